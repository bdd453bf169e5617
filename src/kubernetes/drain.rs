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
//!
//! A pod a drain rule matches (`config::drain`, the first rule that
//! matches) gets the rung of its rule's ladder in force for how long the
//! node has been cordoned: `evict` as above; `restart` rolls its
//! single-replica Deployment or StatefulSet (the pod template's
//! `kubectl.kubernetes.io/restartedAt`, set to the drain's mark so a
//! repeated pass meets its own restart) when no rollout of it is in flight,
//! and waits for it, any other pod being evicted; `wait` leaves it;
//! `skip` asks for the node to be given back; `delete` deletes it, only on
//! a rule with `allow_delete` (checked here again: no other path deletes).

use super::objects::{must_evict, pdbs_matching};
use super::observe::{lock, Observer};
use super::{is_status, Error};
use crate::cluster::{DrainOrder, EvictionPass, RungTaken};
use crate::config::{rule_for, DrainRule, RungKind};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, Preconditions};
use kube::ResourceExt;
use std::collections::BTreeSet;

/// The pod template annotation `kubectl rollout restart` sets.
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

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

/// One eviction pass over `node`, each pod by the rung its drain rule
/// (if any) has in force.
pub async fn evict(
    obs: &Observer,
    node: &str,
    order: &DrainOrder<'_>,
) -> Result<EvictionPass, Error> {
    let pods = match obs.take_drain_list(node) {
        Some(pods) => pods,
        None => obs.list_pods(node).await?,
    };
    let mut remaining = 0;
    let mut blocked_by = BTreeSet::new();
    let mut refused_pods = BTreeSet::new();
    let mut rungs = Vec::new();
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
        let rule = rule_for(order.rules, &ns, pod.labels());
        let rung = rule.map_or(RungKind::Evict, |r| r.rung_at(order.since_cordon));
        tracing::debug!(node, pod = %format!("{ns}/{name}"), rule = rule.map(|r| r.name.as_str()), rung = rung.as_str(), rules = order.rules.len(), "drain rung");
        let taken = |rung, detail: String| RungTaken {
            rung,
            rule: rule.map_or_else(String::new, |r| r.name.clone()),
            detail,
        };
        match rung {
            // A rule's taint is set before the cordon, never per pod.
            RungKind::Evict | RungKind::Taint => {}
            RungKind::Wait => {
                RungTaken::add(
                    &mut rungs,
                    taken(rung, format!("waiting on pod {ns}/{name}")),
                );
                continue;
            }
            RungKind::Skip => {
                RungTaken::add(
                    &mut rungs,
                    taken(rung, format!("node skipped: pod {ns}/{name} still on it")),
                );
                continue;
            }
            RungKind::Delete => {
                // The rule was checked when the file was admitted; checked
                // again here, the one call that deletes a pod.
                if rule.is_some_and(|r: &DrainRule| r.allow_delete) {
                    delete(obs, node, &pod).await?;
                    RungTaken::add(&mut rungs, taken(rung, format!("deleted pod {ns}/{name}")));
                    continue;
                }
            }
            RungKind::Restart => match restart(obs, node, &pod, order.mark).await? {
                Restart::NotSingle => {}
                Restart::Started(what) => {
                    RungTaken::add(
                        &mut rungs,
                        taken(rung, format!("restarted {what} for pod {ns}/{name}")),
                    );
                    continue;
                }
                Restart::InFlight(what) => {
                    RungTaken::add(
                        &mut rungs,
                        taken(
                            rung,
                            format!("awaiting the rollout of {what} for pod {ns}/{name}"),
                        ),
                    );
                    continue;
                }
            },
        }
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
        rungs,
    })
}

/// Delete `pod` (exactly the pod counted: its UID is the precondition).
async fn delete(obs: &Observer, node: &str, pod: &Pod) -> Result<(), Error> {
    let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let uid = pod.uid().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(obs.client.clone(), &ns);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => {
            tracing::warn!(node, pod = %format!("{ns}/{name}"), "deleted by a drain rule");
            lock(&obs.evicted)
                .entry(node.to_string())
                .or_default()
                .insert(uid);
            Ok(())
        }
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(source) => Err(Error::Node {
            node: node.to_string(),
            call: format!("delete pod {ns}/{name}"),
            source,
        }),
    }
}

/// What a `restart` rung found for a pod.
enum Restart {
    /// Its owner is not a Deployment or StatefulSet of one replica: evicted instead.
    NotSingle,
    /// drover restarted the owner now (named).
    Started(String),
    /// A rollout of the owner is in flight (drover's or another's): wait.
    InFlight(String),
}

/// The pod's controller reference, `(kind, name)`.
fn controller(meta: &kube::api::ObjectMeta) -> Option<(String, String)> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone()))
}

/// Restart the single-replica Deployment or StatefulSet owning `pod`, as
/// `kubectl rollout restart` does, unless a rollout of it is in flight
/// (Karpenter's rule): then it is awaited as `kubectl rollout status` does.
async fn restart(obs: &Observer, node: &str, pod: &Pod, mark: &str) -> Result<Restart, Error> {
    let ns = pod.namespace().unwrap_or_default();
    let c = obs.client.clone();
    let call = |what: String| {
        move |source| Error::Node {
            node: node.to_string(),
            call: what,
            source,
        }
    };
    let (kind, name) = match controller(&pod.metadata) {
        Some((k, n)) if k == "ReplicaSet" => {
            let rs = match Api::<ReplicaSet>::namespaced(c.clone(), &ns)
                .get_opt(&n)
                .await
            {
                Ok(Some(rs)) => rs,
                Ok(None) => return Ok(Restart::NotSingle),
                Err(e) => return Err(call(format!("get replicaset {ns}/{n}"))(e)),
            };
            match controller(&rs.metadata) {
                Some((k, n)) if k == "Deployment" => (k, n),
                _ => return Ok(Restart::NotSingle),
            }
        }
        Some((k, n)) if k == "StatefulSet" => (k, n),
        _ => return Ok(Restart::NotSingle),
    };
    let what = format!("{kind} {ns}/{name}");
    if kind == "Deployment" {
        let api = Api::<Deployment>::namespaced(c, &ns);
        restart_owner(api, node, &name, what, mark, deployment_rollout).await
    } else {
        let api = Api::<StatefulSet>::namespaced(c, &ns);
        restart_owner(api, node, &name, what, mark, statefulset_rollout).await
    }
}

/// The owner `name` read through `api` and judged by `rollout` (one
/// replica, carries `mark`, a rollout in flight): restarted when it has one
/// replica, not marked yet and no rollout in flight.
async fn restart_owner<K>(
    api: Api<K>,
    node: &str,
    name: &str,
    what: String,
    mark: &str,
    rollout: fn(&K, &str) -> (bool, bool, bool),
) -> Result<Restart, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let call = |what: String| {
        move |source| Error::Node {
            node: node.to_string(),
            call: what,
            source,
        }
    };
    let Some(owner) = api
        .get_opt(name)
        .await
        .map_err(call(format!("get {what}")))?
    else {
        return Ok(Restart::NotSingle);
    };
    let (single, marked, in_flight) = rollout(&owner, mark);
    if single && !marked && !in_flight {
        let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: mark}}}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(call(format!("restart {what}")))?;
        return Ok(Restart::Started(what));
    }
    Ok(if single {
        Restart::InFlight(what)
    } else {
        Restart::NotSingle
    })
}

/// A Deployment's (one replica, carries `mark`, a rollout in flight), the
/// last as `kubectl rollout status` judges it.
fn deployment_rollout(d: &Deployment, mark: &str) -> (bool, bool, bool) {
    let spec = d.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    let marked = restarted_at(spec.map(|s| &s.template.metadata)) == Some(mark);
    let st = d.status.clone().unwrap_or_default();
    let in_flight = st.observed_generation.unwrap_or(0) < d.metadata.generation.unwrap_or(0)
        || st.updated_replicas.unwrap_or(0) < replicas
        || st.replicas.unwrap_or(0) > st.updated_replicas.unwrap_or(0)
        || st.available_replicas.unwrap_or(0) < st.updated_replicas.unwrap_or(0);
    (replicas == 1, marked, in_flight)
}

/// A StatefulSet's (one replica, carries `mark`, a rollout in flight).
fn statefulset_rollout(s: &StatefulSet, mark: &str) -> (bool, bool, bool) {
    let spec = s.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    let marked = restarted_at(spec.map(|s| &s.template.metadata)) == Some(mark);
    let st = s.status.clone().unwrap_or_default();
    let in_flight = st.observed_generation.unwrap_or(0) < s.metadata.generation.unwrap_or(0)
        || st.ready_replicas.unwrap_or(0) < replicas
        || st.update_revision.is_some() && st.update_revision != st.current_revision;
    (replicas == 1, marked, in_flight)
}

fn restarted_at(meta: Option<&Option<kube::api::ObjectMeta>>) -> Option<&str> {
    meta?
        .as_ref()?
        .annotations
        .as_ref()?
        .get(RESTARTED_AT)
        .map(String::as_str)
}
