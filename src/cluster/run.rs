//! A node's driver runs as drover's record: the Job (or the simulation's
//! run) of a `prepare` or an upgrade is itself the record of `preparing` or
//! `upgrading`, as the system-upgrade-controller's Job is its plan's state,
//! so neither state costs a node patch of its own (issue 25).
//!
//! [`effective`] reads a node's record and its runs together:
//! - no record, and a prepare run: the node is `preparing`, with the
//!   record its run carries ([`RunSeen`]: target, started-at, attempts,
//!   previous version);
//! - `blocked`, and a prepare run started at or after it was given back:
//!   its retry is `preparing` (the run's attempts count the retry);
//! - `draining`, and the upgrade run of that very drain (its target and
//!   started-at): `upgrading`;
//! - any other record is what it says; the run of its attempt gives the
//!   driver's status ([`UpgradeStatus`]), as before. Records written by
//!   older agents (`preparing`, `upgrading`) read as they always did.
//!
//! A run is seen while its Job exists: give-backs delete Jobs (docs/design.md
//! §4), so whoever deletes a *running* run whose state lives only on it
//! writes that state on the node first ([`crate::rollout::Action::Record`]):
//! a crash between the delete and the give-back's own write then resumes
//! from the written state, never from an older record.

use super::{NodeProgress, ProgressError, ProgressState, UpgradeStatus};
use chrono::{DateTime, Utc};
use semver::Version;
use serde::Serialize;

/// One driver run drover started on a node, as long as it exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunSeen {
    /// [`NodeProgress::run_action`] of the record it was started for
    /// (`prepare`, `upgrade`, `rollback`).
    pub action: String,
    /// [`NodeProgress::run_version`] of that record.
    pub version: Version,
    /// `started_at` of that record: with `action` and `version` it names
    /// the attempt.
    pub started_at: DateTime<Utc>,
    /// `attempts` of that record (a blocked node's retries).
    pub attempts: u32,
    /// `previous` of that record.
    pub previous: Option<Version>,
    /// How the run is doing.
    pub status: UpgradeStatus,
}

impl RunSeen {
    /// The run started for `p`, with `status`.
    pub fn of(p: &NodeProgress, status: UpgradeStatus) -> RunSeen {
        RunSeen {
            action: p.run_action().to_string(),
            version: p.run_version().clone(),
            started_at: p.started_at,
            attempts: p.attempts,
            previous: p.previous.clone(),
            status,
        }
    }

    /// Whether this is the run of `p`'s attempt.
    pub fn is_run_of(&self, p: &NodeProgress) -> bool {
        self.action == p.run_action()
            && self.version == *p.run_version()
            && self.started_at == p.started_at
    }

    fn prepare(&self) -> bool {
        self.action == "prepare"
    }

    /// The `preparing` record this prepare run stands for.
    fn preparing(&self) -> NodeProgress {
        NodeProgress {
            state: ProgressState::Preparing,
            target: self.version.clone(),
            started_at: self.started_at,
            cordoned_by_drover: false,
            message: String::new(),
            attempts: self.attempts,
            previous: self.previous.clone(),
        }
    }
}

/// A node's progress as drover acts on it, from its record and its runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    /// The record, or the state a run stands for.
    pub progress: Result<Option<NodeProgress>, ProgressError>,
    /// The status of the run of that progress's attempt.
    pub upgrade: UpgradeStatus,
    /// The progress is a run's (`preparing`, `upgrading`), not yet written
    /// on the node.
    pub from_run: bool,
}

/// Read `record` and `runs` together (see the module docs).
pub fn effective(
    record: Result<Option<NodeProgress>, ProgressError>,
    runs: &[RunSeen],
) -> Effective {
    let status_of = |p: &NodeProgress| {
        runs.iter()
            .find(|r| r.is_run_of(p))
            .map_or(UpgradeStatus::NotStarted, |r| r.status.clone())
    };
    let newest_prepare = |after: Option<DateTime<Utc>>| {
        runs.iter()
            .filter(|r| r.prepare() && after.is_none_or(|t| r.started_at >= t))
            .max_by_key(|r| r.started_at)
    };
    let from_run = |p: NodeProgress, r: &RunSeen| Effective {
        progress: Ok(Some(p)),
        upgrade: r.status.clone(),
        from_run: true,
    };
    match record {
        Ok(None) => match newest_prepare(None) {
            Some(r) => from_run(r.preparing(), r),
            None => Effective {
                progress: Ok(None),
                upgrade: UpgradeStatus::NotStarted,
                from_run: false,
            },
        },
        Ok(Some(p)) if p.state == ProgressState::Blocked => {
            match newest_prepare(Some(p.started_at)) {
                Some(r) => from_run(r.preparing(), r),
                None => recorded(p, UpgradeStatus::NotStarted),
            }
        }
        Ok(Some(p)) if p.state == ProgressState::Draining => {
            let upgrading = NodeProgress {
                state: ProgressState::Upgrading,
                ..p.clone()
            };
            match runs.iter().find(|r| r.is_run_of(&upgrading)) {
                Some(r) => from_run(upgrading, r),
                None => recorded(p, UpgradeStatus::NotStarted),
            }
        }
        Ok(Some(p)) if p.state.runs_driver() => {
            let status = status_of(&p);
            recorded(p, status)
        }
        Ok(Some(p)) => recorded(p, UpgradeStatus::NotStarted),
        Err(e) => Effective {
            progress: Err(e),
            upgrade: UpgradeStatus::NotStarted,
            from_run: false,
        },
    }
}

fn recorded(p: NodeProgress, upgrade: UpgradeStatus) -> Effective {
    Effective {
        progress: Ok(Some(p)),
        upgrade,
        from_run: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        format!("2026-12-08T02:{s}Z").parse().unwrap()
    }

    fn record(state: ProgressState, at: &str) -> NodeProgress {
        NodeProgress {
            state,
            target: Version::new(1, 13, 0),
            started_at: t(at),
            cordoned_by_drover: state.in_flight(),
            message: String::new(),
            attempts: 0,
            previous: Some(Version::new(1, 12, 0)),
        }
    }

    fn prepare_run(at: &str, status: UpgradeStatus) -> RunSeen {
        let mut p = record(ProgressState::Preparing, at);
        p.attempts = 2;
        RunSeen::of(&p, status)
    }

    fn upgrade_run(at: &str, status: UpgradeStatus) -> RunSeen {
        RunSeen::of(&record(ProgressState::Upgrading, at), status)
    }

    fn state(e: &Effective) -> Option<ProgressState> {
        e.progress.as_ref().unwrap().as_ref().map(|p| p.state)
    }

    #[test]
    fn no_record_and_no_run_is_idle() {
        let e = effective(Ok(None), &[]);
        assert_eq!(state(&e), None);
        assert!(!e.from_run);
        // An upgrade run without a record is no one's state to resume:
        // drover writes the drain's record before any upgrade run.
        let e = effective(Ok(None), &[upgrade_run("00:00", UpgradeStatus::Running)]);
        assert_eq!(state(&e), None);
    }

    #[test]
    fn no_record_and_a_prepare_run_is_preparing_with_the_runs_record() {
        let runs = [
            prepare_run("00:00", UpgradeStatus::Failed("old".into())),
            prepare_run("05:00", UpgradeStatus::Running),
        ];
        let e = effective(Ok(None), &runs);
        assert!(e.from_run);
        assert_eq!(e.upgrade, UpgradeStatus::Running, "the newest run's");
        let p = e.progress.unwrap().unwrap();
        assert_eq!(p.state, ProgressState::Preparing);
        assert_eq!(p.started_at, t("05:00"));
        assert_eq!(p.target, Version::new(1, 13, 0));
        assert_eq!(p.attempts, 2);
        assert_eq!(p.previous, Some(Version::new(1, 12, 0)));
        assert!(!p.cordoned_by_drover, "a preparing node serves");
    }

    #[test]
    fn a_blocked_node_is_preparing_only_with_a_prepare_run_of_its_retry() {
        let blocked = record(ProgressState::Blocked, "10:00");
        // The prepare of the drain that was blocked is older: still blocked.
        let old = [prepare_run("00:00", UpgradeStatus::Succeeded)];
        let e = effective(Ok(Some(blocked.clone())), &old);
        assert_eq!(state(&e), Some(ProgressState::Blocked));
        assert!(!e.from_run);
        let retry = [
            prepare_run("00:00", UpgradeStatus::Succeeded),
            prepare_run("12:00", UpgradeStatus::Running),
        ];
        let e = effective(Ok(Some(blocked)), &retry);
        assert_eq!(state(&e), Some(ProgressState::Preparing));
        assert_eq!(e.upgrade, UpgradeStatus::Running);
        assert!(e.from_run);
    }

    #[test]
    fn draining_with_its_upgrade_run_is_upgrading_and_keeps_the_cordon_record() {
        let draining = record(ProgressState::Draining, "10:00");
        let e = effective(Ok(Some(draining.clone())), &[]);
        assert_eq!(state(&e), Some(ProgressState::Draining));
        assert_eq!(e.upgrade, UpgradeStatus::NotStarted);
        assert!(!e.from_run);
        // Another drain's run (an earlier attempt) is not this drain's.
        let other = [upgrade_run("00:00", UpgradeStatus::Running)];
        let e = effective(Ok(Some(draining.clone())), &other);
        assert_eq!(state(&e), Some(ProgressState::Draining));
        // Nor is its prepare run, started at the same instant.
        let prepare = [RunSeen {
            action: "prepare".into(),
            ..upgrade_run("10:00", UpgradeStatus::Running)
        }];
        let e = effective(Ok(Some(draining.clone())), &prepare);
        assert_eq!(state(&e), Some(ProgressState::Draining));
        for status in [
            UpgradeStatus::Running,
            UpgradeStatus::Succeeded,
            UpgradeStatus::Failed("x".into()),
        ] {
            let runs = [upgrade_run("10:00", status.clone())];
            let e = effective(Ok(Some(draining.clone())), &runs);
            assert!(e.from_run);
            assert_eq!(e.upgrade, status);
            let p = e.progress.unwrap().unwrap();
            assert_eq!(p.state, ProgressState::Upgrading);
            assert!(p.cordoned_by_drover, "the drain's cordon record holds");
            assert_eq!(p.previous, Some(Version::new(1, 12, 0)));
            assert_eq!(p.started_at, t("10:00"));
        }
    }

    #[test]
    fn written_records_read_as_they_say_with_their_runs_status() {
        for (state_, run) in [
            (
                ProgressState::Upgrading,
                upgrade_run("10:00", UpgradeStatus::Running),
            ),
            (
                ProgressState::Preparing,
                prepare_run("10:00", UpgradeStatus::Succeeded),
            ),
        ] {
            let p = record(state_, "10:00");
            let e = effective(Ok(Some(p.clone())), std::slice::from_ref(&run));
            assert_eq!(e.progress, Ok(Some(p.clone())));
            assert_eq!(e.upgrade, run.status);
            assert!(!e.from_run);
            // Its run gone: not started (the decision starts it again).
            let e = effective(Ok(Some(p)), &[]);
            assert_eq!(e.upgrade, UpgradeStatus::NotStarted);
        }
        // A given-back record is what it says, whatever runs are left.
        let failed = record(ProgressState::Failed, "10:00");
        let runs = [
            prepare_run("11:00", UpgradeStatus::Running),
            upgrade_run("10:00", UpgradeStatus::Failed("x".into())),
        ];
        let e = effective(Ok(Some(failed.clone())), &runs);
        assert_eq!(e.progress, Ok(Some(failed)));
        assert_eq!(e.upgrade, UpgradeStatus::NotStarted);
        let e = effective(Err(ProgressError::Missing("x")), &runs);
        assert!(e.progress.is_err());
    }
}
