//! The Kubernetes backend factory: builds the cluster view the engine drives
//! for an environment's settings, and rebuilds it when any of them changes.

use crate::cluster::Cluster;
use crate::config::EnvConfig;
use futures::stream::BoxStream;
use futures::StreamExt;
use std::future::Future;

/// A cluster view built for an environment's node settings, and its change notifications.
pub struct Connected<C> {
    /// The cluster the engine drives.
    pub cluster: C,
    /// Yields when something the engine reads changed (nodes, pods, upgrade runs).
    pub changes: BoxStream<'static, ()>,
}

/// Builds the cluster view for an environment's settings.
pub trait ClusterBackend: Send + 'static {
    /// The cluster type.
    type Cluster: Cluster + Send + Sync + 'static;
    /// Why a cluster view could not be built.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Everything of an environment's config that reaches the cluster view
    /// (selector, driver, version regex, the Jobs' deadline, ...): the agent
    /// keeps a view while these are equal and builds a new one when they
    /// differ, so no setting is ever left behind in a cached view.
    type Settings: PartialEq + Clone + Send + Sync + 'static;

    /// The settings `env` gives the view of cluster `cluster_name`.
    fn settings(&self, cluster_name: &str, env: &EnvConfig) -> Self::Settings;

    /// Build the cluster view for `settings`.
    fn connect(
        &mut self,
        settings: &Self::Settings,
    ) -> impl Future<Output = Result<Connected<Self::Cluster>, Self::Error>> + Send;

    /// A client that reads the cluster the views act on, for the preflight
    /// before a window (`super::preflight`); `None` (the default: a backend
    /// without an API server to read, the simulations) runs none.
    fn reader(&self) -> Option<kube::Client> {
        None
    }
}

/// The Kubernetes backend: a [`KubeCluster`](crate::kubernetes::KubeCluster)
/// per set of node settings, driver Jobs in their namespace, node records
/// in the agent's.
#[derive(Clone)]
pub struct KubeBackend {
    config: kube::Config,
    namespace: String,
    records_namespace: String,
    write_timeout: std::time::Duration,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl KubeBackend {
    /// Clusters built from `config` (the backend makes its own client);
    /// Jobs run in `namespace`, node records are kept in `records_namespace`
    /// (the agent's own).
    pub fn new(config: kube::Config, namespace: &str, records_namespace: &str) -> Self {
        KubeBackend {
            config,
            namespace: namespace.to_string(),
            records_namespace: records_namespace.to_string(),
            write_timeout: crate::kubernetes::DEFAULT_WRITE_TIMEOUT,
        }
    }

    /// Bound every write of the clusters it builds by `limit` (the agent's
    /// [`AgentConfig::write_timeout`](super::AgentConfig::write_timeout)).
    pub fn with_write_timeout(mut self, limit: std::time::Duration) -> Self {
        self.write_timeout = limit;
        self
    }
}

impl ClusterBackend for KubeBackend {
    type Cluster = crate::kubernetes::KubeCluster;
    type Error = crate::kubernetes::Error;
    type Settings = crate::kubernetes::KubeOptions;

    fn settings(&self, cluster_name: &str, env: &EnvConfig) -> Self::Settings {
        crate::kubernetes::KubeOptions::from_env(
            cluster_name,
            &self.namespace,
            &self.records_namespace,
            env,
        )
    }

    async fn connect(
        &mut self,
        opts: &Self::Settings,
    ) -> Result<Connected<Self::Cluster>, Self::Error> {
        let cluster = crate::kubernetes::KubeCluster::with_write_timeout(
            self.config.clone(),
            opts.clone(),
            self.write_timeout,
        )
        .await?;
        let rx = cluster.changes();
        let changes = futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
        .boxed();
        Ok(Connected { cluster, changes })
    }

    fn reader(&self) -> Option<kube::Client> {
        crate::kubernetes::client(self.config.clone(), None).ok()
    }
}
