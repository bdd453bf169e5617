//! Admission (docs/design.md §4–§6): the one path by which a config change
//! is judged, trust → config → gate, used by `drover check --base`, the
//! agent, `drover promote` and `drover demo`.
//!
//! This module is the pure core: a change's configs and policies in,
//! a [`Decision`] out. The evidence it needs comes through the narrow
//! [`EvidenceSource`] trait; [`git`] holds the edges that read configs,
//! policies and status reports from a repository.
//!
//! Rules (docs/design.md §4):
//! - a change is judged by the policy in force before it: `chain`,
//!   `evidence`, `status_branch`, `report_signers` (the path and the file's
//!   content), `revoked` and every environment's `soak`; a revoked version
//!   is refused in every environment, the first of the chain included, and
//!   a revocation covers every build-metadata variant of its version;
//! - a change that edits that policy and moves an existing environment's
//!   version is refused: the two go in separate changes. Deleting or adding
//!   an environment edits the chain;
//! - an environment the policy in force does not have (the change adds it)
//!   is judged by the policy in force too: only its place in the chain and
//!   its own soak, which that policy cannot say, come from the change, and
//!   the change may edit nothing else of the policy;
//! - `allow_downgrade` is honoured only when the change sets it (it was not
//!   true before);
//! - the lower environment's clusters are those listed before or after the
//!   change (a change cannot drop the cluster that has not confirmed).
//!
//! A change is a span of commits judged as one, whatever the commits on the
//! way did ([`git::judge_span`]): a pull request against its base, or the
//! agent's new head against its last applied commit.
//!
//! Chosen where the design is silent: `[clusters]` is not a policy key (a
//! cluster may be added beside a version move), but removing one does not
//! weaken the gate, as said above.

mod base;
pub mod bootstrap;
mod evidence;
pub mod git;
mod head;
mod history;
mod merge;
mod snapshot;

use crate::config::{Evidence, RepoConfig, Revoked};
use crate::gate::{
    judge, Decision, GateRequest, Lower, LowerEvidence, LowerHistory, Reason, Refusal,
};
use chrono::{DateTime, Utc};
use semver::Version;
use std::collections::BTreeMap;
use std::time::Duration;

pub use base::{check_base, ChangeReport, ConfirmationSource, StatusRead};
pub use bootstrap::{
    admit_named, check_trust, named_commit, trust_base, TrustBase, TrustInputs, TRUST_ANNOTATION,
};
pub use evidence::{env_evidence, evidence_of, scope_at, scope_of, status_scope};
pub use git::{judge_span, EnvVerdict, GitEvidence, Judged, Judgement};
pub use head::{admit_adoption, admit_head, Admitted, Rejection, Stage, TrustCheck};
pub use history::{lower_history, HistoryError};
pub use snapshot::{at_promotion_key, check_report_signers, snapshot, Snapshot};

/// Errors that stop admission from judging at all (as opposed to a refusal).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A git operation failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    /// A revision does not name a commit.
    #[error("revision {rev:?} does not name a commit: {source}")]
    Rev {
        /// The revision as given.
        rev: String,
        /// The git error.
        #[source]
        source: git2::Error,
    },
    /// The status branch could not be read.
    #[error(transparent)]
    Status(#[from] crate::status::Error),
    /// The config history could not be walked.
    #[error(transparent)]
    History(#[from] HistoryError),
    /// The report signers file of the policy in force cannot be parsed.
    #[error("{path} (report_signers of the policy in force): {message}")]
    Signers {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The environment is not in the promotion chain.
    #[error("environment {0:?} is not in the promotion chain of the policy in force")]
    NotInChain(String),
}

/// The promotion policy of one commit: what judges the next change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `[promotion] chain`.
    pub chain: Vec<String>,
    /// `[promotion] evidence`.
    pub evidence: Evidence,
    /// `[promotion] status_branch`.
    pub status_branch: String,
    /// `[promotion] report_signers` (a path in the config repository).
    pub report_signers: Option<String>,
    /// That file's content at the commit (`None`: unset or missing).
    pub signers_text: Option<String>,
    /// Each environment's `[promotion] soak`.
    pub soaks: BTreeMap<String, Duration>,
    /// `[promotion] revoked`: versions never rolled out again, with why.
    pub revoked: Vec<Revoked>,
    /// `[clusters]` (not an edit key; see the module doc).
    pub clusters: BTreeMap<String, Vec<String>>,
}

impl Policy {
    /// The policy of `cfg`, with the report signers file's content.
    pub fn of(cfg: &RepoConfig, signers_text: Option<String>) -> Self {
        Policy {
            chain: cfg.root.chain.clone(),
            evidence: cfg.root.evidence,
            status_branch: cfg.root.status_branch.clone(),
            report_signers: cfg.root.report_signers.clone(),
            signers_text,
            soaks: cfg
                .envs
                .iter()
                .map(|(n, e)| (n.clone(), e.promotion.soak))
                .collect(),
            revoked: cfg.root.revoked.clone(),
            clusters: cfg.root.clusters.clone(),
        }
    }

    /// The policy keys `after` changes, in the order of the file.
    pub fn edits(&self, after: &Policy) -> Vec<String> {
        let mut out = Vec::new();
        if self.chain != after.chain {
            out.push("chain".to_owned());
        }
        if self.evidence != after.evidence {
            out.push("evidence".to_owned());
        }
        if self.status_branch != after.status_branch {
            out.push("status_branch".to_owned());
        }
        if self.report_signers != after.report_signers {
            out.push("report_signers".to_owned());
        } else if self.signers_text != after.signers_text {
            out.push(format!(
                "the keys in {}",
                after.report_signers.as_deref().unwrap_or("report_signers")
            ));
        }
        if self.revoked != after.revoked {
            out.push("revoked".to_owned());
        }
        for (env, soak) in &self.soaks {
            if after.soaks.get(env).is_some_and(|s| s != soak) {
                out.push(format!("soak of {env}"));
            }
        }
        out
    }

    /// The policy keys `after` changes besides adding environments to the
    /// chain: what a change that adds an environment may not touch.
    fn edits_besides_new_envs(&self, after: &Policy) -> Vec<String> {
        let kept: Vec<&String> = after
            .chain
            .iter()
            .filter(|e| self.chain.contains(e))
            .collect();
        let mut same_chain = after.clone();
        same_chain.chain = kept.into_iter().cloned().collect();
        self.edits(&same_chain)
    }

    /// The environment below `env` in the chain; `None` for the first.
    fn lower(&self, env: &str) -> Option<Option<&str>> {
        let i = self.chain.iter().position(|e| e == env)?;
        Some(i.checked_sub(1).map(|j| self.chain[j].as_str()))
    }
}

/// What the status store says about one environment and version, for the gate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusEvidence {
    /// Cluster -> since when its standing, trusted confirmation counts.
    pub confirmations: BTreeMap<String, DateTime<Utc>>,
    /// Cluster -> why there is none, where the store says.
    pub notes: BTreeMap<String, String>,
    /// Why the environment's evidence is held, if it is (the store cannot
    /// be read or is refused, or a branch of its clusters does not count):
    /// the gate then refuses (docs/design.md §6, missing evidence holds).
    pub held: Option<String>,
}

/// Where the gate's evidence comes from (the git edge, or a test's values).
pub trait EvidenceSource {
    /// Status evidence read with `policy`'s branch and report signers: of
    /// `lower`'s `clusters`, each one's standing confirmation of `version`,
    /// why there is none for those the store says something about, and
    /// whether the environment's evidence is held.
    fn status(
        &mut self,
        policy: &Policy,
        lower: &str,
        clusters: &[String],
        version: &Version,
    ) -> Result<StatusEvidence, Error>;

    /// History evidence: how long `lower` has been configured at `version`,
    /// over the commits already on the base only.
    fn history(&mut self, lower: &str, version: &Version) -> Result<LowerHistory, Error>;
}

/// One change of the config: the config before it (`None` when there was
/// none) and after it, with their policies.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    /// The config before the change.
    pub before: Option<(&'a RepoConfig, &'a Policy)>,
    /// The config after it.
    pub after: (&'a RepoConfig, &'a Policy),
}

/// Judge `env`'s version move in `change` (the pure core of admission).
pub fn judge_env(
    change: Change<'_>,
    env: &str,
    evidence: &mut dyn EvidenceSource,
    now: DateTime<Utc>,
) -> Result<Decision, Error> {
    let (after, after_policy) = change.after;
    let Some(new) = after.envs.get(env) else {
        return Err(Error::NotInChain(env.to_owned()));
    };
    let old = change.before.and_then(|(c, _)| c.envs.get(env));
    let refuse = |reason| {
        Ok(Decision::Refused(Refusal {
            env: env.to_owned(),
            version: new.version.clone(),
            reason,
        }))
    };
    if old.is_some_and(|o| o.version == new.version) {
        return Ok(Decision::Unchanged);
    }
    // `policy` judges; `placed` says where the environment sits in the chain.
    let (policy, placed) = match (change.before, old) {
        (Some((_, p)), Some(_)) => {
            let edits = p.edits(after_policy);
            if !edits.is_empty() {
                return refuse(Reason::PolicyAndVersion { edits });
            }
            (p, p)
        }
        // An environment the policy in force does not have: that policy
        // still judges it; only its place in the chain comes from the change.
        (Some((_, p)), None) => {
            let edits = p.edits_besides_new_envs(after_policy);
            if !edits.is_empty() {
                return refuse(Reason::PolicyAndVersion { edits });
            }
            (p, after_policy)
        }
        // The first config: there is no policy in force but its own.
        (None, _) => (after_policy, after_policy),
    };
    if let Some(r) = policy
        .revoked
        .iter()
        .find(|r| crate::gate::revokes(&r.version, &new.version))
    {
        return refuse(Reason::Revoked {
            why: r.reason.clone(),
        });
    }
    let Some(lower) = placed.lower(env) else {
        return Err(Error::NotInChain(env.to_owned()));
    };
    let lower = match lower {
        None => None,
        Some(l) => {
            let mut clusters: Vec<String> = policy.clusters.get(l).cloned().unwrap_or_default();
            for c in after_policy.clusters.get(l).into_iter().flatten() {
                if !clusters.contains(c) {
                    clusters.push(c.clone());
                }
            }
            let evidence = match policy.evidence {
                Evidence::Status => {
                    if policy.report_signers.is_none() {
                        return refuse(Reason::NoReportSigners);
                    }
                    let found = evidence.status(policy, l, &clusters, &new.version)?;
                    LowerEvidence::Status {
                        branch: policy.status_branch.clone(),
                        confirmations: found.confirmations,
                        notes: found.notes,
                        held: found.held,
                    }
                }
                Evidence::History => LowerEvidence::History(evidence.history(l, &new.version)?),
            };
            Some(Lower {
                env: l.to_owned(),
                clusters,
                evidence,
            })
        }
    };
    Ok(judge(&GateRequest {
        env: env.to_owned(),
        version: new.version.clone(),
        previous: old.map(|o| o.version.clone()),
        allow_downgrade: new.allow_downgrade && !old.is_some_and(|o| o.allow_downgrade),
        soak: policy.soaks.get(env).copied().unwrap_or(new.promotion.soak),
        lower,
        now,
    }))
}

/// Machine-readable name of a gate refusal, for metrics and reports.
pub fn reason_code(r: &Reason) -> &'static str {
    match r {
        Reason::Downgrade { .. } => "downgrade",
        Reason::NoLowerClusters { .. } => "no_lower_clusters",
        Reason::NotConfirmed { .. } => "not_confirmed",
        Reason::Soaking { .. } => "soaking",
        Reason::LowerNotAtVersion { .. } => "lower_not_at_version",
        Reason::HistorySoaking { .. } => "history_soaking",
        Reason::PolicyAndVersion { .. } => "policy_and_version",
        Reason::NoReportSigners => "no_report_signers",
        Reason::Revoked { .. } => "revoked",
        Reason::EvidenceHeld { .. } => "evidence_held",
    }
}
