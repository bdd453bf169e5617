//! The agent's admission of a new head: trust (the head's signature, the
//! trust base), then the span from the last applied commit judged as one
//! ([`super::git::judge_span`]), then adoption of a head it applied
//! before. What is refused is a [`Rejection`] naming the stage.

use super::git::{judge_span, EnvVerdict, Judgement};
use super::snapshot::{snapshot, Snapshot};
use super::{reason_code, Error};
use crate::config::{ENV_DIR, ROOT_FILE};
use crate::diag::Diagnostic;
use crate::gate::Decision;
use crate::trust;
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use semver::Version;
use std::fmt;

/// Which check refused a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Signatures and ancestry (docs/design.md §6).
    Trust,
    /// Config validation.
    Config,
    /// The promotion gate (docs/design.md §4).
    Gate,
}

impl Stage {
    /// `trust`, `config` or `gate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Trust => "trust",
            Stage::Config => "config",
            Stage::Gate => "gate",
        }
    }
}

/// Why a head was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The check that refused.
    pub stage: Stage,
    /// Machine-readable reason (`unsigned`, `invalid`, `not_confirmed`, ...).
    pub code: String,
    /// One line for people.
    pub message: String,
    /// The version the refused head pins for the environment, when readable.
    pub version: Option<Version>,
    /// The gate's refusal, when the gate refused.
    pub refusal: Option<Box<crate::gate::Refusal>>,
    /// What the refused head's `[promotion] revoked` lists (version and
    /// reason) when it passed the trust check and its config is valid
    /// (the gate refused it). A revocation only stops: the agent honours
    /// it from a trusted head the gate refuses, never from an untrusted one.
    pub revokes: Box<[(Version, String)]>,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} check ({}): {}",
            self.stage.as_str(),
            self.code,
            self.message
        )
    }
}

/// A head the agent may apply.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The head's config and policy.
    pub snapshot: Snapshot,
    /// The gate's verdict for the environment over the whole path.
    pub decision: Decision,
}

pub(super) fn reject(stage: Stage, code: &str, message: String) -> Rejection {
    Rejection {
        stage,
        code: code.into(),
        message,
        version: None,
        refusal: None,
        revokes: Box::default(),
    }
}

/// What the trust check of an admission needs (docs/design.md §6).
#[derive(Clone, Copy)]
pub struct TrustCheck<'a> {
    /// `off`, `head` or `all`.
    pub mode: trust::Mode,
    /// The signers the agent was configured with (SSH and OpenPGP keys).
    pub signers: trust::Signers<'a>,
    /// When this cache first fetched a commit (Unix seconds), so a key's
    /// validity is judged at that time as well as at the commit's.
    pub first_seen: &'a dyn Fn(Oid) -> i64,
}

/// The trust stage's rejection of `e`.
pub(super) fn trust_rejection(e: trust::Error) -> Rejection {
    match e {
        trust::Error::Refused(r) => reject(Stage::Trust, r.reason.code(), r.to_string()),
        e => reject(Stage::Trust, "error", e.to_string()),
    }
}

impl TrustCheck<'_> {
    pub(super) fn check(
        &self,
        repo: &Repository,
        last: Option<Oid>,
        head: Oid,
    ) -> Result<trust::Checked, trust::Error> {
        trust::check(repo, self.mode, self.signers, last, head, self.first_seen)
    }
}

/// The agent's admission of `head` for `env` over `last`, its last applied
/// commit (`None`: nothing applied yet): trust over every commit of the
/// span (docs/design.md §6), then the one judgement of the span
/// ([`judge_span`]), exactly as `drover check --base <last>` judges it: the
/// agent never applies a version move that check refuses.
pub fn admit_head(
    repo: &Repository,
    last: Option<Oid>,
    head: Oid,
    env: &str,
    trusted: &TrustCheck<'_>,
    now: DateTime<Utc>,
) -> Result<Admitted, Rejection> {
    match trusted.check(repo, last, head) {
        Ok(_) => {}
        Err(trust::Error::Refused(r)) => {
            return Err(reject(Stage::Trust, r.reason.code(), r.to_string()))
        }
        Err(e) => return Err(reject(Stage::Trust, "error", e.to_string())),
    }
    let gate_err = |e: Error| reject(Stage::Gate, "error", e.to_string());
    let judged = match judge_span(repo, last, head, Some(env), now).map_err(gate_err)? {
        Judgement::HeadInvalid(diags) => {
            return Err(reject(Stage::Config, "invalid", first_five(&diags)))
        }
        Judgement::BaseInvalid { base, first } => {
            return Err(reject(
                Stage::Config,
                "invalid_base",
                format!("the config at the last applied commit {base:.10} is invalid, so there is no policy in force: {first}"),
            ))
        }
        Judgement::Judged(j) => *j,
    };
    let Some(version) = judged.head.config.envs.get(env).map(|e| e.version.clone()) else {
        return Err(reject(
            Stage::Config,
            "unknown_env",
            format!("{ENV_DIR}/{env}.toml does not exist"),
        ));
    };
    let revokes = || {
        judged
            .head
            .config
            .root
            .revoked
            .iter()
            .map(|r| (r.version.clone(), r.reason.clone()))
            .collect()
    };
    let decision = match judged.verdict(env) {
        Some(EnvVerdict::Decided(Decision::Refused(r))) => {
            let mut rej = reject(Stage::Gate, reason_code(&r.reason), r.to_string());
            rej.version = Some(version);
            rej.refusal = Some(Box::new(r.clone()));
            rej.revokes = revokes();
            return Err(rej);
        }
        Some(EnvVerdict::Decided(d)) => d.clone(),
        // `None` cannot happen (the head has `env` and it was asked about);
        // refused all the same.
        Some(EnvVerdict::NotInChain(_)) | None => {
            let mut rej = reject(
                Stage::Gate,
                "not_in_chain",
                format!("{env} is not in the promotion chain of {ROOT_FILE}"),
            );
            rej.version = Some(version);
            rej.revokes = revokes();
            return Err(rej);
        }
    };
    Ok(Admitted {
        snapshot: judged.head,
        decision,
    })
}

pub(super) fn first_five(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .take(5)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Adoption (docs/design.md §4, "the gate governs movement"): a cluster
/// whose selected nodes all already run the version `head` pins moves
/// nothing, so `head` needs the trust check and a valid config, not the gate.
/// The caller has checked the nodes.
pub fn admit_adoption(
    repo: &Repository,
    head: Oid,
    env: &str,
    trusted: &TrustCheck<'_>,
    now: DateTime<Utc>,
) -> Result<Admitted, Rejection> {
    match trusted.check(repo, None, head) {
        Ok(_) => {}
        Err(trust::Error::Refused(r)) => {
            return Err(reject(Stage::Trust, r.reason.code(), r.to_string()))
        }
        Err(e) => return Err(reject(Stage::Trust, "error", e.to_string())),
    }
    match snapshot(repo, head, now) {
        Ok(Ok(s)) if s.config.envs.contains_key(env) => Ok(Admitted {
            snapshot: s,
            decision: Decision::Unchanged,
        }),
        Ok(Ok(_)) => Err(reject(
            Stage::Config,
            "unknown_env",
            format!("{ENV_DIR}/{env}.toml does not exist"),
        )),
        Ok(Err(d)) => Err(reject(Stage::Config, "invalid", first_five(&d))),
        Err(e) => Err(reject(Stage::Gate, "error", e.to_string())),
    }
}
