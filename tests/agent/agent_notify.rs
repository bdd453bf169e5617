//! Notifications (CloudEvents over HTTP, src/agent/notify.rs) against the
//! real API server: a receiver on loopback that checks each request's
//! HMAC signature and notes when it arrived.
//!
//! - Every kind, made by the Events the agent publishes (one place), reaches
//!   the receiver, signed; 1,000 of them give the delivery latency's p99
//!   with the receiver up (BENCHMARKS.md, "Notifications").
//! - An agent's rollout notifies `available`, `started` and `confirmed`,
//!   with the receiver up and then across a 30 s outage (refused
//!   connections): nothing is lost, each arrives within the outage plus the
//!   10 s backoff cap.
//! - The control loop does not wait on a receiver: a node's failure turns
//!   the rollout `failed` as fast with a receiver that accepts and never
//!   answers as with one that answers (both measured).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::kube::{setup, ControlPlane, TestNamespace};
use crate::support::kubelet::Fault;
use crate::support::notify::{config, receiver, Got};
use crate::support::proxy::{Mode, TcpProxy};
use drover::agent::notify::{self, Kind};
use drover::rollout::VirtualClock;

/// Seconds from each event's time to its arrival.
fn latencies(got: &[Got]) -> Vec<f64> {
    let mut l: Vec<f64> = got
        .iter()
        .map(|(e, at, _)| {
            let made: chrono::DateTime<chrono::Utc> = e.time.parse().unwrap();
            (*at - made).num_microseconds().unwrap() as f64 / 1e6
        })
        .collect();
    l.sort_by(f64::total_cmp);
    l
}

fn p99(sorted: &[f64]) -> f64 {
    sorted[((sorted.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)]
}

#[tokio::test]
async fn every_kind_reaches_a_receiver_signed_and_the_p99_is_far_below_30s() {
    use drover::agent::events::{Events, Severity};
    let (client, ns) = setup("notify-kinds").await;
    let (addr, got) = receiver().await;
    let counters = notify::Counters::default();
    let n = notify::Notifier::new(
        config(format!("http://{addr}/hook")),
        "test",
        "test-1",
        counters.clone(),
    );
    let (_stop, stop) = tokio::sync::watch::channel(false);
    n.start(stop.clone());
    let mut events = Events::new(Some(client), "agent-0", ns.name(), "test-test-1");
    events.start(stop, Duration::from_secs(10));
    events.notify_with(n);
    // The Events the agent publishes for each kind.
    for (reason, sev) in [
        ("Applied", Severity::Normal),
        ("RolloutRolling", Severity::Normal),
        ("RolloutBlocked", Severity::Warning),
        ("RolloutHalted", Severity::Warning),
        ("RolloutRevoked", Severity::Warning),
        ("Confirmed", Severity::Normal),
    ] {
        events
            .on_status(sev, reason, "Reconcile", format!("{reason} note"))
            .await;
    }
    events
        .on_node(
            "n-1",
            Severity::Warning,
            "RolledBack",
            "RolledBack",
            "rolled back".into(),
        )
        .await;
    // Control: an Event that is no notification makes none.
    events
        .on_status(Severity::Normal, "WindowOpened", "Window", "open".into())
        .await;
    got.until(Duration::from_secs(30), "every kind", |k| k.len() >= 7)
        .await;
    let mut kinds = got.kinds();
    kinds.sort();
    let mut want: Vec<String> = Kind::ALL.iter().map(|k| k.event_type()).collect();
    want.sort();
    assert_eq!(kinds, want);
    let all = got.all();
    assert!(
        all.iter().all(|(_, _, signed)| *signed),
        "every request signed"
    );
    let (e, _, _) = all
        .iter()
        .find(|(e, _, _)| e.kind.ends_with("rolled-back"))
        .unwrap();
    assert_eq!(
        (
            e.specversion.as_str(),
            e.source.as_str(),
            e.subject.as_str(),
            e.data.message.as_str()
        ),
        ("1.0", "drover/test/test-1", "n-1", "rolled back")
    );
    // 1,000 more, with the receiver up: the delivery latency.
    let n = notify::Notifier::new(
        config(format!("http://{addr}/hook")),
        "test",
        "test-1",
        counters.clone(),
    );
    let (_stop2, stop2) = tokio::sync::watch::channel(false);
    n.start(stop2);
    for i in 0..1000 {
        n.notify_event("RolloutRolling", "test-test-1", &format!("n {i}"));
    }
    got.until(Duration::from_secs(60), "1,000 delivered", |k| {
        k.len() >= 1007
    })
    .await;
    let l = latencies(&got.all()[7..]);
    let p = p99(&l);
    eprintln!(
        "notify: 1000 delivered with the receiver up: p50 {:.4}s p99 {:.4}s max {:.4}s",
        l[l.len() / 2],
        p,
        l[l.len() - 1]
    );
    assert!(p <= 30.0, "p99 {p}s");
}

#[tokio::test]
async fn a_rollout_notifies_and_nothing_is_lost_across_a_30s_outage() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "notify-outage").await;
    let pool = ns.name().to_string();
    let sim = start_sim(&client, pool_options(&pool, 2)).await;
    let (addr, got) = receiver().await;
    let front = TcpProxy::start(addr).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(&pool)]);
    let mut cfg = agent_config(&repo, "test", "test-1", &pool, "notify-agent");
    cfg.notify = config(format!("http://{}/hook", front.addr));
    let clock = VirtualClock::new(dec(1, 2, 30));
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    // Adopted at the pinned version, and its confirmation pushed.
    got.until(Duration::from_secs(60), "adoption", |k| {
        k.iter().any(|t| t.ends_with(".available")) && k.iter().any(|t| t.ends_with(".confirmed"))
    })
    .await;
    // A rollout with the receiver up.
    let before = got.all().len();
    repo.bump("test", "1.12.1", true);
    agent.handle.fetch();
    got.until(Duration::from_secs(90), "1.12.1's rollout", |k| {
        let k = &k[before..];
        ["available", "started", "confirmed"]
            .iter()
            .all(|w| k.iter().any(|t| t.ends_with(&format!(".{w}"))))
    })
    .await;
    let up = latencies(&got.all()[before..]);
    // The receiver goes away for 30 s: the next rollout happens meanwhile.
    let before = got.all().len();
    front.set(Mode::Refuse);
    let outage = Instant::now();
    repo.bump("test", "1.12.2", true);
    agent.handle.fetch();
    await_status(&client, &pool, "test-test-1", "1.12.2 confirmed", |s| {
        s.target.as_deref() == Some("1.12.2") && s.state.as_deref() == Some("confirmed")
    })
    .await;
    assert_eq!(
        got.all().len(),
        before,
        "nothing arrives while the receiver is down"
    );
    let rest = Duration::from_secs(30).saturating_sub(outage.elapsed());
    tokio::time::sleep(rest).await; // the outage itself: 30 s of refused connections
    front.set(Mode::Up);
    got.until(
        Duration::from_secs(30),
        "everything queued, after the outage",
        |k| {
            let k = &k[before..];
            ["available", "started", "confirmed"]
                .iter()
                .all(|w| k.iter().any(|t| t.ends_with(&format!(".{w}"))))
        },
    )
    .await;
    let after = got.all()[before..].to_vec();
    assert!(after.iter().all(|(_, _, s)| *s));
    let across = latencies(&after);
    let metrics = agent.metrics().await;
    let dropped: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("drover_notifications_dropped_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(dropped, 0.0, "nothing dropped:\n{metrics}");
    eprintln!(
        "notify: agent rollout, receiver up: {} events, max {:.3}s; across a 30s outage: {} events, max {:.3}s",
        up.len(),
        up[up.len() - 1],
        across.len(),
        across[across.len() - 1]
    );
    assert!(up[up.len() - 1] <= 30.0, "{up:?}");
    // Made during the outage: delivered within it plus the backoff's cap.
    assert!(across[across.len() - 1] <= 30.0 + 10.0 + 5.0, "{across:?}");
    agent.stop();
    sim.shutdown().await;
}

/// Seconds from a node's driver failing to the rollout being `failed`, with
/// notifications sent to `receiver`.
async fn failure_seconds(name: &str, receiver: SocketAddr, stall: bool) -> f64 {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, name).await;
    let pool = ns.name().to_string();
    let sim = start_sim(&client, pool_options(&pool, 1)).await;
    let node = sim.node_names().remove(0);
    let front = TcpProxy::start(receiver).await;
    if stall {
        front.set(Mode::Stall);
    }
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(&pool)]);
    let mut cfg = agent_config(&repo, "test", "test-1", &pool, &format!("{name}-agent"));
    cfg.notify = notify::Config {
        // The default timeout: a hanging receiver holds each request 10 s.
        timeout: Duration::from_secs(10),
        ..config(format!("http://{}/hook", front.addr))
    };
    let clock = VirtualClock::new(dec(1, 2, 30));
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    await_status(&client, &pool, "test-test-1", "confirmed", |s| {
        s.state.as_deref() == Some("confirmed")
    })
    .await;
    sim.set_fault(&node, Fault::JobFails);
    let start = Instant::now();
    repo.bump("test", "1.13.0", true);
    agent.handle.fetch();
    await_status(&client, &pool, "test-test-1", "failed", |s| {
        s.state.as_deref() == Some("failed")
    })
    .await;
    let took = start.elapsed().as_secs_f64();
    if stall {
        assert!(front.accepted() > 0, "the hanging receiver was reached");
    }
    agent.stop();
    sim.shutdown().await;
    took
}

#[tokio::test]
async fn the_control_loop_never_waits_for_a_hanging_receiver() {
    let (addr, _got) = receiver().await;
    let answering = failure_seconds("notify-up", addr, false).await;
    let hanging = failure_seconds("notify-hang", addr, true).await;
    eprintln!("notify: bump to failed: {answering:.2}s with the receiver up, {hanging:.2}s with it hanging");
    // Each notification to the hanging one waits 10 s; the loop does not.
    assert!(
        hanging <= answering + 3.0,
        "hanging {hanging:.2}s against {answering:.2}s"
    );
}
