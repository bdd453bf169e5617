//! The gate's edge: gather evidence from a git repository and judge.
//!
//! `check_changes` reads only the keys the gate needs, through small serde
//! structs with defaults, so it does not depend on (or duplicate) full config
//! validation; `drover check` runs that validation separately.

use super::history::{lower_history, HistoryError};
use super::{judge, Decision, GateRequest, Lower, LowerEvidence};
use crate::config::{Evidence, RepoConfig, ENV_DIR, ROOT_FILE};
use crate::diag::Diagnostic;
use crate::status::{self, Confirmations};
use chrono::{DateTime, Utc};
use git2::{Commit, ObjectType, Repository, Tree};
use semver::Version;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use toml::Spanned;

/// Errors that stop the gate from judging at all (as opposed to a refusal).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A git operation failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    /// `--base` does not name a commit.
    #[error("base revision {rev:?} does not name a commit: {source}")]
    Rev {
        /// The revision as given.
        rev: String,
        /// The git error.
        #[source]
        source: git2::Error,
    },
    /// The status branch could not be read.
    #[error(transparent)]
    Status(#[from] status::Error),
    /// The config history could not be walked.
    #[error(transparent)]
    History(#[from] HistoryError),
    /// The environment has no file or is not in the promotion chain.
    #[error("environment {0:?} is not in the promotion chain with an environment file")]
    UnknownEnv(String),
}

/// Default `[promotion] soak` of an environment file (DESIGN §2).
const DEFAULT_SOAK: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_STATUS_BRANCH: &str = "drover/status";

#[derive(Deserialize, Default)]
struct RootLite {
    #[serde(default)]
    promotion: RootPromotionLite,
    #[serde(default)]
    clusters: BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize, Default)]
struct RootPromotionLite {
    #[serde(default)]
    chain: Vec<String>,
    evidence: Option<Spanned<String>>,
    status_branch: Option<String>,
}

#[derive(Deserialize, Default)]
struct EnvLite {
    version: Option<Spanned<String>>,
    #[serde(default)]
    allow_downgrade: bool,
    #[serde(default)]
    promotion: EnvPromotionLite,
}

#[derive(Deserialize, Default)]
struct EnvPromotionLite {
    soak: Option<Spanned<String>>,
}

/// What `check_changes_report` found.
#[derive(Debug, Clone, Default)]
pub struct ChangeReport {
    /// One per refusal (at the `version` value), or per file the gate could not read.
    pub diagnostics: Vec<Diagnostic>,
    /// The verdict for each environment whose version changed.
    pub decisions: Vec<(String, Decision)>,
    /// Status reports that were skipped as unreadable.
    pub warnings: Vec<String>,
}

fn read_text(repo: &Repository, tree: &Tree, path: &str) -> Option<String> {
    let entry = tree.get_path(Path::new(path)).ok()?;
    let blob = crate::config::bounded_blob(repo, entry.id()).ok()?;
    String::from_utf8(blob.content().to_vec()).ok()
}

fn env_files(repo: &Repository, tree: &Tree) -> Vec<String> {
    let Ok(entry) = tree.get_path(Path::new(ENV_DIR)) else {
        return Vec::new();
    };
    let Ok(dir) = repo.find_tree(entry.id()) else {
        return Vec::new();
    };
    dir.iter()
        .filter(|e| e.kind() == Some(ObjectType::Blob))
        .filter_map(|e| e.name().ok()?.strip_suffix(".toml").map(str::to_owned))
        .collect()
}

fn toml_diag(file: &str, text: &str, e: &toml::de::Error, what: &str) -> Diagnostic {
    let msg = format!("{what}: {}", e.message().trim());
    match e.span() {
        Some(span) => Diagnostic::at(file, text, span.start, msg),
        None => Diagnostic::file(file, msg),
    }
}

/// Evidence sources, read at most once per run.
struct Evidencer<'r> {
    repo: &'r Repository,
    head: Commit<'r>,
    kind: Evidence,
    branch: String,
    status: Option<Confirmations>,
}

impl<'r> Evidencer<'r> {
    fn lower(
        &mut self,
        lower: &str,
        clusters: &[String],
        version: &Version,
    ) -> Result<Lower, Error> {
        let evidence = match self.kind {
            Evidence::Status => {
                let conf = match &self.status {
                    Some(c) => c,
                    None => self
                        .status
                        .insert(status::read_confirmations(self.repo, &self.branch)?),
                };
                LowerEvidence::Status {
                    branch: self.branch.clone(),
                    confirmations: conf.for_version(lower, version),
                }
            }
            Evidence::History => LowerEvidence::History(lower_history(
                self.repo,
                &self.head,
                &format!("{ENV_DIR}/{lower}.toml"),
                version,
            )?),
        };
        Ok(Lower {
            env: lower.to_owned(),
            clusters: clusters.to_vec(),
            evidence,
        })
    }
}

/// Judge every environment whose version changed between `base` and HEAD of
/// the repository at `repo`; each refusal is a diagnostic at the `version` key.
pub fn check_changes(
    repo: &Path,
    base: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Diagnostic>, Error> {
    Ok(check_changes_report(repo, base, now)?.diagnostics)
}

/// [`check_changes`] with the verdicts and status-branch warnings as well.
pub fn check_changes_report(
    repo_path: &Path,
    base: &str,
    now: DateTime<Utc>,
) -> Result<ChangeReport, Error> {
    let repo = Repository::open(repo_path)?;
    let base_tree = repo
        .revparse_single(base)
        .and_then(|o| o.peel_to_commit())
        .and_then(|c| c.tree())
        .map_err(|source| Error::Rev {
            rev: base.to_owned(),
            source,
        })?;
    let head = repo.head()?.peel_to_commit()?;
    let head_tree = head.tree()?;
    let mut out = ChangeReport::default();

    let Some(root_text) = read_text(&repo, &head_tree, ROOT_FILE) else {
        out.diagnostics.push(Diagnostic::file(
            ROOT_FILE,
            "missing at HEAD: version changes cannot be judged without the promotion chain",
        ));
        return Ok(out);
    };
    let root: RootLite = match toml::from_str(&root_text) {
        Ok(r) => r,
        Err(e) => {
            out.diagnostics.push(toml_diag(
                ROOT_FILE,
                &root_text,
                &e,
                "cannot read the promotion chain to judge version changes",
            ));
            return Ok(out);
        }
    };
    let kind = match root
        .promotion
        .evidence
        .as_ref()
        .map(|s| s.get_ref().as_str())
    {
        None | Some("status") => Evidence::Status,
        Some("history") => Evidence::History,
        Some(other) => {
            let span = root
                .promotion
                .evidence
                .as_ref()
                .map_or(0, |s| s.span().start);
            out.diagnostics.push(Diagnostic::at(
                ROOT_FILE,
                &root_text,
                span,
                format!("evidence = {other:?} is not valid; expected \"status\" or \"history\""),
            ));
            return Ok(out);
        }
    };
    let mut ev = Evidencer {
        repo: &repo,
        head: head.clone(),
        kind,
        branch: root
            .promotion
            .status_branch
            .clone()
            .unwrap_or_else(|| DEFAULT_STATUS_BRANCH.to_owned()),
        status: None,
    };

    for env in env_files(&repo, &head_tree) {
        let file = format!("{ENV_DIR}/{env}.toml");
        let Some(text) = read_text(&repo, &head_tree, &file) else {
            continue;
        };
        let new: EnvLite = match toml::from_str(&text) {
            Ok(e) => e,
            Err(e) => {
                out.diagnostics.push(toml_diag(
                    &file,
                    &text,
                    &e,
                    "cannot read the version change to judge it",
                ));
                continue;
            }
        };
        // A missing or invalid version is config validation's to report.
        let Some(version_s) = &new.version else {
            continue;
        };
        let Ok(version) = Version::parse(version_s.get_ref().trim()) else {
            continue;
        };
        let previous = read_text(&repo, &base_tree, &file)
            .and_then(|t| toml::from_str::<EnvLite>(&t).ok())
            .and_then(|e| e.version)
            .and_then(|v| Version::parse(v.get_ref().trim()).ok());
        if previous.as_ref() == Some(&version) {
            continue;
        }
        let at_version = |msg: String| Diagnostic::at(&file, &text, version_s.span().start, msg);
        let Some(pos) = root.promotion.chain.iter().position(|e| *e == env) else {
            out.diagnostics.push(at_version(format!(
                "{env} is not in the promotion chain of {ROOT_FILE} ({}), so its version change cannot be judged",
                root.promotion.chain.join(", ")
            )));
            continue;
        };
        let soak = match &new.promotion.soak {
            None => DEFAULT_SOAK,
            Some(s) => match humantime::parse_duration(s.get_ref()) {
                Ok(d) => d,
                Err(e) => {
                    out.diagnostics.push(Diagnostic::at(
                        &file,
                        &text,
                        s.span().start,
                        format!(
                            "soak {:?} is not a duration such as \"24h\": {e}",
                            s.get_ref()
                        ),
                    ));
                    continue;
                }
            },
        };
        let lower = match pos.checked_sub(1) {
            None => None,
            Some(i) => {
                let name = &root.promotion.chain[i];
                let clusters = root.clusters.get(name).map(Vec::as_slice).unwrap_or(&[]);
                Some(ev.lower(name, clusters, &version)?)
            }
        };
        let decision = judge(&GateRequest {
            env: env.clone(),
            version,
            previous,
            allow_downgrade: new.allow_downgrade,
            soak,
            lower,
            now,
        });
        if let Decision::Refused(r) = &decision {
            out.diagnostics.push(at_version(r.to_string()));
        }
        out.decisions.push((env, decision));
    }
    if let Some(c) = ev.status {
        out.warnings = c.warnings;
    }
    Ok(out)
}

/// Judge `env` taking the version `cfg` pins, for the agent: `previous` is
/// the version the agent last applied, `head` the config commit `cfg` was
/// read from (history evidence walks back from it).
pub fn judge_config(
    repo: &Repository,
    head: &Commit,
    cfg: &RepoConfig,
    env: &str,
    previous: Option<&Version>,
    now: DateTime<Utc>,
) -> Result<Decision, Error> {
    // Outside the chain `lower` would be None, which reads as "first
    // environment, no gate": refuse to judge rather than let that through.
    let (Some(env_cfg), true) = (cfg.envs.get(env), cfg.root.chain.iter().any(|e| e == env)) else {
        return Err(Error::UnknownEnv(env.to_owned()));
    };
    let mut ev = Evidencer {
        repo,
        head: head.clone(),
        kind: cfg.root.evidence,
        branch: cfg.root.status_branch.clone(),
        status: None,
    };
    let lower = match cfg.lower(env) {
        None => None,
        Some(l) => Some(ev.lower(l, cfg.clusters(l), &env_cfg.version)?),
    };
    Ok(judge(&GateRequest {
        env: env.to_owned(),
        version: env_cfg.version.clone(),
        previous: previous.cloned(),
        allow_downgrade: env_cfg.allow_downgrade,
        soak: env_cfg.promotion.soak,
        lower,
        now,
    }))
}
