//! `drover demo` tells the story of docs/design.md §0 and every invariant holds.

use serde_json::Value;

#[test]
fn demo_tells_the_whole_story() {
    let kept = tempfile::tempdir().unwrap();
    let repo = kept.path().join("repo");
    let out = crate::support::cli::drover_command()
        .args(["demo", "--format", "json", "--keep-repo"])
        .arg(&repo)
        .current_dir(std::env::temp_dir())
        .output()
        .expect("drover runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    crate::cli_schema::assert_valid("demo", &report);
    assert_eq!(
        (&report["ok"], &report["errors"]),
        (&Value::Bool(true), &Value::Array(vec![]))
    );
    assert_eq!(report["violations"], Value::Array(vec![]));
    assert_eq!(report["peak_unavailable"], 1);

    let events: Vec<(String, String, String)> = report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            // A line about the whole fleet has no environment (null, never "-").
            (
                l["at"].as_str().unwrap().to_owned(),
                l["env"].as_str().unwrap_or("(fleet)").to_owned(),
                l["event"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let find = |env: &str, needle: &str| {
        events
            .iter()
            .find(|(_, e, ev)| e == env && ev.contains(needle))
            .unwrap_or_else(|| panic!("no {env} event with {needle:?} in {events:#?}"))
            .0
            .clone()
    };
    // test upgrades on the 1st and confirms; stage's 1.13.3 is refused, 1.13.2 promoted.
    assert!(find("test", "Ready at 1.13.2").starts_with("2026-12-01"));
    find(
        "stage",
        "\"Bump stage to 1.13.3\": `drover check --base main` refuses it",
    );
    find(
        "stage",
        "\"Promote stage to 1.13.2\": `drover check --base main` passes",
    );
    assert!(find("stage", "Ready at 1.13.2").starts_with("2026-12-08"));
    // production waits for stage's confirmation, then both clusters on the 20th.
    find("production", "nothing to promote");
    assert!(find("production", "prod-eu-1: all 5 nodes Ready at 1.13.2").starts_with("2026-12-20"));
    assert!(find("production", "prod-us-1: all 5 nodes Ready at 1.13.2").starts_with("2026-12-20"));
    // Every confirmation is signed with its cluster's own key, generated
    // for this run; a fleet already at its pinned version is adopted.
    find(
        "stage",
        "stage-1: all 5 nodes Ready at 1.13.2: confirmation signed with stage-1's key",
    );
    find("production", "prod-eu-1: agent adopts the cluster");
    // A New Year freeze is merged; the 1 January window opens when it ends
    // (06:00 Madrid), and test moves to 1.13.3 then, not at 02:00.
    find(
        "test",
        "\"Freeze test over New Year\": `drover check --base main` passes",
    );
    find("test", "next window Fri 2027-01-01 06:00 CET");
    let ready = find("test", "Ready at 1.13.3");
    assert!(ready.as_str() >= "2027-01-01T05:00:00Z", "{ready}");
    assert!(ready.starts_with("2027-01-01"), "{ready}");

    // 1.13.3 crash-loops a workload on stage's first upgraded node: stage's
    // health checks halt the rollout at that one node, `on_failure =
    // "rollback"` drives it back to 1.13.2, and stage reports `failed` naming
    // the node and the pod; production's bump is refused, the version is
    // revoked, and 1.13.4 goes through test and stage.
    let back = find(
        "stage",
        "stage-1-node-0 failed its health checks at 1.13.3: cordon, drain, roll it back to 1.13.2",
    );
    let failed = find("stage", "stage-1: failed 1.13.3 (0/5 nodes at version)");
    assert!(failed.starts_with("2027-01-08"), "{failed}");
    assert!(back <= failed, "{back} {failed}");
    find(
        "stage",
        "node stage-1-node-0 failed: rolled back to 1.13.2: health check failed",
    );
    find("stage", "pod default/stage-1-node-0-app is crash-looping");
    find("stage", "upgrade 1 nodes to 1.13.3");
    find(
        "production",
        "\"Bump production to 1.13.3\": `drover check --base main` refuses it",
    );
    // The revocation is prepared by `drover revoke`, not by hand.
    find("(fleet)", "`drover revoke 1.13.3 --reason");
    find(
        "(fleet)",
        "\"Revoke 1.13.3\": `drover check --base main` passes; merged",
    );
    // Reports go to each cluster's own branch, never the single branch of the older layout.
    for (_, _, ev) in &events {
        assert!(!ev.contains("drover/status "), "{ev}");
    }
    find("stage", "reported to drover/status.d/stage/stage-1");
    assert!(find("test", "all 5 nodes Ready at 1.13.4").starts_with("2027-02-01"));
    assert!(find("stage", "all 5 nodes Ready at 1.13.4").starts_with("2027-02-08"));

    let versions: Vec<(String, Value)> = report["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["cluster"].as_str().unwrap().to_owned(),
                c["versions"].clone(),
            )
        })
        .collect();
    let expect = [
        ("test-1", "1.13.4"),
        ("stage-1", "1.13.4"),
        ("prod-eu-1", "1.13.2"),
        ("prod-us-1", "1.13.2"),
    ];
    for (cluster, v) in expect {
        let got = &versions.iter().find(|(c, _)| c == cluster).unwrap().1;
        assert_eq!(got, &serde_json::json!({ v: 5 }), "{cluster}");
    }
    status_commits_carry_the_story_time(&repo);
    origin_still_works(&repo);
}

/// `--keep-repo` keeps the story's origin with the work tree: fetching
/// from it works after the demo's temporary directory is gone.
fn origin_still_works(repo: &std::path::Path) {
    use crate::support::git::git;
    git(repo, &["fetch", "--quiet", "origin"]);
    let remote = git(repo, &["ls-remote", "--heads", "origin"]);
    assert!(remote.contains("refs/heads/main"), "{remote}");
    assert_eq!(
        remote.matches("refs/heads/drover/status.d/").count(),
        4,
        "{remote}"
    );
    // `drover status` reads the fetched branches from origin/ as well.
    let (code, out, err) = crate::support::cli::drover_at(repo, &["-o", "json", "status"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    crate::cli_schema::assert_valid("status", &v);
}

/// Evidence counts from its commit's time, so the demo's status commits are
/// made at the story's (virtual) time, never today's: the story must read
/// the same on any day it is run. Each commit's committer time is the
/// `since` of the report it writes.
fn status_commits_carry_the_story_time(repo: &std::path::Path) {
    use crate::support::git::git;
    let branches = git(
        repo,
        &[
            "for-each-ref",
            "--format=%(refname)",
            "refs/heads/drover/status.d",
        ],
    );
    let branches: Vec<&str> = branches.lines().collect();
    assert_eq!(
        branches.len(),
        4,
        "one status branch per cluster: {branches:?}"
    );
    let mut checked = 0;
    for branch in branches {
        let cluster_path = branch.rsplit("status.d/").next().unwrap();
        let file = format!("status/{cluster_path}.toml");
        for line in git(repo, &["log", "--format=%H %cI", branch]).lines() {
            let (commit, time) = line.split_once(' ').unwrap();
            let report = git(repo, &["show", &format!("{commit}:{file}")]);
            let since = report
                .lines()
                .find_map(|l| l.strip_prefix("since = "))
                .unwrap_or_else(|| panic!("no since in {file} at {commit}: {report}"));
            let since = chrono::DateTime::parse_from_rfc3339(since.trim_matches('"')).unwrap();
            let time = chrono::DateTime::parse_from_rfc3339(time).unwrap();
            assert_eq!(
                time, since,
                "{branch} {commit}: committed at {time}, report since {since}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} status commits");
}
