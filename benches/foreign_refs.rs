//! Refs under the status namespace that name no cluster of the config
//! (BENCHMARKS.md, "Foreign refs"): peak memory and wall time of
//! - `drover check --base main` in a clone holding N such refs (as a CI
//!   checkout of every branch holds them, `refs/remotes/origin/...`);
//! - the agent's git work against a server holding N such refs: fetch into
//!   an empty cache (the agent's scope, by name), the one admission of the
//!   new head, the waves' read of the store, and a signed status report
//!   pushed (its push connection lists the server's refs too), in a child
//!   process of this bench;
//!
//! each against the same work with none, in the same run. The refs are
//! written as packed refs straight into the repositories (writing 300,000
//! through git takes minutes). Peak RSS is `/usr/bin/time -f %M`. Goals,
//! with 300,000 refs: `check` under 64 MiB and 2 s; the agent's work under
//! 64 MiB and 20 s, no foreign ref in its cache, and its peak RSS at most
//! 4 MiB over the same work's without a foreign ref in the same run (the
//! wire client keeps only the refs asked for: what the server lists beyond
//! them is dropped as it streams by). Exits non-zero when a goal is missed.
//!
//! Run: `cargo bench --bench foreign_refs` (`DROVER_FOREIGN_REFS=N` sets N,
//! default 300000; add `--profile dev` to reuse a debug build).

#[path = "../tests/support/git.rs"]
mod git_servers;

use git_servers::{git, keygen, public_key, GitDaemon};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const GOAL_KIB: u64 = 64 * 1024;
const AGENT_GOAL_KIB: u64 = 64 * 1024;
/// Most the agent's peak RSS may grow by over the same run's baseline.
const AGENT_GROWTH_KIB: u64 = 4 * 1024;
const NOW: &str = "2026-12-20T12:00:00Z";
const OLD: &str = "2026-12-10T12:00:00Z";

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn git_dated(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_DATE", OLD)
        .env("GIT_COMMITTER_DATE", OLD)
        .args([
            "-c",
            "user.name=Agent",
            "-c",
            "user.email=a@example.com",
            "-c",
            "gpg.format=ssh",
        ])
        .args(args)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A config repository (test, stage, production; stage-1 signed a
/// confirmation of 1.13.0 on its branch) whose branch `pr` moves production
/// to 1.13.0, and the key of production's cluster prod-1.
fn build(dir: &Path) -> Res<(PathBuf, PathBuf)> {
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join("environments"))?;
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys)?;
    let (k_stage, k_prod) = (keygen(&keys, "stage-1"), keygen(&keys, "prod-1"));
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(
        repo.join("drover.toml"),
        "[promotion]\nchain = [\"test\", \"stage\", \"production\"]\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\ntest = [\"test-1\"]\nstage = [\"stage-1\"]\nproduction = [\"prod-1\"]\n",
    )?;
    std::fs::write(
        repo.join("agents.allowed_signers"),
        format!(
            "stage/stage-1 namespaces=\"git\" {}\nproduction/prod-1 namespaces=\"git\" {}\n",
            public_key(&k_stage),
            public_key(&k_prod)
        ),
    )?;
    for e in ["test", "stage", "production"] {
        std::fs::write(
            repo.join(format!("environments/{e}.toml")),
            "version = \"1.12.0\"\n",
        )?;
    }
    git(&repo, &["add", "-A"]);
    git_dated(&repo, &["commit", "-q", "-m", "initial"]);
    let report = repo.join("report.toml");
    std::fs::write(
        &report,
        format!("env = \"stage\"\ncluster = \"stage-1\"\nconfig_commit = \"abc\"\nversion = \"1.13.0\"\nstate = \"confirmed\"\nsince = {OLD}\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"),
    )?;
    let blob = git_dated(&repo, &["hash-object", "-w", report.to_str().unwrap()]);
    std::fs::remove_file(&report)?;
    let index = repo.join(".git/status-index");
    let out = Command::new("git")
        .current_dir(&repo)
        .env("GIT_INDEX_FILE", &index)
        .args([
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("100644,{blob},status/stage/stage-1.toml"),
        ])
        .output()?;
    assert!(out.status.success());
    let tree = String::from_utf8(
        Command::new("git")
            .current_dir(&repo)
            .env("GIT_INDEX_FILE", &index)
            .arg("write-tree")
            .output()?
            .stdout,
    )?;
    let sk = format!("user.signingkey={}", k_stage.display());
    let c = git_dated(
        &repo,
        &["-c", &sk, "commit-tree", tree.trim(), "-m", "status", "-S"],
    );
    git(
        &repo,
        &["update-ref", "refs/heads/drover/status.d/stage/stage-1", &c],
    );
    git(&repo, &["switch", "-q", "-c", "pr"]);
    std::fs::write(
        repo.join("environments/production.toml"),
        "version = \"1.13.0\"\n",
    )?;
    git(&repo, &["add", "-A"]);
    git_dated(&repo, &["commit", "-q", "-m", "production 1.13.0"]);
    Ok((repo, k_prod))
}

/// The packed refs of `git_dir` as git packs them (every ref), without the header.
fn packed(git_dir: &Path) -> Vec<String> {
    git(git_dir, &["pack-refs", "--all"]);
    std::fs::read_to_string(git_dir.join("packed-refs"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Write the packed refs of `git_dir`: its own `refs` and `n` more under
/// `prefix` + `drover/status.d/`, each naming no cluster of the config
/// (half in the namespace of production, half of no environment), all at
/// `target`.
fn foreign(git_dir: &Path, refs: &[String], prefix: &str, n: usize, target: &str) -> Res<()> {
    let mut lines: Vec<String> = refs.to_vec();
    lines.extend((0..n).map(|i| match i % 2 {
        0 => format!("{target} {prefix}drover/status.d/production/junk-{i:07}"),
        _ => format!("{target} {prefix}drover/status.d/x{:03}/{i:07}/y", i % 997),
    }));
    lines.sort_by(|a, b| a[41..].cmp(&b[41..]));
    let mut text = String::with_capacity(lines.len() * 100);
    text.push_str("# pack-refs with: peeled fully-peeled sorted \n");
    for l in lines {
        text.push_str(&l);
        text.push('\n');
    }
    std::fs::write(git_dir.join("packed-refs"), text)?;
    Ok(())
}

/// Peak RSS (KiB) and wall time of `cmd`, which must exit 0; also its stderr.
fn measured(cmd: &mut Command) -> Res<(u64, Duration, String)> {
    let t0 = Instant::now();
    let out = cmd.output()?;
    let took = t0.elapsed();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let kib = err
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("MAXRSS_KIB="))
        .ok_or_else(|| format!("no MAXRSS in {err}"))?
        .trim()
        .parse()?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {err}{}",
            String::from_utf8_lossy(&out.stdout)
        )
        .into());
    }
    Ok((kib, took, err))
}

fn timed(program: &str) -> Command {
    let mut c = Command::new("/usr/bin/time");
    c.args(["-f", "MAXRSS_KIB=%M", program]);
    c
}

/// Child mode: what prod-1's agent does with git, as `drover agent` runs
/// it: its fetch (by name, its scope), the admission of the new head, the
/// waves' read of its environment, one signed status report pushed.
fn child_agent(url: &str, cache: &str, key: &str) -> Res<()> {
    let mut src = drover::source::Source::open(drover::source::SourceConfig::new(url, cache))?;
    let fetched = src.fetch_scoped(|repo, head| {
        drover::admit::status_scope(repo, &[head], "production", "prod-1")
    })?;
    let head = fetched.head;
    let repo = src.repo();

    let base = repo.revparse_single(&format!("{head}^"))?.id();
    let now = NOW.parse()?;
    let admitted = drover::admit::admit_head(
        repo,
        Some(base),
        head,
        "production",
        &drover::admit::TrustCheck {
            mode: drover::trust::Mode::Off,
            signers: drover::trust::Signers::NONE,
            first_seen: &|_| 0,
        },
        now,
    )
    .map_err(|r| format!("agent gate refused: {r}"))?;
    eprintln!("agent gate: {}", admitted.decision);
    let evidence = drover::admit::env_evidence(
        repo,
        head,
        "production",
        Some("prod-1"),
        &"1.13.0".parse()?,
        now,
    )?;
    if let Some(why) = &evidence.held {
        return Err(format!("production held: {why}").into());
    }
    // The cache holds the branches of the clusters the config lists, nothing else.
    let listed = ["stage/stage-1", "production/prod-1"];
    let foreign = repo
        .references_glob("refs/remotes/origin/drover/status.d/*")?
        .flatten()
        .filter(|r| {
            let name = r.name().unwrap_or("");
            !listed
                .iter()
                .any(|l| name.ends_with(&format!("status.d/{l}")))
        })
        .count();
    eprintln!("FETCHED_REFS={foreign}");
    let report = drover::status::StatusReport {
        env: "production".into(),
        cluster: "prod-1".into(),
        config_commit: head.to_string(),
        version: "1.13.0".parse()?,
        state: drover::rollout::RolloutState::Pending,
        since: now,
        nodes: 3,
        nodes_at_version: 0,
        message: String::new(),
        detail: Default::default(),
    };
    let opts = drover::status::PublishOptions::default().with_signing_key_file(Path::new(key))?;
    drover::status::publish(&src, &report, &opts).map_err(|e| format!("push: {e}"))?;
    eprintln!("PUSHED");
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child-agent") {
        return child_agent(&args[i + 1], &args[i + 2], &args[i + 3]);
    }
    if args.iter().any(|a| a == "--list") {
        return Ok(());
    }
    let n: usize = std::env::var("DROVER_FOREIGN_REFS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300_000);
    let dir = tempfile::tempdir()?;
    let (repo, k_prod) = build(dir.path())?;
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served)?;
    let bare = served.join("config.git");
    git(
        &served,
        &[
            "clone",
            "-q",
            "--bare",
            "--no-local",
            repo.to_str().unwrap(),
            "config.git",
        ],
    );
    git(
        &bare,
        &[
            "fetch",
            "-q",
            repo.to_str().unwrap(),
            "+pr:main",
            "+refs/heads/drover/status.d/stage/stage-1:refs/heads/drover/status.d/stage/stage-1",
        ],
    );
    // The clone CI checks out holds the status branches as origin's.
    git(
        &repo,
        &[
            "update-ref",
            "refs/remotes/origin/drover/status.d/stage/stage-1",
            "refs/heads/drover/status.d/stage/stage-1",
        ],
    );
    git(
        &repo,
        &[
            "update-ref",
            "-d",
            "refs/heads/drover/status.d/stage/stage-1",
        ],
    );
    let target = git(&repo, &["rev-parse", "main"]);
    let daemon = GitDaemon::start(&served);
    let me = std::env::current_exe()?;
    let (own, served_refs) = (packed(&repo.join(".git")), packed(&bare));
    let mut rows = Vec::new();
    for count in [0, n] {
        foreign(
            &repo.join(".git"),
            &own,
            "refs/remotes/origin/",
            count,
            &target,
        )?;
        foreign(&bare, &served_refs, "refs/heads/", count, &target)?;
        let (check, check_took, out) = measured(
            timed(env!("CARGO_BIN_EXE_drover"))
                .args(["check", "--repo"])
                .arg(&repo)
                .args(["--base", "main", "--now", NOW]),
        )?;
        assert!(
            !out.contains("junk") && !out.contains("x001"),
            "a foreign ref was named: {out}"
        );
        let cache = dir.path().join(format!("cache-{count}"));
        let (agent, agent_took, err) = measured(
            timed(me.to_str().unwrap())
                .arg("--child-agent")
                .arg(daemon.url("config"))
                .arg(&cache)
                .arg(&k_prod),
        )?;
        assert!(err.contains("PUSHED"), "{err}");
        let fetched = err
            .lines()
            .find_map(|l| l.strip_prefix("FETCHED_REFS="))
            .unwrap_or("?")
            .to_owned();
        rows.push((count, check, check_took, agent, agent_took, fetched));
    }
    println!("| foreign refs | check --base: peak RSS | wall | agent fetch + admission + waves + push: peak RSS | wall | foreign refs in the agent's cache |");
    println!("|---|---|---|---|---|---|");
    for (count, check, ct, agent, at, fetched) in &rows {
        println!(
            "| {count} | {check} KiB | {:.2} s | {agent} KiB | {:.2} s | {fetched} |",
            ct.as_secs_f64(),
            at.as_secs_f64()
        );
    }
    let (base, big) = (&rows[0], &rows[1]);
    println!(
        "the agent's work: {:.0} bytes more per foreign ref",
        (big.3 as f64 - base.3 as f64) * 1024.0 / n.max(1) as f64
    );
    println!(
        "ratios {n}/0: check RSS {:.2}, wall {:.2}; agent RSS {:.2}, wall {:.2}",
        big.1 as f64 / base.1 as f64,
        big.2.as_secs_f64() / base.2.as_secs_f64(),
        big.3 as f64 / base.3 as f64,
        big.4.as_secs_f64() / base.4.as_secs_f64()
    );
    let mut missed = Vec::new();
    if big.1 > GOAL_KIB {
        missed.push(format!("check --base at {} KiB", big.1));
    }
    if big.3 > AGENT_GOAL_KIB {
        missed.push(format!("the agent at {} KiB", big.3));
    }
    if big.3 > base.3 + AGENT_GROWTH_KIB {
        missed.push(format!(
            "the agent grew from {} KiB to {} KiB",
            base.3, big.3
        ));
    }
    if big.5 != "0" {
        missed.push(format!("the agent's cache holds {} foreign refs", big.5));
    }
    if big.2 > Duration::from_secs(2) {
        missed.push(format!("check --base took {:?}", big.2));
    }
    if big.4 > Duration::from_secs(20) {
        missed.push(format!("the agent took {:?}", big.4));
    }
    drop(daemon);
    if std::env::var_os("DROVER_BENCH_KEEP").is_some() {
        eprintln!("kept: {}", dir.keep().display());
    }
    if !missed.is_empty() {
        return Err(format!("goals missed with {n} foreign refs: {}", missed.join(", ")).into());
    }
    Ok(())
}
