//! Nodes held by a fault of their own ([`Held`]): an observation that came
//! back incomplete ([`NodeView::fault`]) or a call that failed in an earlier
//! step ([`Inputs::held`](super::Inputs::held)). A hold is about its node
//! only: the other nodes proceed, and the held node keeps its timeouts.
//!
//! - A node in flight stays in flight (and counts against the budget): its
//!   failed call is tried again at the next step, an incomplete observation
//!   takes no step that needs the missing part, and `drain_timeout` or
//!   `node_timeout` give it back if the fault lasts. Its record's message
//!   says why it is held ([`HELD_PREFIX`]) until it no longer is.
//! - A node not in flight (idle, or blocked and due for a retry) whose start
//!   failed stays a candidate, after the others ([`start_order`]), for
//!   [`HELD_RETRY`]; then its hold lapses.
//! - The decision names the held nodes ([`Decision::held`](super::Decision::held)),
//!   the first of them in the state message while nothing more pressing is
//!   said; the agent publishes an Event when a node is newly held.

use super::decision::{Action, Held, HELD_RETRY};
use super::health::bounded;
use super::tally::{add, rfc3339, Ctx};
use crate::cluster::{NodeProgress, NodeView, ProgressState};
use chrono::{DateTime, Utc};

/// How the message of a held node's record begins.
pub const HELD_PREFIX: &str = "held: ";

/// The hold on `n` in this step, if any: its observation fault, or a carried
/// hold that still applies (one on a node that is not in flight lapses after
/// [`HELD_RETRY`], so the node is tried again).
pub(super) fn of(ctx: &Ctx<'_>, n: &NodeView, progress: Option<&NodeProgress>) -> Option<Held> {
    let carried = ctx.inputs.held.iter().find(|h| h.node == n.name);
    if let Some(why) = &n.fault {
        return Some(Held {
            node: n.name.clone(),
            why: bounded(why.clone()),
            since: carried.map_or(ctx.now, |h| h.since),
            last: ctx.now,
        });
    }
    let h = carried?;
    let startable = progress
        .is_none_or(|p| matches!(p.state, ProgressState::Blocked | ProgressState::Preparing));
    if startable && ctx.now >= add(h.last, HELD_RETRY) {
        return None;
    }
    Some(h.clone())
}

/// The order candidates to start are tried in: those not held first (in
/// name order), then those whose start failed, the longest ago first. A node
/// whose cordon keeps failing never takes the turn of the nodes behind it,
/// and when every start failed (the API server was unreachable) the first
/// is tried again at once.
pub(super) fn start_order(n: &NodeView, held: &[Held]) -> (bool, DateTime<Utc>) {
    match held.iter().find(|h| h.node == n.name) {
        Some(h) => (true, h.last),
        None => (false, DateTime::<Utc>::MIN_UTC),
    }
}

/// What a held node's record says about its hold.
pub(super) fn record(h: &Held) -> String {
    bounded(format!(
        "{HELD_PREFIX}{} (since {})",
        h.why,
        rfc3339(h.since)
    ))
}

/// Whether a blocked node's record says it was given back while held: its
/// drain failed for a fault of its own, not for its budgets.
pub(super) fn gave_back_held(message: &str) -> bool {
    message.contains(&format!("; {HELD_PREFIX}"))
}

/// The message `p`'s record should carry given its hold, when it differs
/// from the one it carries: why it is held, or (the hold over) nothing.
pub(super) fn message_for(p: &NodeProgress, hold: Option<&Held>) -> Option<String> {
    let wanted = match hold {
        Some(h) => record(h),
        None if p.message.starts_with(HELD_PREFIX) => String::new(),
        None => return None,
    };
    (wanted != p.message).then_some(wanted)
}

/// The action recording `message` on `n`'s record.
pub(super) fn note(n: &NodeView, p: &NodeProgress, message: String) -> Action {
    Action::Note {
        node: n.name.clone(),
        progress: NodeProgress {
            message,
            ..p.clone()
        },
    }
}

/// The state message for `held` (in name order): the first held node, and
/// how many more.
pub(super) fn message(held: &[Held]) -> Option<String> {
    let first = held.first()?;
    let more = match held.len() - 1 {
        0 => String::new(),
        1 => "; 1 more node held".into(),
        k => format!("; {k} more nodes held"),
    };
    Some(bounded(format!(
        "node {} held since {}: {}{more}",
        first.node,
        rfc3339(first.since),
        first.why
    )))
}
