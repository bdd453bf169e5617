//! `drover plan`.

use super::{Global, Outcome};

/// Arguments of `drover plan`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `drover plan`.
pub fn run(_g: &Global, _args: Args) -> anyhow::Result<Outcome> {
    anyhow::bail!("`drover plan` is not built yet")
}
