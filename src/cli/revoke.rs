//! `drover revoke VERSION --reason TEXT`: prepare the pull request that
//! stops a bad OS release fleet-wide, as `drover promote` prepares one.

use super::{print_ok, reject, Global, Outcome, Problem};
use crate::revoke;
use serde_json::json;

/// Arguments of `drover revoke`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The version no environment may move to again, exact (such as 1.13.1).
    pub version: String,
    /// Why: one line, kept in drover.toml, the commit and every refusal.
    #[arg(long)]
    pub reason: String,
    /// Only say what would be revoked; create no branch or commit.
    #[arg(long)]
    pub dry_run: bool,
}

/// Run `drover revoke`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let Some(cfg) = super::load_repo(g) else {
        if !g.format.is_document() {
            eprintln!("drover revoke: the repository does not pass `drover check`; fix it first");
        }
        return Ok(Outcome::Rejected);
    };
    let written = revoke::prepare(&cfg, &args.version, &args.reason).and_then(|r| {
        let commit = match args.dry_run {
            true => None,
            false => Some(revoke::write_branch(&g.repo, &r, None)?),
        };
        Ok((r, commit))
    });
    let (revocation, commit) = match written {
        Ok(w) => w,
        Err(e) if e.is_rejection() => return reject(g, vec![Problem::from(e.to_string())]),
        Err(e) => return Err(e.into()),
    };
    let revoke::Revocation {
        entry,
        pinned,
        branch,
    } = &revocation;
    match g.format.is_document() {
        true => print_ok(
            g.format,
            &json!({
                "version": entry.version.to_string(),
                "reason": entry.reason,
                "pinned": pinned,
                "branch": branch,
                "commit": commit,
            }),
        )?,
        false => {
            println!(
                "revoking {}: {} (no environment may move to it once merged)",
                entry.version, entry.reason
            );
            if let Some(note) = revocation.pinned_note() {
                println!("note: {note}");
            }
            match &commit {
                Some(c) => println!(
                    "created branch {branch} with commit {}: push it and open the pull request",
                    &c[..c.len().min(12)]
                ),
                None => println!("dry run: would create branch {branch}"),
            }
        }
    }
    Ok(Outcome::Ok)
}
