//! The narrow interface the rollout engine drives, implemented by the
//! Kubernetes backend (`crate::kubernetes`) and the simulation (`crate::sim`).
//!
//! The engine keeps no memory between steps: everything it needs to resume
//! after a crash is recorded on the nodes themselves, as the annotations
//! defined here. Both backends encode and decode them with the same
//! functions ([`encode_progress`], [`NodeProgress::decode`]) so that the
//! simulation behaves exactly like a real cluster.
//!
//! Two states are not written on the node: a driver run's Job is itself
//! the record of `preparing` and `upgrading` (`run.rs`, [`effective`]), so a
//! node's routine upgrade patches it twice (cordon, give-back).
//!
//! Every method may be repeated: the engine can crash between two calls,
//! or after a call took effect but before it saw the answer, and will then
//! issue the same call again from what it observes.

mod run;

pub use crate::health::observe::{NodeSeen, PodSeen};
use chrono::{DateTime, SecondsFormat, Utc};
pub use run::{effective, Effective, RunSeen};
use semver::Version;
use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future;

/// Annotation: drover's state for the node (`draining`, `watching`,
/// `passed`, `blocked`, `failed`, `rolling-back`; `preparing` and
/// `upgrading` are the driver run's Job (`run.rs`), and written only when a
/// give-back deletes that Job while it runs, or by older agents).
pub const ANN_STATE: &str = "drover.dev/state";
/// Annotation: the version the node is being moved to.
pub const ANN_TARGET: &str = "drover.dev/target";
/// Annotation: RFC 3339 time the current state's episode began (see [`NodeProgress::started_at`]).
pub const ANN_STARTED_AT: &str = "drover.dev/started-at";
/// Annotation: `"true"` when drover cordoned the node and so must uncordon it.
pub const ANN_CORDONED: &str = "drover.dev/cordoned";
/// Annotation: human-readable detail (why blocked or failed).
pub const ANN_MESSAGE: &str = "drover.dev/message";
/// Annotation set by a person (any value) to clear a failed or blocked node so it is tried again.
pub const ANN_RETRY: &str = "drover.dev/retry";
/// Annotation: how many times a blocked node's drain was retried (absent = 0);
/// its retry backoff grows with it.
pub const ANN_ATTEMPTS: &str = "drover.dev/attempts";

/// Annotation: the version the node ran when drover started moving it to
/// `drover.dev/target`, recorded at the cordon; a rollback drives the node
/// back to it (docs/design.md §5b).
pub const ANN_PREVIOUS: &str = "drover.dev/previous-version";
/// Annotation: the versions this node was rolled back from, comma-separated,
/// newest last; drover never moves the node to one of them again. Not part
/// of the progress record: it outlives every episode, and only a person
/// removes it (`kubectl annotate node N drover.dev/rolled-back-`).
pub const ANN_ROLLED_BACK: &str = "drover.dev/rolled-back";
/// The most versions [`ANN_ROLLED_BACK`] keeps (the oldest go first).
pub const MAX_ROLLED_BACK: usize = 16;

/// Every annotation key of drover's progress record, in a stable order
/// (cleared together; [`ANN_ROLLED_BACK`] is not one of them).
pub const ALL_ANNOTATIONS: [&str; 8] = [
    ANN_STATE,
    ANN_TARGET,
    ANN_STARTED_AT,
    ANN_CORDONED,
    ANN_MESSAGE,
    ANN_RETRY,
    ANN_ATTEMPTS,
    ANN_PREVIOUS,
];

/// drover's per-node state, as recorded in `drover.dev/state`.
///
/// `rolling-back`: the node failed its health checks at `target` and is
/// being driven back to `previous` (cordoned, drained, the driver run for
/// `previous`); see [`NodeProgress::run_version`].
///
/// `preparing`: the driver's `prepare` run checks that `target` is
/// available to the node and downloads it while the node still serves
/// (uncordoned); once it succeeded the node waits, staged, for its turn to
/// be cordoned (`rollout/prepare.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgressState {
    /// Cordoned; pods are being evicted.
    Draining,
    /// Drained; the OS driver is moving the node to the target.
    Upgrading,
    /// The drain did not finish within `drain_timeout`; the node was given back.
    Blocked,
    /// The node did not reach the target, or a health check failed on it
    /// (docs/design.md §5a); it was given back and the rollout stopped.
    Failed,
    /// Back Ready at the target and uncordoned; its health checks are
    /// watched for `pod_ready_timeout` from `started_at` (the return).
    Watching,
    /// Its health watch held; `started_at` is when it passed. Kept until the
    /// cluster settled and confirmed, so settle counts from the last pass.
    Passed,
    /// It failed its health checks at `target` after the upgrade and is
    /// being driven back to `previous` with `on_failure = "rollback"`
    /// (`started_at` = the rollback's start); cordoned until it is back.
    RollingBack,
    /// In service, not cordoned: the driver's `prepare` run (started at
    /// `started_at`) checks the target is available and downloads it before
    /// the drain; once it succeeded the node is staged for its turn.
    Preparing,
}

impl ProgressState {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            ProgressState::Draining => "draining",
            ProgressState::Upgrading => "upgrading",
            ProgressState::Blocked => "blocked",
            ProgressState::Failed => "failed",
            ProgressState::Watching => "watching",
            ProgressState::Passed => "passed",
            ProgressState::RollingBack => "rolling-back",
            ProgressState::Preparing => "preparing",
        }
    }

    /// Whether the node is taken out of service by drover in this state.
    pub fn in_flight(self) -> bool {
        matches!(
            self,
            ProgressState::Draining | ProgressState::Upgrading | ProgressState::RollingBack
        )
    }

    /// Whether a driver run belongs to this state (its status is observed):
    /// the states in flight, and `preparing`, whose run leaves the node in service.
    pub fn runs_driver(self) -> bool {
        self.in_flight() || self == ProgressState::Preparing
    }
}

/// drover's progress on one node, read from and written to its annotations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeProgress {
    /// Where the node is in drover's state machine.
    pub state: ProgressState,
    /// The version the node is being (or was being) moved to.
    pub target: Version,
    /// For `draining`/`upgrading`: when the drain began (both timeouts count
    /// from it, and it identifies the upgrade run). For `blocked`/`failed`:
    /// when the node was given back.
    pub started_at: DateTime<Utc>,
    /// drover cordoned the node, so drover (and only drover) uncordons it.
    pub cordoned_by_drover: bool,
    /// Why the node is blocked or failed; while draining, which
    /// PodDisruptionBudgets refuse which pods, and since when; else empty.
    pub message: String,
    /// Drain retries after a drain timeout (0 for a first attempt).
    pub attempts: u32,
    /// The version the node ran when drover cordoned it for `target`
    /// (`drover.dev/previous-version`): where a rollback takes it. `None`
    /// when it could not be read then, or on records of older agents.
    pub previous: Option<Version>,
}

impl NodeProgress {
    /// The version the driver's run for this record moves the node to: the
    /// target, or the previous version while rolling back. Identifies the
    /// run with `started_at`.
    pub fn run_version(&self) -> &Version {
        match (&self.state, &self.previous) {
            (ProgressState::RollingBack, Some(p)) => p,
            _ => &self.target,
        }
    }

    /// What the driver's run is: `upgrade`, `rollback`, or `prepare` (the
    /// Job driver's `DROVER_ACTION`, docs/drivers.md).
    pub fn run_action(&self) -> &'static str {
        match self.state {
            ProgressState::RollingBack => "rollback",
            ProgressState::Preparing => "prepare",
            _ => "upgrade",
        }
    }
}

/// Drover annotations that are present but cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    /// A required annotation is missing while `drover.dev/state` is set.
    #[error("annotation {0} is missing")]
    Missing(&'static str),
    /// An annotation's value is not valid.
    #[error("annotation {key} has invalid value {value:?}: {why}")]
    Invalid {
        /// The annotation key.
        key: &'static str,
        /// The value found.
        value: String,
        /// What would be valid.
        why: String,
    },
}

impl NodeProgress {
    /// Read drover's progress from a node's annotations: `Ok(None)` when the
    /// node carries no `drover.dev/state` (drover has no business with it).
    pub fn decode(annotations: &BTreeMap<String, String>) -> Result<Option<Self>, ProgressError> {
        let Some(state) = annotations.get(ANN_STATE) else {
            return Ok(None);
        };
        let state = match state.as_str() {
            "draining" => ProgressState::Draining,
            "upgrading" => ProgressState::Upgrading,
            "blocked" => ProgressState::Blocked,
            "failed" => ProgressState::Failed,
            "watching" => ProgressState::Watching,
            "passed" => ProgressState::Passed,
            "rolling-back" => ProgressState::RollingBack,
            "preparing" => ProgressState::Preparing,
            other => {
                return Err(ProgressError::Invalid {
                    key: ANN_STATE,
                    value: other.to_string(),
                    why: "expected preparing, draining, upgrading, watching, passed, blocked, \
                          failed or rolling-back"
                        .into(),
                })
            }
        };
        let get = |key: &'static str| annotations.get(key).ok_or(ProgressError::Missing(key));
        let target_s = get(ANN_TARGET)?;
        let target = Version::parse(target_s).map_err(|e| ProgressError::Invalid {
            key: ANN_TARGET,
            value: target_s.clone(),
            why: e.to_string(),
        })?;
        let started_s = get(ANN_STARTED_AT)?;
        let started_at = DateTime::parse_from_rfc3339(started_s)
            .map_err(|e| ProgressError::Invalid {
                key: ANN_STARTED_AT,
                value: started_s.clone(),
                why: e.to_string(),
            })?
            .with_timezone(&Utc);
        let cordoned_by_drover = match annotations.get(ANN_CORDONED).map(String::as_str) {
            Some("true") => true,
            Some("false") | None => false,
            Some(other) => {
                return Err(ProgressError::Invalid {
                    key: ANN_CORDONED,
                    value: other.to_string(),
                    why: "expected true or false".into(),
                })
            }
        };
        let attempts = match annotations.get(ANN_ATTEMPTS) {
            None => 0,
            Some(a) => a.parse::<u32>().map_err(|_| ProgressError::Invalid {
                key: ANN_ATTEMPTS,
                value: a.clone(),
                why: "expected a whole number".into(),
            })?,
        };
        let previous = match annotations.get(ANN_PREVIOUS) {
            None => None,
            Some(s) => Some(Version::parse(s).map_err(|e| ProgressError::Invalid {
                key: ANN_PREVIOUS,
                value: s.clone(),
                why: e.to_string(),
            })?),
        };
        if state == ProgressState::RollingBack && previous.is_none() {
            return Err(ProgressError::Missing(ANN_PREVIOUS));
        }
        Ok(Some(NodeProgress {
            state,
            target,
            started_at,
            cordoned_by_drover,
            message: annotations.get(ANN_MESSAGE).cloned().unwrap_or_default(),
            attempts,
            previous,
        }))
    }
}

/// The versions a node was rolled back from ([`ANN_ROLLED_BACK`]), oldest
/// first; an unreadable entry is an error, never skipped (it could be the
/// version the node must not take again).
pub fn decode_rolled_back(
    annotations: &BTreeMap<String, String>,
) -> Result<Vec<Version>, ProgressError> {
    let Some(list) = annotations.get(ANN_ROLLED_BACK) else {
        return Ok(Vec::new());
    };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            Version::parse(s).map_err(|e| ProgressError::Invalid {
                key: ANN_ROLLED_BACK,
                value: list.clone(),
                why: format!("{s:?} is not a version: {e}; expected versions separated by commas"),
            })
        })
        .collect()
}

/// The annotation value recording `versions` ([`ANN_ROLLED_BACK`]): at most
/// [`MAX_ROLLED_BACK`], the newest kept.
pub fn encode_rolled_back(versions: &[Version]) -> String {
    let skip = versions.len().saturating_sub(MAX_ROLLED_BACK);
    versions[skip..]
        .iter()
        .map(Version::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether a person asked drover to retry this node (`drover.dev/retry` present).
pub fn retry_requested(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(ANN_RETRY)
}

/// The annotation patch that records `progress` (or clears drover's
/// annotations for `None`): `Some(value)` sets a key, `None` removes it —
/// exactly a JSON merge patch's `"value"` / `null`. Every write removes
/// `drover.dev/retry`, so a retry request is consumed by the write that acts on it.
pub fn encode_progress(progress: Option<&NodeProgress>) -> BTreeMap<String, Option<String>> {
    let mut patch: BTreeMap<String, Option<String>> = ALL_ANNOTATIONS
        .iter()
        .map(|k| (k.to_string(), None))
        .collect();
    if let Some(p) = progress {
        patch.insert(ANN_STATE.into(), Some(p.state.as_str().into()));
        patch.insert(ANN_TARGET.into(), Some(p.target.to_string()));
        patch.insert(
            ANN_STARTED_AT.into(),
            Some(p.started_at.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
        );
        patch.insert(
            ANN_CORDONED.into(),
            Some(
                if p.cordoned_by_drover {
                    "true"
                } else {
                    "false"
                }
                .into(),
            ),
        );
        if !p.message.is_empty() {
            patch.insert(ANN_MESSAGE.into(), Some(p.message.clone()));
        }
        if p.attempts > 0 {
            patch.insert(ANN_ATTEMPTS.into(), Some(p.attempts.to_string()));
        }
        if let Some(v) = &p.previous {
            patch.insert(ANN_PREVIOUS.into(), Some(v.to_string()));
        }
    }
    patch
}

/// Apply an annotation patch from [`encode_progress`] to a node's annotations.
pub fn apply_patch(
    annotations: &mut BTreeMap<String, String>,
    patch: &BTreeMap<String, Option<String>>,
) {
    for (k, v) in patch {
        match v {
            Some(v) => {
                annotations.insert(k.clone(), v.clone());
            }
            None => {
                annotations.remove(k);
            }
        }
    }
}

/// Status of the OS upgrade driver's run for the node's current progress
/// (its `target` and `started_at`); a run for another target or an earlier
/// attempt is reported as `NotStarted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "status", content = "message")]
pub enum UpgradeStatus {
    /// No run exists for this attempt.
    NotStarted,
    /// The run is in progress (including the node's reboot).
    Running,
    /// The run finished, reboot included; the observed version is what the OS now reports.
    Succeeded,
    /// The run failed, with the driver's message.
    Failed(String),
}

/// One selected node as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// OS version read from the node; `None` when it cannot be read (reported, never guessed).
    pub version: Option<Version>,
    /// The node's Ready condition is True.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned, by anyone).
    pub unschedulable: bool,
    /// drover's progress from the annotations; `Err` when they are present but unreadable.
    #[serde(serialize_with = "ser_progress")]
    pub progress: Result<Option<NodeProgress>, ProgressError>,
    /// `drover.dev/retry` is set.
    pub retry: bool,
    /// Pods that a drain still has to evict (DaemonSet and mirror pods excluded).
    pub pods_to_evict: usize,
    /// The driver's run for the current attempt.
    pub upgrade: UpgradeStatus,
    /// `progress` is what a driver run stands for (`preparing`, or
    /// `upgrading` on a `draining` record), not written on the node: a
    /// give-back that deletes that run while it runs records it first
    /// ([`effective`]).
    pub from_run: bool,
    /// Read for blocked nodes only: every PodDisruptionBudget covering the
    /// pods a drain would evict allows a disruption now, so a retry need not
    /// wait out its backoff.
    pub budgets_allow_drain: bool,
    /// Why this node could not be observed in full this time (its pods could
    /// not be listed, its version not confirmed): the decision holds it,
    /// taking no step that needs the missing part, while its timeouts still
    /// run. `None` when everything the decision reads of it was read.
    pub fault: Option<String>,
    /// The versions the node was rolled back from ([`ANN_ROLLED_BACK`]):
    /// drover never moves it to one of them again.
    pub rolled_back: Vec<Version>,
    /// Another updater manages this node, and what says so (the Bottlerocket
    /// update operator's label, `[nodes] other_updater_label`): drover
    /// leaves it alone unless it already has a record of drover's.
    pub managed_by: Option<String>,
}

fn ser_progress<S: serde::Serializer>(
    p: &Result<Option<NodeProgress>, ProgressError>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match p {
        Ok(p) => p.serialize(s),
        Err(e) => s.serialize_str(&format!("unreadable: {e}")),
    }
}

impl NodeView {
    /// A node view whose progress and retry flag come from its annotations
    /// and its driver runs ([`effective`]).
    pub fn from_annotations(
        name: impl Into<String>,
        version: Option<Version>,
        ready: bool,
        unschedulable: bool,
        annotations: &BTreeMap<String, String>,
        pods_to_evict: usize,
        runs: &[RunSeen],
    ) -> Self {
        let (record, rolled_back) = match decode_rolled_back(annotations) {
            Ok(list) => (NodeProgress::decode(annotations), list),
            // Unreadable: the node is skipped and reported, like any
            // unreadable record of drover's.
            Err(e) => (Err(e), Vec::new()),
        };
        let Effective {
            progress,
            upgrade,
            from_run,
        } = effective(record, runs);
        NodeView {
            name: name.into(),
            version,
            ready,
            unschedulable,
            progress,
            retry: retry_requested(annotations),
            pods_to_evict,
            upgrade,
            from_run,
            budgets_allow_drain: false,
            fault: None,
            rolled_back,
            managed_by: None,
        }
    }
}

/// The result of one eviction pass over a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EvictionPass {
    /// Pods still to evict after this pass.
    pub remaining: usize,
    /// PodDisruptionBudgets that refused an eviction (HTTP 429) in this pass.
    pub blocked_by: Vec<String>,
    /// Pods (`namespace/name`) whose eviction they refused.
    pub refused_pods: Vec<String>,
}

/// What the rollout engine needs from a cluster. Implemented with `async fn`;
/// the futures are `Send` so an agent can drive the engine from any task.
///
/// Every method is idempotent: repeating a call that already took effect
/// changes nothing more.
pub trait Cluster {
    /// The backend's error (API failures, a node that vanished).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The cluster's name, for logs and status reports.
    fn name(&self) -> &str;

    /// The nodes the environment's selector chooses, in any order, as they
    /// are now. A node whose own part of the observation fails (its pods
    /// cannot be listed, it vanished mid-read) is returned with
    /// [`NodeView::fault`] set, never as an error of the whole call: one
    /// node's trouble must not stop every other node.
    fn observe(&self) -> impl Future<Output = Result<Vec<NodeView>, Self::Error>> + Send;

    /// Cordon `node` and record `progress`, in one patch so that a crash can
    /// never leave a node cordoned without drover's record of it. On a node
    /// already unschedulable, only the annotations change.
    fn cordon(
        &self,
        node: &str,
        progress: &NodeProgress,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Uncordon `node` and record `progress` (`None` clears drover's
    /// annotations), in one patch. The engine calls it only on nodes whose
    /// record says drover cordoned them.
    fn uncordon(
        &self,
        node: &str,
        progress: Option<&NodeProgress>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Record `progress` (`None` clears drover's annotations) without
    /// touching schedulability.
    fn set_progress(
        &self,
        node: &str,
        progress: Option<&NodeProgress>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// One eviction pass over `node`'s pods through the Eviction API, so
    /// PodDisruptionBudgets are honoured: a refused eviction is not an error,
    /// it is reported in `blocked_by` and retried by a later pass.
    fn evict(&self, node: &str) -> impl Future<Output = Result<EvictionPass, Self::Error>> + Send;

    /// Start the OS driver moving `node` to [`NodeProgress::run_version`]
    /// (the target, or the previous version while rolling back, with
    /// [`NodeProgress::run_action`]), for the attempt identified by
    /// `progress.started_at`. If a run for this node, version and attempt
    /// exists (running, succeeded or failed), nothing is started: a repeated
    /// call never upgrades a node twice.
    fn start_upgrade(
        &self,
        node: &str,
        progress: &NodeProgress,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// A rollback is done: record `progress` and that the node was rolled
    /// back from every version of `rolled_back` ([`ANN_ROLLED_BACK`]), and
    /// uncordon it when `uncordon`, in one patch, so that a crash never
    /// leaves the node in service without the mark that keeps it off the
    /// bad version.
    fn mark_rolled_back(
        &self,
        node: &str,
        progress: &NodeProgress,
        rolled_back: &[Version],
        uncordon: bool,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The health inputs of `nodes` (docs/design.md §5a): their conditions
    /// and the watched pods bound to them, each node read whole or marked
    /// [`NodeSeen::unread`] with why, never in part. A node that vanished is
    /// left out. The default, for backends without workloads, reports no
    /// pods and no conditions.
    fn health(
        &self,
        nodes: &[String],
    ) -> impl Future<Output = Result<Vec<NodeSeen>, Self::Error>> + Send {
        let seen = nodes
            .iter()
            .map(|n| NodeSeen {
                name: n.clone(),
                conditions: Vec::new(),
                pods: Vec::new(),
                unread: None,
            })
            .collect();
        async move { Ok(seen) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress() -> NodeProgress {
        NodeProgress {
            state: ProgressState::Upgrading,
            target: Version::new(1, 13, 2),
            started_at: "2026-12-08T02:00:00Z".parse().unwrap(),
            cordoned_by_drover: true,
            message: String::new(),
            attempts: 0,
            previous: None,
        }
    }

    #[test]
    fn progress_round_trips_through_annotations() {
        let mut ann = BTreeMap::from([("other".to_string(), "x".to_string())]);
        apply_patch(&mut ann, &encode_progress(Some(&progress())));
        assert_eq!(ann[ANN_STATE], "upgrading");
        assert_eq!(ann[ANN_STARTED_AT], "2026-12-08T02:00:00Z");
        assert_eq!(NodeProgress::decode(&ann).unwrap(), Some(progress()));
        ann.insert(ANN_RETRY.into(), "yes".into());
        assert!(retry_requested(&ann));
        apply_patch(&mut ann, &encode_progress(None));
        assert_eq!(ann.len(), 1, "only the foreign annotation is left: {ann:?}");
        assert_eq!(NodeProgress::decode(&ann).unwrap(), None);
    }

    #[test]
    fn unreadable_progress_is_an_error_not_a_guess() {
        let ann = BTreeMap::from([
            (ANN_STATE.to_string(), "upgrading".to_string()),
            (ANN_TARGET.to_string(), "latest".to_string()),
        ]);
        assert!(matches!(
            NodeProgress::decode(&ann),
            Err(ProgressError::Invalid {
                key: ANN_TARGET,
                ..
            })
        ));
        let ann = BTreeMap::from([(ANN_STATE.to_string(), "rebooting".to_string())]);
        assert!(NodeProgress::decode(&ann).is_err());
        let ann = BTreeMap::from([(ANN_STATE.to_string(), "draining".to_string())]);
        assert_eq!(
            NodeProgress::decode(&ann),
            Err(ProgressError::Missing(ANN_TARGET))
        );
    }
}
