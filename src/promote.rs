//! Preparing a promotion (`drover promote`): choose the newest version the
//! lower environment has proven, check it against the gate, and write it as
//! a branch and a commit for review, with the evidence in the message.
//!
//! Choosing is pure ([`choose`]); writing is a thin edge over the `git`
//! command line ([`write_branch`]) so that the commit is signed exactly when
//! the user's git is configured to sign (`commit.gpgsign`, `gpg.format`).

use crate::admit::{self, Change, GitEvidence};
use crate::config::{Evidence, RepoConfig, ENV_DIR};
use crate::gate::{Allowed, Decision};
use crate::status;
use chrono::{DateTime, Utc};
use git2::Repository;
use semver::Version;
use std::path::Path;
use std::process::Command;

/// Errors that stop a promotion from being prepared at all.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The environment is not in the chain.
    #[error("environment `{env}` is not in the promotion chain ({chain})")]
    UnknownEnv {
        /// The name given.
        env: String,
        /// The chain, comma-separated.
        chain: String,
    },
    /// The first environment has nothing below it to promote from.
    #[error("`{0}` is the first environment of the chain: bump its version directly in environments/{0}.toml")]
    FirstInChain(String),
    /// The gate could not read its evidence.
    #[error(transparent)]
    Admit(#[from] admit::Error),
    /// The config at HEAD, whose policy judges the promotion, is invalid.
    #[error("the config at HEAD is invalid: {0}")]
    Invalid(String),
    /// Reading the status branch failed.
    #[error(transparent)]
    Status(#[from] status::Error),
    /// A git command or operation failed.
    #[error("git: {0}")]
    Git(String),
    /// The environment file could not be rewritten.
    #[error("{file}: {why}")]
    File {
        /// The file.
        file: String,
        /// What went wrong.
        why: String,
    },
}

/// A promotion the gate allows.
#[derive(Debug, Clone)]
pub struct Proposal {
    /// The environment promoted.
    pub env: String,
    /// Its version now.
    pub from: Version,
    /// The version it moves to.
    pub to: Version,
    /// The gate's reasons, which become the commit message's evidence.
    pub allowed: Allowed,
    /// Branch name for the pull request.
    pub branch: String,
}

impl Proposal {
    /// The commit message: a summary line, then the evidence.
    pub fn message(&self) -> String {
        format!(
            "Promote {env} to {to}\n\n{evidence}.\n\nPrepared by `drover promote {env}` (was {from}).\n",
            env = self.env,
            to = self.to,
            from = self.from,
            evidence = self.allowed,
        )
    }
}

/// What `choose` concluded.
#[derive(Debug, Clone)]
pub enum Choice {
    /// This promotion is allowed.
    Promote(Box<Proposal>),
    /// Nothing is eligible; each candidate's refusal, or why there is none.
    Nothing(Vec<String>),
}

/// Choose the version `env` should move to: `to` if given and allowed,
/// otherwise the newest version above its current one that the lower
/// environment has proven and the gate allows at `now`.
pub fn choose(
    repo: &Repository,
    cfg: &RepoConfig,
    env: &str,
    to: Option<&Version>,
    now: DateTime<Utc>,
) -> Result<Choice, Error> {
    let Some(env_cfg) = cfg.envs.get(env) else {
        return Err(Error::UnknownEnv {
            env: env.to_owned(),
            chain: cfg.root.chain.join(", "),
        });
    };
    let Some(lower) = cfg.lower(env) else {
        return Err(Error::FirstInChain(env.to_owned()));
    };
    let current = env_cfg.version.clone();
    let head = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|e| Error::Git(e.message().to_owned()))?;

    // The promotion is a change on top of HEAD: judged by HEAD's policy,
    // through the same admission as `drover check --base` and the agent.
    let snap = admit::snapshot(repo, head.id(), now)?
        .map_err(|d| Error::Invalid(d.first().map(ToString::to_string).unwrap_or_default()))?;
    let mut evidence = GitEvidence::new(repo, head.id(), now);

    // Every version the lower environment shows, oldest first.
    let mut proven: Vec<Version> = match cfg.root.evidence {
        Evidence::Status => evidence
            .confirmations(&snap.policy)?
            .for_env(lower)
            .into_iter()
            .map(|(_, v, _)| v)
            .collect(),
        Evidence::History => cfg
            .envs
            .get(lower)
            .map(|l| l.version.clone())
            .into_iter()
            .collect(),
    };
    proven.sort();
    proven.dedup();
    let candidates: Vec<Version> = match to {
        Some(v) => vec![v.clone()],
        None => proven.iter().filter(|v| **v > current).cloned().collect(),
    };
    if candidates.is_empty() {
        let shown: Vec<String> = proven.iter().map(ToString::to_string).collect();
        let shown = if shown.is_empty() {
            "none".to_owned()
        } else {
            shown.join(", ")
        };
        let what = match cfg.root.evidence {
            Evidence::Status => format!(
                "versions its clusters confirmed on their status branches {}: {shown}",
                crate::status::cluster_branch(&cfg.root.status_branch, lower, "<cluster>")
            ),
            Evidence::History => format!("{lower} is configured at {shown}"),
        };
        return Ok(Choice::Nothing(vec![format!(
            "{lower} has proven no version newer than {env}'s {current} ({what})"
        )]));
    }

    let mut refusals = Vec::new();
    for v in candidates.into_iter().rev() {
        let mut trial = snap.config.clone();
        if let Some(e) = trial.envs.get_mut(env) {
            e.version = v.clone();
            // A promotion never sets allow_downgrade; one left over does not count.
            e.allow_downgrade = false;
        }
        let change = Change {
            before: Some((&snap.config, &snap.policy)),
            after: (&trial, &snap.policy),
        };
        match admit::judge_env(change, env, &mut evidence, now)? {
            Decision::Allowed(allowed) => {
                return Ok(Choice::Promote(Box::new(Proposal {
                    env: env.to_owned(),
                    from: current,
                    branch: format!("drover/promote-{env}-{v}"),
                    to: v,
                    allowed,
                })))
            }
            Decision::Unchanged => refusals.push(format!("{env} is already at {v}")),
            Decision::Refused(r) => refusals.push(r.to_string()),
        }
    }
    Ok(Choice::Nothing(refusals))
}

/// Replace the `version` value in an environment file's text, keeping every
/// comment and the rest of the layout as the reviewer knows it.
pub fn set_version(text: &str, to: &Version) -> Result<String, String> {
    let doc = toml::de::DeTable::parse(text).map_err(|e| e.to_string())?;
    let (_, value) = doc
        .get_ref()
        .iter()
        .find(|(k, _)| k.get_ref() == "version")
        .ok_or_else(|| "no top-level `version` key".to_string())?;
    let span = value.span();
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..span.start]);
    out.push_str(&format!("\"{to}\""));
    out.push_str(&text[span.end..]);
    Ok(out)
}

/// Create `proposal.branch` at HEAD of the work tree `dir`, switch to it and
/// commit the new version (dated `date`, or now); returns the new commit's id.
pub fn write_branch(
    dir: &Path,
    proposal: &Proposal,
    date: Option<DateTime<Utc>>,
) -> Result<String, Error> {
    let rel = format!("{ENV_DIR}/{}.toml", proposal.env);
    let text = std::fs::read_to_string(dir.join(&rel)).map_err(|e| Error::File {
        file: rel.clone(),
        why: e.to_string(),
    })?;
    let new = set_version(&text, &proposal.to).map_err(|why| Error::File {
        file: rel.clone(),
        why,
    })?;
    commit_on_branch(dir, &proposal.branch, &rel, &new, &proposal.message(), date)
}

/// The commit every prepared change ends in (`drover promote`, `drover
/// revoke`): in the work tree `dir`, create `branch` at HEAD, switch to it,
/// write `text` to the repository file `rel` and commit only that file with
/// `message` (dated `date`, or now); returns the new commit's id. A file with
/// uncommitted changes is refused first, so the commit never carries edits
/// nobody asked for.
pub fn commit_on_branch(
    dir: &Path,
    branch: &str,
    rel: &str,
    text: &str,
    message: &str,
    date: Option<DateTime<Utc>>,
) -> Result<String, Error> {
    if !git(dir, &["status", "--porcelain", "--", rel])?
        .trim()
        .is_empty()
    {
        return Err(Error::File {
            file: rel.to_owned(),
            why: "has uncommitted changes; commit or stash them first".to_owned(),
        });
    }
    git(dir, &["switch", "--quiet", "-c", branch])?;
    std::fs::write(dir.join(rel), text).map_err(|e| Error::File {
        file: rel.to_owned(),
        why: e.to_string(),
    })?;
    git(dir, &["add", "--", rel])?;
    git_at(dir, &["commit", "--quiet", "-m", message, "--", rel], date)?;
    git(dir, &["rev-parse", "HEAD"]).map(|s| s.trim().to_owned())
}

/// Run `git -C dir args…`; its stdout.
pub fn git(dir: &Path, args: &[&str]) -> Result<String, Error> {
    git_at(dir, args, None)
}

/// Run `git -C dir args…` with author and committer dates set to `date`
/// (the demo's virtual time; history evidence reads commit times).
pub fn git_at(dir: &Path, args: &[&str], date: Option<DateTime<Utc>>) -> Result<String, Error> {
    let mut cmd = Command::new("git");
    if let Some(d) = date {
        let d = d.to_rfc3339();
        cmd.env("GIT_AUTHOR_DATE", &d).env("GIT_COMMITTER_DATE", &d);
    }
    let out = cmd
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| Error::Git(format!("cannot run git: {e}")))?;
    if !out.status.success() {
        return Err(Error::Git(format!(
            "git {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_version_keeps_comments_and_layout() {
        let text =
            "# stage\nversion = \"1.12.0\"   # pinned\n\n[window]\nschedule = \"0 2 8 * *\"\n";
        let out = set_version(text, &Version::new(1, 13, 2)).unwrap();
        assert_eq!(
            out,
            "# stage\nversion = \"1.13.2\"   # pinned\n\n[window]\nschedule = \"0 2 8 * *\"\n"
        );
    }

    #[test]
    fn set_version_needs_a_version_key() {
        assert!(set_version("[window]\nschedule = \"x\"\n", &Version::new(1, 0, 0)).is_err());
    }
}
