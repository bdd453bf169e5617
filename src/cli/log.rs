//! `drover log`.

use super::{Global, Outcome};

/// Arguments of `drover log`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `drover log`.
pub fn run(_g: &Global, _args: Args) -> anyhow::Result<Outcome> {
    anyhow::bail!("`drover log` is not built yet")
}
