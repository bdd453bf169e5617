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
