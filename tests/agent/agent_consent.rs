//! Workload consent (`drover.dev/upgrade=paused` on a Node, set by a
//! workload's operator or a person): the node is not started, skipped and
//! not failed, holds no place in `max_unavailable`, and the cluster says it
//! waits for consent; once the label is removed the node is taken within
//! a minute. Against the real API server with simulated kubelet nodes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::kube::{await_node, os_image, unschedulable, ControlPlane, TestNamespace};
use drover::config::{CONSENT_LABEL, CONSENT_PAUSED};
use drover::rollout::VirtualClock;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

/// What docs/config.md tells an operator to run, with the real kubectl
/// (tests/tools): `kubectl label node NODE drover.dev/upgrade=paused` to
/// wait, `kubectl label node NODE drover.dev/upgrade-` to go ahead.
fn label(ns: &str, node: &str, value: Option<&str>) {
    let arg = match value {
        Some(v) => format!("{CONSENT_LABEL}={v}"),
        None => format!("{CONSENT_LABEL}-"),
    };
    let out = crate::agent_conditions::kubectl_cmd(ns, &["label", "node", node, &arg])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl label: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_node_its_workload_holds_is_skipped_not_failed_and_taken_within_a_minute_of_its_release()
{
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "consent").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    let (held, free) = (nodes[0].clone(), nodes[1].clone());
    // The operator of the workload on the first node asks drover to wait.
    label(ns.name(), &held, Some(CONSENT_PAUSED));
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    repo.set_max_unavailable(1);
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let agent = RunningAgent::start(cfg, clock, None);
    await_status(&client, ns.name(), "test-test-1", "confirmed", |s| {
        s.state.as_deref() == Some("confirmed")
    })
    .await;
    repo.bump("test", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
    // The other node moves (the held one holds no place in a budget of
    // one); the cluster then waits, not blocked and not failed.
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "waiting for consent",
        |s| s.state.as_deref() == Some("pending") && s.message.contains("waiting for consent"),
    )
    .await
    .status
    .unwrap();
    assert_eq!(st.message, format!("waiting for consent on 1 node: {held}"));
    // kubectl shows the one blocker: the column and the condition's reason.
    assert_eq!(
        crate::agent_conditions::blocker_shown(ns.name(), "test-test-1"),
        ("consent".into(), "True".into(), "consent".into())
    );
    assert_eq!(st.blocked_nodes.get("consent"), Some(&1));
    assert_eq!(sim.version(&free).as_deref(), Some("1.13.0"));
    assert_eq!(sim.upgrades_started(&held), 0);
    let n = Api::<Node>::all(client.clone()).get(&held).await.unwrap();
    assert!(!unschedulable(&n), "the held node was cordoned");

    // Released: taken within a minute, and upgraded.
    let released = Instant::now();
    label(ns.name(), &held, None);
    await_node(&client, &held, "cordoned after its release", unschedulable).await;
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(60),
        "taken {took:?} after its release"
    );
    await_node(&client, &held, "upgraded", |n| {
        os_image(n).contains("1.13.0") && !unschedulable(n)
    })
    .await;
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "confirmed at 1.13.0",
        |s| s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some("1.13.0"),
    )
    .await;
    assert_eq!(
        crate::agent_conditions::blocker_shown(ns.name(), "test-test-1"),
        ("".into(), "False".into(), "Progressing".into())
    );
    eprintln!("consent: the released node was cordoned {took:?} after the label went");
    agent.stop();
    sim.shutdown().await;
}
