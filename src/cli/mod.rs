//! The command line (docs/design.md §7). Each command lives in its own file with its
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
pub mod revoke;
pub mod status;
pub mod verify;
pub mod windows;

/// `drover --version`: the version, and the updater image this build
/// defaults to (a release pins it by digest, docs/install.md).
static LONG_VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let image = crate::config::DEFAULT_BOTTLEROCKET_IMAGE;
    let pinned = if image.contains("@sha256:") {
        ""
    } else {
        " (not pinned by digest)"
    };
    format!(
        "{}\nupdater image: {image}{pinned}",
        env!("CARGO_PKG_VERSION")
    )
});

/// drover: a controlled upgrade path for Kubernetes node OS versions.
#[derive(Debug, Parser)]
#[command(name = "drover", version, long_version = LONG_VERSION.as_str(), about, long_about = None)]
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
    /// Prepare a branch and commit adding a version to `[promotion] revoked`.
    Revoke(revoke::Args),
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
    quiet_on_closed_pipe();
    let cli = Cli::parse();
    match run(cli) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Rejected) => ExitCode::from(1),
        // `drover log | head`: the reader had what it wanted.
        Err(err) if is_broken_pipe(&err) => exit_on_closed_pipe(),
        Err(err) => {
            eprintln!("drover: error: {}", render_error(&err));
            ExitCode::from(2)
        }
    }
}

/// Set once a command has judged its input rejected, before it prints why.
static REJECTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Note that the command is rejecting its input: if the reader of its output
/// goes away while it prints why, it still exits 1, so `drover check | head`
/// cannot turn a rejection into success.
pub fn mark_rejected() {
    REJECTING.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The exit code when stdout was closed under a command: 0, or 1 when it
/// was printing a rejection.
fn exit_on_closed_pipe() -> ExitCode {
    if REJECTING.load(std::sync::atomic::Ordering::Relaxed) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Whether `err` comes from writing to a pipe whose reader has gone.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A closed stdout (`drover windows --count 1000 | head`) ends the command
/// quietly with exit 0 (1 for a rejection, see [`mark_rejected`]), whatever
/// command was printing: `println!` reports the failed write as a panic,
/// which is caught here rather than at every print. Any other panic keeps
/// the default report.
fn quiet_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to std") && msg.contains("Broken pipe") {
            let code = if REJECTING.load(std::sync::atomic::Ordering::Relaxed) {
                1
            } else {
                0
            };
            std::process::exit(code);
        }
        default(info);
    }));
}

/// The error and its causes, each said once: many errors already include
/// their source's text (`git: {0}`), and `{:#}` would print libgit2's
/// message a second time.
pub fn render_error(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// One reason a command rejected its input: a problem in a config file
/// (file, line, column, message) or in the command line (message only).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Problem {
    /// A problem at a place in the config repository.
    File(crate::diag::Diagnostic),
    /// A problem with the command line or the repository as a whole.
    Message {
        /// What is wrong and what would be valid.
        message: String,
    },
}

impl From<crate::diag::Diagnostic> for Problem {
    fn from(d: crate::diag::Diagnostic) -> Self {
        Problem::File(d)
    }
}

impl From<String> for Problem {
    fn from(message: String) -> Self {
        Problem::Message { message }
    }
}

/// Report a rejection and return [`Outcome::Rejected`] (exit 1): in text,
/// each problem on stderr; in JSON, `{"ok": false, "errors": [...]}` on
/// stdout, the same document every command gives for a rejection.
pub fn reject(g: &Global, problems: Vec<Problem>) -> anyhow::Result<Outcome> {
    mark_rejected();
    match g.format {
        Format::Json => print_json(&serde_json::json!({ "ok": false, "errors": problems }))?,
        Format::Text => {
            for p in &problems {
                match p {
                    Problem::File(d) => eprintln!("{d}"),
                    Problem::Message { message } => eprintln!("drover: error: {message}"),
                }
            }
        }
    }
    Ok(Outcome::Rejected)
}

/// Reject `name` unless it is an environment of `cfg`, naming the valid ones.
pub fn known_env<'c>(
    g: &Global,
    cfg: &'c crate::config::RepoConfig,
    name: &str,
) -> Result<&'c crate::config::EnvConfig, anyhow::Result<Outcome>> {
    cfg.envs
        .get(name)
        .ok_or_else(|| reject(g, vec![unknown_env(name, cfg.envs.keys())]))
}

/// The problem of an unknown `--env`, listing the environments there are.
pub fn unknown_env<'a>(name: &str, valid: impl IntoIterator<Item = &'a String>) -> Problem {
    let valid: Vec<&str> = valid.into_iter().map(String::as_str).collect();
    Problem::Message {
        message: format!(
            "unknown environment {name:?}; valid environments: {}",
            valid.join(", ")
        ),
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
        Command::Revoke(a) => revoke::run(g, a),
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
    // Streamed: a long `drover log` is megabytes of JSON.
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    let written = serde_json::to_writer_pretty(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| writeln!(out))
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Load and validate the config repository at `--repo`. When it is invalid,
/// its diagnostics are reported as a rejection ([`reject`]) and `None` comes
/// back: the command exits 1.
pub fn load_repo(g: &Global) -> Option<crate::config::RepoConfig> {
    match crate::config::load(&crate::config::DirFiles::new(&g.repo)) {
        Ok(cfg) => Some(cfg),
        Err(diags) => {
            // A failed write of the report still ends in exit 1.
            let _ = reject(g, diags.into_iter().map(Problem::from).collect());
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
