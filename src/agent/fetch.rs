//! Stage 1, fetch: bring the config repository's head into the cache and
//! record the outcome (CRD status `lastFetch`, metrics, readiness).

use super::crd::FetchRecord;
use super::{blocking, lock, rfc3339, Acting, ClusterBackend};
use chrono::Utc;
use tokio::sync::watch;

impl<B: ClusterBackend> Acting<B> {
    /// Fetch and record the outcome; false when `cancel` stopped it first.
    ///
    /// A cancelled fetch is abandoned, not awaited: a slow or stalled server
    /// must not hold a SIGTERM past the pod's grace period or keep a replica
    /// that lost its lease busy. The abort flag ends the transfer at its next
    /// progress callback; a server that sends nothing is bounded by the
    /// source's socket timeout, on a blocking thread nobody waits for.
    pub(super) async fn fetch(&mut self, cancel: &watch::Receiver<bool>) -> bool {
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
        self.crd_status.last_fetch = Some(FetchRecord {
            time: rfc3339(now),
            result: result_text,
        });
        self.fetched_once = true;
        self.ready.set_fetched();
        true
    }
}
