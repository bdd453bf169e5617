//! The preflight's fixtures (`drover plan --preflight` and the agent's
//! preflight before a window read them alike): 50 planted blockers, ten of
//! each pod kind, and three nodes held by workload consent on a pool of
//! simulated nodes, and a control pool of healthy workloads with a
//! singleton a `restart` drain rule moves; both judged by the drain rules
//! of [`DRAIN_RULES`]. No controller-manager runs: each object is created
//! as the controllers would have made it, and the simulated kubelet
//! computes every PodDisruptionBudget's status.

use std::collections::BTreeSet;

use super::kube::{await_pdb, controller_ref, create, daemon_pod, pdb_settled, pod_on};
use drover::config::{CONSENT_LABEL, CONSENT_PAUSED};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The `[[drain]]` tables of the environment both preflights judge by
/// (fits a `drain_timeout` of 5 minutes): the planted pool's `single-0` is
/// matched first by a rule without `restart`, so it stays a finding though
/// the later rule would restart it; the control pool's `solo` is restarted.
pub const DRAIN_RULES: &str = "[[drain]]\nname = \"evict-only\"\nselector = \"app=single-0\"\n\
ladder = [\"evict 2m\", \"skip\"]\n\n[[drain]]\nname = \"singletons\"\n\
selector = \"app in (single-0, solo)\"\nladder = [\"restart 2m\", \"evict\"]\n";

/// Label node `node`'s workload consent `value`.
async fn label_consent(client: &Client, node: &str, value: &str) {
    let patch = json!({ "metadata": { "labels": { CONSENT_LABEL: value } } });
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("label node {node}: {e}"));
}

/// `drover plan --env test --preflight` against the test control plane for
/// the config repository at `repo`, as JSON: its exit code and document.
pub fn plan_preflight(repo: &std::path::Path) -> (i32, serde_json::Value) {
    let out = super::cli::drover_command()
        .arg("--repo")
        .arg(repo)
        .args([
            "--format",
            "json",
            "plan",
            "--env",
            "test",
            "--preflight",
            "--kubeconfig",
        ])
        .arg(super::kube::ControlPlane::get().kubeconfig_path())
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), doc)
}

fn owned(mut pod: Pod, kind: &str, name: &str, uid: &str) -> Pod {
    pod.metadata.owner_references = Some(vec![controller_ref(kind, name, uid)]);
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
pub async fn deployment(client: &Client, ns: &str, name: &str, replicas: i32, node: &str) {
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
    rs.metadata.owner_references = Some(vec![controller_ref(
        "Deployment",
        name,
        &dep.uid().unwrap(),
    )]);
    let rs = create(&rss, &rs).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = pod_on(&format!("{name}-7d9f-a"), node, &[("app", name)], 1);
    create(
        &pods,
        &owned(pod, "ReplicaSet", &rs.name_any(), &rs.uid().unwrap()),
    )
    .await;
}

/// Plant 50 blockers in namespace `ns` on `a` (at least five nodes), ten of
/// each pod kind, and hold three of the nodes by workload consent (a
/// fourth carries the label with a value that holds nothing), and wait
/// until every PDB's status is computed; returns the 53 as (kind, object),
/// as `drover plan --preflight` names them.
pub async fn plant_blockers(client: &Client, ns: &str, a: &[String]) -> BTreeSet<(String, String)> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns);
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
        deployment(client, ns, &app, 1, node).await;
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
    for (i, node) in a.iter().enumerate().take(4) {
        if i == 1 {
            label_consent(client, node, "go").await;
        } else {
            label_consent(client, node, CONSENT_PAUSED).await;
            expected.insert(("consent-held".into(), node.clone()));
        }
    }
    assert_eq!(expected.len(), 53);

    for i in 0..10 {
        for (app, allowed) in [(format!("never-{i}"), 0), (format!("busy-{i}"), 0)] {
            await_pdb(client, ns, &app, "status computed", |p| {
                pdb_settled(p, |s| s.disruptions_allowed == Some(allowed))
            })
            .await;
        }
    }
    expected
}

/// The control: in namespace `hns` on `b`, replicated Deployments behind
/// PDBs that allow one disruption, a DaemonSet's pods, and `solo`, a
/// Deployment of one replica behind a PDB that never allows a disruption
/// which [`DRAIN_RULES`] restarts, every PDB's status computed: nothing a
/// preflight judging by those rules should list.
pub async fn plant_healthy(client: &Client, hns: &str, b: &[String]) {
    let hpods = Api::<Pod>::namespaced(client.clone(), hns);
    let hpdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), hns);
    for i in 0..5 {
        let app = format!("web-{i}");
        deployment(client, hns, &app, 3, &b[i % b.len()]).await;
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
    deployment(client, hns, "solo", 1, &b[0]).await;
    create(&hpdbs, &pdb("solo", "solo", json!({ "minAvailable": 1 }))).await;
    await_pdb(client, hns, "solo", "status computed", |p| {
        pdb_settled(p, |s| {
            s.expected_pods == Some(1)
                && s.current_healthy == Some(1)
                && s.disruptions_allowed == Some(0)
        })
    })
    .await;
    for i in 0..5 {
        await_pdb(
            client,
            hns,
            &format!("web-{i}"),
            "one disruption allowed",
            |p| pdb_settled(p, |s| s.disruptions_allowed == Some(1)),
        )
        .await;
    }
}
