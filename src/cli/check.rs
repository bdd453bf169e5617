//! `drover check`.

use super::{Global, Outcome};

/// Arguments of `drover check`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `drover check`.
pub fn run(_g: &Global, _args: Args) -> anyhow::Result<Outcome> {
    anyhow::bail!("`drover check` is not built yet")
}
