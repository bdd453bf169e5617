//! One simulated node (its version, readiness, cordon, pods and the
//! faults injected into it) and the driver runs started on it, each with
//! its fate fixed when it starts: a node's failure, or one of the first
//! runs of an action the test says fail.

use super::{CordonedBy, Failure, HealthFault, Pod};
use crate::cluster::{RunAction, UpgradeStatus};
use crate::record::legacy::LegacyRun;
use chrono::{DateTime, Utc};
use semver::Version;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone)]
pub(super) struct Run {
    /// Its Job's name (the record's link).
    pub(super) name: String,
    pub(super) uid: String,
    /// The record id and attempt it carries.
    pub(super) record_id: String,
    pub(super) attempt: u32,
    pub(super) action: RunAction,
    pub(super) target: Version,
    pub(super) done_at: Option<DateTime<Utc>>,
    pub(super) status: UpgradeStatus,
    /// Deleted by drover: no longer seen once stopped.
    pub(super) deleted: bool,
    /// A run deleted while running stops (its pod terminates) then.
    pub(super) stopping_until: Option<DateTime<Utc>>,
    /// How it goes wrong, fixed when it starts.
    pub(super) failure: Option<Failure>,
    /// When the driver failed it (not a stop drover asked for).
    pub(super) failed_at: Option<DateTime<Utc>>,
}

impl Run {
    /// Whether it may still act on its node.
    pub(super) fn may_act(&self, now: DateTime<Utc>) -> bool {
        self.action.moves_node()
            && (self.status == UpgradeStatus::Running
                || self.stopping_until.is_some_and(|t| t > now))
    }
}

/// One simulated node.
#[derive(Debug, Clone)]
pub struct SimNode {
    /// Node name.
    pub name: String,
    /// OS version; `None` when unreadable.
    pub version: Option<Version>,
    /// Ready condition.
    pub ready: bool,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Who cordoned it.
    pub cordoned_by: Option<CordonedBy>,
    /// It carries drover's pre-drain taint.
    pub drain_tainted: bool,
    /// The Node's annotations: anyone with `patch nodes`, and its kubelet,
    /// can write them; drover acts on none.
    pub annotations: BTreeMap<String, String>,
    /// How long the driver takes, reboot included.
    pub node_time: Duration,
    /// Injected failure of its upgrade (and of every later upgrade or
    /// rollback run on it).
    pub failure: Option<Failure>,
    /// The driver fails the first `n` runs of an action on it: a fault that
    /// passes when `n` is smaller than the runs asked, and a prepare that
    /// fails at all. A prepare fails at once; an upgrade or a rollback
    /// after the node time, without rebooting the node.
    pub failing_runs: Vec<(RunAction, u32)>,
    /// Pods on it.
    pub pods: Vec<Pod>,
    /// NotReady because a drover driver rebooted it.
    pub down_by_drover: bool,
    /// A health fault that shows while it runs this version after an upgrade.
    pub health_fault: Option<(Version, HealthFault)>,
    /// Driver Jobs an earlier release made for it (for the migration).
    pub legacy_runs: Vec<LegacyRun>,
    /// Its workload asks drover to wait (`drover.dev/upgrade=paused`).
    pub consent_paused: bool,
    pub(super) runs: Vec<Run>,
}

impl SimNode {
    /// A Ready, schedulable node at `version` taking `node_time` to upgrade.
    pub fn new(name: impl Into<String>, version: Option<Version>, node_time: Duration) -> Self {
        SimNode {
            name: name.into(),
            version,
            ready: true,
            unschedulable: false,
            cordoned_by: None,
            drain_tainted: false,
            annotations: BTreeMap::new(),
            node_time,
            failure: None,
            failing_runs: Vec::new(),
            pods: Vec::new(),
            down_by_drover: false,
            health_fault: None,
            legacy_runs: Vec::new(),
            consent_paused: false,
            runs: Vec::new(),
        }
    }

    /// Labelled by its workload `drover.dev/upgrade=paused`.
    pub fn consent_paused(mut self) -> Self {
        self.consent_paused = true;
        self
    }

    /// Cordoned by someone else.
    pub fn cordoned_by_other(mut self) -> Self {
        self.unschedulable = true;
        self.cordoned_by = Some(CordonedBy::Other);
        self
    }

    /// With an injected failure.
    pub fn failing(mut self, f: Failure) -> Self {
        self.failure = Some(f);
        self
    }

    /// With `fault` showing once an upgrade brought it to `version`.
    pub fn with_health_fault(mut self, version: Version, fault: HealthFault) -> Self {
        self.health_fault = Some((version, fault));
        self
    }

    /// With the driver failing its first `n` runs of `action`.
    pub fn failing_first(mut self, action: RunAction, n: u32) -> Self {
        self.failing_runs.push((action, n));
        self
    }

    /// How the driver's next run of `action` goes wrong, if it does.
    pub(super) fn next_failure(&self, action: RunAction) -> Option<Failure> {
        let nth = self.runs.iter().filter(|r| r.action == action).count();
        let fails = self
            .failing_runs
            .iter()
            .any(|(a, n)| *a == action && u32::try_from(nth).is_ok_and(|i| i < *n));
        if fails {
            return Some(Failure::DriverFails(format!(
                "simulated {} failure",
                action.as_str()
            )));
        }
        // A node's failure is of the runs that move it; a prepare moves nothing.
        if action == RunAction::Prepare {
            None
        } else {
            self.failure.clone()
        }
    }

    /// The runs the driver failed (not those drover stopped), each as
    /// `(action, its version, when it failed)`.
    pub fn failed_runs(&self) -> Vec<(RunAction, Version, DateTime<Utc>)> {
        self.runs
            .iter()
            .filter_map(|r| r.failed_at.map(|t| (r.action, r.target.clone(), t)))
            .collect()
    }

    /// With pods.
    pub fn with_pods(mut self, pods: Vec<Pod>) -> Self {
        self.pods = pods;
        self
    }

    /// Driver runs started on this node that move it (upgrades and
    /// rollbacks; a download before the drain, `prepare`, moves nothing).
    pub fn driver_runs(&self) -> usize {
        self.runs.iter().filter(|r| r.action.moves_node()).count()
    }

    /// Driver runs started on this node, each as `(action, attempt, version)`.
    pub fn runs(&self) -> Vec<(RunAction, u32, Version)> {
        self.runs
            .iter()
            .map(|r| (r.action, r.attempt, r.target.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Sim, SimNode};
    use crate::cluster::{Cluster, RunAction, RunStart};
    use crate::record::RunLink;
    use crate::rollout::VirtualClock;
    use chrono::{DateTime, Utc};
    use semver::Version;
    use std::time::Duration;

    /// The driver failing a node's first runs of an action: a prepare at
    /// once, an upgrade after the node time without a reboot; the run after
    /// them does its work, and only the runs the driver failed are named.
    #[test]
    fn the_first_runs_of_an_action_fail_and_the_next_one_works() {
        let t0: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        let clock = VirtualClock::new(t0);
        let sim = Sim::new("c", clock.clone());
        let (from, to) = (Version::new(1, 0, 0), Version::new(1, 1, 0));
        sim.add_node(
            SimNode::new("n", Some(from.clone()), Duration::from_secs(60))
                .failing_first(RunAction::Prepare, 1)
                .failing_first(RunAction::Upgrade, 2),
        );
        let at = |m: i64| t0 + chrono::Duration::minutes(m);
        let start = |attempt: u32, action: RunAction| {
            let run = RunLink {
                name: format!("run-{attempt}"),
                uid: None,
                action,
                version: to.clone(),
                attempt,
                stopped: false,
            };
            let start = RunStart {
                record_id: "id".into(),
                run,
                failed_version: None,
            };
            futures::executor::block_on(sim.start_run("n", &start)).unwrap();
        };
        let node = |t: DateTime<Utc>| {
            clock.set(t);
            futures::executor::block_on(sim.observe()).unwrap();
            sim.nodes().remove(0)
        };
        start(1, RunAction::Prepare);
        start(2, RunAction::Prepare);
        assert_eq!(
            node(t0).failed_runs(),
            [(RunAction::Prepare, to.clone(), t0)]
        );
        for (attempt, m) in [(3, 0), (4, 2)] {
            clock.set(at(m));
            start(attempt, RunAction::Upgrade);
            let n = node(at(m));
            assert!(n.ready, "a failing upgrade does not reboot the node");
            assert_eq!(n.failed_runs().len(), attempt as usize - 2);
            let n = node(at(m + 1));
            assert_eq!(n.failed_runs().len(), attempt as usize - 1);
            assert_eq!(n.failed_runs().last().unwrap().2, at(m + 1));
            assert_eq!(n.version.as_ref(), Some(&from));
        }
        clock.set(at(4));
        start(5, RunAction::Upgrade);
        assert!(!node(at(4)).ready, "the third upgrade reboots it");
        let n = node(at(5));
        assert_eq!(n.version.as_ref(), Some(&to));
        assert!(n.ready);
        assert_eq!(n.failed_runs().len(), 3);
    }
}
