//! Reading the status branch (docs/design.md §5): the one reader of status
//! reports, shared by the gate, `drover promote`, `drover log` and the demo.
//!
//! The walk follows the branch's first parents from its tip. At each commit
//! only the report files that commit changed are looked at, and a report is
//! evidence only when:
//! - its file still exists at the tip (a report deleted from the tip no
//!   longer counts);
//! - the blob is at most [`MAX_REPORT_BYTES`] (its size is read from the
//!   object header, so an oversized report is never loaded);
//! - the commit that wrote it is signed by a key listed for exactly its
//!   `<env>/<cluster>` in the report signers of the policy in force;
//! - it parses and names the env and cluster of its path.
//!
//! Everything else is ignored and named in [`Confirmations::ignored`]. Only
//! one report is held in memory at a time. The gate's read checks signatures
//! only where they can matter ([`Checks::Evidence`]): each file's newest
//! version and every `confirmed` or `failed` one.
//!
//! Per cluster and version, the newest decisive report wins: a `failed`
//! report withdraws every earlier confirmation of that version. A
//! confirmation counts from the first `confirmed` report after the last
//! `failed` one (a re-published `confirmed`, say with a new node count, does
//! not restart the soak), and its time is the signed commit's committer time,
//! or the file's `since` when that is later: a report cannot claim to be
//! older than the commit that published it.

use super::StatusReport;
use crate::rollout::RolloutState;
use crate::trust::{self, AllowedSigners};
use chrono::{DateTime, TimeZone, Utc};
use git2::{Commit, ObjectType, Oid, Repository};
use semver::Version;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::ops::ControlFlow;

/// Largest status report file that is read (docs/design.md §5).
pub const MAX_REPORT_BYTES: usize = 64 * 1024;

/// Errors reading the status branch (a missing branch is not one).
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

/// A report the reader did not count, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    /// Environment of the report's path.
    pub env: String,
    /// Cluster of the report's path.
    pub cluster: String,
    /// The status commit that wrote it.
    pub commit: String,
    /// Why it does not count.
    pub why: String,
}

impl fmt::Display for Ignored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "status/{}/{}.toml in {:.10}: {}",
            self.env, self.cluster, self.commit, self.why
        )
    }
}

/// One trusted report, as the reader passed it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedReport {
    /// The report.
    pub report: StatusReport,
    /// The signed status commit that wrote it.
    pub commit: Oid,
    /// When it counts from: the later of the commit time and `since`.
    pub at: DateTime<Utc>,
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

/// What the status branch proves, per cluster and version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confirmations {
    /// Where the branch was read from; `None` when it does not exist.
    pub branch: Option<BranchRef>,
    /// (env, cluster, version) -> the standing confirmation.
    confirmed: BTreeMap<(String, String, Version), Standing>,
    /// (env, cluster, version) -> the `failed` report that withdrew it.
    withdrawn: BTreeMap<(String, String, Version), DateTime<Utc>>,
    /// Reports that do not count, each named with why.
    pub ignored: Vec<Ignored>,
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

    /// Every (cluster, version, confirmation time) standing for `env`.
    pub fn for_env(&self, env: &str) -> Vec<(String, Version, DateTime<Utc>)> {
        self.confirmed
            .iter()
            .filter(|((e, _, _), _)| e == env)
            .map(|((_, c, v), s)| (c.clone(), v.clone(), s.at))
            .collect()
    }

    /// Why `cluster` of `env` has no standing confirmation of `version`, if
    /// the branch says anything about it (withdrawn, or reports ignored).
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
            .collect();
        (!ignored.is_empty()).then(|| format!("ignored reports: {}", ignored.join("; ")))
    }
}

/// Who may sign reports: the parsed `report_signers` of the policy in force.
/// `None` trusts no report.
pub type ReportSigners<'a> = Option<&'a AllowedSigners>;

pub(super) fn commit_time(c: &Commit<'_>) -> DateTime<Utc> {
    Utc.timestamp_opt(c.time().seconds(), 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `status/<env>/<cluster>.toml` blobs of a commit's tree.
pub(super) fn report_blobs(
    repo: &Repository,
    commit: &Commit<'_>,
) -> Result<BTreeMap<(String, String), Oid>, git2::Error> {
    let mut out = BTreeMap::new();
    let tree = commit.tree()?;
    let Some(status) = tree.get_name("status") else {
        return Ok(out);
    };
    if status.kind() != Some(ObjectType::Tree) {
        return Ok(out);
    }
    for env in repo.find_tree(status.id())?.iter() {
        if env.kind() != Some(ObjectType::Tree) {
            continue;
        }
        let Ok(env_name) = env.name() else { continue };
        for file in repo.find_tree(env.id())?.iter() {
            if file.kind() != Some(ObjectType::Blob) {
                continue;
            }
            let Some(cluster) = file.name().ok().and_then(|n| n.strip_suffix(".toml")) else {
                continue;
            };
            out.insert((env_name.to_owned(), cluster.to_owned()), file.id());
        }
    }
    Ok(out)
}

/// Subtree id of `status/` in a commit (to skip commits that change nothing there).
fn status_dir(commit: &Commit<'_>) -> Result<Option<Oid>, git2::Error> {
    Ok(commit
        .tree()?
        .get_name("status")
        .filter(|e| e.kind() == Some(ObjectType::Tree))
        .map(|e| e.id()))
}

/// Check the commit that wrote `env`/`cluster`'s report: signed by a key
/// listed for exactly `<env>/<cluster>`? `Err` says why not.
pub(super) fn check_signer(
    repo: &Repository,
    commit: Oid,
    env: &str,
    cluster: &str,
    signers: ReportSigners<'_>,
) -> Result<(), String> {
    let own = signers.map(|all| all.for_principal(&format!("{env}/{cluster}")));
    check_signer_with(repo, commit, env, cluster, signers, own.as_ref())
}

/// [`check_signer`] with the keys listed for exactly `<env>/<cluster>`
/// (`own`) already picked out of `signers`, so a walk of one cluster's
/// branch filters the signers once, not once per report.
pub(super) fn check_signer_with(
    repo: &Repository,
    commit: Oid,
    env: &str,
    cluster: &str,
    signers: ReportSigners<'_>,
    own: Option<&AllowedSigners>,
) -> Result<(), String> {
    let (Some(all), Some(own)) = (signers, own) else {
        return Err(
            "no `report_signers` in [promotion] of drover.toml, so no report can be trusted".into(),
        );
    };
    let principal = format!("{env}/{cluster}");
    match trust::verify_commit(repo, commit, own) {
        Ok(_) => Ok(()),
        Err(trust::Error::Refused(r)) => match r.reason {
            trust::Reason::UnknownKey { fingerprint } => {
                // Name whose key it is, when it is someone else's.
                match trust::verify_commit(repo, commit, all) {
                    Ok(v) => Err(format!(
                        "signed by {}'s key, which is not listed for {principal} in the report signers",
                        v.principal
                    )),
                    Err(_) => Err(format!(
                        "signed by key {fingerprint}, which is not listed for {principal} in the report signers"
                    )),
                }
            }
            other => Err(other.to_string()),
        },
        Err(e) => Err(e.to_string()),
    }
}

/// Read one report blob with the size bound; `Err` says why it is ignored.
pub(super) fn read_report(
    repo: &Repository,
    blob: Oid,
    env: &str,
    cluster: &str,
) -> Result<StatusReport, String> {
    let odb = repo.odb().map_err(|e| e.to_string())?;
    let (size, _) = odb.read_header(blob).map_err(|e| e.to_string())?;
    if size > MAX_REPORT_BYTES {
        return Err(format!(
            "{size} bytes, larger than the {} KiB a report may have",
            MAX_REPORT_BYTES / 1024
        ));
    }
    let blob = repo.find_blob(blob).map_err(|e| e.to_string())?;
    let text = std::str::from_utf8(blob.content()).map_err(|_| "not UTF-8".to_string())?;
    let r = StatusReport::from_toml(text)
        .map_err(|e| format!("not a valid status report ({})", e.message().trim()))?;
    if r.env != env || r.cluster != cluster {
        return Err(format!(
            "reports env {:?} cluster {:?}, which does not match its path",
            r.env, r.cluster
        ));
    }
    Ok(r)
}

/// One version of one report file, as the walk of the status branch met it.
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
    /// naming another cluster than its path).
    pub report: Result<StatusReport, String>,
    /// `Ok` when the commit is signed by a key listed for exactly this
    /// `<env>/<cluster>`; otherwise why not. Checked only for readable
    /// reports whose file still exists at the tip.
    pub trust: Result<(), String>,
    /// The file no longer exists at the branch tip, so it counts for nothing.
    pub deleted_at_tip: bool,
    /// False when the walk's [`Checks`] left the signature unchecked (a
    /// readable version that cannot count as evidence); `trust` then says so.
    pub checked: bool,
}

/// Which report versions a walk checks the signature of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checks {
    /// Every readable version (the timeline shows each one's trust).
    All,
    /// Only what can be evidence or must be named: the newest version of each
    /// file on its branch, and every `confirmed` or `failed` one. An older
    /// `pending`/`rolling`/... version changes no confirmation whoever signed
    /// it, and checking 10,000 signatures is most of a fleet's read time.
    Evidence,
}

impl Checks {
    /// Whether a readable `report` gets its signature checked; `newest`: the
    /// newest version of its file on the branch being walked.
    pub(super) fn wants(self, report: &StatusReport, newest: bool) -> bool {
        self == Checks::All
            || newest
            || matches!(report.state, RolloutState::Confirmed | RolloutState::Failed)
    }
}

/// The trust of a version the walk's [`Checks`] do not look at.
pub(super) const NOT_CHECKED: &str =
    "signature not checked: an older report in this state cannot count as evidence";

/// Walk the status branch from `tip` along first parents, newest first,
/// calling `visit` once per version of each report file (at the commit that
/// wrote it), until `visit` says stop. The one reader of the status branch:
/// the gate, `drover log` and `drover status` all read through it, and it
/// holds one report in memory at a time.
pub fn walk_versions(
    repo: &Repository,
    tip: Oid,
    signers: ReportSigners<'_>,
    visit: impl FnMut(ReportVersion) -> ControlFlow<()>,
) -> Result<(), git2::Error> {
    walk_versions_checked(repo, tip, signers, Checks::All, visit)
}

/// [`walk_versions`], checking the signatures `checks` asks for.
pub(super) fn walk_versions_checked(
    repo: &Repository,
    tip: Oid,
    signers: ReportSigners<'_>,
    checks: Checks,
    mut visit: impl FnMut(ReportVersion) -> ControlFlow<()>,
) -> Result<(), git2::Error> {
    // Files whose newest version the walk has passed.
    let mut met: BTreeSet<(String, String)> = BTreeSet::new();
    let mut commit = repo.find_commit(tip)?;
    let at_tip = report_blobs(repo, &commit)?;
    let mut dir = status_dir(&commit)?;
    let mut blobs = at_tip.clone();
    loop {
        let parent = commit.parent(0).ok();
        let parent_dir = match &parent {
            Some(p) => status_dir(p)?,
            None => None,
        };
        let parent_blobs = match (&parent, parent_dir == dir) {
            (_, true) => blobs.clone(),
            (Some(p), false) => report_blobs(repo, p)?,
            (None, false) => BTreeMap::new(),
        };
        if parent_dir != dir {
            for ((env, cluster), blob) in &blobs {
                if parent_blobs.get(&(env.clone(), cluster.clone())) == Some(blob) {
                    continue;
                }
                let deleted_at_tip = !at_tip.contains_key(&(env.clone(), cluster.clone()));
                let newest = met.insert((env.clone(), cluster.clone()));
                let report = read_report(repo, *blob, env, cluster);
                let checked = report.as_ref().map_or(true, |r| checks.wants(r, newest));
                let trust = match (&report, deleted_at_tip) {
                    (Ok(_), false) if !checked => Err(NOT_CHECKED.into()),
                    (Ok(_), false) => check_signer(repo, commit.id(), env, cluster, signers),
                    (Err(why), _) => Err(why.clone()),
                    (Ok(_), true) => Err("the file is deleted at the branch tip".into()),
                };
                let flow = visit(ReportVersion {
                    env: env.clone(),
                    cluster: cluster.clone(),
                    commit: commit.id(),
                    committed: commit_time(&commit),
                    report,
                    trust,
                    deleted_at_tip,
                    checked,
                });
                if flow.is_break() {
                    return Ok(());
                }
            }
        }
        match parent {
            Some(p) => {
                commit = p;
                dir = parent_dir;
                blobs = parent_blobs;
            }
            None => break,
        }
    }
    Ok(())
}

/// Sorts report versions into trusted reports and ignored ones, noting a
/// file deleted at its branch tip once.
#[derive(Default)]
pub(super) struct Sieve {
    deleted_noted: BTreeSet<(String, String)>,
}

impl Sieve {
    /// The trusted report in `v`, or `None` after recording why it does not count.
    pub(super) fn take(
        &mut self,
        v: ReportVersion,
        ignored: &mut Vec<Ignored>,
    ) -> Option<TrustedReport> {
        if v.deleted_at_tip {
            if self
                .deleted_noted
                .insert((v.env.clone(), v.cluster.clone()))
            {
                ignored.push(Ignored {
                    env: v.env,
                    cluster: v.cluster,
                    commit: v.commit.to_string(),
                    why: "the file is deleted at the branch tip, so its reports no longer count"
                        .into(),
                });
            }
            return None;
        }
        if !v.checked {
            // Cannot count, and is not named: only its signature is unknown.
            return None;
        }
        match (v.report, v.trust) {
            (Ok(report), Ok(())) => {
                let at = v.committed.max(report.since);
                Some(TrustedReport {
                    report,
                    commit: v.commit,
                    at,
                })
            }
            (Err(why), _) | (Ok(_), Err(why)) => {
                ignored.push(Ignored {
                    env: v.env,
                    cluster: v.cluster,
                    commit: v.commit.to_string(),
                    why,
                });
                None
            }
        }
    }
}

/// Walk the status branch from `tip`, newest first, calling `visit` with
/// every trusted report among those `checks` looks at, and recording every
/// ignored one in `ignored`.
pub fn walk_reports(
    repo: &Repository,
    tip: Oid,
    signers: ReportSigners<'_>,
    checks: Checks,
    ignored: &mut Vec<Ignored>,
    mut visit: impl FnMut(TrustedReport),
) -> Result<(), git2::Error> {
    let mut sieve = Sieve::default();
    walk_versions_checked(repo, tip, signers, checks, |v| {
        if let Some(t) = sieve.take(v, ignored) {
            visit(t);
        }
        ControlFlow::Continue(())
    })
}

/// Read what the status store named `branch` proves, trusting reports
/// signed by `signers` (docs/design.md §5): every per-cluster branch
/// `<branch>.d/<env>/<cluster>` and the single branch `<branch>` of the
/// older layout, each local or `origin/` (see [`super::find_store`]).
pub fn read_confirmations(
    repo: &Repository,
    branch: &str,
    signers: ReportSigners<'_>,
) -> Result<Confirmations, Error> {
    let store = super::find_store(repo, branch)?;
    let mut out = super::confirmations_in(repo, &store, signers).map_err(|source| Error::Git {
        branch: branch.to_owned(),
        source,
    })?;
    out.branch = store.legacy.clone();
    Ok(out)
}

/// What the status branch at `tip` (one branch of the older layout, every
/// cluster's file on it) proves, trusting reports signed by `signers`.
pub fn confirmations_at(
    repo: &Repository,
    tip: Oid,
    signers: ReportSigners<'_>,
) -> Result<Confirmations, git2::Error> {
    tally(|ignored, visit| walk_reports(repo, tip, signers, Checks::Evidence, ignored, visit))
}

/// Confirmations from the trusted reports `walk` passes on. `walk` must give
/// each cluster's reports newest first (clusters may interleave in any way).
pub(super) fn tally(
    walk: impl FnOnce(&mut Vec<Ignored>, &mut dyn FnMut(TrustedReport)) -> Result<(), git2::Error>,
) -> Result<Confirmations, git2::Error> {
    let mut out = Confirmations::default();
    // Per (env, cluster, version): decided once a `failed` is seen (newest
    // first); until then the earliest confirmation of the run wins.
    let mut decided: HashMap<(String, String, Version), bool> = HashMap::new();
    let mut confirmed = BTreeMap::new();
    let mut withdrawn = BTreeMap::new();
    walk(&mut out.ignored, &mut |t: TrustedReport| {
        let r = t.report;
        let key = (r.env, r.cluster, r.version);
        if decided.get(&key) == Some(&true) {
            return;
        }
        match r.state {
            RolloutState::Failed => {
                decided.insert(key.clone(), true);
                if !confirmed.contains_key(&key) {
                    withdrawn.insert(key, t.at);
                }
            }
            RolloutState::Confirmed => {
                confirmed.insert(
                    key,
                    Standing {
                        at: t.at,
                        status_commit: t.commit,
                        config_commit: r.config_commit,
                    },
                );
            }
            _ => {}
        }
    })?;
    out.confirmed = confirmed;
    out.withdrawn = withdrawn;
    Ok(out)
}
