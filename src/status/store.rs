//! The status store's layout (docs/design.md §5): one branch per cluster,
//! `<status_branch>.d/<env>/<cluster>`, each holding only that cluster's
//! `status/<env>/<cluster>.toml`, and the single `<status_branch>` of the
//! older layout, still read.
//!
//! Why one branch per cluster: every agent pushes only to its own branch, so
//! a push is a fast-forward no other agent can race (on one shared branch,
//! 1,000 agents lost most of their reports to each other), and a forge can
//! restrict each agent's credentials to its own branch.
//!
//! Why `.d`: git cannot hold `refs/heads/drover/status` and
//! `refs/heads/drover/status/<env>/<cluster>` at once (a ref name cannot be
//! both a file and a directory), so branches under the old name would be
//! refused by every remote that still has the old branch.
//!
//! On a cluster's branch only its own file counts: a file naming another
//! cluster is ignored and named, whoever signed it. The older single branch
//! is each cluster's older history: a cluster's reports are read from its
//! own branch (newest first), then from the single branch, so a confirmation
//! made before the move to per-cluster branches still stands, and a `failed`
//! report on the cluster's own branch still withdraws it.

use super::read::{
    check_signer_with, commit_time, find_status_branch, read_report, report_blobs, tally,
    walk_versions_checked, BranchRef, Checks, Confirmations, Error, Ignored, ReportSigners,
    ReportVersion, Sieve, TrustedReport, NOT_CHECKED,
};
use super::report_path;
use git2::{Commit, Oid, Repository};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::path::Path;

/// Most per-cluster status branches read (docs/status.md): ten times the
/// largest fleet drover is measured at. A store with more is refused as a
/// whole rather than read in part, so no cluster's evidence is silently dropped.
pub const MAX_STATUS_BRANCHES: usize = 10_000;

/// Name of the branch that holds `env`/`cluster`'s reports.
pub fn cluster_branch(status_branch: &str, env: &str, cluster: &str) -> String {
    format!("{status_branch}.d/{env}/{cluster}")
}

/// The per-cluster namespace of `status_branch`, with a trailing slash.
pub fn cluster_namespace(status_branch: &str) -> String {
    format!("{status_branch}.d/")
}

/// One cluster's status branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterBranch {
    /// Environment named by the branch.
    pub env: String,
    /// Cluster named by the branch.
    pub cluster: String,
    /// Where it was read: local `refs/heads/...` or `refs/remotes/origin/...`.
    pub branch: BranchRef,
}

/// Every status branch found in a repository.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Store {
    /// Per-cluster branches, by (env, cluster).
    pub clusters: Vec<ClusterBranch>,
    /// The single branch of the older layout, if present.
    pub legacy: Option<BranchRef>,
    /// Refs in the per-cluster namespace that name no `<env>/<cluster>`.
    pub ignored: Vec<Ignored>,
}

impl Store {
    /// True when there is no status branch at all.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty() && self.legacy.is_none()
    }

    /// Number of branches read.
    pub fn len(&self) -> usize {
        self.clusters.len() + usize::from(self.legacy.is_some())
    }
}

/// Find the status store of `status_branch`: per-cluster branches (a local
/// branch wins over `origin/`'s, as for the single branch) and the single
/// branch of the older layout. More than [`MAX_STATUS_BRANCHES`] is an error.
pub fn find_store(repo: &Repository, status_branch: &str) -> Result<Store, Error> {
    let git = |source| Error::Git {
        branch: status_branch.to_owned(),
        source,
    };
    let ns = cluster_namespace(status_branch);
    let mut found: BTreeMap<(String, String), ClusterBranch> = BTreeMap::new();
    let mut ignored = Vec::new();
    // Remote-tracking first, so a local branch of the same cluster replaces it.
    for prefix in [
        format!("refs/remotes/origin/{ns}"),
        format!("refs/heads/{ns}"),
    ] {
        let refs = match repo.references_glob(&format!("{prefix}*")) {
            Ok(r) => r,
            Err(e) if e.code() == git2::ErrorCode::InvalidSpec => continue,
            Err(e) => return Err(git(e)),
        };
        for r in refs {
            let r = r.map_err(git)?;
            let Ok(name) = r.name() else { continue };
            let rest = &name[prefix.len()..];
            let parts: Vec<&str> = rest.split('/').collect();
            let [env, cluster] = parts[..] else {
                ignored.push(Ignored {
                    env: String::new(),
                    cluster: rest.to_owned(),
                    commit: r.target().map(|o| o.to_string()).unwrap_or_default(),
                    why: format!(
                        "{name} is not a cluster's status branch ({prefix}<env>/<cluster>)"
                    ),
                });
                continue;
            };
            let key = (env.to_owned(), cluster.to_owned());
            if found.len() >= MAX_STATUS_BRANCHES && !found.contains_key(&key) {
                return Err(Error::TooManyBranches {
                    branch: status_branch.to_owned(),
                    max: MAX_STATUS_BRANCHES,
                });
            }
            let tip = r.peel_to_commit().map_err(git)?.id();
            found.insert(
                key,
                ClusterBranch {
                    env: env.to_owned(),
                    cluster: cluster.to_owned(),
                    branch: BranchRef {
                        refname: name.to_owned(),
                        tip,
                    },
                },
            );
        }
    }
    Ok(Store {
        clusters: found.into_values().collect(),
        legacy: find_status_branch(repo, status_branch)?,
        ignored,
    })
}

/// What a walk's visitor wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// The next version on this branch.
    Continue,
    /// Nothing more of this version's cluster from this branch: on a
    /// cluster's branch the walk goes on to the next branch; on the single
    /// branch of the older layout, later versions of that cluster are skipped.
    NextBranch,
    /// Nothing more at all.
    Stop,
}

/// The blob at `path` in a commit's tree, if it is a file.
fn blob_at(commit: &Commit<'_>, path: &Path) -> Result<Option<Oid>, git2::Error> {
    match commit.tree()?.get_path(path) {
        Ok(e) if e.kind() == Some(git2::ObjectType::Blob) => Ok(Some(e.id())),
        Ok(_) => Ok(None),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Walk one cluster's branch along first parents, newest first: every
/// version of its own report file, after one version per foreign file at
/// the tip (each an unreadable report saying why it does not count).
fn walk_cluster(
    repo: &Repository,
    b: &ClusterBranch,
    signers: ReportSigners<'_>,
    checks: Checks,
    visit: &mut impl FnMut(ReportVersion) -> Walk,
) -> Result<Walk, git2::Error> {
    let own = signers.map(|all| all.for_principal(&format!("{}/{}", b.env, b.cluster)));
    let path_text = report_path(&b.env, &b.cluster);
    let path = Path::new(&path_text);
    let mut commit = repo.find_commit(b.branch.tip)?;
    for (env, cluster) in report_blobs(repo, &commit)?.into_keys() {
        if env == b.env && cluster == b.cluster {
            continue;
        }
        let why = format!(
            "it is on the status branch of {}/{} ({}); a report counts only on its own cluster's branch",
            b.env, b.cluster, b.branch.refname
        );
        let flow = visit(ReportVersion {
            env,
            cluster,
            commit: commit.id(),
            committed: commit_time(&commit),
            report: Err(why.clone()),
            trust: Err(why),
            deleted_at_tip: false,
            checked: true,
        });
        // `NextBranch` is about that other cluster; this branch's own file comes next.
        if flow == Walk::Stop {
            return Ok(flow);
        }
    }
    let deleted_at_tip = blob_at(&commit, path)?.is_none();
    let mut blob = blob_at(&commit, path)?;
    let mut newest = true;
    loop {
        let parent = commit.parent(0).ok();
        let parent_blob = match &parent {
            Some(p) if p.tree_id() == commit.tree_id() => blob,
            Some(p) => blob_at(p, path)?,
            None => None,
        };
        if let Some(this) = blob.filter(|&this| Some(this) != parent_blob) {
            let report = read_report(repo, this, &b.env, &b.cluster);
            let checked = report.as_ref().map_or(true, |r| checks.wants(r, newest));
            newest = false;
            let trust = match (&report, deleted_at_tip) {
                (Ok(_), false) if !checked => Err(NOT_CHECKED.into()),
                (Ok(_), false) => {
                    check_signer_with(repo, commit.id(), &b.env, &b.cluster, signers, own.as_ref())
                }
                (Err(why), _) => Err(why.clone()),
                (Ok(_), true) => Err("the file is deleted at the branch tip".into()),
            };
            let flow = visit(ReportVersion {
                env: b.env.clone(),
                cluster: b.cluster.clone(),
                commit: commit.id(),
                committed: commit_time(&commit),
                report,
                trust,
                deleted_at_tip,
                checked,
            });
            if flow != Walk::Continue {
                return Ok(flow);
            }
        }
        match parent {
            Some(p) => {
                commit = p;
                blob = parent_blob;
            }
            None => return Ok(Walk::Continue),
        }
    }
}

/// Walk the whole store, calling `visit` once per version of each report:
/// each cluster's branch newest first (clusters in name order), then the
/// single branch of the older layout newest first. Every version passes the
/// checks of [`super::walk_versions`]; on a cluster's branch, files of other
/// clusters come as unreadable versions saying why they do not count.
pub fn walk_store(
    repo: &Repository,
    store: &Store,
    signers: ReportSigners<'_>,
    visit: impl FnMut(ReportVersion) -> Walk,
) -> Result<(), git2::Error> {
    walk_store_checked(repo, store, signers, Checks::All, visit)
}

/// [`walk_store`], checking the signatures `checks` asks for.
fn walk_store_checked(
    repo: &Repository,
    store: &Store,
    signers: ReportSigners<'_>,
    checks: Checks,
    mut visit: impl FnMut(ReportVersion) -> Walk,
) -> Result<(), git2::Error> {
    for b in &store.clusters {
        if walk_cluster(repo, b, signers, checks, &mut visit)? == Walk::Stop {
            return Ok(());
        }
    }
    if let Some(legacy) = &store.legacy {
        let mut done: BTreeSet<(String, String)> = BTreeSet::new();
        walk_versions_checked(repo, legacy.tip, signers, checks, |v| {
            let key = (v.env.clone(), v.cluster.clone());
            if done.contains(&key) {
                return ControlFlow::Continue(());
            }
            match visit(v) {
                Walk::Continue => ControlFlow::Continue(()),
                Walk::NextBranch => {
                    done.insert(key);
                    ControlFlow::Continue(())
                }
                Walk::Stop => ControlFlow::Break(()),
            }
        })?;
    }
    Ok(())
}

/// [`walk_store`], passing on trusted reports only and recording every
/// ignored one (and every misnamed branch) in `ignored`.
pub fn walk_store_reports(
    repo: &Repository,
    store: &Store,
    signers: ReportSigners<'_>,
    ignored: &mut Vec<Ignored>,
    visit: impl FnMut(TrustedReport),
) -> Result<(), git2::Error> {
    sieve_store(repo, store, signers, Checks::All, ignored, visit)
}

/// [`walk_store_reports`], checking the signatures `checks` asks for.
fn sieve_store(
    repo: &Repository,
    store: &Store,
    signers: ReportSigners<'_>,
    checks: Checks,
    ignored: &mut Vec<Ignored>,
    mut visit: impl FnMut(TrustedReport),
) -> Result<(), git2::Error> {
    ignored.extend(store.ignored.iter().cloned());
    let mut sieve = Sieve::default();
    walk_store_checked(repo, store, signers, checks, |v| {
        if let Some(t) = sieve.take(v, ignored) {
            visit(t);
        }
        Walk::Continue
    })
}

/// What the whole store proves, trusting reports signed by `signers`.
pub fn confirmations_in(
    repo: &Repository,
    store: &Store,
    signers: ReportSigners<'_>,
) -> Result<Confirmations, git2::Error> {
    // The gate's read: only versions that can count (or are a file's newest)
    // have their signature checked; the rest cannot change a confirmation.
    tally(|ignored, visit| sieve_store(repo, store, signers, Checks::Evidence, ignored, visit))
}
