//! Reading the status branch (DESIGN §5): every confirmation any agent ever
//! recorded, from the branch's whole history rather than its tip, because
//! each report file is rewritten and a later report for another version does
//! not undo that an earlier version was confirmed.

use super::{RolloutState, StatusReport};
use chrono::{DateTime, Utc};
use git2::{ObjectType, Oid, Repository, Tree};
use semver::Version;
use std::collections::{BTreeMap, HashSet};

/// Errors reading the status branch (a missing branch is not one).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A git operation failed.
    #[error("reading status branch {branch}: {source}")]
    Git {
        /// Branch being read.
        branch: String,
        /// The git error.
        #[source]
        source: git2::Error,
    },
}

/// Where the status branch was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchRef {
    /// Full ref name, e.g. `refs/heads/drover/status` or `refs/remotes/origin/drover/status`.
    pub refname: String,
    /// Commit at its tip.
    pub tip: Oid,
}

/// Find the status branch: local `refs/heads/<branch>`, else `refs/remotes/origin/<branch>`.
pub fn find_status_branch(repo: &Repository, branch: &str) -> Result<Option<BranchRef>, Error> {
    for refname in [
        format!("refs/heads/{branch}"),
        format!("refs/remotes/origin/{branch}"),
    ] {
        match repo.find_reference(&refname) {
            Ok(r) => {
                let commit = r.peel_to_commit().map_err(|source| Error::Git {
                    branch: branch.to_owned(),
                    source,
                })?;
                return Ok(Some(BranchRef {
                    refname,
                    tip: commit.id(),
                }));
            }
            Err(e) if e.code() == git2::ErrorCode::NotFound => {}
            // An invalid branch name in drover.toml cannot name a ref; there
            // is nothing to read rather than a broken repository.
            Err(e) if e.code() == git2::ErrorCode::InvalidSpec => return Ok(None),
            Err(source) => {
                return Err(Error::Git {
                    branch: branch.to_owned(),
                    source,
                })
            }
        }
    }
    Ok(None)
}

/// Every confirmation recorded on the status branch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confirmations {
    /// Where the branch was read from; `None` when it does not exist.
    pub branch: Option<BranchRef>,
    /// (env, cluster, version) -> earliest `since` of a confirmed report.
    confirmed: BTreeMap<(String, String, Version), DateTime<Utc>>,
    /// Reports that could not be used, one line each (path, commit, why).
    pub warnings: Vec<String>,
}

impl Confirmations {
    /// When `cluster` of `env` first confirmed `version`, if it ever did.
    pub fn confirmed_at(
        &self,
        env: &str,
        cluster: &str,
        version: &Version,
    ) -> Option<DateTime<Utc>> {
        self.confirmed
            .get(&(env.to_owned(), cluster.to_owned(), version.clone()))
            .copied()
    }

    /// The clusters of `env` that confirmed `version`, with when each first did.
    pub fn for_version(&self, env: &str, version: &Version) -> BTreeMap<String, DateTime<Utc>> {
        self.confirmed
            .iter()
            .filter(|((e, _, v), _)| e == env && v == version)
            .map(|((_, c, _), t)| (c.clone(), *t))
            .collect()
    }

    /// Every (cluster, version, first confirmation) recorded for `env`.
    pub fn for_env(&self, env: &str) -> Vec<(String, Version, DateTime<Utc>)> {
        self.confirmed
            .iter()
            .filter(|((e, _, _), _)| e == env)
            .map(|((_, c, v), t)| (c.clone(), v.clone(), *t))
            .collect()
    }

    /// Record one report; the earliest confirmation of a version wins.
    pub fn record(&mut self, report: &StatusReport) {
        if report.state != RolloutState::Confirmed {
            return;
        }
        let key = (
            report.env.clone(),
            report.cluster.clone(),
            report.version.clone(),
        );
        self.confirmed
            .entry(key)
            .and_modify(|t| *t = (*t).min(report.since))
            .or_insert(report.since);
    }
}

/// Read every confirmation from the status branch named `branch` (local or `origin/`).
pub fn read_confirmations(repo: &Repository, branch: &str) -> Result<Confirmations, Error> {
    let git = |source| Error::Git {
        branch: branch.to_owned(),
        source,
    };
    let mut out = Confirmations::default();
    let Some(found) = find_status_branch(repo, branch)? else {
        return Ok(out);
    };
    let mut walk = repo.revwalk().map_err(git)?;
    walk.push(found.tip).map_err(git)?;
    out.branch = Some(found);

    // Objects are content-addressed: a tree seen once holds only blobs seen
    // once, so each distinct report is parsed exactly once however many
    // commits carry it.
    let mut seen_trees: HashSet<Oid> = HashSet::new();
    let mut seen_blobs: HashSet<Oid> = HashSet::new();
    for oid in walk {
        let commit = repo.find_commit(oid.map_err(git)?).map_err(git)?;
        let root = commit.tree().map_err(git)?;
        let Some(status) = root.get_name("status") else {
            continue;
        };
        if status.kind() != Some(ObjectType::Tree) || !seen_trees.insert(status.id()) {
            continue;
        }
        let status = repo.find_tree(status.id()).map_err(git)?;
        for env_entry in status.iter() {
            let Ok(env) = env_entry.name() else { continue };
            if env_entry.kind() != Some(ObjectType::Tree) || !seen_trees.insert(env_entry.id()) {
                continue;
            }
            let env_tree: Tree = repo.find_tree(env_entry.id()).map_err(git)?;
            for file in env_tree.iter() {
                if file.kind() != Some(ObjectType::Blob) || !seen_blobs.insert(file.id()) {
                    continue;
                }
                let Some(cluster) = file.name().ok().and_then(|n| n.strip_suffix(".toml")) else {
                    continue;
                };
                let path = format!("status/{env}/{cluster}.toml");
                let where_ = format!("{path} in {:.10}", commit.id());
                let blob = repo.find_blob(file.id()).map_err(git)?;
                let Ok(text) = std::str::from_utf8(blob.content()) else {
                    out.warnings.push(format!("{where_}: not UTF-8; skipped"));
                    continue;
                };
                match StatusReport::from_toml(text) {
                    Ok(r) if r.env != env || r.cluster != cluster => out.warnings.push(format!(
                        "{where_}: reports env {:?} cluster {:?}, which does not match its path; skipped",
                        r.env, r.cluster
                    )),
                    Ok(r) => out.record(&r),
                    Err(e) => out.warnings.push(format!(
                        "{where_}: not a valid status report ({}); skipped",
                        e.message().trim()
                    )),
                }
            }
        }
    }
    Ok(out)
}
