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
//! - **Records** ([`record`]): one `DroverNode` per node in the agent's
//!   namespace, drover's record of it (`crate::record`), written by the
//!   agent alone in one request per transition, conditional on the
//!   `resourceVersion` the decision read.
//! - **Cordon / uncordon** ([`cordon`]) are merge patches of
//!   `spec.unschedulable` alone, each with a `resourceVersion`
//!   precondition; the Node carries nothing else of drover's (the
//!   annotations earlier releases kept their records in are migrated once,
//!   then named and ignored).
//! - **Drain** ([`drain`]) goes through the Eviction API only; pods are never deleted.
//! - **Objects** ([`objects`]): labels, annotation keys, Job status and
//!   whether a Job is the run a record links to ([`objects::linked`]), which
//!   pods a drain must evict; a leaf the others read.
//! - **What a driver said** ([`termination`]): a failed Job's pod's
//!   termination message, on the node's record ahead of the Job's message.
//! - **Drivers** ([`driver`]) are Jobs pinned to the node, named by the
//!   record that starts them (planned in the record write before the Job
//!   is made), so a repeated start is a 409 and never a second run. Writes
//!   per node upgraded with `prepare`: the record (`preparing`), the prepare
//!   Job, the record (`draining`, its upgrade Job named), the cordon, the
//!   upgrade Job, the uncordon and the record (idle): 7, measured from the
//!   audit log by `tests/agent/agent_writes.rs`; without `prepare` 5.
//!   Finished Jobs are left to their `ttlSecondsAfterFinished`; a Job is
//!   deleted only when its run must stop (a timeout, a new pin while it
//!   prepares), after the record saying so, and the node is uncordoned
//!   only once its pods are gone.

pub mod cordon;
pub mod drain;
pub mod driver;
mod health;
pub mod node;
pub mod objects;
pub mod observe;
mod pods;
pub mod record;
pub mod termination;

use crate::cluster::{
    Cluster, Cordoned, EvictionPass, NodeView, RecordWrite, RunLink, RunStart, Stored,
};
use crate::config::{DriverSpec, EnvConfig, NodesSpec};
use crate::record::legacy::LegacyNode;
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
    #[error("refusing to uncordon node {node}: it is cordoned and drover's record of it does not say drover cordoned it")]
    NotCordonedByDrover {
        /// The node.
        node: String,
    },
    /// The node's record changed since the decision read it (another
    /// writer): nothing written, the next step reads it again.
    #[error("the record of node {node} changed since it was read; not written")]
    RecordChanged {
        /// The node.
        node: String,
    },
    /// A record came back from the API server unreadable.
    #[error("the record of node {node} cannot be read: {why}")]
    BadRecord {
        /// The node.
        node: String,
        /// Why.
        why: String,
    },
    /// A Job of the name a record gives its run exists and is not that
    /// record's run: nothing is started over it.
    #[error("node {node}: Job {job} exists and is not its record's run ({what})")]
    ForeignRun {
        /// The node.
        node: String,
        /// The Job.
        job: String,
        /// What it carries instead.
        what: String,
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
    /// Namespace of the upgrade Jobs.
    pub namespace: String,
    /// Namespace of the agent, where drover's node records are.
    pub records_namespace: String,
    /// The environment the agent serves (its records' label).
    pub environment: String,
    /// Label selector choosing the nodes (`[rollout] node_selector`); empty selects all.
    pub node_selector: String,
    /// How a node's version is read.
    pub nodes: NodesSpec,
    /// How the OS update is applied.
    pub driver: DriverSpec,
    /// `activeDeadlineSeconds` of upgrade Jobs (the environment's `node_timeout`).
    pub job_deadline: Option<Duration>,
    /// `ttlSecondsAfterFinished` of driver Jobs: finished runs are left to
    /// it (drover deletes only a run that must stop).
    pub job_ttl: Duration,
    /// Longest wait for a watch's initial list.
    pub ready_timeout: Duration,
    /// Most pod watches held at once ([`observe::MAX_POD_WATCHES`]); the
    /// nodes beyond have their pods listed instead.
    pub pod_watches: usize,
}

impl KubeOptions {
    /// Options for environment `env` of cluster `cluster_name`, with Jobs
    /// in `namespace` and records in `records_namespace`.
    pub fn from_env(
        cluster_name: &str,
        namespace: &str,
        records_namespace: &str,
        env: &EnvConfig,
    ) -> Self {
        KubeOptions {
            cluster_name: cluster_name.to_string(),
            namespace: namespace.to_string(),
            records_namespace: records_namespace.to_string(),
            environment: env.name.clone(),
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

    async fn write_record(&self, write: &RecordWrite) -> Result<Stored, Error> {
        let span = tracing::info_span!("write_record", node = %write.record.node);
        record::write(&self.inner, write).instrument(span).await
    }

    async fn cordon(&self, node: &str) -> Result<Cordoned, Error> {
        let span = tracing::info_span!("cordon", node = %node);
        cordon::cordon(&self.inner, node).instrument(span).await
    }

    async fn uncordon(&self, node: &str) -> Result<(), Error> {
        let span = tracing::info_span!("uncordon", node = %node);
        cordon::uncordon(&self.inner, node).instrument(span).await
    }

    async fn taint(&self, node: &str) -> Result<(), Error> {
        let span = tracing::info_span!("taint", node = %node);
        cordon::taint(&self.inner, node).instrument(span).await
    }

    async fn evict(
        &self,
        node: &str,
        order: &crate::cluster::DrainOrder<'_>,
    ) -> Result<EvictionPass, Error> {
        let span = tracing::info_span!("evict", node = %node);
        drain::evict(&self.inner, node, order)
            .instrument(span)
            .await
    }

    async fn start_run(&self, node: &str, start: &RunStart) -> Result<(), Error> {
        let span = tracing::info_span!("start_run", node = %node, job = %start.run.name);
        driver::start(&self.inner, node, start)
            .instrument(span)
            .await
    }

    async fn stop_run(&self, node: &str, run: &RunLink) -> Result<(), Error> {
        let span = tracing::info_span!("stop_run", node = %node, job = %run.name);
        driver::stop(&self.inner, node, run).instrument(span).await
    }

    async fn health(&self, nodes: &[String]) -> Result<Vec<crate::cluster::NodeSeen>, Error> {
        self.inner.health(nodes).await
    }

    async fn legacy(&self) -> Result<Vec<LegacyNode>, Error> {
        Ok(self.inner.legacy())
    }

    async fn clear_legacy(&self, node: &str) -> Result<(), Error> {
        cordon::clear_legacy(&self.inner, node).await
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
