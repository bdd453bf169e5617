//! Upgrade Jobs under the kubelet's graceful node shutdown, which
//! docs/drivers.md recommends for Bottlerocket: the simulator's
//! graceful-shutdown mode kills the Job's pod when the node shuts down for
//! the reboot and rejects its replacements until the node is down
//! (`NodeShutdown`), and plays the Job controller, so the Job's
//! `podFailurePolicy` and `backoffLimit` decide as in a cluster
//! (support/kubelet.rs, "Graceful node shutdown").

use std::time::Duration;

use chrono::Utc;
use drover::cluster::{NodeProgress, ProgressState};
use drover::kubernetes::driver::upgrade_job;
use drover::kubernetes::node::ObservedNode;
use drover::rollout::RolloutState;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use crate::support::backend::*;
use crate::support::kube::*;
use crate::support::kubelet::{
    Fault, KubeletOptions, JOB_NAME_LABEL, NODE_SHUTDOWN_REASON, SHUTDOWN_KILLED_REASON,
};

const MINUTE: Duration = Duration::from_secs(60);

/// The shutdown lasts 30 times the Job controller's backoff (3 s against
/// 100 ms; e.g. a 5-minute shutdown against the upstream 10 s), so several
/// replacements are rejected before the node goes down.
fn graceful(ns: &str, nodes: usize) -> KubeletOptions {
    let mut opts = pool_options(ns, nodes);
    opts.graceful_shutdown = Some(Duration::from_secs(3));
    opts.job_backoff = Duration::from_millis(100);
    opts.reboot = Duration::from_secs(1);
    opts
}

/// The reasons of the pods the Job controller made for `job`, oldest first.
async fn pod_reasons(client: &kube::Client, ns: &str, job: &str) -> Vec<String> {
    let mut pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{JOB_NAME_LABEL}={job}")))
        .await
        .unwrap()
        .items;
    // Each pod is done before the next is made, so the order of their last
    // writes is the order they were made in (creation timestamps have only
    // seconds); the API server's resourceVersions are etcd revisions.
    pods.sort_by_key(|p| {
        p.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    });
    pods.iter()
        .map(|p| {
            let st = p.status.clone().unwrap_or_default();
            let disrupted = st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "DisruptionTarget" && c.status == "True");
            format!(
                "{}{}{}",
                st.phase.unwrap_or_default(),
                st.reason.map(|r| format!(" {r}")).unwrap_or_default(),
                if disrupted { " DisruptionTarget" } else { "" }
            )
        })
        .collect()
}

#[tokio::test]
async fn the_upgrade_job_survives_the_pods_the_shutdown_rejects_and_the_node_upgrades_once() {
    let (client, ns) = setup("graceful").await;
    let sim = start_sim(&client, graceful(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let cluster = cluster(ns.name()).await;
    let engine = engine(policy("1.13.0", 1, MINUTE, MINUTE));

    let out = drive(&engine, &cluster, &open_window(), 2 * MINUTE, |o| {
        o.decision.state == RolloutState::Confirmed
    })
    .await;
    assert_eq!(out.decision.nodes_at_version, 1);
    assert_eq!(sim.upgrades_started(&node), 1, "upgraded exactly once");
    assert_eq!(sim.version(&node).as_deref(), Some("1.13.0"));

    // The Job is deleted once the node completed; its pods tell its story.
    let jobs: Vec<String> = Api::<Pod>::namespaced(client.clone(), ns.name())
        .list(&ListParams::default().labels(JOB_NAME_LABEL))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.labels().get(JOB_NAME_LABEL).cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(jobs.len(), 1, "one Job: {jobs:?}");
    // The node's new version can be seen before the kubelet reports its pod
    // finished: the story is read once every pod has ended.
    let pods = Api::<Pod>::namespaced(client.clone(), ns.name());
    let selector = format!("{JOB_NAME_LABEL}={}", jobs[0]);
    for pod in pods
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
    {
        await_object(&pods, &pod.name_any(), "the Job's pod ended", |p: &Pod| {
            matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .await;
    }
    let reasons = pod_reasons(&client, ns.name(), &jobs[0]).await;
    let rejected = format!("Failed {NODE_SHUTDOWN_REASON}");
    assert_eq!(
        reasons.first().map(String::as_str),
        Some(format!("Failed {SHUTDOWN_KILLED_REASON} DisruptionTarget").as_str()),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().filter(|r| **r == rejected).count() >= 1,
        "the shutdown rejected a replacement: {reasons:?}"
    );
    assert_eq!(
        reasons.last().map(String::as_str),
        Some("Succeeded"),
        "{reasons:?}"
    );
    eprintln!("graceful shutdown, one node: pods {reasons:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn without_the_new_policy_the_first_rejected_pod_fails_the_job_mid_reboot() {
    let (client, ns) = setup("graceful-old").await;
    let sim = start_sim(&client, graceful(ns.name(), 2)).await;
    let names = sim.node_names();
    let opts = kube_options(ns.name());
    let job_for = |node: &ObservedNode| {
        let p = NodeProgress {
            state: ProgressState::Upgrading,
            target: semver::Version::new(1, 13, 0),
            started_at: Utc::now(),
            cordoned_by_drover: true,
            message: String::new(),
            retries: 0,
            previous: None,
        };
        upgrade_job(&opts, node, &run_start(&node.name_any(), &p)).unwrap()
    };
    let nodes: Api<ObservedNode> = Api::all(client.clone());
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns.name());

    // Control: the policy before this change (backoffLimit 0, two Ignore rules).
    let mut old = serde_json::to_value(job_for(&nodes.get(&names[0]).await.unwrap())).unwrap();
    old["spec"]["backoffLimit"] = json!(0);
    old["spec"]["podFailurePolicy"]["rules"]
        .as_array_mut()
        .unwrap()
        .truncate(2);
    let old: Job = serde_json::from_value(old).unwrap();
    let old = jobs.create(&PostParams::default(), &old).await.unwrap();
    let failed = await_job(
        &client,
        ns.name(),
        &old.name_any(),
        "the old Job fails",
        |j| job_condition(j, "Failed"),
    )
    .await;
    let reason = failed
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Failed")
        .and_then(|c| c.reason.clone());
    assert_eq!(reason.as_deref(), Some("BackoffLimitExceeded"));
    let reasons = pod_reasons(&client, ns.name(), &old.name_any()).await;
    assert_eq!(
        reasons,
        [
            format!("Failed {SHUTDOWN_KILLED_REASON} DisruptionTarget"),
            format!("Failed {NODE_SHUTDOWN_REASON}")
        ],
        "the killed pod was ignored, the first rejected one failed the Job"
    );
    assert_eq!(
        sim.upgrades_started(&names[0]),
        1,
        "while the node was rebooting"
    );

    // A driver that exits 1 fails the Job at once under the new policy: one
    // pod, reason PodFailurePolicy, no retry.
    sim.set_fault(&names[1], Fault::JobFails);
    let new = jobs
        .create(
            &PostParams::default(),
            &job_for(&nodes.get(&names[1]).await.unwrap()),
        )
        .await
        .unwrap();
    let failed = await_job(&client, ns.name(), &new.name_any(), "the Job fails", |j| {
        job_condition(j, "Failed")
    })
    .await;
    let c = failed
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Failed")
        .cloned()
        .unwrap();
    assert_eq!(c.reason.as_deref(), Some("PodFailurePolicy"));
    assert!(
        c.message
            .as_deref()
            .unwrap_or_default()
            .contains("failed with exit code 1 matching FailJob rule at index 2"),
        "{c:?}"
    );
    assert_eq!(
        pod_reasons(&client, ns.name(), &new.name_any()).await,
        ["Failed"]
    );
    assert_eq!(sim.upgrades_started(&names[1]), 0);
    sim.shutdown().await;
}
