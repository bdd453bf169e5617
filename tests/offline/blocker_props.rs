//! One blocker, the same on every surface, and `--explain`'s next start
//! against what then happens: 200 random fleets of simulated clusters
//! (docs/status.md, "Blockers").
//!
//! Each run draws an environment of one or two waves of one to three
//! clusters, each of one to five nodes, under a calendar of repeating
//! windows with random freezes (`all` or `minor`), sometimes paused, and
//! nodes that wait for their workload's consent (lifted later or never),
//! are cordoned by someone else, have an unreadable version, carry pods
//! whose PodDisruptionBudget refuses evictions for a while, or whose
//! driver fails. Some runs revoke the version or refuse a newer head
//! midway. Each cluster is driven by the engine under the wave gate
//! judged on the reports made so far, and after every step the agent's
//! own telling (`agent::told`) is carried out on each surface the way the
//! agent does it: the `DroverStatus`'s status as JSON (its `blocker`,
//! `blockedNodes` and `Blocked` condition), the metrics' exposition text,
//! the signed report written to TOML and read back, and that report as
//! `drover status -o json` shows it.
//!
//! Properties, on every step of every cluster:
//! - a cluster that is not progressing (`pending`, `paused`, `blocked`,
//!   `failed`, `halted`, `revoked`, `refused`) shows exactly one blocker,
//!   and one that progresses none;
//! - it is the same word on all four surfaces;
//! - every selected node that is neither done, moving nor acted on has
//!   exactly one blocker, and the four surfaces count the same nodes;
//! - when the blocker is one time alone lifts (`window`, `freeze`, a
//!   wave's `soak`), `--explain`'s next start (`fleet::explain::next_start`)
//!   is within a minute of the first node start that then happens, when
//!   nothing else held the cluster in between.
//!
//! A failure prints its seed; `DROVER_BLOCKER_SEED=<seed>` replays it.

use chrono::{DateTime, Duration as D, Utc};
use drover::agent::blocked;
use drover::agent::conditions::{conditions, Facts};
use drover::agent::crd::{DroverStatusStatus, Refused};
use drover::agent::metrics::Metrics;
use drover::agent::told::{self, Applied, Refusal, Situation};
use drover::cluster::Cluster as _;
use drover::config::parse_env;
use drover::fleet::explain::{next_start, Next};
use drover::gate::wave::{self, EnvEvidence, Wave};
use drover::rollout::{Blocker, Clock, Engine, Inputs, Labels, Policy, RolloutState, VirtualClock};
use drover::sim::{EventKind, Failure, Pdb, Pod, Sim, SimNode, Timeline};
use drover::status::{NodeDetail, StatusReport};
use drover::window::{Calendar, Change, Freeze, FreezeScope, WindowSpec};
use futures::executor::block_on;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use semver::Version;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

const RUNS: u64 = 200;
const HORIZON_DAYS: i64 = 4;

fn t0() -> DateTime<Utc> {
    "2026-12-20T00:00:00Z".parse().unwrap()
}

struct Seed(u64);

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "blocker property failed for seed {0}; replay: DROVER_BLOCKER_SEED={0} cargo test --test offline blocker_props",
                self.0
            );
        }
    }
}

struct Cluster {
    name: String,
    wave: usize,
    sim: Sim,
    engine: Engine<VirtualClock>,
    status: DroverStatusStatus,
    /// The cluster's metrics, kept across steps as the agent keeps them.
    metrics: Metrics,
    last: Option<RolloutState>,
    held: Vec<drover::rollout::Held>,
    /// Consent lifted from these nodes at these instants.
    consent_lifts: Vec<(String, DateTime<Utc>)>,
    /// `--explain`'s last prediction of the next start, made at the first.
    predicted: Option<(DateTime<Utc>, DateTime<Utc>, Blocker)>,
}

/// What the runs exercised, to show the properties were met on something.
#[derive(Default, Debug)]
struct Seen {
    blocked_steps: usize,
    by_blocker: BTreeMap<&'static str, usize>,
    predictions_checked: usize,
}

fn calendar(rng: &mut StdRng, paused: bool) -> Calendar {
    let (schedule, hours) = [
        ("0 2 * * *", 4),
        ("0 */6 * * *", 1),
        ("30 22 * * 1-5", 3),
        ("0 9 * * 0,3", 6),
    ][rng.random_range(0..4)];
    let w = WindowSpec {
        schedule: schedule.into(),
        duration: Duration::from_secs(hours * 3600),
        timezone: chrono_tz::UTC,
    };
    let freezes: Vec<Freeze> = (0..rng.random_range(0..=2))
        .map(|_| {
            let start = t0() + D::minutes(rng.random_range(0..HORIZON_DAYS * 24 * 60));
            Freeze {
                start,
                end: start + D::minutes(rng.random_range(30..=36 * 60)),
                timezone: chrono_tz::UTC,
                scope: if rng.random_bool(0.5) {
                    FreezeScope::All
                } else {
                    FreezeScope::Minor
                },
                reason: "change freeze".into(),
            }
        })
        .collect();
    Calendar::new(&[w], &freezes, paused).expect("a valid calendar")
}

fn policy(rng: &mut StdRng) -> Policy {
    let env = parse_env(
        "environments/production.toml",
        "production",
        &format!(
            "version = \"1.13.3\"\n[rollout]\nmax_unavailable = {}\ndrain_timeout = \"{}m\"\nnode_timeout = \"3h\"\n[driver]\nprepare = {}\n",
            rng.random_range(1..=2),
            rng.random_range(20..=90),
            rng.random_bool(0.5)
        ),
    )
    .expect("valid environment");
    Policy::from_env(&env)
}

/// The one word a surface shows, and how many it shows.
fn one(words: Vec<String>) -> Option<String> {
    assert!(words.len() <= 1, "more than one blocker shown: {words:?}");
    words.into_iter().next()
}

fn run(seed: u64, seen: &mut Seen) {
    let _guard = Seed(seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let target = Version::new(1, 13, 3);
    let clock = VirtualClock::new(t0() + D::minutes(rng.random_range(0..24 * 60)));
    let paused = rng.random_bool(0.1);
    let cal = calendar(&mut rng, paused);
    let timeline = Timeline {
        windows: Vec::new(),
        calendar: Some(cal.clone()),
        gate_from: Some(DateTime::<Utc>::MIN_UTC),
        gate_waits: None,
    };
    let n_waves = rng.random_range(1..=2);
    let mut clusters = Vec::new();
    for w in 0..n_waves {
        for i in 0..rng.random_range(1..=3) {
            let name = format!("w{}-{i}", w + 1);
            let sim = Sim::new(&name, clock.clone());
            let mut consent_lifts = Vec::new();
            let patch = rng.random_bool(0.3);
            for n in 0..rng.random_range(1..=5) {
                let node_name = format!("node-{n:02}");
                let from = if patch {
                    Version::new(1, 13, 1)
                } else {
                    Version::new(1, 12, 0)
                };
                let mut node = SimNode::new(
                    node_name.clone(),
                    Some(from),
                    Duration::from_secs(rng.random_range(10..=40) * 60),
                );
                match rng.random_range(0..12) {
                    0 | 1 => {
                        node = node.consent_paused();
                        if rng.random_bool(0.6) {
                            let at = clock.now()
                                + D::minutes(rng.random_range(0..HORIZON_DAYS * 24 * 60));
                            consent_lifts.push((node_name.clone(), at));
                        }
                    }
                    2 => node = node.cordoned_by_other(),
                    3 => node.version = None,
                    4 => node = node.failing(Failure::DriverFails("exit 1".into())),
                    5 => {
                        let pdb = format!("{name}-{node_name}");
                        sim.add_pdb(
                            pdb.clone(),
                            Pdb {
                                min_available: 0,
                                blocked_until: Some(
                                    clock.now() + D::minutes(rng.random_range(0..48 * 60)),
                                ),
                            },
                        );
                        node = node.with_pods(vec![Pod {
                            name: format!("{node_name}-db"),
                            pdb: Some(pdb),
                        }]);
                    }
                    _ => {}
                }
                sim.add_node(node);
            }
            clusters.push(Cluster {
                name,
                wave: w,
                sim,
                engine: Engine::new(policy(&mut rng), Labels::default(), clock.clone()),
                status: DroverStatusStatus::default(),
                metrics: Metrics::new(),
                last: None,
                held: Vec::new(),
                consent_lifts,
                predicted: None,
            });
        }
    }
    let waves: Vec<Wave> = (0..n_waves)
        .map(|w| Wave {
            clusters: (clusters.iter().filter(|c| c.wave == w))
                .map(|c| c.name.clone())
                .collect(),
            soak: Duration::from_secs(60 * [0, 45, 180, 600][rng.random_range(0..4)]),
            max_concurrency: [None, Some(1)][rng.random_range(0..2)],
        })
        .collect();
    let start = clock.now();
    let horizon = t0() + D::days(HORIZON_DAYS + 1);
    let revoked_from = rng
        .random_bool(0.1)
        .then(|| start + D::hours(rng.random_range(1..=72)));
    let refused_from = rng
        .random_bool(0.1)
        .then(|| start + D::hours(rng.random_range(1..=72)));
    let refusal = Refused {
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        stage: ["gate", "gate", "trust"][rng.random_range(0..3)].into(),
        reason: ["soaking", "not_confirmed", "unsigned"][rng.random_range(0..3)].into(),
        message: "the newer head".into(),
    };
    let head = Version::new(1, 13, 4);
    let mut evidence = EnvEvidence::default();
    let mut same_instant = 0;
    loop {
        let now = clock.now();
        let mut again = false;
        let mut next: Vec<DateTime<Utc>> = Vec::new();
        for c in clusters.iter_mut() {
            for (node, at) in &c.consent_lifts {
                if *at <= now {
                    c.sim.set_consent_paused(node, false);
                }
            }
            c.consent_lifts.retain(|(_, at)| *at > now);
            next.extend(c.consent_lifts.iter().map(|(_, at)| *at));
            let gate = wave::judge(&wave::WaveRequest {
                env: "production",
                cluster: &c.name,
                version: &target,
                waves: &waves,
                failure_budget: 0,
                evidence: &evidence,
                now,
            });
            let (halted, waiting) = gate.holds();
            let revoked = revoked_from.filter(|t| *t <= now).map(|_| "kernel panic");
            let mut inputs = Inputs {
                halted,
                waiting,
                wave_blocker: gate.blocker(),
                held: std::mem::take(&mut c.held),
                ..timeline.inputs(now)
            };
            if let Some(why) = revoked {
                // As the agent does (`agent::act`): nothing further starts.
                let held = format!("{target} is revoked: {why}");
                inputs.window.held = Some(held.clone());
                if let Some(p) = inputs.patch_window.as_mut() {
                    p.held = Some(held);
                }
            }
            let observed = block_on(c.sim.observe()).expect("observe");
            let change = Change::of(&target, observed.iter().map(|n| n.version.as_ref()));
            let out = block_on(c.engine.reconcile(&c.sim, &inputs)).expect("reconcile");
            c.held = out.held.clone();
            let d = &out.decision;
            let waiting = blocked::waiting(d, &observed, &target);
            let refused = refused_from.filter(|t| *t <= now).map(|_| Refusal {
                refused: &refusal,
                version: Some(&head),
            });
            let t = told::told(&Situation {
                applied: Some(Applied {
                    version: &target,
                    revoked,
                    state: d.state,
                    nodes: d.nodes,
                    nodes_at_version: d.nodes_at_version,
                    message: &d.message,
                    blocker: d.blocker,
                    waiting: &waiting,
                }),
                refused,
            });
            let what = format!(
                "seed {seed}: {} at {now}: {:?} {:?}: {}",
                c.name, t.state, t.blocker, t.message
            );
            // Exactly the states that do not progress name a blocker.
            let progressing = matches!(
                t.state,
                RolloutState::Rolling | RolloutState::Settling | RolloutState::Confirmed
            );
            assert_eq!(t.blocker.is_some(), !progressing, "{what}");
            let word = t.blocker.map(|b| b.as_str().to_string());
            // The DroverStatus, as the agent writes it and kubectl reads it.
            c.status.refused = refused.map(|r| r.refused.clone());
            c.status.last_applied_commit = Some("abc".into());
            c.status.target = Some(target.to_string());
            t.write_status(&mut c.status, &now.to_rfc3339());
            c.status.conditions =
                conditions(&Facts::of(&c.status), Some(1), &c.status.conditions, "t");
            let crd: Value = serde_json::to_value(&c.status).unwrap();
            let crd_word = crd["blocker"].as_str().map(String::from);
            let cond: Vec<&Value> = crd["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|x| x["type"] == "Blocked")
                .collect();
            assert_eq!(cond.len(), 1, "{what}");
            let cond_word = (cond[0]["status"] == "True")
                .then(|| cond[0]["reason"].as_str().unwrap().to_string());
            // The metrics, as a scrape reads them.
            t.write_metrics(&c.metrics, &c.status, now);
            let text = c.metrics.render();
            let metric_word = one(text
                .lines()
                .filter(|l| l.starts_with("drover_blocker{") && l.ends_with(" 1"))
                .map(|l| l.split('"').nth(1).unwrap().to_string())
                .collect());
            let metric_nodes: u64 = text
                .lines()
                .filter(|l| l.starts_with("drover_blocked_nodes{"))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                .sum();
            // The signed report, through its file, and as `drover status` shows it.
            let report = t.report(StatusReport {
                env: "production".into(),
                cluster: c.name.clone(),
                config_commit: "abc".into(),
                version: target.clone(),
                state: d.state,
                since: now,
                nodes: d.nodes,
                nodes_at_version: d.nodes_at_version,
                message: d.message.clone(),
                detail: NodeDetail::of(&observed, &target),
            });
            let back = StatusReport::from_toml(&report.to_toml()).expect("the report reads back");
            let view = drover::fleet::gather::report_view(&back, git2::Oid::ZERO_SHA1);
            let json: Value = serde_json::to_value(&view).unwrap();
            let status_word = json["blocker"].as_str().map(String::from);
            for (surface, w) in [
                ("DroverStatus .status.blocker", &crd_word),
                ("the Blocked condition's reason", &cond_word),
                ("drover_blocker", &metric_word),
                ("the report's [detail] blocker", &back.detail.blocker),
                ("drover status -o json", &status_word),
            ] {
                assert_eq!(w, &word, "{what}: {surface}");
            }
            // Every node left where it is: one blocker each, counted alike.
            let n = t.blocked_nodes.len() as u64;
            let crd_nodes: u64 = c.status.blocked_nodes.values().map(|v| u64::from(*v)).sum();
            assert_eq!(metric_nodes, n, "{what}: drover_blocked_nodes");
            assert_eq!(crd_nodes, n, "{what}: .status.blockedNodes");
            assert_eq!(
                back.detail.blockers.len() as u64,
                n,
                "{what}: [detail] blockers"
            );
            assert_eq!(
                json["blockers"].as_object().unwrap().len() as u64,
                n,
                "{what}: drover status blockers"
            );
            let stuck = observed
                .iter()
                .filter(|o| {
                    let moving = matches!(&o.progress, Ok(Some(p)) if p.state.runs_driver()
                        || matches!(p.state, drover::cluster::ProgressState::Watching | drover::cluster::ProgressState::Passed));
                    let done = o.ready && o.version.as_ref() == Some(&target);
                    // Recording a consent hold moves nothing.
                    let acted = d.actions.iter().any(|a| {
                        a.node() == o.name
                            && !matches!(a, drover::rollout::Action::Consent { .. })
                    });
                    !moving && !done && !acted
                })
                .count() as u64;
            assert_eq!(stuck, n, "{what}: nodes not progressing");
            if let Some(b) = t.blocker {
                seen.blocked_steps += 1;
                *seen.by_blocker.entry(b.as_str()).or_default() += 1;
            }
            // `--explain`: the next start, held against the first start after it.
            let starts: Vec<DateTime<Utc>> = (c.sim.log().iter())
                .filter(|e| {
                    matches!(
                        e.kind,
                        EventKind::Cordon | EventKind::Adopt | EventKind::DriverStart(_)
                    )
                })
                .map(|e| e.at)
                .collect();
            if let Some((made, at, b)) = c.predicted {
                if let Some(s) = starts.iter().find(|s| **s > made) {
                    assert!(
                        (*s - at).num_seconds().abs() <= 60,
                        "seed {seed}: {}: --explain said at {made} ({b}) the next start is {at}, the first start was at {s}",
                        c.name
                    );
                    seen.predictions_checked += 1;
                    c.predicted = None;
                }
            }
            let timed = matches!(
                t.blocker,
                Some(Blocker::Window | Blocker::Freeze | Blocker::Soak)
            );
            let startable = observed.iter().any(|o| {
                o.version.as_ref().is_some_and(|v| *v < target)
                    && o.ready
                    && !o.unschedulable
                    && !o.consent_paused
                    && o.progress.as_ref().is_ok_and(|p| p.is_none())
            });
            c.predicted = match (
                timed && startable && revoked.is_none() && refused.is_none(),
                t.blocker,
            ) {
                (true, Some(b)) => {
                    let not_before = (b == Blocker::Soak).then(|| gate.changes_at()).flatten();
                    match next_start(Some(b), &cal, change, not_before, now) {
                        Next::At { at } => Some((now, at, b)),
                        _ => None,
                    }
                }
                _ => None,
            };
            if c.last != Some(d.state) && d.state == RolloutState::Confirmed {
                evidence.confirmed.insert(c.name.clone(), now);
            }
            c.last = Some(d.state);
            again |= out.again;
            next.extend(c.sim.next_event(now));
            next.extend(d.wake_at);
            next.extend(gate.changes_at());
        }
        if again && same_instant < 64 {
            same_instant += 1;
            continue;
        }
        same_instant = 0;
        next.extend(revoked_from);
        next.extend(refused_from);
        match next.into_iter().filter(|t| *t > now).min() {
            Some(t) if t <= horizon => clock.set(t),
            _ => break,
        }
    }
}

#[test]
fn every_cluster_not_progressing_shows_one_blocker_alike_everywhere_and_explain_says_when() {
    let seeds: Vec<u64> = match std::env::var("DROVER_BLOCKER_SEED") {
        Ok(s) => vec![s.parse().expect("a seed")],
        Err(_) => (0..RUNS).collect(),
    };
    let mut seen = Seen::default();
    for seed in seeds {
        run(seed, &mut seen);
    }
    eprintln!("blocker_props: {seen:?}");
    if std::env::var("DROVER_BLOCKER_SEED").is_err() {
        // The runs exercised it: most blockers shown, predictions held.
        for b in [
            "window", "freeze", "consent", "foreign", "pdb", "driver", "wave", "revoked", "refused",
        ] {
            assert!(
                seen.by_blocker.contains_key(b),
                "no run showed {b}: {seen:?}"
            );
        }
        assert!(seen.predictions_checked >= 50, "{seen:?}");
    }
}
