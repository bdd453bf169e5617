//! `drover promote ENV [--to VERSION]`: prepare the pull request a person
//! would otherwise write by hand.

use super::{output, parse_time, Format, Global, Outcome, Problem};
use crate::promote::{self, Choice};
use chrono::{DateTime, Utc};
use serde_json::json;

/// Arguments of `drover promote`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The environment to promote.
    pub env: String,
    /// Promote to this version instead of the newest eligible one.
    #[arg(long, value_parser = parse_version)]
    pub to: Option<semver::Version>,
    /// Judge the gate at this time instead of now (RFC 3339).
    #[arg(long, value_parser = parse_time)]
    pub now: Option<DateTime<Utc>>,
    /// Only say what would be promoted; create no branch or commit.
    #[arg(long)]
    pub dry_run: bool,
}

fn parse_version(s: &str) -> Result<semver::Version, String> {
    semver::Version::parse(s).map_err(|e| format!("expected an exact version such as 1.13.2: {e}"))
}

/// Run `drover promote`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let Some(cfg) = super::load_repo(g) else {
        if !g.format.is_document() {
            eprintln!("drover promote: the repository does not pass `drover check`; fix it first");
        }
        return Ok(Outcome::Rejected);
    };
    // An unknown name is a rejection like every command's, with the
    // nearest name (`prod`: did you mean "production"?).
    if let Err(rejected) = super::known_env(g, &cfg, &args.env) {
        return rejected;
    }
    let repo = super::open_git(g)?;
    let now = args.now.unwrap_or_else(Utc::now);
    let choice = match promote::choose(&repo, &cfg, &args.env, args.to.as_ref(), now) {
        Ok(c) => c,
        Err(e @ (promote::Error::UnknownEnv { .. } | promote::Error::FirstInChain(_))) => {
            report_refusal(g.format, &args.env, &[e.to_string()])?;
            return Ok(Outcome::Rejected);
        }
        Err(e) => return Err(e.into()),
    };
    let proposal = match choice {
        Choice::Promote(p) => p,
        Choice::Nothing(why) => {
            report_refusal(g.format, &args.env, &why)?;
            return Ok(Outcome::Rejected);
        }
    };
    let commit = if args.dry_run {
        None
    } else {
        Some(promote::write_branch(&g.repo, &proposal, None)?)
    };
    match g.format {
        f if f.is_document() => output::print_ok(
            f,
            &json!({
                "env": proposal.env,
                "from": proposal.from.to_string(),
                "to": proposal.to.to_string(),
                "branch": proposal.branch,
                "commit": commit,
                "evidence": proposal.allowed.to_string(),
            }),
        )?,
        _ => {
            println!("{}", proposal.allowed);
            match &commit {
                Some(c) => println!(
                    "created branch {} with commit {}: push it and open the pull request",
                    proposal.branch,
                    &c[..c.len().min(12)]
                ),
                None => println!("dry run: would create branch {}", proposal.branch),
            }
        }
    }
    Ok(Outcome::Ok)
}

fn report_refusal(format: Format, env: &str, why: &[String]) -> anyhow::Result<()> {
    super::mark_rejected();
    match format {
        f if f.is_document() => {
            let errors: Vec<Problem> = why.iter().cloned().map(Problem::from).collect();
            output::print_document(f, false, &errors, &json!({ "env": env, "refusals": why }))
        }
        _ => {
            println!("nothing to promote for {env}:");
            for w in why {
                println!("  - {w}");
            }
            Ok(())
        }
    }
}
