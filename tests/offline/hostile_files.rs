//! Hostile config files (docs/design.md §8, invariant 8), through the binary:
//! a FIFO, a symlink to a device or out of the repository, an oversized
//! file and stray entries in environments/ each cost a clear error naming
//! the file, never a hang, an unbounded read or silence. The same rules
//! hold for a config read from a git commit (the agent's path).

use drover::config::{self, GitTreeFiles, MAX_FILE_BYTES};
use std::ffi::CString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Every case must finish well inside this; the old code hung on a FIFO forever.
const BOUND: Duration = Duration::from_secs(20);

/// A copy of example-repo in a temporary directory.
fn example_copy() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo");
    std::fs::create_dir_all(repo.join("environments")).unwrap();
    for f in ["drover.toml", "agents.allowed_signers"] {
        std::fs::copy(src.join(f), repo.join(f)).unwrap();
    }
    for e in std::fs::read_dir(src.join("environments")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), repo.join("environments").join(e.file_name())).unwrap();
    }
    (tmp, repo)
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}

struct Run {
    code: i32,
    json: serde_json::Value,
    stderr: String,
    took: Duration,
}

/// `drover check --format json` on `repo`, its address space capped at
/// `limit_mib` when given; killed (and the test failed) if it outlives [`BOUND`].
fn check(repo: &Path, limit_mib: Option<u64>) -> Run {
    let repo = repo.to_str().unwrap();
    run(&["check", "--format", "json", "--repo", repo], limit_mib)
}

/// drover with `args`, bounded like [`check`].
fn run(args: &[&str], limit_mib: Option<u64>) -> Run {
    let mut cmd = crate::support::cli::drover_command();
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(mib) = limit_mib {
        let bytes = mib * 1024 * 1024;
        // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let started = Instant::now();
    let child = cmd.spawn().expect("run drover");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(BOUND) {
        Ok(out) => out.expect("wait for drover"),
        Err(_) => {
            // SAFETY: the child we started and have not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("drover {args:?} did not finish within {BOUND:?}");
        }
    };
    Run {
        code: out.status.code().unwrap_or(-1),
        json: serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

/// The error naming `file`, whose message contains `needle`.
fn assert_error(run: &Run, file: &str, needle: &str) {
    assert_eq!(run.code, 1, "{} {}", run.json, run.stderr);
    assert_eq!(run.json["ok"], false);
    let errors = run.json["errors"].as_array().expect("errors");
    assert!(
        errors
            .iter()
            .any(|e| e["file"] == file && e["message"].as_str().unwrap().contains(needle)),
        "no error on {file} containing {needle:?}: {}",
        run.json
    );
}

#[test]
fn the_example_copy_passes() {
    // Control: the copy the other cases damage is valid as it is.
    let (_tmp, repo) = example_copy();
    let run = check(&repo, Some(512));
    assert_eq!(run.code, 0, "{} {}", run.json, run.stderr);
    assert_eq!(run.json["ok"], true);
}

#[test]
fn a_fifo_drover_toml_is_refused_without_blocking() {
    let (_tmp, repo) = example_copy();
    std::fs::remove_file(repo.join("drover.toml")).unwrap();
    mkfifo(&repo.join("drover.toml"));
    let run = check(&repo, None);
    assert_error(&run, "drover.toml", "FIFO");
    assert_error(&run, "drover.toml", "must be regular files");
}

#[test]
fn drover_toml_linked_to_dev_zero_or_out_of_the_repo_is_refused() {
    let (tmp, repo) = example_copy();
    std::fs::remove_file(repo.join("drover.toml")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", repo.join("drover.toml")).unwrap();
    let run = check(&repo, Some(512));
    assert_error(&run, "drover.toml", "outside the repository");

    let outside = tmp.path().join("drover.toml");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo/drover.toml"),
        &outside,
    )
    .unwrap();
    std::fs::remove_file(repo.join("drover.toml")).unwrap();
    std::os::unix::fs::symlink(&outside, repo.join("drover.toml")).unwrap();
    assert_error(&check(&repo, None), "drover.toml", "outside the repository");

    // Control: a symlink that stays inside the repository is followed.
    std::fs::create_dir(repo.join("config")).unwrap();
    std::fs::rename(&outside, repo.join("config/drover.toml")).unwrap();
    std::fs::remove_file(repo.join("drover.toml")).unwrap();
    std::os::unix::fs::symlink("config/drover.toml", repo.join("drover.toml")).unwrap();
    let run = check(&repo, None);
    assert_eq!(run.code, 0, "{} {}", run.json, run.stderr);
}

#[test]
fn a_50_mb_environment_file_is_refused_fast_in_little_memory() {
    let (_tmp, repo) = example_copy();
    let path = repo.join("environments/stage.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    let filler = "# padding padding padding padding padding padding padding\n";
    while text.len() < 50 * 1024 * 1024 {
        text.push_str(filler);
    }
    std::fs::write(&path, &text).unwrap();
    // 128 MiB of address space: the old code needed 1.4 GB for this file.
    let run = check(&repo, Some(128));
    assert_error(&run, "environments/stage.toml", "at most 1048576 bytes");
    assert!(
        run.took < Duration::from_secs(5),
        "took {:?} to refuse",
        run.took
    );
    // Exactly at the cap is still read (and judged as TOML).
    let mut exact = std::fs::read_to_string(repo.join("environments/test.toml")).unwrap();
    while exact.len() + filler.len() <= MAX_FILE_BYTES as usize {
        exact.push_str(filler);
    }
    std::fs::write(&path, exact.replace("\"test\"", "\"stage\"")).unwrap();
    let run = check(&repo, Some(512));
    let errors = run.json["errors"].as_array().cloned().unwrap_or_default();
    assert!(
        !errors
            .iter()
            .any(|e| e["message"].as_str().unwrap_or("").contains("at most")),
        "{}",
        run.json
    );
}

#[test]
fn stray_entries_in_environments_are_reported() {
    let (tmp, repo) = example_copy();
    let envs = repo.join("environments");
    std::fs::write(tmp.path().join("elsewhere.toml"), "version = \"1.0.0\"\n").unwrap();
    std::os::unix::fs::symlink(tmp.path().join("elsewhere.toml"), envs.join("linked.toml"))
        .unwrap();
    mkfifo(&envs.join("piped.toml"));
    std::fs::create_dir(envs.join("old.toml")).unwrap();
    std::fs::write(envs.join("README.md"), "notes\n").unwrap();
    let run = check(&repo, None);
    assert_error(&run, "environments/linked.toml", "symlink");
    assert_error(&run, "environments/piped.toml", "FIFO");
    assert_error(&run, "environments/old.toml", "a directory");
    assert_error(&run, "environments/README.md", "not an environment file");
    // Text mode names the file in drover's `file: error: message` form.
    let out = crate::support::cli::drover_command()
        .args(["check", "--repo"])
        .arg(&repo)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("environments/piped.toml: error: `piped.toml` is a FIFO"),
        "{text}"
    );
}

/// A commit of `files` (path, content, git file mode) in a new repository.
fn commit(dir: &Path, files: &[(&str, &[u8], i32)]) -> git2::Repository {
    let repo = git2::Repository::init_bare(dir).unwrap();
    let mut index = git2::Index::new().unwrap();
    for (path, content, mode) in files {
        let id = repo.blob(content).unwrap();
        let entry = git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode: *mode as u32,
            uid: 0,
            gid: 0,
            file_size: content.len() as u32,
            id,
            flags: path.len() as u16,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        };
        index.add(&entry).unwrap();
    }
    let tree = index.write_tree_to(&repo).unwrap();
    {
        let tree = repo.find_tree(tree).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "config", &tree, &[])
            .unwrap();
    }
    repo
}

#[test]
fn a_commit_s_files_obey_the_same_rules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo");
    let root = std::fs::read(src.join("drover.toml")).unwrap();
    let test = std::fs::read(src.join("environments/test.toml")).unwrap();
    let stage = std::fs::read(src.join("environments/stage.toml")).unwrap();
    let prod = std::fs::read(src.join("environments/production.toml")).unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // Control: the example as a commit loads.
    let good = commit(
        &tmp.path().join("good"),
        &[
            ("drover.toml", &root, 0o100644),
            ("environments/test.toml", &test, 0o100644),
            ("environments/stage.toml", &stage, 0o100644),
            ("environments/production.toml", &prod, 0o100644),
        ],
    );
    config::load(&GitTreeFiles::at_rev(&good, "HEAD").unwrap()).expect("the example loads");

    let mut big = stage.clone();
    big.resize(2 * MAX_FILE_BYTES as usize, b'\n');
    let bad = commit(
        &tmp.path().join("bad"),
        &[
            ("drover.toml", b"../../../etc/passwd", 0o120000),
            ("environments/test.toml", &test, 0o100644),
            ("environments/stage.toml", &big, 0o100644),
            ("environments/production.toml", b"test.toml", 0o120000),
            ("environments/gone.toml", b"/etc/hostname", 0o120000),
        ],
    );
    let diags = config::load(&GitTreeFiles::at_rev(&bad, "HEAD").unwrap()).unwrap_err();
    let has = |file: &str, needle: &str| {
        diags
            .iter()
            .any(|d| d.file == file && d.message.contains(needle))
    };
    assert!(has("drover.toml", "outside the repository"), "{diags:?}");
    assert!(
        has("environments/stage.toml", "at most 1048576"),
        "{diags:?}"
    );
    assert!(has("environments/gone.toml", "symlink"), "{diags:?}");
    // A symlink inside the tree is followed like on disk: no error of its own.
    assert!(
        !diags
            .iter()
            .any(|d| d.file == "environments/production.toml"
                && (d.message.contains("symlink") || d.message.contains("regular"))),
        "{diags:?}"
    );
}

#[test]
fn an_allowed_signers_fifo_or_device_is_refused_without_blocking() {
    let (tmp, repo) = example_copy();
    let repo = repo.to_str().unwrap();
    let fifo = tmp.path().join("allowed_signers");
    mkfifo(&fifo);
    for file in [fifo.to_str().unwrap(), "/dev/zero"] {
        let r = run(
            &["--repo", repo, "verify", "--allowed-signers", file],
            Some(512),
        );
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(r.stderr.contains("must be regular files"), "{}", r.stderr);
    }
}
