//! One pass, as an ordered list of stages: fetch ([`super::fetch`], which
//! runs off the loop and ends in a pass of its own) → admit
//! ([`super::admit`]: trust → config → gate, whose answer
//! [`super::recorded`] writes into the status, the applied commit durably
//! before anything acts on it) → act ([`super::act`]: the
//! engine) → report ([`super::report`]: CRD status, status report, Events,
//! metrics, handed to the term's writers without waiting), in one
//! `reconcile` tracing span. None of it runs until the term has read the
//! status object (`status_known`): what the last leader applied is the
//! ground every stage stands on.

use super::admit::{Admission, Recovery};
use super::hooks::{PassRecord, Wake};
use super::recorded::Applied;
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
        let head = if self.fetching.ended_in_term {
            lock(&self.source).fetched()
        } else {
            None
        };
        if let Some(h) = head {
            self.told.head(h);
        }
        // `commit` is the applied commit, updated in the span if this pass applies a new one.
        let applied = self
            .told
            .status()
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
            if !self.status_known(cancel).await {
                return Next {
                    after: std::time::Duration::from_secs(1).min(self.cfg.tick),
                };
            }
            if !self.admit_stage(head).await {
                // The newest head was accepted but is not recorded yet, and
                // it may revoke, pause or re-pin what is applied: acting on
                // the older config meanwhile started a node the next pass
                // gave back (simulation seed 5754). The nodes are held as
                // they are, as while the status cannot be read (`write_durably`
                // has said why). What the head is still goes out with the
                // status's other fields.
                self.hand_over();
                return Next {
                    after: std::time::Duration::from_secs(1).min(self.cfg.tick),
                };
            }
            tracing::Span::current().record(
                "commit",
                tracing::field::display(
                    self.admitted
                        .active
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
        let _ = self.edges.passes.send(PassRecord {
            wake,
            started,
            head: head.map(|h| h.to_string()),
            applied: self.told.status().last_applied_commit.clone(),
            state: self.told.published_state(),
            refused: self.told.status().refused.clone(),
        });
        next
    }

    /// Admission's answer for `head`, recorded: a recovered or accepted
    /// commit is durable in the status before the agent acts on it (a
    /// restart must resume from it); a refusal is recorded as it stands.
    /// False when a recovered or accepted commit could not be recorded:
    /// the pass must not act on what was applied before it.
    async fn admit_stage(&mut self, head: Option<git2::Oid>) -> bool {
        let mut adopt = false;
        if let (None, Some(head)) = (&self.told.status().last_applied_commit, head) {
            match self.recover_applied(head).await {
                Recovery::Found {
                    commit,
                    version,
                    named,
                } => {
                    if !self
                        .record_applied(&Applied::Recovered { commit, version })
                        .await
                    {
                        return false;
                    }
                    // Applied: the person's word is used up.
                    if let Some(value) = named {
                        self.consume_annotation(&value, "used: the agent starts from it")
                            .await;
                    }
                }
                Recovery::Refused(r) => {
                    self.record_refused(Some((r.refused(), r.version()))).await;
                    return true;
                }
                Recovery::Nothing => adopt = true,
            }
        }
        match self.admit_head(head, adopt).await {
            Admission::Unjudged => {}
            Admission::Current => self.record_refused(None).await,
            Admission::Refused(r) => self.record_refused(Some((r.refused(), r.version()))).await,
            Admission::Accepted(a) => {
                if !self.record_applied(&a.applied()).await {
                    return false;
                }
                self.take(*a).await;
            }
        }
        true
    }
}
