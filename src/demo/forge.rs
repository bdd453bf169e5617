//! The forge and the people: a bare origin holding the config repository, a
//! work tree pull requests are opened from, and the merges a reviewer makes.

use super::Error;
use crate::config::{self, DirFiles, RepoConfig};
use crate::promote::{self, git, git_at};
use chrono::{DateTime, Utc};
use semver::Version;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The forge and the people: a bare origin and a work tree to open pull requests from.
pub(super) struct Forge {
    pub(super) origin: PathBuf,
    pub(super) work: PathBuf,
    pub(super) pr: u32,
}

impl Forge {
    /// A bare origin holding example-repo's first commit, and a clone to
    /// work in (at `keep` when given, else in `tmp`). A kept work tree keeps
    /// its origin too, inside its `.git` (`.git/drover-demo-origin.git`), so
    /// `git fetch` and `drover status --watch` work there after the story.
    pub(super) fn create(
        tmp: &Path,
        keep: Option<&Path>,
        example: &Path,
        at: DateTime<Utc>,
        cfg: &RepoConfig,
        keys: &BTreeMap<(String, String), ssh_key::PrivateKey>,
    ) -> Result<Self, Error> {
        let work = keep.map_or_else(|| tmp.join("config"), Path::to_path_buf);
        copy_dir(example, &work)?;
        git(&work, &["init", "--quiet", "-b", "main"])?;
        let origin = match keep {
            Some(_) => std::path::absolute(work.join(".git/drover-demo-origin.git"))?,
            None => tmp.join("origin.git"),
        };
        git(
            tmp,
            &[
                "init",
                "--quiet",
                "--bare",
                "-b",
                "main",
                path_str(&origin)?,
            ],
        )?;
        if let Some(file) = &cfg.root.report_signers {
            let path = work.join(file);
            let mut text = std::fs::read_to_string(&path).unwrap_or_default();
            for ((env, cluster), key) in keys {
                let public = key
                    .public_key()
                    .to_openssh()
                    .map_err(|e| Error::Key(e.to_string()))?;
                text.push_str(&format!("{env}/{cluster} namespaces=\"git\" {public}\n"));
            }
            std::fs::write(path, text)?;
        }
        for args in [
            &["config", "user.name", "Platform Team"][..],
            &["config", "user.email", "platform@example.com"],
            &["config", "commit.gpgsign", "false"],
            &["remote", "add", "origin", path_str(&origin)?],
            &["add", "-A"],
        ] {
            git(&work, args)?;
        }
        git_at(
            &work,
            &[
                "commit",
                "--quiet",
                "-m",
                "Initial configuration: test, stage and production at 1.12.0",
            ],
            Some(at),
        )?;
        git(&work, &["push", "--quiet", "origin", "main"])?;
        Ok(Forge {
            origin,
            work,
            pr: 0,
        })
    }

    /// The fleet as `drover status` shows it at `now`, from the work tree
    /// with the status branch fetched as a local branch (so the work tree
    /// stands alone once the temporary origin is gone).
    pub(super) fn fleet(
        &self,
        now: DateTime<Utc>,
    ) -> Result<(crate::fleet::Fleet, crate::fleet::Timeline), Error> {
        git(
            &self.work,
            &[
                "fetch",
                "--quiet",
                "origin",
                "+refs/heads/drover/status.d/*:refs/heads/drover/status.d/*",
            ],
        )?;
        let cfg = self.config()?;
        let repo = git2::Repository::open(&self.work)?;
        let mut fleet = crate::fleet::gather(&repo, &cfg, now, None)?;
        let (timeline, warnings) = crate::fleet::timeline(&repo, &cfg, now, None, None)?;
        fleet.warnings.extend(warnings);
        Ok((fleet, timeline))
    }

    pub(super) fn config(&self) -> Result<RepoConfig, Error> {
        config::load(&DirFiles::new(&self.work)).map_err(|d| {
            Error::Config(
                d.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })
    }

    /// A branch with `env` moved to `to`, as a person would write it; returns the PR number.
    /// Open a pull request appending `block` to `env`'s file.
    pub(super) fn open_edit_pr(
        &mut self,
        env: &str,
        block: &str,
        title: &str,
        at: DateTime<Utc>,
    ) -> Result<u32, Error> {
        self.pr += 1;
        let branch = format!("edit-{env}-{}", self.pr);
        git(&self.work, &["switch", "--quiet", "-c", &branch])?;
        let path = self.work.join(format!("{}/{env}.toml", config::ENV_DIR));
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str(block);
        std::fs::write(&path, text)?;
        git_at(&self.work, &["commit", "--quiet", "-am", title], Some(at))?;
        Ok(self.pr)
    }

    pub(super) fn open_pr(
        &mut self,
        env: &str,
        to: &Version,
        title: &str,
        at: DateTime<Utc>,
    ) -> Result<u32, Error> {
        self.pr += 1;
        let branch = format!("bump-{env}-{to}");
        git(&self.work, &["switch", "--quiet", "-c", &branch])?;
        let rel = format!("{}/{env}.toml", config::ENV_DIR);
        let path = self.work.join(&rel);
        let text = std::fs::read_to_string(&path)?;
        let new = promote::set_version(&text, to).map_err(Error::Config)?;
        std::fs::write(&path, new)?;
        git_at(&self.work, &["commit", "--quiet", "-am", title], Some(at))?;
        Ok(self.pr)
    }
}

pub(super) fn copy_dir(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dest)?;
        } else {
            std::fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

pub(super) fn path_str(p: &Path) -> Result<&str, Error> {
    p.to_str()
        .ok_or_else(|| Error::Config(format!("{} is not valid UTF-8", p.display())))
}

pub(super) fn short(oid: git2::Oid) -> String {
    oid.to_string().chars().take(8).collect()
}
