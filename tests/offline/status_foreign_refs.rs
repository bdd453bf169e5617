//! Refs under the status namespace that name no cluster the config lists
//! are bounded by never being read (docs/status.md, "Bounds"): `drover
//! check --base` looks up each listed cluster's branch by its name, and the
//! agent's fetch takes only those. 20,000 such refs here (always run); the
//! 300,000 of the issue are `benches/foreign_refs.rs` (BENCHMARKS.md).

use crate::status_branches::{passes, Fixture};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FOREIGN: usize = 20_000;

/// Add `n` packed refs at `target` under `refs/heads/drover/status.d/`,
/// naming no listed cluster (half under production, half under no
/// environment), beside the repository's own refs.
fn flood(repo: &Path, n: usize, target: &str) {
    crate::support::git::git(repo, &["pack-refs", "--all"]);
    let path = repo.join(".git/packed-refs");
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    lines.extend((0..n).map(|i| match i % 2 {
        0 => format!("{target} refs/heads/drover/status.d/production/junk-{i:06}"),
        _ => format!("{target} refs/heads/drover/status.d/x/{i:06}/y"),
    }));
    lines.sort_by(|a, b| a[41..].cmp(&b[41..]));
    let text: String = std::iter::once("# pack-refs with: peeled fully-peeled sorted ".to_owned())
        .chain(lines)
        .map(|l| l + "\n")
        .collect();
    std::fs::write(path, text).unwrap();
}

/// `drover check --base main` of `f`: its peak RSS (KiB, its own, from
/// wait4) and its output.
// Waited for with wait4, which std's Child does not know of.
#[allow(clippy::zombie_processes)]
fn check_rss(f: &Fixture) -> (i64, i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["check", "--repo", f.repo.to_str().unwrap()])
        .args(["--base", "main", "--now", "2026-12-20T12:00:00Z"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    let mut err = String::new();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        stderr.read_to_string(&mut err).unwrap();
        err
    });
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let err = reader.join().unwrap();
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for this child alone.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: the pid is this test's own child, not yet waited for.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(waited, pid);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (ru.ru_maxrss, code, format!("{out}{err}"))
}

#[test]
fn refs_the_config_does_not_list_are_neither_read_by_check_nor_fetched_by_the_agent() {
    let f = Fixture::plain();
    f.stage_1_confirmed();
    f.production_pr();
    let (quiet, code, out) = check_rss(&f);
    assert_eq!(code, 0, "{out}");
    let main = crate::support::git::git(&f.repo, &["rev-parse", "main"]);
    flood(&f.repo, FOREIGN, &main);
    let t0 = Instant::now();
    let (flooded, code, out) = check_rss(&f);
    let took = t0.elapsed();
    // The genuine confirmation still passes; no foreign ref is named.
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("junk") && !out.contains("/y"), "{out}");
    assert!(
        flooded < quiet + 4 * 1024,
        "check --base took {flooded} KiB with {FOREIGN} foreign refs, {quiet} KiB without"
    );
    assert!(took < Duration::from_secs(10), "check --base took {took:?}");
    passes(&f);

    // The agent's fetch from this repository, as production's prod-1: its
    // cache holds the branches its config lists (stage-1's), nothing else.
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = drover::source::SourceConfig::new(f.repo.to_str().unwrap(), cache.path());
    cfg.branch = "pr".into();
    let mut src = drover::source::Source::open(cfg).unwrap();
    let t0 = Instant::now();
    src.fetch_scoped(|repo, head| {
        drover::admit::status_scope(repo, &[head], "production", "prod-1")
    })
    .unwrap();
    let took = t0.elapsed();
    let fetched: Vec<String> = src
        .repo()
        .references_glob("refs/remotes/origin/drover/*")
        .unwrap()
        .flatten()
        .filter_map(|r| r.name().ok().map(str::to_owned))
        .collect();
    assert_eq!(
        fetched,
        ["refs/remotes/origin/drover/status.d/stage/stage-1"],
        "{fetched:?}"
    );
    assert!(took < Duration::from_secs(20), "the fetch took {took:?}");
}
