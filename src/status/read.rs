//! Reading status reports (docs/design.md §5): the one reader, shared by
//! the gate (`drover check --base`, the agent, `drover promote`, the demo),
//! `drover log`, `drover status` and the agent's recovery.
//!
//! A status branch counts only as a whole ([`super::branch`]): a merge
//! commit, a commit not signed by a key listed for its cluster, a tree
//! holding more than the branch may hold, or commit times going backwards
//! anywhere in what is read make the whole branch untrusted, named with the
//! commit and why. On a branch that holds, every version of a report is
//! evidence when:
//! - the blob is at most [`MAX_REPORT_BYTES`] (its size is read from the
//!   object header, so an oversized report is never loaded);
//! - it parses and names the env and cluster of its path;
//! - (single branch of the older layout) its file still exists at the tip,
//!   for a confirmation: a `failed` report withdraws whether or not.
//!
//! Everything else is ignored and named in [`Confirmations::ignored`]. Only
//! one report is held in memory at a time.
//!
//! Per cluster and version, the newest decisive report wins, over the
//! cluster's own branch and the single branch together, ordered by the
//! signed commit times: a `failed` report withdraws every earlier
//! confirmation of that version, whichever branch either is on. A
//! confirmation counts from the first `confirmed` report after the last
//! `failed` one (a re-published `confirmed`, say with a new node count, does
//! not restart the soak), and its time is the signed commit's committer time,
//! or the file's `since` when that is later: a report cannot claim to be
//! older than the commit that published it.

use super::branch::{ReportSigners, Untrusted};
use super::StatusReport;
use crate::rollout::RolloutState;
use crate::status_refs::short_ref;
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use semver::Version;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// Largest status report file that is read (docs/design.md §5).
pub const MAX_REPORT_BYTES: usize = 64 * 1024;
/// Longest report message kept for display (`drover status`); the rest is cut.
pub const MAX_SHOWN_MESSAGE: usize = 1024;

/// Errors reading the status branch (a missing branch is not one).
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
    /// More per-cluster status branches than are read.
    #[error(
        "status branch {branch}: more than {max} per-cluster branches under {branch}.d/; \
         none is read (delete the branches of clusters that no longer exist)"
    )]
    TooManyBranches {
        /// The configured status branch.
        branch: String,
        /// The bound.
        max: usize,
    },
}

/// Where the status branch was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchRef {
    /// Full ref name, e.g. `refs/heads/drover/status` or `refs/remotes/origin/drover/status`.
    pub refname: String,
    /// Commit at its tip.
    pub tip: Oid,
}

/// Find the status branch: local `refs/heads/<branch>`, else `refs/remotes/origin/<branch>`.
pub fn find_status_branch(repo: &Repository, branch: &str) -> Result<Option<BranchRef>, Error> {
    for refname in [
        format!("refs/heads/{branch}"),
        format!("refs/remotes/origin/{branch}"),
    ] {
        match repo.find_reference(&refname) {
            Ok(r) => {
                let commit = r.peel_to_commit().map_err(|source| Error::Git {
                    branch: branch.to_owned(),
                    source,
                })?;
                return Ok(Some(BranchRef {
                    refname,
                    tip: commit.id(),
                }));
            }
            Err(e) if e.code() == git2::ErrorCode::NotFound => {}
            // An invalid branch name in drover.toml cannot name a ref; there
            // is nothing to read rather than a broken repository.
            Err(e) if e.code() == git2::ErrorCode::InvalidSpec => return Ok(None),
            Err(source) => {
                return Err(Error::Git {
                    branch: branch.to_owned(),
                    source,
                })
            }
        }
    }
    Ok(None)
}

/// A report (or a whole branch) the reader did not count, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    /// Environment of the report's path (empty when no one report is meant).
    pub env: String,
    /// Cluster of the report's path (or the branch, when no one report is meant).
    pub cluster: String,
    /// The status commit that wrote it, or that breaks its branch.
    pub commit: String,
    /// Why it does not count.
    pub why: String,
}

impl fmt::Display for Ignored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.commit.is_empty() {
            return write!(f, "{}: {}", self.cluster, self.why);
        }
        if self.env.is_empty() {
            return write!(f, "{} in {:.10}: {}", self.cluster, self.commit, self.why);
        }
        write!(
            f,
            "status/{}/{}.toml in {:.10}: {}",
            self.env, self.cluster, self.commit, self.why
        )
    }
}

impl Ignored {
    /// The entry naming a whole untrusted branch, for the reports of
    /// `env`/`cluster` on it (empty: the single branch, every cluster).
    pub(super) fn branch(u: &Untrusted, env: &str, cluster: &str) -> Self {
        Ignored {
            env: env.to_owned(),
            cluster: if env.is_empty() {
                short_ref(&u.refname).to_owned()
            } else {
                cluster.to_owned()
            },
            commit: u.commit.to_string(),
            why: u.to_string(),
        }
    }
}

/// A standing confirmation: the first `confirmed` report of its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// When it counts from.
    pub at: DateTime<Utc>,
    /// The signed status commit that wrote it.
    pub status_commit: Oid,
    /// The config commit the agent was applying.
    pub config_commit: String,
}

/// Whether a report read counts: trusted, untrusted (and why), or not
/// verifiable because no report signers are configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// On a branch that keeps the rule, signed by its cluster's key.
    Trusted,
    /// Does not count, and why.
    Untrusted(String),
    /// No `report_signers`: nothing was verified and nothing counts.
    Unverified,
}

/// A cluster's newest readable report, for display (`drover status`):
/// `detail` is left out and the message is cut at [`MAX_SHOWN_MESSAGE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Newest {
    /// The report.
    pub report: StatusReport,
    /// The status commit that wrote it.
    pub commit: Oid,
    /// That commit's time.
    pub committed: DateTime<Utc>,
    /// Whether it counts.
    pub trust: Trust,
}

/// A trusted `failed` report: what the fleet-wide halt counts
/// (docs/design.md §4a).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The report's time (its signed commit's, or its `since` if later).
    pub at: DateTime<Utc>,
    /// The signed status commit that wrote it.
    pub status_commit: Oid,
    /// What failed (the node and the check), cut at [`MAX_SHOWN_MESSAGE`].
    pub message: String,
}

/// What the status store proves, per cluster and version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confirmations {
    /// Where the single branch of the older layout was read from; `None` when it does not exist.
    pub branch: Option<BranchRef>,
    /// (env, cluster, version) -> the standing confirmation.
    pub(super) confirmed: BTreeMap<(String, String, Version), Standing>,
    /// (env, cluster, version) -> the `failed` report that withdrew it.
    pub(super) withdrawn: BTreeMap<(String, String, Version), DateTime<Utc>>,
    /// (env, cluster, version) -> the newest trusted `failed` report, whether
    /// or not a later confirmation followed it.
    pub(super) failures: BTreeMap<(String, String, Version), Failure>,
    /// Reports and branches that do not count, each named with why.
    pub ignored: Vec<Ignored>,
    /// Branches that do not count as a whole.
    pub untrusted: Vec<Untrusted>,
    /// (env, cluster) -> its newest readable report.
    pub newest: BTreeMap<(String, String), Newest>,
    /// The single branch of the older layout does not count as a whole, so
    /// no cluster's confirmation does.
    pub(super) single_void: Option<Untrusted>,
    /// Why no environment's evidence can be read: the store could not be
    /// read or was refused, or the single branch does not count.
    pub held_all: Option<String>,
    /// env -> cluster -> why a branch holding that cluster's reports does
    /// not count (its environment's evidence is held).
    pub(super) held: BTreeMap<String, BTreeMap<String, String>>,
    /// (env, cluster, version) -> that cluster's newest trusted report of the version.
    pub(super) latest: BTreeMap<(String, String, Version), Latest>,
}

/// A cluster's newest trusted report of a version: when, and whether it
/// says `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latest {
    /// Its signed commit's time.
    pub at: DateTime<Utc>,
    /// It is a `failed` report.
    pub failed: bool,
}

impl Confirmations {
    /// When `cluster` of `env`'s standing confirmation of `version` counts from.
    pub fn confirmed_at(
        &self,
        env: &str,
        cluster: &str,
        version: &Version,
    ) -> Option<DateTime<Utc>> {
        self.confirmed
            .get(&(env.to_owned(), cluster.to_owned(), version.clone()))
            .map(|s| s.at)
    }

    /// Every standing confirmation: (env, cluster, version, confirmation).
    pub fn standing(&self) -> impl Iterator<Item = (&str, &str, &Version, &Standing)> {
        self.confirmed
            .iter()
            .map(|((e, c, v), s)| (e.as_str(), c.as_str(), v, s))
    }

    /// The clusters of `env` whose standing confirmation of `version` counts, with since when.
    pub fn for_version(&self, env: &str, version: &Version) -> BTreeMap<String, DateTime<Utc>> {
        self.confirmed
            .iter()
            .filter(|((e, _, v), _)| e == env && v == version)
            .map(|((_, c, _), s)| (c.clone(), s.at))
            .collect()
    }

    /// The store as read when it could not be read at all: every
    /// environment's evidence held, for `why`.
    pub fn held_everywhere(why: String) -> Self {
        Confirmations {
            held_all: Some(why),
            ..Confirmations::default()
        }
    }

    /// Why `env`'s evidence is held, if it is: the whole store, or a branch
    /// of one of its clusters (but `except`'s, a reader's own) that does
    /// not count.
    pub fn held(&self, env: &str, except: Option<&str>) -> Option<String> {
        if let Some(all) = &self.held_all {
            return Some(all.clone());
        }
        let why: Vec<&str> = self
            .held
            .get(env)?
            .iter()
            .filter(|(c, _)| Some(c.as_str()) != except)
            .map(|(_, w)| w.as_str())
            .collect();
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// `cluster` of `env`'s newest trusted report of `version`, if any.
    pub fn latest(&self, env: &str, cluster: &str, version: &Version) -> Option<Latest> {
        self.latest
            .get(&(env.to_owned(), cluster.to_owned(), version.clone()))
            .copied()
    }

    /// The clusters of `env` whose standing failure of `version` counts:
    /// a trusted `failed` report that is still that cluster's newest
    /// trusted report of the version.
    pub fn failures(&self, env: &str, version: &Version) -> BTreeMap<String, Failure> {
        self.failures
            .iter()
            .filter(|((e, _, v), _)| e == env && v == version)
            .map(|((_, c, _), f)| (c.clone(), f.clone()))
            .collect()
    }

    /// Every (cluster, version, confirmation time) standing for `env`.
    pub fn for_env(&self, env: &str) -> Vec<(String, Version, DateTime<Utc>)> {
        self.confirmed
            .iter()
            .filter(|((e, _, _), _)| e == env)
            .map(|((_, c, v), s)| (c.clone(), v.clone(), s.at))
            .collect()
    }

    /// Why `cluster` of `env` has no standing confirmation of `version`, if
    /// the store says anything about it (withdrawn, reports or branches ignored).
    pub fn why_not(&self, env: &str, cluster: &str, version: &Version) -> Option<String> {
        let key = (env.to_owned(), cluster.to_owned(), version.clone());
        if let Some(t) = self.withdrawn.get(&key) {
            return Some(format!(
                "its confirmation was withdrawn by a later `failed` report at {}",
                t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            ));
        }
        let ignored: Vec<String> = self
            .ignored
            .iter()
            .filter(|i| i.env == env && i.cluster == cluster)
            .map(|i| format!("{:.10}: {}", i.commit, i.why))
            // The single branch holds every cluster's older history.
            .chain(
                self.single_void
                    .iter()
                    .map(|u| format!("{:.10}: {u}", u.commit)),
            )
            .collect();
        (!ignored.is_empty()).then(|| format!("ignored reports: {}", ignored.join("; ")))
    }
}

/// Read one report blob with the size bound; `Err` says why it is ignored.
pub(super) fn read_report(
    repo: &Repository,
    blob: Oid,
    env: &str,
    cluster: &str,
) -> Result<StatusReport, String> {
    read_report_sized(repo, blob, env, cluster).1
}

/// [`read_report`], with the size of the blob (0 when unknown).
pub(super) fn read_report_sized(
    repo: &Repository,
    blob: Oid,
    env: &str,
    cluster: &str,
) -> (usize, Result<StatusReport, String>) {
    let odb = match repo.odb() {
        Ok(o) => o,
        Err(e) => return (0, Err(e.to_string())),
    };
    match odb.read_header(blob) {
        Ok((size, _)) => (size, parse_report(repo, blob, size, env, cluster)),
        Err(e) => (0, Err(e.to_string())),
    }
}

/// The report in `blob` of `size` bytes.
fn parse_report(
    repo: &Repository,
    blob: Oid,
    size: usize,
    env: &str,
    cluster: &str,
) -> Result<StatusReport, String> {
    if size > MAX_REPORT_BYTES {
        return Err(format!(
            "{size} bytes, larger than the {} KiB a report may have",
            MAX_REPORT_BYTES / 1024
        ));
    }
    let r = parsed(blob, size, || {
        // A blob that cannot be read now is not kept as unreadable.
        let blob = repo.find_blob(blob).map_err(|e| e.to_string())?;
        let Ok(text) = std::str::from_utf8(blob.content()) else {
            return Ok(Err("not UTF-8".to_string()));
        };
        Ok(StatusReport::from_toml(text)
            .map_err(|e| format!("not a valid status report ({})", e.message().trim())))
    })?;
    if r.env != env || r.cluster != cluster {
        return Err(format!(
            "reports env {:?} cluster {:?}, which does not match its path",
            r.env, r.cluster
        ));
    }
    Ok(r)
}

/// Most bytes of report files whose parse is kept ([`parsed`]).
const MAX_PARSED_BYTES: usize = 1024 * 1024;

/// Reports parsed in this process, by blob: a blob's bytes never change,
/// and every read of the store (the wave gate's, each poll; the reporter's
/// check of its own branch, each push) parses the same reports again.
#[derive(Default)]
struct Parsed {
    by_blob: std::collections::HashMap<Oid, Result<StatusReport, String>>,
    /// Sum of the kept blobs' sizes; everything is forgotten when the next
    /// one would pass [`MAX_PARSED_BYTES`].
    bytes: usize,
}

/// The report in `blob` (`size` bytes) as `parse` reads it, parsed once;
/// `parse`'s outer `Err` (the blob could not be read) is not kept.
fn parsed(
    blob: Oid,
    size: usize,
    parse: impl FnOnce() -> Result<Result<StatusReport, String>, String>,
) -> Result<StatusReport, String> {
    static PARSED: std::sync::LazyLock<std::sync::Mutex<Parsed>> =
        std::sync::LazyLock::new(Default::default);
    let known = |p: &Parsed| p.by_blob.get(&blob).cloned();
    let lock = || PARSED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = known(&lock()) {
        return r;
    }
    // Parsed outside the lock: threads reading other branches go on.
    let r = parse()?;
    let mut p = lock();
    if p.bytes + size > MAX_PARSED_BYTES {
        *p = Parsed::default();
    }
    p.bytes += size;
    p.by_blob.insert(blob, r.clone());
    r
}

/// A report cut down for display: of its `detail` only the blockers
/// (`drover status` shows them; bounded when written), a bounded message.
pub(super) fn for_display(mut r: StatusReport) -> StatusReport {
    r.detail = super::NodeDetail {
        blocker: r.detail.blocker.take(),
        blockers: std::mem::take(&mut r.detail.blockers),
        ..Default::default()
    }
    .bounded();
    if r.message.len() > MAX_SHOWN_MESSAGE {
        let cut = (0..=MAX_SHOWN_MESSAGE)
            .rev()
            .find(|i| r.message.is_char_boundary(*i))
            .unwrap_or(0);
        r.message.truncate(cut);
        r.message.push('…');
    }
    r
}

/// One version of one report file, as the read of its branch met it.
#[derive(Debug, Clone)]
pub struct ReportVersion {
    /// Environment of the report's path.
    pub env: String,
    /// Cluster of the report's path.
    pub cluster: String,
    /// The status commit that wrote this version.
    pub commit: Oid,
    /// That commit's time.
    pub committed: DateTime<Utc>,
    /// The report, or why it cannot be read (too large, not UTF-8, invalid,
    /// naming another cluster than its path, deleted).
    pub report: Result<StatusReport, String>,
    /// The file is deleted at the tip of the single branch (its
    /// confirmations no longer count there).
    pub deleted_at_tip: bool,
}

/// A decisive report (`confirmed` or `failed`) on a branch that holds.
#[derive(Debug, Clone)]
pub(super) struct Event {
    pub commit: Oid,
    pub committed: DateTime<Utc>,
    /// When a confirmation counts from: the later of the commit time and `since`.
    pub at: DateTime<Utc>,
    pub version: Version,
    /// `confirmed` or `failed`: what the gate counts.
    pub decisive: bool,
    pub failed: bool,
    pub config_commit: String,
    /// A `failed` report's message (what failed), cut as for display; empty
    /// for a confirmation, so a branch's events stay small.
    pub message: String,
}

impl Event {
    /// The event of a report: decisive (`confirmed`, `failed`) or not.
    pub(super) fn of(v: &ReportVersion, r: &StatusReport) -> Self {
        let failed = r.state == RolloutState::Failed;
        let decisive = failed || r.state == RolloutState::Confirmed;
        Event {
            commit: v.commit,
            committed: v.committed,
            at: v.committed.max(r.since),
            version: r.version.clone(),
            decisive,
            failed,
            config_commit: if decisive {
                r.config_commit.clone()
            } else {
                String::new()
            },
            message: if failed {
                for_display(r.clone()).message
            } else {
                String::new()
            },
        }
    }
}

/// One cluster's decisive reports from its own branch and from the single
/// branch (each newest first), merged newest first by commit time. At equal
/// times the single branch's report is the older: it is the cluster's older
/// history.
pub(super) fn merge_newest_first(own: Vec<Event>, single: Vec<Event>) -> Vec<Event> {
    let mut out = Vec::with_capacity(own.len() + single.len());
    let (mut a, mut b) = (own.into_iter().peekable(), single.into_iter().peekable());
    loop {
        let take_own = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => x.committed >= y.committed,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        out.extend(if take_own { a.next() } else { b.next() });
    }
    out
}

/// What one cluster's decisive reports (newest first) prove, per version:
/// the standing confirmation, or the time of the `failed` report that
/// withdrew it.
pub(super) type Tally = HashMap<Version, Result<Standing, DateTime<Utc>>>;

/// Tally one cluster's decisive reports, newest first: per version, the
/// newest `failed` decides (nothing older counts); until one is met, the
/// earliest confirmation of the run wins.
pub(super) fn tally(events: &[Event]) -> Tally {
    let mut out: Tally = HashMap::new();
    let mut decided: HashSet<&Version> = HashSet::new();
    for e in events.iter().filter(|e| e.decisive) {
        if decided.contains(&e.version) {
            continue;
        }
        if e.failed {
            decided.insert(&e.version);
            out.entry(e.version.clone()).or_insert(Err(e.at));
            continue;
        }
        out.insert(
            e.version.clone(),
            Ok(Standing {
                at: e.at,
                status_commit: e.commit,
                config_commit: e.config_commit.clone(),
            }),
        );
    }
    out
}

impl Confirmations {
    /// Add one cluster's newest report of each version (events newest
    /// first), and its failure where that report is a `failed` one.
    pub(super) fn add_latest(&mut self, env: &str, cluster: &str, events: &[Event]) {
        for e in events {
            let key = (env.to_owned(), cluster.to_owned(), e.version.clone());
            if self.latest.contains_key(&key) {
                continue;
            }
            self.latest.insert(
                key.clone(),
                Latest {
                    at: e.committed,
                    failed: e.failed,
                },
            );
            if e.failed {
                self.failures.insert(
                    key,
                    Failure {
                        at: e.at,
                        status_commit: e.commit,
                        message: e.message.clone(),
                    },
                );
            }
        }
    }

    /// Add one cluster's tally.
    pub(super) fn add(&mut self, env: &str, cluster: &str, t: Tally) {
        for (version, r) in t {
            let key = (env.to_owned(), cluster.to_owned(), version);
            match r {
                Ok(s) => {
                    self.confirmed.insert(key, s);
                }
                Err(at) => {
                    self.withdrawn.insert(key, at);
                }
            }
        }
    }
}

/// Read what the status store named `branch` proves at `now`, trusting
/// reports signed by `signers` (docs/design.md §5): every per-cluster branch
/// `<branch>.d/<env>/<cluster>` and the single branch `<branch>` of the
/// older layout, each local or `origin/` (see [`super::find_store`]). For
/// readers without a config: the gate's reads are [`read_confirmations_of`].
pub fn read_confirmations(
    repo: &Repository,
    branch: &str,
    signers: ReportSigners<'_>,
    now: DateTime<Utc>,
) -> Confirmations {
    read_confirmations_of(repo, branch, signers, now, super::Scope::Every, false)
}

/// [`read_confirmations`] of the per-cluster branches of `scope` (the gate
/// asks about one environment at a time: a production bump needs stage's
/// reports, a third of a three-environment store; and it looks up only the
/// clusters the policy lists). The single branch of the older layout is
/// read whole either way: it holds every environment's reports in one
/// history. The first-seen record of an agent's cache is used when the
/// repository has one ([`crate::source::seen::StatusSeen`]). A store that
/// cannot be read, or is refused (too many branches), is no error: every
/// environment's evidence is then held ([`Confirmations::held_all`]), for
/// the gate and the halt alike. `as_of` reads the store as it was at `now`
/// ([`super::Store::as_of`]), for a reader asking about a past instant.
pub fn read_confirmations_of(
    repo: &Repository,
    branch: &str,
    signers: ReportSigners<'_>,
    now: DateTime<Utc>,
    scope: super::Scope<'_>,
    as_of: bool,
) -> Confirmations {
    let git = |source| Error::Git {
        branch: branch.to_owned(),
        source,
    };
    let read = super::find_store(repo, branch, scope).and_then(|store| {
        // Asked about a past instant: the store as it was then.
        let store = if as_of {
            store.as_of(repo, now).map_err(git)?.0
        } else {
            store
        };
        super::confirmations_in(repo, &store, signers, now).map_err(git)
    });
    read.unwrap_or_else(|e| {
        Confirmations::held_everywhere(format!("the status store cannot be read: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report is parsed once per blob; a blob that could not be read is
    /// read again once it is there, not remembered as unreadable.
    #[test]
    fn a_blob_not_fetched_yet_is_read_once_it_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let text = StatusReport {
            env: "stage".into(),
            cluster: "stage-1".into(),
            config_commit: "a".repeat(40),
            version: "1.13.2".parse().unwrap(),
            state: crate::rollout::RolloutState::Rolling,
            since: "2026-12-08T02:00:00Z".parse().unwrap(),
            nodes: 3,
            nodes_at_version: 1,
            message: String::new(),
            detail: Default::default(),
        }
        .to_toml();
        let blob = Oid::hash_object(git2::ObjectType::Blob, text.as_bytes()).unwrap();
        let read = |env| parse_report(&repo, blob, text.len(), env, "stage-1");
        assert!(read("stage").is_err(), "the blob is not there yet");
        assert_eq!(repo.blob(text.as_bytes()).unwrap(), blob);
        for _ in 0..2 {
            assert_eq!(read("stage").map(|r| r.nodes_at_version), Ok(1));
            // What the blob holds is kept; whether it belongs where it was
            // found is judged on every read.
            assert!(read("prod")
                .unwrap_err()
                .contains("does not match its path"));
        }
    }

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn ev(n: u8, at: &str, failed: bool) -> Event {
        Event {
            commit: Oid::from_bytes(&[n; 20]).unwrap(),
            committed: t(at),
            at: t(at),
            version: Version::new(1, 13, 0),
            decisive: true,
            failed,
            config_commit: String::new(),
            message: String::new(),
        }
    }

    #[test]
    fn a_failed_on_either_branch_withdraws_an_earlier_confirmation_on_the_other() {
        let v = Version::new(1, 13, 0);
        // The cluster's own branch holds an old confirmation (a branch made
        // at an old commit of the single branch); the single branch, a later failure.
        let own = vec![ev(1, "2026-12-01T00:00:00Z", false)];
        let single = vec![
            ev(2, "2026-12-05T00:00:00Z", true),
            ev(1, "2026-12-01T00:00:00Z", false),
        ];
        let merged = merge_newest_first(own.clone(), single.clone());
        assert_eq!(tally(&merged)[&v], Err(t("2026-12-05T00:00:00Z")));
        // The other way round.
        let merged = merge_newest_first(single, own);
        assert_eq!(tally(&merged)[&v], Err(t("2026-12-05T00:00:00Z")));
        // A confirmation after the failure counts, from itself.
        let own = vec![ev(3, "2026-12-06T00:00:00Z", false)];
        let single = vec![
            ev(2, "2026-12-05T00:00:00Z", true),
            ev(1, "2026-12-01T00:00:00Z", false),
        ];
        let s = tally(&merge_newest_first(own, single))[&v].clone().unwrap();
        assert_eq!(s.at, t("2026-12-06T00:00:00Z"));
    }

    #[test]
    fn at_equal_times_the_single_branch_is_the_older_history() {
        let v = Version::new(1, 13, 0);
        let own = vec![ev(3, "2026-12-05T00:00:00Z", false)];
        let single = vec![ev(2, "2026-12-05T00:00:00Z", true)];
        assert!(tally(&merge_newest_first(own, single))[&v].is_ok());
        // A run that began on the single branch goes on on the cluster's own.
        let own = vec![ev(3, "2026-12-05T00:00:00Z", false)];
        let single = vec![ev(2, "2026-12-05T00:00:00Z", false)];
        let s = tally(&merge_newest_first(own, single))[&v].clone().unwrap();
        assert_eq!(s.status_commit, Oid::from_bytes(&[2; 20]).unwrap());
    }
}
