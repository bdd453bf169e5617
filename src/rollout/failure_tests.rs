//! A failed run holds every new start (docs/design.md §5a), however the
//! rest of its node's view came back.

use super::decide::decide;
use super::decide_tests::{idle, kinds, open, policy, t};
use super::held_tests::with;
use super::rollback_tests as rb;
use super::RolloutState;
use crate::cluster::{NodeView, ProgressState, UpgradeStatus};
use crate::config::{OnDrainTimeout, OnFailure};

/// The fault both tests' node is observed with.
const UNLISTED: &str = "its pods cannot be listed: 500";

/// `a` upgrading to 1.13.2 since 03:00, its run as `upgrade`, its pods
/// not listed.
fn unlisted(upgrade: UpgradeStatus) -> NodeView {
    let mut a = with(idle("a", "1.12.0"), ProgressState::Upgrading, "03:00", "");
    a.upgrade = upgrade;
    a.fault = Some(UNLISTED.into());
    a
}

/// Simulation seed 11347: a node's driver failed while its pods could not
/// be listed, and another node's blocked drain was retried meanwhile. The
/// run's failure is read from the run, not from the pod list that failed:
/// the node is recorded failed and no other node starts.
#[test]
fn a_failed_run_on_a_node_whose_pods_cannot_be_listed_holds_new_starts() {
    let p = policy(2, OnDrainTimeout::Skip);
    let failed = unlisted(UpgradeStatus::Failed("simulated upgrade failure".into()));
    let d = decide(&p, &open(), &[failed, idle("b", "1.12.0")], t("03:05"));
    assert_eq!(kinds(&d), [("fail", "a".into())], "{:?}", d.actions);
    assert_eq!(d.state, RolloutState::Failed);
    assert!(
        d.message
            .contains("upgrade driver failed: simulated upgrade failure"),
        "{}",
        d.message
    );
    // Control: while its run still runs, the fault holds only its node and
    // `b` starts.
    let running = unlisted(UpgradeStatus::Running);
    let d = decide(&p, &open(), &[running, idle("b", "1.12.0")], t("03:05"));
    assert_eq!(
        kinds(&d),
        [("note", "a".into()), ("cordon", "b".into())],
        "{:?}",
        d.actions
    );
}

/// The rollback counterpart of seed 11347, examined after it: a
/// rolling-back node's run is read before its fault, so a failed rollback
/// under a pod-list fault is recorded failed and nothing else starts.
#[test]
fn a_failed_rollback_on_a_node_whose_pods_cannot_be_listed_is_recorded_and_holds() {
    let p = rb::policy(OnFailure::Rollback, 2, 2);
    let now = rb::t0() + chrono::Duration::minutes(5);
    let mut a = rb::rolling_back();
    a.upgrade = UpgradeStatus::Failed("exit 1".into());
    a.fault = Some(UNLISTED.into());
    let b = idle("b", "1.13.2");
    let d = decide(&p, &rb::open(), &[a.clone(), b.clone()], now);
    assert_eq!(
        kinds(&d),
        [("rollback_failed", "a".into())],
        "{:?}",
        d.actions
    );
    assert_eq!(d.state, RolloutState::Failed);
    assert!(
        d.message
            .contains("rollback failed: its driver failed: exit 1"),
        "{}",
        d.message
    );
    // Control: while the rollback still runs, `a` is only waited on, and a
    // rollback in progress still holds new starts.
    a.upgrade = UpgradeStatus::Running;
    let d = decide(&p, &rb::open(), &[a, b], now);
    assert!(
        kinds(&d)
            .iter()
            .all(|(k, _)| !matches!(*k, "rollback_failed" | "cordon")),
        "{:?}",
        d.actions
    );
    assert_eq!(d.state, RolloutState::Failed);
}
