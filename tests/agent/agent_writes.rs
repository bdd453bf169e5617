//! What one node's upgrade costs in API writes, and that a crash at any
//! point of it resumes from the node's record.
//!
//! With `[driver] prepare` (the Bottlerocket driver's default) a node's
//! upgrade writes seven times besides its evictions (issue 36): its record
//! (`preparing`, the prepare Job named; created the first time), the
//! prepare Job, its record (`draining`, the upgrade Job named, the version
//! it ran before), the cordon, the upgrade Job (no record write: a draining
//! record whose Job exists is upgrading), the uncordon and its record
//! (idle). No Event: the record is what people read; the finished Jobs are
//! left to their TTL. Counted from the API server's audit log by the
//! agent's own User-Agent. Without `prepare`, five: no prepare Job and no
//! `preparing` record.
//!
//! An agent killed while the node prepares (its record `preparing`, naming
//! the prepare Job) or while it upgrades (its record `draining`, naming the
//! upgrade Job that runs) leaves the next leader what it needs: it
//! downloads nothing twice, starts no second run, and finishes the node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{
    await_node_record, job_run, live_jobs, pool_options, progress_of, record_of, start_sim,
};
use crate::support::kube::{
    await_node, create, job_condition, node_ready, os_image, pod_on, retry_until, unschedulable,
    Audited, ControlPlane, TestNamespace,
};
use crate::support::kubelet::Kubelet;
use chrono::{DateTime, Utc};
use drover::cluster::{NodeProgress, ProgressState};
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

pub(crate) fn given_back_at_target(n: &Node, p: Option<&NodeProgress>) -> bool {
    !unschedulable(n) && p.is_none() && os_image(n).contains("1.13.0")
}

/// The writes of `user_agent` since `from` that are about `node`: its
/// patches, its record and its Jobs in `ns`, the Events on it, and what a
/// drain rule's rung writes in `ns` (a pod deleted, a Deployment or
/// StatefulSet restarted); each as `verb resource`, landed (2xx) and
/// refused apart.
pub(crate) fn node_writes(
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
        "drovernodes" => a.namespace == ns && a.name == node,
        "jobs" => a.namespace == ns && a.name.contains(node),
        "events" => a.name.starts_with(&format!("{node}.")),
        "pods" | "deployments" | "statefulsets" => a.namespace == ns,
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

/// Whether the status object's confirmation was told a second time (the
/// 1.13.0 one after 1.12.0's): the Events of the pass that confirmed, the
/// node's among them, were published before it (one queue, in order).
async fn confirmed_twice(client: &Client, ns: &str) -> bool {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let confirmed: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("RolloutConfirmed"))
        .collect();
    let told: i32 = confirmed
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    told >= 2
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
    await_node_record(
        &client,
        ns.name(),
        &node,
        "upgraded and given back",
        given_back_at_target,
    )
    .await;
    await_confirmed_at(&client, &ns, "1.13.0").await;
    // Events are published off the loop: once the confirmation's is out,
    // the node's of the same passes are too.
    retry_until("the confirmation told", || async {
        if confirmed_twice(&client, ns.name()).await {
            Ok(())
        } else {
            Err("not yet")
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
    // Its work done, rebooted once; its finished Jobs left to their TTL.
    assert_eq!(sim.upgrades_started(&node), 1);
    let jobs = jobs_of(&client, ns.name(), &node).await;
    assert!(
        jobs.iter().all(|j| job_condition(j, "Complete")),
        "{jobs:?}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|o| o.name.as_deref()) == Some(&node))
        .filter_map(|e| e.reason)
        .collect();
    sim.shutdown().await;
    (landed, reasons)
}

pub(crate) fn counts(of: &[(&str, usize)]) -> BTreeMap<String, usize> {
    of.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

#[tokio::test]
async fn a_node_upgrade_with_prepare_writes_seven_times_besides_its_evictions() {
    let (landed, reasons) = upgrade_one_node("writes-seven", "drover-test-writes/1", |repo, _| {
        repo.bump("test", "1.13.0", true);
    })
    .await;
    let want = counts(&[
        // Its record, created with `preparing` (the node had none yet).
        ("create drovernodes", 1),
        // Its record: `draining` (before the cordon), idle (after the uncordon).
        ("patch drovernodes", 2),
        // The prepare Job and the upgrade Job.
        ("create jobs", 2),
        // The cordon and the uncordon.
        ("patch nodes", 2),
    ]);
    assert_eq!(landed, want);
    assert_eq!(landed.values().sum::<usize>(), 7);
    assert_eq!(reasons, Vec::<String>::new(), "no routine Event");
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
        ("create drovernodes", 1),
        ("patch drovernodes", 1),
        ("create jobs", 1),
        ("patch nodes", 2),
    ]);
    assert_eq!(landed, want);
    assert_eq!(landed.values().sum::<usize>(), 5);
    assert_eq!(reasons, Vec::<String>::new(), "no routine Event");
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
    // Preparing: its record says so and names the Job; the Node carries nothing.
    let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert!(!unschedulable(&n), "a preparing node serves");
    assert!(n
        .annotations()
        .keys()
        .all(|k| !k.starts_with("drover.dev/")));
    let r = record_of(&client, ns.name(), &node).await.unwrap();
    assert_eq!(r.progress.as_ref().unwrap().state, ProgressState::Preparing);
    let jobs = jobs_of(&client, ns.name(), &node).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        Some(jobs[0].name_any()),
        r.run.map(|run| run.name),
        "the record names its Job"
    );
    assert_eq!(sim.downloads(&node), (0, 0), "killed mid-download");
    let killed = Utc::now();

    let b = start_agent(&repo, ns.name(), "agent-b", UA_B).await;
    await_node_record(
        &client,
        ns.name(),
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
    // previous version a rollback needs) and names its upgrade Job, which exists.
    let r = record_of(&client, ns.name(), &node).await.unwrap();
    let p = r.progress.clone().unwrap();
    assert_eq!(p.state, ProgressState::Draining);
    assert!(p.cordoned_by_drover);
    assert_eq!(p.previous, Some(semver::Version::new(1, 12, 0)));
    let upgrades: Vec<Job> = jobs_of(&client, ns.name(), &node)
        .await
        .into_iter()
        .filter(|j| job_run(j).is_some_and(|(_, prepare)| !prepare))
        .collect();
    assert_eq!(upgrades.len(), 1);
    assert_eq!(Some(upgrades[0].name_any()), r.run.map(|run| run.name));
    let killed = Utc::now();

    let b = start_agent(&repo, ns.name(), "agent-b", UA_B).await;
    await_node_record(
        &client,
        ns.name(),
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
    // B gave it back: the uncordon and its record, no Job deleted.
    assert_eq!(landed.get("patch nodes"), Some(&1), "{landed:?}");
    assert_eq!(landed.get("patch drovernodes"), Some(&1), "{landed:?}");
    assert_eq!(landed.values().sum::<usize>(), 2, "{landed:?}");
    assert_eq!(progress_of(&client, ns.name(), &node).await, None);
    sim.shutdown().await;
}
