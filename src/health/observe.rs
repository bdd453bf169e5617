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

/// A node's health inputs as a backend reports them, before any watch
/// bookkeeping: what [`crate::cluster::Cluster::health`] returns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeSeen {
    /// The node's name.
    pub name: String,
    /// Its conditions, `(type, status)`.
    pub conditions: Vec<(String, String)>,
    /// The watched pods bound to it (see [`is_watched`]).
    pub pods: Vec<PodSeen>,
    /// Why its inputs could not be read in full (a failed list, more pods
    /// than a read takes): then `conditions` and `pods` are empty and the
    /// checks hold rather than judge part of them.
    pub unread: Option<String>,
}

impl NodeSeen {
    /// Node `name`, whose inputs could not be read in full, and why.
    pub fn unread(name: impl Into<String>, why: impl Into<String>) -> Self {
        NodeSeen {
            name: name.into(),
            conditions: Vec::new(),
            pods: Vec::new(),
            unread: Some(why.into()),
        }
    }
}

/// A pod on a node as a backend reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodSeen {
    /// `namespace/name`.
    pub name: String,
    /// When the pod object was created.
    pub created: DateTime<Utc>,
    /// Whether its `Ready` condition is True.
    pub ready: bool,
    /// Sum of its containers' restart counts.
    pub restarts: u32,
    /// The first waiting reason among its containers, if any.
    pub waiting_reason: Option<String>,
}

/// `pod` as a backend reports it.
pub fn pod_seen(pod: &Pod) -> PodSeen {
    PodSeen {
        name: format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        ),
        created: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::from_timestamp_micros(t.0.as_microsecond()))
            .unwrap_or(DateTime::<Utc>::MIN_UTC),
        ready: is_ready(pod),
        restarts: restarts(pod),
        waiting_reason: waiting_reason(pod),
    }
}

/// The verdict's view of `seen` for a watch that began at `watch_start`,
/// without memory between observations (so a restarted agent judges the
/// same): a pod created at or after `watch_start` counts every restart it
/// has; a pod that was already there (a DaemonSet pod that lived through the
/// reboot) starts from its current count, so only `CrashLoopBackOff` or not
/// becoming Ready fail it. Each pod's Ready clock starts at the later of the
/// watch start and its creation.
pub fn watched(seen: &NodeSeen, watch_start: DateTime<Utc>) -> NodeHealth {
    NodeHealth {
        name: seen.name.clone(),
        conditions: seen.conditions.clone(),
        pods: seen
            .pods
            .iter()
            .map(|p| PodHealth {
                name: p.name.clone(),
                since: p.created.max(watch_start),
                ready: p.ready,
                restarts_at_start: if p.created >= watch_start {
                    0
                } else {
                    p.restarts
                },
                restarts: p.restarts,
                waiting_reason: p.waiting_reason.clone(),
            })
            .collect(),
    }
}
