//! A node's record and the driver run it links to, read together
//! ([`effective`]). A run is found by the record's link alone (its name,
//! and its uid once recorded): never by matching versions, so a new pin
//! cannot orphan a run, and nothing but the run drover named can stand
//! for it.
//!
//! - A `draining` record whose upgrade run exists is `upgrading`, to the
//!   version that run installs (the record planned the run when it
//!   cordoned the node; the run is made without another record write).
//! - Any other record is what it says; the linked run of its attempt
//!   gives the driver's status ([`UpgradeStatus`]).
//! - A run drover stopped is `Stopping` until nothing of it is left, then
//!   `Stopped`: the node is not uncordoned before.
//! - A Job of the linked name that does not carry the record's id and
//!   attempt (or, once recorded, its uid) is not the record's run: the
//!   node is held, named, and nothing is started over it.

use super::{NodeProgress, NodeRecord, ProgressState, UpgradeStatus};
use semver::Version;
use serde::Serialize;

/// What a backend found of the run a record links to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "found")]
pub enum LinkedRun {
    /// The record names no run.
    None,
    /// No run of that name exists (not made yet, or gone).
    Missing,
    /// The record's run.
    Found {
        /// Its Job's uid.
        uid: String,
        /// The version it installs.
        version: Version,
        /// How it is doing.
        status: UpgradeStatus,
    },
    /// A run of that name that is not the record's (what it carries instead).
    Foreign(String),
    /// drover's record says it is stopped, and its Job is still there, not
    /// being deleted (the delete did not land): it may still act.
    StopPending,
    /// drover stopped it; something of it is left (its Job being deleted,
    /// a pod not finished).
    Stopping,
    /// drover stopped it; nothing of it is left.
    Stopped,
}

/// A node's progress as drover acts on it, from its record and its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    /// The record's progress, or `upgrading` for a drained node whose run exists.
    pub progress: Option<NodeProgress>,
    /// The status of that progress's run.
    pub upgrade: UpgradeStatus,
    /// The run the record names cannot be recognised.
    pub fault: Option<String>,
}

/// Read `record` and its `linked` run together (see the module docs).
pub fn effective(record: &NodeRecord, linked: &LinkedRun) -> Effective {
    let Some(p) = record.progress.clone() else {
        return Effective {
            progress: None,
            upgrade: UpgradeStatus::NotStarted,
            fault: None,
        };
    };
    let run = record.run.as_ref();
    // The link is this progress's run: its action, for a run of the state.
    let ours = run.is_some_and(|r| {
        r.action == p.run_action()
            || (p.state == ProgressState::Draining && r.action == crate::record::RunAction::Upgrade)
    });
    let upgrade = match linked {
        _ if !p.state.runs_driver() || !ours => UpgradeStatus::NotStarted,
        LinkedRun::None | LinkedRun::Missing | LinkedRun::Foreign(_) => UpgradeStatus::NotStarted,
        LinkedRun::Found { status, .. } => status.clone(),
        LinkedRun::StopPending => UpgradeStatus::StopPending,
        LinkedRun::Stopping => UpgradeStatus::Stopping,
        LinkedRun::Stopped => UpgradeStatus::Stopped,
    };
    // A given-back record keeps its stopped run's status: the uncordon waits on it.
    let upgrade = match (linked, p.state) {
        (LinkedRun::StopPending, _) => UpgradeStatus::StopPending,
        (LinkedRun::Stopping, _) => UpgradeStatus::Stopping,
        (LinkedRun::Stopped, _) if !p.state.runs_driver() => UpgradeStatus::Stopped,
        _ => upgrade,
    };
    let fault = match linked {
        LinkedRun::Foreign(what) => Some(format!(
            "the run its record names, {}, is not its run: {what}; nothing is started over it",
            run.map_or("", |r| r.name.as_str())
        )),
        _ => None,
    };
    let progress = match linked {
        LinkedRun::Found { version, .. } if p.state == ProgressState::Draining && ours => {
            // Drained and its run made: upgrading, to what the run installs.
            NodeProgress {
                state: ProgressState::Upgrading,
                target: version.clone(),
                ..p
            }
        }
        _ => p,
    };
    Effective {
        progress: Some(progress),
        upgrade,
        fault,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};

    fn t(s: &str) -> DateTime<Utc> {
        format!("2026-12-08T02:{s}Z").parse().unwrap()
    }

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    fn progress(state: ProgressState) -> NodeProgress {
        NodeProgress {
            state,
            target: v("1.13.0"),
            started_at: t("10:00"),
            cordoned_by_drover: state.in_flight(),
            message: String::new(),
            retries: 0,
            previous: Some(v("1.12.0")),
        }
    }

    fn found(version: &str, status: UpgradeStatus) -> LinkedRun {
        LinkedRun::Found {
            uid: "u".into(),
            version: v(version),
            status,
        }
    }

    #[test]
    fn an_idle_record_is_idle_whatever_runs_exist() {
        let r = NodeRecord::new("a", "i");
        let e = effective(&r, &found("1.13.0", UpgradeStatus::Running));
        assert_eq!((e.progress, e.upgrade), (None, UpgradeStatus::NotStarted));
    }

    #[test]
    fn draining_with_its_run_is_upgrading_to_what_the_run_installs() {
        let r = NodeRecord::new("a", "i").start(progress(ProgressState::Draining));
        let e = effective(&r, &LinkedRun::Missing);
        assert_eq!(e.progress.as_ref().unwrap().state, ProgressState::Draining);
        assert_eq!(e.upgrade, UpgradeStatus::NotStarted);
        for status in [
            UpgradeStatus::Running,
            UpgradeStatus::Succeeded,
            UpgradeStatus::Failed("x".into()),
        ] {
            // The run installs another version than the record's target
            // (retargeted after it was made): the run's version wins.
            let e = effective(&r, &found("1.13.1", status.clone()));
            let p = e.progress.unwrap();
            assert_eq!(
                (p.state, &p.target),
                (ProgressState::Upgrading, &v("1.13.1"))
            );
            assert!(p.cordoned_by_drover, "the drain's cordon record holds");
            assert_eq!(e.upgrade, status);
        }
    }

    #[test]
    fn a_foreign_run_is_no_run_and_holds_the_node() {
        let r = NodeRecord::new("a", "i").start(progress(ProgressState::Draining));
        let e = effective(&r, &LinkedRun::Foreign("record id x".into()));
        assert_eq!(e.progress.unwrap().state, ProgressState::Draining);
        assert_eq!(e.upgrade, UpgradeStatus::NotStarted);
        assert!(e.fault.unwrap().contains("not its run"));
    }

    #[test]
    fn a_stopped_run_holds_the_given_back_node_until_nothing_is_left() {
        let r = NodeRecord::new("a", "i")
            .start(progress(ProgressState::Draining))
            .stopping()
            .with_progress(Some(progress(ProgressState::Failed)));
        assert_eq!(
            effective(&r, &LinkedRun::Stopping).upgrade,
            UpgradeStatus::Stopping
        );
        assert_eq!(
            effective(&r, &LinkedRun::StopPending).upgrade,
            UpgradeStatus::StopPending
        );
        assert_eq!(
            effective(&r, &LinkedRun::Stopped).upgrade,
            UpgradeStatus::Stopped
        );
        // A given-back record's finished run says nothing more.
        assert_eq!(
            effective(&r, &found("1.13.0", UpgradeStatus::Succeeded)).upgrade,
            UpgradeStatus::NotStarted
        );
    }

    #[test]
    fn a_rollback_and_a_prepare_read_their_own_runs_status() {
        let back = NodeRecord::new("a", "i").start(progress(ProgressState::RollingBack));
        let e = effective(&back, &found("1.12.0", UpgradeStatus::Running));
        assert_eq!(e.progress.unwrap().state, ProgressState::RollingBack);
        assert_eq!(e.upgrade, UpgradeStatus::Running);
        let prep = NodeRecord::new("a", "i").start(progress(ProgressState::Preparing));
        let e = effective(&prep, &found("1.13.0", UpgradeStatus::Succeeded));
        assert_eq!(e.upgrade, UpgradeStatus::Succeeded);
    }
}
