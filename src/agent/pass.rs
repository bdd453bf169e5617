//! One pass, as an ordered list of stages: fetch ([`super::fetch`]) →
//! admit ([`super::admit`]: trust → config → gate) → act ([`super::act`]:
//! the engine) → report ([`super::report`]: CRD status, status report,
//! Events, metrics), in one `reconcile` tracing span.

use super::hooks::{PassRecord, Wake};
use super::{lock, short, Acting, ClusterBackend, Next};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::Instrument;

impl<B: ClusterBackend> Acting<B> {
    /// One pass: fetch if asked, judge a new head, reconcile, report.
    pub(super) async fn pass(&mut self, wake: Wake, cancel: &watch::Receiver<bool>) -> Next {
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
        self.crd_status.head_commit = head.map(|h| h.to_string());
        // `commit` is the applied commit, updated in the span if this pass applies a new one.
        let applied = self
            .crd_status
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
            self.write_crd_status().await;
            self.publish().await;
            next
        }
        .instrument(span)
        .await;
        let _ = self.passes.send(PassRecord {
            wake,
            started,
            head: head.map(|h| h.to_string()),
            applied: self.crd_status.last_applied_commit.clone(),
            state: self.last_published.as_ref().map(|r| r.state),
            refused: self.crd_status.refused.clone(),
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
}
