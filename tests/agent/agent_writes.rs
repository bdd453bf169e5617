//! What one node's upgrade costs in API writes, and that the states no
//! longer written on the node (issue 25) still resume after a crash.
//!
//! With `[driver] prepare` (the Bottlerocket driver's default) a node's
//! upgrade writes six times besides its evictions: the prepare Job, the
//! cordon (with the `draining` record and `drover.dev/previous-version`),
//! the upgrade Job, one `deletecollection` of its Jobs, the uncordon (the
//! record cleared) and the `Upgraded` Event. `preparing` and `upgrading`
//! are the Jobs themselves (`drover::cluster::effective`), and the drain's
//! `Draining` is logged, not published. Counted from the API server's
//! audit log by the agent's own User-Agent. Without `prepare`, five: no
//! prepare Job.
//!
//! An agent killed while the node prepares (a prepare Job, no record on the
//! node) or while it upgrades (`draining` on the node, its upgrade Job
//! running) leaves the next leader what it needs: it downloads nothing
//! twice, starts no second run, and finishes the node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{job_run, live_jobs, pool_options, start_sim};
use crate::support::kube::{
    await_node, create, node_ready, os_image, pod_on, retry_until, unschedulable, Audited,
    ControlPlane, TestNamespace,
};
use crate::support::kubelet::Kubelet;
use chrono::{DateTime, Utc};
use drover::cluster::{ANN_CORDONED, ANN_PREVIOUS, ANN_STATE};
use drover::rollout::VirtualClock;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// An agent `id` for cluster `test-1` of the pool in `ns`, in its open
/// window (Dec 1, 03:00), sending `user_agent` so its requests can be told
/// apart in the audit log.
async fn start_agent(repo: &ConfigRepo, ns: &str, id: &str, user_agent: &str) -> RunningAgent {
    let mut config = config_as(None).await;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(user_agent).unwrap(),
    ));
    let mut cfg = agent_config(repo, "test", "test-1", ns, id);
    cfg.poll = Duration::from_secs(600);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    RunningAgent::start_with_config(cfg, clock, config)
}

/// A pool of one node with one pod to evict, its agent's config at
/// 1.12.0 (what the node runs).
async fn one_node(
    prefix: &str,
    reboot: Duration,
    download: Duration,
) -> (Client, TestNamespace, Kubelet, String, ConfigRepo) {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    let mut opts = pool_options(ns.name(), 1);
    opts.reboot = reboot;
    opts.download = download;
    let sim = start_sim(&client, opts).await;
    let node = sim.node_names()[0].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    create(&pods, &pod_on("web", &node, &[("app", "web")], 1)).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    (client, ns, sim, node, repo)
}

async fn await_confirmed_at(client: &Client, ns: &TestNamespace, version: &str) {
    await_status(
        client,
        ns.name(),
        "test-test-1",
        &format!("confirmed at {version}"),
        |s| s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some(version),
    )
    .await;
}

/// Bump the pin to 1.13.0 and tell the agent.
async fn bump(repo: &ConfigRepo, agent: &RunningAgent) {
    repo.bump("test", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
}

fn given_back_at_target(n: &Node) -> bool {
    !unschedulable(n) && !n.annotations().contains_key(ANN_STATE) && os_image(n).contains("1.13.0")
}

/// The writes of `user_agent` since `from` that are about `node`: its
/// patches, the Jobs in `ns`, the Events on it; each as `verb resource`,
/// landed (2xx) and refused apart.
fn node_writes(
    log: &[Audited],
    user_agent: &str,
    from: DateTime<Utc>,
    ns: &str,
    node: &str,
) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut landed = BTreeMap::new();
    let mut refused = BTreeMap::new();
    let about_node = |a: &Audited| match a.resource.as_str() {
        "nodes" => a.name == node,
        "jobs" => a.namespace == ns,
        "events" => a.name.starts_with(&format!("{node}.")),
        _ => false,
    };
    for a in log.iter().filter(|a| {
        a.user_agent.starts_with(user_agent) && a.received >= from && a.is_write() && about_node(a)
    }) {
        let into = if (200..300).contains(&a.code) {
            &mut landed
        } else {
            &mut refused
        };
        *into
            .entry(format!("{} {}", a.verb, a.resource))
            .or_default() += 1;
    }
    (landed, refused)
}

async fn jobs_of(client: &Client, ns: &str, node: &str) -> Vec<Job> {
    live_jobs(client, ns, &format!("drover.dev/node={node}")).await
}

/// One node's upgrade to 1.13.0 by an agent sending `user_agent`, its
/// config changed by `change`: the writes about the node (landed), and
/// the node's Event reasons.
async fn upgrade_one_node(
    prefix: &str,
    user_agent: &str,
    change: impl FnOnce(&ConfigRepo, &str),
) -> (BTreeMap<String, usize>, Vec<String>) {
    let cp = ControlPlane::get();
    let (client, ns, sim, node, repo) =
        one_node(prefix, Duration::from_secs(1), Duration::ZERO).await;
    let agent = start_agent(&repo, ns.name(), "agent-w", user_agent).await;
    await_confirmed_at(&client, &ns, "1.12.0").await;

    let from = Utc::now();
    change(&repo, ns.name());
    assert_eq!(agent.webhook().await, 202);
    await_node(
        &client,
        &node,
        "upgraded and given back",
        given_back_at_target,
    )
    .await;
    await_confirmed_at(&client, &ns, "1.13.0").await;
    // Events are published off the loop: wait for the node's outcome.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let reasons = || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|o| o.name.as_deref()) == Some(&node))
            .filter_map(|e| e.reason)
            .collect::<Vec<_>>()
    };
    retry_until("the Upgraded Event", || async {
        let r = reasons().await;
        if r.iter().any(|r| r == "Upgraded") {
            Ok(())
        } else {
            Err(r)
        }
    })
    .await;
    agent.stop();

    let log = cp.audited(&client).await;
    let (landed, refused) = node_writes(&log, user_agent, from, ns.name(), &node);
    let all: usize = log
        .iter()
        .filter(|a| a.user_agent.starts_with(user_agent) && a.received >= from && a.is_write())
        .filter(|a| a.resource != "leases" && a.resource != "pods/eviction")
        .count();
    println!(
        "{prefix}: writes of one node's upgrade, besides evictions: {landed:?}; refused \
         (conflicts, retried): {refused:?}; every write of the agent meanwhile (status object \
         and its Events included, leases and evictions apart): {all}"
    );
    // Its work done, rebooted once, no Job left.
    assert_eq!(sim.upgrades_started(&node), 1);
    assert!(jobs_of(&client, ns.name(), &node).await.is_empty());
    let reasons = reasons().await;
    sim.shutdown().await;
    (landed, reasons)
}

fn counts(of: &[(&str, usize)]) -> BTreeMap<String, usize> {
    of.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

#[tokio::test]
async fn a_node_upgrade_with_prepare_writes_six_times_besides_its_evictions() {
    let (landed, reasons) = upgrade_one_node("writes-six", "drover-test-writes/1", |repo, _| {
        repo.bump("test", "1.13.0", true);
    })
    .await;
    let want = counts(&[
        // The prepare Job and the upgrade Job: the records of `preparing`
        // and `upgrading`.
        ("create jobs", 2),
        // The cordon (with `draining`), the uncordon (record cleared).
        ("patch nodes", 2),
        // Both Jobs, in one request, before the uncordon.
        ("deletecollection jobs", 1),
        // `Upgraded`: the drain's `Draining` is logged only.
        ("create events", 1),
    ]);
    assert_eq!(landed, want);
    assert_eq!(landed.values().sum::<usize>(), 6);
    assert_eq!(reasons, ["Upgraded"]);
}

#[tokio::test]
async fn a_node_upgrade_without_prepare_writes_five_times_besides_its_evictions() {
    let (landed, reasons) =
        upgrade_one_node("writes-five", "drover-test-writes-noprep/1", |repo, ns| {
            let selector = EnvSpec::test_pool(ns).selector;
            repo.set_env_text(
                "test",
                &format!(
                    "version = \"1.13.0\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\n\
                     timezone = \"UTC\"\n\n[rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\n\
                     node_timeout = \"10m\"\nnode_selector = \"{selector}\"\n\n[promotion]\n\
                     soak = \"0s\"\n\n[driver]\nprepare = false\n"
                ),
                "test: move to 1.13.0, no download before the drain",
            );
        })
        .await;
    let want = counts(&[
        ("create jobs", 1),
        ("patch nodes", 2),
        ("deletecollection jobs", 1),
        ("create events", 1),
    ]);
    assert_eq!(landed, want);
    assert_eq!(reasons, ["Upgraded"]);
}

#[tokio::test]
async fn an_agent_killed_while_a_node_prepares_leaves_the_next_leader_the_prepare_job() {
    const UA_A: &str = "drover-test-prepare-a/1";
    const UA_B: &str = "drover-test-prepare-b/1";
    let cp = ControlPlane::get();
    // The download takes long enough for the agent to die in the middle.
    let (client, ns, sim, node, repo) = one_node(
        "writes-prepare",
        Duration::from_secs(1),
        Duration::from_secs(6),
    )
    .await;
    let a = start_agent(&repo, ns.name(), "agent-a", UA_A).await;
    await_confirmed_at(&client, &ns, "1.12.0").await;
    bump(&repo, &a).await;
    retry_until("the prepare Job", || async {
        let jobs = jobs_of(&client, ns.name(), &node).await;
        if jobs.iter().any(|j| job_run(j).is_some_and(|(_, p)| p)) {
            Ok(())
        } else {
            Err(jobs.len())
        }
    })
    .await;
    a.kill();
    // Preparing, and nothing on the node says so: the Job is the record.
    let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert!(!unschedulable(&n), "a preparing node serves");
    assert!(
        !n.annotations().contains_key(ANN_STATE),
        "{:?}",
        n.annotations()
    );
    assert_eq!(sim.downloads(&node), (0, 0), "killed mid-download");
    let killed = Utc::now();

    let b = start_agent(&repo, ns.name(), "agent-b", UA_B).await;
    await_node(
        &client,
        &node,
        "finished by the next leader",
        given_back_at_target,
    )
    .await;
    await_confirmed_at(&client, &ns, "1.13.0").await;
    b.stop();
    // The download was not started again, nor made inside the drain; one reboot.
    assert_eq!(sim.downloads(&node), (1, 0));
    assert_eq!(sim.upgrades_started(&node), 1);
    let log = cp.audited(&client).await;
    let (landed, _) = node_writes(&log, UA_B, killed, ns.name(), &node);
    assert_eq!(
        landed.get("create jobs"),
        Some(&1),
        "B created the upgrade Job only: {landed:?}"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn an_agent_killed_while_a_node_upgrades_leaves_the_next_leader_the_upgrade_job() {
    const UA_A: &str = "drover-test-upgrade-a/1";
    const UA_B: &str = "drover-test-upgrade-b/1";
    let cp = ControlPlane::get();
    // The reboot takes long enough for the agent to die in the middle.
    let (client, ns, sim, node, repo) =
        one_node("writes-upgrade", Duration::from_secs(6), Duration::ZERO).await;
    let a = start_agent(&repo, ns.name(), "agent-a", UA_A).await;
    await_confirmed_at(&client, &ns, "1.12.0").await;
    bump(&repo, &a).await;
    await_node(&client, &node, "cordoned and rebooting", |n| {
        unschedulable(n) && node_ready(n) == Some("False")
    })
    .await;
    a.kill();
    // Upgrading: the node's record says draining (with the cordon and the
    // previous version a rollback needs), its upgrade Job says the rest.
    let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    let ann = n.annotations();
    assert_eq!(ann.get(ANN_STATE).map(String::as_str), Some("draining"));
    assert_eq!(ann.get(ANN_CORDONED).map(String::as_str), Some("true"));
    assert_eq!(ann.get(ANN_PREVIOUS).map(String::as_str), Some("1.12.0"));
    let upgrades = jobs_of(&client, ns.name(), &node)
        .await
        .into_iter()
        .filter(|j| job_run(j).is_some_and(|(_, prepare)| !prepare))
        .count();
    assert_eq!(upgrades, 1);
    let killed = Utc::now();

    let b = start_agent(&repo, ns.name(), "agent-b", UA_B).await;
    await_node(
        &client,
        &node,
        "finished by the next leader",
        given_back_at_target,
    )
    .await;
    await_confirmed_at(&client, &ns, "1.13.0").await;
    b.stop();
    assert_eq!(sim.upgrades_started(&node), 1, "not rebooted twice");
    assert_eq!(sim.downloads(&node), (1, 0));
    let log = cp.audited(&client).await;
    let (landed, _) = node_writes(&log, UA_B, killed, ns.name(), &node);
    assert_eq!(
        landed.get("create jobs"),
        None,
        "B started no run: {landed:?}"
    );
    // B gave it back: the Jobs in one request, then the uncordon.
    assert_eq!(landed.get("deletecollection jobs"), Some(&1), "{landed:?}");
    assert!(jobs_of(&client, ns.name(), &node).await.is_empty());
    sim.shutdown().await;
}
