//! The CLI's edges through the binary (docs/design.md §7): bounded counts,
//! unknown environments rejected by every command, a closed pipe ending a
//! command quietly with exit 0, the JSON rejection document on stdout for
//! every command, `plan` saying when its forecast is cut short, and errors
//! that say libgit2's text once, and local commands that leave the system
//! CA bundle unread.

use crate::support::cli::{drover, drover_command};
use crate::support::git::{commit_all, example_checkout, git, WorkRepo};
use serde_json::Value;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const NOW: &str = "2026-12-01T00:00:00Z";

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("example-repo")
        .display()
        .to_string()
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {out:?}"))
}

/// A rejection with `--format json`: exit 1, `{"ok": false, "errors": [..]}`
/// on stdout, an error whose message contains `needle`.
fn assert_json_rejection(args: &[&str], needle: &str) -> Value {
    let (code, out, err) = drover(args);
    assert_eq!(code, 1, "{args:?}: {out} {err}");
    let doc = json_of(&out);
    assert_eq!(doc["ok"], false, "{doc}");
    let errors = doc["errors"].as_array().expect("errors array");
    assert!(
        errors
            .iter()
            .any(|e| e["message"].as_str().unwrap_or("").contains(needle)),
        "{args:?}: no error containing {needle:?}: {doc}"
    );
    doc
}

#[test]
fn windows_count_is_bounded_with_a_clear_error() {
    let repo = example();
    for count in ["18446744073709551615", "1000000000000", "10001"] {
        let args = [
            "--repo", &repo, "--format", "json", "windows", "--env", "test", "--count", count,
        ];
        assert_json_rejection(&args, "more than 10000");
        let (code, out, err) = drover(&[
            "--repo", &repo, "windows", "--env", "test", "--count", count,
        ]);
        assert_eq!(code, 1, "{out} {err}");
        assert!(
            err.contains("--count") && !err.contains("panicked"),
            "{err}"
        );
    }
    // Control: counts up to the maximum list that many windows.
    let (code, out, err) = drover(&[
        "--repo", &repo, "--format", "json", "windows", "--env", "test", "--count", "3", "--from",
        NOW,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["windows"].as_array().unwrap().len(), 3);
    let (code, out, _) = drover(&[
        "--repo", &repo, "--format", "json", "windows", "--env", "test", "--count", "10000",
        "--from", NOW,
    ]);
    assert_eq!(code, 0);
    assert_eq!(json_of(&out)["windows"].as_array().unwrap().len(), 10000);
}

#[test]
fn plan_and_demo_sizes_are_bounded() {
    let repo = example();
    for (args, needle) in [
        (
            vec![
                "plan",
                "--env",
                "test",
                "--max-windows",
                "18446744073709551615",
            ],
            "more than 10000",
        ),
        (
            vec!["plan", "--env", "test", "--nodes", "1000000000000"],
            "more than 100000",
        ),
        (vec!["demo", "--nodes", "1000000000000"], "more than 10000"),
    ] {
        let mut all = vec!["--repo", repo.as_str(), "--format", "json"];
        all.extend(&args);
        assert_json_rejection(&all, needle);
    }
    // At the end of the calendar a plan says plainly that no window is ahead.
    let (code, out, err) = drover(&[
        "--repo",
        &repo,
        "--format",
        "json",
        "plan",
        "--env",
        "test",
        "--now",
        "9999-12-30T00:00:00Z",
    ]);
    assert_eq!(code, 0, "{out} {err}");
    let doc = json_of(&out);
    assert_eq!(doc["decision"]["state"], "pending", "{doc}");
    assert_eq!(doc["decision"]["message"], "no window ahead", "{doc}");
}

#[test]
fn an_unknown_environment_is_a_rejection_for_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let repo = work.dir.display().to_string();
    for cmd in [
        vec!["log", "--env", "nope"],
        vec!["windows", "--env", "nope"],
        vec!["plan", "--env", "nope"],
        vec!["promote", "nope"],
    ] {
        let mut args = vec!["--repo", repo.as_str(), "--format", "json"];
        args.extend(&cmd);
        let doc = assert_json_rejection(&args, "nope");
        assert!(
            doc.to_string().contains("test"),
            "names the valid ones: {doc}"
        );
        // Text: exit 1, the reason on stderr.
        let mut args = vec!["--repo", repo.as_str()];
        args.extend(&cmd);
        let (code, out, err) = drover(&args);
        assert_eq!(code, 1, "{cmd:?}: {err}");
        assert!(
            err.contains("nope") || out.contains("nope"),
            "{cmd:?}: {out} {err}"
        );
    }
    // Control: a known environment is listed (exit 0).
    let (code, out, err) = drover(&["--repo", &repo, "--format", "json", "log", "--env", "test"]);
    assert_eq!(code, 0, "{err}");
    assert!(json_of(&out)["changes"].is_array());
}

#[test]
fn every_command_rejects_an_invalid_repository_with_the_json_document() {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    std::fs::write(
        work.dir.join("environments/test.toml"),
        "version = \"latest\"\n",
    )
    .unwrap();
    let repo = work.dir.display().to_string();
    for cmd in [
        vec!["check"],
        vec!["windows", "--env", "test"],
        vec!["plan", "--env", "test"],
        vec!["promote", "stage"],
    ] {
        let mut args = vec!["--repo", repo.as_str(), "--format", "json"];
        args.extend(&cmd);
        let doc = assert_json_rejection(&args, "exact version");
        let first = &doc["errors"][0];
        assert_eq!(first["file"], "environments/test.toml", "{cmd:?}: {doc}");
        assert_eq!(first["line"], 1, "{cmd:?}: {doc}");
    }
}

#[test]
fn verify_refusal_carries_the_errors_list() {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let allowed = tmp.path().join("allowed");
    std::fs::write(&allowed, "").unwrap();
    let doc = assert_json_rejection(
        &[
            "--repo",
            work.dir.to_str().unwrap(),
            "--format",
            "json",
            "verify",
            "--allowed-signers",
            allowed.to_str().unwrap(),
        ],
        "unsigned",
    );
    assert_eq!(doc["errors"][0]["reason"], "unsigned");
}

/// Run drover with stdout on a pipe, read one line, close the pipe: the
/// exit code and stderr.
fn head_one(args: &[&str]) -> (i32, String) {
    let mut child = crate::support::cli::drover_command()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run drover");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty());
    // The reader (and its pipe) is dropped here, like `head` exiting.
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: the child we started and have not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("drover did not end after its reader went away");
        }
    };
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A repository with `n` version changes, made in one `git fast-import`.
fn long_history(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    let mut stream = String::new();
    let root = "[promotion]\nchain = [\"test\", \"stage\"]\n\n[clusters]\ntest = [\"test-1\"]\nstage = [\"stage-1\"]\n";
    for i in 0..n {
        let env = format!(
            "version = \"1.{}.{}\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\n",
            i / 100,
            i % 100
        );
        stream.push_str(&format!(
            "commit refs/heads/main\ncommitter T <t@example.com> {} +0000\ndata 7\nbump {:>2}\n",
            1_700_000_000 + i * 60,
            i % 100
        ));
        for (path, text) in [
            ("drover.toml", root.to_string()),
            ("environments/test.toml", env.clone()),
            ("environments/stage.toml", env),
        ] {
            stream.push_str(&format!(
                "M 100644 inline {path}\ndata {}\n{text}\n",
                text.len()
            ));
        }
    }
    let mut child = Command::new("git")
        .args(["fast-import", "--quiet"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stream.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    git(dir, &["reset", "-q", "--hard", "main"]);
}

#[test]
fn a_closed_pipe_ends_every_command_quietly_with_exit_0() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("long");
    long_history(&dir, 1500);
    let repo = dir.display().to_string();
    let (code, out, err) = drover(&["--repo", &repo, "log"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.len() > 256 * 1024,
        "more than a pipe holds: {}",
        out.len()
    );
    // A rejection cut off by its reader still exits 1: `drover check | head`
    // must not turn an invalid repository into success.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(bad.join("environments")).unwrap();
    std::fs::write(bad.join("drover.toml"), "[promotion]\nchain = [\"test\"]\n").unwrap();
    let mut env = String::new();
    for i in 0..5000 {
        env.push_str(&format!("unknown_key_{i} = 1\n"));
    }
    std::fs::write(bad.join("environments/test.toml"), env).unwrap();
    let bad = bad.display().to_string();
    for args in [
        vec!["--repo", bad.as_str(), "check"],
        vec!["--repo", bad.as_str(), "--format", "json", "check"],
    ] {
        let (code, err) = head_one(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
    }
    for args in [
        vec!["--repo", repo.as_str(), "log"],
        vec!["--repo", repo.as_str(), "--format", "json", "log"],
        vec![
            "--repo",
            repo.as_str(),
            "windows",
            "--env",
            "test",
            "--count",
            "10000",
        ],
        vec![
            "--repo",
            repo.as_str(),
            "--format",
            "json",
            "windows",
            "--env",
            "test",
            "--count",
            "10000",
        ],
    ] {
        let (code, err) = head_one(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}: nothing on stderr");
    }
}

#[test]
fn plan_says_when_its_forecast_is_cut_short() {
    let repo = example();
    let args = [
        "--repo",
        &repo,
        "--format",
        "json",
        "plan",
        "--env",
        "test",
        "--nodes",
        "300",
        "--max-windows",
        "3",
        "--now",
        NOW,
    ];
    let (code, out, err) = drover(&args);
    assert_eq!(code, 0, "{err}");
    let doc = json_of(&out);
    let cut = &doc["forecast"]["cut_short"];
    assert_eq!(cut["by"], "max_windows", "{doc}");
    assert_eq!(cut["limit"], 3);
    assert!(cut["nodes_left"].as_u64().unwrap() > 0, "{cut}");
    assert!(cut["more_windows_estimated"].as_u64().unwrap() > 0, "{cut}");
    let (_, text, _) = drover(&[
        "--repo",
        &repo,
        "plan",
        "--env",
        "test",
        "--nodes",
        "300",
        "--max-windows",
        "3",
        "--now",
        NOW,
    ]);
    assert!(
        text.contains("forecast cut short by --max-windows 3"),
        "{text}"
    );
    // Control: a rollout that fits is not cut short.
    let (_, out, _) = drover(&[
        "--repo", &repo, "--format", "json", "plan", "--env", "test", "--nodes", "10", "--now", NOW,
    ]);
    let doc = json_of(&out);
    assert_eq!(doc["forecast"]["cut_short"], Value::Null, "{doc}");
    assert_eq!(doc["forecast"]["state"], "confirmed", "{doc}");
}

#[test]
fn errors_say_libgit2_s_text_once() {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let (code, _, err) = drover(&[
        "--repo",
        work.dir.to_str().unwrap(),
        "check",
        "--base",
        "no-such-rev",
    ]);
    assert_eq!(code, 2, "{err}");
    // Said once, and as what it means (src/cli/explain.rs), not libgit2's text.
    assert_eq!(
        err.matches("no-such-rev names no commit in this repository")
            .count(),
        1,
        "{err}"
    );
    assert_eq!(err.matches("class=").count(), 0, "{err}");
    // Not a repository at all: also once.
    let (code, _, err) = drover(&["--repo", tmp.path().to_str().unwrap(), "log"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.matches("class=").count() <= 1, "{err}");
}

/// Whether `drover --repo repo args` opened the CA bundle `SSL_CERT_FILE`
/// names. inotify queues the open as it happens, so once the process has
/// exited the answer is in the queue: no timing involved.
fn opens_ca_bundle(repo: &Path, args: &[&str]) -> bool {
    use std::ffi::CString;
    use std::io::Read as _;
    use std::os::fd::{FromRawFd as _, OwnedFd};
    use std::os::unix::ffi::OsStrExt as _;

    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("ca-certificates.crt");
    std::fs::write(&bundle, "").unwrap();
    let path = CString::new(bundle.as_os_str().as_bytes()).unwrap();
    // SAFETY: a descriptor this function owns from here on, and a path that
    // outlives the call.
    let inotify = unsafe {
        let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        let owned = OwnedFd::from_raw_fd(fd);
        let wd = libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_OPEN);
        assert!(
            wd >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        owned
    };
    let out = drover_command()
        .arg("--repo")
        .arg(repo)
        .args(args)
        .env("SSL_CERT_FILE", &bundle)
        .output()
        .expect("run drover");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0 | 1)) && !err.contains("panicked"),
        "{args:?}: {:?} {err}",
        out.status
    );
    let mut events = [0u8; 4096];
    match std::fs::File::from(inotify).read(&mut events) {
        Ok(n) => n > 0,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("reading inotify events: {e}"),
    }
}

/// libgit2 initialises OpenSSL on first use, which parses the whole CA
/// bundle: most of a local command's CPU time, for no connection. The
/// commands that only read the repository skip it; one that may fetch
/// (`status`) still reads it, which is also the control that the probe sees
/// an open at all.
#[test]
fn local_commands_leave_the_ca_bundle_unread_and_a_fetching_one_reads_it() {
    let dir = example_checkout();
    commit_all(dir.path(), "initial configuration", None, None);
    for args in [
        &["check"][..],
        &["--format", "json", "check", "--base", "HEAD", "--now", NOW],
        &["log", "--env", "test"],
        &["windows", "--env", "test"],
    ] {
        assert!(
            !opens_ca_bundle(dir.path(), args),
            "{args:?} parsed the CA bundle"
        );
    }
    assert!(
        opens_ca_bundle(dir.path(), &["status", "--now", NOW]),
        "status (which may fetch) no longer reads the CA bundle: the probe is blind"
    );
}
