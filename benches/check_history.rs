//! `drover check --base HEAD~3` with history evidence on the 100,000-commit
//! repository of `scripts/make-history-repo`, against the git commands that
//! answer the same question, both run as processes, alternating in the same
//! run (BENCHMARKS.md, "drover check --base").
//!
//! HEAD~3..HEAD bumps all three environments of the chain, so the check walks
//! history twice: `stage`'s new version is judged on `test`'s first-parent
//! history and `production`'s on `stage`'s, each from the base back to the
//! commit that set the lower environment's version. The git baseline asks
//! git the same: which environment files changed (`git diff --name-only`),
//! then, per gated change, the newest first-parent commit of the base that
//! changed the lower environment's `version` line (`git log --first-parent
//! -n1 -G`).
//!
//! Goal: drover's median within 3× of git's for an optimised build (drover
//! also parses and validates the config at both commits, reads the status
//! branches and takes the lower environment's commit times monotone over up
//! to 1,000 ancestors, none of which git is asked to do); a debug build
//! (`--profile dev`) is held to 15×, a regression bound. The bench checks
//! the work was done: the JSON document judges `stage` and `production`,
//! and git found a commit for each walk. The process exits non-zero when
//! either fails.
//!
//! Run: `cargo bench --bench check_history`. The repository is built once by
//! `scripts/make-history-repo` and cached in `target/bench-data/history-100000`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const COMMITS: u32 = 100_000;
const ROUNDS: usize = 11;
const BASE: &str = "HEAD~3";
/// drover's median may be at most this many times git's: the goal for an
/// optimised build, a regression bound for a debug one (same profile as this bench).
const GOAL_RATIO: f64 = if cfg!(debug_assertions) { 15.0 } else { 3.0 };

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
        .stderr(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(format!("git {args:?} failed: {}", out.status).into());
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The chain's lower neighbour of each environment, from the repository's drover.toml.
fn chain(repo: &Path) -> Res<Vec<String>> {
    let root: toml::Table = git(repo, &["show", "HEAD:drover.toml"])?.parse()?;
    let chain = root["promotion"]["chain"]
        .as_array()
        .ok_or("drover.toml has no promotion.chain")?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    Ok(chain)
}

/// The git baseline: what changed, then per gated change the commit that set
/// the lower environment's version. Returns the commits found.
fn git_answer(repo: &Path, chain: &[String]) -> Res<Vec<String>> {
    let changed = git(
        repo,
        &["diff", "--name-only", BASE, "HEAD", "--", "environments/"],
    )?;
    let mut found = Vec::new();
    for pair in chain.windows(2) {
        let (lower, env) = (&pair[0], &pair[1]);
        if !changed
            .lines()
            .any(|f| f == format!("environments/{env}.toml"))
        {
            continue;
        }
        let commit = git(
            repo,
            &[
                "log",
                "--first-parent",
                "-n1",
                "-G^version = ",
                "--format=%H %ct",
                BASE,
                "--",
                &format!("environments/{lower}.toml"),
            ],
        )?;
        if commit.is_empty() {
            return Err(format!("git found no commit that set {lower}'s version").into());
        }
        found.push(commit);
    }
    Ok(found)
}

fn drover_check(repo: &Path, now: &str) -> Res<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_drover"))
        .arg("--repo")
        .arg(repo)
        .args(["--format", "json", "check", "--base", BASE, "--now", now])
        .stderr(Stdio::null())
        .output()?;
    // Exit 1 is a refusal, which this history has; anything else is an error.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(format!("drover check failed: {}", out.status).into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn main() -> Res<ExitCode> {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and
    // then a quick smoke run is not worth a 100,000-commit build.
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(ExitCode::SUCCESS);
    }
    let repo = bench_repo()?;
    let head_time: i64 = git(&repo, &["log", "-1", "--format=%ct", "HEAD"])?.parse()?;
    // A fixed `now` keeps the verdicts the same run to run.
    let now = chrono::DateTime::from_timestamp(head_time + 3600, 0)
        .ok_or("bad HEAD time")?
        .to_rfc3339();
    let chain = chain(&repo)?;

    // The work, checked once before timing.
    let doc = drover_check(&repo, &now)?;
    let changes = doc["changes"].as_array().cloned().unwrap_or_default();
    let gated: Vec<&serde_json::Value> = changes
        .iter()
        .filter(|c| c["env"].as_str() != chain.first().map(String::as_str))
        .collect();
    let found = git_answer(&repo, &chain)?;
    println!(
        "repository: {} ({COMMITS} commits), base {BASE}, now {now}",
        repo.display()
    );
    println!("drover judged {} changes:", changes.len());
    for c in &changes {
        println!("  {c}");
    }
    println!("git found the commits that set the lower versions: {found:?}");

    let (mut drover_t, mut git_t) = (Vec::new(), Vec::new());
    for _ in 0..=ROUNDS {
        let t = Instant::now();
        git_answer(&repo, &chain)?;
        git_t.push(t.elapsed());
        let t = Instant::now();
        drover_check(&repo, &now)?;
        drover_t.push(t.elapsed());
    }
    // The first round warms the page cache and the pack indexes.
    let (d, g) = (median(drover_t.split_off(1)), median(git_t.split_off(1)));
    let ratio = d.as_secs_f64() / g.as_secs_f64();
    println!();
    println!("| command (process, median of {ROUNDS} alternating runs) | median |");
    println!("|---|---|");
    println!("| `drover check --base {BASE}` | {} |", ms(d));
    println!(
        "| git: `diff --name-only` + {} × `log --first-parent -n1 -G` | {} |",
        found.len(),
        ms(g)
    );
    println!("| ratio drover / git | {ratio:.2} (goal ≤ {GOAL_RATIO}) |");

    let walked = gated.len() == 2 && found.len() == 2;
    if !walked {
        println!("the work was not done: drover judged {} gated changes, git found {} commits (want 2 each)", gated.len(), found.len());
    }
    if ratio > GOAL_RATIO {
        println!("goal missed: drover check --base took {ratio:.2}× git's time");
    }
    Ok(if walked && ratio <= GOAL_RATIO {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
