//! Where trust starts (docs/design.md §6), one rule for the agent and for
//! `drover doctor`, which runs these same functions on what the agent
//! would have:
//!
//! 1. the agent's last applied commit (its `DroverStatus`);
//! 2. else the commit its own newest signed report names (it survives the
//!    loss of the agent's state: `crate::agent::recover::from_own_reports`);
//! 3. else the commit a person names (the `drover.dev/trust-commit`
//!    annotation, or `--trust-commit`): that commit and its ancestors are
//!    trusted as they are, every commit after it up to the head is verified
//!    (`verify` as configured), and the named commit is judged by the
//!    *head's* policy (its revocations, no node moved down, the gate read
//!    with the head's branch and keys) before it is applied; once applied it
//!    is consumed (the agent removes the annotation). Once the agent has its
//!    own report, a named commit is ignored (with a Warning Event), so a
//!    stale annotation can never outrank what the agent itself recorded;
//! 4. else the repository's root: every commit of the head's history must
//!    verify (adoption: the head is applied without the gate when every
//!    selected node already runs its version).

use super::git::GitEvidence;
use super::head::{reject, Admitted, Rejection, Stage, TrustCheck};
use super::snapshot::snapshot;
use super::{judge_env, reason_code, Change};
use crate::config::ENV_DIR;
use crate::gate::Decision;
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use semver::Version;
use std::fmt;

/// Annotation on the `DroverStatus` object by which a person names the
/// commit to trust when the agent has neither an applied commit nor a
/// signed report of its own.
pub const TRUST_ANNOTATION: &str = "drover.dev/trust-commit";

/// Most first-parent commits searched for a named commit: the tracked
/// branch's last 100,000 commits, far more than any fleet's config history
/// holds between two losses of the agent's state.
pub const MAX_TRUST_WALK: usize = 100_000;

/// Where trust starts for the next head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustBase {
    /// The agent's last applied commit.
    Applied(Oid),
    /// The config commit the agent's own newest signed report names.
    OwnReport(Oid),
    /// The commit a person named.
    Named(Oid),
    /// Nothing: the head's whole history must verify.
    Root,
}

impl TrustBase {
    /// The commit trust starts after, if any.
    pub fn commit(&self) -> Option<Oid> {
        match self {
            TrustBase::Applied(c) | TrustBase::OwnReport(c) | TrustBase::Named(c) => Some(*c),
            TrustBase::Root => None,
        }
    }
}

impl fmt::Display for TrustBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrustBase::Applied(c) => write!(f, "the last applied commit {c:.12}"),
            TrustBase::OwnReport(c) => {
                write!(f, "{c:.12}, named by this cluster's own signed report")
            }
            TrustBase::Named(c) => write!(f, "{c:.12}, named by a person ({TRUST_ANNOTATION})"),
            TrustBase::Root => write!(f, "the repository's first commit (nothing applied yet)"),
        }
    }
}

/// What decides where trust starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrustInputs<'a> {
    /// The agent's last applied commit.
    pub applied: Option<Oid>,
    /// The commit its own newest signed report names.
    pub own_report: Option<Oid>,
    /// What a person named (the annotation's or the flag's value).
    pub named: Option<&'a str>,
    /// The tracked branch (for the message).
    pub branch: &'a str,
}

/// Where trust starts for `head` (see the module doc); a named commit that
/// is not one to start from is refused here (`trust_commit`). A named
/// commit beside an own report or an applied commit is ignored: the caller
/// says so.
pub fn trust_base(
    repo: &Repository,
    head: Oid,
    inputs: &TrustInputs<'_>,
) -> Result<TrustBase, Rejection> {
    if let Some(c) = inputs.applied {
        return Ok(TrustBase::Applied(c));
    }
    if let Some(c) = inputs.own_report {
        return Ok(TrustBase::OwnReport(c));
    }
    match inputs.named {
        Some(value) => named_commit(repo, value, head, inputs.branch)
            .map(TrustBase::Named)
            .map_err(|message| reject(Stage::Trust, "trust_commit", message)),
        None => Ok(TrustBase::Root),
    }
}

/// The trust check from `base` to `head` (docs/design.md §6): from the
/// root, the head's whole history; else every commit after `base`.
pub fn check_trust(
    repo: &Repository,
    base: TrustBase,
    head: Oid,
    trusted: &TrustCheck<'_>,
) -> Result<crate::trust::Checked, Rejection> {
    trusted
        .check(repo, base.commit(), head)
        .map_err(super::head::trust_rejection)
}

/// The commit a named value stands for, if it may be trusted as a starting
/// point at all: its full object id (no revspec such as `HEAD` or
/// `main~3`, which would follow whatever the repository says now), of a
/// commit on the first-parent history of the fetched `head` of `branch`
/// (not a commit of another branch or one the cache holds for another
/// reason).
pub fn named_commit(
    repo: &Repository,
    value: &str,
    head: Oid,
    branch: &str,
) -> Result<Oid, String> {
    let value = value.trim();
    let full = value.len() == 40 && value.bytes().all(|b| b.is_ascii_hexdigit());
    let oid = match Oid::from_str(value) {
        Ok(o) if full => o,
        _ => {
            return Err(format!(
                "{TRUST_ANNOTATION} must name a commit by its full 40-hex object id \
                 (git rev-parse <commit>), not {value:?}"
            ))
        }
    };
    if repo.find_commit(oid).is_err() {
        return Err(format!(
            "{TRUST_ANNOTATION} names {oid}, which is not a commit of the fetched repository"
        ));
    }
    let mut c = repo.find_commit(head).map_err(|e| e.to_string())?;
    for _ in 0..MAX_TRUST_WALK {
        if c.id() == oid {
            return Ok(oid);
        }
        match c.parent(0) {
            Ok(p) => c = p,
            Err(_) => break,
        }
    }
    Err(format!(
        "{TRUST_ANNOTATION} names {oid}, which is not on {branch} (the first-parent history \
         of the fetched head {}, searched {MAX_TRUST_WALK} commits deep)",
        &head.to_string()[..12]
    ))
}

/// The admission of a commit a person named, `named`, as the agent's first
/// applied commit with `head` fetched: trust from `named` (it and its
/// ancestors trusted, every commit after it up to `head` verified), a
/// valid config with `env`, and judged by `head`'s policy: its version not
/// revoked there, no selected node moved down (`highest`: the highest
/// version a selected node runs), and, unless every selected node already
/// runs it (`adopt`: it moves nothing), the gate as for a first config, its
/// evidence read with `head`'s status branch and report signers.
pub fn admit_named(
    repo: &Repository,
    named: Oid,
    head: Oid,
    env: &str,
    trusted: &TrustCheck<'_>,
    (adopt, highest): (bool, Option<&Version>),
    now: DateTime<Utc>,
) -> Result<Admitted, Rejection> {
    check_trust(repo, TrustBase::Named(named), head, trusted)?;
    let error = |e: super::Error| reject(Stage::Gate, "error", e.to_string());
    let first = |d: &[crate::diag::Diagnostic]| {
        d.iter()
            .take(5)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    };
    let at = match snapshot(repo, named, now).map_err(error)? {
        Ok(s) => s,
        Err(d) => return Err(reject(Stage::Config, "invalid", first(&d))),
    };
    let by = match snapshot(repo, head, now).map_err(error)? {
        Ok(s) => s,
        Err(d) => {
            return Err(reject(
                Stage::Config,
                "invalid",
                format!(
                    "the head's config is invalid, so its policy cannot judge the named commit: {}",
                    first(&d)
                ),
            ))
        }
    };
    let Some(version) = at.config.envs.get(env).map(|e| e.version.clone()) else {
        return Err(reject(
            Stage::Config,
            "unknown_env",
            format!("{ENV_DIR}/{env}.toml does not exist at the named commit {named:.12}"),
        ));
    };
    let gate = |code: &str, message: String| {
        let mut r = reject(Stage::Gate, code, message);
        r.version = Some(version.clone());
        r
    };
    if let Some(r) = by
        .policy
        .revoked
        .iter()
        .find(|r| crate::gate::revokes(&r.version, &version))
    {
        return Err(gate(
            "revoked",
            format!(
                "the named commit {named:.12} pins {env} to {version}, which the head's \
                 [promotion] revoked lists ({}); name a later commit",
                r.reason
            ),
        ));
    }
    if let Some(h) = highest.filter(|h| version < **h) {
        return Err(gate(
            "downgrade",
            format!(
                "the named commit {named:.12} pins {env} to {version}, but a selected node \
                 runs {h}: applying it would move nodes down; name a later commit"
            ),
        ));
    }
    if adopt {
        return Ok(Admitted {
            snapshot: at,
            decision: Decision::Unchanged,
        });
    }
    let change = Change {
        before: None,
        after: (&at.config, &by.policy),
    };
    let mut ev = GitEvidence::new(repo, named, now);
    match judge_env(change, env, &mut ev, now).map_err(error)? {
        Decision::Refused(r) => {
            let mut rej = gate(reason_code(&r.reason), r.to_string());
            rej.refusal = Some(Box::new(r));
            Err(rej)
        }
        decision => Ok(Admitted {
            snapshot: at,
            decision,
        }),
    }
}
