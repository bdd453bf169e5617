//! The Bottlerocket driver script against a node whose update actions fail
//! as a real one's do (support/bottlerocket_api.rs: updog's errors, the
//! partition flags signpost keeps, the reboot endpoint before and after
//! 1.22): transient failures tried again, permanent ones failing at once,
//! a rollback whose download breaks off, a lost answer to the lock's
//! commit, "staged already" with another image on disk, and what the
//! script reports in its termination message. Each fault runs the script
//! as it was before (support/bottlerocket/staged_bookkeeping_driver.sh)
//! too, to show the failure it had.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::bottlerocket_api::disk::PartitionSet;
use crate::support::bottlerocket_api::script::*;
use crate::support::bottlerocket_api::{v, BottlerocketApi, Failure, Scenario};
use serde_json::{json, Value};

/// Run `script` over a pod's life against a fresh node from `scenario`.
fn go(
    script: Script,
    scenario: Scenario,
    target: &str,
) -> (Outcome, BottlerocketApi, tempfile::TempDir) {
    go_env(script, scenario, target, &[])
}

fn go_env(
    script: Script,
    scenario: Scenario,
    target: &str,
    env: &[(&str, &str)],
) -> (Outcome, BottlerocketApi, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), scenario);
    let o = run_env(script, &api, dir.path(), target, UNIT, env);
    (o, api, dir)
}

/// The retries a termination message counts, by kind.
fn retries(o: &Outcome) -> Value {
    o.report.as_ref().expect("a termination message")["retries"].clone()
}

/// No marker of any attempt is left on the node.
fn assert_no_markers(dir: &Path) {
    let left: Vec<_> = fs::read_dir(dir.join("state"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "markers left: {left:?}");
}

/// One request through the stand-in apiclient, as a person on the node
/// would send it: (exit code, output).
fn apiclient(api: &BottlerocketApi, args: &[&str]) -> (i32, String) {
    let out = Command::new(stand_in_dir().join("apiclient"))
        .args(args)
        .env("APICLIENT_SOCKET", api.socket())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Start `action` and wait for its result in the status (as `apiclient
/// update` does): the status once it shows.
fn action(api: &BottlerocketApi, name: &str, uri: &str) -> Value {
    let before = status(api)["most_recent_command"]["timestamp"].clone();
    let (code, out) = apiclient(api, &["-m", "POST", "-u", uri]);
    assert_eq!(code, 0, "{out}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(api);
        let recent = &st["most_recent_command"];
        if recent["cmd_type"] == name && recent["timestamp"] != before {
            return st;
        }
        assert!(Instant::now() < deadline, "{name} never ended: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn status(api: &BottlerocketApi) -> Value {
    loop {
        let (code, out) = apiclient(api, &["-u", "/updates/status"]);
        if code == 0 {
            return serde_json::from_str(&out).unwrap();
        }
        if out.contains("Status 404") {
            return json!({});
        }
        // 423: an action holds the lock.
        std::thread::sleep(Duration::from_millis(50));
    }
}

// --- Transient failures are tried again ---

#[test]
fn a_refresh_that_fails_twice_is_tried_again_and_the_upgrade_goes_on() {
    let scenario = Scenario::new("1.22.0", &["1.22.3"]).refresh_failing(Failure::Unreachable, 2);
    let started = Instant::now();
    let (o, api, dir) = go(Script::New, scenario.clone(), "1.22.3");
    let took = started.elapsed();
    assert_upgraded(&o, &api, "1.22.3", 0);
    assert_eq!(retries(&o), json!({ "refresh": 2 }), "{}", o.output);
    assert_eq!(o.report.as_ref().unwrap()["outcome"], "done");
    assert!(
        o.output
            .contains("refresh failed (try 1): Metadata error: Failed to fetch"),
        "{}",
        o.output
    );
    assert_no_markers(dir.path());
    eprintln!(
        "two failed refreshes retried: upgraded in {took:?} (waits of 10 + 20 units at 0.02 s)"
    );

    // Control: the script before gave up at the first failed refresh.
    let (before, before_api, _d) = go(Script::StagedBookkeeping, scenario, "1.22.3");
    assert_eq!(before.exit, 1, "{}", before.output);
    assert!(
        before.output.contains("refresh failed: Metadata error"),
        "{}",
        before.output
    );
    assert!(before_api.boots().is_empty());
}

#[test]
fn a_prepare_whose_download_breaks_off_is_tried_again() {
    let scenario = Scenario::new("1.22.0", &["1.22.3"]).prepare_failing(Failure::Download, 2);
    let (o, api, _dir) = go(Script::New, scenario.clone(), "1.22.3");
    assert_upgraded(&o, &api, "1.22.3", 0);
    assert_eq!(retries(&o), json!({ "prepare": 2 }), "{}", o.output);
    assert!(
        o.output
            .contains("prepare failed (try 2): Starting update to 1.22.3"),
        "{}",
        o.output
    );

    let (before, before_api, _d) = go(Script::StagedBookkeeping, scenario, "1.22.3");
    assert_eq!(before.exit, 1, "{}", before.output);
    assert!(
        before.output.contains("prepare failed"),
        "{}",
        before.output
    );
    assert!(before_api.boots().is_empty());
}

// --- Permanent failures fail at once, bounded ones after their retries ---

#[test]
fn expired_metadata_fails_the_prepare_at_once_with_nothing_written() {
    let scenario =
        Scenario::new("1.22.0", &["1.22.3"]).refresh_failing(Failure::Expired, usize::MAX);
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), scenario);
    let (code, output) = prepare(&api, dir.path(), "1.22.3");
    assert_eq!(code, 1, "{output}");
    let report = report(dir.path(), 0).expect("a termination message");
    assert_eq!(report["outcome"], "failed");
    assert_eq!(report["action"], "prepare");
    assert_eq!(report["retries"], json!({}), "not retried");
    let reason = report["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("refresh failed, not retried (the update repository's metadata must be fixed): Metadata error: timestamp metadata is expired"),
        "{reason}"
    );
    let refreshes = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST /actions/refresh-updates"))
        .count();
    assert_eq!(refreshes, 1, "{:#?}", api.requests());
    assert!(api.staged().is_empty() && api.reboot_requests() == 0);
}

#[test]
fn a_repository_that_never_answers_fails_the_node_after_bounded_retries() {
    // The node was upgraded to 1.22.0 from 1.21.1 before: its inactive set
    // holds 1.21.1, bootable. Metadata that cannot be fetched fails before
    // updog touches the disk, so that stays.
    let mut scenario =
        Scenario::new("1.22.0", &["1.22.3"]).prepare_failing(Failure::Unreachable, usize::MAX);
    scenario.inactive = Some(v("1.21.1"));
    let (o, api, dir) = go(Script::New, scenario, "1.22.3");
    assert_eq!(o.exit, 1, "{}", o.output);
    assert!(!o.rebooted);
    assert_eq!(retries(&o), json!({ "prepare": 3 }), "{}", o.output);
    let reason = o.report.as_ref().unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.starts_with("prepare failed 4 times; the last: Metadata error"),
        "{reason}"
    );
    assert!(
        reason.ends_with("nothing was written: the inactive partition set is as it was"),
        "{reason}"
    );
    assert_eq!(
        api.inactive(),
        PartitionSet {
            image: Some(v("1.21.1")),
            priority: 1,
            tries_left: 0,
            successful: true
        }
    );
    assert!(
        api.signpost_rollback_to_inactive().is_ok(),
        "the offline way back still works"
    );
    assert_no_markers(dir.path());
}

// --- Rollback: what it needs, what a failed one leaves ---

/// A node drover moved from 1.13.2 to 1.13.3, which failed its health
/// checks: the inactive set holds 1.13.2, bootable (booted successfully before).
fn failed_upgrade() -> Scenario {
    let mut s = Scenario::new("1.13.3", &["1.13.2", "1.13.3"]);
    s.inactive = Some(v("1.13.2"));
    s
}

#[test]
fn a_rollback_whose_download_breaks_off_leaves_the_node_at_the_bad_version_without_its_offline_way_back(
) {
    // Control: before any rollback, the manual way back works.
    let dir = tempfile::tempdir().unwrap();
    let control = BottlerocketApi::start(dir.path(), failed_upgrade());
    assert!(control.inactive().will_boot());
    control
        .signpost_rollback_to_inactive()
        .expect("rollback-to-inactive works");
    control.reboot_now();
    assert_eq!(
        control.running(),
        v("1.13.2"),
        "the manual way back boots 1.13.2"
    );

    let scenario = failed_upgrade().prepare_failing(Failure::Download, usize::MAX);
    let (o, api, dir) = go_env(
        Script::New,
        scenario,
        "1.13.2",
        &[
            ("DROVER_ACTION", "rollback"),
            ("DROVER_FAILED_VERSION", "1.13.3"),
        ],
    );
    assert_eq!(o.exit, 1, "{}", o.output);
    assert!(!o.rebooted);
    let report = o.report.clone().unwrap();
    assert_eq!(report["action"], "rollback");
    assert_eq!(report["retries"], json!({ "prepare": 3 }));
    let reason = report["reason"].as_str().unwrap();
    assert!(
        reason.contains("Failed writing update data to disk"),
        "{reason}"
    );
    assert!(
        reason.ends_with(
            "updog cleared the inactive partition set before the download broke off, so `signpost rollback-to-inactive` no longer works on this node"
        ),
        "{reason}"
    );
    assert_eq!(api.running(), v("1.13.3"), "still the bad version");
    assert_eq!(api.reboot_requests(), 0);
    assert_eq!(
        api.inactive(),
        PartitionSet {
            image: None,
            priority: 0,
            tries_left: 0,
            successful: false
        },
        "cleared by updog (clear_inactive) before the download"
    );
    let refused = api.signpost_rollback_to_inactive().unwrap_err();
    assert_eq!(
        refused,
        "Inactive partition is not valid to roll back to (priority=0 tries_left=0 successful=false)"
    );
    api.reboot_now();
    assert_eq!(api.running(), v("1.13.3"), "a reboot keeps the bad version");
    assert_no_markers(dir.path());
}

#[test]
fn after_a_rollback_the_inactive_set_holds_the_bad_version_marked_bootable() {
    let (o, api, _dir) = go_env(
        Script::New,
        failed_upgrade(),
        "1.13.2",
        &[
            ("DROVER_ACTION", "rollback"),
            ("DROVER_FAILED_VERSION", "1.13.3"),
        ],
    );
    assert_eq!(o.exit, 0, "{}", o.output);
    assert_eq!(api.running(), v("1.13.2"));
    assert_eq!(api.staged(), vec![v("1.13.2")], "downloaded again");
    assert!(
        o.output.contains("downloading 1.13.2 again"),
        "{}",
        o.output
    );
    // 1.13.3 booted successfully once (it failed health checks, not the
    // boot): a later fallback to the inactive set boots it.
    assert_eq!(
        api.inactive(),
        PartitionSet {
            image: Some(v("1.13.3")),
            priority: 1,
            tries_left: 0,
            successful: true
        }
    );
    api.signpost_rollback_to_inactive().unwrap();
    api.reboot_now();
    assert_eq!(
        api.running(),
        v("1.13.3"),
        "rollback-to-inactive now boots the bad version"
    );
}

// --- The lock's commit whose answer is lost ---

#[test]
fn a_lost_answer_to_the_commit_is_read_back_from_the_settings() {
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.lost_commit_answers = 1;
    let (o, api, _dir) = go(Script::New, scenario.clone(), "1.22.3");
    assert_upgraded(&o, &api, "1.22.3", 0);
    assert_eq!(retries(&o), json!({ "commit": 1 }), "{}", o.output);
    assert!(
        o.output.contains(
            "the commit's answer was lost (transport); the lock reads back as 1.22.3: committed"
        ),
        "{}",
        o.output
    );
    let commits = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST /tx/commit_and_apply"))
        .count();
    assert_eq!(commits, 1, "committed once: {:#?}", api.requests());

    // Control: the script before asked again and failed on the 422.
    let (before, before_api, _d) = go(Script::StagedBookkeeping, scenario, "1.22.3");
    assert_eq!(before.exit, 1, "{}", before.output);
    assert!(before.output.contains("Status 422"), "{}", before.output);
    assert!(before_api.boots().is_empty());
    assert_eq!(
        before_api.version_lock(),
        "1.22.3",
        "although the commit happened"
    );
}

// --- "Staged already" is updog's report, not thar-be-updates' bookkeeping ---

#[test]
fn staged_already_with_another_image_on_disk_is_refused_and_downloaded_over() {
    // A 1.19 node whose lock never reached updog: the prepare Job ends with
    // "updog never wrote 1.19.5", thar-be-updates' bookkeeping says
    // "Staged 1.19.5" and the disk holds 1.26.0.
    let mut scenario = Scenario::new("1.19.4", &["1.19.5", "1.26.0"]);
    scenario.settings_delay = Duration::from_secs(3600);
    for script in [Script::StagedBookkeeping, Script::New] {
        let dir = tempfile::tempdir().unwrap();
        let api = BottlerocketApi::start(dir.path(), scenario.clone());
        let (code, output) = prepare(&api, dir.path(), "1.19.5");
        assert_eq!(code, 1, "{output}");
        assert!(output.contains("updog never wrote 1.19.5"), "{output}");
        assert_eq!(
            api.inactive().image,
            Some(v("1.26.0")),
            "another image on disk"
        );
        // The lock reaches updog later; the upgrade Job runs after the drain.
        api.render_now();
        let before = api.staged().len();
        let o = run(script, &api, dir.path(), "1.19.5", UNIT);
        match script {
            Script::StagedBookkeeping => {
                assert!(o.output.contains("staged already"), "{}", o.output);
                assert_eq!(
                    api.boots(),
                    vec![v("1.26.0")],
                    "the script before activated the image updog wrote: {}",
                    o.output
                );
            }
            _ => {
                assert!(!o.output.contains("staged already"), "{}", o.output);
                assert_upgraded(&o, &api, "1.19.5", before);
            }
        }
    }
}

#[test]
fn activate_refuses_a_partition_set_updog_did_not_finish_writing() {
    // The stand-in as signpost: thar-be-updates' bookkeeping says Staged
    // 1.22.3 from a good prepare, then a prepare's download breaks off
    // after clearing the set; activate, which reads the disk's flags,
    // refuses, and nothing boots.
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), Scenario::new("1.22.0", &["1.22.3"]));
    let (code, output) = prepare(&api, dir.path(), "1.22.3");
    assert_eq!(code, 0, "{output}");
    api.fail_prepares(Failure::Download, 1);
    let st = action(&api, "prepare", "/actions/prepare-update");
    assert_eq!(st["most_recent_command"]["cmd_status"], "Failed", "{st}");
    assert_eq!(st["update_state"], "Staged", "the state stays: {st}");
    assert_eq!(
        st["staging_partition"]["image"]["version"], "1.22.3",
        "bookkeeping"
    );
    let st = action(&api, "activate", "/actions/activate-update");
    assert_eq!(st["most_recent_command"]["cmd_status"], "Failed", "{st}");
    assert_eq!(
        st["most_recent_command"]["stderr"],
        "Could not mark inactive partition for boot: Inactive partition /dev/nvme0n1 has not been marked valid for upgrade\n"
    );
    assert_eq!(st["update_state"], "Staged");
    // The upgrade Job after that: no "staged already" (the last command is
    // a failed activate), the target written again, booted once.
    let o = run(Script::New, &api, dir.path(), "1.22.3", UNIT);
    assert!(!o.output.contains("staged already"), "{}", o.output);
    assert_upgraded(&o, &api, "1.22.3", 1);
}

// --- The reboot endpoint before and after 1.22, and the oldest clients ---

#[test]
fn a_held_inhibitor_stops_the_reboot_from_1_22_on_but_not_before() {
    for (running, target, refused) in [("1.21.1", "1.21.3", false), ("1.22.0", "1.22.3", true)] {
        let mut scenario = Scenario::new(running, &[target]);
        scenario.inhibitor = true;
        let (o, api, dir) = go(Script::New, scenario, target);
        if refused {
            assert_eq!(o.exit, 1, "{}", o.output);
            assert!(o.output.contains("reboot refused"), "{}", o.output);
            assert!(o.output.contains("Operation inhibited"), "{}", o.output);
            assert_eq!(api.update_state(), ("Staged".into(), false), "cancelled");
            assert_no_markers(dir.path());
        } else {
            assert_upgraded(&o, &api, target, 0);
        }
    }
}

#[test]
fn a_node_whose_apiclient_predates_subcommands_is_upgraded() {
    // Bottlerocket 1.0.0 to 1.0.2: apiclient takes -u/-m/-d and no `raw`.
    let env = [("APICLIENT_LEGACY", "1")];
    let (o, api, _d) = go_env(
        Script::New,
        Scenario::new("1.0.2", &["1.0.5"]),
        "1.0.5",
        &env,
    );
    assert_upgraded(&o, &api, "1.0.5", 0);
    let (before, before_api, _d) = go_env(
        Script::StagedBookkeeping,
        Scenario::new("1.0.2", &["1.0.5"]),
        "1.0.5",
        &env,
    );
    assert_eq!(
        before.exit, 1,
        "`apiclient raw` does not exist there: {}",
        before.output
    );
    assert!(before_api.requests().is_empty());
}

// --- The stop that races the reboot ---

#[test]
fn a_sigterm_while_the_reboot_request_is_in_flight_waits_for_its_answer() {
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.hold_reboot_answer = true;
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), scenario);
    let first = watch(spawn(Script::New, &api, dir.path(), "1.22.3", 1));
    api.await_reboot_request(RUN_LIMIT);
    // The shutdown the request started stops the pod before the answer came.
    signal(first.pid, "-TERM");
    std::thread::sleep(Duration::from_millis(300));
    api.release_reboot();
    assert_eq!(first.exit(Duration::from_secs(30)), 143);
    let log = fs::read_to_string(dir.path().join("run-1.log")).unwrap();
    assert!(!log.contains("cancelling"), "{log}");
    assert_eq!(
        api.update_state(),
        ("Ready".into(), true),
        "still activated: {log}"
    );
    assert!(
        marker(dir.path()).exists(),
        "the attempt asked for its reboot: {log}"
    );
    api.reboot_now();
    let second = watch(spawn(Script::New, &api, dir.path(), "1.22.3", 2));
    assert_eq!(second.exit(RUN_LIMIT), 0);
    assert_eq!(api.running(), v("1.22.3"));
    assert_no_markers(dir.path());
}

#[test]
fn a_sigterm_before_a_refused_reboot_is_answered_cancels_the_update() {
    // A deletion of the Job racing a reboot request the API then refuses
    // (a shutdown inhibitor): no reboot comes, so the update must not stay
    // activated, nor the marker that says the attempt rebooted.
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.hold_reboot_answer = true;
    scenario.inhibitor = true;
    for script in [Script::StagedBookkeeping, Script::New] {
        let dir = tempfile::tempdir().unwrap();
        let api = BottlerocketApi::start(dir.path(), scenario.clone());
        let r = watch(spawn(script, &api, dir.path(), "1.22.3", 1));
        api.await_reboot_request(RUN_LIMIT);
        signal(r.pid, "-TERM");
        std::thread::sleep(Duration::from_millis(300));
        api.release_reboot();
        let code = r.exit(Duration::from_secs(30));
        let log = fs::read_to_string(dir.path().join("run-1.log")).unwrap();
        if script == Script::StagedBookkeeping {
            // The script before took the request for a reboot under way.
            assert_eq!(api.update_state(), ("Ready".into(), true), "{log}");
            assert!(marker(dir.path()).exists(), "{log}");
            continue;
        }
        assert_eq!(code, 143, "{log}");
        assert!(log.contains("reboot refused"), "{log}");
        assert_eq!(
            api.update_state(),
            ("Staged".into(), false),
            "cancelled: {log}"
        );
        assert_no_markers(dir.path());
        api.reboot_now();
        assert_eq!(api.running(), v("1.22.0"));
    }
}

#[test]
fn a_confirmed_upgrade_clears_every_marker_and_reports_done() {
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), Scenario::new("1.22.0", &["1.22.3"]));
    // A marker an earlier attempt left (a node failed, then retried).
    fs::create_dir_all(dir.path().join("state")).unwrap();
    fs::write(dir.path().join("state/attempt-1700000000"), "{}").unwrap();
    let o = run(Script::New, &api, dir.path(), "1.22.3", UNIT);
    assert_upgraded(&o, &api, "1.22.3", 0);
    assert_no_markers(dir.path());
    assert_eq!(
        o.report,
        Some(json!({
            "outcome": "done", "action": "upgrade", "target": "1.22.3",
            "retries": {}, "reason": "",
        }))
    );
    // The version lock stays at the target (docs/drivers.md says why).
    assert_eq!(api.version_lock(), "1.22.3");
}
