//! `drover log`: version changes with signers, PR numbers and confirmations.

use crate::support::cli::{drover, drover_at};
use crate::support::git::*;
use drover::rollout::RolloutState;
use drover::source::{Source, SourceConfig};
use drover::status::{self, PublishOptions, StatusReport};

#[test]
fn log_lists_changes_newest_first_with_signers_and_confirmations() {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let root = work.head();
    // stage-1's agent signs its reports with its own key, listed as report
    // signer (WorkRepo's drover.toml names agents.allowed_signers).
    let agent_key = keygen(tmp.path(), "stage-1");
    allowed_signers(
        &work.dir.join("agents.allowed_signers"),
        &[("stage/stage-1", &agent_key)],
    );
    git(&work.dir, &["add", "-A"]);
    git(&work.dir, &["commit", "-qm", "List stage-1's report key"]);
    let key = keygen(tmp.path(), "release");
    let allowed = tmp.path().join("allowed");
    allowed_signers(&allowed, &[("release@example.com", &key)]);
    let c1 = work.bump(
        "test",
        "1.1.0",
        "Merge pull request #11 from team/bump-test",
        Some(&key),
    );
    // A change to another key of the file is not a version change.
    std::fs::write(
        work.dir.join("environments/stage.toml"),
        "version = \"1.0.0\"\n# comment\n",
    )
    .unwrap();
    git(&work.dir, &["commit", "-qam", "Reword stage"]);
    let c2 = work.bump("stage", "1.1.0", "Bump stage to 1.1.0 (#12)", None);

    // A confirmation of stage 1.1.0, published to a served copy and fetched back.
    let base = tmp.path().join("served");
    std::fs::create_dir_all(&base).unwrap();
    let bare = bare_clone(&work.dir, &base, "config");
    let src = Source::open(SourceConfig::new(
        format!("file://{}", bare.display()),
        tmp.path().join("cache"),
    ))
    .unwrap();
    let report = StatusReport {
        env: "stage".into(),
        cluster: "stage-1".into(),
        config_commit: c2.clone(),
        version: "1.1.0".parse().unwrap(),
        state: RolloutState::Confirmed,
        since: "2099-01-01T00:00:00Z".parse().unwrap(),
        nodes: 3,
        nodes_at_version: 3,
        message: String::new(),
        detail: Default::default(),
    };
    let signed = PublishOptions::default()
        .with_signing_key_file(&agent_key)
        .unwrap();
    status::publish(&src, &report, &signed).unwrap();
    // A hand-made, unsigned confirmation of test 1.1.0 is not shown.
    let forged = StatusReport {
        env: "test".into(),
        cluster: "test-1".into(),
        ..report.clone()
    };
    status::publish(&src, &forged, &PublishOptions::default()).unwrap();
    git(
        &work.dir,
        &[
            "fetch",
            "-q",
            bare.to_str().unwrap(),
            "refs/heads/drover/status.d/*:refs/heads/drover/status.d/*",
        ],
    );

    let repo = work.dir.to_str().unwrap();
    let (code, out, err) = drover(&[
        "--repo",
        repo,
        "--format",
        "json",
        "log",
        "--allowed-signers",
        allowed.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&v["ok"], &v["errors"]),
        (&serde_json::json!(true), &serde_json::json!([]))
    );
    let list = v["changes"].as_array().unwrap();
    let summary: Vec<(&str, &str, Option<&str>, &str)> = list
        .iter()
        .map(|e| {
            (
                e["env"].as_str().unwrap(),
                e["version"].as_str().unwrap(),
                e["previous"].as_str(),
                e["commit"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("stage", "1.1.0", Some("1.0.0"), c2.as_str()),
            ("test", "1.1.0", Some("1.0.0"), c1.as_str()),
            ("stage", "1.0.0", None, root.as_str()),
            ("test", "1.0.0", None, root.as_str()),
        ]
    );
    assert_eq!(
        (list[0]["pr"].as_u64(), list[1]["pr"].as_u64()),
        (Some(12), Some(11))
    );
    assert_eq!(
        (list[0]["verified"].as_bool(), list[0]["signer"].is_null()),
        (Some(false), true)
    );
    assert_eq!(list[1]["signer"], "release@example.com");
    assert_eq!(list[1]["verified"], true);
    assert_eq!(list[1]["author"], "Test Author <author@example.com>");
    assert!(list[1]["date"].as_str().unwrap().ends_with('Z'));
    assert_eq!(list[0]["confirmations"][0]["cluster"], "stage-1");
    assert_eq!(list[1]["confirmations"].as_array().unwrap().len(), 0);

    let (code, out, _) = drover(&["--repo", repo, "--format", "json", "log", "--env", "test"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v = &v["changes"];
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(
        v[0]["signer"],
        serde_json::Value::Null,
        "no allowed signers, no signer"
    );

    let (code, out, _) = drover(&["--repo", repo, "log"]);
    assert_eq!(code, 0);
    assert!(
        out.lines().nth(1).unwrap().contains("stage")
            && out.contains("stage-1 confirmed 2099-01-01T00:00:00Z"),
        "{out}"
    );
}

/// A history made by the project's own generator, `count` commits.
fn generated_history(dir: &std::path::Path, count: u32) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/make-history-repo");
    let out = std::process::Command::new(script)
        .arg(dir)
        .arg(count.to_string())
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("run make-history-repo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The commits of `drover log --env ENV --format json`, newest first.
fn logged_commits(repo: &std::path::Path, env: &str) -> Vec<String> {
    let (code, out, err) = drover_at(repo, &["--format", "json", "log", "--env", env]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    doc["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["commit"].as_str().unwrap().to_owned())
        .collect()
}

fn remove_commit_graph(repo: &std::path::Path) {
    let info = repo.join(".git/objects/info");
    let _ = std::fs::remove_file(info.join("commit-graph"));
    let _ = std::fs::remove_dir_all(info.join("commit-graphs"));
}

/// `drover log` on a history long enough to be read by several threads, with
/// git's commit-graph, with a graph older than the newest commits, and with
/// none, lists exactly the commits `git log --first-parent` lists for the file.
#[test]
fn a_long_history_logs_as_git_does_with_or_without_a_commit_graph() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("history");
    generated_history(&repo, 6_000);
    assert!(repo.join(".git/objects/info/commit-graph").exists());
    let git_says = |env: &str| -> Vec<String> {
        git(
            &repo,
            &[
                "rev-list",
                "--first-parent",
                "HEAD",
                "--",
                &format!("environments/{env}.toml"),
            ],
        )
        .lines()
        .map(str::to_owned)
        .collect()
    };
    let with_graph = logged_commits(&repo, "stage");
    assert_eq!(with_graph, git_says("stage"));
    // The initial commit plus every third bump of 5,999, less the first
    // stage bump, which writes the initial 1.0.0 again.
    assert_eq!(with_graph.len(), 1 + 2_000 - 1);
    // A graph written before the newest commits: those are read from the
    // object store, the rest from the graph.
    for v in ["7.0.0", "7.0.1"] {
        let file = repo.join("environments/stage.toml");
        let text = std::fs::read_to_string(&file).unwrap();
        let line = text.lines().next().unwrap().to_owned();
        std::fs::write(&file, text.replace(&line, &format!("version = \"{v}\""))).unwrap();
        git(&repo, &["commit", "-qam", &format!("Bump stage to {v}")]);
    }
    let stale = logged_commits(&repo, "stage");
    assert_eq!(stale.len(), with_graph.len() + 2);
    assert_eq!(stale, git_says("stage"));
    remove_commit_graph(&repo);
    assert_eq!(logged_commits(&repo, "stage"), stale);
    assert_eq!(logged_commits(&repo, "production"), git_says("production"));
}

/// Byte offset of commit-graph chunk `id` (the table after the 8-byte header).
fn graph_chunk(graph: &[u8], id: &[u8; 4]) -> usize {
    let chunks = graph[6] as usize;
    (0..chunks)
        .map(|i| &graph[8 + i * 12..8 + (i + 1) * 12])
        .find(|e| &e[..4] == id)
        .map(|e| u64::from_be_bytes(e[4..12].try_into().unwrap()) as usize)
        .expect("chunk present")
}

/// A commit-graph that lies (HEAD its own parent: a loop; a parent position
/// past the end) is not followed: the log ends, matches the one read without
/// a graph, and nothing panics. The untouched graph is the control.
#[test]
fn a_commit_graph_that_lies_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("history");
    generated_history(&repo, 40);
    let graph_path = repo.join(".git/objects/info/commit-graph");
    let good = std::fs::read(&graph_path).unwrap();
    let control = logged_commits(&repo, "test");
    assert_eq!(control.len(), 1 + 13);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    let head = hex::decode(head.trim()).unwrap();
    // Commits are listed by id in OIDL; CDAT holds tree, parent 1, parent 2,
    // generation and date for each, in the same order.
    let oidl = graph_chunk(&good, b"OIDL");
    let cdat = graph_chunk(&good, b"CDAT");
    let count = (cdat - oidl) / 20;
    let pos = (0..count)
        .find(|i| good[oidl + i * 20..oidl + (i + 1) * 20] == head[..])
        .expect("HEAD in the graph");
    let parent1 = cdat + pos * 36 + 20;
    for lie in [pos as u32, 0x0fff_ffff] {
        let mut bad = good.clone();
        bad[parent1..parent1 + 4].copy_from_slice(&lie.to_be_bytes());
        std::fs::write(&graph_path, &bad).unwrap();
        assert_eq!(logged_commits(&repo, "test"), control, "parent {lie:#x}");
    }
    remove_commit_graph(&repo);
    assert_eq!(logged_commits(&repo, "test"), control);
}

/// `git` in `repo` with `input` on stdin; its stdout, trimmed.
fn git_stdin(repo: &std::path::Path, args: &[&str], input: &[u8]) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("git")
        .current_dir(repo)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run git");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "git {args:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// An `environments/` entry that is not a well-formed tree stops the log with
/// an error naming the object, as git stops, instead of a panic or a list cut
/// short: a tree of garbage bytes, and a tree entry that names a blob, each
/// in a commit under a well-formed HEAD. The history below the bad commit is
/// the control and logs.
#[test]
fn a_malformed_tree_in_the_history_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("history");
    generated_history(&repo, 10);
    let control = logged_commits(&repo, "stage");
    assert_eq!(control.len(), 3);
    let good = git(&repo, &["rev-parse", "HEAD"]).trim().to_owned();
    let root_toml = git(&repo, &["rev-parse", "HEAD:drover.toml"])
        .trim()
        .to_owned();
    let garbage = git_stdin(
        &repo,
        &["hash-object", "-t", "tree", "--literally", "-w", "--stdin"],
        b"100644 stage.toml",
    );
    for bad in [garbage.as_str(), root_toml.as_str()] {
        // Written raw: `git mktree` refuses a tree entry that names a blob.
        let mut listing = b"100644 drover.toml\0".to_vec();
        listing.extend(hex::decode(&root_toml).unwrap());
        listing.extend(b"40000 environments\0");
        listing.extend(hex::decode(bad).unwrap());
        let root = git_stdin(
            &repo,
            &["hash-object", "-t", "tree", "--literally", "-w", "--stdin"],
            &listing,
        );
        let bad_commit = git(
            &repo,
            &["commit-tree", &root, "-p", &good, "-m", "Bump stage"],
        );
        // HEAD itself is well formed: the walk meets the bad tree below it.
        let tree = format!("{good}^{{tree}}");
        let head = git(
            &repo,
            &[
                "commit-tree",
                &tree,
                "-p",
                bad_commit.trim(),
                "-m",
                "Revert",
            ],
        );
        git(&repo, &["update-ref", "refs/heads/main", head.trim()]);
        let (code, out, err) = drover_at(&repo, &["--format", "json", "log", "--env", "stage"]);
        assert_ne!(code, 0, "{out}");
        assert!(
            err.contains(&format!("object {bad} is not a well-formed tree")),
            "{err}"
        );
        git(&repo, &["update-ref", "refs/heads/main", &good]);
        assert_eq!(logged_commits(&repo, "stage"), control);
    }
}

/// Run `drover --repo REPO args`: its exit code, stdout and peak resident
/// memory in KiB.
///
/// A small python3 process starts drover and reports the peak of its one
/// child: a process keeps across `exec` the peak of the memory it was
/// started with, and a child of this test process would start with the
/// test's (other tests' histories included).
fn drover_peak_kib(repo: &std::path::Path, args: &[&str]) -> (i32, String, u64) {
    const PARENT: &str = "import resource, subprocess, sys\n\
        r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)\n\
        sys.stdout.buffer.write(r.stdout)\n\
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n\
        sys.stderr.write('%d %d' % (r.returncode, peak))\n";
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(PARENT)
        .arg(env!("CARGO_BIN_EXE_drover"))
        .arg("--repo")
        .arg(repo)
        .args(args)
        .output()
        .expect("run python3");
    let report = String::from_utf8_lossy(&out.stderr);
    let mut numbers = report
        .split_whitespace()
        .rev()
        .take(2)
        .map(|n| n.parse::<i64>().unwrap_or(-1));
    let peak = numbers.next().unwrap_or(-1);
    let code = numbers.next().unwrap_or(-1);
    assert!(peak > 0, "{report}");
    (
        code as i32,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        peak as u64,
    )
}

/// Versions of `drover log --env ENV --format json`, newest first.
fn logged_versions(out: &str) -> Vec<String> {
    let doc: serde_json::Value = serde_json::from_str(out).unwrap();
    let changes = doc["changes"].as_array().unwrap();
    changes
        .iter()
        .map(|c| c["version"].as_str().unwrap().to_owned())
        .collect()
}

/// Two 32 MiB versions of a file in the history, loose and then packed (one
/// as a whole object, one as a 2 KiB delta against it): both read as
/// unreadable and neither is inflated (the peak memory stays within 16 MiB
/// of the log's without them; inflating one takes 32 MiB), while the
/// versions around them read.
#[test]
fn an_oversized_version_is_refused_unread_loose_or_packed() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("history");
    generated_history(&repo, 10);
    let args = ["--format", "json", "log", "--env", "stage"];
    let (code, out, control_kib) = drover_peak_kib(&repo, &args);
    assert_eq!(code, 0);
    assert_eq!(logged_versions(&out), ["1.0.2", "1.0.1", "1.0.0"]);
    let file = repo.join("environments/stage.toml");
    let small = std::fs::read_to_string(&file).unwrap();
    let pad = "# padding padding padding padding padding padding padding\n";
    let big = small.replace("1.0.2", "5.0.0") + &pad.repeat(32 * 1024 * 1024 / pad.len());
    std::fs::write(&file, &big).unwrap();
    git(&repo, &["commit", "-qam", "Bump stage to 5.0.0"]);
    std::fs::write(&file, big.replace("5.0.0", "5.0.1")).unwrap();
    git(&repo, &["commit", "-qam", "Bump stage to 5.0.1"]);
    std::fs::write(&file, small.replace("1.0.2", "6.0.0")).unwrap();
    git(&repo, &["commit", "-qam", "Bump stage to 6.0.0"]);
    drop(big);
    for packed in [false, true] {
        if packed {
            git(&repo, &["gc", "-q"]);
            let packs = git(&repo, &["count-objects", "-v"]);
            assert!(
                packs.lines().any(|l| l == "count: 0"),
                "all packed: {packs}"
            );
        }
        let (code, out, kib) = drover_peak_kib(&repo, &args);
        assert_eq!(code, 0, "packed: {packed}");
        // The two big versions read alike, so the second is no change of version.
        assert_eq!(
            logged_versions(&out),
            ["6.0.0", "(unreadable)", "1.0.2", "1.0.1", "1.0.0"],
            "packed: {packed}"
        );
        assert!(
            kib < control_kib + 16 * 1024,
            "packed: {packed}: {kib} KiB at peak, {control_kib} KiB without the big versions"
        );
    }
}

/// The sizes read from the pack files agree with libgit2's object headers
/// for every object of a packed history, deltas 50 deep included, and every
/// object is found there.
#[test]
fn packed_sizes_agree_with_libgit2_for_every_object() {
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("history");
    generated_history(&repo_dir, 600);
    let repo = git2::Repository::open(&repo_dir).unwrap();
    let odb = repo.odb().unwrap();
    let mut ids = Vec::new();
    odb.foreach(|id| {
        ids.push(*id);
        true
    })
    .unwrap();
    assert!(ids.len() > 1_800, "{} objects", ids.len());
    let mut sizes = drover::config::PackedSizes::open(&repo);
    for id in ids {
        let (size, _) = odb.read_header(id).unwrap();
        assert_eq!(sizes.size(id), Some(size as u64), "{id}");
    }
    assert_eq!(sizes.size(git2::Oid::from_bytes(&[7; 20]).unwrap()), None);
}

/// A pack index whose large-offset reference points past its table (a
/// damaged file) is not read for sizes: every look-up goes to libgit2, and
/// the log is the same as with the sound index, without a panic. The sound
/// index, read first, is the control.
#[test]
fn a_damaged_pack_index_is_left_to_libgit2() {
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("history");
    generated_history(&repo_dir, 30);
    let control = logged_commits(&repo_dir, "stage");
    let repo = git2::Repository::open(&repo_dir).unwrap();
    let head_stage = repo
        .revparse_single("HEAD:environments/stage.toml")
        .unwrap()
        .id();
    assert!(drover::config::PackedSizes::open(&repo)
        .size(head_stage)
        .is_some());
    // An old version of test.toml: an object the stage log never reads.
    let unread = git(&repo_dir, &["rev-parse", "HEAD~20:environments/test.toml"]);
    let pack_dir = repo_dir.join(".git/objects/pack");
    let idx = std::fs::read_dir(&pack_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "idx"))
        .unwrap();
    let listing = git_stdin(&repo_dir, &["show-index"], &std::fs::read(&idx).unwrap());
    let mut ids: Vec<&str> = listing
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    ids.sort_unstable();
    let position = ids.iter().position(|id| *id == unread.trim()).unwrap();
    let mut bytes = std::fs::read(&idx).unwrap();
    let offsets = 8 + 256 * 4 + ids.len() * 24;
    bytes[offsets + position * 4..][..4].copy_from_slice(&0x8000_0100u32.to_be_bytes());
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&idx, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&idx, &bytes).unwrap();
    assert_eq!(
        drover::config::PackedSizes::open(&repo).size(head_stage),
        None
    );
    assert_eq!(logged_commits(&repo_dir, "stage"), control);
}
