//! The kustomize base applies to a real API server with server-side apply,
//! and the agent runs a rollout with exactly the permissions of its
//! ServiceAccount (impersonated) and nothing more.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{live_jobs, pool_options, start_sim, POOL_LABEL};
use crate::support::kube::{apply_deploy_file, retry_until, ControlPlane, TestNamespace};
use drover::rollout::VirtualClock;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

const SERVICE_ACCOUNT: &str = "system:serviceaccount:drover-system:drover";

/// Server-side apply every document of every file the kustomization lists, in its order.
async fn apply_base(client: &Client) -> Vec<String> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base");
    let k: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(base.join("kustomization.yaml")).unwrap())
            .unwrap();
    let mut applied = Vec::new();
    for file in k["resources"].as_sequence().unwrap() {
        let file = format!("base/{}", file.as_str().unwrap());
        let objects = apply_deploy_file(client, &file, "drover-system").await;
        if objects
            .iter()
            .any(|o| o.starts_with("CustomResourceDefinition/"))
        {
            install_crd(client).await;
        }
        applied.extend(objects);
    }
    applied
}

#[tokio::test]
async fn the_agent_needs_nothing_beyond_its_service_account() {
    let cp = ControlPlane::get();
    let admin = cp.admin_client().await;
    let applied = apply_base(&admin).await;
    for want in [
        "Namespace/drover-system",
        "Namespace/drover-upgrades",
        "NetworkPolicy/drover-webhook",
        "PodDisruptionBudget/drover",
        "CustomResourceDefinition/droverstatuses.drover.dev",
        "ServiceAccount/drover",
        "ClusterRole/drover",
        "Role/drover",
        "Deployment/drover",
        "Service/drover",
    ] {
        assert!(
            applied.iter().any(|a| a == want),
            "{want} not applied: {applied:?}"
        );
    }
    // Applying again is a no-op, not a conflict.
    apply_base(&admin).await;

    let pool = TestNamespace::create(&admin, "rbac-pool").await;
    let sim = start_sim(&admin, pool_options(pool.name(), 2)).await;
    let e = EnvSpec {
        env: "test".into(),
        cluster: "test-1".into(),
        version: "1.12.0".into(),
        schedule: "0 2 1 * *".into(),
        selector: format!("{POOL_LABEL}={}", pool.name()),
        soak: "0s".into(),
    };
    let repo = ConfigRepo::new(&[e]);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let mut cfg = agent_config(
        &repo,
        "test",
        "test-1",
        "drover-system",
        "drover-7d9f-abcde",
    );
    cfg.status_name = format!("test-1-{}", pool.name());
    cfg.lease_name = format!("drover-{}", pool.name());
    // As deploy/base wires it: upgrade Jobs in their own namespace.
    cfg.job_namespace = Some("drover-upgrades".into());
    // The shipped lease: its writes get the shipped 4 s bound, so an API
    // server slowed by a loaded machine is not taken for a missing
    // permission (the tests' 3 s lease bounds writes at 0.8 s).
    cfg.lease_duration = Duration::from_secs(15);
    let agent = RunningAgent::start(cfg.clone(), clock, Some(SERVICE_ACCOUNT));

    // As the ServiceAccount: confirm the current version, then roll to the next.
    await_status(
        &admin,
        "drover-system",
        &cfg.status_name,
        "initial confirmation",
        |s| s.state.as_deref() == Some("confirmed"),
    )
    .await;
    let bump = repo.bump("test", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
    await_status(
        &admin,
        "drover-system",
        &cfg.status_name,
        "rolled as the ServiceAccount",
        |s| {
            s.last_applied_commit.as_deref() == Some(bump.as_str())
                && s.target.as_deref() == Some("1.13.0")
                && s.state.as_deref() == Some("confirmed")
                && s.at_version.as_deref() == Some("2/2")
        },
    )
    .await;
    for n in sim.node_names() {
        assert_eq!(sim.version(&n).as_deref(), Some("1.13.0"));
    }
    // Every kind of write it makes went through: Lease, status, Events (namespace and nodes).
    let lease = Api::<Lease>::namespaced(admin.clone(), "drover-system")
        .get(&cfg.lease_name)
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("drover-7d9f-abcde")
    );
    // Events are published beside the status, not before it: wait for them.
    for (ns, reason) in [("drover-system", "Applied"), ("default", "Upgraded")] {
        let events = Api::<Event>::namespaced(admin.clone(), ns);
        retry_until(&format!("a {reason} Event in {ns}"), || async {
            let ev = events.list(&ListParams::default()).await.unwrap().items;
            let found = ev.iter().any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.reporting_instance.as_deref() == Some("drover-7d9f-abcde")
            });
            if found {
                Ok(())
            } else {
                Err("not yet")
            }
        })
        .await;
    }
    // The run over, each node's Jobs (prepare and upgrade) were deleted
    // with its give-back, in one deletecollection the Role grants.
    for n in sim.node_names() {
        let left: Vec<String> =
            live_jobs(&admin, "drover-upgrades", &format!("drover.dev/node={n}"))
                .await
                .iter()
                .map(|j| j.name_any())
                .collect();
        assert!(left.is_empty(), "{n}: Jobs left {left:?}");
    }
    // One routine Event per node, its outcome (Upgraded); the download in
    // service, the drain and the Job's start are in the log only (issue
    // 25). Published in order: once a node's Upgraded is there, any Event
    // before it is too.
    let node_events = Api::<Event>::namespaced(admin.clone(), "default");
    let reasons = |ev: &[Event], node: &str| -> Vec<String> {
        let mut r: Vec<String> = ev
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|o| o.name.as_deref()) == Some(node))
            .filter_map(|e| e.reason.clone())
            .collect();
        r.sort();
        r
    };
    retry_until("an Upgraded Event on every node", || async {
        let ev = node_events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let missing: Vec<String> = sim
            .node_names()
            .into_iter()
            .filter(|n| !reasons(&ev, n).iter().any(|r| r == "Upgraded"))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing)
        }
    })
    .await;
    let ev = node_events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for n in sim.node_names() {
        assert_eq!(reasons(&ev, &n), ["Upgraded"], "Events on {n}");
    }
    let m = agent.metrics().await;
    assert_eq!(
        sample(&m, r#"drover_reconciles_total{result="error"}"#),
        None,
        "a reconcile failed (missing permission?): {m}"
    );
    agent.stop();
    let released = Api::<Lease>::namespaced(admin.clone(), "drover-system")
        .get(&cfg.lease_name)
        .await
        .unwrap();
    assert_eq!(released.spec.unwrap().holder_identity, None);
    sim.shutdown().await;
}
