//! What admission decided, as the status object records it: the one writer
//! of the status's admission fields (`lastAppliedCommit`, `commit`,
//! `appliedVersion`, `refused`, and the target's state and counts a new
//! target resets). Admission (`admit.rs`) returns values, an [`Applied`]
//! or a refusal, and never writes the status; this file turns them into it.
//!
//! An applied commit is written durably before the agent acts on it: a
//! restart or a takeover resumes from the status object's applied commit,
//! so a commit acted on but not recorded would be judged again, from the
//! older one, by the next leader, and its rollout started anew. The status this
//! term holds changes only once the write is stored
//! ([`Acting::write_durably`]): a failed write leaves the last good status
//! whole, with no restore to forget a field of.

use super::crd::{DroverStatusStatus, Refused};
use super::events::Severity;
use super::{short, Acting, ClusterBackend};
use git2::Oid;

/// An applied commit, as admission hands it to the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Applied {
    /// The commit to start from when none was recorded (this cluster's own
    /// signed reports, or a commit a person named), and the version it pins
    /// when its config loads.
    Recovered {
        commit: Oid,
        version: Option<String>,
    },
    /// A new head accepted, pinning `version`.
    Accepted { commit: Oid, version: String },
}

/// `status` recording `applied`: pure, so what a failed write leaves is
/// the status as it was.
pub(super) fn recorded(status: &DroverStatusStatus, applied: &Applied) -> DroverStatusStatus {
    let mut next = status.clone();
    let commit = match applied {
        Applied::Recovered { commit, version } => {
            if let Some(v) = version {
                next.applied_version = Some(v.clone());
            }
            commit
        }
        Applied::Accepted { commit, version } => {
            if next.applied_version.as_deref() != Some(version.as_str()) {
                // A new target: the old counts and state say nothing about it.
                next.target = Some(version.clone());
                next.state = None;
                next.since = None;
                next.at_version = None;
                next.nodes_at_version = 0;
            }
            next.applied_version = Some(version.clone());
            next.refused = None;
            commit
        }
    };
    next.last_applied_commit = Some(commit.to_string());
    next.commit = Some(short(&commit.to_string()));
    next
}

impl<B: ClusterBackend> Acting<B> {
    /// Record `applied` durably; false when the write failed (the status
    /// is as it was, and the agent must not act on the commit yet).
    pub(super) async fn record_applied(&mut self, applied: &Applied) -> bool {
        let next = recorded(self.told.status(), applied);
        if !self.write_durably(next).await {
            return false;
        }
        if let Applied::Accepted { .. } = applied {
            self.told.refused(None, None);
        }
        true
    }

    /// Record the newest head's refusal (`None`: none stands), with the
    /// version the refused commit pins. One Event per refusal: a refusal
    /// is its commit, check and reason; a new message for the same refusal
    /// (another cluster confirmed meanwhile) updates the status, not the Events.
    pub(super) async fn record_refused(
        &mut self,
        refusal: Option<(&Refused, Option<&semver::Version>)>,
    ) {
        let same = |a: &Refused, b: &Refused| {
            (&a.commit, &a.stage, &a.reason) == (&b.commit, &b.stage, &b.reason)
        };
        let r = refusal.map(|(r, _)| r);
        let new = match (&self.told.status().refused, r) {
            (Some(old), Some(r)) => !same(old, r),
            (None, Some(_)) => true,
            (_, None) => false,
        };
        self.edges
            .metrics
            .set_blocked(r.map(|r| (r.stage.as_str(), r.reason.as_str())));
        if new {
            if let Some(r) = r {
                self.edges
                    .events
                    .on_status(
                        Severity::Warning,
                        "Refused",
                        "Verify",
                        format!(
                            "commit {} not applied ({} check, {}): {}",
                            short(&r.commit),
                            r.stage,
                            r.reason,
                            r.message
                        ),
                    )
                    .await;
            }
        }
        self.told
            .refused(r.cloned(), refusal.and_then(|(_, v)| v.cloned()));
    }

    /// Write `next` and wait until it is stored, then hold it as this
    /// term's status: for what must be durable before the agent acts on it
    /// (a newly applied commit, the node records' migration). Bounded by
    /// one API call's timeout; false when it failed, timed out, was
    /// superseded or the term ended, and the status held is unchanged (the
    /// next pass tries again).
    pub(super) async fn write_durably(&mut self, mut next: DroverStatusStatus) -> bool {
        self.assemble_conditions(&mut next);
        let Some(t) = &self.term.tasks else {
            return false;
        };
        if !t.writer.write(&next, super::API_CALL_TIMEOUT).await {
            if let Some(n) = self.pace.allow("status-write") {
                tracing::warn!(
                    suppressed = n,
                    "the status object could not be written: holding the nodes as they are until it is"
                );
            }
            return false;
        }
        self.told.stored(next);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::crd::SeenFailure;

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    /// A status with every field set, as a confirmed cluster's is.
    fn confirmed() -> DroverStatusStatus {
        DroverStatusStatus {
            target: Some("1.12.0".into()),
            state: Some("confirmed".into()),
            blocker: None,
            since: Some("2026-12-01T00:00:00Z".into()),
            at_version: Some("3/3".into()),
            nodes: 3,
            nodes_at_version: 3,
            up_to_date_nodes: 3,
            ready_nodes: 3,
            last_applied_commit: Some(oid(1).to_string()),
            applied_version: Some("1.12.0".into()),
            commit: Some(short(&oid(1).to_string())),
            head_commit: Some(oid(2).to_string()),
            refused: Some(Refused {
                commit: oid(2).to_string(),
                stage: "gate".into(),
                reason: "not_confirmed".into(),
                message: "stage not confirmed".into(),
            }),
            failures_seen: vec![SeenFailure {
                cluster: "stage-2".into(),
                version: "1.12.0".into(),
                at: "2026-11-30T00:00:00Z".into(),
                message: "upgrade failed".into(),
            }],
            message: "3/3 nodes at 1.12.0".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_new_target_resets_what_the_old_one_said_and_clears_the_refusal() {
        let before = confirmed();
        let next = recorded(
            &before,
            &Applied::Accepted {
                commit: oid(2),
                version: "1.13.0".into(),
            },
        );
        let want = DroverStatusStatus {
            target: Some("1.13.0".into()),
            state: None,
            since: None,
            at_version: None,
            nodes_at_version: 0,
            last_applied_commit: Some(oid(2).to_string()),
            applied_version: Some("1.13.0".into()),
            commit: Some(short(&oid(2).to_string())),
            refused: None,
            ..before.clone()
        };
        assert_eq!(next, want);
        // The same version again (a new commit pinning it): the rollout's
        // state and counts still hold.
        let same = recorded(
            &before,
            &Applied::Accepted {
                commit: oid(3),
                version: "1.12.0".into(),
            },
        );
        assert_eq!(
            (same.state.as_deref(), same.nodes_at_version, same.refused),
            (Some("confirmed"), 3, None)
        );
    }

    #[test]
    fn a_recovered_commit_keeps_the_rest_of_the_status() {
        let before = DroverStatusStatus {
            last_applied_commit: None,
            commit: None,
            ..confirmed()
        };
        let next = recorded(
            &before,
            &Applied::Recovered {
                commit: oid(4),
                version: None,
            },
        );
        assert_eq!(
            next,
            DroverStatusStatus {
                last_applied_commit: Some(oid(4).to_string()),
                commit: Some(short(&oid(4).to_string())),
                ..before.clone()
            }
        );
    }
}
