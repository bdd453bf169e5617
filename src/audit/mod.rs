//! The audit trail: version changes from git history, with signers,
//! confirmations and failures from the status branches, and the
//! revocations of `[promotion] revoked` (`drover log`).
//!
//! Fast on long histories: it walks first parents only (merges of reviewed
//! pull requests are the changes), taking each commit's tree and parent from
//! git's commit-graph file where git wrote one, compares tree-entry ids of
//! `environments/<env>.toml` between a commit and its parent instead of
//! diffing trees, and reads a blob only when its id changed. Trees are read
//! raw and the one or two names wanted are looked up in place.
//!
//! The commit-graph is trusted as `git log` trusts it: it is local state of
//! the clone being read. One that is inconsistent (a position past its end, a
//! loop) is dropped and the walk starts over from the object store.
//!
//! [`walk`] takes the first-parent chain and reads trees raw; [`changes`]
//! finds and reads the commits that changed a version or a revocation;
//! this file says what they mean, with the status branches' evidence.

mod changes;
mod walk;

use crate::config::Pin;
use crate::trust::{self, AllowedSigners};
use changes::changes_along;
use chrono::{SecondsFormat, TimeZone, Utc};
use git2::{Oid, Repository};
use serde::Serialize;
use std::sync::LazyLock;
use walk::first_parents;

/// Errors of the audit trail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the repository failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    /// An object the history names as a tree is not one, or is malformed.
    #[error("git: object {0} is not a well-formed tree")]
    NotATree(Oid),
    /// Checking a signature failed for a reason other than a refusal.
    #[error(transparent)]
    Trust(#[from] trust::Error),
}

/// A cluster's confirmation of a version, from the status branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confirmation {
    /// Environment.
    pub env: String,
    /// Cluster.
    pub cluster: String,
    /// Confirmed version.
    pub version: String,
    /// When the cluster confirmed (RFC 3339 UTC).
    pub since: String,
    /// Config commit the agent was applying.
    pub config_commit: String,
    /// Status-branch commit that recorded the confirmation.
    pub status_commit: String,
}

/// One version change of one environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Environment.
    pub env: String,
    /// New version.
    pub version: String,
    /// Version before the change; `None` when the file was created.
    pub previous: Option<String>,
    /// The commit (on the first-parent history) that made the change.
    pub commit: String,
    /// Committer date, RFC 3339 UTC.
    pub date: String,
    /// Author, `Name <email>`.
    pub author: String,
    /// Principal of the verified signer; `None` without allowed signers or when not verified.
    pub signer: Option<String>,
    /// Whether the signature verified against the allowed signers.
    pub verified: bool,
    /// Pull request number from the message (`Merge pull request #N`, `(#N)`).
    pub pr: Option<u64>,
    /// Confirmations of this version by the environment's clusters.
    pub confirmations: Vec<Confirmation>,
    /// `failed` reports of this version by the environment's clusters.
    pub failures: Vec<Failure>,
}

/// A cluster's `failed` report of a version, from the status branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Environment.
    pub env: String,
    /// Cluster.
    pub cluster: String,
    /// The version it failed to reach.
    pub version: String,
    /// When the rollout failed (RFC 3339 UTC).
    pub since: String,
    /// Why, as the agent reported it.
    pub message: String,
    /// Status-branch commit that recorded the failure.
    pub status_commit: String,
}

/// A version added to `[promotion] revoked` of drover.toml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Revocation {
    /// The revoked version.
    pub version: String,
    /// Why, as recorded.
    pub reason: String,
    /// The commit (on the first-parent history) that revoked it.
    pub commit: String,
    /// Committer date, RFC 3339 UTC.
    pub date: String,
    /// Author, `Name <email>`.
    pub author: String,
    /// Principal of the verified signer.
    pub signer: Option<String>,
    /// Whether the signature verified against the allowed signers.
    pub verified: bool,
    /// Pull request number from the message.
    pub pr: Option<u64>,
}

/// What `drover log` lists: the version changes and the revocations, each newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct History {
    /// Version changes, newest first.
    pub changes: Vec<Change>,
    /// Revocations, newest first.
    pub revocations: Vec<Revocation>,
}

/// What to list.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogOptions<'a> {
    /// Only this environment.
    pub env: Option<&'a str>,
    /// Verify signers against these (SSH and OpenPGP keys).
    pub signers: Option<trust::Signers<'a>>,
    /// Status store whose confirmations to attach.
    pub status: Option<&'a crate::status::Store>,
    /// Keys whose reports count (`report_signers` of the config); `None` trusts none.
    pub report_signers: Option<&'a AllowedSigners>,
}

fn parse_version(content: &[u8]) -> String {
    match crate::config::read_pin(&String::from_utf8_lossy(content)) {
        Pin::Set(v) | Pin::NotAString(v) => v,
        Pin::Missing => "(none)".into(),
        Pin::Unreadable => "(invalid)".into(),
    }
}

/// `Merge pull request #N` (GitHub merges) or `(#N)` (squash merges) in the message.
pub fn pull_request(message: &str) -> Option<u64> {
    static MERGE: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"Merge pull request #(\d+)").expect("valid regex"));
    static SQUASH: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"\(#(\d+)\)").expect("valid regex"));
    MERGE
        .captures(message)
        .or_else(|| SQUASH.captures(message.lines().next().unwrap_or("")))
        .and_then(|c| c[1].parse().ok())
}

fn rfc3339(seconds: i64) -> String {
    Utc.timestamp_opt(seconds, 0)
        .single()
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// Version changes reachable from `head` along first parents, newest first.
pub fn version_history(
    repo: &Repository,
    head: Oid,
    opts: &LogOptions<'_>,
) -> Result<Vec<Change>, Error> {
    Ok(history(repo, head, opts)?.changes)
}

/// Version changes and revocations reachable from `head` along first
/// parents, newest first, with the status branches' confirmations and
/// failures beside the changes they concern.
pub fn history(repo: &Repository, head: Oid, opts: &LogOptions<'_>) -> Result<History, Error> {
    let chain = first_parents(repo, head)?;
    // Objects are read on this thread only: libgit2 shares one reader per
    // pack file among all handles, behind mutexes, so a second reading thread
    // only waited on the first (BENCHMARKS.md, "drover log").
    let (mut changes, revocations) = changes_along(repo, &chain, opts)?;
    if let Some(store) = opts.status {
        for c in confirmations(repo, store, opts.report_signers)? {
            if let Some(ch) = concerned(&mut changes, &c.env, &c.version, &c.since) {
                ch.confirmations.push(c);
            }
        }
        for f in failures(repo, store, opts.report_signers)? {
            if let Some(ch) = concerned(&mut changes, &f.env, &f.version, &f.since) {
                ch.failures.push(f);
            }
        }
    }
    Ok(History {
        changes,
        revocations,
    })
}

/// Every standing confirmation in the status store, read by
/// the one report reader (`status::confirmations_in`): only reports signed by
/// their own cluster's key in `report_signers` count, and a later `failed`
/// withdraws a confirmation.
pub fn confirmations(
    repo: &Repository,
    status: &crate::status::Store,
    report_signers: Option<&AllowedSigners>,
) -> Result<Vec<Confirmation>, Error> {
    // `drover log` has no `--now`: the clock judges which status commits are
    // dated in the future.
    let found = crate::status::confirmations_in(repo, status, report_signers, chrono::Utc::now())?;
    let mut out: Vec<Confirmation> = found
        .standing()
        .map(|(env, cluster, version, s)| Confirmation {
            env: env.to_owned(),
            cluster: cluster.to_owned(),
            version: version.to_string(),
            since: s.at.to_rfc3339_opts(SecondsFormat::Secs, true),
            config_commit: s.config_commit.clone(),
            status_commit: s.status_commit.to_string(),
        })
        .collect();
    out.sort_by(|a, b| (&a.since, &a.cluster).cmp(&(&b.since, &b.cluster)));
    Ok(out)
}

/// Every `failed` report in the status store, once per failed run (the
/// reader's trusted reports only: signed by their own cluster's key).
pub fn failures(
    repo: &Repository,
    status: &crate::status::Store,
    report_signers: Option<&AllowedSigners>,
) -> Result<Vec<Failure>, Error> {
    // As for confirmations, the clock judges which status commits are dated in the future.
    let all = crate::status::trusted_reports(repo, status, report_signers, Utc::now(), |v, r| {
        (r.state == crate::rollout::RolloutState::Failed).then(|| Failure {
            env: r.env.clone(),
            cluster: r.cluster.clone(),
            version: r.version.to_string(),
            since: r.since.to_rfc3339_opts(SecondsFormat::Secs, true),
            message: r.message.clone(),
            status_commit: v.commit.to_string(),
        })
    })?;
    let mut out: Vec<Failure> = Vec::new();
    for f in all {
        // Every report of one failed run has the same `since`: keep the first.
        if !out.iter().any(|o| {
            (&o.env, &o.cluster, &o.version, &o.since) == (&f.env, &f.cluster, &f.version, &f.since)
        }) {
            out.push(f);
        }
    }
    out.sort_by(|a, b| (&a.since, &a.cluster).cmp(&(&b.since, &b.cluster)));
    Ok(out)
}

/// The change a report of `version` in `env` at `at` concerns: the newest
/// change of that environment to that version made before it, else the
/// oldest such change.
fn concerned<'c>(
    changes: &'c mut [Change],
    env: &str,
    version: &str,
    at: &str,
) -> Option<&'c mut Change> {
    // Changes are newest first; RFC 3339 UTC strings of equal shape compare as times.
    let i = changes
        .iter()
        .position(|ch| ch.env == env && ch.version == version && ch.date.as_str() <= at)
        .or_else(|| {
            changes
                .iter()
                .rposition(|ch| ch.env == env && ch.version == version)
        })?;
    changes.get_mut(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_request_conventions() {
        assert_eq!(
            pull_request("Merge pull request #42 from team/bump\n\nBump"),
            Some(42)
        );
        assert_eq!(
            pull_request("Bump stage to 1.2.3 (#7)\n\nbody (#9)"),
            Some(7)
        );
        assert_eq!(pull_request("Bump stage\n\nsee (#9)"), None);
        assert_eq!(pull_request("no number"), None);
    }

    #[test]
    fn version_key_only() {
        assert_eq!(
            parse_version(b"version = \"1.2.3\"\n[window]\nx = 1\n"),
            "1.2.3"
        );
        assert_eq!(parse_version(b"[window]\n"), "(none)");
        assert_eq!(parse_version(b"version = "), "(invalid)");
    }
}
