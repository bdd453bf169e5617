//! Which nodes may start now: the one answer to "may a node start" (a
//! failed node, the environment's halt, a `stop` block, a health hold, the
//! gate and trust, the wave gate, the window, each in that order of
//! precedence), and the candidates that fit
//! the budget: never-attempted nodes in name order, then blocked ones due
//! for a retry (`skip`), or blocked ones first (`stop`); a node whose start
//! just failed goes after the others (`held.rs`). With `[driver] prepare`
//! a candidate is first prepared (downloaded) in service and cordoned once
//! staged, staged nodes first (`prepare.rs`).

use super::decision::Action;
use super::held;
use super::tally::{Ctx, Tally};
use super::{prepare, Blocker, RolloutState};
use crate::cluster::{NodeProgress, NodeView, ProgressState};
use crate::config::OnDrainTimeout;

/// Why no node may start now, as the state it puts the rollout in, its
/// blocker and the message; `None` when nodes may start.
pub(super) fn hold(ctx: &Ctx<'_>, t: &Tally<'_>) -> Option<(RolloutState, Blocker, String)> {
    hold_but_window(ctx, t).or_else(|| {
        let win = ctx.win;
        let (state, blocker) = match (&win.held, win.paused) {
            (Some(_), true) => (RolloutState::Paused, Blocker::Paused),
            (Some(_), false) => (RolloutState::Paused, Blocker::Freeze),
            (None, _) => (RolloutState::Pending, Blocker::Window),
        };
        (!win.is_open()).then(|| (state, blocker, win.hold_message()))
    })
}

/// Every reason of [`hold`] but the window: with none, nodes start inside
/// the window, and may prepare before it (`prepare::before_window`).
fn hold_but_window(ctx: &Ctx<'_>, t: &Tally<'_>) -> Option<(RolloutState, Blocker, String)> {
    let inputs = ctx.inputs;
    if let Some((node, msg)) = &t.failed {
        Some((
            RolloutState::Failed,
            failed_blocker(t),
            format!("node {node} failed: {msg}; rollout stopped until retry or a new target"),
        ))
    } else if let Some(h) = &inputs.halted {
        Some((
            RolloutState::Halted,
            inputs.wave_blocker.unwrap_or(Blocker::Halted),
            h.clone(),
        ))
    } else if let Some((node, msg)) = &t.stop_blocked {
        Some((
            RolloutState::Blocked,
            Blocker::Pdb,
            format!(
                "node {node} blocked ({msg}); on_drain_timeout = \"stop\": no node starts before the next window"
            ),
        ))
    } else if let Some(h) = &t.health_hold {
        Some((RolloutState::Blocked, Blocker::Health, h.clone()))
    } else if !inputs.may_start {
        Some((
            RolloutState::Blocked,
            Blocker::Gate,
            if inputs.hold_reason.is_empty() {
                "may not start: gate or trust refused".into()
            } else {
                inputs.hold_reason.clone()
            },
        ))
    } else {
        // The wave before this cluster's has not confirmed.
        inputs.waiting.as_ref().map(|w| {
            (
                RolloutState::Pending,
                inputs.wave_blocker.unwrap_or(Blocker::Wave),
                w.clone(),
            )
        })
    }
}

/// The blocker of the tally's failed node: what its skip says (its
/// record's), else what its failure's message says (a failure of this step).
pub(super) fn failed_blocker(t: &Tally<'_>) -> Blocker {
    let Some((node, msg)) = &t.failed else {
        return Blocker::Driver;
    };
    t.skipped
        .iter()
        .find(|s| s.node == *node)
        .map_or_else(|| Blocker::of_failure(msg), |s| s.blocker)
}

/// The starts that fit the budget now, counted against it: cordons of
/// nodes that may leave service, and (with `[driver] prepare`) prepares of
/// the next candidates: as many as the budget has room for beside the nodes
/// out of service, or with `prestage` up to `budget` preparing or staged
/// at once, ahead of the drains.
pub(super) fn starts<'a>(ctx: &Ctx<'_>, t: &mut Tally<'a>, budget: usize) -> Vec<Action> {
    // Never a node moved to a revoked version, whatever the window says.
    if t.confirmed || hold_but_window(ctx, t).is_some() || ctx.policy.is_revoked(ctx.target) {
        return Vec::new();
    }
    let cordon = ctx.win.is_open();
    if !cordon && !prepare::before_window(ctx, t) {
        return Vec::new();
    }
    let mut candidates: Vec<&'a NodeView> = match ctx.policy.on_drain_timeout {
        OnDrainTimeout::Stop => t
            .blocked_retry
            .iter()
            .chain(t.fresh.iter())
            .copied()
            .collect(),
        OnDrainTimeout::Skip if t.fresh.is_empty() => t.blocked_retry.clone(),
        OnDrainTimeout::Skip => t.fresh.clone(),
    };
    // Never a node at a version it was rolled back from (`rollback.rs`).
    candidates.retain(|n| super::rollback::may_start(n, ctx.target));
    // Stable: name order (or blocked first, with `stop`) within each group.
    candidates.sort_by_key(|n| held::start_order(n, &t.held));
    let mut cordons = Vec::new();
    for n in t.staged.clone() {
        if !cordon || t.unavailable >= budget {
            break;
        }
        let Ok(Some(staged)) = &n.progress else {
            continue;
        };
        t.unavailable += 1;
        t.in_flight = true;
        t.staged.retain(|s| s.name != n.name);
        cordons.push(Action::Cordon {
            node: n.name.clone(),
            progress: prepare::draining(ctx, n, staged),
        });
    }
    let mut prepares = Vec::new();
    // Preparing and staged nodes hold a place: one of the next to leave
    // service (brupop counts a staging node against its concurrency too),
    // or with `prestage` one budget ahead of the drains.
    let mut reserved = t.preparing.len() + t.staged.len();
    let room = if ctx.policy.prestage.is_zero() {
        budget.saturating_sub(t.unavailable)
    } else {
        budget
    };
    for n in candidates {
        let draining = NodeProgress {
            state: ProgressState::Draining,
            target: ctx.target.clone(),
            started_at: ctx.now,
            cordoned_by_drover: !n.unschedulable,
            message: String::new(),
            // Where a rollback takes it back to (docs/design.md §5b).
            previous: n.version.clone(),
            // A blocked node's retry counts, so its next backoff grows.
            retries: match &n.progress {
                Ok(Some(p)) if p.state == ProgressState::Blocked => p.retries.saturating_add(1),
                _ => 0,
            },
        };
        if ctx.policy.prepare {
            if reserved >= room {
                break;
            }
            reserved += 1;
            t.preparing.push(n);
            prepares.push(Action::Prepare {
                node: n.name.clone(),
                progress: prepare::record(ctx, draining),
            });
            continue;
        }
        if t.unavailable >= budget {
            break;
        }
        t.unavailable += 1;
        t.in_flight = true;
        cordons.push(Action::Cordon {
            node: n.name.clone(),
            progress: draining,
        });
    }
    // Cordons first: the engine withholds the last of them when a
    // give-back failed (`Decision::starts_within_budget`).
    cordons.append(&mut prepares);
    cordons
}
