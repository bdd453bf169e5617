//! The guard between the engine and the cluster: once leadership is lost or
//! shutdown began, no new call reaches the cluster (the one in flight
//! finishes); it also keeps what the engine observed, for metrics and reports.

use crate::cluster::{Cluster, EvictionPass, NodeProgress, NodeSeen, NodeView};
use std::sync::Mutex;
use tokio::sync::watch;

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
pub(super) struct Guarded<'a, C> {
    inner: &'a C,
    cancel: watch::Receiver<bool>,
    observed: Mutex<Vec<NodeView>>,
}

impl<'a, C: Cluster + Sync> Guarded<'a, C> {
    /// `inner`, refused once `cancel` reads true.
    pub(super) fn new(inner: &'a C, cancel: &watch::Receiver<bool>) -> Self {
        Guarded {
            inner,
            cancel: cancel.clone(),
            observed: Mutex::new(Vec::new()),
        }
    }

    /// The nodes the last `observe` through the guard saw.
    pub(super) fn into_observed(self) -> Vec<NodeView> {
        self.observed
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
    }

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
