//! Git source figures beside the git command line, on the history repository
//! of `scripts/make-history-repo` served by `git daemon`, each drover figure
//! alternating with its git baseline in the same run. Run: `cargo bench --bench git_source`;
//! `cargo bench --bench git_source -- log` measures only `drover log`.
//!
//! Goals (issue 4), each checked, the process exits non-zero when one is
//! missed or the work was not done: first clone at most 1.5× `git clone`;
//! a poll that finds nothing new no slower than `git fetch`; the `drover log`
//! binary no slower than `git log -p`; `drover verify --mode all` of 1,000
//! signed commits under 0.5 s. The clone and the poll run in-process, as the
//! agent runs them; every other drover figure is the binary.

use drover::audit::{self, LogOptions};
use drover::source::{Source, SourceConfig};
use drover::trust::{self, AllowedSigners, Mode};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// drover's own generator of the benchmark histories (same data on every machine).
fn history_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/make-history-repo")
}

/// Build (once, cached under target/bench-data) a history repository.
fn history(name: &str, args: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/bench-data")
        .join(name);
    if !dir.join(".git/refs/heads/main").exists() && !dir.join(".git/packed-refs").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let st = Command::new(history_script())
            .arg(&dir)
            .args(args)
            .status()
            .expect("run make-history-repo");
        assert!(st.success(), "make-history-repo failed");
    }
    dir
}

fn run(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let st = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(st.success(), "{cmd:?} failed");
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t = Instant::now();
    let r = f();
    (t.elapsed(), r)
}

struct Daemon(std::process::Child);
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `drover log --env stage` (the binary, JSON and text) against
/// `git log -p --format=%H -- environments/stage.toml`, alternating in the
/// same run; exits non-zero when the JSON run is slower than git's.
fn log_only(big: &std::path::Path) {
    let rounds = 9;
    let (mut git, mut json, mut text) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        git.push(run(Command::new("git").arg("-C").arg(big).args([
            "log",
            "-p",
            "--format=%H",
            "--",
            "environments/stage.toml",
        ])));
        json.push(run(Command::new(env!("CARGO_BIN_EXE_drover"))
            .arg("--repo")
            .arg(big)
            .args(["--format", "json", "log", "--env", "stage"])));
        text.push(run(Command::new(env!("CARGO_BIN_EXE_drover"))
            .arg("--repo")
            .arg(big)
            .args(["log", "--env", "stage"])));
    }
    let g = median(git);
    println!("## drover log on 100,000 commits\n");
    println!("Medians of {rounds} alternating runs, stdout to /dev/null.\n");
    println!("| command | median | ratio to git |\n|---|---|---|");
    println!(
        "| `git log -p --format=%H -- environments/stage.toml` | {} | 1.00x |",
        ms(g)
    );
    let mut worst: f64 = 0.0;
    for (name, d) in [
        ("`drover log --env stage --format json`", median(json)),
        ("`drover log --env stage` (text)", median(text)),
    ] {
        let r = d.as_secs_f64() / g.as_secs_f64();
        worst = worst.max(r);
        println!("| {name} | {} | {r:.2}x |", ms(d));
    }
    if worst > 1.0 {
        eprintln!("target missed: drover log is slower than git log -p");
        std::process::exit(1);
    }
}

fn main() {
    let big = history("history-100000", &["100000"]);
    if std::env::args().skip(1).any(|a| a == "log") {
        log_only(&big);
        return;
    }
    let signed = history("signed-2000-1000", &["2000", "1000"]);
    let base = big.parent().unwrap().to_path_buf();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _daemon = Daemon(
        // The daemon itself: killing the `git daemon` wrapper would orphan it.
        Command::new("/usr/lib/git-core/git-daemon")
            .args(["--reuseaddr", "--export-all", "--listen=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .arg(&base)
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "git daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("git://127.0.0.1:{port}/history-100000/.git");
    let scratch = tempfile::tempdir().unwrap();
    let rounds = 3;

    // First clone.
    let mut git_clone = Vec::new();
    let mut drover_clone = Vec::new();
    for i in 0..rounds {
        let dest = scratch.path().join(format!("git-{i}"));
        git_clone.push(run(Command::new("git")
            .args(["clone", "-q", "--bare", &url])
            .arg(&dest)));
        let cache = scratch.path().join(format!("drover-{i}"));
        let (d, r) = time(|| {
            Source::open(SourceConfig::new(&url, &cache))
                .unwrap()
                .fetch()
        });
        let fetched = r.expect("drover fetch");
        assert!(fetched.received_objects > 0, "the clone received nothing");
        drover_clone.push(d);
    }
    // Poll that finds nothing new.
    let git_dir = scratch.path().join("git-0");
    let mut git_poll = Vec::new();
    let src = Source::open(SourceConfig::new(&url, scratch.path().join("drover-0"))).unwrap();
    let mut drover_poll = Vec::new();
    for _ in 0..5 {
        git_poll.push(run(Command::new("git").arg("-C").arg(&git_dir).args([
            "fetch",
            "-q",
            &url,
            "+refs/heads/*:refs/heads/*",
        ])));
        let (d, r) = time(|| src.fetch());
        assert_eq!(r.expect("poll").received_objects, 0);
        drover_poll.push(d);
    }
    // drover log --env stage vs git log -p, both binaries.
    let mut git_log = Vec::new();
    let mut drover_log_bin = Vec::new();
    for _ in 0..rounds {
        git_log.push(run(Command::new("git").arg("-C").arg(&big).args([
            "log",
            "-p",
            "--format=%H",
            "--",
            "environments/stage.toml",
        ])));
        drover_log_bin.push(run(Command::new(env!("CARGO_BIN_EXE_drover"))
            .arg("--repo")
            .arg(&big)
            .args(["--format", "json", "log", "--env", "stage"])));
    }
    // The work: every change of stage's version, counted once outside the timing.
    let repo = git2::Repository::open(&big).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap().id();
    let opts = LogOptions {
        env: Some("stage"),
        ..Default::default()
    };
    let changes = audit::version_history(&repo, head, &opts).unwrap().len();
    // verify --mode all over 1,000 signed commits.
    let srepo = git2::Repository::open(&signed).unwrap();
    let shead = srepo.head().unwrap().peel_to_commit().unwrap().id();
    let since = srepo.revparse_single("HEAD~1000").unwrap().id();
    let signers = AllowedSigners::load(&signed.join(".keys/allowed_signers")).unwrap();
    let mut verify_bin = Vec::new();
    let mut git_verify = Vec::new();
    let now = chrono::Utc::now().timestamp();
    let checked = trust::check(&srepo, Mode::All, &signers, Some(since), shead, &|_| now)
        .expect("all signed")
        .checked;
    for _ in 0..rounds {
        verify_bin.push(run(Command::new(env!("CARGO_BIN_EXE_drover"))
            .arg("--repo")
            .arg(&signed)
            .args([
                "verify",
                "--allowed-signers",
                signed.join(".keys/allowed_signers").to_str().unwrap(),
                "--since",
                &since.to_string(),
            ])));
        git_verify.push(run(Command::new("git").arg("-C").arg(&signed).args([
            "log",
            "--show-signature",
            "--format=%H",
            &format!("{since}..HEAD"),
        ])));
    }
    println!("## Git source\n");
    println!("Medians of {rounds} alternating runs (polls: 5), same machine and run; repository from `make-history-repo DIR 100000` served by `git daemon` on loopback.");
    println!("Reproduce: `cargo bench --bench git_source` (data cached in target/bench-data).\n");
    println!("| operation | drover | git | ratio | goal |\n|---|---|---|---|---|");
    let mut missed = Vec::new();
    let mut row = |name: &str, d: Duration, g: Duration, goal: f64| {
        let r = d.as_secs_f64() / g.as_secs_f64();
        println!("| {name} | {} | {} | {r:.2}x | ≤ {goal}x |", ms(d), ms(g));
        if r > goal {
            missed.push(format!("{name}: {r:.2}x git (goal ≤ {goal}x)"));
        }
    };
    row(
        "first clone (100,000 commits), in-process / `git clone --bare`",
        median(drover_clone),
        median(git_clone),
        1.5,
    );
    row(
        "poll, nothing new, in-process / `git fetch`",
        median(drover_poll),
        median(git_poll),
        1.0,
    );
    row(
        &format!(
            "`drover log --env stage --format json` ({changes} changes) / `git log -p --format=%H`"
        ),
        median(drover_log_bin),
        median(git_log),
        1.0,
    );
    let (vb, gv) = (median(verify_bin), median(git_verify));
    println!(
        "| `drover verify --mode all`, {checked} signed commits / `git log --show-signature` | {} | {} | {:.2}x | < 500 ms |",
        ms(vb),
        ms(gv),
        vb.as_secs_f64() / gv.as_secs_f64()
    );
    if vb >= Duration::from_millis(500) {
        missed.push(format!("verify took {} (goal < 500 ms)", ms(vb)));
    }
    if changes != 33_333 || checked != 1000 {
        missed.push(format!(
            "the work was not done: {changes} changes of stage (want 33333), {checked} signatures checked (want 1000)"
        ));
    }
    for m in &missed {
        eprintln!("goal missed: {m}");
    }
    if !missed.is_empty() {
        std::process::exit(1);
    }
}
