//! `drover status`: the fleet as the status branch tells it (docs/design.md §7).

use super::{parse_time, print_json, Format, Global, Outcome};
use crate::config::{self, DirFiles, ROOT_FILE};
use crate::diag::Diagnostic;
use crate::fleet;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Arguments of `drover status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this environment.
    #[arg(long)]
    pub env: Option<String>,
    /// Also write the timeline page (one self-contained HTML file) here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// The instant to show the fleet at (windows, soaks); default now.
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub now: Option<DateTime<Utc>>,
}

#[derive(Serialize)]
struct Rejection<'a> {
    ok: bool,
    errors: &'a [Diagnostic],
}

fn reject(g: &Global, errors: &[Diagnostic]) -> anyhow::Result<Outcome> {
    match g.format {
        Format::Json => print_json(&Rejection { ok: false, errors })?,
        Format::Text => {
            for e in errors {
                eprintln!("{e}");
            }
        }
    }
    Ok(Outcome::Rejected)
}

/// Run `drover status`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let now = args.now.unwrap_or_else(Utc::now);
    std::fs::read_dir(&g.repo)
        .with_context(|| format!("cannot read the config repository {}", g.repo.display()))?;
    let cfg = match config::load_at(&DirFiles::new(&g.repo), now) {
        Ok(c) => c,
        Err(d) => return reject(g, &d),
    };
    if let Some(env) = &args.env {
        if !cfg.root.chain.contains(env) {
            return reject(
                g,
                &[Diagnostic::file(
                    ROOT_FILE,
                    format!(
                        "unknown environment {env:?}; valid environments: {}",
                        cfg.root.chain.join(", ")
                    ),
                )],
            );
        }
    }
    let repo = git2::Repository::open(&g.repo).with_context(|| {
        format!(
            "{} is not a git repository: the status branch is read from git",
            g.repo.display()
        )
    })?;
    let view = fleet::gather(&repo, &cfg, now, args.env.as_deref())?;
    if let Some(path) = &args.html {
        let (timeline, warnings) = fleet::timeline(&repo, &cfg, now, args.env.as_deref())?;
        let mut view = view.clone();
        view.warnings.extend(warnings);
        write_page(path, "drover: the fleet at a glance", &view, &timeline)?;
    }
    match g.format {
        Format::Json => print_json(&view)?,
        Format::Text => {
            use std::io::Write;
            let text = fleet::text::render(&view);
            match std::io::stdout().lock().write_all(text.as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
                _ => {}
            }
        }
    }
    Ok(Outcome::Ok)
}

/// Write the timeline page to `path` (through a temporary file in the same
/// directory, so a reader never sees half a page).
pub fn write_page(
    path: &Path,
    title: &str,
    view: &fleet::Fleet,
    timeline: &fleet::Timeline,
) -> anyhow::Result<()> {
    let page = fleet::html::page(title, view, timeline);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write {}", path.display()))?;
    std::io::Write::write_all(&mut tmp, page.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    // A page is for sharing: readable like any file the user writes (the
    // temporary file starts private).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("drover: wrote the timeline page to {}", path.display());
    Ok(())
}
