//! `drover status`: the fleet as the status branch tells it (docs/design.md §7).

use super::{parse_time, print_ok, Global, Outcome, Problem};
use crate::config::{self, DirFiles};
use crate::diag::Diagnostic;
use crate::fleet;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
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
    /// The instant to show the fleet at (windows, soaks, and the status
    /// reports as they were then: reports of states entered later are left
    /// out); default now.
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub now: Option<DateTime<Utc>>,
    /// Keep watching: fetch the status branches from origin every
    /// --interval and print the fleet again each time it changed (JSON: one
    /// document per line), until interrupted.
    #[arg(long, short = 'w')]
    pub watch: bool,
    /// Why this cluster or node is not moving: the chain of reasons, the
    /// blocker its report names, and the next time it can move (or what it
    /// waits for, or "needs a person").
    #[arg(long, value_name = "CLUSTER|NODE", conflicts_with_all = ["watch", "html"])]
    pub explain: Option<String>,
    /// How often --watch reads again.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, requires = "watch")]
    pub interval: std::time::Duration,
}

fn reject(g: &Global, errors: &[Diagnostic]) -> anyhow::Result<Outcome> {
    super::reject(g, errors.iter().cloned().map(Problem::from).collect())
}

/// Run `drover status`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let now = args.now.unwrap_or_else(Utc::now);
    std::fs::read_dir(&g.repo)
        .with_context(|| format!("cannot read the config repository {}", g.repo.display()))?;
    if let Some(p) = super::no_repo_found(g) {
        return super::reject(g, vec![p]);
    }
    let cfg = match config::load_at(&DirFiles::new(&g.repo), now) {
        Ok(c) => c,
        Err(d) => return reject(g, &d),
    };
    if let Some(env) = &args.env {
        if !cfg.root.chain.contains(env) {
            return super::reject(g, vec![super::unknown_env(env, &cfg.root.chain)]);
        }
    }
    let repo = super::open_git(g)?;
    if !args.watch {
        let view = match args.now {
            // The config, the gate and the store as they were at the instant named.
            Some(_) => {
                let commit = match config_commit_at(&repo, now)? {
                    Ok(c) => c,
                    Err(p) => return super::reject(g, vec![p]),
                };
                let files = config::GitTreeFiles::at_rev(&repo, &commit.to_string())
                    .with_context(|| format!("reading commit {commit}"))?;
                let cfg = match config::load_at(&files, now) {
                    Ok(c) => c,
                    Err(d) => {
                        let mut problems = vec![Problem::from(format!(
                            "the config in force at {} (commit {:.12}) does not load:",
                            rfc3339(now),
                            commit
                        ))];
                        problems.extend(d.into_iter().map(Problem::from));
                        return super::reject(g, problems);
                    }
                };
                if let Some(env) = &args.env {
                    if !cfg.root.chain.contains(env) {
                        return super::reject(g, vec![super::unknown_env(env, &cfg.root.chain)]);
                    }
                }
                let view = fleet::gather_at(&repo, &cfg, commit, now, args.env.as_deref())?;
                return show(g, &args, &repo, &cfg, view);
            }
            None => fleet::gather(&repo, &cfg, now, args.env.as_deref())?,
        };
        return show(g, &args, &repo, &cfg, view);
    }
    // --watch: fetch and read again every interval; print the fleet each
    // time it changed (the instant it was read for aside), until interrupted.
    let mut last: Option<fleet::Fleet> = None;
    loop {
        super::wait::fetch_status(&g.repo, &cfg.root.status_branch);
        let now = args.now.unwrap_or_else(Utc::now);
        let view = fleet::gather(&repo, &cfg, now, args.env.as_deref())?;
        let same = last
            .as_ref()
            .is_some_and(|l| fleet::Fleet { now, ..l.clone() } == view);
        if !same {
            if last.is_some() && !g.format.is_document() {
                println!();
            }
            show(g, &args, &repo, &cfg, view.clone())?;
            last = Some(view);
        }
        std::thread::sleep(args.interval.max(std::time::Duration::from_millis(10)));
    }
}

/// How many first-parent commits `--now` walks back from HEAD at most.
pub const MAX_NOW_WALK: usize = 100_000;

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The config commit in force at `at`: on HEAD's first-parent history (the
/// branch as it was merged), the newest commit committed at or before `at`;
/// a problem when `at` is before the repository's first commit or more
/// than [`MAX_NOW_WALK`] commits back.
fn config_commit_at(
    repo: &git2::Repository,
    at: DateTime<Utc>,
) -> anyhow::Result<Result<git2::Oid, Problem>> {
    let mut commit = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .context("reading HEAD")?;
    for _ in 0..MAX_NOW_WALK {
        if commit.time().seconds() <= at.timestamp() {
            return Ok(Ok(commit.id()));
        }
        if commit.parent_count() == 0 {
            let first = DateTime::from_timestamp(commit.time().seconds(), 0)
                .map_or_else(|| "an unreadable time".into(), rfc3339);
            return Ok(Err(Problem::from(format!(
                "--now {} is before the repository's first commit ({:.12}, committed {first}): \
                 there was no config then; name an instant at or after {first}",
                rfc3339(at),
                commit.id()
            ))));
        }
        commit = commit
            .parent(0)
            .context("reading the first-parent history")?;
    }
    Ok(Err(Problem::from(format!(
        "--now {} is more than {MAX_NOW_WALK} commits back on HEAD's first-parent history; \
         not read (name a later instant)",
        rfc3339(at)
    ))))
}

/// Print `view` (and write the page with `--html`). Under `--watch` a JSON
/// document is one line, so each change is one line of the stream.
fn show(
    g: &Global,
    args: &Args,
    repo: &git2::Repository,
    cfg: &config::RepoConfig,
    view: fleet::Fleet,
) -> anyhow::Result<Outcome> {
    if let Some(subject) = &args.explain {
        let calendar = |env: &str, cluster: &str| {
            cfg.envs
                .get(env)
                .and_then(|e| crate::window::Calendar::of(&e.for_cluster(cluster)).ok())
        };
        let e = match fleet::explain::explain(&view, calendar, subject) {
            Ok(e) => e,
            Err(why) => return super::reject(g, vec![Problem::from(why)]),
        };
        if g.format.is_document() {
            print_ok(g.format, &e)?;
        } else {
            print!("{}", fleet::explain::render(&e));
        }
        return Ok(Outcome::Ok);
    }
    if let Some(path) = &args.html {
        let at = view
            .config_commit
            .as_deref()
            .and_then(|c| git2::Oid::from_str(c).ok());
        let (timeline, warnings) = fleet::timeline(repo, cfg, view.now, args.env.as_deref(), at)?;
        let mut view = view.clone();
        view.warnings.extend(warnings);
        write_page(path, "drover: the fleet at a glance", &view, &timeline)?;
    }
    match (g.format, args.watch) {
        (super::Format::Json, true) => super::output::print_line(&view)?,
        (super::Format::Yaml, true) => {
            println!("---");
            print_ok(g.format, &view)?
        }
        (f, _) if f.is_document() => print_ok(g.format, &view)?,
        _ => {
            use std::io::Write;
            let mut text = fleet::text::render(&view);
            if args.watch {
                text = format!("{}\n{text}", view.now.format("%Y-%m-%d %H:%M:%S UTC"));
            }
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
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
    if !dir.is_dir() {
        anyhow::bail!(
            "cannot write {}: the directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
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
