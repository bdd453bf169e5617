//! `drover agent`.

use super::{Global, Outcome};

/// Arguments of `drover agent`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `drover agent`.
pub fn run(_g: &Global, _args: Args) -> anyhow::Result<Outcome> {
    anyhow::bail!("`drover agent` is not built yet")
}
