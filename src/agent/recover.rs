//! State that survives (docs/design.md §6): where the agent's last applied
//! commit comes from when the `DroverStatus` object does not hold it, by
//! the one rule of `crate::admit::bootstrap` (which `drover doctor` runs
//! too). In order:
//! 1. the agent's own signed reports on the status branch: every report
//!    carries the config commit the agent was applying, and only a report
//!    signed by this agent's own key (as `<env>/<cluster>`) counts; a
//!    commit a person named meanwhile is ignored, with a Warning Event, and
//!    the annotation removed;
//! 2. a person's word: the annotation [`TRUST_ANNOTATION`] on the status
//!    object (`kubectl annotate`), or `--trust-commit`, names the commit to
//!    start from: it and its ancestors are trusted, the commits after it
//!    verified, and it is judged by the head's policy
//!    (`crate::admit::admit_named`); applied, the annotation is removed;
//! 3. adoption: when every selected node already runs the version the head
//!    pins, and the head's whole history verifies, the head moves nothing
//!    and is applied without the gate.
//!
//! With none of these the agent applies nothing and says which command
//! names a commit.

use crate::cluster::NodeView;
use crate::source::seen::StatusSeen;
use crate::status::{find_store, walk_store, BranchRead, Judge, Layout, ReportVersion, Visitor};
use crate::trust::AllowedSigners;
use git2::{Oid, Repository};
use semver::Version;
use ssh_key::PrivateKey;

pub use crate::admit::bootstrap::{
    named_commit as annotated_commit, MAX_TRUST_WALK, TRUST_ANNOTATION,
};

/// The allowed signers that accept exactly this agent's own reports.
pub fn own_signers(key: &PrivateKey, env: &str, cluster: &str) -> Option<AllowedSigners> {
    let public = key.public_key().to_openssh().ok()?;
    AllowedSigners::parse(&format!("{env}/{cluster} namespaces=\"git\" {public}\n")).ok()
}

/// The last applied commit recorded in this agent's own newest signed report
/// on its cluster's status branch of `branch` or, before it has one, on the
/// single status branch of the older layout (local or `origin/`), read by
/// the one status reader: a branch that does not count as a whole (a merge,
/// a commit not signed by `own`, times going backwards) yields nothing, and
/// when this cluster's own branch exists but does not count, the single
/// branch is not used either. The commit may be missing from `repo`: after a
/// force-push the fetched history no longer holds it, and the head, which
/// does not descend from it, is then refused. `now` is the agent's clock,
/// the one its reports were dated by.
pub fn from_own_reports(
    repo: &Repository,
    branch: &str,
    env: &str,
    cluster: &str,
    own: &AllowedSigners,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Oid> {
    let listed = crate::status::Listed::from([(env.to_owned(), vec![cluster.to_owned()])]);
    let store = find_store(repo, branch, crate::status::Scope::Listed(&listed)).ok()?;
    let seen = StatusSeen::load(repo.path());
    let judge = Judge {
        signers: Some(own),
        now,
        seen: (!seen.is_empty()).then_some(&seen),
    };
    let mut r = Recover {
        env,
        cluster,
        candidate: None,
        found: None,
    };
    walk_store(repo, &store, &judge, &mut r).ok()?;
    r.found.flatten()
}

/// The newest own report of each branch; the last branch read (the
/// cluster's own, after the single one) decides.
struct Recover<'a> {
    env: &'a str,
    cluster: &'a str,
    candidate: Option<Oid>,
    found: Option<Option<Oid>>,
}

impl Visitor for Recover<'_> {
    fn version(&mut self, v: ReportVersion) {
        if self.candidate.is_some()
            || v.deleted_at_tip
            || v.env != self.env
            || v.cluster != self.cluster
        {
            return;
        }
        if let Ok(r) = v.report {
            self.candidate = Oid::from_str(&r.config_commit).ok();
        }
    }

    fn branch(&mut self, b: &BranchRead<'_>) {
        let holds = b.verdict.is_ok()
            && !b
                .broken
                .contains_key(&format!("{}/{}", self.env, self.cluster));
        let candidate = self.candidate.take();
        self.found = match (b.layout, holds, candidate) {
            (_, false, _) => Some(None),
            (_, true, Some(c)) => Some(Some(c)),
            // The cluster's own branch holds but names nothing: the older history may.
            (Layout::Cluster { .. }, true, None) => self.found.or(Some(None)),
            (Layout::Legacy, true, None) => None,
        };
    }
}

/// Whether the cluster can be adopted at `version`: at least one selected
/// node, and every selected node Ready at `version`.
pub fn adoptable(nodes: &[NodeView], version: &Version) -> bool {
    !nodes.is_empty()
        && nodes
            .iter()
            .all(|n| n.ready && n.version.as_ref() == Some(version))
}

/// The highest version a selected node runs, if any runs a known one.
pub fn highest(nodes: &[NodeView]) -> Option<Version> {
    nodes.iter().filter_map(|n| n.version.clone()).max()
}

/// The message of a refusal for want of any trusted state.
pub fn no_trusted_state(namespace: &str, status_name: &str, head: &str) -> String {
    format!(
        "no last applied commit: the DroverStatus object holds none, this cluster has no signed report, \
         and its nodes do not all run the pinned version or the history does not verify from its first \
         commit; nothing is applied until a person names a commit to trust (it and its ancestors are \
         trusted, every later commit is verified): kubectl -n {namespace} annotate droverstatus \
         {status_name} {TRUST_ANNOTATION}=<full commit id> (the head is {head})"
    )
}

/// What the agent has recorded that bears on where its trust starts: its
/// last applied commit and a commit a person named, from its `DroverStatus`
/// (none when there is none yet).
#[derive(Debug, Clone, Default)]
pub struct AgentState {
    /// `status.lastAppliedCommit`.
    pub applied: Option<String>,
    /// The `drover.dev/trust-commit` annotation.
    pub annotation: Option<String>,
}

/// The agent's own trust check of the fetched `head` (`crate::admit`: where
/// trust starts, by the one rule, then every commit after it), as `drover
/// doctor` runs it, on what the
/// agent has recorded (`state`) and would find (its own signed reports):
/// the message of a pass, or the refusal (its reason code, as the agent
/// gives it, the message, what to do). `drover doctor` and the agent run
/// the same functions, so they cannot disagree.
pub fn trust_verdict(
    cfg: &super::AgentConfig,
    state: &AgentState,
    repo: &git2::Repository,
    head: git2::Oid,
    signers: crate::trust::Signers<'_>,
) -> Result<String, TrustRefusal> {
    let own = cfg
        .publish
        .signing_key
        .as_ref()
        .and_then(|k| own_signers(k, &cfg.env, &cfg.cluster));
    let own_report = own.as_ref().and_then(|own| {
        let config = crate::config::GitTreeFiles::at_rev(repo, &head.to_string())
            .ok()
            .and_then(|f| crate::config::load(&f).ok());
        let branch = config.map_or_else(
            || cfg.source.status_branch.clone(),
            |c| c.root.status_branch,
        );
        from_own_reports(
            repo,
            &branch,
            &cfg.env,
            &cfg.cluster,
            own,
            chrono::Utc::now(),
        )
    });
    let named = state.annotation.as_deref().or(cfg.trust_commit.as_deref());
    let inputs = crate::admit::TrustInputs {
        applied: state
            .applied
            .as_deref()
            .and_then(|c| git2::Oid::from_str(c).ok()),
        own_report,
        named,
        branch: &cfg.source.branch,
    };
    let annotate = format!(
        "kubectl -n {} annotate droverstatus {} {}=<full commit id>",
        cfg.namespace,
        cfg.status_name,
        crate::admit::TRUST_ANNOTATION
    );
    let base = crate::admit::trust_base(repo, head, &inputs).map_err(|r| TrustRefusal {
        code: r.code.clone(),
        message: format!("the agent would refuse the head: {r}"),
        fix: format!("name a commit of the tracked branch by its full id: {annotate}"),
    })?;
    let now = chrono::Utc::now().timestamp();
    let first_seen = |_| now;
    let trusted = crate::admit::TrustCheck {
        mode: cfg.verify,
        signers,
        first_seen: &first_seen,
    };
    match crate::admit::check_trust(repo, base, head, &trusted) {
        Ok(checked) => Ok(format!(
            "trust starts at {base}; {} commit(s) verified up to the head{}",
            checked.checked,
            checked
                .head_signer
                .map(|v| format!(", signed by {} ({})", v.principal, v.fingerprint))
                .unwrap_or_default()
        )),
        Err(r) => Err(TrustRefusal {
            code: r.code.clone(),
            message: format!("trust starts at {base}, and the agent would refuse the head: {r}"),
            fix: match base {
                crate::admit::TrustBase::Root => format!(
                    "sign the branch's commits with a listed key (or list the key that signs \
                     them), or name a commit you reviewed to start from: {annotate}"
                ),
                _ => "sign the commits after it with a listed key, or list the key that signs them (allowed_signers, or the OpenPGP keys for a forge's merge button)".into(),
            },
        }),
    }
}

/// Why the agent would refuse the head at its trust check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustRefusal {
    /// The reason code the agent gives (`unsigned`, `trust_commit`, ...).
    pub code: String,
    /// What doctor says.
    pub message: String,
    /// What to do.
    pub fix: String,
}
