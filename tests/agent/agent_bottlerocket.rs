//! The agent with drover's own Bottlerocket driver in its Jobs' pods: the
//! simulated kubelet runs each pod's script, exactly as the updater image
//! holds it, against a simulated Bottlerocket API per node that fails as a
//! real one does (support/bottlerocket/nodes.rs, support/bottlerocket_api.rs).
//! What a person sees (the node, its record, the status, the Events) comes
//! from the real script's exit and termination message, through the Job
//! controller, the kubelet's graceful shutdown and drover's observation.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent_health::{world_tuned, World};
use crate::support::agent::*;
use crate::support::backend::{
    await_node_record, nodes_in, progress_of, record_of, NodeWatch, POOL_LABEL,
};
use crate::support::bottlerocket_api::nodes::BottlerocketNodes;
use crate::support::bottlerocket_api::{v, Failure, Scenario};
use crate::support::kube::{events_for, os_image, pod_on, unschedulable};
use crate::support::kubelet::{Fault, KubeletOptions};
use drover::cluster::ProgressState;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Every node starts at 1.12.0 with 1.12.0 and 1.13.0 in its repository.
fn scenario(_node: &str) -> Scenario {
    Scenario::new("1.12.0", &["1.12.0", "1.13.0"])
}

/// The simulator runs the real script in the Jobs' pods, with short
/// shutdowns and pod backoffs.
fn real_driver(nodes: &Arc<BottlerocketNodes>) -> impl FnOnce(&mut KubeletOptions) {
    let nodes = nodes.clone();
    move |o| {
        o.driver = Some(nodes);
        o.graceful_shutdown = Some(Duration::from_millis(300));
        o.job_backoff = Duration::from_millis(200);
        o.reboot = Duration::from_secs(1);
    }
}

/// A DaemonSet's pod on `node`, so it stays through drains.
fn app_pod(i: usize, node: &str) -> Pod {
    let mut pod = pod_on(&format!("app-{i}"), node, &[("app", "app")], 1);
    pod.metadata.owner_references = Some(vec![crate::support::kube::controller_ref(
        "DaemonSet",
        "app",
        "00000000-0000-0000-0000-000000000003",
    )]);
    pod
}

/// Stage at 1.13.0, one node at a time, failed nodes rolled back.
fn move_stage(w: &World) {
    w.repo.set_env_text(
        "stage",
        &format!(
            "version = \"1.13.0\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
             [rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\n\
             node_selector = \"{POOL_LABEL}={}\"\non_failure = \"rollback\"\nmax_rollbacks = 1\n\n\
             [promotion]\nsoak = \"0s\"\n\n[health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n",
            w.pool
        ),
        "stage: move to 1.13.0, rolling back failed nodes",
    );
    w.agent.handle.fetch();
}

async fn failed(w: &World, says: &str) -> String {
    await_status(&w.client, &w.pool, "stage-stage-1", says, |s| {
        s.state.as_deref() == Some("failed") && s.message.contains(says)
    })
    .await
    .status
    .unwrap()
    .message
}

/// A node as the watch saw it: cordoned, osImage.
type Seen = (bool, String);

/// The rollback: the node failed its health checks at 1.13.0, and
/// the download of 1.12.0 breaks off after updog cleared the inactive
/// partition set, which held 1.12.0 bootable. The node stays cordoned at
/// 1.13.0, named with the driver's own reason (which says the offline way
/// back is gone), and the cluster halts; it is never uncordoned at 1.13.0
/// after the rollback began.
#[tokio::test]
async fn a_rollback_whose_download_breaks_off_leaves_the_node_cordoned_named_and_the_cluster_halted(
) {
    let nodes = BottlerocketNodes::new(scenario);
    let w = world_tuned("br-rollback", 2, app_pod, real_driver(&nodes)).await;
    let (first, second) = (w.nodes[0].clone(), w.nodes[1].clone());
    w.sim.set_fault(&first, Fault::CrashLoopAt("1.13.0".into()));

    // Every state the node is seen in, with its cordon.
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let s = seen.clone();
    let name = first.clone();
    let _watch = NodeWatch::start(&w.client, &w.pool, move |n, _| {
        if n.name_any() == name {
            s.lock()
                .unwrap()
                .push((unschedulable(n), os_image(n).to_string()));
        }
    })
    .await;
    // Once it runs 1.13.0, its repository's downloads break off.
    let node = nodes.node(&first);
    let injector = {
        let node = node.clone();
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while node.api().running() != v("1.13.0") {
                assert!(Instant::now() < deadline, "never at 1.13.0");
                std::thread::sleep(Duration::from_millis(20));
            }
            node.api().fail_prepares(Failure::Download, usize::MAX);
        })
    };
    move_stage(&w);
    injector.await.unwrap();

    let message = failed(&w, "rollback failed").await;
    assert!(message.contains(&first), "{message}");
    let (n, p) = await_node_record(&w.client, &w.pool, &first, "rollback failed", |_, p| {
        p.is_some_and(|p| p.state == ProgressState::Failed)
    })
    .await;
    let logs = node.logs();
    assert!(unschedulable(&n), "left cordoned\n{logs}");
    assert!(os_image(&n).contains("1.13.0"), "{}", os_image(&n));
    let r = record_of(&w.client, &w.pool, &first).await.unwrap();
    assert!(r.rolled_back.is_empty(), "{r:?}");
    let record = p.unwrap().message;
    assert!(
        record.starts_with("rollback failed: its driver failed: prepare failed 4 times"),
        "{record}\n{logs}"
    );
    assert!(
        record.contains(
            "updog cleared the inactive partition set before the download broke off, so `signpost rollback-to-inactive` no longer works on this node"
        ) && record.contains("the driver retried prepare 3 times"),
        "the record carries the driver's own reason: {record}"
    );
    // What the record says is so: the manual way back is refused.
    let refused = node.api().signpost_rollback_to_inactive().unwrap_err();
    assert!(refused.contains("not valid to roll back to"), "{refused}");
    assert_eq!(node.api().running(), v("1.13.0"));

    let evs = events_for(&w.client, "default", &first).await;
    assert!(
        evs.iter()
            .any(|e| e.reason.as_deref() == Some("RollbackFailed")
                && e.note
                    .as_deref()
                    .is_some_and(|m| m.contains("signpost rollback-to-inactive"))),
        "{evs:?}"
    );

    // Never uncordoned once the rollback began, over more passes.
    let mut passes = 0;
    until_pass(
        &w.agent.handle,
        "several passes",
        crate::agent_health::STEP,
        || {
            passes += 1;
            passes > 3
        },
    )
    .await;
    // The rollback began with the first cordon after the node served at
    // 1.13.0 (its health watch, where the crash loop showed).
    let seen = seen.lock().unwrap().clone();
    let served = seen
        .iter()
        .position(|(cordoned, image)| !cordoned && image.contains("1.13.0"))
        .unwrap_or_else(|| panic!("never in service at 1.13.0: {seen:?}"));
    let from = served
        + seen[served..]
            .iter()
            .position(|(cordoned, _)| *cordoned)
            .unwrap_or_else(|| panic!("never cordoned for its rollback: {seen:?}"));
    assert!(
        seen[from..].iter().all(|(cordoned, _)| *cordoned),
        "uncordoned after the rollback began: {seen:?}"
    );
    // The cluster halted: the second node never left 1.12.0 or service.
    let all = nodes_in(&w.client, &w.pool).await;
    let other = all.iter().find(|n| n.name_any() == second).unwrap();
    assert!(os_image(other).contains("1.12.0") && !unschedulable(other));
    assert_eq!(w.sim.upgrades_started(&second), 0);
    w.agent.stop();
    w.sim.shutdown().await;
}

/// A repository whose TUF metadata expired: the prepare Job fails at once,
/// on the node still in service, which is failed uncordoned with the
/// driver's reason; nothing was downloaded and no other node starts.
#[tokio::test]
async fn a_prepare_the_repository_refuses_for_good_fails_the_node_in_service() {
    let nodes = BottlerocketNodes::new(|_| {
        Scenario::new("1.12.0", &["1.12.0", "1.13.0"]).refresh_failing(Failure::Expired, usize::MAX)
    });
    let w = world_tuned("br-expired", 2, app_pod, real_driver(&nodes)).await;
    move_stage(&w);
    let message = failed(&w, "metadata is expired").await;
    let mut failed_node = None;
    for n in nodes_in(&w.client, &w.pool).await {
        if let Some(p) = progress_of(&w.client, &w.pool, &n.name_any())
            .await
            .filter(|p| p.state == ProgressState::Failed)
        {
            failed_node = Some((n, p));
        }
    }
    let (n, p) = failed_node.expect("a failed node");
    assert!(message.contains(&n.name_any()), "{message}");
    assert!(!unschedulable(&n), "failed in service, never cordoned");
    let record = p.message;
    assert!(
        record.contains("refresh failed, not retried (the update repository's metadata must be fixed): Metadata error: timestamp metadata is expired"),
        "{record}\n{}",
        nodes.node(&n.name_any()).logs()
    );
    for node in &w.nodes {
        assert!(
            nodes.node(node).api().staged().is_empty(),
            "nothing downloaded"
        );
        assert_eq!(w.sim.upgrades_started(node), 0);
    }
    w.agent.stop();
    w.sim.shutdown().await;
}

/// Issue 39: a refresh that fails twice (the repository does not answer)
/// and then works. The driver retries it and the node reaches the version;
/// what its run said (the retries) is in the node's record, read back
/// through the API (`driverRetries`, `driverRuns`), and in the signed
/// report's `driver_retries`, with no write more than a rollout makes.
#[tokio::test]
async fn a_run_that_succeeds_after_two_failed_refreshes_records_and_reports_its_retries() {
    let nodes = BottlerocketNodes::new(|_| {
        Scenario::new("1.12.0", &["1.12.0", "1.13.0"]).refresh_failing(Failure::Unreachable, 2)
    });
    let w = world_tuned("br-retried", 1, app_pod, real_driver(&nodes)).await;
    let node = w.nodes[0].clone();
    w.repo.set_env_text(
        "stage",
        &format!(
            "version = \"1.13.0\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
             [rollout]\nmax_unavailable = 1\nnode_selector = \"{POOL_LABEL}={}\"\n\n\
             [promotion]\nsoak = \"0s\"\n",
            w.pool
        ),
        "stage: move to 1.13.0",
    );
    w.agent.handle.fetch();
    until_pass(
        &w.agent.handle,
        "confirmed report pushed",
        crate::agent_health::STEP,
        || {
            w.repo.report("stage", "stage-1").is_some_and(|r| {
                r.state.as_str() == "confirmed" && r.version.to_string() == "1.13.0"
            })
        },
    )
    .await;
    let logs = nodes.node(&node).logs();
    assert_eq!(nodes.node(&node).api().running(), v("1.13.0"), "{logs}");

    // The record, as the API server holds it.
    let obj = kube::Api::<drover::record::wire::DroverNode>::namespaced(w.client.clone(), &w.pool)
        .get(&node)
        .await
        .unwrap();
    let status = obj.status.unwrap();
    assert_eq!(status.phase, "idle");
    assert_eq!(status.driver_retries, 2, "{status:?}\n{logs}");
    let retried: Vec<_> = status
        .driver_runs
        .iter()
        .filter(|d| !d.retries.is_empty())
        .collect();
    assert_eq!(retried.len(), 1, "{:?}", status.driver_runs);
    assert_eq!(
        retried[0].retries,
        [("refresh".to_string(), 2)].into(),
        "{:?}",
        status.driver_runs
    );
    // Every run of the attempt was heard from, the retried one named.
    let record = record_of(&w.client, &w.pool, &node).await.unwrap();
    assert_eq!(record.driver_retries(), 2);
    assert!(record.heard_from(&record.run.as_ref().unwrap().name));

    // The signed report names the node with its retries.
    let report = w.repo.report("stage", "stage-1").unwrap();
    assert_eq!(
        report.detail.driver_retries,
        [format!("{node}: refresh 2 times")],
        "{:?}",
        report.detail
    );
    w.agent.stop();
    w.sim.shutdown().await;
}
