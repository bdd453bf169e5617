//! Workload consent (`drover.dev/upgrade=paused` on a Node, set by a
//! workload's operator or a person): the node is not started, skipped and
//! not failed, holds no place in `max_unavailable`, and the cluster says it
//! waits for consent; once the label is removed the node is taken within
//! a minute. Past the environment's `consent_limit` a held node is reported
//! (status, metric, Warning Event, signed report), from the time drover's
//! own record says it first saw the hold, and never forced. Against the
//! real API server with simulated kubelet nodes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{pool_options, record_of, start_sim};
use crate::support::kube::{
    await_node, events_for, os_image, unschedulable, ControlPlane, TestNamespace,
};
use drover::cluster::{ConsentHold, NodeRecord};
use drover::config::{CONSENT_LABEL, CONSENT_PAUSED};
use drover::rollout::VirtualClock;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The longest one step of the story may take.
const STEP: Duration = Duration::from_secs(60);

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

/// The environment file of `EnvSpec::test_pool` at `version`, with
/// `[rollout] consent_limit` set.
fn env_with_limit(spec: &EnvSpec, version: &str, limit: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"{}\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
         [rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\n\
         node_selector = \"{}\"\nconsent_limit = \"{limit}\"\n\n[promotion]\nsoak = \"0s\"\n",
        spec.schedule, spec.selector
    )
}

#[tokio::test]
async fn a_hold_past_consent_limit_is_reported_from_drovers_own_record_and_the_node_is_never_forced(
) {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "consent-limit").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    label(ns.name(), &node, Some(CONSENT_PAUSED));
    // Attack: a time the node (or its workload) writes is never read: this
    // one says the hold began 26 years ago, and nothing is reported early.
    Api::<Node>::all(client.clone())
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "drover.dev/consent-held-since": "2000-01-01T00:00:00Z",
                "drover.dev/consent-overdue": "true"
            }}})),
        )
        .await
        .unwrap();
    let spec = EnvSpec::test_pool(ns.name());
    let repo = ConfigRepo::new(std::slice::from_ref(&spec));
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    let clock = VirtualClock::new(dec(1, 3, 0));
    let agent = RunningAgent::start(cfg.clone(), Arc::new(clock.clone()), None);
    await_adopted(&client, ns.name(), "test-test-1").await;
    repo.set_env_text(
        "test",
        &env_with_limit(&spec, "1.13.0", "2h"),
        "test: 1.13.0, consent may hold a node 2h",
    );
    assert_eq!(agent.webhook().await, 202);
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "waiting for consent",
        |s| s.target.as_deref() == Some("1.13.0") && s.message.contains("waiting for consent"),
    )
    .await;
    // drover's record says when drover first saw the hold: its own clock.
    let hold = |r: Option<NodeRecord>| r.and_then(|r| r.consent);
    let first = ConsentHold {
        since: dec(1, 3, 0),
        overdue: false,
    };
    assert_eq!(
        hold(record_of(&client, ns.name(), &node).await),
        Some(first)
    );
    let st = status_of(&client, ns.name()).await;
    assert!(st.consent_overdue.is_empty(), "{st:?}");
    assert_eq!(
        sample(&agent.metrics().await, "drover_consent_overdue_nodes"),
        Some(0.0)
    );

    // A restart and a handoff to another replica an hour later: the hold's
    // time is in the record, not in memory, and is not started afresh.
    agent.stop();
    clock.set(dec(1, 4, 0));
    let mut cfg_b = cfg.clone();
    cfg_b.identity = "agent-b".into();
    let agent = RunningAgent::start(cfg_b, Arc::new(clock.clone()), None);
    await_status(&client, ns.name(), "test-test-1", "agent-b's pass", |s| {
        s.reporter.as_deref() == Some("agent-b") && s.message.contains("waiting for consent")
    })
    .await;
    assert_eq!(
        hold(record_of(&client, ns.name(), &node).await),
        Some(first)
    );

    // Two hours after drover first saw it: reported everywhere, not forced.
    clock.set(dec(1, 5, 0));
    let st = await_status(&client, ns.name(), "test-test-1", "consent overdue", |s| {
        !s.consent_overdue.is_empty()
    })
    .await
    .status
    .unwrap();
    assert_eq!(st.consent_overdue[0].node, node);
    assert_eq!(st.consent_overdue[0].since, "2026-12-01T03:00:00Z");
    assert_eq!(
        (st.state.as_deref(), st.blocker.as_deref()),
        (Some("pending"), Some("consent"))
    );
    assert!(
        st.message.contains("overdue, held past consent_limit (2h)"),
        "{}",
        st.message
    );
    assert_eq!(
        hold(record_of(&client, ns.name(), &node).await),
        Some(ConsentHold {
            overdue: true,
            ..first
        })
    );
    until_pass(&agent.handle, "the report naming the hold", STEP, || {
        repo.report("test", "test-1")
            .is_some_and(|r| !r.detail.consent_overdue.is_empty())
    })
    .await;
    let report = repo.report("test", "test-1").unwrap();
    assert_eq!(
        report.detail.consent_overdue,
        [format!(
            "{node}: held by consent since 2026-12-01T03:00:00Z, past consent_limit (2h)"
        )]
    );
    assert_eq!(report.detail.blocker.as_deref(), Some("consent"));
    assert_eq!(
        sample(&agent.metrics().await, "drover_consent_overdue_nodes"),
        Some(1.0)
    );
    let warned = |evs: Vec<k8s_openapi::api::events::v1::Event>| {
        evs.into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("ConsentOverdue")
                    && e.type_.as_deref() == Some("Warning")
            })
            .count()
    };
    until_pass(&agent.handle, "the ConsentOverdue Event", STEP, || true).await;
    let mut seen = 0;
    for _ in 0..50 {
        seen = warned(events_for(&client, "default", &node).await);
        if seen > 0 {
            break;
        }
        until_pass(&agent.handle, "a pass", STEP, || true).await;
    }
    assert_eq!(seen, 1, "one Warning for the hold");
    // Hours later still held: never cordoned, no run started, one Warning.
    clock.set(dec(1, 7, 30));
    until_pass(&agent.handle, "a pass at 07:30", STEP, || true).await;
    let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert!(!unschedulable(&n), "the held node was cordoned");
    assert_eq!(sim.upgrades_started(&node), 0);
    assert_eq!(warned(events_for(&client, "default", &node).await), 1);

    // Released: started, and the record's hold gone with the start.
    label(ns.name(), &node, None);
    await_node(&client, &node, "cordoned after its release", unschedulable).await;
    let r = record_of(&client, ns.name(), &node).await.unwrap();
    assert_eq!(r.consent, None, "{r:?}");
    let st = await_status(&client, ns.name(), "test-test-1", "overdue gone", |s| {
        s.consent_overdue.is_empty()
    })
    .await;
    assert!(st.status.is_some());
    agent.stop();
    sim.shutdown().await;
}

async fn status_of(client: &kube::Client, ns: &str) -> drover::agent::crd::DroverStatusStatus {
    Api::<drover::agent::crd::DroverStatus>::namespaced(client.clone(), ns)
        .get("test-test-1")
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}
