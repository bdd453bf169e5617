//! Kubernetes Events (events.k8s.io/v1) for every refusal and change of
//! state: on the nodes for what drover did to them (the outcome of each
//! node's upgrade and every warning; the routine steps before the outcome
//! are logged only, see [`Events::on_action`]), and on the status object for
//! the rollout and the config. Publishing is best effort and never holds
//! the control loop: an Event is logged at once and queued (at most
//! [`QUEUE`] waiting; past that it is dropped and counted in
//! `drover_events_dropped_total`), and a publisher task of the leadership
//! term sends the queue in order, each call bounded by the term's write
//! bound and without retry (a refused or throttled Event is logged once a
//! minute and counted in `drover_event_failures_total`). The publisher stops
//! with its term: nothing is published after leadership is lost, and what
//! was still queued is dropped with it.
//!
//! A repeat of an Event (same object, type, reason, action and note) within
//! [`SERIES_WINDOW`] is counted into the first one's `series` with a patch
//! rather than created again, as client-go's recorder does. The same Event
//! with other words (`Applied` for another commit) is a new Event, which
//! takes the first one's place for later repeats: the API server keeps an
//! Event's note as it was created, so counting it into the first one would
//! show the first words under the newest count. What that
//! needs is kept in [`SeriesCache`]: the Event's name and a count per key,
//! at most [`SERIES_CAPACITY`] of them. (kube's `Recorder` kept a full
//! copy of every Event it published for its window, about 5 per node during
//! a rollout: megabytes with 1,000 nodes, see BENCHMARKS.md "Agent under load".)
//!
//! Why not kube-rs's runtime (`kube::runtime::events::Recorder`): its
//! `publish` is awaited by the caller, on a client whose retry layer turns a
//! throttled Event into minutes, and it keeps every Event of its window.
//! drover needs the caller never to wait and the memory bounded, so the
//! queue, the publisher loop and the series cache are its own.

use crate::rollout::Action;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// `reportingController` of drover's Events.
const CONTROLLER: &str = "drover.dev/agent";
/// How long a published Event takes repeats into its series (client-go's window).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Most Events remembered for series counting; past it the least recently
/// seen one is forgotten (its next repeat starts a new Event).
pub const SERIES_CAPACITY: usize = 512;
/// Most Events waiting for the publisher: a rollout step makes a few, an
/// API server that throttles every Event for minutes drops the excess.
pub const QUEUE: usize = 256;

/// Publishes the agent's Events; without a client (simulations), or between
/// leadership terms, it only logs.
#[derive(Clone)]
pub struct Events {
    client: Option<Client>,
    /// `reportingInstance`: the pod name.
    instance: Arc<str>,
    series: Arc<Mutex<SeriesCache>>,
    status_ref: ObjectReference,
    /// The running publisher's queue.
    queue: Option<mpsc::Sender<Queued>>,
    /// Failed publications are logged once a minute (an API outage fails them all).
    failures: Arc<crate::retry::Paced>,
    counters: Counters,
    /// CloudEvents notifications of what is published (`notify.rs`).
    notifier: Option<super::notify::Notifier>,
}

/// Where dropped and failed Events are counted (`drover_events_dropped_total`,
/// `drover_event_failures_total`).
#[derive(Clone, Default)]
pub struct Counters {
    /// Events dropped because the queue was full.
    pub dropped: Counter,
    /// Events the API server refused or did not answer in time.
    pub failed: Counter,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("status_ref", &self.status_ref)
            .finish()
    }
}

/// What the publisher is handed.
enum Queued {
    Event(Box<Pending>),
    /// Answered once everything queued before it was published or given up.
    Flush(oneshot::Sender<()>),
}

/// One Event to publish.
struct Pending {
    reference: ObjectReference,
    severity: Severity,
    reason: String,
    action: String,
    note: String,
}

/// Severity of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Normal => "Normal",
            Severity::Warning => "Warning",
        }
    }
}

/// One published Event that repeats are counted into.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    namespace: String,
    name: String,
    /// A hash of its note: a repeat with other words is a new Event.
    note: u64,
    /// Occurrences so far (1: the Event alone, no series yet).
    count: i32,
    last: Instant,
}

/// What a publication does: create a new Event, or count a repeat into one.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Publication {
    Create,
    Repeat {
        namespace: String,
        name: String,
        count: i32,
    },
}

/// The Events published within [`SERIES_WINDOW`], by a hash of what makes
/// two Events the same; bounded by [`SERIES_CAPACITY`].
#[derive(Debug, Default)]
pub struct SeriesCache {
    entries: HashMap<u64, Published>,
}

impl SeriesCache {
    /// What to do with an Event of `key` saying `note` (its hash) at `now`:
    /// a repeat of the same words names the Event to patch and its new count.
    fn lookup(&mut self, key: u64, note: u64, now: Instant) -> Publication {
        match self.entries.get(&key) {
            Some(p) if p.note == note && now.saturating_duration_since(p.last) < SERIES_WINDOW => {
                Publication::Repeat {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    count: p.count.saturating_add(1),
                }
            }
            _ => Publication::Create,
        }
    }

    /// Remember a publication of `key` saying `note` (created, or counted to `count`).
    fn record(
        &mut self,
        key: u64,
        note: u64,
        namespace: &str,
        name: &str,
        count: i32,
        now: Instant,
    ) {
        if !self.entries.contains_key(&key) && self.entries.len() >= SERIES_CAPACITY {
            self.entries
                .retain(|_, p| now.saturating_duration_since(p.last) < SERIES_WINDOW);
            if self.entries.len() >= SERIES_CAPACITY {
                let oldest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, p)| p.last)
                    .map(|(k, _)| *k);
                if let Some(k) = oldest {
                    self.entries.remove(&k);
                }
            }
        }
        self.entries.insert(
            key,
            Published {
                namespace: namespace.to_string(),
                name: name.to_string(),
                note,
                count,
                last: now,
            },
        );
    }

    /// Events remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

// What makes two Events the same (client-go's and kube's key, less the
// reporter, which is fixed per process).
fn series_key(reference: &ObjectReference, severity: Severity, reason: &str, action: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (
        &reference.api_version,
        &reference.kind,
        &reference.namespace,
        &reference.name,
        &reference.uid,
    )
        .hash(&mut h);
    (severity.as_str(), reason, action).hash(&mut h);
    h.finish()
}

impl Events {
    /// Events reported by `instance` (the pod name) about the status object
    /// `namespace/name`; they are only logged until [`Events::start`].
    pub fn new(client: Option<Client>, instance: &str, namespace: &str, name: &str) -> Self {
        Events {
            client,
            instance: instance.into(),
            series: Default::default(),
            status_ref: ObjectReference {
                api_version: Some("drover.dev/v1alpha1".into()),
                kind: Some("DroverStatus".into()),
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            queue: None,
            failures: Default::default(),
            counters: Counters::default(),
            notifier: None,
        }
    }

    /// Send what is published to `notifier` too: each Event whose reason
    /// maps to a notification kind makes one (the one place both are made).
    pub fn notify_with(&mut self, notifier: super::notify::Notifier) {
        self.notifier = Some(notifier);
    }

    /// Count dropped and failed Events in `counters` (the agent's metrics).
    pub fn count_in(&mut self, counters: Counters) {
        self.counters = counters;
    }

    /// Set the status object's uid once known, so `kubectl describe` finds the Events.
    pub fn set_status_uid(&mut self, uid: Option<String>) {
        self.status_ref.uid = uid;
    }

    /// Start publishing: a task sends what is queued, in order, each call
    /// given up after `limit`, until `stop` reads true; then it ends and
    /// what is still queued is dropped. Without a client nothing starts.
    pub fn start(
        &mut self,
        stop: watch::Receiver<bool>,
        limit: Duration,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let client = self.client.clone()?;
        let (tx, rx) = mpsc::channel(QUEUE);
        self.queue = Some(tx);
        let publisher = Publisher {
            client,
            instance: self.instance.clone(),
            series: self.series.clone(),
            failures: self.failures.clone(),
            failed: self.counters.failed.clone(),
            limit,
        };
        Some(tokio::spawn(publisher.run(rx, stop)))
    }

    /// Stop queueing for the publisher (its task ends with its term).
    pub fn stop(&mut self) {
        self.queue = None;
    }

    /// Wait until what was queued before this call is published or given up
    /// (for tests; the agent never waits for its Events).
    pub async fn flushed(&self) {
        let Some(q) = &self.queue else { return };
        let (tx, rx) = oneshot::channel();
        if q.send(Queued::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    // Log the Event now and queue it for the publisher; never waits.
    fn publish(
        &self,
        reference: &ObjectReference,
        severity: Severity,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let what = reference.name.as_deref().unwrap_or("");
        match severity {
            Severity::Normal => tracing::info!(object = what, reason, note = %note, "event"),
            Severity::Warning => tracing::warn!(object = what, reason, note = %note, "event"),
        }
        if let Some(n) = &self.notifier {
            n.notify_event(reason, what, &note);
        }
        let Some(queue) = &self.queue else { return };
        let pending = Pending {
            reference: reference.clone(),
            severity,
            reason: reason.to_string(),
            action: action.to_string(),
            // kubectl prints notes as they are: a report message or a health
            // query's label must not carry a terminal's control sequences.
            note: crate::terminal::escape(&note).into_owned(),
        };
        match queue.try_send(Queued::Event(Box::new(pending))) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.counters.dropped.inc();
                if let Some(n) = self.failures.allow("event-queue") {
                    tracing::warn!(
                        reason,
                        suppressed = n,
                        "too many Events waiting for the API server; dropping this one"
                    );
                }
            }
            // The term ended: nothing more is published.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// An Event on the status object.
    pub async fn on_status(&self, severity: Severity, reason: &str, action: &str, note: String) {
        self.publish(&self.status_ref, severity, reason, action, note);
    }

    /// An Event on a node.
    pub async fn on_node(
        &self,
        node: &str,
        severity: Severity,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..Default::default()
        };
        self.publish(&reference, severity, reason, action, note);
    }

    /// The Event for an engine action on a node. A node's routine upgrade
    /// publishes none: its record (`kubectl get drovernodes`) is what
    /// people read, and each Event is an API write (issue 36; before, the
    /// outcome `Upgraded` was the one routine Event). The routine steps,
    /// the download in service (`Preparing`), the cordon and drain
    /// (`Draining`), the upgrade run's start (`UpgradeStarted`) and the
    /// return (`Upgraded`) are logged at info as an Event would be. What
    /// needs a person is published: a drain PodDisruptionBudgets hold back
    /// (`EvictionRefused`), a health watch and its outcome, every Warning
    /// (`DrainBlocked` at its timeout, `UpgradeFailed`, ...), and what a
    /// new pin or a person's request changed (`Retargeted`, `GivenBack`,
    /// `Released`, `Cleared`). Eviction passes are too frequent for either.
    pub async fn on_action(&self, action: &Action) {
        let (sev, reason, note) = match action {
            // Routine steps inside a node's upgrade are logged, not
            // published: see [`Events::on_action`].
            Action::Cordon { progress, .. } => {
                let note = format!("cordoned and draining to move to {}", progress.target);
                return log_only(action.node(), "Draining", &note);
            }
            Action::Prepare { progress, .. } => {
                let note = format!(
                    "downloading {} before the drain; the node stays in service",
                    progress.target
                );
                return log_only(action.node(), "Preparing", &note);
            }
            // Eviction passes are too frequent; a hold's note has its own
            // Event (`NodeHeld`, published with the outcome's holds).
            // A run's state written before its give-back: the give-back's
            // own Event follows.
            // The taint's Event is the DrainRung of the cordon that set it.
            Action::Evict { .. }
            | Action::Note { .. }
            | Action::StopRun { .. }
            | Action::Taint { .. } => return,
            Action::StartUpgrade { progress, .. }
                if progress.run_action() == crate::record::RunAction::Rollback =>
            {
                (
                    Severity::Warning,
                    "RollbackStarted",
                    format!(
                        "drained; OS rollback from {} to {} started",
                        progress.target,
                        progress.run_version()
                    ),
                )
            }
            Action::StartUpgrade { progress, .. }
                if progress.run_action() == crate::record::RunAction::Prepare =>
            {
                let note = format!("downloading {} before the drain", progress.target);
                return log_only(action.node(), "Preparing", &note);
            }
            Action::StartUpgrade { progress, .. } => {
                let note = format!("drained; OS upgrade to {} started", progress.target);
                return log_only(action.node(), "UpgradeStarted", &note);
            }
            Action::Block { progress, .. } => (
                Severity::Warning,
                "DrainBlocked",
                format!("node given back: {}", progress.message),
            ),
            Action::Fail {
                progress,
                stop_run: true,
                ..
            } => (
                Severity::Warning,
                "UpgradeFailed",
                format!(
                    "{}; its run is stopped, the node stays cordoned until nothing of it is left",
                    progress.message
                ),
            ),
            Action::Fail { progress, .. } => (
                Severity::Warning,
                "UpgradeFailed",
                format!("node given back: {}", progress.message),
            ),
            Action::Complete { .. } => {
                let note = "Ready at the target version, its run over; uncordoned";
                return log_only(action.node(), "Upgraded", note);
            }
            Action::Release { .. } => (
                Severity::Normal,
                "Released",
                "nothing of its stopped run is left; uncordoned".to_string(),
            ),
            Action::CordonAgain { .. } => {
                let note = "draining, but schedulable: cordoned again";
                return log_only(action.node(), "Cordoned", note);
            }
            Action::Retarget { progress, .. } => (
                Severity::Normal,
                "Retargeted",
                format!(
                    "a new version is pinned: the drain goes on toward {}",
                    progress.target
                ),
            ),
            Action::GiveBack { reason, .. } => (
                Severity::Normal,
                "GivenBack",
                format!("{reason}; uncordoned, record cleared"),
            ),
            Action::ClearRolledBack { .. } => (
                Severity::Normal,
                "RolledBackCleared",
                "its rolled-back marks were cleared as its record asked".to_string(),
            ),
            Action::Watch { progress, .. } => (
                Severity::Normal,
                "HealthWatch",
                format!(
                    "Ready at {}; uncordoned, its health is watched",
                    progress.target
                ),
            ),
            Action::Pass { progress, .. } => (
                Severity::Normal,
                "HealthPassed",
                format!("every health check held at {}", progress.target),
            ),
            Action::Unhealthy { progress, .. } => (
                Severity::Warning,
                "HealthCheckFailed",
                format!("{}; rollout stopped", progress.message),
            ),
            Action::RollBack { progress, .. } => (
                Severity::Warning,
                "RollingBack",
                format!(
                    "{}; cordoned and draining to roll back to {}",
                    progress.message,
                    progress.run_version()
                ),
            ),
            Action::RolledBack { progress, .. } => (
                Severity::Warning,
                "RolledBack",
                format!(
                    "{}; healthy again, uncordoned, never moved to {} again",
                    progress.message, progress.target
                ),
            ),
            Action::RollbackFailed { progress, .. } => (
                Severity::Warning,
                "RollbackFailed",
                progress.message.clone(),
            ),
            Action::Clear { reason, .. } => (
                Severity::Normal,
                "Cleared",
                format!("drover's record of the node was cleared: {reason}"),
            ),
            // Past the limit, once per hold: what a person must look at.
            Action::Consent { hold: Some(h), .. } if h.overdue => (
                Severity::Warning,
                "ConsentOverdue",
                super::consent::overdue_note(h.since),
            ),
            // A hold beginning or ending is the workload's routine.
            Action::Consent { hold, .. } => {
                let note = super::consent::routine_note(hold.is_some());
                return log_only(action.node(), "Consent", note);
            }
        };
        self.on_node(action.node(), sev, reason, action.kind(), note)
            .await;
    }
}

// A routine step of a node's upgrade: logged as its Event would be, at
// info, and not published (see `Events::on_action`).
fn log_only(node: &str, reason: &str, note: &str) {
    tracing::info!(object = node, reason, note = %note, "event (logged, not published)");
}

/// The publisher task of one leadership term.
struct Publisher {
    client: Client,
    instance: Arc<str>,
    series: Arc<Mutex<SeriesCache>>,
    failures: Arc<crate::retry::Paced>,
    failed: Counter,
    limit: Duration,
}

impl Publisher {
    async fn run(self, mut queue: mpsc::Receiver<Queued>, mut stop: watch::Receiver<bool>) {
        loop {
            let next = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                q = queue.recv() => q,
            };
            let pending = match next {
                None => return,
                Some(Queued::Flush(done)) => {
                    let _ = done.send(());
                    continue;
                }
                Some(Queued::Event(p)) => *p,
            };
            // An Event in flight when the term ends is given up with it.
            let outcome = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                r = tokio::time::timeout(self.limit, self.send(&pending)) => r,
            };
            let error = match outcome {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {:?}", self.limit),
            };
            self.failed.inc();
            if let Some(n) = self.failures.allow("event") {
                tracing::warn!(error = %error, reason = %pending.reason, suppressed = n, "could not publish an Event");
            }
        }
    }

    // Create the Event, or count it into the series of an earlier one.
    async fn send(&self, p: &Pending) -> Result<(), kube::Error> {
        // The API caps notes at 1 kB.
        let mut note = p.note.clone();
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let key = series_key(&p.reference, p.severity, &p.reason, &p.action);
        let said = note_key(&note);
        let publication = lock(&self.series).lookup(key, said, Instant::now());
        let (namespace, name, count) = match publication {
            Publication::Repeat {
                namespace,
                name,
                count,
            } => match self.repeat(&namespace, &name, count).await {
                Ok(()) => (namespace, name, count),
                // The Event expired on the server (or was deleted): a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => self.create(p, note).await?,
                Err(e) => return Err(e),
            },
            Publication::Create => self.create(p, note).await?,
        };
        lock(&self.series).record(key, said, &namespace, &name, count, Instant::now());
        Ok(())
    }

    // Create a new Event; returns its namespace, name and count (1).
    async fn create(
        &self,
        p: &Pending,
        note: String,
    ) -> Result<(String, String, i32), kube::Error> {
        let now = Timestamp::now();
        // Node Events go to `default`, as kubectl describe looks for them there.
        let namespace = p.reference.namespace.as_deref().unwrap_or("default");
        let name = format!(
            "{}.{:x}",
            p.reference.name.as_deref().unwrap_or("drover"),
            now.as_nanosecond()
        );
        let event = K8sEvent {
            action: Some(p.action.clone()),
            reason: Some(p.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(p.reference.clone()),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.clone()),
                ..Default::default()
            },
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(self.instance.to_string()),
            type_: Some(p.severity.as_str().into()),
            ..Default::default()
        };
        Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &event)
            .await?;
        Ok((namespace.to_string(), name, 1))
    }

    // Count a repeat into the published Event `namespace/name`.
    async fn repeat(&self, namespace: &str, name: &str, count: i32) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "series": EventSeries {
                count,
                last_observed_time: MicroTime(Timestamp::now()),
            }
        });
        Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

fn note_key(note: &str) -> u64 {
    let mut h = DefaultHasher::new();
    note.hash(&mut h);
    h.finish()
}

fn lock(m: &Mutex<SeriesCache>) -> std::sync::MutexGuard<'_, SeriesCache> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_repeat_within_the_window_counts_into_the_first_event() {
        let mut c = SeriesCache::default();
        let t0 = Instant::now();
        let k = series_key(&node("a"), Severity::Warning, "DrainBlocked", "Block");
        assert_eq!(c.lookup(k, 7, t0), Publication::Create);
        c.record(k, 7, "default", "a.1", 1, t0);
        let t1 = t0 + Duration::from_secs(60);
        assert_eq!(
            c.lookup(k, 7, t1),
            Publication::Repeat {
                namespace: "default".into(),
                name: "a.1".into(),
                count: 2
            }
        );
        c.record(k, 7, "default", "a.1", 2, t1);
        // The window runs from the last repeat, as a series stays alive while it repeats.
        let t2 = t1 + SERIES_WINDOW - Duration::from_secs(1);
        assert!(matches!(
            c.lookup(k, 7, t2),
            Publication::Repeat { count: 3, .. }
        ));
        assert_eq!(c.lookup(k, 7, t1 + SERIES_WINDOW), Publication::Create);
        // Other words are a new Event, which later repeats count into.
        assert_eq!(c.lookup(k, 8, t2), Publication::Create);
        c.record(k, 8, "default", "a.2", 1, t2);
        assert!(matches!(
            c.lookup(k, 8, t2),
            Publication::Repeat { count: 2, ref name, .. } if name == "a.2"
        ));
        assert_eq!(c.lookup(k, 7, t2), Publication::Create);
    }

    #[test]
    fn events_differing_in_object_reason_type_or_action_are_not_one_series() {
        let base = series_key(&node("a"), Severity::Normal, "Draining", "Cordon");
        let others = [
            series_key(&node("b"), Severity::Normal, "Draining", "Cordon"),
            series_key(&node("a"), Severity::Warning, "Draining", "Cordon"),
            series_key(&node("a"), Severity::Normal, "Upgraded", "Cordon"),
            series_key(&node("a"), Severity::Normal, "Draining", "Complete"),
            series_key(
                &ObjectReference {
                    uid: Some("u".into()),
                    ..node("a")
                },
                Severity::Normal,
                "Draining",
                "Cordon",
            ),
        ];
        for o in others {
            assert_ne!(base, o);
        }
        // Control: the same Event is the same series.
        assert_eq!(
            base,
            series_key(&node("a"), Severity::Normal, "Draining", "Cordon")
        );
    }

    #[test]
    fn the_cache_stays_bounded_and_forgets_the_least_recently_seen() {
        let mut c = SeriesCache::default();
        let t0 = Instant::now();
        // A rollout's worth of distinct Events, far more than the capacity.
        for i in 0..5_000u64 {
            c.record(
                i,
                0,
                "default",
                &format!("n{i}.1"),
                1,
                t0 + Duration::from_millis(i),
            );
            assert!(c.len() <= SERIES_CAPACITY);
        }
        assert_eq!(c.len(), SERIES_CAPACITY);
        let now = t0 + Duration::from_secs(5);
        // The oldest were forgotten, the newest are kept.
        assert_eq!(c.lookup(0, 0, now), Publication::Create);
        assert!(matches!(
            c.lookup(4_999, 0, now),
            Publication::Repeat { .. }
        ));
        // Expired entries make room before a live one is dropped.
        let later = t0 + SERIES_WINDOW + Duration::from_secs(10);
        c.record(9_999, 0, "default", "x.1", 1, later);
        assert_eq!(c.len(), 1);
    }
}
