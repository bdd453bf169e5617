//! Status reports for the timeline: the history of every report, read
//! through the one status reader with its whole-branch rule (docs/design.md
//! §5). The latest report of each cluster comes with the gate's read
//! ([`status::Confirmations::newest`]).

use crate::config::RepoConfig;
use crate::status::{self, ReportSigners, StatusReport, Store};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};

use super::model::Trust;

/// Most report versions the timeline reads; older ones are left out and a warning says so.
pub const MAX_HISTORY: usize = 100_000;

/// Errors reading the status branch.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A git operation failed.
    #[error("reading the status branches {branch}.d/<env>/<cluster>: {source}")]
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

/// The timeline's reader: every version, kept until its branch's verdict is known.
struct Collect<'a> {
    signed: bool,
    name: &'a str,
    out: Found,
    /// Versions of the branch being read, newest first.
    branch: Vec<Entry>,
    full: bool,
}

impl status::Visitor for Collect<'_> {
    fn version(&mut self, v: status::ReportVersion) {
        if v.deleted_at_tip || self.full {
            return;
        }
        if self.out.entries.len() + self.branch.len() >= MAX_HISTORY {
            self.full = true;
            self.out.warnings.push(format!(
                "status branches {}.d/<env>/<cluster>: more than {MAX_HISTORY} report versions; older ones are not shown",
                self.name
            ));
            return;
        }
        let path = status::report_path(&v.env, &v.cluster);
        match v.report {
            Ok(r) => self.branch.push(Entry {
                // The node lists stay: the page draws what each node ran.
                report: r,
                commit: v.commit,
                committed: v.committed,
                trust: Trust::Unverified,
                signer: None,
                untrusted: None,
            }),
            Err(why) => self
                .out
                .warnings
                .push(format!("{path} in {:.10}: {why}; skipped", v.commit)),
        }
    }

    fn branch(&mut self, b: &status::BranchRead<'_>) {
        if let Err(u) = b.verdict {
            self.out.warnings.push(u.to_string());
        }
        for u in b.broken.values() {
            self.out.warnings.push(u.to_string());
        }
        for mut e in self.branch.drain(..) {
            let principal = format!("{}/{}", e.report.env, e.report.cluster);
            let why = match b.verdict {
                Err(u) => Some(u.to_string()),
                Ok(_) => b.broken.get(&principal).map(ToString::to_string),
            };
            (e.trust, e.signer, e.untrusted) = match (self.signed, why) {
                (false, _) => (Trust::Unverified, None, None),
                (true, None) => (Trust::Trusted, Some(principal), None),
                (true, Some(why)) => (Trust::Untrusted, None, Some(why)),
            };
            self.out.entries.push(e);
        }
    }
}

/// Walk the status store (the single branch of the older layout, then
/// every cluster's branch), each newest first, and collect each version of
/// each report file once (at the commit that wrote it), through the one
/// status reader ([`status::walk_store`]), up to [`MAX_HISTORY`]. `signers`
/// are the report signers of the config in force (`None`: no
/// `report_signers`, so nothing is verified); `now` is the reader's clock.
pub fn walk(
    repo: &Repository,
    cfg: &RepoConfig,
    store: &Store,
    signers: ReportSigners<'_>,
    now: DateTime<Utc>,
) -> Result<Found, Error> {
    let name = cfg.root.status_branch.clone();
    let mut c = Collect {
        signed: signers.is_some(),
        name: &name,
        out: Found::default(),
        branch: Vec::new(),
        full: false,
    };
    c.out
        .warnings
        .extend(store.ignored.iter().map(|i| format!("{}; skipped", i.why)));
    let seen = crate::source::seen::StatusSeen::load(repo.path());
    let judge = status::Judge {
        signers,
        now,
        seen: (!seen.is_empty()).then_some(&seen),
    };
    status::walk_store(repo, store, &judge, &mut c).map_err(|source| Error::Git {
        branch: name.clone(),
        source,
    })?;
    // Newest first over all branches: the single branch, read first, is the older history.
    c.out
        .entries
        .sort_by_key(|e| std::cmp::Reverse(e.committed));
    Ok(c.out)
}
