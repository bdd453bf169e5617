//! The figures in BENCHMARKS.md (## Agent), measured against the real
//! kube-apiserver and `git daemon` on loopback:
//! - push (webhook) to the start of the reconcile that acts on it: p99 < 1 s over 50 pushes;
//! - resident memory of a `drover agent` process with 1,000 nodes registered:
//!   under 32 MiB for optimised builds (`cargo bench` measures the release
//!   binary, `--profile dist` the one the image ships); a debug binary's own
//!   (anonymous) memory is held to a regression bound.
//!   `DROVER_AGENT_BIN` measures another binary, `DROVER_FIGURE_NODES=N`
//!   another cluster size.
//!
//! Both run in one test so they do not compete with each other for the two cores.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover::rollout::VirtualClock;
use support::agent::*;
use support::backend::{pool_options, start_sim, POOL_LABEL};
use support::kube::{ControlPlane, TestNamespace};

fn env_spec(pool: &str) -> EnvSpec {
    EnvSpec {
        env: "test".into(),
        cluster: "test-1".into(),
        version: "1.12.0".into(),
        schedule: "0 2 1 * *".into(),
        selector: format!("{POOL_LABEL}={pool}"),
        soak: "0s".into(),
    }
}

fn kib(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn agent_figures() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;

    // --- Push to reconcile, 50 pushes.
    let ns = TestNamespace::create(&client, "latency").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let repo = ConfigRepo::new(&[env_spec(ns.name())]);
    // Outside the window: each pass judges and applies the commit, no node moves.
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(2, 12, 0)));
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "latency-agent");
    // Long poll and tick: only the webhook can explain a fast reaction.
    cfg.poll = Duration::from_secs(600);
    cfg.tick = Duration::from_secs(600);
    // The 50 pushes follow each other back to back: the minimum interval
    // between webhook fetches would measure itself. It has its own figure.
    cfg.webhook_min_interval = Duration::ZERO;
    let agent = RunningAgent::start(cfg, clock, None);
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "first config applied",
        |s| s.last_applied_commit.is_some() && s.state.is_some(),
    )
    .await;
    let mut lat = Vec::new();
    for i in 0..50 {
        let commit = repo.bump("test", &format!("1.12.{}", i + 1), true);
        let mut rx = agent.handle.subscribe();
        let t0 = Instant::now();
        assert_eq!(agent.webhook().await, 202);
        let rec = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match rx.recv().await {
                    Ok(p) if p.head.as_deref() == Some(commit.as_str()) => return p,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await
        .expect("no pass for the pushed commit");
        assert_eq!(rec.applied.as_deref(), Some(commit.as_str()), "{rec:?}");
        lat.push(rec.started.saturating_duration_since(t0));
    }
    agent.stop();
    sim.shutdown().await;
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    let (p50, p99, max) = (pct(0.50), pct(0.99), lat[lat.len() - 1]);
    println!("FIGURE webhook_to_reconcile n=50 p50={p50:?} p99={p99:?} max={max:?}");

    // --- Resident memory of a `drover agent` process with 1,000 nodes registered.
    let ns = TestNamespace::create(&client, "memory").await;
    // DROVER_FIGURE_NODES: another cluster size, to separate fixed and per-node cost.
    let n: usize = std::env::var("DROVER_FIGURE_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut opts = pool_options(ns.name(), n);
    // Registered and Ready; heartbeats rare so the simulator does not load the machine.
    opts.lease_interval = Duration::from_secs(600);
    opts.status_interval = Duration::from_secs(600);
    let t0 = Instant::now();
    let sim = start_sim(&client, opts).await;
    println!("registered {n} nodes in {:?}", t0.elapsed());
    let repo = ConfigRepo::new(&[env_spec(ns.name())]);
    let port = support::git::free_port();
    let logs = repo.dir.path().join("agent.log");
    // DROVER_AGENT_BIN measures another build (the release binary the image ships).
    let bin =
        std::env::var("DROVER_AGENT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_drover").into());
    // Cargo puts a profile's binaries in target/<profile>/.
    let profile = std::path::Path::new(&bin)
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string();
    let mut child = agent_process(
        &bin,
        &repo,
        &repo.url(),
        ns.name(),
        &format!("127.0.0.1:{port}"),
        &logs,
    )
    .env("DROVER_CLOCK_OFFSET", "-30d")
    .spawn()
    .unwrap();
    let pid = child.id().unwrap();
    let all = format!("{n}/{n}");
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "every node observed",
        |s| s.at_version.as_deref() == Some(all.as_str()),
    )
    .await;
    assert_eq!(st.status.unwrap().state.as_deref(), Some("confirmed"));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(http(addr, "GET", "/readyz", &[], "").await.0, 200);
    let (_, metrics) = http(addr, "GET", "/metrics", &[], "").await;
    assert_eq!(
        sample(&metrics, r#"drover_nodes{version="1.12.0",state="ready"}"#),
        Some(n as f64),
        "{metrics}"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let (rss, hwm, anon) = (
        kib(&status, "VmRSS:"),
        kib(&status, "VmHWM:"),
        kib(&status, "RssAnon:"),
    );
    println!(
        "FIGURE agent_memory nodes={n} VmRSS={:.1}MiB VmHWM={:.1}MiB RssAnon={:.1}MiB binary={}",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        anon as f64 / 1024.0,
        profile
    );
    // JSON logs: every line logged inside a reconcile carries its env, cluster and commit.
    let text = std::fs::read_to_string(&logs).unwrap();
    let (mut inside, mut with_commit) = (0, 0);
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let Some(spans) = v["spans"].as_array() else {
            continue;
        };
        let Some(rec) = spans.iter().find(|s| s["name"] == "reconcile") else {
            continue;
        };
        inside += 1;
        assert_eq!(rec["env"].as_str(), Some("test"), "{line}");
        assert_eq!(rec["cluster"].as_str(), Some("test-1"), "{line}");
        // Before the first fetch there is no commit to carry (the head is
        // empty too: "no trusted config fetched yet"); after it, always one.
        let fetched = rec["head"].as_str().is_some_and(|h| !h.is_empty());
        with_commit += usize::from(fetched);
        assert!(
            !fetched || rec["commit"].as_str().is_some_and(|c| !c.is_empty()),
            "{line}"
        );
    }
    assert!(inside > 0, "no line logged inside a reconcile:\n{text}");
    assert!(
        with_commit > 0,
        "no line logged inside a reconcile after a fetch:\n{text}"
    );
    println!(
        "memory detail: {}",
        status
            .lines()
            .filter(|l| l.starts_with("Rss") || l.starts_with("Threads"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // SIGTERM: graceful exit.
    sigterm(pid);
    let code = child.wait().await.unwrap();
    assert!(code.success(), "exit after SIGTERM: {code}");
    sim.shutdown().await;

    assert!(
        p99 < Duration::from_secs(1),
        "webhook to reconcile p99 {p99:?}"
    );
    if profile == "debug" {
        // A debug binary maps ~40 MiB of unoptimised code; its own memory
        // (heap and stacks) is what is bounded.
        assert!(
            anon < 16 * 1024,
            "anonymous resident memory {anon} KiB with {n} nodes"
        );
    } else {
        // Optimised builds (release, and dist, which the image ships) meet the goal.
        assert!(
            hwm < 32 * 1024,
            "peak resident memory {hwm} KiB with {n} nodes (goal: under 32 MiB)"
        );
    }
}

/// A benchmark binary (`harness = false`): each figure runs once, in order,
/// and panics (non-zero exit) when its goal is missed.
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(agent_figures());
}
