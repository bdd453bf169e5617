//! An in-memory simulated cluster with a virtual clock, for `drover demo`,
//! `drover plan` and benchmarks.
//!
//! Nodes have versions and reboot times; pods belong to
//! PodDisruptionBudgets; failures can be injected (a node that never comes
//! back, one that comes back at the wrong version, a driver that fails, a
//! PDB that refuses every eviction until some instant). Time does not tick:
//! [`drive`] jumps from one interesting instant to the next (a reboot ends,
//! a PDB relents, a window opens or closes, a timeout), so months of
//! rollout take milliseconds. Annotations are read and written with the same
//! functions the Kubernetes backend uses.
//!
//! Faults of the cluster's API about one node can be injected for a while
//! ([`CallFault`], [`Sim::inject`]): its pods cannot be listed, its
//! evictions, writes, driver start or health reads fail, as one node's
//! trouble looks to drover on a real API server.
//!
//! The sim also watches the invariants from the outside: it logs every
//! cordon, uncordon, eviction and driver start with its time, records the
//! peak number of nodes unavailable because of drover, and notes any
//! violation (uncordoning a node drover did not cordon, an eviction past a
//! PDB, a second driver run for the same attempt, a driver started on a node
//! that still runs pods).

mod drive;

pub use drive::{drive, drive_in_waves, DriveReport, Timeline, WaveSchedule};

use crate::cluster::{
    apply_patch, encode_progress, Cluster, EvictionPass, NodeProgress, NodeView, ProgressState,
    RunSeen, UpgradeStatus,
};
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

#[derive(Debug, Clone)]
struct Run {
    target: Version,
    attempt: DateTime<Utc>,
    /// [`NodeProgress::run_action`]: a prepare and a drain may share an instant.
    action: &'static str,
    done_at: Option<DateTime<Utc>>,
    status: UpgradeStatus,
    /// The record it was started for ([`RunSeen`]: its state lives on it).
    record: NodeProgress,
    /// Its Job was deleted by a give-back: no longer seen (kept here for
    /// the invariants and the health faults).
    deleted: bool,
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
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// How long the driver takes, reboot included.
    pub node_time: Duration,
    /// Injected failure of its upgrade.
    pub failure: Option<Failure>,
    /// Pods on it.
    pub pods: Vec<Pod>,
    /// NotReady because a drover driver rebooted it.
    pub down_by_drover: bool,
    /// A health fault that shows while it runs this version after an upgrade.
    pub health_fault: Option<(Version, HealthFault)>,
    runs: Vec<Run>,
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
            annotations: BTreeMap::new(),
            node_time,
            failure: None,
            pods: Vec::new(),
            down_by_drover: false,
            health_fault: None,
            runs: Vec::new(),
        }
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

    /// With pods.
    pub fn with_pods(mut self, pods: Vec<Pod>) -> Self {
        self.pods = pods;
        self
    }

    /// drover's record says draining or upgrading (read cheaply: the sim
    /// checks this after every change).
    pub fn in_flight(&self) -> bool {
        matches!(
            self.annotations
                .get(crate::cluster::ANN_STATE)
                .map(String::as_str),
            Some("draining" | "upgrading" | "rolling-back")
        )
    }

    /// Driver runs started on this node that move it (upgrades and
    /// rollbacks; a download before the drain, `prepare`, moves nothing).
    pub fn driver_runs(&self) -> usize {
        self.runs.iter().filter(|r| r.action != "prepare").count()
    }
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
}

#[derive(Debug, Default)]
struct State {
    nodes: BTreeMap<String, SimNode>,
    pdbs: BTreeMap<String, Pdb>,
    pending: Vec<Pod>,
    log: Vec<Event>,
    violations: Vec<String>,
    peak_unavailable: usize,
    /// Injected faults: node, fault, `[from, until)`.
    faults: Vec<(String, CallFault, DateTime<Utc>, DateTime<Utc>)>,
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
            if let Some(p) = progress {
                apply_patch(&mut n.annotations, &encode_progress(Some(p)));
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

    /// Make `fault` hit `node` from `from` until `until` (exclusive).
    pub fn inject(&self, node: &str, fault: CallFault, from: DateTime<Utc>, until: DateTime<Utc>) {
        self.lock()
            .faults
            .push((node.to_string(), fault, from, until));
    }

    /// Add a PodDisruptionBudget.
    pub fn add_pdb(&self, name: impl Into<String>, pdb: Pdb) {
        self.lock().pdbs.insert(name.into(), pdb);
    }

    /// Set an annotation as a person would (e.g. `drover.dev/retry`).
    pub fn annotate(&self, node: &str, key: &str, value: &str) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            n.annotations.insert(key.into(), value.into());
        }
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

    /// The most nodes unavailable because of drover at any one moment.
    pub fn peak_unavailable(&self) -> usize {
        self.lock().peak_unavailable
    }

    /// Nodes drover has in flight (draining/upgrading per their annotations).
    pub fn in_flight(&self) -> usize {
        self.lock().nodes.values().filter(|n| n.in_flight()).count()
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
            .filter_map(|r| r.done_at);
        let pdbs = s.pdbs.values().filter_map(|p| p.blocked_until);
        let faults = s
            .faults
            .iter()
            .flat_map(|(_, _, from, until)| [*from, *until]);
        runs.chain(pdbs).chain(faults).filter(|t| *t > now).min()
    }
}

impl State {
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

    /// Finish every reboot due by `now`.
    fn settle(&mut self, now: DateTime<Utc>) {
        let mut returned = Vec::new();
        for n in self.nodes.values_mut() {
            let failure = n.failure.clone();
            for r in n.runs.iter_mut() {
                if r.status != UpgradeStatus::Running || r.done_at.is_none_or(|t| t > now) {
                    continue;
                }
                match &failure {
                    Some(Failure::DriverFails(m)) => r.status = UpgradeStatus::Failed(m.clone()),
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
        self.place_pending();
        self.measure();
    }

    fn measure(&mut self) {
        let down = self
            .nodes
            .values()
            .filter(|n| {
                n.cordoned_by == Some(CordonedBy::Drover) || n.down_by_drover || n.in_flight()
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

    fn write(&mut self, node: &str, progress: Option<&NodeProgress>) -> Result<(), SimError> {
        let n = self.node(node)?;
        // As the Kubernetes backend deletes Jobs before a give-back: every
        // run once the node is done or watched, the running ones when it
        // is given back blocked or failed.
        let state = progress.map(|p| p.state);
        for r in &mut n.runs {
            r.deleted |= match state {
                None | Some(ProgressState::Watching) => true,
                Some(ProgressState::Blocked | ProgressState::Failed) => {
                    r.status == UpgradeStatus::Running
                }
                _ => false,
            };
        }
        apply_patch(&mut n.annotations, &encode_progress(progress));
        Ok(())
    }
}

impl Cluster for Sim {
    type Error = SimError;

    fn name(&self) -> &str {
        &self.name
    }

    async fn observe(&self) -> Result<Vec<NodeView>, SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        Ok(s.nodes
            .values()
            .map(|n| {
                let runs: Vec<RunSeen> = n
                    .runs
                    .iter()
                    .filter(|r| !r.deleted)
                    .map(|r| RunSeen::of(&r.record, r.status.clone()))
                    .collect();
                let effective =
                    crate::cluster::effective(NodeProgress::decode(&n.annotations), &runs);
                let unlisted = n.in_flight() && s.faulty(&n.name, CallFault::Observe, now);
                NodeView {
                    name: n.name.clone(),
                    version: n.version.clone(),
                    ready: n.ready,
                    unschedulable: n.unschedulable,
                    rolled_back: crate::cluster::decode_rolled_back(&n.annotations)
                        .unwrap_or_default(),
                    managed_by: None,
                    progress: effective.progress,
                    retry: crate::cluster::retry_requested(&n.annotations),
                    // What a backend reports when the list failed: no count.
                    pods_to_evict: if unlisted { 0 } else { n.pods.len() },
                    fault: unlisted.then(|| "injected: its pods cannot be listed".to_string()),
                    upgrade: effective.upgrade,
                    from_run: effective.from_run,
                    // The same test as an eviction's, for every pod left.
                    budgets_allow_drain: !unlisted
                        && n.pods.iter().all(|pod| {
                            pod.pdb
                                .as_ref()
                                .and_then(|name| s.pdbs.get(name).map(|b| (name, b)))
                                .is_none_or(|(name, b)| {
                                    b.blocked_until.is_none_or(|t| now >= t)
                                        && s.healthy(name) > b.min_available
                                })
                        }),
                }
            })
            .collect())
    }

    async fn cordon(&self, node: &str, progress: &NodeProgress) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        s.node(node)?;
        s.check(node, CallFault::Write, now)?;
        let n = s.node(node)?;
        let kind = if n.unschedulable {
            EventKind::Adopt
        } else {
            n.unschedulable = true;
            n.cordoned_by = Some(CordonedBy::Drover);
            EventKind::Cordon
        };
        s.write(node, Some(progress))?;
        s.log.push(Event {
            at: now,
            node: node.into(),
            kind,
        });
        s.measure();
        Ok(())
    }

    async fn uncordon(&self, node: &str, progress: Option<&NodeProgress>) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        s.node(node)?;
        s.check(node, CallFault::Write, now)?;
        let n = s.node(node)?;
        let by = n.cordoned_by;
        n.unschedulable = false;
        n.cordoned_by = None;
        if by == Some(CordonedBy::Other) {
            s.violations.push(format!(
                "{now}: uncordoned {node}, which someone else cordoned"
            ));
        }
        s.write(node, progress)?;
        s.log.push(Event {
            at: now,
            node: node.into(),
            kind: EventKind::Uncordon,
        });
        s.place_pending();
        s.measure();
        Ok(())
    }

    async fn set_progress(
        &self,
        node: &str,
        progress: Option<&NodeProgress>,
    ) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        s.node(node)?;
        s.check(node, CallFault::Write, now)?;
        s.write(node, progress)?;
        s.measure();
        Ok(())
    }

    async fn evict(&self, node: &str) -> Result<EvictionPass, SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        s.node(node)?;
        s.check(node, CallFault::Evict, now)?;
        let mut blocked_by = Vec::new();
        let mut refused_pods = Vec::new();
        let mut i = 0;
        while i < s.node(node)?.pods.len() {
            let pod = s.nodes[node].pods[i].clone();
            let allowed = match pod
                .pdb
                .as_ref()
                .and_then(|name| s.pdbs.get(name).map(|p| (name, p)))
            {
                None => true,
                Some((name, pdb)) => {
                    pdb.blocked_until.is_none_or(|t| now >= t)
                        && s.healthy(name) > pdb.min_available
                }
            };
            if !allowed {
                refused_pods.push(pod.name.clone());
                if let Some(p) = pod.pdb {
                    if !blocked_by.contains(&p) {
                        blocked_by.push(p);
                    }
                }
                i += 1;
                continue;
            }
            s.node(node)?.pods.remove(i);
            s.log.push(Event {
                at: now,
                node: node.into(),
                kind: EventKind::Evicted(pod.name.clone()),
            });
            s.place(pod, node);
        }
        let remaining = s.node(node)?.pods.len();
        Ok(EvictionPass {
            remaining,
            blocked_by,
            refused_pods,
        })
    }

    async fn start_upgrade(&self, node: &str, progress: &NodeProgress) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        s.node(node)?;
        s.check(node, CallFault::Start, now)?;
        let n = s.node(node)?;
        let version = progress.run_version().clone();
        let action = progress.run_action();
        if n.runs.iter().any(|r| {
            !r.deleted
                && r.target == version
                && r.attempt == progress.started_at
                && r.action == action
        }) {
            return Ok(());
        }
        // A run deleted by a give-back is over: one that moves the node
        // must never be started again for the same attempt (a prepare may:
        // a node given back while preparing prepares again).
        if action != "prepare"
            && n.runs.iter().any(|r| {
                r.deleted
                    && r.target == version
                    && r.attempt == progress.started_at
                    && r.action == action
            })
        {
            s.violations.push(format!(
                "{now}: a second {action} run on {node} for the attempt of {}",
                progress.started_at
            ));
        }
        let n = s.node(node)?;
        if progress.state == ProgressState::Preparing {
            // The download: no reboot, no drain needed, done at once (the
            // simulated node has no repository that could lack the target).
            n.runs.push(Run {
                target: version,
                attempt: progress.started_at,
                action,
                done_at: Some(now),
                status: UpgradeStatus::Succeeded,
                record: progress.clone(),
                deleted: false,
            });
            return Ok(());
        }
        if !n.pods.is_empty() {
            let pods = n.pods.len();
            s.violations.push(format!(
                "{now}: driver started on {node}, which still runs {pods} pods"
            ));
        }
        let n = s.node(node)?;
        let done = chrono::Duration::from_std(n.node_time)
            .ok()
            .and_then(|d| now.checked_add_signed(d));
        let (done_at, reboots) = match n.failure {
            Some(Failure::NeverReturns) => (None, true),
            Some(Failure::DriverFails(_)) => (done, false),
            _ => (done, true),
        };
        if reboots {
            n.ready = false;
            n.down_by_drover = true;
        }
        n.runs.push(Run {
            target: version.clone(),
            attempt: progress.started_at,
            action,
            done_at,
            status: UpgradeStatus::Running,
            record: progress.clone(),
            deleted: false,
        });
        s.log.push(Event {
            at: now,
            node: node.into(),
            kind: if progress.state == ProgressState::RollingBack {
                EventKind::RollbackStart(version)
            } else {
                EventKind::DriverStart(version)
            },
        });
        // The node may have been the only schedulable home for pending pods.
        s.measure();
        Ok(())
    }

    async fn mark_rolled_back(
        &self,
        node: &str,
        progress: &NodeProgress,
        rolled_back: &[Version],
        uncordon: bool,
    ) -> Result<(), SimError> {
        if uncordon {
            self.uncordon(node, Some(progress)).await?;
        } else {
            self.set_progress(node, Some(progress)).await?;
        }

        // One patch on a real cluster; one lock here, taken again at once.
        let mut s = self.lock();
        let n = s.node(node)?;
        n.annotations.insert(
            crate::cluster::ANN_ROLLED_BACK.into(),
            crate::cluster::encode_rolled_back(rolled_back),
        );
        Ok(())
    }

    async fn health(&self, nodes: &[String]) -> Result<Vec<crate::cluster::NodeSeen>, SimError> {
        use crate::cluster::{NodeSeen, PodSeen};
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        Ok(nodes
            .iter()
            .filter_map(|name| s.nodes.get(name))
            .map(|n| {
                if s.faulty(&n.name, CallFault::Health, now) {
                    return NodeSeen::unread(n.name.clone(), "injected: cannot read its health");
                }
                // When its last upgrade brought it back: the fault shows from then.
                let returned = n
                    .runs
                    .iter()
                    .filter(|r| r.status == UpgradeStatus::Succeeded)
                    .filter_map(|r| r.done_at)
                    .max();
                let fault = match (&n.health_fault, returned) {
                    (Some((v, f)), Some(_)) if n.version.as_ref() == Some(v) => Some(f),
                    _ => None,
                };
                let returned = returned.unwrap_or(DateTime::<Utc>::MIN_UTC);
                let mut pods: Vec<PodSeen> = n
                    .pods
                    .iter()
                    .map(|p| PodSeen {
                        name: format!("default/{}", p.name),
                        created: DateTime::<Utc>::MIN_UTC,
                        ready: true,
                        restarts: 0,
                        waiting_reason: None,
                    })
                    .collect();
                let mut conditions = Vec::new();
                match fault {
                    Some(HealthFault::CrashLoop) => pods.push(PodSeen {
                        name: format!("default/{}-app", n.name),
                        created: returned,
                        ready: false,
                        restarts: 3,
                        waiting_reason: Some(crate::health::verdict::CRASHLOOP_REASON.into()),
                    }),
                    Some(HealthFault::Condition(t)) => conditions.push((t.clone(), "True".into())),
                    None => {}
                }
                NodeSeen {
                    name: n.name.clone(),
                    conditions,
                    pods,
                    unread: None,
                }
            })
            .collect())
    }
}
