//! The rollback circuit breaker (`[rollout] max_rollbacks`), counted from
//! what happened: every rollback run the simulated cluster saw start
//! (`EventKind::RollbackStart`), failed ones and a person's retries
//! included, never more than `max_rollbacks` for the version. Random
//! clusters whose nodes crash-loop at the new version, with rollbacks that
//! fail (their driver cannot be started until `node_timeout` passes) and
//! retries a person asks for at random moments. And the budget, counted
//! from the simulated cluster (nodes cordoned by drover or in a run at
//! once): a node its failed rollback leaves cordoned counts against
//! `max_unavailable`, also while a new pin, bumped at a random minute,
//! rolls out past it.
//!
//! 96 cases, about 5 s in debug.

use chrono::{DateTime, Duration as D, Utc};
use drover::cluster::Cluster;
use drover::config::{HealthSpec, MaxUnavailable, OnDrainTimeout, OnFailure};
use drover::rollout::{Clock, Engine, Labels, Policy, VirtualClock};
use drover::sim::{CallFault, EventKind, HealthFault, Sim, SimNode, Timeline};
use futures::executor::block_on;
use proptest::prelude::*;
use semver::Version;
use std::time::Duration;

fn start() -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse().unwrap()
}

fn target() -> Version {
    Version::new(1, 13, 0)
}

#[derive(Debug, Clone)]
struct Case {
    /// Per node: it crash-loops at the target, and its driver's minutes.
    bad: Vec<(bool, u16)>,
    max_unavailable: u32,
    max_rollbacks: u32,
    /// Minutes a returned node is watched.
    watch_min: u16,
    /// (node, from minute, for minutes): its driver cannot be started.
    start_faults: Vec<(usize, u16, u16)>,
    /// (minute, node): a person asks drover to retry the node.
    retries: Vec<(u16, usize)>,
    /// The minute a new pin (healthy on every node) replaces the target:
    /// nodes left cordoned by a failed rollback from the old one still
    /// count against `max_unavailable` while the new one rolls out.
    bump: Option<u16>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((prop::bool::weighted(0.6), 5u16..120), 2..8),
        1u32..4,
        1u32..3,
        10u16..60,
        prop::collection::vec((0usize..8, 0u16..300, 60u16..400), 0..6),
        prop::collection::vec((0u16..900, 0usize..8), 0..6),
        prop::option::of(0u16..900),
    )
        .prop_map(
            |(bad, max_unavailable, max_rollbacks, watch_min, start_faults, retries, bump)| Case {
                bad,
                max_unavailable,
                max_rollbacks,
                watch_min,
                start_faults,
                retries,
                bump,
            },
        )
}

fn policy(c: &Case) -> Policy {
    Policy {
        target: target(),
        allow_downgrade: false,
        max_unavailable: MaxUnavailable::Count(c.max_unavailable),
        drain_timeout: Duration::from_secs(20 * 60),
        node_timeout: Duration::from_secs(150 * 60),
        on_drain_timeout: OnDrainTimeout::Skip,
        health: Some(HealthSpec {
            enabled: true,
            settle: Duration::from_secs(10 * 60),
            pod_ready_timeout: Duration::from_secs(u64::from(c.watch_min) * 60),
            ..HealthSpec::default()
        }),
        on_failure: OnFailure::Rollback,
        max_rollbacks: c.max_rollbacks,
        prepare: false,
        prestage: Duration::ZERO,
        revoked: Vec::new(),
        drain: Vec::new(),
        consent_limit: None,
    }
}

fn build(c: &Case, clock: &VirtualClock) -> Sim {
    let sim = Sim::new("breaker", clock.clone());
    for (i, (bad, minutes)) in c.bad.iter().enumerate() {
        let mut node = SimNode::new(
            format!("n{i}"),
            Some(Version::new(1, 12, 0)),
            Duration::from_secs(u64::from(*minutes) * 60),
        );
        if *bad {
            node = node.with_health_fault(target(), HealthFault::CrashLoop);
        }
        sim.add_node(node);
    }
    for (i, from, len) in &c.start_faults {
        let from = start() + D::minutes(i64::from(*from));
        let node = format!("n{}", i % c.bad.len());
        sim.inject(
            &node,
            CallFault::Start,
            from,
            from + D::minutes(i64::from(*len)),
        );
    }
    sim
}

/// Drive the rollout for a day of virtual time, the retries asked at their
/// minutes.
fn run(c: &Case, sim: &Sim, clock: &VirtualClock) {
    let mut engine = Engine::new(policy(c), Labels::default(), clock.clone());
    let bump = c.bump.map(|m| start() + D::minutes(i64::from(m)));
    let sched = Timeline::always();
    let horizon = start() + D::days(1);
    let mut retries: Vec<(DateTime<Utc>, String)> = c
        .retries
        .iter()
        .map(|(m, i)| {
            (
                start() + D::minutes(i64::from(*m)),
                format!("n{}", i % c.bad.len()),
            )
        })
        .collect();
    retries.sort();
    let mut held = Vec::new();
    let mut same_instant = 0;
    for _ in 0..20_000 {
        let now = clock.now();
        if bump.is_some_and(|b| b <= now) {
            engine.policy.target = Version::new(1, 14, 0);
        }
        while retries.first().is_some_and(|(t, _)| *t <= now) {
            let (_, node) = retries.remove(0);
            sim.request_retry(&node);
        }
        let inputs = drover::rollout::Inputs {
            held: std::mem::take(&mut held),
            ..sched.inputs(now)
        };
        let out = block_on(engine.reconcile(sim, &inputs)).unwrap();
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
            retries.first().map(|(t, _)| *t),
            bump,
            // Health is polled while a node is watched.
            out.decision.poll_health.then(|| now + D::seconds(30)),
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
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn rollbacks_started_never_exceed_max_rollbacks(c in case()) {
        let clock = VirtualClock::new(start());
        let sim = build(&c, &clock);
        run(&c, &sim, &clock);
        let started: Vec<String> = sim
            .log()
            .into_iter()
            .filter(|e| matches!(e.kind, EventKind::RollbackStart(_)))
            .map(|e| format!("{} at {}", e.node, e.at))
            .collect();
        prop_assert!(
            started.len() <= c.max_rollbacks as usize,
            "{} rollbacks started under max_rollbacks = {}: {:?}",
            started.len(),
            c.max_rollbacks,
            started
        );
        prop_assert_eq!(sim.violations(), Vec::<String>::new());
        // Counted from the simulated cluster: the nodes drover had cordoned
        // or in a run at once, a node left cordoned by its failed rollback
        // included.
        prop_assert!(
            sim.peak_unavailable() <= c.max_unavailable as usize,
            "{} nodes out of service at once under max_unavailable = {}",
            sim.peak_unavailable(),
            c.max_unavailable
        );
        let _ = block_on(sim.observe());
        if std::env::var("BREAKER_DEBUG").is_ok() {
            eprintln!("{:?}\n{:#?}", c, sim.log().iter().filter(|e| !matches!(e.kind, EventKind::Evicted(_))).collect::<Vec<_>>());
        }
    }
}
