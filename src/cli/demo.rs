//! `drover demo`.

use super::{Global, Outcome};

/// Arguments of `drover demo`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `drover demo`.
pub fn run(_g: &Global, _args: Args) -> anyhow::Result<Outcome> {
    anyhow::bail!("`drover demo` is not built yet")
}
