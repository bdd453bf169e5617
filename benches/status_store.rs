//! The status store at fleet size: simulated agents, each running the
//! agent's own status reporter (`drover::agent::reporter`: the outbox that
//! coalesces progress, the push thread, its time budget, backoff and
//! jitter) with its own `Source` (its own git cache), offer a signed report
//! every interval for their own status branch
//! (`drover/status.d/<env>/<cluster>`) of one repository served by `git
//! daemon` on loopback. Each cluster goes `pending`, `rolling` (progress),
//! `blocked` halfway, `rolling`, and ends `confirmed`: its final state. Then
//! `drover status` and the gate's reader read the fleet from a clone holding
//! all those reports, verifying every signature.
//!
//! Run: `cargo bench --bench status_store` (1,000 agents, a report per agent
//! every 60 s for 10 rounds). `DROVER_BENCH_AGENTS`, `DROVER_BENCH_INTERVAL`
//! (seconds; also the agents' poll interval, which sizes each push
//! attempt's budget) and `DROVER_BENCH_ROUNDS` scale it down;
//! `DROVER_BENCH_GRACE` (seconds, default five intervals) bounds the wait
//! for the last reports. `DROVER_BENCH_CPU_QUOTA=15` starves the git server:
//! the daemon and every process it forks get 15% of one CPU (a cgroup v2
//! `cpu.max` or v1 `cpu.cfs_quota_us`, whichever the machine offers; the
//! run says which, and how often the quota throttled; without a usable
//! cgroup, the daemon runs at nice 19 beside one busy loop per CPU, and the
//! run says so). The push phase exits non-zero when a cluster's final state
//! is not the tip of its branch after the grace period, when a change of
//! state never reached its branch, or when the p99 of "final state ready →
//! on the remote" exceeds one interval or, on a server too slow to take a
//! push from every agent per interval, two turns of its fair share (agents
//! ÷ the pushes it landed per second; see `goal_p99`).
//! `DROVER_BENCH_AGENTS=0`
//! runs only the first part: status commits for one 200-node rollout in the
//! simulator, a push per change against `status::cadence` with the default
//! `[status] progress_interval`; it asserts at most 20 commits at
//! `max_unavailable = 10` (node times 4–8 min), the cadence's bound in every
//! row, that every rollout completed and that no change of state was lost,
//! and exits non-zero otherwise.
//!
//! Reported: reports due, landed, superseded (progress replaced in the
//! outbox by a newer report: dropped by design), changes of state and final
//! states lost, "final state ready → on the remote" (p50/p99/max), push
//! attempts by result (landed, abandoned by timeout, failed), and the wall
//! time of `drover status` (JSON; and with `--html`, which walks the whole
//! report history) on the result.

#[path = "../tests/support/git.rs"]
mod git_servers;

use drover::agent::reporter::{Outgoing, Reporter, ReporterConfig};
use drover::rollout::RolloutState;
use drover::source::{Source, SourceConfig};
use drover::status::{self, PublishOptions, StatusReport};
use git_servers::{allowed_signers, bare_clone, git, keygen, GitDaemon};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
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
        allow_downgrade: false,
        max_unavailable: MaxUnavailable::Count(max),
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
    };
    let engine = Engine::new(policy, Labels::default(), clock.clone());
    let schedule = Timeline {
        windows: vec![(start, start + chrono::Duration::days(365))],
        calendar: None,
        gate_from: Some(start),
        gate_waits: None,
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

    // Every agent's cache gets its first fetch before the server is
    // starved: the phase measured is pushing, as agents do once running.
    let t_open = Instant::now();
    let source_cfgs: Vec<SourceConfig> = clusters
        .iter()
        .map(|(_, c)| {
            let mut cfg = SourceConfig::new(url.clone(), tmp.path().join("caches").join(c));
            cfg.timeout = Duration::from_secs(60);
            let s = Source::open(cfg.clone()).expect("open source");
            s.fetch().expect("first fetch");
            cfg
        })
        .collect();
    let config_commit = git2::Repository::open(base.join("config.git"))
        .unwrap()
        .revparse_single("main")
        .unwrap()
        .id()
        .to_string();
    eprintln!(
        "{agents} sources opened and fetched in {}",
        secs(t_open.elapsed())
    );
    let quota = env_num("DROVER_BENCH_CPU_QUOTA", 0);
    let starved = (quota > 0).then(|| starve::Starved::start(daemon.pid(), quota));
    if let Some(s) = &starved {
        eprintln!("git daemon starved: {}", s.how());
    }
    eprintln!(
        "load average before pushing: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let grace = Duration::from_secs(env_num("DROVER_BENCH_GRACE", 5 * interval.as_secs()));
    let metrics = Arc::new(drover::agent::metrics::Metrics::new());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let opts = PublishOptions::default()
        .with_signing_key_file(&key)
        .unwrap();
    let start = Instant::now() + Duration::from_secs(2);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let runs: Vec<AgentRun> = rt.block_on(async {
        let mut agents_running = Vec::new();
        for (i, (cfg, (env, cluster))) in source_cfgs.into_iter().zip(clusters.clone()).enumerate()
        {
            let (reporter, task) = Reporter::start(
                ReporterConfig {
                    source: cfg,
                    publish: opts.clone(),
                    poll: interval,
                    clock: Arc::new(drover::agent::OffsetClock(chrono::Duration::zero())),
                    events: drover::agent::events::Events::new(None, &cluster, "drover", &cluster),
                    metrics: metrics.clone(),
                },
                stop.clone(),
            );
            // Agents are spread evenly over the interval, as independent
            // clocks would be; each reports at the same phase every round.
            let phase = interval.mul_f64(i as f64 / agents as f64);
            let config_commit = config_commit.clone();
            let run = tokio::spawn(async move {
                let mut landed = reporter.landed();
                let mut last = None;
                for round in 0..rounds {
                    tokio::time::sleep_until((start + phase + interval * round).into()).await;
                    let report = scripted(&env, &cluster, &config_commit, round, rounds);
                    reporter.offer(Outgoing {
                        report: report.clone(),
                        branch: "drover/status".into(),
                        // Progress is held for three reports (the default
                        // is ten polls), so that a push attempt, which may
                        // take one poll, is given up well before its
                        // progress would be superseded.
                        progress_interval: interval * 3,
                    });
                    last = Some(report);
                }
                let ready = Instant::now();
                let last = last.expect("at least one round");
                let on_remote =
                    tokio::time::timeout(grace, landed.wait_for(|r| r.as_ref() == Some(&last)))
                        .await
                        .is_ok();
                let landed_at = on_remote.then(Instant::now);
                AgentRun {
                    cluster,
                    final_state: last,
                    final_latency: landed_at.map(|t| t - ready),
                    landed_at,
                    task,
                }
            });
            agents_running.push(run);
        }
        let mut runs = Vec::new();
        for r in agents_running {
            runs.push(r.await.expect("agent task"));
        }
        // Every final state landed or its grace ran out: end the terms.
        let _ = stop_tx.send(true);
        for r in &mut runs {
            let _ = tokio::time::timeout(Duration::from_secs(30), &mut r.task).await;
        }
        runs
    });
    drop(rt);
    let push_wall = start.elapsed();
    let throttled = starved.as_ref().map(|s| s.throttled());
    eprintln!(
        "push phase done in {}; load average: {}",
        secs(push_wall),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let starved_how = starved.as_ref().map(|s| s.how());
    drop(daemon);
    drop(starved);

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
    // Each cluster's reports on the remote, oldest first, and its tip's.
    let mut landed_states: HashMap<String, Vec<(u32, RolloutState)>> = HashMap::new();
    let mut tip_reports: HashMap<String, StatusReport> = HashMap::new();
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
        let mut first = true;
        for oid in walk {
            let c = repo.find_commit(oid.unwrap()).unwrap();
            commits += 1;
            let entry = c.tree().unwrap().get_path(Path::new(&path)).unwrap();
            let blob = repo.find_blob(entry.id()).unwrap();
            let r = StatusReport::from_toml(std::str::from_utf8(blob.content()).unwrap()).unwrap();
            landed_states
                .entry(r.cluster.clone())
                .or_default()
                .push((r.nodes_at_version - 1, r.state));
            if std::mem::take(&mut first) {
                tip_reports.insert(r.cluster.clone(), r.clone());
            }
            seen.insert((r.cluster, r.nodes_at_version - 1));
        }
    }
    let expected = agents as u64 * rounds as u64;
    let on_remote = seen.len() as u64;
    // A final state is lost when its cluster's branch does not end on it.
    let finals_lost: Vec<&str> = runs
        .iter()
        .filter(|r| tip_reports.get(&r.cluster) != Some(&r.final_state))
        .map(|r| r.cluster.as_str())
        .collect();
    // Changes of state (not progress) that never reached the branch.
    let offered_runs = state_runs((0..rounds).map(|k| scripted("", "", "", k, rounds).state));
    let changes_lost: Vec<&str> = runs
        .iter()
        .filter(|r| {
            let mut landed = landed_states.get(&r.cluster).cloned().unwrap_or_default();
            landed.sort_by_key(|(round, _)| *round);
            state_runs(landed.into_iter().map(|(_, s)| s)) != offered_runs
        })
        .map(|r| r.cluster.as_str())
        .collect();
    let mut latencies: Vec<Duration> = runs.iter().filter_map(|r| r.final_latency).collect();
    latencies.sort();
    let pushes = |result: &str| -> u64 {
        let line = format!("drover_status_pushes_total{{result=\"{result}\"}} ");
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.trim().parse().ok())
            .unwrap_or(0)
    };
    let p99 = pct(&latencies, 0.99);
    // The server's pace: pushes landed per second until the last final
    // state landed.
    let busy = runs
        .iter()
        .filter_map(|r| r.landed_at)
        .max()
        .map_or(push_wall, |t| t.saturating_duration_since(start));
    let pace = pushes("ok") as f64 / busy.as_secs_f64().max(1.0);
    // The goal for a final state: on the remote within one report interval
    // of being ready, or, when the server cannot take a push from every
    // agent in an interval, within two turns of its fair share (agents ÷
    // its pace): the attempt under way when the state was made, then the
    // one carrying it. Nothing a reporter does can beat the second; one
    // that retried in lockstep or queued its final state behind its own
    // history would miss it.
    let fair_turn = Duration::from_secs_f64(agents as f64 / pace.max(0.001));
    let goal_p99 = interval.max(fair_turn * 2);

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
                let conf = status::read_confirmations(
                    &repo,
                    "drover/status",
                    Some(&signers),
                    chrono::Utc::now(),
                );
                assert!(conf.held_all.is_none(), "{:?}", conf.held_all);
                t0.elapsed()
            })
            .collect();
        v.sort();
        v[2]
    };
    let conf =
        status::read_confirmations(&repo, "drover/status", Some(&signers), chrono::Utc::now());
    assert!(conf.held_all.is_none(), "{:?}", conf.held_all);
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
        "{agents} agents, each the agent's own status reporter (`drover::agent::reporter`: its outbox, its push thread, its time budget and backoff) with its own `Source` and cache, a signed report each every {} s for {rounds} rounds (`pending`, `rolling` progress, `blocked` halfway, ending `confirmed`), each to its own branch `drover/status.d/<env>/<cluster>` of one repository served by `git daemon` on loopback (default 32 connections), the server {}; {} of pushing, grace {} for the last reports.\n",
        interval.as_secs(),
        starved_how.as_deref().unwrap_or("not starved"),
        secs(push_wall),
        secs(grace)
    );
    println!("| figure | value |\n|---|---|");
    println!("| reports due | {expected} |");
    println!("| reports landed (distinct, on the remote) | {on_remote} |");
    println!(
        "| reports superseded (progress replaced in the outbox by a newer report, by design) | {} |",
        expected - on_remote.min(expected)
    );
    println!(
        "| changes of state lost (a state the cluster passed through, not on its branch) | {} |",
        changes_lost.len()
    );
    println!(
        "| **final states lost** (a branch not ending on its cluster's last report) | **{}** of {agents} |",
        finals_lost.len()
    );
    println!("| status commits on the remote (all branches) | {commits} |");
    println!(
        "| final state ready → on the remote, p50 / p99 / max (goal p99 ≤ {}) | {} / {} / {} |",
        secs(goal_p99),
        secs(pct(&latencies, 0.50)),
        secs(p99),
        secs(latencies.last().copied().unwrap_or_default())
    );
    println!(
        "| push attempts: landed / unchanged / abandoned by timeout (budget {}) / failed / refused | {} / {} / {} / {} / {} |",
        secs(drover::agent::reporter::attempt_budget(interval)),
        pushes("ok"),
        pushes("unchanged"),
        pushes("timeout"),
        pushes("failed"),
        pushes("refused")
    );
    println!(
        "| the server's pace: pushes landed per second until the last final state landed; one push from every agent at that pace | {pace:.2}/s; {} |",
        secs(fair_turn)
    );
    if let Some(Some((periods, time))) = throttled {
        println!(
            "| server throttled by its quota: periods / time | {periods} / {} |",
            secs(time)
        );
    }
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
    let mut missed = Vec::new();
    if !finals_lost.is_empty() {
        missed.push(format!(
            "{} final states lost (first 10: {:?})",
            finals_lost.len(),
            &finals_lost[..finals_lost.len().min(10)]
        ));
    }
    if !changes_lost.is_empty() {
        missed.push(format!(
            "{} clusters lost a change of state (first 10: {:?})",
            changes_lost.len(),
            &changes_lost[..changes_lost.len().min(10)]
        ));
    }
    if latencies.len() < agents || p99 > goal_p99 {
        missed.push(format!(
            "final state ready → on the remote p99 {} (goal ≤ {}; {} of {agents} seen landing within the grace)",
            secs(p99),
            secs(goal_p99),
            latencies.len()
        ));
    }
    if !missed.is_empty() {
        eprintln!("GOAL MISSED: {}", missed.join("; "));
        std::process::exit(1);
    }
}

/// One simulated agent's run: its cluster's last report and how long it
/// took from ready to on the remote (`None`: not within the grace period).
struct AgentRun {
    cluster: String,
    final_state: StatusReport,
    final_latency: Option<Duration>,
    landed_at: Option<Instant>,
    task: tokio::task::JoinHandle<()>,
}

/// Round `round` of `rounds` of a cluster's rollout: `pending`, then
/// rolling progress with a `blocked` spell halfway, ending `confirmed`
/// (the final state). `nodes_at_version` is the round plus one, so each
/// report is told apart on the remote.
fn scripted(env: &str, cluster: &str, commit: &str, round: u32, rounds: u32) -> StatusReport {
    let state = match round {
        0 => RolloutState::Pending,
        r if r + 1 == rounds => RolloutState::Confirmed,
        r if rounds >= 4 && r == rounds / 2 => RolloutState::Blocked,
        _ => RolloutState::Rolling,
    };
    StatusReport {
        env: env.into(),
        cluster: cluster.into(),
        config_commit: commit.into(),
        version: "1.13.2".parse().unwrap(),
        state,
        since: chrono::Utc::now(),
        nodes: rounds,
        nodes_at_version: round + 1,
        message: format!("round {round}"),
        detail: Default::default(),
    }
}

/// States in order with repeats folded: the changes of state a branch shows.
fn state_runs(states: impl IntoIterator<Item = RolloutState>) -> Vec<RolloutState> {
    let mut v: Vec<RolloutState> = Vec::new();
    for s in states {
        if v.last() != Some(&s) {
            v.push(s);
        }
    }
    v
}

/// The git server starved of CPU: its daemon (and every process it forks
/// for a connection) in a CPU cgroup with a quota, v2 (`cpu.max`) or v1
/// (`cpu.cfs_quota_us`), whichever the machine mounts; without a usable
/// cgroup, the daemon at nice 19 beside one busy loop per CPU.
mod starve {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};

    pub enum Starved {
        Cgroup {
            dir: PathBuf,
            v2: bool,
            percent: u64,
        },
        Competitors {
            busy: Vec<Child>,
        },
    }

    fn write(path: &Path, text: &str) -> std::io::Result<()> {
        std::fs::write(path, text)
    }

    /// The cgroup-v2 mount whose root offers the cpu controller.
    fn v2_root() -> Option<PathBuf> {
        ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| {
                std::fs::read_to_string(p.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
            })
    }

    fn cgroup(pid: u32, percent: u64) -> Option<Starved> {
        let name = format!("drover-bench-{}", std::process::id());
        let period = 100_000u64;
        let quota = period * percent / 100;
        if let Some(root) = v2_root() {
            let _ = write(&root.join("cgroup.subtree_control"), "+cpu");
            let dir = root.join(&name);
            std::fs::create_dir(&dir).ok()?;
            let ok = write(&dir.join("cpu.max"), &format!("{quota} {period}")).is_ok()
                && write(&dir.join("cgroup.procs"), &pid.to_string()).is_ok();
            if ok {
                return Some(Starved::Cgroup {
                    dir,
                    v2: true,
                    percent,
                });
            }
            let _ = std::fs::remove_dir(&dir);
        }
        let v1 = ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("cpu.cfs_quota_us").exists())?;
        let dir = v1.join(&name);
        std::fs::create_dir(&dir).ok()?;
        let ok = write(&dir.join("cpu.cfs_period_us"), &period.to_string()).is_ok()
            && write(&dir.join("cpu.cfs_quota_us"), &quota.to_string()).is_ok()
            && write(&dir.join("cgroup.procs"), &pid.to_string()).is_ok();
        if ok {
            Some(Starved::Cgroup {
                dir,
                v2: false,
                percent,
            })
        } else {
            let _ = std::fs::remove_dir(&dir);
            None
        }
    }

    impl Starved {
        /// Starve process `pid` (and what it forks) to `percent` of one CPU.
        pub fn start(pid: u32, percent: u64) -> Starved {
            if let Some(s) = cgroup(pid, percent) {
                return s;
            }
            let _ = Command::new("renice")
                .args(["-n", "19", "-p", &pid.to_string()])
                .output();
            let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
            let busy = (0..cpus)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("start a busy competitor")
                })
                .collect();
            Starved::Competitors { busy }
        }

        /// How, in words for the report.
        pub fn how(&self) -> String {
            match self {
                Starved::Cgroup { v2, percent, .. } => format!(
                    "CPU quota {percent}% of one CPU (cgroup {}, {})",
                    if *v2 { "v2" } else { "v1" },
                    if *v2 { "cpu.max" } else { "cpu.cfs_quota_us" }
                ),
                Starved::Competitors { busy } => format!(
                    "no usable CPU cgroup: git daemon at nice 19 beside {} busy loops",
                    busy.len()
                ),
            }
        }

        /// Periods in which the quota throttled the server, and for how long
        /// in all (`None` with busy competitors): proof the quota bit.
        pub fn throttled(&self) -> Option<(u64, std::time::Duration)> {
            let Starved::Cgroup { dir, v2, .. } = self else {
                return None;
            };
            let stat = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
            let field = |k: &str| {
                stat.lines()
                    .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
            };
            let periods = field("nr_throttled ")?;
            let time = if *v2 {
                std::time::Duration::from_micros(field("throttled_usec ")?)
            } else {
                std::time::Duration::from_nanos(field("throttled_time ")?)
            };
            Some((periods, time))
        }
    }

    impl Drop for Starved {
        fn drop(&mut self) {
            match self {
                Starved::Cgroup { dir, v2, .. } => {
                    // Whatever the killed daemon left running goes back to
                    // the root, then the group goes.
                    let root = dir.parent().unwrap().to_path_buf();
                    for _ in 0..50 {
                        let procs =
                            std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                        for p in procs.lines() {
                            let _ = write(&root.join("cgroup.procs"), p);
                        }
                        if std::fs::remove_dir(&*dir).is_ok() {
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                    eprintln!("could not remove {} (v2: {v2})", dir.display());
                }
                Starved::Competitors { busy } => {
                    for c in busy {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                }
            }
        }
    }
}
