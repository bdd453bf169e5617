//! The kustomize base applies to a real API server with server-side apply,
//! and the agent runs a rollout with exactly the permissions of its
//! ServiceAccount (impersonated) and nothing more.

use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{live_jobs, pool_options, start_sim, POOL_LABEL};
use crate::support::kube::{retry_until, ControlPlane, TestNamespace};
use drover::rollout::VirtualClock;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};

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
        "CustomResourceDefinition/drovernodes.drover.dev",
        "ValidatingAdmissionPolicy/drover-node-records",
        "ValidatingAdmissionPolicyBinding/drover-node-records",
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
    for (ns, reason) in [("drover-system", "Applied")] {
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
    // The run over, each node's runs (prepare and upgrade) are left to
    // their TTL, finished; each node's record, written by the
    // ServiceAccount through the admission policy, is idle.
    for n in sim.node_names() {
        let jobs = live_jobs(&admin, "drover-upgrades", &format!("drover.dev/node={n}")).await;
        assert_eq!(jobs.len(), 2, "{n}: {jobs:?}");
        assert!(jobs
            .iter()
            .all(|j| crate::support::kube::job_condition(j, "Complete")));
        let r = crate::support::backend::record_of(&admin, "drover-system", &n)
            .await
            .expect("a record");
        assert_eq!(r.progress, None, "{n}: {r:?}");
        assert_eq!(r.attempt, 1);
    }
    // No routine Event on the nodes: the download, the drain, the Job's
    // start and the return are in the log and the record (issue 36).
    // Published in order: once the status object's confirmation of 1.13.0
    // is out, any Event of the nodes before it is too.
    retry_until("the confirmation told twice", || async {
        let ev = Api::<Event>::namespaced(admin.clone(), "drover-system")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let told: i32 = ev
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("RolloutConfirmed")
                    && e.regarding.as_ref().and_then(|o| o.name.as_deref())
                        == Some(cfg.status_name.as_str())
            })
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum();
        if told >= 2 {
            Ok(())
        } else {
            Err(told)
        }
    })
    .await;
    let ev = Api::<Event>::namespaced(admin.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for n in sim.node_names() {
        let on: Vec<_> = ev
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|o| o.name.as_deref()) == Some(n.as_str()))
            .filter_map(|e| e.reason.clone())
            .collect();
        assert!(on.is_empty(), "Events on {n}: {on:?}");
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
