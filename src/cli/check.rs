//! `drover check`: validate the config repository's working tree and, with
//! `--base`, judge version changes against the promotion gate (docs/design.md §4).

use super::{parse_time, print_json, Format, Global, Outcome};
use crate::config::{self, DirFiles, RepoConfig};
use crate::diag::Diagnostic;
use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// Arguments of `drover check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Also judge every environment whose version changed between REV and
    /// HEAD against the promotion gate (use the pull request's base, such as
    /// origin/main).
    #[arg(long, value_name = "REV")]
    pub base: Option<String>,
    /// The time soak periods and window overlaps are measured from (default: now).
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub now: Option<DateTime<Utc>>,
}

/// The JSON document of docs/design.md §7, plus the status reports the
/// gate ignored (each with its path, commit and why).
#[derive(Debug, Serialize)]
struct Report<'a> {
    ok: bool,
    errors: &'a [Diagnostic],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    ignored_reports: &'a [String],
}

/// Run `drover check`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let repo = &g.repo;
    // A missing or unreadable directory is "could not run" (exit 2), not a
    // config error: nothing was judged.
    std::fs::read_dir(repo)
        .with_context(|| format!("cannot read the config repository {}", repo.display()))?;

    let now = args.now.unwrap_or_else(Utc::now);
    let (config, mut errors) = match config::load_at(&DirFiles::new(repo), now) {
        Ok(c) => (Some(c), Vec::new()),
        Err(d) => (None, d),
    };

    // The gate judges versions of a config that is known to be valid; on
    // an invalid tree its verdicts would be noise on top of the real errors.
    let mut ignored = Vec::new();
    if let (Some(base), Some(_)) = (&args.base, &config) {
        let gate = crate::admit::check_base(repo, base, now)
            .with_context(|| format!("cannot judge the changes since {base}"))?;
        errors.extend(gate.diagnostics);
        ignored = gate.warnings;
    }

    let ok = errors.is_empty();
    if !ok {
        super::mark_rejected();
    }
    if g.format == Format::Text {
        // Named whether or not the check passes: an ignored report is a
        // forgery, a misconfigured agent, or a key that needs listing.
        for i in &ignored {
            eprintln!("note: ignored status report {i}");
        }
    }
    match g.format {
        Format::Json => print_json(&Report {
            ok,
            errors: &errors,
            ignored_reports: &ignored,
        })?,
        Format::Text => match (&config, ok) {
            (Some(c), true) => println!("{}", summary(c)),
            _ => {
                for e in &errors {
                    println!("{e}");
                }
                let n = errors.len();
                eprintln!("drover check: {n} error{}", if n == 1 { "" } else { "s" });
            }
        },
    }
    Ok(if ok { Outcome::Ok } else { Outcome::Rejected })
}

/// `ok: 3 environments (test 1.12.0, stage 1.12.0, production 1.12.0)`.
fn summary(c: &RepoConfig) -> String {
    let envs: Vec<String> = c
        .root
        .chain
        .iter()
        .filter_map(|e| c.envs.get(e).map(|env| format!("{e} {}", env.version)))
        .collect();
    let n = envs.len();
    format!(
        "ok: {n} environment{} ({})",
        if n == 1 { "" } else { "s" },
        envs.join(", ")
    )
}
