//! The Kubernetes backend's calls one by one against a real kube-apiserver:
//! what each writes, what it refuses, and what observation shows.

use std::time::Duration;

use chrono::Utc;
use drover::cluster::{Cluster, NodeProgress, ProgressState, RecordWrite, UpgradeStatus};
use drover::kubernetes::Error;
use drover::rollout::Action;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams};
use semver::Version;
use serde_json::json;

use crate::support::backend::*;
use crate::support::kube::*;

fn draining(cordoned_by_drover: bool) -> NodeProgress {
    NodeProgress {
        state: ProgressState::Draining,
        target: Version::new(1, 13, 0),
        started_at: Utc::now(),
        cordoned_by_drover,
        message: String::new(),
        retries: 0,
        previous: None,
    }
}

fn cordon(node: &str, p: &NodeProgress) -> Action {
    Action::Cordon {
        node: node.into(),
        progress: p.clone(),
    }
}

fn is_unschedulable(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

#[tokio::test]
async fn the_record_precedes_the_cordon_and_uncordon_refuses_someone_elses_cordon() {
    let (client, ns) = setup("ops-cordon").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let [mine, theirs] = <[String; 2]>::try_from(sim.node_names()).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let cluster = cluster(ns.name()).await;

    let p = draining(true);
    act(&cluster, &cordon(&mine, &p)).await.unwrap();
    // Read-your-writes: the very next observation shows the cordon and the record.
    let view = cluster.observe().await.unwrap();
    let v = view.iter().find(|v| v.name == mine).unwrap();
    assert!(v.unschedulable);
    assert_eq!(v.progress.clone().unwrap(), Some(p.clone()));
    let n = nodes.get(&mine).await.unwrap();
    assert!(
        is_unschedulable(&n) && no_drover_annotations(&n),
        "the Node carries the cordon only"
    );
    let r = record_of(&client, ns.name(), &mine).await.unwrap();
    assert_eq!(r.progress, Some(p.clone()));
    assert_eq!(r.attempt, 1);
    // Its upgrade run is named before it exists.
    let run = r.run.clone().unwrap();
    assert_eq!(
        run.name,
        drover::record::run_name(&mine, &r.id, 1, drover::record::RunAction::Upgrade)
    );
    // Cordoning again changes nothing.
    assert_eq!(
        cluster.cordon(&mine).await.unwrap(),
        drover::cluster::Cordoned::Already
    );
    assert_eq!(record_of(&client, ns.name(), &mine).await.unwrap(), r);

    // Someone else's cordon: drover records that it did not cordon it, and refuses to uncordon it.
    nodes
        .patch(
            &theirs,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .unwrap();
    await_node(&client, &theirs, "cordoned", is_unschedulable).await;
    act(&cluster, &cordon(&theirs, &draining(false)))
        .await
        .unwrap();
    assert!(!cordoned_by_drover(&client, ns.name(), &theirs).await);
    let refused = cluster.uncordon(&theirs).await;
    assert!(
        matches!(refused, Err(Error::NotCordonedByDrover { .. })),
        "{refused:?}"
    );
    assert!(is_unschedulable(&nodes.get(&theirs).await.unwrap()));
    // A record write over a record it did not read is refused (a change
    // of its annotations alone is not: the write is made again on it).
    let view = cluster.observe().await.unwrap();
    let stored = view
        .iter()
        .find(|v| v.name == mine)
        .unwrap()
        .record
        .clone()
        .unwrap();
    let mut read = stored.clone();
    read.resource_version = "1".into();
    read.record.attempt = 7;
    let stale = RecordWrite {
        record: stored.record.with_progress(None),
        base: Some(read),
        consume: Default::default(),
        at: Utc::now(),
    };
    let refused = cluster.write_record(&stale).await;
    assert!(
        matches!(refused, Err(Error::RecordChanged { .. })),
        "{refused:?}"
    );

    // Given back: uncordoned, then recorded idle.
    act(
        &cluster,
        &Action::Complete {
            node: mine.clone(),
            uncordon: true,
        },
    )
    .await
    .unwrap();
    let n = nodes.get(&mine).await.unwrap();
    assert!(!is_unschedulable(&n) && no_drover_annotations(&n));
    assert_eq!(progress_of(&client, ns.name(), &mine).await, None);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_drain_evicts_what_it_must_and_names_the_blocking_pdb() {
    let (client, ns) = setup("ops-drain").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns.name());
    for (name, app) in [("web-0", "web"), ("free", "free"), ("done", "job")] {
        create(&pods, &pod_on(name, &node, &[("app", app)], 1)).await;
        await_pod(&client, ns.name(), name, "Running", pod_running_ready).await;
    }
    pods.patch_status(
        "done",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": { "phase": "Succeeded" } })),
    )
    .await
    .unwrap();
    create(&pdbs, &pdb_min_available("web", "web", json!(1))).await;
    await_pdb(&client, ns.name(), "web", "0 allowed", |p| {
        pdb_settled(p, |s| s.disruptions_allowed == Some(0))
    })
    .await;

    let cluster = cluster(ns.name()).await;
    act(&cluster, &cordon(&node, &draining(true)))
        .await
        .unwrap();
    let view = cluster.observe().await.unwrap();
    assert_eq!(
        view[0].pods_to_evict, 2,
        "web-0 and free; not the finished pod"
    );

    let pass = cluster.evict(&node, &Default::default()).await.unwrap();
    assert_eq!(pass.blocked_by, vec![format!("{}/web", ns.name())]);
    assert_eq!(pass.remaining, 2, "web-0 refused, free terminating");
    // A second pass does not evict the terminating pod again, and is still refused.
    let pass = cluster.evict(&node, &Default::default()).await.unwrap();
    assert_eq!(pass.blocked_by, vec![format!("{}/web", ns.name())]);
    await_gone(&pods, "free").await;
    assert!(pods
        .get("web-0")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_none());

    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "spec": { "minAvailable": 0 } })),
    )
    .await
    .unwrap();
    await_pdb(&client, ns.name(), "web", "1 allowed", |p| {
        pdb_settled(p, |s| s.disruptions_allowed == Some(1))
    })
    .await;
    let pass = cluster.evict(&node, &Default::default()).await.unwrap();
    assert!(pass.blocked_by.is_empty(), "{pass:?}");
    await_gone(&pods, "web-0").await;
    let mut changes = cluster.changes();
    tokio::time::timeout(WAIT, async {
        loop {
            if cluster.observe().await.unwrap()[0].pods_to_evict == 0 {
                break;
            }
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the node's pod list shows it empty");
    assert!(
        pods.get_opt("done").await.unwrap().is_some(),
        "finished pods are left alone"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn the_upgrade_job_is_the_records_run_made_once_and_reported() {
    let (client, ns) = setup("ops-job").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns.name());
    let cluster = cluster(ns.name()).await;
    let mut p = draining(true);
    act(&cluster, &cordon(&node, &p)).await.unwrap();
    p.state = ProgressState::Upgrading;
    let start = Action::StartUpgrade {
        node: node.clone(),
        progress: p.clone(),
    };
    act(&cluster, &start).await.unwrap();
    // Repeated, as after a crash: no second Job, no second reboot.
    act(&cluster, &start).await.unwrap();
    let r = record_of(&client, ns.name(), &node).await.unwrap();
    let name = r.run.clone().unwrap().name;
    let job = await_job(&client, ns.name(), &name, "Complete", |j| {
        job_condition(j, "Complete")
    })
    .await;
    let labels = job.metadata.labels.clone().unwrap();
    assert_eq!(labels["drover.dev/node"], node);
    assert_eq!(labels["drover.dev/target-version"], "1.13.0");
    assert_eq!(labels["drover.dev/attempt"], r.attempt.to_string());
    assert_eq!(labels["drover.dev/record"], r.id);
    let spec = job.spec.clone().unwrap();
    // Retries only for what the podFailurePolicy cannot judge (a pod the kubelet
    // rejected while the node shut down); a failing driver fails the Job at once.
    assert_eq!(
        spec.backoff_limit,
        Some(drover::kubernetes::driver::BACKOFF_LIMIT)
    );
    assert!(spec.pod_failure_policy.is_some());
    assert!(spec.ttl_seconds_after_finished.is_some());
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.node_name.as_deref(), Some(node.as_str()));
    assert_eq!(sim.upgrades_started(&node), 1);
    assert_eq!(jobs.list(&Default::default()).await.unwrap().items.len(), 1);

    let mut changes = cluster.changes();
    let view = tokio::time::timeout(WAIT, async {
        loop {
            let v = cluster.observe().await.unwrap().remove(0);
            if v.upgrade == UpgradeStatus::Succeeded {
                return v;
            }
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the Job's success is observed");
    assert_eq!(view.version, Some(Version::new(1, 13, 0)));
    assert_eq!(
        view.progress.clone().unwrap().unwrap().state,
        ProgressState::Upgrading
    );
    // Given back: the record idle, the finished Job left to its TTL.
    act(
        &cluster,
        &Action::Complete {
            node: node.clone(),
            uncordon: true,
        },
    )
    .await
    .unwrap();
    // The next attempt's record names another run: this Job is not it.
    let mut next = draining(true);
    next.target = Version::new(1, 13, 1);
    act(&cluster, &cordon(&node, &next)).await.unwrap();
    let v = cluster.observe().await.unwrap().remove(0);
    assert_eq!(v.upgrade, UpgradeStatus::NotStarted);
    assert_eq!(v.progress.unwrap().unwrap().state, ProgressState::Draining);
    assert!(
        jobs.get_opt(&name).await.unwrap().is_some(),
        "kept for its TTL"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_job_of_the_records_run_name_that_is_not_its_run_is_never_taken_for_it() {
    let (client, ns) = setup("ops-foreign").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns.name());
    let cluster = cluster(ns.name()).await;
    act(&cluster, &cordon(&node, &draining(true)))
        .await
        .unwrap();
    let r = record_of(&client, ns.name(), &node).await.unwrap();
    let name = r.run.clone().unwrap().name;
    // A Job of that very name, made for another record.
    let mut job = crate::support::kubelet::upgrade_job(&name, &node, "1.0.0");
    job.metadata
        .labels
        .get_or_insert_with(Default::default)
        .extend([
            ("drover.dev/record".to_string(), "someone-else".to_string()),
            ("drover.dev/attempt".to_string(), "1".to_string()),
        ]);
    create(&jobs, &job).await;
    let mut changes = cluster.changes();
    let v = tokio::time::timeout(WAIT, async {
        loop {
            let v = cluster.observe().await.unwrap().remove(0);
            if v.fault.is_some() {
                return v;
            }
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the Job is seen");
    assert!(v.fault.unwrap().contains("is not its run"));
    assert_eq!(
        v.progress.unwrap().unwrap().state,
        ProgressState::Draining,
        "not upgrading"
    );
    let mut p = draining(true);
    p.state = ProgressState::Upgrading;
    let refused = act(
        &cluster,
        &Action::StartUpgrade {
            node: node.clone(),
            progress: p,
        },
    )
    .await;
    assert!(format!("{:?}", refused.unwrap_err()).contains("ForeignRun"));
    sim.shutdown().await;
    let _ = Duration::ZERO;
}

/// The newest Event says the newest words: `kubectl describe dst` showed
/// "applying commit d7e24a6 (version 1.13.2)" after 1.13.3 was applied,
/// the second `Applied` counted into the first's series under the first's
/// words (the API server keeps a note as created). Other words are a new
/// Event, which later repeats count into (issue 41).
#[tokio::test]
async fn a_repeated_event_carries_the_newest_note() {
    use drover::agent::events::{Events, Severity};
    use k8s_openapi::api::events::v1::Event;
    let (client, ns) = setup("ops-event-note").await;
    let mut events = Events::new(Some(client.clone()), "agent-0", ns.name(), "test-status");
    let (_stop, stop) = tokio::sync::watch::channel(false);
    events.start(stop, std::time::Duration::from_secs(10));
    for version in ["1.13.2", "1.13.3", "1.13.3"] {
        events
            .on_status(
                Severity::Normal,
                "Applied",
                "Apply",
                format!("applying commit d7e24a6 (version {version})"),
            )
            .await;
    }
    events.flushed().await;
    let api: Api<Event> = Api::namespaced(client.clone(), ns.name());
    let mut listed = api.list(&Default::default()).await.unwrap().items;
    listed.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    let shown: Vec<_> = listed
        .iter()
        .map(|e| (e.note.clone(), e.series.as_ref().map(|s| s.count)))
        .collect();
    assert_eq!(
        shown,
        [
            (
                Some("applying commit d7e24a6 (version 1.13.2)".to_string()),
                None
            ),
            (
                Some("applying commit d7e24a6 (version 1.13.3)".to_string()),
                Some(2)
            )
        ]
    );
}

#[tokio::test]
async fn a_repeated_event_is_counted_into_one_series() {
    use drover::agent::events::{Events, Severity};
    use k8s_openapi::api::events::v1::Event;
    let (client, ns) = setup("ops-events").await;
    let mut events = Events::new(Some(client.clone()), "agent-0", ns.name(), "test-status");
    let (_stop, stop) = tokio::sync::watch::channel(false);
    events.start(stop, std::time::Duration::from_secs(10));
    let api: Api<Event> = Api::namespaced(client.clone(), ns.name());
    events
        .on_status(Severity::Warning, "Refused", "Judge", "unsigned".into())
        .await;
    events
        .on_status(Severity::Warning, "Refused", "Judge", "unsigned".into())
        .await;
    events
        .on_status(Severity::Warning, "Refused", "Judge", "unsigned".into())
        .await;
    // Control: another reason is another Event.
    events
        .on_status(Severity::Normal, "Applied", "Apply", "commit abc".into())
        .await;
    // Published off the caller's task: wait for the queue to drain.
    events.flushed().await;
    let mut listed = api.list(&Default::default()).await.unwrap().items;
    listed.sort_by_key(|e| e.reason.clone());
    let summary: Vec<_> = listed
        .iter()
        .map(|e| {
            (
                e.reason.clone().unwrap_or_default(),
                e.series.as_ref().map(|s| s.count),
                e.reporting_controller.clone().unwrap_or_default(),
                e.reporting_instance.clone().unwrap_or_default(),
                e.regarding.as_ref().and_then(|r| r.name.clone()),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "Applied".to_string(),
                None,
                "drover.dev/agent".to_string(),
                "agent-0".to_string(),
                Some("test-status".to_string())
            ),
            (
                "Refused".to_string(),
                Some(3),
                "drover.dev/agent".to_string(),
                "agent-0".to_string(),
                Some("test-status".to_string())
            ),
        ]
    );
    // An Event deleted meanwhile (expired on the server): the repeat creates a new one.
    let refused = listed
        .iter()
        .find(|e| e.reason.as_deref() == Some("Refused"))
        .unwrap();
    api.delete(&refused.metadata.name.clone().unwrap(), &Default::default())
        .await
        .unwrap();
    events
        .on_status(Severity::Warning, "Refused", "Judge", "unsigned".into())
        .await;
    events.flushed().await;
    let again: Vec<_> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Refused"))
        .collect();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0].metadata.name, refused.metadata.name);
}
