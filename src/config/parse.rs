//! Parsing and validation of the config files.

use super::{EnvConfig, Files, RepoConfig, RootConfig};
use crate::diag::Diagnostic;

/// Load and validate the whole repository; all problems are returned together.
pub fn load(files: &dyn Files) -> Result<RepoConfig, Vec<Diagnostic>> {
    let _ = files;
    Err(vec![Diagnostic::file(
        "drover.toml",
        "config parser not built yet",
    )])
}

/// Parse and validate `drover.toml` from its text.
pub fn parse_root(file: &str, text: &str) -> Result<RootConfig, Vec<Diagnostic>> {
    let _ = text;
    Err(vec![Diagnostic::file(file, "config parser not built yet")])
}

/// Parse and validate an environment file from its text.
pub fn parse_env(file: &str, name: &str, text: &str) -> Result<EnvConfig, Vec<Diagnostic>> {
    let _ = (name, text);
    Err(vec![Diagnostic::file(file, "config parser not built yet")])
}
