//! What every question of the decision shares (`decide.rs` asks them, the
//! state files answer): the step's context ([`Ctx`]), the tally they write
//! into ([`Tally`]), and the small helpers they all use. A leaf: it imports
//! none of the state files, so they need not import `decide.rs`, nor each
//! other through it.

use super::decision::{Action, Held, Inputs, Policy, Skipped};
use super::Blocker;
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::HealthSpec;
use crate::health::Verdict;
use crate::window::WindowState;
use chrono::{DateTime, Utc};
use semver::Version;
use std::time::Duration;

/// Whether `limit` has passed since `since` at `now`, and the deadline.
pub(super) fn elapsed(
    now: DateTime<Utc>,
    since: DateTime<Utc>,
    limit: Duration,
) -> (bool, DateTime<Utc>) {
    let deadline = add(since, limit);
    (now >= deadline, deadline)
}

/// `t + d`, saturating at the largest instant.
pub(super) fn add(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    let d = chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
    t.checked_add_signed(d).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

pub(super) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

pub(super) fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// What every question of one step reads: the policy, the inputs, the
/// instant and what follows from them once.
pub(super) struct Ctx<'a> {
    pub policy: &'a Policy,
    pub inputs: &'a Inputs,
    pub now: DateTime<Utc>,
    pub target: &'a Version,
    /// The window that applies to this change (patch or not).
    pub win: &'a WindowState,
    /// `[health]`, when the environment has it.
    pub health: Option<&'a HealthSpec>,
    /// The Prometheus checks' verdict (with `[health]` only).
    pub queries: Option<Verdict>,
    /// `max_unavailable` resolved against the selected nodes.
    pub budget: usize,
}

/// What the answers for each node add up to; the conclusion reads it.
pub(super) struct Tally<'a> {
    /// Give-backs and completions, applied first.
    pub releases: Vec<Action>,
    /// Steps of nodes in flight.
    pub advances: Vec<Action>,
    pub skipped: Vec<Skipped>,
    /// Nodes counted against the budget.
    pub unavailable: usize,
    /// Some node is still moving (draining, upgrading, watched, rolling
    /// back, or given back): the rollout is `rolling`. A flag, set where a
    /// node is found moving and never taken back: a node's state function
    /// decides its outcome before it says so.
    pub in_flight: bool,
    /// Never-attempted nodes that may start, in name order.
    pub fresh: Vec<&'a NodeView>,
    /// Blocked nodes whose retry may start.
    pub blocked_retry: Vec<&'a NodeView>,
    /// The first failed node and why: no node starts.
    pub failed: Option<(String, String)>,
    /// The first node blocked in this window under `on_drain_timeout = "stop"`.
    pub stop_blocked: Option<(String, String)>,
    /// The first blocked node and why, for the state message.
    pub blocked_msg: Option<String>,
    pub at_version: usize,
    /// Every node is done so far (at least one selected).
    pub confirmed: bool,
    /// Nodes that passed their watch, with when.
    pub passed: Vec<(&'a NodeView, DateTime<Utc>)>,
    /// The first watch in progress, for the message.
    pub watch_msg: Option<String>,
    /// Why the health checks hold.
    pub health_hold: Option<String>,
    /// A firing query was pinned on a watched node.
    pub query_pinned: bool,
    pub poll_health: bool,
    /// Settling until then.
    pub settling: Option<DateTime<Utc>>,
    pub wake: WakeAt,
    /// Nodes held by a fault of their own, in name order.
    pub held: Vec<Held>,
    /// Of the skipped nodes, those their workload asks drover to wait on.
    pub consent_held: usize,
    /// Their names (`consent.rs`).
    pub consent_nodes: std::collections::BTreeSet<String>,
    /// Those held past `consent_limit`, in name order.
    pub consent_overdue: Vec<super::decision::ConsentOverdue>,
    /// Rollbacks started from the target (from the records), this step's
    /// included: what `max_rollbacks` is counted against.
    pub rollbacks: usize,
    /// The same count for the versions a new pin left behind: a node whose
    /// rollback from one of them failed is retried against its own count.
    pub earlier_rollbacks: std::collections::BTreeMap<semver::Version, usize>,
    /// Nodes whose prepare run is under way, in name order (`prepare.rs`).
    pub preparing: Vec<&'a NodeView>,
    /// Nodes being drained, by name, in name order: the status says so
    /// (their `Draining` is logged, not published as an Event).
    pub draining: Vec<String>,
    /// Nodes whose prepare run succeeded: they start first, in name order.
    pub staged: Vec<&'a NodeView>,
    /// Passed nodes that failed, whose rollback would take a place: judged
    /// once every node is counted (`rollback::wanted`), in name order.
    pub wanted: Vec<Wanted<'a>>,
    /// The nodes are still being counted (the decision's loop).
    pub counting: bool,
}

/// A passed node that failed, waiting for the whole budget
/// (`rollback::wanted`).
pub(super) struct Wanted<'a> {
    pub node: &'a NodeView,
    pub progress: NodeProgress,
    pub msg: String,
    pub check: String,
}

/// The earliest instant the decision asks to be woken at (its `wake_at`).
pub(super) struct WakeAt(pub Option<DateTime<Utc>>);

impl WakeAt {
    pub fn at(&mut self, t: DateTime<Utc>) {
        self.0 = Some(self.0.map_or(t, |w| w.min(t)));
    }
}

pub(super) fn skip(n: &NodeView, blocker: Blocker, reason: String) -> Skipped {
    Skipped {
        node: n.name.clone(),
        reason,
        blocker,
    }
}

/// The record of a node given back (blocked or failed) at `now`, saying why.
pub(super) fn given_back_as(
    p: &NodeProgress,
    state: ProgressState,
    now: DateTime<Utc>,
    msg: String,
) -> NodeProgress {
    NodeProgress {
        state,
        target: p.target.clone(),
        started_at: now,
        cordoned_by_drover: false,
        message: msg,
        retries: p.retries,
        previous: p.previous.clone(),
    }
}

/// How long a node given back after a drain timeout waits before its
/// retry number `attempts + 1`: 5 minutes, doubling, at most 2 hours.
pub fn retry_backoff(attempts: u32) -> Duration {
    let base = Duration::from_secs(5 * 60);
    base.saturating_mul(1u32 << attempts.min(5))
        .min(Duration::from_secs(2 * 3600))
}

/// Give `n` back failed, as `failed`: when its run may still act on it
/// (running), the record says failed with the run stopped and the node
/// still cordoned, and the run is deleted: the node is uncordoned once
/// nothing of it is left ([`Action::Release`]); it still counts against
/// the budget meanwhile. Returns whether it was given back now.
pub(super) fn fail(
    n: &NodeView,
    p: &NodeProgress,
    failed: NodeProgress,
    t: &mut Tally<'_>,
) -> bool {
    let running = n.upgrade == UpgradeStatus::Running;
    t.releases.push(Action::Fail {
        node: n.name.clone(),
        uncordon: p.cordoned_by_drover && !running,
        stop_run: running,
        progress: NodeProgress {
            // Still drover's cordon until it is released.
            cordoned_by_drover: p.cordoned_by_drover && running,
            ..failed
        },
    });
    !running
}

/// The rolling message while nodes download before their drain.
pub(super) fn preparing_message(t: &Tally<'_>) -> Option<String> {
    if t.preparing.is_empty() {
        return None;
    }
    let names: Vec<&str> = t.preparing.iter().map(|n| n.name.as_str()).collect();
    Some(super::health::bounded(format!(
        "downloading the update before the drain: {}",
        names.join(", ")
    )))
}

/// The record of a node whose health watch starts at `now`.
pub(super) fn watching(p: &NodeProgress, now: DateTime<Utc>) -> NodeProgress {
    NodeProgress {
        state: ProgressState::Watching,
        target: p.target.clone(),
        started_at: now,
        cordoned_by_drover: false,
        message: String::new(),
        retries: p.retries,
        previous: p.previous.clone(),
    }
}
