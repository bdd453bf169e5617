//! History evidence: how long the lower environment has been configured at a
//! version, from the first-parent config history.
//!
//! Built for long histories: one tree-entry lookup per commit (no tree
//! diffs), a blob read only where the file's oid changes, and the walk stops
//! at the first commit where the version differs; then the times of up to
//! [`MONOTONE_LOOKBACK`] older commits are read so that commit times count
//! as monotone.

use crate::gate::LowerHistory;
use chrono::{DateTime, TimeZone, Utc};
use git2::{Commit, ObjectType, Oid, Repository};
use semver::Version;
use std::path::Path;

/// A git failure while walking the config history.
#[derive(Debug, thiserror::Error)]
#[error("walking the history of {path}: {source}")]
pub struct HistoryError {
    /// The file whose history was walked.
    pub path: String,
    /// The git error.
    #[source]
    pub source: git2::Error,
}

fn version_of(repo: &Repository, blob: Oid) -> Option<Version> {
    let blob = crate::config::bounded_blob(repo, blob).ok()?;
    let text = std::str::from_utf8(blob.content()).ok()?;
    crate::config::read_pin(text).version()
}

fn entry_oid(commit: &Commit, path: &Path) -> Result<Option<Oid>, git2::Error> {
    match commit.tree()?.get_path(path) {
        Ok(e) if e.kind() == Some(ObjectType::Blob) => Ok(Some(e.id())),
        Ok(_) => Ok(None),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn commit_time(c: &Commit) -> DateTime<Utc> {
    Utc.timestamp_opt(c.time().seconds(), 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// How many first-parent ancestors [`monotone_time`] reads. A backdated
/// commit is found by its recent parents, so a bounded look-back suffices in
/// practice, and it keeps a 100,000-commit history cheap in time and memory.
pub const MONOTONE_LOOKBACK: usize = 1_000;

/// A commit's time taken as no earlier than its parent's (docs/design.md §4):
/// the latest committer time among it and its first-parent ancestors (up to
/// [`MONOTONE_LOOKBACK`] of them), so a backdated commit cannot make a version
/// look configured for longer than it was.
fn monotone_time(commit: &Commit) -> Result<DateTime<Utc>, git2::Error> {
    let mut latest = commit_time(commit);
    let mut c = commit.clone();
    for _ in 0..MONOTONE_LOOKBACK {
        match c.parent(0) {
            Ok(p) => {
                latest = latest.max(commit_time(&p));
                c = p;
            }
            Err(e) if e.code() == git2::ErrorCode::NotFound => break,
            Err(e) => return Err(e),
        }
    }
    Ok(latest)
}

/// Whether `path` (an environment file) is at `version` in `head`, and since
/// which first-parent commit it has been continuously.
pub fn lower_history(
    repo: &Repository,
    head: &Commit,
    path: &str,
    version: &Version,
) -> Result<LowerHistory, HistoryError> {
    let err = |source| HistoryError {
        path: path.to_owned(),
        source,
    };
    let p = Path::new(path);
    let Some(mut oid) = entry_oid(head, p).map_err(err)? else {
        return Ok(LowerHistory::AtOtherVersion(None));
    };
    match version_of(repo, oid) {
        Some(v) if v == *version => {}
        other => return Ok(LowerHistory::AtOtherVersion(other)),
    }
    let mut commit = head.clone();
    loop {
        // First parent only: the mainline's commits are the ones that were
        // in effect; a merged branch's own commits never were.
        let parent = match commit.parent(0) {
            Ok(p) => p,
            Err(e) if e.code() == git2::ErrorCode::NotFound => break,
            Err(e) => return Err(err(e)),
        };
        let Some(parent_oid) = entry_oid(&parent, p).map_err(err)? else {
            break;
        };
        // An edit elsewhere in the file (window, rollout) keeps the version.
        if parent_oid != oid && version_of(repo, parent_oid).as_ref() != Some(version) {
            break;
        }
        oid = parent_oid;
        commit = parent;
    }
    Ok(LowerHistory::AtVersionSince {
        since: monotone_time(&commit).map_err(err)?,
        commit: commit.id().to_string(),
    })
}
