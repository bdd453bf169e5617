//! Where a node is in drover's state machine ([`ProgressState`]) and the
//! episode drover is taking it through ([`NodeProgress`]): the part of a
//! node's record the rollout's decision reads and writes.

use chrono::{DateTime, Utc};
use semver::Version;
use serde::Serialize;

/// drover's per-node state, the record's `phase` (an idle node has none).
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
    /// Cordoned; pods are being evicted. The record names the upgrade run
    /// it starts once the node is drained.
    Draining,
    /// Drained; the OS driver is moving the node to the target. Read, not
    /// written: a `draining` record whose run exists is upgrading
    /// ([`crate::cluster::effective`]).
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
    /// Every state, in the order a node goes through them.
    pub const ALL: [ProgressState; 8] = [
        ProgressState::Preparing,
        ProgressState::Draining,
        ProgressState::Upgrading,
        ProgressState::Watching,
        ProgressState::Passed,
        ProgressState::Blocked,
        ProgressState::Failed,
        ProgressState::RollingBack,
    ];

    /// The phase's name, as the record and `kubectl get drovernodes` show it.
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

    /// The state named `s`, as [`Self::as_str`] writes it.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
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

/// What a driver run does ([`NodeProgress::run_action`]): the Job driver's
/// `DROVER_ACTION` (docs/drivers.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunAction {
    /// Check the target is available and download it, the node in service.
    Prepare,
    /// Move the drained node to the target.
    Upgrade,
    /// Drive the drained node back to the version it ran before.
    Rollback,
}

impl RunAction {
    /// `prepare`, `upgrade` or `rollback`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunAction::Prepare => "prepare",
            RunAction::Upgrade => "upgrade",
            RunAction::Rollback => "rollback",
        }
    }

    /// The action named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        [RunAction::Prepare, RunAction::Upgrade, RunAction::Rollback]
            .into_iter()
            .find(|a| a.as_str() == s)
    }

    /// Whether the run moves the node (reboots it): an upgrade or a
    /// rollback; a prepare only downloads, the node in service.
    pub fn moves_node(self) -> bool {
        self != RunAction::Prepare
    }
}

/// drover's progress on one node: the episode its record is in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeProgress {
    /// Where the node is in drover's state machine.
    pub state: ProgressState,
    /// The version the node is being (or was being) moved to.
    pub target: Version,
    /// For `draining`/`upgrading`: when the drain began (both timeouts count
    /// from it). For `blocked`/`failed`: when the node was given back.
    pub started_at: DateTime<Utc>,
    /// drover cordoned the node, so drover (and only drover) uncordons it.
    pub cordoned_by_drover: bool,
    /// Why the node is blocked or failed; while draining, which
    /// PodDisruptionBudgets refuse which pods, and since when; else empty.
    pub message: String,
    /// Drain retries after a drain timeout (0 for a first attempt); its
    /// retry backoff grows with it.
    pub retries: u32,
    /// The version the node ran when drover started it for `target`,
    /// recorded by drover at that start: where a rollback takes it. `None`
    /// when it could not be read then.
    pub previous: Option<Version>,
}

impl NodeProgress {
    /// The version the driver's run for this record moves the node to: the
    /// target, or the previous version while rolling back.
    pub fn run_version(&self) -> &Version {
        match (&self.state, &self.previous) {
            (ProgressState::RollingBack, Some(p)) => p,
            _ => &self.target,
        }
    }

    /// What the driver's run for this progress is.
    pub fn run_action(&self) -> RunAction {
        match self.state {
            ProgressState::RollingBack => RunAction::Rollback,
            ProgressState::Preparing => RunAction::Prepare,
            _ => RunAction::Upgrade,
        }
    }
}
