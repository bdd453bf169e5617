//! The verdict on one commit: through the one admission path
//! (`crate::admit`: trust → config → the one judgement of the span since
//! the applied commit), on the blocking pool, as the agent acts on it (a
//! config to apply, or a refusal and what it depends on). Which commit is
//! judged when, and what a verdict is kept for, is `admit.rs`'s.

use super::crd::Refused;
use super::{blocking, lock, Acting, ClusterBackend};
use crate::admit::{Rejection, Stage};
use crate::config::{self, EnvConfig};
use crate::gate::Reason;
use crate::trust::{self, AllowedSigners, OpenPgpKeys, Signers};
use chrono::{DateTime, Utc};
use git2::Oid;
use std::future::Future;

/// What judging a new head found.
pub(super) enum Verdict {
    Accept {
        env: Box<EnvConfig>,
        version: String,
        status_branch: String,
        progress_interval: std::time::Duration,
        revoked: Option<String>,
        revoked_versions: Vec<semver::Version>,
        waves: Vec<crate::gate::wave::Wave>,
    },
    Refuse(Refusal),
}

/// A refusal and what it depends on.
#[derive(Clone, Debug)]
pub(super) struct Refusal {
    pub(super) refused: Refused,
    /// The version the refused commit pins, when readable.
    pub(super) version: Option<semver::Version>,
    /// Whether the verdict read the status store (a gate verdict).
    pub(super) reads_store: bool,
    /// When the verdict changes by itself (a soak passes).
    pub(super) until: Option<DateTime<Utc>>,
    /// What a trusted head the gate refused revokes (`Rejection::revokes`).
    pub(super) revokes: Vec<(semver::Version, String)>,
}

impl Refusal {
    /// The refusal as the status shows it.
    pub(super) fn refused(&self) -> &Refused {
        &self.refused
    }

    /// The version the refused commit pins, when readable.
    pub(super) fn version(&self) -> Option<&semver::Version> {
        self.version.as_ref()
    }
}

impl<B: ClusterBackend> Acting<B> {
    /// Trust, then config, then the one judgement of the span from the
    /// applied commit to `head` (`crate::admit`); with `adopt`, trust and
    /// config only (the nodes already run the version: nothing moves).
    pub(super) fn evaluate(
        &self,
        head: Oid,
        applied: Option<Oid>,
        adopt: bool,
    ) -> impl Future<Output = Verdict> + Send + 'static {
        let how = match (adopt, applied) {
            (true, _) => How::Adopt,
            (false, applied) => How::Span(applied),
        };
        self.admit(head, how)
    }

    /// The commit a person named, `named`, with `head` fetched
    /// (`crate::admit::admit_named`), given the nodes as `nodes_view` saw them.
    pub(super) fn evaluate_named(
        &self,
        named: Oid,
        head: Oid,
        nodes: Option<(bool, Option<semver::Version>)>,
    ) -> impl Future<Output = Verdict> + Send + 'static {
        let (adopt, highest) = nodes.unwrap_or((false, None));
        self.admit(
            named,
            How::Named {
                head,
                adopt,
                highest,
            },
        )
    }

    /// `commit` through the admission `how` says.
    fn admit(&self, head: Oid, how: How) -> impl Future<Output = Verdict> + Send + 'static {
        self.edges.metrics.admissions.inc();
        let src = self.source.clone();
        let env_name = self.cfg.env.clone();
        let mode = self.cfg.verify;
        let signers_path = self.cfg.allowed_signers.clone();
        let openpgp_path = self.cfg.openpgp_keys.clone();
        let now = self.clock.now();
        let head_s = head.to_string();
        let flag = self.cfg.status_branch.clone();
        let refuse = move |stage: &str, reason: &str, message: String, version| {
            Verdict::Refuse(Refusal {
                refused: Refused {
                    commit: head_s.clone(),
                    stage: stage.into(),
                    reason: reason.into(),
                    message,
                },
                version,
                reads_store: false,
                until: None,
                revokes: Vec::new(),
            })
        };
        let refuse2 = refuse.clone();
        let work = blocking(move || {
            let s = lock(&src);
            let repo = s.repo();
            // Re-read for every head, so a rotated Secret counts at once.
            let loaded = match mode {
                trust::Mode::Off => Ok(Default::default()),
                _ => load_signers(signers_path.as_deref(), openpgp_path.as_deref()),
            };
            let (ssh, openpgp) = match loaded {
                Ok(x) => x,
                Err(e) => return refuse("trust", "signers", e, None),
            };
            // Keys are also judged at when this cache first fetched each commit.
            let seen = s.seen();
            let first_seen = |oid| seen.first_seen(oid).unwrap_or(now.timestamp());
            let trusted = crate::admit::TrustCheck {
                mode,
                signers: Signers {
                    ssh: &ssh,
                    openpgp: &openpgp,
                },
                first_seen: &first_seen,
            };
            let admitted = match &how {
                How::Adopt => crate::admit::admit_adoption(repo, head, &env_name, &trusted, now),
                How::Span(applied) => {
                    crate::admit::admit_head(repo, *applied, head, &env_name, &trusted, now)
                }
                How::Named {
                    head: fetched,
                    adopt,
                    highest,
                } => crate::admit::admit_named(
                    repo,
                    head,
                    *fetched,
                    &env_name,
                    &trusted,
                    (*adopt, highest.as_ref()),
                    now,
                ),
            };
            match admitted {
                Ok(a) => {
                    let Some(env) = a.snapshot.config.envs.get(&env_name).cloned() else {
                        return refuse(
                            "config",
                            "unknown_env",
                            format!("no environment {env_name}"),
                            None,
                        );
                    };
                    let branch = a.snapshot.policy.status_branch.clone();
                    if let Some(flag) = flag.as_ref().filter(|f| **f != branch) {
                        return refuse(
                            "config",
                            "status_branch_mismatch",
                            format!(
                                "--status-branch is {flag:?} but [promotion] status_branch of the config is {branch:?}; the config owns the status branch: drop the flag or make them agree"
                            ),
                            Some(env.version),
                        );
                    }
                    let revoked = revoked_reason(&a.snapshot.config, &env);
                    Verdict::Accept {
                        revoked_versions: revoked_versions(&a.snapshot.config),
                        waves: crate::gate::wave::waves(&a.snapshot.config, &env_name),
                        version: env.version.to_string(),
                        env: Box::new(env),
                        status_branch: branch,
                        progress_interval: a.snapshot.config.root.progress_interval,
                        revoked,
                    }
                }
                Err(r) => Verdict::Refuse(refusal_of(&head.to_string(), r)),
            }
        });
        async move {
            work.await
                .unwrap_or_else(|| refuse2("trust", "error", "the check task failed".into(), None))
        }
    }
}

/// Which admission a commit goes through.
enum How {
    /// The one judgement of the span from the applied commit (`None`: none).
    Span(Option<Oid>),
    /// Adoption: trust over the whole history and a valid config.
    Adopt,
    /// A commit a person named, with the fetched `head` whose policy judges it.
    Named {
        head: Oid,
        adopt: bool,
        highest: Option<semver::Version>,
    },
}

/// The agent's refusal of `commit` from the admission's rejection.
fn refusal_of(commit: &str, r: Rejection) -> Refusal {
    let until = r.refusal.as_ref().and_then(|g| match &g.reason {
        Reason::Soaking { passes_at, .. } | Reason::HistorySoaking { passes_at, .. } => {
            Some(*passes_at)
        }
        _ => None,
    });
    Refusal {
        reads_store: r.stage == Stage::Gate,
        until,
        version: r.version,
        revokes: r.revokes.into_vec(),
        refused: Refused {
            commit: commit.to_owned(),
            stage: r.stage.as_str().into(),
            reason: r.code,
            message: r.message,
        },
    }
}

/// Why `env`'s pinned version is revoked by `cfg`'s `[promotion] revoked`,
/// if it is (every build-metadata variant of a revoked version is).
pub(super) fn revoked_reason(cfg: &config::RepoConfig, env: &EnvConfig) -> Option<String> {
    cfg.root
        .revoked
        .iter()
        .find(|r| crate::gate::revokes(&r.version, &env.version))
        .map(|r| r.reason.clone())
}

/// Every version `cfg`'s `[promotion] revoked` lists: the policy in
/// force's, which a rollback is checked against when it starts.
pub(super) fn revoked_versions(cfg: &config::RepoConfig) -> Vec<semver::Version> {
    cfg.root.revoked.iter().map(|r| r.version.clone()).collect()
}

/// The signer files the agent is configured with; at least one must be.
fn load_signers(
    ssh: Option<&std::path::Path>,
    openpgp: Option<&std::path::Path>,
) -> Result<(AllowedSigners, OpenPgpKeys), String> {
    if ssh.is_none() && openpgp.is_none() {
        return Err("no allowed-signers file and no OpenPGP key file".into());
    }
    let ssh = ssh
        .map(AllowedSigners::load)
        .transpose()
        .map_err(|e| e.to_string())?;
    let openpgp = openpgp
        .map(OpenPgpKeys::load)
        .transpose()
        .map_err(|e| e.to_string())?;
    Ok((ssh.unwrap_or_default(), openpgp.unwrap_or_default()))
}
