//! The names of the status store's branches (docs/design.md §5): one per
//! cluster, `<status_branch>.d/<env>/<cluster>`, and the single
//! `<status_branch>` of the older layout; which clusters' branches a read or
//! a fetch takes, and how many at most. A leaf: the source fetches these
//! branches by name and the status store reads them, and neither asks the
//! other what they are called.
//!
//! Why `.d`: git cannot hold `refs/heads/drover/status` and
//! `refs/heads/drover/status/<env>/<cluster>` at once (a ref name cannot be
//! both a file and a directory), so branches under the old name would be
//! refused by every remote that still has the old branch.

use std::collections::BTreeMap;

/// Most per-cluster status branches read (docs/status.md): ten times the
/// largest fleet drover is measured at. A store with more is refused as a
/// whole rather than read in part, so no cluster's evidence is silently dropped.
pub const MAX_STATUS_BRANCHES: usize = 10_000;

/// Name of the branch that holds `env`/`cluster`'s reports.
pub fn cluster_branch(status_branch: &str, env: &str, cluster: &str) -> String {
    format!("{status_branch}.d/{env}/{cluster}")
}

/// The per-cluster namespace of `status_branch`, with a trailing slash.
pub fn cluster_namespace(status_branch: &str) -> String {
    format!("{status_branch}.d/")
}

/// The clusters whose branches a read looks up: environment -> cluster
/// names, as `[clusters]` of a policy lists them.
pub type Listed = BTreeMap<String, Vec<String>>;

/// `drover/status.d/stage/stage-1` for `refs/remotes/origin/drover/status.d/stage/stage-1`.
pub fn short_ref(refname: &str) -> &str {
    refname
        .strip_prefix("refs/remotes/origin/")
        .or_else(|| refname.strip_prefix("refs/heads/"))
        .unwrap_or(refname)
}
