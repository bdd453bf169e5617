//! Scenarios on the simulated cluster: the engine driven through virtual
//! time, with PDBs, failures, windows, retries and target changes.

use chrono::{DateTime, Duration as D, Utc};
use drover::cluster::{NodeProgress, ProgressState};
use drover::config::{MaxUnavailable, OnDrainTimeout};
use drover::rollout::{Clock, Engine, Labels, Policy, RolloutState, VirtualClock};
use drover::sim::{drive, CordonedBy, EventKind, Failure, Pdb, Pod, Sim, SimNode, Timeline};
use futures::executor::block_on;
use semver::Version;
use std::time::Duration;

fn t0() -> DateTime<Utc> {
    "2026-12-08T02:00:00Z".parse().unwrap()
}

fn mins(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

fn policy(max: u32, mode: OnDrainTimeout) -> Policy {
    Policy {
        target: Version::new(1, 13, 2),
        allow_downgrade: false,
        max_unavailable: MaxUnavailable::Count(max),
        drain_timeout: mins(20),
        node_timeout: mins(45),
        on_drain_timeout: mode,
        health: None,
        on_failure: drover::config::OnFailure::Halt,
        max_rollbacks: 1,
        prepare: false,
        prestage: std::time::Duration::ZERO,
        revoked: Vec::new(),
        drain: Vec::new(),
        consent_limit: None,
    }
}

fn old() -> Option<Version> {
    Some(Version::new(1, 12, 0))
}

fn engine(p: Policy, clock: &VirtualClock) -> Engine<VirtualClock> {
    Engine::new(p, Labels::default(), clock.clone())
}

/// A node on `version` running one pod, `pod`, that the budget `pdb` guards.
fn guarded(node: &str, version: Option<Version>, pod: &str, pdb: &str) -> SimNode {
    SimNode::new(node, version, mins(15)).with_pods(vec![Pod {
        name: pod.into(),
        pdb: Some(pdb.into()),
    }])
}

/// A budget that keeps `min_available` of its pods and refuses every
/// eviction until `relents` (never when `None`).
fn budget(sim: &Sim, name: &str, min_available: usize, relents: Option<DateTime<Utc>>) {
    sim.add_pdb(
        name,
        Pdb {
            min_available,
            blocked_until: relents,
        },
    );
}

fn progress(sim: &Sim, node: &str) -> Option<NodeProgress> {
    let n = sim.nodes().into_iter().find(|n| n.name == node).unwrap();
    sim.record(&n.name).and_then(|r| r.progress)
}

#[test]
fn next_node_starts_the_instant_the_previous_one_completes() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::uniform("c", clock.clone(), 4, &Version::new(1, 12, 0), mins(15));
    let r = block_on(drive(
        &sim,
        &engine(policy(1, OnDrainTimeout::Skip), &clock),
        &Timeline::always(),
        t0() + D::days(1),
    ))
    .unwrap();
    assert_eq!(r.last.state, RolloutState::Confirmed);
    assert_eq!(r.ended_at, t0() + D::minutes(60));
    let starts: Vec<_> = sim
        .log()
        .into_iter()
        .filter(|e| e.kind == EventKind::Cordon)
        .map(|e| e.at)
        .collect();
    assert_eq!(
        starts,
        (0..4)
            .map(|i| t0() + D::minutes(15 * i))
            .collect::<Vec<_>>()
    );
    assert_eq!(sim.peak_unavailable(), 1);
}

#[test]
fn a_pdb_holds_the_drain_until_it_relents_then_the_node_upgrades() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("c", clock.clone());
    budget(&sim, "db", 1, Some(t0() + D::minutes(10)));
    sim.add_node(guarded("a", old(), "db-0", "db"));
    sim.add_node(guarded("b", Some(Version::new(1, 13, 2)), "db-1", "db"));
    let r = block_on(drive(
        &sim,
        &engine(policy(1, OnDrainTimeout::Skip), &clock),
        &Timeline::always(),
        t0() + D::days(1),
    ))
    .unwrap();
    assert_eq!(r.last.state, RolloutState::Confirmed);
    let evicted = sim
        .log()
        .into_iter()
        .find(|e| matches!(e.kind, EventKind::Evicted(_)))
        .unwrap();
    assert_eq!(
        evicted.at,
        t0() + D::minutes(10),
        "evicted as soon as the PDB relents"
    );
    assert_eq!(r.ended_at, t0() + D::minutes(25));
}

#[test]
fn a_refused_drain_names_the_budget_and_pod_and_keeps_its_since() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("c", clock.clone());
    budget(&sim, "db", 2, None);
    sim.add_node(guarded("a", old(), "db-0", "db"));
    sim.add_node(guarded("b", Some(Version::new(1, 13, 2)), "db-1", "db"));
    let e = engine(policy(1, OnDrainTimeout::Skip), &clock);
    block_on(drive(&sim, &e, &Timeline::always(), t0() + D::minutes(5))).unwrap();
    let first = progress(&sim, "a").unwrap().message;
    assert!(
        first.starts_with("PodDisruptionBudget db refused evicting db-0 since "),
        "{first}"
    );
    // Refused the same way again: the message, and when it began, stay.
    block_on(drive(&sim, &e, &Timeline::always(), t0() + D::minutes(10))).unwrap();
    assert_eq!(progress(&sim, "a").unwrap().message, first);
}

#[test]
fn a_drain_that_never_finishes_is_given_back_blocked_and_others_go_on() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("c", clock.clone());
    budget(&sim, "strict", 1, None);
    sim.add_node(guarded("a", old(), "only", "strict"));
    sim.add_node(SimNode::new("b", old(), mins(15)));
    let sched = Timeline {
        windows: vec![(t0(), t0() + D::hours(1))],
        calendar: None,
        gate_from: Some(t0()),
        gate_waits: None,
    };
    let r = block_on(drive(
        &sim,
        &engine(policy(1, OnDrainTimeout::Skip), &clock),
        &sched,
        t0() + D::days(1),
    ))
    .unwrap();
    let a = progress(&sim, "a").unwrap();
    assert_eq!(a.state, ProgressState::Blocked);
    assert!(a.message.contains("drain_timeout"), "{}", a.message);
    let nodes = sim.nodes();
    assert!(
        nodes.iter().all(|n| !n.unschedulable),
        "nothing left cordoned"
    );
    assert_eq!(nodes[1].version, Some(Version::new(1, 13, 2)));
    assert_eq!(r.last.state, RolloutState::Blocked);
    assert!(sim.violations().is_empty());
}

#[test]
fn stop_mode_waits_for_the_next_window_after_a_blocked_drain() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("c", clock.clone());
    budget(&sim, "db", 0, Some(t0() + D::hours(3)));
    sim.add_node(guarded("a", old(), "p", "db"));
    sim.add_node(SimNode::new("b", old(), mins(15)));
    let next = t0() + D::days(30);
    let sched = Timeline {
        windows: vec![(t0(), t0() + D::hours(6)), (next, next + D::hours(6))],
        calendar: None,
        gate_from: Some(t0()),
        gate_waits: None,
    };
    let r = block_on(drive(
        &sim,
        &engine(policy(1, OnDrainTimeout::Stop), &clock),
        &sched,
        next + D::days(1),
    ))
    .unwrap();
    assert_eq!(r.last.state, RolloutState::Confirmed);
    let starts: Vec<_> = sim
        .log()
        .into_iter()
        .filter(|e| e.kind == EventKind::Cordon)
        .map(|e| (e.node, e.at))
        .collect();
    assert_eq!(
        starts,
        [
            ("a".into(), t0()),
            ("a".into(), next),
            ("b".into(), next + D::minutes(15))
        ]
    );
}

#[test]
fn a_node_that_never_returns_fails_the_rollout_uncordoned() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("c", clock.clone());
    sim.add_node(SimNode::new("a", old(), mins(15)).failing(Failure::NeverReturns));
    sim.add_node(SimNode::new("b", old(), mins(15)));
    let r = block_on(drive(
        &sim,
        &engine(policy(1, OnDrainTimeout::Skip), &clock),
        &Timeline::always(),
        t0() + D::days(1),
    ))
    .unwrap();
    assert_eq!(r.last.state, RolloutState::Failed);
    assert!(
        r.last
            .message
            .contains("did not return Ready at 1.13.2 within node_timeout"),
        "{}",
        r.last.message
    );
    // Its run is stopped at node_timeout, and the node uncordoned once
    // its pod is gone.
    assert_eq!(
        r.ended_at,
        t0() + D::minutes(45) + D::from_std(drover::sim::STOP_GRACE).unwrap()
    );
    let nodes = sim.nodes();
    assert!(!nodes[0].unschedulable);
    assert_eq!(
        nodes[1].version,
        old(),
        "no further node starts after a failure"
    );
}

#[test]
fn wrong_version_fails_and_a_retry_annotation_resumes() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("c", clock.clone());
    sim.add_node(
        SimNode::new("a", old(), mins(15)).failing(Failure::ReturnsAt(Version::new(1, 13, 1))),
    );
    sim.add_node(SimNode::new("b", old(), mins(15)));
    let e = engine(policy(1, OnDrainTimeout::Skip), &clock);
    let r = block_on(drive(&sim, &e, &Timeline::always(), t0() + D::days(1))).unwrap();
    assert_eq!(r.last.state, RolloutState::Failed);
    assert!(
        r.last.message.contains("Ready at 1.13.1 instead of 1.13.2"),
        "{}",
        r.last.message
    );

    sim.request_retry("a");
    let r = block_on(drive(&sim, &e, &Timeline::always(), t0() + D::days(1))).unwrap();
    // The retried node is idle again and, first by name, is tried again; the
    // sim returns it at 1.13.1 once more.
    assert_eq!(r.last.state, RolloutState::Failed);
    assert_eq!(sim.nodes()[0].driver_runs(), 2, "a retry is a new attempt");
}

#[test]
fn a_restarted_engine_resumes_from_the_records() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::uniform("c", clock.clone(), 3, &Version::new(1, 12, 0), mins(15));
    let p = policy(1, OnDrainTimeout::Skip);
    // Run a while, then throw the engine away mid-upgrade.
    block_on(drive(
        &sim,
        &engine(p.clone(), &clock),
        &Timeline::always(),
        t0() + D::minutes(20),
    ))
    .unwrap();
    // Upgrading: the record still says draining, its driver run (the Job
    // on a real cluster) is the record of the upgrade.
    assert_eq!(
        progress(&sim, "node-0001").unwrap().state,
        ProgressState::Draining
    );
    let upgrading = sim.nodes().into_iter().find(|n| n.name == "node-0001");
    assert_eq!(upgrading.unwrap().driver_runs(), 1);
    let r = block_on(drive(
        &sim,
        &engine(p, &clock),
        &Timeline::always(),
        t0() + D::days(1),
    ))
    .unwrap();
    assert_eq!(r.last.state, RolloutState::Confirmed);
    assert_eq!(r.ended_at, t0() + D::minutes(45));
    assert!(sim.nodes().iter().all(|n| n.driver_runs() == 1));
}

#[test]
fn the_window_closing_lets_the_node_in_flight_finish_and_starts_no_other() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::uniform("c", clock.clone(), 3, &Version::new(1, 12, 0), mins(15));
    let sched = Timeline {
        windows: vec![(t0(), t0() + D::minutes(20))],
        calendar: None,
        gate_from: Some(t0()),
        gate_waits: None,
    };
    let r = block_on(drive(
        &sim,
        &engine(policy(1, OnDrainTimeout::Skip), &clock),
        &sched,
        t0() + D::days(1),
    ))
    .unwrap();
    // Waiting for a window is `pending`, not `blocked`: nobody needs to look.
    assert_eq!(r.last.state, RolloutState::Pending);
    let at: Vec<_> = sim.nodes().into_iter().map(|n| n.version).collect();
    assert_eq!(
        at,
        [
            Some(Version::new(1, 13, 2)),
            Some(Version::new(1, 13, 2)),
            old()
        ]
    );
    assert_eq!(
        clock.now(),
        t0() + D::minutes(30),
        "the second node, started at 0:15, finished after close"
    );
}

#[test]
fn a_node_cordoned_by_someone_else_is_never_touched() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("c", clock.clone());
    sim.add_node(SimNode::new("a", old(), mins(15)).cordoned_by_other());
    sim.add_node(SimNode::new("b", old(), mins(15)));
    let r = block_on(drive(
        &sim,
        &engine(policy(1, OnDrainTimeout::Skip), &clock),
        &Timeline::always(),
        t0() + D::days(1),
    ))
    .unwrap();
    assert_eq!(r.last.state, RolloutState::Blocked);
    assert!(
        r.last.message.contains("a: cordoned by someone else"),
        "{}",
        r.last.message
    );
    let a = &sim.nodes()[0];
    assert_eq!(
        (a.cordoned_by, a.version.clone(), sim.record("a")),
        (Some(CordonedBy::Other), old(), None)
    );
}

#[test]
fn a_new_target_clears_failed_records_and_moves_on() {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("c", clock.clone());
    sim.add_node(
        SimNode::new("a", old(), mins(15)).failing(Failure::DriverFails("disk full".into())),
    );
    let r = block_on(drive(
        &sim,
        &engine(policy(1, OnDrainTimeout::Skip), &clock),
        &Timeline::always(),
        t0() + D::days(1),
    ))
    .unwrap();
    assert_eq!(r.last.state, RolloutState::Failed);
    assert!(r.last.message.contains("disk full"));
    let mut newer = policy(1, OnDrainTimeout::Skip);
    newer.target = Version::new(1, 13, 3);
    assert_eq!(
        sim.record("a").unwrap().progress.unwrap().state,
        ProgressState::Failed
    );
    let r = block_on(drive(
        &sim,
        &engine(newer, &clock),
        &Timeline::always(),
        t0() + D::days(1),
    ))
    .unwrap();
    // The new target is tried (and fails the same way: the sim's driver is broken).
    assert_eq!(r.last.state, RolloutState::Failed);
    assert!(sim
        .log()
        .iter()
        .any(|e| e.kind == EventKind::DriverStart(Version::new(1, 13, 3))));
}
