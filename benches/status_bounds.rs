//! Bounded status stores (BENCHMARKS.md, "Status store reads: bounds"): peak
//! memory and wall time of `drover check --base` and `drover status` (the
//! release binary, each a process of its own, `/usr/bin/time -f %M`) on
//! three stores, against the same commands on the same repository with the
//! store's refs hidden (the baseline: everything but reading the store), and
//! `git log -p` of every status branch (git reading the same history, no
//! signature checked), in the same run:
//!
//! - 1,000 clusters × 40 signed reports (a fleet after a few months);
//!   goals: each command under 64 MiB and 2 s;
//! - 10,000 clusters × 10 signed reports; goal: each under 128 MiB;
//! - one branch whose tree holds 400,000 files (one shared blob) beside a
//!   genuine confirmation; goal: `check --base` refuses the branch and passes
//!   the genuine bump in under 2 s and 64 MiB.
//!
//! Every report is a commit signed in-process (ssh-key, as the agent signs),
//! one key listed for every cluster (a signature costs the same to check
//! whichever key made it), written through an in-memory object database a
//! pack at a time, then packed with `git repack -ad`, as a fetch leaves it.
//! Exits non-zero when a goal is missed.
//!
//! Run: `cargo bench --bench status_bounds`. `DROVER_BENCH_ONLY=small|large|tree`
//! runs one store.

#[path = "../tests/support/git.rs"]
mod git_servers;

use drover::rollout::RolloutState;
use drover::status::{self, PublishOptions, StatusReport};
use git_servers::{git, keygen, public_key};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const NOW: &str = "2026-12-20T12:00:00Z";
const MIB: u64 = 1024;

/// Peak RSS (KiB) and wall time of `cmd`, which must exit 0, or 1 (a
/// refusal: a completed read) when `refusal_ok`.
fn measure(cmd: &mut Command, refusal_ok: bool) -> (u64, Duration, String) {
    let mut timed = Command::new("/usr/bin/time");
    timed.args(["-f", "MAXRSS_KIB=%M"]);
    timed.arg(cmd.get_program()).args(cmd.get_args());
    if let Some(d) = cmd.get_current_dir() {
        timed.current_dir(d);
    }
    let t0 = Instant::now();
    let out = timed.output().expect("/usr/bin/time");
    let took = t0.elapsed();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let kib = err
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("MAXRSS_KIB="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no MAXRSS in {err}"));
    let text = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success() || (refusal_ok && out.status.code() == Some(1)),
        "{:?} {:?} failed: {text}",
        cmd.get_program(),
        cmd.get_args().collect::<Vec<_>>()
    );
    (kib, took, text)
}

fn drover(repo: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_drover"));
    c.arg("--repo").arg(repo).args(args);
    c
}

/// The config repository: test, stage, production, `clusters` spread over
/// them, one report key listed for every cluster, and a pull request
/// (`pr`, checked out) moving production to the version stage confirmed.
fn config_repo(dir: &Path, clusters: &[(String, String)], key: &Path) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join("environments")).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    let mut root = String::from(
        "[promotion]\nchain = [\"test\", \"stage\", \"production\"]\nevidence = \"status\"\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\n",
    );
    let public = public_key(key);
    // No options on the lines: 10,000 of them must stay within a config file's 1 MiB.
    let signers: String = clusters
        .iter()
        .map(|(e, c)| format!("{e}/{c} {public}\n"))
        .collect();
    std::fs::write(repo.join("agents.allowed_signers"), signers).unwrap();
    for env in ["test", "stage", "production"] {
        let names: Vec<String> = clusters
            .iter()
            .filter(|(e, _)| e == env)
            .map(|(_, c)| format!("{c:?}"))
            .collect();
        root.push_str(&format!("{env} = [{}]\n", names.join(", ")));
        write_env(&repo, env, "1.10.0");
    }
    std::fs::write(repo.join("drover.toml"), root).unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "fleet"]);
    repo
}

fn write_env(repo: &Path, env: &str, version: &str) {
    std::fs::write(
        repo.join(format!("environments/{env}.toml")),
        format!("version = \"{version}\"\n\n[window]\nschedule = \"0 2 8 * *\"\nduration = \"6h\"\n\n[promotion]\nsoak = \"24h\"\n"),
    )
    .unwrap();
}

fn pull_request(repo: &Path, version: &str) {
    git(repo, &["switch", "-q", "-c", "pr"]);
    write_env(repo, "production", version);
    git(repo, &["commit", "-qam", "production"]);
}

/// Clusters whose objects are held in memory before they are written out as one pack.
const CLUSTERS_PER_PACK: usize = 1_000;

/// `reports` signed reports on each cluster's own branch: rounds of
/// pending, rolling, rolling, confirmed, one version a round, an hour apart.
/// Returns the version every cluster confirmed last.
///
/// Every commit is made by the agent's own [`status::build_commit`], so the
/// reader meets the agent's bytes; the objects go to an in-memory object
/// database and are written out a pack at a time (a loose object per
/// report made writing 40,000 reports take 540–700 s), then packed into
/// one pack with deltas, as a fetch leaves them.
fn fill_store(repo: &Path, clusters: &[(String, String)], key: &Path, reports: usize) -> String {
    let r = git2::Repository::open(repo).unwrap();
    let odb = r.odb().unwrap();
    // Above the loose and pack backends (priority 1 and 2): every write goes here.
    let mempack = odb.add_new_mempack_backend(1_000).unwrap();
    let t0 = Instant::now();
    let mut opts = PublishOptions::default()
        .with_signing_key_file(key)
        .unwrap();
    let start: chrono::DateTime<chrono::Utc> = "2026-09-01T00:00:00Z".parse().unwrap();
    let mut last = String::new();
    for (i, (env, cluster)) in clusters.iter().enumerate() {
        let mut tip = None;
        for j in 0..reports {
            let version = format!("1.{}.0", 11 + j / 4);
            let state = [
                RolloutState::Pending,
                RolloutState::Rolling,
                RolloutState::Rolling,
                RolloutState::Confirmed,
            ][j % 4];
            let at =
                start + chrono::Duration::hours(j as i64) + chrono::Duration::seconds(i as i64);
            opts.commit_time = Some(at);
            let report = StatusReport {
                env: env.clone(),
                cluster: cluster.clone(),
                config_commit: "0123456789abcdef0123456789abcdef01234567".into(),
                version: version.parse().unwrap(),
                state,
                since: at,
                nodes: 12,
                nodes_at_version: if state == RolloutState::Confirmed {
                    12
                } else {
                    5
                },
                message: if state == RolloutState::Pending {
                    "waiting for the window: next opens 2026-12-08T01:00:00Z".into()
                } else {
                    String::new()
                },
                detail: Default::default(),
            };
            tip = status::build_commit(&r, &report, &opts, tip).unwrap();
            if state == RolloutState::Confirmed {
                last = version;
            }
        }
        let name = format!(
            "refs/heads/{}",
            status::cluster_branch("drover/status", env, cluster)
        );
        r.reference(&name, tip.unwrap(), true, "bench").unwrap();
        if (i + 1) % CLUSTERS_PER_PACK == 0 || i + 1 == clusters.len() {
            write_pack(&r, &odb, &mempack);
        }
    }
    let written = t0.elapsed();
    git(repo, &["repack", "-adq"]);
    git(repo, &["prune"]);
    eprintln!(
        "{} signed reports written in {}, packed into one pack in {}",
        clusters.len() * reports,
        secs(written),
        secs(t0.elapsed() - written)
    );
    last
}

/// Write the objects held in memory to the repository as one pack, and forget them.
fn write_pack(r: &git2::Repository, odb: &git2::Odb<'_>, mempack: &git2::Mempack<'_>) {
    use std::io::Write;
    let mut pack = git2::Buf::new();
    mempack.dump(r, &mut pack).unwrap();
    let mut w = odb.packwriter().unwrap();
    w.write_all(&pack).unwrap();
    w.commit().unwrap();
    mempack.reset().unwrap();
}

fn fleet(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let env = ["test", "stage", "production"][i % 3];
            (env.to_owned(), format!("c{i:05}"))
        })
        .collect()
}

/// Hide (or show again) the store's refs, for the baseline.
fn hide_store(repo: &Path, hide: bool) {
    let (from, to) = if hide {
        ("refs/heads/drover/", "refs/hidden/drover/")
    } else {
        ("refs/hidden/drover/", "refs/heads/drover/")
    };
    let refs = git(
        repo,
        &["for-each-ref", "--format=%(refname) %(objectname)", from],
    );
    let mut script = String::new();
    for l in refs.lines() {
        let (name, oid) = l.split_once(' ').unwrap();
        script.push_str(&format!(
            "create {}{} {oid}\ndelete {name}\n",
            to,
            &name[from.len()..]
        ));
    }
    let mut child = Command::new("git")
        .current_dir(repo)
        .args(["update-ref", "--stdin"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

struct Row {
    what: String,
    kib: u64,
    took: Duration,
    base_kib: u64,
    base_took: Duration,
    goal_kib: u64,
    goal_time: Option<Duration>,
}

impl Row {
    fn ok(&self) -> bool {
        self.kib <= self.goal_kib && self.goal_time.is_none_or(|g| self.took <= g)
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// `check --base main` and `status --format json` on `repo`, with and without its store.
fn reads(label: &str, repo: &Path, goal_kib: u64, goal_time: Option<Duration>) -> Vec<Row> {
    let cmds: [(&str, Vec<&str>); 2] = [
        (
            "drover check --base main",
            vec!["check", "--base", "main", "--now", NOW],
        ),
        (
            "drover status --format json",
            vec!["--format", "json", "status", "--now", NOW],
        ),
    ];
    let mut rows = Vec::new();
    for (what, args) in cmds {
        let (kib, took, out) = measure(&mut drover(repo, &args), false);
        if what.starts_with("drover check") {
            assert!(out.starts_with("ok:"), "the genuine bump passes: {out}");
        }
        // Without its store the bump has no evidence: `check` refuses,
        // having done everything but read the store.
        hide_store(repo, true);
        let (base_kib, base_took, _) = measure(&mut drover(repo, &args), true);
        hide_store(repo, false);
        rows.push(Row {
            what: format!("{label}: `{what}`"),
            kib,
            took,
            base_kib,
            base_took,
            goal_kib,
            goal_time,
        });
    }
    rows
}

/// `git log -p` of every status branch: git reading the same history.
fn git_log_all(repo: &Path) -> Duration {
    let t0 = Instant::now();
    let out = Command::new("git")
        .current_dir(repo)
        .args([
            "log",
            "-p",
            "--format=%H",
            "--glob=refs/heads/drover/status.d/*",
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(out.success());
    t0.elapsed()
}

fn store(
    label: &str,
    clusters: usize,
    reports: usize,
    goal_kib: u64,
    goal_time: Option<Duration>,
) -> (Vec<Row>, Duration) {
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().to_owned();
    if std::env::var("DROVER_BENCH_KEEP").is_ok() {
        eprintln!("keeping {}", tmp.keep().display());
    }
    let tmp = tmp_path;
    let tmp = &tmp;
    let key = keygen(tmp, "agents");
    let fleet = fleet(clusters);
    let repo = config_repo(tmp, &fleet, &key);
    let t0 = Instant::now();
    let version = fill_store(&repo, &fleet, &key, reports);
    eprintln!(
        "{label}: {} signed reports written and packed in {}",
        clusters * reports,
        secs(t0.elapsed())
    );
    pull_request(&repo, &version);
    let log = git_log_all(&repo);
    (reads(label, &repo, goal_kib, goal_time), log)
}

/// A store with stage-1's genuine confirmation and a branch whose tree holds `files` files.
fn flood(files: usize) -> Vec<Row> {
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "agents");
    let fleet = vec![
        ("test".to_owned(), "test-1".to_owned()),
        ("stage".to_owned(), "stage-1".to_owned()),
        ("production".to_owned(), "prod-1".to_owned()),
    ];
    let repo = config_repo(tmp.path(), &fleet, &key);
    let version = fill_store(&repo, &fleet, &key, 4);
    let r = git2::Repository::open(&repo).unwrap();
    let blob = r.blob(b"flood\n").unwrap();
    let mut raw = Vec::with_capacity(files * 40);
    for i in 0..files {
        raw.extend_from_slice(format!("100644 f{i:07}.toml\0").as_bytes());
        raw.extend_from_slice(blob.as_bytes());
    }
    let tree = r
        .odb()
        .unwrap()
        .write(git2::ObjectType::Tree, &raw)
        .unwrap();
    let sig =
        git2::Signature::new("x", "x@example.com", &git2::Time::new(1_790_000_000, 0)).unwrap();
    let commit = r
        .commit(None, &sig, &sig, "flood", &r.find_tree(tree).unwrap(), &[])
        .unwrap();
    r.reference(
        "refs/heads/drover/status.d/stage/flood",
        commit,
        true,
        "bench",
    )
    .unwrap();
    git(&repo, &["repack", "-adq"]);
    pull_request(&repo, &version);
    let (kib, took, out) = measure(
        &mut drover(&repo, &["check", "--base", "main", "--now", NOW]),
        false,
    );
    assert!(
        out.contains("it is not read") && out.contains("ok:"),
        "{out}"
    );
    git(
        &repo,
        &["update-ref", "-d", "refs/heads/drover/status.d/stage/flood"],
    );
    let (base_kib, base_took, _) = measure(
        &mut drover(&repo, &["check", "--base", "main", "--now", NOW]),
        false,
    );
    vec![Row {
        what: format!("a branch whose tree holds {files} files: `drover check --base main`"),
        kib,
        took,
        base_kib,
        base_took,
        goal_kib: 64 * MIB,
        goal_time: Some(Duration::from_secs(2)),
    }]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let only = std::env::var("DROVER_BENCH_ONLY").unwrap_or_default();
    let mut rows = Vec::new();
    let mut logs = Vec::new();
    if only.is_empty() || only == "tree" {
        rows.extend(flood(400_000));
    }
    if only.is_empty() || only == "small" {
        let (r, log) = store(
            "1,000 clusters × 40 reports",
            1_000,
            40,
            64 * MIB,
            Some(Duration::from_secs(2)),
        );
        rows.extend(r);
        logs.push(("1,000 × 40", log));
    }
    if only.is_empty() || only == "large" {
        let (r, log) = store("10,000 clusters × 10 reports", 10_000, 10, 128 * MIB, None);
        rows.extend(r);
        logs.push(("10,000 × 10", log));
    }
    println!("| store: command | peak RSS | wall | baseline (store refs hidden): RSS / wall | ratio RSS | goal |");
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} KiB | {} | {} KiB / {} | {:.2} | < {} MiB{} {} |",
            r.what,
            r.kib,
            secs(r.took),
            r.base_kib,
            secs(r.base_took),
            r.kib as f64 / r.base_kib as f64,
            r.goal_kib / MIB,
            r.goal_time
                .map_or(String::new(), |g| format!(", < {}", secs(g))),
            if r.ok() { "met" } else { "**missed**" }
        );
    }
    for (label, log) in &logs {
        println!("| {label}: baseline `git log -p` of every status branch (no signature checked) | | {} | | | |", secs(*log));
    }
    if rows.iter().any(|r| !r.ok()) {
        eprintln!("a goal was missed");
        std::process::exit(1);
    }
}
