//! docs/cli.schema.json against what every command prints under `-o json`,
//! on success and on failure (a rejection, exit 1; a command that could not
//! run or a command line clap refused, exit 2): one envelope, `ok` and
//! `errors` first, every field documented (the schema's objects are closed,
//! so a field nobody documented fails here).

use crate::support::cli::{drover, drover_at};
use crate::support::git::{commit_all, commit_file_on, example_checkout, keygen, public_key};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub use crate::support::cli::assert_valid;

/// The committer time of the signed reports (the soak counts from it).
const SIGNED_AT: &str = "2026-12-01T02:41:00Z";

/// A config repository with history and status branches: example-repo,
/// signed by a release key, test moved to 1.13.2, test-1 confirming it and
/// stage-1 failing 1.12.0 in signed reports.
pub struct Fixture {
    _checkout: tempfile::TempDir,
    pub tmp: tempfile::TempDir,
    pub repo: PathBuf,
    pub allowed: PathBuf,
}

fn report(env: &str, cluster: &str, version: &str, state: &str, since: &str) -> String {
    format!(
        "env = \"{env}\"\ncluster = \"{cluster}\"\nconfig_commit = \"{c}\"\nversion = \"{version}\"\nstate = \"{state}\"\nsince = {since}\nnodes = 5\nnodes_at_version = {n}\nmessage = \"{msg}\"\n",
        c = "0".repeat(40),
        n = if state == "confirmed" { 5 } else { 1 },
        msg = if state == "failed" { "stage-1-node-0 did not come back Ready" } else { "" },
    )
}

impl Fixture {
    pub fn new() -> Self {
        let checkout = example_checkout();
        let tmp = tempfile::tempdir().unwrap();
        let keys = tmp.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        let release = keygen(&keys, "release");
        let test1 = keygen(&keys, "test-1");
        let stage1 = keygen(&keys, "stage-1");
        let repo = checkout.path().to_path_buf();
        let signers = repo.join("agents.allowed_signers");
        let mut text = std::fs::read_to_string(&signers).unwrap();
        for (p, k) in [("test/test-1", &test1), ("stage/stage-1", &stage1)] {
            text.push_str(&format!("{p} namespaces=\"git\" {}\n", public_key(k)));
        }
        std::fs::write(&signers, text).unwrap();
        commit_all(
            &repo,
            "Initial configuration",
            Some(&release),
            Some("2026-11-25T09:00:00Z"),
        );
        let test = repo.join("environments/test.toml");
        let bumped = std::fs::read_to_string(&test)
            .unwrap()
            .replace("version = \"1.12.0\"", "version = \"1.13.2\"");
        std::fs::write(&test, bumped).unwrap();
        commit_all(
            &repo,
            "Bump test to 1.13.2 (#1)",
            Some(&release),
            Some("2026-11-27T10:00:00Z"),
        );
        for (env, cluster, key, version, state) in [
            ("test", "test-1", &test1, "1.13.2", "confirmed"),
            ("stage", "stage-1", &stage1, "1.12.0", "failed"),
        ] {
            commit_file_on(
                &repo,
                &format!("drover/status.d/{env}/{cluster}"),
                &format!("status/{env}/{cluster}.toml"),
                Some(report(env, cluster, version, state, "2026-12-01T02:40:00Z").as_bytes()),
                Some(key),
                "status",
                Some(SIGNED_AT),
            );
        }
        let allowed = tmp.path().join("allowed_signers");
        std::fs::write(
            &allowed,
            format!(
                "release@example.com namespaces=\"git\" {}\n",
                public_key(&release)
            ),
        )
        .unwrap();
        Fixture {
            _checkout: checkout,
            tmp,
            repo,
            allowed,
        }
    }
}

/// Run `drover -o json ARGS` in `repo`; the exit code and the document.
fn run(repo: &Path, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["-o", "json"];
    all.extend_from_slice(args);
    let (code, out, err) = drover_at(repo, &all);
    let doc = serde_json::from_str(&out).unwrap_or_else(|e| {
        panic!("drover {args:?}: stdout is not one JSON document ({e}): {out:?} {err}")
    });
    (code, doc)
}

#[test]
fn every_command_s_documents_match_the_schema() {
    let f = Fixture::new();
    let repo = f.repo.as_path();
    let allowed = f.allowed.to_str().unwrap();
    let fresh = f.tmp.path().join("fresh");
    let fresh = fresh.to_str().unwrap();
    // (command, args, exit code)
    let cases: Vec<(&str, Vec<&str>, i32)> = vec![
        ("check", vec!["check"], 0),
        (
            "windows",
            vec!["windows", "--env", "test", "--from", "2026-12-01"],
            0,
        ),
        ("windows", vec!["windows", "--env", "prod"], 1),
        ("log", vec!["log", "--allowed-signers", allowed], 0),
        ("log", vec!["log", "--env", "tset"], 1),
        ("verify", vec!["verify", "--allowed-signers", allowed], 0),
        (
            "promote",
            vec![
                "promote",
                "stage",
                "--dry-run",
                "--now",
                "2026-12-10T00:00:00Z",
            ],
            0,
        ),
        (
            "promote",
            vec![
                "promote",
                "production",
                "--dry-run",
                "--now",
                "2026-12-10T00:00:00Z",
            ],
            1,
        ),
        (
            "revoke",
            vec![
                "revoke",
                "1.13.9",
                "--reason",
                "kernel panic on m7i",
                "--dry-run",
            ],
            0,
        ),
        (
            "revoke",
            vec!["revoke", "latest", "--reason", "x", "--dry-run"],
            1,
        ),
        (
            "plan",
            vec![
                "plan",
                "--env",
                "stage",
                "--nodes",
                "2",
                "--now",
                "2026-12-07T00:00:00Z",
            ],
            0,
        ),
        (
            "plan",
            vec!["plan", "--env", "stage", "--nodes", "999999"],
            1,
        ),
        ("status", vec!["status", "--now", "2026-12-10T00:00:00Z"], 0),
        ("status", vec!["status", "--env", "prod"], 1),
        (
            "explain",
            vec![
                "status",
                "--explain",
                "stage-1",
                "--now",
                "2026-12-10T00:00:00Z",
            ],
            0,
        ),
        ("explain", vec!["status", "--explain", "no-such-cluster"], 1),
        (
            "wait",
            vec!["wait", "--env", "test", "--no-fetch", "--timeout", "30s"],
            0,
        ),
        // stage-1 reported `failed` for stage's version: it will not confirm by itself.
        (
            "wait",
            vec!["wait", "--env", "stage", "--no-fetch", "--timeout", "30s"],
            1,
        ),
        (
            "wait",
            vec!["wait", "--env", "stage", "--cluster", "stage-2"],
            1,
        ),
        ("init", vec!["init", fresh, "--version", "1.12.0"], 0),
        ("init", vec!["init", fresh, "--version", "1.12.0"], 1),
        // No cluster to read: the first check fails, saying what to do.
        (
            "doctor",
            vec!["doctor", "--kubeconfig", "/nonexistent/kubeconfig"],
            1,
        ),
        ("completion", vec!["completion", "bash"], 0),
        ("man", vec!["man"], 0),
        ("version", vec!["version"], 0),
        // Could not run (exit 2): a base that names no commit; clap's refusals.
        ("failure", vec!["check", "--base", "no-such-branch"], 2),
        ("failure", vec!["check", "--bogus"], 2),
        ("failure", vec!["windows"], 2),
        (
            "failure",
            vec!["wait", "--env", "test", "--for", "ready"],
            2,
        ),
    ];
    for (command, args, code) in &cases {
        let (got, doc) = run(repo, args);
        assert_eq!(got, *code, "drover {args:?}: {doc:#}");
        assert_eq!(doc["ok"], *code == 0, "drover {args:?}: {doc:#}");
        assert_valid(command, &doc);
        if *code != 0 {
            let message = doc["errors"][0]["message"].as_str().unwrap_or("");
            assert!(!message.is_empty(), "drover {args:?}: {doc:#}");
            // What the user did and what to do, never libgit2's internals.
            assert!(!message.contains("class="), "drover {args:?}: {message}");
        }
    }
    // Outside any repository (exit 2): the document too.
    let nowhere = tempfile::tempdir().unwrap();
    let out = crate::support::cli::drover_command()
        .args(["-o", "json", "log"])
        .current_dir(nowhere.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_valid("failure", &doc);
    assert!(
        doc["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("not a git repository"),
        "{doc}"
    );
}

#[test]
fn yaml_is_the_same_document() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo");
    let args = [
        "windows",
        "--env",
        "stage",
        "--from",
        "2026-12-01",
        "--count",
        "2",
    ];
    let (code, json) = run(&repo, &args);
    assert_eq!(code, 0);
    let (code, out, err) = drover_at(&repo, &[&["-o", "yaml"][..], &args].concat());
    assert_eq!(code, 0, "{err}");
    let yaml: Value = serde_yaml::from_str(&out).unwrap();
    assert_eq!(yaml, json);
    // --format json and --output json are the same flag as -o json.
    for flag in ["--format", "--output"] {
        let (_, out, _) = drover_at(&repo, &[&[flag, "json"][..], &args].concat());
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json);
    }
    let (code, out, _) = drover(&["-o", "yaml", "check", "--nope"]);
    assert_eq!(code, 2);
    let yaml: Value = serde_yaml::from_str(&out).unwrap();
    assert_valid("failure", &yaml);
}
