//! What a node drover has in flight needs next: a draining node is evicted,
//! then upgraded, or given back blocked at `drain_timeout`; an upgrading
//! node (a `draining` record whose upgrade run exists, `cluster::effective`)
//! completes (or is watched) once Ready at its target and its run is over,
//! and fails on a driver failure, the wrong version or `node_timeout`.
//!
//! A new pin (docs/design.md, "The node record"): a draining node whose
//! run has not started follows it in one record write, its drain going on
//! (the pods already evicted stay evicted); if the pin it drains for is
//! revoked with nothing newer admitted, or the environment halted for it
//! (another cluster's trusted `failed`), it is given back before anything
//! starts. An upgrading node finishes on the version its run installs,
//! and then is moved again like any other. No node is uncordoned while its
//! run may still act on it: a timeout records the node failed, still
//! cordoned, deletes the run, and uncordons it only once nothing of the
//! run is left (`given_back.rs`, [`Action::Release`]).
//!
//! A node whose observation is incomplete ([`NodeView::fault`]) takes no
//! step that needs the missing part (no eviction or upgrade on a pod list
//! that failed, no verdict on a version that could not be confirmed), but
//! its timeouts still give it back, and its run's own failure (read from
//! the run, not from what failed) records it failed.

use super::decision::{Action, Held};
use super::held;
use super::tally::retry_backoff;
use super::tally::{elapsed, fmt_duration, given_back_as, rfc3339, Ctx, Tally};
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::{taint_lead, DrainRule, OnDrainTimeout};

/// A node being drained.
pub(super) fn draining(
    ctx: &Ctx<'_>,
    n: &NodeView,
    p: &NodeProgress,
    hold: Option<&Held>,
    t: &mut Tally<'_>,
) {
    let policy = ctx.policy;
    if policy.is_revoked(ctx.target) {
        // Its pin was revoked and nothing newer is admitted: nothing has
        // started on it yet, so it goes back into service now.
        t.unavailable += usize::from(!n.ready);
        t.releases.push(Action::GiveBack {
            node: n.name.clone(),
            uncordon: p.cordoned_by_drover,
            reason: format!(
                "{} was revoked while the node drained: given back before its run started",
                ctx.target
            ),
        });
        return;
    }
    if let Some(why) = &ctx.inputs.halted {
        // Another cluster's trusted failure of the target, learnt while
        // the node drained: nothing has started on it, so it goes back
        // into service rather than on to a version that just failed
        // elsewhere (a node whose run started finishes).
        t.unavailable += usize::from(!n.ready);
        t.releases.push(Action::GiveBack {
            node: n.name.clone(),
            uncordon: p.cordoned_by_drover,
            reason: format!(
                "halted while the node drained: given back before its run started ({why})"
            ),
        });
        return;
    }
    if n.fault.is_none() && n.version.as_ref() == Some(ctx.target) {
        // At the pin and no run made: it runs what it drains for (a new
        // pin it already runs, or a give-back that uncordoned it and whose
        // record write did not land). Ready or not, it is never cordoned
        // again, drained or run for a version it runs: given back as
        // upgraded once Ready, failed if not Ready within node_timeout.
        // Its record keeps saying draining, a hold's note included: a
        // note changes the message only, whatever the node waits for.
        let run = NodeProgress {
            target: ctx.target.clone(),
            ..p.clone()
        };
        return upgrading(ctx, n, &run, true, hold, t);
    }
    let skipped = n
        .record
        .as_ref()
        .and_then(|s| s.record.used_rung(crate::config::RungKind::Skip, &p.target));
    if let Some(u) = skipped {
        // A drain rule's ladder reached `skip`: given back, not failed,
        // whatever `on_drain_timeout` says.
        let why = format!("skipped by drain rule {}: {}", u.rule, u.detail);
        return given_back_blocked(ctx, n, p, why, false, t);
    }
    let (timed_out, deadline) = elapsed(ctx.now, p.started_at, policy.drain_timeout);
    if timed_out {
        return drain_timed_out(ctx, n, p, hold, t);
    }
    t.wake.at(deadline);
    t.in_flight = true;
    t.unavailable += 1;
    t.draining.push(n.name.clone());
    let mut p = p.clone();
    if p.target != *ctx.target {
        // A new pin: the drain goes on toward it, one record write.
        p.target = ctx.target.clone();
        t.advances.push(Action::Retarget {
            node: n.name.clone(),
            progress: p.clone(),
        });
    }
    if !n.unschedulable {
        let cordon_at = cordoned_at(&p, &policy.drain);
        if ctx.now < cordon_at {
            // The pre-drain taint's lead: tainted (again, if it was
            // lost), cordoned once the lead is over.
            t.wake.at(cordon_at);
            if !n.drain_tainted {
                t.advances.push(Action::Taint {
                    node: n.name.clone(),
                });
            }
            return;
        }
        // Its cordon was lost, or the taint's lead is over: cordoned
        // (again) first; its drain is judged on what is seen after it.
        t.advances.push(Action::CordonAgain {
            node: n.name.clone(),
        });
        return;
    }
    let message = held::message_for(&p, hold);
    if n.fault.is_some() {
        // Its pods could not be listed: neither evict nor upgrade on a
        // guess; the drain timeout gives it back if this lasts.
        if let Some(m) = message {
            t.advances.push(held::note(n, &p, m));
        }
        return;
    }
    let started = NodeProgress {
        state: ProgressState::Upgrading,
        ..p.clone()
    };
    let at = cordoned_at(&p, &policy.drain);
    evict_or_start(n, &p, at, message, started, t);
}

/// When a drain whose record says `p` was cordoned: its start, after the
/// pre-drain taint's lead when a rule asks for one.
pub(super) fn cordoned_at(p: &NodeProgress, rules: &[DrainRule]) -> chrono::DateTime<chrono::Utc> {
    super::tally::add(p.started_at, taint_lead(rules))
}

/// The step of a drained-or-draining node: evict what is left on it, else
/// start its driver for `started` (an upgrade's record, or a rollback's),
/// whose Job is the record from then on. A hold's message, or its end, is
/// noted on the record first.
pub(super) fn evict_or_start(
    n: &NodeView,
    p: &NodeProgress,
    cordoned_at: chrono::DateTime<chrono::Utc>,
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
            cordoned_at,
        });
    } else {
        t.advances.push(Action::StartUpgrade {
            node: n.name.clone(),
            progress: started,
        });
    }
}

/// The rolling message while nodes are drained or download before their
/// drain (`tally::preparing_message`): which ones, as the status object tells it.
pub(super) fn message(t: &Tally<'_>) -> Option<String> {
    let draining = (!t.draining.is_empty()).then(|| format!("draining: {}", t.draining.join(", ")));
    let said: Vec<String> = draining
        .into_iter()
        .chain(super::tally::preparing_message(t))
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
    let msg = format!(
        "drain did not finish within drain_timeout ({}): {why}",
        fmt_duration(policy.drain_timeout),
    );
    let stop = policy.on_drain_timeout == OnDrainTimeout::Stop;
    given_back_blocked(ctx, n, p, msg, stop, t);
}

/// Give a draining node back, blocked, with `msg`; the rollout stops
/// starting nodes when `stop`, else the node is tried again after its backoff.
fn given_back_blocked(
    ctx: &Ctx<'_>,
    n: &NodeView,
    p: &NodeProgress,
    msg: String,
    stop: bool,
    t: &mut Tally<'_>,
) {
    let now = ctx.now;
    let msg = super::health::bounded(msg);
    let retry_at = super::tally::add(now, retry_backoff(p.retries));
    t.blocked_msg.get_or_insert_with(|| {
        format!(
            "node {} blocked since {}: {msg}; next try after {}",
            n.name,
            rfc3339(now),
            rfc3339(retry_at)
        )
    });
    if !stop {
        t.wake.at(retry_at);
    }
    t.releases.push(Action::Block {
        node: n.name.clone(),
        progress: given_back_as(p, ProgressState::Blocked, now, msg),
        uncordon: p.cordoned_by_drover,
    });
    t.unavailable += usize::from(!n.ready);
    if stop {
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
    // Back, and nothing of its run can act on it any more.
    let back = n.ready && node_at_own_target && n.upgrade != UpgradeStatus::Running;
    let (timed_out, deadline) = elapsed(ctx.now, p.started_at, policy.node_timeout);
    let failure = if let (false, UpgradeStatus::Failed(m)) = (back, &n.upgrade) {
        // The run's own verdict, read from the run, whatever else of the
        // view failed (a node whose pods cannot be listed stops new starts
        // once its driver failed: simulation seed 11347).
        Some(format!("upgrade driver failed: {m}"))
    } else if let Some(f) = &n.fault {
        // What the node shows could not be confirmed: no verdict on it but
        // the timeout's.
        timed_out.then(|| {
            format!(
                "node did not return Ready at {} within node_timeout ({}); {f}",
                p.target,
                fmt_duration(policy.node_timeout)
            )
        })
    } else if back && ctx.health.is_some() && at_target {
        // Back at the version: its health is watched next, and it keeps
        // counting against the budget meanwhile.
        t.releases.push(Action::Watch {
            node: name,
            progress: super::tally::watching(p, ctx.now),
            uncordon: p.cordoned_by_drover,
        });
        t.in_flight = true;
        t.unavailable += 1;
        t.poll_health = true;
        return;
    } else if back {
        t.releases.push(Action::Complete {
            node: name,
            uncordon: p.cordoned_by_drover,
        });
        return;
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
        t.unavailable += if super::tally::fail(n, p, failed, t) {
            usize::from(!n.ready)
        } else {
            1
        };
        return;
    }
    t.wake.at(deadline);
    t.in_flight = true;
    t.unavailable += 1;
    let message = held::message_for(p, hold);
    if let Some(m) = message {
        t.advances.push(held::note(n, p, m));
    }
    let _ = name;
}
