//! Drain through the Eviction API, so every PodDisruptionBudget is honoured.
//! drover never deletes a pod.
//!
//! One pass evicts every pod that still needs it, once. A refusal (429: a
//! PDB allows no disruption now) is not an error: it names the PDB in
//! `EvictionPass::blocked_by`, and the engine's next step makes the next pass.
//! The retry cadence is therefore the engine's: while pods remain it steps
//! again after its eviction retry (2 s by default) or sooner on a change the
//! watches report (a PDB's status changing), and gives the node back at
//! `drain_timeout`. Each pass lists the node's pods afresh (one paged,
//! field-selected list) rather than keeping a watch open per draining node,
//! and lists them once: the drain evicts from the list the same pass's
//! observation made ([`Observer::take_drain_list`]), and lists only when
//! there is none (a drain without an observation just before it).

use super::objects::{must_evict, pdbs_matching};
use super::observe::{lock, Observer};
use super::{is_status, Error};
use crate::cluster::EvictionPass;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use kube::ResourceExt;
use std::collections::BTreeSet;

/// PDB names in a 429's causes: "The disruption budget NAME needs N healthy pods ...".
fn pdbs_in_status(status: &kube::core::Status) -> Vec<String> {
    let mut texts = vec![status.message.as_str()];
    if let Some(d) = &status.details {
        texts.extend(d.causes.iter().map(|c| c.message.as_str()));
    }
    texts
        .iter()
        .filter_map(|t| {
            let rest = t.split("disruption budget ").nth(1)?;
            let name = rest.split_whitespace().next()?;
            Some(name.trim_end_matches([',', '.', ':']).to_string())
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// One eviction pass over `node`.
pub async fn evict(obs: &Observer, node: &str) -> Result<EvictionPass, Error> {
    let pods = match obs.take_drain_list(node) {
        Some(pods) => pods,
        None => obs.list_pods(node).await?,
    };
    let mut remaining = 0;
    let mut blocked_by = BTreeSet::new();
    let mut refused_pods = BTreeSet::new();
    for pod in pods {
        if !must_evict(&pod) {
            continue;
        }
        remaining += 1;
        let uid = pod.uid().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some()
            || lock(&obs.evicted)
                .get(node)
                .is_some_and(|s| s.contains(&uid))
        {
            // Already on its way out: wait, do not evict again.
            continue;
        }
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let api: Api<Pod> = Api::namespaced(obs.client.clone(), &ns);
        // The UID precondition evicts exactly the pod counted, never a
        // namesake created since (StatefulSet pods reuse names).
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            }),
            ..EvictParams::default()
        };
        match api.evict(&name, &params).await {
            Ok(_) => {
                tracing::info!(node, pod = %format!("{ns}/{name}"), "evicted");
                lock(&obs.evicted)
                    .entry(node.to_string())
                    .or_default()
                    .insert(uid);
            }
            // Refused by a PDB (429), or covered by several PDBs, which the
            // eviction subresource refuses with 500 until someone fixes them.
            Err(kube::Error::Api(s))
                if s.code == 429 || (s.code == 500 && s.message.contains("DisruptionBudget")) =>
            {
                let mut names = pdbs_in_status(&s);
                if names.is_empty() {
                    names = pdbs_matching(&obs.pdbs.state(), &pod);
                }
                tracing::info!(node, pod = %format!("{ns}/{name}"), pdbs = ?names, code = s.code, "eviction refused");
                if names.is_empty() {
                    // Throttled by the API server rather than a PDB: just retry later.
                    continue;
                }
                blocked_by.extend(names.into_iter().map(|n| format!("{ns}/{n}")));
                refused_pods.insert(format!("{ns}/{name}"));
            }
            // Gone already, or replaced by a namesake: nothing of ours to evict.
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => remaining -= 1,
            Err(source) => {
                return Err(Error::Node {
                    node: node.to_string(),
                    call: format!("evict pod {ns}/{name}"),
                    source,
                })
            }
        }
    }
    Ok(EvictionPass {
        remaining,
        blocked_by: blocked_by.into_iter().collect(),
        refused_pods: refused_pods.into_iter().collect(),
    })
}
