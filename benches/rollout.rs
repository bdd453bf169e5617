//! Rollout engine benchmarks (harness = false, plain timing so that the
//! figures in BENCHMARKS.md come from one short run):
//! 1. `decide` over 10,000 nodes in mixed states: median of 101 runs, budget 10 ms.
//! 2. A simulated rollout of 1,000 nodes in one long window: simulated
//!    duration / ideal (node_time × ceil(nodes / max_unavailable)), which
//!    must stay within 1% — the engine adds no idle gaps. The rollout must
//!    have completed: state `confirmed`, every node at the target, the budget
//!    used in full and never exceeded, no invariant violation in the sim.
//!
//! The process exits non-zero when a goal is missed or the work did not complete.

use chrono::{DateTime, Utc};
use drover::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use drover::config::{MaxUnavailable, OnDrainTimeout};
use drover::rollout::{
    decide, Action, Engine, Inputs, Labels, Policy, RolloutState, VirtualClock, WindowState,
};
use drover::sim::{drive, Sim, Timeline};
use futures::executor::block_on;
use semver::Version;
use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn start() -> DateTime<Utc> {
    "2026-12-08T02:00:00Z".parse().expect("valid time")
}

fn policy(max: MaxUnavailable) -> Policy {
    Policy {
        target: Version::new(1, 13, 2),
        allow_downgrade: false,
        max_unavailable: max,
        drain_timeout: Duration::from_secs(20 * 60),
        node_timeout: Duration::from_secs(45 * 60),
        on_drain_timeout: OnDrainTimeout::Skip,
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

fn nodes(n: usize) -> Vec<NodeView> {
    (0..n)
        .map(|i| {
            // Mostly idle nodes, some done, a few in flight: the common shape mid-rollout.
            let (version, progress) = match i % 10 {
                0..=3 => (Version::new(1, 13, 2), None),
                9 if i % 100 == 9 => (
                    Version::new(1, 12, 0),
                    Some(NodeProgress {
                        state: ProgressState::Upgrading,
                        target: Version::new(1, 13, 2),
                        started_at: start(),
                        cordoned_by_drover: true,
                        message: String::new(),
                        retries: 0,
                        previous: None,
                    }),
                ),
                _ => (Version::new(1, 12, 0), None),
            };
            NodeView {
                name: format!("node-{i:05}"),
                version: Some(version),
                ready: true,
                unschedulable: progress.is_some(),
                upgrade: if progress.is_some() {
                    UpgradeStatus::Running
                } else {
                    UpgradeStatus::NotStarted
                },
                progress: Ok(progress),
                ..NodeView::default()
            }
        })
        .collect()
}

fn bench_decide() -> bool {
    let nodes = nodes(10_000);
    let p = policy(MaxUnavailable::Percent(2));
    let inputs = Inputs {
        may_start: true,
        hold_reason: String::new(),
        window: WindowState {
            opened_at: Some(start()),
            closes_at: Some(start() + chrono::Duration::hours(6)),
            next_opens_at: None,
            ..WindowState::default()
        },
        patch_window: None,
        ..Default::default()
    };
    let now = start() + chrono::Duration::minutes(10);
    let mut times: Vec<Duration> = (0..101)
        .map(|_| {
            let t = Instant::now();
            black_box(decide(&p, &inputs, black_box(&nodes), now));
            t.elapsed()
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    let d = decide(&p, &inputs, &nodes, now);
    println!(
        "decide/10000 nodes: median {:.3} ms (min {:.3}, max {:.3}); {} actions",
        median.as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        d.actions.len()
    );
    // The work done: with 1% of 10,000 nodes in flight and a 2% budget,
    // the decision must cordon the 100 nodes the budget leaves free.
    let starts = d
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Cordon { .. }))
        .count();
    if starts != 100 {
        println!("decide/10000 nodes: {starts} starts, expected 100");
    }
    starts == 100 && median < Duration::from_millis(10)
}

fn bench_rollout(n: usize, max: u32) -> bool {
    let node_time = Duration::from_secs(15 * 60);
    let clock = VirtualClock::new(start());
    let sim = Sim::uniform(
        "bench",
        clock.clone(),
        n,
        &Version::new(1, 12, 0),
        node_time,
    );
    let engine = Engine::new(policy(MaxUnavailable::Count(max)), Labels::default(), clock);
    let schedule = Timeline {
        windows: vec![(start(), start() + chrono::Duration::days(365))],
        calendar: None,
        gate_from: Some(start()),
        gate_waits: None,
    };
    let t = Instant::now();
    let report = match block_on(drive(
        &sim,
        &engine,
        &schedule,
        start() + chrono::Duration::days(400),
    )) {
        Ok(r) => r,
        Err(e) => {
            println!("rollout/{n} nodes: engine error: {e}");
            return false;
        }
    };
    let wall = t.elapsed();
    let simulated = (report.ended_at - start()).to_std().unwrap_or_default();
    let ideal = node_time * n.div_ceil(max as usize) as u32;
    let ratio = simulated.as_secs_f64() / ideal.as_secs_f64();
    println!(
        "rollout/{n} nodes, max_unavailable {max}, node_time 15m: simulated {}, ideal {}, ratio {ratio:.4}; {:?} {} steps, wall {:.1} ms",
        humantime::format_duration(simulated),
        humantime::format_duration(ideal),
        report.last.state,
        report.steps,
        wall.as_secs_f64() * 1e3
    );
    let target = Version::new(1, 13, 2);
    let at_target = sim
        .nodes()
        .iter()
        .filter(|n| n.version.as_ref() == Some(&target) && n.ready && !n.unschedulable)
        .count();
    let peak = sim.peak_unavailable();
    let violations = sim.violations();
    println!(
        "  completed: state {:?}, {at_target}/{n} nodes Ready and schedulable at {target}, peak unavailable {peak}/{max}, {} violations",
        report.last.state,
        violations.len()
    );
    for v in violations.iter().take(5) {
        println!("  violation: {v}");
    }
    let completed = report.last.state == RolloutState::Confirmed
        && report.last.nodes_at_version as usize == n
        && at_target == n
        && peak == max as usize
        && violations.is_empty();
    if !completed {
        println!("rollout/{n} nodes: the rollout did not complete as it must");
    }
    completed && (ratio - 1.0).abs() <= 0.01
}

fn main() -> ExitCode {
    // `cargo bench` passes --bench; anything else (e.g. `cargo test --benches`) just checks it runs.
    let ok = [
        bench_decide(),
        bench_rollout(1000, 1),
        bench_rollout(1000, 10),
    ];
    if ok.iter().all(|b| *b) {
        ExitCode::SUCCESS
    } else {
        println!("a benchmark missed its target");
        ExitCode::FAILURE
    }
}
