//! Which nodes may start now: the one answer to "may a node start" (a
//! failed node, the environment's halt, a `stop` block, a health hold, the
//! gate and trust, the wave gate, the window, each in that order of
//! precedence), and the candidates that fit
//! the budget: never-attempted nodes in name order, then blocked ones due
//! for a retry (`skip`), or blocked ones first (`stop`); a node whose start
//! just failed goes after the others (`held.rs`).

use super::decide::{Ctx, Tally};
use super::decision::Action;
use super::held;
use super::RolloutState;
use crate::cluster::{NodeProgress, NodeView, ProgressState};
use crate::config::OnDrainTimeout;

/// Why no node may start now, as the state it puts the rollout in and the
/// message; `None` when nodes may start.
pub(super) fn hold(ctx: &Ctx<'_>, t: &Tally<'_>) -> Option<(RolloutState, String)> {
    let inputs = ctx.inputs;
    let win = ctx.win;
    if let Some((node, msg)) = &t.failed {
        Some((
            RolloutState::Failed,
            format!("node {node} failed: {msg}; rollout stopped until retry or a new target"),
        ))
    } else if let Some(h) = &inputs.halted {
        Some((RolloutState::Halted, h.clone()))
    } else if let Some((node, msg)) = &t.stop_blocked {
        Some((
            RolloutState::Blocked,
            format!(
                "node {node} blocked ({msg}); on_drain_timeout = \"stop\": no node starts before the next window"
            ),
        ))
    } else if let Some(h) = &t.health_hold {
        Some((RolloutState::Blocked, h.clone()))
    } else if !inputs.may_start {
        Some((
            RolloutState::Blocked,
            if inputs.hold_reason.is_empty() {
                "may not start: gate or trust refused".into()
            } else {
                inputs.hold_reason.clone()
            },
        ))
    } else if let Some(w) = &inputs.waiting {
        Some((RolloutState::Pending, w.clone()))
    } else if !win.is_open() {
        let state = if win.held.is_some() {
            RolloutState::Paused
        } else {
            RolloutState::Pending
        };
        Some((state, win.hold_message()))
    } else {
        None
    }
}

/// The starts that fit the budget now, counted against it.
pub(super) fn starts(ctx: &Ctx<'_>, t: &mut Tally<'_>, budget: usize) -> Vec<Action> {
    let mut candidates: Vec<&NodeView> = match ctx.policy.on_drain_timeout {
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
    let mut starts = Vec::new();
    for n in candidates {
        if t.unavailable >= budget {
            break;
        }
        t.unavailable += 1;
        t.in_flight += 1;
        starts.push(Action::Cordon {
            node: n.name.clone(),
            progress: NodeProgress {
                state: ProgressState::Draining,
                target: ctx.target.clone(),
                started_at: ctx.now,
                cordoned_by_drover: !n.unschedulable,
                message: String::new(),
                // Where a rollback takes it back to (docs/design.md §5b).
                previous: n.version.clone(),
                // A blocked node's retry counts, so its next backoff grows.
                attempts: match &n.progress {
                    Ok(Some(p)) if p.state == ProgressState::Blocked => {
                        p.attempts.saturating_add(1)
                    }
                    _ => 0,
                },
            },
        });
    }
    starts
}
