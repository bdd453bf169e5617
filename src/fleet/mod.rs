//! The fleet at a glance (`drover status`, `drover demo --html`): where
//! every environment and cluster is now, when the next window opens, and
//! what the gate would answer for the next promotion.
//!
//! [`model`] holds plain values; [`gather`] fills them from the config, the
//! windows, the gate and the status branch (read through [`reports`]);
//! [`timeline`] fills the timeline page's over the span it shows, where
//! [`history`] turns a cluster's reports into what its nodes ran; [`text`]
//! and [`html`] render them without any I/O.

pub mod explain;
pub mod gather;
pub mod history;
pub mod html;
pub mod model;
pub mod reports;
pub mod text;
pub mod timeline;

pub use gather::{gather, gather_at, Error};
pub use model::*;
pub use timeline::timeline;

/// One line naming where the reports were read: the per-cluster branches
/// and the single branch of the older layout, or `absent` when neither exists.
pub fn branch_line(b: &StatusBranch, absent: &str) -> String {
    let legacy = match (&b.refname, &b.tip) {
        (Some(r), Some(t)) => Some(format!(
            "{} at {:.10}",
            r.strip_prefix("refs/heads/").unwrap_or(r),
            t
        )),
        _ => None,
    };
    match (b.cluster_branches, legacy) {
        (0, Some(l)) => l,
        // Name where reports go now, not the single branch of the older
        // layout, which a new install never has.
        (0, None) => format!("{}.d/<env>/<cluster> ({absent})", b.name),
        (n, None) => format!(
            "{}.d/<env>/<cluster> ({})",
            b.name,
            crate::terminal::count(n as u64, "branch", "branches")
        ),
        (n, Some(l)) => format!(
            "{}.d/<env>/<cluster> ({}) and {l}",
            b.name,
            crate::terminal::count(n as u64, "branch", "branches")
        ),
    }
}
