//! The in-cluster agent: on every trigger (poll, webhook, local change), on
//! cluster changes and on a fallback tick, one pass runs its stages in
//! order (`pass.rs`): fetch → admit (trust → config → gate) → act (engine) →
//! report (CRD status, status report, Events, metrics).
//!
//! Only the replica holding the lease ([`leader`]; the lifecycle in
//! `lifecycle.rs`) acts. A new head that is unsigned, rewritten, invalid or
//! refused by the gate changes nothing: it is reported (status object,
//! Event, metric) and the agent keeps acting on the last applied commit,
//! which lives in the status object's `status.lastAppliedCommit` so that it
//! survives restarts and takeovers.
//!
//! Why a loop of its own and not kube-rs's runtime `Controller`: a
//! `Controller` reconciles one Kubernetes object at a time, keyed by it and
//! requeued by its watches, while drover's unit of work is the whole
//! cluster against one git commit, woken as much by git (poll, webhook) as
//! by the cluster, and every pass must end with its leadership term (a term
//! that ends cancels its writes; no reconcile of an old term may land).
//! The pieces it does reuse are kube's: the watcher and reflector behind
//! the cluster view (`crate::kubernetes::observe`), the API client and its
//! retry layer.
//!
//! Choices where the issue is silent:
//! - A refused new head does not pause the rollout of the last applied
//!   commit: that commit passed every check when it was applied. Its
//!   revocations do stop it when the head passed the trust check (a
//!   revocation only stops: `admit::Admitted::in_force`).
//! - A refusal is kept as state (`admit.rs`): judged once, one Event, a
//!   stable `since`, until the head, the applied commit, the status store or
//!   the instant a soak passes changes it.
//! - The status report is published when its content (all but `since`) changes.

mod act;
mod admit;
mod backend;
pub mod blocked;
pub mod conditions;
mod consent;
pub mod crd;
pub mod events;
mod fetch;
mod give_back;
mod guard;
mod health;
mod hooks;
pub mod http;
pub mod leader;
mod lifecycle;
pub mod metrics;
mod migrate;
pub mod notify;
mod pass;
pub mod preflight;
pub mod rbac;
mod recorded;
pub mod recover;
mod report;
pub mod reporter;
pub mod told;
mod verdict;
mod waves;
use crate::retry;

pub use backend::{ClusterBackend, Connected, KubeBackend};
pub use guard::GuardError;
pub use hooks::{AgentHandle, OffsetClock, PassRecord, SharedClock, Wake};
pub use rbac::{
    Permission, CLUSTER_PERMISSIONS, DRAIN_DELETE_PERMISSIONS, JOB_NAMESPACE_PERMISSIONS,
    NAMESPACE_PERMISSIONS,
};

use crate::config::EnvConfig;
use crate::source::trigger::{Trigger, WebhookConfig};
use crate::source::{Source, SourceConfig};
use crate::status::PublishOptions;
use crate::trust;
use chrono::{DateTime, SecondsFormat, Utc};
use crd::{DroverStatusSpec, StatusObject};
use events::Events;
use git2::Oid;
use metrics::Metrics;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

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
    /// The API client could not be built.
    #[error(transparent)]
    Client(#[from] crate::kubernetes::Error),
    /// A signers file is required for the verify mode.
    #[error("verify mode {0:?} needs --allowed-signers, --openpgp-keys or both")]
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
    /// This replica's identity in the Lease and in Events: the pod name
    /// (`POD_NAME`); by default `drover-` and 64 random bits, so that two
    /// replicas never share one.
    pub identity: String,
    /// The config repository.
    pub source: SourceConfig,
    /// How much history must be signed.
    pub verify: trust::Mode,
    /// `--trust-commit`: the commit a person names to start from when there
    /// is neither an applied commit nor a signed report of the agent's own
    /// (`recover`; the `drover.dev/trust-commit` annotation wins over it).
    pub trust_commit: Option<String>,
    /// Allowed-signers file (git's SSH format); re-read for every new head.
    pub allowed_signers: Option<PathBuf>,
    /// Armored OpenPGP public keys (e.g. the forge's merge-button key);
    /// re-read for every new head.
    pub openpgp_keys: Option<PathBuf>,
    /// `--status-branch`: the status branch comes from the policy in force;
    /// when given, a head whose policy names another branch is refused.
    pub status_branch: Option<String>,
    /// How status commits are made.
    pub publish: PublishOptions,
    /// Poll interval of the config repository.
    pub poll: Duration,
    /// Longest time between two reconcile passes.
    pub tick: Duration,
    /// Pause between eviction passes while a drain waits for PDBs: 5 s,
    /// kubectl drain's pause after a refused eviction. A budget holds a
    /// pod until another becomes ready elsewhere (tens of seconds to
    /// minutes), so a shorter pause only adds refused calls (and passes).
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
    /// CloudEvents notifications (none without endpoints).
    pub notify: notify::Config,
}

/// The longest one call of the status object's writer, the Event
/// publisher or the webhook relay may take. They race the end of their
/// term, so this bounds a slow API server, not the handover.
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// An identity no other replica has: `drover-` and 64 random bits (a
/// process id is `1` in most containers, and so is every other replica's).
pub fn default_identity() -> String {
    format!("drover-{:016x}", crate::replay::random_u64())
}

impl AgentConfig {
    /// The longest the engine waits for one write to the API server (a
    /// cordon, an eviction, a Job): below the time between giving up the
    /// lease and another replica taking it (see
    /// [`leader::LeaseConfig::write_timeout`]), with or without election,
    /// so a single replica keeps the same bounds. Give it to the backend
    /// ([`KubeBackend::with_write_timeout`]).
    pub fn write_timeout(&self) -> Duration {
        leader::LeaseConfig::new(
            &self.namespace,
            &self.lease_name,
            &self.identity,
            self.lease_duration,
        )
        .write_timeout()
    }

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
            identity: default_identity(),
            source: SourceConfig::new(url, cache_dir),
            verify: trust::Mode::All,
            trust_commit: None,
            allowed_signers: None,
            openpgp_keys: None,
            status_branch: None,
            publish: PublishOptions::default(),
            poll: Duration::from_secs(60),
            tick: Duration::from_secs(30),
            evict_retry: Duration::from_secs(5),
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
            notify: notify::Config::default(),
        }
    }
}
/// The agent, bound but not yet running.
pub struct Agent<B: ClusterBackend> {
    state: Acting<B>,
    trigger: Trigger,
    manual_rx: tokio::sync::mpsc::Receiver<()>,
    servers: Vec<(http::Server, axum::Router)>,
    elector: Option<leader::Elector>,
    /// Leadership as someone else decides it ([`Agent::led_by`]).
    led_by: Option<tokio::sync::watch::Receiver<bool>>,
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
    /// `kube_config` reaches the API server for the Lease, the status object
    /// and Events, through a client built by [`crate::kubernetes::client`]
    /// without a retry layer; each of those calls is bounded where it is
    /// made (the lease by its renew deadline, the others by
    /// [`API_CALL_TIMEOUT`]).
    pub async fn new(
        cfg: AgentConfig,
        kube_config: kube::Config,
        backend: B,
        clock: SharedClock,
    ) -> Result<Self, Error> {
        let client = crate::kubernetes::client(kube_config, None)?;
        Self::with_client(cfg, client, backend, clock).await
    }

    /// [`Agent::new`] with the API client already built: the seam the
    /// whole-agent simulation (tests/sim/agent_sim) reaches the agent
    /// by, with a client whose API server is in-process.
    pub async fn with_client(
        cfg: AgentConfig,
        client: kube::Client,
        backend: B,
        clock: SharedClock,
    ) -> Result<Self, Error> {
        if cfg.verify != trust::Mode::Off
            && cfg.allowed_signers.is_none()
            && cfg.openpgp_keys.is_none()
        {
            return Err(Error::NoSigners(cfg.verify));
        }
        // Two handles on the cache: the control loop's, and the fetch's own,
        // so a fetch waiting on the network never holds the loop's lock.
        let (source, fetch_source) = {
            let sc = cfg.source.clone();
            crate::replay::spawn(move || {
                Ok::<_, crate::source::Error>((Source::open(sc.clone())?, Source::open(sc)?))
            })
            .await
            .map_err(|e| {
                crate::source::Error::Git(git2::Error::from_str(&format!("opening the cache: {e}")))
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
        let (acting_tx, acting) = tokio::sync::watch::channel(false);
        let handle = AgentHandle {
            nudger: trigger.nudger(),
            manual,
            passes: passes.clone(),
            metrics: metrics.clone(),
            addr,
            webhook_addr,
            acting,
        };
        let store = StatusObject::new(
            client.clone(),
            &cfg.namespace,
            &cfg.status_name,
            DroverStatusSpec {
                environment: cfg.env.clone(),
                cluster: cfg.cluster.clone(),
            },
        );
        let mut events = Events::new(
            Some(client),
            &cfg.identity,
            &cfg.namespace,
            &cfg.status_name,
        );
        events.count_in(events::Counters {
            dropped: metrics.events_dropped.clone(),
            failed: metrics.event_failures.clone(),
        });
        let notifier = notify::Notifier::new(
            cfg.notify.clone(),
            &cfg.env,
            &cfg.cluster,
            metrics.notifications.clone(),
        );
        events.notify_with(notifier.clone());
        let state = Acting {
            cfg,
            source: Arc::new(Mutex::new(source)),
            fetching: fetch::Fetching {
                source: Some(fetch_source),
                in_flight: None,
                again: None,
                ended_in_term: false,
                ok_in_term: false,
                scopes: Default::default(),
                store: None,
            },
            status_object: store,
            edges: Edges {
                events,
                notifier,
                metrics,
                ready,
                passes,
            },
            clock,
            backend,
            told: report::Telling::default(),
            term: Term {
                tasks: None,
                count: 0,
                acting: acting_tx,
                status_read: false,
            },
            admitted: admit::Admitted::default(),
            cluster: act::OnCluster::new(),
            pace: retry::Paced::default(),
            preflight: Default::default(),
        };
        Ok(Agent {
            state,
            trigger,
            manual_rx,
            servers,
            elector,
            led_by: None,
            handle,
        })
    }

    /// Act while `leading` reads true, instead of while holding the Lease
    /// (with `leader_election` off): the seam the whole-agent simulation
    /// plays the election through, handing the lease from one replica to
    /// another as the `Elector` would.
    pub fn led_by(mut self, leading: tokio::sync::watch::Receiver<bool>) -> Self {
        self.led_by = Some(leading);
        self
    }

    /// Handles for tests, benchmarks and the CLI.
    pub fn handle(&self) -> AgentHandle {
        self.handle.clone()
    }
}

/// The acting side: everything one leadership term needs, kept across
/// terms. Its state is grouped by owner, each group with one writer (its
/// doc names it): the term (`lifecycle.rs`), the fetch (`fetch.rs`), what
/// admission admitted (`admit.rs`), what acting on the cluster carries
/// (`act.rs`), what the cluster is told (`report.rs`, the others handing in
/// their part), the preflight before a window (`preflight.rs`). The rest
/// are settings and handles nobody writes.
struct Acting<B: ClusterBackend> {
    cfg: AgentConfig,
    clock: SharedClock,
    backend: B,
    /// The control loop's handle on the git cache (local work only: trust,
    /// config, gate; the network is the fetch's and the reporter's).
    source: Arc<Mutex<Source>>,
    /// The DroverStatus object this agent writes (through its term's writer).
    status_object: StatusObject,
    /// The leadership term.
    term: Term,
    /// The fetch, in flight or not.
    fetching: fetch::Fetching,
    /// What admission admitted.
    admitted: admit::Admitted,
    /// What acting on the cluster carries from pass to pass.
    cluster: act::OnCluster<B>,
    /// What the cluster is told.
    told: report::Telling,
    /// Events, notifications, metrics, readiness, the pass records.
    edges: Edges,
    /// The preflight before the next window: `preflight.rs` alone writes it.
    preflight: preflight::Preflight,
    /// Repeated failures are logged once a minute per kind.
    pace: retry::Paced,
}

/// The leadership term as this replica holds it: `lifecycle.rs` alone
/// starts, counts and ends it (and records whether it read the status
/// object); the other stages only read it, and hand what they write to
/// its writers.
struct Term {
    /// The running term's writers (status object, status reports, Events).
    tasks: Option<TermTasks>,
    /// Leadership terms begun so far (the running one's number).
    count: u64,
    /// True while a term runs (for [`AgentHandle::acting`]).
    acting: tokio::sync::watch::Sender<bool>,
    /// Whether this term has read the status object: until it has, the
    /// applied commit it names (another leader's, maybe) is not known.
    status_read: bool,
}

/// The agent's edges to the world besides the status object and the
/// status branch: Events (and the notifications made with them), metrics,
/// readiness and the record of each pass. Handles, not state: each stage
/// tells through them what it alone knows (an action's Event, a fetch's
/// metric), and what the cluster's state is told as comes from `told` alone.
struct Edges {
    events: Events,
    /// Notifications: made by `events`, delivered off the loop by tasks
    /// started with the agent.
    notifier: notify::Notifier,
    metrics: Arc<Metrics>,
    ready: Arc<http::Readiness>,
    passes: broadcast::Sender<PassRecord>,
}

/// What writes for a leadership term, off the control loop; each task
/// stops when the term's cancel reads true.
struct TermTasks {
    /// The status object's one writer.
    writer: crd::StatusWriter,
    /// The status reports' way to git.
    reporter: reporter::Reporter,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The config being applied.
#[derive(Clone)]
struct Active {
    commit: Oid,
    env: EnvConfig,
    /// The status branch its policy names.
    status_branch: String,
    /// `[status] progress_interval` of its config.
    progress_interval: Duration,
    /// Why the pinned version is revoked by the policy in force, if it is:
    /// no further node starts (docs/design.md §2).
    revoked: Option<String>,
    /// Every version the policy in force revokes: no node is moved or
    /// rolled back to one of them.
    revoked_versions: Vec<semver::Version>,
    /// The environment's waves (one wave of every cluster without `[[wave]]`).
    waves: Vec<crate::gate::wave::Wave>,
    /// `[rollout] failure_budget`.
    failure_budget: u32,
    /// `env`'s calendar (`None`: its windows do not parse, so none opens),
    /// parsed once per admitted config rather than on every pass.
    calendar: Option<std::sync::Arc<crate::window::Calendar>>,
}

impl Active {
    /// The calendar of `env`, as [`Active::calendar`] keeps it.
    fn calendar_of(env: &EnvConfig) -> Option<std::sync::Arc<crate::window::Calendar>> {
        crate::window::Calendar::of(env)
            .ok()
            .map(std::sync::Arc::new)
    }
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

/// Run blocking git work off the loop ([`crate::replay`]); a panicked task reads as `None`.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    crate::replay::spawn(f).await.ok()
}
