//! One node's trouble stays that node's (invariant 2 of docs/design.md §8:
//! no node left cordoned by a fault, and the others proceed), against the
//! real API server: a draining node whose pod list fails (a proxy in front
//! of the API server answers it 500) and one whose eviction answers 403 (its
//! pod lives in a namespace being deleted, which the API server refuses new
//! content in). Both are held with their own error on their record, given
//! back at their drain timeout, never upgraded; the other nodes finish in
//! the same steps. Control: with the faults gone, a retry moves both.
//!
//! And no node is uncordoned while its run may still act on it: a timed-out
//! run is deleted only after the record says so (a refused record write
//! deletes nothing), the node stays cordoned while the delete is refused
//! (sent again while its Job is there) and until its Job is gone; a
//! completed node whose give-back record did not land is given back again.
//! Blocked nodes' pod watches are capped, the nodes beyond the cap polled.

use std::time::{Duration, Instant};

use drover::cluster::{Cluster, NodeProgress, NodeRecord, ProgressState, RecordWrite};
use drover::kubernetes::KubeCluster;
use drover::rollout::RolloutState;
use futures::StreamExt;
use http::Method;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

use crate::support::backend::*;
use crate::support::kube::*;
use crate::support::kubelet::Fault;
use crate::support::proxy::{pod_list_of, ApiProxy};

const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_failing_pod_list_and_a_refused_eviction_hold_only_their_nodes() {
    let (client, ns) = setup("isolation").await;
    let sim = start_sim(&client, pool_options(ns.name(), 4)).await;
    let names = sim.node_names();
    let (unlisted, refused) = (names[0].clone(), names[1].clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    for (i, n) in names.iter().enumerate() {
        create(&pods, &pod_on(&format!("app-{i}"), n, &[("app", "app")], 1)).await;
    }
    // The refused node also runs a pod whose eviction the API server refuses.
    let doomed = pod_in_a_terminating_namespace(&client, "isolation-doomed", &refused).await;

    // The backend reaches the API server through the proxy, which fails the
    // unlisted node's pod list (not its watch) with a 500.
    let proxy = ApiProxy::start().await;
    let list_rule = proxy.answer(500, "etcdserver: request timed out", pod_list_of(&unlisted));
    let cluster = KubeCluster::new(proxy.config(), kube_options(ns.name()))
        .await
        .expect("backend starts");
    let watch = BudgetWatch::start(&client, ns.name()).await;
    let engine = engine(policy("1.13.0", 4, DRAIN_TIMEOUT, Duration::from_secs(60)));

    let started = Instant::now();
    let t0 = chrono::Utc::now();
    let out = drive(
        &engine,
        &cluster,
        &open_window(),
        Duration::from_secs(60),
        |o| o.decision.state == RolloutState::Blocked && o.decision.nodes_at_version == 2,
    )
    .await;
    eprintln!("two nodes done, two given back in {:?}", started.elapsed());
    assert!(list_rule.hits() > 0, "the pod list was failed for real");

    // The other nodes finished: upgraded once, uncordoned, no record left.
    for n in &names[2..] {
        let node = Api::<Node>::all(client.clone()).get(n).await.unwrap();
        assert!(
            os_image(&node).contains("1.13.0"),
            "{n}: {}",
            os_image(&node)
        );
        assert!(!unschedulable(&node), "{n} left cordoned");
        assert!(
            no_drover_annotations(&node),
            "{n}: {:?}",
            node.annotations()
        );
        assert_eq!(sim.upgrades_started(n), 1);
    }
    // The held nodes: given back at their drain timeout, blocked, each
    // naming its own error; never upgraded.
    for (n, why) in [
        (
            &unlisted,
            "its pods could not be listed; held: its pods cannot be listed",
        ),
        (&refused, "held: evict pod"),
    ] {
        let node = Api::<Node>::all(client.clone()).get(n).await.unwrap();
        assert!(!unschedulable(&node), "{n} left cordoned");
        let p = progress_of(&client, ns.name(), n)
            .await
            .expect("a blocked record");
        assert_eq!(p.state, ProgressState::Blocked, "{n}");
        assert!(p.message.contains(why), "{n}: {}", p.message);
        // Given back at its drain timeout (its drain began within the first
        // steps), not earlier and not much later.
        let timeout = chrono::Duration::from_std(DRAIN_TIMEOUT).unwrap();
        assert!(
            p.started_at >= t0 + timeout,
            "{n} given back at {}",
            p.started_at
        );
        assert!(
            p.started_at <= t0 + timeout + chrono::Duration::seconds(15),
            "{n} given back at {} (drive began {t0})",
            p.started_at
        );
        assert_eq!(sim.upgrades_started(n), 0, "{n} never upgraded");
    }
    let p = progress_of(&client, ns.name(), &refused).await.unwrap();
    assert!(
        p.message.contains("being terminated"),
        "the 403 is named: {}",
        p.message
    );
    let p = progress_of(&client, ns.name(), &unlisted).await.unwrap();
    assert!(
        p.message.contains("etcdserver: request timed out"),
        "{}",
        p.message
    );
    // Held, not failed: the rollout is blocked by them, and their holds are gone
    // with the give-back (the blocked record says why).
    assert_eq!(out.decision.state, RolloutState::Blocked);
    let (peak, which) = watch.peak();
    assert!(peak <= 4, "{peak}: {which:?}");

    // Control: the faults gone (the list answered, the stuck pod gone), a
    // retry moves both nodes like any other.
    proxy.clear();
    Api::<Pod>::namespaced(client.clone(), doomed.name())
        .delete("stuck", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    for n in [&unlisted, &refused] {
        request_retry(&client, ns.name(), n).await;
    }
    let out = drive(
        &engine,
        &cluster,
        &open_window(),
        Duration::from_secs(60),
        |o| o.decision.state == RolloutState::Confirmed,
    )
    .await;
    assert_eq!(out.decision.nodes_at_version, 4);
    assert!(out.held.is_empty(), "{:?}", out.held);
    for n in [&unlisted, &refused] {
        assert_eq!(sim.upgrades_started(n), 1, "{n}");
        let views = cluster.observe().await.unwrap();
        let v = views.iter().find(|v| v.name == *n).unwrap();
        assert_eq!(v.fault, None);
    }
    sim.shutdown().await;
}

/// A one-node pool's backend behind a proxy that answers 500 ("leader
/// changed") to every request of `method` whose path `refuses` accepts once
/// `on` is set, driven until `done`.
struct Refusing {
    proxy: ApiProxy,
    cluster: KubeCluster,
    engine: drover::rollout::Engine<drover::rollout::SystemClock>,
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
    hits: std::sync::Arc<crate::support::proxy::Rule>,
}

impl Refusing {
    async fn start(
        ns: &str,
        policy: drover::rollout::Policy,
        method: Method,
        refuses: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        let proxy = ApiProxy::start().await;
        let on = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hits = {
            let on = on.clone();
            proxy.answer(500, "etcdserver: leader changed", move |m, path, _| {
                on.load(std::sync::atomic::Ordering::SeqCst) && *m == method && refuses(path)
            })
        };
        let cluster = KubeCluster::new(proxy.config(), kube_options(ns))
            .await
            .expect("backend starts");
        Refusing {
            proxy,
            cluster,
            engine: engine(policy),
            on,
            hits,
        }
    }

    /// Refuse from now on.
    fn refuse(&self) {
        self.on.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    async fn drive(
        &self,
        done: impl FnMut(&drover::rollout::Outcome) -> bool,
    ) -> drover::rollout::Outcome {
        drive(&self.engine, &self.cluster, &open_window(), MINUTE, done).await
    }
}

/// The step released the node given back: its stopped run gone, uncordoned.
fn released(o: &drover::rollout::Outcome) -> bool {
    o.decision.state == RolloutState::Failed
        && o.held.is_empty()
        && o.decision
            .actions
            .iter()
            .any(|a| matches!(a, drover::rollout::Action::Release { .. }))
}

/// Upgrading: cordoned, its Job started.
fn started(o: &drover::rollout::Outcome) -> bool {
    o.decision
        .actions
        .iter()
        .any(|a| matches!(a, drover::rollout::Action::StartUpgrade { .. }))
}

#[tokio::test]
async fn a_timed_out_run_is_deleted_before_the_uncordon_and_sent_again_until_it_is() {
    let (client, ns) = setup("giveback-order").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    // The node never comes back from its reboot: its Job stays active, and
    // node_timeout fails the node while its driver still runs.
    sim.set_fault(&node, Fault::NeverReady);
    let jobs_path = format!("/apis/batch/v1/namespaces/{}/jobs/", ns.name());
    let r = Refusing::start(
        ns.name(),
        policy("1.13.0", 1, Duration::from_secs(5), Duration::from_secs(6)),
        Method::DELETE,
        move |path| path.starts_with(&jobs_path),
    )
    .await;
    r.refuse();
    let out = r.drive(|_| r.hits.hits() >= 2).await;
    // Refused twice: still out of service, its record saying failed, its
    // run stopped and drover's cordon; its Job running; held with the error.
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(&node).await.unwrap();
    assert!(unschedulable(&n), "not uncordoned before its Job is gone");
    let rec = record_of(&client, ns.name(), &node).await.unwrap();
    let p = rec.progress.clone().unwrap();
    assert_eq!(p.state, ProgressState::Failed);
    assert!(p.cordoned_by_drover, "still drover's cordon");
    assert!(
        rec.run.as_ref().unwrap().stopped,
        "the record says the run is stopped"
    );
    assert_eq!(live_jobs(&client, ns.name(), "").await.len(), 1);
    let held = out.held.iter().find(|h| h.node == node).expect("held");
    assert!(held.why.contains("leader changed"), "{held:?}");
    assert_eq!(out.decision.unavailable, 1, "it still counts");

    // The deletes go through: the Job is gone by the time the node is back
    // in service (seen from a watch of the node).
    let seen = {
        let (nodes, client, ns, node) = (
            nodes.clone(),
            client.clone(),
            ns.name().to_owned(),
            node.clone(),
        );
        tokio::spawn(async move {
            let cfg = watcher::Config::default().fields(&format!("metadata.name={node}"));
            let updates = watcher(nodes, cfg).applied_objects();
            futures::pin_mut!(updates);
            while let Some(n) = updates.next().await {
                if n.is_ok_and(|n| !unschedulable(&n)) {
                    return live_jobs(&client, &ns, "").await.len();
                }
            }
            unreachable!("the node watch ended")
        })
    };
    r.proxy.clear();
    let out = r.drive(released).await;
    let jobs_when_uncordoned = tokio::time::timeout(WAIT, seen).await.unwrap().unwrap();
    assert_eq!(
        jobs_when_uncordoned, 0,
        "the Job went before the node came back"
    );
    let p = progress_of(&client, ns.name(), &node).await.unwrap();
    assert_eq!(p.state, ProgressState::Failed);
    assert!(!p.cordoned_by_drover);
    assert!(p.message.contains("within node_timeout"), "{}", p.message);
    assert!(
        out.decision.message.contains(&node),
        "{}",
        out.decision.message
    );
    sim.shutdown().await;
}

/// A timed-out run is deleted only once its node's record says it is: while
/// that write is refused, the Job is not deleted and nothing else is done
/// to the node (an agent dying then finds it upgrading, its run running);
/// once the write passes, the run goes and the node is given back failed.
#[tokio::test]
async fn a_timed_out_run_is_not_deleted_before_its_record_says_so() {
    let (client, ns) = setup("record-first").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    sim.set_fault(&node, Fault::NeverReady);
    let record_path = format!(
        "/apis/drover.dev/v1alpha1/namespaces/{}/drovernodes/{node}",
        ns.name()
    );
    let r = Refusing::start(
        ns.name(),
        policy("1.13.0", 1, Duration::from_secs(5), Duration::from_secs(6)),
        Method::PATCH,
        move |path| path == record_path,
    )
    .await;
    r.drive(started).await;
    r.refuse();
    let out = r.drive(|_| r.hits.hits() >= 2).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let live = || async { live_jobs(&client, ns.name(), "").await.len() };
    assert!(unschedulable(&nodes.get(&node).await.unwrap()));
    assert_eq!(
        progress_of(&client, ns.name(), &node).await.unwrap().state,
        ProgressState::Draining
    );
    assert_eq!(
        live().await,
        1,
        "the running run is kept while its record is not written"
    );
    let held = out.held.iter().find(|h| h.node == node).expect("held");
    assert!(held.why.contains("leader changed"), "{held:?}");

    r.proxy.clear();
    let out = r.drive(released).await;
    assert!(
        out.decision.message.contains("node_timeout"),
        "{}",
        out.decision.message
    );
    assert!(!unschedulable(&nodes.get(&node).await.unwrap()));
    assert_eq!(
        progress_of(&client, ns.name(), &node).await.unwrap().state,
        ProgressState::Failed
    );
    assert_eq!(live().await, 0);
    assert_eq!(sim.upgrades_started(&node), 1);
    sim.shutdown().await;
}

/// A completed node is uncordoned, then recorded idle; its finished Jobs
/// are left to their TTL. While the record write is refused, the node is
/// back in service and its record still says it is in flight: it is given
/// back again, and once the write passes it is idle.
#[tokio::test]
async fn a_completed_node_whose_record_did_not_land_is_given_back_again() {
    let (client, ns) = setup("giveback-record").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let record_path = format!(
        "/apis/drover.dev/v1alpha1/namespaces/{}/drovernodes/{node}",
        ns.name()
    );
    let policy = drover::rollout::Policy {
        prepare: true,
        ..policy("1.13.0", 1, MINUTE, MINUTE)
    };
    let r = Refusing::start(ns.name(), policy, Method::PATCH, move |path| {
        path == record_path
    })
    .await;
    r.drive(started).await;
    r.refuse();
    let out = r.drive(|_| r.hits.hits() >= 2).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(&node).await.unwrap();
    assert!(!unschedulable(&n), "uncordoned first");
    assert!(no_drover_annotations(&n), "{:?}", n.annotations());
    // Its record as the drain wrote it: draining, the run it names done.
    assert_eq!(
        progress_of(&client, ns.name(), &node).await.unwrap().state,
        ProgressState::Draining
    );
    let held = out.held.iter().find(|h| h.node == node).expect("held");
    assert!(held.why.contains("leader changed"), "{held:?}");

    r.proxy.clear();
    let out = r
        .drive(|o| o.decision.state == RolloutState::Confirmed)
        .await;
    assert_eq!(out.decision.nodes_at_version, 1);
    assert_eq!(progress_of(&client, ns.name(), &node).await, None);
    assert_eq!(
        live_jobs(&client, ns.name(), "").await.len(),
        2,
        "the prepare and the upgrade Job, left to their TTL"
    );
    assert!(!unschedulable(&nodes.get(&node).await.unwrap()));
    assert_eq!(sim.upgrades_started(&node), 1);
    sim.shutdown().await;
}

/// Whether every budget covering its pods allows a drain, per node, once
/// every planned pod watch has synced (a watch not synced yet answers no).
async fn budgets_allow(cluster: &KubeCluster, names: &[String]) -> Vec<bool> {
    let mut changes = cluster.changes();
    loop {
        // Synced before the observation (the first one starts the watches),
        // so the answers read come from synced watches.
        let synced = cluster.pod_watches() > 0 && cluster.pod_watches_synced();
        let views = cluster.observe().await.unwrap();
        let allow: Vec<bool> = names
            .iter()
            .map(|n| {
                views
                    .iter()
                    .find(|v| v.name == *n)
                    .unwrap()
                    .budgets_allow_drain
            })
            .collect();
        if synced {
            return allow;
        }
        tokio::time::timeout(WAIT, changes.changed())
            .await
            .expect("a pod watch syncs")
            .unwrap();
    }
}

#[tokio::test]
async fn blocked_nodes_beyond_the_watch_cap_are_polled() {
    let (client, ns) = setup("watch-cap").await;
    let sim = start_sim(&client, pool_options(ns.name(), 3)).await;
    let names = sim.node_names();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    for (i, n) in names.iter().enumerate() {
        create(&pods, &pod_on(&format!("web-{i}"), n, &[("app", "web")], 1)).await;
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns.name());
    create(&pdbs, &pdb_min_available("web", "web", json!(3))).await;
    await_pdb(&client, ns.name(), "web", "0 allowed", |p| {
        pdb_settled(p, |s| {
            s.current_healthy == Some(3) && s.disruptions_allowed == Some(0)
        })
    })
    .await;
    let mut opts = kube_options(ns.name());
    opts.pod_watches = 2;
    let blocked = NodeProgress {
        state: ProgressState::Blocked,
        target: semver::Version::new(1, 13, 0),
        started_at: chrono::Utc::now(),
        cordoned_by_drover: false,
        message: "drain did not finish".into(),
        retries: 0,
        previous: None,
    };
    let cluster = KubeCluster::new(admin_config().await, opts.clone())
        .await
        .unwrap();
    for n in &names {
        let write = RecordWrite {
            record: NodeRecord::new(n, "r").with_progress(Some(blocked.clone())),
            base: None,
            consume: Default::default(),
            at: chrono::Utc::now(),
        };
        cluster.write_record(&write).await.unwrap();
    }
    // Control: the budget allows nothing, for the two watched nodes and the
    // polled one alike.
    assert_eq!(budgets_allow(&cluster, &names).await, [false, false, false]);
    assert_eq!(cluster.pod_watches(), 2, "at most the cap");
    drop(cluster);

    // The budget relents: each node sees it, the third by a list.
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "minAvailable": 0 } })),
    )
    .await
    .unwrap();
    await_pdb(&client, ns.name(), "web", "3 allowed", |p| {
        pdb_settled(p, |s| s.disruptions_allowed == Some(3))
    })
    .await;
    let cluster = KubeCluster::new(admin_config().await, opts).await.unwrap();
    assert_eq!(budgets_allow(&cluster, &names).await, [true, true, true]);
    assert_eq!(cluster.pod_watches(), 2);
    sim.shutdown().await;
}
