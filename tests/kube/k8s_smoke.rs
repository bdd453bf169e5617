//! Smoke tests of the test support against the real kube-apiserver: the simulated
//! kubelet, the simulated disruption controller, the upgrade Job contract, RBAC.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, EvictParams, ListParams};
use serde_json::json;
use tokio::sync::broadcast;

use crate::support::kube::*;
use crate::support::kubelet::{self, Fault, Kubelet, SimEvent};

async fn next_event(
    rx: &mut broadcast::Receiver<SimEvent>,
    want: impl Fn(&SimEvent) -> bool,
) -> SimEvent {
    let found = tokio::time::timeout(WAIT, async {
        loop {
            match rx.recv().await {
                Ok(ev) if want(&ev) => return ev,
                Ok(_) => {}
                Err(e) => panic!("simulator events: {e}"),
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no matching simulator event within {WAIT:?}"))
}

#[tokio::test]
async fn simulated_nodes_register_ready_at_their_version() {
    let (client, ns) = setup("smoke-nodes").await;
    let mut opts = sim_options(ns.name());
    opts.nodes = 2;
    opts.labels
        .insert("node-role.kubernetes.io/worker".into(), String::new());
    let sim = Kubelet::start(client.clone(), opts).await.unwrap();
    let added = sim.add_nodes(1).await.unwrap();

    let names = sim.node_names();
    assert_eq!(names.len(), 3);
    assert_eq!(names[2], added[0]);
    let leases: Api<Lease> = Api::namespaced(client.clone(), kubelet::LEASE_NAMESPACE);
    for name in &names {
        let node = await_node(&client, name, "Ready", |n| node_ready(n) == Some("True")).await;
        assert_eq!(os_image(&node), "Bottlerocket OS 1.12.0 (aws-k8s-1.36)");
        let info = node.status.as_ref().unwrap().node_info.as_ref().unwrap();
        assert_eq!(info.kubelet_version, "v1.36.3");
        let ready = node_condition(&node, "Ready").unwrap();
        assert!(ready.last_heartbeat_time.is_some());
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        let status = node.status.as_ref().unwrap();
        assert_eq!(status.allocatable.as_ref().unwrap()["pods"].0, "110");
        assert!(status
            .addresses
            .as_ref()
            .unwrap()
            .iter()
            .any(|a| a.type_ == "InternalIP"));
        assert!(node
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("node-role.kubernetes.io/worker"));

        let lease = leases.get(name).await.unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(name.as_str()));
        let first_renewal = spec.renew_time.unwrap();
        // The lease is kept fresh: a later renewal arrives through the watch.
        await_object(&leases, name, "renewed", |l: &Lease| {
            l.spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .is_some_and(|t| t.0 > first_renewal.0)
        })
        .await;
    }

    // The selector drover will use finds exactly these nodes among everything in the cluster.
    let selected = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels("node-role.kubernetes.io/worker"))
        .await
        .unwrap();
    let mine: Vec<_> = selected
        .items
        .iter()
        .filter(|n| names.contains(&n.metadata.name.clone().unwrap()))
        .collect();
    assert_eq!(mine.len(), 3);

    sim.shutdown().await;
    for name in &names {
        await_gone(&Api::<Node>::all(client.clone()), name).await;
    }
}

#[tokio::test]
async fn eviction_is_refused_until_the_pdb_allows_a_disruption() {
    let (client, ns) = setup("smoke-pdb").await;
    let sim = Kubelet::start(client.clone(), sim_options(ns.name()))
        .await
        .unwrap();
    let node = sim.node_names()[0].clone();
    // Evictions must show the API server's 429, not kube's retries of it.
    let evicting = ControlPlane::get().admin_client_without_retry().await;
    let pods: Api<Pod> = Api::namespaced(evicting, ns.name());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns.name());

    create(&pods, &pod_on("web-0", &node, &[("app", "web")], 2)).await;
    await_pod(
        &client,
        ns.name(),
        "web-0",
        "Running and Ready",
        pod_running_ready,
    )
    .await;
    create(&pdbs, &pdb_min_available("web", "web", json!(1))).await;
    await_pdb(&client, ns.name(), "web", "1 healthy, 0 allowed", |p| {
        pdb_settled(p, |s| {
            s.expected_pods == Some(1)
                && s.current_healthy == Some(1)
                && s.desired_healthy == Some(1)
                && s.disruptions_allowed == Some(0)
        })
    })
    .await;

    let refused = pods.evict("web-0", &EvictParams::default()).await;
    assert_eq!(api_code(&refused), Some(429), "{refused:?}");

    // A second replica leaves one disruption to spend.
    create(&pods, &pod_on("web-1", &node, &[("app", "web")], 2)).await;
    await_pdb(&client, ns.name(), "web", "1 disruption allowed", |p| {
        pdb_settled(p, |s| {
            s.current_healthy == Some(2) && s.disruptions_allowed == Some(1)
        })
    })
    .await;
    pods.evict("web-0", &EvictParams::default())
        .await
        .expect("eviction within the budget");

    // The evicted pod is terminating, not gone: the budget must stay spent.
    let pdb = await_pdb(&client, ns.name(), "web", "budget spent", |p| {
        pdb_settled(p, |s| {
            s.current_healthy == Some(1) && s.disruptions_allowed == Some(0)
        })
    })
    .await;
    assert_eq!(
        pdb.status.unwrap().expected_pods,
        Some(2),
        "the terminating pod still exists"
    );
    let refused = pods.evict("web-1", &EvictParams::default()).await;
    assert_eq!(
        api_code(&refused),
        Some(429),
        "second eviction must be refused: {refused:?}"
    );

    // Once it is gone, one healthy pod against minAvailable=1 still allows nothing.
    await_gone(&pods, "web-0").await;
    await_pdb(&client, ns.name(), "web", "1 pod left", |p| {
        pdb_settled(p, |s| {
            s.expected_pods == Some(1) && s.disruptions_allowed == Some(0)
        })
    })
    .await;
    let refused = pods.evict("web-1", &EvictParams::default()).await;
    assert_eq!(api_code(&refused), Some(429), "{refused:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn pdb_percentages_and_max_unavailable_follow_the_disruption_controller() {
    let (client, ns) = setup("smoke-pdb-pct").await;
    let sim = Kubelet::start(client.clone(), sim_options(ns.name()))
        .await
        .unwrap();
    let node = sim.node_names()[0].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns.name());
    for i in 0..3 {
        create(
            &pods,
            &pod_on(&format!("db-{i}"), &node, &[("app", "db")], 1),
        )
        .await;
    }
    // 50% of 3 rounds up to 2.
    create(&pdbs, &pdb_min_available("db-min", "db", json!("50%"))).await;
    let max: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": { "name": "db-max" },
        "spec": { "maxUnavailable": 2, "selector": { "matchLabels": { "app": "db" } } },
    }))
    .unwrap();
    create(&pdbs, &max).await;
    await_pdb(&client, ns.name(), "db-min", "2 desired, 1 allowed", |p| {
        pdb_settled(p, |s| {
            s.desired_healthy == Some(2)
                && s.current_healthy == Some(3)
                && s.disruptions_allowed == Some(1)
        })
    })
    .await;
    await_pdb(&client, ns.name(), "db-max", "1 desired, 2 allowed", |p| {
        pdb_settled(p, |s| {
            s.desired_healthy == Some(1) && s.disruptions_allowed == Some(2)
        })
    })
    .await;

    // A spec change bumps the generation; the status follows it.
    let patch = json!({ "spec": { "maxUnavailable": 1 } });
    pdbs.patch(
        "db-max",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    let pdb = await_pdb(&client, ns.name(), "db-max", "regenerated", |p| {
        pdb_settled(p, |s| {
            s.desired_healthy == Some(2) && s.disruptions_allowed == Some(1)
        })
    })
    .await;
    assert_eq!(pdb.metadata.generation, Some(2));
    let allowed = pdb.status.unwrap().conditions.unwrap();
    assert!(allowed
        .iter()
        .any(|c| c.type_ == "DisruptionAllowed" && c.status == "True"));
    sim.shutdown().await;
}

#[tokio::test]
async fn an_evicted_pod_disappears_after_its_grace_period() {
    let (client, ns) = setup("smoke-grace").await;
    let sim = Kubelet::start(client.clone(), sim_options(ns.name()))
        .await
        .unwrap();
    let node = sim.node_names()[0].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());

    create(&pods, &pod_on("worker", &node, &[("app", "worker")], 2)).await;
    let mut slow = pod_on("slow", &node, &[("app", "slow")], 1);
    slow.metadata.annotations = Some(
        [(
            kubelet::SLOW_TERMINATION_ANNOTATION.to_string(),
            "3".to_string(),
        )]
        .into(),
    );
    create(&pods, &slow).await;
    for name in ["worker", "slow"] {
        await_pod(
            &client,
            ns.name(),
            name,
            "Running and Ready",
            pod_running_ready,
        )
        .await;
    }

    let evicted = Instant::now();
    pods.evict("worker", &EvictParams::default())
        .await
        .expect("no PDB covers it");
    pods.evict("slow", &EvictParams::default())
        .await
        .expect("no PDB covers it");
    // The API server only marks it; the kubelet finishes the deletion.
    let terminating = pods
        .get("worker")
        .await
        .expect("still there during its grace period");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(2));

    await_gone(&pods, "worker").await;
    let worker_after = evicted.elapsed();
    await_gone(&pods, "slow").await;
    let slow_after = evicted.elapsed();
    assert!(
        worker_after >= Duration::from_secs(2),
        "gone after {worker_after:?}, before its 2s grace"
    );
    assert!(
        slow_after >= Duration::from_secs(3),
        "slow-termination ignored: gone after {slow_after:?}"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn an_upgrade_job_reboots_the_node_into_the_target_version() {
    let (client, ns) = setup("smoke-upgrade").await;
    let sim = Kubelet::start(client.clone(), sim_options(ns.name()))
        .await
        .unwrap();
    let node = sim.node_names()[0].clone();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns.name());
    await_node(&client, &node, "Ready at 1.12.0", |n| {
        node_ready(n) == Some("True") && os_image(n).contains("1.12.0")
    })
    .await;

    let job = kubelet::upgrade_job("upgrade-1", &node, "1.13.0");
    create(&jobs, &job).await;
    let down = await_node(&client, &node, "NotReady, rebooting", |n| {
        node_ready(n) == Some("False")
    })
    .await;
    let ready = node_condition(&down, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some(kubelet::NOT_READY_REASON));
    assert_eq!(ready.message.as_deref(), Some(kubelet::REBOOT_MESSAGE));
    assert!(
        os_image(&down).contains("1.12.0"),
        "still the old version while rebooting"
    );
    let running = jobs.get("upgrade-1").await.unwrap().status.unwrap();
    assert_eq!(running.active, Some(1));
    assert!(running.start_time.is_some());

    let up = await_node(&client, &node, "Ready at 1.13.0", |n| {
        node_ready(n) == Some("True")
    })
    .await;
    assert_eq!(os_image(&up), "Bottlerocket OS 1.13.0 (aws-k8s-1.36)");
    let done = await_job(&client, ns.name(), "upgrade-1", "Complete", |j| {
        job_condition(j, "Complete")
    })
    .await;
    let status = done.status.unwrap();
    // The API server omits a zero `active`.
    assert_eq!((status.succeeded, status.active.unwrap_or(0)), (Some(1), 0));
    assert!(status.completion_time.is_some());
    assert!(job_condition(
        &jobs.get("upgrade-1").await.unwrap(),
        "SuccessCriteriaMet"
    ));
    assert_eq!(sim.upgrades_started(&node), 1);

    // A retried Job for the version the node already runs completes without a reboot.
    create(&jobs, &kubelet::upgrade_job("upgrade-2", &node, "1.13.0")).await;
    await_job(&client, ns.name(), "upgrade-2", "Complete", |j| {
        job_condition(j, "Complete")
    })
    .await;
    assert_eq!(sim.upgrades_started(&node), 1, "no second reboot");
    let node_now = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert_eq!(node_ready(&node_now), Some("True"));
    sim.shutdown().await;
}

#[tokio::test]
async fn injected_faults_break_upgrades_as_asked() {
    let (client, ns) = setup("smoke-faults").await;
    let mut opts = sim_options(ns.name());
    opts.nodes = 3;
    opts.reboot = Duration::from_secs(1);
    let sim = Kubelet::start(client.clone(), opts).await.unwrap();
    let [old, stuck, failing] = <[String; 3]>::try_from(sim.node_names()).unwrap();
    sim.set_fault(&old, Fault::OldVersion);
    sim.set_fault(&stuck, Fault::NeverReady);
    sim.set_fault(&failing, Fault::JobFails);
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns.name());
    let mut events = sim.subscribe();
    for (i, node) in [&old, &stuck, &failing].into_iter().enumerate() {
        create(
            &jobs,
            &kubelet::upgrade_job(&format!("up-{i}"), node, "1.13.0"),
        )
        .await;
    }

    // Back at the old version, and the Job still claims success: drover must check osImage.
    await_job(&client, ns.name(), "up-0", "Complete", |j| {
        job_condition(j, "Complete")
    })
    .await;
    let node = await_node(&client, &old, "Ready", |n| node_ready(n) == Some("True")).await;
    assert!(os_image(&node).contains("1.12.0"), "{}", os_image(&node));

    // The stuck node's reboot ends and it stays down, its Job still active.
    next_event(
        &mut events,
        |e| matches!(e, SimEvent::NodeStaysDown { node } if node == &stuck),
    )
    .await;
    let node = Api::<Node>::all(client.clone()).get(&stuck).await.unwrap();
    assert_eq!(node_ready(&node), Some("False"));
    let job = jobs.get("up-1").await.unwrap();
    assert!(!job_condition(&job, "Complete") && !job_condition(&job, "Failed"));
    assert_eq!(job.status.unwrap().active, Some(1));

    let failed = await_job(&client, ns.name(), "up-2", "Failed", |j| {
        job_condition(j, "Failed")
    })
    .await;
    assert_eq!(failed.status.unwrap().failed, Some(1));
    assert_eq!(sim.upgrades_started(&failing), 0);
    assert_eq!(sim.version(&failing).as_deref(), Some("1.12.0"));

    // Cleared at runtime, the next attempt works.
    sim.set_fault(&stuck, Fault::WrongVersion("1.12.9".into()));
    create(&jobs, &kubelet::upgrade_job("up-3", &stuck, "1.13.0")).await;
    await_job(&client, ns.name(), "up-3", "Complete", |j| {
        job_condition(j, "Complete")
    })
    .await;
    let node = await_node(&client, &stuck, "Ready", |n| node_ready(n) == Some("True")).await;
    assert!(os_image(&node).contains("1.12.9"));
    assert_eq!(sim.upgrades_started(&stuck), 2);

    // A Job breaking the contract fails instead of rebooting anything.
    let mut bad = kubelet::upgrade_job("bad", &old, "1.14.0");
    bad.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .node_name = Some(stuck.clone());
    create(&jobs, &bad).await;
    await_job(&client, ns.name(), "bad", "Failed", |j| {
        job_condition(j, "Failed")
    })
    .await;
    assert_eq!(sim.upgrades_started(&old), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn the_restricted_identity_gets_only_what_its_role_grants() {
    let (client, ns) = setup("smoke-rbac").await;
    let restricted = ControlPlane::get().restricted_client().await;
    let sim = Kubelet::start(client.clone(), sim_options(ns.name()))
        .await
        .unwrap();
    let node = sim.node_names()[0].clone();
    create(
        &Api::<Pod>::namespaced(client.clone(), ns.name()),
        &pod_on("app", &node, &[("app", "x")], 1),
    )
    .await;

    let nodes = Api::<Node>::all(restricted.clone())
        .list(&ListParams::default())
        .await;
    assert_eq!(api_code(&nodes), Some(403), "{nodes:?}");
    let r_pods: Api<Pod> = Api::namespaced(restricted.clone(), ns.name());
    let before = r_pods.get("app").await;
    assert_eq!(api_code(&before), Some(403), "{before:?}");

    let role: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": { "name": "pod-reader" },
        "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"] }],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": "pod-reader" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": RESTRICTED_USER }],
    }))
    .unwrap();
    create(&Api::namespaced(client.clone(), ns.name()), &role).await;
    create(&Api::namespaced(client.clone(), ns.name()), &binding).await;

    let pod = retry_until("the Role's grant reaches the authorizer", || {
        r_pods.get("app")
    })
    .await;
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(node.as_str()));
    assert_eq!(
        r_pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    // Still nothing beyond the Role: no deletes, nothing cluster-wide, nothing elsewhere.
    let delete = r_pods.delete("app", &Default::default()).await;
    assert_eq!(api_code(&delete), Some(403), "{delete:?}");
    let nodes = Api::<Node>::all(restricted.clone())
        .list(&ListParams::default())
        .await;
    assert_eq!(api_code(&nodes), Some(403), "{nodes:?}");
    let elsewhere = Api::<Pod>::namespaced(restricted, "default")
        .list(&ListParams::default())
        .await;
    assert_eq!(api_code(&elsewhere), Some(403), "{elsewhere:?}");
    sim.shutdown().await;
}
