//! The agent at the seams with the cluster, against the real API server,
//! simulated kubelets and a real git server:
//! - a setting of the config that reaches the cluster view is never left
//!   behind in a cached view: `node_timeout` raised mid-rollout is the next
//!   upgrade Job's `activeDeadlineSeconds` (the Job already running keeps
//!   the old one: the control);
//! - a node held by a fault of its own (an eviction answering 403) is named
//!   in a `NodeHeld` Event and in the status while the other node upgrades,
//!   and is given back at its drain timeout.

use std::sync::Arc;

use crate::support::agent::*;
use crate::support::backend::{await_node_record, pool_options, start_sim, POOL_LABEL};
use crate::support::kube::{
    await_pdb, await_pod, create, events_for, pdb_min_available, pdb_settled,
    pod_in_a_terminating_namespace, pod_on, pod_running_ready, unschedulable, ControlPlane,
    TestNamespace, WAIT,
};
use drover::agent::OffsetClock;
use drover::cluster::ProgressState;
use drover::kubernetes::objects::NODE_LABEL;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;

/// The environment file of the test pool `ns`, with its rollout settings.
fn env_text(ns: &str, version: &str, max: u32, drain: &str, node_timeout: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
         [rollout]\nmax_unavailable = {max}\ndrain_timeout = \"{drain}\"\nnode_timeout = \"{node_timeout}\"\n\
         node_selector = \"{POOL_LABEL}={ns}\"\n\n[promotion]\nsoak = \"0s\"\n"
    )
}

/// An agent whose clock runs from Dec 1, 03:00 (inside the pool's window)
/// at the wall clock's pace, so that timeouts fire.
fn start_agent(repo: &ConfigRepo, ns: &TestNamespace) -> RunningAgent {
    let cfg = agent_config(repo, "test", "test-1", ns.name(), "agent-a");
    let offset = dec(1, 3, 0) - chrono::Utc::now();
    RunningAgent::start(cfg, Arc::new(OffsetClock(offset)), None)
}

/// The first upgrade Job for `node` in `ns` that the watch shows from now on.
fn first_job(client: &Client, ns: &str, node: &str) -> tokio::task::JoinHandle<Job> {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    let cfg = watcher::Config::default().labels(&format!("{NODE_LABEL}={node}"));
    tokio::spawn(async move {
        let jobs = watcher(api, cfg).applied_objects();
        futures::pin_mut!(jobs);
        loop {
            if let Some(Ok(j)) = jobs.next().await {
                return j;
            }
        }
    })
}

async fn confirmed_at(client: &Client, ns: &str, version: &'static str) {
    await_status(client, ns, "test-test-1", "confirmed", move |s| {
        s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some(version)
    })
    .await;
}

#[tokio::test]
async fn a_raised_node_timeout_is_the_next_jobs_deadline() {
    let client = ControlPlane::get().admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "held-deadline").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let names = sim.node_names();
    let (first, second) = (names[0].clone(), names[1].clone());
    // The second node's drain waits for its budget, which the test lets go
    // only once the new setting is applied: its Job can only come after.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    create(&pods, &pod_on("web-0", &second, &[("app", "web")], 1)).await;
    await_pod(
        &client,
        ns.name(),
        "web-0",
        "Running and Ready",
        pod_running_ready,
    )
    .await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns.name());
    create(&pdbs, &pdb_min_available("web", "web", json!(1))).await;
    await_pdb(&client, ns.name(), "web", "0 allowed", |p| {
        pdb_settled(p, |s| s.disruptions_allowed == Some(0))
    })
    .await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let agent = start_agent(&repo, &ns);
    confirmed_at(&client, ns.name(), "1.12.0").await;

    let job = first_job(&client, ns.name(), &first);
    repo.set_env_text(
        "test",
        &env_text(ns.name(), "1.13.0", 1, "5m", "10m"),
        "test: 1.13.0",
    );
    assert_eq!(agent.webhook().await, 202);
    let job = tokio::time::timeout(WAIT, job)
        .await
        .expect("first Job")
        .unwrap();
    // Control: the Job of the setting in force when it started.
    assert_eq!(job.spec.unwrap().active_deadline_seconds, Some(600));

    let raised = repo.set_env_text(
        "test",
        &env_text(ns.name(), "1.13.0", 1, "5m", "20m"),
        "test: node_timeout 20m",
    );
    assert_eq!(agent.webhook().await, 202);
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "the raise applied",
        |s| s.last_applied_commit.as_deref() == Some(raised.as_str()),
    )
    .await;
    let job = first_job(&client, ns.name(), &second);
    pdbs.delete("web", &DeleteParams::default()).await.unwrap();
    let job = tokio::time::timeout(WAIT, job)
        .await
        .expect("second Job")
        .unwrap();
    assert_eq!(
        job.spec.unwrap().active_deadline_seconds,
        Some(1200),
        "the next Job carries the raised node_timeout"
    );
    confirmed_at(&client, ns.name(), "1.13.0").await;
    agent.stop();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_node_held_by_a_refused_eviction_is_named_and_given_back() {
    let client = ControlPlane::get().admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "held-event").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let names = sim.node_names();
    let (held, other) = (names[0].clone(), names[1].clone());
    // A pod of a namespace being deleted: its eviction answers 403.
    let _doomed = pod_in_a_terminating_namespace(&client, "held-doomed", &held).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let agent = start_agent(&repo, &ns);
    confirmed_at(&client, ns.name(), "1.12.0").await;

    repo.set_env_text(
        "test",
        &env_text(ns.name(), "1.13.0", 2, "10s", "1m"),
        "test: 1.13.0",
    );
    assert_eq!(agent.webhook().await, 202);
    let named = format!("node {held} held since");
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "the held node named",
        |s| s.message.starts_with(&named),
    )
    .await;
    let message = st.status.unwrap().message;
    assert!(
        message.contains("being terminated (403 Forbidden)"),
        "{message}"
    );
    let events = events_for(&client, "default", &held).await;
    let event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("NodeHeld"))
        .unwrap_or_else(|| panic!("a NodeHeld Event on {held}: {events:#?}"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event.note.as_deref().unwrap_or("").contains("evict pod"),
        "{event:?}"
    );
    // The other node upgrades meanwhile; the held one is given back at its
    // drain timeout, blocked, naming the refusal.
    await_node_record(
        &client,
        ns.name(),
        &other,
        "upgraded and in service",
        |n, p| !unschedulable(n) && p.is_none() && sim.version(&other).as_deref() == Some("1.13.0"),
    )
    .await;
    let (_, p) = await_node_record(&client, ns.name(), &held, "given back, blocked", |n, p| {
        !unschedulable(n) && p.is_some_and(|p| p.state == ProgressState::Blocked)
    })
    .await;
    let p = p.unwrap();
    assert!(p.message.contains("held: evict pod"), "{}", p.message);
    assert_eq!(sim.upgrades_started(&held), 0);
    // Control: no Event names the node that was never held.
    assert!(events_for(&client, "default", &other)
        .await
        .iter()
        .all(|e| e.reason.as_deref() != Some("NodeHeld")));
    agent.stop();
    sim.shutdown().await;
}
