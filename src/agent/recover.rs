//! State that survives (docs/design.md §6): where the agent's last applied
//! commit comes from when the `DroverStatus` object does not hold it.
//!
//! In order:
//! 1. a person's word: the annotation [`TRUST_ANNOTATION`] on the status
//!    object names the commit to trust (`kubectl annotate`). It must be the
//!    full object id of a commit on the tracked branch ([`annotated_commit`]),
//!    and that commit is then admitted like any other: signed by an allowed
//!    signer, a valid config, and past the gate unless every selected node
//!    already runs the version it pins (then it moves nothing, as in 3.);
//! 2. the agent's own signed reports on the status branch: every report
//!    carries the config commit the agent was applying, and only a report
//!    signed by this agent's own key (as `<env>/<cluster>`) counts;
//! 3. adoption: when every selected node already runs the version the head
//!    pins, the head moves nothing and is applied without the gate.
//!
//! With none of these the agent applies nothing and says which command
//! confirms a commit.

use crate::cluster::NodeView;
use crate::source::seen::StatusSeen;
use crate::status::{find_store, walk_store, BranchRead, Judge, Layout, ReportVersion, Visitor};
use crate::trust::AllowedSigners;
use git2::{Oid, Repository};
use semver::Version;
use ssh_key::PrivateKey;

/// Annotation on the `DroverStatus` object by which a person names the
/// commit to trust when the agent has no last applied commit.
pub const TRUST_ANNOTATION: &str = "drover.dev/trust-commit";

/// Most first-parent commits searched for the annotated commit: the tracked
/// branch's last 100,000 commits, far more than any fleet's config history
/// holds between two losses of the agent's state.
pub const MAX_TRUST_WALK: usize = 100_000;

/// The commit a [`TRUST_ANNOTATION`] value names, if it may be trusted as a
/// starting point at all: its full object id (no revspec such as `HEAD` or
/// `main~3`, which would follow whatever the repository says now), of a
/// commit on the first-parent history of the fetched `head` of `branch`
/// (not a commit of another branch or one the cache holds for another
/// reason). Its signature and config are the admission's to check.
pub fn annotated_commit(
    repo: &Repository,
    value: &str,
    head: Oid,
    branch: &str,
) -> Result<Oid, String> {
    let value = value.trim();
    let full = value.len() == 40 && value.bytes().all(|b| b.is_ascii_hexdigit());
    let oid = match Oid::from_str(value) {
        Ok(o) if full => o,
        _ => {
            return Err(format!(
                "{TRUST_ANNOTATION} must name a commit by its full 40-hex object id                  (git rev-parse <commit>), not {value:?}"
            ))
        }
    };
    if repo.find_commit(oid).is_err() {
        return Err(format!(
            "{TRUST_ANNOTATION} names {oid}, which is not a commit of the fetched repository"
        ));
    }
    let mut c = repo.find_commit(head).map_err(|e| e.to_string())?;
    for _ in 0..MAX_TRUST_WALK {
        if c.id() == oid {
            return Ok(oid);
        }
        match c.parent(0) {
            Ok(p) => c = p,
            Err(_) => break,
        }
    }
    Err(format!(
        "{TRUST_ANNOTATION} names {oid}, which is not on {branch} (the first-parent history \
         of the fetched head {}, searched {MAX_TRUST_WALK} commits deep)",
        &head.to_string()[..12]
    ))
}

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

/// The message of a refusal for want of any trusted state.
pub fn no_trusted_state(namespace: &str, status_name: &str, head: &str) -> String {
    format!(
        "no last applied commit: the DroverStatus object holds none, this cluster has no signed report, \
         and its nodes do not all run the pinned version; nothing is applied until a person confirms \
         a commit: kubectl -n {namespace} annotate droverstatus {status_name} {TRUST_ANNOTATION}=<commit> \
         (the head is {head})"
    )
}
