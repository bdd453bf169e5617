//! The pin changes while a node is in flight (docs/design.md, "The node
//! record"): every call drover makes is counted by the simulated cluster
//! (`Sim::calls`), so an action sent again while its effect is pending, a
//! second run of one attempt, or an uncordon while a run may still act on
//! the node shows as what happened, not as what the engine believes.

use chrono::{DateTime, Duration as D, Utc};
use drover::config::{MaxUnavailable, OnDrainTimeout};
use drover::rollout::Clock;
use drover::rollout::{Engine, Labels, Policy, VirtualClock};
use drover::sim::{drive, EventKind, Pdb, Pod, Sim, SimNode, Timeline};
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
        drain: Vec::new(),
        consent_limit: None,
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

/// A random cluster whose pin changes mid-rollout (`revoke`: the first pin
/// is revoked with nothing newer admitted for a while first).
#[derive(Debug, Clone)]
struct Case {
    /// Per node: its reboot minutes and pods (each under budget `pdb`).
    nodes: Vec<(u16, u8)>,
    max_unavailable: u32,
    prepare: bool,
    /// Minutes after the start at which 1.13.2 is pinned.
    change_min: u16,
    /// 1.13.1 is revoked this many minutes before the new pin (0: a bump).
    revoke_for: u16,
    /// The budget refuses every eviction until this minute.
    pdb_until: u16,
}

fn case() -> impl proptest::strategy::Strategy<Value = Case> {
    use proptest::prelude::*;
    (
        prop::collection::vec((5u16..40, 0u8..3), 1..8),
        1u32..4,
        any::<bool>(),
        0u16..90,
        prop_oneof![Just(0u16), 1u16..30],
        0u16..40,
    )
        .prop_map(
            |(nodes, max_unavailable, prepare, change_min, revoke_for, pdb_until)| Case {
                nodes,
                max_unavailable,
                prepare,
                change_min,
                revoke_for,
                pdb_until,
            },
        )
}

/// Drive `c` for a day: 1.13.1 pinned, then (revoked first, with
/// `revoke_for`) 1.13.2; returns the sim.
fn run_case(c: &Case) -> Sim {
    let clock = VirtualClock::new(t0());
    let sim = Sim::new("pin", clock.clone());
    sim.add_pdb(
        "web",
        Pdb {
            min_available: 0,
            blocked_until: Some(t0() + D::minutes(i64::from(c.pdb_until))),
        },
    );
    for (i, (reboot, pods)) in c.nodes.iter().enumerate() {
        sim.add_node(
            SimNode::new(format!("n{i}"), Some(v("1.12.0")), mins(u64::from(*reboot))).with_pods(
                (0..*pods)
                    .map(|j| Pod {
                        name: format!("p{i}-{j}"),
                        pdb: Some("web".into()),
                    })
                    .collect(),
            ),
        );
    }
    let change = t0() + D::minutes(i64::from(c.change_min));
    let revoke = change - D::minutes(i64::from(c.revoke_for));
    let policy_at = |now: DateTime<Utc>| {
        // Room for every drain and reboot: what is checked is the pin.
        let mut p = Policy {
            max_unavailable: MaxUnavailable::Count(c.max_unavailable),
            prepare: c.prepare,
            drain_timeout: mins(60),
            node_timeout: mins(180),
            ..policy("1.13.1")
        };
        if now >= change {
            p.target = v("1.13.2");
        }
        if c.revoke_for > 0 && now >= revoke {
            p.revoked = vec![v("1.13.1")];
        }
        p
    };
    let horizon = t0() + D::days(1);
    let mut held = Vec::new();
    let mut same_instant = 0;
    for _ in 0..20_000 {
        let now = clock.now();
        let p = policy_at(now);
        let mut inputs = drover::rollout::Inputs {
            held: std::mem::take(&mut held),
            ..Timeline::always().inputs(now)
        };
        if p.is_revoked(&p.target) {
            // As the agent gives it: a revoked pin holds every start.
            inputs.window.held = Some(format!("{} is revoked", p.target));
        }
        let engine = Engine::new(p, Labels::default(), clock.clone());
        let out = block_on(engine.reconcile(&sim, &inputs)).unwrap();
        held = out.held.clone();
        if out.again && same_instant < 200 {
            same_instant += 1;
            continue;
        }
        assert!(same_instant < 200, "engine loops at one instant");
        same_instant = 0;
        let next = [
            sim.next_event(now),
            out.decision.wake_at,
            Some(change),
            Some(revoke),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now && *t <= horizon)
        .min();
        match next {
            Some(t) => clock.set(t),
            None => break,
        }
    }
    sim
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, ..Default::default() })]

    #[test]
    fn a_pin_changing_mid_rollout_keeps_every_run_seen_once_and_the_budget(c in case()) {
        let sim = run_case(&c);
        // The sim's own invariants: no uncordon while a run may act on the
        // node, no second run of an attempt, no driver on a node with pods.
        proptest::prop_assert_eq!(sim.violations(), Vec::<String>::new());
        proptest::prop_assert!(
            sim.peak_unavailable() <= c.max_unavailable as usize,
            "peak {} > {}", sim.peak_unavailable(), c.max_unavailable
        );
        for n in sim.nodes() {
            // Each start sent once: as many calls as runs made.
            proptest::prop_assert_eq!(
                sim.calls("start_run", &n.name),
                n.runs().len(),
                "{}: {:?}", n.name, n.runs()
            );
            // Every run seen to its end: none left running, the node back
            // in service, at the new pin, its record idle.
            proptest::prop_assert!(!n.unschedulable, "{} left cordoned", n.name);
            proptest::prop_assert_eq!(n.version.clone(), Some(v("1.13.2")), "{}", n.name);
            let r = sim.record(&n.name).expect("a record");
            proptest::prop_assert!(r.progress.is_none(), "{}: {:?}", n.name, r.progress);
        }
        // Nothing started toward the revoked pin after its revocation.
        let revoked_at = t0() + D::minutes(i64::from(c.change_min) - i64::from(c.revoke_for));
        if c.revoke_for > 0 {
            for e in sim.log() {
                if let EventKind::DriverStart(to) = &e.kind {
                    proptest::prop_assert!(
                        !(e.at >= revoked_at && *to == v("1.13.1")),
                        "{} started toward the revoked 1.13.1 at {}", e.node, e.at
                    );
                }
            }
        }
    }
}
