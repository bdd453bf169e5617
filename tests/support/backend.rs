//! For the Kubernetes backend tests and benches: a selected pool of simulated
//! nodes per test, the engine driven by the backend's change notification,
//! and a watch that checks the unavailability budget at every node event.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use drover::cluster::{NodeProgress, NodeRecord};
use drover::config::{DriverSpec, MaxUnavailable, NodesSpec, OnDrainTimeout};
use drover::kubernetes::{KubeCluster, KubeOptions};
use drover::record::wire::DroverNode;
use drover::rollout::{Engine, Inputs, Labels, Outcome, Policy, SystemClock, WindowState};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use semver::Version;

use super::kube::{sim_options, ControlPlane};
use super::kubelet::{Kubelet, KubeletOptions};

/// Label put on a test's nodes; its value is the test's namespace.
pub const POOL_LABEL: &str = "drover.dev/test-pool";

/// Simulator options for `n` nodes at 1.12.0 carrying the test's pool label.
pub fn pool_options(ns: &str, n: usize) -> KubeletOptions {
    let mut opts = sim_options(ns);
    opts.nodes = n;
    opts.labels = BTreeMap::from([(POOL_LABEL.to_string(), ns.to_string())]);
    opts
}

/// Starts the simulator.
pub async fn start_sim(client: &Client, opts: KubeletOptions) -> Kubelet {
    Kubelet::start(client.clone(), opts)
        .await
        .expect("simulator starts")
}

/// Backend options selecting the test's pool, Jobs and records in its namespace.
pub fn kube_options(ns: &str) -> KubeOptions {
    KubeOptions {
        cluster_name: format!("test-{ns}"),
        namespace: ns.to_string(),
        records_namespace: ns.to_string(),
        environment: "test".into(),
        node_selector: format!("{POOL_LABEL}={ns}"),
        nodes: NodesSpec {
            version_regex: regex::Regex::new(r"(\d+\.\d+\.\d+)").unwrap(),
            ..NodesSpec::default()
        },
        driver: DriverSpec::Bottlerocket {
            image: Some("registry.example/drover-bottlerocket:1".into()),
        },
        job_deadline: Some(Duration::from_secs(600)),
        job_ttl: Duration::from_secs(3600),
        ready_timeout: Duration::from_secs(60),
        pod_watches: drover::kubernetes::observe::MAX_POD_WATCHES,
    }
}

/// The backend for the test's pool (the node record CRD installed first).
pub async fn cluster(ns: &str) -> KubeCluster {
    install_record_crd(&ControlPlane::get().admin_client().await).await;
    KubeCluster::new(admin_config().await, kube_options(ns))
        .await
        .expect("backend starts")
}

/// The admin kubeconfig as a client config.
pub async fn admin_config() -> kube::Config {
    config_from(&ControlPlane::get().kubeconfig_path()).await
}

/// A client config from a kubeconfig file.
pub async fn config_from(path: &std::path::Path) -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("client config")
}

/// Policy moving to `target` with a budget of `max` nodes.
pub fn policy(target: &str, max: u32, drain_timeout: Duration, node_timeout: Duration) -> Policy {
    Policy {
        target: Version::parse(target).unwrap(),
        allow_downgrade: false,
        max_unavailable: MaxUnavailable::Count(max),
        drain_timeout,
        node_timeout,
        on_drain_timeout: OnDrainTimeout::Skip,
        health: None,
        on_failure: drover::config::OnFailure::Halt,
        max_rollbacks: 1,
        prepare: false,
        prestage: std::time::Duration::ZERO,
        revoked: Vec::new(),
        drain: Vec::new(),
        consent_limit: None,
    }
}

/// Apply `action` on `cluster` as the engine would, from a fresh
/// observation (the record write first, then the call it records).
pub async fn act(
    cluster: &KubeCluster,
    action: &drover::rollout::Action,
) -> Result<
    Option<drover::cluster::EvictionPass>,
    drover::rollout::EngineError<drover::kubernetes::Error>,
> {
    let views = drover::cluster::Cluster::observe(cluster).await.unwrap();
    drover::rollout::apply(cluster, action, &views, Utc::now()).await
}

/// The run a new record of `node` names for `p`, as the agent starts it:
/// what `driver::upgrade_job` builds a Job from.
pub fn run_start(node: &str, p: &NodeProgress) -> drover::cluster::RunStart {
    let r = NodeRecord::new(node, "0123456789abcdef").start(p.clone());
    drover::cluster::RunStart::of(&r, p).expect("a started record names its run")
}

/// An engine on the wall clock.
pub fn engine(policy: Policy) -> Engine<SystemClock> {
    Engine::new(policy, Labels::default(), SystemClock)
}

/// Gate passed, a window open for the day.
pub fn open_window() -> Inputs {
    let now = Utc::now();
    Inputs {
        may_start: true,
        hold_reason: String::new(),
        window: WindowState {
            opened_at: Some(now - chrono::Duration::hours(1)),
            closes_at: Some(now + chrono::Duration::days(1)),
            next_opens_at: None,
            ..WindowState::default()
        },
        patch_window: None,
        ..Default::default()
    }
}

/// Fallback tick when nothing changes (timeouts are timer-driven through `wake_at` too).
pub const TICK: Duration = Duration::from_millis(1000);

/// Drive `engine` on `cluster` until `done` says so; each step runs on the
/// backend's change notification, `wake_at`, or the fallback tick. Panics after `limit`.
pub async fn drive(
    engine: &Engine<SystemClock>,
    cluster: &KubeCluster,
    inputs: &Inputs,
    limit: Duration,
    mut done: impl FnMut(&Outcome) -> bool,
) -> Outcome {
    let mut rx = cluster.changes();
    let mut last = None;
    let run = async {
        // The holds one step leaves for the next, as the agent carries them.
        let mut held = Vec::new();
        loop {
            rx.borrow_and_update();
            let step = Inputs {
                held: std::mem::take(&mut held),
                ..inputs.clone()
            };
            let out = match engine.reconcile(cluster, &step).await {
                Ok(out) => out,
                Err(e) => {
                    eprintln!("reconcile failed (retrying): {e}");
                    held = step.held;
                    tokio::time::sleep(TICK).await;
                    continue;
                }
            };
            held = out.held.clone();
            last = Some(out.clone());
            if done(&out) {
                return out;
            }
            if out.again {
                continue;
            }
            let mut wait = if out.retry_evictions {
                Duration::from_millis(250)
            } else {
                TICK
            };
            if let Some(w) = out.decision.wake_at {
                let until = (w - Utc::now()).to_std().unwrap_or_default();
                wait = wait.min(until + Duration::from_millis(10));
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    };
    match tokio::time::timeout(limit, run).await {
        Ok(out) => out,
        Err(_) => panic!("rollout not done within {limit:?}; last outcome: {last:#?}"),
    }
}

/// Whether a node is out of service in the sense of the budget, as the
/// Node shows it: cordoned or NotReady (drover's record is written before
/// its cordon, so it never counts a node the Node does not show).
pub fn unavailable(n: &Node) -> bool {
    let cordoned = n
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    cordoned || super::kube::node_ready(n) != Some("True")
}

/// Watches the pool for the whole test and records the peak number of unavailable nodes.
pub struct BudgetWatch {
    peak: Arc<Mutex<(usize, Vec<String>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl BudgetWatch {
    /// Starts watching the pool of namespace `ns`; returns once the initial list is in.
    pub async fn start(client: &Client, ns: &str) -> BudgetWatch {
        let api: Api<Node> = Api::all(client.clone());
        let cfg = watcher::Config::default().labels(&format!("{POOL_LABEL}={ns}"));
        let peak = Arc::new(Mutex::new((0usize, Vec::new())));
        let p = peak.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut state: HashMap<String, bool> = HashMap::new();
            let stream = watcher(api, cfg);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        state.insert(n.name_any(), unavailable(&n));
                    }
                    Ok(watcher::Event::Delete(n)) => {
                        state.remove(&n.name_any());
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(e) => eprintln!("budget watch: {e}"),
                }
                let now: Vec<String> = state
                    .iter()
                    .filter(|(_, u)| **u)
                    .map(|(n, _)| n.clone())
                    .collect();
                let mut g = p.lock().unwrap();
                if now.len() > g.0 {
                    *g = (now.len(), now);
                }
            }
        });
        ready_rx.await.expect("budget watch lists the pool");
        BudgetWatch { peak, task }
    }

    /// The most nodes seen unavailable at once, and which.
    pub fn peak(&self) -> (usize, Vec<String>) {
        self.peak.lock().unwrap().clone()
    }
}

impl Drop for BudgetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The nodes of the test pool `pool` (labelled [`POOL_LABEL`]), by name.
pub async fn nodes_in(client: &Client, pool: &str) -> Vec<Node> {
    let mut nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={pool}")))
        .await
        .unwrap()
        .items;
    nodes.sort_by_key(|n| n.name_any());
    nodes
}

/// Whether drover left no annotation of its own on the node.
pub fn no_drover_annotations(n: &Node) -> bool {
    !n.annotations().keys().any(|k| k.starts_with("drover.dev/"))
}

/// drover's record of node `node`, in namespace `ns` (the agent's), if
/// it wrote one.
pub async fn record_of(client: &Client, ns: &str, node: &str) -> Option<NodeRecord> {
    let obj = Api::<DroverNode>::namespaced(client.clone(), ns)
        .get_opt(node)
        .await
        .unwrap()?;
    Some(drover::record::wire::decode(&obj.spec, obj.status.as_ref()).expect("a readable record"))
}

/// The progress a stored record holds.
pub fn record_progress(r: &DroverNode) -> Option<NodeProgress> {
    drover::record::wire::decode(&r.spec, r.status.as_ref())
        .expect("a readable record")
        .progress
}

/// The progress drover's record of `node` holds.
pub async fn progress_of(client: &Client, ns: &str, node: &str) -> Option<NodeProgress> {
    record_of(client, ns, node).await.and_then(|r| r.progress)
}

/// The progress drover's records of `nodes` hold, in their order.
pub async fn progresses(client: &Client, ns: &str, nodes: &[Node]) -> Vec<Option<NodeProgress>> {
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        out.push(progress_of(client, ns, &n.name_any()).await);
    }
    out
}

/// Whether drover's record of `node` says it cordoned the node.
pub async fn cordoned_by_drover(client: &Client, ns: &str, node: &str) -> bool {
    progress_of(client, ns, node)
        .await
        .is_some_and(|p| p.cordoned_by_drover)
}

/// Waits, through watches of the Node and of drover's record of it (in
/// namespace `ns`), until `cond` holds of both; panics after `WAIT`
/// showing them as they last were. Returns them.
pub async fn await_node_record(
    client: &Client,
    ns: &str,
    node: &str,
    what: &str,
    cond: impl Fn(&Node, Option<&NodeProgress>) -> bool,
) -> (Node, Option<NodeProgress>) {
    let (n, r) = await_node_and(client, ns, node, what, |n, r| {
        cond(n, r.and_then(|r| r.progress.as_ref()))
    })
    .await;
    (n, r.and_then(|r| r.progress))
}

/// [`await_node_record`] on the whole record (its marks, its run).
pub async fn await_node_and(
    client: &Client,
    ns: &str,
    node: &str,
    what: &str,
    cond: impl Fn(&Node, Option<&NodeRecord>) -> bool,
) -> (Node, Option<NodeRecord>) {
    use futures::StreamExt;
    let nodes: Api<Node> = Api::all(client.clone());
    let records: Api<DroverNode> = Api::namespaced(client.clone(), ns);
    let by_name = || watcher::Config::default().fields(&format!("metadata.name={node}"));
    enum Seen {
        Node(Option<Box<Node>>),
        Record(Option<Box<DroverNode>>),
    }
    let node_events = watcher(nodes, by_name()).filter_map(|e| async move {
        match e {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                Some(Seen::Node(Some(Box::new(n))))
            }
            Ok(watcher::Event::Delete(_)) => Some(Seen::Node(None)),
            _ => None,
        }
    });
    let record_events = watcher(records, by_name()).filter_map(|e| async move {
        match e {
            Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) => {
                Some(Seen::Record(Some(Box::new(r))))
            }
            Ok(watcher::Event::Delete(_)) => Some(Seen::Record(None)),
            _ => None,
        }
    });
    let events = futures::stream::select(node_events.boxed(), record_events.boxed());
    futures::pin_mut!(events);
    let (mut n, mut r): (Option<Node>, Option<DroverNode>) = (None, None);
    let progress = |r: &Option<DroverNode>| {
        r.as_ref().map(|r| {
            drover::record::wire::decode(&r.spec, r.status.as_ref()).expect("a readable record")
        })
    };
    let waited = tokio::time::timeout(super::kube::WAIT, async {
        while let Some(e) = events.next().await {
            match e {
                Seen::Node(x) => n = x.map(|x| *x),
                Seen::Record(x) => r = x.map(|x| *x),
            }
            if let Some(node) = &n {
                let p = progress(&r);
                if cond(node, p.as_ref()) {
                    return (node.clone(), p);
                }
            }
        }
        unreachable!("the watches ended")
    })
    .await;
    match waited {
        Ok(found) => found,
        Err(_) => {
            let node_now = Api::<Node>::all(client.clone()).get_opt(node).await;
            let record_now = record_of(client, ns, node).await;
            panic!(
                "timed out after {:?} waiting for {node}: {what}; it is now {:?}, its record {record_now:?}",
                super::kube::WAIT,
                node_now.map(|n| n.map(|n| (n.spec, n.status.map(|s| s.node_info.map(|i| i.os_image)))))
            )
        }
    }
}

/// A person asks drover to retry `node`: `drover.dev/retry` on its record
/// in namespace `ns`.
pub async fn request_retry(client: &Client, ns: &str, node: &str) {
    Api::<DroverNode>::namespaced(client.clone(), ns)
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "metadata": { "annotations": { drover::record::ANN_RETRY: "now" } }
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating the record of {node}: {e}"));
}

/// Install (server-side apply) the `DroverNode` CRD and wait until it serves.
pub async fn install_record_crd(client: &Client) {
    install_crd_of(client, drover::record::wire::crd()).await;
    let api: Api<DroverNode> = Api::all(client.clone());
    let lp = ListParams::default().limit(1);
    super::kube::retry_until("drovernodes servable", || api.list(&lp)).await;
}

/// drover's Jobs in `ns` matching the label `selector` ("" for all) that
/// are not being deleted: what a node's give-back leaves behind.
pub async fn live_jobs(client: &Client, ns: &str, selector: &str) -> Vec<Job> {
    Api::<Job>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .collect()
}

/// A watch of the pool `ns`'s nodes that hands each node it sees, with the
/// instant it saw it, to a callback, from the initial list on, until it is
/// dropped: how tests and benches time a node's steps as an outside
/// observer would.
pub struct NodeWatch {
    task: tokio::task::JoinHandle<()>,
}

impl NodeWatch {
    /// Start watching; returns once the initial list went through `on`.
    pub async fn start(
        client: &Client,
        ns: &str,
        on: impl FnMut(&Node, std::time::Instant) + Send + 'static,
    ) -> NodeWatch {
        let api: Api<Node> = Api::all(client.clone());
        let cfg = watcher::Config::default().labels(&format!("{POOL_LABEL}={ns}"));
        let task = watch_each(api, cfg, "node watch of the pool", on).await;
        NodeWatch { task }
    }
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A watch of drover's Jobs in namespace `ns` that hands each Job it sees
/// (created or changed), with the instant it saw it, to a callback, until
/// it is dropped: when a node's prepare and upgrade runs began.
pub struct JobWatch {
    task: tokio::task::JoinHandle<()>,
}

impl JobWatch {
    /// Start watching; returns once the initial list went through `on`.
    pub async fn start(
        client: &Client,
        ns: &str,
        on: impl FnMut(&Job, std::time::Instant) + Send + 'static,
    ) -> JobWatch {
        let api: Api<Job> = Api::namespaced(client.clone(), ns);
        let cfg = watcher::Config::default().labels("app.kubernetes.io/managed-by=drover");
        let task = watch_each(api, cfg, "job watch of the namespace", on).await;
        JobWatch { task }
    }
}

/// Watch `api` under `cfg`, handing each object created or changed, with
/// the instant it was seen, to `on`; returns once the initial list went
/// through `on` (`what` names the watch in its errors and its panic).
async fn watch_each<K>(
    api: Api<K>,
    cfg: watcher::Config,
    what: &'static str,
    mut on: impl FnMut(&K, std::time::Instant) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        let stream = watcher(api, cfg);
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    on(&o, std::time::Instant::now())
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(_) => {}
                Err(e) => eprintln!("{what}: {e}"),
            }
        }
    });
    ready_rx
        .await
        .unwrap_or_else(|_| panic!("the {what} lists its objects"));
    task
}

impl Drop for JobWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The node a drover Job runs for, and whether it is a prepare run
/// (`drover.dev/action: prepare`).
pub fn job_run(j: &Job) -> Option<(String, bool)> {
    let node = j.labels().get("drover.dev/node")?.clone();
    let prepare = j.annotations().get("drover.dev/action").map(String::as_str) == Some("prepare");
    Some((node, prepare))
}

/// Server-side apply `crd` and wait until the API server says it is established.
pub async fn install_crd_of(
    client: &Client,
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &kube::api::PatchParams::apply("drover-tests").force(),
        &kube::api::Patch::Apply(&crd),
    )
    .await
    .unwrap_or_else(|e| panic!("apply the CRD {name}: {e}"));
    super::kube::await_object(&api, &name, "CRD established", |c| {
        c.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
    })
    .await;
}
