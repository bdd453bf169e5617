//! `drover demo`: the controlled-upgrade story end to end on simulated clusters.

use super::{Global, Outcome, Problem};
use crate::demo::{self, Options};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `drover demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Nodes in each simulated cluster (at most 10000).
    #[arg(long, default_value_t = 5)]
    pub nodes: u64,
    /// Time one node takes from drain to Ready at the new version.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub node_time: Duration,
    /// The config repository the story starts from (default: the embedded example-repo).
    #[arg(long)]
    pub example_repo: Option<PathBuf>,
    /// Write the story's timeline page (one self-contained HTML file) here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Keep the story's config repository, status branch included, in this
    /// new directory (then `drover status --repo DIR` shows the fleet).
    #[arg(long, value_name = "DIR")]
    pub keep_repo: Option<PathBuf>,
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
    if let Some(dir) = &args.keep_repo {
        if dir.exists() {
            anyhow::bail!(
                "--keep-repo {}: the directory exists; name a new one",
                dir.display()
            );
        }
    }
    let opts = Options {
        nodes: (args.nodes as usize).max(1),
        node_time: args.node_time,
        example_repo: match args.example_repo {
            Some(p) => p,
            None => crate::example::materialize()?,
        },
        keep_repo: args.keep_repo,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(demo::run(&opts))?;
    if !report.violations.is_empty() {
        super::mark_rejected();
    }
    if let (Some(path), Some(fleet), Some(picture)) = (&args.html, &report.fleet, &report.picture) {
        super::status::write_page(
            path,
            "drover demo: test → stage → production",
            fleet,
            picture,
        )?;
    }
    if g.format.is_document() {
        let errors: Vec<Problem> = report
            .violations
            .iter()
            .map(|v| Problem::from(format!("invariant broken: {v}")))
            .collect();
        super::output::print_document(g.format, errors.is_empty(), &errors, &report)?;
    } else {
        print!("{}", text(&report));
    }
    Ok(if report.violations.is_empty() {
        Outcome::Ok
    } else {
        Outcome::Rejected
    })
}

/// The story as text: each line in UTC and in its environment's zone, then
/// the fleet at the end as `drover status` prints it.
pub fn text(report: &demo::Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "drover demo: the controlled upgrade path, test -> stage -> production\n"
    );
    let _ = writeln!(out, "{:<17}  {:<20}  {:<10}  WHAT", "UTC", "LOCAL", "ENV");
    for l in &report.timeline {
        let _ = writeln!(
            out,
            "{:<17}  {:<20}  {:<10}  {}",
            l.at.format("%Y-%m-%d %H:%M"),
            l.local.as_deref().unwrap_or("-"),
            l.env.as_deref().unwrap_or("-"),
            l.event
        );
    }
    let _ = writeln!(
        out,
        "\n{:<11} {:<10} {:>5}  {:<13} {:<18}  CONFIRMED",
        "ENV", "CLUSTER", "NODES", "NODES RUN", "LAST REPORT"
    );
    for c in &report.clusters {
        let versions: Vec<String> = c.versions.iter().map(|(v, n)| format!("{n}×{v}")).collect();
        let confirmed: Vec<String> = c
            .confirmed
            .iter()
            .map(|k| format!("{} {}", k.version, k.at.format("%m-%d %H:%M")))
            .collect();
        let _ = writeln!(
            out,
            "{:<11} {:<10} {:>5}  {:<13} {:<18}  {}",
            c.env,
            c.cluster,
            c.nodes,
            versions.join(", "),
            c.state.as_deref().unwrap_or("-"),
            if confirmed.is_empty() {
                "-".to_owned()
            } else {
                confirmed.join(", ")
            }
        );
    }
    if let Some(f) = &report.fleet {
        let _ = writeln!(out, "\nThe fleet at the end (`drover status`):\n");
        out.push_str(&crate::fleet::text::render(f));
    }
    let _ = writeln!(out);
    if report.violations.is_empty() {
        let _ = writeln!(
            out,
            "invariants held: at most {} node unavailable at once per cluster, every upgrade inside its window, at its pinned version, each wave only after the one before it confirmed and soaked, nothing left cordoned",
            report.peak_unavailable
        );
    } else {
        for v in &report.violations {
            let _ = writeln!(out, "INVARIANT BROKEN: {v}");
        }
    }
    out
}
