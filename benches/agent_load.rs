//! The agent's memory and pace under load, measured on a `drover agent`
//! process against the real kube-apiserver and `git daemon` on loopback
//! (figures in BENCHMARKS.md, "Agent under load"):
//!
//! - hostile webhook traffic: 100 connections that keep sending 1 MiB − 1
//!   bodies slowly, while 2,000 valid signed deliveries are replayed.
//!   Goals: peak RSS under 48 MiB, at most one fetch per minimum interval
//!   (5 s). Baseline: the same process idle just before.
//! - a rollout with 1,000 nodes and 50 in flight. Goal: peak RSS under
//!   32 MiB for the binary the image ships (dist profile), 36 MiB for the
//!   release binary (~4 MiB more code pages). Baseline: the same process
//!   idle with the 1,000 nodes observed, just before the bump.
//! - the same with 5,000 nodes and 100 in flight
//!   (`DROVER_FIGURE_NODES=5000 DROVER_FIGURE_IN_FLIGHT=100`). Goal: idle
//!   and peak RSS under 48 MiB (dist; release 52 MiB). A debug binary's own
//!   (anonymous) memory is held to each goal less 16 MiB of code.
//!
//! `cargo bench --bench agent_load` measures the release binary;
//! `DROVER_AGENT_BIN=$PWD/target/dist/drover` the one the image ships;
//! `DROVER_FIGURE_NODES=N` another cluster size for the rollout,
//! `DROVER_FIGURE_IN_FLIGHT=M` another `max_unavailable`,
//! `DROVER_FIGURE_UPGRADED=K` ends the rollout figure once K nodes are at
//! the target (the peak with M in flight is reached in the first batches;
//! a whole 5,000-node rollout takes over an hour on the loaded 2-core
//! machine).

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover::agent::crd::DroverStatus;
use hmac::{Hmac, Mac};
use kube::api::Api;
use kube::runtime::wait::await_condition;
use sha2::Sha256;
use support::agent::*;
use support::backend::{pool_options, start_sim, BudgetWatch, POOL_LABEL};
use support::kube::{ControlPlane, TestNamespace};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HMAC_SECRET: &str = "load-hmac-secret";
const MIN_INTERVAL: Duration = Duration::from_secs(5);

fn env_spec(pool: &str) -> EnvSpec {
    EnvSpec {
        env: "test".into(),
        cluster: "test-1".into(),
        version: "1.12.0".into(),
        // Opens every 6 h for 6 h: always open.
        schedule: "0 */6 * * *".into(),
        selector: format!("{POOL_LABEL}={pool}"),
        soak: "0s".into(),
    }
}

fn kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mib(k: u64) -> f64 {
    k as f64 / 1024.0
}

/// Samples VmRSS of `pid` every 100 ms until stopped; returns the peak (KiB).
fn rss_sampler(pid: u32) -> (Arc<AtomicBool>, tokio::task::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let task = tokio::spawn(async move {
        let mut peak = 0;
        while !s.load(Ordering::Relaxed) {
            peak = peak.max(kib(pid, "VmRSS:"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        peak
    });
    (stop, task)
}

struct Agent {
    child: tokio::process::Child,
    pid: u32,
    http: SocketAddr,
    hook: SocketAddr,
    profile: String,
}

fn start_agent(repo: &ConfigRepo, ns: &str) -> Agent {
    let bin =
        std::env::var("DROVER_AGENT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_drover").into());
    let profile = std::path::Path::new(&bin)
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string();
    let (http, hook) = (support::git::free_port(), support::git::free_port());
    let secret = repo.dir.path().join("hmac-secret");
    std::fs::write(&secret, HMAC_SECRET).unwrap();
    let http: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    let hook: SocketAddr = format!("127.0.0.1:{hook}").parse().unwrap();
    let child = agent_process(
        &bin,
        repo,
        &repo.url(),
        ns,
        &http.to_string(),
        &repo.dir.path().join("agent.log"),
    )
    .env("DROVER_WEBHOOK_SECRET_FILE", &secret)
    .env("DROVER_WEBHOOK_LISTEN", hook.to_string())
    .env("DROVER_POLL_INTERVAL", "10m")
    .env("RUST_LOG", "warn")
    .spawn()
    .unwrap();
    let pid = child.id().unwrap();
    Agent {
        child,
        pid,
        http,
        hook,
        profile,
    }
}

async fn stop_agent(mut a: Agent) {
    sigterm(a.pid);
    let code = a.child.wait().await.unwrap();
    assert!(code.success(), "exit after SIGTERM: {code}");
}

/// Wait (through a watch) up to `within` for the status object to satisfy `cond`.
async fn until_status(
    client: &kube::Client,
    ns: &str,
    what: &str,
    within: Duration,
    cond: impl Fn(&drover::agent::crd::DroverStatusStatus) -> bool,
) {
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns);
    let wait = await_condition(api, "test-test-1", |o: Option<&DroverStatus>| {
        o.and_then(|o| o.status.as_ref()).is_some_and(&cond)
    });
    tokio::time::timeout(within, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out after {within:?} waiting for {what}"))
        .unwrap();
}

async fn fetches(http: SocketAddr) -> f64 {
    let (_, text) = support::agent::http(http, "GET", "/metrics", &[], "").await;
    sample(&text, r#"drover_fetches_total{result="ok"}"#).unwrap_or(0.0)
}

/// One slow attacker: announce 1 MiB − 1 with a plausible signature, send
/// 1 KiB every 200 ms, reconnect when cut off; until `stop`.
async fn slow_body(addr: SocketAddr, stop: Arc<AtomicBool>, cut: Arc<AtomicUsize>) {
    let head = format!(
        "POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nX-Hub-Signature-256: sha256={}\r\n\r\n",
        (1 << 20) - 1,
        "ab".repeat(32)
    );
    let chunk = vec![b'x'; 1024];
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if s.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        while !stop.load(Ordering::Relaxed) {
            if s.write_all(&chunk).await.is_err() {
                break;
            }
            let mut b = [0u8; 1];
            // The server answering (408) or closing ends this connection.
            if let Ok(r) = tokio::time::timeout(Duration::from_millis(200), s.read(&mut b)).await {
                let _ = r;
                break;
            }
        }
        cut.fetch_add(1, Ordering::Relaxed);
    }
}

async fn flood_figure(client: &kube::Client) {
    let ns = TestNamespace::create(client, "load-flood").await;
    let sim = start_sim(client, pool_options(ns.name(), 1)).await;
    let repo = ConfigRepo::new(&[env_spec(ns.name())]);
    let agent = start_agent(&repo, ns.name());
    until_status(
        client,
        ns.name(),
        "initial confirmation",
        Duration::from_secs(120),
        |s| s.state.as_deref() == Some("confirmed"),
    )
    .await;
    let idle_rss = kib(agent.pid, "VmRSS:");
    let idle_hwm = kib(agent.pid, "VmHWM:");
    let f0 = fetches(agent.http).await;
    let (sampling, sampler) = rss_sampler(agent.pid);

    let stop = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicUsize::new(0));
    let attackers: Vec<_> = (0..100)
        .map(|_| tokio::spawn(slow_body(agent.hook, stop.clone(), cut.clone())))
        .collect();
    // 2,000 replays of one valid signed delivery, 20 at a time.
    let body = r#"{"ref":"refs/heads/main"}"#;
    let mut mac = Hmac::<Sha256>::new_from_slice(HMAC_SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let req = Arc::new(format!(
        "POST /webhook HTTP/1.0\r\nX-Hub-Signature-256: {sig}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    let t0 = Instant::now();
    let accepted = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let replayers: Vec<_> = (0..20)
        .map(|_| {
            let (req, accepted, sent, hook) =
                (req.clone(), accepted.clone(), sent.clone(), agent.hook);
            tokio::spawn(async move {
                while sent.fetch_add(1, Ordering::Relaxed) < 2000 {
                    let Ok(mut s) = TcpStream::connect(hook).await else {
                        continue;
                    };
                    if s.write_all(req.as_bytes()).await.is_err() {
                        continue;
                    }
                    let mut out = Vec::new();
                    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
                        .await;
                    if out.starts_with(b"HTTP/1.0 202") || out.starts_with(b"HTTP/1.1 202") {
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for r in replayers {
        r.await.unwrap();
    }
    let replay_time = t0.elapsed();
    // Keep the slow flood on a little longer, then stop it.
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
    // The last queued nudge is answered within one interval.
    tokio::time::sleep(MIN_INTERVAL + Duration::from_secs(2)).await;
    let window = t0.elapsed();
    sampling.store(true, Ordering::Relaxed);
    let peak_rss = sampler.await.unwrap();
    let hwm = kib(agent.pid, "VmHWM:");
    let started = fetches(agent.http).await - f0;
    let allowed = (window.as_secs_f64() / MIN_INTERVAL.as_secs_f64()).ceil() + 1.0;
    println!(
        "FIGURE webhook_flood binary={} replays=2000 accepted={} replay_time={replay_time:.1?} \
         slow_connections=100 slow_cut_off={} window={window:.1?} fetches={started} allowed={allowed} \
         idle_VmRSS={:.1}MiB idle_VmHWM={:.1}MiB peak_VmRSS={:.1}MiB VmHWM={:.1}MiB ratio_to_idle={:.2}",
        agent.profile,
        accepted.load(Ordering::Relaxed),
        cut.load(Ordering::Relaxed),
        mib(idle_rss),
        mib(idle_hwm),
        mib(peak_rss),
        mib(hwm),
        hwm as f64 / idle_hwm.max(1) as f64,
    );
    stop_agent(agent).await;
    sim.shutdown().await;
    // The work done: every replay was answered, none dropped by the flood.
    assert_eq!(
        accepted.load(Ordering::Relaxed),
        2000,
        "replays answered 202 under the flood"
    );
    assert!(started >= 1.0, "the replayed webhooks started no fetch");
    assert!(started <= allowed, "{started} fetches in {window:?}");
    assert!(
        hwm < 48 * 1024,
        "peak RSS {hwm} KiB under the flood (goal: under 48 MiB)"
    );
}

async fn rollout_figure(client: &kube::Client) {
    let n: usize = std::env::var("DROVER_FIGURE_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let in_flight: u32 = std::env::var("DROVER_FIGURE_IN_FLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let ns = TestNamespace::create(client, "load-rollout").await;
    let mut opts = pool_options(ns.name(), n);
    // The control plane is this bench's own and ends with it: deleting
    // thousands of nodes one by one would only add minutes.
    opts.remove_nodes_on_shutdown = false;
    // Registered and Ready; heartbeats rare so the simulator does not load the machine.
    opts.lease_interval = Duration::from_secs(600);
    opts.status_interval = Duration::from_secs(600);
    let t = Instant::now();
    let sim = start_sim(client, opts).await;
    println!("registered {n} nodes in {:?}", t.elapsed());
    let repo = ConfigRepo::new(&[env_spec(ns.name())]);
    let agent = start_agent(&repo, ns.name());
    let all = format!("{n}/{n}");
    until_status(
        client,
        ns.name(),
        "every node observed",
        Duration::from_secs(300),
        |s| {
            s.state.as_deref() == Some("confirmed") && s.at_version.as_deref() == Some(all.as_str())
        },
    )
    .await;
    let idle_hwm = kib(agent.pid, "VmHWM:");
    let idle_anon = kib(agent.pid, "RssAnon:");
    println!(
        "FIGURE idle_memory binary={} nodes={n} VmHWM={:.1}MiB RssAnon={:.1}MiB",
        agent.profile,
        mib(idle_hwm),
        mib(idle_anon)
    );
    let upgraded: u32 = std::env::var("DROVER_FIGURE_UPGRADED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(n as u32);
    let budget = BudgetWatch::start(client, ns.name()).await;
    let (sampling, sampler) = rss_sampler(agent.pid);
    let peak_anon = Arc::new(AtomicU64::new(idle_anon));
    let anon_sampler = {
        let (peak, pid, stop) = (peak_anon.clone(), agent.pid, sampling.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(kib(pid, "RssAnon:"), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    repo.set_max_unavailable(in_flight);
    repo.bump("test", "1.13.0", true);
    let body = "{}";
    let mut mac = Hmac::<Sha256>::new_from_slice(HMAC_SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let t0 = Instant::now();
    let (code, _) = support::agent::http(
        agent.hook,
        "POST",
        "/webhook",
        &[("X-Hub-Signature-256", &sig)],
        body,
    )
    .await;
    assert_eq!(code, 202);
    until_status(
        client,
        ns.name(),
        "rollout finished",
        Duration::from_secs(3600),
        |s| {
            s.target.as_deref() == Some("1.13.0")
                && if upgraded as usize >= n {
                    s.state.as_deref() == Some("confirmed")
                        && s.at_version.as_deref() == Some(all.as_str())
                } else {
                    s.state.as_deref() == Some("rolling") && s.nodes_at_version >= upgraded
                }
        },
    )
    .await;
    let took = t0.elapsed();
    sampling.store(true, Ordering::Relaxed);
    let peak_rss = sampler.await.unwrap();
    anon_sampler.await.unwrap();
    let hwm = kib(agent.pid, "VmHWM:");
    let anon = kib(agent.pid, "RssAnon:");
    let (peak_unavailable, _) = budget.peak();
    let anon_peak = peak_anon.load(Ordering::Relaxed);
    println!(
        "FIGURE rollout_memory binary={} nodes={n} upgraded>={upgraded} max_unavailable={in_flight} peak_unavailable={peak_unavailable} \
         took={took:.0?} idle_VmHWM={:.1}MiB idle_RssAnon={:.1}MiB peak_VmRSS={:.1}MiB VmHWM={:.1}MiB RssAnon_end={:.1}MiB RssAnon_peak={:.1}MiB ratio_to_idle={:.2}",
        agent.profile,
        mib(idle_hwm),
        mib(idle_anon),
        mib(peak_rss),
        mib(hwm),
        mib(anon),
        mib(anon_peak),
        hwm as f64 / idle_hwm.max(1) as f64,
    );
    let profile = agent.profile.clone();
    stop_agent(agent).await;
    sim.shutdown().await;
    assert!(
        peak_unavailable as u32 <= in_flight,
        "{peak_unavailable} in flight"
    );
    // The goal is the shipped binary's (dist: fat LTO): 32 MiB up to 1,000
    // nodes, 48 MiB up to 5,000. The release binary maps ~4 MiB more code
    // (its idle figure is that much higher in the same bench), so it is held
    // to the goal plus that allowance: a regression in what acting costs
    // still fails it. A debug binary maps ~37 MiB of unoptimised code; its
    // own (anonymous) memory is held to the goal less 16 MiB (an optimised
    // binary maps 19 MiB of code), as agent_figures holds it.
    let goal: u64 = if n <= 1000 { 32 } else { 48 };
    let (what, measured, limit) = match profile.as_str() {
        "dist" => ("peak RSS", hwm, goal),
        "release" => ("peak RSS", hwm, goal + 4),
        _ => ("peak anonymous RSS", anon_peak, goal - 16),
    };
    assert!(
        measured < limit * 1024,
        "{what} {measured} KiB during the rollout of {n} nodes ({profile} binary; bound: under {limit} MiB)"
    );
    if profile != "debug" {
        assert!(
            idle_hwm < limit * 1024,
            "idle peak RSS {idle_hwm} KiB with {n} nodes ({profile} binary; bound: under {limit} MiB)"
        );
    }
}

/// A benchmark binary (`harness = false`): each figure runs once, in order
/// (they would compete for the two cores), and panics when its goal is missed.
/// `DROVER_LOAD_FIGURE=flood|rollout` runs one.
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = ControlPlane::get().admin_client().await;
        install_crd(&client).await;
        let which = std::env::var("DROVER_LOAD_FIGURE").unwrap_or_default();
        if which.is_empty() || which == "flood" {
            flood_figure(&client).await;
        }
        if which.is_empty() || which == "rollout" {
            rollout_figure(&client).await;
        }
    });
}
