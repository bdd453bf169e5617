//! What a node drover has in flight needs next: a draining node is evicted,
//! then upgraded, or given back blocked at `drain_timeout`; an upgrading
//! node (a `draining` record whose upgrade Job exists, `cluster::effective`)
//! completes (or is watched) once Ready at its target, and fails on a
//! driver failure, the wrong version or `node_timeout`.
//!
//! A node whose observation is incomplete ([`NodeView::fault`]) takes no
//! step that needs the missing part (no eviction or upgrade on a pod list
//! that failed, no verdict on a version that could not be confirmed), but
//! its timeouts still give it back.

use super::decide::{elapsed, fmt_duration, given_back_as, rfc3339, Ctx, Tally};
use super::decision::{Action, Held};
use super::given_back::retry_backoff;
use super::{decide, held};
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::OnDrainTimeout;

/// A node being drained.
pub(super) fn draining(
    ctx: &Ctx<'_>,
    n: &NodeView,
    p: &NodeProgress,
    hold: Option<&Held>,
    t: &mut Tally<'_>,
) {
    let policy = ctx.policy;
    if n.fault.is_none() && n.ready && n.version.as_ref() == Some(&p.target) {
        // Ready at its target with no run left: a give-back deleted the
        // finished run's Job and did not land (it is repeated from here).
        let run = NodeProgress {
            state: ProgressState::Upgrading,
            ..p.clone()
        };
        let at_target = p.target == *ctx.target;
        return upgrading(ctx, n, &run, at_target, hold, t);
    }
    let (timed_out, deadline) = elapsed(ctx.now, p.started_at, policy.drain_timeout);
    if timed_out {
        return drain_timed_out(ctx, n, p, hold, t);
    }
    t.wake.at(deadline);
    t.in_flight += 1;
    t.unavailable += 1;
    t.draining.push(n.name.clone());
    let message = held::message_for(p, hold);
    if n.fault.is_some() {
        // Its pods could not be listed: neither evict nor upgrade on a
        // guess; the drain timeout gives it back if this lasts.
        if let Some(m) = message {
            t.advances.push(held::note(n, p, m));
        }
        return;
    }
    let started = NodeProgress {
        state: ProgressState::Upgrading,
        target: ctx.target.clone(),
        ..p.clone()
    };
    evict_or_start(n, p, message, started, t);
}

/// The step of a drained-or-draining node: evict what is left on it, else
/// start its driver for `started` (an upgrade's record, or a rollback's),
/// whose Job is the record from then on. A hold's message, or its end, is
/// noted on the record first.
pub(super) fn evict_or_start(
    n: &NodeView,
    p: &NodeProgress,
    message: Option<String>,
    started: NodeProgress,
    t: &mut Tally<'_>,
) {
    if let Some(m) = message {
        t.advances.push(held::note(n, p, m));
    }
    if n.pods_to_evict > 0 {
        t.advances.push(Action::Evict {
            node: n.name.clone(),
        });
    } else {
        t.advances.push(Action::StartUpgrade {
            node: n.name.clone(),
            progress: started,
        });
    }
}

/// The give-back of `n` failed at `failed`: when its state lives only on a
/// run still running (`cluster::effective`), that state is written first,
/// for the give-back deletes the run.
pub(super) fn fail(
    n: &NodeView,
    p: &NodeProgress,
    failed: NodeProgress,
    uncordon: bool,
) -> Vec<Action> {
    let mut actions = Vec::new();
    if n.from_run && n.upgrade == UpgradeStatus::Running {
        actions.push(Action::Record {
            node: n.name.clone(),
            progress: p.clone(),
        });
    }
    actions.push(Action::Fail {
        node: n.name.clone(),
        progress: failed,
        uncordon,
    });
    actions
}

/// The rolling message while nodes are drained or download before their
/// drain (`prepare::message`): which ones, as the status object tells it.
pub(super) fn message(t: &Tally<'_>) -> Option<String> {
    let draining = (!t.draining.is_empty()).then(|| format!("draining: {}", t.draining.join(", ")));
    let said: Vec<String> = draining
        .into_iter()
        .chain(super::prepare::message(t))
        .collect();
    (!said.is_empty()).then(|| super::health::bounded(said.join("; ")))
}

/// The drain did not finish in time: give the node back, blocked.
fn drain_timed_out(
    ctx: &Ctx<'_>,
    n: &NodeView,
    p: &NodeProgress,
    hold: Option<&Held>,
    t: &mut Tally<'_>,
) {
    let policy = ctx.policy;
    let now = ctx.now;
    let left = match &n.fault {
        Some(_) => "its pods could not be listed".to_string(),
        None => format!("{} pods left", n.pods_to_evict),
    };
    // Why: the hold, or what the engine recorded while draining (which
    // budgets refused which pods, and since when).
    let detail = match hold {
        Some(h) => held::record(h),
        None if p.message.starts_with(held::HELD_PREFIX) => String::new(),
        None => p.message.clone(),
    };
    let why = if detail.is_empty() {
        left
    } else {
        format!("{left}; {detail}")
    };
    let msg = super::health::bounded(format!(
        "drain did not finish within drain_timeout ({}): {why}",
        fmt_duration(policy.drain_timeout),
    ));
    let retry_at = decide::add(now, retry_backoff(p.attempts));
    t.blocked_msg.get_or_insert_with(|| {
        format!(
            "node {} blocked since {}: {msg}; next try after {}",
            n.name,
            rfc3339(now),
            rfc3339(retry_at)
        )
    });
    if policy.on_drain_timeout == OnDrainTimeout::Skip {
        t.wake.at(retry_at);
    }
    t.releases.push(Action::Block {
        node: n.name.clone(),
        progress: given_back_as(p, ProgressState::Blocked, now, msg),
        uncordon: p.cordoned_by_drover,
    });
    t.blocked_count += 1;
    t.unavailable += usize::from(!n.ready);
    if policy.on_drain_timeout == OnDrainTimeout::Stop {
        t.stop_blocked
            .get_or_insert((n.name.clone(), "drain timed out".into()));
    }
}

/// A node whose OS driver is moving it to its target.
pub(super) fn upgrading(
    ctx: &Ctx<'_>,
    n: &NodeView,
    p: &NodeProgress,
    at_target: bool,
    hold: Option<&Held>,
    t: &mut Tally<'_>,
) {
    let policy = ctx.policy;
    let name = n.name.clone();
    let node_at_own_target = n.version.as_ref() == Some(&p.target);
    let (timed_out, deadline) = elapsed(ctx.now, p.started_at, policy.node_timeout);
    let failure = if let Some(f) = &n.fault {
        // What the node shows could not be confirmed: no verdict on it but
        // the timeout's.
        timed_out.then(|| {
            format!(
                "node did not return Ready at {} within node_timeout ({}); {f}",
                p.target,
                fmt_duration(policy.node_timeout)
            )
        })
    } else if n.ready && node_at_own_target && ctx.health.is_some() && at_target {
        // Back at the version: its health is watched next, and it keeps
        // counting against the budget meanwhile.
        t.releases.push(Action::Watch {
            node: name,
            progress: super::watch::watching(p, ctx.now),
            uncordon: p.cordoned_by_drover,
        });
        t.in_flight += 1;
        t.unavailable += 1;
        t.poll_health = true;
        return;
    } else if n.ready && node_at_own_target {
        t.releases.push(Action::Complete {
            node: name,
            uncordon: p.cordoned_by_drover,
        });
        return;
    } else if let UpgradeStatus::Failed(m) = &n.upgrade {
        Some(format!("upgrade driver failed: {m}"))
    } else if n.upgrade == UpgradeStatus::Succeeded && n.ready {
        Some(match &n.version {
            Some(v) => format!("node returned Ready at {v} instead of {}", p.target),
            None => format!(
                "node returned Ready but its OS version cannot be read (expected {})",
                p.target
            ),
        })
    } else if timed_out {
        Some(format!(
            "node did not return Ready at {} within node_timeout ({})",
            p.target,
            fmt_duration(policy.node_timeout)
        ))
    } else {
        None
    };
    if let Some(msg) = failure {
        let msg = super::health::bounded(msg);
        if p.target == *ctx.target {
            t.failed.get_or_insert((n.name.clone(), msg.clone()));
        }
        let failed = given_back_as(p, ProgressState::Failed, ctx.now, msg);
        t.releases.extend(fail(n, p, failed, p.cordoned_by_drover));
        t.unavailable += usize::from(!n.ready);
        return;
    }
    t.wake.at(deadline);
    t.in_flight += 1;
    t.unavailable += 1;
    let message = held::message_for(p, hold);
    if let Some(m) = message {
        t.advances.push(held::note(n, p, m));
    }
    if n.fault.is_none() && n.upgrade == UpgradeStatus::NotStarted {
        // Recorded `upgrading` (by an older agent, or before a give-back
        // that did not land) with no run: start it.
        t.advances.push(Action::StartUpgrade {
            node: name,
            progress: p.clone(),
        });
    }
}
