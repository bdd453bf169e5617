//! Upgrade from the release before node records (issue 36): a cluster
//! mid-rollout, its records in the Nodes' annotations and its run in a Job
//! as that release wrote them (`record::legacy`, the encoding kept only for
//! this), is taken over by the new agent once: the node upgrading finishes
//! on its Job without a second cordon or a second run, a `rolling-back`
//! record without its rollback Job is not migrated and is named, the old
//! annotations are removed, and the marker is set so they are never read
//! again. Counted from the audit log.

use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{await_node_record, pool_options, record_of, start_sim};
use crate::support::kube::{create, events_for, ControlPlane, TestNamespace};
use chrono::Utc;
use drover::cluster::{NodeProgress, ProgressState};
use drover::record::legacy;
use drover::rollout::VirtualClock;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use semver::Version;
use serde_json::json;

const UA: &str = "drover-test-migrate/1";

fn v(s: &str) -> Version {
    s.parse().unwrap()
}

/// The upgrade Job the release before wrote for `node`'s drain begun at
/// `started_at`: its labels and annotations, and the pod a kubelet runs.
fn legacy_job(node: &str, target: &str, started_at: &str) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": format!("drover-{node}-{}-legacy", target.replace('.', "-")),
            "labels": {
                "app.kubernetes.io/managed-by": "drover",
                "drover.dev/node": node,
                "drover.dev/target-version": target,
                "drover.dev/attempt": "1764557700",
            },
            "annotations": {
                legacy::JOB_VERSION: target,
                legacy::JOB_STARTED_AT: started_at,
                legacy::JOB_ACTION: "upgrade",
                legacy::ANN_PREVIOUS: "1.12.0",
            },
        },
        "spec": {
            "backoffLimit": 6,
            "template": {
                "metadata": { "labels": { "app.kubernetes.io/managed-by": "drover", "drover.dev/node": node } },
                "spec": {
                    "nodeName": node, "restartPolicy": "Never",
                    "containers": [{ "name": "update", "image": "registry.example/drover-bottlerocket:1" }],
                },
            },
        },
    }))
    .unwrap()
}

/// Write the release before's record of `progress` on `node`, cordoning it
/// when `cordon`, as that release did (one patch).
async fn write_legacy(client: &kube::Client, node: &str, p: &NodeProgress, cordon: bool) {
    let mut patch = json!({ "metadata": { "annotations": legacy::encode(p, &[]) } });
    if cordon {
        patch["spec"] = json!({ "unschedulable": true });
    }
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams {
                field_manager: Some("drover".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cluster_mid_rollout_is_taken_over_without_a_second_cordon_or_a_lost_node() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "migrate").await;
    let mut opts = pool_options(ns.name(), 3);
    // Long enough for the takeover to happen while n0 reboots.
    opts.reboot = Duration::from_secs(6);
    let sim = start_sim(&client, opts).await;
    let nodes = sim.node_names();
    let (n0, n1, n2) = (nodes[0].clone(), nodes[1].clone(), nodes[2].clone());
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let bump = repo.bump("test", "1.13.0", true);
    // The release before had applied the bump: its status object says so.
    let dst: Api<drover::agent::crd::DroverStatus> = Api::namespaced(client.clone(), ns.name());
    create(
        &dst,
        &drover::agent::crd::DroverStatus::new(
            "test-test-1",
            drover::agent::crd::DroverStatusSpec {
                environment: "test".into(),
                cluster: "test-1".into(),
            },
        ),
    )
    .await;
    dst.patch_status(
        "test-test-1",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "lastAppliedCommit": bump, "appliedVersion": "1.13.0", "target": "1.13.0",
            "state": "rolling",
        } })),
    )
    .await
    .unwrap();

    // As the release before left it: n0 drained, cordoned, its upgrade Job
    // running (the record on the node says draining, the Job upgrading);
    // n1 marked rolled back from an older version; n2 carrying a
    // `rolling-back` record no rollback Job stands for.
    let started = "2026-12-01T02:55:00Z";
    let draining = NodeProgress {
        state: ProgressState::Draining,
        target: v("1.13.0"),
        started_at: started.parse().unwrap(),
        cordoned_by_drover: true,
        message: String::new(),
        retries: 0,
        previous: Some(v("1.12.0")),
    };
    write_legacy(&client, &n0, &draining, true).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns.name());
    let job = create(&jobs, &legacy_job(&n0, "1.13.0", started)).await;
    await_node_record(&client, ns.name(), &n0, "rebooting", |n, _| {
        crate::support::kube::node_ready(n) == Some("False")
    })
    .await;
    Api::<Node>::all(client.clone())
        .patch(
            &n1,
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "annotations": { legacy::ANN_ROLLED_BACK: "1.11.0" } } }),
            ),
        )
        .await
        .unwrap();
    let rolling_back = NodeProgress {
        state: ProgressState::RollingBack,
        target: v("1.13.0"),
        previous: Some(v("1.0.0")),
        cordoned_by_drover: false,
        ..draining.clone()
    };
    write_legacy(&client, &n2, &rolling_back, false).await;

    // The new agent.
    let from = Utc::now();
    let mut config = config_as(None).await;
    config
        .headers
        .push((http::header::USER_AGENT, http::HeaderValue::from_static(UA)));
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-new");
    cfg.poll = Duration::from_secs(600);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let agent = RunningAgent::start_with_config(cfg, clock, config);
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "confirmed at 1.13.0",
        |s| s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some("1.13.0"),
    )
    .await
    .status
    .unwrap();
    assert_eq!(
        st.node_records.as_deref(),
        Some("DroverNode"),
        "the migration's marker"
    );

    // n0 finished on its Job: one run, no second cordon, no Job made.
    assert_eq!(sim.upgrades_started(&n0), 1, "one run");
    for n in &nodes {
        assert_eq!(sim.version(n).as_deref(), Some("1.13.0"), "{n}");
        let node = Api::<Node>::all(client.clone()).get(n).await.unwrap();
        assert!(
            !crate::support::kube::unschedulable(&node),
            "{n} left cordoned"
        );
        assert!(
            node.annotations()
                .keys()
                .all(|k| !k.starts_with("drover.dev/")),
            "{n}: the old record is gone: {:?}",
            node.annotations()
        );
    }
    let r0 = record_of(&client, ns.name(), &n0).await.unwrap();
    assert_eq!(r0.progress, None);
    let run = r0.run.unwrap();
    assert_eq!(
        (run.name.as_str(), run.uid),
        (job.name_any().as_str(), job.uid()),
        "its record took over the Job the release before made"
    );
    // n1 kept its mark (it only forbids); n2's rolling-back was not taken
    // for a rollback (none to 1.0.0 ran) and was named.
    let r1 = record_of(&client, ns.name(), &n1).await.unwrap();
    assert_eq!(r1.rolled_back, vec![v("1.11.0")]);
    assert_eq!(
        sim.upgrades_started(&n2),
        1,
        "upgraded to the pin, never rolled back"
    );
    let named = events_for(&client, "default", &n2).await;
    assert!(
        named
            .iter()
            .any(|e| e.reason.as_deref() == Some("RecordNotMigrated")
                && e.note.as_deref().unwrap_or("").contains("rolling-back")),
        "{named:?}"
    );
    agent.stop();

    let log = cp.audited(&client).await;
    let by_agent = |resource: &str, verb: &str, name: &str| {
        log.iter()
            .filter(|a| {
                a.user_agent.starts_with(UA)
                    && a.received >= from
                    && a.resource == resource
                    && a.verb == verb
                    && (name.is_empty() || a.name == name)
                    && (200..300).contains(&a.code)
            })
            .count()
    };
    // n0: the uncordon, and the removal of the old annotations; never a cordon.
    assert_eq!(
        by_agent("nodes", "patch", &n0),
        2,
        "clear the annotations, uncordon"
    );
    let of_n0 =
        crate::support::backend::live_jobs(&client, ns.name(), &format!("drover.dev/node={n0}"))
            .await;
    assert_eq!(
        of_n0.iter().map(|j| j.name_any()).collect::<Vec<_>>(),
        [job.name_any()],
        "no second run for n0"
    );
    sim.shutdown().await;
}
