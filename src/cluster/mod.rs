//! The narrow interface the rollout engine drives, implemented by the
//! Kubernetes backend (`crate::kubernetes`) and the simulation (`crate::sim`).
//!
//! The engine keeps no memory between steps: everything it needs to resume
//! after a crash is in each node's record ([`crate::record`]), which only
//! drover writes, and in the driver run the record links to
//! ([`effective`]). The Node itself carries only the cordon. Both backends
//! store records with the same encoding (`record::wire`) so that the
//! simulation behaves exactly like a real cluster.
//!
//! Every method may be repeated: the engine can crash between two calls,
//! or after a call took effect but before it saw the answer, and will then
//! issue the same call again from what it observes.

mod run;

pub use crate::health::observe::{NodeSeen, PodSeen};
use crate::record::legacy::LegacyNode;
pub use crate::record::{
    ConsentHold, NodeProgress, NodeRecord, ProgressState, RecordError, RecordWrite, Requests,
    RunAction, RunLink, Stored,
};
pub use run::{effective, Effective, LinkedRun};
use semver::Version;
use serde::Serialize;
use std::future::Future;

/// Status of the driver run a node's record links to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "status", content = "message")]
pub enum UpgradeStatus {
    /// The record names no run, or one not made yet.
    NotStarted,
    /// The run is in progress (including the node's reboot).
    Running,
    /// The run finished, reboot included; the observed version is what the OS now reports.
    Succeeded,
    /// The run failed, with the driver's message.
    Failed(String),
    /// drover's record stopped the run but its Job is still there, not
    /// being deleted (the delete did not land): it is deleted again.
    StopPending,
    /// drover deleted the run; its Job or pods are still there and may act
    /// on the node: it is not uncordoned yet.
    Stopping,
    /// drover deleted the run and nothing of it is left.
    Stopped,
}

/// One selected node as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// OS version read from the node; `None` when it cannot be read (reported, never guessed).
    pub version: Option<Version>,
    /// The node's Ready condition is True.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned, by anyone).
    pub unschedulable: bool,
    /// drover's progress from its record and the run it links
    /// ([`effective`]); `Err` when the record cannot be read.
    #[serde(serialize_with = "ser_progress")]
    pub progress: Result<Option<NodeProgress>, RecordError>,
    /// A person asked for a retry on the record.
    pub retry: bool,
    /// The uid of the run the record links to, when it was found.
    pub run_uid: Option<String>,
    /// A person asked to clear the record's rolled-back marks.
    pub clear_rolled_back: bool,
    /// Pods that a drain still has to evict (DaemonSet and mirror pods excluded).
    pub pods_to_evict: usize,
    /// The driver run the record links to.
    pub upgrade: UpgradeStatus,
    /// Read for blocked nodes only: every PodDisruptionBudget covering the
    /// pods a drain would evict allows a disruption now, so a retry need not
    /// wait out its backoff.
    pub budgets_allow_drain: bool,
    /// Why this node could not be observed in full this time (its pods could
    /// not be listed, its version not confirmed, its run not recognised):
    /// the decision holds it, taking no step that needs the missing part,
    /// while its timeouts still run. `None` when everything was read.
    pub fault: Option<String>,
    /// The versions the node was rolled back from: drover never moves it
    /// to one of them again.
    pub rolled_back: Vec<Version>,
    /// Another updater manages this node, and what says so (the Bottlerocket
    /// update operator's label, `[nodes] other_updater_label`): drover
    /// leaves it alone unless it already has a record of drover's.
    pub managed_by: Option<String>,
    /// The node's workload asks drover to wait: the value of
    /// [`crate::config::CONSENT_LABEL`] when it is
    /// [`crate::config::CONSENT_PAUSED`]. Read, never written: it only keeps
    /// a node from being started.
    pub consent_paused: bool,
    /// What drover's record says of the consent holding the node: when
    /// drover first saw it, whether the hold was reported overdue.
    pub consent_hold: Option<ConsentHold>,
    /// The node carries drover's pre-drain taint
    /// ([`crate::config::DRAIN_TAINT`]).
    pub drain_tainted: bool,
    /// Rollbacks started on the node, per version rolled back from.
    pub rollbacks: Vec<crate::record::Rollbacks>,
    /// The stored record, what the next write builds on; `None` before
    /// drover's first write about the node.
    #[serde(skip)]
    pub record: Option<Stored>,
    /// drover's annotations of earlier releases found on the Node
    /// (`key=value`, bounded): never acted on, named by the agent.
    pub ignored: Vec<String>,
    /// What the record's run said when it ended (its retries), read once
    /// when it has just ended and the record does not hold it yet: the
    /// next write of the record carries it.
    pub driver_said: Option<crate::record::DriverRun>,
}

impl Default for NodeView {
    fn default() -> Self {
        NodeView {
            name: String::new(),
            version: None,
            ready: false,
            unschedulable: false,
            progress: Ok(None),
            retry: false,
            run_uid: None,
            clear_rolled_back: false,
            pods_to_evict: 0,
            upgrade: UpgradeStatus::NotStarted,
            budgets_allow_drain: false,
            fault: None,
            rolled_back: Vec::new(),
            rollbacks: Vec::new(),
            record: None,
            ignored: Vec::new(),
            managed_by: None,
            consent_paused: false,
            consent_hold: None,
            drain_tainted: false,
            driver_said: None,
        }
    }
}

fn ser_progress<S: serde::Serializer>(
    p: &Result<Option<NodeProgress>, RecordError>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match p {
        Ok(p) => p.serialize(s),
        Err(e) => s.serialize_str(&format!("unreadable: {e}")),
    }
}

/// The most of a node's ignored annotations a view names.
pub const MAX_IGNORED: usize = 12;

impl NodeView {
    /// The view of a node whose record is `record` (`None`: none yet;
    /// `Err`: unreadable) linking to `linked`: its progress, run status and
    /// the record's marks and requests ([`effective`]).
    pub fn of_record(
        name: impl Into<String>,
        version: Option<Version>,
        ready: bool,
        unschedulable: bool,
        record: Option<Result<Stored, RecordError>>,
        linked: &LinkedRun,
    ) -> Self {
        let mut view = NodeView {
            name: name.into(),
            version,
            ready,
            unschedulable,
            ..NodeView::default()
        };
        match record {
            None => {}
            Some(Err(e)) => view.progress = Err(e),
            Some(Ok(stored)) => {
                let e = effective(&stored.record, linked);
                view.progress = Ok(e.progress);
                view.upgrade = e.upgrade;
                view.fault = e.fault;
                if let LinkedRun::Found { uid, .. } = linked {
                    view.run_uid = Some(uid.clone());
                }
                view.rolled_back = stored.record.rolled_back.clone();
                view.rollbacks = stored.record.rollbacks.clone();
                view.consent_hold = stored.record.consent;
                view.retry = stored.requests.retry;
                view.clear_rolled_back = stored.requests.clear_rolled_back;
                view.record = Some(stored);
            }
        }
        view
    }

    /// The record the next write about this node builds on: the stored
    /// one, or a new one with `id`.
    pub fn record_or_new(&self, id: impl FnOnce() -> String) -> NodeRecord {
        self.record
            .as_ref()
            .map_or_else(|| NodeRecord::new(&self.name, id()), |s| s.record.clone())
    }
}

/// The result of one eviction pass over a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EvictionPass {
    /// Pods still to evict after this pass.
    pub remaining: usize,
    /// PodDisruptionBudgets that refused an eviction (HTTP 429) in this pass.
    pub blocked_by: Vec<String>,
    /// Pods (`namespace/name`) whose eviction they refused.
    pub refused_pods: Vec<String>,
    /// The rungs beyond `evict` this pass used (a restart made or awaited,
    /// a wait, a skip reached, a pod deleted), one per rung and rule.
    pub rungs: Vec<RungTaken>,
}

/// A drain rung beyond `evict` one pass used on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RungTaken {
    /// The rung.
    pub rung: crate::config::RungKind,
    /// The drain rule that called for it.
    pub rule: String,
    /// What it did, in a line ("restarted Deployment apps/web for pod apps/web-1").
    pub detail: String,
}

/// What one eviction pass is to do ([`Cluster::evict`]): the environment's
/// drain rules, and how long the node has been cordoned (which rung of
/// each ladder is in force).
#[derive(Debug, Clone, Copy, Default)]
pub struct DrainOrder<'a> {
    /// `[[drain]]`; empty: every pod evicted, as before rules existed.
    pub rules: &'a [crate::config::DrainRule],
    /// Time since the cordon.
    pub since_cordon: std::time::Duration,
    /// This drain's mark (the time of its cordon, the node and the
    /// record's attempt): the value a `restart` rung writes as the owner's `kubectl.kubernetes.io/restartedAt`, so
    /// a repeated pass meets its own restart instead of starting another.
    pub mark: &'a str,
}

impl RungTaken {
    /// Add `taken` to `list` unless a rung of the same kind and rule is there.
    pub fn add(list: &mut Vec<RungTaken>, taken: RungTaken) {
        if !list
            .iter()
            .any(|t| t.rung == taken.rung && t.rule == taken.rule)
        {
            list.push(taken);
        }
    }
}

/// What a cordon found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cordoned {
    /// The node was schedulable: drover cordoned it.
    ByDrover,
    /// It was already unschedulable (someone else's cordon, or drover's
    /// own repeated): nothing changed.
    Already,
}

/// A driver run to make: the run a record links to, for the record `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStart {
    /// The record's id (the run carries it, and is accepted by it).
    pub record_id: String,
    /// The run, as the record names it.
    pub run: RunLink,
    /// A rollback's: the version that failed (`DROVER_FAILED_VERSION`).
    pub failed_version: Option<Version>,
}

impl RunStart {
    /// The run `record` names for `progress` (a rollback's with the
    /// version that failed), if it names one.
    pub fn of(record: &NodeRecord, progress: &NodeProgress) -> Option<RunStart> {
        let run = record.run.clone()?;
        Some(RunStart {
            record_id: record.id.clone(),
            failed_version: (run.action == RunAction::Rollback).then(|| progress.target.clone()),
            run,
        })
    }
}

/// What the rollout engine needs from a cluster. Implemented with `async fn`;
/// the futures are `Send` so an agent can drive the engine from any task.
///
/// Every method is idempotent: repeating a call that already took effect
/// changes nothing more.
pub trait Cluster {
    /// The backend's error (API failures, a node that vanished).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The cluster's name, for logs and status reports.
    fn name(&self) -> &str;

    /// The nodes the environment's selector chooses, in any order, as they
    /// are now, each with its record and the run it links. A node whose own
    /// part of the observation fails (its pods cannot be listed, it
    /// vanished mid-read) is returned with [`NodeView::fault`] set, never
    /// as an error of the whole call: one node's trouble must not stop
    /// every other node.
    fn observe(&self) -> impl Future<Output = Result<Vec<NodeView>, Self::Error>> + Send;

    /// Write a node's record, in one request, conditional on the stored
    /// version it replaces (created when there is none); returns it as
    /// stored, what the node's next write builds on. Only drover writes
    /// records.
    fn write_record(
        &self,
        write: &RecordWrite,
    ) -> impl Future<Output = Result<Stored, Self::Error>> + Send;

    /// Cordon `node` (`spec.unschedulable`, nothing else); says whether it
    /// was schedulable. The engine records that drover cordons it first.
    fn cordon(&self, node: &str) -> impl Future<Output = Result<Cordoned, Self::Error>> + Send;

    /// Set drover's pre-drain taint ([`crate::config::DRAIN_TAINT`]) on
    /// `node`, the lead time before its cordon a drain rule asks for.
    fn taint(&self, node: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Uncordon `node` (and remove the pre-drain taint). The engine calls
    /// it only on a node whose record says drover cordoned it (or will:
    /// one given back during the taint's lead), and whose runs cannot act
    /// on it any more.
    fn uncordon(&self, node: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// One eviction pass over `node`'s pods through the Eviction API, so
    /// PodDisruptionBudgets are honoured: a refused eviction is not an error,
    /// it is reported in `blocked_by` and retried by a later pass. A pod a
    /// drain rule of `order` matches gets its rule's rung in force instead
    /// (`config::drain`); a pod is deleted only by a rule that allows it.
    fn evict(
        &self,
        node: &str,
        order: &DrainOrder<'_>,
    ) -> impl Future<Output = Result<EvictionPass, Self::Error>> + Send;

    /// Make the driver run `start` names, unless a run of that name exists
    /// (running, succeeded or failed): a repeated call never moves a node
    /// twice. The record naming it is written first.
    fn start_run(
        &self,
        node: &str,
        start: &RunStart,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Delete the run `run` names (a timeout, a new pin while it
    /// prepares); its pods are then stopped. The record saying so is
    /// written first.
    fn stop_run(
        &self,
        node: &str,
        run: &RunLink,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The health inputs of `nodes` (docs/design.md §5a): their conditions
    /// and the watched pods bound to them, each node read whole or marked
    /// [`NodeSeen::unread`] with why, never in part. A node that vanished is
    /// left out. The default, for backends without workloads, reports no
    /// pods and no conditions.
    fn health(
        &self,
        nodes: &[String],
    ) -> impl Future<Output = Result<Vec<NodeSeen>, Self::Error>> + Send {
        let seen = nodes
            .iter()
            .map(|n| NodeSeen {
                name: n.clone(),
                conditions: Vec::new(),
                pods: Vec::new(),
                unread: None,
            })
            .collect();
        async move { Ok(seen) }
    }

    /// The records earlier releases left in the Nodes' annotations, with
    /// their drover Jobs, for the one migration (`record::legacy`): every
    /// selected node that carries any of those annotations.
    fn legacy(&self) -> impl Future<Output = Result<Vec<LegacyNode>, Self::Error>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Remove the annotations of earlier releases from `node`.
    fn clear_legacy(&self, node: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = node;
        async { Ok(()) }
    }
}

/// A shared cluster is the cluster: a backend that hands out one cluster
/// view to several builders (the whole-agent simulation's in-memory
/// cluster, kept across the agent's restarts) hands out an `Arc` of it.
impl<C: Cluster + Send + Sync> Cluster for std::sync::Arc<C> {
    type Error = C::Error;

    fn name(&self) -> &str {
        (**self).name()
    }
    fn observe(&self) -> impl Future<Output = Result<Vec<NodeView>, Self::Error>> + Send {
        (**self).observe()
    }
    fn write_record(
        &self,
        write: &RecordWrite,
    ) -> impl Future<Output = Result<Stored, Self::Error>> + Send {
        (**self).write_record(write)
    }
    fn cordon(&self, node: &str) -> impl Future<Output = Result<Cordoned, Self::Error>> + Send {
        (**self).cordon(node)
    }
    fn uncordon(&self, node: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        (**self).uncordon(node)
    }
    fn taint(&self, node: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        (**self).taint(node)
    }
    fn evict(
        &self,
        node: &str,
        order: &DrainOrder<'_>,
    ) -> impl Future<Output = Result<EvictionPass, Self::Error>> + Send {
        (**self).evict(node, order)
    }
    fn start_run(
        &self,
        node: &str,
        start: &RunStart,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        (**self).start_run(node, start)
    }
    fn stop_run(
        &self,
        node: &str,
        run: &RunLink,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        (**self).stop_run(node, run)
    }
    fn health(
        &self,
        nodes: &[String],
    ) -> impl Future<Output = Result<Vec<NodeSeen>, Self::Error>> + Send {
        (**self).health(nodes)
    }
    fn legacy(&self) -> impl Future<Output = Result<Vec<LegacyNode>, Self::Error>> + Send {
        (**self).legacy()
    }
    fn clear_legacy(&self, node: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        (**self).clear_legacy(node)
    }
}
