//! Property tests of docs/design.md §8's invariants: random clusters, configs,
//! failures, PDBs, engine crashes at arbitrary points (the engine has no
//! memory, so a restart is a new engine; a crash mid-step lets only the
//! first calls of the engine's own step reach the cluster), and faults
//! of the API about one node for a while (its pods cannot be listed, its
//! evictions, writes or driver start fail), which must hold that node only.
//!
//! `invariants_hold_across_crashes` runs 512 cases,
//! `rollout_completes_when_nothing_fails` 256 and
//! `rollout_completes_through_passing_faults` 128; together about 20 s in
//! debug on a loaded 2-core machine.

use chrono::{DateTime, Duration as D, Utc};
use drover::config::{MaxUnavailable, OnDrainTimeout};
use drover::rollout::{Clock, Engine, Labels, Policy, RolloutState, VirtualClock};
use drover::sim::{CallFault, CordonedBy, EventKind, Failure, Pdb, Pod, Sim, SimNode, Timeline};
use futures::executor::block_on;
use proptest::prelude::*;
use semver::Version;
use std::collections::BTreeSet;
use std::time::Duration;

fn start() -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse().unwrap()
}

fn target() -> Version {
    Version::new(1, 13, 2)
}

#[derive(Debug, Clone)]
struct NodeSpec {
    version: u8,
    foreign_cordon: bool,
    node_time_min: u16,
    failure: Option<u8>,
    pods: Vec<Option<u8>>,
}

#[derive(Debug, Clone)]
struct Case {
    nodes: Vec<NodeSpec>,
    pdbs: Vec<(u8, Option<u16>)>,
    max: MaxUnavailable,
    drain_min: u16,
    node_min: u16,
    stop: bool,
    windows: Vec<(u16, u16)>,
    gate_after_h: u16,
    crashes: BTreeSet<usize>,
    /// Calls that reach the cluster in a step cut off by a crash.
    prefix: usize,
    /// (node index, fault, from minute, for minutes).
    faults: Vec<(usize, CallFault, u16, u16)>,
}

fn fault() -> impl Strategy<Value = (usize, CallFault, u16, u16)> {
    (
        0usize..40,
        prop::sample::select(vec![
            CallFault::Observe,
            CallFault::Evict,
            CallFault::Write,
            CallFault::Start,
        ]),
        0u16..2000,
        1u16..600,
    )
}

fn node_spec(fail: bool) -> impl Strategy<Value = NodeSpec> {
    let failure = if fail {
        prop::option::weighted(0.12, 0u8..3).boxed()
    } else {
        Just(None).boxed()
    };
    (
        0u8..3,
        prop::bool::weighted(if fail { 0.1 } else { 0.0 }),
        5u16..60,
        failure,
        prop::collection::vec(prop::option::of(0u8..3), 0..3),
    )
        .prop_map(
            |(version, foreign_cordon, node_time_min, failure, pods)| NodeSpec {
                version,
                foreign_cordon,
                node_time_min,
                failure,
                pods,
            },
        )
}

fn case(fail: bool) -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(node_spec(fail), 1..40),
        prop::collection::vec((0u8..4, prop::option::of(0u16..600)), 3),
        prop_oneof![
            (1u32..4).prop_map(MaxUnavailable::Count),
            (1u32..60).prop_map(MaxUnavailable::Percent)
        ],
        (5u16..40, 30u16..120),
        any::<bool>(),
        prop::collection::vec((1u16..30, 60u16..720), 1..5),
        0u16..30,
        prop::collection::btree_set(0usize..400, 0..6),
        0usize..8,
        prop::collection::vec(fault(), 0..10),
    )
        .prop_map(
            |(
                nodes,
                pdbs,
                max,
                (drain_min, node_min),
                stop,
                windows,
                gate,
                crashes,
                prefix,
                faults,
            )| {
                Case {
                    nodes,
                    pdbs,
                    max,
                    drain_min,
                    node_min,
                    stop,
                    windows,
                    gate_after_h: gate,
                    crashes,
                    prefix,
                    faults,
                }
            },
        )
}

fn min(m: u16) -> Duration {
    Duration::from_secs(u64::from(m) * 60)
}

/// Windows: gaps in hours then lengths in minutes, one after another.
fn schedule(c: &Case) -> Timeline {
    let mut t = start();
    let mut windows = Vec::new();
    for (gap_h, len_min) in &c.windows {
        t += D::hours(i64::from(*gap_h));
        let end = t + D::minutes(i64::from(*len_min));
        windows.push((t, end));
        t = end;
    }
    Timeline {
        windows,
        calendar: None,
        gate_from: Some(start() + D::hours(i64::from(c.gate_after_h))),
        gate_waits: None,
    }
}

fn build(c: &Case, clock: &VirtualClock) -> (Sim, Policy) {
    let versions = [Version::new(1, 11, 0), Version::new(1, 12, 0), target()];
    let sim = Sim::new("prop", clock.clone());
    for (i, (min_available, blocked)) in c.pdbs.iter().enumerate() {
        sim.add_pdb(
            format!("pdb-{i}"),
            Pdb {
                min_available: usize::from(*min_available),
                blocked_until: blocked.map(|m| start() + D::minutes(i64::from(m))),
            },
        );
    }
    for (i, n) in c.nodes.iter().enumerate() {
        let mut node = SimNode::new(
            format!("n{i:02}"),
            Some(versions[usize::from(n.version)].clone()),
            min(n.node_time_min),
        )
        .with_pods(
            n.pods
                .iter()
                .enumerate()
                .map(|(j, pdb)| Pod {
                    name: format!("p{i}-{j}"),
                    pdb: pdb.map(|p| format!("pdb-{p}")),
                })
                .collect(),
        );
        if n.foreign_cordon {
            node = node.cordoned_by_other();
        }
        node = match n.failure {
            Some(0) => node.failing(Failure::NeverReturns),
            Some(1) => node.failing(Failure::ReturnsAt(Version::new(1, 13, 1))),
            Some(_) => node.failing(Failure::DriverFails("disk full".into())),
            None => node,
        };
        sim.add_node(node);
    }
    for (i, f, from, len) in &c.faults {
        let from = start() + D::minutes(i64::from(*from));
        let node = format!("n{:02}", i % c.nodes.len());
        sim.inject(&node, *f, from, from + D::minutes(i64::from(*len)));
    }
    let policy = Policy {
        target: target(),
        allow_downgrade: false,
        max_unavailable: c.max,
        drain_timeout: min(c.drain_min),
        node_timeout: min(c.node_min),
        on_drain_timeout: if c.stop {
            OnDrainTimeout::Stop
        } else {
            OnDrainTimeout::Skip
        },
        health: None,
        on_failure: drover::config::OnFailure::Halt,
        max_rollbacks: 1,
        prepare: false,
        prestage: std::time::Duration::ZERO,
        revoked: Vec::new(),
        drain: Vec::new(),
        consent_limit: None,
    };
    (sim, policy)
}

/// Drive the sim with crashes; returns the last state.
fn run(
    c: &Case,
    sim: &Sim,
    policy: &Policy,
    sched: &Timeline,
    clock: &VirtualClock,
) -> RolloutState {
    let faults_end = c
        .faults
        .iter()
        .map(|(_, _, from, len)| start() + D::minutes(i64::from(*from) + i64::from(*len)))
        .max()
        .unwrap_or(start());
    let windows_end = sched.windows.last().map_or(start(), |w| w.1);
    let horizon = windows_end.max(faults_end) + D::hours(6);
    let mut engine = Engine::new(policy.clone(), Labels::default(), clock.clone());
    let mut same_instant = 0;
    let mut state = RolloutState::Rolling;
    // What the agent carries from one step to the next; a restart forgets it.
    let mut held = Vec::new();
    for step in 0..5000 {
        let now = clock.now();
        let inputs = drover::rollout::Inputs {
            held: std::mem::take(&mut held),
            ..sched.inputs(now)
        };
        if c.crashes.contains(&step) {
            // Crash mid-step: the engine's own step, cut off after `prefix`
            // calls that change the cluster, so what lands is what its step
            // sent first, in its order (a give-back before the start it makes
            // room for; a record written and its cordon not sent).
            sim.crash_after(Some(c.prefix));
            let _ = block_on(engine.reconcile(sim, &inputs));
            sim.crash_after(None);
            engine = Engine::new(policy.clone(), Labels::default(), clock.clone());
            continue;
        }
        let out = block_on(engine.reconcile(sim, &inputs)).unwrap();
        held = out.held.clone();
        state = out.decision.state;
        if matches!(state, RolloutState::Confirmed | RolloutState::Failed) && sim.in_flight() == 0 {
            break;
        }
        if out.again && same_instant < 200 {
            same_instant += 1;
            continue;
        }
        assert!(same_instant < 200, "engine loops at one instant");
        same_instant = 0;
        let next = [sim.next_event(now), out.decision.wake_at]
            .into_iter()
            .flatten()
            .filter(|t| *t > now && *t <= horizon)
            .min();
        match next {
            Some(t) => clock.set(t),
            None => break,
        }
    }
    state
}

fn check_invariants(c: &Case, sim: &Sim, policy: &Policy, sched: &Timeline) {
    let budget = policy.max_unavailable.resolve(c.nodes.len());
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert!(
        sim.peak_unavailable() <= budget,
        "peak {} > budget {budget}",
        sim.peak_unavailable()
    );
    for e in sim.log() {
        match &e.kind {
            EventKind::Cordon | EventKind::Adopt => assert!(
                sched.allows(e.at),
                "{} started at {} outside a window or before the gate",
                e.node,
                e.at
            ),
            EventKind::DriverStart(v) => assert_eq!(*v, target()),
            _ => {}
        }
    }
    for n in sim.nodes() {
        assert_ne!(
            n.cordoned_by,
            Some(CordonedBy::Drover),
            "{} left cordoned",
            n.name
        );
        let p = sim.record(&n.name).and_then(|r| r.progress);
        assert!(
            !p.is_some_and(|p| p.state.in_flight()),
            "{} left in flight",
            n.name
        );
        assert!(
            n.driver_runs() <= 1,
            "{} upgraded {} times",
            n.name,
            n.driver_runs()
        );
        if c.nodes[n.name[1..].parse::<usize>().unwrap()].foreign_cordon {
            assert_eq!(
                n.cordoned_by,
                Some(CordonedBy::Other),
                "{} foreign cordon lost",
                n.name
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_across_crashes(c in case(true)) {
        let clock = VirtualClock::new(start());
        let (sim, policy) = build(&c, &clock);
        let sched = schedule(&c);
        run(&c, &sim, &policy, &sched, &clock);
        check_invariants(&c, &sim, &policy, &sched);
    }
}

/// Make `c` a case that must complete: enough window time, budgets that can
/// always let one pod go and relent within ten hours, a node_timeout that
/// leaves room for the reboot (and for `slack` more minutes).
fn completable(c: &mut Case, slack: u16) {
    c.windows = vec![(12, 720); 30];
    // A node_timeout shorter than the node's reboot is a failure, not what this tests.
    c.node_min = c.node_min.max(c.drain_min + 60) + slack;
    // A single node is drained only if its budgets let every pod go at
    // once: evicted pods have nowhere else to become healthy.
    let alone = c.nodes.len() == 1;
    for (i, (m, _)) in c.pdbs.iter_mut().enumerate() {
        let pods = c
            .nodes
            .iter()
            .flat_map(|n| &n.pods)
            .filter(|p| **p == Some(i as u8))
            .count();
        *m = if alone {
            0
        } else {
            (*m).min(pods.saturating_sub(1) as u8)
        };
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn rollout_completes_through_passing_faults(mut c in case(false)) {
        // Faults of up to 20 minutes each: a node held that long must still
        // finish (node_timeout leaves it the room), and so must every other.
        completable(&mut c, 30);
        for f in &mut c.faults {
            f.3 = f.3 % 20 + 1;
        }
        let clock = VirtualClock::new(start());
        let (sim, policy) = build(&c, &clock);
        let sched = schedule(&c);
        let state = run(&c, &sim, &policy, &sched, &clock);
        check_invariants(&c, &sim, &policy, &sched);
        prop_assert_eq!(state, RolloutState::Confirmed);
        for n in sim.nodes() {
            prop_assert_eq!(n.version, Some(target()), "{}", n.name);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn rollout_completes_when_nothing_fails(mut c in case(false)) {
        // Enough window time: thirty 12-hour windows, one a day.
        completable(&mut c, 0);
        c.faults.clear();
        let clock = VirtualClock::new(start());
        let (sim, policy) = build(&c, &clock);
        let sched = schedule(&c);
        let state = run(&c, &sim, &policy, &sched, &clock);
        check_invariants(&c, &sim, &policy, &sched);
        prop_assert_eq!(state, RolloutState::Confirmed);
        for n in sim.nodes() {
            prop_assert_eq!(n.version, Some(target()), "{}", n.name);
        }
    }
}
