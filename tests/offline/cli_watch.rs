//! Reading the fleet as it moves: `drover wait` (kubectl rollout status's
//! exit codes) and `drover status --watch` fetch the status branches from
//! origin and see a report pushed while they wait; `drover log` shows the
//! failed report and the revocation in columns that stay aligned.

use crate::cli_schema::{assert_valid, Fixture};
use crate::support::cli::{drover_at, drover_command};
use crate::support::git::{commit_file_on, git};
use serde_json::Value;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The fixture's repository served as a bare `origin`, and an operator's clone of it.
struct Served {
    f: Fixture,
    origin: PathBuf,
    clone: PathBuf,
}

fn served() -> Served {
    let f = Fixture::new();
    let origin = f.tmp.path().join("origin.git");
    git(
        f.tmp.path(),
        &[
            "clone",
            "-q",
            "--mirror",
            f.repo.to_str().unwrap(),
            origin.to_str().unwrap(),
        ],
    );
    let clone = f.tmp.path().join("ops");
    git(
        f.tmp.path(),
        &[
            "clone",
            "-q",
            origin.to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );
    Served { f, origin, clone }
}

/// stage-1's key, as the fixture listed it.
fn stage_key(f: &Fixture) -> PathBuf {
    let key = f.tmp.path().join("keys/stage-1");
    assert!(key.exists());
    key
}

/// A signed report of stage-1 pushed to origin (its branch, as an agent pushes).
///
/// Dated now: readers refuse a status commit dated ahead of their clock
/// (beyond the allowed skew), and `wait` and `--watch` read at the wall clock.
fn push_stage_report(s: &Served, version: &str, state: &str) {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let report = format!(
        "env = \"stage\"\ncluster = \"stage-1\"\nconfig_commit = \"{}\"\nversion = \"{version}\"\nstate = \"{state}\"\nsince = {now}\nnodes = 5\nnodes_at_version = 5\nmessage = \"\"\n",
        "0".repeat(40)
    );
    commit_file_on(
        &s.origin,
        "drover/status.d/stage/stage-1",
        "status/stage/stage-1.toml",
        Some(report.as_bytes()),
        Some(&stage_key(&s.f)),
        "status",
        Some(&now),
    );
}

/// Lines of `child`'s stream, read on a thread, so a test can wait for one with a bound.
fn lines(stream: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line of `rx` that holds `needle`, within a minute.
fn await_line(rx: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return l,
            Ok(_) => {}
            Err(e) => panic!("no line with {needle:?}: {e}"),
        }
    }
}

fn spawn(dir: &Path, args: &[&str]) -> Child {
    drover_command()
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn wait_returns_when_a_pushed_report_confirms_the_version() {
    let s = served();
    let mut child = spawn(
        &s.clone,
        &[
            "wait",
            "--env",
            "stage",
            "--for",
            "version=1.13.2",
            "--interval",
            "100ms",
            "--timeout",
            "2m",
        ],
    );
    let err = lines(child.stderr.take().unwrap());
    // It has read the branches once: stage-1's failure of 1.12.0 is not about 1.13.2.
    await_line(&err, "stage/stage-1: failed 1.12.0");
    push_stage_report(&s, "1.13.2", "confirmed");
    await_line(&err, "stage/stage-1: confirmed 1.13.2");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));

    // A timeout is exit 1, with the document saying where each cluster stands.
    let (code, out, _) = drover_at(
        &s.clone,
        &[
            "-o",
            "json",
            "wait",
            "--env",
            "production",
            "--timeout",
            "300ms",
            "--interval",
            "100ms",
        ],
    );
    assert_eq!(code, 1);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_valid("wait", &doc);
    assert!(doc["errors"][0]["message"]
        .as_str()
        .unwrap()
        .contains("timed out after 300ms"));
    assert_eq!(doc["clusters"][0]["state"], "none");
}

#[test]
fn status_watch_prints_the_fleet_again_when_a_report_arrives() {
    let s = served();
    let mut child = spawn(
        &s.clone,
        &[
            "-o",
            "json",
            "status",
            "--watch",
            "--interval",
            "100ms",
            "--now",
            "2026-12-10T00:00:00Z",
        ],
    );
    let out = lines(child.stdout.take().unwrap());
    let stage_state = |line: &str| -> String {
        let doc: Value = serde_json::from_str(line).unwrap();
        assert_valid("status", &doc);
        doc["environments"][1]["clusters"][0]["report"]["state"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let first = await_line(&out, "\"ok\":true");
    assert_eq!(stage_state(&first), "failed");
    push_stage_report(&s, "1.12.0", "confirmed");
    let second = await_line(&out, "\"ok\":true");
    assert_eq!(stage_state(&second), "confirmed");
    child.kill().unwrap();
    let _ = child.wait();
}

#[test]
fn log_shows_failures_and_revocations_in_aligned_columns() {
    let f = Fixture::new();
    let repo = f.repo.as_path();
    // A change by someone with a long name, and a revocation made by `drover revoke`.
    let test = repo.join("environments/test.toml");
    let text = std::fs::read_to_string(&test).unwrap();
    std::fs::write(&test, text.replace("\"1.13.2\"", "\"1.13.3\"")).unwrap();
    git(
        repo,
        &[
            "-c",
            "user.name=Maximiliana Castellanos-Oyarzábal (Platform Team)",
            "commit",
            "-qam",
            "Bump test to 1.13.3",
        ],
    );
    let (code, out, err) = drover_at(
        repo,
        &[
            "revoke",
            "1.13.3",
            "--reason",
            "its pods crash-loop on stage-1",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");

    let (code, out, err) = drover_at(repo, &["log"]);
    assert_eq!(code, 0, "{err}");
    let mut rows = out.lines();
    let header = rows.next().unwrap();
    let columns: Vec<usize> = [
        "ENV", "VERSION", "PREVIOUS", "COMMIT", "PR", "AUTHOR", "SIGNER", "REPORTS",
    ]
    .iter()
    .map(|h| header.find(&format!("  {h}")).unwrap() + 2)
    .collect();
    let rows: Vec<&str> = rows.collect();
    for row in &rows {
        let chars: Vec<char> = row.chars().collect();
        for &c in &columns {
            assert!(
                chars[c - 1] == ' ' && chars[c] != ' ',
                "a column of this row does not start under its header:\n{header}\n{row}"
            );
        }
    }
    assert!(
        // The revocation is dated by the clock the test runs at, so where it sorts among the
        // fixture's fixed dates depends on the day; that it is shown is what matters.
        rows.iter()
            .any(|r| r.contains("(all)") && r.contains("REVOKED: its pods crash-loop on stage-1")),
        "{out}"
    );
    assert!(rows.iter().any(|r| r.contains("Maximiliana")), "{out}");
    assert!(
        rows.iter()
            .any(|r| r.contains(" stage ") && r.contains("stage-1 FAILED 2026-12-01T02:40:00Z")),
        "{out}"
    );
    assert!(
        rows.iter()
            .any(|r| r.contains("test-1 confirmed 2026-12-01T02:41:00Z")),
        "{out}"
    );

    let (_, out, _) = drover_at(repo, &["-o", "json", "log"]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_valid("log", &doc);
    assert_eq!(doc["revocations"][0]["version"], "1.13.3");
    assert_eq!(
        doc["revocations"][0]["reason"],
        "its pods crash-loop on stage-1"
    );
    let stage = doc["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["env"] == "stage")
        .unwrap();
    assert_eq!(stage["failures"][0]["cluster"], "stage-1");
    assert_eq!(
        stage["failures"][0]["message"],
        "stage-1-node-0 did not come back Ready"
    );
}
