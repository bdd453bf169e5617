//! A new pin at every state a node can be in (docs/design.md, "The node
//! record"): one step of the decision per state, for a bump (1.13.2 →
//! 1.13.3) and for a pin revoked with nothing newer admitted (1.13.2
//! revoked, still pinned), each checked against the rules that hold
//! whatever the state: no node is uncordoned while its run may still act
//! on it, no run is started for a node whose run exists, and the budget
//! holds.

use super::decide::decide;
use super::decide_tests::{idle, kinds, open, policy, t, v};
use super::decision::*;
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::OnDrainTimeout;

/// `name` in `state` toward 1.13.2 since 03:00, its run `run`.
fn node(name: &str, state: ProgressState, run: UpgradeStatus) -> NodeView {
    let cordoned = state.in_flight();
    let mut n = idle(name, "1.12.0");
    n.progress = Ok(Some(NodeProgress {
        state,
        target: v("1.13.2"),
        started_at: t("03:00"),
        cordoned_by_drover: cordoned,
        message: String::new(),
        retries: 0,
        previous: Some(v("1.12.0")),
    }));
    n.unschedulable = cordoned;
    n.upgrade = run;
    n
}

/// Every state a node can be in when the pin changes, named.
fn every_state() -> Vec<(&'static str, NodeView)> {
    use ProgressState as P;
    use UpgradeStatus as U;
    let mut draining_pods = node("draining", P::Draining, U::NotStarted);
    draining_pods.pods_to_evict = 2;
    let drained = node("drained", P::Draining, U::NotStarted);
    let mut upgrading = node("upgrading", P::Upgrading, U::Running);
    upgrading.ready = false;
    let mut back_running = node("back-running", P::Upgrading, U::Running);
    back_running.version = Some(v("1.13.2"));
    let mut back_done = node("back-done", P::Upgrading, U::Succeeded);
    back_done.version = Some(v("1.13.2"));
    let mut watching = node("watching", P::Watching, U::NotStarted);
    watching.version = Some(v("1.13.2"));
    let mut passed = node("passed", P::Passed, U::NotStarted);
    passed.version = Some(v("1.13.2"));
    let mut rolling_back = node("rolling-back", P::RollingBack, U::Running);
    rolling_back.ready = false;
    let mut rollback_failed = node("rollback-failed", P::Failed, U::NotStarted);
    if let Ok(Some(p)) = rollback_failed.progress.as_mut() {
        p.cordoned_by_drover = true;
        p.message = format!("{}its driver failed", super::ROLLBACK_FAILED_PREFIX);
    }
    rollback_failed.unschedulable = true;
    let mut stopping = node("stopping", P::Failed, U::Stopping);
    if let Ok(Some(p)) = stopping.progress.as_mut() {
        p.cordoned_by_drover = true;
    }
    stopping.unschedulable = true;
    vec![
        (
            "preparing, downloading",
            node("preparing", P::Preparing, U::Running),
        ),
        (
            "preparing, staged",
            node("staged", P::Preparing, U::Succeeded),
        ),
        ("draining, pods left", draining_pods),
        ("draining, drained, no run", drained),
        ("upgrading, rebooting", upgrading),
        ("upgrading, back, run still running", back_running),
        ("upgrading, back, run done", back_done),
        ("watching", watching),
        ("passed", passed),
        ("blocked", node("blocked", P::Blocked, U::NotStarted)),
        ("failed", node("failed", P::Failed, U::NotStarted)),
        ("rolling back", rolling_back),
        ("rollback failed, left cordoned", rollback_failed),
        ("failed, its run stopping", stopping),
    ]
}

/// Whether `a` takes `n` out of drover's cordon.
fn uncordons(a: &Action) -> bool {
    match a {
        Action::Block { uncordon, .. }
        | Action::Fail { uncordon, .. }
        | Action::Complete { uncordon, .. }
        | Action::Watch { uncordon, .. }
        | Action::GiveBack { uncordon, .. }
        | Action::RolledBack { uncordon, .. } => *uncordon,
        Action::Release { .. } => true,
        _ => false,
    }
}

/// The rules every step keeps, whatever the state and the pin.
fn check(what: &str, n: &NodeView, d: &Decision) {
    let may_act = matches!(
        n.upgrade,
        UpgradeStatus::Running | UpgradeStatus::Stopping | UpgradeStatus::StopPending
    );
    for a in d.actions.iter().filter(|a| a.node() == n.name) {
        assert!(
            !(may_act && uncordons(a)),
            "{what}: uncordoned while its run may act: {a:?}"
        );
        assert!(
            !(n.upgrade != UpgradeStatus::NotStarted && matches!(a, Action::StartUpgrade { .. })),
            "{what}: a second run started: {a:?}"
        );
        if let Action::Retarget { progress, .. } | Action::Cordon { progress, .. } = a {
            assert!(!progress.target.to_string().is_empty());
        }
    }
    assert!(d.unavailable <= d.max_unavailable, "{what}: {d:?}");
}

/// The step of each state under `p` and `inputs`: (what, node, decision).
fn steps(p: &Policy, inputs: &Inputs) -> Vec<(&'static str, NodeView, Decision)> {
    every_state()
        .into_iter()
        .map(|(what, n)| {
            let d = decide(p, inputs, std::slice::from_ref(&n), t("03:05"));
            check(what, &n, &d);
            (what, n, d)
        })
        .collect()
}

fn bumped() -> Policy {
    Policy {
        target: v("1.13.3"),
        max_unavailable: crate::config::MaxUnavailable::Count(3),
        ..policy(3, OnDrainTimeout::Skip)
    }
}

#[test]
fn a_bump_at_every_state_moves_each_node_as_its_state_allows() {
    let said: Vec<(&str, Vec<(&str, String)>)> = steps(&bumped(), &open())
        .into_iter()
        .map(|(what, _, d)| (what, kinds(&d)))
        .collect();
    let want: Vec<(&str, Vec<(&str, &str)>)> = vec![
        // Its download is stopped; it prepares the new pin later.
        ("preparing, downloading", vec![("clear", "preparing")]),
        ("preparing, staged", vec![("clear", "staged")]),
        // The drain goes on toward the new pin (the pods evicted stay so).
        (
            "draining, pods left",
            vec![("retarget", "draining"), ("evict", "draining")],
        ),
        (
            "draining, drained, no run",
            vec![("retarget", "drained"), ("start_upgrade", "drained")],
        ),
        // A run that may act is left to finish: no uncordon, nothing new.
        ("upgrading, rebooting", vec![]),
        ("upgrading, back, run still running", vec![]),
        // It finished on the version its run installed; moved again later.
        ("upgrading, back, run done", vec![("complete", "back-done")]),
        ("watching", vec![("clear", "watching")]),
        ("passed", vec![("clear", "passed")]),
        ("blocked", vec![("clear", "blocked")]),
        ("failed", vec![("clear", "failed")]),
        // A rollback runs to its end whatever the pin.
        ("rolling back", vec![]),
        ("rollback failed, left cordoned", vec![]),
        ("failed, its run stopping", vec![]),
    ];
    for ((what, got), (w, expected)) in said.iter().zip(&want) {
        assert_eq!(what, w);
        let expected: Vec<(&str, String)> =
            expected.iter().map(|(k, n)| (*k, n.to_string())).collect();
        assert_eq!(*got, expected, "{what}");
    }
    // The retargeted drain starts the run of the new pin, in the same attempt.
    let (_, _, d) = steps(&bumped(), &open()).remove(3);
    let Action::StartUpgrade { progress, .. } = &d.actions[1] else {
        unreachable!()
    };
    assert_eq!(progress.target, v("1.13.3"));
    assert_eq!(progress.started_at, t("03:00"), "its drain's timeout holds");
    // A preparing node's running download is stopped; a staged one's is over.
    let (_, _, d) = steps(&bumped(), &open()).remove(0);
    assert!(matches!(d.actions[0], Action::Clear { stop_run: true, .. }));
    let (_, _, d) = steps(&bumped(), &open()).remove(1);
    assert!(matches!(
        d.actions[0],
        Action::Clear {
            stop_run: false,
            ..
        }
    ));
}

#[test]
fn a_pin_revoked_with_nothing_newer_gives_back_what_has_not_started_and_no_more() {
    // As the agent gives it: the pinned version revoked, no node starts.
    let revoked = Policy {
        revoked: vec![v("1.13.2")],
        ..policy(3, OnDrainTimeout::Skip)
    };
    let mut inputs = open();
    inputs.window.held = Some("1.13.2 is revoked".into());
    let said: Vec<(&str, Vec<(&str, String)>)> = steps(&revoked, &inputs)
        .into_iter()
        .map(|(what, _, d)| (what, kinds(&d)))
        .collect();
    for (what, got) in &said {
        let is = |k: &str| got.iter().any(|(kind, _)| *kind == k);
        match *what {
            "preparing, downloading" | "preparing, staged" => {
                assert_eq!(got.len(), 1, "{what}: {got:?}");
                assert!(is("clear"), "{what}: {got:?}");
            }
            "draining, pods left" | "draining, drained, no run" => {
                assert_eq!(got.len(), 1, "{what}: {got:?}");
                assert!(
                    is("give_back"),
                    "{what}: given back before anything started: {got:?}"
                );
            }
            // Runs that may act, and nodes given back or rolling back,
            // are as they would be without the revocation.
            "upgrading, rebooting" | "upgrading, back, run still running" => {
                assert!(got.is_empty(), "{what}: {got:?}")
            }
            _ => assert!(
                !is("cordon") && !is("prepare") && !is("retarget"),
                "{what}: nothing starts: {got:?}"
            ),
        }
    }
    // A new pin after the revocation: the drains follow it.
    let new_pin = Policy {
        revoked: vec![v("1.13.2")],
        ..bumped()
    };
    let (_, _, d) = steps(&new_pin, &open()).remove(3);
    assert_eq!(
        kinds(&d),
        [
            ("retarget", "drained".to_string()),
            ("start_upgrade", "drained".to_string())
        ]
    );
}

#[test]
fn a_node_whose_run_stopped_is_released_only_once_nothing_of_it_is_left() {
    let mut n = every_state().remove(13).1;
    for (run, released) in [
        (UpgradeStatus::Stopping, false),
        (UpgradeStatus::StopPending, false),
        (UpgradeStatus::Stopped, true),
    ] {
        n.upgrade = run.clone();
        let d = decide(&bumped(), &open(), std::slice::from_ref(&n), t("03:05"));
        check("stopping", &n, &d);
        assert_eq!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::Release { .. })),
            released,
            "{run:?}: {d:?}"
        );
        assert_eq!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::StopRun { .. })),
            run == UpgradeStatus::StopPending,
            "a delete that did not land is sent again: {d:?}"
        );
        assert_eq!(d.unavailable, u32::from(!released), "{run:?}");
    }
}

#[test]
fn a_drained_node_that_already_runs_the_new_pin_is_given_back_as_upgraded() {
    // Drained toward 1.13.2 when 1.13.3 was pinned, and it runs 1.13.3
    // already: no run is made for a version it runs, and it completes at
    // once instead of waiting out node_timeout for 1.13.2.
    let mut n = node(
        "drained",
        ProgressState::Draining,
        UpgradeStatus::NotStarted,
    );
    n.version = Some(v("1.13.3"));
    let d = decide(&bumped(), &open(), &[n], t("03:05"));
    assert!(
        matches!(
            d.actions.as_slice(),
            [Action::Complete { node, uncordon: true }] if node == "drained"
        ),
        "{:?}",
        d.actions
    );
}

#[test]
fn a_held_note_on_a_drained_node_that_runs_the_new_pin_keeps_its_record_draining() {
    // As above, but NotReady and held by a call that failed: it waits for
    // Ready, and the note of its hold changes its record's message only.
    let mut n = node(
        "drained",
        ProgressState::Draining,
        UpgradeStatus::NotStarted,
    );
    n.version = Some(v("1.13.3"));
    n.ready = false;
    let hold = Held {
        node: "drained".into(),
        why: "uncordon failed: 503".into(),
        since: t("03:01"),
        last: t("03:01"),
    };
    let inputs = Inputs {
        held: vec![hold],
        ..open()
    };
    let d = decide(&bumped(), &inputs, std::slice::from_ref(&n), t("03:05"));
    match d.actions.as_slice() {
        [Action::Note { node, progress }] if node == "drained" => {
            assert_eq!(progress.state, ProgressState::Draining);
            assert!(progress.message.starts_with("held: uncordon failed: 503"));
        }
        other => panic!("{other:?}"),
    }
    // Control: not held, nothing is written.
    let d = decide(&bumped(), &open(), &[n], t("03:05"));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

#[test]
fn a_rollback_from_the_pin_fails_the_cluster_and_one_from_an_older_pin_does_not() {
    let mut n = node(
        "rolling-back",
        ProgressState::RollingBack,
        UpgradeStatus::Running,
    );
    n.ready = false;
    if let Ok(Some(p)) = n.progress.as_mut() {
        p.message = "health check failed: pods crash-looping".into();
    }
    let d = decide(
        &policy(3, OnDrainTimeout::Skip),
        &open(),
        std::slice::from_ref(&n),
        t("03:05"),
    );
    assert_eq!(d.state, super::RolloutState::Failed, "{}", d.message);
    assert!(
        d.message.ends_with("rolling back to 1.12.0"),
        "{}",
        d.message
    );
    // 1.13.3 pinned since: the rollback from 1.13.2 goes on, and says
    // nothing of 1.13.3.
    let d = decide(&bumped(), &open(), &[n], t("03:05"));
    assert_eq!(d.state, super::RolloutState::Rolling, "{}", d.message);
}

#[test]
fn a_notready_node_given_back_when_its_pin_is_revoked_counts_against_the_budget() {
    let mut p = policy(1, OnDrainTimeout::Skip);
    p.revoked = vec![v("1.13.2")];
    let mut a = node("a", ProgressState::Draining, UpgradeStatus::NotStarted);
    a.ready = false;
    let d = decide(&p, &open(), &[a], t("03:05"));
    assert_eq!(kinds(&d), [("give_back", "a".into())]);
    assert_eq!(d.unavailable, 1, "NotReady, it is out of service still");
}
