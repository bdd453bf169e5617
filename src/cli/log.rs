//! `drover log`: version history from git, newest first (docs/design.md §7).

use super::{print_json, Format, Global, Outcome};
use crate::audit::{self, LogOptions};
use crate::config::Files as _;
use crate::trust::{AllowedSigners, OpenPgpKeys, Signers};
use anyhow::Context;
use std::path::PathBuf;

/// Arguments of `drover log`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this environment.
    #[arg(long)]
    pub env: Option<String>,
    /// Verify commit signatures against this allowed-signers file (SSH keys).
    #[arg(long, value_name = "FILE")]
    pub allowed_signers: Option<PathBuf>,
    /// Verify commit signatures against these armored OpenPGP keys (a file or
    /// a directory of files), e.g. GitHub's web-flow key.
    #[arg(long, value_name = "FILE")]
    pub openpgp_keys: Option<PathBuf>,
    /// Branch holding the status reports whose confirmations are shown
    /// (default: `[promotion] status_branch` of the config at HEAD).
    #[arg(long)]
    pub status_branch: Option<String>,
}

/// Run `drover log`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    // Like git itself, trust the local object store instead of re-hashing every
    // object read: hashing was a third of the time on a 100,000-commit history.
    git2::opts::strict_hash_verification(false);
    // The walk reads each object once; libgit2's object cache only costs
    // inserts and a large free at exit.
    git2::opts::enable_caching(false);
    no_fastbins();
    let repo = git2::Repository::open(&g.repo)
        .with_context(|| format!("cannot open the repository at {}", g.repo.display()))?;
    let head = repo
        .head()?
        .peel_to_commit()
        .context("HEAD is not a commit")?
        .id();
    // An unknown environment is a rejection, as in `windows` and `plan`; the
    // environments are those with a file at HEAD.
    if let Some(env) = &args.env {
        let files = crate::config::GitTreeFiles::new(&repo, repo.find_commit(head)?.tree()?);
        let known: Vec<String> = files
            .list(crate::config::ENV_DIR)
            .into_iter()
            .filter(|e| e.kind == crate::config::EntryKind::File)
            .filter_map(|e| e.name.strip_suffix(".toml").map(str::to_owned))
            .collect();
        if !known.contains(env) {
            return super::reject(g, vec![super::unknown_env(env, &known)]);
        }
    }
    let ssh = args
        .allowed_signers
        .as_deref()
        .map(AllowedSigners::load)
        .transpose()?;
    let openpgp = args
        .openpgp_keys
        .as_deref()
        .map(OpenPgpKeys::load)
        .transpose()?;
    // Signers are shown only when some were given; either kind may be missing.
    let signers = (ssh.is_some() || openpgp.is_some()).then(|| Signers {
        ssh: ssh.as_ref().unwrap_or(Signers::NONE.ssh),
        openpgp: openpgp.as_ref().unwrap_or(Signers::NONE.openpgp),
    });
    // Confirmations are read as the gate reads them: the status branch and
    // the report signers of the policy at HEAD.
    let policy = crate::admit::snapshot(&repo, head, chrono::Utc::now())
        .ok()
        .and_then(Result::ok)
        .map(|s| s.policy);
    let branch = args
        .status_branch
        .clone()
        .or_else(|| policy.as_ref().map(|p| p.status_branch.clone()))
        .unwrap_or_else(|| crate::config::DEFAULT_STATUS_BRANCH.to_owned());
    let report_signers = policy
        .as_ref()
        .and_then(|p| p.signers_text.as_deref())
        .and_then(|t| AllowedSigners::parse(t).ok());
    let store = crate::status::find_store(&repo, &branch)
        .ok()
        .filter(|s| !s.is_empty());
    let opts = LogOptions {
        env: args.env.as_deref(),
        signers,
        status: store.as_ref(),
        report_signers: report_signers.as_ref(),
    };
    let changes = audit::version_history(&repo, head, &opts)?;
    match g.format {
        Format::Json => print_json(&changes)?,
        Format::Text => {
            use std::io::Write;
            let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
            writeln!(
                out,
                "{:<20}  {:<12} {:<10} {:<10} {:<10} {:>6}  {:<28} {:<24} CONFIRMED BY",
                "DATE", "ENV", "VERSION", "PREVIOUS", "COMMIT", "PR", "AUTHOR", "SIGNER"
            )?;
            for c in &changes {
                let signer = match (&c.signer, c.verified) {
                    (Some(s), true) => s.clone(),
                    _ if signers.is_some() => "(not verified)".into(),
                    _ => "-".into(),
                };
                let confirmed: Vec<String> = c
                    .confirmations
                    .iter()
                    .map(|k| format!("{} {}", k.cluster, k.since))
                    .collect();
                writeln!(
                    out,
                    "{:<20}  {:<12} {:<10} {:<10} {:<10} {:>6}  {:<28} {:<24} {}",
                    c.date,
                    c.env,
                    c.version,
                    c.previous.as_deref().unwrap_or("-"),
                    &c.commit[..10],
                    c.pr.map(|n| format!("#{n}")).unwrap_or_else(|| "-".into()),
                    c.author,
                    signer,
                    if confirmed.is_empty() {
                        "-".into()
                    } else {
                        confirmed.join(", ")
                    }
                )?;
            }
            out.flush()?;
        }
    }
    // The process exits next: freeing the changes and libgit2's delta-base
    // cache one allocation at a time took 8% of a 100,000-commit log, and the
    // kernel takes the pages back at once anyway.
    std::mem::forget(changes);
    std::mem::forget(repo);
    Ok(Outcome::Ok)
}

/// Turn off glibc's fastbins for this short-lived process.
///
/// libgit2 allocates and frees a zlib stream (two blocks, one of 32 KiB) for
/// every object it inflates; each such large request first consolidates the
/// fastbins, which was a sixth of a long `drover log`. Without fastbins small
/// blocks still come from the per-thread cache.
fn no_fastbins() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; `drover log` runs on
    // one thread and no allocation is in flight across this call.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
    }
}
