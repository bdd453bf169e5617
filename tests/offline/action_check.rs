//! The GitHub Action (action.yml, action/check) from recorded runs: the
//! script runs as the runner runs it — `GITHUB_STEP_SUMMARY`, `GITHUB_OUTPUT`
//! and `RUNNER_TEMP` set to temporary files, a pull request's checkout whose
//! `origin` holds the base branch and the agents' signed status branches —
//! and its annotations, job summary and exit status are compared with the
//! recordings in tests/offline/fixtures/action/. Re-record with
//! `DROVER_BLESS=1 cargo test --test offline action_check`.
//!
//! The stories: a pull request moving stage (confirmed, soaked: allowed) and
//! production (stage has not confirmed: refused, annotated on the version
//! line); a stage bump inside test's soak, refused, that passes unchanged
//! when the scheduled re-run comes after the soak; and an origin with no
//! status branch, which the check names instead of "not confirmed" alone.

use crate::support::cli::drover_at;
use crate::support::git::{commit_file_on, copy_dir, git, git_env};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The report key of `<env>/<cluster>`, made from its name so recordings
/// are stable (never a key to use outside this test), written for git.
fn cluster_key(dir: &Path, principal: &str) -> (PathBuf, String) {
    use sha2::Digest;
    let seed: [u8; 32] = sha2::Sha256::digest(principal.as_bytes()).into();
    let key = ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&seed));
    let path = dir.join(principal.replace('/', "-"));
    std::fs::write(
        &path,
        key.to_openssh(ssh_key::LineEnding::LF).unwrap().as_bytes(),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path, key.public_key().to_openssh().unwrap())
}

struct Fixture {
    dir: tempfile::TempDir,
    origin: PathBuf,
    work: PathBuf,
    test_key: PathBuf,
}

fn set_version(work: &Path, env: &str, version: &str) {
    let p = work.join(format!("environments/{env}.toml"));
    let text = std::fs::read_to_string(&p).unwrap();
    let text = text.replacen(
        "version = \"1.12.0\"",
        &format!("version = \"{version}\""),
        1,
    );
    std::fs::write(p, text).unwrap();
}

/// example-repo on `main` with test at 1.13.2, pushed to a bare `origin`;
/// `confirm`: test-1's signed confirmation of 1.13.2 (2026-12-01T05:00Z)
/// on its status branch there.
fn fixture(confirm: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let mut signers = String::new();
    let mut test_key = PathBuf::new();
    for p in ["test/test-1", "stage/stage-1"] {
        let (path, public) = cluster_key(&keys, p);
        signers.push_str(&format!("{p} namespaces=\"git\" {public}\n"));
        if p == "test/test-1" {
            test_key = path;
        }
    }
    let work = dir.path().join("work");
    copy_dir(&root().join("example-repo"), &work);
    std::fs::write(work.join("agents.allowed_signers"), signers).unwrap();
    set_version(&work, "test", "1.13.2");
    git(&work, &["init", "-q", "-b", "main"]);
    git(&work, &["add", "-A"]);
    git_env(
        &work,
        &["commit", "-q", "-m", "test: 1.13.2"],
        Some("2026-11-25T10:00:00Z"),
        &[],
    );
    let origin = dir.path().join("origin.git");
    git(
        dir.path(),
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            origin.to_str().unwrap(),
        ],
    );
    git(
        &work,
        &["remote", "add", "origin", origin.to_str().unwrap()],
    );
    git(&work, &["push", "-q", "origin", "main"]);
    if confirm {
        let report = "env = \"test\"\ncluster = \"test-1\"\nconfig_commit = \"0123456789abcdef0123456789abcdef01234567\"\nversion = \"1.13.2\"\nstate = \"confirmed\"\nsince = 2026-12-01T05:00:00Z\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n";
        commit_file_on(
            &origin,
            "drover/status.d/test/test-1",
            "status/test/test-1.toml",
            Some(report.as_bytes()),
            Some(&test_key),
            "test/test-1: confirmed 1.13.2",
            Some("2026-12-01T05:00:00Z"),
        );
    }
    Fixture {
        dir,
        origin,
        work,
        test_key,
    }
}

impl Fixture {
    /// The pull request: a branch moving `envs` to 1.13.2.
    fn pull_request(&self, envs: &[&str]) {
        git(&self.work, &["checkout", "-q", "-b", "bump"]);
        for e in envs {
            set_version(&self.work, e, "1.13.2");
        }
        git(&self.work, &["add", "-A"]);
        git_env(
            &self.work,
            &["commit", "-q", "-m", "bump"],
            Some("2026-12-03T10:00:00Z"),
            &[],
        );
    }

    /// One run of the action's script, as the runner makes it; returns
    /// (exit code, stdout with the workflow commands, the job summary, GITHUB_OUTPUT).
    fn run_action(&self, now: &str) -> (i32, String, String, String) {
        let runner = self.dir.path().join(format!("runner-{now}"));
        std::fs::create_dir_all(&runner).unwrap();
        let summary = runner.join("step_summary.md");
        let output = runner.join("output");
        let out = Command::new(root().join("action/check"))
            .current_dir(&self.work)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GITHUB_STEP_SUMMARY", &summary)
            .env("GITHUB_OUTPUT", &output)
            .env("RUNNER_TEMP", &runner)
            .env("INPUT_BASE", "main")
            .env("INPUT_PATH", ".")
            .env("INPUT_STATUS_BRANCH", "drover/status")
            .env("INPUT_DROVER", env!("CARGO_BIN_EXE_drover"))
            .env("INPUT_NOW", now)
            .output()
            .unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "the action could not run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            out.status.code().unwrap(),
            String::from_utf8(out.stdout).unwrap(),
            read(&summary),
            read(&output),
        )
    }

    /// Commit ids of the status branch, named for the recording.
    fn normalize(&self, text: &str) -> String {
        let mut text = text.to_owned();
        let tip = Command::new("git")
            .args(["rev-parse", "drover/status.d/test/test-1"])
            .current_dir(&self.origin)
            .output()
            .unwrap();
        let tip = String::from_utf8_lossy(&tip.stdout).trim().to_owned();
        if tip.len() == 40 {
            text = text.replace(&tip, "<test-1's report>");
            text = text.replace(&tip[..10], "<test-1's report>");
        }
        let _ = &self.test_key;
        text
    }
}

/// Compare a run with its recording (or record it under DROVER_BLESS=1).
fn recorded(name: &str, fx: &Fixture, run: (i32, String, String, String)) {
    let (code, stdout, summary, output) = run;
    let have = fx.normalize(&format!(
        "# exit status\n{code}\n# workflow commands (stdout)\n{stdout}# GITHUB_OUTPUT\n{output}# GITHUB_STEP_SUMMARY\n{summary}"
    ));
    let path = root().join(format!("tests/offline/fixtures/action/{name}.txt"));
    if std::env::var("DROVER_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &have).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "the action's output differs from {} (re-record with DROVER_BLESS=1 if the change is meant):\n--- recorded\n{want}\n--- this run\n{have}",
        path.display()
    );
}

#[test]
fn a_pull_request_gets_annotations_and_the_evidence_in_the_summary() {
    let fx = fixture(true);
    fx.pull_request(&["stage", "production"]);
    let run = fx.run_action("2026-12-05T00:00:00Z");
    assert_eq!(run.0, 1, "production is refused");
    assert!(
        run.1
            .contains("::error file=environments/production.toml,line="),
        "{}",
        run.1
    );
    assert!(
        run.2.contains("SHA256:"),
        "the signer's key is named:\n{}",
        run.2
    );
    recorded("evidence", &fx, run);
}

#[test]
fn a_soak_refusal_passes_by_itself_on_the_scheduled_rerun() {
    let fx = fixture(true);
    fx.pull_request(&["stage"]);
    let soaking = fx.run_action("2026-12-01T12:00:00Z");
    assert_eq!(soaking.0, 1);
    assert!(
        soaking.2.contains("Soak passes at 2026-12-02T05:00:00Z"),
        "{}",
        soaking.2
    );
    recorded("soaking", &fx, soaking);
    // The schedule runs the same check on the same pull request a day later.
    let later = fx.run_action("2026-12-02T06:00:00Z");
    assert_eq!(later.0, 0, "{}", later.2);
    recorded("soaked", &fx, later);

    // And drover check itself shows the evidence of a passing change, in text and JSON.
    let (code, out, _) = drover_at(
        &fx.work,
        &[
            "check",
            "--base",
            "origin/main",
            "--now",
            "2026-12-02T06:00:00Z",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("stage 1.12.0 -> 1.13.2: allowed"), "{out}");
    assert!(
        out.contains("  test-1 confirmed 1.13.2 at 2026-12-01T05:00:00Z (report "),
        "{out}"
    );
    assert!(
        out.contains("on origin/drover/status.d/test/test-1, signed by SHA256:"),
        "{out}"
    );
    assert!(
        out.contains("  soak passed at 2026-12-02T05:00:00Z"),
        "{out}"
    );
    let (_, json, _) = drover_at(
        &fx.work,
        &[
            "--format",
            "json",
            "check",
            "--base",
            "origin/main",
            "--now",
            "2026-12-02T06:00:00Z",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let c = &v["changes"][0];
    assert_eq!(c["env"], "stage");
    assert_eq!(c["verdict"], "allowed");
    assert_eq!(c["confirmations"][0]["cluster"], "test-1");
    assert!(c["confirmations"][0]["signer"]
        .as_str()
        .unwrap()
        .starts_with("SHA256:"));
    assert_eq!(c["soak_passes_at"], "2026-12-02T05:00:00Z");
}

#[test]
fn no_status_branch_on_origin_is_named_not_read_as_unconfirmed() {
    let fx = fixture(false);
    fx.pull_request(&["stage"]);
    let run = fx.run_action("2026-12-05T00:00:00Z");
    assert_eq!(run.0, 1);
    assert!(
        run.1
            .contains("no status branches found locally or under origin/drover/status.d/"),
        "{}",
        run.1
    );
    assert!(run.1.contains("did CI fetch them?"), "{}", run.1);
    recorded("unfetched", &fx, run);
}

/// The action installs the release of its own version.
#[test]
fn the_action_installs_the_release_of_this_version() {
    let script = std::fs::read_to_string(root().join("action/check")).unwrap();
    assert!(
        script.contains(&format!("\nDROVER_VERSION={}\n", env!("CARGO_PKG_VERSION"))),
        "action/check's DROVER_VERSION is not Cargo.toml's version"
    );
}
