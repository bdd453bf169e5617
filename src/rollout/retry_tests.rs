//! A rollback that failed and a person's retry of it (`drover.dev/retry`
//! on the node's DroverNode record): the node left cordoned and counted
//! against the budget, the retry a rollback started, within
//! `max_rollbacks` however many are retried in one step. The model
//! cluster and its helpers are `rollback_tests.rs`'s.

use super::decide::decide;
use super::decision::*;
use super::rollback_tests::{at, drive, model, moved, node, open, policy, rolling_back, t0, v};
use super::RolloutState;
use crate::cluster::{NodeView, ProgressState, UpgradeStatus};
use crate::config::OnFailure;

#[test]
fn retries_of_failed_rollbacks_in_one_step_share_max_rollbacks() {
    // Two rollbacks from the pin failed (2 of max_rollbacks = 3 used); a
    // person retries both at once: the step starts one, the breaker's last,
    // and names the other refused.
    let mut nodes = vec![model("a", true, true), model("b", true, true)];
    let seen = drive(&policy(OnFailure::Rollback, 2, 2), &mut nodes, 200);
    assert_eq!(seen.rollbacks_started, 2);
    for n in &mut nodes {
        n.rollback_fails = false;
        n.view.retry = true;
    }
    let p = policy(OnFailure::Rollback, 2, 3);
    let views: Vec<NodeView> = nodes.iter().map(|m| m.view.clone()).collect();
    let d = decide(&p, &open(), &views, t0() + chrono::Duration::hours(3));
    let retried: Vec<&str> = d
        .actions
        .iter()
        .filter(|a| matches!(a, Action::RollBack { .. }))
        .map(Action::node)
        .collect();
    assert_eq!(retried, ["a"], "{:?}", d.actions);
    let said = &d
        .skipped
        .iter()
        .find(|s| s.node == "b")
        .expect("b named")
        .reason;
    assert!(said.contains("max_rollbacks (3) reached"), "{said}");
}

#[test]
fn a_retry_on_a_failed_rollback_tries_the_rollback_again_within_max_rollbacks() {
    // The retry is a rollback started: with max_rollbacks = 1 the failed
    // one used the breaker up, and the retry is refused, named.
    let p = policy(OnFailure::Rollback, 1, 1);
    let mut nodes = vec![model("a", true, true)];
    drive(&p, &mut nodes, 200);
    nodes[0].rollback_fails = false;
    nodes[0].view.retry = true;
    let seen = drive(&p, &mut nodes, 50);
    assert_eq!(seen.rollbacks_started, 0);
    let a = node(&nodes, "a");
    assert!(a.unschedulable, "still cordoned at the failed version");
    let d = seen.last.unwrap();
    let said = &d.skipped.iter().find(|s| s.node == "a").unwrap().reason;
    assert!(
        said.contains("retry not started: max_rollbacks (1) reached"),
        "{said}"
    );
    // With room for a second rollback, the retry runs it.
    let p = policy(OnFailure::Rollback, 1, 2);
    let seen = drive(&p, &mut nodes, 200);
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    assert_eq!(seen.rollbacks_started, 1);
    let a = node(&nodes, "a");
    assert_eq!(a.version, Some(v("1.13.2")));
    assert!(!a.unschedulable);
    assert_eq!(a.rolled_back, vec![v("1.13.3")]);
}

#[test]
fn a_node_whose_rollback_failed_counts_while_cordoned_or_notready() {
    // Left cordoned by drover it is out of service; uncordoned by a person
    // it serves while Ready, and counts again once NotReady.
    let p = policy(OnFailure::Rollback, 2, 1);
    let failed = |unschedulable: bool, ready: bool| {
        let mut a = moved(
            "a",
            ProgressState::Failed,
            "rollback failed: its driver failed: exit 1; left cordoned",
        );
        if let Ok(Some(r)) = a.progress.as_mut() {
            r.cordoned_by_drover = true;
        }
        a.unschedulable = unschedulable;
        a.ready = ready;
        a
    };
    for (unschedulable, ready, counted) in [(true, true, 1), (false, true, 0), (false, false, 1)] {
        let d = decide(&p, &open(), &[failed(unschedulable, ready)], at(30));
        assert_eq!(d.state, RolloutState::Failed, "{}", d.message);
        assert_eq!(
            d.unavailable, counted,
            "cordoned {unschedulable}, Ready {ready}: {d:?}"
        );
    }
}

#[test]
fn a_retried_rollback_that_cordons_the_node_again_records_the_cordon_as_drovers() {
    // Someone else had cordoned the node when its rollback started (not
    // drover's to uncordon), and uncordoned it since: the retry cordons it,
    // that cordon is drover's, and drover uncordons the node once back.
    let p = policy(OnFailure::Rollback, 1, 2);
    let mut a = moved(
        "a",
        ProgressState::Failed,
        "rollback failed: its driver failed: exit 1; left cordoned",
    );
    a.retry = true;
    let d = decide(&p, &open(), &[a], at(30));
    match d.actions.as_slice() {
        [Action::RollBack { progress, .. }] => {
            assert!(progress.cordoned_by_drover, "{progress:?}");
            // Its node_timeout counts from the retry, not the failure.
            assert_eq!(progress.started_at, at(30));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_failed_rollback_stops_its_run_only_while_it_runs() {
    // Its rollback run still running past node_timeout: the record says
    // the rollback failed and the run is stopped (it would move the node
    // on while drover says it is left as it is).
    let p = policy(OnFailure::Rollback, 1, 1);
    let mut a = rolling_back();
    a.ready = false;
    a.upgrade = UpgradeStatus::Running;
    let d = decide(
        &p,
        &open(),
        std::slice::from_ref(&a),
        t0() + chrono::Duration::hours(2),
    );
    match d.actions.as_slice() {
        [Action::RollbackFailed {
            stop_run, progress, ..
        }] => {
            assert!(*stop_run);
            assert!(
                progress.message.contains("within node_timeout"),
                "{}",
                progress.message
            );
        }
        other => panic!("{other:?}"),
    }
    // Control: its driver failed, so no run is left to stop.
    a.upgrade = UpgradeStatus::Failed("exit 1".into());
    let d = decide(&p, &open(), &[a], t0() + chrono::Duration::minutes(5));
    match d.actions.as_slice() {
        [Action::RollbackFailed { stop_run, .. }] => assert!(!*stop_run),
        other => panic!("{other:?}"),
    }
}

#[test]
fn retries_of_rollbacks_from_an_older_pin_count_within_the_step() {
    // 1.13.4 pinned since; `a` and `b` failed their rollbacks from 1.13.3
    // (one started each) and a person asked both to retry. Under
    // max_rollbacks = 3 the step starts one more from 1.13.3, not two.
    let p = Policy {
        target: v("1.13.4"),
        ..policy(OnFailure::Rollback, 2, 3)
    };
    let failed = |name: &str| {
        let mut n = moved(
            name,
            ProgressState::Failed,
            &format!("{}its driver failed", super::ROLLBACK_FAILED_PREFIX),
        );
        n.unschedulable = true;
        if let Ok(Some(pr)) = n.progress.as_mut() {
            pr.cordoned_by_drover = true;
        }
        n.retry = true;
        n.rollbacks = vec![crate::record::Rollbacks {
            version: v("1.13.3"),
            started: 1,
        }];
        n
    };
    let started = |p: &Policy| -> Vec<String> {
        decide(p, &open(), &[failed("a"), failed("b")], t0())
            .actions
            .into_iter()
            .filter_map(|a| match a {
                Action::RollBack { node, .. } => Some(node),
                _ => None,
            })
            .collect()
    };
    // `b` waits: the third from 1.13.3 is `a`'s.
    assert_eq!(started(&p), ["a"]);
    // The control: with room for a fourth, both start.
    let roomier = Policy {
        max_rollbacks: 4,
        ..p.clone()
    };
    assert_eq!(started(&roomier), ["a", "b"]);
    // A node back in service (uncordoned since) takes a place again when
    // its rollback is retried: it counts against max_unavailable.
    let mut a = failed("a");
    a.unschedulable = false;
    let d = decide(&roomier, &open(), &[a], t0());
    assert!(
        matches!(d.actions.as_slice(), [Action::RollBack { .. }]),
        "{:?}",
        d.actions
    );
    assert_eq!(d.unavailable, 1);
}

#[test]
fn a_rollback_whose_run_waited_past_node_timeout_says_it_never_started() {
    // Drained, its run waiting for a window (§5b), node_timeout over: the
    // failure, which a person reads before a retry meets max_rollbacks,
    // names the wait, not a node that did not come back (simulation seed
    // 821: paused while it drained, it read "did not return Ready").
    let p = policy(OnFailure::Rollback, 1, 1);
    let late = at(46);
    let said = |inputs: &Inputs, a: NodeView| {
        let d = decide(&p, inputs, &[a], late);
        match d.actions.as_slice() {
            [Action::RollbackFailed { progress, .. }] => progress.message.clone(),
            other => panic!("{other:?}"),
        }
    };
    let mut paused = open();
    paused.window.held = Some("paused ([rollout] paused = true)".into());
    paused.window.paused = true;
    let m = said(&paused, rolling_back());
    assert!(
        m.contains("its run to 1.13.2 did not start within node_timeout (45m): paused"),
        "{m}"
    );
    let closed = Inputs {
        window: WindowState::default(),
        ..open()
    };
    let m = said(&closed, rolling_back());
    assert!(m.contains(": no maintenance window was open"), "{m}");
    // Control: a run that started and did not bring the node back.
    let mut a = rolling_back();
    a.upgrade = UpgradeStatus::Running;
    let m = said(&open(), a);
    assert!(
        m.contains("node did not return Ready at 1.13.2 within node_timeout"),
        "{m}"
    );
}
