//! `drover plan --kubeconfig` reads the nodes of a real cluster (never
//! changing them) and forecasts the rollout from them.

use crate::support::kube::{sim_options, ControlPlane, TestNamespace};
use crate::support::kubelet::Kubelet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

#[tokio::test]
async fn plans_from_the_nodes_of_a_real_cluster() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    // drover installed (its CRDs): plan reads the node records as the agent
    // does. It passed in a full run only when another test had installed
    // them first.
    crate::support::agent::install_crd(&client).await;
    let ns = TestNamespace::create(&client, "plan").await;
    let mut opts = sim_options(ns.name());
    opts.nodes = 4;
    opts.labels
        .insert("drover-test/pool".into(), ns.name().to_string());
    let sim = Kubelet::start(client.clone(), opts)
        .await
        .expect("simulated nodes");

    // example-repo, with test selecting only this test's nodes.
    let repo = crate::support::git::example_files_selecting(
        &format!("drover-test/pool={}", ns.name()),
        "1.13.2",
    );

    let out = crate::support::cli::drover_command()
        .arg("--repo")
        .arg(repo.path())
        .args(["--format", "json", "plan", "--env", "test", "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .args([
            "--cluster",
            "test-1",
            "--node-time",
            "30m",
            "--now",
            "2026-12-01T01:30:00Z",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["cluster"], "test-1");
    assert_eq!(plan["decision"]["nodes"], 4, "{plan:#}");
    assert_eq!(plan["forecast"]["nodes_to_upgrade"], 4);
    // The window (02:00-08:00 Madrid = 01:00-07:00Z) is open: the agent would
    // start one node now, by downloading its update in service (the
    // Bottlerocket driver prepares before the drain); 4 nodes × 30m fit in
    // this window.
    let actions = plan["decision"]["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 1, "{actions:?}");
    assert_eq!(actions[0]["action"], "prepare");
    assert_eq!(plan["forecast"]["windows_needed"], 1);

    // Planning changed nothing on the cluster.
    let nodes: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("drover-test/pool={}", ns.name()));
    for n in nodes.list(&lp).await.unwrap() {
        assert_ne!(n.spec.and_then(|s| s.unschedulable), Some(true));
        assert!(n
            .metadata
            .annotations
            .unwrap_or_default()
            .keys()
            .all(|k| !k.starts_with("drover.dev/")));
    }
    sim.shutdown().await;
}
