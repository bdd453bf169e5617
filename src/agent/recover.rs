//! State that survives (docs/design.md §6): where the agent's last applied
//! commit comes from when the `DroverStatus` object does not hold it.
//!
//! In order:
//! 1. a person's word: the annotation [`TRUST_ANNOTATION`] on the status
//!    object names the commit to trust (`kubectl annotate`);
//! 2. the agent's own signed reports on the status branch: every report
//!    carries the config commit the agent was applying, and only a report
//!    signed by this agent's own key (as `<env>/<cluster>`) counts;
//! 3. adoption: when every selected node already runs the version the head
//!    pins, the head moves nothing and is applied without the gate.
//!
//! With none of these the agent applies nothing and says which command
//! confirms a commit.

use crate::cluster::NodeView;
use crate::status::{find_store, walk_store_reports};
use crate::trust::AllowedSigners;
use git2::{Oid, Repository};
use semver::Version;
use ssh_key::PrivateKey;

/// Annotation on the `DroverStatus` object by which a person names the
/// commit to trust when the agent has no last applied commit.
pub const TRUST_ANNOTATION: &str = "drover.dev/trust-commit";

/// The allowed signers that accept exactly this agent's own reports.
pub fn own_signers(key: &PrivateKey, env: &str, cluster: &str) -> Option<AllowedSigners> {
    let public = key.public_key().to_openssh().ok()?;
    AllowedSigners::parse(&format!("{env}/{cluster} namespaces=\"git\" {public}\n")).ok()
}

/// The last applied commit recorded in this agent's own newest signed report
/// on its cluster's status branch of `branch` or, before it has one, on the
/// single status branch of the older layout (local or `origin/`). It may be missing from `repo`: after a
/// force-push the fetched history no longer holds it, and the head, which
/// does not descend from it, is then refused.
pub fn from_own_reports(
    repo: &Repository,
    branch: &str,
    env: &str,
    cluster: &str,
    own: &AllowedSigners,
) -> Option<Oid> {
    let mut store = find_store(repo, branch).ok()?;
    store
        .clusters
        .retain(|b| b.env == env && b.cluster == cluster);
    let mut found = None;
    let mut ignored = Vec::new();
    let _ = walk_store_reports(repo, &store, Some(own), &mut ignored, |t| {
        if found.is_some() || t.report.env != env || t.report.cluster != cluster {
            return;
        }
        found = Oid::from_str(&t.report.config_commit).ok();
    });
    found
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
