//! Automatic rollback (docs/design.md §5b) with the agent against a real
//! kube-apiserver, simulated kubelet nodes and a real git server: with
//! `on_failure = "rollback"`, a node whose pods crash-loop after its upgrade
//! is driven back to the version it ran (an upgrade Job for that version,
//! `DROVER_ACTION=rollback`), comes back healthy and uncordoned, marked so it
//! is never moved to the bad version again, and the signed report names it
//! and the check; a rollback whose driver fails leaves the node cordoned
//! and named; beyond `max_rollbacks` the cluster halts with its nodes as
//! they are. The control, `on_failure = "halt"` (the default), is
//! `agent_health`'s crash-loop test, unchanged.

use std::time::{Duration, Instant};

use crate::agent_health::{progress, world_with, World, STEP};
use crate::support::agent::*;
use crate::support::backend::{await_node_and, nodes_in, record_of, POOL_LABEL};
use crate::support::kube::{
    await_node, events_for, os_image, pod_on, pod_running_ready, unschedulable,
};
use crate::support::kubelet::Fault;
use drover::cluster::ProgressState;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;

/// Stage at 1.13.0 rolling back failed nodes, `max_unavailable` at once.
fn stage_text(pool: &str, max_unavailable: u32, max_rollbacks: u32) -> String {
    format!(
        "version = \"1.13.0\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
         [rollout]\nmax_unavailable = {max_unavailable}\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\n\
         node_selector = \"{POOL_LABEL}={pool}\"\non_failure = \"rollback\"\nmax_rollbacks = {max_rollbacks}\n\n\
         [promotion]\nsoak = \"0s\"\n\n[health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n"
    )
}

/// A pod of the workload 1.13.0 breaks, on `node` (a DaemonSet's, so it
/// stays through drains).
fn app_pod(i: usize, node: &str) -> Pod {
    let mut pod = pod_on(&format!("app-{i}"), node, &[("app", "app")], 1);
    pod.metadata.owner_references = Some(vec![crate::support::kube::controller_ref(
        "DaemonSet",
        "app",
        "00000000-0000-0000-0000-000000000002",
    )]);
    pod
}

/// Stage's agent adopted at 1.12.0 inside its window, on `n` nodes each
/// running an [`app_pod`].
async fn world(prefix: &str, n: usize) -> World {
    world_with(prefix, n, app_pod).await
}

impl World {
    fn move_stage(&self, max_unavailable: u32, max_rollbacks: u32) {
        self.repo.set_env_text(
            "stage",
            &stage_text(&self.pool, max_unavailable, max_rollbacks),
            "stage: move to 1.13.0, rolling back failed nodes",
        );
        self.agent.handle.fetch();
    }

    async fn failed(&self, says: &str) -> String {
        await_status(&self.client, &self.pool, "stage-stage-1", says, |s| {
            s.state.as_deref() == Some("failed") && s.message.contains(says)
        })
        .await
        .status
        .unwrap()
        .message
    }

    /// The rollback Jobs drover created for `node`.
    async fn rollback_jobs(&self, node: &str) -> Vec<Job> {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.pool);
        jobs.list(&ListParams::default().labels(&format!("drover.dev/node={node}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|j| {
                j.spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .is_some_and(|s| {
                        s.containers[0].env.iter().flatten().any(|e| {
                            e.name == "DROVER_ACTION" && e.value.as_deref() == Some("rollback")
                        })
                    })
            })
            .collect()
    }
}

fn env_of(job: &Job, name: &str) -> Option<String> {
    job.spec.as_ref()?.template.spec.as_ref()?.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

#[tokio::test]
async fn a_crash_looping_node_is_rolled_back_healthy_uncordoned_and_named_in_the_signed_report() {
    let w = world("rollback-ok", 3).await;
    let first = w.nodes[0].clone();
    w.sim.set_fault(&first, Fault::CrashLoopAt("1.13.0".into()));
    w.move_stage(1, 1);

    let message = w.failed("rolled back to 1.12.0").await;
    assert!(message.contains(&first), "{message}");
    assert!(message.contains("crash-looping"), "{message}");
    w.notified
        .kind(Duration::from_secs(30), "rolled-back")
        .await;

    // The node: back at 1.12.0, Ready, uncordoned, marked, its record naming the check.
    let (node, record) = await_node_and(&w.client, &w.pool, &first, "rolled back", |_, r| {
        r.is_some_and(|r| r.rolled_back == [semver::Version::new(1, 13, 0)])
    })
    .await;
    let record = record.unwrap();
    assert!(os_image(&node).contains("1.12.0"), "{}", os_image(&node));
    assert!(!unschedulable(&node), "uncordoned");
    let p = record.progress.clone().expect("a failed record");
    assert_eq!(p.state, ProgressState::Failed);
    assert!(
        p.message
            .starts_with("rolled back to 1.12.0: health check failed: ")
            && p.message.contains("crash-looping"),
        "{}",
        p.message
    );
    assert_eq!(p.previous, Some(semver::Version::new(1, 12, 0)));
    assert_eq!(record.rollbacks_from(&semver::Version::new(1, 13, 0)), 1);
    let healthy: Api<Pod> = Api::namespaced(w.client.clone(), &w.pool);
    assert!(pod_running_ready(&healthy.get("app-0").await.unwrap()));

    // Through the same driver: one Job for 1.12.0, DROVER_ACTION=rollback.
    let jobs = w.rollback_jobs(&first).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        env_of(&jobs[0], "DROVER_TARGET_VERSION").as_deref(),
        Some("1.12.0")
    );
    assert_eq!(
        env_of(&jobs[0], "DROVER_FAILED_VERSION").as_deref(),
        Some("1.13.0")
    );

    // The signed report: failed for 1.13.0, naming the node and the check.
    until_pass(&w.agent.handle, "failed report pushed", STEP, || {
        w.repo.report("stage", "stage-1").is_some_and(|r| {
            r.state.as_str() == "failed"
                && r.version.to_string() == "1.13.0"
                && r.detail.rolled_back == [first.clone()]
        })
    })
    .await;
    let report = w.repo.report("stage", "stage-1").unwrap();
    assert!(
        report.detail.failed_checks.iter().any(|c| c
            .starts_with(&format!("{first}: rolled back to 1.12.0"))
            && c.contains("crash-looping")),
        "{:?}",
        report.detail
    );

    // Events say what happened.
    let evs = events_for(&w.client, "default", &first).await;
    for reason in ["RollingBack", "RollbackStarted", "RolledBack"] {
        assert!(
            evs.iter().any(|e| e.reason.as_deref() == Some(reason)),
            "no {reason}: {evs:?}"
        );
    }

    // Never moved to 1.13.0 again, and no other node starts it: over
    // several more passes, one upgrade and one rollback for the first node.
    let mut passes = 0;
    until_pass(&w.agent.handle, "several passes", STEP, || {
        passes += 1;
        passes > 4
    })
    .await;
    assert_eq!(w.sim.upgrades_started(&first), 2, "to 1.13.0 and back");
    for n in &nodes_in(&w.client, &w.pool).await[1..] {
        assert!(os_image(n).contains("1.12.0") && progress(&w, n).await.is_none());
    }
    w.agent.stop();
    w.sim.shutdown().await;
}

#[tokio::test]
async fn a_rollback_whose_driver_fails_leaves_the_node_cordoned_and_named() {
    let w = world("rollback-fails", 2).await;
    let first = w.nodes[0].clone();
    w.sim.set_fault(&first, Fault::CrashLoopAfterUpgrade);
    w.move_stage(1, 1);
    // Back at 1.13.0 and crash-looping: from now on its driver fails.
    await_node(&w.client, &first, "at 1.13.0", |n| {
        os_image(n).contains("1.13.0")
    })
    .await;
    w.sim.set_fault(&first, Fault::JobFails);

    let message = w.failed("rollback failed").await;
    assert!(message.contains(&first), "{message}");
    let (node, record) = await_node_and(&w.client, &w.pool, &first, "rollback failed", |_, r| {
        r.and_then(|r| r.progress.as_ref())
            .is_some_and(|p| p.state == ProgressState::Failed)
    })
    .await;
    let record = record.unwrap();
    assert!(unschedulable(&node), "left cordoned");
    assert!(os_image(&node).contains("1.13.0"));
    assert!(record.rolled_back.is_empty());
    let p = record.progress.clone().unwrap();
    assert!(
        p.message
            .starts_with("rollback failed: its driver failed: ")
            && p.message.contains("left cordoned"),
        "{}",
        p.message
    );
    let evs = events_for(&w.client, "default", &first).await;
    assert!(
        evs.iter()
            .any(|e| e.reason.as_deref() == Some("RollbackFailed")
                && e.type_.as_deref() == Some("Warning")),
        "{evs:?}"
    );
    until_pass(&w.agent.handle, "failed report pushed", STEP, || {
        w.repo.report("stage", "stage-1").is_some_and(|r| {
            r.state.as_str() == "failed"
                && r.detail
                    .failed_checks
                    .iter()
                    .any(|c| c.starts_with(&format!("{first}: rollback failed")))
        })
    })
    .await;
    // Still cordoned after more passes; the other node untouched.
    let mut passes = 0;
    until_pass(&w.agent.handle, "several passes", STEP, || {
        passes += 1;
        passes > 3
    })
    .await;
    let nodes = nodes_in(&w.client, &w.pool).await;
    assert!(unschedulable(&nodes[0]));
    assert!(progress(&w, &nodes[1]).await.is_none() && !unschedulable(&nodes[1]));
    w.agent.stop();
    w.sim.shutdown().await;
}

#[tokio::test]
async fn beyond_max_rollbacks_the_cluster_halts_with_its_nodes_as_they_are() {
    // Two nodes move at once and both crash-loop at 1.13.0: one is rolled
    // back, the other stays as it is, and the third is never touched.
    let w = world("rollback-breaker", 3).await;
    for n in &w.nodes[..2] {
        w.sim.set_fault(n, Fault::CrashLoopAt("1.13.0".into()));
    }
    w.move_stage(2, 1);
    let message = w.failed("").await;
    let deadline = Instant::now() + STEP;
    let (nodes, records) = loop {
        let nodes = nodes_in(&w.client, &w.pool).await;
        let mut records = Vec::new();
        for n in &nodes {
            records.push(record_of(&w.client, &w.pool, &n.name_any()).await);
        }
        let rolled = records
            .iter()
            .flatten()
            .filter(|r| !r.rolled_back.is_empty())
            .count();
        let halted = records.iter().flatten().any(|r| {
            r.progress
                .as_ref()
                .is_some_and(|p| p.message.contains("max_rollbacks (1) reached"))
        });
        if rolled == 1 && halted {
            break (nodes, records);
        }
        assert!(
            Instant::now() < deadline,
            "one rolled back, one halted: {nodes:?}"
        );
        let mut waited = false;
        until_pass(&w.agent.handle, "a pass", STEP, || {
            std::mem::replace(&mut waited, true)
        })
        .await;
    };
    let marked = |i: usize| {
        records[i]
            .as_ref()
            .is_some_and(|r| !r.rolled_back.is_empty())
    };
    let (rolled, halted): (Vec<&Node>, Vec<&Node>) = {
        let (r, h): (Vec<usize>, Vec<usize>) = (0..2).partition(|i| marked(*i));
        (
            r.into_iter().map(|i| &nodes[i]).collect(),
            h.into_iter().map(|i| &nodes[i]).collect(),
        )
    };
    assert!(os_image(rolled[0]).contains("1.12.0") && !unschedulable(rolled[0]));
    assert!(
        os_image(halted[0]).contains("1.13.0") && !unschedulable(halted[0]),
        "halted in service, as it is"
    );
    assert!(
        records[2].as_ref().is_none_or(|r| r.progress.is_none())
            && os_image(&nodes[2]).contains("1.12.0")
    );
    assert!(!message.is_empty());
    until_pass(&w.agent.handle, "failed report pushed", STEP, || {
        w.repo.report("stage", "stage-1").is_some_and(|r| {
            r.state.as_str() == "failed"
                && r.detail.rolled_back == [rolled[0].name_any()]
                && r.detail.failed_checks.len() == 2
        })
    })
    .await;
    w.agent.stop();
    w.sim.shutdown().await;
}
