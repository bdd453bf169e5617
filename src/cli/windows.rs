//! `drover windows`.

use super::{Global, Outcome};

/// Arguments of `drover windows`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `drover windows`.
pub fn run(_g: &Global, _args: Args) -> anyhow::Result<Outcome> {
    anyhow::bail!("`drover windows` is not built yet")
}
