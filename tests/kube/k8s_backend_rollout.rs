//! The Kubernetes backend driven by the real rollout engine against a real
//! kube-apiserver and simulated nodes: the budget, PDBs, someone else's
//! cordon, nodes that fail.

use std::time::Duration;

use drover::cluster::ProgressState;
use drover::rollout::{Action, RolloutState};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use crate::support::backend::*;
use crate::support::kube::*;
use crate::support::kubelet::Fault;

const MINUTE: Duration = Duration::from_secs(60);

fn is_unschedulable(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

async fn node(client: &kube::Client, name: &str) -> Node {
    Api::<Node>::all(client.clone()).get(name).await.unwrap()
}

async fn jobs_in(client: &kube::Client, ns: &str) -> Vec<Job> {
    live_jobs(client, ns, "").await
}

#[tokio::test]
async fn six_nodes_roll_two_at_a_time_and_end_clean() {
    let (client, ns) = setup("rollout-six").await;
    let sim = start_sim(&client, pool_options(ns.name(), 6)).await;
    let names = sim.node_names();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    // On every node: an app pod to evict, a DaemonSet pod and a mirror pod to leave alone.
    for (i, n) in names.iter().enumerate() {
        create(&pods, &pod_on(&format!("app-{i}"), n, &[("app", "app")], 1)).await;
        let mut ds = pod_on(&format!("ds-{i}"), n, &[("app", "ds")], 1);
        ds.metadata.owner_references = Some(vec![serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "00000000-0000-0000-0000-000000000001",
        }))
        .unwrap()]);
        create(&pods, &ds).await;
        let mut mirror = pod_on(&format!("static-{i}"), n, &[("app", "static")], 1);
        mirror.metadata.annotations =
            Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
        create(&pods, &mirror).await;
    }
    let watch = BudgetWatch::start(&client, ns.name()).await;
    let cluster = cluster(ns.name()).await;
    let engine = engine(policy("1.13.0", 2, MINUTE, MINUTE));

    let started = std::time::Instant::now();
    let out = drive(&engine, &cluster, &open_window(), 3 * MINUTE, |o| {
        o.decision.state == RolloutState::Confirmed
    })
    .await;
    eprintln!("six nodes rolled in {:?}", started.elapsed());
    assert_eq!(out.decision.nodes_at_version, 6);

    let (peak, which) = watch.peak();
    assert!(peak <= 2, "{peak} nodes unavailable at once: {which:?}");
    assert_eq!(peak, 2, "the budget was used");
    for n in &names {
        let node = node(&client, n).await;
        assert!(
            os_image(&node).contains("1.13.0"),
            "{n}: {}",
            os_image(&node)
        );
        assert!(!is_unschedulable(&node), "{n} left cordoned");
        assert!(
            no_drover_annotations(&node),
            "{n}: {:?}",
            node.annotations()
        );
        assert_eq!(sim.upgrades_started(n), 1, "{n} upgraded once");
    }
    // Finished runs are left to their TTL: one per node, each complete.
    let jobs = jobs_in(&client, ns.name()).await;
    assert_eq!(jobs.len(), names.len(), "one run per node");
    assert!(jobs.iter().all(|j| job_condition(j, "Complete")));
    let left: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(
        left.iter().all(|p| !p.starts_with("app-")),
        "app pods evicted: {left:?}"
    );
    assert_eq!(
        left.iter()
            .filter(|p| p.starts_with("ds-") || p.starts_with("static-"))
            .count(),
        12,
        "{left:?}"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_pdb_with_no_disruptions_blocks_the_drain_until_it_allows_one() {
    let (client, ns) = setup("rollout-pdb").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let n = sim.node_names()[0].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns.name());
    create(&pods, &pod_on("web-0", &n, &[("app", "web")], 1)).await;
    await_pod(
        &client,
        ns.name(),
        "web-0",
        "Running and Ready",
        pod_running_ready,
    )
    .await;
    create(&pdbs, &pdb_min_available("web", "web", json!(1))).await;
    await_pdb(&client, ns.name(), "web", "0 allowed", |p| {
        pdb_settled(p, |s| {
            s.current_healthy == Some(1) && s.disruptions_allowed == Some(0)
        })
    })
    .await;

    let cluster = cluster(ns.name()).await;
    let engine = engine(policy("1.13.0", 1, Duration::from_secs(4), MINUTE));
    let inputs = open_window();
    let mut blockers = Vec::new();
    drive(&engine, &cluster, &inputs, MINUTE, |o| {
        blockers.extend(o.evictions_blocked.iter().cloned());
        o.decision
            .actions
            .iter()
            .any(|a| matches!(a, Action::Block { .. }))
    })
    .await;
    let pdb_name = format!("{}/web", ns.name());
    assert!(
        blockers
            .iter()
            .any(|(node, pdbs)| node == &n && pdbs.contains(&pdb_name)),
        "{blockers:?}"
    );
    let blocked = node(&client, &n).await;
    assert!(!is_unschedulable(&blocked), "given back uncordoned");
    let p = progress_of(&client, ns.name(), &blocked.name_any())
        .await
        .expect("a record");
    assert_eq!(p.state, ProgressState::Blocked);
    assert!(p.message.contains("drain_timeout"), "{}", p.message);
    assert_eq!(sim.upgrades_started(&n), 0);
    assert!(
        pods.get_opt("web-0")
            .await
            .unwrap()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        "never deleted past the PDB"
    );

    // The budget relents: the next attempt drains and upgrades.
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "spec": { "minAvailable": 0 } })),
    )
    .await
    .unwrap();
    let out = drive(&engine, &cluster, &inputs, 2 * MINUTE, |o| {
        o.decision.state == RolloutState::Confirmed
    })
    .await;
    assert_eq!(out.decision.nodes_at_version, 1);
    let done = node(&client, &n).await;
    assert!(
        !is_unschedulable(&done) && no_drover_annotations(&done),
        "{:?}",
        done.annotations()
    );
    assert_eq!(sim.upgrades_started(&n), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_node_cordoned_by_someone_else_stays_cordoned_and_is_not_upgraded() {
    let (client, ns) = setup("rollout-foreign").await;
    let sim = start_sim(&client, pool_options(ns.name(), 3)).await;
    let names = sim.node_names();
    let theirs = names[1].clone();
    Api::<Node>::all(client.clone())
        .patch(
            &theirs,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    await_node(&client, &theirs, "cordoned", is_unschedulable).await;

    let cluster = cluster(ns.name()).await;
    let engine = engine(policy("1.13.0", 3, MINUTE, MINUTE));
    let out = drive(&engine, &cluster, &open_window(), 2 * MINUTE, |o| {
        o.decision.nodes_at_version == 2
            && o.decision.actions.is_empty()
            && o.decision.unavailable == 0
    })
    .await;
    assert_eq!(out.decision.state, RolloutState::Blocked);
    assert!(
        out.decision
            .skipped
            .iter()
            .any(|s| s.node == theirs && s.reason.contains("cordoned by someone else")),
        "{:?}",
        out.decision.skipped
    );
    let still = node(&client, &theirs).await;
    assert!(is_unschedulable(&still), "their cordon is kept");
    assert!(no_drover_annotations(&still));
    assert_eq!(sim.upgrades_started(&theirs), 0);
    assert!(os_image(&still).contains("1.12.0"));
    for n in [&names[0], &names[2]] {
        assert_eq!(sim.upgrades_started(n), 1);
        assert!(!is_unschedulable(&node(&client, n).await));
    }
    sim.shutdown().await;
}

/// The step released a node given back whose stopped run is gone.
fn released(o: &drover::rollout::Outcome) -> bool {
    o.decision
        .actions
        .iter()
        .any(|a| matches!(a, Action::Release { .. }))
}

async fn a_failing_node_stops_the_rollout(
    prefix: &str,
    fault: Fault,
    node_timeout: Duration,
    expect: &str,
) {
    let (client, ns) = setup(prefix).await;
    let sim = start_sim(&client, pool_options(ns.name(), 3)).await;
    let names = sim.node_names();
    sim.set_fault(&names[0], fault);
    let cluster = cluster(ns.name()).await;
    let engine = engine(policy("1.13.0", 1, MINUTE, node_timeout));
    let inputs = open_window();
    let out = drive(&engine, &cluster, &inputs, 2 * MINUTE, |o| {
        o.decision.state == RolloutState::Failed
    })
    .await;
    assert!(
        out.decision.message.contains(&names[0]) && out.decision.message.contains(expect),
        "{}",
        out.decision.message
    );

    // Stopped: once the failed node is given back (its run stopped first
    // if it was still running), further steps start nothing.
    let again = drive(&engine, &cluster, &inputs, MINUTE, |o| {
        o.decision.state == RolloutState::Failed && (o.decision.unavailable == 0 || released(o))
    })
    .await;
    assert!(
        !again.decision.actions.iter().any(|a| matches!(
            a,
            Action::Cordon { .. } | Action::Prepare { .. } | Action::StartUpgrade { .. }
        )),
        "{:?}",
        again.decision.actions
    );
    let failed = node(&client, &names[0]).await;
    let p = progress_of(&client, ns.name(), &failed.name_any())
        .await
        .expect("a record");
    assert_eq!(p.state, ProgressState::Failed);
    assert!(p.message.contains(expect), "{}", p.message);
    assert!(!is_unschedulable(&failed), "given back uncordoned");
    assert!(
        jobs_in(&client, ns.name())
            .await
            .iter()
            .all(|j| { j.status.as_ref().and_then(|s| s.active).unwrap_or(0) == 0 }),
        "no driver left running"
    );
    for n in &names[1..] {
        let other = node(&client, n).await;
        assert!(
            no_drover_annotations(&other) && !is_unschedulable(&other),
            "{n} touched"
        );
        assert_eq!(sim.upgrades_started(n), 0, "{n} upgraded");
        assert_eq!(
            progress_of(&client, ns.name(), &other.name_any()).await,
            None
        );
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn a_node_that_never_returns_fails_and_stops_the_rollout() {
    a_failing_node_stops_the_rollout(
        "rollout-never",
        Fault::NeverReady,
        Duration::from_secs(8),
        "within node_timeout",
    )
    .await;
}

#[tokio::test]
async fn a_node_back_at_the_wrong_version_fails_and_stops_the_rollout() {
    a_failing_node_stops_the_rollout(
        "rollout-wrong",
        Fault::WrongVersion("1.12.9".into()),
        MINUTE,
        "1.12.9 instead of 1.13.0",
    )
    .await;
}
