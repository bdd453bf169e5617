//! Tests of the config grammar, through its entry points.

use super::load::*;
use super::values::{nearest, parse_duration, parse_version};
use super::*;
use crate::config::WindowSpec;
use chrono_tz::Tz;
use std::time::Duration;

#[test]
fn durations_parse_like_people_write_them() {
    assert_eq!(parse_duration("6h"), Ok(Duration::from_secs(6 * 3600)));
    assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
    assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    for bad in ["", "6", "six hours", "6 h x", "-1h", " 6h"] {
        assert!(parse_duration(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn versions_must_be_exact() {
    assert!(parse_version("1.13.2").is_ok());
    assert!(parse_version("1.13.2-rc.1").is_ok());
    for (bad, why) in [
        ("1.13", "partial"),
        ("^1.2.3", "range"),
        (">=1.2.3", "range"),
        ("1.x", "range"),
        ("latest", "latest"),
        ("01.13.2", "leading zero"),
        ("v1.13.2", "leading `v`"),
        ("", "1.13.2"),
    ] {
        let e = parse_version(bad).expect_err(bad);
        assert!(e.contains(why), "{bad}: {e}");
        assert!(e.contains("such as \"1.13.2\""), "{bad}: {e}");
    }
}

#[test]
fn max_unavailable_resolves_against_the_selected_nodes() {
    assert_eq!(MaxUnavailable::Count(2).resolve(10), 2);
    assert_eq!(MaxUnavailable::Count(5).resolve(3), 5);
    assert_eq!(MaxUnavailable::Percent(10).resolve(100), 10);
    assert_eq!(MaxUnavailable::Percent(10).resolve(15), 1);
    assert_eq!(MaxUnavailable::Percent(10).resolve(5), 1);
    assert_eq!(MaxUnavailable::Percent(100).resolve(7), 7);
    assert_eq!(MaxUnavailable::Percent(50).resolve(0), 1);
}

#[test]
fn an_env_file_with_only_a_version_gets_every_default() {
    let env = parse_env("environments/test.toml", "test", "version = \"1.12.0\"\n")
        .expect("minimal file is valid");
    assert_eq!(env.version, semver::Version::new(1, 12, 0));
    assert!(!env.allow_downgrade);
    assert_eq!(env.windows, vec![WindowSpec::default()]);
    assert_eq!(env.windows[0].schedule, "0 2 1 * *");
    assert_eq!(env.windows[0].duration, Duration::from_secs(6 * 3600));
    assert_eq!(env.windows[0].timezone, Tz::UTC);
    assert!(env.freezes.is_empty());
    assert!(!env.rollout.paused);
    assert_eq!(env.rollout, RolloutSpec::default());
    assert_eq!(env.rollout.max_unavailable, MaxUnavailable::Count(1));
    assert_eq!(env.rollout.drain_timeout, Duration::from_secs(20 * 60));
    assert_eq!(env.rollout.node_timeout, Duration::from_secs(45 * 60));
    assert_eq!(env.rollout.node_selector, "");
    assert_eq!(env.rollout.on_drain_timeout, OnDrainTimeout::Skip);
    assert_eq!(env.promotion.soak, Duration::from_secs(24 * 3600));
    assert_eq!(env.driver, DriverSpec::default());
    assert_eq!(env.nodes, NodesSpec::default());
    assert_eq!(
        env.nodes
            .version_of("Bottlerocket OS 1.13.2 (aws-k8s-1.31)"),
        Some(semver::Version::new(1, 13, 2))
    );
}

#[test]
fn a_root_file_with_only_a_chain_gets_every_default() {
    let root = parse_root("drover.toml", "[promotion]\nchain = [\"prod\"]\n")
        .expect("minimal root is valid");
    assert_eq!(root.chain, vec!["prod".to_owned()]);
    assert_eq!(root.evidence, Evidence::Status);
    assert_eq!(root.status_branch, "drover/status");
    assert!(root.clusters.is_empty());
    assert_eq!(root.progress_interval, Duration::from_secs(600));
}

#[test]
fn the_progress_interval_is_a_duration_of_at_most_a_day() {
    let chain = "[promotion]\nchain = [\"prod\"]\n";
    let root = parse_root(
        "drover.toml",
        &format!("{chain}[status]\nprogress_interval = \"30m\"\n"),
    )
    .expect("valid");
    assert_eq!(root.progress_interval, Duration::from_secs(1800));
    // Zero pushes every change.
    let root = parse_root(
        "drover.toml",
        &format!("{chain}[status]\nprogress_interval = \"0s\"\n"),
    )
    .expect("valid");
    assert_eq!(root.progress_interval, Duration::ZERO);
    for (text, says) in [
        ("progress_interval = \"2d\"", "at most \"24h\""),
        ("progress_interval = 600", "duration"),
        ("progres_interval = \"10m\"", "progress_interval"),
    ] {
        let errs =
            parse_root("drover.toml", &format!("{chain}[status]\n{text}\n")).expect_err(text);
        assert_eq!(errs[0].line, 4, "{text}: {errs:?}");
        assert!(errs[0].message.contains(says), "{text}: {errs:?}");
    }
}

#[test]
fn several_windows_freezes_and_pause_parse() {
    let env = parse_env(
        "environments/x.toml",
        "x",
        "version = \"2.0.0\"\n\
         [[window]]\nschedule = \"0 2 * * 6\"\nduration = \"30h\"\ntimezone = \"Europe/Madrid\"\n\
         [[window]]\nschedule = \"0 1 * * 0\"\n\
         [[freeze]]\nstart = 2026-12-18T00:00:00\nend = 2027-01-04\nreason = \"holidays\"\n\
         [[freeze]]\nstart = 2026-11-01T00:00:00Z\nend = 2026-11-02T00:00:00+01:00\nscope = \"minor\"\n\
         [rollout]\npaused = true\n",
    )
    .expect("valid");
    assert_eq!(env.windows.len(), 2);
    assert_eq!(env.windows[0].duration, Duration::from_secs(30 * 3600));
    assert_eq!(env.windows[1].timezone, Tz::UTC);
    assert!(env.rollout.paused);
    assert_eq!(env.freezes.len(), 2);
    // Local times read in the first window's zone (CET, +01:00).
    assert_eq!(
        env.freezes[0].start.to_rfc3339(),
        "2026-12-17T23:00:00+00:00"
    );
    assert_eq!(env.freezes[0].end.to_rfc3339(), "2027-01-03T23:00:00+00:00");
    assert_eq!(env.freezes[0].scope, crate::config::FreezeScope::All);
    assert_eq!(env.freezes[1].scope, crate::config::FreezeScope::Minor);
    assert_eq!(env.freezes[1].end.to_rfc3339(), "2026-11-01T23:00:00+00:00");
}

#[test]
fn bad_freezes_name_the_line_and_what_is_valid() {
    let errs = parse_env(
        "environments/x.toml",
        "x",
        "version = \"2.0.0\"\n[[freeze]]\nstart = 2026-12-18\nend = 2026-12-01\nscope = \"patch\"\n",
    )
    .expect_err("invalid");
    let text: Vec<String> = errs
        .iter()
        .map(|d| format!("{}: {}", d.line, d.message))
        .collect();
    assert!(
        text.iter()
            .any(|m| m.starts_with("5: ") && m.contains("\"all\" or \"minor\"")),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|m| m.starts_with("4: ") && m.contains("must be after `start`")),
        "{text:?}"
    );
    let errs = parse_env(
        "environments/x.toml",
        "x",
        "version = \"2.0.0\"\n[[freeze]]\nstart = \"tomorrow\"\n",
    )
    .expect_err("invalid");
    assert!(
        errs.iter().any(|d| d.message.contains("requires `end`")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|d| d.line == 3 && d.message.contains("TOML date-time")),
        "{errs:?}"
    );
}

#[test]
fn history_evidence_needs_no_clusters() {
    let root = parse_root(
        "drover.toml",
        "[promotion]\nchain = [\"a\", \"b\"]\nevidence = \"history\"\n",
    )
    .expect("valid");
    assert_eq!(root.evidence, Evidence::History);
    let errs = parse_root("drover.toml", "[promotion]\nchain = [\"a\", \"b\"]\n")
        .expect_err("status evidence needs clusters for `a`");
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].line, errs[0].column), (2, 10));
}

#[test]
fn percentages_and_job_drivers_parse() {
    let env = parse_env(
        "environments/x.toml",
        "x",
        "version = \"2.0.0\"\n[rollout]\nmax_unavailable = \"25%\"\n\
         on_drain_timeout = \"stop\"\n[driver]\nkind = \"job\"\n\
         image = \"example.com/up:1\"\ncommand = [\"/up\", \"--now\"]\n",
    )
    .expect("valid");
    assert_eq!(env.rollout.max_unavailable, MaxUnavailable::Percent(25));
    assert_eq!(env.rollout.on_drain_timeout, OnDrainTimeout::Stop);
    assert_eq!(
        env.driver,
        DriverSpec::Job {
            image: "example.com/up:1".into(),
            command: vec!["/up".into(), "--now".into()],
        }
    );
}

#[test]
fn suggestions_catch_typos_only() {
    assert_eq!(
        nearest("max_unavailabel", ["max_unavailable", "drain_timeout"]),
        Some("max_unavailable")
    );
    assert_eq!(nearest("zzz", ["max_unavailable", "drain_timeout"]), None);
}

#[test]
fn the_bottlerocket_driver_selects_bottlerocket_nodes_unless_told_otherwise() {
    let env = |extra: &str| {
        parse_env(
            "environments/x.toml",
            "x",
            &format!("version = \"1.2.3\"\n{extra}"),
        )
    };
    let bottlerocket = "Bottlerocket OS 1.26.0 (aws-k8s-1.31)";
    let ubuntu = "Ubuntu 22.04.4 LTS";

    let default = env("").expect("valid");
    assert!(default.nodes.selects(bottlerocket));
    assert!(
        !default.nodes.selects(ubuntu),
        "another OS is not the Bottlerocket driver's"
    );
    assert_eq!(default.nodes, NodesSpec::default());

    let every = env("[nodes]\nos_image_regex = \"\"\n").expect("valid");
    assert!(every.nodes.selects(ubuntu) && every.nodes.selects(bottlerocket));
    assert_ne!(
        every.nodes, default.nodes,
        "a change of the key is a change of the config"
    );

    let job =
        env("[driver]\nkind = \"job\"\nimage = \"u:1\"\ncommand = [\"/u\"]\n").expect("valid");
    assert!(
        job.nodes.selects(ubuntu),
        "kind = \"job\" selects every node by default"
    );

    let flatcar = env("[nodes]\nos_image_regex = '^Flatcar'\n[driver]\nkind = \"job\"\nimage = \"u:1\"\ncommand = [\"/u\"]\n")
        .expect("valid");
    assert!(flatcar
        .nodes
        .selects("Flatcar Container Linux by Kinvolk 3975.2.0"));
    assert!(!flatcar.nodes.selects(bottlerocket));

    let errs = env("[nodes]\nos_image_regex = '(Bottlerocket'\n").expect_err("bad regex");
    let text = format!("{errs:?}");
    assert!(
        text.contains("`os_image_regex` must be a valid regular expression"),
        "{text}"
    );
    assert!(errs.iter().any(|d| d.line == 3), "{text}");
    let errs = env("[nodes]\nos_image_regex = 1\n").expect_err("not a string");
    assert!(format!("{errs:?}").contains("os_image_regex"), "{errs:?}");
}

#[test]
fn a_bottlerocket_image_must_be_pinned_by_digest() {
    let env = |image: &str| {
        parse_env(
            "environments/x.toml",
            "x",
            &format!("version = \"1.2.3\"\n[driver]\nimage = \"{image}\"\n"),
        )
    };
    let digest = "a".repeat(64);
    assert!(env(&format!("mirror.example.com/updater@sha256:{digest}")).is_ok());
    for bad in [
        "ghcr.io/drover-dev/bottlerocket-updater:v0.1.0".to_string(),
        format!("ghcr.io/x@sha256:{}", &digest[1..]),
        format!("ghcr.io/x@sha256:{}", "A".repeat(64)),
        format!("@sha256:{digest}"),
    ] {
        let errs = env(&bad).expect_err(&bad);
        assert!(
            format!("{errs:?}").contains("must be pinned by digest"),
            "{bad}: {errs:?}"
        );
    }
    // The all-zero digest names no image: refused, naming the key and line.
    let zero = format!(
        "ghcr.io/drover-dev/bottlerocket-updater@sha256:{}",
        "0".repeat(64)
    );
    let errs = env(&zero).expect_err("a placeholder");
    let text = format!("{errs:?}");
    assert!(
        text.contains("names the all-zero placeholder digest"),
        "{text}"
    );
    assert!(errs.iter().any(|d| d.line == 3), "{text}");
}

#[test]
fn a_bottlerocket_driver_without_an_image_names_the_setting() {
    // What a build without an updater image of its own (not a release, no
    // test hooks) parses a file without `[driver] image` into.
    let none = DriverSpec::Bottlerocket { image: None };
    let why = none.updater_image().expect_err("no image");
    assert!(
        why.contains("[driver] image = \"REPOSITORY@sha256:<digest>\""),
        "{why}"
    );
    assert!(why.contains("drover --version"), "{why}");
    // Control: an image configured, or the job driver's own.
    let some = DriverSpec::Bottlerocket {
        image: Some(TEST_UPDATER_IMAGE.into()),
    };
    assert_eq!(some.updater_image(), Ok(TEST_UPDATER_IMAGE));
    // This build (the tests', with their hooks) defaults to the test image;
    // a release build to the one it was given (build.rs).
    let parsed = parse_env("environments/x.toml", "x", "version = \"1.2.3\"\n").unwrap();
    assert_eq!(parsed.driver.updater_image(), Ok(TEST_UPDATER_IMAGE));
    assert!(!TEST_UPDATER_IMAGE.ends_with(&"0".repeat(64)));
}

#[test]
fn waves_parse_resolve_and_give_their_clusters_their_own_window() {
    let env = parse_env(
        "environments/production.toml",
        "production",
        r#"
version = "1.13.2"
[window]
schedule = "0 2 20 * *"
timezone = "Europe/Madrid"
[rollout]
failure_budget = 1
[[wave]]
clusters = ["prod-eu-*"]
soak = "24h"
[[wave]]
clusters = ["prod-us-1", "prod-us-?"]
schedule = "0 2 21 * *"
duration = "4h"
timezone = "America/New_York"
max_concurrency = 1
"#,
    )
    .expect("valid");
    assert_eq!(env.rollout.failure_budget, 1);
    assert_eq!(env.waves.len(), 2);
    assert_eq!(env.waves[0].soak, Duration::from_secs(24 * 3600));
    assert_eq!(env.waves[0].window, None);
    assert_eq!(env.waves[1].max_concurrency, Some(1));
    assert_eq!(env.waves[1].soak, DEFAULT_WAVE_SOAK);
    assert_eq!(env.wave_of("prod-eu-7"), Some(0));
    assert_eq!(env.wave_of("prod-us-2"), Some(1));
    assert_eq!(env.wave_of("prod-us-10"), None);
    // A wave's own window replaces the environment's for its clusters only.
    let us = env.for_cluster("prod-us-2");
    assert_eq!(us.windows.len(), 1);
    assert_eq!(us.windows[0].timezone, Tz::America__New_York);
    assert_eq!(us.windows[0].duration, Duration::from_secs(4 * 3600));
    assert_eq!(env.for_cluster("prod-eu-1").windows, env.windows);
    let mut cfg = RepoConfig {
        root: parse_root("drover.toml", "[promotion]\nchain = [\"production\"]\n").expect("root"),
        envs: [("production".to_owned(), env)].into(),
    };
    cfg.root.clusters.insert(
        "production".into(),
        vec!["prod-us-1".into(), "prod-eu-1".into(), "prod-us-2".into()],
    );
    assert_eq!(
        cfg.waves("production"),
        vec![
            vec!["prod-eu-1".to_owned()],
            vec!["prod-us-1".to_owned(), "prod-us-2".to_owned()]
        ]
    );
    assert!(pattern_matches("prod-*", "prod-eu-1"));
    assert!(!pattern_matches("prod-?", "prod-eu"));
    assert!(!pattern_matches("eu", "prod-eu"));
}

#[test]
fn on_failure_and_max_rollbacks_parse_with_their_defaults() {
    let env = parse_env("environments/x.toml", "x", "version = \"2.0.0\"\n").expect("valid");
    assert_eq!(env.rollout.on_failure, OnFailure::Halt);
    assert_eq!(env.rollout.max_rollbacks, 1);
    let env = parse_env(
        "environments/x.toml",
        "x",
        "version = \"2.0.0\"\n[rollout]\non_failure = \"rollback\"\nmax_rollbacks = 3\n\
         [health]\npod_ready_timeout = \"5m\"\n",
    )
    .expect("valid");
    assert_eq!(env.rollout.on_failure, OnFailure::Rollback);
    assert_eq!(env.rollout.max_rollbacks, 3);
}

#[test]
fn bad_rollback_keys_are_refused_at_their_line_saying_what_is_valid() {
    let cases = [
        (
            "version = \"2.0.0\"\n[rollout]\non_failure = \"rollbak\"\n[health]\n",
            3,
            "`on_failure` must be \"halt\" or \"rollback\"; found \"rollbak\"; did you mean \"rollback\"?",
        ),
        (
            "version = \"2.0.0\"\n[rollout]\n\nmax_rollbacks = -1\n[health]\n",
            4,
            "`max_rollbacks` must be a whole number from 0 to 1000",
        ),
        (
            "version = \"2.0.0\"\n[rollout]\nmax_rollbacks = \"1\"\n",
            3,
            "max_rollbacks",
        ),
        (
            "version = \"2.0.0\"\n[rollout]\non_failure = \"rollback\"\n",
            3,
            "needs a [health] section",
        ),
    ];
    for (text, line, says) in cases {
        let errs = parse_env("environments/x.toml", "x", text).expect_err(text);
        assert!(
            errs.iter().any(|d| d.file == "environments/x.toml"
                && d.line == line
                && d.message.contains(says)),
            "{text}: {errs:?}"
        );
    }
}

#[test]
fn prepare_is_on_for_bottlerocket_opt_in_for_jobs_and_prestage_is_a_duration() {
    let env = |extra: &str| {
        parse_env(
            "environments/x.toml",
            "x",
            &format!("version = \"1.2.3\"\n{extra}"),
        )
    };
    let bottlerocket = env("").expect("valid").prepare;
    assert!(bottlerocket.enabled);
    assert_eq!(
        bottlerocket.prestage,
        Duration::ZERO,
        "downloads in the window only"
    );
    let job = "[driver]\nkind = \"job\"\nimage = \"example.com/up:1\"\ncommand = [\"/up\"]\n";
    assert!(
        !env(job).expect("valid").prepare.enabled,
        "a Job driver opts in"
    );
    let opted = env(&format!("{job}prepare = true\nprestage = \"2h\"\n")).expect("valid");
    assert!(opted.prepare.enabled);
    assert_eq!(opted.prepare.prestage, Duration::from_secs(7200));
    assert!(
        !env("[driver]\nprepare = false\n")
            .expect("valid")
            .prepare
            .enabled
    );

    let errs = env("[driver]\nprepare = \"yes\"\nprestage = \"soon\"\n").expect_err("invalid");
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert_eq!(errs[0].line, 3);
    assert!(errs[0].message.contains("a boolean"), "{}", errs[0].message);
    assert_eq!(errs[1].line, 4);
    assert!(
        errs[1].message.contains("`prestage` must be"),
        "{}",
        errs[1].message
    );
}
