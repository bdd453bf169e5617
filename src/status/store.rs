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
//! A cluster's branch holds only its own file; anything else makes the
//! branch untrusted as a whole ([`super::branch`]). The older single branch
//! is each cluster's older history, read first: a cluster's reports on both
//! branches are ordered by their signed commit times, so a confirmation made
//! before the move to per-cluster branches still stands, and a `failed`
//! report on either branch withdraws an earlier confirmation on the other.
//! When a branch holding a cluster's reports does not count, none of that
//! cluster's confirmations count (from either branch): breaking a branch can
//! hide a `failed` report, so it must never let an older confirmation stand.

use super::branch::{scan, Found, Judge, Layout, ReportSigners, Signatures, Untrusted};
use super::read::{
    find_status_branch, read_report, read_report_sized, BranchRef, Error, Ignored, ReportVersion,
};
use crate::status_refs::{cluster_namespace, Listed, MAX_STATUS_BRANCHES};
use chrono::{DateTime, Utc};
use git2::Repository;
use std::collections::{BTreeMap, HashSet};

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

    /// The store as it was at `at` (`status --now T`): each branch's tip
    /// moved back along its first parents to the newest commit dated at or
    /// before `at`, a branch with none left out, and how many commits were
    /// passed over (each a report written after `at`). Reading the later
    /// commits would judge them by a clock set to `at`, and a commit dated
    /// ahead of the reader's clock breaks its whole branch (the branch
    /// rule), which hid every report of then behind one of later. At most
    /// [`MAX_REWIND`] commits are passed over per branch; a branch with
    /// more is left out, and counted as such.
    pub fn as_of(
        &self,
        repo: &Repository,
        at: DateTime<Utc>,
    ) -> Result<(Store, usize), git2::Error> {
        let mut left_out = 0;
        let mut rewind = |b: &BranchRef| -> Result<Option<BranchRef>, git2::Error> {
            let mut commit = repo.find_commit(b.tip)?;
            for _ in 0..MAX_REWIND {
                if super::branch::time_of(&commit) <= at {
                    return Ok(Some(BranchRef {
                        refname: b.refname.clone(),
                        tip: commit.id(),
                    }));
                }
                left_out += 1;
                commit = match commit.parent(0) {
                    Ok(p) => p,
                    Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
                    Err(e) => return Err(e),
                };
            }
            Ok(None)
        };
        let legacy = match &self.legacy {
            Some(b) => rewind(b)?,
            None => None,
        };
        let mut clusters = Vec::with_capacity(self.clusters.len());
        for c in &self.clusters {
            if let Some(branch) = rewind(&c.branch)? {
                clusters.push(ClusterBranch {
                    branch,
                    ..c.clone()
                });
            }
        }
        Ok((
            Store {
                clusters,
                legacy,
                ignored: self.ignored.clone(),
            },
            left_out,
        ))
    }
}

/// Most commits [`Store::as_of`] passes over on one branch (a cluster that
/// reports every few minutes writes about 100,000 a year).
pub const MAX_REWIND: usize = 100_000;

/// Which branches of the per-cluster namespace a read takes.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Exactly the branches of these clusters, each looked up by its name
    /// (a binary search of the packed refs, a file for a loose one): what
    /// else the namespace holds, however much, is never listed nor read.
    /// The gate, the waves and the halt, `drover check`, `drover status`
    /// and the agent read this way, from the policy's `[clusters]`.
    Listed(&'a Listed),
    /// Every ref of the namespace, for a reader without a config (tests,
    /// benches): more than [`MAX_STATUS_BRANCHES`] cluster branches are
    /// refused, and refs that name no `<env>/<cluster>` are counted, the
    /// first [`MAX_IGNORED_REFS`] of them named.
    Every,
}

/// Most refs of the namespace that name no `<env>/<cluster>` that a read
/// of [`Scope::Every`] names one by one; the rest are counted in one line.
pub const MAX_IGNORED_REFS: usize = 20;

/// Find the status store of `status_branch` within `scope`: per-cluster
/// branches (a local branch wins over `origin/`'s, as for the single
/// branch) and the single branch of the older layout. More than
/// [`MAX_STATUS_BRANCHES`] is an error.
pub fn find_store(
    repo: &Repository,
    status_branch: &str,
    scope: Scope<'_>,
) -> Result<Store, Error> {
    let git = |source| Error::Git {
        branch: status_branch.to_owned(),
        source,
    };
    let ns = cluster_namespace(status_branch);
    let mut found: BTreeMap<(String, String), ClusterBranch> = BTreeMap::new();
    let mut ignored = Vec::new();
    let too_many = || Error::TooManyBranches {
        branch: status_branch.to_owned(),
        max: MAX_STATUS_BRANCHES,
    };
    match scope {
        Scope::Listed(listed) => {
            if listed.values().map(Vec::len).sum::<usize>() > MAX_STATUS_BRANCHES {
                return Err(too_many());
            }
            for (env, clusters) in listed {
                for cluster in clusters {
                    let rest = format!("{ns}{env}/{cluster}");
                    // Local first: a local branch wins over origin's.
                    for refname in [
                        format!("refs/heads/{rest}"),
                        format!("refs/remotes/origin/{rest}"),
                    ] {
                        let r = match repo.find_reference(&refname) {
                            Ok(r) => r,
                            Err(e)
                                if matches!(
                                    e.code(),
                                    git2::ErrorCode::NotFound | git2::ErrorCode::InvalidSpec
                                ) =>
                            {
                                continue
                            }
                            Err(e) => return Err(git(e)),
                        };
                        let tip = r.peel_to_commit().map_err(git)?.id();
                        found.insert(
                            (env.clone(), cluster.clone()),
                            ClusterBranch {
                                env: env.clone(),
                                cluster: cluster.clone(),
                                branch: BranchRef { refname, tip },
                            },
                        );
                        break;
                    }
                }
            }
        }
        Scope::Every => {
            let mut foreign = 0usize;
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
                        foreign += 1;
                        if foreign <= MAX_IGNORED_REFS {
                            ignored.push(Ignored {
                                env: String::new(),
                                cluster: rest.to_owned(),
                                commit: r.target().map(|o| o.to_string()).unwrap_or_default(),
                                why: format!(
                                    "{name} is not a cluster's status branch ({prefix}<env>/<cluster>)"
                                ),
                            });
                        }
                        continue;
                    };
                    let key = (env.to_owned(), cluster.to_owned());
                    if found.len() >= MAX_STATUS_BRANCHES && !found.contains_key(&key) {
                        return Err(too_many());
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
            if foreign > MAX_IGNORED_REFS {
                ignored.push(Ignored {
                    env: String::new(),
                    cluster: format!("{ns}*"),
                    commit: String::new(),
                    why: format!(
                        "{} more refs that name no <env>/<cluster> (not named one by one)",
                        foreign - MAX_IGNORED_REFS
                    ),
                });
            }
        }
    }
    Ok(Store {
        clusters: found.into_values().collect(),
        legacy: find_status_branch(repo, status_branch)?,
        ignored,
    })
}

/// What one branch's read came to, as a [`Visitor`] is told at its end.
#[derive(Debug)]
pub struct BranchRead<'a> {
    /// The branch's full ref name.
    pub refname: &'a str,
    /// What it holds.
    pub layout: &'a Layout,
    /// `Ok` when it keeps the rule as a whole.
    pub verdict: &'a Result<(), Untrusted>,
    /// Single branch: clusters whose reports there do not count, and why.
    pub broken: &'a BTreeMap<String, Untrusted>,
    /// The bound stopped the read before the branch's first commit.
    pub truncated: bool,
}

/// What reads the store: told each version of each report as its branch is
/// read (newest first), then how the branch's read ended. A version counts
/// only when its branch's verdict, known at the end, holds.
pub trait Visitor {
    /// One version of one report file.
    fn version(&mut self, v: ReportVersion);
    /// The branch whose versions were just given is done.
    fn branch(&mut self, b: &BranchRead<'_>);
}

/// Most threads that read cluster branches at once ([`walk_store`]).
pub const MAX_READ_THREADS: usize = 4;
/// Most report bytes a reading thread holds for one branch before it hands
/// the branch back to be read in order (about 2,000 ordinary reports).
const MAX_BUFFERED_BYTES: usize = 1024 * 1024;
/// Branches read ahead of the one being handed over, per thread: bounds
/// what waits in memory when one long branch holds the others up.
const READ_AHEAD: usize = 2;

/// Read the whole store under `judge`: the single branch of the older layout
/// first, then each cluster's branch in name order, every one through the
/// whole-branch rule ([`super::branch`]).
///
/// The cluster branches are read by up to [`MAX_READ_THREADS`] threads (as
/// many as the process may run at once), each with its own handle on the
/// repository, and handed to `visitor` in name order, one whole branch at a
/// time: each branch is judged by the same code whichever thread reads it,
/// so no verdict depends on timing. A thread holds at most
/// [`MAX_BUFFERED_BYTES`] of a branch's reports; a larger branch is read
/// again in order, one report at a time, as the single branch is.
pub fn walk_store(
    repo: &Repository,
    store: &Store,
    judge: &Judge<'_>,
    visitor: &mut dyn Visitor,
) -> Result<(), git2::Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    walk_store_threads(repo, store, judge, visitor, threads)
}

/// [`walk_store`] with at most `threads` threads (1: every branch in order
/// on the calling thread); the visitor is told the same either way.
pub fn walk_store_threads(
    repo: &Repository,
    store: &Store,
    judge: &Judge<'_>,
    visitor: &mut dyn Visitor,
    threads: usize,
) -> Result<(), git2::Error> {
    super::bound_object_cache();
    let sigs = Signatures::new(judge.signers);
    if let Some(legacy) = &store.legacy {
        walk_legacy(repo, legacy, judge, &sigs, visitor)?;
    }
    let threads = threads.min(MAX_READ_THREADS).min(store.clusters.len());
    if threads < 2 {
        for b in &store.clusters {
            let read = read_cluster(repo, b, judge, &sigs, &mut |v, _| {
                visitor.version(v);
                true
            })?;
            visitor.branch(&read.view());
        }
        return Ok(());
    }
    let handles = (0..threads)
        .map(|_| Repository::open(repo.path()))
        .collect::<Result<Vec<_>, _>>()?;
    walk_clusters_in_parallel(repo, handles, store, judge, &sigs, visitor)
}

/// The single branch of the older layout, read in order.
fn walk_legacy(
    repo: &Repository,
    legacy: &BranchRef,
    judge: &Judge<'_>,
    sigs: &Signatures<'_>,
    visitor: &mut dyn Visitor,
) -> Result<(), git2::Error> {
    // A file whose newest version deletes it: its reports no longer count.
    let mut newest_seen: HashSet<(String, String)> = HashSet::new();
    let mut deleted: HashSet<(String, String)> = HashSet::new();
    let layout = Layout::Legacy;
    let end = scan(
        repo,
        &legacy.refname,
        legacy.tip,
        &layout,
        judge,
        sigs,
        &mut |f: Found| {
            let key = (f.env.clone(), f.cluster.clone());
            if newest_seen.insert(key.clone()) && f.blob.is_none() {
                deleted.insert(key.clone());
            }
            let Some(blob) = f.blob else { return };
            visitor.version(ReportVersion {
                report: read_report(repo, blob, &f.env, &f.cluster),
                deleted_at_tip: deleted.contains(&key),
                env: f.env,
                cluster: f.cluster,
                commit: f.commit,
                committed: f.committed,
            });
        },
    )?;
    visitor.branch(&BranchRead {
        refname: &legacy.refname,
        layout: &layout,
        verdict: &end.verdict,
        broken: &end.broken,
        truncated: end.truncated,
    });
    Ok(())
}

/// How the read of one cluster's branch ended.
struct ClusterRead<'b> {
    branch: &'b ClusterBranch,
    layout: Layout,
    end: super::branch::Scanned,
}

impl ClusterRead<'_> {
    fn view(&self) -> BranchRead<'_> {
        BranchRead {
            refname: &self.branch.branch.refname,
            layout: &self.layout,
            verdict: &self.end.verdict,
            broken: &self.end.broken,
            truncated: self.end.truncated,
        }
    }
}

/// Read one cluster's branch, giving each version of its report, with the
/// size of its file, to `take` (newest first) until `take` wants no more.
fn read_cluster<'b>(
    repo: &Repository,
    b: &'b ClusterBranch,
    judge: &Judge<'_>,
    sigs: &Signatures<'_>,
    take: &mut dyn FnMut(ReportVersion, usize) -> bool,
) -> Result<ClusterRead<'b>, git2::Error> {
    let layout = Layout::Cluster {
        env: b.env.clone(),
        cluster: b.cluster.clone(),
    };
    let mut wanted = true;
    let end = scan(
        repo,
        &b.branch.refname,
        b.branch.tip,
        &layout,
        judge,
        sigs,
        &mut |f: Found| {
            let Some(blob) = f.blob.filter(|_| wanted) else {
                return;
            };
            let (size, report) = read_report_sized(repo, blob, &f.env, &f.cluster);
            let v = ReportVersion {
                report,
                deleted_at_tip: false,
                env: f.env,
                cluster: f.cluster,
                commit: f.commit,
                committed: f.committed,
            };
            wanted = take(v, size);
        },
    )?;
    Ok(ClusterRead {
        branch: b,
        layout,
        end,
    })
}

/// One cluster branch read by a thread: its reports (`None` when they
/// outgrew [`MAX_BUFFERED_BYTES`]) and how its read ended.
type Read<'b> = Result<(Option<Vec<ReportVersion>>, ClusterRead<'b>), git2::Error>;

/// The cluster branches of `store`, read by one thread per handle and given
/// to `visitor` in order (see [`walk_store`]).
fn walk_clusters_in_parallel(
    repo: &Repository,
    handles: Vec<Repository>,
    store: &Store,
    judge: &Judge<'_>,
    sigs: &Signatures<'_>,
    visitor: &mut dyn Visitor,
) -> Result<(), git2::Error> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{mpsc, Condvar, Mutex};
    let branches = &store.clusters;
    let ahead = READ_AHEAD * handles.len();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // The index of the branch being handed over, and its change.
    let handed = (Mutex::new(0usize), Condvar::new());
    let (tx, rx) = mpsc::sync_channel::<(usize, Read<'_>)>(ahead);
    std::thread::scope(|s| {
        for handle in handles {
            let tx = tx.clone();
            let (next, stop, handed) = (&next, &stop, &handed);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= branches.len() {
                    return;
                }
                // Never more than `ahead` branches past the one handed over.
                let (lock, moved) = handed;
                let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
                let guard = moved
                    .wait_while(guard, |h| i >= *h + ahead && !stop.load(Ordering::Relaxed))
                    .unwrap_or_else(|e| e.into_inner());
                drop(guard);
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let mut held = Some(Vec::new());
                let mut bytes = 0;
                let read = read_cluster(&handle, &branches[i], judge, sigs, &mut |v, size| {
                    // Parsed, a report takes about twice its file's bytes.
                    bytes += std::mem::size_of::<ReportVersion>() + 2 * size;
                    match held.as_mut().filter(|_| bytes <= MAX_BUFFERED_BYTES) {
                        Some(h) => {
                            h.push(v);
                            true
                        }
                        None => {
                            held = None;
                            false
                        }
                    }
                });
                if tx.send((i, read.map(|r| (held, r)))).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        let result = hand_over(repo, branches, rx, judge, sigs, visitor, &handed);
        // On an error, the threads stop at their next branch.
        stop.store(true, Ordering::Relaxed);
        handed.1.notify_all();
        result
    })
}

/// Give each branch read by the threads to `visitor`, in order; a branch
/// whose reports a thread could not hold is read again here.
fn hand_over<'b>(
    repo: &Repository,
    branches: &'b [ClusterBranch],
    rx: std::sync::mpsc::Receiver<(usize, Read<'b>)>,
    judge: &Judge<'_>,
    sigs: &Signatures<'_>,
    visitor: &mut dyn Visitor,
    handed: &(std::sync::Mutex<usize>, std::sync::Condvar),
) -> Result<(), git2::Error> {
    let mut waiting: BTreeMap<usize, Read<'b>> = BTreeMap::new();
    let mut want = 0;
    while want < branches.len() {
        let Some(read) = waiting.remove(&want) else {
            let Ok((i, read)) = rx.recv() else {
                // Every thread ended without this branch: only a panic does that.
                return Err(git2::Error::from_str("a status branch reader stopped"));
            };
            waiting.insert(i, read);
            continue;
        };
        let (held, read) = read?;
        match held {
            Some(versions) => {
                for v in versions {
                    visitor.version(v);
                }
                visitor.branch(&read.view());
            }
            None => {
                let read = read_cluster(repo, &branches[want], judge, sigs, &mut |v, _| {
                    visitor.version(v);
                    true
                })?;
                visitor.branch(&read.view());
            }
        }
        want += 1;
        *handed.0.lock().unwrap_or_else(|e| e.into_inner()) = want;
        handed.1.notify_all();
    }
    Ok(())
}

/// Whether the branch `refname` at `tip`, holding `env`/`cluster`'s
/// reports, counts as a whole under `judge` (the agent asks before it builds
/// its next report on its own branch, and before it recovers from it).
pub fn judge_branch(
    repo: &Repository,
    refname: &str,
    tip: git2::Oid,
    env: &str,
    cluster: &str,
    judge: &Judge<'_>,
) -> Result<Result<(), Untrusted>, git2::Error> {
    super::bound_object_cache();
    let layout = Layout::Cluster {
        env: env.to_owned(),
        cluster: cluster.to_owned(),
    };
    let sigs = Signatures::new(judge.signers);
    Ok(scan(repo, refname, tip, &layout, judge, &sigs, &mut |_| {})?.verdict)
}

/// The reports of the whole store that count (signed by their own
/// cluster's key, on a branch that holds as a whole), as `pick` keeps them:
/// it is given each readable report as its branch is read, newest first,
/// and what it returns is kept only once that branch's verdict holds. With
/// no `signers`, no report counts.
pub fn trusted_reports<T>(
    repo: &Repository,
    store: &Store,
    signers: ReportSigners<'_>,
    now: DateTime<Utc>,
    pick: impl FnMut(&ReportVersion, &super::StatusReport) -> Option<T>,
) -> Result<Vec<T>, git2::Error> {
    if signers.is_none() {
        return Ok(Vec::new());
    }
    let seen = crate::source::seen::StatusSeen::load(repo.path());
    let judge = Judge {
        signers,
        now,
        seen: (!seen.is_empty()).then_some(&seen),
    };
    let mut keep = Keep {
        pick,
        pending: Vec::new(),
        out: Vec::new(),
    };
    walk_store(repo, store, &judge, &mut keep)?;
    Ok(keep.out)
}

/// [`trusted_reports`]'s reader: picks of the branch being read, each with
/// its cluster's principal, until the branch's verdict is known.
struct Keep<T, F> {
    pick: F,
    pending: Vec<(String, T)>,
    out: Vec<T>,
}

impl<T, F: FnMut(&ReportVersion, &super::StatusReport) -> Option<T>> Visitor for Keep<T, F> {
    fn version(&mut self, v: ReportVersion) {
        if v.deleted_at_tip {
            return;
        }
        if let Ok(r) = &v.report {
            if let Some(t) = (self.pick)(&v, r) {
                self.pending.push((format!("{}/{}", v.env, v.cluster), t));
            }
        }
    }

    fn branch(&mut self, b: &BranchRead<'_>) {
        let pending = std::mem::take(&mut self.pending);
        if b.verdict.is_err() {
            return;
        }
        self.out.extend(
            pending
                .into_iter()
                .filter(|(principal, _)| !b.broken.contains_key(principal))
                .map(|(_, t)| t),
        );
    }
}
