//! A newcomer's first steps, scripted: `drover init` in an empty directory,
//! the first commit, a pull request bumping test's version (the only edit),
//! and `drover check --base main` passing it, run from inside
//! `environments/` (the repository is found upward, like git's). Then what
//! the same newcomer hits next: a bump of stage refused until test's
//! cluster confirms, errors said for people, and the shell's helpers.

use crate::support::cli::drover_command;
use crate::support::git::git;
use std::path::Path;

/// `drover ARGS` run in `dir` (no --repo): the exit code, stdout and stderr.
fn drover_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = drover_command()
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one hand-edit: the version line of `environments/<env>.toml`.
fn bump(repo: &Path, env: &str, from: &str, to: &str) {
    let path = repo.join(format!("environments/{env}.toml"));
    let text = std::fs::read_to_string(&path).unwrap();
    let line = format!("version = \"{from}\"");
    assert!(text.contains(&line), "{text}");
    std::fs::write(
        &path,
        text.replacen(&line, &format!("version = \"{to}\""), 1),
    )
    .unwrap();
}

#[test]
fn from_drover_init_to_a_first_check_base() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("fleet-config");

    let (code, out, err) = drover_in(tmp.path(), &["init", "fleet-config", "--version", "1.12.0"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ran git init (branch main)"), "{out}");
    assert!(out.contains("drover check --base origin/main"), "{out}");
    for file in [
        "drover.toml",
        "environments/test.toml",
        "environments/stage.toml",
        "environments/production.toml",
        "agents.allowed_signers",
    ] {
        assert!(repo.join(file).is_file(), "{file}");
    }
    let signers = std::fs::read_to_string(repo.join("agents.allowed_signers")).unwrap();
    assert!(
        signers.contains("ssh-keygen") && signers.contains("<env>/<cluster>"),
        "{signers}"
    );

    // As written, from the repository's root and from environments/.
    let (code, out, err) = drover_in(&repo, &["check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.trim(),
        "ok: 3 environments (test 1.12.0, stage 1.12.0, production 1.12.0)"
    );
    let envs = repo.join("environments");
    let (code, out, err) = drover_in(&envs, &["check"]);
    assert_eq!(code, 0, "found upward from environments/: {out}{err}");

    git(&repo, &["config", "user.name", "New Operator"]);
    git(&repo, &["config", "user.email", "operator@example.com"]);
    git(&repo, &["config", "commit.gpgsign", "false"]);
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &["commit", "-q", "-m", "Start the config repository"],
    );

    // The pull request: test to 1.13.2, the first of the chain, no gate.
    git(&repo, &["switch", "-q", "-c", "bump-test"]);
    bump(&repo, "test", "1.12.0", "1.13.2");
    git(&repo, &["commit", "-q", "-am", "Bump test to 1.13.2"]);
    let (code, out, err) = drover_in(&envs, &["check", "--base", "main"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("test 1.13.2"), "{out}");

    // Stage next, before any cluster confirmed: refused, naming where the
    // confirmations would be.
    bump(&repo, "stage", "1.12.0", "1.13.2");
    git(&repo, &["commit", "-q", "-am", "Bump stage to 1.13.2"]);
    let (code, out, _) = drover_in(&envs, &["check", "--base", "main"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("environments/stage.toml:")
            && out
                .contains("has confirmed it on its status branch (drover/status.d/test/<cluster>)")
            && out.contains("not confirmed by: test-1"),
        "{out}"
    );

    // `drover init` overwrites nothing.
    let (code, _, err) = drover_in(tmp.path(), &["init", "fleet-config", "--version", "1.12.0"]);
    assert_eq!(code, 1);
    assert!(err.contains("already holds drover.toml"), "{err}");
}

#[test]
fn init_refuses_what_check_would_refuse_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (&["init", "a", "--version", "1.13"][..], "exact version"),
        (
            &["init", "a", "--version", "1.13.2", "--envs", "Test,prod"],
            "environment name \"Test\" is not valid",
        ),
        (
            &[
                "init",
                "a",
                "--version",
                "1.13.2",
                "--timezone",
                "Europe/Madird",
            ],
            "Europe/Madrid",
        ),
    ] {
        let (code, _, err) = drover_in(tmp.path(), args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!tmp.path().join("a/drover.toml").exists(), "{args:?}");
    }
}

/// The five library errors a newcomer met, each now said as what they did
/// and what to do.
#[test]
fn errors_say_what_happened_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    // An empty repository: no commit yet.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    git(&empty, &["init", "-q"]);
    let (code, _, err) = drover_in(&empty, &["log"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("has no commits yet: commit the config first"),
        "{err}"
    );
    assert!(!err.contains("class="), "{err}");

    // Outside git.
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let (code, _, err) = drover_in(&plain, &["status"]);
    assert_eq!(code, 1, "no drover.toml here: {err}");
    assert!(
        err.contains("or any directory above it") && err.contains("drover init"),
        "{err}"
    );
    let (code, _, err) = drover_in(&plain, &["verify", "--allowed-signers", "/dev/null"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = drover_in(&plain, &["log"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("is not a git repository") && err.contains("--repo DIR"),
        "{err}"
    );
    assert!(!err.contains("class="), "{err}");

    // Hour 25, and an unquoted version.
    let repo = tmp.path().join("repo");
    let (code, _, err) = drover_in(tmp.path(), &["init", "repo", "--version", "1.12.0"]);
    assert_eq!(code, 0, "{err}");
    let test = repo.join("environments/test.toml");
    let text = std::fs::read_to_string(&test).unwrap();
    std::fs::write(&test, text.replace("\"0 2 1 * *\"", "\"0 25 1 * *\"")).unwrap();
    let (code, out, _) = drover_in(&repo, &["check"]);
    assert_eq!(code, 1);
    assert!(out.contains("the hour 25 is out of range 0–23"), "{out}");
    assert!(!out.contains("Component error"), "{out}");
    std::fs::write(
        &test,
        text.replace("version = \"1.12.0\"", "version = 1.12.0"),
    )
    .unwrap();
    let (code, out, _) = drover_in(&repo, &["check"]);
    assert_eq!(code, 1);
    assert!(
        out.contains("environments/test.toml:3:")
            && out.contains("text must be quoted, as in version = \"1.12.0\""),
        "{out}"
    );
    assert!(!out.contains("invalid float"), "{out}");
    std::fs::write(&test, &text).unwrap();

    // A date alone is 00:00 UTC; a time without a zone says to add one.
    let (code, out, err) = drover_in(
        &repo,
        &[
            "-o",
            "json",
            "windows",
            "--env",
            "test",
            "--from",
            "2026-12-01",
            "--count",
            "1",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"start\": \"2026-12-01T02:00:00Z\""), "{out}");
    let (code, _, err) = drover_in(
        &repo,
        &["windows", "--env", "test", "--from", "2026-12-01T02:00"],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("a time needs its zone") && !err.contains("premature"),
        "{err}"
    );

    // Typos of environments and clusters.
    let (code, _, err) = drover_in(&repo, &["windows", "--env", "prod"]);
    assert_eq!(code, 1);
    assert!(err.contains("did you mean \"production\"?"), "{err}");
    let (code, _, err) = drover_in(&repo, &["wait", "--env", "stage", "--cluster", "stage1"]);
    assert_eq!(code, 1);
    assert!(err.contains("did you mean \"stage-1\"?"), "{err}");
}

#[test]
fn completion_man_and_version() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = drover_in(Path::new("."), &["completion", shell]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("drover") && out.contains("format"),
            "{shell}: {out}"
        );
        assert!(out.contains("wait"), "{shell}: every command completes");
    }
    // bash accepts the script.
    let (_, script, _) = drover_in(Path::new("."), &["completion", "bash"]);
    let st = std::process::Command::new("bash")
        .args(["-n", "-c", &script])
        .status()
        .unwrap();
    assert!(st.success());
    let (code, out, _) = drover_in(Path::new("."), &["man"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(".ie") || out.contains(".TH drover"),
        "{out}"
    );
    let (code, out, _) = drover_in(Path::new("."), &["version"]);
    assert_eq!(code, 0);
    let commit = out
        .lines()
        .find_map(|l| l.strip_prefix("commit: "))
        .unwrap();
    assert!(commit == "unknown" || commit.len() == 40, "{out}");
    assert!(out.lines().any(|l| l.starts_with("built: 20")), "{out}");
    let (code, out, _) = drover_in(Path::new("."), &["--version"]);
    assert_eq!(code, 0);
    assert!(out.contains(&format!("commit: {commit}")), "{out}");
}
