//! `drover check`: validate the config repository's working tree and, with
//! `--base`, judge version changes against the promotion gate (docs/design.md §4).

use super::{output, parse_time, Global, Outcome, Problem};
use crate::config::{self, DirFiles, RepoConfig};
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

/// The fields `drover check` adds to the document (docs/cli.schema.json):
/// the status reports the gate ignored, each with its path, commit and why.
#[derive(Debug, Serialize)]
struct Report<'a> {
    #[serde(skip_serializing_if = "<[IgnoredReport]>::is_empty")]
    ignored_reports: &'a [IgnoredReport],
}

/// A status report the gate did not count, and why.
#[derive(Debug, Serialize)]
struct IgnoredReport {
    env: String,
    cluster: String,
    /// The report's file on the status branch.
    path: String,
    /// The status commit that wrote it.
    commit: String,
    /// Why it does not count.
    reason: String,
}

impl From<&crate::status::Ignored> for IgnoredReport {
    fn from(i: &crate::status::Ignored) -> Self {
        IgnoredReport {
            env: i.env.clone(),
            cluster: i.cluster.clone(),
            path: crate::status::report_path(&i.env, &i.cluster),
            commit: i.commit.clone(),
            reason: i.why.clone(),
        }
    }
}

/// Run `drover check`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let repo = &g.repo;
    // A missing or unreadable directory is "could not run" (exit 2), not a
    // config error: nothing was judged.
    std::fs::read_dir(repo)
        .with_context(|| format!("cannot read the config repository {}", repo.display()))?;

    if let Some(p) = super::no_repo_found(g) {
        return super::reject(g, vec![p]);
    }
    let now = args.now.unwrap_or_else(Utc::now);
    let (config, mut errors) = match config::load_at(&DirFiles::new(repo), now) {
        Ok(c) => (Some(c), Vec::new()),
        Err(d) => (None, d),
    };

    // The gate judges versions of a config that is known to be valid; on
    // an invalid tree its verdicts would be noise on top of the real errors.
    let mut ignored = Vec::new();
    let mut ignored_reports = Vec::new();
    if let (Some(base), Some(_)) = (&args.base, &config) {
        let gate = crate::admit::check_base(repo, base, now)
            .with_context(|| format!("cannot judge the changes since {base}"))?;
        errors.extend(gate.diagnostics);
        ignored = gate.warnings;
        ignored_reports = gate.ignored.iter().map(IgnoredReport::from).collect();
    }

    let ok = errors.is_empty();
    if !ok {
        super::mark_rejected();
    }
    if !g.format.is_document() {
        // Named whether or not the check passes: an ignored report is a
        // forgery, a misconfigured agent, or a key that needs listing.
        for i in &ignored {
            eprintln!("note: ignored status report {i}");
        }
    }
    if g.format.is_document() {
        let problems: Vec<Problem> = errors.iter().cloned().map(Problem::from).collect();
        output::print_document(
            g.format,
            ok,
            &problems,
            &Report {
                ignored_reports: &ignored_reports,
            },
        )?;
    } else {
        match (&config, ok) {
            (Some(c), true) => println!("{}", summary(c)),
            _ => {
                for e in &errors {
                    println!("{e}");
                }
                let n = errors.len();
                eprintln!("drover check: {n} error{}", if n == 1 { "" } else { "s" });
            }
        }
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
