//! The status store at fleet size: simulated agents, each with its own
//! `Source` (its own git cache), push a signed report every interval to its
//! own status branch (`drover/status.d/<env>/<cluster>`) of one repository
//! served by `git daemon` on loopback, through the same `status::publish`
//! the agent uses. Then `drover status` and the gate's reader read the fleet
//! from a clone holding all those reports, verifying every signature.
//!
//! Run: `cargo bench --bench status_store` (1,000 agents, a report per agent
//! every 60 s for 10 rounds). `DROVER_BENCH_AGENTS`, `DROVER_BENCH_INTERVAL`
//! (seconds) and `DROVER_BENCH_ROUNDS` scale it down; `DROVER_BENCH_AGENTS=0`
//! runs only the first part: status commits for one 200-node rollout in the
//! simulator, a push per change against `status::cadence` with the default
//! `[status] progress_interval`; it asserts at most 20 commits at
//! `max_unavailable = 10` (node times 4–8 min), the cadence's bound in every
//! row, that every rollout completed and that no change of state was lost,
//! and exits non-zero otherwise.
//!
//! Reported: reports pushed, lost (never on the remote), latency from
//! "report ready" to "on the remote" (p50/p99/max), push attempts per report,
//! and the wall time of `drover status` (JSON; and with `--html`, which walks
//! the whole report history) on the result.

#[path = "../tests/support/git.rs"]
mod git_servers;

use drover::rollout::RolloutState;
use drover::source::{Source, SourceConfig};
use drover::status::{self, PublishOptions, StatusReport};
use git_servers::{allowed_signers, bare_clone, git, keygen, GitDaemon};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The config repository: three environments, the agents spread over them,
/// and `key` listed as every cluster's report signer.
fn config_repo(dir: &Path, clusters: &[(String, String)], key: &Path) {
    std::fs::create_dir_all(dir.join("environments")).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["config", "user.name", "Bench"]);
    git(dir, &["config", "user.email", "bench@example.com"]);
    git(dir, &["config", "commit.gpgsign", "false"]);
    let mut root = String::from(
        "[promotion]\nchain = [\"test\", \"stage\", \"production\"]\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\n",
    );
    let principals: Vec<(String, &Path)> = clusters
        .iter()
        .map(|(e, c)| (format!("{e}/{c}"), key))
        .collect();
    let listed: Vec<(&str, &Path)> = principals.iter().map(|(p, k)| (p.as_str(), *k)).collect();
    allowed_signers(&dir.join("agents.allowed_signers"), &listed);
    for env in ["test", "stage", "production"] {
        let names: Vec<String> = clusters
            .iter()
            .filter(|(e, _)| e == env)
            .map(|(_, c)| format!("{c:?}"))
            .collect();
        root.push_str(&format!("{env} = [{}]\n", names.join(", ")));
        std::fs::write(
            dir.join(format!("environments/{env}.toml")),
            "version = \"1.13.2\"\n\n[window]\nschedule = \"0 2 8 * *\"\nduration = \"6h\"\ntimezone = \"Europe/Madrid\"\n",
        )
        .unwrap();
    }
    std::fs::write(dir.join("drover.toml"), root).unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "fleet"]);
}

#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    attempts: Vec<u32>,
    errors: u64,
    /// The first few distinct errors, with how long the failed call took.
    error_kinds: Vec<(String, Duration)>,
    lost: Vec<(String, u32)>,
}

fn pct(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// What one simulated 200-node rollout wrote to the status branch.
struct Commits {
    /// The old rule: a commit whenever the report changed.
    before: u32,
    /// `status::cadence` with the interval given, per-node detail included.
    after: u32,
    /// The same with the 60 s poll interval as the interval (the agent before `[status] progress_interval`).
    poll: u32,
    /// Simulated length of the rollout.
    minutes: u32,
    /// Changes of state (state or version) the reports passed through.
    changes: u32,
}

/// Status commits for one 200-node rollout in the simulator, driven
/// reconcile by reconcile as the agent does: the old rule (a push whenever
/// the report changed) against `status::cadence` (state changes at once,
/// progress at most once per `interval`, the newest progress pushed when
/// its time comes). Node times spread evenly over `node_mins` minutes (a
/// fixed spread, so the figure is repeatable); `max` nodes at a time.
/// Panics when the rollout did not complete, a change of state did not
/// reach the branch, or the branch does not end on the last report.
fn rollout_commits(max: u32, node_mins: (u64, u64), interval: Duration) -> Commits {
    use drover::cluster::Cluster;
    use drover::config::{MaxUnavailable, OnDrainTimeout};
    use drover::rollout::{Engine, Labels, Policy, VirtualClock};
    use drover::sim::{Sim, SimNode, Timeline};
    use drover::status::cadence::{decide, Push};
    use futures::executor::block_on;
    let start: chrono::DateTime<chrono::Utc> = "2026-12-08T02:00:00Z".parse().unwrap();
    let from = semver::Version::new(1, 12, 0);
    let target = semver::Version::new(1, 13, 2);
    let clock = VirtualClock::new(start);
    let sim = Sim::new("bench", clock.clone());
    let (lo, hi) = (node_mins.0 * 60, node_mins.1 * 60);
    for i in 0..200u64 {
        let secs = lo + (i * 7919 % (hi - lo));
        sim.add_node(SimNode::new(
            format!("node-{i:04}"),
            Some(from.clone()),
            Duration::from_secs(secs),
        ));
    }
    let policy = Policy {
        target: target.clone(),
        max_unavailable: MaxUnavailable::Count(max),
        drain_timeout: Duration::from_secs(20 * 60),
        node_timeout: Duration::from_secs(45 * 60),
        on_drain_timeout: OnDrainTimeout::Skip,
        health: None,
        on_failure: drover::config::OnFailure::Halt,
        max_rollbacks: 1,
        prepare: false,
        prestage: std::time::Duration::ZERO,
    };
    let engine = Engine::new(policy, Labels::default(), clock.clone());
    let schedule = Timeline {
        windows: vec![(start, start + chrono::Duration::days(365))],
        calendar: None,
        gate_from: Some(start),
    };
    let (mut before, mut after) = (0u32, 0u32);
    let mut old_last: Option<StatusReport> = None;
    let mut pushed: Option<(StatusReport, chrono::DateTime<chrono::Utc>)> = None;
    let mut held: Option<(StatusReport, chrono::DateTime<chrono::Utc>)> = None;
    // Changes of state offered and pushed, in order.
    let mut offered_states: Vec<RolloutState> = Vec::new();
    let mut pushed_states: Vec<RolloutState> = Vec::new();
    let mut last_report: Option<StatusReport>;
    let mut steps = 0;
    let mut push = |r: StatusReport, at, pushed: &mut Option<_>, states: &mut Vec<RolloutState>| {
        after += 1;
        if states.last() != Some(&r.state) {
            states.push(r.state);
        }
        *pushed = Some((r, at));
    };
    loop {
        let now = drover::rollout::Clock::now(&clock);
        // Held progress whose time has come goes out first, as the reporter does.
        if let Some((r, due)) = held.take_if(|(_, due)| *due <= now) {
            push(r, due, &mut pushed, &mut pushed_states);
        }
        let out = block_on(engine.reconcile(&sim, &schedule.inputs(now))).unwrap();
        steps += 1;
        let d = &out.decision;
        let observed = block_on(sim.observe()).unwrap();
        let report = StatusReport {
            env: "production".into(),
            cluster: "bench".into(),
            config_commit: "0".repeat(40),
            version: target.clone(),
            state: d.state,
            since: start,
            nodes: d.nodes,
            nodes_at_version: d.nodes_at_version,
            message: d.message.clone(),
            detail: Default::default(),
        };
        // The old rule: every change of the report (without per-node detail) is a commit.
        if old_last.as_ref() != Some(&report) {
            before += 1;
            old_last = Some(report.clone());
        }
        if offered_states.last() != Some(&report.state) {
            offered_states.push(report.state);
        }
        // The new rule, with per-node detail in the report.
        let report = StatusReport {
            detail: drover::status::NodeDetail::of(&observed, &target),
            ..report
        };
        last_report = Some(report.clone());
        match decide(
            pushed.as_ref().map(|(r, t)| (r, *t)),
            &report,
            now,
            interval,
        ) {
            // A newer report supersedes held progress.
            Push::Now => {
                held = None;
                push(report, now, &mut pushed, &mut pushed_states);
            }
            Push::At(t) => held = Some((report, t)),
            Push::Nothing => held = None,
        }
        let finished = matches!(d.state, RolloutState::Confirmed | RolloutState::Failed)
            && sim.in_flight() == 0;
        if finished || steps > 100_000 {
            break;
        }
        if out.again {
            continue;
        }
        // The agent wakes for the node watch, the engine's wake-up, or a held report.
        let next = [
            sim.next_event(now),
            d.wake_at,
            held.as_ref().map(|(_, t)| *t),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .min();
        match next {
            Some(t) => clock.set(t),
            None => break,
        }
    }
    // The work completed: confirmed, every node at the target, the budget kept.
    let last = last_report.expect("a report");
    assert_eq!(
        last.state,
        RolloutState::Confirmed,
        "rollout did not complete: {}",
        last.message
    );
    assert_eq!((last.nodes, last.nodes_at_version), (200, 200));
    assert_eq!(
        last.detail.at_version.len(),
        200,
        "the detail names every node"
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    assert!(sim.peak_unavailable() <= max as usize);
    // No change of state lost, and the branch ends on the last report.
    assert_eq!(
        offered_states, pushed_states,
        "a change of state did not reach the branch"
    );
    assert!(held.is_none(), "the confirmation is never held");
    assert_eq!(pushed.map(|(r, _)| r), Some(last));
    let minutes = (drover::rollout::Clock::now(&clock) - start).num_minutes() as u32;
    Commits {
        before,
        after,
        poll: 0,
        minutes,
        changes: offered_states.len() as u32,
    }
}

/// Goal of issue 25: at most 20 status commits for a 200-node rollout with
/// `max_unavailable = 10` and the default progress interval.
const GOAL_COMMITS: u32 = 20;

fn main() {
    {
        let interval = drover::config::DEFAULT_PROGRESS_INTERVAL;
        println!("## Status commits per 200-node rollout\n");
        println!(
            "| node time | max_unavailable | rollout (simulated) | changes of state | commits, a push per change | commits, progress every 60 s (the poll interval: before) | commits, `[status] progress_interval` = {} min (after) | bound: changes + ⌈rollout / interval⌉ |\n|---|---|---|---|---|---|---|---|",
            interval.as_secs() / 60
        );
        let mut missed = Vec::new();
        for (node_mins, max) in [((4, 8), 1), ((4, 8), 10), ((4, 8), 20), ((10, 20), 10)] {
            let mut c = rollout_commits(max, node_mins, interval);
            c.poll = rollout_commits(max, node_mins, Duration::from_secs(60)).after;
            let bound = c.changes + (c.minutes * 60).div_ceil(interval.as_secs() as u32);
            println!(
                "| {}–{} min | {max} | {} min | {} | {} | {} | {} | {bound} |",
                node_mins.0, node_mins.1, c.minutes, c.changes, c.before, c.poll, c.after
            );
            if c.after > bound {
                missed.push(format!(
                    "{node_mins:?}/{max}: {} commits over the cadence's bound {bound}",
                    c.after
                ));
            }
            if node_mins == (4, 8) && max == 10 && c.after > GOAL_COMMITS {
                missed.push(format!(
                    "{} commits at max_unavailable = 10, goal ≤ {GOAL_COMMITS}",
                    c.after
                ));
            }
        }
        println!();
        if !missed.is_empty() {
            eprintln!("GOAL MISSED: {}", missed.join("; "));
            std::process::exit(1);
        }
    }
    let agents = env_num("DROVER_BENCH_AGENTS", 1000) as usize;
    if agents == 0 {
        return;
    }
    let interval = Duration::from_secs(env_num("DROVER_BENCH_INTERVAL", 60));
    let rounds = env_num("DROVER_BENCH_ROUNDS", 10) as u32;
    let tmp = tempfile::tempdir().unwrap();
    let clusters: Vec<(String, String)> = (0..agents)
        .map(|i| {
            let env = match i % 10 {
                0 => "test",
                1..=3 => "stage",
                _ => "production",
            };
            (env.to_owned(), format!("c{i:04}"))
        })
        .collect();
    let work = tmp.path().join("work");
    // One key for the whole simulated fleet (listed once per cluster): a
    // signature costs the same to check whichever key made it.
    let key = keygen(tmp.path(), "agents");
    config_repo(&work, &clusters, &key);
    let base = tmp.path().join("served");
    std::fs::create_dir_all(&base).unwrap();
    bare_clone(&work, &base, "config");
    // `DROVER_BENCH_AUTOGC=0`: the served repository runs no `git gc --auto`
    // after a push, as forges do their maintenance out of band.
    if env_num("DROVER_BENCH_AUTOGC", 1) == 0 {
        git(
            &base.join("config.git"),
            &["config", "receive.autogc", "false"],
        );
    }
    let daemon = GitDaemon::start(&base);
    let url = daemon.url("config");

    // Every agent opens its own Source (its own cache, its own first fetch).
    let t_open = Instant::now();
    let sources: Vec<Source> = clusters
        .iter()
        .map(|(_, c)| {
            let mut cfg = SourceConfig::new(url.clone(), tmp.path().join("caches").join(c));
            cfg.timeout = Duration::from_secs(60);
            let s = Source::open(cfg).expect("open source");
            s.fetch().expect("first fetch");
            s
        })
        .collect();
    eprintln!(
        "{agents} sources opened and fetched in {}",
        secs(t_open.elapsed())
    );

    eprintln!(
        "load average before pushing: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = Instant::now() + Duration::from_secs(2);
    let mut handles = Vec::new();
    for (i, (source, (env, cluster))) in sources.into_iter().zip(clusters.clone()).enumerate() {
        let tally = Arc::clone(&tally);
        let key = key.clone();
        // Agents are spread evenly over the interval, as independent
        // clocks would be; each reports at the same phase every round.
        let phase = interval.mul_f64(i as f64 / agents as f64);
        handles.push(
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let opts = PublishOptions::default()
                        .with_signing_key_file(&key)
                        .unwrap();
                    for round in 0..rounds {
                        let due = start + phase + interval * round;
                        let next_due = due + interval;
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        let report = StatusReport {
                            env: env.clone(),
                            cluster: cluster.clone(),
                            config_commit: "0".repeat(40),
                            version: "1.13.2".parse().unwrap(),
                            state: if round + 1 == rounds {
                                RolloutState::Confirmed
                            } else {
                                RolloutState::Rolling
                            },
                            since: chrono::Utc::now(),
                            nodes: rounds,
                            nodes_at_version: round + 1,
                            message: format!("round {round}"),
                            detail: Default::default(),
                        };
                        let ready = Instant::now();
                        let mut attempts = 0;
                        // Like the agent: a push that fails (connection
                        // refused by the server's limit, or exhausted) is
                        // retried until the next report supersedes it.
                        let landed = loop {
                            let call = Instant::now();
                            match status::publish(&source, &report, &opts) {
                                Ok(p) => {
                                    attempts += p.attempts;
                                    break true;
                                }
                                Err(e) => {
                                    attempts += 1;
                                    let mut t = tally.lock().unwrap();
                                    t.errors += 1;
                                    let kind = e.to_string();
                                    if t.error_kinds.len() < 5
                                        && !t.error_kinds.iter().any(|(k, _)| *k == kind)
                                    {
                                        t.error_kinds.push((kind, call.elapsed()));
                                    }
                                    drop(t);
                                    let pause =
                                        Duration::from_millis(rand::random_range(500..2000));
                                    if Instant::now() + pause >= next_due {
                                        break false;
                                    }
                                    std::thread::sleep(pause);
                                }
                            }
                        };
                        let mut t = tally.lock().unwrap();
                        if landed {
                            t.latencies.push(ready.elapsed());
                            t.attempts.push(attempts);
                        } else {
                            t.lost.push((cluster.clone(), round));
                        }
                    }
                })
                .expect("spawn agent"),
        );
    }
    for h in handles {
        h.join().expect("agent thread");
    }
    let push_wall = start.elapsed();
    eprintln!(
        "push phase done in {}; load average: {}",
        secs(push_wall),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    drop(daemon);

    // What is on the remote: every (cluster, round) ever written, on every
    // cluster's branch.
    let bare = base.join("config.git");
    let reader = tmp.path().join("reader");
    git(
        tmp.path(),
        &[
            "clone",
            "-q",
            bare.to_str().unwrap(),
            reader.to_str().unwrap(),
        ],
    );
    git(
        &reader,
        &[
            "fetch",
            "-q",
            "origin",
            "+refs/heads/drover/status.d/*:refs/heads/drover/status.d/*",
        ],
    );
    let repo = git2::Repository::open(&reader).unwrap();
    let mut seen: HashSet<(String, u32)> = HashSet::new();
    let mut commits = 0;
    let mut tips: HashMap<(String, String), git2::Oid> = HashMap::new();
    for r in repo
        .references_glob("refs/heads/drover/status.d/*")
        .unwrap()
    {
        let r = r.unwrap();
        let name = r.name().unwrap().to_owned();
        let rest = name.trim_start_matches("refs/heads/drover/status.d/");
        let (env, cluster) = rest.split_once('/').unwrap();
        let tip = r.peel_to_commit().unwrap().id();
        tips.insert((env.to_owned(), cluster.to_owned()), tip);
        let path = status::report_path(env, cluster);
        let mut walk = repo.revwalk().unwrap();
        walk.push(tip).unwrap();
        for oid in walk {
            let c = repo.find_commit(oid.unwrap()).unwrap();
            commits += 1;
            let entry = c.tree().unwrap().get_path(Path::new(&path)).unwrap();
            let blob = repo.find_blob(entry.id()).unwrap();
            let r = StatusReport::from_toml(std::str::from_utf8(blob.content()).unwrap()).unwrap();
            seen.insert((r.cluster, r.nodes_at_version - 1));
        }
    }
    let expected = agents as u64 * rounds as u64;
    let mut t = tally.lock().unwrap();
    let on_remote = seen.len() as u64;
    t.latencies.sort();
    let attempts_total: u64 = t.attempts.iter().map(|a| *a as u64).sum();
    let pushed = t.latencies.len() as u64;

    // Reading the fleet back at the size of the goal: top each cluster's
    // branch up locally (no push), round-robin, to 10,000 signed report
    // versions in all, then time drover status (tip reports), --html (the
    // whole history) and the gate's reader.
    let history_target = env_num("DROVER_BENCH_HISTORY", 10_000) as usize;
    let added = history_target.saturating_sub(commits);
    {
        let opts = PublishOptions::default()
            .with_signing_key_file(&key)
            .unwrap();
        for k in 0..added {
            let (env, cluster) = &clusters[k % clusters.len()];
            let n = (k / clusters.len()) as u32 + 1;
            let report = StatusReport {
                env: env.clone(),
                cluster: cluster.clone(),
                config_commit: "0".repeat(40),
                version: "1.13.2".parse().unwrap(),
                state: if k + clusters.len() >= added {
                    RolloutState::Confirmed
                } else {
                    RolloutState::Rolling
                },
                since: chrono::Utc::now(),
                nodes: 10,
                nodes_at_version: n,
                message: String::new(),
                detail: Default::default(),
            };
            let key = (env.clone(), cluster.clone());
            let tip = tips.get(&key).copied();
            let id = status::build_commit(&repo, &report, &opts, tip)
                .unwrap()
                .unwrap();
            tips.insert(key, id);
        }
        for ((env, cluster), tip) in &tips {
            repo.reference(
                &format!(
                    "refs/heads/{}",
                    status::cluster_branch("drover/status", env, cluster)
                ),
                *tip,
                true,
                "bench",
            )
            .unwrap();
        }
    }
    let history_total = commits + added;
    // A reader's copy of the store comes from a fetch, packed; the versions
    // added above are loose objects until packed like a fetch would have.
    git(&reader, &["repack", "-adq"]);
    let bin = env!("CARGO_BIN_EXE_drover");
    let time_status = |extra: &[&str]| -> Duration {
        let mut v: Vec<Duration> = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                let st = Command::new(bin)
                    .arg("--repo")
                    .arg(&reader)
                    .args(["--format", "json", "status"])
                    .args(extra)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .unwrap();
                assert!(st.success());
                t0.elapsed()
            })
            .collect();
        v.sort();
        v[2]
    };
    let read = time_status(&[]);
    let page = tmp.path().join("fleet.html");
    let read_html = time_status(&["--html", page.to_str().unwrap()]);
    let cfg = drover::config::load(&drover::config::DirFiles::new(&reader)).unwrap();
    let signers =
        drover::trust::AllowedSigners::load(&reader.join("agents.allowed_signers")).unwrap();
    let gate_read = {
        let mut v: Vec<Duration> = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                status::read_confirmations(
                    &repo,
                    "drover/status",
                    Some(&signers),
                    chrono::Utc::now(),
                )
                .unwrap();
                t0.elapsed()
            })
            .collect();
        v.sort();
        v[2]
    };
    let conf =
        status::read_confirmations(&repo, "drover/status", Some(&signers), chrono::Utc::now())
            .unwrap();
    // The baselines of the same run: git itself reading the same data, with
    // no signature checked. Tips: list the branches, then every tip's report
    // in one `cat-file --batch`. History: every version of every report.
    let (git_tips, git_history) = {
        let tips_read = || {
            let refs = Command::new("git")
                .current_dir(&reader)
                .args([
                    "for-each-ref",
                    "--format=%(refname)",
                    "refs/heads/drover/status.d/",
                ])
                .output()
                .unwrap();
            assert!(refs.status.success());
            let mut input = String::new();
            for name in String::from_utf8(refs.stdout).unwrap().lines() {
                let rest = name.trim_start_matches("refs/heads/drover/status.d/");
                let (env, cluster) = rest.split_once('/').unwrap();
                input.push_str(&format!("{name}:{}\n", status::report_path(env, cluster)));
            }
            let mut child = Command::new("git")
                .current_dir(&reader)
                .args(["cat-file", "--batch"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
            assert!(child.wait().unwrap().success());
        };
        let history_read = || {
            let st = Command::new("git")
                .current_dir(&reader)
                .args([
                    "log",
                    "-p",
                    "--format=%H %ct",
                    "--branches=drover/status.d/*",
                ])
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success());
        };
        let median = |f: &dyn Fn()| {
            let mut v: Vec<Duration> = (0..5)
                .map(|_| {
                    let t0 = Instant::now();
                    f();
                    t0.elapsed()
                })
                .collect();
            v.sort();
            v[2]
        };
        (median(&tips_read), median(&history_read))
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    println!("## Status store at fleet size\n");
    println!(
        "{agents} agents (threads, each its own `Source` and cache), a signed report each every {} s for {rounds} rounds, pushed with `status::publish` to its own branch `drover/status.d/<env>/<cluster>` of one repository served by `git daemon` on loopback (default 32 connections); {} of pushing.\n",
        interval.as_secs(),
        secs(push_wall)
    );
    println!("| figure | value |\n|---|---|");
    println!("| reports due | {expected} |");
    println!("| reports pushed (publish returned Ok) | {pushed} |");
    println!("| distinct reports on the remote | {on_remote} |");
    println!(
        "| lost (never on the remote) | {} |",
        expected - on_remote.min(expected)
    );
    println!("| status commits on the remote (all branches) | {commits} |");
    println!(
        "| latency ready → on the remote, p50 / p99 / max | {} / {} / {} |",
        secs(pct(&t.latencies, 0.50)),
        secs(pct(&t.latencies, 0.99)),
        secs(t.latencies.last().copied().unwrap_or_default())
    );
    println!(
        "| push attempts per landed report, mean / max | {:.2} / {} |",
        attempts_total as f64 / pushed.max(1) as f64,
        t.attempts.iter().max().copied().unwrap_or(0)
    );
    println!(
        "| failed publish calls (connection refused, exhausted), retried | {} |",
        t.errors
    );
    println!("| `drover status --format json`, {} clusters, {history_total} signed report versions ({added} added locally after the push phase), signatures verified, median of 5 | {} |", cfg.root.clusters.values().map(Vec::len).sum::<usize>(), secs(read));
    println!(
        "| same with `--html` (walks all {history_total} report versions) | {} |",
        secs(read_html)
    );
    println!(
        "| `status::read_confirmations` (the gate's read, every signature verified), {} confirmations, median of 5 | {} |",
        conf.for_env("production").len() + conf.for_env("stage").len() + conf.for_env("test").len(),
        secs(gate_read)
    );
    println!(
        "| baseline: git `for-each-ref` + one `cat-file --batch` of every tip's report (no signature checked), median of 5 | {} |",
        secs(git_tips)
    );
    println!(
        "| baseline: `git log -p` of every cluster branch, all {history_total} versions (no signature checked), median of 5 | {} |",
        secs(git_history)
    );
    println!(
        "| ratio `drover status` / git tips read; `read_confirmations` / `git log -p` | {:.1}× ; {:.1}× |",
        read.as_secs_f64() / git_tips.as_secs_f64(),
        gate_read.as_secs_f64() / git_history.as_secs_f64()
    );
    println!("\nload average after the reads: {}", load.trim());
    for (kind, took) in &t.error_kinds {
        eprintln!("publish failed after {}: {kind}", secs(*took));
    }
    if let Ok(log) = std::fs::read_to_string(base.join("daemon.log")) {
        let lines: Vec<&str> = log.lines().collect();
        eprintln!(
            "git daemon log: {} lines, {} 'Too many children'; last: {:?}",
            lines.len(),
            lines
                .iter()
                .filter(|l| l.contains("Too many children"))
                .count(),
            lines.iter().rev().take(3).collect::<Vec<_>>()
        );
    }
    if !t.lost.is_empty() {
        eprintln!(
            "lost reports (first 10): {:?}",
            &t.lost[..t.lost.len().min(10)]
        );
    }
}
