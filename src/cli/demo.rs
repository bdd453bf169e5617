//! `drover demo`: the seed's story end to end on simulated clusters.

use super::{print_json, Format, Global, Outcome};
use crate::demo::{self, ts, Options};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `drover demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Nodes in each simulated cluster (at most 10000).
    #[arg(long, default_value_t = 5)]
    pub nodes: u64,
    /// Time one node takes from drain to Ready at the new version.
    #[arg(long, default_value = "20m", value_parser = humantime::parse_duration)]
    pub node_time: Duration,
    /// The config repository the story starts from (default: the embedded example-repo).
    #[arg(long)]
    pub example_repo: Option<PathBuf>,
}

/// Run `drover demo`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    // Five clusters of simulated nodes are held in memory.
    const MAX_NODES: u64 = 10_000;
    if args.nodes > MAX_NODES {
        return super::reject(
            g,
            vec![format!(
                "--nodes {} is more than {MAX_NODES}; give a count from 1 to {MAX_NODES}",
                args.nodes
            )
            .into()],
        );
    }
    let opts = Options {
        nodes: (args.nodes as usize).max(1),
        node_time: args.node_time,
        example_repo: match args.example_repo {
            Some(p) => p,
            None => crate::example::materialize()?,
        },
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(demo::run(&opts))?;
    if !report.violations.is_empty() {
        super::mark_rejected();
    }
    match g.format {
        Format::Json => print_json(&report)?,
        Format::Text => {
            println!("drover demo: the controlled upgrade path, test -> stage -> production\n");
            for l in &report.timeline {
                println!("{}  {:<10}  {}", ts(l.at), l.env, l.event);
            }
            println!(
                "\n{:<11} {:<10} {:>5}  {:<22} {:<16} confirmed",
                "env", "cluster", "nodes", "versions", "state"
            );
            for c in &report.clusters {
                let versions: Vec<String> =
                    c.versions.iter().map(|(v, n)| format!("{n}×{v}")).collect();
                let confirmed: Vec<String> = c
                    .confirmed
                    .iter()
                    .map(|(v, t)| format!("{v} at {}", ts(*t)))
                    .collect();
                println!(
                    "{:<11} {:<10} {:>5}  {:<22} {:<16} {}",
                    c.env,
                    c.cluster,
                    c.nodes,
                    versions.join(", "),
                    c.state,
                    confirmed.join("; ")
                );
            }
            println!();
            if report.violations.is_empty() {
                println!(
                    "invariants held: at most {} node unavailable at once per cluster, every upgrade inside its window, at its pinned version, nothing left cordoned",
                    report.peak_unavailable
                );
            } else {
                for v in &report.violations {
                    println!("INVARIANT BROKEN: {v}");
                }
            }
        }
    }
    Ok(if report.violations.is_empty() {
        Outcome::Ok
    } else {
        Outcome::Rejected
    })
}
