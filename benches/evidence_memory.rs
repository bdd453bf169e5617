//! Peak memory of reading evidence from a status branch that holds a 100 MB
//! report (about 100 KB on the wire), against the same work on a branch
//! without it, in the same run (BENCHMARKS.md, "Evidence: a 100 MB report"):
//! - `drover check --base main` on the config repository (the CLI binary);
//! - the agent's gate: fetch into an empty cache over `git daemon`, then
//!   `admit::admit_head`, in a child process of this bench.
//!
//! Peak RSS is `/usr/bin/time -f %M` of each process. Goal: < 64 MiB with the
//! big report. Exits non-zero when it is missed.
//!
//! Run: `cargo bench --bench evidence_memory` (add `--profile dev` to reuse a
//! debug build).

#[path = "../tests/support/git.rs"]
mod git_servers;

use git_servers::{git, keygen, public_key, GitDaemon};
use std::path::{Path, PathBuf};
use std::process::Command;

const BIG: usize = 100 * 1024 * 1024;
const GOAL_KIB: u64 = 64 * 1024;
const NOW: &str = "2026-12-20T12:00:00Z";
const OLD: &str = "2026-12-10T12:00:00Z";

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn git_dated(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_DATE", OLD)
        .env("GIT_COMMITTER_DATE", OLD)
        .envs(env.iter().copied())
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

/// A signed status commit on drover/status writing `path` from `file`.
fn status_commit(repo: &Path, path: &str, file: &Path, key: &Path) {
    let index = repo.join(".git/status-index");
    let _ = std::fs::remove_file(&index);
    let idx = [("GIT_INDEX_FILE", index.to_str().unwrap())];
    let parent = Command::new("git")
        .current_dir(repo)
        .args(["rev-parse", "-q", "--verify", "refs/heads/drover/status"])
        .output()
        .unwrap();
    let parent = String::from_utf8_lossy(&parent.stdout).trim().to_owned();
    if !parent.is_empty() {
        git_dated(repo, &["read-tree", &parent], &idx);
    }
    let blob = git_dated(repo, &["hash-object", "-w", file.to_str().unwrap()], &[]);
    git_dated(
        repo,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("100644,{blob},{path}"),
        ],
        &idx,
    );
    let tree = git_dated(repo, &["write-tree"], &idx);
    let sk = format!("user.signingkey={}", key.display());
    let mut args = vec![
        "-c",
        sk.as_str(),
        "commit-tree",
        tree.as_str(),
        "-m",
        "status",
        "-S",
    ];
    if !parent.is_empty() {
        args.extend(["-p", parent.as_str()]);
    }
    let c = git_dated(repo, &args, &[]);
    git(repo, &["update-ref", "refs/heads/drover/status", &c]);
}

fn report(env: &str, cluster: &str, version: &str) -> String {
    format!(
        "env = \"{env}\"\ncluster = \"{cluster}\"\nconfig_commit = \"abc\"\nversion = \"{version}\"\nstate = \"confirmed\"\nsince = {OLD}\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"
    )
}

/// A config repository whose PR branch moves production to 1.13.0, with
/// stage-1's signed confirmation; with `big`, test-1's report is 100 MB.
fn build(dir: &Path, big: bool) -> Res<PathBuf> {
    let repo = dir.join(if big { "big" } else { "small" });
    std::fs::create_dir_all(repo.join("environments"))?;
    let keys = dir.join(format!("keys-{big}"));
    std::fs::create_dir_all(&keys)?;
    let (k_test, k_stage) = (keygen(&keys, "test-1"), keygen(&keys, "stage-1"));
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(
        repo.join("drover.toml"),
        "[promotion]\nchain = [\"test\", \"stage\", \"production\"]\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\ntest = [\"test-1\"]\nstage = [\"stage-1\"]\nproduction = [\"prod-1\"]\n",
    )?;
    std::fs::write(
        repo.join("agents.allowed_signers"),
        format!(
            "test/test-1 namespaces=\"git\" {}\nstage/stage-1 namespaces=\"git\" {}\n",
            public_key(&k_test),
            public_key(&k_stage)
        ),
    )?;
    for e in ["test", "stage", "production"] {
        std::fs::write(
            repo.join(format!("environments/{e}.toml")),
            "version = \"1.12.0\"\n",
        )?;
    }
    git(&repo, &["add", "-A"]);
    git_dated(&repo, &["commit", "-q", "-m", "initial"], &[]);
    let tmp = dir.join("report.toml");
    std::fs::write(&tmp, report("stage", "stage-1", "1.13.0"))?;
    status_commit(&repo, "status/stage/stage-1.toml", &tmp, &k_stage);
    let mut text = report("test", "test-1", "1.13.0");
    if big {
        // A comment line of 100 MB: valid TOML, compresses to ~100 KB.
        text.push('#');
        text.push_str(&" ".repeat(BIG));
        text.push('\n');
    }
    std::fs::write(&tmp, text)?;
    status_commit(&repo, "status/test/test-1.toml", &tmp, &k_test);
    std::fs::remove_file(&tmp)?;
    git(&repo, &["switch", "-q", "-c", "pr"]);
    std::fs::write(
        repo.join("environments/production.toml"),
        "version = \"1.13.0\"\n",
    )?;
    git(&repo, &["add", "-A"]);
    git_dated(&repo, &["commit", "-q", "-m", "production 1.13.0"], &[]);
    Ok(repo)
}

/// Peak RSS (KiB) of `cmd`, which must exit 0; also its stdout and stderr.
fn peak_kib(cmd: &mut Command) -> Res<(u64, String)> {
    let out = cmd.output()?;
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
    Ok((kib, err))
}

fn timed(program: &str) -> Command {
    let mut c = Command::new("/usr/bin/time");
    c.args(["-f", "MAXRSS_KIB=%M", program]);
    c
}

/// Child mode: the agent's source and gate, as `drover agent` runs them.
fn child_agent(url: &str, cache: &str) -> Res<()> {
    let src = drover::source::Source::open(drover::source::SourceConfig::new(url, cache))?;
    let fetched = src.fetch()?;
    let repo = src.repo();
    let base = repo.revparse_single(&format!("{}^", fetched.head))?.id();
    let admitted = drover::admit::admit_head(
        repo,
        Some(base),
        fetched.head,
        "production",
        &drover::admit::TrustCheck {
            mode: drover::trust::Mode::Off,
            signers: drover::trust::Signers::NONE,
            first_seen: &|_| 0,
        },
        NOW.parse()?,
    );
    // Say how big the fetched report is (read from the object header only).
    if let Some(tip) = fetched.status_tip {
        let tree = repo.find_commit(tip)?.tree()?;
        if let Ok(e) = tree.get_path(Path::new("status/test/test-1.toml")) {
            let (size, _) = repo.odb()?.read_header(e.id())?;
            eprintln!("REPORT_BYTES={size}");
        }
    }
    match admitted {
        Ok(a) => eprintln!("agent gate: {}", a.decision),
        Err(r) => return Err(format!("agent gate refused: {r}").into()),
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child-agent") {
        return child_agent(&args[i + 1], &args[i + 2]);
    }
    if args.iter().any(|a| a == "--list") {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served)?;
    let daemon = GitDaemon::start(&served);
    let me = std::env::current_exe()?;
    let mut rows = Vec::new();
    for big in [false, true] {
        let repo = build(dir.path(), big)?;
        let name = if big { "big" } else { "small" };
        git(
            &served,
            &[
                "clone",
                "-q",
                "--bare",
                "--no-local",
                repo.to_str().unwrap(),
                &format!("{name}.git"),
            ],
        );
        git(
            &served.join(format!("{name}.git")),
            &[
                "fetch",
                "-q",
                repo.to_str().unwrap(),
                "pr:main",
                "drover/status:drover/status",
            ],
        );
        let (check, out) = peak_kib(
            timed(env!("CARGO_BIN_EXE_drover"))
                .args(["check", "--repo"])
                .arg(&repo)
                .args(["--base", "main", "--now", NOW]),
        )?;
        if big {
            assert!(
                out.contains("larger than the 64 KiB"),
                "the big report is named: {out}"
            );
        }
        let cache = dir.path().join(format!("cache-{name}"));
        let (agent, err) = peak_kib(
            timed(me.to_str().unwrap())
                .arg("--child-agent")
                .arg(daemon.url(name))
                .arg(&cache),
        )?;
        if big {
            assert!(
                err.contains(&format!(
                    "REPORT_BYTES={}",
                    report("test", "test-1", "1.13.0").len() + BIG + 2
                )),
                "the agent fetched the 100 MB report: {err}"
            );
        }
        rows.push((name, check, agent));
    }
    println!("peak RSS (KiB), status branch without / with a 100 MB report:");
    for (name, check, agent) in &rows {
        println!("  {name:<6} drover check --base: {check} KiB   agent fetch + gate: {agent} KiB");
    }
    let (small, big) = (&rows[0], &rows[1]);
    println!(
        "ratios big/small: check {:.2}, agent {:.2}",
        big.1 as f64 / small.1 as f64,
        big.2 as f64 / small.2 as f64
    );
    if big.1 > GOAL_KIB || big.2 > GOAL_KIB {
        return Err(format!("peak RSS over {GOAL_KIB} KiB with the 100 MB report").into());
    }
    Ok(())
}
