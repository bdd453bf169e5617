//! Reading the checks' inputs off Kubernetes objects: pure functions from a
//! `Node` or `Pod` as the API server returns it to the verdict's values.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};

use super::verdict::{NodeHealth, PodHealth};

/// A node's conditions as `(type, status)`.
pub fn node_conditions(node: &Node) -> Vec<(String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pod` is one the checks watch: not being deleted (a drain or a
/// rollout replacing it) and not finished (`Succeeded` or `Failed` pods,
/// such as a Job's, are never Ready by design).
pub fn is_watched(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Sum of `pod`'s container restart counts (init containers included).
pub fn restarts(pod: &Pod) -> u32 {
    let Some(st) = pod.status.as_ref() else {
        return 0;
    };
    st.container_statuses
        .iter()
        .flatten()
        .chain(st.init_container_statuses.iter().flatten())
        .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
        .fold(0u32, u32::saturating_add)
}

/// Whether `pod`'s `Ready` condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The first waiting reason among `pod`'s containers, if any.
pub fn waiting_reason(pod: &Pod) -> Option<String> {
    let st = pod.status.as_ref()?;
    st.init_container_statuses
        .iter()
        .flatten()
        .chain(st.container_statuses.iter().flatten())
        .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
}

/// `pod` as the verdict sees it; `since` and `restarts_at_start` are what
/// the watcher recorded when this pod's watch began.
pub fn pod_health(pod: &Pod, since: DateTime<Utc>, restarts_at_start: u32) -> PodHealth {
    PodHealth {
        name: format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        ),
        since,
        ready: is_ready(pod),
        restarts_at_start,
        restarts: restarts(pod),
        waiting_reason: waiting_reason(pod),
    }
}

/// `node` and its watched pods, as the verdict sees them.
pub fn node_health(node: &Node, pods: Vec<PodHealth>) -> NodeHealth {
    NodeHealth {
        name: node.metadata.name.clone().unwrap_or_default(),
        conditions: node_conditions(node),
        pods,
    }
}
