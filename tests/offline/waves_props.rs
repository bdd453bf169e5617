//! The wave gate and the fleet-wide halt over randomised environments of
//! simulated clusters (docs/design.md §4a): 50 runs, each an environment of
//! two or three waves of one to three clusters, random node counts, node
//! times, `max_unavailable`, window openings, soaks, `max_concurrency` and
//! `failure_budget`. On some clusters the version crash-loops on one node,
//! so that cluster reports `failed`; the others confirm it. A person
//! retries some of the failed clusters later (the fault fixed,
//! `drover.dev/retry` on the node's record), which then report the version again,
//! `rolling`, then `confirmed`.
//!
//! Every cluster is driven by the engine with the inputs the agent gives
//! it: the wave gate judged by `gate::wave::judge` on the reports landed so
//! far (each report lands a random 1 to 120 s after its cluster made it),
//! and a wake when the gate says its answer changes. The properties are
//! checked on what happened, not on the gate's answer: each node start is
//! read from its simulated cluster's own log (a cordon), and held against
//! [`holds`], the rules of §4a written out again from the reports that had
//! landed by then, sharing no code with the gate:
//! - a cluster of wave N > 1 starts a node only once every cluster of wave
//!   N − 1 has a standing confirmation (counted from the first `confirmed`
//!   after its last `failed`) and the newest of them is at least wave
//!   N − 1's soak old;
//! - no cluster starts a node while more than `failure_budget` other
//!   clusters have a standing `failed` report (their newest report of the
//!   version), which only that cluster's own later report ends;
//! - within a wave, a cluster starts a node only while fewer than
//!   `max_concurrency` clusters listed before it have not confirmed.
//!
//! And the gate holds no more than the rules: a retry the rules let go
//! resumes its cluster on the pass that reads it, and a cluster that ends
//! without confirming (other than one failed on a node nobody retried) was
//! held by the rules at some time in the last hours of its window.
//!
//! The runs must exercise it all: later waves start, environments halt,
//! halts end by a retried cluster's own report with starts after, and
//! retries resume. Each rule of `gate::wave::judge` broken on purpose fails
//! this test (TESTING.md lists the mutations and what it printed).
//!
//! A failure prints its seed; `DROVER_WAVES_SEED=<seed>` replays that run.

use chrono::{DateTime, Duration as D, Utc};
use drover::config::parse_env;
use drover::gate::wave::{self, EnvEvidence, Failure, Wave};
use drover::rollout::{Clock, Engine, Inputs, Labels, Policy, RolloutState, VirtualClock};
use drover::sim::{EventKind, HealthFault, Sim, SimNode, Timeline};
use futures::executor::block_on;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use semver::Version;
use std::time::Duration;

const RUNS: u64 = 50;
/// How long each cluster's window stays open.
const WINDOW_HOURS: i64 = 30;
/// How long the rules must have let a cluster go, up to its window's
/// end, for it to be bound to have confirmed: ample for four nodes.
const FREE_HOURS: i64 = 6;

fn t0() -> DateTime<Utc> {
    "2026-12-20T02:00:00Z".parse().unwrap()
}

struct Cluster {
    name: String,
    wave: usize,
    sim: Sim,
    engine: Engine<VirtualClock>,
    timeline: Timeline,
    held: Vec<drover::rollout::Held>,
    last: Option<RolloutState>,
    /// The node the version crash-loops on, if it does on this cluster.
    broken: Option<String>,
    /// When a person fixes the fault and asks for a retry, once it failed.
    retry_after: Option<D>,
    retry_at: Option<DateTime<Utc>>,
    /// When the person did.
    retried_at: Option<DateTime<Utc>>,
    /// When its window closes.
    window_ends: DateTime<Utc>,
}

/// A status report as it was made and as it landed in the store.
#[derive(Debug, Clone)]
struct Report {
    cluster: String,
    state: RolloutState,
    message: String,
    made: DateTime<Utc>,
    landed: DateTime<Utc>,
}

/// What the store said of one cluster at one instant, from the reports
/// landed by then, in the order they were made.
struct Standing {
    /// Since when its confirmation counts: the first `confirmed` after its
    /// last `failed`, while no `failed` is newer.
    confirmed: Option<DateTime<Utc>>,
    /// Its newest report, when that is `failed`.
    failed: Option<Report>,
    /// Its newest report: when made, and whether it says `failed`.
    latest: Option<(DateTime<Utc>, bool)>,
}

fn standing(reports: &[Report], cluster: &str, at: DateTime<Utc>) -> Standing {
    let mine: Vec<&Report> = reports
        .iter()
        .filter(|r| r.cluster == cluster && r.landed <= at)
        .collect();
    let last_failed = mine.iter().rposition(|r| r.state == RolloutState::Failed);
    let confirmed = mine[last_failed.map_or(0, |i| i + 1)..]
        .iter()
        .find(|r| r.state == RolloutState::Confirmed)
        .map(|r| r.made);
    let newest = mine.last();
    Standing {
        confirmed,
        failed: newest
            .filter(|r| r.state == RolloutState::Failed)
            .map(|r| (*r).clone()),
        latest: newest.map(|r| (r.made, r.state == RolloutState::Failed)),
    }
}

/// Why the rules of docs/design.md §4a hold `cluster` at `at`, judged
/// from the reports landed by then; `None` when it may start a node.
fn holds(
    reports: &[Report],
    waves: &[Wave],
    failure_budget: u32,
    cluster: &str,
    at: DateTime<Utc>,
) -> Option<String> {
    let failed: Vec<String> = waves
        .iter()
        .flat_map(|w| &w.clusters)
        .filter(|o| *o != cluster && standing(reports, o, at).failed.is_some())
        .cloned()
        .collect();
    if failed.len() > failure_budget as usize {
        return Some(format!(
            "when {failed:?} had standing failures, over failure_budget = {failure_budget}"
        ));
    }
    let i = waves
        .iter()
        .position(|w| w.clusters.iter().any(|c| c == cluster))
        .expect("every cluster is in a wave");
    if i > 0 {
        let prev = &waves[i - 1];
        let mut newest = DateTime::<Utc>::MIN_UTC;
        for p in &prev.clusters {
            let Some(since) = standing(reports, p, at).confirmed else {
                return Some(format!(
                    "when {p} of the wave before had no standing confirmation"
                ));
            };
            newest = newest.max(since);
        }
        let soak = D::from_std(prev.soak).expect("a small soak");
        if at < newest + soak {
            return Some(format!(
                "when the wave before's newest confirmation (at {newest}) had soaked {} of {} min",
                (at - newest).num_minutes(),
                soak.num_minutes()
            ));
        }
    }
    if let Some(max) = waves[i].max_concurrency {
        let ahead: Vec<&String> = waves[i]
            .clusters
            .iter()
            .take_while(|c| *c != cluster)
            .filter(|c| standing(reports, c, at).confirmed.is_none())
            .collect();
        if ahead.len() >= max as usize {
            return Some(format!(
                "when {ahead:?}, listed before it in its wave, had not confirmed, max_concurrency = {max}"
            ));
        }
    }
    None
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

/// What a run did that the properties are about, to show they were met.
#[derive(Default)]
struct Seen {
    /// Node starts by clusters of a wave after the first.
    later_waves_started: usize,
    /// Failures that, landing, put the environment over its failure budget.
    halted: usize,
    /// Starts made after another cluster's failure had landed and been
    /// ended by that cluster's own later report.
    started_after_a_failure_ended: usize,
    /// Retries made when nothing held their cluster.
    retries_resumed: usize,
}

fn run(seed: u64) -> Seen {
    let _guard = Seed(seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let v = Version::new(1, 13, 3);
    let clock = VirtualClock::new(t0());
    let mut clusters = Vec::new();
    let n_waves = rng.random_range(2..=3);
    for w in 0..n_waves {
        for i in 0..rng.random_range(1..=3) {
            let name = format!("w{}-{i}", w + 1);
            let sim = Sim::new(&name, clock.clone());
            let nodes = rng.random_range(1..=4);
            let broken = rng
                .random_bool(0.3)
                .then(|| format!("node-{:04}", rng.random_range(0..nodes)));
            for n in 0..nodes {
                let node_name = format!("node-{n:04}");
                let mut node = SimNode::new(
                    node_name.clone(),
                    Some(Version::new(1, 12, 0)),
                    Duration::from_secs(rng.random_range(5..=30) * 60),
                );
                if broken.as_deref() == Some(node_name.as_str()) {
                    node = node.with_health_fault(v.clone(), HealthFault::CrashLoop);
                }
                sim.add_node(node);
            }
            let max_unavailable = rng.random_range(1..=2);
            let opens = t0() + D::minutes(rng.random_range(0..=60));
            clusters.push(Cluster {
                name,
                wave: w,
                engine: Engine::new(policy(max_unavailable), Labels::default(), clock.clone()),
                sim,
                timeline: Timeline {
                    windows: vec![(opens, opens + D::hours(WINDOW_HOURS))],
                    calendar: None,
                    gate_from: Some(DateTime::<Utc>::MIN_UTC),
                    gate_waits: None,
                },
                held: Vec::new(),
                last: None,
                retry_after: (broken.is_some() && rng.random_bool(0.6))
                    .then(|| D::minutes(rng.random_range(10..=180))),
                broken,
                retry_at: None,
                retried_at: None,
                window_ends: opens + D::hours(WINDOW_HOURS),
            });
        }
    }
    let waves: Vec<Wave> = (0..n_waves)
        .map(|w| Wave {
            clusters: clusters
                .iter()
                .filter(|c| c.wave == w)
                .map(|c| c.name.clone())
                .collect(),
            soak: Duration::from_secs(60 * [0, 30, 60, 120][rng.random_range(0..4)]),
            max_concurrency: [None, Some(1), Some(2)][rng.random_range(0..3)],
        })
        .collect();
    let failure_budget: u32 = rng.random_range(0..=1);
    let mut reports: Vec<Report> = Vec::new();
    let horizon = t0() + D::hours(32);
    let mut same_instant = 0;
    let mut seen = Seen::default();
    loop {
        let now = clock.now();
        let mut evidence = EnvEvidence::default();
        for c in &clusters {
            let s = standing(&reports, &c.name, now);
            if let Some(t) = s.confirmed {
                evidence.confirmed.insert(c.name.clone(), t);
            }
            if let Some(r) = s.failed {
                evidence.failed.insert(
                    c.name.clone(),
                    Failure {
                        at: r.made,
                        message: r.message,
                    },
                );
            }
            if let Some(l) = s.latest {
                evidence.latest.insert(c.name.clone(), l);
            }
        }
        let mut again = false;
        let mut next: Vec<DateTime<Utc>> = reports.iter().map(|r| r.landed).collect();
        for c in clusters.iter_mut() {
            // A person fixes the fault and asks for a retry.
            if let (Some(at), Some(node)) = (c.retry_at, &c.broken) {
                if at <= now {
                    c.sim
                        .set_health_fault(node, Version::new(9, 9, 9), HealthFault::CrashLoop);
                    c.sim.request_retry(node);
                    c.retry_at = None;
                    c.retried_at = Some(now);
                    c.retry_after = None;
                }
            }
            let gate = wave::judge(&wave::WaveRequest {
                env: "production",
                cluster: &c.name,
                version: &v,
                waves: &waves,
                failure_budget,
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
            if c.last != Some(d.state) {
                reports.push(Report {
                    cluster: c.name.clone(),
                    state: d.state,
                    message: d.message.clone(),
                    made: now,
                    // A push takes time: a report made at `now` lands after
                    // it, never in the instant whose evidence the clusters
                    // after it in this loop have already been judged on
                    // (seed 15773190332102409528 started a node at the
                    // instant another cluster's failure was made and landed).
                    landed: now + D::seconds(rng.random_range(1..=120)),
                });
                if d.state == RolloutState::Failed && c.retry_at.is_none() {
                    c.retry_at = c.retry_after.map(|after| now + after);
                }
            }
            c.last = Some(d.state);
            again |= out.again;
            next.extend(c.sim.next_event(now));
            next.extend(d.wake_at);
            // As the agent does: the gate's answer changes when a soak passes.
            next.extend(gate.changes_at());
            next.extend(c.retry_at);
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

    // Every node start, from each simulated cluster's own log.
    for c in &clusters {
        let log = c.sim.log();
        for e in &log {
            if !matches!(e.kind, EventKind::Cordon | EventKind::Adopt) {
                continue;
            }
            let s = e.at;
            let what = format!(
                "seed {seed}: {} (wave {}) started {} at {s}",
                c.name,
                c.wave + 1,
                e.node
            );
            if c.wave > 0 {
                seen.later_waves_started += 1;
            }
            if let Some(why) = holds(&reports, &waves, failure_budget, &c.name, s) {
                panic!("{what}, {why}; reports: {reports:#?}");
            }
            // A failure of another cluster that had landed and was ended by
            // that cluster's own later report before this start.
            let ended = reports.iter().any(|r| {
                r.cluster != c.name
                    && r.state == RolloutState::Failed
                    && r.landed <= s
                    && standing(&reports, &r.cluster, s).failed.is_none()
            });
            seen.started_after_a_failure_ended += usize::from(ended);
        }
        // A retry the rules let go resumes the cluster on the pass that
        // reads it: its next report, made then, says it rolls again.
        if let (Some(node), Some(at)) = (&c.broken, c.retried_at) {
            if holds(&reports, &waves, failure_budget, &c.name, at).is_none() {
                let next = reports.iter().find(|r| r.cluster == c.name && r.made >= at);
                assert!(
                    next.is_some_and(|r| r.made == at
                        && matches!(
                            r.state,
                            RolloutState::Rolling | RolloutState::Settling | RolloutState::Confirmed
                        )),
                    "seed {seed}: {} was retried on {node} at {at}, when nothing held it, but its next report is {next:?}",
                    c.name
                );
                seen.retries_resumed += 1;
            }
        }
        // Nor may it hold a cluster the rules let go: one that ends without
        // confirming (and is not left failed on a node nobody retried) must
        // have been held by the rules at some time in its window's last hours.
        let from = c.window_ends - D::hours(FREE_HOURS);
        let stuck_on_its_own = c.broken.is_some() && c.retried_at.is_none_or(|t| t > from);
        if c.last != Some(RolloutState::Confirmed) && !stuck_on_its_own {
            let held = std::iter::once(from)
                .chain(
                    reports
                        .iter()
                        .map(|r| r.landed)
                        .filter(|t| *t > from && *t < c.window_ends),
                )
                .any(|at| holds(&reports, &waves, failure_budget, &c.name, at).is_some());
            assert!(
                held,
                "seed {seed}: {} (wave {}) ends {:?}, though nothing held it from {from} to its window's end; reports: {reports:#?}",
                c.name,
                c.wave + 1,
                c.last
            );
        }
        assert!(
            c.sim.violations().is_empty(),
            "seed {seed}: {:?}",
            c.sim.violations()
        );
    }
    // Each failure that, when it landed, made more standing failures than the budget.
    for r in reports.iter().filter(|r| r.state == RolloutState::Failed) {
        let standing_failures = clusters
            .iter()
            .filter(|o| standing(&reports, &o.name, r.landed).failed.is_some())
            .count();
        seen.halted += usize::from(standing_failures > failure_budget as usize);
    }
    seen
}

#[test]
fn no_wave_starts_before_the_one_before_confirmed_and_soaked_nor_while_a_failure_halts() {
    if let Ok(s) = std::env::var("DROVER_WAVES_SEED") {
        run(s.parse().expect("DROVER_WAVES_SEED: a number"));
        return;
    }
    let base: u64 = rand::random();
    let mut seen = Seen::default();
    for i in 0..RUNS {
        let s = run(base.wrapping_add(i));
        seen.later_waves_started += s.later_waves_started;
        seen.halted += s.halted;
        seen.started_after_a_failure_ended += s.started_after_a_failure_ended;
        seen.retries_resumed += s.retries_resumed;
    }
    // The properties must have had something to hold on.
    assert!(
        seen.later_waves_started > 0
            && seen.halted > 0
            && seen.started_after_a_failure_ended > 0
            && seen.retries_resumed > 0,
        "base seed {base}: {} starts in later waves, {} failures over the budget, \
         {} starts after a failure ended, {} retries resumed",
        seen.later_waves_started,
        seen.halted,
        seen.started_after_a_failure_ended,
        seen.retries_resumed
    );
}
