//! The `DroverStatus` custom resource: the agent's state readable with
//! `kubectl get dst`, and the durable home of the last applied commit (the
//! git cache is an emptyDir and memory does not survive a restart).
//!
//! Its status has one writer per leadership term, [`StatusWriter`]: a task
//! that takes the newest status the term wants (a newer one replaces a
//! waiting one: the status is a whole, not a log) and writes it off the
//! control loop. Every write carries the `resourceVersion` it was computed
//! against, so a write never overwrites a status it did not see: when the
//! object changed only in its metadata (a follower's fetch request, a
//! person's annotation) the write is made again on the new version; when
//! another replica wrote the status, nothing is written and the term
//! reloads from what that replica left.

pub use crate::record::Condition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Field manager of every write the agent makes to its status object.
pub const FIELD_MANAGER: &str = "drover-agent";

/// Annotation a follower sets on the status object when a webhook reached
/// it, so that the leader (which watches the object) fetches at once.
pub const ANN_FETCH_REQUESTED: &str = "drover.dev/fetch-requested";

/// The last fetch request a follower stamped on the status object, if any.
pub fn fetch_request_stamp(o: &DroverStatus) -> Option<String> {
    o.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_FETCH_REQUESTED).cloned())
}

// Printer columns are raw JSON: the list form trips clippy::duplicated_attributes
// on the repeated `type_ = "string"`.
/// Desired identity of a status object: which environment and cluster it describes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "drover.dev",
    version = "v1alpha1",
    kind = "DroverStatus",
    namespaced,
    shortname = "dst",
    status = "DroverStatusStatus",
    doc = "The drover agent's view of one cluster of one environment: target, rollout state, window, applied commit.",
    printcolumn = r#"{"name":"Environment","type":"string","jsonPath":".spec.environment"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".status.target"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Blocker","type":"string","jsonPath":".status.blocker"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"At Version","type":"string","jsonPath":".status.atVersion"}"#,
    printcolumn = r#"{"name":"Up-to-date","type":"integer","priority":1,"jsonPath":".status.upToDateNodes"}"#,
    printcolumn = r#"{"name":"In Flight","type":"integer","priority":1,"jsonPath":".status.inFlightNodes"}"#,
    printcolumn = r#"{"name":"Next Window","type":"string","jsonPath":".status.nextWindow"}"#,
    printcolumn = r#"{"name":"Commit","type":"string","jsonPath":".status.commit"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DroverStatusSpec {
    /// Environment the agent serves (`--env`).
    pub environment: String,
    /// Cluster name the agent reports as (`--cluster`).
    pub cluster: String,
}

/// What the agent last observed and did; written only through the status subresource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DroverStatusStatus {
    /// The pinned version being applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Rollout state: pending, paused, rolling, settling, confirmed, blocked,
    /// failed, refused or halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Why the cluster is not progressing, one word of a closed list
    /// (docs/status.md, "Blockers"); absent while it rolls, settles or is
    /// confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocker: Option<String>,
    /// How many selected nodes each blocker holds.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub blocked_nodes: std::collections::BTreeMap<String, u32>,
    /// When `state` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Nodes workload consent (`drover.dev/upgrade=paused`) has held past
    /// the environment's `consent_limit`, by name (at most 32): reported,
    /// never forced; their blocker stays `consent`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consent_overdue: Vec<super::consent::ConsentOverdueStatus>,
    /// The last preflight the agent ran before a window opened: what
    /// would keep a drain from finishing on the selected nodes, as `drover
    /// plan --preflight` lists it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<super::preflight::PreflightStatus>,
    /// Selected nodes Ready at the target over selected nodes, e.g. "4/6".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_version: Option<String>,
    /// Selected nodes.
    #[serde(default)]
    pub nodes: u32,
    /// Selected nodes Ready at the target.
    #[serde(default)]
    pub nodes_at_version: u32,
    /// Selected nodes whose OS runs the target (Ready or not), as a
    /// Deployment's `updatedReplicas`: `kubectl wait
    /// --for=jsonpath='{.status.upToDateNodes}'=6`.
    #[serde(default)]
    pub up_to_date_nodes: u32,
    /// Selected nodes whose Ready condition is True, at any version.
    #[serde(default)]
    pub ready_nodes: u32,
    /// Selected nodes drover has out of service now (cordoned and draining,
    /// upgrading, rolling back).
    #[serde(default)]
    pub in_flight_nodes: u32,
    /// The status-branch commit of the last signed status report this
    /// agent pushed: the evidence a later environment's gate reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_report_commit: Option<String>,
    /// "open until <time>" while a window is open, else the next opening (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<String>,
    /// Whether a maintenance window is open.
    #[serde(default)]
    pub window_open: bool,
    /// Short id of the last applied commit, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Full id of the last applied (trusted, valid, gate-passed) config commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_commit: Option<String>,
    /// The version the last applied commit pins: the gate's `previous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_version: Option<String>,
    /// The newest fetched head of the config branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_commit: Option<String>,
    /// Why the newest head is not applied, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refused>,
    /// Why the environment's status evidence is held, if it is: no node
    /// starts for the target while it is (docs/design.md §4a).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_held: Option<String>,
    /// The clusters whose standing failures halt the environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub halted_by: Vec<String>,
    /// Trusted failures of the environment's other clusters for the target
    /// that this agent has seen (at most 32), kept so that a branch that is
    /// rewritten or turns untrusted cannot make it forget them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures_seen: Vec<SeenFailure>,
    /// Why the state is what it is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the last fetch finished (RFC 3339) and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fetch: Option<FetchRecord>,
    /// Pod name of the replica that wrote this status (the leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporter: Option<String>,
    /// `DroverNode` once the agent keeps its node records in `DroverNode`
    /// objects and migrated the annotation records of earlier releases
    /// (once; absent before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_records: Option<String>,
    /// The `metadata.generation` this status was written for (kstatus: a
    /// status for an older generation is not yet reconciled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    // Ready, Reconciling and Stalled are computed by
    // `super::conditions::conditions` alone.
    /// `Ready`, `Reconciling` and `Stalled`, as kstatus, Flux and Argo CD
    /// read them (docs/install.md, "Health checks"), and `ReportPushed`
    /// (False while the git server refuses or cannot take the status report).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::record::conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// A config head the agent refused to apply.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    /// The refused commit.
    pub commit: String,
    /// Which check refused it: trust, config or gate.
    pub stage: String,
    /// Machine-readable reason (`unsigned`, `invalid`, `not_confirmed`, ...).
    pub reason: String,
    /// Human-readable explanation.
    pub message: String,
}

/// A trusted `failed` report of another cluster, as the agent saw it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeenFailure {
    /// The failed cluster.
    pub cluster: String,
    /// The version it failed.
    pub version: String,
    /// The report's time (RFC 3339).
    pub at: String,
    /// What failed, as the report says (cut at 256 bytes).
    pub message: String,
}

/// The outcome of one fetch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FetchRecord {
    /// When it finished (RFC 3339).
    pub time: String,
    /// `ok` or the error.
    pub result: String,
}

/// The CRD as the API server takes it.
pub fn crd(
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    DroverStatus::crd()
}

/// The CRD rendered as `deploy/base/crd.yaml` holds it: pretty JSON (valid YAML), newline-terminated.
pub fn crd_manifest() -> String {
    // Serialising a typed CRD cannot fail; fall back to an empty document rather than panic.
    let mut s = serde_json::to_string_pretty(&crd()).unwrap_or_default();
    s.push('\n');
    s
}

/// Errors reading or writing the status object.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or could not be reached.
    #[error("status object {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Every write met a newer version of the object.
    #[error("status object {namespace}/{name}: changed under every write; retrying")]
    Contended {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The API server did not answer in time.
    #[error("status object {namespace}/{name}: no answer within {limit:?}")]
    Timeout {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// How long we waited.
        limit: Duration,
    },
}

impl Error {
    /// The write's `resourceVersion` was not the object's (409).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// The agent's status object: `<namespace>/<name>`, one per agent.
#[derive(Clone)]
pub struct StatusObject {
    api: Api<DroverStatus>,
    name: String,
    namespace: String,
    spec: DroverStatusSpec,
    /// Longest wait for one call.
    timeout: Duration,
    /// The object's `metadata.generation` as last read, written or watched
    /// (0: not yet), shared by the clones (the term's writer): the status
    /// says which generation it was written for.
    generation: Arc<AtomicI64>,
}

impl std::fmt::Debug for StatusObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StatusObject({}/{})", self.namespace, self.name)
    }
}

impl StatusObject {
    /// The store for the object `name` in `namespace` describing `spec`.
    pub fn new(client: Client, namespace: &str, name: &str, spec: DroverStatusSpec) -> Self {
        StatusObject {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            namespace: namespace.to_string(),
            spec,
            timeout: Duration::from_secs(10),
            generation: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Give up each call after `limit` (default 10 s).
    pub fn with_timeout(mut self, limit: Duration) -> Self {
        self.timeout = limit;
        self
    }

    // One call, bounded by the timeout.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(|e| self.err(e)),
            Err(_) => Err(Error::Timeout {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                limit: self.timeout,
            }),
        }
    }

    /// Object name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn err(&self, source: kube::Error) -> Error {
        Error::Api {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// The object's `metadata.generation` as last read, written or
    /// watched; `None` before any.
    pub fn generation(&self) -> Option<i64> {
        Some(self.generation.load(Ordering::Relaxed)).filter(|g| *g > 0)
    }

    fn saw(&self, o: &DroverStatus) {
        if let Some(g) = o.metadata.generation {
            self.generation.store(g, Ordering::Relaxed);
        }
    }

    /// Read the object, creating it (empty status) when absent.
    pub async fn load_or_create(&self) -> Result<DroverStatus, Error> {
        let obj = self.get_or_create().await?;
        self.saw(&obj);
        Ok(obj)
    }

    async fn get_or_create(&self) -> Result<DroverStatus, Error> {
        if let Some(obj) = self.read().await? {
            return Ok(obj);
        }
        let obj = DroverStatus::new(&self.name, self.spec.clone());
        match self
            .bounded(self.api.create(&PostParams::default(), &obj))
            .await
        {
            Ok(o) => Ok(o),
            // Another replica created it between our get and create.
            Err(e) if e.is_conflict() => self.bounded(self.api.get(&self.name)).await,
            Err(e) => Err(e),
        }
    }

    /// Read the object, if it exists.
    pub async fn read(&self) -> Result<Option<DroverStatus>, Error> {
        let obj = self.bounded(self.api.get_opt(&self.name)).await?;
        if let Some(o) = &obj {
            self.saw(o);
        }
        Ok(obj)
    }

    /// Ask the leader to fetch now (a follower received a webhook).
    pub async fn request_fetch(&self) -> Result<(), Error> {
        let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let patch =
            serde_json::json!({ "metadata": { "annotations": { ANN_FETCH_REQUESTED: stamp } } });
        self.bounded(self.api.patch(
            &self.name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        ))
        .await?;
        Ok(())
    }

    /// Remove the annotation `key` (a named trust commit, once used or
    /// ignored: docs/design.md §6), if the object still has it with `value`.
    pub async fn remove_annotation(&self, key: &str, value: &str) -> Result<(), Error> {
        let obj = self.bounded(self.api.get(&self.name)).await?;
        let current = obj.metadata.annotations.as_ref().and_then(|a| a.get(key));
        if current.map(String::as_str) != Some(value) {
            return Ok(());
        }
        // The resourceVersion makes it conditional: a person's newer value stays.
        let patch = serde_json::json!({ "metadata": {
            "resourceVersion": obj.metadata.resource_version,
            "annotations": { key: null },
        } });
        self.bounded(self.api.patch(
            &self.name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        ))
        .await?;
        Ok(())
    }

    /// Yields whenever a follower asks for a fetch ([`Self::request_fetch`]):
    /// whenever the request stamp differs from the last one seen, starting
    /// from `seen`, the stamp on the object when the caller last read it.
    ///
    /// The watch starts when the stream is first polled, after the leader's
    /// first pass; a request made in between shows up in the initial list,
    /// which is why the initial list is compared too, not taken as the base.
    /// A relist after a watch error is compared the same way. An extra fetch
    /// is harmless; a lost request would wait for the next poll.
    ///
    /// Errors (API server unreachable, 403) are retried with kube's default
    /// backoff (jittered, up to 30 s) and logged at most once a minute.
    pub fn fetch_requests(&self, seen: Option<String>) -> futures::stream::BoxStream<'static, ()> {
        use futures::StreamExt;
        use kube::runtime::{watcher, WatchStreamExt};
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut seen = seen;
        let mut quiet = crate::retry::Quiet::new(std::time::Duration::from_secs(60));
        let what = format!("{}/{}", self.namespace, self.name);
        let generation = self.generation.clone();
        watcher::watcher(self.api.clone(), cfg)
            .default_backoff()
            .filter_map(move |ev| {
                if let Err(e) = &ev {
                    if let Some(n) = quiet.allow() {
                        tracing::warn!(object = %what, error = %e, suppressed = n, "watch of the status object failed; retrying with backoff");
                    }
                }
                let fire = match ev {
                    Ok(watcher::Event::InitApply(o) | watcher::Event::Apply(o)) => {
                        if let Some(g) = o.metadata.generation {
                            generation.store(g, Ordering::Relaxed);
                        }
                        let stamp = fetch_request_stamp(&o);
                        let new = stamp.is_some() && stamp != seen;
                        seen = stamp;
                        new
                    }
                    Ok(
                        watcher::Event::InitDone | watcher::Event::Init | watcher::Event::Delete(_),
                    )
                    | Err(_) => false,
                };
                futures::future::ready(fire.then_some(()))
            })
            .boxed()
    }

    /// Replace the status (a merge patch of the whole status subresource)
    /// if the object is still at `resource_version`; returns the new one.
    /// A changed object is refused by the API server: [`Error::is_conflict`].
    pub async fn write_at(
        &self,
        status: &DroverStatusStatus,
        resource_version: &str,
    ) -> Result<String, Error> {
        // Explicit nulls for every field of the type that is absent, so a
        // cleared field (`refused`, `blocker`) is removed rather than kept
        // from before; read from the type's schema, so no field is missed.
        // The field names are read once per process, not built into a
        // schema on every write.
        static KEYS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
            let schema = schemars::schema_for!(DroverStatusStatus);
            let props = schema.get("properties").and_then(|p| p.as_object());
            props.into_iter().flat_map(|p| p.keys().cloned()).collect()
        });
        let mut value = serde_json::to_value(status).unwrap_or_default();
        if let serde_json::Value::Object(map) = &mut value {
            for key in KEYS.iter() {
                map.entry(key.clone()).or_insert(serde_json::Value::Null);
            }
        }
        // The resourceVersion in a merge patch is a precondition: the API
        // server answers 409 unless the object is still at that version.
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": resource_version },
            "status": value,
        });
        let written = self
            .bounded(self.api.patch_status(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(&patch),
            ))
            .await?;
        self.saw(&written);
        Ok(written.resource_version().unwrap_or_default())
    }
}

/// What the writer has done, for those waiting on a write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Progress {
    /// The newest offer written (or already in place).
    written: u64,
    /// The newest offer whose write failed.
    failed: u64,
    /// The newest offer not written because another replica wrote the status.
    superseded: u64,
}

/// The status as the writer last saw it on the API server.
#[derive(Clone)]
struct Known {
    resource_version: String,
    status: Option<DroverStatusStatus>,
}

/// The one writer of the status during a leadership term: offers replace
/// each other (the newest wins), each write is made on the
/// `resourceVersion` of the status it saw, and it stops with its term.
pub struct StatusWriter {
    desired: watch::Sender<(u64, Option<DroverStatusStatus>)>,
    progress: watch::Receiver<Progress>,
    /// What another replica left, when a write found that it wrote.
    superseded_by: Arc<Mutex<Option<DroverStatus>>>,
    stop: watch::Receiver<bool>,
}

impl StatusWriter {
    /// Start writing `object`, as last read in `loaded` (`None`: not read
    /// in this term; the first write reads it first), each call given up
    /// after `limit`, until `stop` reads true.
    pub fn start(
        object: StatusObject,
        loaded: Option<&DroverStatus>,
        stop: watch::Receiver<bool>,
        limit: Duration,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (desired, desired_rx) = watch::channel((0, None));
        let (progress_tx, progress) = watch::channel(Progress::default());
        let superseded_by = Arc::new(Mutex::new(None));
        let known = loaded.map(|o| Known {
            resource_version: o.resource_version().unwrap_or_default(),
            status: o.status.clone(),
        });
        let task = Writer {
            object: object.with_timeout(limit),
            known,
            progress: progress_tx,
            superseded_by: superseded_by.clone(),
            hold_through: 0,
        };
        let handle = tokio::spawn(task.run(desired_rx, stop.clone()));
        (
            StatusWriter {
                desired,
                progress,
                superseded_by,
                stop,
            },
            handle,
        )
    }

    /// Hand `status` over to be written; returns at once. A status equal
    /// to the one waiting is not offered again.
    pub fn offer(&self, status: &DroverStatusStatus) -> u64 {
        let mut seq = 0;
        self.desired.send_if_modified(|(n, s)| {
            if s.as_ref() == Some(status) {
                seq = *n;
                return false;
            }
            *n += 1;
            *s = Some(status.clone());
            seq = *n;
            true
        });
        seq
    }

    /// Offer `status` and wait until it is written (true), or its write
    /// failed, was superseded, the term ended or `within` passed (false).
    pub async fn write(&self, status: &DroverStatusStatus, within: Duration) -> bool {
        let seq = self.offer(status);
        let mut progress = self.progress.clone();
        let mut stop = self.stop.clone();
        let done = async {
            progress
                .wait_for(|p| p.written >= seq || p.failed >= seq || p.superseded >= seq)
                .await
                .map(|p| p.written >= seq)
                .unwrap_or(false)
        };
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => false,
            r = tokio::time::timeout(within, done) => r.unwrap_or(false),
        }
    }

    /// What another replica left in the status, when a write found that it
    /// had written one since this term read it: the term reloads from it
    /// before offering again. Taken once.
    pub fn take_superseded(&self) -> Option<DroverStatus> {
        let taken = self
            .superseded_by
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if taken.is_some() {
            // The next offer is new, even if it equals the one held back.
            self.desired.send_modify(|(_, s)| *s = None);
        }
        taken
    }
}

/// The writer task.
struct Writer {
    object: StatusObject,
    known: Option<Known>,
    progress: watch::Sender<Progress>,
    superseded_by: Arc<Mutex<Option<DroverStatus>>>,
    /// Offers up to this one were made before the term reloaded: not written.
    hold_through: u64,
}

/// How one write ended.
enum Written {
    Done,
    /// A status this term did not read is there (another replica wrote it,
    /// or the term could not read the object when it began): not written.
    Superseded {
        found: Box<DroverStatus>,
        /// The term had read the object, and another writer changed it since.
        by_another: bool,
    },
}

impl Writer {
    async fn run(
        mut self,
        mut desired: watch::Receiver<(u64, Option<DroverStatusStatus>)>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut backoff =
            crate::retry::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        let mut quiet = crate::retry::Quiet::new(Duration::from_secs(60));
        loop {
            let (seq, status) = desired.borrow_and_update().clone();
            let pending =
                status.filter(|_| seq > self.progress.borrow().written.max(self.hold_through));
            let Some(status) = pending else {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => return,
                    r = desired.changed() => if r.is_err() { return },
                }
                continue;
            };
            let outcome = tokio::select! {
                biased;
                // A write in flight when the term ends is given up with it.
                _ = stop.wait_for(|s| *s) => return,
                r = self.write(&status) => r,
            };
            match outcome {
                Ok(Written::Done) => {
                    backoff.reset();
                    quiet.reset();
                    self.progress.send_modify(|p| p.written = seq);
                }
                Ok(Written::Superseded { found, by_another }) => {
                    let object = format!("{}/{}", self.object.namespace, self.object.name);
                    let reporter = found
                        .status
                        .as_ref()
                        .and_then(|s| s.reporter.as_deref())
                        .unwrap_or("")
                        .to_string();
                    if by_another {
                        tracing::warn!(%object, %reporter, "another replica wrote the status since this term read it; going on from it, not overwriting it");
                    } else {
                        tracing::info!(%object, "the status object was read only now; going on from it");
                    }
                    self.hold_through = seq;
                    *self.superseded_by.lock().unwrap_or_else(|e| e.into_inner()) = Some(*found);
                    self.progress.send_modify(|p| p.superseded = seq);
                }
                Err(e) => {
                    self.progress.send_modify(|p| p.failed = seq);
                    if let Some(n) = quiet.allow() {
                        tracing::warn!(error = %e, suppressed = n, "cannot write the status object; retrying");
                    }
                    let delay = backoff.next_delay();
                    tokio::select! {
                        biased;
                        _ = stop.wait_for(|s| *s) => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn write(&mut self, status: &DroverStatusStatus) -> Result<Written, Error> {
        // A write meeting only a metadata change (a fetch request, an
        // annotation) is made again on the new version; a few of those in
        // a row are retried at the loop's pace.
        for _ in 0..3 {
            let known = match self.known.clone() {
                Some(k) => k,
                None => {
                    // Not read in this term: whatever is there was not seen.
                    let fresh = self.object.load_or_create().await?;
                    self.known = Some(Known {
                        resource_version: fresh.resource_version().unwrap_or_default(),
                        status: fresh.status.clone(),
                    });
                    return Ok(Written::Superseded {
                        found: Box::new(fresh),
                        by_another: false,
                    });
                }
            };
            if known.status.as_ref() == Some(status) {
                return Ok(Written::Done);
            }
            match self.object.write_at(status, &known.resource_version).await {
                Ok(rv) => {
                    self.known = Some(Known {
                        resource_version: rv,
                        status: Some(status.clone()),
                    });
                    return Ok(Written::Done);
                }
                Err(e) if e.is_conflict() => {
                    let fresh = self.object.load_or_create().await?;
                    let same = fresh.status == known.status;
                    self.known = Some(Known {
                        resource_version: fresh.resource_version().unwrap_or_default(),
                        status: fresh.status.clone(),
                    });
                    if !same {
                        return Ok(Written::Superseded {
                            found: Box::new(fresh),
                            by_another: true,
                        });
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Contended {
            namespace: self.object.namespace.clone(),
            name: self.object.name.clone(),
        })
    }
}

#[cfg(test)]
#[path = "crd_tests.rs"]
mod tests;
