//! The pin changes while a node is in flight (docs/design.md, "The node
//! record"): every call drover makes is counted by the simulated cluster
//! (`Sim::calls`), so an action sent again while its effect is pending, a
//! second run of one attempt, or an uncordon while a run may still act on
//! the node shows as what happened, not as what the engine believes.

use chrono::{DateTime, Duration as D, Utc};
use drover::config::{MaxUnavailable, OnDrainTimeout};
use drover::rollout::{Engine, Labels, Policy, VirtualClock};
use drover::sim::{drive, Pdb, Pod, Sim, SimNode, Timeline};
use futures::executor::block_on;
use semver::Version;
use std::time::Duration;

fn t0() -> DateTime<Utc> {
    "2026-12-08T02:00:00Z".parse().unwrap()
}

fn mins(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

fn v(s: &str) -> Version {
    s.parse().unwrap()
}

fn policy(target: &str) -> Policy {
    Policy {
        target: v(target),
        allow_downgrade: false,
        max_unavailable: MaxUnavailable::Count(1),
        drain_timeout: mins(20),
        node_timeout: mins(45),
        on_drain_timeout: OnDrainTimeout::Skip,
        health: None,
        on_failure: drover::config::OnFailure::Halt,
        max_rollbacks: 1,
        prepare: false,
        prestage: Duration::ZERO,
        revoked: Vec::new(),
    }
}

fn engine(target: &str, clock: &VirtualClock) -> Engine<VirtualClock> {
    Engine::new(policy(target), Labels::default(), clock.clone())
}

/// One node at 1.12.0 whose pod a budget keeps until `relents`.
fn held_node(clock: &VirtualClock, relents: DateTime<Utc>) -> Sim {
    let sim = Sim::new("pin", clock.clone());
    sim.add_pdb(
        "web",
        Pdb {
            min_available: 0,
            blocked_until: Some(relents),
        },
    );
    sim.add_node(
        SimNode::new("n0", Some(v("1.12.0")), mins(15)).with_pods(vec![Pod {
            name: "web-0".into(),
            pdb: Some("web".into()),
        }]),
    );
    sim
}

#[test]
fn a_pin_change_mid_drain_sends_the_nodes_start_once() {
    let clock = VirtualClock::new(t0());
    let sim = held_node(&clock, t0() + D::minutes(10));
    // Draining toward 1.13.1, held by the budget.
    block_on(drive(
        &sim,
        &engine("1.13.1", &clock),
        &Timeline::always(),
        t0() + D::minutes(5),
    ))
    .unwrap();
    assert_eq!(sim.calls("cordon", "n0"), 1);
    // A signed commit pins 1.13.2 while the drain goes on.
    let r = block_on(drive(
        &sim,
        &engine("1.13.2", &clock),
        &Timeline::always(),
        t0() + D::hours(3),
    ))
    .unwrap();
    let n = sim.nodes().into_iter().find(|n| n.name == "n0").unwrap();
    let starts = sim.calls("start_run", "n0");
    println!(
        "starts sent: {starts}, driver runs: {}, steps: {}, ended {:?} at {}",
        n.driver_runs(),
        r.steps,
        r.last.state,
        r.ended_at
    );
    assert_eq!(n.driver_runs(), 1, "one run");
    assert_eq!(
        starts, 1,
        "the start is sent once, not again while it is pending"
    );
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert_eq!(n.version, Some(v("1.13.2")), "finished on the new pin");
    assert!(!n.unschedulable);
}
