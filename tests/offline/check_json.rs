//! The JSON document of `drover check --format json` (docs/design.md §7).

use std::path::Path;

fn check_json(repo: &Path) -> (i32, serde_json::Value) {
    let out = crate::support::cli::drover_command()
        .args(["check", "--format", "json", "--repo"])
        .arg(repo)
        .output()
        .expect("run drover");
    let doc = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    (out.status.code().unwrap_or(-1), doc)
}

#[test]
fn success_is_ok_true_with_no_errors() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo");
    let (code, doc) = check_json(&repo);
    assert_eq!(code, 0);
    assert_eq!(doc, serde_json::json!({"ok": true, "errors": []}));
}

#[test]
fn each_error_has_exactly_file_line_column_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("drover.toml"),
        "[promotion]\nchain = [\"test\"]\nevidence = \"logs\"\n",
    )
    .expect("write");
    std::fs::create_dir(dir.path().join("environments")).expect("mkdir");
    std::fs::write(
        dir.path().join("environments/test.toml"),
        "version = \"latest\"\n",
    )
    .expect("write");
    let (code, doc) = check_json(dir.path());
    assert_eq!(code, 1);
    let obj = doc.as_object().expect("object");
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["errors", "ok"]);
    assert_eq!(doc["ok"], false);
    let errors = doc["errors"].as_array().expect("errors array");
    assert_eq!(errors.len(), 2, "{errors:?}");
    for e in errors {
        let mut keys: Vec<&str> = e
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["column", "file", "line", "message"]);
        assert!(e["line"].is_u64() && e["column"].is_u64() && e["message"].is_string());
    }
    assert_eq!(errors[0]["file"], "drover.toml");
    assert_eq!(errors[0]["line"], 3);
    assert_eq!(errors[0]["column"], 12);
    assert_eq!(errors[1]["file"], "environments/test.toml");
    assert_eq!(errors[1]["line"], 1);
    assert_eq!(errors[1]["column"], 11);
}

/// `check --base` judges commits: an uncommitted edit (here one taking
/// stage to a version test never confirmed) is refused by name, not passed;
/// committed, the same edit is judged and refused by the gate. The control:
/// a clean tree with an untracked file outside environments/ passes.
#[test]
fn base_refuses_a_working_tree_that_differs_from_head() {
    use crate::support::git::{example_checkout, git};
    let dir = example_checkout();
    let d = dir.path();
    git(d, &["add", "-A"]);
    git(d, &["commit", "-q", "-m", "initial"]);
    git(d, &["branch", "-q", "base"]);
    std::fs::write(d.join("drover-linux-amd64"), "a tool a CI job downloaded").unwrap();
    let run = |args: &[&str]| crate::support::cli::drover_at(d, args);
    let (code, out, err) = run(&["check", "--base", "base"]);
    assert_eq!(code, 0, "{out}{err}");

    let f = d.join("environments/stage.toml");
    let text = std::fs::read_to_string(&f)
        .unwrap()
        .replacen("\"1.12.0\"", "\"1.13.3\"", 1);
    std::fs::write(&f, text).unwrap();
    let (code, out, err) = run(&["check", "--base", "base"]);
    assert_eq!(code, 1, "{out}{err}");
    let said = format!("{out}{err}");
    assert!(
        said.contains("the working tree differs from HEAD (environments/stage.toml)"),
        "{said}"
    );
    let (code, out, _) = run(&["-o", "json", "check", "--base", "base"]);
    assert_eq!(code, 1);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["ok"], false);

    git(d, &["commit", "-q", "-am", "stage: 1.13.3"]);
    let (code, out, err) = run(&["check", "--base", "base"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        !format!("{out}{err}").contains("working tree"),
        "{out}{err}"
    );
}
