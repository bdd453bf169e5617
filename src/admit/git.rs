//! Admission's edges over a git repository: configs and policies read at a
//! commit, status and history evidence, and the two ways a change is
//! judged — a pull request's whole diff against its base (`drover check
//! --base`), and the agent's new head commit by commit along the
//! first-parent path from its last applied commit.

use super::history::lower_history;
use super::{judge_env, reason_code, Change, Error, EvidenceSource, Policy};
use crate::config::{self, RepoConfig, ENV_DIR, ROOT_FILE};
use crate::diag::Diagnostic;
use crate::gate::{Decision, LowerHistory};
use crate::status::{self, Confirmations, Ignored, MAX_REPORT_BYTES};
use crate::trust::{self, AllowedSigners};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository, Tree};
use semver::Version;
use std::collections::BTreeMap;
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
    if size > MAX_REPORT_BYTES {
        return Err(format!(
            "{size} bytes; an allowed-signers file may have at most {} KiB",
            MAX_REPORT_BYTES / 1024
        ));
    }
    let blob = repo.find_blob(entry.id()).map_err(|e| e.to_string())?;
    String::from_utf8(blob.content().to_vec())
        .map(Some)
        .map_err(|_| "not UTF-8".to_string())
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
                return Ok(Err(vec![Diagnostic::file(
                    ROOT_FILE,
                    format!("report_signers names {path}, which does not exist in the repository"),
                )]))
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

/// Evidence read from the repository: status reports from the status
/// branch, history over the commits up to `base` only.
pub struct GitEvidence<'r> {
    repo: &'r Repository,
    base: Oid,
    cache: Option<(String, Option<String>, Confirmations)>,
}

impl<'r> GitEvidence<'r> {
    /// Evidence in `repo`, with history counted up to `base`.
    pub fn new(repo: &'r Repository, base: Oid) -> Self {
        GitEvidence {
            repo,
            base,
            cache: None,
        }
    }

    /// The reports the last status read ignored, each named with why.
    pub fn ignored(&self) -> &[Ignored] {
        self.cache.as_ref().map_or(&[], |(_, _, c)| &c.ignored)
    }

    /// The status branch as read with `policy` (its branch, its report signers).
    pub fn confirmations(&mut self, policy: &Policy) -> Result<&Confirmations, Error> {
        let fresh = matches!(&self.cache, Some((b, s, _))
            if *b == policy.status_branch && *s == policy.signers_text);
        if !fresh {
            let signers = match &policy.signers_text {
                Some(t) => Some(AllowedSigners::parse(t).map_err(|e| Error::Signers {
                    path: policy.report_signers.clone().unwrap_or_default(),
                    message: e.to_string(),
                })?),
                None => None,
            };
            let c = status::read_confirmations(
                self.repo,
                &policy.status_branch,
                signers.as_ref().filter(|_| policy.report_signers.is_some()),
            )?;
            self.cache = Some((policy.status_branch.clone(), policy.signers_text.clone(), c));
        }
        Ok(&self.cache.as_ref().expect("filled above").2)
    }
}

impl EvidenceSource for GitEvidence<'_> {
    fn status(
        &mut self,
        policy: &Policy,
        lower: &str,
        version: &Version,
    ) -> Result<(BTreeMap<String, DateTime<Utc>>, BTreeMap<String, String>), Error> {
        let conf = self.confirmations(policy)?;
        let found = conf.for_version(lower, version);
        let mut notes = BTreeMap::new();
        let mut clusters: Vec<&str> = policy
            .clusters
            .get(lower)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        clusters.extend(
            conf.ignored
                .iter()
                .filter(|i| i.env == lower)
                .map(|i| i.cluster.as_str()),
        );
        for c in clusters {
            if !found.contains_key(c) {
                if let Some(why) = conf.why_not(lower, c, version) {
                    notes.insert(c.to_owned(), why);
                }
            }
        }
        Ok((found, notes))
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
    /// The refs read (local or `refs/remotes/origin/`); empty when none
    /// exists, which in CI usually means none was fetched.
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

/// `drover check --base REV`: judge every environment whose version changed
/// between `base` and HEAD of the repository at `repo_path`, as one change
/// judged by the base's policy; each refusal is a diagnostic at the `version` key.
pub fn check_base(repo_path: &Path, base: &str, now: DateTime<Utc>) -> Result<ChangeReport, Error> {
    let repo = Repository::open(repo_path)?;
    let base = commit_of(&repo, base)?;
    let head = commit_of(&repo, "HEAD")?;
    let mut out = ChangeReport::default();
    let after = match snapshot(&repo, head, now)? {
        Ok(s) => s,
        Err(d) => {
            out.diagnostics.extend(d);
            return Ok(out);
        }
    };
    let base_tree = repo.find_commit(base)?.tree()?;
    let before = if base_tree.get_path(Path::new(ROOT_FILE)).is_err() {
        // The first config: judged by its own policy.
        None
    } else {
        match snapshot(&repo, base, now)? {
            Ok(s) => Some(s),
            Err(d) => {
                let first = d.first().map(ToString::to_string).unwrap_or_default();
                out.diagnostics.push(Diagnostic::file(
                    ROOT_FILE,
                    format!(
                        "the config at the base {:.10} is invalid, so there is no policy in force to judge version changes by: {first}",
                        base
                    ),
                ));
                return Ok(out);
            }
        }
    };
    let head_tree = repo.find_commit(head)?.tree()?;
    let mut ev = GitEvidence::new(&repo, base);
    let change = Change {
        before: before.as_ref().map(|s| (&s.config, &s.policy)),
        after: (&after.config, &after.policy),
    };
    for env in after.config.envs.keys() {
        match judge_env(change, env, &mut ev, now) {
            Ok(Decision::Unchanged) => {}
            Ok(d) => {
                if let Decision::Refused(r) = &d {
                    out.diagnostics
                        .push(at_version(&repo, &head_tree, env, r.to_string()));
                }
                out.decisions.push((env.clone(), d));
            }
            Err(Error::NotInChain(_)) => out.diagnostics.push(at_version(
                &repo,
                &head_tree,
                env,
                format!(
                    "{env} is not in the promotion chain of {ROOT_FILE} ({}), so its version change cannot be judged",
                    change.before.map_or(&after.policy, |(_, p)| p).chain.join(", ")
                ),
            )),
            Err(e) => return Err(e),
        }
    }
    out.warnings = ev.ignored().iter().map(ToString::to_string).collect();
    out.ignored = ev.ignored().to_vec();
    let policy = change.before.map_or(&after.policy, |(_, p)| p);
    for (env, _) in &out.decisions {
        if let Some(v) = before.as_ref().and_then(|b| b.config.envs.get(env)) {
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
    let mut needed = false;
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
        needed = true;
        for (cluster, _) in confirmed {
            named.push((lower.clone(), version.clone(), cluster.clone()));
        }
    }
    if !needed {
        return Ok(());
    }
    let store = status::find_store(repo, &policy.status_branch)?;
    let mut refs: Vec<String> = store
        .clusters
        .iter()
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
    let conf = ev.confirmations(policy)?;
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

fn reject(stage: Stage, code: &str, message: String) -> Rejection {
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

impl TrustCheck<'_> {
    fn check(
        &self,
        repo: &Repository,
        last: Option<Oid>,
        head: Oid,
    ) -> Result<trust::Checked, trust::Error> {
        trust::check(repo, self.mode, self.signers, last, head, self.first_seen)
    }
}

/// The agent's admission of `head` for `env` over `last`, its last applied
/// commit (`None`: nothing applied yet): trust, then the head's config, then
/// the gate for every first-parent commit from `last` to `head`, each judged
/// by the policy of the commit before it. History evidence counts only over
/// the commits up to `last`, the agent's base: never over commits this fetch
/// brings.
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
    let after = match snapshot(repo, head, now).map_err(gate_err)? {
        Ok(s) => s,
        Err(diags) => {
            let msg = diags
                .iter()
                .take(5)
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            return Err(reject(Stage::Config, "invalid", msg));
        }
    };
    let Some(version) = after.config.envs.get(env).map(|e| e.version.clone()) else {
        return Err(reject(
            Stage::Config,
            "unknown_env",
            format!("{ENV_DIR}/{env}.toml does not exist"),
        ));
    };
    // The steps: (before, after) pairs of valid configs along the first-parent path.
    let mut path = Vec::new();
    if let Some(last) = last {
        let mut c = repo.find_commit(head).map_err(|e| gate_err(e.into()))?;
        let mut found = last == head;
        while !found {
            path.push(c.id());
            match c.parent(0) {
                Ok(p) if p.id() == last => found = true,
                Ok(p) => c = p,
                Err(_) => break,
            }
        }
        if !found {
            // `last` is reachable only through a merged branch: judge the
            // whole range as one change.
            path = vec![head];
        }
        path.reverse();
    }
    let mut before = match last {
        Some(l) => snapshot(repo, l, now).map_err(gate_err)?.ok(),
        None => None,
    };
    let mut ev = GitEvidence::new(repo, last.unwrap_or(head));
    let mut decision = Decision::Unchanged;
    let steps: Vec<Oid> = if last.is_none() { vec![head] } else { path };
    for commit in steps {
        let snap = if commit == head {
            Some(after.clone())
        } else {
            snapshot(repo, commit, now).map_err(gate_err)?.ok()
        };
        // An invalid commit on the way is never applied; the next valid one
        // is judged against the last valid config before it.
        let Some(snap) = snap else { continue };
        if snap.config.envs.contains_key(env) {
            let change = Change {
                before: before.as_ref().map(|s| (&s.config, &s.policy)),
                after: (&snap.config, &snap.policy),
            };
            match judge_env(change, env, &mut ev, now) {
                Ok(Decision::Refused(r)) => {
                    let mut rej = reject(
                        Stage::Gate,
                        reason_code(&r.reason),
                        if commit == head {
                            r.to_string()
                        } else {
                            format!("at {:.10}: {r}", commit.to_string())
                        },
                    );
                    rej.version = Some(version);
                    rej.refusal = Some(Box::new(r));
                    return Err(rej);
                }
                Ok(Decision::Unchanged) => {}
                Ok(d) => decision = d,
                Err(Error::NotInChain(_)) => {
                    let mut rej = reject(
                        Stage::Gate,
                        "not_in_chain",
                        format!("{env} is not in the promotion chain of {ROOT_FILE}"),
                    );
                    rej.version = Some(version);
                    return Err(rej);
                }
                Err(e) => return Err(gate_err(e)),
            }
        }
        before = Some(snap);
    }
    Ok(Admitted {
        snapshot: after,
        decision,
    })
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
        Ok(Err(d)) => Err(reject(
            Stage::Config,
            "invalid",
            d.iter()
                .take(5)
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )),
        Err(e) => Err(reject(Stage::Gate, "error", e.to_string())),
    }
}
