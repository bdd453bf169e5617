//! Cordon and uncordon: one merge patch of `spec.unschedulable` per call,
//! conditional on the `resourceVersion` it was checked against. The Node
//! carries nothing else of drover's: who cordoned it is in drover's record
//! (`record.rs`), written before the cordon.
//!
//! The precondition matters for "drover cordoned this node": it is only
//! true if the node was schedulable at the version drover cordoned. A
//! concurrent writer (a person running `kubectl cordon`, the kubelet's
//! status heartbeat) makes the patch fail with 409; drover then reads the
//! node again and re-checks.

use super::node::{is_drain_taint, ObservedNode};
use super::observe::Observer;
use super::{is_status, Error, FIELD_MANAGER};
use crate::cluster::Cordoned;
use crate::record::legacy::ALL_ANNOTATIONS;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};
use std::sync::Arc;

/// Conditional writes tried before giving up on a node that keeps changing.
const MAX_ATTEMPTS: u32 = 5;

// Patch `node` with what `build` computes from its current version (`None`:
// nothing to write), as a conditional write; re-read and rebuild on conflict.
async fn guarded_patch(
    obs: &Observer,
    node: &str,
    call: &'static str,
    build: impl Fn(&ObservedNode) -> Result<Option<Value>, Error>,
) -> Result<bool, Error> {
    let api: Api<ObservedNode> = Api::all(obs.client.clone());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let mut current: Arc<ObservedNode> = match obs.node(node) {
        Some(n) => n,
        None => obs.get_node(node, call).await?,
    };
    for attempt in 1..=MAX_ATTEMPTS {
        let Some(mut patch) = build(&current)? else {
            return Ok(false);
        };
        patch["metadata"]["resourceVersion"] = json!(current.resource_version());
        match api.patch(node, &params, &Patch::Merge(&patch)).await {
            Ok(mut written) => {
                written.managed_fields_mut().clear();
                tracing::info!(node, call, attempt, "patched");
                obs.wrote_node(written);
                return Ok(true);
            }
            Err(e) if is_status(&e, 409) => {
                tracing::debug!(
                    node,
                    call,
                    attempt,
                    "conflicting write; reading the node again"
                );
                current = obs.get_node(node, call).await?;
            }
            Err(e) if is_status(&e, 404) => {
                return Err(Error::NodeGone {
                    node: node.to_string(),
                    call,
                })
            }
            Err(source) => {
                return Err(Error::Node {
                    node: node.to_string(),
                    call: call.to_string(),
                    source,
                })
            }
        }
    }
    Err(Error::Conflict {
        node: node.to_string(),
        call,
        attempts: MAX_ATTEMPTS,
    })
}

/// Cordon `node`; says whether it was schedulable (drover's cordon) or
/// already cordoned (nothing written).
pub async fn cordon(obs: &Observer, node: &str) -> Result<Cordoned, Error> {
    let wrote = guarded_patch(obs, node, "cordon", |cur| {
        Ok((!cur.unschedulable).then(|| json!({ "spec": { "unschedulable": true } })))
    })
    .await?;
    Ok(if wrote {
        Cordoned::ByDrover
    } else {
        Cordoned::Already
    })
}

/// Uncordon `node`; refused unless drover's newest record of it says
/// drover cordoned it (defense in depth: the engine asks only then).
pub async fn uncordon(obs: &Observer, node: &str) -> Result<(), Error> {
    let ours = obs
        .record(node)
        .is_some_and(|r| r.progress.as_ref().is_some_and(|p| p.cordoned_by_drover));
    guarded_patch(obs, node, "uncordon", |cur| {
        if !cur.unschedulable {
            return Ok(None);
        }
        if !ours {
            return Err(Error::NotCordonedByDrover {
                node: node.to_string(),
            });
        }
        // null removes the field, as `kubectl uncordon` leaves it; the
        // pre-drain taint goes in the same write.
        Ok(Some(without_drain_taint(
            cur,
            json!({ "spec": { "unschedulable": null } }),
        )))
    })
    .await?;
    untaint(obs, node).await
}

/// `patch` removing drover's pre-drain taint too, when `cur` carries it
/// (the list is written whole; the precondition keeps others' changes).
fn without_drain_taint(cur: &ObservedNode, mut patch: Value) -> Value {
    if cur.drain_tainted() {
        let kept: Vec<Value> = cur
            .taints
            .iter()
            .filter(|t| !is_drain_taint(t))
            .cloned()
            .collect();
        patch["spec"]["taints"] = if kept.is_empty() {
            Value::Null
        } else {
            Value::Array(kept)
        };
    }
    patch
}

/// Set drover's pre-drain taint on `node` (`config::DRAIN_TAINT`), the
/// lead before its cordon; nothing written when it is there.
pub async fn taint(obs: &Observer, node: &str) -> Result<(), Error> {
    guarded_patch(obs, node, "taint", |cur| {
        if cur.drain_tainted() {
            return Ok(None);
        }
        let mut taints = cur.taints.clone();
        taints.push(json!({
            "key": crate::config::DRAIN_TAINT,
            "effect": crate::config::DRAIN_TAINT_EFFECT,
        }));
        Ok(Some(json!({ "spec": { "taints": taints } })))
    })
    .await?;
    Ok(())
}

/// Remove drover's pre-drain taint from a schedulable `node` (a node given
/// back before its cordon); nothing written when it is not there.
pub async fn untaint(obs: &Observer, node: &str) -> Result<(), Error> {
    guarded_patch(obs, node, "untaint", |cur| {
        Ok(cur
            .drain_tainted()
            .then(|| without_drain_taint(cur, json!({ "spec": {} }))))
    })
    .await?;
    Ok(())
}

/// Remove the annotations of earlier releases' records from `node` (the
/// migration's last step for it).
pub async fn clear_legacy(obs: &Observer, node: &str) -> Result<(), Error> {
    guarded_patch(obs, node, "clear_legacy", |cur| {
        let present: serde_json::Map<String, Value> = ALL_ANNOTATIONS
            .iter()
            .filter(|k| cur.annotations().contains_key(**k))
            .map(|k| (k.to_string(), Value::Null))
            .collect();
        Ok((!present.is_empty()).then(|| json!({ "metadata": { "annotations": present } })))
    })
    .await?;
    Ok(())
}
