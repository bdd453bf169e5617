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

/// `drover --version`: the short line, then the full commit and the updater
/// image this build defaults to (a release pins it by digest, docs/install.md).
pub static LONG: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}\ncommit: {COMMIT}\nbuilt: {BUILD_DATE}\nupdater image: {}",
        env!("CARGO_PKG_VERSION"),
        updater_image()
    )
});

/// The default `[driver] image` of the Bottlerocket driver: the one the
/// release built, or none (build.rs, `DROVER_UPDATER_IMAGE`).
fn updater_image() -> String {
    match crate::config::DEFAULT_BOTTLEROCKET_IMAGE {
        Some(image) => image.to_owned(),
        None => "none (not a release build: set [driver] image)".to_owned(),
    }
}

/// The document of `drover version -o json`.
#[derive(Debug, Serialize)]
struct Output {
    version: &'static str,
    commit: &'static str,
    build_date: &'static str,
    updater_image: String,
}

/// Run `drover version`.
pub fn run(g: &Global) -> anyhow::Result<Outcome> {
    let out = Output {
        version: env!("CARGO_PKG_VERSION"),
        commit: COMMIT,
        build_date: BUILD_DATE,
        updater_image: updater_image(),
    };
    if g.format.is_document() {
        print_ok(g.format, &out)?;
    } else {
        println!("drover {}", out.version);
        println!("commit: {}", out.commit);
        println!("built: {}", out.build_date);
        println!("updater image: {}", out.updater_image);
    }
    Ok(Outcome::Ok)
}
