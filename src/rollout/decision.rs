//! The decision's vocabulary: what [`super::decide`] reads ([`Policy`],
//! [`Inputs`], [`WindowState`]) and what it says ([`Decision`], [`Action`],
//! [`Skipped`], [`Held`]). Values only; how a decision is reached lives in
//! `decide.rs` and the modules it names.

use super::{Blocker, RolloutState};
use crate::cluster::{NodeProgress, NodeSeen};
use crate::config::{
    EnvConfig, HealthSpec, MaxUnavailable, OnDrainTimeout, OnFailure, PrometheusCheck,
};
use crate::health::QueryOutcome;
use chrono::{DateTime, Utc};
use semver::Version;
use serde::Serialize;
use std::time::Duration;

/// The environment's rollout policy, from its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The pinned version.
    pub target: Version,
    /// `allow_downgrade = true` in the environment's file: a node newer than
    /// the pin is moved down to it; without it such a node is left alone
    /// and reported (someone else put it there).
    pub allow_downgrade: bool,
    /// Budget of unavailable selected nodes.
    pub max_unavailable: MaxUnavailable,
    /// Longest a drain may take.
    pub drain_timeout: Duration,
    /// Longest from drain start to Ready at the target.
    pub node_timeout: Duration,
    /// What a drain timeout does to the rest of the rollout.
    pub on_drain_timeout: OnDrainTimeout,
    /// `[health]` when the environment has the section: each returned node
    /// is watched and the cluster settles before `confirmed` (see
    /// [`super::health`]); `None` = done once Ready at the version.
    pub health: Option<HealthSpec>,
    /// What a node that fails its health checks after its upgrade becomes.
    pub on_failure: OnFailure,
    /// Nodes of the cluster that may be rolled back from the target before
    /// it halts with its nodes as they are.
    pub max_rollbacks: u32,
    /// The driver checks the target is available and downloads it before
    /// the drain (`[driver] prepare`, `prepare.rs`): a node is cordoned only
    /// once it is staged. False: it is cordoned first and the driver does
    /// everything while it is drained.
    pub prepare: bool,
    /// How long before a maintenance window opens the next nodes may
    /// prepare (`[driver] prestage`); zero = inside the window only.
    pub prestage: Duration,
    /// `[promotion] revoked` of the policy in force: no node is moved to,
    /// or rolled back to, one of these (nor a build-metadata variant).
    pub revoked: Vec<Version>,
    /// `[[drain]]`: the rungs a drain gives the pods each rule matches,
    /// and the pre-drain taint's lead (`config::drain`); empty = every pod
    /// evicted until `drain_timeout`.
    pub drain: Vec<crate::config::DrainRule>,
    /// `[rollout] consent_limit`: how long workload consent may hold a
    /// node before it is reported overdue (never forced); `None`: no limit.
    pub consent_limit: Option<Duration>,
}

impl Policy {
    /// The policy an environment file pins.
    pub fn from_env(env: &EnvConfig) -> Self {
        Policy {
            target: env.version.clone(),
            allow_downgrade: env.allow_downgrade,
            max_unavailable: env.rollout.max_unavailable,
            drain_timeout: env.rollout.drain_timeout,
            node_timeout: env.rollout.node_timeout,
            on_drain_timeout: env.rollout.on_drain_timeout,
            health: env.health.enabled.then(|| env.health.clone()),
            on_failure: env.rollout.on_failure,
            max_rollbacks: env.rollout.max_rollbacks,
            prepare: env.prepare.enabled,
            prestage: env.prepare.prestage,
            revoked: Vec::new(),
            drain: env.drain.clone(),
            consent_limit: env.rollout.consent_limit,
        }
    }

    /// The policy with `revoked` as the policy in force's revoked versions.
    pub fn with_revoked(mut self, revoked: Vec<Version>) -> Self {
        self.revoked = revoked;
        self
    }

    /// Whether `v` is revoked (it, or a build-metadata variant of it).
    pub fn is_revoked(&self, v: &Version) -> bool {
        self.revoked
            .iter()
            .any(|r| r.cmp_precedence(v) == std::cmp::Ordering::Equal)
    }
}

/// The window at the decision's `now`, computed by the caller with
/// [`crate::window::Calendar::state_at`].
pub use crate::window::WindowState;

/// Everything besides the nodes that decides whether a node may start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inputs {
    /// False when the gate or the trust check refused, or there is no trusted config.
    pub may_start: bool,
    /// Why `may_start` is false, for the status message.
    pub hold_reason: String,
    /// The environment is halted for the target (`crate::gate::wave`): no
    /// node starts, a node whose run started finishes, one still draining is given back, the state is `halted` with this
    /// message.
    pub halted: Option<String>,
    /// The cluster's wave waits for the one before it (`crate::gate::wave`):
    /// no node starts, the state is `pending` with this message.
    pub waiting: Option<String>,
    /// Which blocker the wave gate's `halted` or `waiting` is (`halted`,
    /// `evidence`, `wave`, `soak`); `None`: `halted` for `halted`, `wave`
    /// for `waiting`.
    pub wave_blocker: Option<Blocker>,
    /// The window at `now` for a change that is not a patch update.
    pub window: WindowState,
    /// The window at `now` for a patch update (same major.minor as every
    /// selected node runs), when it differs (a `minor` freeze); `None` = `window`.
    pub patch_window: Option<WindowState>,
    /// Health inputs of the watched nodes (those `watching` or `passed` at
    /// the target), from [`crate::cluster::Cluster::health`]; the engine
    /// fills it in.
    pub health: Vec<NodeSeen>,
    /// The latest outcome of every `[[health.prometheus]]` check, evaluated
    /// by the caller.
    pub queries: Vec<(PrometheusCheck, QueryOutcome)>,
    /// The nodes held by a fault of their own at the end of the previous
    /// step ([`super::Outcome::held`]); empty after a restart, which costs
    /// each failing call one more try.
    pub held: Vec<Held>,
}

/// How long a node that is not in flight goes after the other candidates
/// once a call that would have started it failed: a node whose cordon keeps
/// failing never takes the turn of the nodes behind it, and when every start
/// failed (an outage) the first is tried again at once.
pub const HELD_RETRY: Duration = Duration::from_secs(60);

/// A node held by a fault of its own: its observation was incomplete (its
/// pods could not be listed, its version not confirmed) or a call on it
/// failed (an eviction answered 403, its patch was refused). It keeps its
/// place (and its budget slot while in flight) and its timeouts; every other
/// node proceeds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Held {
    /// Node name.
    pub node: String,
    /// What failed, bounded ([`super::health::MAX_FAILURE_MESSAGE`]).
    pub why: String,
    /// When the node was first held (kept while it stays held).
    pub since: DateTime<Utc>,
    /// When it failed last; a node that is not in flight goes after the
    /// other candidates to start until [`HELD_RETRY`] after it.
    pub last: DateTime<Utc>,
}

/// One thing the engine must do to a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Record state=draining (the upgrade run planned), then cordon;
    /// `cordoned_by_drover` is false when the node was already unschedulable.
    Cordon {
        /// Node name.
        node: String,
        /// The progress to write.
        progress: NodeProgress,
    },
    /// Record state=preparing (a new attempt, its run planned), then start
    /// the driver's `prepare` run (the node stays in service, uncordoned):
    /// the target checked available and downloaded before the drain
    /// (`prepare.rs`).
    Prepare {
        /// Node name.
        node: String,
        /// The progress to write (its target and started-at identify the run).
        progress: NodeProgress,
    },
    /// Set the pre-drain taint on a draining node not cordoned yet (its
    /// lead before the cordon, a drain rule's `taint`).
    Taint {
        /// Node name.
        node: String,
    },
    /// One eviction pass, each pod by the rung of its drain rule in force
    /// for how long the node has been cordoned.
    Evict {
        /// Node name.
        node: String,
        /// When the node was cordoned (the drain's start, after the
        /// pre-drain taint's lead): the rungs count from it.
        cordoned_at: DateTime<Utc>,
    },
    /// Start the driver run the record planned (the upgrade the cordon's
    /// record names, or the rollback's): no record write, unless the
    /// record does not name it yet.
    StartUpgrade {
        /// Node name.
        node: String,
        /// The progress to write (its target and started-at identify the run).
        progress: NodeProgress,
    },
    /// The drain timed out: give the node back (uncordon if drover cordoned it), state=blocked.
    Block {
        /// Node name.
        node: String,
        /// The progress to write.
        progress: NodeProgress,
        /// Uncordon it, then record.
        uncordon: bool,
    },
    /// Ready at the target, its run finished: uncordon if drover cordoned
    /// it, then record it idle.
    Complete {
        /// Node name.
        node: String,
        /// Uncordon it, then record.
        uncordon: bool,
    },
    /// A node given back with its run stopped, now that nothing of the run
    /// is left: uncordon it, then record that it is no longer cordoned.
    Release {
        /// Node name.
        node: String,
        /// The progress to write (no cordon).
        progress: NodeProgress,
    },
    /// A draining node whose run has not started follows a new pin: its
    /// record (the same attempt, drain and cordon) names the run of the
    /// new target.
    Retarget {
        /// Node name.
        node: String,
        /// The progress to write (the new target).
        progress: NodeProgress,
    },
    /// Give a node back before anything started on it (its drain's pin was
    /// revoked with nothing newer admitted): uncordon if drover cordoned
    /// it, then record it idle.
    GiveBack {
        /// Node name.
        node: String,
        /// Uncordon it, then record.
        uncordon: bool,
        /// Why.
        reason: String,
    },
    /// A draining node is schedulable: its cordon was lost (the agent
    /// stopped between the record and the cordon, or a person uncordoned
    /// it). Cordon it again, the record claiming the cordon if it did not;
    /// nothing else happens to the node in this step, so no pod scheduled
    /// onto it meanwhile is left behind by its run.
    CordonAgain {
        /// Node name.
        node: String,
    },
    /// Delete the run the record says is stopped, whose delete did not land
    /// (its Job is still there): no record write.
    StopRun {
        /// Node name.
        node: String,
    },
    /// A person asked to clear the node's rolled-back marks: record it
    /// without them.
    ClearRolledBack {
        /// Node name.
        node: String,
    },
    /// The node did not reach the target: uncordon if drover cordoned it,
    /// state=failed. With `stop_run` its run may still act on it: the
    /// record (still cordoned) says the run is stopped, the run is deleted,
    /// and the node is uncordoned only once nothing of the run is left
    /// ([`Action::Release`]).
    Fail {
        /// Node name.
        node: String,
        /// The progress to write.
        progress: NodeProgress,
        /// Uncordon it, then record.
        uncordon: bool,
        /// Record, then delete its running run (no uncordon now).
        stop_run: bool,
    },
    /// Ready at the target with `[health]`: uncordon if drover cordoned it
    /// and record state=watching (also a retried health failure).
    Watch {
        /// Node name.
        node: String,
        /// The progress to write (`started_at` = the watch start).
        progress: NodeProgress,
        /// Uncordon it, then record.
        uncordon: bool,
    },
    /// The node's watch held for `pod_ready_timeout`: state=passed.
    Pass {
        /// Node name.
        node: String,
        /// The progress to write (`started_at` = when it passed).
        progress: NodeProgress,
    },
    /// A health check failed (docs/design.md §5a): state=failed, naming the
    /// check; the node stays in service, no further node starts.
    Unhealthy {
        /// Node name.
        node: String,
        /// The progress to write.
        progress: NodeProgress,
        /// The kind of check that failed (`node_condition`, `crash_loop`,
        /// `pod_not_ready`, `prometheus`).
        check: String,
    },
    /// A health check failed and the node is rolled back
    /// (`on_failure = "rollback"`, `rollback.rs`): record state=rolling-back
    /// (a new attempt, its rollback counted), then cordon it (if not already).
    RollBack {
        /// Node name.
        node: String,
        /// The progress to write (`previous` is where it goes back to).
        progress: NodeProgress,
        /// The kind of check that failed, as for [`Action::Unhealthy`]
        /// (`retry` when a person asked to retry a failed rollback).
        check: String,
    },
    /// Back and healthy at the previous version: uncordon (if drover
    /// cordoned it), then record state=failed naming the check and the
    /// node rolled back from every version of `rolled_back`, in one write.
    RolledBack {
        /// Node name.
        node: String,
        /// The progress to write.
        progress: NodeProgress,
        /// Every version the node was rolled back from, this one included.
        rolled_back: Vec<Version>,
        /// Uncordon it, then record.
        uncordon: bool,
    },
    /// The rollback failed (its driver, the version it would install was
    /// revoked, or the node did not come back healthy in time):
    /// state=failed, the node stays cordoned; a run still running is
    /// stopped.
    RollbackFailed {
        /// Node name.
        node: String,
        /// The progress to write (it keeps the cordon record).
        progress: NodeProgress,
        /// Record, then delete its running run.
        stop_run: bool,
    },
    /// Forget a record (retry requested, target changed, settled); a
    /// prepare still running is stopped first.
    Clear {
        /// Node name.
        node: String,
        /// Why.
        reason: String,
        /// Delete its running (prepare) run first.
        stop_run: bool,
    },
    /// Record the workload consent holding an idle or given-back node as
    /// drover sees it (`consent.rs`): when it first kept the node from
    /// starting, that it is past `consent_limit` (reported, never forced),
    /// or (`None`) that it no longer holds it. Nothing but the record.
    Consent {
        /// Node name.
        node: String,
        /// The hold to record; `None` clears it.
        hold: Option<crate::record::ConsentHold>,
    },
    /// Record why an in-flight node is held, or that it no longer is, in its
    /// message; its state and cordon stay as they are.
    Note {
        /// Node name.
        node: String,
        /// The progress to write (only its message differs).
        progress: NodeProgress,
    },
}

impl Action {
    /// The node the action is about.
    pub fn node(&self) -> &str {
        match self {
            Action::Cordon { node, .. }
            | Action::Prepare { node, .. }
            | Action::Evict { node, .. }
            | Action::StartUpgrade { node, .. }
            | Action::Block { node, .. }
            | Action::Complete { node, .. }
            | Action::Fail { node, .. }
            | Action::Watch { node, .. }
            | Action::Pass { node, .. }
            | Action::Unhealthy { node, .. }
            | Action::RollBack { node, .. }
            | Action::RolledBack { node, .. }
            | Action::RollbackFailed { node, .. }
            | Action::Clear { node, .. }
            | Action::Note { node, .. }
            | Action::Consent { node, .. }
            | Action::Release { node, .. }
            | Action::Retarget { node, .. }
            | Action::GiveBack { node, .. }
            | Action::StopRun { node }
            | Action::CordonAgain { node }
            | Action::Taint { node }
            | Action::ClearRolledBack { node } => node,
        }
    }

    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Cordon { .. } => "cordon",
            Action::Prepare { .. } => "prepare",
            Action::Evict { .. } => "evict",
            Action::StartUpgrade { .. } => "start_upgrade",
            Action::Block { .. } => "block",
            Action::Complete { .. } => "complete",
            Action::Fail { .. } => "fail",
            Action::Watch { .. } => "watch",
            Action::Pass { .. } => "pass",
            Action::Unhealthy { .. } => "unhealthy",
            Action::RollBack { .. } => "roll_back",
            Action::RolledBack { .. } => "rolled_back",
            Action::RollbackFailed { .. } => "rollback_failed",
            Action::Clear { .. } => "clear",
            Action::Note { .. } => "note",
            Action::Release { .. } => "release",
            Action::Retarget { .. } => "retarget",
            Action::GiveBack { .. } => "give_back",
            Action::StopRun { .. } => "stop_run",
            Action::CordonAgain { .. } => "cordon_again",
            Action::Taint { .. } => "taint",
            Action::ClearRolledBack { .. } => "clear_rolled_back",
            Action::Consent { .. } => "consent",
        }
    }

    /// Whether the decision stops counting the node against the budget once
    /// this action lands: if it fails, the node still counts (see
    /// [`Decision::starts_within_budget`]).
    pub fn gives_back(&self) -> bool {
        matches!(
            self,
            Action::Block { .. }
                | Action::Fail {
                    stop_run: false,
                    ..
                }
                | Action::Complete { .. }
                | Action::Pass { .. }
                | Action::Unhealthy { .. }
                | Action::RolledBack { .. }
                | Action::Clear { .. }
                | Action::Release { .. }
                | Action::GiveBack { .. }
        )
    }
}

/// A node drover leaves alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Node name.
    pub node: String,
    /// Why it is not touched.
    pub reason: String,
    /// The reason's word from the closed list.
    pub blocker: Blocker,
}

/// A node held by workload consent past the environment's `consent_limit`:
/// reported, never forced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsentOverdue {
    /// Node name.
    pub node: String,
    /// When drover first saw the consent hold the node (its record's).
    pub since: DateTime<Utc>,
    /// The limit it is past.
    #[serde(serialize_with = "words")]
    pub limit: Duration,
}

fn words<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

/// The decision for one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// What to do, in order: give nodes back first, then advance, then start
    /// new ones (the starts, [`Action::Cordon`] then [`Action::Prepare`],
    /// always come last).
    pub actions: Vec<Action>,
    /// The environment's state for the status report.
    pub state: RolloutState,
    /// Why the state is what it is (empty when rolling or confirmed).
    pub message: String,
    /// Why the cluster is not progressing, when it is not (`pending`,
    /// `paused`, `blocked`, `failed`, `halted`); `None` while it rolls,
    /// settles or is confirmed.
    pub blocker: Option<Blocker>,
    /// Selected nodes.
    pub nodes: u32,
    /// Selected nodes Ready at the target.
    pub nodes_at_version: u32,
    /// The budget resolved against the selected nodes.
    pub max_unavailable: u32,
    /// Nodes counted against the budget once the actions are applied.
    pub unavailable: u32,
    /// Nodes left alone.
    pub skipped: Vec<Skipped>,
    /// The next instant at which the decision changes by time alone (a
    /// timeout, a window opening or closing); events on nodes come on top.
    pub wake_at: Option<DateTime<Utc>>,
    /// A health watch or settle is running: pods and Prometheus are polled,
    /// so decide again within [`super::health::HEALTH_RECHECK`] (a backend
    /// whose health changes only at its own events may ignore this).
    pub poll_health: bool,
    /// Nodes held by a fault of their own, by name: an incomplete
    /// observation now, or a failed call of an earlier step that still holds.
    pub held: Vec<Held>,
    /// Nodes workload consent has held past `consent_limit`, by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub consent_overdue: Vec<ConsentOverdue>,
}

impl Decision {
    /// How many of the decision's starts may still be applied once `failed`
    /// of its give-backs ([`Action::gives_back`]) did not land: each of those
    /// nodes still counts against the budget the starts were chosen within,
    /// so the last starts are dropped until the budget holds again.
    pub fn starts_within_budget(&self, failed: usize) -> usize {
        let starts = self
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Cordon { .. }))
            .count();
        let before = (self.unavailable as usize).saturating_sub(starts);
        let room = (self.max_unavailable as usize).saturating_sub(before.saturating_add(failed));
        starts.min(room)
    }
}
