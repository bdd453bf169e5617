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

use super::tree::{cluster_blob, legacy_change, legacy_status, size_of};
use crate::source::seen::{Mark, StatusSeen};
use crate::status_refs::short_ref;
use crate::trust::{self, AllowedSigners};
use chrono::{DateTime, Duration, TimeZone, Utc};
use git2::{Commit, Odb, Oid, Repository};
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

/// Who may sign reports: the parsed `report_signers` of the policy in force.
/// `None` trusts no report.
pub type ReportSigners<'a> = Option<&'a AllowedSigners>;

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
