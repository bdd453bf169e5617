//! drover's node records are the agent's alone (issue 36), against the real
//! API server with the Node authorizer and NodeRestriction on, deploy/base
//! applied (its RBAC and its admission policy), and the `drover agent`
//! binary running as its ServiceAccount.
//!
//! Attack: a node's own kubelet credential (a client certificate for
//! `system:node:NAME` in `system:nodes`) and a credential holding `patch
//! nodes` write earlier releases' records on Nodes (`rolling-back` to a
//! revoked version, `failed`, `draining` with a cordon, a retry): drover
//! starts no Job, installs nothing, cordons and uncordons nothing, and its
//! report stays what the cluster is; it names each forged annotation once
//! (a Warning Event and a log line) however many passes follow. Neither
//! credential can create or change a record; a namespace admin of the
//! agent's namespace (RBAC on drovernodes) is refused by the admission
//! policy except for a person's retry annotation.
//!
//! Control: the agent's own ServiceAccount writes records, and a pinned
//! version moves every node.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{live_jobs, pool_options, record_of, start_sim, POOL_LABEL};
use crate::support::git::free_port;
use crate::support::kube::{
    api_code, create, retry_until, unschedulable, ControlPlane, TestNamespace,
};
use drover::record::legacy;
use drover::record::wire::DroverNode;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::Client;
use serde_json::json;

/// The earlier releases' record of `state` on a node, as a forger writes it.
fn forged(state: &str, extra: &[(&str, &str)]) -> serde_json::Value {
    let mut a: BTreeMap<&str, &str> = BTreeMap::from([
        (legacy::ANN_STATE, state),
        (legacy::ANN_TARGET, "1.12.0"),
        (legacy::ANN_STARTED_AT, "2026-12-01T02:30:00Z"),
        (legacy::ANN_CORDONED, "true"),
    ]);
    a.extend(extra.iter().copied());
    json!({ "metadata": { "annotations": a } })
}

async fn annotate(
    client: &Client,
    node: &str,
    patch: &serde_json::Value,
) -> Result<Node, kube::Error> {
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// A record as a forger would create it for `node`: rolling back to 1.0.0.
fn forged_record(node: &str) -> DroverNode {
    serde_json::from_value(json!({
        "apiVersion": "drover.dev/v1alpha1", "kind": "DroverNode",
        "metadata": { "name": node, "namespace": "drover-system" },
        "spec": { "node": node, "recordId": "forged", "environment": "test", "cluster": "test-1" },
        "status": {
            "phase": "rolling-back", "target": "1.12.0", "since": "2026-12-01T02:30:00Z",
            "attempt": 1, "cordonedByDrover": true, "previousVersion": "1.0.0",
        },
    }))
    .unwrap()
}

/// Cluster-wide rights to read and patch Nodes for `user`, as autoscalers
/// and labelling controllers hold them.
async fn grant_patch_nodes(admin: &Client, user: &str) {
    let name = format!("drover-test-{user}");
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": { "name": name },
        "rules": [{ "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"] }],
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .unwrap();
    create(&Api::all(admin.clone()), &role).await;
    create(&Api::all(admin.clone()), &binding).await;
}

/// Every right on drovernodes in drover-system for `user` (a namespace
/// admin, a wildcard role): what only the admission policy stops.
async fn grant_records(admin: &Client, user: &str) {
    let name = format!("drover-test-{user}");
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "drover-system" },
        "rules": [{ "apiGroups": ["drover.dev"], "resources": ["drovernodes"], "verbs": ["*"] }],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "drover-system" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .unwrap();
    create(&Api::namespaced(admin.clone(), "drover-system"), &role).await;
    create(&Api::namespaced(admin.clone(), "drover-system"), &binding).await;
}

/// The agent's `drover_reconciles_total{result="ok"}`.
async fn passes(addr: std::net::SocketAddr) -> f64 {
    let (_, text) = http(addr, "GET", "/metrics", &[], "").await;
    sample(&text, r#"drover_reconciles_total{result="ok"}"#).unwrap_or(0.0)
}

/// Wait for `n` more passes of the agent at `addr`.
async fn more_passes(addr: std::net::SocketAddr, n: f64) {
    let from = passes(addr).await;
    retry_until(&format!("{n} more passes"), || async {
        let now = passes(addr).await;
        if now >= from + n {
            Ok(())
        } else {
            Err(now)
        }
    })
    .await;
}

/// Lines of the agent's JSON log naming `node` and the ignored `annotation`.
fn named_in_log(log: &str, node: &str, annotation: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains("annotation on the node ignored")
                && l.contains(node)
                && l.contains(&format!("\"{annotation}="))
        })
        .count()
}

#[tokio::test]
async fn neither_a_nodes_credential_nor_patch_nodes_can_move_a_node_or_change_the_report() {
    let cp = ControlPlane::get();
    let admin = cp.admin_client().await;
    apply_base(&admin).await;
    let pool = TestNamespace::create(&admin, "records-attack").await;
    let sim = start_sim(&admin, pool_options(pool.name(), 3)).await;
    let nodes = sim.node_names();
    let (n0, n1, n2) = (nodes[0].clone(), nodes[1].clone(), nodes[2].clone());
    let e = EnvSpec {
        env: "test".into(),
        cluster: "test-1".into(),
        version: "1.12.0".into(),
        schedule: "0 2 1 * *".into(),
        selector: format!("{POOL_LABEL}={}", pool.name()),
        soak: "0s".into(),
    };
    let repo = ConfigRepo::new(&[e]);
    repo.revoke("1.0.0", "kernel panic on m7i");
    let status_name = format!("test-1-{}", pool.name());

    // The agent as deploy/base runs it: the binary, its ServiceAccount,
    // Jobs in drover-upgrades, inside its window (Dec 1, 03:00).
    let logs = repo.dir.path().join("agent.log");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let offset = (dec(1, 3, 0) - chrono::Utc::now()).num_seconds();
    let _agent = agent_process(
        env!("CARGO_BIN_EXE_drover"),
        &repo,
        &repo.url(),
        "drover-system",
        &addr.to_string(),
        &logs,
    )
    .env("KUBECONFIG", kubeconfig_as(SERVICE_ACCOUNT))
    .env("POD_NAME", format!("{}-agent", pool.name()))
    .env("DROVER_STATUS_NAME", &status_name)
    .env("DROVER_LEASE_NAME", format!("drover-{}", pool.name()))
    .env("DROVER_JOB_NAMESPACE", "drover-upgrades")
    .env("DROVER_CLOCK_OFFSET", format!("{offset:+}s"))
    .env("DROVER_POLL_INTERVAL", "1s")
    .env("DROVER_TICK", "1s")
    .spawn()
    .unwrap();
    await_status(
        &admin,
        "drover-system",
        &status_name,
        "confirmed at 1.12.0",
        |s| s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some("1.12.0"),
    )
    .await;

    // The node's own kubelet credential, and one holding `patch nodes`.
    let kubelet = cp
        .client_as_certificate(&format!("system:node:{n2}"), &["system:nodes"])
        .await;
    let patcher_user = format!("patcher-{}", pool.name());
    grant_patch_nodes(&admin, &patcher_user).await;
    let patcher = cp.client_as_certificate(&patcher_user, &[]).await;
    let records: Api<DroverNode> = Api::namespaced(kubelet.clone(), "drover-system");

    // The kubelet may annotate its own Node (NodeRestriction lets it):
    // rolling back to 1.0.0, revoked, outside any rule.
    let own = forged(
        "rolling-back",
        &[
            (legacy::ANN_PREVIOUS, "1.0.0"),
            (legacy::ANN_MESSAGE, "forged"),
        ],
    );
    retry_until("the kubelet annotates its own Node", || {
        annotate(&kubelet, &n2, &own)
    })
    .await;
    // Not another node's, and no record.
    let other = annotate(&kubelet, &n0, &forged("failed", &[])).await;
    assert_eq!(api_code(&other), Some(403), "{other:?}");
    let made = records
        .create(&Default::default(), &forged_record(&n2))
        .await;
    assert_eq!(
        api_code(&made),
        Some(403),
        "the kubelet made a record: {made:?}"
    );

    // `patch nodes`: a failed record on n0, a draining one with a cordon
    // on n1, a retry on n2.
    let failed = forged("failed", &[(legacy::ANN_MESSAGE, "forged failure")]);
    retry_until("the patcher's grant reaches the authorizer", || {
        annotate(&patcher, &n0, &failed)
    })
    .await;
    annotate(
        &patcher,
        &n1,
        &forged("draining", &[(legacy::ANN_PREVIOUS, "1.0.0")]),
    )
    .await
    .unwrap();
    Api::<Node>::all(patcher.clone())
        .patch(
            &n1,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    annotate(
        &patcher,
        &n2,
        &json!({ "metadata": { "annotations": { legacy::ANN_RETRY: "now" } } }),
    )
    .await
    .unwrap();
    let made = Api::<DroverNode>::namespaced(patcher.clone(), "drover-system")
        .create(&Default::default(), &forged_record(&n1))
        .await;
    assert_eq!(
        api_code(&made),
        Some(403),
        "the patcher made a record: {made:?}"
    );

    // Passes go by: each forged annotation is named once, nothing moves.
    retry_until("every forged annotation named", || async {
        let log = std::fs::read_to_string(&logs).unwrap_or_default();
        let all = [
            (&n2, legacy::ANN_STATE),
            (&n2, legacy::ANN_PREVIOUS),
            (&n2, legacy::ANN_RETRY),
            (&n0, legacy::ANN_STATE),
            (&n1, legacy::ANN_STATE),
        ];
        let missing: Vec<_> = all
            .iter()
            .filter(|(n, a)| named_in_log(&log, n, a) == 0)
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("{missing:?}"))
        }
    })
    .await;
    // Forged again, with new values: more passes, no second word.
    annotate(
        &patcher,
        &n0,
        &forged("failed", &[(legacy::ANN_MESSAGE, "forged again")]),
    )
    .await
    .unwrap();
    more_passes(addr, 5.0).await;
    let log = std::fs::read_to_string(&logs).unwrap();
    for (n, a) in [
        (&n2, legacy::ANN_STATE),
        (&n2, legacy::ANN_RETRY),
        (&n0, legacy::ANN_STATE),
        (&n0, legacy::ANN_MESSAGE),
        (&n1, legacy::ANN_CORDONED),
    ] {
        assert_eq!(named_in_log(&log, n, a), 1, "{n} {a} named once:\n{log}");
    }
    let ignored = |events: &[Event], node: &str| -> (i32, String) {
        let on: Vec<&Event> = events
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("AnnotationIgnored")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|o| o.name.as_deref()) == Some(node)
            })
            .collect();
        let told = on
            .iter()
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum();
        let notes = on
            .iter()
            .filter_map(|e| e.note.clone())
            .collect::<Vec<_>>()
            .join(" | ");
        (told, notes)
    };
    let list = || async {
        Api::<Event>::namespaced(admin.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    };
    let before = list().await;
    let (told_n2, notes) = ignored(&before, &n2);
    assert!(told_n2 >= 1, "{notes}");
    assert!(
        notes.contains("drover.dev/previous-version=1.0.0") && notes.contains("ignored"),
        "{notes}"
    );
    assert!(
        notes.contains("kubectl annotate drovernode -n drover-system"),
        "the retry is pointed to its place: {notes}"
    );
    more_passes(addr, 5.0).await;
    let after = list().await;
    for n in &nodes {
        assert_eq!(
            ignored(&after, n).0,
            ignored(&before, n).0,
            "{n}: named again"
        );
    }

    // Nothing moved: no Job, no record, no cordon but the patcher's own,
    // the report what the cluster is.
    for n in &nodes {
        assert!(
            live_jobs(&admin, "drover-upgrades", &format!("drover.dev/node={n}"))
                .await
                .is_empty(),
            "a Job for {n}"
        );
        assert_eq!(record_of(&admin, "drover-system", n).await, None, "{n}");
        assert_eq!(sim.upgrades_started(n), 0);
        assert_eq!(sim.version(n).as_deref(), Some("1.12.0"));
    }
    for n in &nodes {
        let node = Api::<Node>::all(admin.clone()).get(n).await.unwrap();
        assert_eq!(
            unschedulable(&node),
            *n == n1,
            "{n}: only the patcher's own cordon"
        );
    }
    let st = await_status(&admin, "drover-system", &status_name, "still", |_| true)
        .await
        .status
        .unwrap();
    assert_eq!(st.state.as_deref(), Some("confirmed"), "{st:?}");
    let report = repo.report("test", "test-1").expect("a report");
    assert_ne!(
        report.state.as_str(),
        "failed",
        "the forged failure reached the report"
    );
    assert!(report.detail.failed.is_empty(), "{:?}", report.detail);

    // A namespace admin of drover-system: RBAC lets it, the admission
    // policy does not, but for a person's retry. Control: the agent's own
    // ServiceAccount moves every node and writes their records.
    let admin_user = format!("records-admin-{}", pool.name());
    grant_records(&admin, &admin_user).await;
    let ns_admin = cp.client_as_certificate(&admin_user, &[]).await;
    let as_admin: Api<DroverNode> = Api::namespaced(ns_admin.clone(), "drover-system");
    let refused = retry_until("the admin's grant reaches the authorizer", || async {
        match as_admin
            .create(&Default::default(), &forged_record(&n2))
            .await
        {
            Err(kube::Error::Api(s))
                if s.code == 403 && s.message.contains("ValidatingAdmissionPolicy") =>
            {
                Ok(s.message)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        refused.contains("only the drover agent creates or deletes node records"),
        "{refused}"
    );
    Api::<Node>::all(admin.clone())
        .patch(
            &n1,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "unschedulable": null } })),
        )
        .await
        .unwrap();
    repo.bump("test", "1.13.0", true);
    await_status(
        &admin,
        "drover-system",
        &status_name,
        "confirmed at 1.13.0",
        |s| s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some("1.13.0"),
    )
    .await;
    for n in &nodes {
        assert_eq!(sim.version(n).as_deref(), Some("1.13.0"));
        assert_eq!(sim.upgrades_started(n), 1, "{n} moved once, to the pin");
        let r = record_of(&admin, "drover-system", n)
            .await
            .expect("its record");
        assert_eq!((r.progress, r.attempt), (None, 1), "{n}");
    }
    let status_patch = json!({ "status": { "phase": "rolling-back", "target": "1.13.0",
        "since": "2026-12-01T03:00:00Z", "previousVersion": "1.0.0", "cordonedByDrover": true } });
    let changed = as_admin
        .patch(&n0, &PatchParams::default(), &Patch::Merge(&status_patch))
        .await;
    assert_eq!(api_code(&changed), Some(403), "{changed:?}");
    let deleted = as_admin.delete(&n0, &DeleteParams::default()).await;
    assert_eq!(api_code(&deleted), Some(403), "{deleted:?}");
    let retry = json!({ "metadata": { "annotations": { drover::record::ANN_RETRY: "now" } } });
    as_admin
        .patch(&n0, &PatchParams::default(), &Patch::Merge(&retry))
        .await
        .expect("a person's retry is allowed");
    let other_annotation = json!({ "metadata": { "annotations": { "example.com/x": "y" } } });
    let refused = as_admin
        .patch(
            &n0,
            &PatchParams::default(),
            &Patch::Merge(&other_annotation),
        )
        .await;
    assert_eq!(api_code(&refused), Some(403), "{refused:?}");
    // The kubelet still cannot touch its record.
    let touched = records
        .patch(&n2, &PatchParams::default(), &Patch::Merge(&retry))
        .await;
    assert_eq!(api_code(&touched), Some(403), "{touched:?}");
    let _ = Duration::ZERO;
    sim.shutdown().await;
}
