//! Text output for people never passes a terminal control character
//! through (`drover status`, `log`, `check`, `windows`): others write much
//! of what it shows (a report's message, a commit's author, a freeze's
//! reason), and an ESC sequence in it could redraw the screen, such as a
//! fake "confirmed trusted" row. Each case shows the raw bytes absent and
//! the escaped text present; the control is the same output without them.

use crate::support::cli::drover_at;
use crate::support::git::{commit_configured, commit_file_on, example_checkout, git, git_env};

/// What an attacker puts in a field: erase the line, move up, draw a row.
const FORGED: &str = "\u{1b}[2K\u{1b}[1A  stage-1  1.13.2  confirmed  trusted\r";

fn example_repo() -> tempfile::TempDir {
    let dir = example_checkout();
    git(dir.path(), &["add", "-A"]);
    commit_configured(dir.path(), &["-q", "-m", "initial"]);
    dir
}

/// A TOML basic string holding `s` (control characters as \uXXXX).
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains('\u{1b}') && !text.contains('\r'),
        "{what}: raw control characters reach the terminal: {text:?}"
    );
    assert!(
        text.contains("\\u{1b}[2K"),
        "{what}: not shown escaped: {text}"
    );
}

#[test]
fn a_report_message_is_escaped_in_status() {
    let dir = example_repo();
    let report = format!(
        "env = \"stage\"\ncluster = \"stage-1\"\nconfig_commit = \"{}\"\nversion = \"1.13.2\"\nstate = \"failed\"\nsince = 2026-12-08T03:00:00Z\nnodes = 5\nnodes_at_version = 2\nmessage = {}\n",
        "0".repeat(40),
        toml_string(&format!("pod crash-looping{FORGED}"))
    );
    commit_file_on(
        dir.path(),
        "drover/status.d/stage/stage-1",
        "status/stage/stage-1.toml",
        Some(report.as_bytes()),
        None,
        "status",
        Some("2026-12-08T03:00:00Z"),
    );
    let (code, out, err) = drover_at(dir.path(), &["status", "--now", "2026-12-09T00:00:00Z"]);
    assert_eq!(code, 0, "{err}");
    assert_clean("status", &out);
    assert!(out.contains("pod crash-looping"), "{out}");
    // Control: JSON carries the message as it is, escaped by JSON's grammar.
    let (_, json, _) = drover_at(
        dir.path(),
        &[
            "--format",
            "json",
            "status",
            "--now",
            "2026-12-09T00:00:00Z",
        ],
    );
    assert!(json.contains("\\u001b[2K"), "{json}");
}

#[test]
fn a_commit_author_is_escaped_in_log() {
    let dir = example_repo();
    let path = dir.path().join("environments/test.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("1.12.0", "1.13.2", 1)).unwrap();
    git(dir.path(), &["add", "-A"]);
    let author = format!("Eve{FORGED}");
    git_env(
        dir.path(),
        &["commit", "-q", "-m", "test: 1.13.2"],
        None,
        &[("GIT_AUTHOR_NAME", &author)],
    );
    let (code, out, err) = drover_at(dir.path(), &["log"]);
    assert_eq!(code, 0, "{err}");
    assert_clean("log", &out);
    assert!(out.contains("Eve"), "{out}");
}

#[test]
fn a_freeze_reason_is_escaped_in_windows() {
    let dir = example_repo();
    let path = dir.path().join("environments/stage.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        format!(
            "{text}\n[[freeze]]\nstart = 2026-12-18T00:00:00\nend = 2027-01-04T00:00:00\nreason = {}\n",
            // One line (the config's rule for a reason), ESC sequences and all.
            toml_string(&format!("holidays{}", FORGED.trim_end_matches('\r')))
        ),
    )
    .unwrap();
    let (code, out, err) = drover_at(
        dir.path(),
        &[
            "windows",
            "--env",
            "stage",
            "--from",
            "2026-12-01T00:00:00Z",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_clean("windows", &out);
    assert!(out.contains("holidays"), "{out}");
}

#[test]
fn a_config_key_echoed_in_an_error_is_escaped_in_check() {
    let dir = example_repo();
    let path = dir.path().join("drover.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replacen(
            "[promotion]\n",
            &format!("[promotion]\n{} = 1\n", toml_string(&format!("x{FORGED}"))),
            1,
        ),
    )
    .unwrap();
    let (code, out, _) = drover_at(dir.path(), &["check"]);
    assert_eq!(code, 1, "{out}");
    assert_clean("check", &out);
    // Control: the same repository without it passes.
    let dir = example_repo();
    let (code, out, err) = drover_at(dir.path(), &["check"]);
    assert_eq!(code, 0, "{out}{err}");
}
