//! `drover verify`: the trust check of docs/design.md §6 on the repository as it stands.
//!
//! Without `--since`, `--mode all` checks every commit reachable from HEAD
//! (the whole history must be signed); with it, the commits after `--since`,
//! and HEAD must descend from `--since`.
//!
//! A commit is trusted when its SSH signature verifies against
//! `--allowed-signers` or its OpenPGP signature against `--openpgp-keys`
//! (e.g. GitHub's web-flow key, which signs what the merge button makes);
//! at least one of the two is required.

use super::{output, Global, Outcome, Problem};
use crate::trust::{self, AllowedSigners, Mode, OpenPgpKeys, Signers};
use anyhow::Context;
use serde_json::json;
use std::path::PathBuf;

/// Arguments of `drover verify`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("signers").required(true).multiple(true)))]
pub struct Args {
    /// Allowed-signers file in git's SSH format: who may sign with SSH keys.
    #[arg(long, value_name = "FILE", group = "signers")]
    pub allowed_signers: Option<PathBuf>,
    /// Armored OpenPGP public keys (one or more, e.g. GitHub's
    /// https://github.com/web-flow.gpg), or a directory of such files: who
    /// may sign with OpenPGP keys.
    #[arg(long, value_name = "FILE", group = "signers")]
    pub openpgp_keys: Option<PathBuf>,
    /// The last trusted commit: check only what came after it.
    #[arg(long, value_name = "REV")]
    pub since: Option<String>,
    /// `all`: every commit after --since (or the whole history); `head`: HEAD only.
    #[arg(long, value_enum, default_value_t = VerifyMode::All)]
    pub mode: VerifyMode,
}

/// Modes `drover verify` takes (`off` makes no sense for a check).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifyMode {
    /// Only HEAD must be signed.
    Head,
    /// Every commit must be signed.
    All,
}

/// Run `drover verify`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let ssh = match &args.allowed_signers {
        Some(p) => AllowedSigners::load(p)?,
        None => AllowedSigners::default(),
    };
    let openpgp = match &args.openpgp_keys {
        Some(p) => OpenPgpKeys::load(p)?,
        None => OpenPgpKeys::default(),
    };
    let signers = Signers {
        ssh: &ssh,
        openpgp: &openpgp,
    };
    let repo = super::open_git(g)?;
    let head = super::head_commit(g, &repo)?;
    let since = match &args.since {
        Some(rev) => Some(
            repo.revparse_single(rev)
                .and_then(|o| o.peel_to_commit())
                .with_context(|| format!("--since {rev}: no such commit"))?
                .id(),
        ),
        None => None,
    };
    let mode = match args.mode {
        VerifyMode::Head => Mode::Head,
        VerifyMode::All => Mode::All,
    };
    let mode_name = if mode == Mode::Head { "head" } else { "all" };
    // No fetch history here: every checked commit counts as first seen now,
    // so a key past its valid-before refuses even a backdated commit.
    let now = chrono::Utc::now().timestamp();
    let result = trust::check(&repo, mode, signers, since, head, &|_| now);
    let (ok, checked, signer, error) = match result {
        Ok(c) => (true, c.checked, c.head_signer, None),
        Err(trust::Error::Refused(r)) => (false, 0, None, Some(r)),
        Err(e) => return Err(e.into()),
    };
    if !ok {
        super::mark_rejected();
    }
    if g.format.is_document() {
        let errors: Vec<Problem> = error
            .iter()
            .map(|r| Problem::Commit {
                message: r.to_string(),
                commit: r.commit.clone(),
                reason: r.reason.code().to_owned(),
            })
            .collect();
        let body = json!({
            "mode": mode_name,
            "head": head.to_string(),
            "since": since.map(|s| s.to_string()),
            "checked": checked,
            "signer": signer.as_ref().map(|s| &s.principal),
            // The first error again, where scripts written before `errors` look.
            "error": error.as_ref().map(|r| json!({
                "commit": r.commit,
                "reason": r.reason.code(),
                "message": r.to_string(),
            })),
        });
        output::print_document(g.format, ok, &errors, &body)?;
    } else {
        match (&error, &signer) {
            (Some(r), _) => println!("refused: {r}"),
            (None, Some(s)) => println!(
                "ok: {checked} commit(s) verified; HEAD {head} signed by {} ({})",
                s.principal, s.fingerprint
            ),
            (None, None) => println!("ok: {checked} commit(s) verified"),
        }
    }
    Ok(if ok { Outcome::Ok } else { Outcome::Rejected })
}
