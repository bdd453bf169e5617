//! The kubelet simulator's health faults against the real API server:
//! `crashloop-after-upgrade` and `condition:TYPE` show up on the objects
//! exactly as a real kubelet would write them, and drover's health verdict
//! reads them as failures; an upgrade without a fault is the control.

use std::time::Duration;

use chrono::Utc;
use drover::config::HealthSpec;
use drover::health::{judge, node_watch_until, observe, Failure, Observation, Verdict};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::Client;

use crate::support::kube::*;
use crate::support::kubelet::{self, Fault, Kubelet, FAULT_CONDITION_REASON};

async fn setup(prefix: &str, nodes: usize) -> (Client, TestNamespace, Kubelet) {
    let client = ControlPlane::get().admin_client().await;
    let ns = TestNamespace::create(&client, prefix).await;
    let mut opts = sim_options(ns.name());
    opts.nodes = nodes;
    opts.reboot = Duration::from_secs(1);
    let sim = Kubelet::start(client.clone(), opts).await.unwrap();
    (client, ns, sim)
}

async fn upgrade(client: &Client, ns: &str, job: &str, node: &str) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    create(&jobs, &kubelet::upgrade_job(job, node, "1.13.0")).await;
    await_job(client, ns, job, "Complete", |j| {
        job_condition(j, "Complete")
    })
    .await;
}

fn verdict_on(node: &k8s_openapi::api::core::v1::Node, pods: &[Pod], spec: &HealthSpec) -> Verdict {
    let now = Utc::now();
    let pods = pods
        .iter()
        .filter(|p| observe::is_watched(p))
        .map(|p| observe::pod_health(p, now, 0))
        .collect();
    let nodes = [observe::node_health(node, pods)];
    judge(&Observation {
        spec,
        watch_until: node_watch_until(spec, now),
        nodes: &nodes,
        queries: &[],
        now,
    })
}

#[tokio::test]
async fn crashloop_after_upgrade_makes_the_pods_on_the_upgraded_node_crash_loop() {
    let (client, ns, sim) = setup("fault-crash", 2).await;
    let [bad, good] = <[String; 2]>::try_from(sim.node_names()).unwrap();
    sim.set_fault(&bad, Fault::CrashLoopAfterUpgrade);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    for (pod, node) in [("web-bad", &bad), ("web-good", &good)] {
        create(&pods, &pod_on(pod, node, &[("app", "web")], 5)).await;
        await_pod(
            &client,
            ns.name(),
            pod,
            "Running and Ready",
            pod_running_ready,
        )
        .await;
    }

    // Before the upgrade the fault does nothing.
    let node = await_node(&client, &bad, "Ready", |n| node_ready(n) == Some("True")).await;
    let spec = HealthSpec::default();
    let before = pods.get("web-bad").await.unwrap();
    assert!(matches!(
        verdict_on(&node, &[before], &spec),
        Verdict::Watching { .. }
    ));

    upgrade(&client, ns.name(), "up-bad", &bad).await;
    upgrade(&client, ns.name(), "up-good", &good).await;

    // The pod on the faulty node: not Ready, waiting in CrashLoopBackOff,
    // its restart count growing.
    let crashing = await_pod(&client, ns.name(), "web-bad", "restartCount >= 2", |p| {
        observe::restarts(p) >= 2
    })
    .await;
    assert!(!observe::is_ready(&crashing));
    assert_eq!(
        observe::waiting_reason(&crashing).as_deref(),
        Some("CrashLoopBackOff")
    );
    let status = crashing.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let c = &status.container_statuses.unwrap()[0];
    assert!(!c.ready);
    assert_eq!(
        c.last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        1
    );
    let later = await_pod(
        &client,
        ns.name(),
        "web-bad",
        "restarts keep growing",
        |p| observe::restarts(p) > observe::restarts(&crashing),
    )
    .await;
    assert!(observe::restarts(&later) > observe::restarts(&crashing));

    // A pod landing on the crash-looping node crash-loops too.
    create(&pods, &pod_on("late", &bad, &[("app", "web")], 5)).await;
    await_pod(&client, ns.name(), "late", "crash-looping", |p| {
        observe::waiting_reason(p).as_deref() == Some("CrashLoopBackOff")
    })
    .await;

    // The verdict names the node and the pod.
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&bad)
        .await
        .unwrap();
    match verdict_on(&node, &[later], &spec) {
        Verdict::Unhealthy(f @ Failure::CrashLoop { .. }) => assert!(
            f.to_string().starts_with(&format!(
                "node {bad}: pod {}/web-bad is crash-looping (",
                ns.name()
            )),
            "{f}"
        ),
        other => panic!("expected a crash loop, got {other:?}"),
    }

    // Control: the node upgraded without the fault keeps its pod Ready.
    let fine = pods.get("web-good").await.unwrap();
    assert!(pod_running_ready(&fine));
    assert_eq!(observe::restarts(&fine), 0);
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&good)
        .await
        .unwrap();
    assert!(os_image(&node).contains("1.13.0"));
    assert!(matches!(
        verdict_on(&node, &[fine], &spec),
        Verdict::Watching { .. }
    ));
    sim.shutdown().await;
}

#[tokio::test]
async fn condition_fault_turns_the_condition_true_after_the_upgrade() {
    let (client, ns, sim) = setup("fault-cond", 3).await;
    let [pressured, custom, good] = <[String; 3]>::try_from(sim.node_names()).unwrap();
    sim.set_fault(&pressured, Fault::Condition("MemoryPressure".into()));
    sim.set_fault(&custom, "condition:NetworkUnavailable".parse().unwrap());
    let spec = HealthSpec::default();

    // Before the upgrade: the condition is False, the node healthy.
    let node = await_node(&client, &pressured, "Ready", |n| {
        node_ready(n) == Some("True")
    })
    .await;
    assert_eq!(
        node_condition(&node, "MemoryPressure").unwrap().status,
        "False"
    );

    for (i, n) in [&pressured, &custom, &good].into_iter().enumerate() {
        upgrade(&client, ns.name(), &format!("up-{i}"), n).await;
    }
    let node = await_node(&client, &pressured, "MemoryPressure True", |n| {
        node_condition(n, "MemoryPressure").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(node_ready(&node), Some("True"));
    assert!(os_image(&node).contains("1.13.0"));
    let c = node_condition(&node, "MemoryPressure").unwrap();
    assert_eq!(c.reason.as_deref(), Some(FAULT_CONDITION_REASON));
    match verdict_on(&node, &[], &spec) {
        Verdict::Unhealthy(f) => {
            assert_eq!(
                f.to_string(),
                format!("node {pressured}: condition MemoryPressure is True")
            )
        }
        other => panic!("expected a condition failure, got {other:?}"),
    }

    // A condition the simulator does not normally report is added.
    let node = await_node(&client, &custom, "NetworkUnavailable True", |n| {
        node_condition(n, "NetworkUnavailable").is_some_and(|c| c.status == "True")
    })
    .await;
    assert!(matches!(
        verdict_on(&node, &[], &spec),
        Verdict::Unhealthy(Failure::Condition { condition, .. }) if condition == "NetworkUnavailable"
    ));

    // Control: the node without the fault shows no pressure.
    let node = await_node(&client, &good, "at 1.13.0", |n| {
        os_image(n).contains("1.13.0")
    })
    .await;
    assert!(node_condition(&node, "MemoryPressure").is_some_and(|c| c.status == "False"));
    assert!(matches!(
        verdict_on(&node, &[], &spec),
        Verdict::Watching { .. }
    ));
    sim.shutdown().await;
}

#[test]
fn the_documented_fault_flags_parse_and_print_back() {
    for flag in ["crashloop-after-upgrade", "condition:MemoryPressure"] {
        let fault: Fault = flag.parse().unwrap();
        assert_eq!(fault.to_string(), flag);
    }
    assert!("condition:".parse::<Fault>().is_err());
    assert!("condition:Ready".parse::<Fault>().is_err());
}
