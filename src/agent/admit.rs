//! Stage 2, admit: whether a new head replaces the applied commit, through
//! the one admission path (`crate::admit`: trust → config → gate); recovery
//! of the applied commit when none is recorded; loading the applied config.

use super::crd::Refused;
use super::events::Severity;
use super::{blocking, lock, recover, short, Acting, Active, ClusterBackend};
use crate::cluster::Cluster;
use crate::config::{self, EnvConfig};
use crate::trust::{self, AllowedSigners, OpenPgpKeys, Signers};
use git2::Oid;
use std::future::Future;

/// What judging a new head found.
enum Verdict {
    Accept {
        env: Box<EnvConfig>,
        version: String,
        status_branch: String,
        revoked: Option<String>,
    },
    Refuse(Refused, Option<semver::Version>),
}

impl<B: ClusterBackend> Acting<B> {
    /// Decide whether `head` replaces the applied commit; load the applied config.
    pub(super) async fn judge_head(&mut self, head: Option<Oid>) {
        let mut adopt = false;
        if self.crd_status.last_applied_commit.is_none() {
            if let Some(head) = head {
                match self.recover(head).await {
                    Some(commit) => {
                        self.crd_status.last_applied_commit = Some(commit.to_string());
                        self.crd_status.commit = Some(short(&commit.to_string()));
                        if let Some(a) = self.load_active(commit).await {
                            self.crd_status.applied_version = Some(a.env.version.to_string());
                        }
                        // Durable before acting on it, as for any applied commit.
                        if !self.write_crd_status().await {
                            self.crd_status.last_applied_commit = None;
                            return;
                        }
                    }
                    None => adopt = true,
                }
            }
        }
        let applied: Option<Oid> = self
            .crd_status
            .last_applied_commit
            .as_deref()
            .and_then(|s| Oid::from_str(s).ok());
        if self.active.is_none() {
            if let Some(commit) = applied {
                self.active = self.load_active(commit).await;
            }
        }
        let Some(head) = head else {
            return;
        };
        if Some(head) == applied && self.active.is_some() {
            self.set_refused(None).await;
            return;
        }
        let verdict = match &self.refused_cache {
            Some((c, r)) if *c == head => Verdict::Refuse(r.clone(), self.refused_version.clone()),
            _ if adopt => self.evaluate_adoption(head).await,
            _ => self.evaluate(head, applied, false).await,
        };
        match verdict {
            Verdict::Refuse(r, version) => {
                if r.stage != "gate" && r.reason != "no_trusted_state" {
                    self.refused_cache = Some((head, r.clone()));
                }
                self.refused_version = version;
                self.set_refused(Some(r)).await;
            }
            Verdict::Accept {
                env,
                version,
                status_branch,
                revoked,
            } => {
                let previous = self.crd_status.last_applied_commit.clone();
                if self.crd_status.applied_version.as_deref() != Some(version.as_str()) {
                    // A new target: the old counts and state say nothing about it.
                    self.crd_status.target = Some(version.clone());
                    self.crd_status.state = None;
                    self.crd_status.since = None;
                    self.crd_status.at_version = None;
                    self.crd_status.nodes_at_version = 0;
                }
                self.crd_status.last_applied_commit = Some(head.to_string());
                self.crd_status.applied_version = Some(version.clone());
                self.crd_status.commit = Some(short(&head.to_string()));
                self.crd_status.refused = None;
                // Durable before acting on it: a restart must resume from this commit.
                if !self.write_crd_status().await {
                    self.crd_status.last_applied_commit = previous;
                    return;
                }
                let src = self.source.clone();
                let branch = status_branch.clone();
                let _ = blocking(move || {
                    let mut s = lock(&src);
                    s.set_status_branch(&branch);
                    s.accept(head)
                })
                .await;
                self.refused_version = None;
                self.active = Some(Active {
                    commit: head,
                    env: *env,
                    status_branch,
                    revoked,
                });
                self.metrics.set_blocked(None);
                self.metrics.set_applied(&head.to_string(), &version);
                self.events
                    .on_status(
                        Severity::Normal,
                        "Applied",
                        "Apply",
                        format!(
                            "applying commit {} (version {version})",
                            short(&head.to_string())
                        ),
                    )
                    .await;
            }
        }
    }

    pub(super) async fn set_refused(&mut self, r: Option<Refused>) {
        let changed = self.crd_status.refused != r;
        self.metrics
            .set_blocked(r.as_ref().map(|r| (r.stage.as_str(), r.reason.as_str())));
        if changed {
            if let Some(r) = &r {
                self.events
                    .on_status(
                        Severity::Warning,
                        "Refused",
                        "Verify",
                        format!(
                            "commit {} not applied ({} check, {}): {}",
                            short(&r.commit),
                            r.stage,
                            r.reason,
                            r.message
                        ),
                    )
                    .await;
            }
        }
        self.crd_status.refused = r;
    }

    /// Without a last applied commit: the one a person confirmed, else the
    /// one this agent's own signed reports name (see [`recover`]).
    pub(super) async fn recover(&mut self, head: Oid) -> Option<Oid> {
        if self.trust_annotation.is_none() {
            // Read again: the person may have annotated since the term began.
            if let Ok(obj) = self.status_object.load_or_create().await {
                self.trust_annotation = obj
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(recover::TRUST_ANNOTATION))
                    .cloned();
            }
        }
        let src = self.source.clone();
        let named = self.trust_annotation.clone();
        let own = self
            .cfg
            .publish
            .signing_key
            .as_ref()
            .and_then(|k| recover::own_signers(k, &self.cfg.env, &self.cfg.cluster));
        let (env, cluster) = (self.cfg.env.clone(), self.cfg.cluster.clone());
        let found = blocking(move || {
            let s = lock(&src);
            let repo = s.repo();
            if let Some(c) = named.and_then(|n| repo.revparse_single(n.trim()).ok()) {
                return c
                    .peel_to_commit()
                    .ok()
                    .map(|c| (c.id(), "confirmed by a person"));
            }
            let branch = s.config().status_branch.clone();
            recover::from_own_reports(repo, &branch, &env, &cluster, own.as_ref()?)
                .map(|c| (c, "recovered from this cluster's signed reports"))
        })
        .await
        .flatten();
        let (commit, how) = found?;
        tracing::info!(commit = %commit, head = %head, "{how}");
        self.events
            .on_status(
                Severity::Normal,
                "Recovered",
                "Recover",
                format!("last applied commit {} {how}", short(&commit.to_string())),
            )
            .await;
        Some(commit)
    }

    /// No trusted state: adopt the head when every selected node already
    /// runs the version it pins, otherwise refuse and say how to confirm one.
    async fn evaluate_adoption(&mut self, head: Oid) -> Verdict {
        let pinned = self.load_active(head).await;
        let mut adoptable = false;
        if let Some(a) = &pinned {
            if self.ensure_cluster(&a.env).await {
                if let Some((_, c)) = &self.connected {
                    if let Ok(nodes) = c.cluster.observe().await {
                        adoptable = recover::adoptable(&nodes, &a.env.version);
                    }
                }
            }
        }
        if adoptable {
            return self.evaluate(head, None, true).await;
        }
        Verdict::Refuse(
            Refused {
                commit: head.to_string(),
                stage: "trust".into(),
                reason: "no_trusted_state".into(),
                message: recover::no_trusted_state(
                    &self.cfg.namespace,
                    &self.cfg.status_name,
                    &head.to_string(),
                ),
            },
            pinned.map(|a| a.env.version),
        )
    }

    // Not `async fn`: the future must not borrow `self` (Acting is not Sync).
    pub(super) fn load_active(
        &self,
        commit: Oid,
    ) -> impl Future<Output = Option<Active>> + Send + 'static {
        let src = self.source.clone();
        let env_name = self.cfg.env.clone();
        let work = blocking(move || {
            let mut s = lock(&src);
            let cfg = {
                let files = config::GitTreeFiles::at_rev(s.repo(), &commit.to_string()).ok()?;
                config::load(&files).ok()?
            };
            let env = cfg.envs.get(&env_name)?.clone();
            // The policy in force owns the status branch.
            s.set_status_branch(&cfg.root.status_branch);
            let revoked = revoked_reason(&cfg, &env);
            Some(Active {
                commit,
                env,
                status_branch: cfg.root.status_branch,
                revoked,
            })
        });
        async move { work.await.flatten() }
    }

    /// Trust, then config, then gate, for `head` over the applied commit:
    /// the one admission path (`crate::admit`), commit by commit.
    fn evaluate(
        &self,
        head: Oid,
        applied: Option<Oid>,
        adopt: bool,
    ) -> impl Future<Output = Verdict> + Send + 'static {
        let src = self.source.clone();
        let env_name = self.cfg.env.clone();
        let mode = self.cfg.verify;
        let signers_path = self.cfg.allowed_signers.clone();
        let openpgp_path = self.cfg.openpgp_keys.clone();
        let now = self.clock.now();
        let head_s = head.to_string();
        let flag = self.cfg.status_branch.clone();
        let refuse = move |stage: &str, reason: &str, message: String, version| {
            Verdict::Refuse(
                Refused {
                    commit: head_s.clone(),
                    stage: stage.into(),
                    reason: reason.into(),
                    message,
                },
                version,
            )
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
            let admitted = if adopt {
                crate::admit::admit_adoption(repo, head, &env_name, &trusted, now)
            } else {
                crate::admit::admit_head(repo, applied, head, &env_name, &trusted, now)
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
                        version: env.version.to_string(),
                        env: Box::new(env),
                        status_branch: branch,
                        revoked,
                    }
                }
                Err(r) => refuse(r.stage.as_str(), &r.code, r.message, r.version),
            }
        });
        async move {
            work.await
                .unwrap_or_else(|| refuse2("trust", "error", "the check task failed".into(), None))
        }
    }
}

/// Why `env`'s pinned version is revoked by `cfg`'s `[promotion] revoked`, if it is.
fn revoked_reason(cfg: &config::RepoConfig, env: &EnvConfig) -> Option<String> {
    cfg.root
        .revoked
        .iter()
        .find(|r| r.version == env.version)
        .map(|r| r.reason.clone())
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
