//! Reading status reports for the fleet view: the latest report of each
//! cluster, and the history of every report for the timeline. This is the
//! one place the fleet view touches the status branch, so a stricter report
//! reader (signature checks of docs/design.md §5) replaces [`trust_of`] and
//! nothing else.

use crate::config::RepoConfig;
use crate::status::{self, BranchRef, StatusReport};
use chrono::{DateTime, TimeZone, Utc};
use git2::{Commit, ObjectType, Oid, Repository};
use std::collections::HashMap;

use super::model::Trust;

/// A report file larger than this is ignored and named (docs/design.md §5).
pub const MAX_REPORT_BYTES: usize = 64 * 1024;
/// Most report versions the timeline reads; older ones are left out and a warning says so.
pub const MAX_HISTORY: usize = 100_000;

/// Errors reading the status branch.
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
    /// Finding the branch failed.
    #[error(transparent)]
    Status(#[from] status::Error),
}

/// One version of one cluster's report file.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The report.
    pub report: StatusReport,
    /// The status commit that wrote this version of the file.
    pub commit: Oid,
    /// That commit's time.
    pub committed: DateTime<Utc>,
    /// Whether it counts as evidence.
    pub trust: Trust,
    /// Verified signer, if any.
    pub signer: Option<String>,
}

/// What a walk of the status branch found.
#[derive(Debug, Default)]
pub struct Found {
    /// Report versions, newest first.
    pub entries: Vec<Entry>,
    /// Reports skipped (oversized, not UTF-8, invalid, wrong path), one line each.
    pub warnings: Vec<String>,
}

/// Whether the report that `commit` wrote for `env`/`cluster` counts as evidence.
///
/// The adapter to the report-trust check: with no `report_signers` in the
/// config the answer is [`Trust::Unverified`].
pub fn trust_of(
    _repo: &Repository,
    _cfg: &RepoConfig,
    _commit: Oid,
    _env: &str,
    _cluster: &str,
) -> (Trust, Option<String>) {
    (Trust::Unverified, None)
}

/// Walk the status branch's first parents from its tip, newest first, and
/// collect each version of each report file once (at the commit that wrote
/// it). `want` limits the walk: it stops as soon as every cluster it names
/// has been seen (`None`: the whole history, up to [`MAX_HISTORY`]).
pub fn walk(
    repo: &Repository,
    cfg: &RepoConfig,
    branch: &BranchRef,
    want: Option<&[(String, String)]>,
) -> Result<Found, Error> {
    let name = cfg.root.status_branch.clone();
    let git = |source| Error::Git {
        branch: name.clone(),
        source,
    };
    let mut out = Found::default();
    let mut missing: Option<Vec<(String, String)>> = want.map(<[_]>::to_vec);
    let odb = repo.odb().map_err(git)?;
    let mut commit = repo.find_commit(branch.tip).map_err(git)?;
    let mut dir = status_dir(&commit).map_err(git)?;
    loop {
        let parent = commit.parent(0).ok();
        let parent_dir = match &parent {
            Some(p) => status_dir(p).map_err(git)?,
            None => None,
        };
        if dir != parent_dir {
            let before = subtrees(repo, parent_dir).map_err(git)?;
            for (env, tree) in subtrees(repo, dir).map_err(git)? {
                let old_tree = before.get(&env).copied();
                if old_tree == Some(tree) {
                    continue;
                }
                let old = blobs(repo, old_tree).map_err(git)?;
                for (cluster, blob) in blobs(repo, Some(tree)).map_err(git)? {
                    if old.get(&cluster) == Some(&blob) {
                        continue;
                    }
                    if out.entries.len() >= MAX_HISTORY {
                        out.warnings.push(format!(
                            "status branch {name}: more than {MAX_HISTORY} report versions; older ones are not shown"
                        ));
                        return Ok(out);
                    }
                    let path = status::report_path(&env, &cluster);
                    let where_ = format!("{path} in {:.10}", commit.id());
                    let (size, _) = odb.read_header(blob).map_err(git)?;
                    if size > MAX_REPORT_BYTES {
                        out.warnings.push(format!(
                            "{where_}: {size} bytes, larger than the {MAX_REPORT_BYTES}-byte limit for a report; skipped"
                        ));
                        continue;
                    }
                    let content = repo.find_blob(blob).map_err(git)?;
                    let Ok(text) = std::str::from_utf8(content.content()) else {
                        out.warnings.push(format!("{where_}: not UTF-8; skipped"));
                        continue;
                    };
                    let report = match StatusReport::from_toml(text) {
                        Ok(r) if r.env != env || r.cluster != cluster => {
                            out.warnings.push(format!(
                                "{where_}: reports env {:?} cluster {:?}, which does not match its path; skipped",
                                r.env, r.cluster
                            ));
                            continue;
                        }
                        Ok(r) => r,
                        Err(e) => {
                            out.warnings.push(format!(
                                "{where_}: not a valid status report ({}); skipped",
                                e.message().trim()
                            ));
                            continue;
                        }
                    };
                    let (trust, signer) = trust_of(repo, cfg, commit.id(), &env, &cluster);
                    if let Some(m) = missing.as_mut() {
                        m.retain(|(e, c)| !(*e == env && *c == cluster));
                    }
                    out.entries.push(Entry {
                        report,
                        commit: commit.id(),
                        committed: commit_time(&commit),
                        trust,
                        signer,
                    });
                }
            }
        }
        if missing.as_ref().is_some_and(Vec::is_empty) {
            break;
        }
        match parent {
            Some(p) => {
                commit = p;
                dir = parent_dir;
            }
            None => break,
        }
    }
    Ok(out)
}

fn commit_time(c: &Commit<'_>) -> DateTime<Utc> {
    Utc.timestamp_opt(c.committer().when().seconds(), 0)
        .single()
        .unwrap_or_default()
}

fn status_dir(c: &Commit<'_>) -> Result<Option<Oid>, git2::Error> {
    Ok(c.tree()?
        .get_name("status")
        .filter(|e| e.kind() == Some(ObjectType::Tree))
        .map(|e| e.id()))
}

/// Subdirectories (environments) of a `status/` tree.
fn subtrees(repo: &Repository, dir: Option<Oid>) -> Result<HashMap<String, Oid>, git2::Error> {
    let Some(d) = dir else {
        return Ok(HashMap::new());
    };
    Ok(repo
        .find_tree(d)?
        .iter()
        .filter(|e| e.kind() == Some(ObjectType::Tree))
        .filter_map(|e| Some((e.name().ok()?.to_owned(), e.id())))
        .collect())
}

/// `<cluster>.toml` blobs of an environment's tree.
fn blobs(repo: &Repository, tree: Option<Oid>) -> Result<HashMap<String, Oid>, git2::Error> {
    let Some(t) = tree else {
        return Ok(HashMap::new());
    };
    Ok(repo
        .find_tree(t)?
        .iter()
        .filter(|e| e.kind() == Some(ObjectType::Blob))
        .filter_map(|e| {
            let name = e.name().ok()?.strip_suffix(".toml")?.to_owned();
            Some((name, e.id()))
        })
        .collect())
}
