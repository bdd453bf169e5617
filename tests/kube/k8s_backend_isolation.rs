//! One node's trouble stays that node's (invariant 2 of docs/design.md §8:
//! no node left cordoned by a fault, and the others proceed), against the
//! real API server: a draining node whose pod list fails (a proxy in front
//! of the API server answers it 500) and one whose eviction answers 403 (its
//! pod lives in a namespace being deleted, which the API server refuses new
//! content in). Both are held with their own error on their record, given
//! back at their drain timeout, never upgraded; the other nodes finish in
//! the same steps. Control: with the faults gone, a retry moves both.
//!
//! And a give-back deletes the node's running Job before it uncordons: a
//! delete that fails keeps the node cordoned, held, and is tried again on
//! every pass until the Job is gone; a completed node's Jobs go in one
//! `deletecollection`, and its cordon stays until that succeeds; a running
//! Job that is the node's only record of its upgrade is not deleted until
//! that state is written on the node. Blocked nodes' pod watches are
//! capped, the nodes beyond the cap polled.

use std::time::{Duration, Instant};

use drover::cluster::{Cluster, NodeProgress, ProgressState, ANN_RETRY};
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
        let p = progress_of(&node).expect("a blocked record");
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
    let p = progress_of(
        &Api::<Node>::all(client.clone())
            .get(&refused)
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(
        p.message.contains("being terminated"),
        "the 403 is named: {}",
        p.message
    );
    let p = progress_of(
        &Api::<Node>::all(client.clone())
            .get(&unlisted)
            .await
            .unwrap(),
    )
    .unwrap();
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
    let nodes: Api<Node> = Api::all(client.clone());
    for n in [&unlisted, &refused] {
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": { ANN_RETRY: "1" } } })),
            )
            .await
            .unwrap();
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
/// changed") to every DELETE whose path `refuses` accepts, driven until two
/// were refused: the give-back tests then look at what the node kept.
struct DeletesRefused {
    proxy: ApiProxy,
    cluster: KubeCluster,
    engine: drover::rollout::Engine<drover::rollout::SystemClock>,
    out: drover::rollout::Outcome,
}

impl DeletesRefused {
    async fn drive(
        ns: &str,
        policy: drover::rollout::Policy,
        refuses: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        let proxy = ApiProxy::start().await;
        let deletes = proxy.answer(500, "etcdserver: leader changed", move |m, path, _| {
            *m == Method::DELETE && refuses(path)
        });
        let cluster = KubeCluster::new(proxy.config(), kube_options(ns))
            .await
            .expect("backend starts");
        let engine = engine(policy);
        let out = drive(
            &engine,
            &cluster,
            &open_window(),
            Duration::from_secs(60),
            move |_| deletes.hits() >= 2,
        )
        .await;
        DeletesRefused {
            proxy,
            cluster,
            engine,
            out,
        }
    }
}

#[tokio::test]
async fn a_give_back_deletes_the_running_job_first_and_retries_until_it_can() {
    let (client, ns) = setup("giveback-order").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    // The node never comes back from its reboot: its Job stays active, and
    // node_timeout gives the node back failed while its driver still runs.
    sim.set_fault(&node, Fault::NeverReady);
    let jobs_path = format!("/apis/batch/v1/namespaces/{}/jobs/", ns.name());
    let DeletesRefused {
        proxy,
        cluster,
        engine,
        out,
    } = DeletesRefused::drive(
        ns.name(),
        policy("1.13.0", 1, Duration::from_secs(5), Duration::from_secs(6)),
        move |path| path.starts_with(&jobs_path),
    )
    .await;
    // Tried twice, refused twice: still out of service, with its in-flight
    // record and its running Job, held with the error.
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(&node).await.unwrap();
    assert!(unschedulable(&n), "not uncordoned before its Job is gone");
    // `upgrading` on the node: the running Job was the only record of it,
    // so the give-back wrote it before trying the delete.
    assert_eq!(progress_of(&n).unwrap().state, ProgressState::Upgrading);
    assert_eq!(live_jobs(&client, ns.name(), "").await.len(), 1);
    let held = out.held.iter().find(|h| h.node == node).expect("held");
    assert!(held.why.contains("leader changed"), "{held:?}");

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
    proxy.clear();
    let out = drive(
        &engine,
        &cluster,
        &open_window(),
        Duration::from_secs(60),
        |o| o.decision.state == RolloutState::Failed && o.held.is_empty(),
    )
    .await;
    let jobs_when_uncordoned = tokio::time::timeout(WAIT, seen).await.unwrap().unwrap();
    assert_eq!(
        jobs_when_uncordoned, 0,
        "the Job went before the node came back"
    );
    let n = nodes.get(&node).await.unwrap();
    let p = progress_of(&n).unwrap();
    assert_eq!(p.state, ProgressState::Failed);
    assert!(p.message.contains("within node_timeout"), "{}", p.message);
    assert!(
        out.decision.message.contains(&node),
        "{}",
        out.decision.message
    );
    sim.shutdown().await;
}

/// A completed node's Jobs (its prepare and its upgrade) go in one
/// `deletecollection` before its uncordon: while that request fails the
/// node stays cordoned with its record, held with the error; once it
/// passes, both Jobs are gone and the node is back in service.
#[tokio::test]
async fn a_completed_node_keeps_its_cordon_until_its_jobs_go_in_one_request() {
    let (client, ns) = setup("giveback-all").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    // The collection itself, not one Job: a DELETE per Job would pass.
    let collection = format!("/apis/batch/v1/namespaces/{}/jobs", ns.name());
    let minute = Duration::from_secs(60);
    let policy = drover::rollout::Policy {
        prepare: true,
        ..policy("1.13.0", 1, minute, minute)
    };
    let DeletesRefused {
        proxy,
        cluster,
        engine,
        out,
    } = DeletesRefused::drive(ns.name(), policy, move |path| path == collection).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let live = || async {
        live_jobs(&client, ns.name(), "")
            .await
            .iter()
            .map(|j| j.name_any())
            .collect::<Vec<_>>()
    };
    let n = nodes.get(&node).await.unwrap();
    assert!(unschedulable(&n), "not uncordoned before its Jobs are gone");
    // Its record as the drain wrote it: the (finished) upgrade Job is the
    // record of the upgrade, and the give-back deletes only finished Jobs,
    // so nothing more was written.
    assert_eq!(progress_of(&n).unwrap().state, ProgressState::Draining);
    assert_eq!(live().await.len(), 2, "the prepare and the upgrade Job");
    let held = out.held.iter().find(|h| h.node == node).expect("held");
    assert!(held.why.contains("leader changed"), "{held:?}");

    proxy.clear();
    let out = drive(
        &engine,
        &cluster,
        &open_window(),
        Duration::from_secs(60),
        |o| o.decision.state == RolloutState::Confirmed,
    )
    .await;
    assert_eq!(out.decision.nodes_at_version, 1);
    assert_eq!(live().await, Vec::<String>::new(), "both Jobs deleted");
    let n = nodes.get(&node).await.unwrap();
    assert!(!unschedulable(&n), "back in service");
    assert!(no_drover_annotations(&n), "{:?}", n.annotations());
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
        attempts: 0,
        previous: None,
    };
    let cluster = KubeCluster::new(admin_config().await, opts.clone())
        .await
        .unwrap();
    for n in &names {
        cluster.set_progress(n, Some(&blocked)).await.unwrap();
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

/// A node upgrading whose running Job is the only record of it (its node
/// says `draining`): at `node_timeout` its state is written before the
/// give-back deletes that Job. While that write is refused, the Job is not
/// deleted and nothing else is done to the node, so an agent dying then
/// still finds the node upgrading; once the write passes, the node is
/// given back failed and its Job goes.
#[tokio::test]
async fn a_running_job_that_is_the_only_record_stays_until_its_state_is_written() {
    let (client, ns) = setup("record-first").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    sim.set_fault(&node, Fault::NeverReady);
    let proxy = ApiProxy::start().await;
    let refuse = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let node_path = format!("/api/v1/nodes/{node}");
    let patches = {
        let refuse = refuse.clone();
        proxy.answer(500, "etcdserver: leader changed", move |m, path, _| {
            refuse.load(std::sync::atomic::Ordering::SeqCst)
                && *m == Method::PATCH
                && path == node_path
        })
    };
    let cluster = KubeCluster::new(proxy.config(), kube_options(ns.name()))
        .await
        .expect("backend starts");
    let engine = engine(policy(
        "1.13.0",
        1,
        Duration::from_secs(5),
        Duration::from_secs(6),
    ));
    // Upgrading: cordoned, its Job started.
    drive(&engine, &cluster, &open_window(), MINUTE, |o| {
        o.decision
            .actions
            .iter()
            .any(|a| matches!(a, drover::rollout::Action::StartUpgrade { .. }))
    })
    .await;
    refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    let out = drive(&engine, &cluster, &open_window(), MINUTE, |_| {
        patches.hits() >= 2
    })
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    let live = || async { live_jobs(&client, ns.name(), "").await.len() };
    let n = nodes.get(&node).await.unwrap();
    assert!(unschedulable(&n));
    assert_eq!(progress_of(&n).unwrap().state, ProgressState::Draining);
    assert_eq!(
        live().await,
        1,
        "the Job, the only record of the upgrade, is kept"
    );
    let held = out.held.iter().find(|h| h.node == node).expect("held");
    assert!(held.why.contains("leader changed"), "{held:?}");

    proxy.clear();
    let out = drive(&engine, &cluster, &open_window(), MINUTE, |o| {
        o.decision.state == RolloutState::Failed && o.held.is_empty()
    })
    .await;
    assert!(
        out.decision.message.contains("node_timeout"),
        "{}",
        out.decision.message
    );
    let n = nodes.get(&node).await.unwrap();
    assert!(!unschedulable(&n));
    assert_eq!(progress_of(&n).unwrap().state, ProgressState::Failed);
    assert_eq!(live().await, 0);
    assert_eq!(sim.upgrades_started(&node), 1);
    sim.shutdown().await;
}
