//! Publishing status reports: one commit per change on the cluster's own
//! status branch (`<status_branch>.d/<env>/<cluster>`), pushed fast-forward.
//!
//! No other agent writes that branch, so a push is not raced; a rejection
//! is classified ([`classify`]): a stale tip (a second replica of the same
//! cluster, a cache behind the remote) is rebuilt on the new tip and pushed
//! again, a few times at most; anything else the remote says no to (a
//! pre-receive hook, a protected branch, missing permission) is a
//! [`PushError::Refused`], which no retry will change: the caller stops and
//! says so. Each call is bounded: by [`PublishOptions::budget`], checked
//! whenever libgit2 reports progress and between the steps of an attempt,
//! by a caller's stop flag, and, for a server that says nothing at all, by
//! the transport's socket timeout (the source's).
//!
//! Each attempt speaks to the remote through the source's wire client
//! ([`crate::source::wire`]): the branch's tip is read from the push
//! connection's own advertisement, which is read as a stream and the rest
//! of it dropped, so an attempt holds one ref of the remote whatever it
//! has (a ref name that is not UTF-8 among them is dropped unread).

use super::StatusReport;
use crate::source::wire::{FetchSpec, PushConn, Update};
use crate::source::{self, Source};
use crate::trust;
use git2::{build::TreeUpdateBuilder, Commit, FileMode, ObjectType, Oid, Repository, Signature};
use ssh_key::{HashAlg, LineEnding, PrivateKey};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Local ref a stale push fetches the branch's new tip into.
const TIP_REF: &str = "refs/drover/status-tip";

/// Errors of status publishing.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// Fetching the status branch or talking to the remote failed.
    #[error(transparent)]
    Source(#[from] source::Error),
    /// Signing the status commit failed.
    #[error("cannot sign the status commit: {0}")]
    Sign(String),
    /// The cluster's own status branch does not count as a whole (a merge,
    /// a commit not signed by its key, times going backwards...): the agent
    /// does not build its reports on it.
    #[error(
        "not building on the status branch: {0}; a person must repair it (docs/status.md, \"When a status branch does not count\")"
    )]
    Untrusted(super::Untrusted),
    /// The remote refused the update for a reason a retry does not change.
    #[error("{url} refused the status report on {branch}: {message}")]
    Refused {
        /// Remote URL.
        url: String,
        /// The branch.
        branch: String,
        /// What the remote said (a hook's message, "protected branch", ...).
        message: String,
    },
    /// Every attempt found a newer tip than the one it built on.
    #[error("status push to {url} still rejected after {attempts} attempts: {last}")]
    Exhausted {
        /// Remote URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last rejection.
        last: String,
    },
    /// The budget was spent, or the caller asked to stop.
    #[error("status push to {url} stopped: {why}")]
    Stopped {
        /// Remote URL.
        url: String,
        /// Budget spent, or stop asked.
        why: String,
    },
}

impl From<git2::Error> for PushError {
    fn from(e: git2::Error) -> Self {
        PushError::Source(source::Error::Git(e))
    }
}

impl PushError {
    /// Whether retrying the same push cannot help until a person acts: the
    /// remote refused it, or the credentials, host key, URL or signing key
    /// are wrong. Everything else (unreachable, timed out, stale) may pass
    /// on a later attempt.
    pub fn needs_a_person(&self) -> bool {
        match self {
            PushError::Refused { .. } | PushError::Sign(_) | PushError::Untrusted(_) => true,
            PushError::Source(e) => matches!(
                e,
                source::Error::Auth { .. }
                    | source::Error::HostKey { .. }
                    | source::Error::Url(_)
                    | source::Error::Credential { .. }
            ),
            PushError::Exhausted { .. } | PushError::Stopped { .. } => false,
        }
    }
}

/// What a rejected ref update means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The tip moved (or is being moved): rebuild on the new tip and push again.
    Stale,
    /// The remote will not take it (a hook, a protected branch, a
    /// permission): stop and say so.
    Refused,
}

/// Classify the message a remote gave for rejecting a ref update
/// (git's receive-pack reports "non-fast-forward", "fetch first", "failed
/// to lock" for a moving tip; hooks and forges report "pre-receive hook
/// declined", "protected branch hook declined", "permission denied", ...).
/// Only a moving tip is worth rebuilding for; anything else, known or not,
/// is a refusal, because pushing it again unchanged would meet it again.
pub fn classify(message: &str) -> Rejection {
    let m = message.to_ascii_lowercase();
    let stale = [
        "non-fast-forward",
        "fetch first",
        "stale info",
        "failed to lock",
        "cannot lock ref",
        "incorrect old value",
    ];
    if stale.iter().any(|s| m.contains(s)) {
        Rejection::Stale
    } else {
        Rejection::Refused
    }
}

/// How status commits are made.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    /// Sign status commits with this key (sshsig, namespace `git`), so the
    /// gate can tell agent confirmations from hand-made ones.
    pub signing_key: Option<PrivateKey>,
    /// Push attempts on a stale tip before giving up (the caller keeps the
    /// report and retries later). The branch is this cluster's own, so a
    /// stale tip means a second writer of it; a few rebuilds settle that.
    pub max_attempts: u32,
    /// Longest one [`publish`] call may take, checked whenever the
    /// transport reports progress and between its steps. A server that
    /// sends nothing is cut by the transport's socket timeout instead.
    pub budget: Duration,
    /// Committer name.
    pub name: String,
    /// Committer e-mail.
    pub email: String,
    /// Committer time of the status commits; `None` is the wall clock. The
    /// agent sets the clock it decides by (a report's evidence counts from
    /// its commit's time); the demo, whose clock is virtual, commits at its
    /// own time so that its story reads the same whatever day it is run.
    pub commit_time: Option<chrono::DateTime<chrono::Utc>>,
    /// The report signers of the policy in force: before building on its
    /// branch's tip, the agent checks the branch counts as a whole by the
    /// one reader's rule, and refuses to build on it otherwise (`None`: no
    /// check, as for a branch nobody reads as evidence).
    pub report_signers: Option<crate::trust::AllowedSigners>,
}

impl Default for PublishOptions {
    fn default() -> Self {
        Self {
            signing_key: None,
            max_attempts: 5,
            budget: Duration::from_secs(20),
            name: "drover agent".into(),
            email: "drover@localhost".into(),
            commit_time: None,
            report_signers: None,
        }
    }
}

impl PublishOptions {
    /// Load an unencrypted OpenSSH private key for signing.
    pub fn with_signing_key_file(mut self, path: &Path) -> Result<Self, PushError> {
        let key = PrivateKey::read_openssh_file(path)
            .map_err(|e| PushError::Sign(format!("{}: {e}", path.display())))?;
        self.signing_key = Some(key);
        Ok(self)
    }
}

/// What [`publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The pushed commit; `None` when the tip already held this exact report.
    pub commit: Option<Oid>,
    /// Push attempts made (0 when nothing needed pushing).
    pub attempts: u32,
}

enum Attempt {
    Pushed(Oid),
    Untrusted(super::Untrusted),
    Unchanged,
    NeedFetch,
    /// The ref update was refused: the remote's status for it, and that
    /// status with what the remote printed (for people).
    Rejected {
        status: String,
        message: String,
    },
}

/// When a publish must stop: its budget, and the caller's flag.
struct Limit<'a> {
    deadline: Instant,
    stop: &'a AtomicBool,
    url: String,
}

impl Limit<'_> {
    fn go_on(&self) -> bool {
        Instant::now() < self.deadline && !self.stop.load(Ordering::Relaxed)
    }

    fn check(&self) -> Result<(), PushError> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(PushError::Stopped {
                url: self.url.clone(),
                why: "asked to stop".into(),
            });
        }
        if Instant::now() >= self.deadline {
            return Err(PushError::Stopped {
                url: self.url.clone(),
                why: "its time budget is spent".into(),
            });
        }
        Ok(())
    }
}

/// Write `report` to `status/<env>/<cluster>.toml` on its cluster's status
/// branch, `<status_branch>.d/<env>/<cluster>`, and push it.
///
/// The commit's parent is the remote tip of that branch (an orphan root
/// when the branch does not exist yet), so its tree holds only this
/// cluster's file. A push rejected for a stale tip is rebuilt on the new
/// tip and retried with a short jittered pause; any other rejection is
/// [`PushError::Refused`] at once. Blocking: call from a thread of its own.
pub fn publish(
    source: &Source,
    report: &StatusReport,
    opts: &PublishOptions,
) -> Result<Published, PushError> {
    publish_until(
        source,
        std::slice::from_ref(report),
        opts,
        &AtomicBool::new(false),
    )
}

/// [`publish`] for `reports` of one cluster, oldest first, in one push: a
/// commit each, in order, so the branch shows every one of them and ends on
/// the last (an agent behind a slow server catches up in one push instead
/// of one per report). Reports the branch's tip already holds, and those
/// before it, are not written again (a push abandoned by its budget may
/// still have landed). Given up (as [`PushError::Stopped`]) once `stop` is
/// set: before any step of an attempt, and at the transport's next progress
/// report. A push already sent when `stop` is set may still land.
pub fn publish_until(
    source: &Source,
    reports: &[StatusReport],
    opts: &PublishOptions,
    stop: &AtomicBool,
) -> Result<Published, PushError> {
    let Some(report) = reports.last() else {
        return Ok(Published {
            commit: None,
            attempts: 0,
        });
    };
    let url = source::redact(&source.config().url);
    let limit = Limit {
        deadline: Instant::now() + opts.budget,
        stop,
        url: url.clone(),
    };
    let branch =
        super::cluster_branch(&source.config().status_branch, &report.env, &report.cluster);
    let mut last = String::new();
    for attempt in 1..=opts.max_attempts.max(1) {
        limit.check()?;
        match try_once(source, reports, opts, &limit)? {
            Attempt::Pushed(oid) => {
                return Ok(Published {
                    commit: Some(oid),
                    attempts: attempt,
                })
            }
            Attempt::Unchanged => {
                return Ok(Published {
                    commit: None,
                    attempts: attempt - 1,
                })
            }
            Attempt::NeedFetch => {
                // The tip has commits this cache lacks: get them, then build on it.
                fetch_tip(source, &branch, &limit)?;
                continue;
            }
            Attempt::Rejected { status, message } => match classify(&status) {
                Rejection::Stale => last = message,
                Rejection::Refused => {
                    return Err(PushError::Refused {
                        url,
                        branch,
                        message,
                    })
                }
            },
            Attempt::Untrusted(u) => return Err(PushError::Untrusted(u)),
        }
        std::thread::sleep(backoff(attempt));
    }
    Err(PushError::Exhausted {
        url,
        attempts: opts.max_attempts,
        last,
    })
}

// Short and not growing with the attempt count: the branch has one
// writer, so a stale tip is a rare race that a short random pause breaks.
fn backoff(_attempt: u32) -> Duration {
    Duration::from_millis(crate::replay::random_between(5.0, 60.0) as u64)
}

/// A rejection's status followed by what the remote printed (a hook's
/// reason), on one line: "pre-receive hook declined (remote: frozen)".
fn with_remote_text(status: String, said: &[u8]) -> String {
    let text = String::from_utf8_lossy(said);
    let lines: Vec<&str> = text
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        status
    } else {
        format!("{status} (remote: {})", lines.join("; "))
    }
}

/// Fetch only this cluster's branch (into a private ref: the store's refs
/// are the fetch stage's), so the next attempt can build on its tip.
fn fetch_tip(source: &Source, branch: &str, limit: &Limit<'_>) -> Result<(), PushError> {
    let spec = FetchSpec::parse(&format!("+refs/heads/{branch}:{TIP_REF}"))
        .ok_or_else(|| PushError::Sign(format!("not a branch name: {branch}")))?;
    let go_on = || limit.go_on();
    match source::wire::fetch(source.repo(), source.config(), &[spec], 0, &go_on) {
        Ok(_) => Ok(()),
        Err(e) => {
            limit.check()?;
            Err(PushError::Source(e))
        }
    }
}

/// Build the status commit on `tip` (signed if configured); `None` when unchanged.
pub fn build_commit(
    repo: &Repository,
    report: &StatusReport,
    opts: &PublishOptions,
    tip: Option<Oid>,
) -> Result<Option<Oid>, PushError> {
    let path = report.path();
    let blob = repo.blob(report.to_toml().as_bytes())?;
    let parent: Option<Commit<'_>> = tip.map(|o| repo.find_commit(o)).transpose()?;
    let base = match &parent {
        Some(c) => c.tree()?,
        None => repo.find_tree(repo.treebuilder(None)?.write()?)?,
    };
    if base.get_path(Path::new(&path)).map(|e| e.id()).ok() == Some(blob) {
        return Ok(None);
    }
    let mut update = TreeUpdateBuilder::new();
    update.upsert(path.as_str(), blob, FileMode::Blob);
    let tree = repo.find_tree(update.create_updated(repo, &base)?)?;
    // Commit times on a status branch never go backwards (the reader's
    // rule): a clock stepped back dates the commit at its parent's time.
    let at = opts
        .commit_time
        .map_or_else(|| chrono::Utc::now().timestamp(), |t| t.timestamp())
        .max(parent.as_ref().map_or(i64::MIN, |p| p.time().seconds()));
    let who = Signature::new(&opts.name, &opts.email, &git2::Time::new(at, 0))?;
    let message = format!(
        "status: {}/{} {} {}\n\nconfig_commit: {}\nnodes: {}/{}\n",
        report.env,
        report.cluster,
        report.state.as_str(),
        report.version,
        report.config_commit,
        report.nodes_at_version,
        report.nodes
    );
    let parents: Vec<&Commit<'_>> = parent.iter().collect();
    let buf = repo.commit_create_buffer(&who, &who, &message, &tree, &parents)?;
    let oid = match &opts.signing_key {
        Some(key) => {
            let text = buf
                .as_str()
                .map_err(|_| PushError::Sign("commit buffer is not UTF-8".into()))?;
            let sig = key
                .sign(trust::GIT_NAMESPACE, HashAlg::Sha512, &buf)
                .map_err(|e| PushError::Sign(e.to_string()))?;
            let pem = sig
                .to_pem(LineEnding::LF)
                .map_err(|e| PushError::Sign(e.to_string()))?;
            repo.commit_signed(text, pem.trim_end(), None)?
        }
        None => repo.odb()?.write(ObjectType::Commit, &buf)?,
    };
    Ok(Some(oid))
}

/// Why the branch at `tip` does not count as a whole, if it does not, by
/// the reader the gate uses (judged at the time the next commit is dated).
fn untrusted_tip(
    repo: &Repository,
    branch: &str,
    tip: Oid,
    report: &StatusReport,
    opts: &PublishOptions,
) -> Result<Option<super::Untrusted>, git2::Error> {
    let Some(signers) = &opts.report_signers else {
        return Ok(None);
    };
    let seen = crate::source::seen::StatusSeen::load(repo.path());
    let judge = super::Judge {
        signers: Some(signers),
        now: opts.commit_time.unwrap_or_else(chrono::Utc::now),
        seen: (!seen.is_empty()).then_some(&seen),
    };
    let refname = format!("refs/remotes/origin/{branch}");
    Ok(super::judge_branch(repo, &refname, tip, &report.env, &report.cluster, &judge)?.err())
}

/// The reports of `reports` the branch at `tip` does not hold yet: those
/// after the last one equal to the tip's report (all when none is).
fn not_yet_on<'a>(
    repo: &Repository,
    tip: Option<Oid>,
    reports: &'a [StatusReport],
) -> Result<&'a [StatusReport], git2::Error> {
    let Some(tip) = tip else { return Ok(reports) };
    let Some(last) = reports.last() else {
        return Ok(reports);
    };
    let tree = repo.find_commit(tip)?.tree()?;
    let Ok(entry) = tree.get_path(Path::new(&last.path())) else {
        return Ok(reports);
    };
    let held = repo.find_blob(entry.id())?;
    let held = held.content();
    Ok(
        match reports.iter().rposition(|r| r.to_toml().as_bytes() == held) {
            Some(i) => &reports[i + 1..],
            None => reports,
        },
    )
}

fn try_once(
    source: &Source,
    reports: &[StatusReport],
    opts: &PublishOptions,
    limit: &Limit<'_>,
) -> Result<Attempt, PushError> {
    let Some(report) = reports.last() else {
        return Ok(Attempt::Unchanged);
    };
    let repo = source.repo();
    let branch =
        &super::cluster_branch(&source.config().status_branch, &report.env, &report.cluster);
    let branch_ref = format!("refs/heads/{branch}");
    let given_up = |e: source::Error| -> PushError {
        // Given up by the budget or the caller: say that, not the
        // transport's error it caused.
        match limit.check() {
            Err(stopped) => stopped,
            Ok(()) => PushError::Source(e),
        }
    };
    // Build on the tip this very push connection advertises, so the race
    // window is the time to write one commit, not a separate fetch's round trip.
    let conn = PushConn::open(source.config(), &branch_ref).map_err(given_up)?;
    let tip = conn.tip();
    if let Some(t) = tip {
        if repo.find_commit(t).is_err() {
            return Ok(Attempt::NeedFetch);
        }
        if let Some(u) = untrusted_tip(repo, branch, t, report, opts)? {
            return Ok(Attempt::Untrusted(u));
        }
    }
    let mut built = tip;
    for r in not_yet_on(repo, tip, reports)? {
        built = build_commit(repo, r, opts, built)?.or(built);
    }
    let Some(oid) = built.filter(|b| Some(*b) != tip) else {
        return Ok(Attempt::Unchanged);
    };
    // The last moment to give up before anything is sent.
    limit.check()?;
    let go_on = || limit.go_on();
    let (update, said) = conn.send(repo, Some(oid), &[], &go_on).map_err(given_up)?;
    Ok(match update {
        Update::Done => {
            // The local view of the branch follows the push; best
            // effort, since the fetch stage may hold the ref's lock now
            // and its next fetch brings the same tip.
            let _ = repo.reference(
                &format!("refs/remotes/origin/{branch}"),
                oid,
                true,
                "drover: status pushed",
            );
            Attempt::Pushed(oid)
        }
        Update::Rejected(status) => Attempt::Rejected {
            message: with_remote_text(status.clone(), &said),
            status,
        },
    })
}

/// What [`probe_push`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The scratch branch was created and deleted: the remote takes a
    /// push to this cluster's status branches with these credentials.
    Allowed {
        /// The scratch branch.
        scratch: String,
    },
    /// Created, but the remote refused its deletion: pushing works, and
    /// the scratch branch is left for a person to delete.
    LeftBehind {
        /// The scratch branch.
        scratch: String,
        /// What the remote said about the deletion.
        message: String,
    },
}

/// Whether the remote takes a push to `env`/`cluster`'s status branch with
/// `source`'s credentials, found by doing one: a scratch branch beside it,
/// `<status_branch>.d/<env>/<cluster>.doctor-<nonce>`, pointed at `at` (a
/// commit the remote already has, so no object is sent), then deleted. A
/// dry run (libgit2's push negotiation) would stop before the remote's
/// hooks and branch rules run, which are what refuse a status push in
/// practice; the scratch name sits beside the real branch so that the
/// same rules (`drover/status.d/**`, `.../<env>/*`) cover it, and never
/// replaces the branch itself, whose history a reader judges as a whole.
/// A refusal is [`PushError::Refused`] with the remote's words.
pub fn probe_push(
    source: &Source,
    env: &str,
    cluster: &str,
    at: Oid,
    nonce: &str,
) -> Result<Probe, PushError> {
    let repo = source.repo();
    let scratch = format!(
        "{}.doctor-{nonce}",
        super::cluster_branch(&source.config().status_branch, env, cluster)
    );
    let scratch_ref = format!("refs/heads/{scratch}");
    // `at` is known to the remote: the creation sends no object.
    let push = |new: Option<Oid>| -> Result<Option<String>, PushError> {
        let conn = PushConn::open(source.config(), &scratch_ref)?;
        if new.is_none() && conn.tip().is_none() {
            return Ok(None);
        }
        let (update, said) = conn.send(repo, new, &[at], &|| true)?;
        Ok(match update {
            Update::Done => None,
            Update::Rejected(status) => Some(with_remote_text(status, &said)),
        })
    };
    if let Some(message) = push(Some(at))? {
        return Err(PushError::Refused {
            url: source::redact(&source.config().url),
            branch: scratch,
            message,
        });
    }
    match push(None) {
        Ok(None) => Ok(Probe::Allowed { scratch }),
        Ok(Some(message)) => Ok(Probe::LeftBehind { scratch, message }),
        Err(e) => Ok(Probe::LeftBehind {
            scratch,
            message: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_moving_tip_is_rebuilt_for() {
        for stale in [
            "non-fast-forward",
            "fetch first",
            "stale info",
            "failed to lock",
            "cannot lock ref 'refs/heads/drover/status.d/a/b': is at 1234 but expected 5678",
        ] {
            assert_eq!(classify(stale), Rejection::Stale, "{stale}");
        }
        for refused in [
            "pre-receive hook declined",
            "hook declined",
            "protected branch hook declined",
            "deny updating a hidden ref",
            "permission denied",
            "shallow update not allowed",
            "something no forge said before",
        ] {
            assert_eq!(classify(refused), Rejection::Refused, "{refused}");
        }
    }

    #[test]
    fn what_the_remote_printed_follows_the_status_on_one_line() {
        assert_eq!(
            with_remote_text(
                "pre-receive hook declined".into(),
                b"frozen by the change board\n\r\nask #ops\n"
            ),
            "pre-receive hook declined (remote: frozen by the change board; ask #ops)"
        );
        assert_eq!(
            with_remote_text("hook declined".into(), b"\n"),
            "hook declined"
        );
    }

    #[test]
    fn a_refusal_needs_a_person_and_an_outage_does_not() {
        let refused = PushError::Refused {
            url: "u".into(),
            branch: "b".into(),
            message: "m".into(),
        };
        assert!(refused.needs_a_person());
        assert!(PushError::Sign("bad key".into()).needs_a_person());
        let down = PushError::Source(source::Error::Git(git2::Error::from_str(
            "failed to connect",
        )));
        assert!(!down.needs_a_person());
        let stopped = PushError::Stopped {
            url: "u".into(),
            why: "budget".into(),
        };
        assert!(!stopped.needs_a_person());
    }
}
