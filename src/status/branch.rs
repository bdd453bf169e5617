//! The whole-branch rule (docs/design.md §5): a status branch counts only
//! as a whole. One branch is read from its tip, newest first, and every
//! commit is checked on the way: it has at most one parent, its tree holds
//! what its layout allows, it is signed by a key listed for the cluster it
//! writes (valid at the commit's time and, for the agent, when it first
//! fetched it), and its time is not after its child's nor ahead of the
//! reader's clock. The first commit that breaks the rule ends the read, and
//! the whole branch is untrusted, named with that commit and why.
//!
//! Every read is bounded: commit and tree objects are sized from their
//! headers before they are loaded, so a tree of 400,000 files is refused
//! without being read, and a branch is read to at most
//! [`MAX_BRANCH_COMMITS`] (a cluster's) or [`MAX_LEGACY_COMMITS`] (the
//! single branch of the older layout) commits. What lies deeper is not read
//! and counts for nothing.

use super::read::ReportSigners;
use crate::source::seen::{Mark, StatusSeen};
use crate::trust::{self, AllowedSigners};
use chrono::{DateTime, Duration, TimeZone, Utc};
use git2::{Commit, ObjectType, Odb, Oid, Repository, Tree};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Most commits of one cluster's status branch that are read, newest first
/// (docs/status.md, "Bounds"): about a year of a busy cluster's reports.
pub const MAX_BRANCH_COMMITS: usize = 1_000;
/// Most commits of the single status branch of the older layout that are
/// read, newest first: it holds every cluster's reports.
pub const MAX_LEGACY_COMMITS: usize = 100_000;
/// How far ahead of the reader's clock a status commit may be dated (two
/// clocks are never exactly in step).
pub const MAX_CLOCK_SKEW_SECS: i64 = 300;
/// Largest status commit object read: a signature and a short message.
const MAX_COMMIT_BYTES: usize = 64 * 1024;
/// Largest tree object of a cluster's branch: one entry with a name of at
/// most 255 bytes.
const MAX_CLUSTER_TREE_BYTES: usize = 512;
/// Largest tree object of the single branch: `status/<env>/` with one file
/// per cluster of the largest fleet read.
const MAX_LEGACY_TREE_BYTES: usize = 1024 * 1024;

/// What a status branch holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// `<status_branch>.d/<env>/<cluster>`: exactly `status/<env>/<cluster>.toml`.
    Cluster {
        /// Environment named by the branch.
        env: String,
        /// Cluster named by the branch.
        cluster: String,
    },
    /// `<status_branch>` of the older layout: `status/<env>/<cluster>.toml`
    /// files, each commit writing exactly one of them.
    Legacy,
}

/// Why a whole status branch does not count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untrusted {
    /// The branch's full ref name.
    pub refname: String,
    /// The commit that breaks the rule (the first met from the tip).
    pub commit: Oid,
    /// Why.
    pub why: String,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "status branch {} does not count as a whole: commit {:.10} {}",
            short_ref(&self.refname),
            self.commit,
            self.why
        )
    }
}

/// `drover/status.d/stage/stage-1` for `refs/remotes/origin/drover/status.d/stage/stage-1`.
pub fn short_ref(refname: &str) -> &str {
    refname
        .strip_prefix("refs/remotes/origin/")
        .or_else(|| refname.strip_prefix("refs/heads/"))
        .unwrap_or(refname)
}

/// What a branch is judged by: the report signers of the policy in force,
/// the reader's clock, and the reader's first-seen record (the agent's; none
/// for `drover check` in a fresh clone).
#[derive(Clone, Copy)]
pub struct Judge<'a> {
    /// Who may sign reports (`None`: no `report_signers`, nothing counts).
    pub signers: ReportSigners<'a>,
    /// The reader's clock.
    pub now: DateTime<Utc>,
    /// When the reader first fetched each branch's commits.
    pub seen: Option<&'a StatusSeen>,
}

/// One version of one report file, as the read met it.
#[derive(Debug, Clone)]
pub(super) struct Found {
    pub env: String,
    pub cluster: String,
    /// The commit that wrote this version.
    pub commit: Oid,
    /// That commit's time.
    pub committed: DateTime<Utc>,
    /// The file's blob; `None` when the commit deleted it (single branch only).
    pub blob: Option<Oid>,
}

/// How the read of one branch ended.
#[derive(Debug, Clone)]
pub(super) struct Scanned {
    /// `Ok` when every commit read keeps the rule.
    pub verdict: Result<(), Untrusted>,
    /// The bound stopped the read before the branch's first commit.
    pub truncated: bool,
    /// Single branch only: clusters (`<env>/<cluster>`) with a report there
    /// not signed by a valid key of theirs. The single branch holds every
    /// cluster's older history, so such a report voids that cluster's
    /// history, not everyone's (a decommissioned cluster's key may have left
    /// the report signers); anything else wrong with it voids all of it.
    pub broken: BTreeMap<String, Untrusted>,
}

pub(super) fn time_of(c: &Commit<'_>) -> DateTime<Utc> {
    Utc.timestamp_opt(c.time().seconds(), 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// An object's size from its header, without loading it.
fn size_of(odb: &Odb<'_>, oid: Oid) -> Result<usize, git2::Error> {
    Ok(odb.read_header(oid)?.0)
}

/// Load a tree no larger than `max` bytes; `Err` says why not.
fn small_tree<'r>(
    repo: &'r Repository,
    odb: &Odb<'_>,
    oid: Oid,
    max: usize,
    what: &str,
) -> Result<Result<Tree<'r>, String>, git2::Error> {
    let size = size_of(odb, oid)?;
    if size > max {
        return Ok(Err(format!(
            "has a tree {what} of {size} bytes, more than the {max} bytes {} may hold; it is not read",
            if max == MAX_CLUSTER_TREE_BYTES {
                "a cluster's branch (one report)"
            } else {
                "the single status branch"
            }
        )));
    }
    Ok(Ok(repo.find_tree(oid)?))
}

/// The blob of `status/<env>/<cluster>.toml` in a cluster branch's tree,
/// which must hold that file and nothing else.
fn cluster_blob(
    repo: &Repository,
    odb: &Odb<'_>,
    tree: Oid,
    env: &str,
    cluster: &str,
) -> Result<Result<Oid, String>, git2::Error> {
    let file = format!("{cluster}.toml");
    let mut at = tree;
    for (level, (name, kind)) in [
        ("status", ObjectType::Tree),
        (env, ObjectType::Tree),
        (file.as_str(), ObjectType::Blob),
    ]
    .into_iter()
    .enumerate()
    {
        let path = ["/", "status/", &format!("status/{env}/")][level].to_owned();
        let t = match small_tree(repo, odb, at, MAX_CLUSTER_TREE_BYTES, &path)? {
            Ok(t) => t,
            Err(why) => return Ok(Err(why)),
        };
        let only = (t.len() == 1).then(|| t.get(0)).flatten();
        match only {
            Some(e) if e.name_bytes() == name.as_bytes() && e.kind() == Some(kind) => at = e.id(),
            _ => {
                let names: Vec<String> = t
                    .iter()
                    .take(3)
                    .map(|e| String::from_utf8_lossy(e.name_bytes()).into_owned())
                    .collect();
                return Ok(Err(format!(
                    "has {} in {path} ({}{}); a cluster's branch holds exactly status/{env}/{file}",
                    match t.len() {
                        0 => "nothing".to_owned(),
                        1 => "one other entry".to_owned(),
                        n => format!("{n} entries"),
                    },
                    names.join(", "),
                    if t.len() > 3 { ", ..." } else { "" }
                )));
            }
        }
    }
    Ok(Ok(at))
}

/// The order git keeps tree entries in (a tree's name compares as if it
/// ended in `/`).
fn git_order(a: &[u8], a_tree: bool, b: &[u8], b_tree: bool) -> Ordering {
    let ta = a.iter().chain(if a_tree { &b"/"[..] } else { &b""[..] });
    let tb = b.iter().chain(if b_tree { &b"/"[..] } else { &b""[..] });
    ta.cmp(tb)
}

/// Entries of a tree as (name, id), checking each has `kind` and, in
/// `env` trees, a `.toml` name, and that they are in git's order.
fn entries(tree: Option<&Tree<'_>>, kind: ObjectType) -> Result<Vec<(Vec<u8>, Oid)>, String> {
    let Some(tree) = tree else {
        return Ok(Vec::new());
    };
    let is_tree = kind == ObjectType::Tree;
    let mut out: Vec<(Vec<u8>, Oid)> = Vec::with_capacity(tree.len());
    for e in tree.iter() {
        let name = e.name_bytes();
        if e.kind() != Some(kind) || (!is_tree && !name.ends_with(b".toml")) {
            return Err(format!(
                "writes {:?}, which is not a status/<env>/<cluster>.toml file",
                String::from_utf8_lossy(name)
            ));
        }
        if let Some((last, _)) = out.last() {
            if git_order(last, is_tree, name, is_tree) != Ordering::Less {
                return Err("has a malformed tree (entries out of order)".into());
            }
        }
        out.push((name.to_vec(), e.id()));
    }
    Ok(out)
}

/// Differences between two sorted entry lists: (name, new, old).
fn changed(
    new: &[(Vec<u8>, Oid)],
    old: &[(Vec<u8>, Oid)],
    is_tree: bool,
) -> Vec<(Vec<u8>, Option<Oid>, Option<Oid>)> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < new.len() || j < old.len() {
        let ord = match (new.get(i), old.get(j)) {
            (Some(a), Some(b)) => git_order(&a.0, is_tree, &b.0, is_tree),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match ord {
            Ordering::Less => {
                out.push((new[i].0.clone(), Some(new[i].1), None));
                i += 1;
            }
            Ordering::Greater => {
                out.push((old[j].0.clone(), None, Some(old[j].1)));
                j += 1;
            }
            Ordering::Equal => {
                if new[i].1 != old[j].1 {
                    out.push((new[i].0.clone(), Some(new[i].1), Some(old[j].1)));
                }
                i += 1;
                j += 1;
            }
        }
        if out.len() > 1 {
            break;
        }
    }
    out
}

/// Trees of the single branch, loaded with their size bound.
fn legacy_tree<'r>(
    repo: &'r Repository,
    odb: &Odb<'_>,
    oid: Option<Oid>,
    what: &str,
) -> Result<Result<Option<Tree<'r>>, String>, git2::Error> {
    match oid {
        None => Ok(Ok(None)),
        Some(o) => Ok(small_tree(repo, odb, o, MAX_LEGACY_TREE_BYTES, what)?.map(Some)),
    }
}

/// The `status` subtree of a single-branch commit's root tree, which holds
/// nothing else (an empty tree is allowed).
fn legacy_status(
    repo: &Repository,
    odb: &Odb<'_>,
    root: Oid,
) -> Result<Result<Option<Oid>, String>, git2::Error> {
    let t = match small_tree(repo, odb, root, MAX_CLUSTER_TREE_BYTES, "/")? {
        Ok(t) => t,
        Err(why) => return Ok(Err(why)),
    };
    let only = t.get(0).filter(|_| t.len() == 1);
    Ok(match only {
        None if t.is_empty() => Ok(None),
        Some(e) if e.name_bytes() == b"status" && e.kind() == Some(ObjectType::Tree) => {
            Ok(Some(e.id()))
        }
        _ => Err("has files outside status/; the status branch holds only status/<env>/<cluster>.toml files".into()),
    })
}

/// What a single-branch commit writes: (env, cluster, its new blob or
/// `None` when deleted), or why it breaks the rule.
type LegacyChange = Result<(String, String, Option<Oid>), String>;
/// An entry's name with its new and old object, or why the commit is refused.
type OneChange = Result<Option<(Vec<u8>, Option<Oid>, Option<Oid>)>, String>;

/// The one report file a single-branch commit writes, against its parent.
fn legacy_change(
    repo: &Repository,
    odb: &Odb<'_>,
    new_status: Option<Oid>,
    old_status: Option<Oid>,
) -> Result<LegacyChange, git2::Error> {
    let none =
        || Err("writes no report; each commit of the status branch writes exactly one".to_owned());
    if new_status == old_status {
        return Ok(none());
    }
    let env_change = match one_change(
        repo,
        odb,
        new_status,
        old_status,
        "status/",
        ObjectType::Tree,
    )? {
        Ok(change) => change,
        Err(why) => return Ok(Err(why)),
    };
    let Some((env, new_env, old_env)) = env_change else {
        return Ok(none());
    };
    let Ok(env) = String::from_utf8(env) else {
        return Ok(Err("writes an environment whose name is not UTF-8".into()));
    };
    let path = format!("status/{env}/");
    let file_change = match one_change(repo, odb, new_env, old_env, &path, ObjectType::Blob)? {
        Ok(change) => change,
        Err(why) => return Ok(Err(why)),
    };
    let Some((file, blob, _)) = file_change else {
        return Ok(none());
    };
    let cluster = String::from_utf8_lossy(&file);
    let cluster = cluster.strip_suffix(".toml").unwrap_or(&cluster).to_owned();
    Ok(Ok((env, cluster, blob)))
}

/// One changed entry of `kind` between the trees at `path` of two commits'
/// status trees: `None` when nothing changed, a reason when more than one
/// did (a legacy commit writes one environment's one report).
fn one_change(
    repo: &Repository,
    odb: &Odb<'_>,
    new: Option<Oid>,
    old: Option<Oid>,
    path: &str,
    kind: ObjectType,
) -> Result<OneChange, git2::Error> {
    let trees = both(
        legacy_tree(repo, odb, new, path)?,
        legacy_tree(repo, odb, old, path)?,
    );
    let listed =
        trees.and_then(|(n, o)| both(entries(n.as_ref(), kind), entries(o.as_ref(), kind)));
    let (n, o) = match listed {
        Ok(pair) => pair,
        Err(why) => return Ok(Err(why)),
    };
    let mut changes = changed(&n, &o, kind == ObjectType::Tree);
    Ok(match changes.len() {
        0 => Ok(None),
        1 => Ok(changes.pop()),
        _ => Err(more_than_one()),
    })
}

fn more_than_one() -> String {
    "writes more than one report; each commit of the status branch writes exactly one, signed by its cluster's key".into()
}

/// The signature check of one commit for its cluster's principal, with the
/// report signers indexed by principal once for a whole read of the store
/// (shared by the threads that read it).
pub(super) struct Signatures<'a> {
    all: Option<&'a AllowedSigners>,
    by_principal: HashMap<String, AllowedSigners>,
    none: AllowedSigners,
}

impl<'a> Signatures<'a> {
    pub(super) fn new(all: ReportSigners<'a>) -> Self {
        Self {
            all,
            by_principal: all.map(AllowedSigners::by_principal).unwrap_or_default(),
            none: AllowedSigners::default(),
        }
    }

    /// `Err` says why `commit` is not signed by a key listed for exactly
    /// `principal`, valid at its time and at `seen` (when known). For a
    /// branch's `newest` commit, `seen` is the reader's clock.
    fn check(
        &self,
        repo: &Repository,
        commit: &Commit<'_>,
        size: usize,
        principal: &str,
        seen: Option<i64>,
        newest: bool,
    ) -> Result<Result<(), String>, git2::Error> {
        let Some(all) = self.all else {
            return Ok(Ok(()));
        };
        let own = self.by_principal.get(principal).unwrap_or(&self.none);
        let time = commit.committer().when().seconds();
        let result = trust::verify_loaded_commit(repo, commit, size, own, time, seen);
        let commit = commit.id();
        Ok(match result {
            Ok(_) => Ok(()),
            Err(trust::Error::Refused(r)) => Err(match r.reason {
                // Name whose key it is, when it is someone else's.
                trust::Reason::UnknownKey { fingerprint } => {
                    match trust::verify_commit(repo, commit, all) {
                        Ok(v) => format!(
                            "is signed by {}'s key, which is not listed for {principal} in the report signers",
                            v.principal
                        ),
                        Err(_) => format!(
                            "is signed by key {fingerprint}, which is not listed for {principal} in the report signers"
                        ),
                    }
                }
                trust::Reason::ExpiredWhenSeen { limit, .. } if newest => format!(
                    "is the branch's newest commit, signed by a key of {principal} that is no \
                     longer valid ({limit}): a branch counts only while its newest report is \
                     signed by a key valid now, so a retired key can neither create a branch \
                     nor extend one (its cluster's next report, signed by its current key, \
                     makes the branch count again)"
                ),
                other => format!("is not signed by a valid key of {principal}: {other}"),
            }),
            Err(trust::Error::Git(e)) => return Err(e),
            Err(e) => Err(e.to_string()),
        })
    }
}

/// When the reader first fetched each commit of one branch, walking it
/// newest first ([`StatusSeen`]).
struct SeenWalk {
    mark: Option<Mark>,
    /// The first-seen time of the commits met so far; `None` once below
    /// `since`, where first-seen time is not judged.
    at: Option<i64>,
}

impl SeenWalk {
    fn new(seen: Option<&StatusSeen>, refname: &str, now: i64) -> Self {
        let mark = seen.and_then(|s| s.mark(refname));
        // A commit above the recorded tip (the agent's own push not yet
        // fetched back) is judged at the time of the check.
        Self {
            at: seen.map(|_| now),
            mark,
        }
    }

    /// The first-seen time to judge `commit` by.
    fn at(&mut self, commit: Oid) -> Option<i64> {
        if let Some(m) = self.mark {
            if m.since == Some(commit) {
                self.at = None;
            } else if m.tip == commit {
                self.at = self.at.map(|a| a.min(m.at));
            }
        }
        self.at
    }
}

/// The time rule for a commit dated `time` under `child` (the next newer
/// commit of the same history): not ahead of the reader's clock (`limit`,
/// with the skew allowed), not after its child. `Err` names the commit that
/// breaks it and why.
fn times(
    oid: Oid,
    time: DateTime<Utc>,
    child: Option<(Oid, DateTime<Utc>)>,
    limit: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(), (Oid, String)> {
    if time > limit {
        return Err((
            oid,
            format!(
                "is dated {}, ahead of this reader's clock ({})",
                rfc3339(time),
                rfc3339(now)
            ),
        ));
    }
    match child {
        Some((c, ct)) if time > ct => Err((
            c,
            format!(
                "is dated {}, before the commit under it ({:.10}, dated {}): commit times never go backwards",
                rfc3339(ct),
                oid,
                rfc3339(time)
            ),
        )),
        _ => Ok(()),
    }
}

/// A fault: the commit that breaks the rule, and why.
type Fault = (Oid, String);

/// What every commit of a branch is checked against, whatever its layout.
struct Rule<'a, 's> {
    refname: &'a str,
    judge: &'a Judge<'a>,
    /// Latest commit time allowed: the reader's clock and the skew.
    limit: DateTime<Utc>,
    sigs: &'a Signatures<'s>,
    seen: SeenWalk,
}

/// A cluster's branch, walked newest first.
struct ClusterWalk<'a> {
    env: &'a str,
    cluster: &'a str,
    principal: String,
    /// The version the child holds, written by the child unless its parent
    /// holds the same blob.
    pending: Option<Found>,
    child: Option<(Oid, DateTime<Utc>)>,
}

impl ClusterWalk<'_> {
    /// Check one commit and pass on the version its child wrote, if any.
    fn step(
        &mut self,
        repo: &Repository,
        odb: &Odb<'_>,
        rule: &mut Rule<'_, '_>,
        (commit, size): (&Commit<'_>, usize),
        visit: &mut dyn FnMut(Found),
    ) -> Result<Result<(), Fault>, git2::Error> {
        let oid = commit.id();
        let time = time_of(commit);
        // The file first, so that a branch that does not count still shows its newest report.
        let blob = match cluster_blob(repo, odb, commit.tree_id(), self.env, self.cluster)? {
            Ok(b) => b,
            Err(why) => return Ok(Err((oid, why))),
        };
        if let Some(p) = self.pending.take() {
            if p.blob != Some(blob) {
                visit(p);
            }
        }
        self.pending = Some(Found {
            env: self.env.to_owned(),
            cluster: self.cluster.to_owned(),
            commit: oid,
            committed: time,
            blob: Some(blob),
        });
        if let Err(f) = merge(commit) {
            return Ok(Err(f));
        }
        if let Err(f) = times(oid, time, self.child, rule.limit, rule.judge.now) {
            return Ok(Err(f));
        }
        let seen = rule.seen.at(oid);
        // The newest commit's key must still be valid now, for every
        // reader: a retired key cannot create a branch (nor add to one)
        // with a report backdated into its validity, which a reader with
        // no first-seen record (`drover check` in a fresh clone) could not
        // tell from an old one.
        let newest = self.child.is_none();
        let seen = if newest {
            Some(rule.judge.now.timestamp())
        } else {
            seen
        };
        if let Err(why) = rule
            .sigs
            .check(repo, commit, size, &self.principal, seen, newest)?
        {
            return Ok(Err((oid, why)));
        }
        self.child = Some((oid, time));
        Ok(Ok(()))
    }
}

/// The single branch of the older layout, walked newest first.
#[derive(Default)]
struct LegacyWalk {
    /// The child's `status` subtree (so each tree is read once).
    child_status: Option<Option<Oid>>,
    /// Each cluster's newer commit met so far.
    last_of: HashMap<String, (Oid, DateTime<Utc>)>,
    broken: BTreeMap<String, Untrusted>,
}

impl LegacyWalk {
    /// Check one commit and pass on the version it writes. A fault of the
    /// branch's shape ends the read; a fault of one cluster's commit voids
    /// that cluster's history ([`Scanned::broken`]).
    fn step(
        &mut self,
        repo: &Repository,
        odb: &Odb<'_>,
        rule: &mut Rule<'_, '_>,
        (commit, size): (&Commit<'_>, usize),
        visit: &mut dyn FnMut(Found),
    ) -> Result<Result<(), Fault>, git2::Error> {
        let oid = commit.id();
        let time = time_of(commit);
        if let Err(f) = merge(commit) {
            return Ok(Err(f));
        }
        let status = match self.child_status.take() {
            Some(s) => s,
            None => match legacy_status(repo, odb, commit.tree_id())? {
                Ok(s) => s,
                Err(why) => return Ok(Err((oid, why))),
            },
        };
        let parent_status = match commit.parent_ids().next() {
            Some(p) => match legacy_status(repo, odb, repo.find_commit(p)?.tree_id())? {
                Ok(s) => s,
                Err(why) => return Ok(Err((p, why))),
            },
            None => None,
        };
        let (env, cluster, blob) = match legacy_change(repo, odb, status, parent_status)? {
            Ok(c) => c,
            Err(why) => return Ok(Err((oid, why))),
        };
        self.child_status = Some(parent_status);
        let seen = rule.seen.at(oid);
        let principal = format!("{env}/{cluster}");
        if !self.broken.contains_key(&principal) {
            // One agent's clock dates one cluster's commits: times are
            // checked among those, not across clusters.
            let newer = self.last_of.insert(principal.clone(), (oid, time));
            let fault = match times(oid, time, newer, rule.limit, rule.judge.now) {
                Err(f) => Some(f),
                Ok(()) => rule
                    .sigs
                    .check(repo, commit, size, &principal, seen, false)?
                    .err()
                    .map(|why| (oid, why)),
            };
            if let Some((commit, why)) = fault {
                let refname = rule.refname.to_owned();
                self.broken.insert(
                    principal,
                    Untrusted {
                        refname,
                        commit,
                        why,
                    },
                );
            }
        }
        // Passed on whatever the verdict: the reader shows it, untrusted.
        visit(Found {
            env,
            cluster,
            commit: oid,
            committed: time,
            blob,
        });
        Ok(Ok(()))
    }
}

/// A branch being walked, by layout.
enum Walk<'a> {
    Cluster(ClusterWalk<'a>),
    Legacy(LegacyWalk),
}

/// A status branch is one agent's linear chain: a merge commit breaks it.
fn merge(commit: &Commit<'_>) -> Result<(), Fault> {
    match commit.parent_count() {
        0 | 1 => Ok(()),
        n => Err((
            commit.id(),
            format!(
                "is a merge commit ({n} parents); a status branch is a linear chain of its agents' commits"
            ),
        )),
    }
}

/// Read the branch `refname` at `tip` as `layout` under `judge`, calling
/// `visit` once per version of a report file, newest first (each version at
/// the commit that wrote it), until the rule is broken or the bound reached.
pub(super) fn scan(
    repo: &Repository,
    refname: &str,
    tip: Oid,
    layout: &Layout,
    judge: &Judge<'_>,
    sigs: &Signatures<'_>,
    visit: &mut dyn FnMut(Found),
) -> Result<Scanned, git2::Error> {
    let odb = repo.odb()?;
    let mut rule = Rule {
        refname,
        judge,
        limit: judge.now + Duration::seconds(MAX_CLOCK_SKEW_SECS),
        sigs,
        seen: SeenWalk::new(judge.seen, refname, judge.now.timestamp()),
    };
    let (max, mut walk) = match layout {
        Layout::Cluster { env, cluster } => (
            MAX_BRANCH_COMMITS,
            Walk::Cluster(ClusterWalk {
                env,
                cluster,
                principal: format!("{env}/{cluster}"),
                pending: None,
                child: None,
            }),
        ),
        Layout::Legacy => (MAX_LEGACY_COMMITS, Walk::Legacy(LegacyWalk::default())),
    };
    let mut next = Some(tip);
    let mut read = 0;
    let mut truncated = false;
    let mut fault: Option<Fault> = None;
    while let Some(oid) = next {
        if read == max {
            truncated = true;
            break;
        }
        read += 1;
        let size = size_of(&odb, oid)?;
        if size > MAX_COMMIT_BYTES {
            fault = Some((
                oid,
                format!("is a commit object of {size} bytes; a status commit has at most {MAX_COMMIT_BYTES}"),
            ));
            break;
        }
        let commit = repo.find_commit(oid)?;
        let step = match &mut walk {
            Walk::Cluster(c) => c.step(repo, &odb, &mut rule, (&commit, size), visit)?,
            Walk::Legacy(l) => l.step(repo, &odb, &mut rule, (&commit, size), visit)?,
        };
        if let Err(f) = step {
            fault = Some(f);
            break;
        }
        next = commit.parent_ids().next();
    }
    // The last commit read holds the oldest version read: it counts as its
    // own (too deep to tell), and shows when the branch does not count.
    let broken = match walk {
        Walk::Cluster(c) => {
            if let Some(p) = c.pending {
                visit(p);
            }
            BTreeMap::new()
        }
        Walk::Legacy(l) => l.broken,
    };
    Ok(Scanned {
        verdict: match fault {
            None => Ok(()),
            Some((commit, why)) => Err(Untrusted {
                refname: refname.to_owned(),
                commit,
                why,
            }),
        },
        truncated,
        broken,
    })
}

/// Both reads of a new/old pair, or the first reason either could not be read.
fn both<T>(new: Result<T, String>, old: Result<T, String>) -> Result<(T, T), String> {
    Ok((new?, old?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_orders_a_tree_as_if_its_name_ended_in_a_slash() {
        assert_eq!(git_order(b"a", true, b"a-", true), Ordering::Greater);
        assert_eq!(git_order(b"a", false, b"a-", false), Ordering::Less);
        assert_eq!(
            git_order(b"a.toml", false, b"b.toml", false),
            Ordering::Less
        );
    }

    #[test]
    fn one_change_is_found_and_a_second_stops_the_comparison() {
        let o = |n: u8| Oid::from_bytes(&[n; 20]).unwrap();
        let old = vec![(b"a.toml".to_vec(), o(1)), (b"b.toml".to_vec(), o(2))];
        let new = vec![(b"a.toml".to_vec(), o(1)), (b"b.toml".to_vec(), o(3))];
        assert_eq!(
            changed(&new, &old, false),
            vec![(b"b.toml".to_vec(), Some(o(3)), Some(o(2)))]
        );
        let added = vec![
            (b"0.toml".to_vec(), o(9)),
            (b"a.toml".to_vec(), o(4)),
            (b"b.toml".to_vec(), o(2)),
        ];
        assert_eq!(changed(&added, &old, false).len(), 2);
        assert_eq!(
            changed(&[], &old, false),
            vec![
                (b"a.toml".to_vec(), None, Some(o(1))),
                (b"b.toml".to_vec(), None, Some(o(2)))
            ]
        );
    }
}
