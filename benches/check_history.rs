//! `drover check --base HEAD~1` with history evidence on a 100,000-commit
//! config repository, against `git log -p -- environments/<env>.toml` on the
//! same repository in the same run.
//!
//! Run: `cargo bench --bench check_history`. The repository is built once by
//! `scripts/make-history-repo` and cached in `target/bench-data/history-100000`.

use chrono::{DateTime, TimeZone, Utc};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const COMMITS: u32 = 100_000;
const RUNS: usize = 11;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bench_repo() -> Res<PathBuf> {
    let data = crate_root().join("target/bench-data");
    let dir = data.join(format!("history-{COMMITS}"));
    if dir.join(".git").is_dir() {
        return Ok(dir);
    }
    let script = crate_root().join("scripts/make-history-repo");
    let tmp = data.join(format!("history-{COMMITS}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&data)?;
    eprintln!(
        "building {} with {} (once)",
        dir.display(),
        script.display()
    );
    let st = Command::new(&script)
        .arg(&tmp)
        .arg(COMMITS.to_string())
        .status()?;
    if !st.success() {
        return Err(format!("{} failed: {st}", script.display()).into());
    }
    // Renamed only when complete, so an interrupted build is not reused.
    std::fs::rename(&tmp, &dir)?;
    Ok(dir)
}

fn git(repo: &Path, args: &[&str]) -> Res<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<F: FnMut() -> Res<()>>(mut f: F) -> Res<Duration> {
    f()?; // warm-up: page cache and pack index
    let mut runs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        f()?;
        runs.push(t.elapsed());
    }
    Ok(median(runs))
}

fn main() -> Res<()> {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and
    // then a quick smoke run is not worth a 100,000-commit build.
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let repo = bench_repo()?;
    let changed = git(
        &repo,
        &[
            "diff",
            "--name-only",
            "HEAD~1",
            "HEAD",
            "--",
            "environments/",
        ],
    )?;
    let env_file = changed
        .lines()
        .next()
        .ok_or("HEAD changes no environment file")?
        .to_owned();
    let head_time: i64 = git(&repo, &["log", "-1", "--format=%ct", "HEAD"])?.parse()?;
    // A fixed `now` keeps the verdicts the same run to run.
    let now: DateTime<Utc> = Utc
        .timestamp_opt(head_time + 3600, 0)
        .single()
        .ok_or("bad HEAD time")?;

    let diags = drover::admit::check_base(&repo, "HEAD~1", now)?.diagnostics;
    let deep = drover::admit::check_base(&repo, "HEAD~3", now)?.diagnostics;
    let drover_t = time(|| {
        drover::admit::check_base(&repo, "HEAD~1", now)?;
        Ok(())
    })?;
    let drover3_t = time(|| {
        drover::admit::check_base(&repo, "HEAD~3", now)?;
        Ok(())
    })?;
    let git_t = time(|| {
        let st = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["log", "-p", "--", &env_file])
            .stdout(Stdio::null())
            .status()?;
        if !st.success() {
            return Err(format!("git log failed: {st}").into());
        }
        Ok(())
    })?;

    println!("repository: {} ({COMMITS} commits)", repo.display());
    println!("HEAD changes {env_file}; now = {now}");
    println!(
        "drover admit::check_base(HEAD~1): median {:?} over {RUNS} runs ({} refusals)",
        drover_t,
        diags.len()
    );
    println!(
        "drover admit::check_base(HEAD~3): median {:?} over {RUNS} runs ({} refusals)",
        drover3_t,
        deep.len()
    );
    for d in &deep {
        println!("  {d}");
    }
    println!("git log -p -- {env_file}: median {git_t:?} over {RUNS} runs");
    println!(
        "ratio git / drover(HEAD~1): {:.1}x",
        git_t.as_secs_f64() / drover_t.as_secs_f64()
    );
    Ok(())
}
