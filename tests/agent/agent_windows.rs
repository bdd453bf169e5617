//! Windows, freezes, pause and honest states, with the agent against a real
//! kube-apiserver, simulated kubelet nodes and a real git server: a budget
//! that never allows an eviction is named everywhere and the blocked node
//! waits out its backoff; an agent outside its window is `pending`; a freeze
//! holds a started rollout; `paused = true` stops new starts at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{await_node_record, nodes_in, progress_of, progresses};
use crate::support::backend::{pool_options, start_sim, POOL_LABEL};
use crate::support::kube::{
    await_node, await_pdb, await_pod, create, pdb_min_available, pdb_settled, pod_on,
    pod_running_ready, ControlPlane, TestNamespace,
};
use crate::support::kube::{events_for, unschedulable};
use drover::cluster::ProgressState;
use drover::rollout::VirtualClock;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::json;

const STEP: Duration = Duration::from_secs(90);

fn env_text(version: &str, pool: &str, extra: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
         {extra}\n\
         [rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\n\
         node_selector = \"{POOL_LABEL}={pool}\"\n\n[promotion]\nsoak = \"0s\"\n"
    )
}

fn spec(pool: &str) -> EnvSpec {
    EnvSpec {
        env: "test".into(),
        cluster: "test-1".into(),
        version: "1.12.0".into(),
        schedule: "0 2 1 * *".into(),
        selector: format!("{POOL_LABEL}={pool}"),
        soak: "0s".into(),
    }
}

/// The Events of `name` (a node in `default`, or the status object in
/// the agent's namespace) once one has `reason`, checked after each agent
/// pass (Events are published within the pass that causes them).
async fn await_event(
    agent: &RunningAgent,
    client: &Client,
    (ns, name): (&str, &str),
    reason: &str,
) -> Vec<Event> {
    let mut rx = agent.handle.subscribe();
    let run = async {
        loop {
            let evs = events_for(client, ns, name).await;
            if evs.iter().any(|e| e.reason.as_deref() == Some(reason)) {
                return evs;
            }
            let _ = rx.recv().await;
        }
    };
    tokio::time::timeout(STEP, run)
        .await
        .unwrap_or_else(|_| panic!("no {reason} Event on {ns}/{name}"))
}

/// The status object's Event `reason` (once it is published) says `head`
/// first: its state and blocker.
async fn assert_state_event(
    agent: &RunningAgent,
    client: &Client,
    pool: &str,
    reason: &str,
    head: &str,
) {
    let evs = await_event(agent, client, (pool, "test-test-1"), reason).await;
    let notes: Vec<&str> = evs
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note.as_deref())
        .collect();
    assert!(
        notes.iter().any(|n| n.starts_with(head)),
        "{reason}: {notes:?}"
    );
}

/// Wait until the agent adopted its pool at the first config's 1.12.0 (its
/// nodes already run it), the trusted state later bumps are judged from.
async fn adopted(client: &Client, pool: &str) {
    await_adopted(client, pool, "test-test-1").await;
}

#[tokio::test]
async fn a_budget_that_never_allows_eviction_is_named_everywhere_and_the_node_waits() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "win-pdb").await;
    let pool = ns.name().to_string();
    let sim = start_sim(&client, pool_options(&pool, 1)).await;
    let node = sim.node_names()[0].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pool);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &pool);
    create(&pods, &pod_on("web-0", &node, &[("app", "web")], 1)).await;
    await_pod(
        &client,
        &pool,
        "web-0",
        "Running and Ready",
        pod_running_ready,
    )
    .await;
    create(&pdbs, &pdb_min_available("web", "web", json!(1))).await;
    await_pdb(&client, &pool, "web", "0 allowed", |p| {
        pdb_settled(p, |s| s.disruptions_allowed == Some(0))
    })
    .await;

    let repo = ConfigRepo::new(&[spec(&pool)]);
    // An hour before the window: the agent adopts the pool at its pinned
    // 1.12.0, then a bump makes it report pending, naming the window.
    let clock = VirtualClock::new(dec(1, 1, 0));
    let (notify, notified) = crate::support::notify::notified().await;
    let mut cfg = agent_config(&repo, "test", "test-1", &pool, "agent-pdb");
    cfg.notify = notify;
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    adopted(&client, &pool).await;
    repo.set_env_text(
        "test",
        &env_text("1.13.0", &pool, ""),
        "test: move to 1.13.0",
    );
    agent.handle.fetch();
    let pending = await_status(&client, &pool, "test-test-1", "pending", |s| {
        s.state.as_deref() == Some("pending")
    })
    .await;
    let msg = pending.status.unwrap().message;
    assert!(msg.contains("2026-12-01T02:00:00Z"), "{msg}");
    assert_eq!(
        crate::agent_conditions::blocker_shown(&pool, "test-test-1"),
        ("window".into(), "True".into(), "window".into())
    );
    until_pass(&agent.handle, "pending report pushed", STEP, || {
        repo.report("test", "test-1").is_some_and(|r| {
            r.state.as_str() == "pending"
                && r.message.contains("02:00:00Z")
                && r.detail.blocker.as_deref() == Some("window")
        })
    })
    .await;
    assert!(
        !unschedulable(&sim_node(&client, &node).await),
        "nothing starts outside the window"
    );
    // The Event of the state names its blocker, the word the status shows.
    assert_state_event(
        &agent,
        &client,
        &pool,
        "RolloutPending",
        "pending (window) ",
    )
    .await;

    // The window opens: the drain meets the budget. Pacing is a Normal fact.
    clock.set(dec(1, 2, 0));
    let pdb = format!("{pool}/web");
    let pod = format!("{pool}/web-0");
    await_node_record(
        &client,
        &pool,
        &node,
        "draining, refusal recorded",
        |_, p| {
            p.is_some_and(|p| {
                p.state == ProgressState::Draining
                    && p.message.contains(&pdb)
                    && p.message.contains(&pod)
            })
        },
    )
    .await;
    let evs = await_event(&agent, &client, ("default", &node), "EvictionRefused").await;
    let refused: Vec<&Event> = evs
        .iter()
        .filter(|e| e.reason.as_deref() == Some("EvictionRefused"))
        .collect();
    assert!(!refused.is_empty(), "{evs:?}");
    assert!(
        refused.iter().all(|e| e.type_.as_deref() == Some("Normal")),
        "{refused:?}"
    );
    assert!(
        !evs.iter().any(|e| e.type_.as_deref() == Some("Warning")),
        "no Warning while a budget merely paces: {evs:?}"
    );

    // drain_timeout (5m) passes: given back, named in every place.
    clock.set(dec(1, 2, 6));
    let (_, p) = await_node_record(&client, &pool, &node, "given back blocked", |n, p| {
        !unschedulable(n) && p.is_some_and(|p| p.state == ProgressState::Blocked)
    })
    .await;
    let p = p.unwrap();
    assert!(
        p.message.contains(&pdb) && p.message.contains(&pod),
        "{}",
        p.message
    );
    assert!(p.message.contains("since"), "{}", p.message);
    let status = await_status(&client, &pool, "test-test-1", "blocked", |s| {
        s.state.as_deref() == Some("blocked")
    })
    .await
    .status
    .unwrap();
    notified.kind(Duration::from_secs(30), "blocked").await;
    assert_state_event(&agent, &client, &pool, "RolloutBlocked", "blocked (pdb) ").await;
    // The notification says what the Event says (the agent was blocked
    // once before, by `source`, until its first fetch).
    let blocked: Vec<String> = notified
        .all()
        .into_iter()
        .filter(|(e, _, _)| e.kind.ends_with(".blocked"))
        .map(|(e, _, _)| e.data.message)
        .collect();
    assert!(
        blocked.iter().any(|m| m.starts_with("blocked (pdb) ")),
        "{blocked:?}"
    );
    assert!(
        status.message.contains(&pdb) && status.message.contains(&pod),
        "{}",
        status.message
    );
    assert!(
        status.message.contains("blocked since 2026-12-01T02:06"),
        "{}",
        status.message
    );
    assert!(
        status.message.contains("next try after 2026-12-01T02:11"),
        "{}",
        status.message
    );
    until_pass(&agent.handle, "blocked report pushed", STEP, || {
        repo.report("test", "test-1")
            .is_some_and(|r| r.state.as_str() == "blocked" && r.message.contains(&pdb))
    })
    .await;
    let evs = await_event(&agent, &client, ("default", &node), "DrainBlocked").await;
    assert!(
        evs.iter()
            .any(|e| e.reason.as_deref() == Some("DrainBlocked")
                && e.type_.as_deref() == Some("Warning")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains(&pdb) && n.contains(&pod))),
        "{evs:?}"
    );
    let metrics = agent.metrics().await;
    assert_eq!(
        sample(&metrics, r#"drover_rollout_state{state="blocked"}"#),
        Some(1.0),
        "{metrics}"
    );

    // Nothing else to do, yet the node is not unschedulable again before its backoff.
    let mut passes = 0;
    until_pass(&agent.handle, "several passes", STEP, || {
        passes += 1;
        passes > 6
    })
    .await;
    let waiting = sim_node(&client, &node).await;
    assert!(
        !unschedulable(&waiting),
        "re-unschedulable before the backoff"
    );
    assert_eq!(
        progress_of(&client, &pool, &node).await.unwrap().state,
        ProgressState::Blocked
    );
    // Control: once the backoff has passed, it is tried again.
    clock.set(dec(1, 2, 12));
    let (_, retried) = await_node_record(&client, &pool, &node, "retried", |n, p| {
        unschedulable(n) && p.is_some_and(|p| p.state == ProgressState::Draining)
    })
    .await;
    assert_eq!(retried.unwrap().retries, 1);
    agent.stop();
    sim.shutdown().await;
}

async fn sim_node(client: &Client, name: &str) -> Node {
    Api::<Node>::all(client.clone()).get(name).await.unwrap()
}

#[tokio::test]
async fn a_freeze_holds_a_started_rollout_minor_lets_patches_through_and_pause_is_prompt() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "win-freeze").await;
    let pool = ns.name().to_string();
    let sim = start_sim(&client, pool_options(&pool, 3)).await;
    let repo = ConfigRepo::new(&[spec(&pool)]);
    // An `all` freeze from 02:32 to 04:00 inside the window (02:00-08:00),
    // so the node started at 02:30 is in flight (within its 5m drain) when it begins,
    // and a `minor` freeze from 05:00 to 06:00.
    let freezes = "[[freeze]]\nstart = 2026-12-01T02:32:00\nend = 2026-12-01T04:00:00\nreason = \"payments cutover\"\n\n\
                   [[freeze]]\nstart = 2026-12-01T05:00:00\nend = 2026-12-01T06:00:00\nscope = \"minor\"\nreason = \"holiday\"\n";
    let clock = VirtualClock::new(dec(1, 2, 30));
    let agent = RunningAgent::start(
        agent_config(&repo, "test", "test-1", &pool, "agent-freeze"),
        Arc::new(clock.clone()),
        None,
    );
    adopted(&client, &pool).await;
    repo.set_env_text("test", &env_text("1.13.0", &pool, freezes), "test: 1.13.0");
    agent.handle.fetch();
    // The first node starts; the freeze begins while it is in flight.
    let nodes = sim.node_names();
    await_node(&client, &nodes[0], "first node started", unschedulable).await;
    clock.set(dec(1, 2, 32));
    let held = await_status(&client, &pool, "test-test-1", "paused by the freeze", |s| {
        s.state.as_deref() == Some("paused") && s.at_version.as_deref() == Some("1/3")
    })
    .await
    .status
    .unwrap();
    assert!(
        held.message.contains("payments cutover"),
        "{}",
        held.message
    );
    assert_eq!(held.blocker.as_deref(), Some("freeze"));
    assert_eq!(
        crate::agent_conditions::blocker_shown(&pool, "test-test-1"),
        ("freeze".into(), "True".into(), "freeze".into())
    );
    let now_nodes = nodes_in(&client, &pool).await;
    let records = progresses(&client, &pool, &now_nodes).await;
    assert!(
        now_nodes
            .iter()
            .zip(&records)
            .all(|(n, p)| !unschedulable(n) && p.is_none()),
        "the node in flight finished and no other started: {:?}",
        now_nodes
            .iter()
            .map(|n| n.name_any())
            .zip(&records)
            .collect::<Vec<_>>()
    );
    // The freeze ends: the rollout resumes and completes.
    clock.set(dec(1, 4, 0));
    await_status(&client, &pool, "test-test-1", "confirmed 1.13.0", |s| {
        s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some("1.13.0")
    })
    .await;

    // Inside the minor freeze: a patch update goes through...
    clock.set(dec(1, 5, 0));
    repo.set_env_text("test", &env_text("1.13.1", &pool, freezes), "test: 1.13.1");
    agent.webhook().await;
    await_status(&client, &pool, "test-test-1", "patch confirmed", |s| {
        s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some("1.13.1")
    })
    .await;
    // ...and a minor one waits, naming the freeze.
    repo.set_env_text("test", &env_text("1.14.0", &pool, freezes), "test: 1.14.0");
    agent.webhook().await;
    let minor = await_status(&client, &pool, "test-test-1", "minor held", |s| {
        s.state.as_deref() == Some("paused") && s.target.as_deref() == Some("1.14.0")
    })
    .await
    .status
    .unwrap();
    assert!(
        minor.message.contains("holiday") && minor.message.contains("minor"),
        "{}",
        minor.message
    );
    assert!(nodes_in(&client, &pool)
        .await
        .iter()
        .all(|n| !unschedulable(n)));

    // After the minor freeze the minor update starts; pause it mid-rollout.
    clock.set(dec(1, 6, 0));
    await_node(&client, &nodes[0], "1.14.0 started", unschedulable).await;
    let pause = repo.set_env_text(
        "test",
        &env_text("1.14.0", &pool, freezes).replace("[rollout]\n", "[rollout]\npaused = true\n"),
        "test: pause",
    );
    let hooked = Instant::now();
    agent.webhook().await;
    // In force once applied: the node in flight goes on (the state reads
    // rolling until it is done), no new one starts.
    await_status(&client, &pool, "test-test-1", "pause applied", |s| {
        s.last_applied_commit.as_deref() == Some(pause.as_str())
    })
    .await;
    let took = hooked.elapsed();
    eprintln!("pause in force {took:?} after the webhook");
    assert!(
        took < Duration::from_secs(1),
        "pause applied {took:?} after the webhook"
    );
    let paused = await_status(&client, &pool, "test-test-1", "paused", |s| {
        s.state.as_deref() == Some("paused") && s.message.contains("paused = true")
    })
    .await;
    let applied = paused.status.unwrap().last_applied_commit.unwrap();
    // The node in flight finishes; no other starts while paused.
    let mut passes = 0;
    until_pass(
        &agent.handle,
        "node in flight done, several passes",
        STEP,
        || {
            passes += 1;
            passes > 8
        },
    )
    .await;
    let after = nodes_in(&client, &pool).await;
    let records = progresses(&client, &pool, &after).await;
    let started: Vec<String> = after
        .iter()
        .zip(&records)
        .filter(|(n, p)| unschedulable(n) || p.is_some())
        .map(|(n, _)| n.name_any())
        .collect();
    assert!(
        started.iter().all(|n| *n == nodes[0]),
        "started while paused: {started:?}"
    );
    assert_eq!(applied, pause);
    agent.stop();
    sim.shutdown().await;
}
