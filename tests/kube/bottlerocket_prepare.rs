//! Downloading before the drain, against the real API server: the engine
//! drives the Kubernetes backend, whose prepare and upgrade Jobs the
//! simulated kubelet runs as the Bottlerocket script does (support/kubelet.rs,
//! contract item 5: a prepare Job takes the simulated download and stages
//! the version without a reboot; an upgrade Job that finds nothing staged
//! downloads inside the drain). The script's own prepare step is tested
//! against the Bottlerocket API stand-in in `bottlerocket_driver.rs`.
//!
//! A timeline of every pool node (from a watch) says when each was
//! preparing, cordoned and given back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover::rollout::{Inputs, Policy, RolloutState, WindowState};
use kube::{Client, ResourceExt};

use crate::support::backend::*;
use crate::support::kube::*;
use crate::support::kubelet::{Fault, KubeletOptions};

const MINUTE: Duration = Duration::from_secs(60);
/// The simulated download: long against the reboot, as on a real node.
const DOWNLOAD: Duration = Duration::from_secs(3);
const REBOOT: Duration = Duration::from_secs(1);

/// What the watch saw of one node, as instants.
#[derive(Debug, Default, Clone)]
struct Seen {
    preparing: Option<Instant>,
    cordoned: Option<Instant>,
    uncordoned: Option<Instant>,
}

impl Seen {
    /// How long the node was out of service (cordoned).
    fn out_of_service(&self) -> Duration {
        match (self.cordoned, self.uncordoned) {
            (Some(c), Some(u)) => u - c,
            _ => panic!("not cordoned and given back: {self:?}"),
        }
    }
}

/// Every pool node's [`Seen`], kept by a watch for the test's life.
struct Timeline {
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    _watch: NodeWatch,
    _jobs: JobWatch,
}

impl Timeline {
    async fn start(client: &Client, ns: &str) -> Timeline {
        let seen = Arc::new(Mutex::new(BTreeMap::<String, Seen>::new()));
        let s = seen.clone();
        // Preparing: its prepare Job exists (the Job is the record).
        let p = seen.clone();
        let jobs = JobWatch::start(client, ns, move |j, now| {
            if let Some((node, true)) = job_run(j) {
                p.lock()
                    .unwrap()
                    .entry(node)
                    .or_default()
                    .preparing
                    .get_or_insert(now);
            }
        })
        .await;
        let watch = NodeWatch::start(client, ns, move |n, now| {
            let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            let mut g = s.lock().unwrap();
            let e = g.entry(n.name_any()).or_default();
            if cordoned && e.cordoned.is_none() {
                e.cordoned = Some(now);
            }
            if !cordoned && e.cordoned.is_some() && e.uncordoned.is_none() {
                e.uncordoned = Some(now);
            }
        })
        .await;
        Timeline {
            seen,
            _watch: watch,
            _jobs: jobs,
        }
    }

    fn seen(&self) -> BTreeMap<String, Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn options(ns: &str, nodes: usize) -> KubeletOptions {
    let mut opts = pool_options(ns, nodes);
    opts.download = DOWNLOAD;
    opts.reboot = REBOOT;
    opts
}

fn policy_with(prepare: bool) -> Policy {
    Policy {
        prepare,
        ..policy("1.13.0", 1, MINUTE, MINUTE)
    }
}

/// A rollout of a fresh pool of `n` nodes: (the timeline, the simulator's
/// downloads and reboots per node, the wall time from `inputs` to confirmed).
async fn roll(
    prefix: &str,
    n: usize,
    policy: Policy,
    before: Option<Inputs>,
) -> (
    BTreeMap<String, Seen>,
    Vec<((usize, usize), usize)>,
    Duration,
) {
    let (client, ns) = setup(prefix).await;
    let sim = start_sim(&client, options(ns.name(), n)).await;
    let timeline = Timeline::start(&client, ns.name()).await;
    let cluster = cluster(ns.name()).await;
    let engine = engine(policy);
    if let Some(closed) = before {
        // Before the window: as many nodes staged as the budget allows.
        let first = sim.node_names()[0].clone();
        let out = drive(&engine, &cluster, &closed, MINUTE, |_| {
            sim.downloads(&first).0 == 1
        })
        .await;
        assert_eq!(out.decision.state, RolloutState::Pending);
        assert!(
            timeline.seen().values().all(|s| s.cordoned.is_none()),
            "nothing leaves service before the window"
        );
    }
    let opened = Instant::now();
    let out = drive(&engine, &cluster, &open_window(), 2 * MINUTE, |o| {
        o.decision.state == RolloutState::Confirmed
    })
    .await;
    let wall = opened.elapsed();
    assert_eq!(out.decision.nodes_at_version, n as u32);
    let counts = sim
        .node_names()
        .iter()
        .map(|node| (sim.downloads(node), sim.upgrades_started(node)))
        .collect();
    // The last give-back reaches the watch an instant after the engine saw it.
    let limit = Instant::now() + Duration::from_secs(10);
    while timeline.seen().values().any(|s| s.uncordoned.is_none()) && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = timeline.seen();
    sim.shutdown().await;
    (seen, counts, wall)
}

#[tokio::test]
async fn a_node_is_cordoned_only_once_its_download_finished_and_upgrades_once() {
    let (seen, counts, _) = roll("prepare", 2, policy_with(true), None).await;
    for (node, s) in &seen {
        let prepared = s.preparing.expect("prepared first");
        let cordoned = s.cordoned.expect("cordoned");
        assert!(
            cordoned - prepared >= DOWNLOAD,
            "{node} was cordoned {:?} after its download began, before it could finish ({DOWNLOAD:?})",
            cordoned - prepared
        );
    }
    // Downloaded once, by the prepare; never inside the drain; one reboot.
    assert_eq!(counts, vec![((1, 0), 1), ((1, 0), 1)]);
}

#[tokio::test]
async fn a_target_missing_from_the_repository_fails_the_node_before_it_leaves_service() {
    let (client, ns) = setup("prepare-missing").await;
    let sim = start_sim(&client, options(ns.name(), 2)).await;
    let bad = sim.node_names()[0].clone();
    sim.set_fault(&bad, Fault::NotInRepository);
    let timeline = Timeline::start(&client, ns.name()).await;
    let cluster = cluster(ns.name()).await;
    // A budget of 2: both nodes prepare at once.
    let engine = engine(Policy {
        prepare: true,
        ..policy("1.13.0", 2, MINUTE, MINUTE)
    });

    let out = drive(&engine, &cluster, &open_window(), MINUTE, |o| {
        o.decision.state == RolloutState::Failed
    })
    .await;
    assert!(
        out.decision.message.contains(&format!("node {bad} failed"))
            && out.decision.message.contains("not offered"),
        "{}",
        out.decision.message
    );
    let p = progress_of(&client, ns.name(), &bad)
        .await
        .expect("a record");
    assert_eq!(p.state, drover::cluster::ProgressState::Failed);
    let message = p.message;
    assert!(
        message.contains("before the drain") && message.contains("1.13.0 is not offered"),
        "the reason is in its record: {message}"
    );
    // The rollout stays failed; nothing is cordoned or rebooted meanwhile.
    let again = drive(&engine, &cluster, &open_window(), MINUTE, |o| {
        o.decision.state == RolloutState::Failed && o.decision.actions.is_empty()
    })
    .await;
    assert_eq!(again.decision.unavailable, 0);
    for node in sim.node_names() {
        assert_eq!(sim.upgrades_started(&node), 0, "{node} never rebooted");
    }
    assert!(
        timeline.seen().values().all(|s| s.cordoned.is_none()),
        "no node left service: {:?}",
        timeline.seen()
    );
    sim.shutdown().await;
}

/// The same failure passing: the repository offers the target once the
/// node failed. Nothing moves until a person asks (`drover.dev/retry` on
/// the node's `DroverNode` record); then the node
/// prepares again in a new attempt and the rollout completes, each node
/// downloading once and rebooting once.
#[tokio::test]
async fn a_prepare_that_failed_once_goes_through_on_a_persons_retry() {
    let (client, ns) = setup("prepare-retry").await;
    let sim = start_sim(&client, options(ns.name(), 2)).await;
    let bad = sim.node_names()[0].clone();
    sim.set_fault(&bad, Fault::NotInRepository);
    let cluster = cluster(ns.name()).await;
    let engine = engine(policy_with(true));
    drive(&engine, &cluster, &open_window(), MINUTE, |o| {
        o.decision.state == RolloutState::Failed
    })
    .await;
    let failed = record_of(&client, ns.name(), &bad).await.expect("a record");

    sim.set_fault(&bad, Fault::None);
    let held = drive(&engine, &cluster, &open_window(), MINUTE, |o| {
        o.decision.state == RolloutState::Failed && o.decision.actions.is_empty()
    })
    .await;
    assert_eq!(held.decision.unavailable, 0);
    for node in sim.node_names() {
        assert_eq!(
            sim.downloads(&node),
            (0, 0),
            "{node}: nothing before the retry"
        );
    }

    request_retry(&client, ns.name(), &bad).await;
    let out = drive(&engine, &cluster, &open_window(), 2 * MINUTE, |o| {
        o.decision.state == RolloutState::Confirmed
    })
    .await;
    assert_eq!(out.decision.nodes_at_version, 2);
    for node in sim.node_names() {
        assert_eq!(
            (sim.downloads(&node), sim.upgrades_started(&node)),
            ((1, 0), 1),
            "{node}"
        );
    }
    let after = record_of(&client, ns.name(), &bad).await.expect("a record");
    assert!(
        after.attempt > failed.attempt,
        "the retry began a new attempt: {} after {}",
        after.attempt,
        failed.attempt
    );
    sim.shutdown().await;
}

/// In-window time per node (cordoned → given back) with a download of
/// [`DOWNLOAD`] and a reboot of [`REBOOT`]: before (the download inside the
/// drain), after (downloaded before the drain) and prestaged (the first
/// node's download before the window opens). The goal: out of service for
/// drain + reboot (+ health) only, never the download. The figures go to
/// BENCHMARKS.md ("Downloading before the drain").
#[tokio::test]
async fn in_window_time_per_node_holds_no_download_once_prepared_before_the_drain() {
    let closed = Inputs {
        window: WindowState {
            next_opens_at: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
            ..WindowState::default()
        },
        ..open_window()
    };
    let prestage = Policy {
        prestage: Duration::from_secs(2 * 3600),
        ..policy_with(true)
    };
    // The three pools are apart (namespaces, nodes, engines): run at once.
    let (
        (before, before_counts, before_wall),
        (after, after_counts, after_wall),
        (pre, _, pre_wall),
    ) = tokio::join!(
        roll("stage-before", 2, policy_with(false), None),
        roll("stage-after", 2, policy_with(true), None),
        roll("stage-pre", 2, prestage, Some(closed)),
    );

    let out = |s: &BTreeMap<String, Seen>| -> Vec<Duration> {
        s.values().map(Seen::out_of_service).collect()
    };
    let (b, a, p) = (out(&before), out(&after), out(&pre));
    eprintln!(
        "download {DOWNLOAD:?}, reboot {REBOOT:?}, 2 nodes, max_unavailable 1:\n  \
         out of service per node: before {b:?}, after {a:?}, prestaged {p:?}\n  \
         window time for the rollout: before {before_wall:?}, after {after_wall:?}, \
         prestaged {pre_wall:?}"
    );
    assert_eq!(
        before_counts,
        vec![((0, 1), 1), ((0, 1), 1)],
        "downloaded in the drain"
    );
    assert_eq!(
        after_counts,
        vec![((1, 0), 1), ((1, 0), 1)],
        "downloaded in service"
    );
    for d in &b {
        assert!(
            *d >= DOWNLOAD + REBOOT,
            "before: the download is out of service: {d:?}"
        );
    }
    for d in a.iter().chain(&p) {
        assert!(
            *d < DOWNLOAD,
            "out of service {d:?}: drain + reboot only, never the {DOWNLOAD:?} download"
        );
    }
    assert!(pre_wall < after_wall, "prestaging saves the first download");
}
