//! `drover plan --preflight` against a real API server: a pool with 50
//! planted blockers (ten of each pod kind) and three nodes held by
//! workload consent lists each of them once and nothing else, and a
//! control pool of healthy workloads on the same API server, among them a
//! singleton behind a PDB that never allows a disruption which a `restart`
//! drain rule moves, lists nothing. The simulated kubelet runs the pods and
//! plays the disruption controller, so every PDB's status is computed, not
//! written.

use std::collections::BTreeSet;

use crate::support::kube::{sim_options, ControlPlane, TestNamespace};
use crate::support::kubelet::Kubelet;
use crate::support::preflight::{plant_blockers, plant_healthy, DRAIN_RULES};
use kube::Client;

const POOL: &str = "drover-test/pool";

/// `drover plan --preflight` for the nodes of `pool`, with the drain rules
/// of [`DRAIN_RULES`]: exit code and findings as (kind, object).
fn preflight(pool: &str) -> (i32, BTreeSet<(String, String)>, serde_json::Value) {
    let repo = crate::support::git::example_files_selecting(&format!("{POOL}={pool}"), "1.12.0");
    let env = repo.path().join("environments/test.toml");
    let text = std::fs::read_to_string(&env).unwrap();
    std::fs::write(&env, format!("{text}\n{DRAIN_RULES}")).unwrap();
    let (code, doc) = crate::support::preflight::plan_preflight(repo.path());
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
    (code, found, doc)
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
    let ns = planted.name();
    let expected = plant_blockers(&client, ns, &a).await;
    assert_eq!(expected.len(), 53);
    // The healthy pool, with the planted pool's PDBs (which select nothing
    // there) on the same API server.
    let hns = healthy.name();
    plant_healthy(&client, hns, &b).await;

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
    assert_eq!(doc["errors"].as_array().unwrap().len(), 53);

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
