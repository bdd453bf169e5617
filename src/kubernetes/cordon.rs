//! Cordon, uncordon and progress records: one merge patch of
//! `spec.unschedulable` and drover's annotations per call, conditional on the
//! `resourceVersion` the decision was checked against.
//!
//! The precondition matters for the cordon record: "drover cordoned this
//! node" is only true if the node was schedulable at the version drover
//! cordoned, and "drover may uncordon it" only if that record is on the
//! version drover uncordons. A concurrent writer (a person running `kubectl
//! cordon`, the kubelet's status heartbeat) makes the patch fail with 409;
//! drover then reads the node again and re-checks.

use super::node::ObservedNode;
use super::observe::Observer;
use super::{is_status, Error, FIELD_MANAGER};
use crate::cluster::{
    encode_progress, encode_rolled_back, NodeProgress, ANN_CORDONED, ANN_ROLLED_BACK,
};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use semver::Version;
use serde_json::{json, Value};
use std::sync::Arc;

/// Conditional writes tried before giving up on a node that keeps changing.
const MAX_ATTEMPTS: u32 = 5;

fn says_drover_cordoned(n: &ObservedNode) -> bool {
    n.annotations().get(ANN_CORDONED).map(String::as_str) == Some("true")
}

// Patch `node` with what `build` computes from its current version, as a
// conditional write; re-read and rebuild on conflict.
async fn guarded_patch(
    obs: &Observer,
    node: &str,
    call: &'static str,
    build: impl Fn(&ObservedNode) -> Result<Value, Error>,
) -> Result<(), Error> {
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
        let mut patch = build(&current)?;
        patch["metadata"]["resourceVersion"] = json!(current.resource_version());
        match api.patch(node, &params, &Patch::Merge(&patch)).await {
            Ok(mut written) => {
                written.managed_fields_mut().clear();
                tracing::info!(node, call, attempt, "patched");
                obs.wrote_node(written);
                return Ok(());
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

/// Cordon `node` and record `progress` in one patch. On a node someone else
/// already cordoned, drover records that it did *not* cordon it, whatever
/// `progress` says, so that it will never uncordon it.
pub async fn cordon(obs: &Observer, node: &str, progress: &NodeProgress) -> Result<(), Error> {
    guarded_patch(obs, node, "cordon", |cur| {
        let mut p = progress.clone();
        let ours = says_drover_cordoned(cur);
        if cur.unschedulable {
            // Already cordoned: by drover (a repeated call) or by someone else.
            if p.cordoned_by_drover != ours {
                tracing::warn!(
                    node,
                    recorded = ours,
                    "node already cordoned; keeping who cordoned it"
                );
            }
            p.cordoned_by_drover = ours;
        }
        Ok(json!({
            "metadata": { "annotations": encode_progress(Some(&p)) },
            "spec": { "unschedulable": true },
        }))
    })
    .await
}

/// Uncordon `node` and record `progress` in one patch; refused on a cordoned
/// node whose annotations do not say drover cordoned it.
pub async fn uncordon(
    obs: &Observer,
    node: &str,
    progress: Option<&NodeProgress>,
) -> Result<(), Error> {
    guarded_patch(obs, node, "uncordon", |cur| {
        if cur.unschedulable && !says_drover_cordoned(cur) {
            return Err(Error::NotCordonedByDrover {
                node: node.to_string(),
            });
        }
        Ok(json!({
            "metadata": { "annotations": encode_progress(progress) },
            // null removes the field, as `kubectl uncordon` leaves it.
            "spec": { "unschedulable": null },
        }))
    })
    .await
}

/// Record `progress` without touching schedulability; refused when it would
/// erase the record that drover cordoned a node that is still cordoned.
pub async fn set_progress(
    obs: &Observer,
    node: &str,
    progress: Option<&NodeProgress>,
) -> Result<(), Error> {
    guarded_patch(obs, node, "set_progress", |cur| {
        let keeps_record = progress.is_some_and(|p| p.cordoned_by_drover);
        if cur.unschedulable && says_drover_cordoned(cur) && !keeps_record {
            return Err(Error::WouldDropCordonRecord {
                node: node.to_string(),
            });
        }
        Ok(json!({ "metadata": { "annotations": encode_progress(progress) } }))
    })
    .await
}

/// A rollback is done: record `progress` and the versions the node was
/// rolled back from, and uncordon it when `uncordon`, in one patch (see
/// [`crate::cluster::Cluster::mark_rolled_back`]); an uncordon is refused as
/// [`uncordon`] refuses it.
pub async fn mark_rolled_back(
    obs: &Observer,
    node: &str,
    progress: &NodeProgress,
    rolled_back: &[Version],
    uncordon: bool,
) -> Result<(), Error> {
    guarded_patch(obs, node, "mark_rolled_back", |cur| {
        if uncordon && cur.unschedulable && !says_drover_cordoned(cur) {
            return Err(Error::NotCordonedByDrover {
                node: node.to_string(),
            });
        }
        let mut annotations = encode_progress(Some(progress));
        annotations.insert(
            ANN_ROLLED_BACK.to_string(),
            Some(encode_rolled_back(rolled_back)),
        );
        let mut patch = json!({ "metadata": { "annotations": annotations } });
        if uncordon {
            patch["spec"] = json!({ "unschedulable": null });
        }
        Ok(patch)
    })
    .await
}
