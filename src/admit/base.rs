//! `drover check --base`: what a pull request would land, judged as one
//! span against its base ([`super::git::judge_span`]), each refusal a
//! diagnostic at the `version` value, with the status branches read and
//! the signed report behind each confirmation a verdict names.

use super::git::{judge_span_with, EnvVerdict, GitEvidence, Judgement};
use super::snapshot::read_small;
use super::{Error, Policy};
use crate::config::{ENV_DIR, ROOT_FILE};
use crate::diag::Diagnostic;
use crate::gate::Decision;
use crate::status;
use crate::trust::{self, AllowedSigners};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository, Tree};
use semver::Version;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What [`check_base`] found.
#[derive(Debug, Clone, Default)]
pub struct ChangeReport {
    /// One per refusal (at the `version` value), or per file that could not be judged.
    pub diagnostics: Vec<Diagnostic>,
    /// The verdict for each environment whose version changed.
    pub decisions: Vec<(String, Decision)>,
    /// Status reports that were ignored, one line each (path, commit, why).
    pub warnings: Vec<String>,
    /// The same reports as values, for a document.
    pub ignored: Vec<crate::status::Ignored>,
    /// Each judged environment's version before the change (absent: new).
    pub previous: BTreeMap<String, Version>,
    /// Where each confirmation the decisions name came from, so a reviewer
    /// sees the signed report behind a verdict, not only its time.
    pub sources: Vec<ConfirmationSource>,
    /// The status evidence the decisions needed: `None` when none needed
    /// any (history evidence, first environment, refused before the gate).
    pub status: Option<StatusRead>,
}

/// The status branches a judgement read.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatusRead {
    /// `[promotion] status_branch` of the policy in force.
    pub branch: String,
    /// The refs read: the per-cluster branches of the environments whose
    /// reports the decisions needed and the single branch of the older
    /// layout (local or `refs/remotes/origin/`); empty when none exists,
    /// which in CI usually means none was fetched.
    pub refs: Vec<String>,
}

/// One standing confirmation, as the status branch holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmationSource {
    /// The lower environment.
    pub env: String,
    /// Its cluster.
    pub cluster: String,
    /// The version confirmed.
    pub version: Version,
    /// When it counts from.
    pub at: DateTime<Utc>,
    /// The signed status commit that wrote it.
    pub status_commit: String,
    /// The config commit that cluster was applying.
    pub config_commit: String,
    /// The branch it was read from.
    pub branch: Option<String>,
    /// The SHA256 fingerprint of the key that signed it (listed for
    /// `<env>/<cluster>` in the report signers of the policy in force).
    pub signer: Option<String>,
}

/// A diagnostic at the `version` value of `environments/<env>.toml` in `tree`.
pub(super) fn at_version(repo: &Repository, tree: &Tree<'_>, env: &str, msg: String) -> Diagnostic {
    let file = format!("{ENV_DIR}/{env}.toml");
    let text = read_small(repo, tree, &file)
        .ok()
        .flatten()
        .unwrap_or_default();
    let span = toml::de::DeTable::parse(&text).ok().and_then(|doc| {
        doc.get_ref()
            .iter()
            .find(|(k, _)| k.get_ref() == "version")
            .map(|(_, v)| v.span().start)
    });
    match span {
        Some(at) => Diagnostic::at(&file, &text, at, msg),
        None => Diagnostic::file(&file, msg),
    }
}

pub(super) fn commit_of(repo: &Repository, rev: &str) -> Result<Oid, Error> {
    repo.revparse_single(rev)
        .and_then(|o| o.peel_to_commit())
        .map(|c| c.id())
        .map_err(|source| Error::Rev {
            rev: rev.to_owned(),
            source,
        })
}

/// `drover check --base REV`: the one judgement ([`judge_span`]) of the
/// span from `base` to what HEAD would land on it (`super::merge::landed`: HEAD itself
/// when it descends from `base`, else the merge of the two) in the
/// repository at `repo_path`; each refusal is a diagnostic at the `version`
/// key.
pub fn check_base(repo_path: &Path, base: &str, now: DateTime<Utc>) -> Result<ChangeReport, Error> {
    let repo = Repository::open(repo_path)?;
    let base_name = base;
    let base = commit_of(&repo, base)?;
    let tip = commit_of(&repo, "HEAD")?;
    let mut out = ChangeReport::default();
    let head = match super::merge::landed(&repo, base, tip, base_name)? {
        Ok(head) => head,
        Err(refused) => {
            out.diagnostics = refused;
            return Ok(out);
        }
    };
    let mut ev = GitEvidence::new(&repo, base, now);
    let judged = match judge_span_with(&repo, Some(base), head, None, now, &mut ev)? {
        Judgement::HeadInvalid(d) => {
            out.diagnostics.extend(d);
            return Ok(out);
        }
        Judgement::BaseInvalid { base, first } => {
            out.diagnostics.push(Diagnostic::file(
                ROOT_FILE,
                format!(
                    "the config at the base {:.10} is invalid, so there is no policy in force to judge version changes by: {first}",
                    base
                ),
            ));
            return Ok(out);
        }
        Judgement::Judged(j) => *j,
    };
    let head_tree = repo.find_commit(head)?.tree()?;
    for (env, verdict) in judged.verdicts {
        match verdict {
            EnvVerdict::Decided(Decision::Unchanged) => {}
            EnvVerdict::Decided(d) => {
                if let Decision::Refused(r) = &d {
                    out.diagnostics
                        .push(at_version(&repo, &head_tree, &env, r.to_string()));
                }
                out.decisions.push((env, d));
            }
            EnvVerdict::NotInChain(chain) => out.diagnostics.push(at_version(
                &repo,
                &head_tree,
                &env,
                format!(
                    "{env} is not in the promotion chain of {ROOT_FILE} ({}), so its version change cannot be judged",
                    chain.join(", ")
                ),
            )),
        }
    }
    out.warnings = judged.warnings;
    out.ignored = ev.ignored().to_vec();
    let policy = judged
        .base
        .as_ref()
        .map_or(&judged.head.policy, |b| &b.policy);
    for (env, _) in &out.decisions {
        if let Some(v) = judged.base.as_ref().and_then(|b| b.config.envs.get(env)) {
            out.previous.insert(env.clone(), v.version.clone());
        }
    }
    evidence_sources(&repo, policy, &mut ev, &mut out)?;
    Ok(out)
}

/// Fill `out.status` and `out.sources` for the decisions that read status
/// evidence: which branches were there, and each named confirmation's
/// signed report (one signature check per confirmation named).
pub(super) fn evidence_sources(
    repo: &Repository,
    policy: &Policy,
    ev: &mut GitEvidence<'_>,
    out: &mut ChangeReport,
) -> Result<(), Error> {
    use crate::gate::{Basis, Reason};
    let mut named: Vec<(String, Version, String)> = Vec::new();
    // The environments whose reports the decisions read.
    let mut needed: BTreeSet<String> = BTreeSet::new();
    for (_, d) in &out.decisions {
        let (version, lower, confirmed) = match d {
            Decision::Allowed(a) => match &a.basis {
                Basis::Confirmed {
                    lower, confirmed, ..
                } => (&a.version, lower, confirmed),
                _ => continue,
            },
            Decision::Refused(r) => match &r.reason {
                Reason::NotConfirmed {
                    lower, confirmed, ..
                }
                | Reason::Soaking {
                    lower, confirmed, ..
                } => (&r.version, lower, confirmed),
                _ => continue,
            },
            Decision::Unchanged => continue,
        };
        needed.insert(lower.clone());
        for (cluster, _) in confirmed {
            named.push((lower.clone(), version.clone(), cluster.clone()));
        }
    }
    if needed.is_empty() {
        return Ok(());
    }
    let listed: status::Listed = policy
        .clusters
        .iter()
        .filter(|(e, _)| needed.contains(*e))
        .map(|(e, c)| (e.clone(), c.clone()))
        .collect();
    let store = status::find_store(repo, &policy.status_branch, status::Scope::Listed(&listed))
        .unwrap_or_default();
    let mut refs: Vec<String> = store
        .clusters
        .iter()
        .filter(|c| needed.contains(&c.env))
        .map(|c| c.branch.refname.clone())
        .collect();
    refs.extend(store.legacy.iter().map(|b| b.refname.clone()));
    out.status = Some(StatusRead {
        branch: policy.status_branch.clone(),
        refs,
    });
    let signers = match &policy.signers_text {
        Some(t) => AllowedSigners::parse(t).ok(),
        None => None,
    };
    let conf = ev.confirmations_of(policy, &needed)?;
    for (env, version, cluster) in named {
        let Some((_, _, _, standing)) = conf
            .standing()
            .find(|(e, c, v, _)| *e == env && *c == cluster && **v == version)
        else {
            continue;
        };
        let signer = signers.as_ref().and_then(|all| {
            let own = all.for_principal(&format!("{env}/{cluster}"));
            trust::verify_commit(repo, standing.status_commit, &own)
                .ok()
                .map(|v| v.fingerprint)
        });
        let branch = store
            .clusters
            .iter()
            .find(|c| c.env == env && c.cluster == cluster)
            .map(|c| c.branch.refname.clone())
            .or_else(|| store.legacy.as_ref().map(|b| b.refname.clone()));
        out.sources.push(ConfirmationSource {
            env,
            cluster,
            version,
            at: standing.at,
            status_commit: standing.status_commit.to_string(),
            config_commit: standing.config_commit.clone(),
            branch,
            signer,
        });
    }
    Ok(())
}
