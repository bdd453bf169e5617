//! The command line (docs/design.md §7, docs/cli.md). Each command lives in
//! its own file with its arguments and its `run`; this file owns the shared
//! flags (`--repo`, found upward like git; `-o`), the exit codes (0 success,
//! 1 input rejected, 2 could not run) and the translation of what failed
//! into what the user did and what to do ([`explain`]); [`output`] owns the
//! one document every command prints in JSON and YAML.

use clap::{CommandFactory, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub mod agent;
pub mod check;
pub mod completion;
pub mod demo;
pub mod doctor;
pub mod explain;
pub mod init;
pub mod jsonpath;
pub mod log;
pub mod output;
pub mod plan;
pub mod promote;
pub mod revoke;
pub mod status;
pub mod verify;
pub mod version;
pub mod wait;
pub mod windows;

pub use output::{print_json, print_ok, Format, Problem};

/// drover: a controlled upgrade path for Kubernetes node OS versions.
#[derive(Debug, Parser)]
#[command(name = "drover", version = version::SHORT.as_str(), long_version = version::LONG.as_str(), about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// The config repository (a git work tree); default: the nearest
    /// directory holding drover.toml, from the current one upward.
    #[arg(
        long = "repo",
        global = true,
        env = "DROVER_REPO_DIR",
        value_name = "DIR"
    )]
    pub repo_arg: Option<PathBuf>,
    /// The config repository, resolved from `--repo` or found upward.
    #[arg(skip)]
    pub repo: PathBuf,
    /// Output format: text, wide (text, unabridged), json, yaml, or
    /// jsonpath=TEMPLATE (kubectl's: -o jsonpath='{.environments[*].name}').
    #[arg(
        long,
        short = 'o',
        visible_alias = "output",
        global = true,
        value_name = "FORMAT",
        value_parser = output::parse_format,
        default_value = "text"
    )]
    pub format: Format,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the repository; with --base, judge version changes against the promotion gate.
    #[command(
        after_help = "Examples:\n  drover check\n  drover check --base origin/main\n  drover check --base origin/main -o json"
    )]
    Check(check::Args),
    /// List the next maintenance windows of an environment.
    #[command(
        after_help = "Examples:\n  drover windows --env production\n  drover windows --env stage --from 2027-01-01 --count 10\n  drover windows --env production -o json"
    )]
    Windows(windows::Args),
    /// Version history from git, newest first, with confirmations, failures and revocations.
    #[command(
        after_help = "Examples:\n  drover log\n  drover log --env production --allowed-signers agents.allowed_signers\n  drover log -o json"
    )]
    Log(log::Args),
    /// Check commit signatures against an allowed-signers file.
    #[command(
        after_help = "Examples:\n  drover verify --allowed-signers maintainers.allowed_signers\n  drover verify --allowed-signers maintainers.allowed_signers --since origin/main --mode all\n  drover verify --openpgp-keys web-flow.asc"
    )]
    Verify(verify::Args),
    /// Prepare a branch and commit promoting an environment.
    #[command(
        after_help = "Examples:\n  drover promote production --dry-run\n  drover promote production\n  drover promote production --to 1.13.2"
    )]
    Promote(promote::Args),
    /// Prepare a branch and commit adding a version to `[promotion] revoked`.
    #[command(
        after_help = "Examples:\n  drover revoke 1.13.3 --reason \"kernel panic on m7i\" --dry-run\n  drover revoke 1.13.3 --reason \"kernel panic on m7i\""
    )]
    Revoke(revoke::Args),
    /// What the agent would do now, and how many windows the rollout needs.
    #[command(
        after_help = "Examples:\n  drover plan --env production\n  drover plan --env production --nodes 200 --node-time 20m\n  drover plan --env stage --kubeconfig ~/.kube/config --cluster stage-1"
    )]
    Plan(plan::Args),
    /// The fleet at a glance: every environment and cluster, next windows, the gate's answers.
    #[command(
        after_help = "Examples:\n  drover status\n  drover status --env production --now 2027-01-08T03:00:00Z\n  drover status --html fleet.html\n  drover status -o jsonpath='{.environments[*].name}'\n  drover status --watch"
    )]
    Status(status::Args),
    /// Wait until an environment's clusters confirm its version (like `kubectl rollout status`).
    #[command(
        after_help = "Examples:\n  drover wait --env stage --timeout 2h\n  drover wait --env production --cluster prod-eu-1 --timeout 30m"
    )]
    Wait(wait::Args),
    /// Start a config repository: drover.toml, environments/, report signers.
    #[command(
        after_help = "Examples:\n  drover init --version 1.13.2\n  drover init --version 1.13.2 --envs test,stage,production --timezone Europe/Madrid config-repo"
    )]
    Init(init::Args),
    /// After an install: check each step the agent needs, and say what to fix.
    #[command(
        after_help = "Examples:\n  drover doctor\n  drover doctor --kubeconfig ~/.kube/config --namespace drover-system"
    )]
    Doctor(doctor::Args),
    /// Run the in-cluster agent.
    #[command(
        after_help = "Examples:\n  drover agent --env production --cluster prod-eu-1 --repo-url https://github.com/example/fleet-config\n  drover agent --config /etc/drover/agent.toml"
    )]
    Agent(Box<agent::Args>),
    /// The controlled-upgrade story end to end on simulated clusters.
    #[command(
        after_help = "Examples:\n  drover demo\n  drover demo --html demo.html\n  drover demo --keep-repo demo-repo"
    )]
    Demo(demo::Args),
    /// Print a shell completion script (bash, zsh or fish).
    #[command(
        after_help = "Examples:\n  drover completion bash > /etc/bash_completion.d/drover\n  drover completion zsh > \"${fpath[1]}/_drover\"\n  drover completion fish > ~/.config/fish/completions/drover.fish"
    )]
    Completion(completion::Args),
    /// Print the manual page (roff), generated from these flags.
    #[command(after_help = "Examples:\n  drover man | man -l -")]
    Man,
    /// The version, the commit it was built from and the build date.
    #[command(after_help = "Examples:\n  drover version\n  drover version -o json")]
    Version,
}

impl Command {
    /// Commands that read the local repository only: no fetch, no API call,
    /// no child process.
    fn opens_no_connection(&self) -> bool {
        matches!(
            self,
            Command::Check(_)
                | Command::Log(_)
                | Command::Verify(_)
                | Command::Windows(_)
                | Command::Completion(_)
                | Command::Man
                | Command::Version
        )
    }
}

/// libgit2 initialises OpenSSL on its first use, and OpenSSL then parses the
/// whole system CA bundle: two thirds of `check --base`'s CPU time (47 ms
/// against 13–18 ms without), for commands that make no TLS connection. An empty
/// `SSL_CERT_FILE` makes that load find nothing (OpenSSL ignores a failed
/// default load); the agent and every command that connects keep the bundle.
fn skip_ca_bundle() {
    // Called from `main` before any thread exists, so nothing reads the
    // environment concurrently.
    std::env::set_var("SSL_CERT_FILE", "/dev/null");
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
    // A completion script asking for the environments (see `completion`).
    if std::env::var_os(completion::ASK).is_some_and(|v| v == "envs") {
        completion::envs();
        return ExitCode::SUCCESS;
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, Format::sniff(&args[1..])),
    };
    // Both before any thread starts and before libgit2's first use.
    if cli.command.opens_no_connection() {
        skip_ca_bundle();
    }
    // libgit2's caches are process-wide.
    crate::status::bound_object_cache();
    let format = cli.global.format;
    let result = resolve_repo(&mut cli).and_then(|()| run(cli));
    match result {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Rejected) => ExitCode::from(1),
        // `drover log | head`: the reader had what it wanted.
        Err(err) if is_broken_pipe(&err) => exit_on_closed_pipe(),
        Err(err) => {
            let message = explain::explain(&err);
            if format.is_document() {
                let _ = output::print_failure(format, &[Problem::from(message.clone())]);
            }
            eprintln!("drover: error: {message}");
            ExitCode::from(2)
        }
    }
}

/// A command line clap refused (exit 2), or `--help`/`--version` (exit 0).
/// Under `-o json|yaml` a refusal is the failure document on stdout as well.
fn usage_error(e: clap::Error, format: Format) -> ExitCode {
    use clap::error::ErrorKind;
    let usage = !matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if usage && format.is_document() {
        let text = e.render().to_string();
        let message = text
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("invalid command line")
            .trim_start_matches("error: ")
            .to_owned();
        let _ = output::print_failure(format, &[Problem::from(message)]);
    }
    let _ = e.print();
    ExitCode::from(if usage { 2 } else { 0 })
}

/// Set `global.repo`: `--repo` (or `DROVER_REPO_DIR`) as given, else the
/// nearest directory holding `drover.toml` from the current one upward (as
/// git finds its work tree), else the current directory, whose error then
/// says none was found. `drover init` and the agent never search.
fn resolve_repo(cli: &mut Cli) -> anyhow::Result<()> {
    let searches = !matches!(
        cli.command,
        Command::Init(_)
            | Command::Agent(_)
            | Command::Demo(_)
            | Command::Completion(_)
            | Command::Man
            | Command::Version
    );
    cli.global.repo = match &cli.global.repo_arg {
        Some(dir) => dir.clone(),
        None if searches => {
            let cwd = std::env::current_dir()?;
            find_repo_root(&cwd).unwrap_or_else(|| PathBuf::from("."))
        }
        None => PathBuf::from("."),
    };
    Ok(())
}

/// The nearest directory from `start` upward that holds `drover.toml`.
/// Stops at the root of the git work tree `start` is in (a `.git` entry),
/// as a config repository is one.
pub fn find_repo_root(start: &Path) -> Option<PathBuf> {
    for dir in start.ancestors() {
        if dir.join(crate::config::ROOT_FILE).is_file() {
            return Some(dir.to_path_buf());
        }
        if dir.join(".git").exists() {
            return None;
        }
    }
    None
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

/// Report a rejection and return [`Outcome::Rejected`] (exit 1): in text,
/// each problem on stderr; in JSON and YAML the failure document on stdout,
/// the same document every command gives for a rejection.
pub fn reject(g: &Global, problems: Vec<Problem>) -> anyhow::Result<Outcome> {
    mark_rejected();
    if g.format.is_document() {
        output::print_failure(g.format, &problems)?;
    } else {
        for p in &problems {
            eprintln!("{}", p.text());
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
        .ok_or_else(|| reject(g, vec![unknown_env(name, &cfg.root.chain)]))
}

/// The problem of an unknown `--env`, with the nearest valid name when it
/// looks like a typo, and the valid ones.
pub fn unknown_env<'a>(name: &str, valid: impl IntoIterator<Item = &'a String>) -> Problem {
    unknown("environment", name, valid)
}

/// The problem of an unknown `what` (`environment`, `cluster`) called
/// `name`: "did you mean" the nearest of `valid`, and the list.
pub fn unknown<'a>(what: &str, name: &str, valid: impl IntoIterator<Item = &'a String>) -> Problem {
    let valid: Vec<&str> = valid.into_iter().map(String::as_str).collect();
    let hint = crate::config::nearest(name, valid.iter().copied())
        .map(|n| format!("did you mean {n:?}? "))
        .unwrap_or_default();
    let list = if valid.is_empty() {
        "none".to_owned()
    } else {
        valid.join(", ")
    };
    Problem::Message {
        message: format!("unknown {what} {name:?}; {hint}valid {what}s: {list}"),
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
        Command::Wait(a) => wait::run(g, a),
        Command::Init(a) => init::run(g, a),
        Command::Doctor(a) => doctor::run(g, a),
        Command::Agent(a) => agent::run(g, *a),
        Command::Demo(a) => demo::run(g, a),
        Command::Completion(a) => completion::run(g, a, Cli::command()),
        Command::Man => completion::man(g, Cli::command()),
        Command::Version => version::run(g),
    }
}

/// With no `--repo` and no `drover.toml` found upward: the rejection that
/// says so (rather than "missing file drover.toml" about the current directory).
pub fn no_repo_found(g: &Global) -> Option<Problem> {
    if g.repo_arg.is_some() || g.repo.join(crate::config::ROOT_FILE).exists() {
        return None;
    }
    let here = std::env::current_dir().unwrap_or_else(|_| g.repo.clone());
    Some(Problem::from(format!(
        "no {} in {} or any directory above it: run drover inside a config \
         repository, pass --repo DIR, or start one with `drover init --version V`",
        crate::config::ROOT_FILE,
        here.display()
    )))
}

/// Load and validate the config repository at `--repo`. When it is invalid,
/// its diagnostics are reported as a rejection ([`reject`]) and `None` comes
/// back: the command exits 1.
pub fn load_repo(g: &Global) -> Option<crate::config::RepoConfig> {
    load_repo_at(g, chrono::Utc::now())
}

/// [`load_repo`], with freezes and the like judged at `now`.
pub fn load_repo_at(
    g: &Global,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<crate::config::RepoConfig> {
    if let Some(p) = no_repo_found(g) {
        let _ = reject(g, vec![p]);
        return None;
    }
    match crate::config::load_at(&crate::config::DirFiles::new(&g.repo), now) {
        Ok(cfg) => Some(cfg),
        Err(diags) => {
            // A failed write of the report still ends in exit 1.
            let _ = reject(g, diags.into_iter().map(Problem::from).collect());
            None
        }
    }
}

/// Open the config repository's git repository (at `--repo`, not above it).
pub fn open_git(g: &Global) -> anyhow::Result<git2::Repository> {
    git2::Repository::open(&g.repo).map_err(|e| explain::repository(&g.repo, e))
}

/// The commit HEAD points at, or why there is none, said for people.
pub fn head_commit(g: &Global, repo: &git2::Repository) -> anyhow::Result<git2::Oid> {
    let head = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|e| explain::head(&g.repo, e))?;
    Ok(head.id())
}

/// Parse a time given on the command line: RFC 3339 with a zone
/// (`2026-12-01T02:00:00Z`, `2026-12-01T03:00:00+01:00`), or a date alone,
/// meaning 00:00 UTC that day.
pub fn parse_time(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        if let Some(t) = d.and_hms_opt(0, 0, 0) {
            return Ok(t.and_utc());
        }
    }
    let zone = if chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S").is_ok()
        || chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M").is_ok()
    {
        " (a time needs its zone: add Z for UTC or an offset such as +01:00)"
    } else {
        ""
    };
    Err(format!(
        "{s:?} is not a time{zone}; give an RFC 3339 time such as 2026-12-01T02:00:00Z \
         or 2026-12-01T03:00:00+01:00, or a date such as 2026-12-01 (00:00 UTC)"
    ))
}

/// The client config of the commands that read a cluster (`doctor`, `plan
/// --kubeconfig`, `plan --preflight`): `--kubeconfig` when given, else
/// `$KUBECONFIG` (with its own error, not kube's summary of every place it
/// looked, in-cluster variables included), else in-cluster.
pub async fn kube_config(path: Option<&Path>) -> anyhow::Result<kube::Config> {
    use anyhow::Context as _;
    let (kc, shown) = match path {
        Some(path) => (
            kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        None => match std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
            Some(p) => {
                let shown = format!("KUBECONFIG {}", p.to_string_lossy());
                let kc =
                    kube::config::Kubeconfig::read().with_context(|| format!("reading {shown}"))?;
                (kc, shown)
            }
            None => {
                return kube::Config::infer()
                    .await
                    .context("no kubeconfig and not in a cluster")
            }
        },
    };
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("using {shown}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line as a shell splits it (quotes, no expansion), up to
    /// a pipe or a redirection.
    fn words(line: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut quote: Option<char> = None;
        let mut any = false;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => cur.push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    any = true;
                }
                (None, ' ') => {
                    if any || !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                    any = false;
                }
                (None, c) => cur.push(c),
            }
        }
        if any || !cur.is_empty() {
            out.push(cur);
        }
        let end = out
            .iter()
            .position(|w| w == "|" || w == ">")
            .unwrap_or(out.len());
        out.truncate(end);
        out
    }

    #[test]
    fn every_command_shows_examples_that_parse() {
        let cmd = Cli::command();
        let mut seen = 0;
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            let help = sub
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            let examples: Vec<&str> = help
                .lines()
                .filter_map(|l| l.strip_prefix("  "))
                .filter(|l| l.starts_with("drover "))
                .collect();
            assert!(
                help.starts_with("Examples:") && !examples.is_empty(),
                "{} has no examples in --help",
                sub.get_name()
            );
            for e in examples {
                let args = words(e);
                assert_eq!(args[1], sub.get_name(), "{e}");
                if let Err(err) = Cli::try_parse_from(&args) {
                    panic!("{e}: {err}");
                }
                seen += 1;
            }
        }
        assert!(seen > 30, "{seen} examples");
    }
}
