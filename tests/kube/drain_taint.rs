//! The pre-drain taint (`[[drain]] taint`, docs/config.md): a fake
//! database operator that watches for `drover.dev/draining` moves its pod
//! off a node before drover cordons it, in 50 of 50 drains. Against the
//! real API server with simulated kubelet nodes, the engine driven by the
//! Kubernetes backend: two nodes, one at a time, 25 versions in a row, the
//! operator's pod moving to the other node at each taint (so every drain
//! is of the node holding it). A watch of the test's own checks, at every
//! cordon, that no pod of the operator is bound to the node.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::backend::{cluster, drive, open_window, policy, pool_options, start_sim};
use crate::support::kube::{
    await_gone, await_pod, create, pod_on, pod_running_ready, unschedulable, ControlPlane,
    TestNamespace,
};
use drover::config::DRAIN_TAINT;
use drover::rollout::{Engine, Labels, RolloutState, SystemClock};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

const RUNS: usize = 50;

fn tainted(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == DRAIN_TAINT))
}

/// Where the operator's one pod `db-N` is, by node name, and how many moves.
#[derive(Default)]
struct Operator {
    moves: usize,
    seq: usize,
}

/// The fake operator: at each node event, if the node carries drover's
/// pre-drain taint and holds its pod, it deletes the pod and makes it again
/// on the other node (a switchover).
async fn operator(client: Client, ns: String, nodes: Vec<String>, state: Arc<Mutex<Operator>>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let api: Api<Node> = Api::all(client.clone());
    let sel = format!("{}={ns}", crate::support::backend::POOL_LABEL);
    let mut stream = watcher(api, watcher::Config::default().labels(&sel)).boxed();
    while let Some(ev) = stream.next().await {
        let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev else {
            continue;
        };
        if !tainted(&n) {
            continue;
        }
        let here: Vec<Pod> = pods
            .list(
                &ListParams::default()
                    .labels("app=db")
                    .fields(&format!("spec.nodeName={}", n.name_any())),
            )
            .await
            .unwrap()
            .items;
        if here.is_empty() {
            continue;
        }
        for p in &here {
            let _ = pods
                .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
                .await;
            await_gone(&pods, &p.name_any()).await;
        }
        let to = nodes.iter().find(|m| **m != n.name_any()).unwrap().clone();
        let name = {
            let mut s = state.lock().unwrap();
            s.moves += 1;
            s.seq += 1;
            format!("db-{}", s.seq)
        };
        create(&pods, &pod_on(&name, &to, &[("app", "db")], 0)).await;
    }
}

/// The test's own check: at every cordon it sees, the pods of the operator
/// bound to that node (none is right).
async fn cordons(client: Client, ns: String, seen: Arc<Mutex<Vec<(String, usize)>>>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let api: Api<Node> = Api::all(client.clone());
    let sel = format!("{}={ns}", crate::support::backend::POOL_LABEL);
    let mut stream = watcher(api, watcher::Config::default().labels(&sel)).boxed();
    let mut cordoned = std::collections::BTreeSet::new();
    while let Some(ev) = stream.next().await {
        let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev else {
            continue;
        };
        let name = n.name_any();
        if !unschedulable(&n) {
            cordoned.remove(&name);
            continue;
        }
        if !cordoned.insert(name.clone()) {
            continue;
        }
        let left = pods
            .list(
                &ListParams::default()
                    .labels("app=db")
                    .fields(&format!("spec.nodeName={name}")),
            )
            .await
            .unwrap()
            .items
            .len();
        seen.lock().unwrap().push((name, left));
    }
}

#[tokio::test]
async fn an_operator_watching_the_pre_drain_taint_moves_its_pod_before_the_cordon_in_50_of_50_drains(
) {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    let ns = TestNamespace::create(&client, "drain-taint").await;
    let mut opts = pool_options(ns.name(), 2);
    opts.reboot = Duration::from_millis(100);
    let sim = start_sim(&client, opts).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    let cluster = cluster(ns.name()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    create(&pods, &pod_on("db-0", &nodes[0], &[("app", "db")], 0)).await;
    await_pod(
        &client,
        ns.name(),
        "db-0",
        "Running and Ready",
        pod_running_ready,
    )
    .await;
    let state = Arc::new(Mutex::new(Operator::default()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let op = tokio::spawn(operator(
        client.clone(),
        ns.name().to_string(),
        nodes.clone(),
        state.clone(),
    ));
    let check = tokio::spawn(cordons(client.clone(), ns.name().to_string(), seen.clone()));
    // The rule a CloudNativePG user writes (docs/config.md), with a lead
    // of one second so that 50 drains stay fast.
    let rules = drover::config::parse_env(
        "environments/test.toml",
        "test",
        "version = \"1.13.0\"\n[[drain]]\nname = \"postgres\"\nselector = \"app=db\"\n\
         taint = \"1s\"\nladder = [\"evict 30m\", \"skip\"]\n[rollout]\ndrain_timeout = \"1h\"\n\
         node_timeout = \"2h\"\n",
    )
    .expect("the documented rule is valid")
    .drain;
    for i in 1..=RUNS / 2 {
        let mut p = policy(
            &format!("1.13.{i}"),
            1,
            Duration::from_secs(60),
            Duration::from_secs(120),
        );
        p.drain = rules.clone();
        let engine = Engine::new(p, Labels::default(), SystemClock);
        drive(
            &engine,
            &cluster,
            &open_window(),
            Duration::from_secs(60),
            |o| o.decision.state == RolloutState::Confirmed,
        )
        .await;
    }
    op.abort();
    check.abort();
    let seen = seen.lock().unwrap().clone();
    let moves = state.lock().unwrap().moves;
    let late: Vec<&(String, usize)> = seen.iter().filter(|(_, left)| *left > 0).collect();
    assert_eq!(seen.len(), RUNS, "cordons seen: {seen:?}");
    assert_eq!(moves, RUNS, "the operator moved its pod {moves} times");
    assert!(
        late.is_empty(),
        "cordoned with the operator's pod still on it: {late:?}"
    );
    for n in &nodes {
        let node = Api::<Node>::all(client.clone()).get(n).await.unwrap();
        assert!(
            !tainted(&node) && !unschedulable(&node),
            "{n} kept drover's taint or cordon"
        );
    }
    sim.shutdown().await;
}
