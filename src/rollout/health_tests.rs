//! Health in the decision core (docs/design.md §5a), step by step, without I/O.

use super::decide::*;
use super::decide_tests::idle as node;
use super::decide_tests::{self, kinds, open, t, v};
use super::decision::*;
use super::RolloutState;
use crate::cluster::{NodeProgress, NodeSeen, NodeView, PodSeen, ProgressState, UpgradeStatus};
use crate::config::{HealthSpec, OnDrainTimeout, OnUnreachable, PrometheusCheck};
use crate::health::QueryOutcome;
use std::time::Duration;

fn policy(max: u32) -> Policy {
    Policy {
        health: Some(spec()),
        ..decide_tests::policy(max, OnDrainTimeout::Skip)
    }
}

fn spec() -> HealthSpec {
    HealthSpec {
        enabled: true,
        settle: Duration::from_secs(30 * 60),
        pod_ready_timeout: Duration::from_secs(10 * 60),
        ..HealthSpec::default()
    }
}

fn with(mut n: NodeView, state: ProgressState, started: &str) -> NodeView {
    n.progress = Ok(Some(NodeProgress {
        state,
        target: v("1.13.2"),
        started_at: t(started),
        cordoned_by_drover: state.in_flight(),
        message: String::new(),
        retries: 0,
        previous: None,
    }));
    n.unschedulable = state.in_flight();
    n
}

fn healthy(name: &str) -> NodeSeen {
    NodeSeen {
        name: name.into(),
        conditions: vec![("MemoryPressure".into(), "False".into())],
        pods: vec![PodSeen {
            name: "apps/web".into(),
            created: t("01:00:00"),
            ready: true,
            restarts: 0,
            waiting_reason: None,
        }],
        unread: None,
    }
}

fn crashing(name: &str) -> NodeSeen {
    let mut s = healthy(name);
    s.pods.push(PodSeen {
        name: "apps/api-7f9c".into(),
        created: t("03:01:00"),
        ready: false,
        restarts: 3,
        waiting_reason: Some("CrashLoopBackOff".into()),
    });
    s
}

fn check(query: &str, on_unreachable: OnUnreachable) -> PrometheusCheck {
    PrometheusCheck {
        url: "http://prom:9090".into(),
        query: query.into(),
        timeout: Duration::from_secs(10),
        on_unreachable,
    }
}

fn firing() -> QueryOutcome {
    QueryOutcome::Firing {
        series: "{job=\"api\"}".into(),
        value: "3".into(),
        samples: 1,
    }
}

#[test]
fn a_returned_node_is_watched_and_holds_the_next_start() {
    let mut a = with(node("a", "1.13.2"), ProgressState::Upgrading, "03:00:00");
    a.upgrade = UpgradeStatus::Succeeded;
    let d = decide(
        &policy(1),
        &open(),
        &[a, node("b", "1.12.0")],
        t("03:05:00"),
    );
    assert_eq!(kinds(&d), [("watch", "a".into())], "no cordon of b yet");
    let Action::Watch {
        progress, uncordon, ..
    } = &d.actions[0]
    else {
        unreachable!()
    };
    assert!(uncordon);
    assert_eq!(progress.state, ProgressState::Watching);
    assert_eq!(progress.started_at, t("03:05:00"));
    assert_eq!(d.state, RolloutState::Rolling);
    assert!(d.poll_health);
}

#[test]
fn a_healthy_watch_passes_after_pod_ready_timeout_and_the_next_node_starts() {
    let mut a = with(node("a", "1.13.2"), ProgressState::Watching, "03:05:00");
    if let Ok(Some(p)) = a.progress.as_mut() {
        p.message = "held: the health inputs could not be read".into();
    }
    let nodes = [a, node("b", "1.12.0")];
    let inputs = Inputs {
        health: vec![healthy("a")],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:10:00"));
    assert!(kinds(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(
        d.message,
        "node a is Ready at 1.13.2; its health is watched until 2026-12-08T03:15:00Z"
    );
    assert_eq!(d.wake_at, Some(t("03:15:00")));
    assert!(d.poll_health);
    let d = decide(&policy(1), &inputs, &nodes, t("03:15:00"));
    assert_eq!(kinds(&d), [("pass", "a".into()), ("cordon", "b".into())]);
    let Action::Pass { progress, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert_eq!(
        (progress.state, progress.started_at),
        (ProgressState::Passed, t("03:15:00"))
    );
    // What the watch said while it lasted is not carried onto the pass.
    assert_eq!(progress.message, "");
}

#[test]
fn a_budget_of_two_starts_the_next_node_while_one_is_watched() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Watching, "03:05:00"),
        node("b", "1.12.0"),
    ];
    let inputs = Inputs {
        health: vec![healthy("a")],
        ..open()
    };
    let d = decide(&policy(2), &inputs, &nodes, t("03:06:00"));
    assert_eq!(kinds(&d), [("cordon", "b".into())]);
}

#[test]
fn a_crash_loop_halts_naming_node_and_pod_and_nothing_else_starts() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Watching, "03:00:00"),
        node("b", "1.12.0"),
        node("c", "1.12.0"),
    ];
    let inputs = Inputs {
        health: vec![crashing("a")],
        ..open()
    };
    // Even a budget that would allow more starts nothing once a check failed.
    let d = decide(&policy(3), &inputs, &nodes, t("03:02:00"));
    assert_eq!(kinds(&d), [("unhealthy", "a".into())]);
    let Action::Unhealthy {
        progress, check, ..
    } = &d.actions[0]
    else {
        unreachable!()
    };
    assert_eq!(check, "crash_loop");
    assert_eq!(progress.state, ProgressState::Failed);
    assert!(
        progress
            .message
            .contains("pod apps/api-7f9c is crash-looping"),
        "{}",
        progress.message
    );
    assert_eq!(d.state, RolloutState::Failed);
    assert!(
        d.message
            .starts_with("node a failed: health check failed: node a: pod apps/api-7f9c"),
        "{}",
        d.message
    );

    // The record holds the rollout on the next pass, from the annotations alone.
    let mut failed = nodes.clone();
    failed[0].progress = Ok(Some(progress.clone()));
    let d = decide(&policy(3), &open(), &failed, t("03:30:00"));
    assert!(kinds(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(d.state, RolloutState::Failed);
    assert!(d.message.contains("apps/api-7f9c"));

    // Retry: the node is watched again (it is already at the version).
    failed[0].retry = true;
    let d = decide(&policy(1), &open(), &failed, t("03:31:00"));
    assert_eq!(kinds(&d), [("watch", "a".into())]);
    // A new pinned version clears the record instead.
    failed[0].retry = false;
    let mut p = policy(3);
    p.target = v("1.13.3");
    let d = decide(&p, &open(), &failed, t("03:31:00"));
    assert_eq!(kinds(&d)[0], ("clear", "a".into()));
}

#[test]
fn a_listed_condition_halts_naming_it() {
    let mut seen = healthy("a");
    seen.conditions[0].1 = "True".into();
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Watching, "03:00:00"),
        node("b", "1.12.0"),
    ];
    let inputs = Inputs {
        health: vec![seen],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:01:00"));
    assert_eq!(kinds(&d), [("unhealthy", "a".into())]);
    assert_eq!(
        d.message,
        "node a failed: health check failed: node a: condition MemoryPressure is True"
    );
}

#[test]
fn without_an_observation_a_watch_holds_rather_than_passes() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Watching, "03:00:00"),
        node("b", "1.12.0"),
    ];
    let d = decide(&policy(2), &open(), &nodes, t("04:00:00"));
    assert!(kinds(&d).is_empty(), "{:?}", d.actions);
    assert!(
        d.message.contains("no health observation of node a"),
        "{}",
        d.message
    );
}

#[test]
fn a_health_read_in_part_holds_rather_than_judges() {
    // A watched node whose pods could not be read in full: no pass on what
    // was read, even well past its pod_ready_timeout.
    let watched = [
        with(node("a", "1.13.2"), ProgressState::Watching, "03:00:00"),
        node("b", "1.12.0"),
    ];
    let unread = Inputs {
        health: vec![NodeSeen::unread(
            "a",
            "its pods cannot be read: more than 1000",
        )],
        ..open()
    };
    let d = decide(&policy(2), &unread, &watched, t("04:00:00"));
    assert!(kinds(&d).is_empty(), "{:?}", d.actions);
    assert!(
        d.message
            .starts_with("held: node a: its pods cannot be read: more than 1000"),
        "{}",
        d.message
    );
    assert!(d.poll_health);
    // Control: read whole, it passes and the next node starts.
    let whole = Inputs {
        health: vec![healthy("a")],
        ..open()
    };
    let d = decide(&policy(2), &whole, &watched, t("04:00:00"));
    assert_eq!(kinds(&d), [("pass", "a".into()), ("cordon", "b".into())]);

    // During settle, one node read in part holds the confirmation, and
    // settle is read again at its own pace, not the watch's.
    let passed = [
        with(node("a", "1.13.2"), ProgressState::Passed, "03:15:00"),
        with(node("b", "1.13.2"), ProgressState::Passed, "03:30:00"),
    ];
    let inputs = Inputs {
        health: vec![healthy("a"), NodeSeen::unread("b", "cannot list its pods")],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &passed, t("04:30:00"));
    assert_ne!(d.state, RolloutState::Confirmed);
    assert!(kinds(&d).is_empty(), "{:?}", d.actions);
    assert!(
        d.message.contains("node b: cannot list its pods"),
        "{}",
        d.message
    );
    assert!(!d.poll_health);
    assert_eq!(d.wake_at, Some(t("04:30:30")));
}

#[test]
fn settle_holds_confirmation_until_it_ends_then_clears_the_records() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Passed, "03:15:00"),
        with(node("b", "1.13.2"), ProgressState::Passed, "03:30:00"),
    ];
    let inputs = Inputs {
        health: vec![healthy("a"), healthy("b")],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:45:00"));
    assert_eq!(d.state, RolloutState::Settling);
    assert_eq!(
        d.message,
        "every node is Ready at 1.13.2 and passed its watch; settling until 2026-12-08T04:00:00Z"
    );
    assert!(kinds(&d).is_empty());
    assert_eq!((d.nodes, d.nodes_at_version), (2, 2));
    let d = decide(&policy(1), &inputs, &nodes, t("04:00:00"));
    assert_eq!(d.state, RolloutState::Confirmed);
    assert_eq!(kinds(&d), [("clear", "a".into()), ("clear", "b".into())]);
    // Once the records are gone, confirmed needs no further judging.
    let done = [node("a", "1.13.2"), node("b", "1.13.2")];
    let d = decide(&policy(1), &open(), &done, t("05:00:00"));
    assert_eq!(d.state, RolloutState::Confirmed);
}

#[test]
fn a_failure_during_settle_fails_the_node_it_names() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Passed, "03:15:00"),
        with(node("b", "1.13.2"), ProgressState::Passed, "03:30:00"),
    ];
    let inputs = Inputs {
        health: vec![crashing("a"), healthy("b")],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:45:00"));
    assert_eq!(kinds(&d), [("unhealthy", "a".into())]);
    assert_eq!(d.state, RolloutState::Failed);
}

#[test]
fn a_firing_query_fails_the_watched_node_naming_query_and_value() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Watching, "03:00:00"),
        node("b", "1.12.0"),
    ];
    let inputs = Inputs {
        health: vec![healthy("a")],
        queries: vec![(check("errors > 0", OnUnreachable::Hold), firing())],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:01:00"));
    assert_eq!(kinds(&d), [("unhealthy", "a".into())]);
    let Action::Unhealthy { check, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert_eq!(check, "prometheus");
    assert!(
        d.message
            .contains("query `errors > 0` returned {job=\"api\"} = 3"),
        "{}",
        d.message
    );
}

#[test]
fn a_query_firing_between_nodes_fails_the_last_passed_node() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Passed, "03:15:00"),
        with(node("b", "1.13.2"), ProgressState::Passed, "03:30:00"),
        node("c", "1.12.0"),
    ];
    let inputs = Inputs {
        health: vec![healthy("a"), healthy("b")],
        queries: vec![(check("errors > 0", OnUnreachable::Hold), firing())],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:31:00"));
    assert_eq!(kinds(&d), [("unhealthy", "b".into())], "no cordon of c");
    assert_eq!(d.state, RolloutState::Failed);
}

#[test]
fn a_query_firing_before_any_node_moved_only_holds() {
    let nodes = [node("a", "1.12.0"), node("b", "1.12.0")];
    let inputs = Inputs {
        queries: vec![(check("errors > 0", OnUnreachable::Hold), firing())],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:00:00"));
    assert!(kinds(&d).is_empty());
    assert_eq!(d.state, RolloutState::Blocked);
    assert!(
        d.message.starts_with("held: query `errors > 0` returned"),
        "{}",
        d.message
    );
    // Control: a clear query lets the rollout start.
    let inputs = Inputs {
        queries: vec![(
            check("errors > 0", OnUnreachable::Hold),
            QueryOutcome::Clear,
        )],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:00:00"));
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
}

#[test]
fn an_unreachable_prometheus_holds_and_says_so_unless_ignored() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Watching, "03:00:00"),
        node("b", "1.12.0"),
    ];
    let down = QueryOutcome::Unreachable("connection refused".into());
    let inputs = Inputs {
        health: vec![healthy("a")],
        queries: vec![(check("errors > 0", OnUnreachable::Hold), down.clone())],
        ..open()
    };
    // The watch is over, but the node does not pass while Prometheus is silent.
    let d = decide(&policy(1), &inputs, &nodes, t("03:20:00"));
    assert!(kinds(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(d.state, RolloutState::Rolling);
    assert!(
        d.message
            .contains("Prometheus http://prom:9090 unreachable"),
        "{}",
        d.message
    );
    // Between nodes: no start, state blocked naming Prometheus.
    let passed = [
        with(node("a", "1.13.2"), ProgressState::Passed, "03:15:00"),
        node("b", "1.12.0"),
    ];
    let d = decide(&policy(1), &inputs, &passed, t("03:20:00"));
    assert!(kinds(&d).is_empty());
    assert_eq!(d.state, RolloutState::Blocked);
    assert!(d.message.contains("unreachable"), "{}", d.message);
    // `ignore` skips the check.
    let inputs = Inputs {
        queries: vec![(check("errors > 0", OnUnreachable::Ignore), down)],
        ..inputs
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:20:00"));
    assert_eq!(kinds(&d), [("pass", "a".into()), ("cordon", "b".into())]);
}

#[test]
fn without_health_a_returned_node_completes_at_once() {
    let mut a = with(node("a", "1.13.2"), ProgressState::Upgrading, "03:00:00");
    a.upgrade = UpgradeStatus::Succeeded;
    let mut p = policy(1);
    p.health = None;
    let d = decide(&p, &open(), &[a, node("b", "1.12.0")], t("03:05:00"));
    assert_eq!(
        kinds(&d),
        [("complete", "a".into()), ("cordon", "b".into())]
    );
}

#[test]
fn a_huge_series_is_named_within_a_bounded_message() {
    let nodes = [
        with(node("a", "1.13.2"), ProgressState::Watching, "03:00:00"),
        node("b", "1.12.0"),
    ];
    let huge = QueryOutcome::Firing {
        series: format!("{{pod=\"{}\"}}", "x".repeat(500_000)),
        value: "1".into(),
        samples: 1,
    };
    let inputs = Inputs {
        health: vec![healthy("a")],
        queries: vec![(check("errors > 0", OnUnreachable::Hold), huge)],
        ..open()
    };
    let d = decide(&policy(1), &inputs, &nodes, t("03:01:00"));
    let Action::Unhealthy { progress, .. } = &d.actions[0] else {
        panic!("{:?}", d.actions)
    };
    assert!(progress.message.len() <= super::health::MAX_FAILURE_MESSAGE);
    assert!(progress
        .message
        .starts_with("health check failed: query `errors > 0` returned {pod=\"xxx"));
    assert!(d.message.len() < 2 * super::health::MAX_FAILURE_MESSAGE);
}

#[test]
fn the_engine_judges_a_watch_on_the_health_it_reads_from_the_cluster() {
    // The caller hands the engine no health (`open()`): the engine reads
    // the watched node's from the cluster. A watch judged without it would
    // hold for ever ("no health observation"), never pass.
    use super::held_tests::{run, sim_with};
    use super::VirtualClock;
    let clock = VirtualClock::new(t("03:00"));
    let sim = sim_with(&clock, &[("a", 1)]);
    let outs = run(&sim, &clock, &policy(1), t("04:30"));
    let passed = |o: &super::engine::Outcome| kinds(&o.decision).contains(&("pass", "a".into()));
    assert!(
        outs.iter().any(passed),
        "{:?}",
        outs.iter().map(|o| kinds(&o.decision)).collect::<Vec<_>>()
    );
}
