//! The pure decision core: policy, gates, window state and observed nodes
//! in, the next actions and the environment's state out. No I/O, no clock:
//! the same inputs always give the same decision.
//!
//! The decision is taken question by question, each in a module of its own;
//! this file runs them over the nodes in name order and concludes the state:
//! - what an in-flight node needs next: `in_flight.rs` (draining, upgrading);
//! - what becomes of a node drover gave back: `given_back.rs` (blocked,
//!   failed: retries, backoff, clearing);
//! - the health of returned nodes and the cluster's settle: `watch.rs`;
//! - which nodes a fault of their own holds: `held.rs`;
//! - a node failed after its upgrade, rolled back: `rollback.rs`;
//! - a node downloading its update before the drain: `prepare.rs`;
//! - which nodes may start now: `start.rs`.
//!
//! What they share (the step's context, the tally they write into, the
//! helpers) is the leaf `tally.rs`: the state files import it, not this
//! file, so none of them imports another through the decision.
//!
//! Choices where docs/design.md is silent:
//! - Budget: a node counts against `max_unavailable` when drover has it in
//!   flight (draining/upgrading) *or* it is NotReady for any reason: drover
//!   takes no more capacity down while the cluster is already degraded. A
//!   Ready node cordoned by someone else still runs its pods and does not count.
//! - A node cordoned by someone else without drover's record, a node whose
//!   version cannot be read, a NotReady idle node and a node with an
//!   unreadable record are skipped and reported, never touched.
//! - Timeouts fire when `now - started_at >= timeout`, so the instant to wake
//!   at is exact. In `draining` only `drain_timeout` applies (the node is
//!   given back, blocked); in `upgrading` `node_timeout` (the node failed).
//! - Blocked nodes: see `given_back.rs`. A retry request on the record or
//!   a new target clears blocked and failed records at once.
//! - A failed node for the current target stops every new start until the
//!   target changes or a person asks for a retry on its record.
//! - A new pin (`in_flight.rs`): a draining node follows it, an upgrading
//!   one finishes on the version its run installs and is moved again later,
//!   a preparing one's download is stopped and it prepares the new pin
//!   later, watching and passed nodes are idle for it.
//! - A node held by a fault of its own (`held.rs`) holds only itself: it
//!   keeps its budget slot while in flight, its timeouts still give it back,
//!   and the other nodes proceed.
//! - Confirmed needs at least one selected node: zero nodes is reported
//!   blocked, so an empty selector is never evidence for the next environment.
//! - States (docs/design.md §5): `failed` and `blocked` mean someone should
//!   look; a blocked node keeps the state `blocked` until another node is in
//!   flight. Outside a window the state is `pending`, under `paused` or a
//!   freeze `paused`. A patch update (same major.minor as every selected
//!   node) uses [`Inputs::patch_window`], which a `minor` freeze leaves open.

use super::decision::{Action, Decision, Inputs, Policy};
use super::health::{bounded, queries_verdict};
use super::{
    consent, given_back, held, in_flight, prepare, rollback, start, watch, Blocker, RolloutState,
};
use crate::cluster::{NodeView, ProgressState};
use crate::health::Verdict;
use crate::window::Change;
use chrono::{DateTime, Utc};

pub use super::tally::retry_backoff;
pub(super) use super::tally::{rfc3339, skip, Ctx, Tally, WakeAt};

/// Decide the next actions. `nodes` may come in any order; the decision
/// handles them by name so that it is deterministic.
pub fn decide(
    policy: &Policy,
    inputs: &Inputs,
    nodes: &[NodeView],
    now: DateTime<Utc>,
) -> Decision {
    let mut order: Vec<&NodeView> = nodes.iter().collect();
    order.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let target = &policy.target;
    let win = match Change::of(target, order.iter().map(|n| n.version.as_ref())) {
        Change::Patch => inputs.patch_window.as_ref().unwrap_or(&inputs.window),
        Change::Other => &inputs.window,
    };
    let health = policy.health.as_ref();
    let ctx = Ctx {
        policy,
        inputs,
        now,
        target,
        win,
        health,
        queries: health.map(|spec| queries_verdict(spec, &inputs.queries, now)),
        budget: policy.max_unavailable.resolve(order.len()),
    };
    let mut t = Tally {
        releases: Vec::new(),
        advances: Vec::new(),
        skipped: Vec::new(),
        unavailable: 0,
        in_flight: false,
        fresh: Vec::new(),
        blocked_retry: Vec::new(),
        failed: None,
        stop_blocked: None,
        blocked_msg: None,
        at_version: 0,
        confirmed: !order.is_empty(),
        passed: Vec::new(),
        watch_msg: None,
        health_hold: None,
        query_pinned: false,
        poll_health: false,
        settling: None,
        wake: WakeAt(win.closes_at.or(win.next_opens_at)),
        held: Vec::new(),
        consent_held: 0,
        consent_nodes: Default::default(),
        consent_overdue: Vec::new(),
        rollbacks: rollback::count(&order, target),
        earlier_rollbacks: rollback::earlier_counts(&order, target),
        preparing: Vec::new(),
        draining: Vec::new(),
        staged: Vec::new(),
        wanted: Vec::new(),
        counting: true,
    };
    if let Some(Verdict::Held(why)) = &ctx.queries {
        t.health_hold = Some(bounded(format!(
            "held: {why}; no node starts or passes and nothing is confirmed until it answers"
        )));
    }
    for n in &order {
        node(&ctx, n, &mut t);
    }
    t.counting = false;
    rollback::wanted(&ctx, &mut t);
    watch::settle(&ctx, &mut t);
    let total = order.len();
    let budget = ctx.budget;
    let hold = start::hold(&ctx, &t);
    let starts = start::starts(&ctx, &mut t, budget);
    consent::released(&order, &starts, &mut t);
    conclude(&ctx, t, hold, starts, total, budget)
}

/// Ask the question that fits `n`'s state.
fn node<'a>(ctx: &Ctx<'_>, n: &'a NodeView, t: &mut Tally<'a>) {
    let at_target = n.version.as_ref() == Some(ctx.target);
    if n.ready && at_target {
        t.at_version += 1;
    }
    let progress = match &n.progress {
        Ok(p) => p.as_ref(),
        Err(e) => {
            t.confirmed = false;
            t.unavailable += usize::from(!n.ready || n.unschedulable);
            t.skipped.push(skip(
                n,
                Blocker::Evidence,
                format!("unreadable record: {e}"),
            ));
            return;
        }
    };
    if n.clear_rolled_back {
        // A person cleared its marks: recorded now, read from the next step.
        t.advances.push(Action::ClearRolledBack {
            node: n.name.clone(),
        });
    }
    let hold = held::of(ctx, n, progress);
    if let Some(h) = &hold {
        t.held.push(h.clone());
    }
    let Some(p) = progress else {
        return idle(n, ctx, at_target, t);
    };
    if ctx.health.is_some()
        && p.state == ProgressState::Passed
        && p.target == *ctx.target
        && n.ready
        && at_target
    {
        // Passed its watch and still Ready at the target: done, like an
        // idle node; settle is judged after the loop.
        t.passed.push((n, p.started_at));
        return;
    }
    t.confirmed = false;
    match p.state {
        ProgressState::Draining => in_flight::draining(ctx, n, p, hold.as_ref(), t),
        ProgressState::Upgrading => in_flight::upgrading(ctx, n, p, at_target, hold.as_ref(), t),
        ProgressState::Watching | ProgressState::Passed => watch::watched(ctx, n, p, at_target, t),
        ProgressState::Blocked | ProgressState::Failed => given_back::node(ctx, n, p, at_target, t),
        ProgressState::RollingBack => rollback::rolling_back(ctx, n, p, hold.as_ref(), t),
        ProgressState::Preparing => prepare::preparing(ctx, n, p, at_target, t),
    }
}

/// A node drover has no record on: done, skipped, or a candidate to start.
fn idle<'a>(n: &'a NodeView, ctx: &Ctx<'_>, at_target: bool, t: &mut Tally<'a>) {
    let target = ctx.target;
    t.unavailable += usize::from(!n.ready);
    if n.ready && at_target {
        return;
    }
    t.confirmed = false;
    if !rollback::may_start(n, target) {
        rollback::idle_rolled_back(n, target, t);
    } else if at_target {
        t.skipped.push(skip(n, Blocker::Health, "NotReady".into()));
    } else if n.version.is_none() {
        t.skipped.push(skip(
            n,
            Blocker::Evidence,
            "OS version cannot be read".into(),
        ));
    } else if let Some(why) = &n.managed_by {
        t.skipped.push(skip(n, Blocker::Foreign, why.clone()));
    } else if n.consent_paused {
        consent::held(ctx, n, t);
    } else if let Some(v) = n
        .version
        .as_ref()
        .filter(|v| *v > target && !ctx.policy.allow_downgrade)
    {
        // Someone else put it there; moving it down is a decision the
        // config must state.
        t.skipped.push(skip(
            n,
            Blocker::Foreign,
            format!(
                "runs {v}, newer than the pinned {target}: left alone, since the \
                 environment's file does not set allow_downgrade = true"
            ),
        ));
    } else if n.unschedulable {
        t.skipped
            .push(skip(n, Blocker::Foreign, "cordoned by someone else".into()));
    } else if !n.ready {
        t.skipped.push(skip(n, Blocker::Health, "NotReady".into()));
    } else if let Some(f) = &n.fault {
        // Not a view to start a node on.
        t.skipped
            .push(skip(n, Blocker::Evidence, format!("held: {f}")));
    } else {
        // A node whose start failed a moment ago is a candidate still,
        // after the others (start.rs).
        t.fresh.push(n);
    }
}

/// The state and message the tally comes to, and the decision.
fn conclude(
    ctx: &Ctx<'_>,
    t: Tally<'_>,
    hold: Option<(RolloutState, Blocker, String)>,
    mut starts: Vec<Action>,
    total: usize,
    budget: usize,
) -> Decision {
    let (state, blocker, message) = if let Some((node, msg)) = &t.failed {
        (
            RolloutState::Failed,
            Some(start::failed_blocker(&t)),
            format!("node {node} failed: {msg}"),
        )
    } else if let Some((s, b, m)) = hold.as_ref().filter(|(s, _, _)| *s == RolloutState::Halted) {
        // The environment's halt is what every cluster of it shows, one
        // that had confirmed or has nodes in flight (they finish) included.
        (*s, Some(*b), m.clone())
    } else if t.confirmed {
        (RolloutState::Confirmed, None, String::new())
    } else if let Some(until) = t.settling {
        (
            RolloutState::Settling,
            None,
            format!(
                "every node is Ready at {} and passed its watch; settling until {}",
                ctx.target,
                rfc3339(until)
            ),
        )
    } else if t.in_flight
        || (hold.is_none() && !t.preparing.is_empty())
        || t.releases
            .iter()
            .any(|a| !matches!(a, Action::Block { .. }))
    {
        (
            RolloutState::Rolling,
            None,
            t.health_hold
                .clone()
                .or_else(|| held::message(&t.held))
                .or_else(|| t.watch_msg.clone())
                .or_else(|| in_flight::message(&t))
                .unwrap_or_default(),
        )
    } else if let Some(b) = &t.blocked_msg {
        (RolloutState::Blocked, Some(Blocker::Pdb), b.clone())
    } else if let Some((s, b, m)) = hold {
        (s, Some(b), m)
    } else if total == 0 {
        (
            RolloutState::Blocked,
            Some(Blocker::Selector),
            "no selected nodes".into(),
        )
    } else if !t.skipped.is_empty() && t.consent_held == t.skipped.len() {
        // Waiting on the workloads is not a fault to look at (a blocked
        // node, which is, named the state above); a hold past the limit is
        // named, the blocker stays consent.
        (
            RolloutState::Pending,
            Some(Blocker::Consent),
            consent::message(&t),
        )
    } else if !t.skipped.is_empty() {
        let list: Vec<String> = t
            .skipped
            .iter()
            .map(|s| format!("{}: {}", s.node, s.reason))
            .collect();
        (
            RolloutState::Blocked,
            // The first node left alone that is not waiting for its
            // workload's consent names the cluster's blocker.
            t.skipped
                .iter()
                .map(|s| s.blocker)
                .find(|b| *b != Blocker::Consent)
                .or(Some(Blocker::Pdb)),
            format!("nodes not moved: {}", list.join("; ")),
        )
    } else {
        (
            RolloutState::Blocked,
            Some(Blocker::Budget),
            format!(
                "budget used up: {} of {} unavailable",
                t.unavailable,
                crate::terminal::count(budget as u64, "node", "nodes")
            ),
        )
    };
    let mut actions = t.releases;
    actions.extend(t.advances);
    actions.append(&mut starts);
    Decision {
        actions,
        state,
        message,
        blocker,
        nodes: total as u32,
        nodes_at_version: t.at_version as u32,
        max_unavailable: budget as u32,
        unavailable: t.unavailable as u32,
        skipped: t.skipped,
        wake_at: t.wake.0,
        poll_health: t.poll_health,
        held: t.held,
        consent_overdue: t.consent_overdue,
    }
}
