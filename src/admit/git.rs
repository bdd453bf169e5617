//! Admission's edges over a git repository: configs and policies read at a
//! commit, status and history evidence, and the one judgement of a span of
//! commits ([`judge_span`]) that both `drover check --base` (a pull request
//! against its base) and the agent (its new head against its last applied
//! commit) call.

use super::history::lower_history;
use super::{judge_env, reason_code, Change, Error, EvidenceSource, Policy};
use crate::config::{self, RepoConfig, ENV_DIR, ROOT_FILE};
use crate::diag::Diagnostic;
use crate::gate::{Decision, LowerHistory};
use crate::status::{self, Confirmations, Ignored};
use crate::trust::{self, AllowedSigners};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository, Tree};
use semver::Version;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

/// A commit's config and policy.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The commit.
    pub commit: Oid,
    /// Its validated config.
    pub config: RepoConfig,
    /// Its promotion policy.
    pub policy: Policy,
}

fn read_small(repo: &Repository, tree: &Tree<'_>, path: &str) -> Result<Option<String>, String> {
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return Ok(None);
    };
    let odb = repo.odb().map_err(|e| e.to_string())?;
    let (size, _) = odb.read_header(entry.id()).map_err(|e| e.to_string())?;
    // Bounded as a config file is: one line per cluster of the fleet.
    if size as u64 > config::MAX_FILE_BYTES {
        return Err(format!(
            "{size} bytes; an allowed-signers file may have at most {} KiB",
            config::MAX_FILE_BYTES / 1024
        ));
    }
    let blob = repo.find_blob(entry.id()).map_err(|e| e.to_string())?;
    String::from_utf8(blob.content().to_vec())
        .map(Some)
        .map_err(|_| "not UTF-8".to_string())
}

/// A diagnostic at the value of `[promotion] key` in `drover.toml`'s
/// `text`, or at the `[promotion]` table when the key is not written (its
/// default is what is wrong), or at the file when neither can be found.
pub fn at_promotion_key(text: Option<&str>, key: &str, message: String) -> Diagnostic {
    let at = text.and_then(|text| {
        let doc = toml::de::DeTable::parse(text).ok()?;
        let (table_key, table) = doc
            .get_ref()
            .iter()
            .find(|(k, _)| k.get_ref() == "promotion")?;
        let toml::de::DeValue::Table(t) = table.get_ref() else {
            return Some(table_key.span().start);
        };
        Some(
            t.iter()
                .find(|(k, _)| k.get_ref() == key)
                .map_or(table_key.span().start, |(_, v)| v.span().start),
        )
    });
    match (text, at) {
        (Some(text), Some(at)) => Diagnostic::at(ROOT_FILE, text, at, message),
        _ => Diagnostic::file(ROOT_FILE, message),
    }
}

fn missing_signers(root_text: Option<&str>, path: &str) -> Diagnostic {
    at_promotion_key(
        root_text,
        "report_signers",
        format!(
            "report_signers names {path}, which does not exist in the repository; \
             it must be an allowed-signers file naming each cluster's key as <env>/<cluster>"
        ),
    )
}

/// `[promotion] report_signers` as `drover check` validates it
/// (docs/design.md §2): with `evidence = "status"` and an environment to
/// gate (a chain of two or more), it is required, and the file it names
/// must exist, be readable, and hold valid allowed-signers lines. Each
/// problem is at the key's line of `drover.toml`, or at the file's line.
pub fn check_report_signers(files: &dyn config::Files, cfg: &RepoConfig) -> Vec<Diagnostic> {
    let root_text = files
        .read(ROOT_FILE)
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok());
    let root = root_text.as_deref();
    let Some(path) = &cfg.root.report_signers else {
        if cfg.root.evidence == config::Evidence::Status && cfg.root.chain.len() > 1 {
            return vec![at_promotion_key(
                root,
                "evidence",
                "evidence = \"status\" needs `report_signers` in [promotion]: the path of an \
                 allowed-signers file naming each cluster's key as <env>/<cluster>, such as \
                 report_signers = \"agents.allowed_signers\"; without it no status report can \
                 count and every gate refuses"
                    .to_owned(),
            )];
        }
        return Vec::new();
    };
    let text = match files.read(path) {
        // Bounded as a config file is: one line per cluster of the fleet.
        Ok(Some(bytes)) if bytes.len() as u64 > config::MAX_FILE_BYTES => Err(format!(
            "{} bytes; an allowed-signers file may have at most {} KiB",
            bytes.len(),
            config::MAX_FILE_BYTES / 1024
        )),
        Ok(Some(bytes)) => String::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned()),
        Ok(None) => return vec![missing_signers(root, path)],
        Err(why) => Err(why),
    };
    match text {
        Err(why) => vec![at_promotion_key(
            root,
            "report_signers",
            format!("report_signers names {path}, which cannot be read: {why}"),
        )],
        Ok(text) => match AllowedSigners::parse(&text) {
            Err(trust::Error::Signers { line, message, .. }) => vec![Diagnostic {
                file: path.clone(),
                line,
                column: 1,
                message: format!("not a valid allowed-signers line: {message}"),
            }],
            _ => Vec::new(),
        },
    }
}

/// The config and policy at `commit`; `Ok(Err(..))` when its config is invalid.
pub fn snapshot(
    repo: &Repository,
    commit: Oid,
    now: DateTime<Utc>,
) -> Result<Result<Snapshot, Vec<Diagnostic>>, Error> {
    let tree = repo.find_commit(commit)?.tree()?;
    let files = config::GitTreeFiles::new(repo, tree.clone());
    let config = match config::load_at(&files, now) {
        Ok(c) => c,
        Err(d) => return Ok(Err(d)),
    };
    let signers_text = match &config.root.report_signers {
        None => None,
        Some(path) => match read_small(repo, &tree, path) {
            Ok(Some(t)) => Some(t),
            Ok(None) => {
                let root = read_small(repo, &tree, ROOT_FILE).ok().flatten();
                return Ok(Err(vec![missing_signers(root.as_deref(), path)]));
            }
            Err(why) => return Ok(Err(vec![Diagnostic::file(path.clone(), why)])),
        },
    };
    if let (Some(path), Some(text)) = (&config.root.report_signers, &signers_text) {
        if let Err(trust::Error::Signers { line, message, .. }) = AllowedSigners::parse(text) {
            return Ok(Err(vec![Diagnostic {
                file: path.clone(),
                line,
                column: 1,
                message: format!("not a valid allowed-signers line: {message}"),
            }]));
        }
    }
    let policy = Policy::of(&config, signers_text);
    Ok(Ok(Snapshot {
        commit,
        config,
        policy,
    }))
}

/// Configs [`judge_span`] read lately, by commit. A commit id names its
/// tree and so its config exactly, so an entry never goes stale, whatever
/// repository it came from; the agent judges each new head over the same
/// last applied commit and reads that config once, not once per head.
const RECENT_SNAPSHOTS: usize = 8;

type Loaded = Result<Snapshot, Vec<Diagnostic>>;

static RECENT: std::sync::Mutex<std::collections::VecDeque<(Oid, Loaded)>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

/// [`snapshot`], through [`RECENT`].
pub(super) fn snapshot_recent(
    repo: &Repository,
    commit: Oid,
    now: DateTime<Utc>,
) -> Result<Loaded, Error> {
    let recent = || RECENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, hit)) = recent().iter().find(|(c, _)| *c == commit) {
        return Ok(hit.clone());
    }
    let loaded = snapshot(repo, commit, now)?;
    let mut r = recent();
    r.push_front((commit, loaded.clone()));
    r.truncate(RECENT_SNAPSHOTS);
    Ok(loaded)
}

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

/// What [`check_base`] found.
#[derive(Debug, Clone, Default)]
pub struct ChangeReport {
    /// One per refusal (at the `version` value), or per file that could not be judged.
    pub diagnostics: Vec<Diagnostic>,
    /// The verdict for each environment whose version changed.
    pub decisions: Vec<(String, Decision)>,
    /// Status reports that were ignored, one line each (path, commit, why).
    pub warnings: Vec<String>,
    /// The same reports as values, for a document.
    pub ignored: Vec<crate::status::Ignored>,
    /// Each judged environment's version before the change (absent: new).
    pub previous: BTreeMap<String, Version>,
    /// Where each confirmation the decisions name came from, so a reviewer
    /// sees the signed report behind a verdict, not only its time.
    pub sources: Vec<ConfirmationSource>,
    /// The status evidence the decisions needed: `None` when none needed
    /// any (history evidence, first environment, refused before the gate).
    pub status: Option<StatusRead>,
}

/// The status branches a judgement read.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatusRead {
    /// `[promotion] status_branch` of the policy in force.
    pub branch: String,
    /// The refs read: the per-cluster branches of the environments whose
    /// reports the decisions needed and the single branch of the older
    /// layout (local or `refs/remotes/origin/`); empty when none exists,
    /// which in CI usually means none was fetched.
    pub refs: Vec<String>,
}

/// One standing confirmation, as the status branch holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmationSource {
    /// The lower environment.
    pub env: String,
    /// Its cluster.
    pub cluster: String,
    /// The version confirmed.
    pub version: Version,
    /// When it counts from.
    pub at: DateTime<Utc>,
    /// The signed status commit that wrote it.
    pub status_commit: String,
    /// The config commit that cluster was applying.
    pub config_commit: String,
    /// The branch it was read from.
    pub branch: Option<String>,
    /// The SHA256 fingerprint of the key that signed it (listed for
    /// `<env>/<cluster>` in the report signers of the policy in force).
    pub signer: Option<String>,
}

/// A diagnostic at the `version` value of `environments/<env>.toml` in `tree`.
fn at_version(repo: &Repository, tree: &Tree<'_>, env: &str, msg: String) -> Diagnostic {
    let file = format!("{ENV_DIR}/{env}.toml");
    let text = read_small(repo, tree, &file)
        .ok()
        .flatten()
        .unwrap_or_default();
    let span = toml::de::DeTable::parse(&text).ok().and_then(|doc| {
        doc.get_ref()
            .iter()
            .find(|(k, _)| k.get_ref() == "version")
            .map(|(_, v)| v.span().start)
    });
    match span {
        Some(at) => Diagnostic::at(&file, &text, at, msg),
        None => Diagnostic::file(&file, msg),
    }
}

fn commit_of(repo: &Repository, rev: &str) -> Result<Oid, Error> {
    repo.revparse_single(rev)
        .and_then(|o| o.peel_to_commit())
        .map(|c| c.id())
        .map_err(|source| Error::Rev {
            rev: rev.to_owned(),
            source,
        })
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
fn judge_span_with(
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

/// `drover check --base REV`: the one judgement ([`judge_span`]) of the
/// span from `base` to what HEAD would land on it (`super::merge::landed`: HEAD itself
/// when it descends from `base`, else the merge of the two) in the
/// repository at `repo_path`; each refusal is a diagnostic at the `version`
/// key.
pub fn check_base(repo_path: &Path, base: &str, now: DateTime<Utc>) -> Result<ChangeReport, Error> {
    let repo = Repository::open(repo_path)?;
    let base_name = base;
    let base = commit_of(&repo, base)?;
    let tip = commit_of(&repo, "HEAD")?;
    let mut out = ChangeReport::default();
    let head = match super::merge::landed(&repo, base, tip, base_name)? {
        Ok(head) => head,
        Err(refused) => {
            out.diagnostics = refused;
            return Ok(out);
        }
    };
    let mut ev = GitEvidence::new(&repo, base, now);
    let judged = match judge_span_with(&repo, Some(base), head, None, now, &mut ev)? {
        Judgement::HeadInvalid(d) => {
            out.diagnostics.extend(d);
            return Ok(out);
        }
        Judgement::BaseInvalid { base, first } => {
            out.diagnostics.push(Diagnostic::file(
                ROOT_FILE,
                format!(
                    "the config at the base {:.10} is invalid, so there is no policy in force to judge version changes by: {first}",
                    base
                ),
            ));
            return Ok(out);
        }
        Judgement::Judged(j) => *j,
    };
    let head_tree = repo.find_commit(head)?.tree()?;
    for (env, verdict) in judged.verdicts {
        match verdict {
            EnvVerdict::Decided(Decision::Unchanged) => {}
            EnvVerdict::Decided(d) => {
                if let Decision::Refused(r) = &d {
                    out.diagnostics
                        .push(at_version(&repo, &head_tree, &env, r.to_string()));
                }
                out.decisions.push((env, d));
            }
            EnvVerdict::NotInChain(chain) => out.diagnostics.push(at_version(
                &repo,
                &head_tree,
                &env,
                format!(
                    "{env} is not in the promotion chain of {ROOT_FILE} ({}), so its version change cannot be judged",
                    chain.join(", ")
                ),
            )),
        }
    }
    out.warnings = judged.warnings;
    out.ignored = ev.ignored().to_vec();
    let policy = judged
        .base
        .as_ref()
        .map_or(&judged.head.policy, |b| &b.policy);
    for (env, _) in &out.decisions {
        if let Some(v) = judged.base.as_ref().and_then(|b| b.config.envs.get(env)) {
            out.previous.insert(env.clone(), v.version.clone());
        }
    }
    evidence_sources(&repo, policy, &mut ev, &mut out)?;
    Ok(out)
}

/// Fill `out.status` and `out.sources` for the decisions that read status
/// evidence: which branches were there, and each named confirmation's
/// signed report (one signature check per confirmation named).
fn evidence_sources(
    repo: &Repository,
    policy: &Policy,
    ev: &mut GitEvidence<'_>,
    out: &mut ChangeReport,
) -> Result<(), Error> {
    use crate::gate::{Basis, Reason};
    let mut named: Vec<(String, Version, String)> = Vec::new();
    // The environments whose reports the decisions read.
    let mut needed: BTreeSet<String> = BTreeSet::new();
    for (_, d) in &out.decisions {
        let (version, lower, confirmed) = match d {
            Decision::Allowed(a) => match &a.basis {
                Basis::Confirmed {
                    lower, confirmed, ..
                } => (&a.version, lower, confirmed),
                _ => continue,
            },
            Decision::Refused(r) => match &r.reason {
                Reason::NotConfirmed {
                    lower, confirmed, ..
                }
                | Reason::Soaking {
                    lower, confirmed, ..
                } => (&r.version, lower, confirmed),
                _ => continue,
            },
            Decision::Unchanged => continue,
        };
        needed.insert(lower.clone());
        for (cluster, _) in confirmed {
            named.push((lower.clone(), version.clone(), cluster.clone()));
        }
    }
    if needed.is_empty() {
        return Ok(());
    }
    let listed: status::Listed = policy
        .clusters
        .iter()
        .filter(|(e, _)| needed.contains(*e))
        .map(|(e, c)| (e.clone(), c.clone()))
        .collect();
    let store = status::find_store(repo, &policy.status_branch, status::Scope::Listed(&listed))
        .unwrap_or_default();
    let mut refs: Vec<String> = store
        .clusters
        .iter()
        .filter(|c| needed.contains(&c.env))
        .map(|c| c.branch.refname.clone())
        .collect();
    refs.extend(store.legacy.iter().map(|b| b.refname.clone()));
    out.status = Some(StatusRead {
        branch: policy.status_branch.clone(),
        refs,
    });
    let signers = match &policy.signers_text {
        Some(t) => AllowedSigners::parse(t).ok(),
        None => None,
    };
    let conf = ev.confirmations_of(policy, &needed)?;
    for (env, version, cluster) in named {
        let Some((_, _, _, standing)) = conf
            .standing()
            .find(|(e, c, v, _)| *e == env && *c == cluster && **v == version)
        else {
            continue;
        };
        let signer = signers.as_ref().and_then(|all| {
            let own = all.for_principal(&format!("{env}/{cluster}"));
            trust::verify_commit(repo, standing.status_commit, &own)
                .ok()
                .map(|v| v.fingerprint)
        });
        let branch = store
            .clusters
            .iter()
            .find(|c| c.env == env && c.cluster == cluster)
            .map(|c| c.branch.refname.clone())
            .or_else(|| store.legacy.as_ref().map(|b| b.refname.clone()));
        out.sources.push(ConfirmationSource {
            env,
            cluster,
            version,
            at: standing.at,
            status_commit: standing.status_commit.to_string(),
            config_commit: standing.config_commit.clone(),
            branch,
            signer,
        });
    }
    Ok(())
}

/// Which check refused a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Signatures and ancestry (docs/design.md §6).
    Trust,
    /// Config validation.
    Config,
    /// The promotion gate (docs/design.md §4).
    Gate,
}

impl Stage {
    /// `trust`, `config` or `gate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Trust => "trust",
            Stage::Config => "config",
            Stage::Gate => "gate",
        }
    }
}

/// Why a head was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The check that refused.
    pub stage: Stage,
    /// Machine-readable reason (`unsigned`, `invalid`, `not_confirmed`, ...).
    pub code: String,
    /// One line for people.
    pub message: String,
    /// The version the refused head pins for the environment, when readable.
    pub version: Option<Version>,
    /// The gate's refusal, when the gate refused.
    pub refusal: Option<Box<crate::gate::Refusal>>,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} check ({}): {}",
            self.stage.as_str(),
            self.code,
            self.message
        )
    }
}

/// A head the agent may apply.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The head's config and policy.
    pub snapshot: Snapshot,
    /// The gate's verdict for the environment over the whole path.
    pub decision: Decision,
}

pub(super) fn reject(stage: Stage, code: &str, message: String) -> Rejection {
    Rejection {
        stage,
        code: code.into(),
        message,
        version: None,
        refusal: None,
    }
}

/// What the trust check of an admission needs (docs/design.md §6).
#[derive(Clone, Copy)]
pub struct TrustCheck<'a> {
    /// `off`, `head` or `all`.
    pub mode: trust::Mode,
    /// The signers the agent was configured with (SSH and OpenPGP keys).
    pub signers: trust::Signers<'a>,
    /// When this cache first fetched a commit (Unix seconds), so a key's
    /// validity is judged at that time as well as at the commit's.
    pub first_seen: &'a dyn Fn(Oid) -> i64,
}

/// The trust stage's rejection of `e`.
pub(super) fn trust_rejection(e: trust::Error) -> Rejection {
    match e {
        trust::Error::Refused(r) => reject(Stage::Trust, r.reason.code(), r.to_string()),
        e => reject(Stage::Trust, "error", e.to_string()),
    }
}

impl TrustCheck<'_> {
    pub(super) fn check(
        &self,
        repo: &Repository,
        last: Option<Oid>,
        head: Oid,
    ) -> Result<trust::Checked, trust::Error> {
        trust::check(repo, self.mode, self.signers, last, head, self.first_seen)
    }
}

/// The agent's admission of `head` for `env` over `last`, its last applied
/// commit (`None`: nothing applied yet): trust over every commit of the
/// span (docs/design.md §6), then the one judgement of the span
/// ([`judge_span`]), exactly as `drover check --base <last>` judges it: the
/// agent never applies a version move that check refuses.
pub fn admit_head(
    repo: &Repository,
    last: Option<Oid>,
    head: Oid,
    env: &str,
    trusted: &TrustCheck<'_>,
    now: DateTime<Utc>,
) -> Result<Admitted, Rejection> {
    match trusted.check(repo, last, head) {
        Ok(_) => {}
        Err(trust::Error::Refused(r)) => {
            return Err(reject(Stage::Trust, r.reason.code(), r.to_string()))
        }
        Err(e) => return Err(reject(Stage::Trust, "error", e.to_string())),
    }
    let gate_err = |e: Error| reject(Stage::Gate, "error", e.to_string());
    let judged = match judge_span(repo, last, head, Some(env), now).map_err(gate_err)? {
        Judgement::HeadInvalid(diags) => {
            return Err(reject(Stage::Config, "invalid", first_five(&diags)))
        }
        Judgement::BaseInvalid { base, first } => {
            return Err(reject(
                Stage::Config,
                "invalid_base",
                format!("the config at the last applied commit {base:.10} is invalid, so there is no policy in force: {first}"),
            ))
        }
        Judgement::Judged(j) => *j,
    };
    let Some(version) = judged.head.config.envs.get(env).map(|e| e.version.clone()) else {
        return Err(reject(
            Stage::Config,
            "unknown_env",
            format!("{ENV_DIR}/{env}.toml does not exist"),
        ));
    };
    let decision = match judged.verdict(env) {
        Some(EnvVerdict::Decided(Decision::Refused(r))) => {
            let mut rej = reject(Stage::Gate, reason_code(&r.reason), r.to_string());
            rej.version = Some(version);
            rej.refusal = Some(Box::new(r.clone()));
            return Err(rej);
        }
        Some(EnvVerdict::Decided(d)) => d.clone(),
        // `None` cannot happen (the head has `env` and it was asked about);
        // refused all the same.
        Some(EnvVerdict::NotInChain(_)) | None => {
            let mut rej = reject(
                Stage::Gate,
                "not_in_chain",
                format!("{env} is not in the promotion chain of {ROOT_FILE}"),
            );
            rej.version = Some(version);
            return Err(rej);
        }
    };
    Ok(Admitted {
        snapshot: judged.head,
        decision,
    })
}

fn first_five(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .take(5)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Adoption (docs/design.md §4, "the gate governs movement"): a cluster
/// whose selected nodes all already run the version `head` pins moves
/// nothing, so `head` needs the trust check and a valid config, not the gate.
/// The caller has checked the nodes.
pub fn admit_adoption(
    repo: &Repository,
    head: Oid,
    env: &str,
    trusted: &TrustCheck<'_>,
    now: DateTime<Utc>,
) -> Result<Admitted, Rejection> {
    match trusted.check(repo, None, head) {
        Ok(_) => {}
        Err(trust::Error::Refused(r)) => {
            return Err(reject(Stage::Trust, r.reason.code(), r.to_string()))
        }
        Err(e) => return Err(reject(Stage::Trust, "error", e.to_string())),
    }
    match snapshot(repo, head, now) {
        Ok(Ok(s)) if s.config.envs.contains_key(env) => Ok(Admitted {
            snapshot: s,
            decision: Decision::Unchanged,
        }),
        Ok(Ok(_)) => Err(reject(
            Stage::Config,
            "unknown_env",
            format!("{ENV_DIR}/{env}.toml does not exist"),
        )),
        Ok(Err(d)) => Err(reject(Stage::Config, "invalid", first_five(&d))),
        Err(e) => Err(reject(Stage::Gate, "error", e.to_string())),
    }
}
