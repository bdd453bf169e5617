//! One pass, as an ordered list of stages: fetch ([`super::fetch`], which
//! runs off the loop and ends in a pass of its own) → admit
//! ([`super::admit`]: trust → config → gate) → act ([`super::act`]: the
//! engine) → report ([`super::report`]: CRD status, status report, Events,
//! metrics, handed to the term's writers without waiting), in one
//! `reconcile` tracing span.

use super::hooks::{PassRecord, Wake};
use super::{lock, short, Acting, ClusterBackend, Next};
use std::time::Instant;
use tokio::sync::watch;
use tracing::Instrument;

impl<B: ClusterBackend> Acting<B> {
    /// One pass: judge the newest head fetched in this term, reconcile, report.
    pub(super) async fn pass(&mut self, wake: Wake, cancel: &watch::Receiver<bool>) -> Next {
        let started = Instant::now();
        // Another replica wrote the status since this term read it: start
        // from what it left rather than overwrite it.
        self.adopt_superseded();
        // A head fetched before this term (by the follower, or long ago)
        // is not judged: the applied commit may have moved since.
        let head = if self.term_fetched {
            lock(&self.source).fetched()
        } else {
            None
        };
        if let Some(h) = head {
            self.crd_status.head_commit = Some(h.to_string());
        }
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
            self.hand_over();
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
        next
    }
}
