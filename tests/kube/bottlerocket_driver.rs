//! The Bottlerocket driver script, exactly as the updater image holds it
//! (deploy/updater/bottlerocket-update.sh, the upgrade Job's command), run
//! against a simulated Bottlerocket API (support/bottlerocket_api.rs) through
//! a stand-in `apiclient` (support/bottlerocket/apiclient), with the faults a
//! real node shows. Each fault runs an earlier script too, to show the
//! failure it had: the first one (support/bottlerocket/old_driver.sh), or the
//! one before the last change (support/bottlerocket/previous_driver.sh).
//!
//! A run follows the pod's life: the script starts; when it asks for the
//! reboot, the test stops it with SIGTERM (the node's graceful shutdown),
//! reboots the simulated node and starts the script again (the Job's
//! `podFailurePolicy` ignores the killed pod).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::bottlerocket_api::script::*;
use crate::support::bottlerocket_api::{v, BottlerocketApi, Scenario};
use chrono::{DateTime, Utc};
use drover::cluster::{NodeProgress, ProgressState};
use drover::config::{DriverSpec, NodesSpec, TEST_UPDATER_IMAGE};
use drover::kubernetes::driver::{self, BOTTLEROCKET_COMMAND};
use drover::kubernetes::node::ObservedNode;
use drover::kubernetes::KubeOptions;
use serde_json::Value;

// --- Failure 1: the image's apiclient against an older node's API server ---

#[test]
fn a_node_older_than_1_21_is_upgraded_although_its_server_lacks_the_keypair_endpoint() {
    // The stand-in apiclient is a current one: `set k=v` sends
    // PATCH /settings/keypair, which 1.20 servers answer with 404.
    let ((old, old_api, _d1), (new, new_api, _d2)) =
        both(Scenario::new("1.19.5", &["1.20.1"]), "1.20.1");

    assert_eq!(old.exit, 1, "{}", old.output);
    assert!(
        old.output.contains("/settings/keypair") && old.output.contains("Status 404"),
        "{}",
        old.output
    );
    assert!(old_api.staged().is_empty() && old_api.boots().is_empty());

    assert_upgraded(&new, &new_api, "1.20.1", 0);
    assert!(
        !new_api.requests().iter().any(|r| r.contains("keypair")),
        "only endpoints every release serves"
    );
}

// --- Failure 2: `set` returns before it takes effect ---

#[test]
fn a_lock_applied_late_never_stages_the_newest_release_in_the_wave() {
    // 1.20.1 is in this node's wave, the target 1.20.3 not yet: until the
    // lock and ignore-waves are rendered, a refresh chooses 1.20.1.
    let mut scenario = Scenario::new("1.22.0", &["1.22.1", "1.22.3"]).out_of_wave("1.22.3");
    // Rendered only once a second refresh was asked for: the old script
    // refreshes once, then prepares.
    scenario.render_after = Some(("POST /actions/refresh-updates", 2));
    let ((old, old_api, _d1), (new, new_api, _d2)) = both(scenario, "1.22.3");

    assert_eq!(old_api.staged(), vec![v("1.22.1")], "{}", old.output);
    assert_eq!(
        old_api.boots(),
        vec![v("1.22.1")],
        "the old script booted the wrong version"
    );
    assert_eq!(old.exit, 1, "{}", old.output);

    assert_upgraded(&new, &new_api, "1.22.3", 0);
    assert!(
        new.output.contains("refresh chose 1.22.1"),
        "the new script saw the early refresh and waited: {}",
        new.output
    );
}

#[test]
fn a_refresh_offering_only_a_newer_release_stages_nothing() {
    // The target is not in the repository (withdrawn, or a typo in the pin).
    let mut scenario = Scenario::new("1.22.0", &["1.22.5"]);
    // The old script's refresh and prepare both run before the rendering.
    scenario.render_after = Some(("POST /actions/prepare-update", 1));
    let ((old, old_api, _d1), (new, new_api, _d2)) = both(scenario, "1.22.3");

    assert_eq!(
        old_api.boots(),
        vec![v("1.22.5")],
        "the old script booted the newer release: {}",
        old.output
    );

    assert_eq!(new.exit, 1, "{}", new.output);
    assert!(!new.rebooted);
    assert!(
        new.output
            .contains("1.22.3 is not offered to this node (offered: 1.22.5)"),
        "{}",
        new.output
    );
    assert!(new_api.staged().is_empty(), "nothing written");
    assert!(new_api.boots().is_empty() && new_api.reboot_requests() == 0);
    assert_eq!(new_api.running(), v("1.22.0"));
}

// --- Failure 2b: before 1.20, the refresh read the lock before updog did ---

/// The requests to prepare, and how long after the version lock's commit
/// the last one was made.
fn prepares_after_commit(api: &BottlerocketApi) -> (usize, Duration) {
    let log = api.timed_requests();
    let committed = log
        .iter()
        .find(|(_, r)| r.starts_with("POST /tx/commit_and_apply"))
        .map(|(t, _)| *t)
        .expect("the lock was committed");
    let prepares: Vec<Instant> = log
        .iter()
        .filter(|(_, r)| r == "POST /actions/prepare-update -> 204")
        .map(|(t, _)| *t)
        .collect();
    let last = prepares.last().copied().unwrap_or(committed);
    (prepares.len(), last.duration_since(committed))
}

#[test]
fn a_1_19_node_boots_exactly_its_pin_although_its_refresh_reads_the_lock_before_updog() {
    // The issue's node: 1.19.4 pinned to 1.19.5, 1.26.0 the newest release.
    // Its refresh chooses from the API's settings, committed at once, while
    // updog writes what /etc/updog.toml says, rendered only after the first
    // prepare was answered (and then at once).
    let mut scenario = Scenario::new("1.19.4", &["1.19.5", "1.26.0"]);
    scenario.render_after = Some(("POST /actions/prepare-update", 1));
    let ((prev, prev_api, _d1), (new, new_api, _d2)) =
        pair(Script::Previous, scenario, "1.19.5", UNIT);

    // Control: the stand-in reproduces the failure the script had.
    assert_eq!(
        prev_api.boots(),
        vec![v("1.26.0")],
        "the previous script booted the newest release: {}",
        prev.output
    );

    assert_upgraded(&new, &new_api, "1.19.5", 1);
    assert_eq!(
        new_api.staged()[0],
        v("1.26.0"),
        "the first prepare came before the lock reached updog"
    );
    assert!(
        new.output.contains(
            "updog wrote 1.26.0 for a refresh that chose 1.19.5: the lock to 1.19.5 is not yet applied"
        ),
        "{}",
        new.output
    );
    let (prepares, after) = prepares_after_commit(&new_api);
    eprintln!(
        "1.19, the lock rendered after the first prepare: {prepares} prepares, the good one {after:?} after the commit"
    );
    assert_eq!(prepares, 2, "{:#?}", new_api.requests());
}

#[test]
fn a_1_19_node_whose_lock_never_reaches_updog_is_failed_without_a_reboot() {
    let mut scenario = Scenario::new("1.19.4", &["1.19.5", "1.26.0"]);
    scenario.settings_delay = Duration::from_secs(3600);
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), scenario);
    let o = run(Script::New, &api, dir.path(), "1.19.5", UNIT);

    assert_eq!(o.exit, 1, "{}", o.output);
    assert!(!o.rebooted, "{}", o.output);
    assert!(
        o.output
            .contains("updog never wrote 1.19.5 (last: 1.26.0); nothing was activated"),
        "{}",
        o.output
    );
    assert_eq!(
        api.update_state(),
        ("Staged".into(), false),
        "never activated"
    );
    assert_eq!(api.reboot_requests(), 0);
    api.reboot_now();
    assert_eq!(api.running(), v("1.19.4"), "the node stays as it was");
}

#[test]
fn a_1_19_node_whose_lock_is_rendered_at_once_prepares_once() {
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), Scenario::new("1.19.4", &["1.19.5", "1.26.0"]));
    let o = run(Script::New, &api, dir.path(), "1.19.5", UNIT);
    assert_upgraded(&o, &api, "1.19.5", 0);
    assert_eq!(prepares_after_commit(&api).0, 1, "{:#?}", api.requests());
}

// --- Failure 3: an activated update left behind ---

#[test]
fn a_stale_ready_update_is_cancelled_before_the_upgrade() {
    let mut scenario = Scenario::new("1.22.0", &["1.22.1", "1.22.3"]);
    scenario.stale_ready = Some(v("1.22.1"));
    let ((old, old_api, _d1), (new, new_api, _d2)) = both(scenario, "1.22.3");

    // prepare is refused in Ready: the old script fails, the update stays
    // activated, and the next reboot (of a node given back) boots it.
    assert_eq!(old.exit, 1, "{}", old.output);
    assert!(old.output.contains("Status 409"), "{}", old.output);
    assert_eq!(old_api.update_state(), ("Ready".into(), true));
    old_api.reboot_now();
    assert_eq!(
        old_api.running(),
        v("1.22.1"),
        "an unrelated reboot booted it"
    );

    assert!(new
        .output
        .contains("cancelling the update left activated for 1.22.1"));
    assert_upgraded(&new, &new_api, "1.22.3", 1);
}

#[test]
fn a_failed_reboot_leaves_the_update_cancelled() {
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.inhibitor = true;
    let ((old, old_api, _d1), (new, new_api, d2)) = both(scenario, "1.22.3");

    assert_eq!(old.exit, 1, "{}", old.output);
    assert_eq!(old_api.update_state(), ("Ready".into(), true));
    old_api.reboot_now();
    assert_eq!(
        old_api.running(),
        v("1.22.3"),
        "a node given back as failed boots the update at its next reboot"
    );

    assert_eq!(new.exit, 1, "{}", new.output);
    assert!(new.output.contains("reboot refused"), "{}", new.output);
    assert_eq!(new_api.update_state(), ("Staged".into(), false));
    new_api.reboot_now();
    assert_eq!(new_api.running(), v("1.22.0"), "the node stays as it was");
    assert!(
        !marker(d2.path()).exists(),
        "no marker left: a later attempt is not taken for a rebooted one"
    );
}

// --- Failure 4: no retries ---

#[test]
fn a_held_update_lock_is_waited_for() {
    // Another caller's refresh holds the lock at first, until three calls
    // were refused with 423.
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.locked_at_start = Duration::from_millis(1);
    scenario.locked_for_refusals = 3;
    let ((old, old_api, _d1), (new, new_api, _d2)) = both(scenario, "1.22.3");

    assert_eq!(old.exit, 1, "{}", old.output);
    assert!(old.output.contains("423"), "{}", old.output);
    assert!(old_api.boots().is_empty());

    assert!(new.output.contains("423, retrying"), "{}", new.output);
    assert_upgraded(&new, &new_api, "1.22.3", 0);
}

#[test]
fn a_refresh_slower_than_apiclients_ten_seconds_is_awaited() {
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.refresh_takes = Duration::from_secs(11);
    // The new script's refresh bound, 300 units, is 15 s here (5 min in clusters).
    let ((old, old_api, _d1), (new, new_api, _d2)) = both_with_unit(scenario, "1.22.3", "0.05");

    assert_eq!(old.exit, 1, "{}", old.output);
    assert!(old.output.contains("Timed out"), "{}", old.output);
    assert!(old_api.boots().is_empty());

    assert_upgraded(&new, &new_api, "1.22.3", 0);
}

// --- A Job deleted mid-update ---

#[test]
fn a_job_deleted_while_the_update_is_activated_leaves_it_cancelled() {
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.activate_takes = Duration::from_millis(1000);
    for script in [Script::Old, Script::New] {
        let dir = tempfile::tempdir().unwrap();
        let api = BottlerocketApi::start(dir.path(), scenario.clone());
        let r = watch(spawn(script, &api, dir.path(), "1.22.3", 1));
        // The activate is running (it holds the lock): the Job is deleted now.
        api.await_update_state(RUN_LIMIT, "Ready");
        signal(r.pid, "-TERM");
        let code = r.exit(Duration::from_secs(30));
        let log = fs::read_to_string(dir.path().join("run-1.log")).unwrap();
        match script {
            Script::Old => {
                assert_eq!(api.update_state(), ("Ready".into(), true), "{log}");
                api.reboot_now();
                assert_eq!(api.running(), v("1.22.3"), "booted behind drover's back");
            }
            _ => {
                assert_eq!(code, 143, "{log}");
                assert!(log.contains("update cancelled"), "{log}");
                assert_eq!(api.update_state(), ("Staged".into(), false), "{log}");
                api.reboot_now();
                assert_eq!(api.running(), v("1.22.0"), "the node stays as it was");
                assert_eq!(api.reboot_requests(), 0);
            }
        }
    }
}

// --- The restarted pod ---

// --- A stop at any moment ---

/// The pod's SIGTERM can arrive while bash parses one of the script's `$(...)`,
/// where bash 5.2 runs a trap in a half-built parser state and loses it. After
/// each of the first requests of an upgrade the script is stopped: every time
/// it must end with 143, say so, and leave no update activated.
#[test]
fn a_sigterm_at_any_moment_ends_the_script_and_leaves_no_update_activated() {
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.activate_takes = Duration::from_millis(200);
    // Stop after request 1, 2, ... until a run no longer reaches that many
    // requests before the reboot (the whole upgrade has been covered then).
    let mut stopped = 0;
    for n in 1.. {
        let dir = tempfile::tempdir().unwrap();
        let api = BottlerocketApi::start(dir.path(), scenario.clone());
        let r = watch(spawn(Script::New, &api, dir.path(), "1.22.3", 1));
        api.await_requests(RUN_LIMIT, n);
        if api.reboot_requests() > 0 {
            break;
        }
        signal(r.pid, "-TERM");
        let code = r.exit(Duration::from_secs(30));
        let log = fs::read_to_string(dir.path().join("run-1.log")).unwrap();
        assert_eq!(code, 143, "stopped after request {n}:\n{log}");
        assert!(log.contains("stopped by SIGTERM"), "{log}");
        assert!(!log.contains("unexpected EOF"), "{log}");
        if api.reboot_requests() == 0 {
            assert!(
                !api.update_state().1,
                "left activated after request {n}:\n{log}"
            );
            // No reboot was asked for: no marker may say it was.
            assert!(
                !marker(dir.path()).exists(),
                "a marker left after request {n}:\n{log}"
            );
        }
        stopped += 1;
    }
    // The control: the loop really stopped the script at many points.
    assert!(stopped >= 15, "only {stopped} stops");
}

#[test]
fn the_version_is_read_again_until_the_api_answers_after_the_reboot() {
    // The pod starts again before the node's API server is up.
    let mut scenario = Scenario::new("1.22.0", &["1.22.3"]);
    scenario.reboot_downtime = Duration::from_secs(2);
    let ((old, old_api, _d1), (new, new_api, _d2)) = both(scenario, "1.22.3");

    // Without pipefail the failed read was an empty version: the node runs
    // the target, and the old script failed it anyway.
    assert_eq!(old_api.running(), v("1.22.3"));
    assert_eq!(old.exit, 1, "{}", old.output);
    assert!(
        old.output.contains("runs an unknown version"),
        "{}",
        old.output
    );

    assert_upgraded(&new, &new_api, "1.22.3", 0);
    assert!(
        new_api
            .requests()
            .iter()
            .any(|r| r == "GET /os -> no answer (rebooting)"),
        "the restarted script met the API down: {:#?}",
        new_api.requests()
    );
}

#[test]
fn a_node_back_at_another_version_fails_without_a_second_update() {
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), Scenario::new("1.22.0", &["1.22.3"]));
    fs::create_dir_all(dir.path().join("state")).unwrap();
    fs::write(marker(dir.path()), "").unwrap();
    let r = watch(spawn(Script::New, &api, dir.path(), "1.22.3", 1));
    assert_eq!(r.exit(RUN_LIMIT), 1);
    let log = fs::read_to_string(dir.path().join("run-1.log")).unwrap();
    assert!(log.contains("rebooted for 1.22.3 but runs 1.22.0"), "{log}");
    assert!(api.staged().is_empty());
}

// --- The Job, the docs and the image ---

fn bottlerocket_job() -> Value {
    job_for(NodeProgress {
        state: ProgressState::Upgrading,
        target: v("1.20.3"),
        started_at: "2026-12-01T02:00:00Z".parse().unwrap(),
        cordoned_by_drover: true,
        message: String::new(),
        retries: 0,
        previous: None,
    })
}

/// The Bottlerocket Job drover creates for node-1's record `p`.
fn job_for(p: NodeProgress) -> Value {
    let opts = KubeOptions {
        cluster_name: "c".into(),
        namespace: "drover-system".into(),
        records_namespace: "drover-system".into(),
        environment: "e".into(),
        node_selector: String::new(),
        nodes: NodesSpec::default(),
        driver: DriverSpec::Bottlerocket {
            image: Some(TEST_UPDATER_IMAGE.into()),
        },
        job_deadline: Some(Duration::from_secs(1800)),
        job_ttl: Duration::from_secs(3600),
        ready_timeout: Duration::from_secs(60),
        pod_watches: 32,
    };
    let mut node = ObservedNode::default();
    node.metadata.name = Some("node-1".into());
    let start = crate::support::backend::run_start("node-1", &p);
    serde_json::to_value(driver::upgrade_job(&opts, &node, &start).unwrap()).unwrap()
}

/// The plain environment of a Job's container, by name.
fn job_env(job: &Value) -> std::collections::BTreeMap<String, String> {
    job["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A rollback through the Bottlerocket driver (docs/design.md §5b): the Job
/// drover creates for a node rolling back from 1.13.3 names the version it
/// ran before, and the script, the same one, locks that version and boots
/// it, staging nothing else.
#[test]
fn a_rollback_locks_the_previous_version_and_boots_it() {
    let started: DateTime<Utc> = "2026-12-01T03:00:00Z".parse().unwrap();
    let job = job_for(NodeProgress {
        state: ProgressState::RollingBack,
        target: v("1.13.3"),
        started_at: started,
        cordoned_by_drover: true,
        message: "health check failed: ...".into(),
        retries: 0,
        previous: Some(v("1.13.2")),
    });
    let env = job_env(&job);
    assert_eq!(env["DROVER_TARGET_VERSION"], "1.13.2");
    assert_eq!(env["DROVER_ACTION"], "rollback");
    assert_eq!(env["DROVER_FAILED_VERSION"], "1.13.3");
    assert_eq!(
        job["metadata"]["labels"]["drover.dev/target-version"],
        "1.13.2"
    );

    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), Scenario::new("1.13.3", &["1.13.2", "1.13.3"]));
    let o = run(
        Script::New,
        &api,
        dir.path(),
        &env["DROVER_TARGET_VERSION"],
        UNIT,
    );
    assert_eq!(o.exit, 0, "{}", o.output);
    assert!(o.rebooted, "{}", o.output);
    assert_eq!(api.version_lock(), "1.13.2", "through the version lock");
    assert_eq!(api.running(), v("1.13.2"));
    assert_eq!(
        api.boots(),
        vec![v("1.13.2")],
        "booted once, into the previous version"
    );
    assert_eq!(api.staged(), vec![v("1.13.2")], "nothing else written");
}

/// The rows of the markdown table following `heading` in `text`.
fn table_after<'a>(text: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("{heading} in docs"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`'))
                .collect()
        })
        .collect()
}

#[test]
fn the_job_has_the_mounts_and_selinux_options_docs_drivers_md_documents() {
    let job = bottlerocket_job();
    let pod = &job["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["command"], serde_json::json!([BOTTLEROCKET_COMMAND]));
    assert!(c.get("args").is_none());
    assert_eq!(c["image"], TEST_UPDATER_IMAGE);
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);

    let docs =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/drivers.md")).unwrap();
    // | volume | host path | type | in the container | read-only |
    let mut documented: Vec<Vec<String>> = table_after(&docs, "**Host mounts**")
        .into_iter()
        .map(|r| r.into_iter().take(5).map(str::to_string).collect())
        .collect();
    let mut built: Vec<Vec<String>> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vol| {
            let name = vol["name"].as_str().unwrap();
            let mount = c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == name)
                .unwrap_or_else(|| panic!("volume {name} is mounted"));
            vec![
                name.to_string(),
                vol["hostPath"]["path"].as_str().unwrap().to_string(),
                vol["hostPath"]["type"].as_str().unwrap().to_string(),
                mount["mountPath"].as_str().unwrap().to_string(),
                if mount["readOnly"] == true {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
            ]
        })
        .collect();
    documented.sort();
    built.sort();
    assert_eq!(documented, built, "docs/drivers.md's host mounts table");
    assert!(built.iter().any(|r| r[0] == "apiclient"
        && r[1] == "/bin/apiclient"
        && r[2] == "File"
        && r[3] == "/usr/local/bin/apiclient"));

    // The SELinux options, as the YAML block under **SELinux** shows them.
    let start = docs.find("**SELinux**").expect("SELinux section");
    let block: String = docs[start..]
        .lines()
        .skip_while(|l| !l.starts_with("```yaml"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(|l| format!("{l}\n"))
        .collect();
    let documented: Value = serde_yaml::from_str(&block).expect("the SELinux YAML block");
    assert_eq!(documented["securityContext"], c["securityContext"]);
    assert_eq!(c["securityContext"]["seLinuxOptions"]["type"], "super_t");
}

/// The updater image as the release builds it (deploy/updater/build, from
/// the Debian packages tests/release/build caches): the driver script runs
/// with the image's own bash, jq and coreutils (its own loader and
/// libraries, on x86_64) and upgrades a node; the packages are bash, jq,
/// coreutils and their dependencies, nothing more.
#[test]
fn the_updater_image_holds_the_script_the_job_runs_and_what_it_runs_and_nothing_else() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lock = fs::read_to_string(root.join("deploy/updater/packages.lock")).unwrap();
    let mut programs: Vec<&str> = lock
        .lines()
        .filter(|l| l.starts_with("amd64 "))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .filter(|p| !p.starts_with("lib"))
        .collect();
    programs.sort();
    // bash, jq and coreutils; the rest are what they load (libgcc's and
    // OpenSSL's data packages, zlib).
    assert_eq!(
        programs,
        [
            "bash",
            "coreutils",
            "gcc-14-base",
            "jq",
            "openssl-provider-legacy",
            "zlib1g"
        ]
    );
    let build = fs::read_to_string(root.join("deploy/updater/build")).unwrap();
    assert!(build.contains("command=\"/usr/local/bin/drover-bottlerocket-update\""));
    assert_eq!(
        BOTTLEROCKET_COMMAND,
        "/usr/local/bin/drover-bottlerocket-update"
    );
    assert!(build.contains(&format!(
        "repository=\"${{1:-{}}}\"",
        TEST_UPDATER_IMAGE.split('@').next().unwrap()
    )));

    if cfg!(target_arch = "x86_64") {
        let tmp = tempfile::tempdir().unwrap();
        let image = built_image_root(tmp.path());
        let libs = image.join("usr/lib/x86_64-linux-gnu");
        let loader = libs.join("ld-linux-x86-64.so.2");
        // Each tool the script starts, from the image.
        let tools = tmp.path().join("tools");
        fs::create_dir_all(&tools).unwrap();
        for tool in [
            "jq", "date", "sleep", "mktemp", "rm", "touch", "cat", "cp", "mv", "seq",
        ] {
            let shim = tools.join(tool);
            fs::write(
                &shim,
                format!(
                    "#!/bin/sh\nexec {} --library-path {} {} \"$@\"\n",
                    loader.display(),
                    libs.display(),
                    image.join("usr/bin").join(tool).display()
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap();
        }
        // The Job's command, run by the image's bash, the image's tools
        // first on PATH (then the stand-in apiclient).
        let driver = tmp.path().join("driver");
        fs::write(
            &driver,
            format!(
                "#!/bin/sh\nPATH={}:$PATH exec {} --library-path {} {} {}\n",
                tools.display(),
                loader.display(),
                libs.display(),
                image.join("usr/bin/bash").display(),
                image
                    .join(BOTTLEROCKET_COMMAND.trim_start_matches('/'))
                    .display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&driver, fs::Permissions::from_mode(0o755)).unwrap();
        let in_image = fs::read(image.join(BOTTLEROCKET_COMMAND.trim_start_matches('/'))).unwrap();
        assert!(
            in_image == fs::read(script_path()).unwrap(),
            "the image's driver is the script"
        );
        let driver: &'static Path = Box::leak(driver.into_boxed_path());
        let dir = tempfile::tempdir().unwrap();
        let api = BottlerocketApi::start(dir.path(), Scenario::new("1.22.0", &["1.22.3"]));
        let o = run(Script::Exec(driver), &api, dir.path(), "1.22.3", UNIT);
        assert_upgraded(&o, &api, "1.22.3", 0);
    }

    // Every program the script starts is in those packages or is the
    // host's apiclient; no text tool the image lacks.
    let script = script_text();
    assert!(script.starts_with("#!/bin/bash\n"), "run by its shebang");
    for word in [
        "jq ",
        "date ",
        "sleep ",
        "mktemp",
        "rm -f",
        "touch ",
        "cat ",
        "seq ",
        "apiclient -m",
    ] {
        assert!(script.contains(word), "{word}");
    }
    let words: Vec<&str> = script
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    for absent in ["sed", "awk", "grep", "curl", "python", "perl"] {
        assert!(!words.contains(&absent), "the script uses {absent}");
    }
    // `raw` did not exist before 1.0.3 (the default subcommand since).
    for absent in [
        "apiclient raw",
        "apiclient get",
        "apiclient set",
        "apiclient update",
    ] {
        assert!(!script.contains(absent), "the script uses {absent}");
    }
    assert!(script.contains("set -euo pipefail"));
}

// --- Downloading before the drain: DROVER_ACTION=prepare ---

#[test]
fn a_prepare_stages_the_target_in_service_and_the_upgrade_after_the_drain_does_not_download_it_again(
) {
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), Scenario::new("1.22.0", &["1.22.1", "1.22.3"]));

    let (code, output) = prepare(&api, dir.path(), "1.22.1");
    assert_eq!(code, 0, "{output}\n{:#?}", api.requests());
    assert_eq!(
        api.update_state(),
        ("Staged".into(), false),
        "staged, not activated"
    );
    assert_eq!(api.staged(), vec![v("1.22.1")], "the target written once");
    assert_eq!(api.reboot_requests(), 0, "no reboot while the node serves");
    assert_eq!(api.running(), v("1.22.0"));

    // The upgrade Job after the drain: activate and reboot, no second download.
    let o = run(Script::New, &api, dir.path(), "1.22.1", UNIT);
    // Written once in all: by the prepare.
    assert_upgraded(&o, &api, "1.22.1", 0);
    let prepares = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST /actions/prepare-update"))
        .count();
    assert_eq!(
        prepares,
        1,
        "downloaded before the drain only: {:#?}",
        api.requests()
    );
    assert!(o.output.contains("staged already"), "{}", o.output);
}

#[test]
fn a_prepare_for_a_target_the_repository_lacks_fails_with_the_reason_and_stages_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), Scenario::new("1.22.0", &["1.22.1"]));

    let (code, output) = prepare(&api, dir.path(), "1.22.5");
    assert_eq!(code, 1, "{output}");
    assert!(
        output.contains("1.22.5 is not offered to this node (offered: 1.22.1)"),
        "the reason names what the repository offers: {output}"
    );
    assert!(api.staged().is_empty(), "nothing downloaded");
    assert_eq!(api.reboot_requests(), 0);
    assert_eq!(api.running(), v("1.22.0"));
}

#[test]
fn a_staged_image_of_another_version_is_downloaded_over_by_the_upgrade() {
    // Control: only the target staged is taken as prepared.
    let dir = tempfile::tempdir().unwrap();
    let api = BottlerocketApi::start(dir.path(), Scenario::new("1.22.0", &["1.22.1", "1.22.3"]));
    let (code, output) = prepare(&api, dir.path(), "1.22.3");
    assert_eq!(code, 0, "{output}");

    let o = run(Script::New, &api, dir.path(), "1.22.1", UNIT);
    assert_upgraded(&o, &api, "1.22.1", 1);
    assert!(!o.output.contains("staged already"), "{}", o.output);
}

#[test]
fn the_prepare_job_says_prepare_and_is_never_taken_for_the_upgrade_of_the_same_instant() {
    let upgrade = bottlerocket_job();
    let mut p = NodeProgress {
        state: ProgressState::Preparing,
        target: v("1.20.3"),
        started_at: "2026-12-01T02:00:00Z".parse().unwrap(),
        cordoned_by_drover: false,
        message: String::new(),
        retries: 0,
        previous: None,
    };
    let prepare = job_for(p.clone());
    assert_eq!(job_env(&prepare)["DROVER_ACTION"], "prepare");
    assert_eq!(
        prepare["metadata"]["annotations"]["drover.dev/action"],
        "prepare"
    );
    assert_ne!(
        prepare["metadata"]["name"], upgrade["metadata"]["name"],
        "a prepare and a drain may share an instant; their Jobs never share a name"
    );
    // The same command and mounts as the upgrade: the admission policy's pin holds.
    assert_eq!(
        prepare["spec"]["template"]["spec"]["containers"][0]["command"],
        upgrade["spec"]["template"]["spec"]["containers"][0]["command"]
    );
    p.state = ProgressState::Upgrading;
    assert_eq!(job_for(p)["metadata"]["name"], upgrade["metadata"]["name"]);
}

/// The root filesystem of the updater image's amd64 layer, built as the
/// release builds it (into `dir`).
fn built_image_root(dir: &Path) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tools = std::process::Command::new(root.join("tests/release/build"))
        .output()
        .unwrap();
    assert!(
        tools.status.success(),
        "{}",
        String::from_utf8_lossy(&tools.stderr)
    );
    let layout = dir.join("layout");
    let built = std::process::Command::new(root.join("deploy/updater/build"))
        .arg("-o")
        .arg(&layout)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let blob = |d: &str| {
        layout
            .join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let read = |d: &str| -> Value { serde_json::from_slice(&fs::read(blob(d)).unwrap()).unwrap() };
    let top: Value = serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let index = read(top["manifests"][0]["digest"].as_str().unwrap());
    let amd64 = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["platform"]["architecture"] == "amd64")
        .unwrap();
    let manifest = read(amd64["digest"].as_str().unwrap());
    let layer = blob(manifest["layers"][0]["digest"].as_str().unwrap());
    let rootfs = dir.join("rootfs");
    fs::create_dir_all(&rootfs).unwrap();
    let ok = std::process::Command::new("tar")
        .args(["-x", "-z", "-f"])
        .arg(&layer)
        .arg("-C")
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(ok.success());
    rootfs
}
