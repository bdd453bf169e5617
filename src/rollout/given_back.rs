//! What becomes of a node drover gave back: a `failed` one holds the
//! rollout until `drover.dev/retry` or a new target; a `blocked` one (its
//! drain timed out) is tried again.
//!
//! Choices where docs/design.md is silent:
//! - With `on_drain_timeout = "skip"` a blocked node is tried again once no
//!   never-attempted node is left to start, and not before its backoff
//!   ([`super::tally::retry_backoff`]: 5 minutes after the first give-back, doubling per
//!   retry, at most 2 hours; the first retry comes earlier when every budget
//!   covering the node's pods allows a disruption again), so a budget that
//!   never relents cannot keep a node cordoned in a loop.
//! - With `stop` no node starts while a node blocked in the current window
//!   (or since it opened) remains, and a node blocked before the current
//!   window opened is eligible again, first.
//! - A retry annotation or a new target clears blocked and failed records at
//!   once; a retried node already at the version is watched again (with
//!   `[health]`) rather than taken for healthy.

use super::decision::Action;
use super::held;
use super::tally::{add, rfc3339, skip, Ctx, Tally};
use super::Blocker;

use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::OnDrainTimeout;
use std::time::Duration;

/// A node recorded `blocked` or `failed`.
pub(super) fn node<'a>(
    ctx: &Ctx<'_>,
    n: &'a NodeView,
    p: &NodeProgress,
    at_target: bool,
    t: &mut Tally<'a>,
) {
    let target = ctx.target;
    let name = n.name.clone();
    if super::rollback::after_failed_rollback(ctx, n, p, t) {
        return;
    }
    if p.cordoned_by_drover && n.unschedulable {
        return release(ctx, n, p, t);
    }
    t.unavailable += usize::from(!n.ready);
    if n.retry
        && p.state == ProgressState::Failed
        && p.target == *target
        && ctx.health.is_some()
        && n.ready
        && at_target
    {
        t.releases.push(Action::Watch {
            node: name,
            progress: super::tally::watching(p, ctx.now),
            uncordon: false,
        });
        t.in_flight = true;
        t.unavailable += 1;
        t.poll_health = true;
        return;
    }
    if p.target != *target || n.retry {
        let reason = if n.retry {
            "retry requested".to_string()
        } else {
            format!("target changed from {} to {target}", p.target)
        };
        t.releases.push(Action::Clear {
            node: name,
            reason,
            stop_run: false,
        });
        return;
    }
    if p.state == ProgressState::Failed {
        t.failed.get_or_insert((n.name.clone(), p.message.clone()));
        t.skipped.push(skip(
            n,
            Blocker::of_failure(&p.message),
            format!("failed: {}", p.message),
        ));
        return;
    }
    blocked(ctx, n, p, t);
}

/// How soon a node given back with its run stopped is looked at again
/// while something of the run is left (its pods terminate within their
/// grace period).
pub const STOP_RECHECK: Duration = Duration::from_secs(5);

/// A node given back whose cordon is still drover's: its run was stopped
/// (a timeout) and is uncordoned once nothing of the run is left; until
/// then it stays cordoned and counts against the budget.
fn release(ctx: &Ctx<'_>, n: &NodeView, p: &NodeProgress, t: &mut Tally<'_>) {
    if matches!(
        n.upgrade,
        UpgradeStatus::Stopping | UpgradeStatus::StopPending
    ) {
        if n.upgrade == UpgradeStatus::StopPending {
            // Its delete did not land: sent again (once per observation
            // that shows the Job alive).
            t.advances.push(Action::StopRun {
                node: n.name.clone(),
            });
        }
        t.unavailable += 1;
        t.in_flight = true;
        t.wake.at(add(ctx.now, STOP_RECHECK));
        t.skipped.push(skip(
            n,
            Blocker::Driver,
            "given back; its stopped run is still there, so it stays cordoned".into(),
        ));
        if p.state == ProgressState::Failed {
            t.failed.get_or_insert((n.name.clone(), p.message.clone()));
        }
        return;
    }
    t.unavailable += usize::from(!n.ready);
    if p.state == ProgressState::Failed {
        t.failed.get_or_insert((n.name.clone(), p.message.clone()));
    }
    t.releases.push(Action::Release {
        node: n.name.clone(),
        progress: NodeProgress {
            cordoned_by_drover: false,
            ..p.clone()
        },
    });
}

/// A blocked node: waiting out its backoff, held by `stop`, or ready to retry.
fn blocked<'a>(ctx: &Ctx<'_>, n: &'a NodeView, p: &NodeProgress, t: &mut Tally<'a>) {
    let policy = ctx.policy;
    let held_by_stop = match policy.on_drain_timeout {
        OnDrainTimeout::Skip => false,
        OnDrainTimeout::Stop => ctx
            .win
            .opened_at
            .is_none_or(|opened| p.started_at >= opened),
    };
    let retry_at = add(p.started_at, super::tally::retry_backoff(p.retries));
    // Budgets that allow a disruption again cut only the first wait short:
    // a budget that relents only because the node was given back must not
    // turn retries into a loop. A node given back while held by a fault of
    // its own was not waiting for its budgets: it waits out its backoff.
    let relented = n.budgets_allow_drain && p.retries == 0 && !held::gave_back_held(&p.message);
    let backing_off =
        policy.on_drain_timeout == OnDrainTimeout::Skip && ctx.now < retry_at && !relented;
    t.blocked_msg.get_or_insert_with(|| {
        let next = if backing_off {
            format!("; next try after {}", rfc3339(retry_at))
        } else {
            String::new()
        };
        format!(
            "node {} blocked since {}: {}{next}",
            n.name,
            rfc3339(p.started_at),
            p.message
        )
    });
    if backing_off {
        t.wake.at(retry_at);
        t.skipped.push(skip(
            n,
            Blocker::Pdb,
            format!("blocked, next try after {}", rfc3339(retry_at)),
        ));
    } else if held_by_stop {
        t.stop_blocked
            .get_or_insert((n.name.clone(), p.message.clone()));
        t.skipped
            .push(skip(n, Blocker::Pdb, format!("blocked: {}", p.message)));
    } else if n.consent_paused {
        // A retry is a start: the workload's consent holds it as it holds
        // an idle node.
        super::consent::held(ctx, n, t);
    } else if n.unschedulable {
        t.skipped.push(skip(
            n,
            Blocker::Foreign,
            "blocked, and cordoned by someone else".into(),
        ));
    } else if !n.ready {
        t.skipped
            .push(skip(n, Blocker::Health, "blocked, and NotReady".into()));
    } else if let Some(f) = &n.fault {
        t.skipped.push(skip(
            n,
            Blocker::Evidence,
            format!("blocked, and held: {f}"),
        ));
    } else {
        t.blocked_retry.push(n);
    }
}
