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
//! field-selected list) rather than keeping a watch open per draining node.

use super::observe::{lock, Observer};
use super::{is_status, Error};
use crate::cluster::EvictionPass;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;
use std::collections::BTreeSet;

/// Annotation the kubelet puts on mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

fn owned_by_daemonset(pod: &Pod) -> bool {
    pod.owner_references().iter().any(|o| o.kind == "DaemonSet")
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn drover_pod(pod: &Pod) -> bool {
    pod.labels()
        .get(super::observe::MANAGED_BY_LABEL)
        .map(String::as_str)
        == Some(super::observe::MANAGED_BY_VALUE)
}

/// Whether a drain waits for `pod` to be gone: everything but DaemonSet pods
/// (the DaemonSet would put them back), mirror pods (the API cannot remove
/// them), finished pods and drover's own upgrade pods. Terminating pods count
/// until they are gone.
pub fn must_evict(pod: &Pod) -> bool {
    !owned_by_daemonset(pod)
        && !pod.annotations().contains_key(MIRROR_ANNOTATION)
        && !finished(pod)
        && !drover_pod(pod)
}

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

/// The PDBs in the pod's namespace whose selector matches it.
fn pdbs_matching(obs: &Observer, pod: &Pod) -> Vec<String> {
    let ns = pod.namespace().unwrap_or_default();
    obs.pdbs
        .state()
        .iter()
        .filter(|p: &&std::sync::Arc<PodDisruptionBudget>| {
            p.namespace().as_deref() == Some(ns.as_str())
        })
        .filter(|p| {
            let Some(sel) = p.spec.as_ref().and_then(|s| s.selector.clone()) else {
                return false;
            };
            Selector::try_from(sel).is_ok_and(|s| s.matches(pod.labels()))
        })
        .map(|p| p.name_any())
        .collect()
}

/// Whether every PodDisruptionBudget covering a pod of `pods` that a drain
/// must evict allows a disruption now (a blocked node's retry may then come
/// before its backoff).
pub(crate) fn budgets_allow(obs: &Observer, pods: &[std::sync::Arc<Pod>]) -> bool {
    pods.iter().filter(|p| must_evict(p)).all(|pod| {
        let ns = pod.namespace().unwrap_or_default();
        pdbs_matching(obs, pod).iter().all(|name| {
            obs.pdbs
                .state()
                .iter()
                .find(|b| b.namespace().as_deref() == Some(ns.as_str()) && b.name_any() == *name)
                .and_then(|b| b.status.as_ref())
                .is_some_and(|s| s.disruptions_allowed.unwrap_or(0) > 0)
        })
    })
}

/// One eviction pass over `node`.
pub async fn evict(obs: &Observer, node: &str) -> Result<EvictionPass, Error> {
    let pods = obs.list_pods(node).await?;
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
                    names = pdbs_matching(obs, &pod);
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
