//! The in-cluster agent: source → trust → config → gate → window → engine →
//! status, on every trigger (poll, webhook, local change), on cluster changes
//! and on a fallback tick.
//!
//! Only the replica holding the lease ([`leader`]) acts. A new head that is
//! unsigned, rewritten, invalid or refused by the gate changes nothing: it is
//! reported (status object, Event, metric) and the agent keeps acting on the
//! last applied commit, which lives in the status object's
//! `status.lastAppliedCommit` so that it survives restarts and takeovers.
//!
//! Choices where the issue is silent:
//! - A refused new head does not pause the rollout of the last applied
//!   commit: that commit passed every check when it was applied.
//! - Trust and config refusals are remembered per commit (they cannot change
//!   for the same commit); gate refusals are judged again on every pass,
//!   since confirmations arrive and soaks pass with time.
//! - The status report is published when its content (all but `since`) changes.

pub mod crd;
pub mod events;
mod give_back;
mod health;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod recover;
pub mod retry;

use crate::cluster::{Cluster, EvictionPass, NodeProgress, NodeSeen, NodeView, ProgressState};
use crate::config::{self, EnvConfig};
use crate::rollout::{Clock, Engine, Inputs, Labels, Policy, RolloutState, WindowState};
use crate::source::trigger::{Nudger, Reason, Trigger, WebhookConfig};
use crate::source::{Source, SourceConfig};
use crate::status::{PublishOptions, StatusReport};
use crate::trust::{self, AllowedSigners};
use chrono::{DateTime, SecondsFormat, Utc};
use crd::{DroverStatusSpec, DroverStatusStatus, FetchRecord, Refused, StatusStore};
use events::{Events, Severity};
use futures::stream::BoxStream;
use futures::StreamExt;
use git2::Oid;
use metrics::Metrics;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, watch};
use tracing::Instrument;

/// One RBAC rule the agent needs: (API group, resource, verbs).
pub type Permission = (&'static str, &'static str, &'static [&'static str]);

/// Every permission the agent uses, cluster-wide; `deploy/base/rbac.yaml`'s
/// ClusterRole must grant exactly these (tests/agent_manifests.rs checks).
pub const CLUSTER_PERMISSIONS: &[Permission] = &[
    // crate::kubernetes: observe nodes, cordon/annotate in one patch.
    ("", "nodes", &["get", "list", "watch", "patch"]),
    // crate::kubernetes: pods on nodes being drained (field-selected lists and watches).
    ("", "pods", &["list", "watch"]),
    // crate::kubernetes: drains through the Eviction API.
    ("", "pods/eviction", &["create"]),
    ("policy", "poddisruptionbudgets", &["list", "watch"]),
    // events::Events: creates Events, and patches a repeated one into a series.
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// Every permission the agent uses in the namespace of its upgrade Jobs
/// (`drover-upgrades` in `deploy/base`, Role `drover-upgrades`): kept apart
/// from the agent's own namespace so that only that namespace admits the
/// pods an OS driver needs.
pub const JOB_NAMESPACE_PERMISSIONS: &[Permission] = &[
    // crate::kubernetes: the OS driver's upgrade Jobs.
    ("batch", "jobs", &["create", "list", "watch", "delete"]),
];

/// Every permission the agent uses in its own namespace (the Role `drover` in `deploy/base/rbac.yaml`).
pub const NAMESPACE_PERMISSIONS: &[Permission] = &[
    // leader::Elector: get, create once, conditional replace (update).
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    ),
    // crd::StatusStore: get, create once, merge-patch the status subresource;
    // a follower patches an annotation that the leader watches (webhook relay).
    (
        "drover.dev",
        "droverstatuses",
        &["get", "list", "watch", "create", "patch"],
    ),
    ("drover.dev", "droverstatuses/status", &["patch"]),
];

/// Errors that stop the agent (everything else is reported and retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The git cache could not be opened.
    #[error(transparent)]
    Source(#[from] crate::source::Error),
    /// The local repository cannot be watched.
    #[error(transparent)]
    Trigger(#[from] crate::source::trigger::Error),
    /// Leader election could not be set up.
    #[error(transparent)]
    Leader(#[from] leader::Error),
    /// The HTTP server failed.
    #[error(transparent)]
    Http(#[from] http::Error),
    /// The allowed-signers file is required for the verify mode.
    #[error("verify mode {0:?} needs --allowed-signers")]
    NoSigners(trust::Mode),
}

/// Everything the agent needs besides the cluster backend and the clock.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The environment this agent serves.
    pub env: String,
    /// The cluster name it reports as.
    pub cluster: String,
    /// Namespace of the Lease and the status object.
    pub namespace: String,
    /// This replica's identity (pod name).
    pub identity: String,
    /// The config repository.
    pub source: SourceConfig,
    /// How much history must be signed.
    pub verify: trust::Mode,
    /// Allowed-signers file (git's SSH format); re-read for every new head.
    pub allowed_signers: Option<PathBuf>,
    /// `--status-branch`: the status branch comes from the policy in force;
    /// when given, a head whose policy names another branch is refused.
    pub status_branch: Option<String>,
    /// How status commits are made.
    pub publish: PublishOptions,
    /// Poll interval of the config repository.
    pub poll: Duration,
    /// Longest time between two reconcile passes.
    pub tick: Duration,
    /// Pause between eviction passes while a drain waits for PDBs.
    pub evict_retry: Duration,
    /// Quiet time after a cluster change before reconciling, so a burst of changes costs one pass.
    pub debounce: Duration,
    /// Lease name.
    pub lease_name: String,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Run leader election (off: this replica always acts; for a single replica without a Lease).
    pub leader_election: bool,
    /// Status object name.
    pub status_name: String,
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// Webhook secrets; `None` disables `/webhook`.
    pub webhook: Option<WebhookConfig>,
    /// Serve `/webhook` on this address alone instead of on `listen`, so a
    /// NetworkPolicy can admit the forge to it and nothing else.
    pub webhook_listen: Option<SocketAddr>,
    /// Namespace of the upgrade Jobs (`None`: the agent's own namespace).
    pub job_namespace: Option<String>,
    /// Shortest time between two fetches that webhooks (or local changes) start.
    pub webhook_min_interval: Duration,
    /// Also wake when the repository, a local path, changes on disk.
    pub watch_local: bool,
}

impl AgentConfig {
    /// Where the upgrade Jobs run: `job_namespace`, else the agent's namespace.
    pub fn jobs_namespace(&self) -> &str {
        self.job_namespace.as_deref().unwrap_or(&self.namespace)
    }

    /// Defaults for `env`/`cluster` fetching `url` into `cache_dir`.
    pub fn new(env: &str, cluster: &str, url: &str, cache_dir: PathBuf) -> Self {
        AgentConfig {
            env: env.into(),
            cluster: cluster.into(),
            namespace: "drover-system".into(),
            identity: format!("drover-{}", std::process::id()),
            source: SourceConfig::new(url, cache_dir),
            verify: trust::Mode::All,
            allowed_signers: None,
            status_branch: None,
            publish: PublishOptions::default(),
            poll: Duration::from_secs(60),
            tick: Duration::from_secs(30),
            evict_retry: Duration::from_secs(2),
            debounce: Duration::from_millis(200),
            lease_name: format!("drover-{env}-{cluster}"),
            lease_duration: Duration::from_secs(15),
            leader_election: true,
            status_name: format!("{env}-{cluster}"),
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            webhook: None,
            webhook_min_interval: crate::source::trigger::DEFAULT_MIN_INTERVAL,
            webhook_listen: None,
            job_namespace: None,
            watch_local: true,
        }
    }
}

/// A cluster view built for an environment's node settings, and its change notifications.
pub struct Connected<C> {
    /// The cluster the engine drives.
    pub cluster: C,
    /// Yields when something the engine reads changed (nodes, pods, upgrade runs).
    pub changes: BoxStream<'static, ()>,
}

/// Builds the cluster view for an environment (node selector, driver, version regex).
pub trait ClusterBackend: Send + 'static {
    /// The cluster type.
    type Cluster: Cluster + Send + Sync + 'static;
    /// Why a cluster view could not be built.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Build the cluster view for `env`; called again when those settings change.
    fn connect(
        &mut self,
        cluster_name: &str,
        env: &EnvConfig,
    ) -> impl Future<Output = Result<Connected<Self::Cluster>, Self::Error>> + Send;
}

/// The Kubernetes backend: a [`KubeCluster`](crate::kubernetes::KubeCluster)
/// per set of node settings, upgrade Jobs in the agent's namespace.
#[derive(Clone)]
pub struct KubeBackend {
    config: kube::Config,
    namespace: String,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl KubeBackend {
    /// Clusters built from `config` (the backend makes its own client); Jobs run in `namespace`.
    pub fn new(config: kube::Config, namespace: &str) -> Self {
        KubeBackend {
            config,
            namespace: namespace.to_string(),
        }
    }
}

impl ClusterBackend for KubeBackend {
    type Cluster = crate::kubernetes::KubeCluster;
    type Error = crate::kubernetes::Error;

    async fn connect(
        &mut self,
        cluster_name: &str,
        env: &EnvConfig,
    ) -> Result<Connected<Self::Cluster>, Self::Error> {
        let opts = crate::kubernetes::KubeOptions::from_env(cluster_name, &self.namespace, env);
        let cluster = crate::kubernetes::KubeCluster::new(self.config.clone(), opts).await?;
        let rx = cluster.changes();
        let changes = futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
        .boxed();
        Ok(Connected { cluster, changes })
    }
}

/// One reconcile pass, for tests and benchmarks that follow the agent.
#[derive(Debug, Clone)]
pub struct PassRecord {
    /// What woke the pass.
    pub wake: Wake,
    /// When the pass started (after its fetch, before trust and the engine).
    pub started: Instant,
    /// The fetched head, if any.
    pub head: Option<String>,
    /// The last applied commit after the pass.
    pub applied: Option<String>,
    /// The rollout state after the pass.
    pub state: Option<RolloutState>,
    /// Why the head is not applied, if it is not.
    pub refused: Option<Refused>,
}

/// What woke a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// First pass of a leadership term.
    Start,
    /// A source trigger (poll, webhook, local change): fetch first.
    Source(Reason),
    /// The cluster changed.
    Cluster,
    /// A timer: the decision's wake-up, an eviction retry or the fallback tick.
    Timer,
    /// Asked through [`AgentHandle::reconcile`].
    Manual,
}

/// Handles to a running agent.
#[derive(Clone, Debug)]
pub struct AgentHandle {
    nudger: Nudger,
    manual: tokio::sync::mpsc::Sender<()>,
    passes: broadcast::Sender<PassRecord>,
    metrics: Arc<Metrics>,
    addr: Option<SocketAddr>,
    webhook_addr: Option<SocketAddr>,
}

impl AgentHandle {
    /// Ask for a fetch now (as a webhook would).
    pub fn fetch(&self) {
        self.nudger.nudge(Reason::Webhook);
    }

    /// Ask for a reconcile pass without fetching (e.g. after moving a test clock).
    pub fn reconcile(&self) {
        let _ = self.manual.try_send(());
    }

    /// Follow the passes.
    pub fn subscribe(&self) -> broadcast::Receiver<PassRecord> {
        self.passes.subscribe()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Where the HTTP server listens.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Where `/webhook` is served (the HTTP server's address unless it has its own).
    pub fn webhook_addr(&self) -> Option<SocketAddr> {
        self.webhook_addr.or(self.addr)
    }
}

/// The clock the agent reads windows, gates and timeouts from.
pub type SharedClock = Arc<dyn Clock + Send + Sync>;

/// The wall clock shifted by a fixed offset (`--clock-offset`, a test hook).
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock(pub chrono::Duration);

impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.0
    }
}

/// The agent, bound but not yet running.
pub struct Agent<B: ClusterBackend> {
    state: Acting<B>,
    trigger: Trigger,
    manual_rx: tokio::sync::mpsc::Receiver<()>,
    servers: Vec<(http::Server, axum::Router)>,
    elector: Option<leader::Elector>,
    handle: AgentHandle,
}

impl<B: ClusterBackend> std::fmt::Debug for Agent<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("env", &self.state.cfg.env)
            .field("cluster", &self.state.cfg.cluster)
            .finish()
    }
}

impl<B: ClusterBackend> Agent<B> {
    /// Open the git cache, bind the HTTP server and prepare leader election.
    /// `client` is the API server for the Lease, the status object and Events.
    pub async fn new(
        cfg: AgentConfig,
        client: kube::Client,
        backend: B,
        clock: SharedClock,
    ) -> Result<Self, Error> {
        if cfg.verify != trust::Mode::Off && cfg.allowed_signers.is_none() {
            return Err(Error::NoSigners(cfg.verify));
        }
        let source = {
            let sc = cfg.source.clone();
            tokio::task::spawn_blocking(move || Source::open(sc))
                .await
                .map_err(|e| {
                    crate::source::Error::Git(git2::Error::from_str(&format!(
                        "opening the cache: {e}"
                    )))
                })??
        };
        let mut trigger = Trigger::new(cfg.poll);
        trigger.set_min_interval(cfg.webhook_min_interval);
        if cfg.watch_local {
            if let Some(path) = source.local_path() {
                trigger.watch(&path)?;
            }
        }
        let metrics = Arc::new(Metrics::new());
        let ready = Arc::new(http::Readiness::default());
        let webhook = cfg
            .webhook
            .clone()
            .map(|w| crate::source::trigger::webhook_router(w, trigger.nudger()));
        let mut servers = Vec::new();
        let mut webhook_addr = None;
        let webhook = match (webhook, cfg.webhook_listen) {
            (Some(w), Some(at)) => {
                let srv = http::Server::bind(at).await?;
                webhook_addr = srv.local_addr();
                servers.push((srv, w));
                None
            }
            (w, _) => w,
        };
        let app = http::router(metrics.clone(), ready.clone(), webhook);
        let server = http::Server::bind(cfg.listen).await?;
        let addr = server.local_addr();
        servers.push((server, app));
        let elector = if cfg.leader_election {
            Some(leader::Elector::new(
                client.clone(),
                leader::LeaseConfig::new(
                    &cfg.namespace,
                    &cfg.lease_name,
                    &cfg.identity,
                    cfg.lease_duration,
                ),
            )?)
        } else {
            None
        };
        let (passes, _) = broadcast::channel(256);
        let (manual, manual_rx) = tokio::sync::mpsc::channel(1);
        let handle = AgentHandle {
            nudger: trigger.nudger(),
            manual,
            passes: passes.clone(),
            metrics: metrics.clone(),
            addr,
            webhook_addr,
        };
        let store = StatusStore::new(
            client.clone(),
            &cfg.namespace,
            &cfg.status_name,
            DroverStatusSpec {
                environment: cfg.env.clone(),
                cluster: cfg.cluster.clone(),
            },
        );
        let events = Events::new(
            Some(client),
            &cfg.identity,
            &cfg.namespace,
            &cfg.status_name,
        );
        let state = Acting {
            cfg,
            source_abort: source.abort_flag(),
            source: Arc::new(Mutex::new(source)),
            store,
            events,
            metrics,
            ready,
            clock,
            backend,
            status: DroverStatusStatus::default(),
            written: None,
            active: None,
            refused_cache: None,
            connected: None,
            last_published: None,
            publish_pending: false,
            pushed: None,
            publish_due: None,
            passes,
            fetched_once: false,
            window_seen: None,
            trust_annotation: None,
            refused_version: None,
            pace: retry::Paced::default(),
            reconcile_backoff: retry::Backoff::new(Duration::from_secs(2), Duration::from_secs(60)),
        };
        Ok(Agent {
            state,
            trigger,
            manual_rx,
            servers,
            elector,
            handle,
        })
    }

    /// Handles for tests, benchmarks and the CLI.
    pub fn handle(&self) -> AgentHandle {
        self.handle.clone()
    }

    /// Run until `shutdown` becomes true: serve HTTP, take part in the
    /// election, act while leader. On shutdown the current API call is
    /// finished, no further one starts, and the lease is released.
    pub async fn run(mut self, shutdown: watch::Receiver<bool>) -> Result<(), Error> {
        let server_tasks: Vec<_> = std::mem::take(&mut self.servers)
            .into_iter()
            .map(|(srv, app)| tokio::spawn(srv.serve(app, shutdown.clone())))
            .collect();
        let (leader_tx, mut leader_rx) = watch::channel(self.elector.is_none());
        let mut elector_task = self.elector.take().map(|mut el| {
            let sd = shutdown.clone();
            tokio::spawn(async move {
                el.run(leader_tx, sd).await;
                el
            })
        });
        let mut shutdown_rx = shutdown.clone();
        let mut state = self.state;
        let mut trigger = self.trigger;
        let mut manual_rx = self.manual_rx;
        loop {
            // Follower: keep the cache warm and become ready, but touch nothing.
            if !*leader_rx.borrow() && !state.ready.is_ready() {
                state.warm_up(&shutdown_rx).await;
            }
            state.metrics.leader.set(0);
            tokio::select! {
                r = leader_rx.wait_for(|l| *l) => if r.is_err() { break },
                _ = shutdown_rx.wait_for(|s| *s) => break,
                // A webhook that reached the follower: relay it to the leader.
                r = trigger.next() => {
                    if r == Reason::Webhook {
                        if let Err(e) = state.store.request_fetch().await {
                            if let Some(n) = state.pace.allow("relay") {
                                tracing::warn!(error = %e, suppressed = n, "could not relay the webhook to the leader");
                            }
                        }
                    }
                    continue;
                }
            }
            if *shutdown_rx.borrow() {
                break;
            }
            state.metrics.leader.set(1);
            let (cancel_tx, cancel_rx) = watch::channel(false);
            let term = tokio::spawn(async move {
                state.term(&mut trigger, &mut manual_rx, cancel_rx).await;
                (state, trigger, manual_rx)
            });
            let mut leader_watch = leader_rx.clone();
            let lost = async {
                // A closed channel (no election: always leader) never reports a loss.
                if leader_watch.wait_for(|l| !*l).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = lost => {
                    tracing::warn!("leadership lost: stopping at once");
                }
                _ = shutdown_rx.wait_for(|s| *s) => {}
            }
            // No engine call starts after this; the one in flight finishes.
            let _ = cancel_tx.send(true);
            match term.await {
                Ok((s, t, m)) => {
                    state = s;
                    trigger = t;
                    manual_rx = m;
                }
                Err(e) => {
                    tracing::error!(error = %e, "the acting task panicked");
                    break;
                }
            }
            if *shutdown_rx.borrow() {
                // Still the lease holder (released below): hand back nodes
                // that are only cordoned, so that no node stays out of
                // service if no replica takes over. Not after losing the
                // lease: the nodes are another replica's to act on then.
                if *leader_rx.borrow() {
                    state.give_back_on_stop().await;
                }
                break;
            }
        }
        if let Some(task) = elector_task.take() {
            if let Ok(mut el) = task.await {
                if let Err(e) = el.release().await {
                    tracing::warn!(error = %e, "could not release the lease");
                } else {
                    tracing::info!("released the lease");
                }
            }
        }
        for t in server_tasks {
            match t.await {
                Ok(r) => r?,
                Err(e) => tracing::warn!(error = %e, "http server task"),
            }
        }
        Ok(())
    }
}

/// The acting side: everything one leadership term needs, kept across terms.
struct Acting<B: ClusterBackend> {
    cfg: AgentConfig,
    source: Arc<Mutex<Source>>,
    /// Stops the fetch in progress; set when a term or the process ends.
    source_abort: Arc<std::sync::atomic::AtomicBool>,
    store: StatusStore,
    events: Events,
    metrics: Arc<Metrics>,
    ready: Arc<http::Readiness>,
    clock: SharedClock,
    backend: B,
    /// The status as this term wants it.
    status: DroverStatusStatus,
    /// The status as last written.
    written: Option<DroverStatusStatus>,
    active: Option<Active>,
    /// A trust or config refusal, remembered for its commit.
    refused_cache: Option<(Oid, Refused)>,
    connected: Option<(String, Connected<B::Cluster>)>,
    last_published: Option<StatusReport>,
    publish_pending: bool,
    /// The last report that reached the remote, and when (status::cadence).
    pushed: Option<(StatusReport, DateTime<Utc>)>,
    /// When a held progress report is due (status::cadence).
    publish_due: Option<DateTime<Utc>>,
    passes: broadcast::Sender<PassRecord>,
    fetched_once: bool,
    /// Whether the window was open at the last reconcile of this term.
    window_seen: Option<bool>,
    /// The commit a person confirmed through `recover::TRUST_ANNOTATION`.
    trust_annotation: Option<String>,
    /// The version the refused head pins (reported as `refused`).
    refused_version: Option<semver::Version>,
    /// Repeated failures are logged once a minute per kind.
    pace: retry::Paced,
    /// Spaces reconcile attempts while the cluster keeps failing them.
    reconcile_backoff: retry::Backoff,
}

/// The config being applied.
#[derive(Clone)]
struct Active {
    commit: Oid,
    env: EnvConfig,
    /// The status branch its policy names.
    status_branch: String,
    /// Why the pinned version is revoked by the policy in force, if it is:
    /// no further node starts (docs/design.md §2).
    revoked: Option<String>,
}

/// What judging a new head found.
enum Verdict {
    Accept {
        env: Box<EnvConfig>,
        version: String,
        status_branch: String,
        revoked: Option<String>,
    },
    Refuse(Refused, Option<semver::Version>),
}

/// When a pass asks to run again.
struct Next {
    after: Duration,
}

fn short(commit: &str) -> String {
    commit.chars().take(12).collect()
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn lock(source: &Mutex<Source>) -> std::sync::MutexGuard<'_, Source> {
    source.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run blocking git work on the blocking pool; a panicked task reads as `None`.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

impl<B: ClusterBackend> Acting<B> {
    /// A follower's preparation: fetch once and observe the cluster once, so
    /// that `/readyz` turns ready and a takeover starts from a warm cache.
    async fn warm_up(&mut self, shutdown: &watch::Receiver<bool>) {
        if !self.fetch(shutdown).await {
            return;
        }
        let head = { lock(&self.source).fetched() };
        let Some(head) = head else { return };
        let env_name = self.cfg.env.clone();
        let src = self.source.clone();
        let env = blocking(move || {
            let s = lock(&src);
            let files = config::GitTreeFiles::at_rev(s.repo(), &head.to_string()).ok()?;
            config::load(&files).ok()?.envs.get(&env_name).cloned()
        })
        .await
        .flatten();
        if let Some(env) = env {
            if self.ensure_cluster(&env).await {
                if let Some((_, c)) = &self.connected {
                    if c.cluster.observe().await.is_ok() {
                        self.ready.set_synced();
                    }
                }
            }
        }
    }

    /// One leadership term: pass after pass until `cancel`.
    async fn term(
        &mut self,
        trigger: &mut Trigger,
        manual: &mut tokio::sync::mpsc::Receiver<()>,
        mut cancel: watch::Receiver<bool>,
    ) {
        // A takeover: another replica may have applied newer commits meanwhile.
        let seen = self.reload_status().await;
        self.window_seen = None;
        self.events
            .on_status(
                Severity::Normal,
                "LeaderElected",
                "Lead",
                format!("{} holds the lease and acts", self.cfg.identity),
            )
            .await;
        let mut relayed = self.store.fetch_requests(seen);
        let mut wake = Wake::Start;
        loop {
            if *cancel.borrow() {
                return;
            }
            let next = self.pass(wake, &cancel).await;
            if *cancel.borrow() {
                return;
            }
            let sleep = tokio::time::sleep(next.after.min(self.cfg.tick));
            tokio::pin!(sleep);
            let changes = async {
                match self.connected.as_mut() {
                    Some((_, c)) => {
                        if c.changes.next().await.is_none() {
                            // The stream ended; the tick still covers us.
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            wake = tokio::select! {
                _ = cancel.wait_for(|c| *c) => return,
                r = trigger.next() => Wake::Source(r),
                Some(()) = relayed.next() => Wake::Source(Reason::Webhook),
                _ = changes => Wake::Cluster,
                Some(()) = manual.recv() => Wake::Manual,
                _ = &mut sleep => Wake::Timer,
            };
            if wake == Wake::Cluster && !self.cfg.debounce.is_zero() {
                // Let a burst of changes settle, draining what piles up meanwhile.
                let until = tokio::time::Instant::now() + self.cfg.debounce;
                if let Some((_, c)) = self.connected.as_mut() {
                    while let Ok(Some(())) = tokio::time::timeout_at(until, c.changes.next()).await
                    {
                    }
                }
            }
        }
    }

    /// Read the status object back; returns the fetch request stamped on it,
    /// which the term's first fetch (always made) answers.
    async fn reload_status(&mut self) -> Option<String> {
        match self.store.load_or_create().await {
            Ok(obj) => {
                let stamp = crd::fetch_request_stamp(&obj);
                self.trust_annotation = obj
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(recover::TRUST_ANNOTATION))
                    .cloned();
                self.events.set_status_uid(obj.metadata.uid.clone());
                let st = obj.status.unwrap_or_default();
                let changed = st.last_applied_commit != self.status.last_applied_commit;
                self.status = st.clone();
                self.written = Some(st);
                if changed {
                    self.active = None;
                }
                stamp
            }
            Err(e) => {
                if let Some(n) = self.pace.allow("status-read") {
                    tracing::warn!(error = %e, suppressed = n, "cannot read the status object");
                }
                None
            }
        }
    }

    /// Fetch and record the outcome; false when `cancel` stopped it first.
    ///
    /// A cancelled fetch is abandoned, not awaited: a slow or stalled server
    /// must not hold a SIGTERM past the pod's grace period or keep a replica
    /// that lost its lease busy. The abort flag ends the transfer at its next
    /// progress callback; a server that sends nothing is bounded by the
    /// source's socket timeout, on a blocking thread nobody waits for.
    async fn fetch(&mut self, cancel: &watch::Receiver<bool>) -> bool {
        use std::sync::atomic::Ordering;
        let src = self.source.clone();
        self.source_abort.store(false, Ordering::Relaxed);
        let mut cancel = cancel.clone();
        let result = tokio::select! {
            r = blocking(move || lock(&src).fetch()) => r,
            Ok(_) = cancel.wait_for(|c| *c) => {
                self.source_abort.store(true, Ordering::Relaxed);
                tracing::info!("fetch abandoned: the agent stops acting");
                return false;
            }
        };
        let now = Utc::now();
        let ok = matches!(result, Some(Ok(_)));
        let result_text = match &result {
            Some(Ok(_)) => "ok".to_string(),
            Some(Err(e)) => e.to_string(),
            None => "the fetch task failed".to_string(),
        };
        if !ok {
            if let Some(n) = self.pace.allow("fetch") {
                tracing::warn!(error = %result_text, suppressed = n, "fetch failed");
            }
        }
        self.metrics
            .fetched(ok, now.timestamp_millis() as f64 / 1000.0);
        self.status.last_fetch = Some(FetchRecord {
            time: rfc3339(now),
            result: result_text,
        });
        self.fetched_once = true;
        self.ready.set_fetched();
        true
    }

    /// One pass: fetch if asked, judge a new head, reconcile, report.
    async fn pass(&mut self, wake: Wake, cancel: &watch::Receiver<bool>) -> Next {
        if (matches!(wake, Wake::Start | Wake::Source(_)) || !self.fetched_once)
            && !self.fetch(cancel).await
        {
            // Cancelled: the term ends without touching the source, which
            // the abandoned fetch still holds.
            return Next {
                after: Duration::ZERO,
            };
        }
        let started = Instant::now();
        let head = { lock(&self.source).fetched() };
        self.status.head_commit = head.map(|h| h.to_string());
        // `commit` is the applied commit, updated in the span if this pass applies a new one.
        let applied = self
            .status
            .last_applied_commit
            .as_deref()
            .map(short)
            .unwrap_or_else(|| "none".into());
        let span = tracing::info_span!(
            "reconcile",
            env = %self.cfg.env,
            cluster = %self.cfg.cluster,
            commit = %applied,
            head = %head.map(|h| short(&h.to_string())).unwrap_or_default(),
        );
        let next = async {
            self.judge_head(head).await;
            tracing::Span::current().record(
                "commit",
                tracing::field::display(
                    self.active
                        .as_ref()
                        .map(|a| short(&a.commit.to_string()))
                        .unwrap_or_default(),
                ),
            );
            let next = self.reconcile(cancel).await;
            self.write_status().await;
            self.publish().await;
            next
        }
        .instrument(span)
        .await;
        let _ = self.passes.send(PassRecord {
            wake,
            started,
            head: head.map(|h| h.to_string()),
            applied: self.status.last_applied_commit.clone(),
            state: self.last_published.as_ref().map(|r| r.state),
            refused: self.status.refused.clone(),
        });
        if self.publish_pending {
            // A held progress report waits for its time; a failed push retries soon.
            let wait = self
                .publish_due
                .and_then(|t| (t - self.clock.now()).to_std().ok())
                .unwrap_or(Duration::from_secs(5));
            return Next {
                after: next.after.min(wait),
            };
        }
        next
    }

    /// Decide whether `head` replaces the applied commit; load the applied config.
    async fn judge_head(&mut self, head: Option<Oid>) {
        let mut adopt = false;
        if self.status.last_applied_commit.is_none() {
            if let Some(head) = head {
                match self.recover(head).await {
                    Some(commit) => {
                        self.status.last_applied_commit = Some(commit.to_string());
                        self.status.commit = Some(short(&commit.to_string()));
                        if let Some(a) = self.load_active(commit).await {
                            self.status.applied_version = Some(a.env.version.to_string());
                        }
                        // Durable before acting on it, as for any applied commit.
                        if !self.write_status().await {
                            self.status.last_applied_commit = None;
                            return;
                        }
                    }
                    None => adopt = true,
                }
            }
        }
        let applied: Option<Oid> = self
            .status
            .last_applied_commit
            .as_deref()
            .and_then(|s| Oid::from_str(s).ok());
        if self.active.is_none() {
            if let Some(commit) = applied {
                self.active = self.load_active(commit).await;
            }
        }
        let Some(head) = head else {
            return;
        };
        if Some(head) == applied && self.active.is_some() {
            self.set_refused(None).await;
            return;
        }
        let verdict = match &self.refused_cache {
            Some((c, r)) if *c == head => Verdict::Refuse(r.clone(), self.refused_version.clone()),
            _ if adopt => self.evaluate_adoption(head).await,
            _ => self.evaluate(head, applied, false).await,
        };
        match verdict {
            Verdict::Refuse(r, version) => {
                if r.stage != "gate" && r.reason != "no_trusted_state" {
                    self.refused_cache = Some((head, r.clone()));
                }
                self.refused_version = version;
                self.set_refused(Some(r)).await;
            }
            Verdict::Accept {
                env,
                version,
                status_branch,
                revoked,
            } => {
                let previous = self.status.last_applied_commit.clone();
                if self.status.applied_version.as_deref() != Some(version.as_str()) {
                    // A new target: the old counts and state say nothing about it.
                    self.status.target = Some(version.clone());
                    self.status.state = None;
                    self.status.since = None;
                    self.status.at_version = None;
                    self.status.nodes_at_version = 0;
                }
                self.status.last_applied_commit = Some(head.to_string());
                self.status.applied_version = Some(version.clone());
                self.status.commit = Some(short(&head.to_string()));
                self.status.refused = None;
                // Durable before acting on it: a restart must resume from this commit.
                if !self.write_status().await {
                    self.status.last_applied_commit = previous;
                    return;
                }
                let src = self.source.clone();
                let branch = status_branch.clone();
                let _ = blocking(move || {
                    let mut s = lock(&src);
                    s.set_status_branch(&branch);
                    s.accept(head)
                })
                .await;
                self.refused_version = None;
                self.active = Some(Active {
                    commit: head,
                    env: *env,
                    status_branch,
                    revoked,
                });
                self.metrics.set_blocked(None);
                self.metrics.set_applied(&head.to_string(), &version);
                self.events
                    .on_status(
                        Severity::Normal,
                        "Applied",
                        "Apply",
                        format!(
                            "applying commit {} (version {version})",
                            short(&head.to_string())
                        ),
                    )
                    .await;
            }
        }
    }

    async fn set_refused(&mut self, r: Option<Refused>) {
        let changed = self.status.refused != r;
        self.metrics
            .set_blocked(r.as_ref().map(|r| (r.stage.as_str(), r.reason.as_str())));
        if changed {
            if let Some(r) = &r {
                self.events
                    .on_status(
                        Severity::Warning,
                        "Refused",
                        "Verify",
                        format!(
                            "commit {} not applied ({} check, {}): {}",
                            short(&r.commit),
                            r.stage,
                            r.reason,
                            r.message
                        ),
                    )
                    .await;
            }
        }
        self.status.refused = r;
    }

    /// Without a last applied commit: the one a person confirmed, else the
    /// one this agent's own signed reports name (see [`recover`]).
    async fn recover(&mut self, head: Oid) -> Option<Oid> {
        if self.trust_annotation.is_none() {
            // Read again: the person may have annotated since the term began.
            if let Ok(obj) = self.store.load_or_create().await {
                self.trust_annotation = obj
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(recover::TRUST_ANNOTATION))
                    .cloned();
            }
        }
        let src = self.source.clone();
        let named = self.trust_annotation.clone();
        let own = self
            .cfg
            .publish
            .signing_key
            .as_ref()
            .and_then(|k| recover::own_signers(k, &self.cfg.env, &self.cfg.cluster));
        let (env, cluster) = (self.cfg.env.clone(), self.cfg.cluster.clone());
        let found = blocking(move || {
            let s = lock(&src);
            let repo = s.repo();
            if let Some(c) = named.and_then(|n| repo.revparse_single(n.trim()).ok()) {
                return c
                    .peel_to_commit()
                    .ok()
                    .map(|c| (c.id(), "confirmed by a person"));
            }
            let branch = s.config().status_branch.clone();
            recover::from_own_reports(repo, &branch, &env, &cluster, own.as_ref()?)
                .map(|c| (c, "recovered from this cluster's signed reports"))
        })
        .await
        .flatten();
        let (commit, how) = found?;
        tracing::info!(commit = %commit, head = %head, "{how}");
        self.events
            .on_status(
                Severity::Normal,
                "Recovered",
                "Recover",
                format!("last applied commit {} {how}", short(&commit.to_string())),
            )
            .await;
        Some(commit)
    }

    /// No trusted state: adopt the head when every selected node already
    /// runs the version it pins, otherwise refuse and say how to confirm one.
    async fn evaluate_adoption(&mut self, head: Oid) -> Verdict {
        let pinned = self.load_active(head).await;
        let mut adoptable = false;
        if let Some(a) = &pinned {
            if self.ensure_cluster(&a.env).await {
                if let Some((_, c)) = &self.connected {
                    if let Ok(nodes) = c.cluster.observe().await {
                        adoptable = recover::adoptable(&nodes, &a.env.version);
                    }
                }
            }
        }
        if adoptable {
            return self.evaluate(head, None, true).await;
        }
        Verdict::Refuse(
            Refused {
                commit: head.to_string(),
                stage: "trust".into(),
                reason: "no_trusted_state".into(),
                message: recover::no_trusted_state(
                    &self.cfg.namespace,
                    &self.cfg.status_name,
                    &head.to_string(),
                ),
            },
            pinned.map(|a| a.env.version),
        )
    }

    // Not `async fn`: the future must not borrow `self` (Acting is not Sync).
    fn load_active(&self, commit: Oid) -> impl Future<Output = Option<Active>> + Send + 'static {
        let src = self.source.clone();
        let env_name = self.cfg.env.clone();
        let work = blocking(move || {
            let mut s = lock(&src);
            let cfg = {
                let files = config::GitTreeFiles::at_rev(s.repo(), &commit.to_string()).ok()?;
                config::load(&files).ok()?
            };
            let env = cfg.envs.get(&env_name)?.clone();
            // The policy in force owns the status branch.
            s.set_status_branch(&cfg.root.status_branch);
            let revoked = revoked_reason(&cfg, &env);
            Some(Active {
                commit,
                env,
                status_branch: cfg.root.status_branch,
                revoked,
            })
        });
        async move { work.await.flatten() }
    }

    /// Trust, then config, then gate, for `head` over the applied commit:
    /// the one admission path (`crate::admit`), commit by commit.
    fn evaluate(
        &self,
        head: Oid,
        applied: Option<Oid>,
        adopt: bool,
    ) -> impl Future<Output = Verdict> + Send + 'static {
        let src = self.source.clone();
        let env_name = self.cfg.env.clone();
        let mode = self.cfg.verify;
        let signers_path = self.cfg.allowed_signers.clone();
        let now = self.clock.now();
        let head_s = head.to_string();
        let flag = self.cfg.status_branch.clone();
        let refuse = move |stage: &str, reason: &str, message: String, version| {
            Verdict::Refuse(
                Refused {
                    commit: head_s.clone(),
                    stage: stage.into(),
                    reason: reason.into(),
                    message,
                },
                version,
            )
        };
        let refuse2 = refuse.clone();
        let work = blocking(move || {
            let s = lock(&src);
            let repo = s.repo();
            let signers = match (&signers_path, mode) {
                (_, trust::Mode::Off) => AllowedSigners::default(),
                (Some(p), _) => match AllowedSigners::load(p) {
                    Ok(x) => x,
                    Err(e) => return refuse("trust", "signers", e.to_string(), None),
                },
                (None, _) => {
                    return refuse("trust", "signers", "no allowed-signers file".into(), None)
                }
            };
            // Keys are also judged at when this cache first fetched each commit.
            let seen = s.seen();
            let first_seen = |oid| seen.first_seen(oid).unwrap_or(now.timestamp());
            let trusted = crate::admit::TrustCheck {
                mode,
                signers: &signers,
                first_seen: &first_seen,
            };
            let admitted = if adopt {
                crate::admit::admit_adoption(repo, head, &env_name, &trusted, now)
            } else {
                crate::admit::admit_head(repo, applied, head, &env_name, &trusted, now)
            };
            match admitted {
                Ok(a) => {
                    let Some(env) = a.snapshot.config.envs.get(&env_name).cloned() else {
                        return refuse(
                            "config",
                            "unknown_env",
                            format!("no environment {env_name}"),
                            None,
                        );
                    };
                    let branch = a.snapshot.policy.status_branch.clone();
                    if let Some(flag) = flag.as_ref().filter(|f| **f != branch) {
                        return refuse(
                            "config",
                            "status_branch_mismatch",
                            format!(
                                "--status-branch is {flag:?} but [promotion] status_branch of the config is {branch:?}; the config owns the status branch: drop the flag or make them agree"
                            ),
                            Some(env.version),
                        );
                    }
                    let revoked = revoked_reason(&a.snapshot.config, &env);
                    Verdict::Accept {
                        version: env.version.to_string(),
                        env: Box::new(env),
                        status_branch: branch,
                        revoked,
                    }
                }
                Err(r) => refuse(r.stage.as_str(), &r.code, r.message, r.version),
            }
        });
        async move {
            work.await
                .unwrap_or_else(|| refuse2("trust", "error", "the check task failed".into(), None))
        }
    }

    /// (Re)build the cluster view when the node settings change; false when unavailable.
    async fn ensure_cluster(&mut self, env: &EnvConfig) -> bool {
        let key = format!(
            "{:?}|{:?}|{}",
            env.rollout.node_selector,
            env.driver,
            env.nodes.version_regex.as_str()
        );
        if matches!(&self.connected, Some((k, _)) if *k == key) {
            return true;
        }
        match self.backend.connect(&self.cfg.cluster, env).await {
            Ok(c) => {
                self.connected = Some((key, c));
                true
            }
            Err(e) => {
                if let Some(n) = self.pace.allow("connect") {
                    tracing::warn!(error = %e, suppressed = n, "cannot connect to the cluster");
                }
                false
            }
        }
    }

    /// The window at `now` for `env`, for any change and for a patch update
    /// (they differ only under a `minor` freeze); asked of [`crate::window`].
    fn window(env: &EnvConfig, now: DateTime<Utc>) -> (WindowState, Option<WindowState>) {
        match crate::window::Calendar::of(env) {
            Ok(cal) => cal.inputs_at(now),
            Err(_) => (WindowState::default(), None),
        }
    }

    /// Run the engine for the applied config; update status, metrics and Events.
    async fn reconcile(&mut self, cancel: &watch::Receiver<bool>) -> Next {
        let tick = Next {
            after: self.cfg.tick,
        };
        let Some(active) = self.active.clone() else {
            // Nothing to act on: nodes drover cordoned are not left cordoned meanwhile.
            self.give_back_unconfigured(cancel).await;
            self.status.state = Some(if self.status.refused.is_some() {
                "refused".into()
            } else {
                "blocked".into()
            });
            self.status.message = match &self.status.refused {
                Some(r) => format!("no applied config: {}", r.message),
                None => "no trusted config fetched yet".into(),
            };
            self.metrics.set_rollout_state("blocked");
            return tick;
        };
        if !self.ensure_cluster(&active.env).await {
            return Next {
                after: Duration::from_secs(5),
            };
        }
        let now = self.clock.now();
        let (mut window, mut patch_window) = Self::window(&active.env, now);
        if let Some(why) = &active.revoked {
            // A version revoked after it was pinned: nodes already moving
            // finish, no further node starts, until a new version is pinned.
            let held = format!("{} is revoked: {why}", active.env.version);
            window.held = Some(held.clone());
            if let Some(p) = patch_window.as_mut() {
                p.held = Some(held);
            }
        }
        self.metrics
            .window_open
            .set(i64::from(window.opened_at.is_some()));
        let inputs = Inputs {
            may_start: true,
            hold_reason: String::new(),
            window: window.clone(),
            patch_window,
            queries: health::evaluate_queries(&active.env, self.last_published.as_ref()).await,
            ..Default::default()
        };
        let engine = Engine::new(
            Policy::from_env(&active.env),
            Labels {
                env: self.cfg.env.clone(),
                commit: active.commit.to_string(),
            },
            ClockRef(self.clock.clone()),
        );
        let Some((_, conn)) = self.connected.as_ref() else {
            return tick;
        };
        let guarded = Guarded {
            inner: &conn.cluster,
            cancel: cancel.clone(),
            observed: Mutex::new(Vec::new()),
        };
        let result = engine.reconcile(&guarded, &inputs).await;
        let observed =
            std::mem::take(&mut *guarded.observed.lock().unwrap_or_else(|e| e.into_inner()));
        drop(guarded);
        if !observed.is_empty() || result.is_ok() {
            self.ready.set_synced();
        }
        self.node_metrics(&observed);
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                self.metrics.reconciled("error");
                if !*cancel.borrow() {
                    if let Some(n) = self.pace.allow("reconcile") {
                        tracing::warn!(error = %e, suppressed = n, "reconcile failed");
                    }
                }
                return Next {
                    after: self.reconcile_backoff.next_delay(),
                };
            }
        };
        self.reconcile_backoff.reset();
        self.metrics.reconciled("ok");
        let d = &outcome.decision;
        for a in &d.actions {
            health::count_failure(&self.metrics, &self.cfg.env, a);
            self.durations(a, &observed, now);
            self.events.on_action(a).await;
        }
        // A budget pacing a drain is normal; it becomes a Warning
        // (DrainBlocked) only when the drain times out.
        for (node, msg) in &outcome.evictions_blocked {
            self.events
                .on_node(
                    node,
                    Severity::Normal,
                    "EvictionRefused",
                    "Evict",
                    msg.clone(),
                )
                .await;
        }
        let state = state_str(d.state);
        if self.status.state.as_deref() != Some(state) {
            self.events
                .on_status(
                    if matches!(d.state, RolloutState::Failed | RolloutState::Blocked) {
                        Severity::Warning
                    } else {
                        Severity::Normal
                    },
                    &format!("Rollout{}", capitalise(state)),
                    "Reconcile",
                    format!(
                        "{} {}/{} nodes at {}{}",
                        state,
                        d.nodes_at_version,
                        d.nodes,
                        active.env.version,
                        if d.message.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", d.message)
                        }
                    ),
                )
                .await;
            self.status.since = Some(rfc3339(now));
        }
        // The first observation of a term is no transition (a restart would repeat it).
        let was_open = self.window_seen.replace(window.opened_at.is_some());
        if was_open.is_some_and(|w| w != window.opened_at.is_some()) {
            let note = match (window.closes_at, window.next_opens_at) {
                (Some(end), _) => format!("maintenance window open until {}", rfc3339(end)),
                (None, Some(next)) => {
                    format!("maintenance window closed; next opens {}", rfc3339(next))
                }
                (None, None) => "maintenance window closed".to_string(),
            };
            let reason = if window.opened_at.is_some() {
                "WindowOpened"
            } else {
                "WindowClosed"
            };
            self.events
                .on_status(Severity::Normal, reason, "Window", note)
                .await;
        }
        self.metrics.set_rollout_state(state);
        self.status.state = Some(state.into());
        self.status.target = Some(active.env.version.to_string());
        self.status.nodes = d.nodes;
        self.status.nodes_at_version = d.nodes_at_version;
        self.status.at_version = Some(format!("{}/{}", d.nodes_at_version, d.nodes));
        self.status.window_open = window.opened_at.is_some();
        self.status.next_window = match (window.closes_at, window.next_opens_at) {
            (Some(end), _) => Some(format!("open until {}", rfc3339(end))),
            (None, Some(start)) => Some(rfc3339(start)),
            (None, None) => None,
        };
        self.status.message = d.message.clone();
        self.status.reporter = Some(self.cfg.identity.clone());
        let since = self
            .status
            .since
            .as_deref()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or(now);
        let report = StatusReport {
            env: self.cfg.env.clone(),
            cluster: self.cfg.cluster.clone(),
            config_commit: active.commit.to_string(),
            version: active.env.version.clone(),
            state: d.state,
            since,
            nodes: d.nodes,
            nodes_at_version: d.nodes_at_version,
            message: d.message.clone(),
            detail: crate::status::NodeDetail::of(&observed, &active.env.version),
        };
        // A refused newer head is what the cluster reports (docs/design.md §5):
        // `version` is the refused one, `config_commit` the commit it stays on.
        let report = match (&self.status.refused, &self.refused_version) {
            (Some(r), Some(v)) => {
                let mut message = format!(
                    "commit {} refused ({} check, {}): {}",
                    short(&r.commit),
                    r.stage,
                    r.reason,
                    r.message
                );
                if message.len() > 1000 {
                    let cut = (0..=1000)
                        .rev()
                        .find(|i| message.is_char_boundary(*i))
                        .unwrap_or(0);
                    message.truncate(cut);
                }
                self.status.state = Some("refused".into());
                StatusReport {
                    version: v.clone(),
                    state: RolloutState::Refused,
                    message,
                    ..report
                }
            }
            _ => report,
        };
        let same = self.last_published.as_ref().is_some_and(|p| {
            StatusReport {
                since: p.since,
                ..report.clone()
            } == *p
        });
        if !same {
            self.last_published = Some(report);
            self.publish_pending = true;
        }
        if outcome.again {
            return Next {
                after: Duration::ZERO,
            };
        }
        let mut after = self.cfg.tick;
        if outcome.retry_evictions {
            after = after.min(self.cfg.evict_retry);
        }
        if let Some(w) = d.wake_at {
            after = after.min((w - now).to_std().unwrap_or(Duration::ZERO));
        }
        if d.poll_health {
            after = after.min(crate::rollout::health::HEALTH_RECHECK);
        }
        Next { after }
    }

    fn node_metrics(&self, nodes: &[NodeView]) {
        if nodes.is_empty() {
            return;
        }
        let mut counts: BTreeMap<(String, String), i64> = BTreeMap::new();
        for n in nodes {
            let version = n
                .version
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "unknown".into());
            let state = match &n.progress {
                Ok(Some(p)) => p.state.as_str(),
                Err(_) => "unreadable",
                Ok(None) if n.ready => "ready",
                Ok(None) => "notready",
            };
            *counts.entry((version, state.to_string())).or_default() += 1;
        }
        self.metrics.set_nodes(&counts);
    }

    fn durations(
        &self,
        action: &crate::rollout::Action,
        observed: &[NodeView],
        now: DateTime<Utc>,
    ) {
        use crate::rollout::Action;
        let secs = |since: DateTime<Utc>| (now - since).num_milliseconds().max(0) as f64 / 1000.0;
        match action {
            Action::StartUpgrade { progress, .. } => {
                self.metrics
                    .drain_duration
                    .observe(secs(progress.started_at));
            }
            Action::Complete { node, .. } | Action::Watch { node, .. } => {
                let started =
                    observed
                        .iter()
                        .find(|n| n.name == *node)
                        .and_then(|n| match &n.progress {
                            Ok(Some(p)) if p.state == ProgressState::Upgrading => {
                                Some(p.started_at)
                            }
                            _ => None,
                        });
                if let Some(s) = started {
                    self.metrics.upgrade_duration.observe(secs(s));
                }
            }
            _ => {}
        }
    }

    /// Write the status object if it changed; false when the write failed.
    async fn write_status(&mut self) -> bool {
        if self.written.as_ref() == Some(&self.status) {
            return true;
        }
        match self.store.write(&self.status).await {
            Ok(()) => {
                self.written = Some(self.status.clone());
                true
            }
            Err(e) => {
                if let Some(n) = self.pace.allow("status-write") {
                    tracing::warn!(error = %e, suppressed = n, "cannot write the status object");
                }
                false
            }
        }
    }

    /// Push the status report if it changed since the last successful push.
    async fn publish(&mut self) {
        if !self.publish_pending {
            return;
        }
        let Some(report) = self.last_published.clone() else {
            return;
        };
        // State changes go out at once, rolling progress at most once per poll interval.
        let now = self.clock.now();
        let last = self.pushed.as_ref().map(|(r, t)| (r, *t));
        self.publish_due = None;
        match crate::status::cadence::decide(last, &report, now, self.cfg.poll) {
            crate::status::cadence::Push::Nothing => {
                self.publish_pending = false;
                return;
            }
            crate::status::cadence::Push::At(due) => {
                self.publish_due = Some(due);
                return;
            }
            crate::status::cadence::Push::Now => {}
        }
        let src = self.source.clone();
        let opts = self.cfg.publish.clone();
        let r = report.clone();
        match blocking(move || crate::status::publish(&lock(&src), &r, &opts)).await {
            Some(Ok(p)) => {
                self.publish_pending = false;
                self.pushed = Some((report.clone(), now));
                if let Some(c) = p.commit {
                    tracing::info!(commit = %c, state = ?report.state, "status report pushed");
                }
                if report.state == RolloutState::Confirmed && p.commit.is_some() {
                    self.events
                        .on_status(
                            Severity::Normal,
                            "Confirmed",
                            "Report",
                            format!(
                                "confirmed {} on {}; recorded on the status branch",
                                report.version,
                                self.active
                                    .as_ref()
                                    .map_or(&self.cfg.source.status_branch, |a| &a.status_branch)
                            ),
                        )
                        .await;
                }
            }
            Some(Err(e)) => {
                if let Some(n) = self.pace.allow("push") {
                    tracing::warn!(error = %e, suppressed = n, "status push failed; will retry")
                }
            }
            None => tracing::warn!("status push task failed; will retry"),
        }
    }
}

fn state_str(s: RolloutState) -> &'static str {
    s.as_str()
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// The shared clock as the engine's clock type.
#[derive(Clone)]
struct ClockRef(SharedClock);

impl Clock for ClockRef {
    fn now(&self) -> DateTime<Utc> {
        self.0.now()
    }
}

/// The engine's calls refused once leadership is lost or shutdown began.
#[derive(Debug, thiserror::Error)]
pub enum GuardError<E: std::error::Error + 'static> {
    /// The agent stopped acting; the call was not made.
    #[error("not acting any more (leadership lost or shutting down)")]
    Stopped,
    /// The backend's error.
    #[error(transparent)]
    Cluster(E),
}

/// A cluster whose mutating calls check, before each one, that the agent
/// may still act: after leadership is lost no new call starts, while the
/// one in flight finishes. It also keeps the nodes the engine observed.
struct Guarded<'a, C> {
    inner: &'a C,
    cancel: watch::Receiver<bool>,
    observed: Mutex<Vec<NodeView>>,
}

impl<C: Cluster + Sync> Guarded<'_, C> {
    fn check(&self) -> Result<(), GuardError<C::Error>> {
        if *self.cancel.borrow() {
            Err(GuardError::Stopped)
        } else {
            Ok(())
        }
    }
}

impl<C: Cluster + Sync> Cluster for Guarded<'_, C> {
    type Error = GuardError<C::Error>;

    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn observe(&self) -> Result<Vec<NodeView>, Self::Error> {
        self.check()?;
        let nodes = self.inner.observe().await.map_err(GuardError::Cluster)?;
        *self.observed.lock().unwrap_or_else(|e| e.into_inner()) = nodes.clone();
        Ok(nodes)
    }

    async fn cordon(&self, node: &str, progress: &NodeProgress) -> Result<(), Self::Error> {
        self.check()?;
        self.inner
            .cordon(node, progress)
            .await
            .map_err(GuardError::Cluster)
    }

    async fn uncordon(
        &self,
        node: &str,
        progress: Option<&NodeProgress>,
    ) -> Result<(), Self::Error> {
        self.check()?;
        self.inner
            .uncordon(node, progress)
            .await
            .map_err(GuardError::Cluster)
    }

    async fn set_progress(
        &self,
        node: &str,
        progress: Option<&NodeProgress>,
    ) -> Result<(), Self::Error> {
        self.check()?;
        self.inner
            .set_progress(node, progress)
            .await
            .map_err(GuardError::Cluster)
    }

    async fn evict(&self, node: &str) -> Result<EvictionPass, Self::Error> {
        self.check()?;
        self.inner.evict(node).await.map_err(GuardError::Cluster)
    }

    async fn start_upgrade(&self, node: &str, progress: &NodeProgress) -> Result<(), Self::Error> {
        self.check()?;
        self.inner
            .start_upgrade(node, progress)
            .await
            .map_err(GuardError::Cluster)
    }

    async fn health(&self, nodes: &[String]) -> Result<Vec<NodeSeen>, Self::Error> {
        self.check()?;
        self.inner.health(nodes).await.map_err(GuardError::Cluster)
    }
}

/// Why `env`'s pinned version is revoked by `cfg`'s `[promotion] revoked`, if it is.
fn revoked_reason(cfg: &config::RepoConfig, env: &EnvConfig) -> Option<String> {
    cfg.root
        .revoked
        .iter()
        .find(|r| r.version == env.version)
        .map(|r| r.reason.clone())
}
