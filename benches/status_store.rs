//! The status store at fleet size: simulated agents, each with its own
//! `Source` (its own git cache), push a report every interval to one
//! repository served by `git daemon` on loopback, through the same
//! `status::publish` the agent uses. Then `drover status` reads the fleet
//! from a clone holding all those reports.
//!
//! Run: `cargo bench --bench status_store` (1,000 agents, a report per agent
//! every 60 s for 10 rounds). `DROVER_BENCH_AGENTS`, `DROVER_BENCH_INTERVAL`
//! (seconds) and `DROVER_BENCH_ROUNDS` scale it down.
//!
//! Reported: reports pushed, lost (never on the remote), latency from
//! "report ready" to "on the remote" (p50/p99/max), push attempts per report,
//! and the wall time of `drover status` (JSON; and with `--html`, which walks
//! the whole report history) on the result.

#[path = "../tests/support/git_servers.rs"]
mod git_servers;

use drover::source::{Source, SourceConfig};
use drover::status::{self, PublishOptions, RolloutState, StatusReport};
use git_servers::{bare_clone, git, GitDaemon};
use std::collections::HashSet;
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

/// The config repository: three environments, the agents spread over them.
fn config_repo(dir: &Path, clusters: &[(String, String)]) {
    std::fs::create_dir_all(dir.join("environments")).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["config", "user.name", "Bench"]);
    git(dir, &["config", "user.email", "bench@example.com"]);
    git(dir, &["config", "commit.gpgsign", "false"]);
    let mut root =
        String::from("[promotion]\nchain = [\"test\", \"stage\", \"production\"]\n\n[clusters]\n");
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

fn main() {
    let agents = env_num("DROVER_BENCH_AGENTS", 1000) as usize;
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
    config_repo(&work, &clusters);
    let base = tmp.path().join("served");
    std::fs::create_dir_all(&base).unwrap();
    bare_clone(&work, &base, "config");
    let daemon = GitDaemon::start(&base);
    let url = daemon.url("config");

    // Every agent opens its own Source (its own cache, its own first fetch).
    let t_open = Instant::now();
    let sources: Vec<Source> = clusters
        .iter()
        .map(|(_, c)| {
            let mut cfg = SourceConfig::new(url.clone(), tmp.path().join("agents").join(c));
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

    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = Instant::now() + Duration::from_secs(2);
    let mut handles = Vec::new();
    for (i, (source, (env, cluster))) in sources.into_iter().zip(clusters.clone()).enumerate() {
        let tally = Arc::clone(&tally);
        // Agents are spread evenly over the interval, as independent
        // clocks would be; each reports at the same phase every round.
        let phase = interval.mul_f64(i as f64 / agents as f64);
        handles.push(
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let opts = PublishOptions::default();
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
                        };
                        let ready = Instant::now();
                        let mut attempts = 0;
                        // Like the agent: a push that fails (connection
                        // refused by the server's limit, or exhausted) is
                        // retried until the next report supersedes it.
                        let landed = loop {
                            match status::publish(&source, &report, &opts) {
                                Ok(p) => {
                                    attempts += p.attempts;
                                    break true;
                                }
                                Err(_) => {
                                    attempts += 1;
                                    tally.lock().unwrap().errors += 1;
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
    drop(daemon);

    // What is on the remote: every (cluster, round) ever written.
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
    if rounds > 0 {
        git(
            &reader,
            &["fetch", "-q", "origin", "drover/status:drover/status"],
        );
    }
    let repo = git2::Repository::open(&reader).unwrap();
    let mut seen: HashSet<(String, u32)> = HashSet::new();
    let mut commits = 0;
    let mut walk = repo.revwalk().unwrap();
    if let Ok(r) = repo.find_reference("refs/heads/drover/status") {
        walk.push(r.peel_to_commit().unwrap().id()).unwrap();
    }
    for oid in walk {
        let c = repo.find_commit(oid.unwrap()).unwrap();
        commits += 1;
        let parent_tree = c.parent(0).ok().map(|p| p.tree().unwrap());
        let diff = repo
            .diff_tree_to_tree(parent_tree.as_ref(), Some(&c.tree().unwrap()), None)
            .unwrap();
        for d in diff.deltas() {
            let blob = repo.find_blob(d.new_file().id()).unwrap();
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

    // Reading the fleet back at the size of the goal: top the branch up
    // locally (no push) to 10,000 report versions over every cluster, then
    // time drover status (tip reports) and --html (the whole history).
    let history_target = env_num("DROVER_BENCH_HISTORY", 10_000) as usize;
    let added = history_target.saturating_sub(commits);
    {
        let sig = git2::Signature::now("bench", "bench@example.com").unwrap();
        let mut parent = repo
            .find_reference("refs/heads/drover/status")
            .ok()
            .map(|r| r.peel_to_commit().unwrap());
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
            };
            let blob = repo.blob(report.to_toml().as_bytes()).unwrap();
            let base = match &parent {
                Some(p) => p.tree().unwrap(),
                None => repo
                    .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
                    .unwrap(),
            };
            let mut update = git2::build::TreeUpdateBuilder::new();
            update.upsert(report.path(), blob, git2::FileMode::Blob);
            let tree = repo
                .find_tree(update.create_updated(&repo, &base).unwrap())
                .unwrap();
            let parents: Vec<&git2::Commit> = parent.iter().collect();
            let id = repo
                .commit(None, &sig, &sig, "status", &tree, &parents)
                .unwrap();
            parent = Some(repo.find_commit(id).unwrap());
        }
        if let Some(p) = &parent {
            repo.reference("refs/heads/drover/status", p.id(), true, "bench")
                .unwrap();
        }
    }
    let history_total = commits + added;
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
    let t_gate = Instant::now();
    let cfg = drover::config::load(&drover::config::DirFiles::new(&reader)).unwrap();
    // The bench's agents do not sign, so this times the walk and the reads,
    // not the signature checks a real fleet's reports also cost.
    let conf = status::read_confirmations(&repo, "drover/status", None).unwrap();
    let gate_read = t_gate.elapsed();

    println!("## Status store at fleet size\n");
    println!(
        "{agents} agents (threads, each its own `Source` and cache), a report each every {} s for {rounds} rounds, pushed with `status::publish` to one branch served by `git daemon` on loopback (default 32 connections); {} of pushing.\n",
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
    println!("| status-branch commits | {commits} |");
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
    println!("| `drover status --format json`, {} clusters, {history_total} report versions ({added} added locally after the push phase), median of 5 | {} |", cfg.root.clusters.values().map(Vec::len).sum::<usize>(), secs(read));
    println!(
        "| same with `--html` (walks all {history_total} report versions) | {} |",
        secs(read_html)
    );
    println!(
        "| `status::read_confirmations` (the gate's read), {} confirmations | {} |",
        conf.for_env("production").len() + conf.for_env("stage").len() + conf.for_env("test").len(),
        secs(gate_read)
    );
    if !t.lost.is_empty() {
        eprintln!(
            "lost reports (first 10): {:?}",
            &t.lost[..t.lost.len().min(10)]
        );
    }
}
