//! Downloading before the drain (`[driver] prepare`): a node about to start
//! is first `preparing`, in service and uncordoned, while the driver's
//! `prepare` run checks that the target is available to it and downloads
//! it (its record says `preparing` and names the run); the node is
//! cordoned only once that run succeeded (staged), so a
//! node is out of service for drain + reboot + health, never for the
//! download, and a target the node cannot get fails it before it left
//! service (brupop stages before it drains, too).
//!
//! Choices where docs/design.md is silent:
//! - A preparing or staged node holds a place in `max_unavailable` (it is
//!   one of the next to leave service, as brupop counts a staging node
//!   against its concurrency) but is not counted unavailable: it serves.
//!   Staged nodes start first, in name order.
//! - By default a node prepares when it may start: the window is open and
//!   the budget has room. With `prestage` the next nodes prepare ahead, at
//!   most `max_unavailable` preparing or staged at once (a node's disk and
//!   bandwidth are used only for an update about to be booted), inside the
//!   window while others drain and up to `prestage` before it opens, when
//!   the only reason no node may start is that the calendar's window is
//!   closed (never under `paused` or a freeze: those say "no change now").
//! - A prepare run that fails or outlasts `node_timeout` fails the node,
//!   never cordoned (`failed`, with the driver's reason), and the rollout's
//!   failure handling applies: no node starts until retry or a new target.
//! - A new target (or its pin revoked) clears a preparing node and stops
//!   its prepare run (the next prepare overwrites what was staged; nothing
//!   staged is ever booted without its own activation).

use super::decision::Action;
use super::tally::{elapsed, fmt_duration, given_back_as, Ctx, Tally};
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use chrono::{DateTime, Utc};

/// A node whose prepare run was started (`preparing`).
pub(super) fn preparing<'a>(
    ctx: &Ctx<'_>,
    n: &'a NodeView,
    p: &NodeProgress,
    at_target: bool,
    t: &mut Tally<'a>,
) {
    t.unavailable += usize::from(!n.ready);
    let revoked = ctx.policy.is_revoked(ctx.target);
    if p.target != *ctx.target || (at_target && n.ready) || revoked {
        // Its download is for another version (a new pin, or one revoked):
        // stopped; the node prepares the pin later, like any other.
        t.releases.push(Action::Clear {
            node: n.name.clone(),
            reason: if revoked {
                format!("{} was revoked while it prepared", ctx.target)
            } else {
                format!("prepared {} but the target is {}", p.target, ctx.target)
            },
            stop_run: n.upgrade == UpgradeStatus::Running,
        });
        return;
    }
    let policy = ctx.policy;
    let (timed_out, deadline) = elapsed(ctx.now, p.started_at, policy.node_timeout);
    let failure = match &n.upgrade {
        UpgradeStatus::Succeeded => {
            t.staged.push(n);
            return;
        }
        UpgradeStatus::Failed(m) => Some(format!(
            "prepare failed before the drain (the node stayed in service): {m}"
        )),
        _ if timed_out => Some(format!(
            "prepare did not finish within node_timeout ({}) before the drain (the node stayed \
             in service)",
            fmt_duration(policy.node_timeout)
        )),
        _ => None,
    };
    if let Some(msg) = failure {
        let msg = super::health::bounded(msg);
        t.failed.get_or_insert((n.name.clone(), msg.clone()));
        let failed = given_back_as(p, ProgressState::Failed, ctx.now, msg);
        super::tally::fail(n, p, failed, t);
        return;
    }
    t.wake.at(deadline);
    t.preparing.push(n);
    if n.fault.is_none() && n.upgrade == UpgradeStatus::NotStarted {
        // Recorded `preparing`, its run not made (the agent stopped between
        // the record and the run): the run the record names is made now.
        t.advances.push(Action::StartUpgrade {
            node: n.name.clone(),
            progress: p.clone(),
        });
    }
}

/// Whether prepares may start ahead of a closed window at `now`: `prestage`
/// is set, the calendar alone holds (no pause or freeze) and the next window
/// opens within it. Asks to be woken when it will.
pub(super) fn before_window(ctx: &Ctx<'_>, t: &mut Tally<'_>) -> bool {
    let win = ctx.win;
    let prestage = ctx.policy.prestage;
    if !ctx.policy.prepare || prestage.is_zero() || win.is_open() || win.held.is_some() {
        return false;
    }
    let Some(opens) = win.next_opens_at else {
        return false;
    };
    let from = earlier(opens, prestage);
    if ctx.now >= from {
        return true;
    }
    t.wake.at(from);
    false
}

/// `t - d`, saturating at the earliest instant.
fn earlier(t: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    let d = chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
    t.checked_sub_signed(d).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The record of a node whose prepare run starts now (`previous` and
/// `retries` as its cordon will carry them).
pub(super) fn record(ctx: &Ctx<'_>, draining: NodeProgress) -> NodeProgress {
    NodeProgress {
        state: ProgressState::Preparing,
        cordoned_by_drover: false,
        started_at: ctx.now,
        ..draining
    }
}

/// A staged node's drain record: its prepare's `previous` and `retries`,
/// a new episode from `now`.
pub(super) fn draining(ctx: &Ctx<'_>, n: &NodeView, staged: &NodeProgress) -> NodeProgress {
    NodeProgress {
        state: ProgressState::Draining,
        target: ctx.target.clone(),
        started_at: ctx.now,
        cordoned_by_drover: !n.unschedulable,
        message: String::new(),
        retries: staged.retries,
        previous: staged.previous.clone().or_else(|| n.version.clone()),
    }
}
