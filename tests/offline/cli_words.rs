//! What the CLI says, as the first-hour trial read it (issue 41): a typo'd
//! environment gets the nearest name, a typo in the chain is pointed at the
//! chain (not at the name that matches a file), counts read "1 node", the
//! status store is named as agents write it now, errors say a file's trouble
//! in words, and `--env` completes environment names in bash (the real
//! bash, the script `drover completion bash` prints).

use crate::support::cli::{drover_at, drover_command};
use crate::support::git::{commit_configured, example_checkout, git};
use std::path::Path;

fn example_repo() -> tempfile::TempDir {
    let dir = example_checkout();
    git(dir.path(), &["add", "-A"]);
    commit_configured(dir.path(), &["-q", "-m", "initial"]);
    dir
}

#[test]
fn a_typo_gets_the_nearest_name_pointed_the_right_way() {
    let dir = example_repo();
    let (code, out, err) = drover_at(dir.path(), &["promote", "prod"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(r#"unknown environment "prod"; did you mean "production"?"#),
        "{err}"
    );
    // A typo in the chain: the file and [clusters] say `production`.
    let toml = dir.path().join("drover.toml");
    let text = std::fs::read_to_string(&toml).unwrap().replacen(
        r#""stage", "production"]"#,
        r#""stage", "prodution"]"#,
        1,
    );
    std::fs::write(&toml, text).unwrap();
    let (code, out, err) = drover_at(dir.path(), &["check"]);
    let err = format!("{out}{err}");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("environment `prodution` has no file `environments/prodution.toml`; did you mean `production`? (environments/production.toml exists: correct the chain)"),
        "{err}"
    );
    assert!(
        err.contains("did you mean `production` in the chain?")
            && !err.contains("did you mean `prodution`"),
        "the suggestion runs from the file's name to the chain: {err}"
    );
    assert!(
        err.contains("correct `prodution` in the chain to `production`"),
        "{err}"
    );
    // Control: a typo in [clusters] is still pointed at [clusters].
    let dir = example_repo();
    let toml = dir.path().join("drover.toml");
    let text =
        std::fs::read_to_string(&toml)
            .unwrap()
            .replacen("\nproduction = [", "\nprodution = [", 1);
    std::fs::write(&toml, text).unwrap();
    let (_, out, err) = drover_at(dir.path(), &["check"]);
    let err = format!("{out}{err}");
    assert!(
        err.contains(
            "[clusters] lists `prodution`, which is not in the chain; did you mean `production`?"
        ),
        "{err}"
    );
}

#[test]
fn one_is_singular_and_the_store_is_named_as_agents_write_it() {
    let dir = example_repo();
    let (code, out, err) = drover_at(
        dir.path(),
        &[
            "plan",
            "--env",
            "test",
            "--nodes",
            "1",
            "--now",
            "2026-12-01T00:00:00Z",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("target 1.12.0, 1 node, 0 at target"), "{out}");
    assert!(
        out.contains("1 node to upgrade") && out.contains("1 window,"),
        "{out}"
    );
    assert!(
        !out.contains(" 1 nodes") && !out.contains(" 1 windows"),
        "{out}"
    );
    let (code, out, err) = drover_at(dir.path(), &["status", "--now", "2026-12-05T00:00:00Z"]);
    assert_eq!(code, 0, "{err}");
    let first = out.lines().nth(1).unwrap();
    assert_eq!(
        first,
        "status branch drover/status.d/<env>/<cluster> (none yet: no reports)"
    );
    let (code, out, _) = drover_at(dir.path(), &["promote", "stage", "--dry-run"]);
    assert_eq!(code, 1);
    assert!(
        out.contains("confirmed on their status branches drover/status.d/test/<cluster>: none"),
        "{out}"
    );
}

#[test]
fn a_files_trouble_is_said_in_words() {
    let dir = example_repo();
    for (args, want) in [
        (
            vec!["status", "--html", "/nonexistent/page.html"],
            "drover: error: cannot write /nonexistent/page.html: the directory /nonexistent does not exist",
        ),
        (
            vec!["verify", "--allowed-signers", "/nonexistent/signers"],
            "drover: error: /nonexistent/signers: cannot read it: no such file or directory",
        ),
        (
            vec!["plan", "--env", "test", "--kubeconfig", "/nonexistent/kubeconfig"],
            "drover: error: reading /nonexistent/kubeconfig: no such file or directory",
        ),
    ] {
        let (code, _, err) = drover_at(dir.path(), &args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim_end(), want, "{args:?}");
        assert!(!err.contains("os error"), "{err}");
    }
}

/// Complete `words` (the last one being typed) with the bash script
/// `drover completion bash` prints, sourced by the real bash in `dir`.
fn bash_complete(dir: &Path, words: &[&str]) -> Vec<String> {
    let script = drover_command()
        .args(["completion", "bash"])
        .output()
        .unwrap();
    assert!(script.status.success());
    let file = dir.join("drover.bash");
    std::fs::write(&file, &script.stdout).unwrap();
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_drover"));
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cword = words.len() - 1;
    let driver = format!(
        "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={cword}\n_drover drover '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        file.display(),
        quoted.join(" "),
        words[cword],
        words[cword - 1],
    );
    let out = std::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &driver])
        .current_dir(dir)
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.parent().unwrap().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn env_completes_environment_names_not_file_names() {
    let dir = example_repo();
    // Inside a directory of the repository, as people type.
    let sub = dir.path().join("environments");
    assert_eq!(
        bash_complete(&sub, &["drover", "windows", "--env", ""]),
        ["test", "stage", "production"]
    );
    assert_eq!(
        bash_complete(&sub, &["drover", "status", "--env", "pr"]),
        ["production"]
    );
    // Outside a repository: nothing, and no file names.
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("production.toml"), "").unwrap();
    assert!(bash_complete(empty.path(), &["drover", "plan", "--env", ""]).is_empty());
    // Control: a file argument still completes file names.
    assert!(bash_complete(&sub, &["drover", "status", "--html", "te"])
        .contains(&"test.toml".to_owned()));
    // zsh and fish ask the binary the same way, for every --env.
    for (shell, per_env) in [
        ("zsh", ":ENV:_drover_envs'"),
        (
            "fish",
            "-f -a \"(DROVER_COMPLETE=envs drover 2>/dev/null)\"",
        ),
    ] {
        let out = drover_command()
            .args(["completion", shell])
            .output()
            .unwrap();
        let script = String::from_utf8(out.stdout).unwrap();
        let envs = script
            .lines()
            .filter(|l| l.starts_with("'--env=[") || l.contains(" -l env -d "))
            .collect::<Vec<_>>();
        assert!(envs.len() >= 5, "{shell}: {envs:?}");
        assert!(
            envs.iter().all(|l| l.contains(per_env)),
            "{shell}: {envs:?}"
        );
    }
}

#[test]
fn tables_drop_their_headers_and_jsonpath_reads_the_document() {
    let dir = example_repo();
    let from = "2026-12-05T00:00:00Z";
    let (code, with, err) = drover_at(
        dir.path(),
        &["windows", "--env", "stage", "--from", from, "--count", "2"],
    );
    assert_eq!(code, 0, "{err}");
    let (_, without, _) = drover_at(
        dir.path(),
        &[
            "windows",
            "--env",
            "stage",
            "--from",
            from,
            "--count",
            "2",
            "--no-headers",
        ],
    );
    assert_eq!(without.lines().count(), 2, "{without}");
    assert!(
        with.ends_with(&without) && with.lines().count() > 2,
        "{with}"
    );
    let (_, log, _) = drover_at(dir.path(), &["log", "--no-headers"]);
    assert!(!log.contains("DATE") && !log.trim().is_empty(), "{log}");
    // -o jsonpath: the JSON document through kubectl's template.
    let (code, names, err) = drover_at(
        dir.path(),
        &[
            "status",
            "--now",
            from,
            "-o",
            "jsonpath={.environments[*].name}",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(names, "test stage production");
    let (_, starts, _) = drover_at(
        dir.path(),
        &[
            "windows",
            "--env",
            "stage",
            "--from",
            from,
            "--count",
            "2",
            "-o",
            r#"jsonpath={range .windows[*]}{.start}{"\n"}{end}"#,
        ],
    );
    let (_, json, _) = drover_at(
        dir.path(),
        &[
            "windows", "--env", "stage", "--from", from, "--count", "2", "-o", "json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let want: String = v["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| format!("{}\n", w["start"].as_str().unwrap()))
        .collect();
    assert_eq!(starts, want);
    // A rejection is said on stderr; a bad template is a usage error.
    let (code, out, err) = drover_at(
        dir.path(),
        &["windows", "--env", "prod", "-o", "jsonpath={.env}"],
    );
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(err.contains("did you mean \"production\""), "{err}");
    let (code, _, err) = drover_at(dir.path(), &["status", "-o", "jsonpath={.environments[}"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is not a JSONPath expression"), "{err}");
}

/// What `cargo install --git ... drover` and `cargo install --path .`
/// (docs/install.md, "The CLI") rely on, checked without building: one
/// binary target `drover` that needs no feature, the lock file in git (for
/// `--locked`), and the release publishing both static binaries with
/// `SHA256SUMS`. (`cargo install --locked --offline --debug --path .
/// --root DIR` with the tests' target directory installs it in ~16 s when
/// the plain binary is built; too slow to repeat in every CI run.)
#[test]
fn the_cli_installs_with_cargo_and_from_the_release() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pkg = &meta["packages"][0];
    assert_eq!(pkg["name"], "drover");
    let bins: Vec<&serde_json::Value> = pkg["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .collect();
    assert_eq!(bins.len(), 1, "{bins:?}");
    assert_eq!(bins[0]["name"], "drover");
    assert!(bins[0]["required-features"].is_null(), "{:?}", bins[0]);
    assert!(
        pkg["features"]["default"]
            .as_array()
            .is_none_or(|d| d.is_empty()),
        "no default feature: the test hooks stay out of an install"
    );
    let tracked = git(root, &["ls-files", "Cargo.lock"]);
    assert_eq!(tracked.trim(), "Cargo.lock");
    let release = std::fs::read_to_string(root.join(".github/workflows/release.yml")).unwrap();
    for want in [
        "x86_64-unknown-linux-musl",
        "aarch64-unknown-linux-musl",
        "subject-path: dist/drover-${{ matrix.target }}",
        "sha256sum drover-* > SHA256SUMS",
        "gh release create \"$TAG\" dist/*",
    ] {
        assert!(release.contains(want), "release.yml lacks {want:?}");
    }
    let doc = std::fs::read_to_string(root.join("docs/install.md")).unwrap();
    assert!(doc.contains(
        "cargo install --locked --git https://github.com/drover-dev/drover --tag v0.1.0 drover"
    ));
    assert!(doc.contains("cargo install --locked --path ."));
}
