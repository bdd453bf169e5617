//! `drover version` and `drover --version`: which build this is (the
//! version, the commit it was built from, the build date; build.rs).

use super::{print_ok, Global, Outcome};
use serde::Serialize;
use std::sync::LazyLock;

/// The commit the binary was built from (`unknown` without git or
/// `DROVER_GIT_COMMIT` at build time).
pub const COMMIT: &str = env!("DROVER_COMMIT");
/// The build date, `YYYY-MM-DD` (`SOURCE_DATE_EPOCH` when set).
pub const BUILD_DATE: &str = env!("DROVER_BUILD_DATE");

/// `drover -V`: `0.1.0 (commit 1a2b3c4d5e6f, built 2026-12-01)`.
pub static SHORT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} (commit {}, built {BUILD_DATE})",
        env!("CARGO_PKG_VERSION"),
        &COMMIT[..COMMIT.len().min(12)]
    )
});

/// `drover --version`: the short line, then the full commit.
pub static LONG: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}\ncommit: {COMMIT}\nbuilt: {BUILD_DATE}",
        env!("CARGO_PKG_VERSION")
    )
});

/// The document of `drover version -o json`.
#[derive(Debug, Serialize)]
struct Output {
    version: &'static str,
    commit: &'static str,
    build_date: &'static str,
}

/// Run `drover version`.
pub fn run(g: &Global) -> anyhow::Result<Outcome> {
    let out = Output {
        version: env!("CARGO_PKG_VERSION"),
        commit: COMMIT,
        build_date: BUILD_DATE,
    };
    if g.format.is_document() {
        print_ok(g.format, &out)?;
    } else {
        println!("drover {}", out.version);
        println!("commit: {}", out.commit);
        println!("built: {}", out.build_date);
    }
    Ok(Outcome::Ok)
}
