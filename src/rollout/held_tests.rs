//! Nodes held by a fault of their own (`held.rs`), step by step: the held
//! node keeps its slot and its timeouts, every other node proceeds; then the
//! engine against the sim with one node's calls failing.

use super::decide::*;
use super::decide_tests::idle;
use super::decide_tests::{self, kinds, open, t, v};
use super::decision::*;
use super::engine::{reconcile, Outcome};
use super::{Clock, RolloutState, VirtualClock, HELD_PREFIX};
use crate::cluster::{Cluster, NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::OnDrainTimeout;
use crate::sim::{CallFault, Pod, Sim, SimNode};
use chrono::{DateTime, Utc};
use futures::executor::block_on;
use std::time::Duration;

fn policy(max: u32) -> Policy {
    decide_tests::policy(max, OnDrainTimeout::Skip)
}

pub(super) fn with(mut n: NodeView, state: ProgressState, started: &str, msg: &str) -> NodeView {
    n.progress = Ok(Some(NodeProgress {
        state,
        target: v("1.13.2"),
        started_at: t(started),
        cordoned_by_drover: state.in_flight(),
        message: msg.into(),
        retries: 0,
        previous: None,
    }));
    n.unschedulable = state.in_flight();
    n
}

fn draining_with_pods(name: &str, pods: usize) -> NodeView {
    let mut n = with(idle(name, "1.12.0"), ProgressState::Draining, "03:00", "");
    n.pods_to_evict = pods;
    n
}

#[test]
fn a_node_whose_pods_cannot_be_listed_holds_only_itself() {
    let mut a = draining_with_pods("a", 0);
    a.fault = Some("its pods cannot be listed: 500".into());
    let b = draining_with_pods("b", 2);
    let nodes = [a, b, idle("c", "1.12.0")];
    let d = decide(&policy(3), &open(), &nodes, t("03:05"));
    // `a` takes no step that needs its pods (no upgrade on a guessed zero),
    // records why it is held; `b` evicts and `c` starts in a's presence.
    assert_eq!(
        kinds(&d),
        [
            ("note", "a".into()),
            ("evict", "b".into()),
            ("cordon", "c".into())
        ]
    );
    let Action::Note { progress, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert_eq!(progress.state, ProgressState::Draining);
    assert!(progress.cordoned_by_drover);
    assert_eq!(
        progress.message,
        "held: its pods cannot be listed: 500 (since 2026-12-08T03:05:00Z)"
    );
    // It keeps its budget slot: three of three.
    assert_eq!(d.unavailable, 3);
    assert_eq!(d.held.len(), 1);
    assert_eq!(d.held[0].node, "a");
    assert_eq!(d.state, RolloutState::Rolling);
    assert!(
        d.message
            .starts_with("node a held since 2026-12-08T03:05:00Z"),
        "{}",
        d.message
    );

    // Control: listed, with nothing left on it, the same node is upgraded.
    let nodes = [draining_with_pods("a", 0)];
    let d = decide(&policy(3), &open(), &nodes, t("03:05"));
    assert_eq!(kinds(&d), [("start_upgrade", "a".into())]);
}

#[test]
fn a_held_draining_node_is_given_back_at_its_drain_timeout() {
    let mut a = with(
        idle("a", "1.12.0"),
        ProgressState::Draining,
        "03:00",
        "held: its pods cannot be listed: 500 (since 2026-12-08T03:01:00Z)",
    );
    a.fault = Some("its pods cannot be listed: 500".into());
    let carried = Held {
        node: "a".into(),
        why: "its pods cannot be listed: 500".into(),
        since: t("03:01"),
        last: t("03:19"),
    };
    let inputs = Inputs {
        held: vec![carried],
        ..open()
    };
    // Before the timeout: the message is already recorded, nothing to write.
    let d = decide(&policy(1), &inputs, std::slice::from_ref(&a), t("03:19"));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.wake_at, Some(t("03:20")));
    assert_eq!(d.held[0].since, t("03:01"), "a hold keeps its since");
    // At the timeout it is given back like any drain that did not finish.
    let d = decide(&policy(1), &inputs, &[a], t("03:20"));
    let Action::Block {
        progress, uncordon, ..
    } = &d.actions[0]
    else {
        panic!("{:?}", d.actions)
    };
    assert!(*uncordon);
    assert!(
        progress
            .message
            .starts_with("drain did not finish within drain_timeout (20m): its pods could not be listed; held: its pods cannot be listed: 500"),
        "{}",
        progress.message
    );
}

#[test]
fn an_upgrading_node_that_cannot_be_confirmed_fails_only_at_its_timeout() {
    let mut a = with(idle("a", "1.13.1"), ProgressState::Upgrading, "03:00", "");
    a.upgrade = UpgradeStatus::Succeeded;
    // Ready at the wrong version is a failure... unless the read confirming
    // it failed: then no verdict on it but the timeout's.
    let control = decide(&policy(1), &open(), std::slice::from_ref(&a), t("03:10"));
    assert_eq!(kinds(&control), [("fail", "a".into())]);
    a.fault = Some("its version cannot be confirmed: timeout".into());
    let d = decide(&policy(1), &open(), std::slice::from_ref(&a), t("03:10"));
    assert_eq!(kinds(&d), [("note", "a".into())]);
    assert_eq!(d.state, RolloutState::Rolling);
    assert_eq!(d.wake_at, Some(t("03:45")));
    let d = decide(&policy(1), &open(), &[a], t("03:45"));
    assert_eq!(kinds(&d), [("fail", "a".into())]);
    assert_eq!(d.state, RolloutState::Failed);
}

#[test]
fn a_node_whose_start_failed_goes_after_the_others() {
    let nodes = [
        idle("a", "1.12.0"),
        idle("b", "1.12.0"),
        idle("c", "1.12.0"),
    ];
    let failed = |node: &str, last: &str| Held {
        node: node.into(),
        why: "cordon failed: admission webhook denied".into(),
        since: t("02:50"),
        last: t(last),
    };
    let inputs = Inputs {
        held: vec![failed("a", "03:00")],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:00"));
    assert_eq!(kinds(&d), [("cordon", "b".into())]);
    assert_eq!(d.held.len(), 1, "still named while its hold lasts");
    // After HELD_RETRY its hold lapses: back in name order.
    let d = decide(&policy(1), &inputs, &nodes, t("03:01"));
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
    assert!(d.held.is_empty());
    // When every start failed (the API server was gone for a moment), the
    // first is tried again at once: the one that failed longest ago.
    let inputs = Inputs {
        held: vec![
            failed("a", "03:00:30"),
            failed("b", "03:00:10"),
            failed("c", "03:00:20"),
        ],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:00:40"));
    assert_eq!(kinds(&d), [("cordon", "b".into())]);
    // Control: without the hold, `a` comes first.
    let d = decide(&policy(1), &open(), &nodes, t("03:00"));
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
}

#[test]
fn a_hold_that_ended_clears_its_note() {
    let b = with(
        idle("b", "1.12.0"),
        ProgressState::Draining,
        "03:00",
        &format!("{HELD_PREFIX}evict pod x failed (since 2026-12-08T03:01:00Z)"),
    );
    let mut evicting = b.clone();
    evicting.pods_to_evict = 1;
    let d = decide(&policy(1), &open(), &[evicting], t("03:05"));
    assert_eq!(kinds(&d), [("note", "b".into()), ("evict", "b".into())]);
    let Action::Note { progress, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert_eq!(progress.message, "");
    // Drained: the message is cleared on the record before the upgrade
    // starts (its Job is the record of `upgrading`, nothing else is written).
    let d = decide(&policy(1), &open(), &[b], t("03:05"));
    assert_eq!(
        kinds(&d),
        [("note", "b".into()), ("start_upgrade", "b".into())]
    );
    let Action::Note { progress, .. } = &d.actions[0] else {
        panic!("{:?}", d.actions)
    };
    assert_eq!(progress.message, "");
}

#[test]
fn failed_give_backs_take_the_room_of_the_last_starts() {
    let mut complete = with(idle("a", "1.13.2"), ProgressState::Upgrading, "03:00", "");
    complete.upgrade = UpgradeStatus::Succeeded;
    let nodes = [
        complete,
        idle("b", "1.12.0"),
        idle("c", "1.12.0"),
        idle("d", "1.12.0"),
    ];
    let d = decide(&policy(2), &open(), &nodes, t("03:10"));
    assert_eq!(
        kinds(&d),
        [
            ("complete", "a".into()),
            ("cordon", "b".into()),
            ("cordon", "c".into())
        ]
    );
    assert!(d.actions[0].gives_back());
    assert_eq!(d.starts_within_budget(0), 2);
    // `a` is still cordoned if its uncordon failed: one start fits.
    assert_eq!(d.starts_within_budget(1), 1);
    assert_eq!(d.starts_within_budget(5), 0);
}

pub(super) fn sim_with(clock: &VirtualClock, nodes: &[(&str, usize)]) -> Sim {
    let sim = Sim::new("held", clock.clone());
    for (name, pods) in nodes {
        sim.add_node(
            SimNode::new(*name, Some(v("1.12.0")), Duration::from_secs(5 * 60)).with_pods(
                (0..*pods)
                    .map(|i| Pod {
                        name: format!("{name}-{i}"),
                        pdb: None,
                    })
                    .collect(),
            ),
        );
    }
    sim
}

/// Run the engine, carrying holds, until every node is done or `until`.
pub(super) fn run(
    sim: &Sim,
    clock: &VirtualClock,
    p: &Policy,
    until: DateTime<Utc>,
) -> Vec<Outcome> {
    let mut outs: Vec<Outcome> = Vec::new();
    for _ in 0..500 {
        let now = clock.now();
        let inputs = Inputs {
            held: outs.last().map(|o| o.held.clone()).unwrap_or_default(),
            ..open()
        };
        let out = block_on(reconcile(sim, p, &inputs, now)).expect("observation never fails");
        let again = out.again;
        let next = [sim.next_event(now), out.decision.wake_at]
            .into_iter()
            .flatten()
            .filter(|w| *w > now)
            .min();
        outs.push(out);
        if again {
            continue;
        }
        match next {
            Some(w) if w <= until => clock.set(w),
            _ => break,
        }
        if now > until {
            break;
        }
    }
    outs
}

#[test]
fn one_nodes_failing_evictions_hold_it_while_the_others_finish() {
    let clock = VirtualClock::new(t("03:00"));
    let sim = sim_with(&clock, &[("a", 1), ("b", 1), ("c", 1)]);
    sim.inject("a", CallFault::Evict, t("00:00"), t("23:00"));
    let p = policy(3);
    // Until just after a's drain timeout (its retry would come at 03:25).
    let outs = run(&sim, &clock, &p, t("03:22"));
    let nodes = block_on(sim.observe()).unwrap();
    let at = |n: &str| nodes.iter().find(|x| x.name == n).unwrap().clone();
    for n in ["b", "c"] {
        assert_eq!(at(n).version, Some(v("1.13.2")), "{n} finished");
        assert!(!at(n).unschedulable);
    }
    // `a` was held from its first failed eviction, then given back at its
    // drain timeout (20 minutes after its start), uncordoned, blocked.
    let first = outs.iter().find(|o| !o.held.is_empty()).unwrap();
    assert_eq!(first.held[0].node, "a");
    assert!(
        first.held[0].why.contains("injected fault: Evict"),
        "{:?}",
        first.held
    );
    let a = at("a");
    assert!(!a.unschedulable);
    let p_a = a.progress.unwrap().unwrap();
    assert_eq!(p_a.state, ProgressState::Blocked);
    assert_eq!(p_a.started_at, t("03:20"));
    assert!(
        p_a.message.contains("injected fault: Evict"),
        "{}",
        p_a.message
    );
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert!(sim.peak_unavailable() <= 3);
}

/// Run `f` and return what it returned with the messages of the warnings
/// the engine logged meanwhile (on this thread).
fn engine_warnings<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;
    type Seen = Arc<Mutex<Vec<String>>>;
    struct Warnings(Seen);
    struct Message(String);
    impl tracing::field::Visit for Message {
        fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
            if f.name() == "message" {
                self.0 = format!("{v:?}");
            }
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if *e.metadata().level() == tracing::Level::WARN
                && e.metadata().target() == "drover::rollout::engine"
            {
                let mut m = Message(String::new());
                e.record(&mut m);
                self.0.lock().unwrap_or_else(|p| p.into_inner()).push(m.0);
            }
        }
    }
    let seen: Seen = Arc::default();
    let subscriber = tracing_subscriber::registry().with(Warnings(seen.clone()));
    let out = {
        // While only one subscriber lives, tracing judges a callsite first
        // hit on another test's thread by that thread's subscriber alone
        // (none: never enabled), and caches it: this test then missed the
        // engine's warnings 1 run in 3. A second one, kept alive, makes it
        // ask every live subscriber, this test's among them.
        let _second = tracing::Dispatch::new(tracing_subscriber::registry());
        let _guard = tracing::subscriber::set_default(subscriber);
        // Callsites cached before this test's subscriber: asked again.
        tracing::callsite::rebuild_interest_cache();
        f()
    };
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    (out, seen)
}

#[test]
fn a_call_that_fails_again_for_the_same_reason_is_warned_of_once() {
    // Once per hold and reason: a fault that lasts is not news at every
    // pass (an eviction failing for ten minutes would be a warning each
    // pacing step, in an operator's log and in whatever alerts on it).
    let (passes_held, warnings) = engine_warnings(|| {
        let clock = VirtualClock::new(t("03:00"));
        let sim = sim_with(&clock, &[("a", 1)]);
        sim.inject("a", CallFault::Evict, t("00:00"), t("23:00"));
        let p = policy(1);
        let mut held = Vec::new();
        let mut passes_held = 0;
        for m in 0..6 {
            clock.set(t("03:00") + chrono::Duration::minutes(m));
            let inputs = Inputs {
                held: std::mem::take(&mut held),
                ..open()
            };
            let out = block_on(reconcile(&sim, &p, &inputs, clock.now())).unwrap();
            held = out.held;
            passes_held += usize::from(held.iter().any(|h| h.node == "a"));
        }
        passes_held
    });
    assert_eq!(passes_held, 5, "held from its first eviction on");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
}

#[test]
fn a_start_withheld_for_a_failed_give_back_is_warned_of() {
    // `a`'s give-back fails while the step also starts `b` in the room it
    // would have made: `b`'s start is dropped, and an operator is told why
    // nothing started.
    let (starts_during_fault, warnings) = engine_warnings(|| {
        let clock = VirtualClock::new(t("03:00"));
        let sim = sim_with(&clock, &[("a", 0), ("b", 0)]);
        sim.inject("a", CallFault::Write, t("03:03"), t("03:30"));
        run(&sim, &clock, &policy(1), t("03:29"));
        sim.log()
            .into_iter()
            .filter(|e| e.node == "b" && e.kind == crate::sim::EventKind::Cordon)
            .count()
    });
    assert_eq!(starts_during_fault, 0, "b waits while a counts");
    let withheld = warnings
        .iter()
        .filter(|w| w.starts_with("starts withheld"))
        .count();
    assert!(withheld >= 1, "{warnings:?}");
}

#[test]
fn a_failed_uncordon_keeps_its_slot_and_the_budget_holds() {
    let clock = VirtualClock::new(t("03:00"));
    let sim = sim_with(&clock, &[("a", 0), ("b", 0), ("c", 0)]);
    // `a`'s writes fail from 03:03 (after its cordon, before its return):
    // it stays cordoned and counts, so `b` waits rather than exceed the budget.
    sim.inject("a", CallFault::Write, t("03:03"), t("03:30"));
    let p = policy(1);
    run(&sim, &clock, &p, t("06:00"));
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert_eq!(
        sim.peak_unavailable(),
        1,
        "never two nodes out with a budget of one"
    );
    let nodes = block_on(sim.observe()).unwrap();
    assert!(nodes
        .iter()
        .all(|n| n.version == Some(v("1.13.2")) && !n.unschedulable));
    // `b` started only once `a` was given back, after the fault ended.
    let b_start = sim
        .log()
        .into_iter()
        .find(|e| e.node == "b" && e.kind == crate::sim::EventKind::Cordon)
        .unwrap();
    assert!(b_start.at >= t("03:30"), "{}", b_start.at);
}

/// The sim, with `b`'s eviction passes slow (they yield to the executor a
/// number of times) and every call's start and end in `calls`.
struct SlowDrain<'a> {
    sim: &'a Sim,
    calls: std::sync::Mutex<Vec<String>>,
}

impl SlowDrain<'_> {
    fn note(&self, what: String) {
        self.calls.lock().unwrap().push(what);
    }
}

/// Returns `Pending` once, waking itself: the executor polls others first.
struct YieldNow(bool);

impl std::future::Future for YieldNow {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

impl Cluster for SlowDrain<'_> {
    type Error = crate::sim::SimError;
    fn name(&self) -> &str {
        self.sim.name()
    }
    async fn observe(&self) -> Result<Vec<NodeView>, Self::Error> {
        self.sim.observe().await
    }
    async fn write_record(
        &self,
        w: &crate::cluster::RecordWrite,
    ) -> Result<crate::cluster::Stored, Self::Error> {
        self.sim.write_record(w).await
    }
    async fn cordon(&self, node: &str) -> Result<crate::cluster::Cordoned, Self::Error> {
        let r = self.sim.cordon(node).await;
        self.note(format!("cordon {node}"));
        r
    }
    async fn taint(&self, node: &str) -> Result<(), Self::Error> {
        self.sim.taint(node).await
    }

    async fn uncordon(&self, node: &str) -> Result<(), Self::Error> {
        let r = self.sim.uncordon(node).await;
        self.note(format!("uncordon {node}"));
        r
    }
    async fn evict(
        &self,
        node: &str,
        order: &crate::cluster::DrainOrder<'_>,
    ) -> Result<crate::cluster::EvictionPass, Self::Error> {
        if node != "b" {
            return self.sim.evict(node, order).await;
        }
        self.note("evict b begins".into());
        for _ in 0..50 {
            YieldNow(false).await;
        }
        let r = self.sim.evict(node, order).await;
        self.note("evict b ends".into());
        r
    }
    async fn start_run(
        &self,
        node: &str,
        start: &crate::cluster::RunStart,
    ) -> Result<(), Self::Error> {
        self.sim.start_run(node, start).await
    }
    async fn stop_run(&self, node: &str, run: &crate::cluster::RunLink) -> Result<(), Self::Error> {
        self.sim.stop_run(node, run).await
    }
}

#[test]
fn a_freed_place_is_filled_while_the_steps_slower_calls_are_still_out() {
    let clock = VirtualClock::new(t("03:00"));
    // `b`'s pod is under a budget that refuses it for an hour: `b` is
    // evicted again at every step while `a` upgrades and comes back.
    let sim = sim_with(&clock, &[("a", 0), ("c", 0)]);
    sim.add_node(
        SimNode::new("b", Some(v("1.12.0")), Duration::from_secs(5 * 60)).with_pods(vec![Pod {
            name: "b-0".into(),
            pdb: Some("hold".into()),
        }]),
    );
    sim.add_pdb(
        "hold",
        crate::sim::Pdb {
            min_available: 0,
            blocked_until: Some(t("04:00")),
        },
    );
    let slow = SlowDrain {
        sim: &sim,
        calls: std::sync::Mutex::new(Vec::new()),
    };
    let p = policy(2);
    let mut held = Vec::new();
    for _ in 0..50 {
        let now = clock.now();
        let inputs = Inputs {
            held: std::mem::take(&mut held),
            ..open()
        };
        let out = block_on(reconcile(&slow, &p, &inputs, now)).expect("observation never fails");
        held = out.held;
        if slow.calls.lock().unwrap().iter().any(|c| c == "cordon c") {
            break;
        }
        if !out.again {
            let next = [sim.next_event(now), out.decision.wake_at]
                .into_iter()
                .flatten()
                .filter(|w| *w > now)
                .min()
                .expect("something is due");
            clock.set(next);
        }
    }
    let calls = slow.calls.lock().unwrap().clone();
    let c = calls
        .iter()
        .position(|c| c == "cordon c")
        .unwrap_or_else(|| panic!("c never started: {calls:?}"));
    // In the step that gave `a` back, `c` was cordoned while `b`'s pass
    // (decided before it) was still out: the place did not wait for it.
    let a = calls.iter().position(|c| c == "uncordon a");
    assert!(a.is_some_and(|a| a < c), "{calls:?}");
    let last_b = calls[..c]
        .iter()
        .rposition(|c| c.starts_with("evict b"))
        .expect("b was evicted in the step");
    assert_eq!(calls[last_b], "evict b begins", "{calls:?}");
    assert_eq!(calls[c + 1], "evict b ends", "{calls:?}");
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert_eq!(sim.peak_unavailable(), 2);
}

#[test]
fn an_unreadable_record_is_reported_and_the_node_left_alone() {
    let mut n = idle("a", "1.12.0");
    n.progress = Err(crate::cluster::RecordError::Missing("target"));
    let d = decide(&policy(1), &open(), &[n], t("03:00"));
    assert!(d.actions.is_empty());
    assert!(d.skipped[0].reason.contains("unreadable record"));
}

#[test]
fn a_node_out_of_service_whose_record_cannot_be_read_fills_the_budget() {
    // NotReady, its record unreadable: still out of service, so with
    // max_unavailable 1 no other node starts. Ready, it leaves room.
    let p = policy(1);
    let mut a = idle("a", "1.12.0");
    a.progress = Err(crate::cluster::RecordError::Missing("target"));
    let d = decide(&p, &open(), &[a.clone(), idle("b", "1.12.0")], t("03:00"));
    assert!(d.actions.iter().any(|x| x.node() == "b"), "{:?}", d.actions);
    a.ready = false;
    let d = decide(&p, &open(), &[a, idle("b", "1.12.0")], t("03:00"));
    assert_eq!(d.unavailable, 1);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

#[test]
fn a_give_back_that_lands_makes_room_for_a_start_in_the_same_step() {
    // With room for one, `b` is cordoned in the step whose `complete` of
    // `a` lands, not one step later.
    let clock = VirtualClock::new(t("03:00"));
    let sim = sim_with(&clock, &[("a", 0), ("b", 0)]);
    let outs = run(&sim, &clock, &policy(1), t("06:00"));
    let is = |o: &Outcome, kind: &str, node: &str| {
        o.decision
            .actions
            .iter()
            .any(|a| a.kind() == kind && a.node() == node)
    };
    let step = outs
        .iter()
        .find(|o| is(o, "complete", "a"))
        .expect("a completes");
    assert!(is(step, "cordon", "b"), "{:?}", step.decision.actions);
    assert_eq!(sim.violations(), Vec::<String>::new());
}

/// `a` cordoned for 1.13.1 and drained (it has no pods), then 1.13.2
/// pinned: the next step retargets it and starts its run.
fn drained_then_repinned() -> (VirtualClock, Sim, Policy) {
    let clock = VirtualClock::new(t("03:00"));
    let sim = sim_with(&clock, &[("a", 0)]);
    let mut p = policy(1);
    p.target = v("1.13.1");
    let out = block_on(reconcile(&sim, &p, &open(), clock.now())).unwrap();
    assert_eq!(kinds(&out.decision), [("cordon", "a".into())]);
    p.target = v("1.13.2");
    (clock, sim, p)
}

#[test]
fn a_nodes_calls_after_one_that_landed_go_on_in_the_same_step() {
    // A new pin while `a` drains: its retarget and its run's start are one
    // step's two calls, the second applied once the first landed (only a
    // call that failed stops the node's next ones).
    let (clock, sim, p) = drained_then_repinned();
    let out = block_on(reconcile(&sim, &p, &open(), clock.now())).unwrap();
    assert_eq!(
        kinds(&out.decision),
        [("retarget", "a".into()), ("start_upgrade", "a".into())]
    );
    let a = sim.nodes().into_iter().find(|n| n.name == "a").unwrap();
    assert_eq!(
        a.runs(),
        [(crate::record::RunAction::Upgrade, 1, v("1.13.2"))]
    );
}

#[test]
fn a_nodes_call_that_failed_stops_its_next_ones_in_the_same_step() {
    // The retarget and start above, with `a`'s writes failing: the start
    // builds on the record the retarget would have stored, so it is not
    // tried in that step (counted by the cluster: one record write, the
    // retarget's, not two), and `a` is held.
    let (clock, sim, p) = drained_then_repinned();
    sim.inject("a", CallFault::Write, t("03:00"), t("04:00"));
    let writes = || sim.calls("write_record", "a");
    let before = writes();
    let out = block_on(reconcile(&sim, &p, &open(), clock.now())).unwrap();
    assert_eq!(writes() - before, 1, "record writes on `a` in the step");
    assert_eq!(out.held.iter().map(|h| &h.node).collect::<Vec<_>>(), ["a"]);
    let a = sim.nodes().into_iter().find(|n| n.name == "a").unwrap();
    assert!(a.runs().is_empty(), "{:?}", a.runs());
}

#[test]
fn a_given_back_node_is_released_only_while_drovers_own_cordon_stands() {
    // Failed and blocked nodes, each either still cordoned by drover (it
    // is released: uncordoned, the cordon no longer drover's), cordoned
    // since by someone else, or uncordoned by a person: drover releases
    // only the first, never lifting a cordon it did not make.
    for state in [ProgressState::Failed, ProgressState::Blocked] {
        for (by_drover, cordoned, released) in [
            (true, true, true),
            (false, true, false),
            (true, false, false),
        ] {
            let mut a = with(idle("a", "1.12.0"), state, "03:00", "driver failed");
            if let Ok(Some(p)) = a.progress.as_mut() {
                p.cordoned_by_drover = by_drover;
            }
            a.unschedulable = cordoned;
            let d = decide(&policy(1), &open(), &[a], t("03:30"));
            let release = d
                .actions
                .iter()
                .any(|x| matches!(x, Action::Release { node, .. } if node == "a"));
            assert_eq!(
                release, released,
                "{state:?}, cordoned by drover {by_drover}, unschedulable {cordoned}: {:?}",
                d.actions
            );
        }
    }
}

#[test]
fn a_held_node_whose_call_lands_is_no_longer_held() {
    // `a`'s writes fail from 03:03 to 03:30: its give-back is held; the
    // step whose give-back lands lets the hold go.
    let clock = VirtualClock::new(t("03:00"));
    let sim = sim_with(&clock, &[("a", 0)]);
    sim.inject("a", CallFault::Write, t("03:03"), t("03:30"));
    let outs = run(&sim, &clock, &policy(1), t("06:00"));
    assert!(
        outs.iter().any(|o| o.held.iter().any(|h| h.node == "a")),
        "the failed write held `a`"
    );
    let landed = outs
        .iter()
        .find(|o| o.decision.actions.iter().any(|a| a.gives_back()))
        .expect("a's give-back lands");
    assert_eq!(landed.held, Vec::<Held>::new());
}

#[test]
fn a_rolling_back_node_whose_pods_cannot_be_listed_starts_no_run() {
    // Neither evicted nor run on a guessed zero pods: held, its rollback's
    // node_timeout still running.
    let mut a = with(
        idle("a", "1.13.2"),
        ProgressState::RollingBack,
        "03:00",
        "health check failed: pods crash-looping",
    );
    if let Ok(Some(p)) = a.progress.as_mut() {
        p.previous = Some(v("1.12.0"));
    }
    a.fault = Some("its pods cannot be listed: 500".into());
    let d = decide(&policy(3), &open(), &[a], t("03:05"));
    assert!(
        d.actions.iter().all(|x| x.kind() == "note"),
        "{:?}",
        d.actions
    );
    assert_eq!(d.held.len(), 1);
}

#[test]
fn a_give_back_applied_outside_the_engine_uncordons_the_node_and_clears_its_record() {
    // `apply` is how the agent gives nodes back outside a pass (on SIGTERM,
    // with no config to act on): one action, applied from what was observed.
    let clock = VirtualClock::new(t("03:00"));
    let sim = sim_with(&clock, &[("a", 1)]);
    sim.inject("a", CallFault::Evict, t("00:00"), t("23:00"));
    run(&sim, &clock, &policy(1), t("03:10"));
    let views = block_on(sim.observe()).expect("observe");
    let a = views.iter().find(|n| n.name == "a").expect("a");
    assert!(a.unschedulable, "a is drained first: {a:?}");
    assert!(matches!(&a.progress, Ok(Some(p)) if p.state == ProgressState::Draining));
    let give_back = Action::GiveBack {
        node: "a".into(),
        uncordon: true,
        reason: "the agent stopped while draining".into(),
    };
    block_on(super::apply(&sim, &give_back, &views, clock.now())).expect("applied");
    let views = block_on(sim.observe()).expect("observe");
    let a = views.iter().find(|n| n.name == "a").expect("a");
    assert!(!a.unschedulable, "a is still cordoned: {a:?}");
    assert!(
        !matches!(&a.progress, Ok(Some(p)) if p.state.in_flight()),
        "a's record still says it moves: {:?}",
        a.progress
    );
}
