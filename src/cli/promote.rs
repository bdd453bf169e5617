//! `drover promote`.

use super::{Global, Outcome};

/// Arguments of `drover promote`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `drover promote`.
pub fn run(_g: &Global, _args: Args) -> anyhow::Result<Outcome> {
    anyhow::bail!("`drover promote` is not built yet")
}
