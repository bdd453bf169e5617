//! When the agent first fetched each commit: the second clock a signing
//! key's `valid-after` / `valid-before` are checked against (docs/design.md
//! §6). The committer date is chosen by the signer, so a retired key could
//! otherwise sign today with a backdated commit; the time drover first
//! received the commit is not the signer's to choose.
//!
//! The record is a small text file, `drover-seen`, in the agent's cache
//! repository (so it lives exactly as long as the cached objects it
//! describes, across restarts): one line per commit, `<oid> <unix seconds>`.
//! It is bounded: a fetch records at most [`MAX_WALK`] new commits and the
//! file keeps the newest [`MAX_ENTRIES`]; it is read with a size cap. A
//! commit with no record (a lost cache, a pruned entry, a walk cut short) is
//! judged as first seen at the time of the check, which is never earlier
//! than the truth: losing the record can only make the check stricter.

use git2::{Oid, Repository, Sort};
use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

/// The record's file name inside the cache repository's git directory.
pub const SEEN_FILE: &str = "drover-seen";
/// Most commits the record keeps (about 500 KiB); the oldest go first.
pub const MAX_ENTRIES: usize = 10_000;
/// Most new commits one fetch records (a first fetch of a long history).
pub const MAX_WALK: usize = 10_000;
/// Bytes of the longest valid line (40 hex digits, a space, 20 digits, LF).
const MAX_LINE: usize = 62;

/// Errors of the record.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the file failed.
    #[error("fetch-time record {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Walking the fetched history failed.
    #[error("fetch-time record: git: {0}")]
    Git(#[from] git2::Error),
}

/// The first-fetch times of commits, as recorded by the agent.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    path: PathBuf,
    times: HashMap<Oid, i64>,
}

impl Seen {
    /// The record of the cache repository at `git_dir` (empty when absent,
    /// damaged lines skipped, at most [`MAX_ENTRIES`] lines read).
    pub fn load(git_dir: &Path) -> Self {
        let path = git_dir.join(SEEN_FILE);
        let mut text = String::new();
        if let Ok(f) = std::fs::File::open(&path) {
            let cap = (MAX_ENTRIES * MAX_LINE) as u64;
            let _ = f.take(cap).read_to_string(&mut text);
        }
        let times = text
            .lines()
            .filter_map(|l| {
                let (oid, secs) = l.split_once(' ')?;
                Some((Oid::from_str(oid).ok()?, secs.trim().parse().ok()?))
            })
            .take(MAX_ENTRIES)
            .collect();
        Self { path, times }
    }

    /// When `oid` was first fetched (seconds since the epoch), if recorded.
    pub fn first_seen(&self, oid: Oid) -> Option<i64> {
        self.times.get(&oid).copied()
    }

    /// Number of commits recorded.
    pub fn len(&self) -> usize {
        self.times.len()
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    /// Record `now` for every commit reachable from `head` that has no
    /// record yet (at most [`MAX_WALK`]), keep the newest [`MAX_ENTRIES`],
    /// and write the file atomically. Returns how many were new.
    pub fn record(&mut self, repo: &Repository, head: Oid, now: i64) -> Result<usize, Error> {
        if self.times.contains_key(&head) {
            return Ok(0);
        }
        // Unsorted, so the walk yields as it goes and the cap bounds its time.
        let mut walk = repo.revwalk()?;
        walk.set_sorting(Sort::NONE)?;
        walk.push(head)?;
        // A known commit's ancestors were known when it was recorded (or are
        // older than the record), so the walk stops there.
        let known = &self.times;
        let mut hide = |oid: Oid| known.contains_key(&oid);
        let walk = walk.with_hide_callback(&mut hide)?;
        let mut new = Vec::new();
        for oid in walk.take(MAX_WALK) {
            let oid = oid?;
            if !known.contains_key(&oid) {
                new.push(oid);
            }
        }
        if new.is_empty() {
            return Ok(0);
        }
        let n = new.len();
        for oid in new {
            self.times.entry(oid).or_insert(now);
        }
        if self.times.len() > MAX_ENTRIES {
            let mut by_age: Vec<(i64, Oid)> = self.times.iter().map(|(o, t)| (*t, *o)).collect();
            by_age.sort_unstable();
            for (_, oid) in &by_age[..self.times.len() - MAX_ENTRIES] {
                self.times.remove(oid);
            }
        }
        self.save()?;
        Ok(n)
    }

    fn save(&self) -> Result<(), Error> {
        let io = |source| Error::Io {
            path: self.path.display().to_string(),
            source,
        };
        let mut lines: Vec<(i64, Oid)> = self.times.iter().map(|(o, t)| (*t, *o)).collect();
        lines.sort_unstable();
        let mut text = String::with_capacity(lines.len() * MAX_LINE);
        for (t, oid) in lines {
            text.push_str(&format!("{oid} {t}\n"));
        }
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)
    }
}

/// The status store's record file inside the cache repository's git directory.
pub const STATUS_SEEN_FILE: &str = "drover-seen-status";
/// Bytes of the longest valid line of the status record: a ref name (at most
/// 255 bytes, as most filesystems allow), two object ids, a time.
const MAX_STATUS_LINE: usize = 255 + 2 * 41 + 21 + 1;
/// Most commits walked to tell whether a branch moved forward or back.
const MAX_ANCESTRY_WALK: usize = 10_000;

/// When the agent first fetched the commits of each status branch
/// (docs/design.md §5, "report keys over time"): a report key's
/// `valid-before` is checked against that time too, so a retired key cannot
/// add a report by backdating it.
///
/// Status branches hold tens of thousands of commits across a fleet, so the
/// record is not one line per commit but one per branch: the tip this agent
/// saw before the branch last moved (`since`), the tip it moved to (`tip`)
/// and when (`at`). Every commit on `tip`'s chain above `since` was first
/// fetched at `at`; commits at or below `since` were fetched earlier and
/// judged then; a commit above `tip` (this agent's own push, not fetched
/// back yet) is judged at the time of the check. The record begins with the
/// cache: the branches found by its first fetch are recorded with
/// `since = tip`, so the history already there when the agent started is
/// not judged by first-seen time (the reader's other rules, monotone commit
/// times and none in the future, still hold for it). A lost record
/// therefore loosens only the first-seen rule, and only for what was
/// already there; `drover check` in a fresh clone has no record at all.
#[derive(Debug, Clone, Default)]
pub struct StatusSeen {
    path: PathBuf,
    branches: HashMap<String, Mark>,
}

/// One status branch's entry of the [`StatusSeen`] record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The tip before the branch last moved: at and below it, commits are
    /// not judged by first-seen time. `None`: the whole chain is.
    pub since: Option<Oid>,
    /// The tip the branch moved to.
    pub tip: Oid,
    /// When (seconds since the epoch).
    pub at: i64,
}

impl StatusSeen {
    /// The record of the cache repository at `git_dir` (empty when absent,
    /// damaged lines skipped, read with a size cap).
    pub fn load(git_dir: &Path) -> Self {
        let path = git_dir.join(STATUS_SEEN_FILE);
        let mut text = String::new();
        if let Ok(f) = std::fs::File::open(&path) {
            let cap = ((crate::status_refs::MAX_STATUS_BRANCHES + 1) * MAX_STATUS_LINE) as u64;
            let _ = f.take(cap).read_to_string(&mut text);
        }
        let branches = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split(' ');
                let name = it.next()?;
                let since = match it.next()? {
                    "-" => None,
                    o => Some(Oid::from_str(o).ok()?),
                };
                let tip = Oid::from_str(it.next()?).ok()?;
                let at = it.next()?.parse().ok()?;
                Some((name.to_owned(), Mark { since, tip, at }))
            })
            .take(crate::status_refs::MAX_STATUS_BRANCHES + 1)
            .collect();
        Self { path, branches }
    }

    /// The record of the branch read at `refname`, if any.
    pub fn mark(&self, refname: &str) -> Option<Mark> {
        self.branches.get(refname).copied()
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.branches.is_empty()
    }

    /// Record `now` for the status branches at `tips` (ref name, tip) that
    /// moved since the last record, forget branches that are gone, and write
    /// the file atomically when anything changed. The first record of a
    /// cache marks what is there as already seen. Returns how many moved.
    pub fn record(
        &mut self,
        repo: &Repository,
        tips: &[(String, Oid)],
        now: i64,
    ) -> Result<usize, Error> {
        let first = self.branches.is_empty() && !self.path.exists();
        let mut moved = 0;
        let mut next = HashMap::with_capacity(tips.len());
        for (name, tip) in tips
            .iter()
            .take(crate::status_refs::MAX_STATUS_BRANCHES + 1)
        {
            let mark = match self.branches.get(name) {
                Some(m) if m.tip == *tip => *m,
                Some(m) => {
                    moved += 1;
                    Mark {
                        since: common_tip(repo, m.tip, *tip),
                        tip: *tip,
                        at: now,
                    }
                }
                None => {
                    moved += 1;
                    Mark {
                        since: first.then_some(*tip),
                        tip: *tip,
                        at: now,
                    }
                }
            };
            next.insert(name.clone(), mark);
        }
        let gone = self.branches.keys().any(|k| !next.contains_key(k));
        self.branches = next;
        if moved > 0 || gone || first {
            self.save()?;
        }
        Ok(moved)
    }

    fn save(&self) -> Result<(), Error> {
        let io = |source| Error::Io {
            path: self.path.display().to_string(),
            source,
        };
        let mut names: Vec<&String> = self.branches.keys().collect();
        names.sort_unstable();
        let mut text = String::with_capacity(names.len() * 128);
        for name in names {
            let m = &self.branches[name];
            let since = m.since.map_or("-".to_owned(), |o| o.to_string());
            text.push_str(&format!("{name} {since} {} {}\n", m.tip, m.at));
        }
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)
    }
}

/// What was seen before a branch moved from `old` to `new`: `old` when the
/// branch moved forward, `new` when it was rewound to an older commit of its
/// own chain, nothing when it was rewritten (then all of `new` is judged at
/// the time it was seen). Status branches are linear, so first parents are
/// followed, at most [`MAX_ANCESTRY_WALK`] commits.
fn common_tip(repo: &Repository, old: Oid, new: Oid) -> Option<Oid> {
    let reaches = |from: Oid, target: Oid| {
        let mut c = repo.find_commit(from).ok();
        for _ in 0..MAX_ANCESTRY_WALK {
            match c {
                Some(commit) if commit.id() == target => return true,
                Some(commit) => c = commit.parent(0).ok(),
                None => return false,
            }
        }
        false
    };
    if reaches(new, old) {
        Some(old)
    } else if reaches(old, new) {
        Some(new)
    } else {
        None
    }
}

/// The status branches of `status_branch` the agent's cache holds
/// (`refs/remotes/origin/<status_branch>` and every
/// `refs/remotes/origin/<status_branch>.d/*`), as (ref name, tip), at most
/// one more than the reader reads.
pub fn status_tips(repo: &Repository, status_branch: &str) -> Vec<(String, Oid)> {
    let mut out = Vec::new();
    let single = format!("refs/remotes/origin/{status_branch}");
    let ns = format!(
        "refs/remotes/origin/{}*",
        crate::status_refs::cluster_namespace(status_branch)
    );
    if let Ok(r) = repo.find_reference(&single) {
        if let Some(t) = r.target() {
            out.push((single, t));
        }
    }
    if let Ok(refs) = repo.references_glob(&ns) {
        for r in refs
            .flatten()
            .take(crate::status_refs::MAX_STATUS_BRANCHES + 1)
        {
            if let (Ok(name), Some(t)) = (r.name(), r.target()) {
                out.push((name.to_owned(), t));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(repo: &Repository, parent: Option<Oid>, msg: &str) -> Oid {
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let tree = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let parents: Vec<git2::Commit> = parent
            .map(|p| repo.find_commit(p).unwrap())
            .into_iter()
            .collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(None, &sig, &sig, msg, &tree, &refs).unwrap()
    }

    #[test]
    fn keeps_the_first_time_and_survives_a_reload() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        let a = commit(&repo, None, "a");
        let b = commit(&repo, Some(a), "b");
        let mut seen = Seen::load(tmp.path());
        assert_eq!(seen.record(&repo, b, 100).unwrap(), 2);
        let c = commit(&repo, Some(b), "c");
        // Only the new commit is walked; the old ones keep their time.
        assert_eq!(seen.record(&repo, c, 200).unwrap(), 1);
        assert_eq!(seen.record(&repo, c, 300).unwrap(), 0);
        let again = Seen::load(tmp.path());
        assert_eq!(again.first_seen(a), Some(100));
        assert_eq!(again.first_seen(b), Some(100));
        assert_eq!(again.first_seen(c), Some(200));
        assert_eq!(again.first_seen(Oid::ZERO_SHA1), None);
    }

    #[test]
    fn a_damaged_record_loses_lines_not_the_agent() {
        let tmp = tempfile::tempdir().unwrap();
        let good = "0123456789012345678901234567890123456789 42\n";
        std::fs::write(tmp.path().join(SEEN_FILE), format!("garbage\n{good}x y\n")).unwrap();
        let seen = Seen::load(tmp.path());
        assert_eq!(seen.len(), 1);
        assert_eq!(
            seen.first_seen(Oid::from_str("0123456789012345678901234567890123456789").unwrap()),
            Some(42)
        );
    }
}
