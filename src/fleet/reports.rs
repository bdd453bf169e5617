//! Status reports for the fleet view: the latest report of each cluster,
//! and the history of every report for the timeline, read through the one
//! status reader with its signature check (docs/design.md §5).

use crate::config::RepoConfig;
use crate::status::{self, ReportSigners, StatusReport, Store, Walk};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use std::collections::BTreeSet;

use super::model::Trust;

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
    /// Why the report is untrusted (the signature check's answer), when it is.
    pub untrusted: Option<String>,
}

/// What a walk of the status branch found.
#[derive(Debug, Default)]
pub struct Found {
    /// Report versions, newest first.
    pub entries: Vec<Entry>,
    /// Reports skipped (oversized, not UTF-8, invalid, wrong path), one line each.
    pub warnings: Vec<String>,
}

/// Walk the status store (every cluster's branch, then the single branch
/// of the older layout), each newest first, and collect each version of
/// each report file once (at the commit that wrote it), through the one
/// status reader ([`status::walk_store`]). `signers` are the report signers
/// of the config in force (`None`: no `report_signers`, so nothing is
/// verified). `want` limits the walk to the newest readable report of each
/// cluster it names (`None`: the whole history, up to [`MAX_HISTORY`]).
pub fn walk(
    repo: &Repository,
    cfg: &RepoConfig,
    store: &Store,
    signers: ReportSigners<'_>,
    want: Option<&[(String, String)]>,
) -> Result<Found, Error> {
    let name = cfg.root.status_branch.clone();
    let mut out = Found::default();
    out.warnings
        .extend(store.ignored.iter().map(|i| format!("{}; skipped", i.why)));
    let mut missing: Option<BTreeSet<(String, String)>> = want.map(|w| w.iter().cloned().collect());
    status::walk_store(repo, store, signers, |v| {
        if v.deleted_at_tip {
            return Walk::Continue;
        }
        if out.entries.len() >= MAX_HISTORY {
            out.warnings.push(format!(
                "status branch {name}: more than {MAX_HISTORY} report versions; older ones are not shown"
            ));
            return Walk::Stop;
        }
        let path = status::report_path(&v.env, &v.cluster);
        let report = match v.report {
            Ok(r) => r,
            Err(why) => {
                out.warnings
                    .push(format!("{path} in {:.10}: {why}; skipped", v.commit));
                return Walk::Continue;
            }
        };
        if let Some(m) = missing.as_mut() {
            if !m.remove(&(v.env.clone(), v.cluster.clone())) {
                // Not wanted, or its newest report is already taken.
                return if m.is_empty() { Walk::Stop } else { Walk::NextBranch };
            }
        }
        let (trust, signer, untrusted) = match (signers, v.trust) {
            (None, _) => (Trust::Unverified, None, None),
            (Some(_), Ok(())) => (
                Trust::Trusted,
                Some(format!("{}/{}", v.env, v.cluster)),
                None,
            ),
            (Some(_), Err(why)) => (Trust::Untrusted, None, Some(why)),
        };
        out.entries.push(Entry {
            report,
            commit: v.commit,
            committed: v.committed,
            trust,
            signer,
            untrusted,
        });
        match &missing {
            Some(m) if m.is_empty() => Walk::Stop,
            // The rest of this cluster's reports are older.
            Some(_) => Walk::NextBranch,
            None => Walk::Continue,
        }
    })
    .map_err(|source| Error::Git {
        branch: name.clone(),
        source,
    })?;
    Ok(out)
}
