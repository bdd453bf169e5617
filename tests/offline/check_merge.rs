//! `drover check --base` judges what the pull request would land: the merge
//! of HEAD into the base, computed in memory as `git merge-tree` computes
//! it, never the base's tip against HEAD's tip (docs/design.md §7). A
//! branch that is behind its base is blamed only for its own change; one
//! that does not merge cleanly is refused, naming the files.

use crate::support::cli::drover_at;
use crate::support::git::{commit_all, git, WorkRepo};
use std::path::Path;

/// Merge `branch` into main as a merge commit (the merge button's shape).
fn merge_into_main(dir: &Path, branch: &str) {
    git(dir, &["checkout", "-q", "main"]);
    git(
        dir,
        &[
            "merge",
            "-q",
            "--no-ff",
            "-m",
            &format!("Merge {branch}"),
            branch,
        ],
    );
}

/// A change on a branch of its own off main, merged into main.
fn merged_change(r: &WorkRepo, branch: &str, edit: impl FnOnce(&Path)) {
    git(&r.dir, &["checkout", "-q", "-b", branch, "main"]);
    edit(&r.dir);
    commit_all(&r.dir, branch, None, None);
    merge_into_main(&r.dir, branch);
}

fn replace(dir: &Path, file: &str, from: &str, to: &str) {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file}: {from:?} not in {text}");
    std::fs::write(&path, text.replace(from, to)).unwrap();
}

/// main, and a pull request branch `pr` started at main's first commit,
/// then three merges on main: test moves to 1.1.0 and to 1.2.0, and
/// stage's soak is set (a policy edit). The branch holds none of them.
fn three_merges_behind() -> (tempfile::TempDir, WorkRepo) {
    let tmp = tempfile::tempdir().unwrap();
    let r = WorkRepo::init(&tmp.path().join("work"));
    git(&r.dir, &["branch", "pr"]);
    merged_change(&r, "test-1.1.0", |d| {
        replace(d, "environments/test.toml", "1.0.0", "1.1.0")
    });
    merged_change(&r, "stage-soak", |d| {
        let path = d.join("environments/stage.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}\n[promotion]\nsoak = \"48h\"\n")).unwrap();
    });
    merged_change(&r, "test-1.2.0", |d| {
        replace(d, "environments/test.toml", "1.1.0", "1.2.0")
    });
    git(&r.dir, &["checkout", "-q", "pr"]);
    (tmp, r)
}

fn check(r: &WorkRepo) -> (i32, serde_json::Value, String) {
    let (code, out, err) = drover_at(&r.dir, &["-o", "json", "check", "--base", "main"]);
    let json = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
    (code, json, err)
}

#[test]
fn a_branch_three_merges_behind_main_is_judged_by_its_own_change() {
    let (_tmp, r) = three_merges_behind();
    // Its own change moves no version (a window edit): it passes. Judged as
    // HEAD's tip against main's, it "downgraded" test and edited stage's soak.
    replace(&r.dir, "environments/test.toml", "0 2 1 * *", "0 3 1 * *");
    commit_all(&r.dir, "test: a later window", None, None);
    let (code, json, err) = check(&r);
    assert_eq!(code, 0, "{json} {err}");
    assert_eq!(json["ok"], true, "{json}");
    assert_eq!(json["changes"], serde_json::json!([]), "{json}");

    // Its own change moves stage without test's confirmation: refused, for
    // that alone (main's own moves of test are not this branch's).
    replace(&r.dir, "environments/stage.toml", "1.0.0", "1.2.0");
    commit_all(&r.dir, "stage: 1.2.0", None, None);
    let objects = git(&r.dir, &["count-objects"]);
    let (code, json, err) = check(&r);
    // The merge was computed in memory: nothing was written to the repository.
    assert_eq!(git(&r.dir, &["count-objects"]), objects);
    assert_eq!(code, 1, "{json} {err}");
    let changes = json["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{json}");
    assert_eq!(changes[0]["env"], "stage", "{json}");
    assert_eq!(changes[0]["previous"], "1.0.0", "{json}");
    assert_eq!(changes[0]["reason"], "not_confirmed", "{json}");
    let errors = json["errors"].to_string();
    assert!(
        !errors.contains("downgrade") && !errors.contains("policy"),
        "{errors}"
    );
}

#[test]
fn a_branch_that_does_not_merge_cleanly_is_refused_naming_the_files() {
    let (_tmp, r) = three_merges_behind();
    // main moved test to 1.2.0; the branch moves it to 1.5.0 from 1.0.0.
    replace(&r.dir, "environments/test.toml", "1.0.0", "1.5.0");
    commit_all(&r.dir, "test: 1.5.0", None, None);
    let (code, json, err) = check(&r);
    assert_eq!(code, 1, "{json} {err}");
    let errors = json["errors"].as_array().unwrap();
    assert_eq!(errors[0]["file"], "environments/test.toml", "{json}");
    let message = errors[0]["message"].as_str().unwrap();
    assert!(
        message.contains("does not merge cleanly") && message.contains("rebase"),
        "{message}"
    );
    // Control: rebased onto main, the same move is judged (test is the
    // first environment: no gate).
    git(&r.dir, &["checkout", "-q", "-B", "pr", "main"]);
    replace(&r.dir, "environments/test.toml", "1.2.0", "1.5.0");
    commit_all(&r.dir, "test: 1.5.0", None, None);
    let (code, json, err) = check(&r);
    assert_eq!(code, 0, "{json} {err}");
    assert_eq!(json["changes"][0]["previous"], "1.2.0", "{json}");
}
