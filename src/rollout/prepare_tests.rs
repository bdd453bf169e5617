//! Downloading before the drain (`prepare.rs`), decided without I/O: a node
//! is cordoned only once its prepare run succeeded, a target it cannot get
//! fails it in service, at most `max_unavailable` nodes prepare ahead, and
//! `prestage` lets them prepare before a window opens.

use super::decide::decide;
use super::decide_tests::idle;
use super::decide_tests::{self, kinds, t, v};
use super::decision::*;
use super::RolloutState;
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::OnDrainTimeout;
use std::time::Duration;

fn policy(max: u32) -> Policy {
    Policy {
        prepare: true,
        ..decide_tests::policy(max, OnDrainTimeout::Skip)
    }
}

fn window(open: bool) -> Inputs {
    Inputs {
        may_start: true,
        window: if open {
            WindowState {
                opened_at: Some(t("02:00")),
                closes_at: Some(t("08:00")),
                ..WindowState::default()
            }
        } else {
            WindowState {
                next_opens_at: Some(t("02:00")),
                ..WindowState::default()
            }
        },
        ..Default::default()
    }
}

/// `name` preparing the target since `started`, its run in `run`.
fn preparing(name: &str, started: &str, run: UpgradeStatus) -> NodeView {
    let mut n = idle(name, "1.12.0");
    n.progress = Ok(Some(NodeProgress {
        state: ProgressState::Preparing,
        target: v("1.13.2"),
        started_at: t(started),
        cordoned_by_drover: false,
        message: String::new(),
        retries: 0,
        previous: Some(v("1.12.0")),
    }));
    n.upgrade = run;
    n
}

fn draining(name: &str) -> NodeView {
    let mut n = idle(name, "1.12.0");
    n.progress = Ok(Some(NodeProgress {
        state: ProgressState::Draining,
        target: v("1.13.2"),
        started_at: t("02:50"),
        cordoned_by_drover: true,
        message: String::new(),
        retries: 0,
        previous: Some(v("1.12.0")),
    }));
    n.unschedulable = true;
    n.pods_to_evict = 3;
    n
}

#[test]
fn a_node_about_to_start_prepares_in_service_before_any_cordon() {
    let nodes = [idle("a", "1.12.0"), idle("b", "1.12.0")];
    let d = decide(&policy(1), &window(true), &nodes, t("03:00"));
    assert_eq!(
        kinds(&d),
        [("prepare", "a".into())],
        "b waits: a holds the place"
    );
    let Action::Prepare { progress, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert_eq!(progress.state, ProgressState::Preparing);
    assert!(!progress.cordoned_by_drover, "it stays in service");
    assert_eq!(progress.run_action(), crate::record::RunAction::Prepare);
    assert_eq!(d.state, RolloutState::Rolling);
    assert_eq!(d.unavailable, 0, "a preparing node serves");
    assert!(d.message.contains("downloading"), "{}", d.message);

    // Control: without prepare the same step cordons.
    let mut off = policy(1);
    off.prepare = false;
    let d = decide(&off, &window(true), &nodes, t("03:00"));
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
}

#[test]
fn the_node_is_cordoned_only_once_its_download_finished() {
    let running = [
        preparing("a", "03:00", UpgradeStatus::Running),
        idle("b", "1.12.0"),
    ];
    let d = decide(&policy(1), &window(true), &running, t("03:10"));
    assert_eq!(kinds(&d), [], "a downloads; b waits for a prepare slot");

    let staged = [
        preparing("a", "03:00", UpgradeStatus::Succeeded),
        idle("b", "1.12.0"),
    ];
    let d = decide(&policy(1), &window(true), &staged, t("03:10"));
    assert_eq!(
        kinds(&d),
        [("cordon", "a".into())],
        "a leaves service staged; b waits for the budget"
    );
    let Action::Cordon { progress, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert_eq!(progress.state, ProgressState::Draining);
    assert_eq!(progress.started_at, t("03:10"), "a new episode: the drain");
    assert_eq!(progress.previous, Some(v("1.12.0")));
}

#[test]
fn a_target_the_node_cannot_get_fails_it_uncordoned_and_stops_new_starts() {
    let nodes = [
        preparing(
            "a",
            "03:00",
            UpgradeStatus::Failed("1.13.2 is not offered to this node (offered: 1.13.1)".into()),
        ),
        idle("b", "1.12.0"),
    ];
    let d = decide(&policy(2), &window(true), &nodes, t("03:05"));
    assert_eq!(kinds(&d), [("fail", "a".into())], "b does not start");
    let Action::Fail {
        progress, uncordon, ..
    } = &d.actions[0]
    else {
        unreachable!()
    };
    assert!(!uncordon && !progress.cordoned_by_drover, "never cordoned");
    assert_eq!(progress.state, ProgressState::Failed);
    assert!(
        progress.message.contains("before the drain") && progress.message.contains("not offered"),
        "{}",
        progress.message
    );
    assert_eq!(d.state, RolloutState::Failed);
    assert!(d.message.contains("node a failed"), "{}", d.message);
}

#[test]
fn a_download_outlasting_node_timeout_fails_the_node_in_service() {
    let nodes = [preparing("a", "03:00", UpgradeStatus::Running)];
    let d = decide(&policy(1), &window(true), &nodes, t("03:44"));
    assert_eq!(kinds(&d), []);
    assert_eq!(d.wake_at, Some(t("03:45")), "woken at the timeout");
    let d = decide(&policy(1), &window(true), &nodes, t("03:45"));
    assert_eq!(kinds(&d), [("fail", "a".into())]);
    assert_eq!(d.state, RolloutState::Failed);
}

#[test]
fn with_prestage_downloads_run_at_most_one_budget_ahead_of_the_drains() {
    let mut nodes = vec![draining("a"), draining("b")];
    nodes.extend(["c", "d", "e", "f"].map(|n| idle(n, "1.12.0")));
    // Default: nothing ahead while the budget is used up.
    let d = decide(&policy(2), &window(true), &nodes, t("03:00"));
    assert_eq!(kinds(&d), [("evict", "a".into()), ("evict", "b".into())]);
    let mut p = policy(2);
    p.prestage = Duration::from_secs(3600);
    let d = decide(&p, &window(true), &nodes, t("03:00"));
    assert_eq!(
        kinds(&d),
        [
            ("evict", "a".into()),
            ("evict", "b".into()),
            ("prepare", "c".into()),
            ("prepare", "d".into()),
        ]
    );
    assert_eq!(d.unavailable, 2, "the budget counts the drains only");
}

#[test]
fn a_new_target_clears_a_preparing_node() {
    let mut p = policy(1);
    p.target = v("1.13.3");
    let nodes = [preparing("a", "03:00", UpgradeStatus::Succeeded)];
    let d = decide(&p, &window(true), &nodes, t("03:10"));
    assert_eq!(kinds(&d), [("clear", "a".into())]);
}

#[test]
fn a_crash_before_the_prepare_run_started_starts_the_run_its_record_names() {
    // Recorded preparing, its run not made: that run is made (no new
    // record, no new attempt).
    let nodes = [preparing("a", "03:00", UpgradeStatus::NotStarted)];
    let d = decide(&policy(1), &window(true), &nodes, t("03:01"));
    assert_eq!(kinds(&d), [("start_upgrade", "a".into())]);
    let Action::StartUpgrade { progress, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert_eq!(progress.state, ProgressState::Preparing);
}

#[test]
fn outside_the_window_nothing_prepares_unless_prestage_reaches_the_opening() {
    let nodes = [idle("a", "1.12.0"), idle("b", "1.12.0")];
    // Default: no download before the window.
    let d = decide(&policy(1), &window(false), &nodes, t("01:00"));
    assert_eq!(kinds(&d), []);
    assert_eq!(d.state, RolloutState::Pending);

    let mut p = policy(1);
    p.prestage = Duration::from_secs(30 * 60);
    // More than `prestage` before the opening: woken when it begins.
    let d = decide(&p, &window(false), &nodes, t("01:00"));
    assert_eq!(kinds(&d), []);
    assert_eq!(d.wake_at, Some(t("01:30")));
    // Within it: prepares only, bounded by the budget; no cordon.
    let d = decide(&p, &window(false), &nodes, t("01:40"));
    assert_eq!(kinds(&d), [("prepare", "a".into())]);
    assert_eq!(d.state, RolloutState::Pending, "no node leaves service");
    // Staged before the window: not cordoned until it opens...
    let staged = [
        preparing("a", "01:40", UpgradeStatus::Succeeded),
        idle("b", "1.12.0"),
    ];
    let d = decide(&p, &window(false), &staged, t("01:50"));
    assert_eq!(kinds(&d), []);
    // ... and cordoned at once when it does, the next downloading meanwhile.
    let d = decide(&p, &window(true), &staged, t("02:00"));
    assert_eq!(kinds(&d), [("cordon", "a".into()), ("prepare", "b".into())]);
}

#[test]
fn prestage_never_downloads_under_a_pause_a_freeze_or_a_refusal() {
    let nodes = [idle("a", "1.12.0")];
    let mut p = policy(1);
    p.prestage = Duration::from_secs(3600);
    let mut paused = window(false);
    paused.window.held = Some("paused".into());
    assert_eq!(kinds(&decide(&p, &paused, &nodes, t("01:30"))), []);
    let mut refused = window(false);
    refused.may_start = false;
    assert_eq!(kinds(&decide(&p, &refused, &nodes, t("01:30"))), []);
    // Control: the same instant with only the calendar closed.
    assert_eq!(
        kinds(&decide(&p, &window(false), &nodes, t("01:30"))),
        [("prepare", "a".into())]
    );
}

#[test]
fn a_prepare_run_outlasting_node_timeout_is_stopped_and_the_node_failed_in_service() {
    let mut n = preparing("a", "03:00", UpgradeStatus::Running);
    let d = decide(
        &policy(1),
        &window(true),
        std::slice::from_ref(&n),
        t("03:45"),
    );
    assert_eq!(kinds(&d), [("fail", "a".into())]);
    let Action::Fail {
        uncordon,
        stop_run,
        progress,
        ..
    } = &d.actions[0]
    else {
        unreachable!()
    };
    assert!(!uncordon, "never cordoned");
    assert!(*stop_run, "its run is deleted after the record says so");
    assert!(!progress.cordoned_by_drover);
    // While it runs, and once it succeeded (staged), nothing is written
    // but the cordon.
    let d = decide(
        &policy(1),
        &window(true),
        std::slice::from_ref(&n),
        t("03:10"),
    );
    assert_eq!(kinds(&d), []);
    n.upgrade = UpgradeStatus::Succeeded;
    let d = decide(&policy(1), &window(true), &[n], t("03:10"));
    assert_eq!(kinds(&d), [("cordon", "a".into())]);
}

#[test]
fn a_new_pin_stops_the_download_of_the_old_one_and_the_node_prepares_later() {
    let n = preparing("a", "03:00", UpgradeStatus::Running);
    let mut p = policy(1);
    p.target = v("1.13.3");
    let d = decide(&p, &window(true), std::slice::from_ref(&n), t("03:10"));
    assert_eq!(kinds(&d), [("clear", "a".into())]);
    let Action::Clear { stop_run, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert!(*stop_run);
    // A finished download needs no stop.
    let n = preparing("a", "03:00", UpgradeStatus::Succeeded);
    let d = decide(&p, &window(true), &[n], t("03:10"));
    let Action::Clear { stop_run, .. } = &d.actions[0] else {
        unreachable!()
    };
    assert!(!*stop_run);
}
