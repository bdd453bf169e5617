//! The figure in BENCHMARKS.md (## Health: time to halt), measured against
//! the real kube-apiserver with simulated kubelets, a real git server and a
//! real Prometheus (tests/prometheus) scraping an exporter on loopback:
//! the time from a `[[health.prometheus]]` check failing (the moment
//! Prometheus first returns a sample) to the agent's pass that halts the
//! rollout (state `failed`, no new cordon), against a baseline measured in
//! the same run: the spacing of the agent's passes while the node is
//! watched (how often it re-evaluates health).
//!
//! Goal: under 5 s. `DROVER_FIGURE_ROUNDS=N` changes the number of rounds
//! (default 3; each is a fresh rollout).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover::cluster::ProgressState;
use drover::config::{OnUnreachable, PrometheusCheck};
use drover::health::{PrometheusClient, QueryOutcome};
use drover::rollout::{RolloutState, VirtualClock};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use support::agent::*;
use support::backend::{await_node_record, pool_options, progress_of, start_sim, POOL_LABEL};
use support::kube::{ControlPlane, TestNamespace};
use support::prometheus::{Exporter, Prometheus};

const QUERY: &str = "drover_test_value > 0";

fn env_text(version: &str, pool: &str, prom: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
         [rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\n\
         node_selector = \"{POOL_LABEL}={pool}\"\n\n[promotion]\nsoak = \"0s\"\n\n\
         [health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n\n\
         [[health.prometheus]]\nurl = \"{prom}\"\nquery = \"{QUERY}\"\ntimeout = \"2s\"\n"
    )
}

struct Round {
    halt: Duration,
    pass_spacing: Duration,
}

async fn round(i: usize, prom: &Prometheus, exporter: &Exporter) -> Round {
    let client = ControlPlane::get().admin_client().await;
    let ns = TestNamespace::create(&client, &format!("halt-{i}")).await;
    let pool = ns.name().to_string();
    let sim = start_sim(&client, pool_options(&pool, 3)).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    let repo = ConfigRepo::new(&[EnvSpec {
        env: "test".into(),
        cluster: "test-1".into(),
        version: "1.12.0".into(),
        schedule: "0 2 1 * *".into(),
        selector: format!("{POOL_LABEL}={pool}"),
        soak: "0s".into(),
    }]);
    let clock = VirtualClock::new(dec(1, 2, 30));
    let agent = RunningAgent::start(
        agent_config(&repo, "test", "test-1", &pool, &format!("halt-agent-{i}")),
        Arc::new(clock.clone()),
        None,
    );
    await_status(&client, &pool, "test-test-1", "adopted", |s| {
        s.state.as_deref() == Some("confirmed") && s.last_applied_commit.is_some()
    })
    .await;
    // Start from a clear check (the previous round left it firing).
    exporter.set(0.0);
    let check = PrometheusCheck {
        url: prom.url().to_string(),
        query: QUERY.into(),
        timeout: Duration::from_secs(2),
        on_unreachable: OnUnreachable::Hold,
    };
    let prom_client = PrometheusClient::new().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(prom_client.evaluate(&check).await, QueryOutcome::Clear) {
        assert!(Instant::now() < deadline, "Prometheus never saw the clear");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    repo.set_env_text(
        "test",
        &env_text("1.13.0", &pool, prom.url()),
        "test: 1.13.0",
    );
    agent.handle.fetch();
    await_node_record(&client, &pool, &nodes[0], "watching", |_, p| {
        p.is_some_and(|p| p.state == ProgressState::Watching)
    })
    .await;

    // Baseline: how often the agent passes while the node is watched.
    let mut rx = agent.handle.subscribe();
    let mut starts = Vec::new();
    while starts.len() < 6 {
        if let Ok(p) = rx.recv().await {
            starts.push(p.started);
        }
    }
    let mut gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    let pass_spacing = gaps[gaps.len() / 2];

    // The check fails the moment Prometheus returns a sample.
    exporter.set(1.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(
        prom_client.evaluate(&check).await,
        QueryOutcome::Firing { .. }
    ) {
        assert!(Instant::now() < deadline, "Prometheus never saw the flip");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let failing = Instant::now();
    let mut rx = agent.handle.subscribe();
    loop {
        match rx.recv().await {
            Ok(p) if p.state == Some(RolloutState::Failed) => break,
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let halt = failing.elapsed();

    // The halt is real: the watched node is failed, no other node moves.
    let mut passes = 0;
    until_pass(
        &agent.handle,
        "passes after the halt",
        Duration::from_secs(60),
        || {
            passes += 1;
            passes > 3
        },
    )
    .await;
    let listed = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={pool}")))
        .await
        .unwrap()
        .items;
    for n in &listed {
        let p = progress_of(&client, &pool, &n.name_any()).await;
        if n.name_any() == nodes[0] {
            assert_eq!(p.map(|p| p.state), Some(ProgressState::Failed));
        } else {
            assert!(p.is_none(), "{} moved after the halt", n.name_any());
        }
    }
    agent.stop();
    sim.shutdown().await;
    Round { halt, pass_spacing }
}

async fn health_halt() {
    install_crd(&ControlPlane::get().admin_client().await).await;
    let exporter = Exporter::start(0.0).await;
    let prom = Prometheus::start(exporter.addr()).expect("prometheus starts");
    let rounds: usize = std::env::var("DROVER_FIGURE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mut results = Vec::new();
    for i in 0..rounds {
        let r = round(i, &prom, &exporter).await;
        println!(
            "round {i}: failing check -> halt {:.0} ms; pass spacing while watched {:.0} ms",
            r.halt.as_secs_f64() * 1e3,
            r.pass_spacing.as_secs_f64() * 1e3
        );
        results.push(r);
    }
    let mut halts: Vec<Duration> = results.iter().map(|r| r.halt).collect();
    halts.sort();
    let mut spacing: Vec<Duration> = results.iter().map(|r| r.pass_spacing).collect();
    spacing.sort();
    let (median, worst, base) = (
        halts[halts.len() / 2],
        halts[halts.len() - 1],
        spacing[spacing.len() / 2],
    );
    println!(
        "FIGURE health_halt rounds={rounds} median={:.0}ms worst={:.0}ms pass_spacing={:.0}ms ratio={:.2}",
        median.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3,
        base.as_secs_f64() * 1e3,
        median.as_secs_f64() / base.as_secs_f64()
    );
    assert!(
        worst < Duration::from_secs(5),
        "halt took {worst:?} (goal: under 5 s)"
    );
}

/// A benchmark binary (`harness = false`): panics (non-zero exit) when the goal is missed.
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(health_halt());
}
