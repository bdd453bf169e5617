//! Admission's edges over a git repository: the status and history
//! evidence a judgement reads ([`GitEvidence`]), and the one judgement of a
//! span of commits ([`judge_span`]) that both `drover check --base` (a pull
//! request against its base, `base.rs`) and the agent (its new head against
//! its last applied commit, `head.rs`) call. A commit's config and policy
//! are read by `snapshot.rs`.

use super::history::lower_history;
use super::snapshot::{snapshot_recent, Snapshot};
use super::{judge_env, Change, Error, EvidenceSource, Policy};
use crate::config::{ENV_DIR, ROOT_FILE};
use crate::diag::Diagnostic;
use crate::gate::{Decision, LowerHistory};
use crate::status::{self, Confirmations, Ignored};
use crate::trust::AllowedSigners;
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use semver::Version;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Evidence read from the repository: status reports from the status
/// store, judged at `now` (a status commit dated ahead of it does not
/// count), history over the commits up to `base` only.
pub struct GitEvidence<'r> {
    repo: &'r Repository,
    base: Oid,
    now: DateTime<Utc>,
    /// Read the status store as it was at `now` (a past instant).
    as_of: bool,
    cache: Option<Read>,
}

/// One read of the status store: the branch and report signers it was read
/// with, the clusters whose branches it looked up.
struct Read {
    branch: String,
    signers: Option<String>,
    listed: status::Listed,
    conf: Confirmations,
}

/// Whether every cluster of `wanted` is in `read`.
fn covers(read: &status::Listed, wanted: &status::Listed) -> bool {
    wanted.iter().all(|(env, clusters)| {
        read.get(env)
            .is_some_and(|have| clusters.iter().all(|c| have.contains(c)))
    })
}

impl<'r> GitEvidence<'r> {
    /// Evidence in `repo` as a reader whose clock says `now`, with history
    /// counted up to `base`.
    pub fn new(repo: &'r Repository, base: Oid, now: DateTime<Utc>) -> Self {
        GitEvidence {
            repo,
            base,
            now,
            as_of: false,
            cache: None,
        }
    }

    /// Read the status store as it was at `now`, for a reader asking
    /// about a past instant (`status --now T`, `plan --now T`): the reports
    /// written after it are not read ([`status::Store::as_of`]).
    pub fn as_of(mut self) -> Self {
        self.as_of = true;
        self
    }

    /// The reports the last status read ignored, each named with why.
    pub fn ignored(&self) -> &[Ignored] {
        self.cache.as_ref().map_or(&[], |r| &r.conf.ignored)
    }

    /// The status store as read with `policy` (its branch, its report
    /// signers), the branches of every cluster its `[clusters]` lists.
    pub fn confirmations(&mut self, policy: &Policy) -> Result<&Confirmations, Error> {
        let all = policy.clusters.clone();
        self.read(policy, &all)
    }

    /// The status store as read with `policy`, at least the branches of
    /// the clusters its `[clusters]` lists for `envs`: a judgement reads
    /// only the environments its gates name, so a production bump does not
    /// verify test's reports.
    pub fn confirmations_of(
        &mut self,
        policy: &Policy,
        envs: &BTreeSet<String>,
    ) -> Result<&Confirmations, Error> {
        let wanted: status::Listed = policy
            .clusters
            .iter()
            .filter(|(e, _)| envs.contains(*e))
            .map(|(e, c)| (e.clone(), c.clone()))
            .collect();
        self.read(policy, &wanted)
    }

    /// The status store as read with `policy`, at least the branches of
    /// `wanted`: exactly the clusters asked about are looked up, whatever
    /// else the status namespace holds.
    pub fn confirmations_of_clusters(
        &mut self,
        policy: &Policy,
        wanted: &status::Listed,
    ) -> Result<&Confirmations, Error> {
        self.read(policy, wanted)
    }

    fn read(&mut self, policy: &Policy, wanted: &status::Listed) -> Result<&Confirmations, Error> {
        let same = self
            .cache
            .as_ref()
            .filter(|r| r.branch == policy.status_branch && r.signers == policy.signers_text);
        if !same.is_some_and(|r| covers(&r.listed, wanted)) {
            // Widened: clusters asked for later are read with the earlier ones.
            let mut listed = same.map(|r| r.listed.clone()).unwrap_or_default();
            for (env, clusters) in wanted {
                let have = listed.entry(env.clone()).or_default();
                for c in clusters {
                    if !have.contains(c) {
                        have.push(c.clone());
                    }
                }
            }
            let signers = match &policy.signers_text {
                Some(t) => Some(AllowedSigners::parse(t).map_err(|e| Error::Signers {
                    path: policy.report_signers.clone().unwrap_or_default(),
                    message: e.to_string(),
                })?),
                None => None,
            };
            let conf = status::read_confirmations_of(
                self.repo,
                &policy.status_branch,
                signers.as_ref().filter(|_| policy.report_signers.is_some()),
                self.now,
                status::Scope::Listed(&listed),
                self.as_of,
            );
            self.cache = Some(Read {
                branch: policy.status_branch.clone(),
                signers: policy.signers_text.clone(),
                listed,
                conf,
            });
        }
        Ok(&self.cache.as_ref().expect("filled above").conf)
    }
}

impl EvidenceSource for GitEvidence<'_> {
    fn status(
        &mut self,
        policy: &Policy,
        lower: &str,
        clusters: &[String],
        version: &Version,
    ) -> Result<super::StatusEvidence, Error> {
        let wanted = status::Listed::from([(lower.to_owned(), clusters.to_vec())]);
        let conf = self.confirmations_of_clusters(policy, &wanted)?;
        let found = conf.for_version(lower, version);
        let mut notes = BTreeMap::new();
        for c in clusters {
            if !found.contains_key(c) {
                if let Some(why) = conf.why_not(lower, c, version) {
                    notes.insert(c.clone(), why);
                }
            }
        }
        Ok(super::StatusEvidence {
            confirmations: found,
            notes,
            held: conf.held(lower, None),
        })
    }

    fn history(&mut self, lower: &str, version: &Version) -> Result<LowerHistory, Error> {
        let base = self.repo.find_commit(self.base)?;
        Ok(lower_history(
            self.repo,
            &base,
            &format!("{ENV_DIR}/{lower}.toml"),
            version,
        )?)
    }
}

/// One environment's verdict in a [`Judged`] span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvVerdict {
    /// The gate's decision (`Unchanged` when the span does not move its version).
    Decided(Decision),
    /// The environment is not in the chain that places it, so its version
    /// move cannot be judged: the chain of the policy in force.
    NotInChain(Vec<String>),
}

/// A span the one judgement could judge.
#[derive(Debug, Clone)]
pub struct Judged {
    /// The head's config and policy.
    pub head: Snapshot,
    /// The base's, when it has a config (else the head's policy is in force).
    pub base: Option<Snapshot>,
    /// Each environment of the head that was asked about, with its verdict.
    pub verdicts: Vec<(String, EnvVerdict)>,
    /// Status reports the evidence reads ignored, one line each (path, commit, why).
    pub warnings: Vec<String>,
}

impl Judged {
    /// The verdict for `env`, if the head has it and it was asked about.
    pub fn verdict(&self, env: &str) -> Option<&EnvVerdict> {
        self.verdicts.iter().find(|(e, _)| e == env).map(|(_, v)| v)
    }
}

/// What the one judgement found for a span.
#[derive(Debug, Clone)]
pub enum Judgement {
    /// The head's config is invalid: nothing is judged, nothing may be applied.
    HeadInvalid(Vec<Diagnostic>),
    /// The base's config is invalid: there is no policy in force to judge by.
    BaseInvalid {
        /// The base.
        base: Oid,
        /// Its first error.
        first: String,
    },
    /// Every asked environment judged (boxed: a snapshot is large).
    Judged(Box<Judged>),
}

/// The one judgement (docs/design.md §4): the span from `base` to `head`
/// judged as one change by the policy in force at `base`, whatever the
/// commits in between did (a split push is judged as the push it adds up
/// to). `drover check --base` and the agent both call it; the agent's base
/// is its last applied commit.
///
/// `base` `None`, or a base without `drover.toml`, makes the head the first
/// config, judged by its own policy. History evidence counts only the
/// commits up to the base (the head when there is none), never those the
/// span brings. `only` restricts the verdicts to one environment (each
/// environment is judged on its own, so this changes no verdict).
pub fn judge_span(
    repo: &Repository,
    base: Option<Oid>,
    head: Oid,
    only: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Judgement, Error> {
    let mut ev = GitEvidence::new(repo, base.unwrap_or(head), now);
    judge_span_with(repo, base, head, only, now, &mut ev)
}

/// [`judge_span`] reading the evidence through `ev` (made for `base`, or
/// `head` without one), which `check --base` reads again to name the
/// signed reports behind its verdicts without a second read of the store.
pub(super) fn judge_span_with(
    repo: &Repository,
    base: Option<Oid>,
    head: Oid,
    only: Option<&str>,
    now: DateTime<Utc>,
    ev: &mut GitEvidence<'_>,
) -> Result<Judgement, Error> {
    let after = match snapshot_recent(repo, head, now)? {
        Ok(s) => s,
        Err(d) => return Ok(Judgement::HeadInvalid(d)),
    };
    let before = match base {
        None => None,
        Some(b)
            if repo
                .find_commit(b)?
                .tree()?
                .get_path(Path::new(ROOT_FILE))
                .is_err() =>
        {
            None
        }
        Some(b) => match snapshot_recent(repo, b, now)? {
            Ok(s) => Some(s),
            Err(d) => {
                return Ok(Judgement::BaseInvalid {
                    base: b,
                    first: d.first().map(ToString::to_string).unwrap_or_default(),
                })
            }
        },
    };
    let change = Change {
        before: before.as_ref().map(|s| (&s.config, &s.policy)),
        after: (&after.config, &after.policy),
    };
    let in_force = change.before.map_or(&after.policy, |(_, p)| p);
    let mut verdicts = Vec::new();
    for env in after.config.envs.keys() {
        if only.is_some_and(|o| o != env) {
            continue;
        }
        let verdict = match judge_env(change, env, ev, now) {
            Ok(d) => EnvVerdict::Decided(d),
            Err(Error::NotInChain(_)) => EnvVerdict::NotInChain(in_force.chain.clone()),
            Err(e) => return Err(e),
        };
        verdicts.push((env.clone(), verdict));
    }
    let warnings = ev.ignored().iter().map(ToString::to_string).collect();
    Ok(Judgement::Judged(Box::new(Judged {
        head: after,
        base: before,
        verdicts,
        warnings,
    })))
}
