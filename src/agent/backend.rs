//! The Kubernetes backend factory: builds the cluster view the engine drives
//! for an environment's node settings, and rebuilds it when they change.

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
