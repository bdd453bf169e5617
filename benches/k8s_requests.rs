//! Figures for BENCHMARKS.md (`## Kubernetes backend`), counted server-side
//! from the API server's audit log (one event per completed request, with
//! its User-Agent): drover's requests per node upgraded and per reconcile,
//! and its requests per minute while idle with 1,000 nodes, against a naive
//! list-based poll at the same cadence in the same run. Every figure printed
//! is computed from the audit log.
//!
//! Goals, each asserted (a panic, so a non-zero exit, when missed):
//! - the rollout completes: `confirmed`, every node at the target, no Job
//!   running (finished ones are left to their `ttlSecondsAfterFinished`);
//! - per node upgraded, at most 7 writes besides evictions, and exactly one
//!   eviction per pod (no budget refuses here);
//! - one list of a node's pods per drain pass (the observation lists them,
//!   the drain of the same pass evicts from that list): at most one per
//!   eviction pass plus one per node, the pass that finds it empty;
//! - idle: no reconcile makes a request (no get or list in the window, only
//!   watches being re-opened), and at most a tenth of the naive poll's requests.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use drover::rollout::RolloutState;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

use support::backend::*;
use support::kube::*;

fn with_audit() -> &'static ControlPlane {
    // Must be set before the binary's control plane starts; every test here sets it.
    std::env::set_var("CONTROLPLANE_AUDIT", "1");
    ControlPlane::get()
}

/// Requests by `user_agent_prefix` received in `[from, to)`, by verb.
fn audited(
    cp: &ControlPlane,
    user_agent_prefix: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> BTreeMap<String, usize> {
    let log = std::fs::read_to_string(cp.dir().join("audit.log"))
        .expect("audit log (CONTROLPLANE_AUDIT=1)");
    let mut by_verb = BTreeMap::new();
    for line in log.lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if !ev["userAgent"]
            .as_str()
            .is_some_and(|ua| ua.starts_with(user_agent_prefix))
        {
            continue;
        }
        let Some(at) = ev["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<DateTime<Utc>>().ok())
        else {
            continue;
        };
        if at < from || at >= to {
            continue;
        }
        let verb = ev["verb"].as_str().unwrap_or("?");
        let resource = ev["objectRef"]["resource"].as_str().unwrap_or("?");
        let sub = ev["objectRef"]["subresource"]
            .as_str()
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        *by_verb
            .entry(format!("{verb} {resource}{sub}"))
            .or_default() += 1;
    }
    by_verb
}

/// Requests counted in one class: evictions, other writes, reads.
#[derive(Debug, Default)]
struct Classes {
    evictions: usize,
    writes: usize,
    reads: usize,
    watches: usize,
}

fn classify(counts: &BTreeMap<String, usize>) -> Classes {
    let mut c = Classes::default();
    for (key, n) in counts {
        let verb = key.split(' ').next().unwrap_or("");
        match verb {
            _ if key.ends_with("pods/eviction") => c.evictions += n,
            "create" | "update" | "patch" | "delete" | "deletecollection" => c.writes += n,
            "watch" => c.watches += n,
            _ => c.reads += n,
        }
    }
    c
}

// The audit log is written when a request completes; a watch completes when
// the client drops it. Wait until a marker request made after the drop shows up.
async fn flush(cp: &ControlPlane, client: &kube::Client) {
    let marker = format!("flush-{}", rand::random::<u32>());
    let _ = Api::<Node>::all(client.clone()).get_opt(&marker).await;
    retry_until("the audit log catches up", || async {
        let log = std::fs::read_to_string(cp.dir().join("audit.log")).unwrap_or_default();
        if log.contains(&marker) {
            Ok(())
        } else {
            Err("not yet")
        }
    })
    .await;
}

async fn requests_per_node_upgraded() {
    let cp = with_audit();
    let (client, ns) = setup("bench-rollout").await;
    let nodes = 6;
    let sim = start_sim(&client, pool_options(ns.name(), nodes)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    for (i, n) in sim.node_names().iter().enumerate() {
        for j in 0..3 {
            create(
                &pods,
                &pod_on(&format!("app-{i}-{j}"), n, &[("app", "app")], 1),
            )
            .await;
        }
    }
    let from = Utc::now();
    let t0 = Instant::now();
    let cluster = cluster(ns.name()).await;
    let engine = engine(policy(
        "1.13.0",
        2,
        Duration::from_secs(60),
        Duration::from_secs(60),
    ));
    let mut steps = 0;
    let mut drain_passes = 0;
    let out = drive(
        &engine,
        &cluster,
        &open_window(),
        Duration::from_secs(180),
        |o| {
            steps += 1;
            drain_passes += o
                .decision
                .actions
                .iter()
                .filter(|a| matches!(a, drover::rollout::Action::Evict { .. }))
                .count();
            o.decision.state == RolloutState::Confirmed
        },
    )
    .await;
    let took = t0.elapsed();
    drop(cluster);
    flush(cp, &client).await;
    let counts = audited(cp, drover::kubernetes::USER_AGENT, from, Utc::now());
    let total: usize = counts.values().sum();
    let c = classify(&counts);
    let pod_lists = counts.get("list pods").copied().unwrap_or(0);
    let per_node = |n: usize| n as f64 / nodes as f64;
    println!(
        "BENCH k8s rollout: {nodes} nodes (3 pods each), max_unavailable 2, {took:.1?}, {steps} reconciles; \
         {total} API requests = {:.1} per node upgraded, {:.2} per reconcile; \
         per node: {:.1} writes besides evictions, {:.1} evictions, {:.1} reads (get/list), {:.1} watches opened; \
         {drain_passes} eviction passes + {nodes} passes finding a node empty, {pod_lists} pod lists ({:.2} per pass); {counts:?}",
        per_node(total),
        total as f64 / steps as f64,
        per_node(c.writes),
        per_node(c.evictions),
        per_node(c.reads),
        per_node(c.watches),
        pod_lists as f64 / (drain_passes + nodes) as f64,
    );
    // The work completed: every node at the target, no Job running (the
    // finished ones are left to their TTL).
    assert_eq!(out.decision.nodes_at_version as usize, nodes, "{out:?}");
    let jobs = Api::<Job>::namespaced(client.clone(), ns.name())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        jobs.iter().all(|j| j
            .status
            .as_ref()
            .is_some_and(|s| s.succeeded.unwrap_or(0) > 0)),
        "a Job not succeeded: {:?}",
        jobs.iter().map(|j| &j.status).collect::<Vec<_>>()
    );
    assert_eq!(c.evictions, nodes * 3, "one eviction per pod: {counts:?}");
    assert!(
        per_node(c.writes) <= 7.0,
        "{:.1} writes per node upgraded besides evictions (goal: at most 7): {counts:?}",
        per_node(c.writes)
    );
    assert!(
        drain_passes >= nodes,
        "{drain_passes} drain passes for {nodes} nodes"
    );
    // Each node's drain ends with a pass that lists its pods, finds none
    // left to evict and starts the upgrade instead.
    assert!(
        pod_lists <= drain_passes + nodes,
        "{pod_lists} pod lists for {drain_passes} eviction passes over {nodes} nodes \
         (goal: one per pass, the pass that finds a node empty included): {counts:?}"
    );
    sim.shutdown().await;
}

async fn idle_requests_per_minute_with_a_thousand_nodes() {
    let cp = with_audit();
    let (client, ns) = setup("bench-idle").await;
    let mut opts = pool_options(ns.name(), 1000);
    opts.version = "1.13.0".into();
    // Real kubelets: a Lease every 10 s, a status write when something changes or every 5 min.
    opts.lease_interval = Duration::from_secs(10);
    opts.status_interval = Duration::from_secs(60);
    let t0 = Instant::now();
    let sim = start_sim(&client, opts).await;
    println!(
        "BENCH registered 1000 simulated nodes in {:.1?}",
        t0.elapsed()
    );
    let window = Duration::from_secs(60);

    // drover: reconciles on every change notification (node heartbeats included) or the 1 s tick.
    let cluster = cluster(ns.name()).await;
    let engine = engine(policy(
        "1.13.0",
        2,
        Duration::from_secs(60),
        Duration::from_secs(60),
    ));
    let from = Utc::now();
    let mut steps = 0usize;
    let deadline = Instant::now() + window;
    let out = drive(
        &engine,
        &cluster,
        &open_window(),
        window + Duration::from_secs(30),
        |o| {
            steps += 1;
            Instant::now() >= deadline && o.decision.state == RolloutState::Confirmed
        },
    )
    .await;
    let to = Utc::now();
    assert_eq!(out.decision.nodes, 1000);
    // Baseline: the same cadence, each step a list of the nodes, drover's Jobs and the pods.
    let mut config = admin_config().await;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static("naive-poll/1"),
    ));
    let naive = kube::Client::try_from(config).unwrap();
    let selector = format!("{POOL_LABEL}={}", ns.name());
    let base_from = Utc::now();
    let base_deadline = Instant::now() + window;
    let mut polls = 0usize;
    let mut bytes = 0usize;
    while Instant::now() < base_deadline {
        let n = Api::<Node>::all(naive.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        let j = Api::<Job>::namespaced(naive.clone(), ns.name())
            .list(&ListParams::default())
            .await
            .unwrap();
        let p = Api::<Pod>::all(naive.clone())
            .list(&ListParams::default())
            .await
            .unwrap();
        bytes += serde_json::to_vec(&n).unwrap().len()
            + serde_json::to_vec(&j).unwrap().len()
            + serde_json::to_vec(&p).unwrap().len();
        polls += 1;
        tokio::time::sleep(TICK).await;
    }
    let base_to = Utc::now();
    drop(cluster);
    flush(cp, &client).await;
    let ours = audited(cp, drover::kubernetes::USER_AGENT, from, to);
    let theirs = audited(cp, "naive-poll/", base_from, base_to);
    let per_min = |c: &BTreeMap<String, usize>, a: DateTime<Utc>, b: DateTime<Utc>| {
        c.values().sum::<usize>() as f64 * 60.0 / (b - a).num_milliseconds() as f64 * 1000.0
    };
    let ours_total: usize = ours.values().sum();
    let c = classify(&ours);
    let (drover_rate, naive_rate) = (
        per_min(&ours, from, to),
        per_min(&theirs, base_from, base_to),
    );
    println!(
        "BENCH k8s idle, 1000 nodes: drover {drover_rate:.1} requests/min over {:.0} s ({steps} reconciles, {ours_total} requests = {:.3} per reconcile; {} get/list, {} watches re-opened) {ours:?}; \
         naive list poll at 1/s {naive_rate:.1} requests/min ({polls} polls, {:.1} MB/min decoded) {theirs:?}",
        (to - from).num_milliseconds() as f64 / 1000.0,
        ours_total as f64 / steps as f64,
        c.reads,
        c.watches,
        bytes as f64 / 1e6 * 60.0 / (base_to - base_from).num_milliseconds() as f64 * 1000.0,
    );
    assert!(steps >= 30, "only {steps} reconciles in the idle minute");
    assert_eq!(
        c.reads + c.writes + c.evictions,
        0,
        "an idle reconcile made requests: {ours:?}"
    );
    assert!(
        drover_rate * 10.0 <= naive_rate,
        "idle drover {drover_rate:.1}/min against the naive poll's {naive_rate:.1}/min (goal: at most a tenth)"
    );
    sim.shutdown().await;
}

/// A benchmark binary (`harness = false`): each figure runs once, in order,
/// and panics (non-zero exit) when its goal is missed.
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(requests_per_node_upgraded());
    rt.block_on(idle_requests_per_minute_with_a_thousand_nodes());
}
