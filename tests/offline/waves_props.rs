//! The wave gate and the fleet-wide halt over randomised environments of
//! simulated clusters (docs/design.md §4a): 50 runs, each an environment of
//! one to three clusters in wave 1 and one to three in wave 2, random node
//! counts, node times, `max_unavailable` and window openings, and a
//! version whose pods crash-loop on wave 1's nodes, so whichever cluster
//! upgrades first reports `failed` (its report lands after a random delay
//! of up to a minute). Every cluster is driven by the engine with the
//! inputs the agent gives it: the wave gate judged by `gate::wave::judge`
//! on the reports landed so far. Properties:
//! - wave 2 never starts the version;
//! - at most wave 1's clusters × `max_unavailable` nodes ever run it;
//! - a wave-1 cluster whose window opened after the failure landed starts
//!   no node;
//! - the halt is in every cluster's last report (the failing cluster's own
//!   is `failed`, naming its node).
//!
//! A failure prints its seed; `DROVER_WAVES_SEED=<seed>` replays that run.

use chrono::{DateTime, Duration as D, Utc};
use drover::config::parse_env;
use drover::gate::wave::{self, EnvEvidence, Failure, Wave};
use drover::rollout::{Clock, Engine, Inputs, Labels, Policy, RolloutState, VirtualClock};
use drover::sim::{HealthFault, Sim, SimNode, Timeline};
use futures::executor::block_on;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use semver::Version;
use std::time::Duration;

const RUNS: u64 = 50;

fn t0() -> DateTime<Utc> {
    "2026-12-20T02:00:00Z".parse().unwrap()
}

struct Cluster {
    name: String,
    wave: usize,
    sim: Sim,
    engine: Engine<VirtualClock>,
    timeline: Timeline,
    opens: DateTime<Utc>,
    max_unavailable: usize,
    held: Vec<drover::rollout::Held>,
    last: Option<(RolloutState, String)>,
}

/// Prints the seed when the run it guards panics.
struct Seed(u64);

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "waves property failed for seed {0}; replay: DROVER_WAVES_SEED={0} cargo test --test offline waves_props",
                self.0
            );
        }
    }
}

fn policy(max_unavailable: usize) -> Policy {
    let env = parse_env(
        "environments/production.toml",
        "production",
        &format!(
            "version = \"1.13.3\"\n[rollout]\nmax_unavailable = {max_unavailable}\n\
             [health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n"
        ),
    )
    .expect("valid environment");
    Policy::from_env(&env)
}

fn run(seed: u64) {
    let _guard = Seed(seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let v = Version::new(1, 13, 3);
    let clock = VirtualClock::new(t0());
    let mut clusters = Vec::new();
    let sizes = [rng.random_range(1..=3), rng.random_range(1..=3)];
    for (w, size) in sizes.iter().enumerate() {
        for i in 0..*size {
            let name = format!("w{}-{i}", w + 1);
            let sim = Sim::new(&name, clock.clone());
            for n in 0..rng.random_range(2..=6) {
                let node = SimNode::new(
                    format!("node-{n:04}"),
                    Some(Version::new(1, 12, 0)),
                    Duration::from_secs(rng.random_range(5..=30) * 60),
                );
                // The version is broken: its pods crash-loop wherever it runs.
                sim.add_node(node.with_health_fault(v.clone(), HealthFault::CrashLoop));
            }
            let max_unavailable = rng.random_range(1..=2);
            let opens = t0() + D::minutes(rng.random_range(0..=120));
            clusters.push(Cluster {
                name,
                wave: w,
                engine: Engine::new(policy(max_unavailable), Labels::default(), clock.clone()),
                sim,
                timeline: Timeline {
                    windows: vec![(opens, opens + D::hours(6))],
                    calendar: None,
                    gate_from: Some(DateTime::<Utc>::MIN_UTC),
                    gate_waits: None,
                },
                opens,
                max_unavailable,
                held: Vec::new(),
                last: None,
            });
        }
    }
    let waves: Vec<Wave> = (0..2)
        .map(|w| Wave {
            clusters: clusters
                .iter()
                .filter(|c| c.wave == w)
                .map(|c| c.name.clone())
                .collect(),
            soak: Duration::from_secs(3600),
            max_concurrency: None,
        })
        .collect();
    let delay = D::seconds(rng.random_range(0..=60));
    // Reports as they land: (cluster, landed at, failure).
    let mut landed: Vec<(String, DateTime<Utc>, Failure)> = Vec::new();
    let horizon = t0() + D::hours(12);
    let mut same_instant = 0;
    loop {
        let now = clock.now();
        let mut evidence = EnvEvidence::default();
        for (c, at, f) in &landed {
            if *at <= now {
                evidence.failed.insert(c.clone(), f.clone());
            }
        }
        let mut again = false;
        let mut next: Vec<DateTime<Utc>> = landed.iter().map(|(_, at, _)| *at).collect();
        for c in clusters.iter_mut() {
            let gate = wave::judge(&wave::WaveRequest {
                env: "production",
                cluster: &c.name,
                version: &v,
                waves: &waves,
                failure_budget: 0,
                evidence: &evidence,
                now,
            });
            let (halted, waiting) = gate.holds();
            let inputs = Inputs {
                halted,
                waiting,
                held: std::mem::take(&mut c.held),
                ..c.timeline.inputs(now)
            };
            let out = block_on(c.engine.reconcile(&c.sim, &inputs)).expect("reconcile");
            c.held = out.held.clone();
            let d = &out.decision;
            if d.state == RolloutState::Failed && !landed.iter().any(|(n, _, _)| *n == c.name) {
                landed.push((
                    c.name.clone(),
                    now + delay,
                    Failure {
                        at: now,
                        message: d.message.clone(),
                    },
                ));
            }
            c.last = Some((d.state, d.message.clone()));
            again |= out.again;
            next.extend(c.sim.next_event(now));
            next.extend(d.wake_at);
        }
        if again && same_instant < 64 {
            same_instant += 1;
            continue;
        }
        same_instant = 0;
        match next.into_iter().filter(|t| *t > now).min() {
            Some(t) if t <= horizon => clock.set(t),
            _ => break,
        }
    }

    let first = landed
        .iter()
        .map(|(_, at, _)| *at)
        .min()
        .unwrap_or_else(|| panic!("seed {seed}: no cluster of wave 1 failed"));
    let mut ran = 0;
    for c in &clusters {
        let at_v = c
            .sim
            .nodes()
            .iter()
            .filter(|n| n.version.as_ref() == Some(&v))
            .count();
        let started: usize = c.sim.nodes().iter().map(|n| n.driver_runs()).sum();
        let (state, message) = c.last.clone().expect("decided");
        if c.wave == 1 {
            assert_eq!(started, 0, "seed {seed}: wave 2's {} started {v}", c.name);
            assert_eq!(
                state,
                RolloutState::Halted,
                "seed {seed}: {}: {message}",
                c.name
            );
        } else {
            assert!(
                at_v <= c.max_unavailable,
                "seed {seed}: {} ran {v} on {at_v} nodes",
                c.name
            );
            if c.opens > first {
                assert_eq!(started, 0, "seed {seed}: {} started after the halt", c.name);
            }
            assert!(
                matches!(state, RolloutState::Failed | RolloutState::Halted),
                "seed {seed}: {} ends {state:?}: {message}",
                c.name
            );
        }
        ran += at_v;
        match state {
            RolloutState::Halted => {
                let (failed, _, _) = &landed[0];
                assert!(
                    message.contains(&format!("{failed} at "))
                        && message.to_lowercase().contains("crash"),
                    "seed {seed}: {}'s halt does not name the failure: {message}",
                    c.name
                );
            }
            RolloutState::Failed => {
                assert!(message.starts_with("node node-"), "seed {seed}: {message}")
            }
            _ => {}
        }
    }
    let bound: usize = clusters
        .iter()
        .filter(|c| c.wave == 0)
        .map(|c| c.max_unavailable)
        .sum();
    assert!(
        ran <= bound,
        "seed {seed}: {ran} nodes ran {v}, bound {bound}"
    );
}

#[test]
fn a_failure_in_wave_one_halts_the_environment_and_wave_two_never_starts() {
    if let Ok(s) = std::env::var("DROVER_WAVES_SEED") {
        run(s.parse().expect("DROVER_WAVES_SEED: a number"));
        return;
    }
    let base: u64 = rand::random();
    for i in 0..RUNS {
        run(base.wrapping_add(i));
    }
}
