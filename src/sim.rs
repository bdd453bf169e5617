//! An in-memory simulated cluster with a virtual clock, for `drover demo`,
//! `drover plan` and benchmarks.
//!
//! Nodes have versions and reboot times; pods belong to
//! PodDisruptionBudgets; failures can be injected (a node that never comes
//! back, one that comes back at the wrong version, a driver that fails, a
//! PDB that refuses every eviction until some instant). Time does not tick:
//! [`drive`] jumps from one interesting instant to the next (a reboot ends,
//! a PDB relents, a window opens or closes, a timeout), so months of
//! rollout take milliseconds. It keeps the same split as a real cluster:
//! Nodes, whose annotations anyone can write (so tests can forge them), and
//! drover's records of them, written only through [`Cluster::write_record`]
//! with the encoding the Kubernetes backend stores (`record::wire`), and
//! driver runs named by the records that start them.
//!
//! Faults of the cluster's API about one node can be injected for a while
//! ([`CallFault`], [`Sim::inject`]): its pods cannot be listed, its
//! evictions, writes, driver start or health reads fail, as one node's
//! trouble looks to drover on a real API server.
//!
//! Nodes and the driver runs on them are `node.rs`'s.
//!
//! The sim also watches the invariants from the outside: it logs every
//! cordon, uncordon, eviction and driver start with its time, counts every
//! call drover makes ([`Sim::calls`]), records the peak number of nodes
//! unavailable because of drover, and notes any violation (uncordoning a
//! node drover did not cordon, or one a driver run may still act on, an
//! eviction past a PDB, a second driver run for the same attempt, a driver
//! started on a node that still runs pods).

mod cluster;
mod drive;
mod node;

pub use drive::{drive, drive_in_waves, DriveReport, Timeline, WaveSchedule};
use node::Run;
pub use node::SimNode;

use crate::cluster::{NodeRecord, NodeView, ProgressState, UpgradeStatus};
use crate::record::wire::{DroverNodeSpec, DroverNodeStatus};
use crate::rollout::Clock;
use crate::rollout::VirtualClock;
use chrono::{DateTime, Utc};
use semver::Version;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// A way for a node's upgrade to go wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The node reboots and never returns Ready.
    NeverReturns,
    /// The node returns Ready at this version instead of the target.
    ReturnsAt(Version),
    /// The driver fails after the node time, without rebooting the node.
    DriverFails(String),
}

/// A workload fault that shows once a node returned from an upgrade to a
/// given version: what the health checks (docs/design.md §5a) must catch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthFault {
    /// A pod on the node crash-loops (`CrashLoopBackOff`, restarts growing).
    CrashLoop,
    /// The node condition of this type turns True.
    Condition(String),
}

/// A fault of the cluster's API about one node (see [`Sim::inject`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallFault {
    /// Its pods cannot be listed: while drover has it in flight (the only
    /// nodes whose pods an observation reads, as on a real API server) it is
    /// observed with a fault and no pod count.
    Observe,
    /// Every eviction on it fails (as one answering 403 does).
    Evict,
    /// Every write to it fails (cordon, uncordon, progress), changing nothing.
    Write,
    /// Its driver cannot be started.
    Start,
    /// Its health inputs cannot be read.
    Health,
}

/// A pod; evicted pods are rescheduled onto another schedulable Ready node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// Pod name.
    pub name: String,
    /// The PodDisruptionBudget covering it.
    pub pdb: Option<String>,
}

/// A PodDisruptionBudget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdb {
    /// Pods of the budget that must stay healthy (on a Ready node).
    pub min_available: usize,
    /// Every eviction is refused before this instant.
    pub blocked_until: Option<DateTime<Utc>>,
}

/// Who cordoned a node (ground truth, which drover cannot see).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CordonedBy {
    /// drover.
    Drover,
    /// Someone else.
    Other,
}

/// How long a deleted run's pod takes to stop (its driver cancels).
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// A stored record: its spec, status and annotations, as the API server
/// would keep them.
#[derive(Debug, Clone)]
struct SimRecord {
    spec: DroverNodeSpec,
    status: DroverNodeStatus,
    annotations: BTreeMap<String, String>,
    resource_version: u64,
    generation: i64,
}

/// Something that happened in the sim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// When.
    pub at: DateTime<Utc>,
    /// Which node.
    pub node: String,
    /// What.
    pub kind: EventKind,
}

/// Kinds of [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// drover cordoned the node (a start).
    Cordon,
    /// drover recorded progress on an already-cordoned node (a start).
    Adopt,
    /// drover uncordoned the node.
    Uncordon,
    /// A pod was evicted.
    Evicted(String),
    /// The driver started towards this version.
    DriverStart(Version),
    /// The driver started rolling the node back to this version
    /// (`on_failure = "rollback"`).
    RollbackStart(Version),
    /// The node came back Ready at this version (or unreadable).
    Returned(Option<Version>),
}

/// The sim's errors.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The node does not exist.
    #[error("no node named {0}")]
    NoSuchNode(String),
    /// An injected fault ([`Sim::inject`]).
    #[error("injected fault: {fault:?} on node {node}")]
    Injected {
        /// The node.
        node: String,
        /// The fault.
        fault: CallFault,
    },
    /// A record write met another version of the record (409).
    #[error("the record of node {0} changed since it was read")]
    Conflict(String),
    /// A run of that name exists and is not the one asked for (409, not ours).
    #[error("a run named {0} exists and is not this record's")]
    Foreign(String),
    /// The agent's process died before it sent this call ([`Sim::crash_after`]).
    #[error("the agent crashed before calling {0}")]
    Crashed(String),
}

#[derive(Debug, Default)]
struct State {
    nodes: BTreeMap<String, SimNode>,
    /// drover's records, by node: only [`Cluster::write_record`] writes them.
    records: BTreeMap<String, SimRecord>,
    /// The last resourceVersion handed out.
    revision: u64,
    pdbs: BTreeMap<String, Pdb>,
    pending: Vec<Pod>,
    log: Vec<Event>,
    violations: Vec<String>,
    peak_unavailable: usize,
    /// Calls drover made, by (call, node): what happened, not what drover counts.
    calls: BTreeMap<(String, String), usize>,
    /// Injected faults: node, fault, `[from, until)`.
    faults: Vec<(String, CallFault, DateTime<Utc>, DateTime<Utc>)>,
    /// Calls that still reach the cluster before the agent's process dies
    /// ([`Sim::crash_after`]); `None` while it lives.
    calls_before_crash: Option<usize>,
    /// When drover last listed the nodes ([`Cluster::observe`]).
    observed: Option<DateTime<Utc>>,
    /// Nodes NotReady by no act of drover's (a kubelet that stops
    /// posting, a reboot someone else made): node, `[from, until)`.
    outages: Vec<(String, DateTime<Utc>, DateTime<Utc>)>,
    /// The nodes such an outage holds NotReady now.
    out: std::collections::BTreeSet<String>,
}

/// A simulated cluster.
#[derive(Debug)]
pub struct Sim {
    name: String,
    clock: VirtualClock,
    state: Mutex<State>,
}

impl Sim {
    /// An empty cluster reading time from `clock`.
    pub fn new(name: impl Into<String>, clock: VirtualClock) -> Self {
        Sim {
            name: name.into(),
            clock,
            state: Mutex::new(State::default()),
        }
    }

    /// `n` identical nodes `node-0000`… at `version`.
    pub fn uniform(
        name: &str,
        clock: VirtualClock,
        n: usize,
        version: &Version,
        node_time: Duration,
    ) -> Self {
        let sim = Sim::new(name, clock);
        for i in 0..n {
            sim.add_node(SimNode::new(
                format!("node-{i:04}"),
                Some(version.clone()),
                node_time,
            ));
        }
        sim
    }

    /// A sim seeded from observed nodes (of a real cluster or another sim):
    /// versions, readiness, cordons and drover's records carry over; each
    /// node's pods become plain pods, and every node takes `node_time`.
    pub fn from_views(
        name: &str,
        clock: VirtualClock,
        views: &[NodeView],
        node_time: Duration,
    ) -> Self {
        let sim = Sim::new(name, clock);
        for v in views {
            let mut n = SimNode::new(v.name.clone(), v.version.clone(), node_time);
            n.ready = v.ready;
            n.unschedulable = v.unschedulable;
            let progress = v.progress.as_ref().ok().and_then(Option::as_ref);
            if v.unschedulable {
                n.cordoned_by = Some(match progress {
                    Some(p) if p.cordoned_by_drover => CordonedBy::Drover,
                    _ => CordonedBy::Other,
                });
            }
            if let Some(stored) = &v.record {
                sim.seed_record(&stored.record);
            }
            n.pods = (0..v.pods_to_evict)
                .map(|i| Pod {
                    name: format!("{}-pod-{i}", v.name),
                    pdb: None,
                })
                .collect();
            sim.add_node(n);
        }
        sim
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add a node.
    pub fn add_node(&self, node: SimNode) {
        self.lock().nodes.insert(node.name.clone(), node);
    }

    /// Give `node` a health fault that shows once an upgrade brings it to `version`.
    pub fn set_health_fault(&self, node: &str, version: Version, fault: HealthFault) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            n.health_fault = Some((version, fault));
        }
    }

    /// Let `calls` more calls that change the cluster through, then none:
    /// the agent's process died mid-step, so what landed is a prefix of what
    /// its own step sent, in the order it sent it (half an action included).
    /// `None` brings it back to life.
    pub fn crash_after(&self, calls: Option<usize>) {
        self.lock().calls_before_crash = calls;
    }

    /// Make `fault` hit `node` from `from` until `until` (exclusive).
    pub fn inject(&self, node: &str, fault: CallFault, from: DateTime<Utc>, until: DateTime<Utc>) {
        self.lock()
            .faults
            .push((node.to_string(), fault, from, until));
    }

    /// `node` goes NotReady from `from` until `until` (exclusive) by no
    /// act of drover's; it comes back Ready then unless a run of drover's
    /// holds it down.
    pub fn not_ready(&self, node: &str, from: DateTime<Utc>, until: DateTime<Utc>) {
        self.lock().outages.push((node.to_string(), from, until));
    }

    /// Add a PodDisruptionBudget.
    pub fn add_pdb(&self, name: impl Into<String>, pdb: Pdb) {
        self.lock().pdbs.insert(name.into(), pdb);
    }

    /// Set an annotation on the Node, as its kubelet or anyone with
    /// `patch nodes` can (drover acts on none of them).
    pub fn annotate(&self, node: &str, key: &str, value: &str) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            n.annotations.insert(key.into(), value.into());
        }
    }

    /// Set an annotation on `node`'s record, as a person may
    /// (`record::PERSON_ANNOTATIONS`); a no-op without a record.
    pub fn annotate_record(&self, node: &str, key: &str, value: &str) {
        let mut s = self.lock();
        s.revision += 1;
        let rv = s.revision;
        if let Some(r) = s.records.get_mut(node) {
            r.annotations.insert(key.into(), value.into());
            r.resource_version = rv;
        }
    }

    /// The workload labels `node` `drover.dev/upgrade=paused`, or removes it.
    pub fn set_consent_paused(&self, node: &str, paused: bool) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            n.consent_paused = paused;
        }
    }

    /// A person asks drover to retry `node` (`drover.dev/retry` on its record).
    pub fn request_retry(&self, node: &str) {
        self.annotate_record(node, crate::record::ANN_RETRY, "now");
    }

    /// `node`'s record as stored, if drover wrote one.
    pub fn record(&self, node: &str) -> Option<NodeRecord> {
        let s = self.lock();
        let r = s.records.get(node)?;
        crate::record::wire::decode(&r.spec, Some(&r.status)).ok()
    }

    /// Store `record` as an earlier drover left it (a seeded sim).
    fn seed_record(&self, record: &NodeRecord) {
        let mut s = self.lock();
        s.revision += 1;
        let rv = s.revision;
        let status = crate::record::wire::encode(record, 1, &[], self.clock.now());
        s.records.insert(
            record.node.clone(),
            SimRecord {
                spec: crate::record::wire::spec(record, "", &self.name),
                status,
                annotations: BTreeMap::new(),
                resource_version: rv,
                generation: 1,
            },
        );
    }

    /// The clock the sim reads.
    pub fn clock(&self) -> &VirtualClock {
        &self.clock
    }

    /// A snapshot of the nodes, brought up to the clock's time.
    pub fn nodes(&self) -> Vec<SimNode> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        s.nodes.values().cloned().collect()
    }

    /// Everything that happened, in order.
    pub fn log(&self) -> Vec<Event> {
        self.lock().log.clone()
    }

    /// Invariant violations seen.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// How many times drover made `call` (`cordon`, `uncordon`,
    /// `set_progress`, `evict`, `start_upgrade`, `mark_rolled_back`) on
    /// `node`, whether it landed or not.
    pub fn calls(&self, call: &str, node: &str) -> usize {
        self.lock()
            .calls
            .get(&(call.to_string(), node.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// When drover last listed the nodes: what a simulation judges the
    /// control loop's liveness by.
    pub fn last_observed(&self) -> Option<DateTime<Utc>> {
        self.lock().observed
    }

    /// The most nodes unavailable because of drover at any one moment.
    pub fn peak_unavailable(&self) -> usize {
        self.lock().peak_unavailable
    }

    /// Nodes drover has in flight (draining, upgrading or rolling back per
    /// their records) or still holds cordoned.
    pub fn in_flight(&self) -> usize {
        let s = self.lock();
        s.nodes.keys().filter(|n| s.in_flight(n)).count()
    }

    /// The next instant after `now` at which something happens by itself
    /// (a reboot ends, a PDB relents).
    pub fn next_event(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let s = self.lock();
        let runs = s
            .nodes
            .values()
            .flat_map(|n| n.runs.iter())
            .filter(|r| r.status == UpgradeStatus::Running)
            .filter_map(|r| r.stopping_until.or(r.done_at));
        let pdbs = s.pdbs.values().filter_map(|p| p.blocked_until);
        let faults = s
            .faults
            .iter()
            .flat_map(|(_, _, from, until)| [*from, *until]);
        let outages = s
            .outages
            .iter()
            .flat_map(|(_, from, until)| [*from, *until]);
        runs.chain(pdbs)
            .chain(faults)
            .chain(outages)
            .filter(|t| *t > now)
            .min()
    }
}

impl State {
    fn count(&mut self, call: &str, node: &str) {
        *self
            .calls
            .entry((call.to_string(), node.to_string()))
            .or_default() += 1;
    }

    fn faulty(&self, node: &str, fault: CallFault, now: DateTime<Utc>) -> bool {
        self.faults
            .iter()
            .any(|(n, f, from, until)| n == node && *f == fault && *from <= now && now < *until)
    }

    /// `Err` when `fault` hits `node` at `now`.
    fn check(&self, node: &str, fault: CallFault, now: DateTime<Utc>) -> Result<(), SimError> {
        if self.faulty(node, fault, now) {
            return Err(SimError::Injected {
                node: node.to_string(),
                fault,
            });
        }
        Ok(())
    }

    fn node(&mut self, name: &str) -> Result<&mut SimNode, SimError> {
        self.nodes
            .get_mut(name)
            .ok_or_else(|| SimError::NoSuchNode(name.to_string()))
    }

    /// Whether `node`'s record says drover has it in flight, or it holds
    /// drover's cordon still (a give-back waiting for its stopped run).
    fn in_flight(&self, node: &str) -> bool {
        self.records.get(node).is_some_and(|r| {
            ProgressState::parse(&r.status.phase).is_some_and(ProgressState::in_flight)
                || (r.status.cordoned_by_drover
                    && self.nodes.get(node).is_some_and(|n| n.unschedulable))
        })
    }

    /// Finish every reboot due by `now`, and stop the runs deleted whose
    /// stop is due.
    fn settle(&mut self, now: DateTime<Utc>) {
        let mut returned = Vec::new();
        for n in self.nodes.values_mut() {
            for r in n.runs.iter_mut() {
                if r.status == UpgradeStatus::Running && r.stopping_until.is_some_and(|t| t <= now)
                {
                    // Its pod stopped before it finished: the reboot is
                    // cancelled, the node back at what it ran.
                    r.status = UpgradeStatus::Failed("deleted".into());
                    if n.down_by_drover {
                        n.ready = true;
                        n.down_by_drover = false;
                        returned.push((now, n.name.clone(), n.version.clone()));
                    }
                    continue;
                }
                if r.status != UpgradeStatus::Running || r.done_at.is_none_or(|t| t > now) {
                    continue;
                }
                match &r.failure {
                    Some(Failure::DriverFails(m)) => {
                        r.status = UpgradeStatus::Failed(m.clone());
                        r.failed_at = r.done_at;
                    }
                    Some(Failure::ReturnsAt(v)) => {
                        r.status = UpgradeStatus::Succeeded;
                        n.version = Some(v.clone());
                        n.ready = true;
                        n.down_by_drover = false;
                    }
                    _ => {
                        r.status = UpgradeStatus::Succeeded;
                        n.version = Some(r.target.clone());
                        n.ready = true;
                        n.down_by_drover = false;
                    }
                }
                if n.ready {
                    returned.push((r.done_at.unwrap_or(now), n.name.clone(), n.version.clone()));
                }
            }
        }
        for (at, node, v) in returned {
            self.log.push(Event {
                at,
                node,
                kind: EventKind::Returned(v),
            });
        }
        for n in self.nodes.values_mut() {
            let out = self
                .outages
                .iter()
                .any(|(o, from, until)| *o == n.name && *from <= now && now < *until);
            if out {
                n.ready = false;
                self.out.insert(n.name.clone());
            } else if self.out.remove(&n.name) && !n.down_by_drover {
                n.ready = true;
            }
        }
        self.place_pending();
        self.measure();
    }

    fn measure(&mut self) {
        let down = self
            .nodes
            .values()
            .filter(|n| {
                n.cordoned_by == Some(CordonedBy::Drover)
                    || n.down_by_drover
                    || self.in_flight(&n.name)
            })
            .count();
        self.peak_unavailable = self.peak_unavailable.max(down);
    }

    fn place_pending(&mut self) {
        let pods = std::mem::take(&mut self.pending);
        for pod in pods {
            self.place(pod, "");
        }
    }

    /// Put `pod` on the schedulable Ready node (not `from`) with the fewest pods.
    fn place(&mut self, pod: Pod, from: &str) {
        let dest = self
            .nodes
            .values_mut()
            .filter(|n| n.ready && !n.unschedulable && n.name != from)
            .min_by_key(|n| n.pods.len());
        match dest {
            Some(n) => n.pods.push(pod),
            None => self.pending.push(pod),
        }
    }

    fn healthy(&self, pdb: &str) -> usize {
        self.nodes
            .values()
            .filter(|n| n.ready)
            .flat_map(|n| n.pods.iter())
            .filter(|p| p.pdb.as_deref() == Some(pdb))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Cluster;

    /// A node NotReady by no act of drover's is NotReady exactly in its
    /// window, wakes a driver of the sim at both ends, and is seen so.
    #[test]
    fn a_node_goes_not_ready_on_its_own_for_its_window() {
        let t0: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        let clock = VirtualClock::new(t0);
        let sim = Sim::new("c", clock.clone());
        sim.add_node(SimNode::new(
            "n",
            Some(Version::new(1, 0, 0)),
            Duration::from_secs(60),
        ));
        let (from, until) = (
            t0 + chrono::Duration::minutes(1),
            t0 + chrono::Duration::minutes(3),
        );
        sim.not_ready("n", from, until);
        assert_eq!(sim.next_event(t0), Some(from));
        assert_eq!(sim.next_event(from), Some(until));
        let ready_at = |t| {
            clock.set(t);
            let seen = futures::executor::block_on(sim.observe()).unwrap();
            seen[0].ready
        };
        assert!(ready_at(t0));
        assert!(!ready_at(from));
        assert!(!ready_at(until - chrono::Duration::seconds(1)));
        assert!(ready_at(until));
    }
}
