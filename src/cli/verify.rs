//! `drover verify`.

use super::{Global, Outcome};

/// Arguments of `drover verify`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `drover verify`.
pub fn run(_g: &Global, _args: Args) -> anyhow::Result<Outcome> {
    anyhow::bail!("`drover verify` is not built yet")
}
