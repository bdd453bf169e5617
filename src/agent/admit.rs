//! Stage 2, admit: whether a new head replaces the applied commit (each
//! commit judged by `verdict.rs`, through the one admission path);
//! recovery of the applied commit when none is recorded; loading the
//! applied config. Admission returns what it decided ([`Admission`],
//! [`Recovery`]) and never writes the status: `recorded.rs` does.
//!
//! A refusal is kept as state ([`Kept`]): judged once, then reused, with
//! one Event and a stable `since`, until something it depends on changes:
//! the head, the applied commit, the status store the gate read (other
//! clusters' branches; this cluster's own reports are never its evidence),
//! or the instant the verdict changes by itself (a soak that passes). The
//! gate depends on nothing else: windows and freezes decide when nodes
//! start, never whether a version may be taken.

use super::crd::Refused;
use super::events::Severity;
use super::recorded::Applied;
use super::verdict::{revoked_reason, revoked_versions, Refusal, Verdict};
use super::{blocking, lock, recover, short, Acting, Active, ClusterBackend};
use crate::cluster::Cluster;
use crate::config::{self, EnvConfig};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};

/// A refusal kept as state: the verdict for `head` over `applied`.
#[derive(Clone, Debug)]
pub(super) struct Kept {
    head: Oid,
    applied: Option<Oid>,
    /// The status store as the verdict read it (see [`store_state`]).
    store: u64,
    refusal: Refusal,
}

impl Kept {
    /// Whether this verdict still stands for `head` over `applied` at `now`.
    fn holds(&self, head: Oid, applied: Option<Oid>, store: u64, now: DateTime<Utc>) -> bool {
        self.head == head
            && self.applied == applied
            && (!self.refusal.reads_store || self.store == store)
            && self.refusal.until.is_none_or(|t| now < t)
    }
}

/// What admission admitted: `admit.rs` alone writes it. A term that takes
/// the status object as its starting point hands it the annotation read
/// and whether the applied commit moved ([`Admitted::adopt`]).
#[derive(Default)]
pub(super) struct Admitted {
    /// The applied config (`None`: none loaded yet, or none applicable).
    pub(super) active: Option<Active>,
    /// The refusal kept as state until what it depends on changes.
    pub(super) kept: Option<Kept>,
    /// The commit a person confirmed through `recover::TRUST_ANNOTATION`.
    pub(super) trust_annotation: Option<String>,
}

impl Admitted {
    /// The applied config as it is in force: with what a trusted newer
    /// head that the gate refused revokes. A revocation only stops, so it
    /// is not held back with the rest of a refused head: a version revoked
    /// and a new one pinned within one poll are refused together as one
    /// span that changes the policy and the pin, and the agent went on
    /// moving nodes to the version just revoked (simulation seed 514). An
    /// untrusted head's revocations never count (its refusal lists none).
    pub(super) fn in_force(&self) -> Option<Active> {
        let mut active = self.active.clone()?;
        let Some(k) = self
            .kept
            .as_ref()
            .filter(|k| k.applied == Some(active.commit))
        else {
            return Some(active);
        };
        for (v, why) in &k.refusal.revokes {
            if !active.revoked_versions.contains(v) {
                active.revoked_versions.push(v.clone());
            }
            if active.revoked.is_none() && crate::gate::revokes(v, &active.env.version) {
                active.revoked = Some(format!(
                    "{why} (in {:.12}, a signed change the gate refused)",
                    k.head.to_string()
                ));
            }
        }
        Some(active)
    }

    /// The status object as read is the starting point: its trust
    /// annotation, and no applied config if its applied commit is another.
    pub(super) fn adopt(&mut self, trust_annotation: Option<String>, applied_moved: bool) {
        self.trust_annotation = trust_annotation;
        if applied_moved {
            self.active = None;
        }
    }
}

/// What recovery found when no last applied commit is recorded.
pub(super) enum Recovery {
    /// The commit to start from, the version it pins when its config
    /// loads, and the annotation that named it (to be removed once the
    /// commit is applied).
    Found {
        commit: Oid,
        version: Option<String>,
        named: Option<String>,
    },
    /// The commit a person named may not be trusted, and why.
    Refused(Refusal),
    /// Nothing: adopt the head if the nodes already run it.
    Nothing,
}

/// What admission made of the newest head, for the status's one writer
/// (`recorded.rs`) to record; admission itself never writes the status.
pub(super) enum Admission {
    /// No head fetched in this term: nothing to record.
    Unjudged,
    /// The head is the applied commit: no refusal stands.
    Current,
    /// The head is refused.
    Refused(Refusal),
    /// The head replaces the applied commit, once that is durable.
    Accepted(Box<Accepted>),
}

/// A head accepted: the config to apply and the version it pins.
pub(super) struct Accepted {
    pub(super) version: String,
    pub(super) active: Active,
}

impl Accepted {
    /// What the status records of it.
    pub(super) fn applied(&self) -> Applied {
        Applied::Accepted {
            commit: self.active.commit,
            version: self.version.clone(),
        }
    }
}

impl<B: ClusterBackend> Acting<B> {
    /// The applied commit the status records.
    pub(super) fn applied_commit(&self) -> Option<Oid> {
        self.told
            .status()
            .last_applied_commit
            .as_deref()
            .and_then(|s| Oid::from_str(s).ok())
    }

    /// Without a recorded applied commit: the commit to start from, found
    /// from `head` (see [`Acting::recover`]).
    pub(super) async fn recover_applied(&mut self, head: Oid) -> Recovery {
        match self.recover(head).await {
            Recovery::Found { commit, named, .. } => {
                let version = self
                    .load_active(commit)
                    .await
                    .map(|a| a.env.version.to_string());
                Recovery::Found {
                    commit,
                    version,
                    named,
                }
            }
            other => other,
        }
    }

    /// Whether `head` replaces the applied commit (`adopt`: none is
    /// recorded or recovered, adopt the head if the nodes already run it);
    /// loads the applied config.
    pub(super) async fn admit_head(&mut self, head: Option<Oid>, adopt: bool) -> Admission {
        let applied = self.applied_commit();
        // A commit named while one is applied is never used: it is removed,
        // so that it cannot outrank the agent's own record later.
        if let (Some(_), Some(value)) = (applied, self.admitted.trust_annotation.clone()) {
            self.edges
                .events
                .on_status(
                    Severity::Warning,
                    "TrustCommitIgnored",
                    "Recover",
                    format!(
                        "{} ignored: the agent has an applied commit and starts from it",
                        recover::TRUST_ANNOTATION
                    ),
                )
                .await;
            self.consume_annotation(&value, "ignored").await;
            self.admitted.trust_annotation = None;
        }
        if self.admitted.active.is_none() {
            if let Some(commit) = applied {
                self.admitted.active = self.load_active(commit).await;
            }
        }
        let Some(head) = head else {
            return Admission::Unjudged;
        };
        if Some(head) == applied && self.admitted.active.is_some() {
            return Admission::Current;
        }
        let verdict = match self.kept_refusal(head, applied).await {
            Some(r) => Verdict::Refuse(r),
            None if adopt => self.evaluate_adoption(head).await,
            None => self.judged(head, applied).await,
        };
        match verdict {
            Verdict::Refuse(r) => Admission::Refused(r),
            Verdict::Accept {
                env,
                version,
                status_branch,
                progress_interval,
                revoked,
                revoked_versions,
                waves,
            } => {
                let here = env.for_cluster(&self.cfg.cluster);
                Admission::Accepted(Box::new(Accepted {
                    version,
                    active: Active {
                        commit: head,
                        failure_budget: env.rollout.failure_budget,
                        calendar: Active::calendar_of(&here),
                        env: here,
                        status_branch,
                        progress_interval,
                        revoked,
                        revoked_versions,
                        waves,
                    },
                }))
            }
        }
    }

    /// Act on `accepted` once the status holds it durably: the cache
    /// follows its status branch and takes its head, and its config is the
    /// applied one.
    pub(super) async fn take(&mut self, accepted: Accepted) {
        let Accepted { version, active } = accepted;
        let head = active.commit;
        let src = self.source.clone();
        let branch = active.status_branch.clone();
        let _ = blocking(move || {
            let mut s = lock(&src);
            s.set_status_branch(&branch);
            s.accept(head)
        })
        .await;
        self.admitted.kept = None;
        self.admitted.active = Some(active);
        self.edges.metrics.set_blocked(None);
        self.edges.metrics.set_applied(&head.to_string(), &version);
        self.edges
            .events
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

    /// The kept refusal of `head` over `applied`, if it still stands.
    async fn kept_refusal(&mut self, head: Oid, applied: Option<Oid>) -> Option<Refusal> {
        let kept = self.admitted.kept.clone()?;
        let store = self.store_state().await;
        if kept.holds(head, applied, store, self.clock.now()) {
            return Some(kept.refusal);
        }
        self.admitted.kept = None;
        None
    }

    /// Judge `head` over `applied` and keep a refusal (not one for want of
    /// trusted state: that depends on the nodes, which change on their own).
    async fn judged(&mut self, head: Oid, applied: Option<Oid>) -> Verdict {
        let store = self.store_state().await;
        let verdict = self.evaluate(head, applied, false).await;
        if let Verdict::Refuse(r) = &verdict {
            self.keep(head, applied, store, r);
        }
        verdict
    }

    fn keep(&mut self, head: Oid, applied: Option<Oid>, store: u64, r: &Refusal) {
        self.admitted.kept = Some(Kept {
            head,
            applied,
            store,
            refusal: r.clone(),
        });
    }

    /// The status store the gate reads, as one number: every status
    /// branch's tip but this cluster's own (see [`store_state`]). Other
    /// clusters' branches move only when a fetch ends, so it is read once
    /// after each fetch (and again when the policy names another status
    /// branch), not on every pass.
    pub(super) async fn store_state(&mut self) -> u64 {
        let branch = lock(&self.source).config().status_branch.clone();
        if let Some((b, state)) = &self.fetching.store {
            if *b == branch {
                return *state;
            }
        }
        let src = self.source.clone();
        let own = (self.cfg.env.clone(), self.cfg.cluster.clone());
        let at = branch.clone();
        let state = blocking(move || store_state(lock(&src).repo(), &at, (&own.0, &own.1)))
            .await
            .unwrap_or_default();
        self.fetching.store = Some((branch, state));
        state
    }

    /// Without a last applied commit: the one this agent's own signed
    /// reports name, else the one a person named (the annotation, else
    /// `--trust-commit`), by the one rule of `crate::admit::bootstrap`.
    async fn recover(&mut self, head: Oid) -> Recovery {
        if self.admitted.trust_annotation.is_none() {
            // Read again: the person may have annotated since the term began.
            if let Ok(obj) = self.status_object.load_or_create().await {
                self.admitted.trust_annotation = obj
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(recover::TRUST_ANNOTATION))
                    .cloned();
            }
        }
        let src = self.source.clone();
        let own = self
            .cfg
            .publish
            .signing_key
            .as_ref()
            .and_then(|k| recover::own_signers(k, &self.cfg.env, &self.cfg.cluster));
        let (env, cluster) = (self.cfg.env.clone(), self.cfg.cluster.clone());
        let now = self.clock.now();
        let found = blocking(move || {
            let s = lock(&src);
            let branch = s.config().status_branch.clone();
            recover::from_own_reports(s.repo(), &branch, &env, &cluster, own.as_ref()?, now)
        })
        .await
        .flatten();
        if let Some(commit) = found {
            // The agent's own record outranks any commit a person named.
            if let Some(value) = self.admitted.trust_annotation.clone() {
                self.edges
                    .events
                    .on_status(
                        Severity::Warning,
                        "TrustCommitIgnored",
                        "Recover",
                        format!(
                            "{} names {}, ignored: this cluster's own signed report names {}, \
                             and the agent starts from that",
                            recover::TRUST_ANNOTATION,
                            value.trim().chars().take(64).collect::<String>(),
                            short(&commit.to_string())
                        ),
                    )
                    .await;
                self.consume_annotation(&value, "ignored").await;
            } else if let Some(flag) = &self.cfg.trust_commit {
                tracing::warn!(flag = %flag, "--trust-commit ignored: this cluster has a signed report of its own");
            }
            self.recovered(commit, head, "recovered from this cluster's signed reports")
                .await;
            return Recovery::Found {
                commit,
                version: None,
                named: None,
            };
        }
        let named = self
            .admitted
            .trust_annotation
            .clone()
            .map(|v| (v, true))
            .or_else(|| self.cfg.trust_commit.clone().map(|v| (v, false)));
        if let Some((value, annotated)) = named {
            return match self.named(&value, head).await {
                Ok(commit) => {
                    self.recovered(commit, head, "named by a person").await;
                    Recovery::Found {
                        commit,
                        version: None,
                        named: annotated.then_some(value),
                    }
                }
                Err(r) => {
                    // Read the annotation again next time: the person may correct it.
                    self.admitted.trust_annotation = None;
                    Recovery::Refused(r)
                }
            };
        }
        Recovery::Nothing
    }

    /// Remove the trust annotation that says `value`, used or ignored, and
    /// say so; a failure leaves it, and it is tried again next time.
    pub(super) async fn consume_annotation(&mut self, value: &str, how: &str) {
        match self
            .status_object
            .remove_annotation(recover::TRUST_ANNOTATION, value)
            .await
        {
            Ok(()) => {
                self.admitted.trust_annotation = None;
                self.edges
                    .events
                    .on_status(
                        Severity::Normal,
                        "TrustCommitConsumed",
                        "Recover",
                        format!("{} removed ({how})", recover::TRUST_ANNOTATION),
                    )
                    .await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot remove the {} annotation", recover::TRUST_ANNOTATION)
            }
        }
    }

    async fn recovered(&mut self, commit: Oid, head: Oid, how: &str) {
        tracing::info!(commit = %commit, head = %head, "{how}");
        self.edges
            .events
            .on_status(
                Severity::Normal,
                "Recovered",
                "Recover",
                format!("last applied commit {} {how}", short(&commit.to_string())),
            )
            .await;
    }

    /// The commit a person named, if it may be the starting point: its full
    /// id, on the tracked branch, then admitted by `crate::admit::admit_named`
    /// (trusted from it, judged by the head's policy, the gate unless every
    /// selected node already runs its version).
    async fn named(&mut self, named: &str, head: Oid) -> Result<Oid, Refusal> {
        let src = self.source.clone();
        let (value, branch) = (named.to_owned(), self.cfg.source.branch.clone());
        let found = blocking(move || {
            let s = lock(&src);
            recover::annotated_commit(s.repo(), &value, head, &branch)
        })
        .await
        .unwrap_or_else(|| Err("the check task failed".into()));
        let commit = match found {
            Ok(c) => c,
            Err(message) => {
                return Err(Refusal {
                    refused: Refused {
                        commit: named.trim().chars().take(64).collect(),
                        stage: "trust".into(),
                        reason: "trust_commit".into(),
                        message,
                    },
                    version: None,
                    reads_store: false,
                    until: None,
                    revokes: Vec::new(),
                })
            }
        };
        if let Some(r) = self.kept_refusal(commit, None).await {
            return Err(r);
        }
        let store = self.store_state().await;
        let nodes = match self.load_active(commit).await {
            Some(a) => self.nodes_view(&a.env).await,
            None => None,
        };
        match self.evaluate_named(commit, head, nodes).await {
            Verdict::Accept { .. } => Ok(commit),
            Verdict::Refuse(r) => {
                self.keep(commit, None, store, &r);
                Err(r)
            }
        }
    }

    /// Whether every selected node of `env` already runs its version.
    async fn nodes_at(&mut self, env: &EnvConfig) -> bool {
        self.nodes_view(env).await.is_some_and(|(all, _)| all)
    }

    /// Whether every selected node of `env` already runs its version, and
    /// the highest version a selected node runs; `None` when the cluster
    /// cannot be observed.
    async fn nodes_view(&mut self, env: &EnvConfig) -> Option<(bool, Option<semver::Version>)> {
        if !self.ensure_cluster(env).await {
            return None;
        }
        let (_, c) = self.cluster.connected.as_ref()?;
        let nodes = c.cluster.observe().await.ok()?;
        Some((
            recover::adoptable(&nodes, &env.version),
            recover::highest(&nodes),
        ))
    }

    /// No trusted state: adopt the head when every selected node already
    /// runs the version it pins, otherwise refuse and say how to confirm one.
    async fn evaluate_adoption(&mut self, head: Oid) -> Verdict {
        let pinned = self.load_active(head).await;
        let adoptable = match &pinned {
            Some(a) => self.nodes_at(&a.env).await,
            None => false,
        };
        if adoptable {
            return match self.evaluate(head, None, true).await {
                // The history does not verify from its first commit (a
                // forge's first push is unsigned): say how to name one.
                Verdict::Refuse(mut r) if r.refused.stage == "trust" => {
                    r.refused.message = format!(
                        "{}; to start from a commit you reviewed instead (it and its \
                         ancestors are trusted, every later commit is verified): kubectl -n {} \
                         annotate droverstatus {} {}=<full commit id>",
                        r.refused.message,
                        self.cfg.namespace,
                        self.cfg.status_name,
                        recover::TRUST_ANNOTATION
                    );
                    Verdict::Refuse(r)
                }
                v => v,
            };
        }
        Verdict::Refuse(Refusal {
            refused: Refused {
                commit: head.to_string(),
                stage: "trust".into(),
                reason: "no_trusted_state".into(),
                message: recover::no_trusted_state(
                    &self.cfg.namespace,
                    &self.cfg.status_name,
                    &head.to_string(),
                ),
            },
            version: pinned.map(|a| a.env.version),
            reads_store: false,
            until: None,
            revokes: Vec::new(),
        })
    }

    // Not `async fn`: the future must not borrow `self` (Acting is not Sync).
    pub(super) fn load_active(
        &self,
        commit: Oid,
    ) -> impl Future<Output = Option<Active>> + Send + 'static {
        let src = self.source.clone();
        let env_name = self.cfg.env.clone();
        let cluster = self.cfg.cluster.clone();
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
            let env_here = env.for_cluster(&cluster);
            Some(Active {
                commit,
                failure_budget: env.rollout.failure_budget,
                calendar: Active::calendar_of(&env_here),
                env: env_here,
                waves: crate::gate::wave::waves(&cfg, &env_name),
                revoked_versions: revoked_versions(&cfg),
                status_branch: cfg.root.status_branch,
                progress_interval: cfg.root.progress_interval,
                revoked,
            })
        });
        async move { work.await.flatten() }
    }
}

/// The status store of `status_branch` as one number: every local and
/// `origin/` status branch (per-cluster and the single one) with its tip,
/// except `own`'s branch, whose reports are never evidence for its own
/// environment's gate (its pushes must not make a kept verdict stale).
pub(super) fn store_state(repo: &Repository, status_branch: &str, own: (&str, &str)) -> u64 {
    let own_branch = crate::status::cluster_branch(status_branch, own.0, own.1);
    let mut h = DefaultHasher::new();
    for prefix in ["refs/heads/", "refs/remotes/origin/"] {
        let Ok(refs) = repo.references_glob(&format!("{prefix}{status_branch}*")) else {
            continue;
        };
        for r in refs.flatten() {
            let Ok(name) = r.name() else { continue };
            if name[prefix.len()..] == own_branch {
                continue;
            }
            (name, r.target()).hash(&mut h);
        }
    }
    h.finish()
}
