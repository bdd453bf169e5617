//! The command line (DESIGN §7). Each command lives in its own file with its
//! arguments and its `run`; this file owns the shared flags, output format
//! and exit codes: 0 success, 1 input rejected, 2 could not run.

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

pub mod agent;
pub mod check;
pub mod demo;
pub mod log;
pub mod plan;
pub mod promote;
pub mod status;
pub mod verify;
pub mod windows;

/// drover: a controlled upgrade path for Kubernetes node OS versions.
#[derive(Debug, Parser)]
#[command(name = "drover", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// The config repository (a git work tree).
    #[arg(long, global = true, default_value = ".", env = "DROVER_REPO_DIR")]
    pub repo: PathBuf,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// Output format of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable text.
    Text,
    /// One JSON document on stdout.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the repository; with --base, judge version changes against the promotion gate.
    Check(check::Args),
    /// List the next maintenance windows of an environment.
    Windows(windows::Args),
    /// Version history from git, newest first.
    Log(log::Args),
    /// Check commit signatures against an allowed-signers file.
    Verify(verify::Args),
    /// Prepare a branch and commit promoting an environment.
    Promote(promote::Args),
    /// What the agent would do now, and how many windows the rollout needs.
    Plan(plan::Args),
    /// The fleet at a glance: every environment and cluster, next windows, the gate's answers.
    Status(status::Args),
    /// Run the in-cluster agent.
    Agent(Box<agent::Args>),
    /// The controlled-upgrade story end to end on simulated clusters.
    Demo(demo::Args),
}

/// How a command that ran ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Ok,
    /// Exit 1: the input was rejected; the output says why.
    Rejected,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Rejected) => ExitCode::from(1),
        Err(err) => {
            eprintln!("drover: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    let g = &cli.global;
    match cli.command {
        Command::Check(a) => check::run(g, a),
        Command::Windows(a) => windows::run(g, a),
        Command::Log(a) => log::run(g, a),
        Command::Verify(a) => verify::run(g, a),
        Command::Promote(a) => promote::run(g, a),
        Command::Plan(a) => plan::run(g, a),
        Command::Status(a) => status::run(g, a),
        Command::Agent(a) => agent::run(g, *a),
        Command::Demo(a) => demo::run(g, a),
    }
}

/// Print `value` as pretty JSON on stdout. A reader that went away
/// (`drover log --format json | head`) is not an error.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    use std::io::Write;
    let text = serde_json::to_string_pretty(value)?;
    match writeln!(std::io::stdout().lock(), "{text}") {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Load and validate the config repository at `--repo`. When it is invalid,
/// its diagnostics go to stderr and `None` comes back: the command exits 1.
pub fn load_repo(g: &Global) -> Option<crate::config::RepoConfig> {
    match crate::config::load(&crate::config::DirFiles::new(&g.repo)) {
        Ok(cfg) => Some(cfg),
        Err(diags) => {
            for d in &diags {
                eprintln!("{d}");
            }
            None
        }
    }
}

/// Parse an RFC 3339 timestamp given on the command line.
pub fn parse_time(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("expected an RFC 3339 time such as 2026-12-01T02:00:00Z: {e}"))
}
