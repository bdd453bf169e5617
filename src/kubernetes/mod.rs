//! The Kubernetes implementation of the cluster interface: observe, cordon, drain, OS update drivers.
//!
//! - **Observation** ([`observe`]) reads from watch-fed stores (kube-rs
//!   reflectors): the selected nodes, drover's upgrade Jobs, the
//!   PodDisruptionBudgets, and the pods of the nodes whose health is watched
//!   or whose blocked drain may retry early (capped, see
//!   [`KubeOptions::pod_watches`]); the only API requests it makes are one
//!   field-selected list of pods per node being drained (which the drain
//!   of the same pass evicts from: one list per drain pass), a list of a
//!   blocked node's pods beyond the watch cap at most every
//!   [`observe::BLOCKED_POLL`], and a fresh read confirming a version the
//!   node and Job watches disagree on. An idle cluster costs no pod traffic
//!   at all. The counts per node upgraded and per idle minute are measured
//!   from the API server's audit log (BENCHMARKS.md, "Kubernetes backend"). Our own writes are overlaid on the
//!   stores until the watches catch up, so the engine always reads its own
//!   writes and never decides twice from a stale view. A read about one node
//!   that fails is that node's [`crate::cluster::NodeView::fault`], never an
//!   error of the whole observation. Nodes are decoded as
//!   [`node::ObservedNode`], only the fields drover reads, which keeps the
//!   store at ~2 KiB per node.
//! - **Cordon / uncordon / progress** ([`cordon`]) are merge patches of
//!   `spec.unschedulable` and drover's annotations in one request, each with a
//!   `resourceVersion` precondition so the check that justifies the write
//!   (e.g. "drover cordoned this node") holds for exactly the version written.
//! - **Drain** ([`drain`]) goes through the Eviction API only; pods are never deleted.
//! - **Objects** ([`objects`]): labels, annotation keys, Job names and
//!   attempts, Job status and the run a Job stands for
//!   ([`objects::run_seen`]), which pods a drain must evict; a leaf the
//!   others read.
//! - **What a driver said** ([`termination`]): a failed Job's pod's
//!   termination message, on the node's record ahead of the Job's message.
//! - **Drivers** ([`driver`]) are Jobs pinned to the node, named per node,
//!   version and attempt so a repeated start is a 409 and never a second run.
//!   A Job is also drover's record of `preparing` and `upgrading`
//!   ([`crate::cluster::effective`]): the observation hands every node's
//!   Jobs to it, and no node patch records either state. Writes per node
//!   upgraded with `prepare`: the prepare Job, the cordon (`draining`), the
//!   upgrade Job, one `deletecollection` of the node's Jobs and the uncordon
//!   (5; the agent's `Upgraded` Event makes 6), measured from the audit log
//!   by `tests/agent/agent_writes.rs`; without `prepare` 4 (and the Event).
//!
//! Job cleanup comes first in a give-back: before the write that hands a
//! node back (`uncordon`, or `set_progress` to `blocked`, `failed`,
//! `watching` or none) the node's drover Jobs are deleted (propagation
//! Background; the observation forgets them at once, so a deleted prepare
//! Job the watch still shows is no one's record): every one when its
//! record is cleared or its watch begins (the run is over: one
//! `deletecollection` by the node's label, which takes its prepare and
//! upgrade Jobs in one request), each of those still running, one by one,
//! when it is given back blocked or
//! failed (finished ones are kept for inspection until their
//! `ttlSecondsAfterFinished`). A delete that fails fails the give-back: the
//! node keeps its in-flight record and its cordon, so the engine gives it
//! back again on its next pass until the Jobs are gone, and a late driver
//! can never reboot a node that is back in service. A running Job that is
//! the node's only record of its state is recorded on the node by the
//! engine before such a give-back ([`crate::rollout::Action::Record`]).

pub mod cordon;
pub mod drain;
pub mod driver;
mod health;
pub mod node;
pub mod objects;
pub mod observe;
pub mod termination;

use crate::cluster::{Cluster, EvictionPass, NodeProgress, NodeView, ProgressState};
use crate::config::{DriverSpec, EnvConfig, NodesSpec};
use kube::Client;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::Instrument;

/// User-Agent of drover's API requests.
pub const USER_AGENT: &str = concat!("drover/", env!("CARGO_PKG_VERSION"));

/// Field manager recorded on every write drover makes.
pub const FIELD_MANAGER: &str = "drover";

/// An error of the Kubernetes backend; every variant names the node or object and the call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client could not be built from the config.
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// An API call about a node failed.
    #[error("{call} on node {node} failed: {}", brief(.source))]
    Node {
        /// The node.
        node: String,
        /// The call (`cordon`, `evict pod ns/name`, ...).
        call: String,
        /// The API error, with its status.
        #[source]
        source: kube::Error,
    },
    /// An API call not tied to one node failed.
    #[error("{call} failed: {}", brief(.source))]
    Api {
        /// The call and its object.
        call: String,
        /// The API error, with its status.
        #[source]
        source: kube::Error,
    },
    /// The node does not exist (any more).
    #[error("node {node} not found ({call})")]
    NodeGone {
        /// The node.
        node: String,
        /// The call that found it missing.
        call: &'static str,
    },
    /// Defense in depth: the node is cordoned and drover's record does not say drover cordoned it.
    #[error("refusing to uncordon node {node}: it is cordoned and its drover.dev/cordoned annotation does not say drover cordoned it")]
    NotCordonedByDrover {
        /// The node.
        node: String,
    },
    /// Defense in depth: the write would erase the record that drover cordoned a still-cordoned node.
    #[error("refusing to write progress on node {node}: drover cordoned it and the write would drop that record while it is still cordoned")]
    WouldDropCordonRecord {
        /// The node.
        node: String,
    },
    /// Every conditional write lost against a concurrent writer.
    #[error("{call} on node {node}: gave up after {attempts} conflicting writes")]
    Conflict {
        /// The node.
        node: String,
        /// The call.
        call: &'static str,
        /// Attempts made.
        attempts: u32,
    },
    /// A watch did not deliver its initial list in time.
    #[error("watch of {what} not ready within {timeout:?}")]
    NotReady {
        /// What is watched.
        what: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// A node has more pods than drover reads of one node (a drain pass, a health read).
    #[error("node {node} has more than {limit} pods; drover reads at most {limit} of a node's pods, never part of them")]
    TooManyPods {
        /// The node.
        node: String,
        /// Most pods a pass reads.
        limit: usize,
    },
    /// The Bottlerocket driver has no image to run (docs/drivers.md).
    #[error("{why}")]
    NoUpdaterImage {
        /// What to set.
        why: String,
    },
    /// An upgrade Job could not be built from the config.
    #[error("building the upgrade Job for node {node}: {why}")]
    BuildJob {
        /// The node.
        node: String,
        /// What went wrong.
        why: String,
    },
}

/// How a [`KubeCluster`] talks to one cluster for one environment: all of
/// the environment's config that reaches the cluster view, so two views
/// built from equal options behave alike (the agent rebuilds its view when
/// they differ).
#[derive(Debug, Clone, PartialEq)]
pub struct KubeOptions {
    /// The cluster's name, for logs and status reports.
    pub cluster_name: String,
    /// Namespace of the agent, where upgrade Jobs run.
    pub namespace: String,
    /// Label selector choosing the nodes (`[rollout] node_selector`); empty selects all.
    pub node_selector: String,
    /// How a node's version is read.
    pub nodes: NodesSpec,
    /// How the OS update is applied.
    pub driver: DriverSpec,
    /// `activeDeadlineSeconds` of upgrade Jobs (the environment's `node_timeout`).
    pub job_deadline: Option<Duration>,
    /// `ttlSecondsAfterFinished` of upgrade Jobs, for the ones drover keeps (failed runs).
    pub job_ttl: Duration,
    /// Longest wait for a watch's initial list.
    pub ready_timeout: Duration,
    /// Most pod watches held at once ([`observe::MAX_POD_WATCHES`]); the
    /// nodes beyond have their pods listed instead.
    pub pod_watches: usize,
}

impl KubeOptions {
    /// Options for environment `env` of cluster `cluster_name`, with Jobs in `namespace`.
    pub fn from_env(cluster_name: &str, namespace: &str, env: &EnvConfig) -> Self {
        KubeOptions {
            cluster_name: cluster_name.to_string(),
            namespace: namespace.to_string(),
            node_selector: env.rollout.node_selector.clone(),
            nodes: env.nodes.clone(),
            driver: env.driver.clone(),
            job_deadline: Some(env.rollout.node_timeout),
            job_ttl: Duration::from_secs(7 * 24 * 3600),
            ready_timeout: Duration::from_secs(60),
            pod_watches: observe::MAX_POD_WATCHES,
        }
    }
}

/// The Kubernetes backend of [`Cluster`]; clones share the same watches.
#[derive(Clone)]
pub struct KubeCluster {
    inner: Arc<observe::Observer>,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster")
            .field("cluster", &self.inner.opts.cluster_name)
            .field("namespace", &self.inner.opts.namespace)
            .finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// Start the watches (nodes, drover's Jobs, PodDisruptionBudgets) and
    /// wait until each has delivered its initial list. The watches stop when
    /// the last clone is dropped.
    ///
    /// It builds its own client from `config` with [`client`]: no retry
    /// layer (an eviction refused by a PodDisruptionBudget is reported, and
    /// drover retries at the engine's step cadence); its writes are not
    /// bound in time (`drover plan` only reads; the agent builds its
    /// clusters with [`KubeCluster::with_write_timeout`]).
    pub async fn new(config: kube::Config, opts: KubeOptions) -> Result<KubeCluster, Error> {
        let inner = observe::Observer::start(client(config, None)?, opts).await?;
        Ok(KubeCluster { inner })
    }

    /// [`KubeCluster::new`] with each write bound by `write_timeout`: the
    /// agent's backend, whose writes must not outlive its lease (it derives
    /// the bound from the lease, see [`client`]).
    pub async fn with_write_timeout(
        config: kube::Config,
        opts: KubeOptions,
        write_timeout: Duration,
    ) -> Result<KubeCluster, Error> {
        // The agent's backend: a view whose driver has no image would
        // cordon and drain nodes for Jobs it cannot create. Refused before
        // anything is watched, with the setting to fix.
        opts.driver
            .updater_image()
            .map_err(|why| Error::NoUpdaterImage { why })?;
        let client = client(config, Some(write_timeout))?;
        let inner = observe::Observer::start(client, opts).await?;
        Ok(KubeCluster { inner })
    }

    /// A receiver whose value changes whenever something the engine decides
    /// on changes (a node's readiness, version, schedulability or drover
    /// annotations; a drover Job; a PDB; a pod on a node being drained):
    /// reconcile on `changed()` instead of polling.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// The namespace upgrade Jobs run in.
    pub fn namespace(&self) -> &str {
        &self.inner.opts.namespace
    }

    /// The options it was built with.
    pub fn options(&self) -> &KubeOptions {
        &self.inner.opts
    }

    /// Pod watches running now (at most [`KubeOptions::pod_watches`]).
    pub fn pod_watches(&self) -> usize {
        self.inner.pod_watches()
    }

    /// Whether every pod watch running has delivered its first list.
    pub fn pod_watches_synced(&self) -> bool {
        self.inner.pod_watches_synced()
    }
}

impl Cluster for KubeCluster {
    type Error = Error;

    fn name(&self) -> &str {
        &self.inner.opts.cluster_name
    }

    async fn observe(&self) -> Result<Vec<NodeView>, Error> {
        self.inner.observe().await
    }

    async fn cordon(&self, node: &str, progress: &NodeProgress) -> Result<(), Error> {
        let span = tracing::info_span!("cordon", node = %node, target = %progress.target);
        cordon::cordon(&self.inner, node, progress)
            .instrument(span)
            .await
    }

    async fn uncordon(&self, node: &str, progress: Option<&NodeProgress>) -> Result<(), Error> {
        let span = tracing::info_span!("uncordon", node = %node, state = progress.map(|p| p.state.as_str()).unwrap_or("cleared"));
        async {
            self.before_give_back(node, progress).await?;
            cordon::uncordon(&self.inner, node, progress).await
        }
        .instrument(span)
        .await
    }

    async fn set_progress(&self, node: &str, progress: Option<&NodeProgress>) -> Result<(), Error> {
        let span = tracing::info_span!("set_progress", node = %node, state = progress.map(|p| p.state.as_str()).unwrap_or("cleared"));
        async {
            self.before_give_back(node, progress).await?;
            cordon::set_progress(&self.inner, node, progress).await
        }
        .instrument(span)
        .await
    }

    async fn evict(&self, node: &str) -> Result<EvictionPass, Error> {
        let span = tracing::info_span!("evict", node = %node);
        drain::evict(&self.inner, node).instrument(span).await
    }

    async fn start_upgrade(&self, node: &str, progress: &NodeProgress) -> Result<(), Error> {
        let span = tracing::info_span!("start_upgrade", node = %node, target = %progress.target);
        driver::start(&self.inner, node, progress)
            .instrument(span)
            .await
    }

    async fn mark_rolled_back(
        &self,
        node: &str,
        progress: &NodeProgress,
        rolled_back: &[semver::Version],
        uncordon: bool,
    ) -> Result<(), Error> {
        let span = tracing::info_span!("mark_rolled_back", node = %node, from = %progress.target);
        async {
            // The rollback's run is over: no Job of it may outlive the uncordon.
            driver::cleanup(&self.inner, node, false).await?;
            cordon::mark_rolled_back(&self.inner, node, progress, rolled_back, uncordon).await
        }
        .instrument(span)
        .await
    }

    async fn health(&self, nodes: &[String]) -> Result<Vec<crate::cluster::NodeSeen>, Error> {
        self.inner.health(nodes).await
    }
}

impl KubeCluster {
    // Job cleanup before a node leaves drover's hands (see the module docs).
    async fn before_give_back(
        &self,
        node: &str,
        progress: Option<&NodeProgress>,
    ) -> Result<(), Error> {
        match progress.map(|p| p.state) {
            None => driver::cleanup(&self.inner, node, true).await,
            Some(ProgressState::Blocked | ProgressState::Failed) => {
                driver::cleanup(&self.inner, node, false).await
            }
            // Back at the version: the run is over, as for a completed node.
            Some(ProgressState::Watching) => driver::cleanup(&self.inner, node, true).await,
            Some(
                ProgressState::Draining
                | ProgressState::Upgrading
                | ProgressState::Passed
                | ProgressState::RollingBack
                | ProgressState::Preparing,
            ) => Ok(()),
        }
    }
}

/// An API error in one line: the server's message, code and reason,
/// without the whole `Status` object kube's own text appends (this text
/// ends up in node records, Events and the status).
pub(crate) fn brief(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}

/// The agent backend's write bound when it is not given one: the agent's
/// default lease (15 s, given up at 10 s without renewal) leaves 5 s
/// between giving up and another replica taking over; a write must be
/// answered well inside that.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(4);

/// The API client every part of drover uses, built from `config`:
///
/// - without kube's default retry layer, which re-sends a 429, 503 or 504
///   up to 15 times with a backoff growing to minutes: an eviction refused
///   by a PodDisruptionBudget would hang the drain, and Events throttled by
///   API priority and fairness would hold whatever awaits them. drover
///   retries at its own cadence (the engine's next step, the status
///   writer's and the Event publisher's own loops) and says so.
/// - with `write_timeout`, every request that is not a read (anything but
///   GET and HEAD) given up when its answer has not started in time: a
///   write stuck on a stalled connection cannot land long after the
///   decision that made it (the backend's client, whose writes are the
///   engine's, gets a bound below the time between losing and handing over
///   the lease). Reads and watches are not bound here: a watch's answer
///   streams for minutes, and a read changes nothing. Callers that bound
///   each call themselves (the lease's renewal, by its own deadline) pass
///   `None`.
/// - naming drover in its User-Agent (kube-rs sends none), unless
///   `config` already sets one, so API server logs and audit events show
///   who made each call.
pub fn client(mut config: kube::Config, write_timeout: Option<Duration>) -> Result<Client, Error> {
    config.default_retry = false;
    if !config
        .headers
        .iter()
        .any(|(k, _)| k == http::header::USER_AGENT)
    {
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static(USER_AGENT),
        ));
    }
    let builder = kube::client::ClientBuilder::try_from(config).map_err(Error::Client)?;
    Ok(match write_timeout {
        Some(limit) => builder.with_layer(&bound::WriteTimeoutLayer(limit)).build(),
        None => builder.build(),
    })
}

/// The tower layer behind [`client`]'s write bound.
mod bound {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;
    use tower::{BoxError, Layer, Service};

    /// A write whose answer did not start in time.
    #[derive(Debug, thiserror::Error)]
    #[error("{method} {path}: no answer within {limit:?} (write given up)")]
    pub struct WriteTimedOut {
        method: http::Method,
        path: String,
        limit: Duration,
    }

    pub struct WriteTimeoutLayer(pub Duration);

    impl<S> Layer<S> for WriteTimeoutLayer {
        type Service = WriteTimeout<S>;
        fn layer(&self, inner: S) -> WriteTimeout<S> {
            WriteTimeout {
                inner,
                limit: self.0,
            }
        }
    }

    #[derive(Clone)]
    pub struct WriteTimeout<S> {
        inner: S,
        limit: Duration,
    }

    type Answer<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

    impl<S, B> Service<http::Request<B>> for WriteTimeout<S>
    where
        S: Service<http::Request<B>>,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        type Response = S::Response;
        type Error = BoxError;
        type Future = Answer<S::Response>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            self.inner.poll_ready(cx).map_err(Into::into)
        }

        fn call(&mut self, req: http::Request<B>) -> Self::Future {
            let read = matches!(*req.method(), http::Method::GET | http::Method::HEAD);
            let (method, path) = (req.method().clone(), req.uri().path().to_string());
            let limit = self.limit;
            let answer = self.inner.call(req);
            Box::pin(async move {
                if read {
                    return answer.await.map_err(Into::into);
                }
                match tokio::time::timeout(limit, answer).await {
                    Ok(r) => r.map_err(Into::into),
                    Err(_) => Err(Box::new(WriteTimedOut {
                        method,
                        path,
                        limit,
                    }) as BoxError),
                }
            })
        }
    }
}

/// Whether an API error has HTTP status `code`.
pub(crate) fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}
