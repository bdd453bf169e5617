//! drover's record of each node (docs/design.md §9, "The node record"):
//! everything drover acts on about a node, in one object only the agent
//! writes (a `DroverNode` in the agent's namespace, named after the node;
//! the simulation keeps the same objects). The Node itself carries only the
//! cordon: its annotations are written by its kubelet and by anyone with
//! `patch nodes`, so nothing there is acted on.
//!
//! Pure: the record's values ([`NodeRecord`], [`NodeProgress`],
//! [`RunLink`]), their wire form (`wire.rs`, one encoding for both
//! backends), the `kubectl`-readable conditions (`conditions.rs`), the
//! driver runs' names ([`run_name`]), and the encoding of older agents'
//! annotation records (`legacy.rs`), kept only to migrate them once.
//!
//! A record links to the driver run it started by name (planned in the
//! record write before the run is created, deterministic per record id,
//! attempt and action, so a repeated start is a conflict, never a second
//! run) and, once seen, its uid; a run is found by that link only.

mod conditions;
pub mod legacy;
mod progress;
pub mod wire;

pub use crate::config::RungKind;
pub use conditions::{conditions_schema, node_conditions, Condition};
pub use progress::{NodeProgress, ProgressState, RunAction};

use semver::Version;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// API group of drover's objects.
pub const GROUP: &str = "drover.dev";
/// API version of drover's objects (`DroverStatus`, `DroverNode`).
pub const API_VERSION: &str = "v1alpha1";
/// Kind of a node's record.
pub const KIND: &str = "DroverNode";
/// Resource (plural) of a node's record.
pub const PLURAL: &str = "drovernodes";

/// Label of a record: the environment its agent serves.
pub const ENVIRONMENT_LABEL: &str = "drover.dev/environment";
/// Label of a record: the cluster its agent reports as.
pub const CLUSTER_LABEL: &str = "drover.dev/cluster";

/// Annotation a person sets on a node's record (any value) to have a
/// failed, blocked or failed-rollback node tried again
/// (`kubectl annotate drovernode -n drover-system NODE drover.dev/retry=now`).
/// The write that acts on it removes it.
pub const ANN_RETRY: &str = "drover.dev/retry";
/// Annotation a person sets on a node's record (any value) to remove its
/// rolled-back marks, so drover may move it to those versions again.
pub const ANN_CLEAR_ROLLED_BACK: &str = "drover.dev/clear-rolled-back";
/// The annotations a person may set on a record: the only change the
/// admission policy lets anyone but the agent make (`deploy/base`).
pub const PERSON_ANNOTATIONS: [&str; 2] = [ANN_RETRY, ANN_CLEAR_ROLLED_BACK];

/// The most versions [`NodeRecord::rolled_back`] keeps (the oldest go first).
pub const MAX_ROLLED_BACK: usize = 16;
/// The most bytes of a record's message.
pub const MAX_MESSAGE: usize = 1024;

/// A node's record: what drover acts on about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeRecord {
    /// The node it is about (the object's name).
    pub node: String,
    /// Chosen when the record is created and never changed: the driver
    /// runs' names derive from it ([`run_name`]), so a record deleted and
    /// made again never meets its predecessor's runs.
    pub id: String,
    /// The episode the node is in; `None` = idle.
    pub progress: Option<NodeProgress>,
    /// Starts drover made on the node (a prepare, a cordon, a rollback,
    /// retried or not, each begin one; a retry that only watches a failed
    /// node again does not); a run belongs to one attempt.
    pub attempt: u32,
    /// The driver run drover started (or planned, in the write before it
    /// creates it) for the current attempt.
    pub run: Option<RunLink>,
    /// The versions the node was rolled back from, oldest first: drover
    /// never moves it to one of them again. Only a person clears them
    /// ([`ANN_CLEAR_ROLLED_BACK`]).
    pub rolled_back: Vec<Version>,
    /// Rollbacks drover started on the node, per version rolled back from
    /// (failed ones and retries included): what `max_rollbacks` counts.
    pub rollbacks: Vec<Rollbacks>,
    /// The drain rungs beyond `evict` used on the node (a restart, a wait,
    /// a skip, a delete), one entry per rung, version and attempt: the
    /// evidence the node's report carries, and what ends a drain at `skip`.
    pub drain_rungs: Vec<RungUse>,
    /// What the driver runs of the current attempt said when they ended
    /// (their retries), at most [`MAX_DRIVER_RUNS`]: kept after the node
    /// is given back, until a new attempt begins.
    pub driver_runs: Vec<DriverRun>,
    /// Workload consent holding the node ([`crate::config::CONSENT_LABEL`]):
    /// when drover first saw it keep the node from starting, and whether
    /// it reported the hold past the environment's `consent_limit`. The
    /// label is the workload's input; this time is drover's own, so
    /// nothing the node or its workloads write moves it. Gone once the
    /// label is, and when the node starts.
    pub consent: Option<ConsentHold>,
}

/// Workload consent holding a node, as drover saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConsentHold {
    /// When drover first saw the consent label keep the node from starting.
    pub since: chrono::DateTime<chrono::Utc>,
    /// drover reported the hold as past `consent_limit` (its Warning
    /// Event was published for this hold).
    pub overdue: bool,
}

/// The most driver runs a record keeps the retries of (an attempt has a
/// prepare and an upgrade, or a rollback).
pub const MAX_DRIVER_RUNS: usize = 4;
/// The most kinds of retry kept per run, and the most bytes of a kind's name.
pub const MAX_RETRY_KINDS: usize = 8;
const MAX_KIND_BYTES: usize = 32;

/// What one driver run said when it ended: the retries it made, by kind
/// (`refresh`, `prepare`, `commit` for the Bottlerocket driver; none for
/// a driver that says nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DriverRun {
    /// Its Job's name.
    pub run: String,
    /// Retries by kind (kinds with none left out).
    pub retries: std::collections::BTreeMap<String, u32>,
}

impl DriverRun {
    /// `run`'s retries, bounded: kinds with none left out, at most
    /// [`MAX_RETRY_KINDS`] kinds of at most 32 bytes each.
    pub fn new(run: impl Into<String>, retries: impl IntoIterator<Item = (String, u32)>) -> Self {
        DriverRun {
            run: run.into(),
            retries: retries
                .into_iter()
                .filter(|(k, n)| *n > 0 && !k.is_empty() && k.len() <= MAX_KIND_BYTES)
                .take(MAX_RETRY_KINDS)
                .collect(),
        }
    }

    /// All its retries.
    pub fn total(&self) -> u32 {
        self.retries
            .values()
            .fold(0u32, |a, n| a.saturating_add(*n))
    }

    /// Its retries in words: "refresh 2 times, prepare once"; empty when none.
    pub fn describe(&self) -> String {
        self.retries
            .iter()
            .map(|(k, n)| match n {
                1 => format!("{k} once"),
                n => format!("{k} {n} times"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A drain rung beyond `evict` used on the node (`config::drain`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RungUse {
    /// The rung.
    pub rung: crate::config::RungKind,
    /// The drain rule that called for it.
    pub rule: String,
    /// The version the node was drained for.
    pub version: Version,
    /// The attempt it was used in.
    pub attempt: u32,
    /// What it did, in a line (bounded by [`MAX_MESSAGE`]).
    pub detail: String,
}

/// The most entries [`NodeRecord::drain_rungs`] keeps (the oldest go first).
pub const MAX_DRAIN_RUNGS: usize = 16;

/// Rollbacks started from one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rollbacks {
    /// The version rolled back from.
    pub version: Version,
    /// How many were started.
    pub started: u32,
}

/// The driver run a record started: the one link from record to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunLink {
    /// Its Job's name ([`run_name`]).
    pub name: String,
    /// Its Job's uid, recorded by the first record write after it was seen:
    /// a Job of that name with another uid is not this run.
    pub uid: Option<String>,
    /// What it does.
    pub action: RunAction,
    /// The version it installs (a prepare: downloads).
    pub version: Version,
    /// The attempt it belongs to.
    pub attempt: u32,
    /// drover deleted it (a timeout, a new pin while it prepared): never
    /// started again, and the node is not uncordoned before its pods are gone.
    pub stopped: bool,
}

/// What a person asked of a record, with the annotations of
/// [`PERSON_ANNOTATIONS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Requests {
    /// [`ANN_RETRY`] is set.
    pub retry: bool,
    /// [`ANN_CLEAR_ROLLED_BACK`] is set.
    pub clear_rolled_back: bool,
}

/// A record as it is stored, and what a write to it builds on: the
/// object's version (a write is conditional on it), its generation and
/// conditions (the next write's `observedGeneration` and transition
/// times), and what a person asked of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stored {
    /// The record.
    pub record: NodeRecord,
    /// The object's `resourceVersion`.
    pub resource_version: String,
    /// The object's `metadata.generation`.
    pub generation: i64,
    /// Its conditions as stored.
    pub conditions: Vec<Condition>,
    /// The annotations of [`PERSON_ANNOTATIONS`] set on it.
    pub requests: Requests,
}

/// One write of a node's record: the whole record, in one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordWrite {
    /// What to record.
    pub record: NodeRecord,
    /// The stored record it replaces, at the version it was read
    /// (`None`: there is none, the record is created).
    pub base: Option<Stored>,
    /// The person's requests this write acts on: their annotations go.
    pub consume: Requests,
    /// When it is written (the conditions' transition times).
    pub at: chrono::DateTime<chrono::Utc>,
}

impl RecordWrite {
    /// The generation the write makes: every write changes the record
    /// (it has no status subresource), so the next one, or 1 on creation.
    pub fn generation(&self) -> i64 {
        self.base
            .as_ref()
            .map_or(1, |b| b.generation.saturating_add(1))
    }

    /// The stored status this write makes.
    pub fn status(&self) -> wire::DroverNodeStatus {
        let previous = self.base.as_ref().map_or(&[][..], |b| &b.conditions[..]);
        wire::encode(&self.record, self.generation(), previous, self.at)
    }
}

/// A record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A field the record's phase needs is missing.
    #[error("field {0} is missing")]
    Missing(&'static str),
    /// A field's value is not valid.
    #[error("field {field} has invalid value {value:?}: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The value found.
        value: String,
        /// What would be valid.
        why: String,
    },
}

impl NodeRecord {
    /// A new, idle record of `node` with id `id`.
    pub fn new(node: impl Into<String>, id: impl Into<String>) -> Self {
        NodeRecord {
            node: node.into(),
            id: id.into(),
            progress: None,
            attempt: 0,
            run: None,
            rolled_back: Vec::new(),
            rollbacks: Vec::new(),
            drain_rungs: Vec::new(),
            driver_runs: Vec::new(),
            consent: None,
        }
    }

    /// The record with `hold` as the consent holding the node (`None`:
    /// none holds it).
    pub fn with_consent(&self, hold: Option<ConsentHold>) -> NodeRecord {
        NodeRecord {
            consent: hold,
            ..self.clone()
        }
    }

    /// Whether the record holds `rung` used in its current attempt toward `version`.
    pub fn used_rung(&self, rung: crate::config::RungKind, version: &Version) -> Option<&RungUse> {
        self.drain_rungs
            .iter()
            .find(|u| u.rung == rung && u.attempt == self.attempt && u.version == *version)
    }

    /// The record with `uses` added (one entry per rung, version and
    /// attempt: a rung used again is not written again), the oldest
    /// dropped past [`MAX_DRAIN_RUNGS`]; `None` when it holds them all.
    pub fn with_rungs(&self, uses: &[RungUse]) -> Option<NodeRecord> {
        let mut r = self.clone();
        for u in uses {
            let known = r
                .drain_rungs
                .iter()
                .any(|k| k.rung == u.rung && k.version == u.version && k.attempt == u.attempt);
            if !known {
                let mut u = u.clone();
                cut(&mut u.detail);
                r.drain_rungs.push(u);
            }
        }
        let skip = r.drain_rungs.len().saturating_sub(MAX_DRAIN_RUNGS);
        r.drain_rungs.drain(..skip);
        (r.drain_rungs != self.drain_rungs).then_some(r)
    }

    /// The record after drover starts `progress` (a prepare, a cordon, a
    /// rollback): a new attempt unless `progress` drains a node whose
    /// prepare of this attempt succeeded (staged), and its run planned.
    pub fn start(&self, progress: NodeProgress) -> NodeRecord {
        let staged = matches!(&self.progress, Some(p) if p.state == ProgressState::Preparing)
            && progress.state == ProgressState::Draining;
        let attempt = if staged {
            self.attempt.max(1)
        } else {
            self.attempt.saturating_add(1)
        };
        let mut rollbacks = self.rollbacks.clone();
        if progress.state == ProgressState::RollingBack {
            add_rollback(&mut rollbacks, &progress.target);
        }
        let run = Some(self.plan(&progress, attempt));
        // A new attempt's runs start with no retries; a staged drain keeps
        // its prepare's.
        let driver_runs = if attempt == self.attempt {
            self.driver_runs.clone()
        } else {
            Vec::new()
        };
        NodeRecord {
            progress: Some(bounded(progress)),
            attempt,
            run,
            rollbacks,
            driver_runs,
            // A node that starts is no longer held.
            consent: None,
            ..self.clone()
        }
    }

    /// The record with what driver run `said.run` said when it ended
    /// (replacing what it said before; the oldest runs go first past
    /// [`MAX_DRIVER_RUNS`]).
    pub fn driver_said(&self, said: &DriverRun) -> NodeRecord {
        let mut r = self.clone();
        r.driver_runs.retain(|d| d.run != said.run);
        r.driver_runs.push(said.clone());
        let skip = r.driver_runs.len().saturating_sub(MAX_DRIVER_RUNS);
        r.driver_runs.drain(..skip);
        r
    }

    /// Whether the record holds what run `name` said.
    pub fn heard_from(&self, name: &str) -> bool {
        self.driver_runs.iter().any(|d| d.run == name)
    }

    /// The retries the driver runs of the current attempt made, all kinds.
    pub fn driver_retries(&self) -> u32 {
        self.driver_runs
            .iter()
            .fold(0u32, |a, d| a.saturating_add(d.total()))
    }

    /// The run `progress` starts in `attempt`, planned: named, not yet made.
    fn plan(&self, progress: &NodeProgress, attempt: u32) -> RunLink {
        let action = progress.run_action();
        RunLink {
            name: run_name(&self.node, &self.id, attempt, action),
            uid: None,
            action,
            version: progress.run_version().clone(),
            attempt,
            stopped: false,
        }
    }

    /// The record with `progress` (a step or a give-back) and its run as it
    /// is; `None` = idle.
    pub fn with_progress(&self, progress: Option<NodeProgress>) -> NodeRecord {
        NodeRecord {
            progress: progress.map(bounded),
            ..self.clone()
        }
    }

    /// The record whose run is planned for `progress` when it does not link
    /// that run yet: the run of the current attempt with `progress`'s
    /// action and version (a guard: every write that starts a state with a
    /// run plans it already).
    pub fn planned_for(&self, progress: &NodeProgress) -> NodeRecord {
        let mut r = self.with_progress(Some(progress.clone()));
        if !self.links_run_of(progress) {
            r.run = Some(self.plan(progress, self.attempt.max(1)));
            r.attempt = self.attempt.max(1);
        }
        r
    }

    /// Whether the record's run is the one `progress` starts (its action
    /// and version), not stopped.
    pub fn links_run_of(&self, progress: &NodeProgress) -> bool {
        self.run.as_ref().is_some_and(|r| {
            !r.stopped && r.action == progress.run_action() && r.version == *progress.run_version()
        })
    }

    /// The record of a draining node moved to `target` before its run
    /// started (a new pin): the same attempt, drain and cordon, its
    /// planned run installing `target`.
    pub fn retarget(&self, target: &Version) -> NodeRecord {
        let mut r = self.clone();
        if let Some(p) = r.progress.as_mut() {
            p.target = target.clone();
        }
        if let Some(run) = r.run.as_mut() {
            run.version = target.clone();
        }
        r
    }

    /// The record whose run is stopped (drover deletes it).
    pub fn stopping(&self) -> NodeRecord {
        let mut r = self.clone();
        if let Some(run) = r.run.as_mut() {
            run.stopped = true;
        }
        r
    }

    /// The record with `uid` as its run's, once seen.
    pub fn run_seen(&self, uid: Option<&str>) -> NodeRecord {
        let mut r = self.clone();
        if let (Some(run), Some(uid)) = (r.run.as_mut(), uid) {
            if run.uid.is_none() {
                run.uid = Some(uid.to_string());
            }
        }
        r
    }

    /// The record marked rolled back from every version of `versions`
    /// (at most [`MAX_ROLLED_BACK`], the newest kept).
    pub fn with_rolled_back(&self, versions: &[Version]) -> NodeRecord {
        let skip = versions.len().saturating_sub(MAX_ROLLED_BACK);
        NodeRecord {
            rolled_back: versions[skip..].to_vec(),
            ..self.clone()
        }
    }

    /// Rollbacks started on this node from `version`.
    pub fn rollbacks_from(&self, version: &Version) -> u32 {
        self.rollbacks
            .iter()
            .filter(|r| r.version == *version)
            .map(|r| r.started)
            .sum()
    }
}

fn add_rollback(rollbacks: &mut Vec<Rollbacks>, version: &Version) {
    match rollbacks.iter_mut().find(|r| r.version == *version) {
        Some(r) => r.started = r.started.saturating_add(1),
        None => {
            rollbacks.push(Rollbacks {
                version: version.clone(),
                started: 1,
            });
            // Bounded like the marks: the oldest versions go first.
            let skip = rollbacks.len().saturating_sub(MAX_ROLLED_BACK);
            rollbacks.drain(..skip);
        }
    }
}

/// `p` as a record stores it: its message within [`MAX_MESSAGE`] bytes,
/// and `upgrading` as `draining` (a draining record whose run exists is
/// read as upgrading, `cluster::effective`; it is never written).
fn bounded(mut p: NodeProgress) -> NodeProgress {
    if p.state == ProgressState::Upgrading {
        p.state = ProgressState::Draining;
    }
    cut(&mut p.message);
    p
}

/// `s` within [`MAX_MESSAGE`] bytes, cut at a character boundary.
fn cut(s: &mut String) {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// The name of the driver run (its Job) of `node`'s record `id`, attempt
/// `attempt`, action `action`: a DNS label of at most 63 characters,
/// `drover-<node>-<action>-<attempt>-<hash>`, the same for the same
/// inputs, so a repeated start meets the run it made (409), never makes a
/// second one.
pub fn run_name(node: &str, id: &str, attempt: u32, action: RunAction) -> String {
    let mut h = Sha256::new();
    for part in [node, id, action.as_str()] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(attempt.to_be_bytes());
    let hash = &hex::encode(h.finalize())[..8];
    let tail = format!("-{}-{attempt}-{hash}", action.as_str());
    let node_max = 63 - "drover-".len() - tail.len();
    let mut part: String = node
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    part.truncate(node_max);
    format!("drover-{}{tail}", part.trim_matches('-'))
}

/// The driver's `DROVER_ATTEMPT` for record `id`'s attempt `attempt`: a
/// number (at most 20 digits, what the Bottlerocket admission policy
/// admits) the same for the same attempt and no other, which the driver
/// remembers on the host for the attempt it rebooted for.
pub fn driver_attempt(id: &str, attempt: u32) -> String {
    let mut h = Sha256::new();
    h.update(id.as_bytes());
    h.update([0]);
    h.update(attempt.to_be_bytes());
    let d = h.finalize();
    let mut n = [0u8; 8];
    n.copy_from_slice(&d[..8]);
    // 63 bits: at most 19 digits.
    (u64::from_be_bytes(n) >> 1).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};

    fn t(s: &str) -> DateTime<Utc> {
        format!("2026-12-08T02:{s}Z").parse().unwrap()
    }

    fn progress(state: ProgressState) -> NodeProgress {
        NodeProgress {
            state,
            target: Version::new(1, 13, 0),
            started_at: t("00:00"),
            cordoned_by_drover: state.in_flight(),
            message: String::new(),
            retries: 0,
            previous: Some(Version::new(1, 12, 0)),
        }
    }

    #[test]
    fn run_names_are_dns_labels_per_record_attempt_and_action() {
        let long = "ip-10-0-0-1.eu-west-1.compute.internal.with-a-very-long-suffix-indeed";
        let a = run_name(long, "0011aabb", 3, RunAction::Upgrade);
        assert!(a.len() <= 63, "{a} is {} long", a.len());
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a}"
        );
        assert!(a.starts_with("drover-ip-10-0-0-1"), "{a}");
        assert!(a.contains("-upgrade-3-"), "{a}");
        assert_eq!(a, run_name(long, "0011aabb", 3, RunAction::Upgrade));
        assert_ne!(a, run_name(long, "0011aabb", 4, RunAction::Upgrade));
        assert_ne!(a, run_name(long, "0011aabb", 3, RunAction::Prepare));
        assert_ne!(a, run_name(long, "ffff0000", 3, RunAction::Upgrade));
    }

    #[test]
    fn the_drivers_attempt_is_a_number_per_record_and_attempt() {
        let a = driver_attempt("0011", 3);
        assert!(
            a.len() <= 20 && a.chars().all(|c| c.is_ascii_digit()),
            "{a}"
        );
        assert_eq!(a, driver_attempt("0011", 3));
        assert_ne!(a, driver_attempt("0011", 4));
        assert_ne!(a, driver_attempt("0012", 3));
    }

    #[test]
    fn a_start_begins_an_attempt_and_plans_its_run_a_staged_drain_keeps_it() {
        let r = NodeRecord::new("a-1", "id1");
        let prep = r.start(progress(ProgressState::Preparing));
        assert_eq!(prep.attempt, 1);
        let run = prep.run.clone().unwrap();
        assert_eq!(
            (run.action, run.attempt, run.uid.is_none(), run.stopped),
            (RunAction::Prepare, 1, true, false)
        );
        assert_eq!(run.name, run_name("a-1", "id1", 1, RunAction::Prepare));
        // Staged, then cordoned: the same attempt, its upgrade run planned.
        let drain = prep.start(progress(ProgressState::Draining));
        assert_eq!(drain.attempt, 1);
        assert_eq!(drain.run.as_ref().unwrap().action, RunAction::Upgrade);
        // A drain from idle (no prepare) is a new attempt.
        let idle = drain.with_progress(None);
        assert_eq!(idle.start(progress(ProgressState::Draining)).attempt, 2);
        // A rollback: a new attempt, counted, its run installs `previous`.
        let back = drain.start(progress(ProgressState::RollingBack));
        assert_eq!(back.attempt, 2);
        let run = back.run.clone().unwrap();
        assert_eq!(
            (run.action, run.version),
            (RunAction::Rollback, Version::new(1, 12, 0))
        );
        assert_eq!(back.rollbacks_from(&Version::new(1, 13, 0)), 1);
    }

    #[test]
    fn driver_retries_belong_to_the_attempt_a_staged_drain_keeps_the_prepares() {
        let prep = NodeRecord::new("a", "i").start(progress(ProgressState::Preparing));
        let said = DriverRun::new(
            prep.run.as_ref().unwrap().name.clone(),
            [("refresh".to_string(), 2), ("commit".to_string(), 0)],
        );
        let prep = prep.driver_said(&said).driver_said(&said);
        assert_eq!((prep.driver_runs.len(), prep.driver_retries()), (1, 2));
        assert_eq!(said.describe(), "refresh 2 times");
        let drain = prep.start(progress(ProgressState::Draining));
        assert_eq!(drain.driver_retries(), 2, "the staged drain keeps them");
        let upgrade = DriverRun::new(
            drain.run.as_ref().unwrap().name.clone(),
            [("prepare".to_string(), 1)],
        );
        let done = drain.driver_said(&upgrade).with_progress(None);
        assert_eq!(done.driver_retries(), 3, "kept once given back");
        let again = done.start(progress(ProgressState::Draining));
        assert!(again.driver_runs.is_empty(), "a new attempt starts afresh");
        let many = (0..10).fold(done, |r, i| {
            r.driver_said(&DriverRun::new(format!("r{i}"), []))
        });
        assert_eq!(many.driver_runs.len(), MAX_DRIVER_RUNS);
        let long = DriverRun::new("r", (0..20).map(|i| (format!("k{i}"), 1)));
        assert_eq!(long.retries.len(), MAX_RETRY_KINDS);
    }

    #[test]
    fn a_retarget_keeps_the_attempt_and_its_run_installs_the_new_pin() {
        let drain = NodeRecord::new("a", "i").start(progress(ProgressState::Draining));
        let moved = drain.retarget(&Version::new(1, 13, 1));
        assert_eq!(moved.attempt, drain.attempt);
        let (a, b) = (drain.run.unwrap(), moved.run.clone().unwrap());
        assert_eq!(a.name, b.name);
        assert_eq!(b.version, Version::new(1, 13, 1));
        assert_eq!(
            moved.progress.unwrap().target,
            Version::new(1, 13, 1),
            "the record moves with its run"
        );
    }

    #[test]
    fn upgrading_is_stored_as_the_draining_record_whose_run_exists() {
        let r = NodeRecord::new("a", "i").start(progress(ProgressState::Draining));
        let noted = r.with_progress(Some(progress(ProgressState::Upgrading)));
        assert_eq!(noted.progress.unwrap().state, ProgressState::Draining);
        assert_eq!(noted.run, r.run);
    }

    #[test]
    fn messages_and_marks_are_bounded() {
        let mut p = progress(ProgressState::Failed);
        p.message = "é".repeat(MAX_MESSAGE);
        let r = NodeRecord::new("a", "i").with_progress(Some(p));
        let m = &r.progress.unwrap().message;
        assert!(m.len() <= MAX_MESSAGE && m.chars().all(|c| c == 'é'));
        let many: Vec<Version> = (0..40).map(|i| Version::new(1, i, 0)).collect();
        let r = NodeRecord::new("a", "i").with_rolled_back(&many);
        assert_eq!(r.rolled_back.len(), MAX_ROLLED_BACK);
        assert_eq!(r.rolled_back.last(), many.last());
    }
}
