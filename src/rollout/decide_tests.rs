//! Step-by-step tests of the decision core.

use super::decide::*;
use super::decision::*;
use super::RolloutState;
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::{MaxUnavailable, OnDrainTimeout};
use chrono::{DateTime, Utc};
use semver::Version;
use std::time::Duration;

// The fixtures below are shared by the other decision tests of this module.

/// An instant on the test day, `HH:MM` or `HH:MM:SS`.
pub(super) fn t(s: &str) -> DateTime<Utc> {
    let s = if s.len() == 5 {
        format!("{s}:00")
    } else {
        s.into()
    };
    format!("2026-12-08T{s}Z").parse().unwrap()
}

pub(super) fn v(s: &str) -> Version {
    s.parse().unwrap()
}

pub(super) fn policy(max: u32, mode: OnDrainTimeout) -> Policy {
    Policy {
        target: v("1.13.2"),
        allow_downgrade: false,
        max_unavailable: MaxUnavailable::Count(max),
        drain_timeout: Duration::from_secs(20 * 60),
        node_timeout: Duration::from_secs(45 * 60),
        on_drain_timeout: mode,
        health: None,
        on_failure: crate::config::OnFailure::Halt,
        max_rollbacks: 1,
        prepare: false,
        prestage: std::time::Duration::ZERO,
        revoked: Vec::new(),
        drain: Vec::new(),
        consent_limit: None,
    }
}

pub(super) fn open() -> Inputs {
    Inputs {
        may_start: true,
        hold_reason: String::new(),
        window: WindowState {
            opened_at: Some(t("02:00")),
            closes_at: Some(t("08:00")),
            next_opens_at: None,
            ..WindowState::default()
        },
        patch_window: None,
        ..Default::default()
    }
}

/// A Ready, schedulable node at `ver` that drover has not touched.
pub(super) fn idle(name: &str, ver: &str) -> NodeView {
    NodeView {
        name: name.into(),
        version: Some(v(ver)),
        ready: true,
        ..NodeView::default()
    }
}

fn with(mut n: NodeView, state: ProgressState, started: &str, by_drover: bool) -> NodeView {
    n.progress = Ok(Some(NodeProgress {
        state,
        target: v("1.13.2"),
        started_at: t(started),
        cordoned_by_drover: by_drover,
        message: "why".into(),
        retries: 0,
        previous: None,
    }));
    n.unschedulable = state.in_flight();
    n
}

pub(super) fn kinds(d: &Decision) -> Vec<(&'static str, String)> {
    d.actions
        .iter()
        .map(|a| (a.kind(), a.node().to_string()))
        .collect()
}

#[test]
fn idle_nodes_start_in_name_order_up_to_the_budget() {
    let nodes = [
        idle("c", "1.12.0"),
        idle("a", "1.12.0"),
        idle("b", "1.13.2"),
    ];
    let d = decide(
        &policy(1, OnDrainTimeout::Skip),
        &open(),
        &nodes,
        t("03:00"),
    );
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
    let Action::Cordon { progress, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert_eq!(progress.state, ProgressState::Draining);
    assert_eq!(progress.started_at, t("03:00"));
    assert!(progress.cordoned_by_drover);
    assert_eq!(d.state, RolloutState::Rolling);
    assert_eq!((d.nodes, d.nodes_at_version), (3, 1));
}

#[test]
fn percent_budget_resolves_against_selected_nodes() {
    let nodes: Vec<_> = (0..10).map(|i| idle(&format!("n{i}"), "1.12.0")).collect();
    let mut p = policy(1, OnDrainTimeout::Skip);
    p.max_unavailable = MaxUnavailable::Percent(30);
    let d = decide(&p, &open(), &nodes, t("03:00"));
    assert_eq!(d.actions.len(), 3);
    assert_eq!(d.max_unavailable, 3);
}

#[test]
fn nothing_starts_outside_the_window_or_without_the_gate() {
    let nodes = [idle("a", "1.12.0")];
    let mut closed = open();
    closed.window = WindowState {
        opened_at: None,
        closes_at: None,
        next_opens_at: Some(t("22:00")),
        ..WindowState::default()
    };
    let d = decide(
        &policy(1, OnDrainTimeout::Skip),
        &closed,
        &nodes,
        t("09:00"),
    );
    assert!(d.actions.is_empty());
    assert_eq!(d.state, RolloutState::Pending);
    assert!(
        d.message.contains("waiting for the next window"),
        "{}",
        d.message
    );
    assert_eq!(d.wake_at, Some(t("22:00")));

    let mut refused = open();
    refused.may_start = false;
    refused.hold_reason = "gate: stage has not confirmed 1.13.2".into();
    let d = decide(
        &policy(1, OnDrainTimeout::Skip),
        &refused,
        &nodes,
        t("03:00"),
    );
    assert!(d.actions.is_empty());
    assert_eq!(d.message, "gate: stage has not confirmed 1.13.2");
}

#[test]
fn a_node_cordoned_by_someone_else_is_skipped_and_reported() {
    let mut n = idle("a", "1.12.0");
    n.unschedulable = true;
    let d = decide(&policy(1, OnDrainTimeout::Skip), &open(), &[n], t("03:00"));
    assert!(d.actions.is_empty());
    assert_eq!(d.skipped[0].reason, "cordoned by someone else");
    assert_eq!(d.state, RolloutState::Blocked);
}

#[test]
fn unreadable_version_is_reported_and_not_moved() {
    let mut n = idle("a", "1.12.0");
    n.version = None;
    let d = decide(&policy(1, OnDrainTimeout::Skip), &open(), &[n], t("03:00"));
    assert!(d.actions.is_empty());
    assert_eq!(d.skipped[0].reason, "OS version cannot be read");
}

#[test]
fn notready_nodes_count_against_the_budget() {
    let mut sick = idle("z", "1.13.2");
    sick.ready = false;
    let nodes = [idle("a", "1.12.0"), sick];
    let d = decide(
        &policy(1, OnDrainTimeout::Skip),
        &open(),
        &nodes,
        t("03:00"),
    );
    assert!(d.actions.is_empty());
    assert_eq!(d.unavailable, 1);
}

#[test]
fn a_draining_node_whose_cordon_was_lost_is_cordoned_again_before_anything_else() {
    // The agent stopped between the record and the cordon (or a person
    // uncordoned it): a pod may land on it, so no run starts on what was
    // seen before the cordon.
    let p = policy(1, OnDrainTimeout::Skip);
    let mut n = with(idle("a", "1.12.0"), ProgressState::Draining, "03:00", true);
    n.unschedulable = false;
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:05"));
    assert_eq!(kinds(&d), [("cordon_again", "a".into())]);
    assert_eq!((d.unavailable, d.message.as_str()), (1, "draining: a"));
    // The same for a rollback whose run has not started.
    let mut n = with(
        idle("a", "1.13.2"),
        ProgressState::RollingBack,
        "03:00",
        true,
    );
    n.unschedulable = false;
    if let Ok(Some(p)) = n.progress.as_mut() {
        p.previous = Some(v("1.12.0"));
    }
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:05"));
    assert_eq!(kinds(&d), [("cordon_again", "a".into())]);
}

#[test]
fn draining_evicts_then_starts_the_upgrade_then_blocks_on_timeout() {
    let p = policy(1, OnDrainTimeout::Skip);
    let mut n = with(idle("a", "1.12.0"), ProgressState::Draining, "03:00", true);
    n.pods_to_evict = 2;
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:05"));
    assert_eq!(kinds(&d), [("evict", "a".into())]);
    assert_eq!(d.wake_at, Some(t("03:20")));
    // Its `Draining` is no Event: the status says it.
    assert_eq!(d.state, RolloutState::Rolling);
    assert_eq!(d.message, "draining: a");

    n.pods_to_evict = 0;
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:06"));
    let Action::StartUpgrade { progress, .. } = &d.actions[0] else {
        panic!("{d:?}")
    };
    assert_eq!(progress.state, ProgressState::Upgrading);
    assert_eq!(
        progress.started_at,
        t("03:00"),
        "the attempt keeps its drain start"
    );

    n.pods_to_evict = 1;
    let d = decide(&p, &open(), &[n, idle("b", "1.12.0")], t("03:20"));
    let Action::Block {
        progress, uncordon, ..
    } = &d.actions[0]
    else {
        panic!("{d:?}")
    };
    assert!(*uncordon);
    assert_eq!(progress.state, ProgressState::Blocked);
    assert!(progress.message.contains("drain_timeout"));
    // The slot it frees goes to the next node at once (skip mode).
    assert_eq!(kinds(&d)[1], ("cordon", "b".into()));
}

#[test]
fn upgrading_completes_only_ready_at_exactly_the_target() {
    let p = policy(1, OnDrainTimeout::Skip);
    let mut n = with(idle("a", "1.12.0"), ProgressState::Upgrading, "03:00", true);
    n.upgrade = UpgradeStatus::Running;
    n.ready = false;
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:10"));
    assert!(d.actions.is_empty());
    assert_eq!(d.wake_at, Some(t("03:45")));

    n.ready = true;
    n.version = Some(v("1.13.2"));
    n.upgrade = UpgradeStatus::Succeeded;
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:15"));
    assert_eq!(
        d.actions,
        [Action::Complete {
            node: "a".into(),
            uncordon: true
        }]
    );
    // Still cordoned until that give-back lands: not confirmed yet.
    assert_eq!(d.state, RolloutState::Rolling, "{}", d.message);
}

#[test]
fn a_node_drover_did_not_cordon_is_never_uncordoned() {
    let p = policy(1, OnDrainTimeout::Skip);
    let mut n = with(
        idle("a", "1.13.2"),
        ProgressState::Upgrading,
        "03:00",
        false,
    );
    n.upgrade = UpgradeStatus::Succeeded;
    let d = decide(&p, &open(), &[n], t("03:15"));
    assert_eq!(
        d.actions,
        [Action::Complete {
            node: "a".into(),
            uncordon: false
        }]
    );
}

#[test]
fn wrong_version_driver_failure_and_timeout_fail_and_stop_the_rollout() {
    let p = policy(2, OnDrainTimeout::Skip);
    let mut wrong = with(idle("a", "1.13.1"), ProgressState::Upgrading, "03:00", true);
    wrong.upgrade = UpgradeStatus::Succeeded;
    let mut broken = with(idle("b", "1.12.0"), ProgressState::Upgrading, "03:00", true);
    broken.upgrade = UpgradeStatus::Failed("no space left".into());
    let mut lost = with(idle("c", "1.12.0"), ProgressState::Upgrading, "03:00", true);
    lost.upgrade = UpgradeStatus::Running;
    lost.ready = false;
    let nodes = [wrong, broken, lost, idle("d", "1.12.0")];
    let d = decide(&p, &open(), &nodes, t("03:45"));
    let msgs: Vec<_> = d
        .actions
        .iter()
        .map(|a| match a {
            Action::Fail {
                progress,
                uncordon,
                stop_run,
                node,
            } => {
                // A run still running is stopped first; its node stays
                // cordoned (and counted) until nothing of it is left.
                assert_eq!(*stop_run, node == "c", "{node}");
                assert_eq!(*uncordon, node != "c", "{node}");
                assert_eq!(progress.cordoned_by_drover, node == "c", "{node}");
                progress.message.clone()
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(msgs.len(), 3, "d is not started: {d:?}");
    assert!(msgs[0].contains("Ready at 1.13.1 instead of 1.13.2"));
    assert!(msgs[1].contains("no space left"));
    assert!(msgs[2].contains("did not return Ready at 1.13.2 within node_timeout"));
    assert_eq!(d.state, RolloutState::Failed);
    assert_eq!(d.unavailable, 1, "the stopping node still counts");
}

#[test]
fn a_failed_node_holds_the_rollout_until_retry_or_a_new_target() {
    let p = policy(1, OnDrainTimeout::Skip);
    let failed = with(idle("a", "1.12.0"), ProgressState::Failed, "03:00", false);
    let d = decide(
        &p,
        &open(),
        &[failed.clone(), idle("b", "1.12.0")],
        t("04:00"),
    );
    assert!(d.actions.is_empty());
    assert_eq!(d.state, RolloutState::Failed);

    let mut retried = failed.clone();
    retried.retry = true;
    let d = decide(&p, &open(), &[retried, idle("b", "1.12.0")], t("04:00"));
    assert_eq!(kinds(&d), [("clear", "a".into()), ("cordon", "b".into())]);

    let mut newer = p.clone();
    newer.target = v("1.13.3");
    let d = decide(&newer, &open(), &[failed, idle("b", "1.12.0")], t("04:00"));
    assert_eq!(kinds(&d)[0], ("clear", "a".into()));
}

#[test]
fn skip_retries_blocked_nodes_after_never_attempted_ones() {
    let p = policy(1, OnDrainTimeout::Skip);
    let blocked = with(idle("a", "1.12.0"), ProgressState::Blocked, "03:20", false);
    let d = decide(
        &p,
        &open(),
        &[blocked.clone(), idle("b", "1.12.0")],
        t("03:20"),
    );
    assert_eq!(kinds(&d), [("cordon", "b".into())]);
    let d = decide(&p, &open(), &[blocked, idle("b", "1.13.2")], t("03:40"));
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
}

#[test]
fn stop_holds_until_a_later_window_then_retries_the_blocked_node_first() {
    let p = policy(1, OnDrainTimeout::Stop);
    let blocked = with(idle("b", "1.12.0"), ProgressState::Blocked, "03:20", false);
    let nodes = [idle("a", "1.12.0"), blocked];
    let d = decide(&p, &open(), &nodes, t("03:30"));
    assert!(d.actions.is_empty());
    assert_eq!(d.state, RolloutState::Blocked);

    let mut next = open();
    next.window.opened_at = Some(t("22:00"));
    next.window.closes_at = Some(t("23:00"));
    let d = decide(&p, &next, &nodes, t("22:00"));
    assert_eq!(kinds(&d), [("cordon", "b".into())]);
}

#[test]
fn in_flight_nodes_continue_when_the_window_closes() {
    let p = policy(2, OnDrainTimeout::Skip);
    let mut n = with(idle("a", "1.12.0"), ProgressState::Draining, "07:55", true);
    n.pods_to_evict = 0;
    let closed = Inputs {
        may_start: true,
        hold_reason: String::new(),
        window: WindowState::default(),
        patch_window: None,
        ..Default::default()
    };
    let d = decide(&p, &closed, &[n, idle("b", "1.12.0")], t("08:05"));
    assert_eq!(kinds(&d), [("start_upgrade", "a".into())]);
    assert_eq!(d.state, RolloutState::Rolling);
}

#[test]
fn a_node_back_at_its_target_is_not_given_back_while_its_run_still_runs() {
    let p = policy(1, OnDrainTimeout::Skip);
    let mut n = with(idle("a", "1.13.2"), ProgressState::Upgrading, "03:00", true);
    n.upgrade = UpgradeStatus::Running;
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:10"));
    assert_eq!(kinds(&d), [], "the run may still act on it");
    assert_eq!(d.unavailable, 1);
    n.upgrade = UpgradeStatus::Succeeded;
    let d = decide(&p, &open(), &[n], t("03:11"));
    assert_eq!(kinds(&d), [("complete", "a".into())]);
}

#[test]
fn confirmed_needs_every_node_ready_at_target_and_no_progress_left() {
    let p = policy(1, OnDrainTimeout::Skip);
    let d = decide(
        &p,
        &open(),
        &[idle("a", "1.13.2"), idle("b", "1.13.2")],
        t("03:00"),
    );
    assert_eq!(d.state, RolloutState::Confirmed);
    assert_eq!(d.nodes_at_version, 2);
    let blocked = with(idle("b", "1.13.2"), ProgressState::Blocked, "03:00", false);
    let d = decide(&p, &open(), &[idle("a", "1.13.2"), blocked], t("03:00"));
    assert_ne!(d.state, RolloutState::Confirmed);
    let d = decide(&p, &open(), &[], t("03:00"));
    assert_eq!(d.state, RolloutState::Blocked);
}

#[test]
fn window_state_from_intervals() {
    let w = [(t("02:00"), t("08:00")), (t("20:00"), t("21:00"))];
    let s = WindowState::from_intervals(&w, t("07:59"));
    assert_eq!(
        (s.opened_at, s.closes_at, s.next_opens_at),
        (Some(t("02:00")), Some(t("08:00")), Some(t("20:00")))
    );
    let s = WindowState::from_intervals(&w, t("08:00"));
    assert!(!s.is_open());
    assert_eq!(s.next_opens_at, Some(t("20:00")));
}

#[test]
fn a_pause_or_freeze_holds_as_paused_and_a_minor_freeze_lets_a_patch_through() {
    let p = policy(1, OnDrainTimeout::Skip);
    let mut held = open();
    held.window.held = Some("held by freeze \"holiday\" (scope minor) until x".into());
    held.window.opened_at = None;
    held.window.closes_at = None;
    // A minor change (1.12 -> 1.13.2) is held; the state says why.
    let d = decide(&p, &held, &[idle("a", "1.12.0")], t("03:00"));
    assert!(d.actions.is_empty());
    assert_eq!(d.state, RolloutState::Paused);
    assert!(d.message.contains("holiday"), "{}", d.message);
    // A patch (1.13.0 -> 1.13.2) uses the patch window, which is open.
    held.patch_window = Some(open().window);
    let d = decide(&p, &held, &[idle("a", "1.13.0")], t("03:00"));
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
    // Control: one node on another minor makes it a minor change again.
    let d = decide(
        &p,
        &held,
        &[idle("a", "1.13.0"), idle("b", "1.12.9")],
        t("03:00"),
    );
    assert!(d.actions.is_empty());
    assert_eq!(d.state, RolloutState::Paused);
}

#[test]
fn a_blocked_node_waits_out_its_backoff_unless_its_budgets_relent() {
    let p = policy(1, OnDrainTimeout::Skip);
    let blocked = with(idle("a", "1.12.0"), ProgressState::Blocked, "02:00", false);
    // 3 minutes after the give-back: not retried, and the wake-up is the retry time.
    let d = decide(&p, &open(), std::slice::from_ref(&blocked), t("02:03"));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.state, RolloutState::Blocked);
    assert!(
        d.message.contains("next try after 2026-12-08T02:05:00Z"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("blocked since 2026-12-08T02:00:00Z"),
        "{}",
        d.message
    );
    assert_eq!(d.wake_at, Some(t("02:05")));
    // At the backoff: retried, counting the attempt.
    let d = decide(&p, &open(), std::slice::from_ref(&blocked), t("02:05"));
    match &d.actions[..] {
        [Action::Cordon { progress, .. }] => assert_eq!(progress.retries, 1),
        other => panic!("{other:?}"),
    }
    // The backoff grows: after a second give-back, 10 minutes.
    let mut again = blocked.clone();
    if let Ok(Some(pr)) = &mut again.progress {
        pr.retries = 1;
    }
    let d = decide(&p, &open(), std::slice::from_ref(&again), t("02:09"));
    assert!(d.actions.is_empty());
    assert_eq!(d.wake_at, Some(t("02:10")));
    // Its budgets allow a disruption again: the first retry comes at once...
    let mut relented = blocked;
    relented.budgets_allow_drain = true;
    let d = decide(&p, &open(), std::slice::from_ref(&relented), t("02:01"));
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
    // ...later ones wait out their backoff (a budget that relents only
    // because the node was given back must not make a loop).
    if let Ok(Some(pr)) = &mut relented.progress {
        pr.retries = 1;
    }
    let d = decide(&p, &open(), &[relented], t("02:01"));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(retry_backoff(0), Duration::from_secs(300));
    assert_eq!(retry_backoff(30), Duration::from_secs(7200));
}

#[test]
fn a_halted_environment_starts_no_node_lets_the_one_in_flight_finish_and_says_halted() {
    let mut halted = open();
    halted.halted = Some("production halted for 1.13.2: prod-eu-1 failed it".into());
    let nodes = vec![
        with(idle("a", "1.12.0"), ProgressState::Upgrading, "02:10", true),
        idle("b", "1.12.0"),
        // Still draining, its run not started: given back, not upgraded
        // to the version that failed elsewhere (sim seed 133).
        with(idle("c", "1.12.0"), ProgressState::Draining, "02:15", true),
    ];
    let d = decide(
        &policy(2, OnDrainTimeout::Skip),
        &halted,
        &nodes,
        t("02:20"),
    );
    assert!(
        !d.actions.iter().any(|a| matches!(a, Action::Cordon { .. })),
        "{:?}",
        d.actions
    );
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::GiveBack { node, uncordon: true, .. } if node == "c")),
        "{:?}",
        d.actions
    );
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::StartUpgrade { node, .. } if node == "c")),
        "{:?}",
        d.actions
    );
    assert_eq!(d.state, RolloutState::Halted);
    assert!(d.message.contains("prod-eu-1 failed it"), "{}", d.message);
    // Out of service: a, upgrading; not c, Ready and given back.
    assert_eq!(d.unavailable, 1);
    // A NotReady node given back is still out of service, and counts.
    let mut not_ready = nodes.clone();
    not_ready[2].ready = false;
    let d = decide(
        &policy(2, OnDrainTimeout::Skip),
        &halted,
        &not_ready,
        t("02:20"),
    );
    assert_eq!(d.unavailable, 2, "{:?}", d.actions);
    // A cluster that had confirmed shows the environment's halt too.
    let done = vec![idle("a", "1.13.2")];
    let d = decide(&policy(1, OnDrainTimeout::Skip), &halted, &done, t("02:20"));
    assert_eq!(d.state, RolloutState::Halted);
    assert!(d.actions.is_empty());
}

#[test]
fn a_wave_waiting_for_the_one_before_is_pending_and_starts_nothing() {
    let mut waiting = open();
    waiting.waiting =
        Some("wave 2 waits for wave 1 to confirm: not yet confirmed by prod-eu-1".into());
    let d = decide(
        &policy(1, OnDrainTimeout::Skip),
        &waiting,
        &[idle("a", "1.12.0")],
        t("03:00"),
    );
    assert!(d.actions.is_empty());
    assert_eq!(d.state, RolloutState::Pending);
    assert!(d.message.starts_with("wave 2 waits"), "{}", d.message);
}

#[test]
fn a_timed_out_run_is_stopped_and_its_node_released_only_once_it_is_gone() {
    // Upgrading (a draining record whose run exists), its run running past
    // node_timeout: the record says failed, still cordoned, the run stopped.
    let p = policy(1, OnDrainTimeout::Skip);
    let mut n = with(idle("a", "1.12.0"), ProgressState::Upgrading, "03:00", true);
    n.upgrade = UpgradeStatus::Running;
    n.ready = false;
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:45"));
    assert_eq!(kinds(&d), [("fail", "a".into())]);
    assert!(!d.actions[0].gives_back(), "it still counts");
    // Before the timeout: nothing.
    let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:30"));
    assert_eq!(kinds(&d), []);
    // Failed, still drover's cordon, its run stopping: it waits, counted,
    // and no other node starts in its place.
    let mut failed = with(idle("a", "1.12.0"), ProgressState::Failed, "03:45", true);
    failed.unschedulable = true;
    failed.upgrade = UpgradeStatus::Stopping;
    let d = decide(
        &p,
        &open(),
        &[failed.clone(), idle("b", "1.12.0")],
        t("03:46"),
    );
    assert_eq!(kinds(&d), []);
    assert_eq!(d.unavailable, 1);
    assert_eq!(d.state, RolloutState::Failed);
    assert!(d.wake_at.is_some_and(|w| w <= t("03:46:05")));
    // Nothing of it left: released (uncordoned, the record saying so).
    failed.upgrade = UpgradeStatus::Stopped;
    let d = decide(&p, &open(), &[failed, idle("b", "1.12.0")], t("03:47"));
    assert_eq!(kinds(&d), [("release", "a".into())]);
    let Action::Release { progress, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert!(!progress.cordoned_by_drover);
    assert_eq!(progress.state, ProgressState::Failed);
}

#[test]
fn draining_ready_at_its_target_without_a_run_is_given_back_as_upgraded() {
    // Its record says draining and no run was made, and the node runs the
    // pin (a new pin it already runs, or a give-back that did not land).
    let p = policy(1, OnDrainTimeout::Skip);
    let n = with(idle("a", "1.13.2"), ProgressState::Draining, "03:00", true);
    for now in ["03:10", "03:30"] {
        let d = decide(&p, &open(), std::slice::from_ref(&n), t(now));
        assert_eq!(kinds(&d), [("complete", "a".into())], "at {now}");
        let Action::Complete { uncordon, .. } = &d.actions[0] else {
            unreachable!()
        };
        assert!(*uncordon);
    }
    // Control: not at the target, drained: the upgrade starts, once.
    let n = with(idle("a", "1.12.0"), ProgressState::Draining, "03:00", true);
    let d = decide(&p, &open(), &[n], t("03:10"));
    assert_eq!(kinds(&d), [("start_upgrade", "a".into())]);
}

#[test]
fn a_give_back_that_did_not_land_is_repaired_when_the_node_is_not_ready() {
    // Its record says draining, no run, and it runs the pin (its give-back
    // uncordoned it and the record write did not land, or a new pin it
    // already runs), but it is NotReady: no second cordon, no eviction, no
    // driver run for a version it runs; it waits, counted, for Ready
    // within node_timeout.
    let p = policy(1, OnDrainTimeout::Skip);
    for uncordoned in [false, true] {
        let mut n = with(idle("a", "1.13.2"), ProgressState::Draining, "03:00", true);
        n.ready = false;
        n.pods_to_evict = 2;
        n.unschedulable = !uncordoned;
        let nodes = [n.clone(), idle("b", "1.12.0")];
        for now in ["03:10", "03:30"] {
            let d = decide(&p, &open(), &nodes, t(now));
            assert_eq!(kinds(&d), [], "uncordoned {uncordoned}, at {now}");
            assert_eq!(d.unavailable, 1, "it counts, and no other node starts");
        }
        // Ready again: given back as upgraded.
        let mut back = n.clone();
        back.ready = true;
        let d = decide(&p, &open(), std::slice::from_ref(&back), t("03:30"));
        assert_eq!(kinds(&d), [("complete", "a".into())]);
        // Still NotReady at node_timeout: given back failed, named.
        let d = decide(&p, &open(), std::slice::from_ref(&n), t("03:46"));
        assert_eq!(kinds(&d), [("fail", "a".into())], "uncordoned {uncordoned}");
        assert_eq!(d.state, RolloutState::Failed);
    }
}

#[test]
fn a_node_newer_than_the_pin_is_left_alone_unless_allow_downgrade_is_set() {
    let nodes = [idle("a", "1.13.2"), idle("b", "1.14.0")];
    let p = policy(1, OnDrainTimeout::Skip);
    let d = decide(&p, &open(), &nodes, t("03:00"));
    assert!(d.actions.is_empty(), "{:?}", kinds(&d));
    assert_eq!(d.skipped.len(), 1);
    assert_eq!(d.skipped[0].node, "b");
    assert!(
        d.skipped[0]
            .reason
            .contains("runs 1.14.0, newer than the pinned 1.13.2")
            && d.skipped[0].reason.contains("allow_downgrade = true"),
        "{}",
        d.skipped[0].reason
    );
    assert_eq!(
        d.state,
        RolloutState::Blocked,
        "never confirmed: b is not at the pin"
    );
    assert!(d.message.contains("runs 1.14.0"), "{}", d.message);

    let down = Policy {
        allow_downgrade: true,
        ..p
    };
    let d = decide(&down, &open(), &nodes, t("03:00"));
    assert_eq!(kinds(&d), [("cordon", "b".to_string())]);
    assert!(d.skipped.is_empty());
}

#[test]
fn a_node_another_updater_manages_is_skipped_with_the_reason() {
    let mut managed = idle("a", "1.12.0");
    managed.managed_by = Some("managed by the Bottlerocket update operator (...)".into());
    let nodes = [managed, idle("b", "1.12.0")];
    let d = decide(
        &policy(2, OnDrainTimeout::Skip),
        &open(),
        &nodes,
        t("03:00"),
    );
    assert_eq!(kinds(&d), [("cordon", "b".to_string())]);
    assert_eq!(d.skipped.len(), 1);
    assert_eq!(
        d.skipped[0].reason,
        "managed by the Bottlerocket update operator (...)"
    );
}

#[test]
fn a_node_whose_workload_asks_to_wait_is_skipped_holds_no_place_and_is_taken_once_it_stops_asking()
{
    let mut paused = idle("a", "1.12.0");
    paused.consent_paused = true;
    let nodes = [paused.clone(), idle("b", "1.12.0")];
    let one = policy(1, OnDrainTimeout::Skip);
    // b starts in a's turn: a holds no place in the budget of one.
    let d = decide(&one, &open(), &nodes, t("03:00"));
    // drover records when it first saw the hold (consent_tests.rs).
    assert_eq!(
        kinds(&d),
        [("consent", "a".to_string()), ("cordon", "b".to_string())]
    );
    paused.consent_hold = Some(crate::cluster::ConsentHold {
        since: t("03:00"),
        overdue: false,
    });
    assert_eq!(d.skipped.len(), 1);
    assert!(
        d.skipped[0].reason.starts_with("waiting for consent"),
        "{:?}",
        d.skipped
    );
    assert_eq!(d.unavailable, 1);
    // b done, a still asking: waiting, not blocked or failed.
    let done = idle("b", &one.target.to_string());
    let d = decide(&one, &open(), &[paused.clone(), done.clone()], t("03:30"));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.state, RolloutState::Pending, "{}", d.message);
    assert_eq!(d.message, "waiting for consent on 1 node: a");
    // The label removed: a starts at once.
    paused.consent_paused = false;
    let d = decide(&one, &open(), &[paused, done], t("03:31"));
    assert_eq!(kinds(&d), [("cordon", "a".to_string())]);
}
