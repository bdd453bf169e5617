//! `drover revoke VERSION --reason TEXT` through the binary on a real git
//! repository (docs/design.md §2, §4, §7): the commit it prepares, then the
//! gate refusing the version in `drover check --base` and `drover promote`,
//! with controls that still pass; bad input refused with nothing written.

use crate::support::cli::drover;
use crate::support::git::git;
use serde_json::Value;
use std::path::Path;

/// Far enough after every commit of the test for any soak to have passed.
const LATER: &str = "2030-01-01T00:00:00Z";

const DROVER_TOML: &str = "\
# Fleet policy: reviewed like code.
[promotion]
chain = [\"test\", \"stage\"]   # lowest first
evidence = \"history\"        # how long test has been pinned
revoked = []                # e.g. [{ version = \"1.0.0\", reason = \"...\" }]

[clusters]                  # who reports
test = [\"test-1\"]
stage = [\"stage-1\"]
";

fn env_toml(version: &str, soak: &str) -> String {
    format!(
        "# pinned\nversion = \"{version}\"\n\n[window]\nschedule = \"0 2 1 * *\"\n\n[promotion]\nsoak = \"{soak}\"\n"
    )
}

/// A config repository on `main`: test at `test_v`, stage at 1.12.0.
fn repo(test_v: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("environments")).unwrap();
    std::fs::write(d.join("drover.toml"), DROVER_TOML).unwrap();
    std::fs::write(d.join("environments/test.toml"), env_toml(test_v, "0s")).unwrap();
    std::fs::write(d.join("environments/stage.toml"), env_toml("1.12.0", "1h")).unwrap();
    git(d, &["init", "-q", "-b", "main"]);
    git(d, &["add", "-A"]);
    git(d, &["commit", "-q", "-m", "initial configuration"]);
    // drover's own git calls (the commit it prepares) use the repository's identity.
    git(d, &["config", "user.name", "Release Engineer"]);
    git(d, &["config", "user.email", "re@example.com"]);
    git(d, &["config", "commit.gpgsign", "false"]);
    dir
}

fn run(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["--repo", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    drover(&all)
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {out:?}"))
}

fn branch(dir: &Path) -> String {
    git(dir, &["rev-parse", "--abbrev-ref", "HEAD"])
}

/// Commit `env` at `version` on the current branch.
fn pin(dir: &Path, env: &str, version: &str, soak: &str) {
    std::fs::write(
        dir.join(format!("environments/{env}.toml")),
        env_toml(version, soak),
    )
    .unwrap();
    git(dir, &["commit", "-q", "-am", &format!("{env}: {version}")]);
}

#[test]
fn revoke_commits_the_entry_and_the_gate_then_refuses_the_version() {
    let dir = repo("1.13.1");
    let d = dir.path();

    // Control before: stage may take 1.13.1, which test has run long enough.
    let (code, out, err) = run(d, &["promote", "stage", "--dry-run", "--now", LATER]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("drover/promote-stage-1.13.1"), "{out}");

    let (code, out, err) = run(
        d,
        &[
            "--format",
            "json",
            "revoke",
            "1.13.1",
            "--reason",
            "kernel panic on m7i",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let doc = json_of(&out);
    assert_eq!(doc["ok"], true, "{doc}");
    assert_eq!(doc["version"], "1.13.1");
    assert_eq!(doc["reason"], "kernel panic on m7i");
    assert_eq!(doc["branch"], "drover/revoke-1.13.1");
    assert_eq!(doc["pinned"], serde_json::json!(["test"]));
    let commit = git(d, &["rev-parse", "HEAD"]);
    assert_eq!(doc["commit"], commit.as_str());

    // The commit: on its own branch, only drover.toml, one line changed,
    // every comment kept; the message says what and why.
    assert_eq!(branch(d), "drover/revoke-1.13.1");
    assert_eq!(
        git(d, &["diff", "--name-only", "main", "HEAD"]),
        "drover.toml"
    );
    let expected = DROVER_TOML.replace(
        "revoked = []                #",
        "revoked = [{ version = \"1.13.1\", reason = \"kernel panic on m7i\" }] #",
    );
    assert_eq!(
        std::fs::read_to_string(d.join("drover.toml")).unwrap(),
        expected
    );
    assert_eq!(git(d, &["status", "--porcelain"]), "", "work tree clean");
    let msg = git(d, &["log", "-1", "--format=%B"]);
    assert!(
        msg.starts_with("Revoke 1.13.1: kernel panic on m7i\n"),
        "{msg}"
    );
    assert!(msg.contains("Pinned to 1.13.1 now: test."), "{msg}");
    assert!(msg.contains("keep running it"), "{msg}");
    assert_eq!(git(d, &["log", "-1", "--format=%an"]), "Release Engineer");

    // The revocation itself passes CI: it edits the policy and moves no version.
    let (code, out, err) = run(d, &["check", "--base", "main", "--now", LATER]);
    assert_eq!(code, 0, "{out}{err}");

    // Merged. A change moving stage to 1.13.1 is refused by `check --base`.
    git(d, &["switch", "-q", "main"]);
    git(d, &["merge", "-q", "--ff-only", "drover/revoke-1.13.1"]);
    git(d, &["switch", "-q", "-c", "bump-stage"]);
    pin(d, "stage", "1.13.1", "1h");
    let (code, out, err) = run(
        d,
        &[
            "--format", "json", "check", "--base", "main", "--now", LATER,
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    let doc = json_of(&out);
    let errors = doc["errors"].as_array().unwrap();
    assert!(
        errors.iter().any(|e| {
            let m = e["message"].as_str().unwrap_or("");
            m.contains("stage may not take 1.13.1: it is revoked")
                && m.contains("kernel panic on m7i")
        }),
        "{doc}"
    );
    assert_eq!(errors[0]["file"], "environments/stage.toml", "{doc}");

    // `drover promote` refuses it too, and writes nothing.
    git(d, &["switch", "-q", "main"]);
    let (code, out, err) = run(d, &["promote", "stage", "--now", LATER]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("stage may not take 1.13.1: it is revoked"),
        "{out}"
    );
    assert_eq!(branch(d), "main");

    // Controls: test moves on to 1.13.2 past `check --base`, and stage may
    // then be promoted to it; the revocation refuses one version, not all.
    git(d, &["switch", "-q", "-c", "bump-test"]);
    pin(d, "test", "1.13.2", "0s");
    let (code, out, err) = run(d, &["check", "--base", "main", "--now", LATER]);
    assert_eq!(code, 0, "{out}{err}");
    git(d, &["switch", "-q", "main"]);
    git(d, &["merge", "-q", "--ff-only", "bump-test"]);
    let (code, out, err) = run(d, &["promote", "stage", "--now", LATER]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(branch(d), "drover/promote-stage-1.13.2");
    let (code, out, err) = run(d, &["check", "--base", "main", "--now", LATER]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn a_second_revocation_appends_and_says_no_environment_is_pinned() {
    let dir = repo("1.13.1");
    let d = dir.path();
    let (code, out, err) = run(d, &["revoke", "1.13.1", "--reason", "kernel panic"]);
    assert_eq!(code, 0, "{out}{err}");
    git(d, &["switch", "-q", "main"]);
    git(d, &["merge", "-q", "--ff-only", "drover/revoke-1.13.1"]);
    // A version nobody runs yet may be revoked ahead of time.
    let (code, out, err) = run(
        d,
        &["revoke", "1.14.0", "--reason", "  breaks \"cilium\" 1.16  "],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("revoking 1.14.0: breaks \"cilium\" 1.16"),
        "{out}"
    );
    assert!(!out.contains("note: Pinned"), "{out}");
    let text = std::fs::read_to_string(d.join("drover.toml")).unwrap();
    assert!(
        text.contains(
            "revoked = [{ version = \"1.13.1\", reason = \"kernel panic\" }, { version = \"1.14.0\", reason = \"breaks \\\"cilium\\\" 1.16\" }]"
        ),
        "{text}"
    );
    let msg = git(d, &["log", "-1", "--format=%B"]);
    assert!(msg.contains("No environment is pinned to it."), "{msg}");
    let (code, out, err) = run(d, &["check"]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let dir = repo("1.13.1");
    let d = dir.path();
    let (code, out, err) = run(d, &["revoke", "1.13.1", "--reason", "x"]);
    assert_eq!(code, 0, "{out}{err}");
    git(d, &["switch", "-q", "main"]);
    git(d, &["merge", "-q", "--ff-only", "drover/revoke-1.13.1"]);
    let head = git(d, &["rev-parse", "HEAD"]);
    let branches = git(d, &["branch", "--list"]);

    let cases: &[(&[&str], &str)] = &[
        (&["1.13"], "version must be an exact version"),
        (&["v1.13.2"], "drop the leading `v`"),
        (&["latest"], "\"latest\" is not allowed"),
        (&["^1.13.2"], "a range is not allowed"),
        (&["1.13.2", "--reason", ""], "--reason is empty"),
        (&["1.13.2", "--reason", "   "], "--reason is empty"),
        (&["1.13.2", "--reason", "line one\nline two"], "one line"),
        (&["1.13.1"], "1.13.1 is already revoked"),
    ];
    let long = "y".repeat(501);
    let too_long: &[&str] = &["1.13.2", "--reason", &long];
    for (args, needle) in cases.iter().copied().chain([(too_long, "at most 500")]) {
        let mut argv = vec!["revoke"];
        argv.extend_from_slice(args);
        if !args.contains(&"--reason") {
            argv.extend(["--reason", "kernel panic"]);
        }
        let (code, out, err) = run(d, &argv);
        assert_eq!(code, 1, "{argv:?}: {out}{err}");
        assert!(err.contains(needle), "{argv:?}: {err}");
        let mut json = vec!["--format", "json"];
        json.extend_from_slice(&argv);
        let (code, out, _) = run(d, &json);
        assert_eq!(code, 1, "{json:?}: {out}");
        let doc = json_of(&out);
        assert_eq!(doc["ok"], false);
        assert!(
            doc["errors"][0]["message"]
                .as_str()
                .unwrap_or("")
                .contains(needle),
            "{json:?}: {doc}"
        );
    }
    // Nothing written: same HEAD, branches, clean tree.
    assert_eq!(git(d, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(d, &["branch", "--list"]), branches);
    assert_eq!(git(d, &["status", "--porcelain"]), "");

    // Uncommitted edits to drover.toml are never swept into the commit.
    let edited = format!(
        "{}# a local note\n",
        std::fs::read_to_string(d.join("drover.toml")).unwrap()
    );
    std::fs::write(d.join("drover.toml"), &edited).unwrap();
    let (code, out, err) = run(d, &["revoke", "1.13.2", "--reason", "x"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("drover.toml: has uncommitted changes"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("drover.toml")).unwrap(),
        edited
    );
    assert_eq!(git(d, &["branch", "--list"]), branches);
    git(d, &["checkout", "--", "drover.toml"]);

    // A repository that fails `drover check` is not edited.
    std::fs::write(d.join("environments/stage.toml"), "version = \"1.x\"\n").unwrap();
    git(d, &["commit", "-q", "-am", "broken"]);
    let (code, out, err) = run(d, &["revoke", "1.13.2", "--reason", "x"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("does not pass `drover check`"), "{err}");
    assert_eq!(git(d, &["branch", "--list"]), branches);

    // Control: `--dry-run` on a valid repository says what it would do, writes nothing.
    git(d, &["reset", "-q", "--hard", "HEAD~1"]);
    let (code, out, err) = run(d, &["revoke", "1.13.2", "--reason", "x", "--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("dry run: would create branch drover/revoke-1.13.2"),
        "{out}"
    );
    assert_eq!(git(d, &["rev-parse", "HEAD"]), head);
}

#[test]
fn revoke_names_the_pinned_environments_and_the_command_that_pauses_them() {
    let dir = repo("1.13.1");
    let d = dir.path();
    // test has a [rollout] table with paused = false, as the example's files do.
    let f = d.join("environments/test.toml");
    let mut text = std::fs::read_to_string(&f).unwrap();
    text.push_str("\n[rollout]\nmax_unavailable = 1\npaused = false   # default false\n");
    std::fs::write(&f, text).unwrap();
    git(d, &["commit", "-q", "-am", "test: rollout table"]);

    let (code, out, err) = run(
        d,
        &["revoke", "1.13.1", "--reason", "kernel panic", "--dry-run"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("note: Pinned to 1.13.1 now: test."), "{out}");
    assert!(out.contains("keep running it"), "{out}");
    // The command it gives, run as given, pauses test in a change of its own.
    let cmd = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("sed -i"))
        .unwrap_or_else(|| panic!("no pause command in:\n{out}"));
    assert!(cmd.contains("environments/test.toml"), "{cmd}");
    git(d, &["switch", "-q", "-c", "pause-test"]);
    let st = std::process::Command::new("sh")
        .args(["-c", cmd])
        .current_dir(d)
        .status()
        .unwrap();
    assert!(st.success(), "{cmd}");
    assert_eq!(
        git(d, &["diff", "--name-only", "main", "HEAD"]),
        "environments/test.toml"
    );
    let (code, out, err) = run(d, &["check", "--base", "main"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(d, &["windows", "--env", "test", "--from", LATER]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PAUSED"), "{out}");
}
