//! Workload consent's limit, step by step (`consent.rs`): drover records
//! when it first saw the hold, from its own clock and record; past
//! `consent_limit` the node is reported (once in the record, in every
//! decision while it lasts), never started; the record is cleared once the
//! label goes.

use super::decide::decide;
use super::decide_tests::{idle, kinds, open, policy, t};
use super::decision::Action;
use super::{Blocker, RolloutState};
use crate::cluster::{ConsentHold, NodeProgress, NodeView, ProgressState};
use crate::config::OnDrainTimeout;
use std::time::Duration;

fn held(name: &str) -> NodeView {
    let mut n = idle(name, "1.12.0");
    n.consent_paused = true;
    n
}

fn hold(since: &str, overdue: bool) -> Option<ConsentHold> {
    Some(ConsentHold {
        since: t(since),
        overdue,
    })
}

fn limited(hours: u64) -> super::Policy {
    super::Policy {
        consent_limit: Some(Duration::from_secs(hours * 3600)),
        ..policy(1, OnDrainTimeout::Skip)
    }
}

fn consent_actions(d: &super::Decision) -> Vec<(String, Option<ConsentHold>)> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Consent { node, hold } => Some((node.clone(), *hold)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_hold_is_recorded_once_reported_past_the_limit_and_never_forced() {
    let p = limited(2);
    let mut a = held("a");
    // First seen at 03:00: recorded with drover's own time, woken at the limit.
    let d = decide(&p, &open(), std::slice::from_ref(&a), t("03:00"));
    assert_eq!(
        consent_actions(&d),
        [("a".to_string(), hold("03:00", false))]
    );
    assert_eq!(d.wake_at, Some(t("05:00")));
    assert!(d.consent_overdue.is_empty());
    a.consent_hold = hold("03:00", false);
    // Before the limit: nothing to write, nothing reported.
    let d = decide(&p, &open(), std::slice::from_ref(&a), t("04:59:59"));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.state, RolloutState::Pending);
    assert_eq!(d.message, "waiting for consent on 1 node: a");
    // At the limit: reported once in the record (its Warning Event), the
    // blocker stays consent, the node is not started.
    let d = decide(&p, &open(), std::slice::from_ref(&a), t("05:00"));
    assert_eq!(
        consent_actions(&d),
        [("a".to_string(), hold("03:00", true))]
    );
    assert_eq!(kinds(&d), [("consent", "a".to_string())]);
    assert_eq!(
        (d.state, d.blocker),
        (RolloutState::Pending, Some(Blocker::Consent))
    );
    assert_eq!(
        d.message,
        "waiting for consent on 1 node: a; overdue, held past consent_limit (2h): a"
    );
    assert_eq!(d.consent_overdue.len(), 1);
    assert_eq!(
        (
            d.consent_overdue[0].node.as_str(),
            d.consent_overdue[0].since
        ),
        ("a", t("03:00"))
    );
    assert!(
        d.skipped[0].reason.contains("reported, not forced"),
        "{:?}",
        d.skipped
    );
    a.consent_hold = hold("03:00", true);
    // Reported already: still overdue in every decision, written no more,
    // and days later still not started.
    for at in ["06:00", "23:59"] {
        let d = decide(&p, &open(), std::slice::from_ref(&a), t(at));
        assert!(d.actions.is_empty(), "{at}: {:?}", d.actions);
        assert_eq!(d.consent_overdue.len(), 1, "{at}");
    }
    // Without a limit, a hold is never reported.
    let d = decide(&policy(1, OnDrainTimeout::Skip), &open(), &[a], t("23:59"));
    assert!(
        d.consent_overdue.is_empty() && d.actions.is_empty(),
        "{d:?}"
    );
}

#[test]
fn the_hold_is_cleared_once_the_label_goes_and_a_start_clears_it_in_its_own_write() {
    let p = limited(2);
    let mut a = idle("a", "1.12.0");
    a.consent_hold = hold("03:00", true);
    // The label gone, the window closed: the record is cleared, nothing starts.
    let closed = super::Inputs {
        window: super::WindowState::default(),
        ..open()
    };
    let d = decide(&p, &closed, std::slice::from_ref(&a), t("09:00"));
    assert_eq!(consent_actions(&d), [("a".to_string(), None)]);
    assert!(d.consent_overdue.is_empty());
    // In the window the node starts: its cordon's record write clears the
    // hold (NodeRecord::start), no separate write.
    let d = decide(&p, &open(), std::slice::from_ref(&a), t("03:00"));
    assert_eq!(kinds(&d), [("cordon", "a".to_string())]);
    // A node at the target keeps no hold, labelled or not.
    let mut done = held("b");
    done.version = Some(p.target.clone());
    done.consent_hold = hold("03:00", false);
    let d = decide(&p, &open(), &[done], t("03:00"));
    assert_eq!(consent_actions(&d), [("b".to_string(), None)]);
    // A hold past the limit set again after a release starts again.
    let rec = crate::record::NodeRecord::new("a", "i").with_consent(hold("03:00", true));
    let started = rec.start(NodeProgress {
        state: ProgressState::Draining,
        target: p.target.clone(),
        started_at: t("03:00"),
        cordoned_by_drover: true,
        message: String::new(),
        retries: 0,
        previous: None,
    });
    assert_eq!(started.consent, None);
}

#[test]
fn a_blocked_node_due_for_its_retry_is_held_by_consent_too() {
    let p = limited(2);
    let mut b = held("b");
    b.progress = Ok(Some(NodeProgress {
        state: ProgressState::Blocked,
        target: p.target.clone(),
        started_at: t("02:00"),
        cordoned_by_drover: false,
        message: "drain timed out".into(),
        retries: 0,
        previous: None,
    }));
    // Its backoff (5 minutes) is over: without the label it would retry.
    let d = decide(&p, &open(), std::slice::from_ref(&b), t("03:00"));
    assert_eq!(
        consent_actions(&d),
        [("b".to_string(), hold("03:00", false))]
    );
    assert!(
        !d.actions.iter().any(|a| matches!(a, Action::Cordon { .. })),
        "{:?}",
        d.actions
    );
    assert_eq!(d.skipped[0].blocker, Blocker::Consent);
    b.consent_paused = false;
    let d = decide(&p, &open(), &[b], t("03:00"));
    assert_eq!(kinds(&d), [("cordon", "b".to_string())]);
}
