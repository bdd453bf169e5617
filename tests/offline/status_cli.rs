//! `drover status` end to end through the binary: on the example repository
//! (no reports yet), on the demo's repository (the whole story's reports),
//! and on status branches holding hostile reports.

use crate::support::cli::drover_at as drover;
use crate::support::git::{
    commit_configured, commit_file_on, example_checkout, git, git_env, public_key,
};
use serde_json::Value;
use std::path::Path;

/// example-repo as a git repository.
fn example_repo() -> tempfile::TempDir {
    let dir = example_checkout();
    git(dir.path(), &["add", "-A"]);
    commit_configured(dir.path(), &["-q", "-m", "initial"]);
    dir
}

/// Commit `content` at `path` on the status branch, unsigned.
fn put(dir: &Path, path: &str, content: &[u8]) {
    put_as(dir, path, content, None);
}

/// The committer time of reports: the soak counts from it, so it is fixed
/// rather than the wall clock's (the assertions name times on 2026-12-01,
/// and a status commit dated after `--now` does not count).
const SIGNED_AT: &str = "2026-12-01T02:41:00Z";

/// An SSH key made by `ssh-keygen` in `dir` for `principal`; its allowed-signers line.
fn keygen(dir: &Path, principal: &str) -> (std::path::PathBuf, String) {
    let key = crate::support::git::keygen(dir, &principal.replace('/', "-"));
    let line = format!("{principal} namespaces=\"git\" {}\n", public_key(&key));
    (key, line)
}

/// Commit `content` at `path` on the status branch, signed with `key` when
/// given (by `git commit-tree -S`, as an agent's signed report is).
fn put_as(dir: &Path, path: &str, content: &[u8], key: Option<&Path>) {
    put_on(dir, "drover/status", path, content, key);
}

/// [`put_as`] on `branch`.
fn put_on(dir: &Path, branch: &str, path: &str, content: &[u8], key: Option<&Path>) {
    commit_file_on(
        dir,
        branch,
        path,
        Some(content),
        key,
        "status",
        Some(SIGNED_AT),
    );
}

fn report(env: &str, cluster: &str, version: &str, state: &str, since: &str, msg: &str) -> String {
    format!(
        "env = \"{env}\"\ncluster = \"{cluster}\"\nconfig_commit = \"{c}\"\nversion = \"{version}\"\nstate = \"{state}\"\nsince = {since}\nnodes = 5\nnodes_at_version = {n}\nmessage = {msg:?}\n",
        c = "0".repeat(40),
        n = if state == "confirmed" { 5 } else { 2 },
    )
}

fn json(repo: &Path, args: &[&str]) -> Value {
    let mut all = vec!["--format", "json"];
    all.extend_from_slice(args);
    let (code, out, err) = drover(repo, &all);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn assert_fits_80(text: &str) {
    for l in text.lines() {
        assert!(l.chars().count() <= 80, "wider than 80 columns: {l:?}");
    }
}

fn env<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no environment {name} in {v:#}"))
}

#[test]
fn example_repository_text_and_json() {
    let dir = example_repo();
    let now = "2026-12-05T10:00:00Z";
    let (code, text, err) = drover(dir.path(), &["status", "--now", now]);
    assert_eq!(code, 0, "{err}");
    assert_fits_80(&text);
    // Where reports go now, not the single branch of the older layout.
    assert!(
        text.contains("status branch drover/status.d/<env>/<cluster> (none yet: no reports)"),
        "{text}"
    );
    for cluster in ["test-1", "stage-1", "prod-eu-1", "prod-us-1"] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(cluster))
            .unwrap_or_else(|| panic!("no row for {cluster}:\n{text}"));
        assert!(line.contains("no report"), "{line}");
    }
    // The stage window in Madrid time beside UTC.
    assert!(
        text.contains("next window  Tue 2026-12-08 02:00–08:00 CET (2026-12-08 01:00–07:00 UTC)"),
        "{text}"
    );
    assert!(text.contains("gate         test is the first environment of the chain: no gate"));

    let v = json(dir.path(), &["status", "--now", now]);
    assert_eq!(v["ok"], true);
    assert_eq!(v["now"], now);
    assert_eq!(v["status_branch"]["name"], "drover/status");
    assert_eq!(v["status_branch"]["ref"], Value::Null);
    let names: Vec<&str> = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["test", "stage", "production"]);
    let stage = env(&v, "stage");
    assert_eq!(stage["version"], "1.12.0");
    assert_eq!(stage["timezone"], "Europe/Madrid");
    assert_eq!(stage["next_window"]["start"], "2026-12-08T01:00:00Z");
    assert_eq!(stage["next_window"]["end"], "2026-12-08T07:00:00Z");
    assert_eq!(
        stage["next_window"]["start_local"],
        "2026-12-08T02:00:00+01:00"
    );
    assert_eq!(stage["next_window"]["zone"], "CET");
    assert_eq!(stage["next_window"]["open"], false);
    assert_eq!(stage["gate"]["lower"], "test");
    assert_eq!(stage["gate"]["answer"], "current");
    assert_eq!(env(&v, "test")["gate"]["answer"], "no_gate");
    let prod = env(&v, "production");
    assert_eq!(prod["clusters"][0]["name"], "prod-eu-1");
    assert_eq!(prod["clusters"][0]["report"], Value::Null);
    assert_eq!(prod["clusters"][0]["trust"], "none");

    // --env keeps one environment; an unknown one is a rejection, in JSON too.
    let v = json(dir.path(), &["status", "--now", now, "--env", "stage"]);
    assert_eq!(v["environments"].as_array().unwrap().len(), 1);
    let (code, out, _) = drover(dir.path(), &["--format", "json", "status", "--env", "prod"]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    let msg = v["errors"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"prod\"") && msg.contains("test, stage, production"),
        "{msg}"
    );
}

#[test]
fn gate_answers_follow_confirmations_and_soak() {
    let dir = example_repo();
    // test-1's report key, listed in the report signers in a change of its own.
    let keys = tempfile::tempdir().unwrap();
    let (key, line) = keygen(keys.path(), "test/test-1");
    let signers = dir.path().join("agents.allowed_signers");
    let mut text = std::fs::read_to_string(&signers).unwrap();
    text.push_str(&line);
    std::fs::write(&signers, text).unwrap();
    commit_configured(dir.path(), &["-qam", "List test-1's report key"]);
    let f = dir.path().join("environments/test.toml");
    let text = std::fs::read_to_string(&f)
        .unwrap()
        .replacen("\"1.12.0\"", "\"1.13.2\"", 1);
    std::fs::write(f, text).unwrap();
    commit_configured(dir.path(), &["-qam", "Bump test to 1.13.2"]);
    // Not confirmed yet: refused, naming the cluster.
    let v = json(dir.path(), &["status", "--now", "2026-12-01T12:00:00Z"]);
    let gate = &env(&v, "stage")["gate"];
    assert_eq!(gate["answer"], "refused", "{gate}");
    assert_eq!(gate["version"], "1.13.2");
    assert!(
        gate["message"]
            .as_str()
            .unwrap()
            .contains("not confirmed by test-1"),
        "{gate}"
    );
    // An unsigned confirmation is named untrusted and moves nothing.
    let confirmed = report(
        "test",
        "test-1",
        "1.13.2",
        "confirmed",
        "2026-12-01T02:40:00Z",
        "",
    );
    put(dir.path(), "status/test/test-1.toml", confirmed.as_bytes());
    let v = json(dir.path(), &["status", "--now", "2026-12-01T12:00:00Z"]);
    assert_eq!(env(&v, "stage")["gate"]["answer"], "refused");
    assert_eq!(env(&v, "test")["clusters"][0]["trust"], "untrusted");
    assert!(
        env(&v, "test")["clusters"][0]["untrusted_reason"]
            .as_str()
            .unwrap()
            .contains("unsigned"),
        "{v:#}"
    );
    // An unsigned commit on a status branch voids the cluster's reports
    // there until a person repairs it: here, by deleting the branch. Then
    // the agent's report, signed by test-1's own key at 02:41, on its own
    // branch: stage may take it once the 24h soak has passed.
    git(
        dir.path(),
        &["update-ref", "-d", "refs/heads/drover/status"],
    );
    put_on(
        dir.path(),
        "drover/status.d/test/test-1",
        "status/test/test-1.toml",
        report(
            "test",
            "test-1",
            "1.13.2",
            "confirmed",
            "2026-12-01T02:41:00Z",
            "",
        )
        .as_bytes(),
        Some(&key),
    );
    let v = json(dir.path(), &["status", "--now", "2026-12-01T12:00:00Z"]);
    let gate = &env(&v, "stage")["gate"];
    assert_eq!(gate["answer"], "waiting", "{gate}");
    assert_eq!(gate["after"], "2026-12-02T02:41:00Z");
    assert_eq!(
        gate["message"],
        "stage may take 1.13.2 after 2026-12-02T02:41Z"
    );
    let test1 = &env(&v, "test")["clusters"][0];
    assert_eq!(test1["report"]["state"], "confirmed");
    assert_eq!(test1["report"]["nodes_at_version"], 5);
    assert_eq!(test1["trust"], "trusted");
    assert_eq!(test1["report"]["status_commit"].as_str().unwrap().len(), 40);
    let v = json(dir.path(), &["status", "--now", "2026-12-02T02:41:00Z"]);
    assert_eq!(env(&v, "stage")["gate"]["answer"], "allowed");
    // production's answer is about stage's pin, which stage already runs.
    assert_eq!(env(&v, "production")["gate"]["answer"], "current");
}

#[test]
fn hostile_reports_are_named_and_skipped() {
    let dir = example_repo();
    put(
        dir.path(),
        "status/test/test-1.toml",
        report(
            "test",
            "test-1",
            "1.12.0",
            "confirmed",
            "2026-11-25T09:00:00Z",
            "",
        )
        .as_bytes(),
    );
    // A report claiming another cluster than its path: ignored.
    put(
        dir.path(),
        "status/stage/stage-1.toml",
        report(
            "production",
            "prod-eu-1",
            "9.9.9",
            "confirmed",
            "2026-11-25T09:00:00Z",
            "",
        )
        .as_bytes(),
    );
    // An oversized report: ignored without being read.
    let mut big = report(
        "production",
        "prod-us-1",
        "1.12.0",
        "failed",
        "2026-11-25T09:00:00Z",
        "",
    );
    big.push_str(&format!("# {}\n", "x".repeat(70 * 1024)));
    put(
        dir.path(),
        "status/production/prod-us-1.toml",
        big.as_bytes(),
    );
    // Invalid TOML and non-UTF-8 bytes.
    put(dir.path(), "status/production/prod-eu-1.toml", b"state = [");
    put(dir.path(), "status/test/test-1.toml", &[0xff, 0xfe, 0x00]);
    // A hostile message is shown as text, not markup.
    let dir2 = example_repo();
    put(
        dir2.path(),
        "status/test/test-1.toml",
        report(
            "test",
            "test-1",
            "1.12.0",
            "failed",
            "2026-11-25T09:00:00Z",
            "<script>alert(1)</script> node n1 \"quoted\"",
        )
        .as_bytes(),
    );

    let v = json(dir.path(), &["status", "--now", "2026-12-05T10:00:00Z"]);
    let warnings: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    let has = |path: &str, what: &str| {
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with(path) && w.contains(what)),
            "no warning for {path} ({what}) in {warnings:#?}"
        )
    };
    has("status/stage/stage-1.toml", "does not match its path");
    has(
        "status/production/prod-us-1.toml",
        "larger than the 64 KiB a report may have",
    );
    has(
        "status/production/prod-eu-1.toml",
        "not a valid status report",
    );
    has("status/test/test-1.toml", "not UTF-8");
    // Skipped reports are not shown; the last readable one of test-1 is.
    assert_eq!(env(&v, "stage")["clusters"][0]["report"], Value::Null);
    assert_eq!(env(&v, "production")["clusters"][1]["report"], Value::Null);
    assert_eq!(
        env(&v, "test")["clusters"][0]["report"]["version"],
        "1.12.0"
    );
    // Control: a clean repository has no warnings at all.
    let clean = json(example_repo().path(), &["status"]);
    assert_eq!(clean["warnings"], Value::Array(vec![]));

    let page = dir2.path().join("page.html");
    let (code, text, err) = drover(dir2.path(), &["status", "--html", page.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_fits_80(&text);
    assert!(
        text.contains("↳ <script>alert(1)</script> node n1"),
        "{text}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("<script"),
        "markup from a report reached the page"
    );
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert_eq!(html.matches("class=\"cluster-row\"").count(), 4);
    assert_eq!(
        html.matches("class=\"alarm\"").count(),
        1,
        "failed is highlighted"
    );
}

#[test]
fn demo_repository_text_and_json() {
    let tmp = tempfile::tempdir().unwrap();
    let kept = tmp.path().join("demo-repo");
    let out = crate::support::cli::drover_command()
        .args(["demo", "--format", "json", "--keep-repo"])
        .arg(&kept)
        .output()
        .expect("drover demo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let demo: Value = serde_json::from_slice(&out.stdout).unwrap();

    // The day after stage confirmed 1.13.4 (03:35 UTC on 8 February, each
    // node watched and the cluster settled): production waits for the soak.
    let now = "2027-02-09T12:00:00Z";
    let v = json(&kept, &["status", "--now", now]);
    // The demo's agents push to their own branches (drover/status.d/<env>/<cluster>):
    // test-1, stage-1, prod-eu-1 and prod-us-1; no single branch of the older layout.
    assert_eq!(v["status_branch"]["cluster_branches"], 4);
    assert!(v["status_branch"]["ref"].is_null());
    let rows: Vec<(String, String, String, String)> = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| {
            e["clusters"].as_array().unwrap().iter().map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["report"]["state"].as_str().unwrap().to_owned(),
                    c["report"]["version"].as_str().unwrap().to_owned(),
                    format!(
                        "{}/{}",
                        c["report"]["nodes_at_version"], c["report"]["nodes"]
                    ),
                )
            })
        })
        .collect();
    let want = |c: &str, v: &str| {
        (
            c.to_owned(),
            "confirmed".to_owned(),
            v.to_owned(),
            "5/5".to_owned(),
        )
    };
    assert_eq!(
        rows,
        [
            want("test-1", "1.13.4"),
            want("stage-1", "1.13.4"),
            want("prod-eu-1", "1.13.2"),
            want("prod-us-1", "1.13.2"),
        ]
    );
    let production = env(&v, "production");
    assert_eq!(production["gate"]["answer"], "waiting");
    assert_eq!(production["gate"]["after"], "2027-02-11T03:35:00Z");
    assert_eq!(production["next_window"]["start"], "2027-02-20T01:00:00Z");
    assert_eq!(env(&v, "stage")["gate"]["answer"], "current");
    // The demo's own JSON carries the same view at its end.
    assert_eq!(
        demo["fleet"]["environments"][1]["gate"]["answer"],
        "current"
    );

    let (code, text, err) = drover(&kept, &["status", "--now", now]);
    assert_eq!(code, 0, "{err}");
    assert_fits_80(&text);
    assert!(
        text.contains("gate         production may take 1.13.4 after 2027-02-11T03:35Z"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("  test-1 ")
            && l.contains("1.13.4")
            && l.contains("confirmed")
            && l.contains("2027-02-01 03:35")
            && l.contains("5/5")
            && l.contains("trusted")),
        "{text}"
    );
}

/// Replace `from` by `to` in the example's stage.toml and commit it.
fn edit_stage(dir: &Path, edits: &[(&str, &str)], append: &str) {
    let path = dir.join("environments/stage.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{from} not in stage.toml");
        text = text.replace(from, to);
    }
    text.push_str(append);
    std::fs::write(&path, text).unwrap();
    commit_configured(dir, &["-q", "-am", "stage: hold"]);
}

/// The first stretch `drover windows` lists from `now` (UTC start, end).
fn first_window(dir: &Path, now: &str) -> (Value, Value) {
    let v = json(
        dir,
        &["windows", "--env", "stage", "--from", now, "--count", "1"],
    );
    let w = &v["windows"][0];
    (w["start"].clone(), w["end"].clone())
}

/// test-1's report key listed, and its signed confirmation of 1.12.0 (the
/// example's pin) on its own branch, a week before the tests' instants:
/// stage's promotion gate passes, so `plan` forecasts stage's rollout.
fn stage_gate_passed(dir: &Path) {
    let keys = tempfile::tempdir().unwrap();
    let (key, line) = keygen(keys.path(), "test/test-1");
    let signers = dir.join("agents.allowed_signers");
    let mut text = std::fs::read_to_string(&signers).unwrap();
    text.push_str(&line);
    std::fs::write(&signers, text).unwrap();
    commit_configured(dir, &["-qam", "List test-1's report key"]);
    let r = report(
        "test",
        "test-1",
        "1.12.0",
        "confirmed",
        "2026-12-01T02:40:00Z",
        "",
    );
    put_on(
        dir,
        "drover/status.d/test/test-1",
        "status/test/test-1.toml",
        r.as_bytes(),
        Some(&key),
    );
}

#[test]
fn status_and_plan_say_what_freezes_and_the_pause_hold() {
    // stage's window: 02:00–08:00 Madrid on the 8th (01:00–07:00 UTC). A
    // freeze to 05:00 Madrid covers its first three hours.
    let dir = example_repo();
    stage_gate_passed(dir.path());
    edit_stage(
        dir.path(),
        &[],
        "\n[[freeze]]\nstart = 2026-12-07T00:00:00\nend = 2026-12-08T05:00:00\nreason = \"payroll run\"\n",
    );
    let now = "2026-12-08T01:30:00Z"; // 02:30 Madrid: in the window, frozen
    let v = json(dir.path(), &["status", "--now", now, "--env", "stage"]);
    let stage = env(&v, "stage");
    assert_eq!(stage["paused"], false);
    assert_eq!(stage["hold"]["kind"], "freeze");
    assert_eq!(stage["hold"]["reason"], "payroll run");
    assert_eq!(stage["hold"]["until"], "2026-12-08T04:00:00Z");
    // The next stretch a node may start in is the one `drover windows` lists.
    let (start, end) = first_window(dir.path(), now);
    assert_eq!(start, "2026-12-08T04:00:00Z");
    assert_eq!(stage["next_window"]["start"], start);
    assert_eq!(stage["next_window"]["end"], end);
    assert_eq!(stage["next_window"]["open"], false);
    let (code, text, err) = drover(dir.path(), &["status", "--now", now, "--env", "stage"]);
    assert_eq!(code, 0, "{err}");
    assert_fits_80(&text);
    assert!(
        text.contains("held         held by") && text.contains("payroll run"),
        "{text}"
    );
    assert!(
        text.contains("next window  Tue 2026-12-08 05:00–08:00 CET"),
        "{text}"
    );

    // plan at the same instant: the forecast starts nothing before 05:00
    // Madrid, and its headline counts what the forecast does.
    let p = json(
        dir.path(),
        &[
            "plan",
            "--env",
            "stage",
            "--now",
            now,
            "--nodes",
            "30",
            "--node-time",
            "15m",
        ],
    );
    let f = &p["forecast"];
    assert_eq!(f["windows"][0]["start"], start, "{f:#}");
    assert!(f["held"].as_str().unwrap().contains("payroll run"), "{f:#}");
    assert_eq!(f["node_cycle"], "25m", "15m to Ready, then the 10m watch");
    assert_eq!(f["settle"], "30m");
    let (code, text, err) = drover(
        dir.path(),
        &[
            "plan",
            "--env",
            "stage",
            "--now",
            now,
            "--nodes",
            "30",
            "--node-time",
            "15m",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let most = f["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["started"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(f["fit_per_window"], most);
    let n = |k: u64, one: &str, many: &str| format!("{k} {}", if k == 1 { one } else { many });
    assert!(
        text.contains(&format!(
            "30 nodes to upgrade, 1 at a time, 25m each (15m to Ready, then the [health] watch), then 30m settle: {}, at most {} started in one",
            n(f["windows_needed"].as_u64().unwrap(), "window", "windows"),
            n(most, "node", "nodes")
        )),
        "{text}"
    );

    // A freeze of a hundred years: no next window to name.
    let dir = example_repo();
    edit_stage(
        dir.path(),
        &[],
        "\n[[freeze]]\nstart = 2026-12-01\nend = 2126-12-01\nreason = \"decommissioned\"\n",
    );
    let v = json(dir.path(), &["status", "--now", now, "--env", "stage"]);
    let stage = env(&v, "stage");
    assert_eq!(stage["hold"]["reason"], "decommissioned");
    let next = &stage["next_window"];
    assert!(
        next.is_null() || next["start"].as_str().unwrap() >= "2126-12-01",
        "{next:#}"
    );

    // Paused: no next window, the pause and where it is set, in text and JSON;
    // plan starts no node.
    let dir = example_repo();
    stage_gate_passed(dir.path());
    edit_stage(dir.path(), &[("paused = false", "paused = true")], "");
    let v = json(dir.path(), &["status", "--now", now, "--env", "stage"]);
    let stage = env(&v, "stage");
    assert_eq!(stage["paused"], true);
    assert_eq!(stage["hold"]["kind"], "paused");
    assert_eq!(stage["hold"]["until"], Value::Null);
    assert!(stage["hold"]["reason"]
        .as_str()
        .unwrap()
        .contains("environments/stage.toml"));
    assert_eq!(stage["next_window"], Value::Null);
    let (code, text, err) = drover(dir.path(), &["status", "--now", now, "--env", "stage"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("next window  none while paused"), "{text}");
    assert!(text.contains("paused by [rollout] paused = true"), "{text}");
    let p = json(dir.path(), &["plan", "--env", "stage", "--now", now]);
    let f = &p["forecast"];
    assert_eq!(f["state"], "paused", "{f:#}");
    assert_eq!(f["windows_needed"], 0, "{f:#}");
    assert_eq!(p["decision"]["state"], "paused");
    let (_, text, _) = drover(dir.path(), &["plan", "--env", "stage", "--now", now]);
    assert!(
        text.contains("paused: [rollout] paused = true: the agent starts no node"),
        "{text}"
    );
}

#[test]
fn untrusted_reports_say_why_and_now_reads_the_store_as_it_was() {
    let dir = example_repo();
    let keys = tempfile::tempdir().unwrap();
    let (key, line) = keygen(keys.path(), "test/test-1");
    let signers = dir.path().join("agents.allowed_signers");
    let mut text = std::fs::read_to_string(&signers).unwrap();
    text.push_str(&line);
    std::fs::write(&signers, text).unwrap();
    commit_configured(dir.path(), &["-qam", "List test-1's report key"]);
    // stage-1's report, signed with test-1's key.
    let r = report(
        "stage",
        "stage-1",
        "1.12.0",
        "confirmed",
        "2026-12-01T02:00:00Z",
        "",
    );
    put_as(
        dir.path(),
        "status/stage/stage-1.toml",
        r.as_bytes(),
        Some(&key),
    );
    let v = json(dir.path(), &["status", "--now", "2026-12-05T00:00:00Z"]);
    let c = &env(&v, "stage")["clusters"][0];
    assert_eq!(c["trust"], "untrusted");
    let why =
        "signed by test/test-1's key, which is not listed for stage/stage-1 in the report signers";
    // A wrongly signed commit voids its whole status branch (design §5):
    // the reason names the branch, the commit and the key.
    let reason = c["untrusted_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("status branch drover/status does not count as a whole: commit "),
        "{reason}"
    );
    assert!(reason.ends_with(why), "{reason}");
    let (_, text, _) = drover(dir.path(), &["status", "--now", "2026-12-05T00:00:00Z"]);
    assert!(
        text.contains("untrusted: status branch drover/status does not count as a whole")
            && text.contains("signed by test/test-1's key, which is not listed for"),
        "{text}"
    );
    // Trusted reports carry no reason.
    assert_eq!(
        env(&v, "test")["clusters"][0]["untrusted_reason"],
        Value::Null
    );

    // A later report (committed 2026-12-09): --now before it shows the
    // report of then, and says a newer one was left out.
    let later = report(
        "stage",
        "stage-1",
        "1.13.2",
        "rolling",
        "2026-12-08T01:00:00Z",
        "",
    );
    commit_file_on(
        dir.path(),
        "drover/status",
        "status/stage/stage-1.toml",
        Some(later.as_bytes()),
        None,
        "status",
        Some("2026-12-09T00:00:00Z"),
    );
    let v = json(dir.path(), &["status", "--now", "2026-12-05T00:00:00Z"]);
    let c = &env(&v, "stage")["clusters"][0];
    assert_eq!(c["report"]["version"], "1.12.0", "{c:#}");
    assert_eq!(c["report"]["state"], "confirmed");
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("1 report from after 2026-12-05T00:00:00Z left out")),
        "{warnings:?}"
    );
    let v = json(dir.path(), &["status", "--now", "2026-12-10T00:00:00Z"]);
    assert_eq!(
        env(&v, "stage")["clusters"][0]["report"]["version"],
        "1.13.2"
    );
}

/// `--now T` before a cluster's latest signed report, on its own branch
/// (the layout agents write): the report in force at T is shown, trusted,
/// and the gate reads the confirmations of then. (Before the fix every
/// cluster that reported after T showed `no report`: the later commit, dated
/// ahead of a clock set to T, voided its whole branch.)
#[test]
fn now_shows_the_signed_report_in_force_then_on_a_cluster_branch() {
    let dir = example_repo();
    let keys = tempfile::tempdir().unwrap();
    let (key, line) = keygen(keys.path(), "test/test-1");
    let signers = dir.path().join("agents.allowed_signers");
    let mut text = std::fs::read_to_string(&signers).unwrap();
    text.push_str(&line);
    std::fs::write(&signers, text).unwrap();
    commit_configured(dir.path(), &["-qam", "List test-1's report key"]);
    let branch = "drover/status.d/test/test-1";
    let at = |content: String, date: &str| {
        commit_file_on(
            dir.path(),
            branch,
            "status/test/test-1.toml",
            Some(content.as_bytes()),
            Some(&key),
            "status",
            Some(date),
        );
    };
    at(
        report(
            "test",
            "test-1",
            "1.12.0",
            "confirmed",
            "2026-12-01T02:40:00Z",
            "",
        ),
        "2026-12-01T02:41:00Z",
    );
    at(
        report(
            "test",
            "test-1",
            "1.13.2",
            "rolling",
            "2026-12-08T01:00:00Z",
            "n-1 upgrading",
        ),
        "2026-12-08T01:00:30Z",
    );
    at(
        report(
            "test",
            "test-1",
            "1.13.2",
            "confirmed",
            "2026-12-08T02:00:00Z",
            "",
        ),
        "2026-12-08T02:00:30Z",
    );
    let shown = |now: &str| {
        let v = json(dir.path(), &["status", "--now", now]);
        let c = env(&v, "test")["clusters"][0].clone();
        (v, c)
    };
    let (v, c) = shown("2026-12-05T00:00:00Z");
    assert_eq!(c["report"]["version"], "1.12.0", "{v:#}");
    assert_eq!(c["report"]["state"], "confirmed");
    assert_eq!(c["trust"], "trusted", "{c:#}");
    let warnings: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(
        warnings.iter().all(|w| !w.contains("does not count")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("2 reports from after 2026-12-05T00:00:00Z left out")),
        "{warnings:?}"
    );
    // Mid-rollout, and after: each report of then.
    let (_, c) = shown("2026-12-08T01:30:00Z");
    assert_eq!(
        (&c["report"]["version"], &c["report"]["state"], &c["trust"]),
        (&"1.13.2".into(), &"rolling".into(), &"trusted".into())
    );
    let (v, c) = shown("2026-12-10T00:00:00Z");
    assert_eq!(c["report"]["state"], "confirmed");
    assert!(v["warnings"].as_array().unwrap().is_empty(), "{v:#}");
    // The text says the same.
    let (code, text, err) = drover(dir.path(), &["status", "--now", "2026-12-05T00:00:00Z"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("  test-1 ") && l.contains("1.12.0") && l.contains("trusted")),
        "{text}"
    );
}

/// A change to `environments/<file>.toml` (each `from` replaced by `to`)
/// committed on a side branch dated the 3rd and merged on the 10th.
fn merged_late(dir: &Path, edits: &[(&str, &str, &str)]) {
    git(dir, &["switch", "-q", "-c", "bump"]);
    for (file, from, to) in edits {
        let f = dir.join(format!("environments/{file}.toml"));
        let text = std::fs::read_to_string(&f).unwrap().replacen(from, to, 1);
        std::fs::write(f, text).unwrap();
    }
    git_env(
        dir,
        &["commit", "-qam", "a change"],
        Some("2026-12-03T00:00:00Z"),
        &[],
    );
    git(dir, &["switch", "-q", "main"]);
    git_env(
        dir,
        &["merge", "-q", "--no-ff", "-m", "Merge bump", "bump"],
        Some("2026-12-10T00:00:00Z"),
        &[],
    );
}

/// `--now T` reads the config and the gate as they were at T: the config
/// commit in force then, on HEAD's first-parent history. A change merged
/// after T is not in force at T even when its own commit is older (the
/// merge is when it landed); a T before the first commit is refused.
#[test]
fn now_reads_the_config_and_the_gate_in_force_then() {
    let dir = example_repo();
    let first = git(dir.path(), &["rev-parse", "HEAD"]);
    // Test moves to 1.13.2 and stage is paused.
    merged_late(
        dir.path(),
        &[
            ("test", "\"1.12.0\"", "\"1.13.2\""),
            ("stage", "paused = false", "paused = true"),
        ],
    );
    let merge = git(dir.path(), &["rev-parse", "HEAD"]);

    // Before the merge (even after the side commit): the first commit's config and gate.
    for at in ["2026-11-30T00:00:00Z", "2026-12-05T00:00:00Z"] {
        let v = json(dir.path(), &["status", "--now", at]);
        assert_eq!(v["config_commit"], first.as_str(), "{at}");
        assert_eq!(env(&v, "test")["version"], "1.12.0", "{at}");
        assert_eq!(env(&v, "stage")["paused"], false, "{at}");
        assert_eq!(env(&v, "stage")["gate"]["answer"], "current", "{at}");
    }
    let (code, text, err) = drover(dir.path(), &["status", "--now", "2026-12-05T00:00:00Z"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains(&format!(
            "config at commit {} (in force then)",
            &first[..12]
        )),
        "{text}"
    );
    // After it: the merged config, and the gate judges stage's next promotion by it.
    let v = json(dir.path(), &["status", "--now", "2026-12-10T00:00:00Z"]);
    assert_eq!(v["config_commit"], merge.as_str());
    assert_eq!(env(&v, "test")["version"], "1.13.2");
    assert_eq!(env(&v, "stage")["paused"], true);
    assert_eq!(env(&v, "stage")["gate"]["answer"], "refused");
    // Without --now: the checkout, and no config_commit field.
    let v = json(dir.path(), &["status"]);
    assert_eq!(env(&v, "test")["version"], "1.13.2");
    assert!(v.get("config_commit").is_none(), "{v:#}");

    // Before the first commit there was no config: refused, saying so.
    for format in ["text", "json"] {
        let (code, out, err) = drover(
            dir.path(),
            &["-o", format, "status", "--now", "2026-11-29T23:59:59Z"],
        );
        assert_eq!(code, 1, "{out}{err}");
        let said = if format == "json" {
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["ok"], false);
            v["errors"][0]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        } else {
            err
        };
        assert!(
            said.contains(&format!(
                "--now 2026-11-29T23:59:59Z is before the repository's first commit ({}, committed 2026-11-30T00:00:00Z)",
                &first[..12]
            )),
            "{said}"
        );
    }
}

#[test]
fn now_draws_the_page_from_the_config_history_in_force_then() {
    let dir = example_repo();
    // Stage promoted to 1.14.9.
    merged_late(
        dir.path(),
        &[("stage", "version = \"1.12.0\"", "version = \"1.14.9\"")],
    );
    let page = dir.path().join("page.html");
    let draw = |at: &str| {
        let (code, _, err) = drover(
            dir.path(),
            &["status", "--now", at, "--html", page.to_str().unwrap()],
        );
        assert_eq!(code, 0, "{err}");
        std::fs::read_to_string(&page).unwrap()
    };
    // Before the merge the promotion had not happened: the page does not draw it.
    let before = draw("2026-12-05T00:00:00Z");
    assert!(!before.contains("1.14.9"), "a later promotion drawn");
    // After it, the page draws it.
    assert!(draw("2026-12-11T00:00:00Z").contains("1.14.9"));
}

#[test]
fn waves_show_what_each_cluster_waits_on_and_a_failure_halts_the_environment() {
    let dir = example_repo();
    let keys = tempfile::tempdir().unwrap();
    let (eu, line) = keygen(keys.path(), "production/prod-eu-1");
    let signers = dir.path().join("agents.allowed_signers");
    let mut text = std::fs::read_to_string(&signers).unwrap();
    text.push_str(&line);
    std::fs::write(&signers, text).unwrap();
    let f = dir.path().join("environments/production.toml");
    // The example's own waves give way to these (patterns, a 1h soak, one window).
    let example = std::fs::read_to_string(&f).unwrap();
    let (before, waves) = example.split_once("# Waves:").unwrap();
    let after = &waves[waves.find("\n[promotion]").unwrap()..];
    let text = format!("{before}{after}").replacen("\"1.12.0\"", "\"1.13.2\"", 1)
        + "\n[[wave]]\nclusters = [\"prod-eu-*\"]\nsoak = \"1h\"\n\n[[wave]]\nclusters = [\"prod-us-*\"]\n";
    std::fs::write(f, text).unwrap();
    // The reviewed change the reports come after.
    crate::support::git::git_env(
        dir.path(),
        &["commit", "-qam", "production in two waves, at 1.13.2"],
        Some("2026-12-01T00:00:00Z"),
        &[],
    );
    let cluster = |v: &Value, name: &str| -> Value {
        env(v, "production")["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap()
    };
    let v = json(dir.path(), &["status", "--now", "2026-12-01T03:00:00Z"]);
    assert_eq!(cluster(&v, "prod-eu-1")["wave"], 1);
    assert_eq!(cluster(&v, "prod-eu-1")["waits_on"], Value::Null);
    assert_eq!(cluster(&v, "prod-us-1")["wave"], 2);
    assert_eq!(
        cluster(&v, "prod-us-1")["waits_on"],
        "wave 2 waits for wave 1 to confirm: not yet confirmed by prod-eu-1"
    );
    assert_eq!(env(&v, "production")["halt"], Value::Null);
    // plan names each wave's gate: stage for wave 1 (which has not
    // confirmed 1.13.2: not by time alone), wave 1 for wave 2.
    let waves = |now: &str| {
        let p = json(dir.path(), &["plan", "--env", "production", "--now", now]);
        crate::cli_schema::assert_valid("plan", &p);
        p["waves"].clone()
    };
    let w = waves("2026-12-01T03:00:00Z");
    assert_eq!(w[0]["clusters"], serde_json::json!(["prod-eu-1"]));
    assert_eq!(w[1]["clusters"], serde_json::json!(["prod-us-1"]));
    assert!(
        w[0]["waits_on"]
            .as_str()
            .unwrap()
            .starts_with("the promotion gate: every cluster of stage (stage-1) confirmed 1.13.2 at least 72h before"),
        "{w:#}"
    );
    assert_eq!(w[0]["basis"], "none", "{w:#}");
    assert_eq!(w[0]["could_start_at"], Value::Null);
    assert_eq!(
        w[1]["waits_on"],
        "wave 1's signed confirmations of 1.13.2 (prod-eu-1), then its soak of 1h"
    );
    assert_eq!(w[1]["gate_now"], "not yet confirmed by prod-eu-1");
    assert_eq!(w[1]["window"]["timezone"], "Europe/Madrid");
    let branch = "drover/status.d/production/prod-eu-1";
    let path = "status/production/prod-eu-1.toml";
    let ok = report(
        "production",
        "prod-eu-1",
        "1.13.2",
        "confirmed",
        "2026-12-01T02:40:00Z",
        "",
    );
    put_on(dir.path(), branch, path, ok.as_bytes(), Some(&eu));
    let v = json(dir.path(), &["status", "--now", "2026-12-01T03:00:00Z"]);
    assert_eq!(
        cluster(&v, "prod-us-1")["waits_on"],
        "wave 2 waits for wave 1's soak, which passes at 2026-12-01T03:41:00Z"
    );
    let v = json(dir.path(), &["status", "--now", "2026-12-01T04:00:00Z"]);
    assert_eq!(cluster(&v, "prod-us-1")["waits_on"], Value::Null);
    // plan: wave 2's gate passes from prod-eu-1's signed report, and the
    // wave could start in the environment's next window (the 20th).
    let w = waves("2026-12-01T03:00:00Z");
    assert_eq!(w[1]["basis"], "reports", "{w:#}");
    assert_eq!(w[1]["gate_passes_at"], "2026-12-01T03:41:00Z");
    assert_eq!(w[1]["gate_now"], "soaking until 2026-12-01T03:41:00Z");
    assert_eq!(w[1]["could_start_at"], "2026-12-20T01:00:00Z");
    assert!(
        w[1]["confirmed_at"].as_str().unwrap() > "2026-12-20T01:00:00Z",
        "{w:#}"
    );
    let (code, out, err) = drover(
        dir.path(),
        &[
            "plan",
            "--env",
            "production",
            "--now",
            "2026-12-01T04:00:00Z",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("waves of production for 1.13.2:"), "{out}");
    assert!(
        out.contains("  wave 2: prod-us-1; window \"0 2 20 * *\" for 6h (Europe/Madrid)\n    waits on wave 1's signed confirmations of 1.13.2 (prod-eu-1), then its soak of 1h\n    now: passed\n    could start Sun 2026-12-20 02:00 CET (01:00 UTC)"),
        "{out}"
    );

    // A failed check on prod-eu-1 halts production; status says how to stop it.
    let failed = report(
        "production",
        "prod-eu-1",
        "1.13.2",
        "failed",
        "2026-12-01T02:41:00Z",
        "node ip-10-0-1-7 failed: pod shop/web-7 crash-looping",
    );
    put_on(dir.path(), branch, path, failed.as_bytes(), Some(&eu));
    let v = json(dir.path(), &["status", "--now", "2026-12-01T04:00:00Z"]);
    let halt = &env(&v, "production")["halt"];
    assert_eq!(halt["version"], "1.13.2", "{halt:#}");
    assert_eq!(halt["failure_budget"], 0);
    assert_eq!(halt["failed"][0]["cluster"], "prod-eu-1");
    assert_eq!(
        halt["failed"][0]["message"],
        "node ip-10-0-1-7 failed: pod shop/web-7 crash-looping"
    );
    assert!(
        halt["revoke"]
            .as_str()
            .unwrap()
            .starts_with("drover revoke 1.13.2 --reason"),
        "{halt:#}"
    );
    assert_eq!(cluster(&v, "prod-us-1")["waits_on"], "halted");
    // plan's wave 2 says the same: halted, not "not yet confirmed" (the
    // halt is asked of the one judgement of the gate), and no start by time
    // alone. (prod-eu-1's own failure is its own `failed` state, as in status.)
    let w = waves("2026-12-01T04:00:00Z");
    let now = w[1]["gate_now"].as_str().unwrap();
    assert!(now.starts_with("production halted for 1.13.2"), "{w:#}");
    assert_eq!(w[1]["basis"], "none");
    assert_eq!(w[1]["could_start_at"], Value::Null);
    let (code, out, err) = drover(dir.path(), &["status", "--now", "2026-12-01T04:00:00Z"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("HALTED"), "{out}");
    assert!(out.contains("drover revoke 1.13.2"), "{out}");
    assert!(out.contains("wave 2: halted"), "{out}");
    assert_fits_80(&out);
    // A reviewed change that neither pins another version, revokes it nor
    // raises the failure budget does not end the halt (here: prod-us moves
    // at night in New York), and plan for a cluster of a wave with its own
    // window forecasts in that window.
    let f = dir.path().join("environments/production.toml");
    let text = std::fs::read_to_string(&f).unwrap().replace(
        "clusters = [\"prod-us-*\"]\n",
        "clusters = [\"prod-us-*\"]\nschedule = \"0 2 21 * *\"\ntimezone = \"America/New_York\"\n",
    );
    std::fs::write(f, text).unwrap();
    crate::support::git::git_env(
        dir.path(),
        &["commit", "-qam", "prod-us at night in New York"],
        Some("2026-12-01T03:00:00Z"),
        &[],
    );
    let plan = |cluster: &str| {
        let p = json(
            dir.path(),
            &[
                "plan",
                "--env",
                "production",
                "--cluster",
                cluster,
                "--now",
                "2026-12-01T04:00:00Z",
            ],
        );
        p["forecast"].clone()
    };
    // The forecast keeps to the gates the wave section names (issue 41: it
    // forecast nodes upgrading while its own wave said the wave could not
    // start): while the halt stands neither cluster starts by time alone.
    for (cluster, gate) in [
        ("prod-eu-1", "wave 1's gate: production may not take 1.13.2"),
        ("prod-us-1", "wave 2's gate: production halted for 1.13.2"),
    ] {
        let f = plan(cluster);
        assert_eq!(f["windows"], serde_json::json!([]), "{cluster}: {f:#}");
        assert_eq!(f["windows_needed"], 0);
        let held = f["held"].as_str().unwrap();
        assert!(
            held.starts_with(gate) && held.ends_with("(no node starts by time alone)"),
            "{cluster}: {held}"
        );
    }
    // Neither that commit nor the clock ends the halt...
    let v = json(dir.path(), &["status", "--now", "2026-12-05T04:00:00Z"]);
    assert_eq!(
        env(&v, "production")["halt"]["failed"][0]["cluster"],
        "prod-eu-1"
    );
    // ...prod-eu-1's own later report of the version does (its node retried).
    let retried = report(
        "production",
        "prod-eu-1",
        "1.13.2",
        "rolling",
        "2026-12-01T02:50:00Z",
        "",
    );
    put_on(dir.path(), branch, path, retried.as_bytes(), Some(&eu));
    let v = json(dir.path(), &["status", "--now", "2026-12-01T04:00:00Z"]);
    assert_eq!(env(&v, "production")["halt"], Value::Null);
    // prod-us-1 still waits on prod-eu-1's confirmation, withdrawn by its failure.
    let f = plan("prod-us-1");
    assert_eq!(f["windows"], serde_json::json!([]), "{f:#}");
    let held = f["held"].as_str().unwrap();
    assert!(
        held.starts_with("wave 2's gate: not yet confirmed by prod-eu-1")
            && held.ends_with("(no node starts by time alone)"),
        "{held}"
    );
    let (code, out, err) = drover(
        dir.path(),
        &[
            "plan",
            "--env",
            "production",
            "--cluster",
            "prod-us-1",
            "--now",
            "2026-12-01T04:00:00Z",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("state now: pending (wave 2's gate: not yet confirmed by prod-eu-1)"),
        "{out}"
    );
    assert!(out.contains("the agent would do nothing now"), "{out}");
    assert!(out.contains("the forecast starts none"), "{out}");
    // Control: prod-eu-1 confirms 1.13.2; after wave 1's soak prod-us-1 may
    // start, in its own window (the 21st, at night in New York).
    let again = report(
        "production",
        "prod-eu-1",
        "1.13.2",
        "confirmed",
        "2026-12-01T02:55:00Z",
        "",
    );
    put_on(dir.path(), branch, path, again.as_bytes(), Some(&eu));
    let f = plan("prod-us-1");
    assert_eq!(f["windows"][0]["start"], "2026-12-21T07:00:00Z", "{f:#}");
    assert_eq!(f["held"], Value::Null);
    assert_eq!(plan("prod-eu-1")["windows"], serde_json::json!([]));
    let v = json(dir.path(), &["status", "--now", "2026-12-01T04:00:00Z"]);
    assert_eq!(env(&v, "production")["halt"], Value::Null);
}
