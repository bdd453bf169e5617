//! `drover plan --preflight` against a real API server: a pool with 50
//! planted blockers (ten of each kind) lists each of them once and nothing
//! else, and a control pool of healthy workloads on the same API server
//! lists nothing. The simulated kubelet runs the pods and plays the
//! disruption controller, so every PDB's status is computed, not written.

use std::collections::BTreeSet;

use crate::support::kube::{
    await_pdb, create, daemon_pod, pdb_settled, pod_on, sim_options, ControlPlane, TestNamespace,
};
use crate::support::kubelet::Kubelet;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::json;

const POOL: &str = "drover-test/pool";

fn owned(mut pod: Pod, kind: &str, name: &str, uid: &str) -> Pod {
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        ..Default::default()
    }]);
    pod
}

fn fake_uid(i: usize) -> String {
    format!("00000000-0000-0000-0000-{i:012}")
}

fn pdb(name: &str, app: &str, spec: serde_json::Value) -> PodDisruptionBudget {
    let mut spec = spec;
    spec["selector"] = json!({ "matchLabels": { "app": app } });
    serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": { "name": name }, "spec": spec,
    }))
    .unwrap()
}

/// A Deployment of `replicas`, its ReplicaSet, and that ReplicaSet's pod
/// on `node` (no controller-manager runs: each object is created as the
/// controllers would have made it).
async fn deployment(client: &Client, ns: &str, name: &str, replicas: i32, node: &str) {
    let labels = json!({ "app": name });
    let template = json!({
        "metadata": { "labels": labels },
        "spec": { "containers": [{ "name": "app", "image": "registry.example/app:1" }] },
    });
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let dep: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name },
        "spec": { "replicas": replicas, "selector": { "matchLabels": labels }, "template": template },
    }))
    .unwrap();
    let dep = create(&deps, &dep).await;
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let mut rs: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": { "name": format!("{name}-7d9f") },
        "spec": { "replicas": replicas, "selector": { "matchLabels": labels }, "template": template },
    }))
    .unwrap();
    rs.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: name.into(),
        uid: dep.uid().unwrap(),
        controller: Some(true),
        ..Default::default()
    }]);
    let rs = create(&rss, &rs).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = pod_on(&format!("{name}-7d9f-a"), node, &[("app", name)], 1);
    create(
        &pods,
        &owned(pod, "ReplicaSet", &rs.name_any(), &rs.uid().unwrap()),
    )
    .await;
}

/// `drover plan --preflight` for the nodes of `pool`: exit code and findings as (kind, object).
fn preflight(pool: &str) -> (i32, BTreeSet<(String, String)>, serde_json::Value) {
    let repo = crate::support::git::example_files_selecting(&format!("{POOL}={pool}"), "1.12.0");
    let out = crate::support::cli::drover_command()
        .arg("--repo")
        .arg(repo.path())
        .args([
            "--format",
            "json",
            "plan",
            "--env",
            "test",
            "--preflight",
            "--kubeconfig",
        ])
        .arg(ControlPlane::get().kubeconfig_path())
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    crate::support::cli::assert_valid("plan", &doc);
    let found = doc["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("{doc:#}"))
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["object"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (out.status.code().unwrap(), found, doc)
}

async fn pool(client: &Client, ns: &TestNamespace, nodes: usize) -> (Kubelet, Vec<String>) {
    let mut opts = sim_options(ns.name());
    opts.nodes = nodes;
    opts.labels.insert(POOL.into(), ns.name().to_string());
    let sim = Kubelet::start(client.clone(), opts)
        .await
        .expect("simulated nodes");
    let mut names = sim.node_names();
    names.sort();
    (sim, names)
}

#[tokio::test]
async fn preflight_lists_every_planted_blocker_once_and_nothing_on_a_healthy_pool() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    let planted = TestNamespace::create(&client, "preflight").await;
    let healthy = TestNamespace::create(&client, "preflight-ok").await;
    let (sim_a, a) = pool(&client, &planted, 5).await;
    let (sim_b, b) = pool(&client, &healthy, 3).await;
    let (ns, pods, pdbs) = (
        planted.name(),
        Api::<Pod>::namespaced(client.clone(), planted.name()),
        Api::<PodDisruptionBudget>::namespaced(client.clone(), planted.name()),
    );
    let mut expected = BTreeSet::new();
    for i in 0..10 {
        let node = &a[i % a.len()];
        let other = &a[(i + 1) % a.len()];
        // A PDB that can never allow an eviction: minAvailable = its pods.
        let app = format!("never-{i}");
        for (j, n) in [node, other].into_iter().enumerate() {
            let p = pod_on(&format!("{app}-{j}"), n, &[("app", &app)], 1);
            create(
                &pods,
                &owned(p, "ReplicaSet", &format!("{app}-rs"), &fake_uid(i)),
            )
            .await;
        }
        create(&pdbs, &pdb(&app, &app, json!({ "minAvailable": 2 }))).await;
        expected.insert(("pdb-never-allows".into(), format!("{ns}/{app}")));
        // A PDB that could allow one but allows none now: one of its three
        // pods is bound to a node that does not exist, so never Ready.
        let app = format!("busy-{i}");
        for (j, n) in [node.as_str(), other.as_str(), "nowhere"]
            .into_iter()
            .enumerate()
        {
            let p = pod_on(&format!("{app}-{j}"), n, &[("app", &app)], 1);
            create(
                &pods,
                &owned(p, "ReplicaSet", &format!("{app}-rs"), &fake_uid(100 + i)),
            )
            .await;
        }
        create(&pdbs, &pdb(&app, &app, json!({ "minAvailable": 2 }))).await;
        expected.insert(("pdb-allows-none-now".into(), format!("{ns}/{app}")));
        // A Deployment of one replica.
        let app = format!("single-{i}");
        deployment(&client, ns, &app, 1, node).await;
        expected.insert(("single-replica".into(), format!("{ns}/{app}")));
        // A pod no controller owns.
        let app = format!("bare-{i}");
        create(&pods, &pod_on(&app, node, &[("app", &app)], 1)).await;
        expected.insert(("no-controller".into(), format!("{ns}/{app}")));
        // A pod with an emptyDir.
        let app = format!("scratch-{i}");
        let mut p = owned(
            pod_on(&format!("{app}-0"), node, &[("app", &app)], 1),
            "ReplicaSet",
            &format!("{app}-rs"),
            &fake_uid(200 + i),
        );
        p.spec.as_mut().unwrap().volumes = Some(vec![serde_json::from_value(
            json!({ "name": "scratch", "emptyDir": {} }),
        )
        .unwrap()]);
        create(&pods, &p).await;
        expected.insert(("local-storage".into(), format!("{ns}/{app}-0")));
    }
    assert_eq!(expected.len(), 50);

    // The healthy pool: replicated Deployments behind PDBs that allow one
    // disruption, a DaemonSet's pods, and the planted pool's PDBs (which
    // select nothing here) on the same API server.
    let (hns, hpods, hpdbs) = (
        healthy.name(),
        Api::<Pod>::namespaced(client.clone(), healthy.name()),
        Api::<PodDisruptionBudget>::namespaced(client.clone(), healthy.name()),
    );
    for i in 0..5 {
        let app = format!("web-{i}");
        deployment(&client, hns, &app, 3, &b[i % b.len()]).await;
        for (j, n) in b.iter().enumerate().take(2) {
            let p = pod_on(&format!("{app}-x-{j}"), n, &[("app", &app)], 1);
            create(
                &hpods,
                &owned(p, "ReplicaSet", &format!("{app}-7d9f"), &fake_uid(300 + i)),
            )
            .await;
        }
        create(&hpdbs, &pdb(&app, &app, json!({ "maxUnavailable": 1 }))).await;
    }
    for (i, n) in b.iter().enumerate() {
        create(&hpods, &daemon_pod(&format!("node-agent-{i}"), n)).await;
    }
    // Every PDB's status computed before the cluster is read.
    for i in 0..10 {
        for (app, allowed) in [(format!("never-{i}"), 0), (format!("busy-{i}"), 0)] {
            await_pdb(&client, ns, &app, "status computed", |p| {
                pdb_settled(p, |s| s.disruptions_allowed == Some(allowed))
            })
            .await;
        }
    }
    for i in 0..5 {
        await_pdb(
            &client,
            hns,
            &format!("web-{i}"),
            "one disruption allowed",
            |p| pdb_settled(p, |s| s.disruptions_allowed == Some(1)),
        )
        .await;
    }

    let (code, found, doc) = preflight(ns);
    let missed: Vec<_> = expected.difference(&found).collect();
    let extra: Vec<_> = found.difference(&expected).collect();
    assert!(
        missed.is_empty() && extra.is_empty(),
        "missed {missed:?}\nfalse alarms {extra:?}\n{doc:#}"
    );
    assert_eq!(code, 1, "findings exit 1");
    assert_eq!(doc["nodes"], 5);
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["errors"].as_array().unwrap().len(), 50);

    let (code, found, doc) = preflight(hns);
    assert!(
        found.is_empty(),
        "false alarms on the healthy pool: {doc:#}"
    );
    assert_eq!(code, 0);
    assert_eq!(doc["nodes"], 3);
    assert_eq!(doc["ok"], true);
    sim_a.shutdown().await;
    sim_b.shutdown().await;
}
