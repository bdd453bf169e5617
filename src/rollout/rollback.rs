//! Automatic rollback (docs/design.md §5b): what becomes of a node that
//! failed its health checks after its upgrade when the environment says
//! `on_failure = "rollback"`, and of a node being rolled back.
//!
//! - A node that fails a health check while it runs the target (its watch,
//!   a `passed` node turning NotReady, a failure pinned on it at settle) is
//!   recorded `rolling-back` and cordoned ([`Action::RollBack`]) when its
//!   record names the version it ran before (recorded by drover when it
//!   started the node), that version is not revoked, a window is open, the
//!   budget has room (a `passed` node's place is judged once every node is
//!   counted, [`wanted`]), and fewer than `max_rollbacks` rollbacks were started
//!   from the target on the cluster's nodes (counted from the records:
//!   failed ones and retries included); otherwise it is recorded `failed`
//!   in service, as with `halt`, and the message says why it was not rolled
//!   back (the circuit breaker: the cluster halts with its nodes as they are).
//! - A `rolling-back` node is drained, then the driver's run for the
//!   previous version starts ([`crate::cluster::NodeProgress::run_version`])
//!   inside a window, that version checked against `revoked` again at that
//!   moment (revoked: the rollback fails, the node stays cordoned);
//!   once the node is Ready at the previous version and its health checks
//!   hold there (no node condition, no pod crash-looping or overdue), it is
//!   uncordoned and marked rolled back from the target
//!   ([`Action::RolledBack`]): it keeps a `failed` record naming the check,
//!   and no node of the cluster starts the target again (`start.rs` never
//!   starts a node at a version it was rolled back from).
//! - A rollback whose driver fails, or that does not bring the node back
//!   healthy within `node_timeout`, leaves the node cordoned at whatever it
//!   runs, recorded `failed` with [`ROLLBACK_FAILED_PREFIX`]: drover never
//!   uncordons a node at the version it failed. `drover.dev/retry` on its
//!   record tries the rollback again, within `max_rollbacks`. It counts
//!   against `max_unavailable` while it stays cordoned.
//!
//! The cluster reports `failed` for the target from the first failure on,
//! for as long as a node is rolling back, failed, or marked rolled back from
//! it: only a new version (or a person removing the mark) ends it.

use super::decision::{Action, Held};
use super::health::bounded;
use super::held;
use super::tally::{elapsed, fmt_duration, given_back_as, skip, Ctx, Tally, Wanted};
use super::Blocker;
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::OnFailure;
use crate::health::{observe, Verdict};
use semver::Version;

/// How the message of a node whose rollback failed begins.
pub const ROLLBACK_FAILED_PREFIX: &str = "rollback failed: ";
/// How the message of a node rolled back begins.
pub const ROLLED_BACK_PREFIX: &str = "rolled back to ";

/// How many rollbacks from `target` were started on `nodes`, from their
/// records (failed ones and retries included; a node marked rolled back
/// from it had one at least): what the circuit breaker counts against
/// `max_rollbacks`.
pub(super) fn count(nodes: &[&NodeView], target: &Version) -> usize {
    nodes
        .iter()
        .map(|n| {
            let started: u32 = n
                .rollbacks
                .iter()
                .filter(|r| r.version == *target)
                .map(|r| r.started)
                .sum();
            started.max(u32::from(n.rolled_back.contains(target))) as usize
        })
        .sum()
}

/// [`count`] for every version but `target` that rollbacks were started from.
pub(super) fn earlier_counts(
    nodes: &[&NodeView],
    target: &Version,
) -> std::collections::BTreeMap<Version, usize> {
    let mut from: Vec<&Version> = nodes
        .iter()
        .flat_map(|n| n.rollbacks.iter().map(|r| &r.version).chain(&n.rolled_back))
        .filter(|v| *v != target)
        .collect();
    from.sort();
    from.dedup();
    from.into_iter()
        .map(|v| (v.clone(), count(nodes, v)))
        .collect()
}

/// Node `n`, recorded `p` at the target, failed health check `check` with
/// `msg` (already prefixed and bounded): roll it back or record it failed in
/// service. Returns whether it is rolled back (it then counts against the
/// budget and is in flight), or waits to be judged with the budget whole.
pub(super) fn failed_health<'a>(
    ctx: &Ctx<'_>,
    n: &'a NodeView,
    p: &NodeProgress,
    msg: String,
    check: &str,
    t: &mut Tally<'a>,
) -> bool {
    // A passed node's rollback takes a place: the nodes after it in name
    // order are not counted yet (simulation seed 553).
    if t.counting && p.state != ProgressState::Watching {
        t.wanted.push(Wanted {
            node: n,
            progress: p.clone(),
            msg,
            check: check.into(),
        });
        return true;
    }
    let policy = ctx.policy;
    let (action, why) = match why_not(ctx, n, p, t) {
        None => {
            let previous = p.previous.clone().unwrap_or_else(|| p.target.clone());
            t.rollbacks += 1;
            t.in_flight = true;
            t.unavailable += 1;
            let why = bounded(format!("{msg}; rolling back to {previous}"));
            let progress = NodeProgress {
                state: ProgressState::RollingBack,
                target: p.target.clone(),
                started_at: ctx.now,
                cordoned_by_drover: !n.unschedulable,
                message: msg,
                retries: p.retries,
                previous: Some(previous),
            };
            (
                Action::RollBack {
                    node: n.name.clone(),
                    progress,
                    check: check.into(),
                },
                why,
            )
        }
        Some(not) => {
            let msg = if policy.on_failure == OnFailure::Rollback {
                bounded(format!("{msg}; {not}"))
            } else {
                msg
            };
            let action = Action::Unhealthy {
                node: n.name.clone(),
                progress: given_back_as(p, ProgressState::Failed, ctx.now, msg.clone()),
                check: check.into(),
            };
            (action, msg)
        }
    };
    let rolled = matches!(action, Action::RollBack { .. });
    t.failed.get_or_insert((n.name.clone(), why));
    t.releases.push(action);
    rolled
}

/// Judge the passed nodes that failed, once every node is counted: each
/// rolled back while the budget has room, in name order; the others
/// recorded failed in service, counted while NotReady.
pub(super) fn wanted<'a>(ctx: &Ctx<'_>, t: &mut Tally<'a>) {
    for w in std::mem::take(&mut t.wanted) {
        if !failed_health(ctx, w.node, &w.progress, w.msg, &w.check, t) {
            t.unavailable += usize::from(!w.node.ready);
        }
    }
}

/// Why node `n` is not rolled back, or `None` when it is.
fn why_not(ctx: &Ctx<'_>, n: &NodeView, p: &NodeProgress, t: &Tally<'_>) -> Option<String> {
    let policy = ctx.policy;
    if policy.on_failure != OnFailure::Rollback {
        return Some("on_failure = \"halt\"".into());
    }
    if n.version.as_ref() != Some(&p.target) {
        return Some("not rolled back: it no longer runs the version that failed".into());
    }
    match &p.previous {
        None => {
            return Some(
                "not rolled back: the version it ran before was not recorded when it started"
                    .into(),
            )
        }
        Some(prev) if *prev == p.target => {
            return Some("not rolled back: it ran this version before".into())
        }
        Some(prev) if policy.is_revoked(prev) => {
            return Some(format!(
                "not rolled back: the version it ran before, {prev}, is revoked"
            ))
        }
        Some(_) => {}
    }
    if t.rollbacks >= policy.max_rollbacks as usize {
        return Some(format!(
            "max_rollbacks ({}) reached: the cluster halts with its nodes as they are",
            policy.max_rollbacks
        ));
    }
    if !ctx.win.is_open() {
        return Some("not rolled back: no maintenance window is open".into());
    }
    // A watched node counts already; a passed one would take a place.
    let counted = p.state == ProgressState::Watching;
    if !counted && t.unavailable >= ctx.budget {
        return Some(format!(
            "not rolled back: max_unavailable ({}) has no room",
            ctx.budget
        ));
    }
    None
}

/// A node recorded `rolling-back`: drained, its driver run for the previous
/// version, then checked and marked, or left cordoned when that fails.
pub(super) fn rolling_back(
    ctx: &Ctx<'_>,
    n: &NodeView,
    p: &NodeProgress,
    hold: Option<&Held>,
    t: &mut Tally<'_>,
) {
    let previous = p.run_version();
    if p.target == *ctx.target {
        t.failed.get_or_insert_with(|| {
            (
                n.name.clone(),
                bounded(format!("{}; rolling back to {previous}", p.message)),
            )
        });
    }
    let (timed_out, deadline) = elapsed(ctx.now, p.started_at, ctx.policy.node_timeout);
    // Back once Ready at the previous version and its driver's run is over:
    // the run's record (its Job) is kept, finished, for whoever looks.
    let back = n.fault.is_none()
        && n.ready
        && n.version.as_ref() == Some(previous)
        && n.upgrade != UpgradeStatus::Running;
    // The run's own verdict first, whatever else of the view failed, as
    // for an upgrade (`in_flight::upgrading`, simulation seed 11347).
    let failure = if let UpgradeStatus::Failed(m) = &n.upgrade {
        Some(format!("its driver failed: {m}"))
    } else if back {
        match healthy_at_previous(ctx, n, p) {
            Ok(()) => return rolled_back(n, p, t, ctx),
            Err(why) if timed_out => Some(format!(
                "back at {previous} but not healthy within node_timeout ({}): {why}",
                fmt_duration(ctx.policy.node_timeout)
            )),
            Err(_) => None,
        }
    } else if timed_out && n.upgrade == UpgradeStatus::NotStarted {
        // Its run waited for a window the whole time: say that, not that
        // the node failed to come back from a run it never had.
        let why = match (&ctx.win.held, ctx.win.is_open()) {
            (Some(h), _) => format!(": {h}"),
            (None, false) => ": no maintenance window was open".to_string(),
            (None, true) => String::new(),
        };
        Some(format!(
            "its run to {previous} did not start within node_timeout ({}){why}",
            fmt_duration(ctx.policy.node_timeout)
        ))
    } else if timed_out {
        Some(format!(
            "node did not return Ready at {previous} within node_timeout ({})",
            fmt_duration(ctx.policy.node_timeout)
        ))
    } else {
        None
    };
    let failure = failure.or_else(|| {
        // Checked again as its run would start: never to a revoked version.
        (n.upgrade == UpgradeStatus::NotStarted && ctx.policy.is_revoked(previous)).then(|| {
            format!("the version it would roll back to, {previous}, is revoked: not started")
        })
    });
    if let Some(why) = failure {
        return rollback_failed(ctx, n, p, why, t);
    }
    t.in_flight = true;
    t.unavailable += 1;
    t.wake.at(deadline);
    t.poll_health |= back;
    let message = held::message_for(p, hold);
    // Its run starts inside a window only (it waits, cordoned, for one;
    // `node_timeout` still applies).
    let may_run = ctx.win.is_open() || n.pods_to_evict > 0;
    if n.fault.is_some() || back || n.upgrade != UpgradeStatus::NotStarted || !may_run {
        if let Some(m) = message {
            t.advances.push(held::note(n, p, m));
        }
        return;
    }
    if !n.unschedulable {
        // Its cordon was lost before its run started: cordoned again first.
        t.advances.push(Action::CordonAgain {
            node: n.name.clone(),
        });
        return;
    }
    // A rollback drains a node cordoned at its start: no taint's lead.
    super::in_flight::evict_or_start(n, p, p.started_at, message, p.clone(), t);
}

/// Whether node `n`, Ready at its previous version, passes the health
/// checks there: no failing node condition, no pod crash-looping or past
/// its Ready deadline since the rollback started.
fn healthy_at_previous(ctx: &Ctx<'_>, n: &NodeView, p: &NodeProgress) -> Result<(), String> {
    let Some(spec) = ctx.health else {
        return Ok(());
    };
    let seen = ctx
        .inputs
        .health
        .iter()
        .find(|s| s.name == n.name)
        .ok_or_else(|| format!("no health observation of node {}", n.name))?;
    if let Some(why) = &seen.unread {
        return Err(why.clone());
    }
    let mut node = observe::watched(seen, p.started_at);
    // The restarts counted at the failed version are not the old one's:
    // its pods are judged by what they show now (crash-looping, not Ready).
    for pod in &mut node.pods {
        pod.restarts_at_start = pod.restarts;
    }
    let verdict = crate::health::judge(&crate::health::Observation {
        spec,
        watch_until: ctx.now,
        nodes: &[node],
        queries: &[],
        now: ctx.now,
    });
    match verdict {
        Verdict::Healthy => Ok(()),
        Verdict::Unhealthy(f) => Err(f.to_string()),
        Verdict::Held(why) => Err(why),
        Verdict::Watching { .. } => Err("its pods are not Ready yet".into()),
    }
}

/// Back and healthy at the previous version: uncordon and mark.
fn rolled_back(n: &NodeView, p: &NodeProgress, t: &mut Tally<'_>, ctx: &Ctx<'_>) {
    let previous = p.run_version().clone();
    let msg = bounded(format!("{ROLLED_BACK_PREFIX}{previous}: {}", p.message));
    if p.target == *ctx.target {
        // What this node came to replaces the "rolling back" said of it.
        if t.failed.as_ref().is_none_or(|(node, _)| *node == n.name) {
            t.failed = Some((n.name.clone(), msg.clone()));
        }
    }
    let mut marks = n.rolled_back.clone();
    if !marks.contains(&p.target) {
        marks.push(p.target.clone());
    }
    t.releases.push(Action::RolledBack {
        node: n.name.clone(),
        progress: NodeProgress {
            state: ProgressState::Failed,
            started_at: ctx.now,
            cordoned_by_drover: false,
            message: msg,
            ..p.clone()
        },
        rolled_back: marks,
        uncordon: p.cordoned_by_drover,
    });
}

/// The rollback failed: the node stays cordoned (and counted against the
/// budget) and is named; a run still running is stopped.
fn rollback_failed(ctx: &Ctx<'_>, n: &NodeView, p: &NodeProgress, why: String, t: &mut Tally<'_>) {
    t.unavailable += 1;
    let msg = bounded(format!(
        "{ROLLBACK_FAILED_PREFIX}{why}; left cordoned (it failed at {}: {})",
        p.target, p.message
    ));
    if p.target == *ctx.target {
        t.failed = Some((n.name.clone(), msg.clone()));
    }
    t.releases.push(Action::RollbackFailed {
        node: n.name.clone(),
        progress: NodeProgress {
            state: ProgressState::Failed,
            started_at: ctx.now,
            message: msg,
            ..p.clone()
        },
        stop_run: n.upgrade == UpgradeStatus::Running,
    });
}

/// Whether `p` records a rollback that failed (the node left cordoned).
pub(super) fn failed_record(p: &NodeProgress) -> bool {
    p.state == ProgressState::Failed && p.message.starts_with(ROLLBACK_FAILED_PREFIX)
}

/// A node whose rollback failed: left as it is, named; `drover.dev/retry`
/// on it starts the rollback again. Returns false when `p` is no such record.
pub(super) fn after_failed_rollback(
    ctx: &Ctx<'_>,
    n: &NodeView,
    p: &NodeProgress,
    t: &mut Tally<'_>,
) -> bool {
    if !failed_record(p) {
        return false;
    }
    // Still cordoned by drover at the version it failed: it counts.
    let cordoned = p.cordoned_by_drover && n.unschedulable;
    t.unavailable += usize::from(cordoned || !n.ready);
    if n.upgrade == UpgradeStatus::StopPending {
        // Its run was stopped and the delete did not land: sent again.
        t.advances.push(Action::StopRun {
            node: n.name.clone(),
        });
    }
    let stopping = matches!(
        n.upgrade,
        UpgradeStatus::Stopping | UpgradeStatus::StopPending
    );
    // Counted for the version it is rolled back from, which a new pin may
    // have left behind, not for the pin.
    let used = if p.target == *ctx.target {
        t.rollbacks
    } else {
        t.earlier_rollbacks.get(&p.target).copied().unwrap_or(0)
    };
    let refused = if !n.retry {
        None
    } else if stopping {
        Some("its stopped rollback run is still there".to_string())
    } else if p.previous.is_none() {
        Some("the version it ran before was not recorded".to_string())
    } else if used >= ctx.policy.max_rollbacks as usize {
        Some(format!(
            "max_rollbacks ({}) reached: {} rollbacks from {} started; a reviewed change raising \
             max_rollbacks allows another",
            ctx.policy.max_rollbacks, used, p.target
        ))
    } else if p
        .previous
        .as_ref()
        .is_some_and(|v| ctx.policy.is_revoked(v))
    {
        Some("the version it ran before is revoked".into())
    } else if !ctx.win.is_open() {
        Some("no maintenance window is open".into())
    } else {
        None
    };
    if n.retry && refused.is_none() {
        if p.target == *ctx.target {
            t.rollbacks += 1;
        } else {
            *t.earlier_rollbacks.entry(p.target.clone()).or_default() += 1;
        }
        t.in_flight = true;
        t.unavailable += usize::from(!cordoned && n.ready);
        t.releases.push(Action::RollBack {
            node: n.name.clone(),
            progress: NodeProgress {
                state: ProgressState::RollingBack,
                started_at: ctx.now,
                cordoned_by_drover: p.cordoned_by_drover || !n.unschedulable,
                ..p.clone()
            },
            check: "retry".into(),
        });
        return true;
    }
    let said = match refused {
        Some(why) => bounded(format!("{}; retry not started: {why}", p.message)),
        None => p.message.clone(),
    };
    if p.target == *ctx.target {
        t.failed.get_or_insert((n.name.clone(), said.clone()));
    }
    t.skipped.push(skip(n, Blocker::of_failure(&said), said));
    true
}

/// Whether `n` may be started at `target`: never at a version it was
/// rolled back from.
pub(super) fn may_start(n: &NodeView, target: &Version) -> bool {
    !n.rolled_back.contains(target)
}

/// An idle node rolled back from the target: named, and the cluster stays
/// `failed` for the target.
pub(super) fn idle_rolled_back(n: &NodeView, target: &Version, t: &mut Tally<'_>) {
    let msg = format!(
        "rolled back from {target}: not moved to it again (annotate its DroverNode \
         drover.dev/clear-rolled-back to allow it)"
    );
    t.failed.get_or_insert((n.name.clone(), msg.clone()));
    t.skipped.push(skip(n, Blocker::Health, msg));
}
