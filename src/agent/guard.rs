//! The guard between the engine and the cluster: once leadership is lost or
//! shutdown began, no new call reaches the cluster and the one in flight is
//! given up at once rather than awaited (a cordon or an eviction must not
//! land after another replica may have taken over; each write request is
//! also bound by the client's write timeout, below the time between giving
//! up the lease and its expiry, see `kubernetes::client`). It also keeps
//! what the engine observed, for metrics and reports.

use crate::cluster::{
    Cluster, Cordoned, EvictionPass, NodeSeen, NodeView, RecordWrite, RunLink, RunStart, Stored,
};
use crate::record::legacy::LegacyNode;
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

/// A cluster whose calls check, before each one, that the agent may still
/// act, and race that for as long as they run: after leadership is lost no
/// new call starts and the one in flight is dropped (a request it had
/// already sent may still be answered; its effect is then what the next
/// leader observes). It also keeps the nodes the engine observed.
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

    /// `call`, unless the agent stops acting first (checked before it starts).
    async fn guarded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, C::Error>>,
    ) -> Result<T, GuardError<C::Error>> {
        self.check()?;
        let mut cancel = self.cancel.clone();
        tokio::select! {
            biased;
            _ = cancel.wait_for(|c| *c) => Err(GuardError::Stopped),
            r = call => r.map_err(GuardError::Cluster),
        }
    }
}

impl<C: Cluster + Sync> Cluster for Guarded<'_, C> {
    type Error = GuardError<C::Error>;

    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn observe(&self) -> Result<Vec<NodeView>, Self::Error> {
        let nodes = self.guarded(self.inner.observe()).await?;
        *self.observed.lock().unwrap_or_else(|e| e.into_inner()) = nodes.clone();
        Ok(nodes)
    }

    async fn write_record(&self, write: &RecordWrite) -> Result<Stored, Self::Error> {
        self.guarded(self.inner.write_record(write)).await
    }

    async fn cordon(&self, node: &str) -> Result<Cordoned, Self::Error> {
        self.guarded(self.inner.cordon(node)).await
    }

    async fn uncordon(&self, node: &str) -> Result<(), Self::Error> {
        self.guarded(self.inner.uncordon(node)).await
    }

    async fn taint(&self, node: &str) -> Result<(), Self::Error> {
        self.guarded(self.inner.taint(node)).await
    }

    async fn evict(
        &self,
        node: &str,
        order: &crate::cluster::DrainOrder<'_>,
    ) -> Result<EvictionPass, Self::Error> {
        self.guarded(self.inner.evict(node, order)).await
    }

    async fn start_run(&self, node: &str, start: &RunStart) -> Result<(), Self::Error> {
        self.guarded(self.inner.start_run(node, start)).await
    }

    async fn stop_run(&self, node: &str, run: &RunLink) -> Result<(), Self::Error> {
        self.guarded(self.inner.stop_run(node, run)).await
    }

    async fn health(&self, nodes: &[String]) -> Result<Vec<NodeSeen>, Self::Error> {
        self.guarded(self.inner.health(nodes)).await
    }

    async fn legacy(&self) -> Result<Vec<LegacyNode>, Self::Error> {
        self.guarded(self.inner.legacy()).await
    }

    async fn clear_legacy(&self, node: &str) -> Result<(), Self::Error> {
        self.guarded(self.inner.clear_legacy(node)).await
    }
}
