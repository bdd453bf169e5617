//! Publishing status reports: one commit per change on the cluster's own
//! status branch (`<status_branch>.d/<env>/<cluster>`), pushed fast-forward.
//! No other agent writes that branch, so a push is not raced; a rejection
//! (a stale cache, a second agent for the same cluster) is rebuilt on the
//! new tip.

use super::StatusReport;
use crate::source::{self, CallbackState, Source};
use crate::trust;
use git2::{
    build::TreeUpdateBuilder, Commit, FileMode, ObjectType, Oid, PushOptions, Repository, Signature,
};
use ssh_key::{HashAlg, LineEnding, PrivateKey};
use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

/// Local ref the outgoing status commit is pushed from.
const OUTGOING_REF: &str = "refs/drover/status-outgoing";

/// Errors of status publishing.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// Fetching the status branch or talking to the remote failed.
    #[error(transparent)]
    Source(#[from] source::Error),
    /// Signing the status commit failed.
    #[error("cannot sign the status commit: {0}")]
    Sign(String),
    /// Every attempt lost the race to other agents.
    #[error("status push to {url} still rejected after {attempts} attempts: {last}")]
    Exhausted {
        /// Remote URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last rejection.
        last: String,
    },
}

impl From<git2::Error> for PushError {
    fn from(e: git2::Error) -> Self {
        PushError::Source(source::Error::Git(e))
    }
}

/// How status commits are made.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    /// Sign status commits with this key (sshsig, namespace `git`), so the
    /// gate can tell agent confirmations from hand-made ones.
    pub signing_key: Option<PrivateKey>,
    /// Push attempts before giving up (the caller keeps the report and retries
    /// later). Each rejection means another agent's push landed, so this bounds
    /// how many foreign pushes one report waits behind.
    pub max_attempts: u32,
    /// Committer name.
    pub name: String,
    /// Committer e-mail.
    pub email: String,
    /// Committer time of the status commits; `None` is the wall clock, as an
    /// agent must use (a report's evidence counts from its commit's time). The
    /// demo, whose clock is virtual, commits at its own time so that its story
    /// reads the same whatever day it is run.
    pub commit_time: Option<chrono::DateTime<chrono::Utc>>,
}

impl Default for PublishOptions {
    fn default() -> Self {
        Self {
            signing_key: None,
            max_attempts: 150,
            name: "drover agent".into(),
            email: "drover@localhost".into(),
            commit_time: None,
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
    Unchanged,
    NeedFetch,
    Rejected(String),
}

/// Write `report` to `status/<env>/<cluster>.toml` on its cluster's status
/// branch, `<status_branch>.d/<env>/<cluster>`, and push it.
///
/// The commit's parent is the remote tip of that branch (an orphan root
/// when the branch does not exist yet), so its tree holds only this
/// cluster's file. A rejected push is retried on the new tip with jittered
/// backoff. Blocking: call from `spawn_blocking`.
pub fn publish(
    source: &Source,
    report: &StatusReport,
    opts: &PublishOptions,
) -> Result<Published, PushError> {
    let mut last = String::new();
    for attempt in 1..=opts.max_attempts.max(1) {
        match try_once(source, report, opts)? {
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
                source.fetch_status()?;
                continue;
            }
            Attempt::Rejected(why) => last = why,
        }
        std::thread::sleep(backoff(attempt));
    }
    Err(PushError::Exhausted {
        url: source::redact(&source.config().url),
        attempts: opts.max_attempts,
        last,
    })
}

// Short and not growing with the attempt count: a growing backoff lets agents
// on their first attempt overtake one that already lost several races, and a
// loser could starve. Random spread is what breaks the ties.
fn backoff(_attempt: u32) -> Duration {
    Duration::from_millis(rand::random_range(5..60))
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
    let who = match opts.commit_time {
        Some(t) => Signature::new(&opts.name, &opts.email, &git2::Time::new(t.timestamp(), 0))?,
        None => Signature::now(&opts.name, &opts.email)?,
    };
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

fn try_once(
    source: &Source,
    report: &StatusReport,
    opts: &PublishOptions,
) -> Result<Attempt, PushError> {
    let repo = source.repo();
    let branch =
        &super::cluster_branch(&source.config().status_branch, &report.env, &report.cluster);
    let branch_ref = format!("refs/heads/{branch}");
    let state = CallbackState::default();
    let rejected: RefCell<Option<String>> = RefCell::new(None);
    let mut remote = repo.remote_anonymous(&source.config().url)?;
    let result: Result<Attempt, git2::Error> = (|| {
        // Build on the tip this very push connection advertises, so the race
        // window is the time to write one commit, not a separate fetch's round trip.
        let mut conn =
            remote.connect_auth(git2::Direction::Push, Some(source.callbacks(&state)), None)?;
        let tip = conn
            .list()?
            .iter()
            .find(|h| h.name() == branch_ref)
            .map(|h| h.oid());
        if let Some(t) = tip {
            if repo.find_commit(t).is_err() {
                return Ok(Attempt::NeedFetch);
            }
        }
        let Some(oid) = build_commit(repo, report, opts, tip).map_err(|e| match e {
            PushError::Source(source::Error::Git(g)) => g,
            other => git2::Error::from_str(&other.to_string()),
        })?
        else {
            return Ok(Attempt::Unchanged);
        };
        repo.reference(OUTGOING_REF, oid, true, "drover: status report")?;
        let mut cbs = source.callbacks(&state);
        cbs.push_update_reference(|_name, status| {
            if let Some(msg) = status {
                *rejected.borrow_mut() = Some(msg.to_string());
            }
            Ok(())
        });
        let mut po = PushOptions::new();
        po.remote_callbacks(cbs);
        conn.remote()
            .push(&[format!("{OUTGOING_REF}:{branch_ref}")], Some(&mut po))?;
        Ok(Attempt::Pushed(oid))
    })();
    let attempt = match result {
        Ok(Attempt::Pushed(oid)) => match rejected.into_inner() {
            Some(why) => Attempt::Rejected(why),
            None => {
                repo.reference(
                    &format!("refs/remotes/origin/{branch}"),
                    oid,
                    true,
                    "drover: status pushed",
                )?;
                Attempt::Pushed(oid)
            }
        },
        Ok(other) => other,
        // libgit2 refuses a non-fast-forward locally when it already knows the newer tip.
        Err(e) if e.code() == git2::ErrorCode::NotFastForward => {
            Attempt::Rejected(e.message().to_string())
        }
        Err(e) => return Err(PushError::Source(state.into_error(e))),
    };
    Ok(attempt)
}
