//! The agent's preflight before a window opens, against the real API
//! server: on a pool with the 50 planted blockers and three consent-held
//! nodes of `support::preflight` it runs an hour before the window
//! (virtual time), off the control loop, and tells what it found as a
//! Warning Event `PreflightBlockers` on the status object, the status's
//! `preflight` summary and `drover_preflight_blockers{kind}`: every planted
//! blocker counted, and the same as `drover plan --preflight` finds on the
//! same cluster with the same environment file, drain rules included (one
//! function, differential); it runs again 15 minutes later. On a healthy
//! pool, whose singleton a `restart` rule moves, it finds nothing
//! (`PreflightClear`, Normal).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::kube::{events_for, ControlPlane, TestNamespace};
use crate::support::preflight::{plant_blockers, plant_healthy, DRAIN_RULES};
use drover::agent::crd::DroverStatusStatus;
use drover::rollout::VirtualClock;

/// `drover plan --preflight -o json` for the environment of `repo`:
/// findings counted by kind, and the nodes read.
fn cli_counts(repo: &ConfigRepo) -> (BTreeMap<String, u32>, u64) {
    let (_, doc) = crate::support::preflight::plan_preflight(&repo.work);
    let mut counts = BTreeMap::new();
    for f in doc["findings"].as_array().unwrap() {
        *counts
            .entry(f["kind"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    (counts, doc["nodes"].as_u64().unwrap())
}

/// The agent's Events `reason` on its status object, once there is one
/// (the publisher is off the loop: awaited over the agent's passes).
async fn await_events(
    agent: &RunningAgent,
    client: &kube::Client,
    ns: &str,
    reason: &str,
) -> Vec<(String, String)> {
    for _ in 0..100 {
        let evs = status_events(client, ns, reason).await;
        if !evs.is_empty() {
            return evs;
        }
        until_pass(&agent.handle, "a pass", Duration::from_secs(30), || true).await;
    }
    panic!("no Event {reason}")
}

/// The agent's Events `reason` on its status object.
async fn status_events(client: &kube::Client, ns: &str, reason: &str) -> Vec<(String, String)> {
    events_for(client, ns, "test-test-1")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// The test pool's environment of namespace `ns`, with the drain rules
/// both preflights judge by.
fn repo_with_rules(ns: &str) -> ConfigRepo {
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns)]);
    repo.set_drain(DRAIN_RULES);
    repo.bump("test", "1.12.0", true);
    repo
}

fn ran_at(s: &DroverStatusStatus, at: &str) -> bool {
    s.preflight.as_ref().is_some_and(|p| p.time == at)
}

#[tokio::test]
async fn the_agent_runs_preflight_an_hour_before_the_window_and_finds_what_plan_preflight_finds() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "agent-preflight").await;
    let sim = start_sim(&client, pool_options(ns.name(), 5)).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    let planted = plant_blockers(&client, ns.name(), &nodes).await;
    assert_eq!(planted.len(), 53);
    let repo = repo_with_rules(ns.name());
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    // The window opens at 02:00 on the 1st; an hour before it.
    let clock = VirtualClock::new(dec(1, 1, 0));
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    let st = await_status(&client, ns.name(), "test-test-1", "the preflight", |s| {
        ran_at(s, "2026-12-01T01:00:00Z")
    })
    .await
    .status
    .unwrap();
    let p = st.preflight.unwrap();
    assert_eq!(p.window.as_deref(), Some("2026-12-01T02:00:00Z"));
    assert_eq!(p.error, None);
    // Every planted blocker, counted by kind; no other.
    let mut want: BTreeMap<String, u32> = BTreeMap::new();
    for (kind, _) in &planted {
        *want.entry(kind.clone()).or_insert(0) += 1;
    }
    assert_eq!(want.get("consent-held"), Some(&3));
    assert_eq!(p.blockers, want);
    assert_eq!(p.nodes, 5);
    // The same as the command on the same cluster.
    let (cli, cli_nodes) = cli_counts(&repo);
    assert_eq!(
        p.blockers, cli,
        "the agent's preflight and plan --preflight differ"
    );
    assert_eq!(u64::from(p.nodes), cli_nodes);
    let warned = await_events(&agent, &client, ns.name(), "PreflightBlockers").await;
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].0, "Warning");
    assert!(
        warned[0].1.contains("53 findings on 5 selected nodes"),
        "{}",
        warned[0].1
    );
    let m = agent.metrics().await;
    for (kind, n) in &want {
        assert_eq!(
            sample(&m, &format!("drover_preflight_blockers{{kind=\"{kind}\"}}")),
            Some(f64::from(*n)),
            "{kind}"
        );
    }
    // Fifteen minutes later, still before the window: again.
    clock.set(dec(1, 1, 15));
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "the second preflight",
        |s| ran_at(s, "2026-12-01T01:15:00Z"),
    )
    .await;
    agent.stop();
    sim.shutdown().await;
}

#[tokio::test]
async fn on_a_healthy_pool_the_agents_preflight_finds_nothing() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "agent-preflight-ok").await;
    let sim = start_sim(&client, pool_options(ns.name(), 3)).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    plant_healthy(&client, ns.name(), &nodes).await;
    let repo = repo_with_rules(ns.name());
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    let clock = VirtualClock::new(dec(1, 1, 30));
    let agent = RunningAgent::start(cfg, Arc::new(clock), None);
    let st = await_status(&client, ns.name(), "test-test-1", "the preflight", |s| {
        s.preflight.is_some()
    })
    .await
    .status
    .unwrap();
    let p = st.preflight.unwrap();
    assert!(p.blockers.is_empty(), "false alarms: {p:?}");
    assert_eq!((p.nodes, p.error), (3, None));
    assert_eq!(cli_counts(&repo), (BTreeMap::new(), 3));
    let clear = await_events(&agent, &client, ns.name(), "PreflightClear").await;
    assert_eq!(clear.len(), 1, "{clear:?}");
    assert_eq!(clear[0].0, "Normal");
    assert!(status_events(&client, ns.name(), "PreflightBlockers")
        .await
        .is_empty());
    agent.stop();
    sim.shutdown().await;
}
