//! `drover log`: version history from git, newest first (docs/design.md §7),
//! with the status branches' confirmations and failures and the revocations.

use super::{print_ok, Format, Global, Outcome};
use crate::audit::{self, History, LogOptions};
use crate::config::Files as _;
use crate::trust::{AllowedSigners, OpenPgpKeys, Signers};
use std::path::PathBuf;

/// Arguments of `drover log`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this environment.
    #[arg(long)]
    pub env: Option<String>,
    /// Text: no header line, for scripts.
    #[arg(long)]
    pub no_headers: bool,
    /// Verify commit signatures against this allowed-signers file (SSH keys).
    #[arg(long, value_name = "FILE")]
    pub allowed_signers: Option<PathBuf>,
    /// Verify commit signatures against these armored OpenPGP keys (a file or
    /// a directory of files), e.g. GitHub's web-flow key.
    #[arg(long, value_name = "FILE")]
    pub openpgp_keys: Option<PathBuf>,
    /// Status branch name whose reports' confirmations are shown: each
    /// cluster's branch `<name>.d/<env>/<cluster>` (and the single `<name>`
    /// of the older layout); default `[promotion] status_branch` at HEAD.
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
    let repo = super::open_git(g)?;
    let head = super::head_commit(g, &repo)?;
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
    // The clusters HEAD's config lists; without one, every ref of the
    // namespace (bounded: status::Scope::Every).
    let listed = policy.as_ref().map(|p| p.clusters.clone());
    let scope = listed
        .as_ref()
        .map_or(crate::status::Scope::Every, crate::status::Scope::Listed);
    let store = crate::status::find_store(&repo, &branch, scope)
        .ok()
        .filter(|s| !s.is_empty());
    let opts = LogOptions {
        env: args.env.as_deref(),
        signers,
        status: store.as_ref(),
        report_signers: report_signers.as_ref(),
    };
    let history = audit::history(&repo, head, &opts)?;
    if g.format.is_document() {
        print_ok(g.format, &history)?;
    } else {
        print_text(
            &history,
            signers.is_some(),
            g.format == Format::Wide,
            !args.no_headers,
        )?;
    }
    // The process exits next: freeing the changes and libgit2's delta-base
    // cache one allocation at a time took 8% of a 100,000-commit log, and the
    // kernel takes the pages back at once anyway.
    std::mem::forget(history);
    std::mem::forget(repo);
    Ok(Outcome::Ok)
}

/// The history as a table whose columns fit their widest value, changes
/// and revocations merged newest first; `wide` keeps commit ids whole.
fn print_text(h: &History, verifying: bool, wide: bool, headers: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let short = |c: &str| {
        if wide {
            c.to_owned()
        } else {
            c[..c.len().min(10)].to_owned()
        }
    };
    let signer = |s: &Option<String>, verified: bool| match (s, verified) {
        (Some(s), true) => s.clone(),
        _ if verifying => "(not verified)".into(),
        _ => "-".into(),
    };
    let pr = |n: Option<u64>| n.map_or_else(|| "-".into(), |n| format!("#{n}"));
    let mut rows: Vec<[String; 9]> = Vec::with_capacity(h.changes.len() + h.revocations.len());
    let (mut c, mut r) = (h.changes.iter().peekable(), h.revocations.iter().peekable());
    loop {
        // Both lists are newest first; take the newer head.
        let take_change = match (c.peek(), r.peek()) {
            (Some(ch), Some(rv)) => ch.date >= rv.date,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if take_change {
            let Some(ch) = c.next() else { break };
            let mut reports: Vec<String> = ch
                .confirmations
                .iter()
                .map(|k| format!("{} confirmed {}", k.cluster, k.since))
                .collect();
            reports.extend(
                ch.failures
                    .iter()
                    .map(|f| format!("{} FAILED {}", f.cluster, f.since)),
            );
            rows.push([
                ch.date.clone(),
                ch.env.clone(),
                ch.version.clone(),
                ch.previous.clone().unwrap_or_else(|| "-".into()),
                short(&ch.commit),
                pr(ch.pr),
                ch.author.clone(),
                signer(&ch.signer, ch.verified),
                if reports.is_empty() {
                    "-".into()
                } else {
                    reports.join(", ")
                },
            ]);
        } else {
            let Some(rv) = r.next() else { break };
            rows.push([
                rv.date.clone(),
                "(all)".into(),
                rv.version.clone(),
                "-".into(),
                short(&rv.commit),
                pr(rv.pr),
                rv.author.clone(),
                signer(&rv.signer, rv.verified),
                format!("REVOKED: {}", rv.reason),
            ]);
        }
    }
    // Authors, signers and revocation reasons are others' text: escaped
    // before the columns are measured.
    for cell in rows.iter_mut().flatten() {
        if let std::borrow::Cow::Owned(e) = crate::terminal::escape(cell) {
            *cell = e;
        }
    }
    let header = [
        "DATE", "ENV", "VERSION", "PREVIOUS", "COMMIT", "PR", "AUTHOR", "SIGNER", "REPORTS",
    ];
    let mut width = header.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 9]| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let pad = width[i] - cell.chars().count();
                s.push_str(cell);
                s.push_str(&" ".repeat(pad + 2));
            }
        }
        s.push('\n');
        s
    };
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    if headers {
        out.write_all(line(header).as_bytes())?;
    }
    for row in &rows {
        out.write_all(line(row.each_ref().map(String::as_str)).as_bytes())?;
    }
    out.flush()?;
    Ok(())
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
