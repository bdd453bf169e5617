//! `drover demo` tells the story of docs/design.md §0 and every invariant holds.

use serde_json::Value;
use std::ffi::OsStr;

/// `drover demo --format json` with `args`, run from the temporary
/// directory; it must succeed. Its JSON report.
fn demo_json(args: &[&OsStr]) -> Value {
    let out = crate::support::cli::drover_command()
        .args(["demo", "--format", "json"])
        .args(args)
        .current_dir(std::env::temp_dir())
        .output()
        .expect("drover runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

#[test]
fn demo_tells_the_whole_story() {
    let kept = tempfile::tempdir().unwrap();
    let repo = kept.path().join("repo");
    let report = demo_json(&["--keep-repo".as_ref(), repo.as_os_str()]);
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
    // production waits for stage's confirmation; then its two waves:
    // prod-eu-1 on the 20th in Madrid; prod-us-1 waits for prod-eu-1's
    // signed confirmation and wave 1's 24h soak, then moves in its own
    // window, the next night in New York.
    find("production", "nothing to promote");
    let eu = find("production", "prod-eu-1: all 5 nodes Ready at 1.13.2");
    assert!(eu.starts_with("2026-12-20"), "{eu}");
    find("production", "prod-us-1: agent accepts config");
    let waits = find(
        "production",
        "wave 2 waits for wave 1 to confirm: not yet confirmed by prod-eu-1",
    );
    let soaking = find(
        "production",
        "prod-us-1: wave 1 (prod-eu-1) has confirmed 1.13.2 in signed reports; wave 2 waits 24h for its soak",
    );
    find("production", "reported to drover/status.d/production/prod-us-1 wave 2 waits for wave 1's soak, which passes at");
    let soaked = find("production", "wave 2 may start it in its window");
    let us_start = find("production", "prod-us-1: window 2026-12-21T07:00:00Z");
    let us = find("production", "prod-us-1: all 5 nodes Ready at 1.13.2");
    assert!(waits.starts_with("2026-12-12"), "{waits}");
    assert_eq!(
        soaking, eu,
        "wave 2 learns of wave 1's confirmation as it lands"
    );
    let plus_soak = |t: &str| {
        (chrono::DateTime::parse_from_rfc3339(t).unwrap() + chrono::Duration::hours(24)).to_utc()
    };
    let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap().to_utc();
    assert_eq!(at(&soaked), plus_soak(&eu), "{soaked}");
    assert!(at(&us_start) >= plus_soak(&eu), "{us_start}");
    assert!(us.starts_with("2026-12-21"), "{us}");
    let local = report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["at"] == us_start.as_str() && l["event"].as_str().unwrap().starts_with("prod-us-1")
        })
        .map(|l| l["local"].as_str().unwrap().to_owned());
    assert_eq!(
        local.as_deref(),
        Some("Mon 12-21 02:00 EST"),
        "prod-us-1 is told in New York time"
    );
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
    find("stage", "upgrade 1 node to 1.13.3");
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
    explain_says_when_wave_two_moves(&repo, &soaking, &us_start);
}

/// `drover status --explain prod-us-1` while wave 2 soaks, as the story's
/// repository holds it: the report's blocker is `soak`, and the next start
/// it gives is the one the story then made (its window after the soak).
fn explain_says_when_wave_two_moves(repo: &std::path::Path, soaking: &str, us_start: &str) {
    let at = (chrono::DateTime::parse_from_rfc3339(soaking).unwrap()
        + chrono::Duration::minutes(1))
    .to_utc()
    .to_rfc3339();
    let (code, out, err) =
        crate::support::cli::drover_at(repo, &["status", "--now", &at, "--explain", "prod-us-1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\n  ↳ blocker: soak ("), "{out}");
    // The story logs the start a minute into the window it waited for.
    let started = chrono::DateTime::parse_from_rfc3339(us_start)
        .unwrap()
        .to_utc();
    let said = out
        .lines()
        .find_map(|l| l.strip_prefix("next: can move at "))
        .unwrap_or_else(|| panic!("no next start in {out}"));
    let said = chrono::DateTime::parse_from_rfc3339(said).unwrap().to_utc();
    assert!(
        (started - said).num_seconds().abs() <= 60,
        "--explain said {said}, the story started prod-us-1 at {started}: {out}"
    );
    let (code, out, _) = crate::support::cli::drover_at(
        repo,
        &[
            "-o",
            "json",
            "status",
            "--now",
            &at,
            "--explain",
            "prod-us-1",
        ],
    );
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    crate::cli_schema::assert_valid("explain", &v);
    assert_eq!(v["blocker"], "soak", "{v:#}");
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

/// With both waves in the same window (02:00 on the 20th in Madrid), the
/// window no longer keeps prod-us-1 after prod-eu-1: the wave gate alone
/// does. prod-us-1 waits through December's window for prod-eu-1's
/// confirmation and its soak, and moves in January's.
#[test]
fn demo_wave_two_waits_for_wave_one_even_in_a_shared_window() {
    let tmp = tempfile::tempdir().unwrap();
    let example = tmp.path().join("example");
    for f in [
        "drover.toml",
        "agents.allowed_signers",
        "environments/test.toml",
        "environments/stage.toml",
        "environments/production.toml",
    ] {
        let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("example-repo")
            .join(f);
        let to = example.join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        let text = std::fs::read_to_string(from).unwrap();
        let text = text
            .replace("schedule = \"0 2 21 * *\"", "schedule = \"0 2 20 * *\"")
            .replace(
                "timezone = \"America/New_York\"",
                "timezone = \"Europe/Madrid\"",
            );
        std::fs::write(to, text).unwrap();
    }
    let report = demo_json(&[
        "--nodes".as_ref(),
        "2".as_ref(),
        "--example-repo".as_ref(),
        example.as_os_str(),
    ]);
    assert_eq!(report["violations"], Value::Array(vec![]));
    let lines: Vec<(String, String)> = report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["at"].as_str().unwrap().to_owned(),
                l["event"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let at = |needle: &str| -> Vec<&str> {
        lines
            .iter()
            .filter(|(_, e)| e.contains(needle))
            .map(|(t, _)| t.as_str())
            .collect()
    };
    // Both clusters saw December's window open; only prod-eu-1 used it.
    assert_eq!(
        at("prod-eu-1: window 2026-12-20T01:00:00Z"),
        ["2026-12-20T01:00:00Z"]
    );
    let us = at("prod-us-1: window ");
    assert_eq!(us, ["2027-01-20T01:00:00Z"], "{lines:#?}");
    assert_eq!(
        at("prod-us-1: pending 1.13.2 (0/2 nodes at version) reported to drover/status.d/production/prod-us-1 wave 2 waits for wave 1's soak").len(),
        1,
        "{lines:#?}"
    );
}
