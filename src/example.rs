//! The example config repository, embedded in the binary so that
//! `drover demo` runs from any directory, not only from a checkout.

use std::path::PathBuf;

/// (path relative to the repository root, content) of every file of `example-repo/`.
pub const FILES: &[(&str, &str)] = &[
    ("drover.toml", include_str!("../example-repo/drover.toml")),
    (
        "agents.allowed_signers",
        include_str!("../example-repo/agents.allowed_signers"),
    ),
    (
        "environments/test.toml",
        include_str!("../example-repo/environments/test.toml"),
    ),
    (
        "environments/stage.toml",
        include_str!("../example-repo/environments/stage.toml"),
    ),
    (
        "environments/production.toml",
        include_str!("../example-repo/environments/production.toml"),
    ),
];

/// Write the example repository's config files into a new temporary directory.
pub fn materialize() -> std::io::Result<PathBuf> {
    let dir = tempfile::Builder::new()
        .prefix("drover-example-")
        .tempdir()?
        .keep();
    for (path, text) in FILES {
        let dest = dir.join(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(dest, text)?;
    }
    Ok(dir)
}
