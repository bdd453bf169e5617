//! `drover log`: version changes with signers, PR numbers and confirmations.

use crate::support::cli::drover;
use crate::support::git::*;
use drover::rollout::RolloutState;
use drover::source::{Source, SourceConfig};
use drover::status::{self, PublishOptions, StatusReport};

#[test]
fn log_lists_changes_newest_first_with_signers_and_confirmations() {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let root = work.head();
    // stage-1's agent signs its reports with its own key, listed as report signer.
    let agent_key = keygen(tmp.path(), "stage-1");
    let toml = std::fs::read_to_string(work.dir.join("drover.toml")).unwrap();
    std::fs::write(
        work.dir.join("drover.toml"),
        toml.replace(
            "[promotion]\n",
            "[promotion]\nreport_signers = \"agents.allowed_signers\"\n",
        ),
    )
    .unwrap();
    allowed_signers(
        &work.dir.join("agents.allowed_signers"),
        &[("stage/stage-1", &agent_key)],
    );
    git(&work.dir, &["add", "-A"]);
    git(&work.dir, &["commit", "-qm", "List stage-1's report key"]);
    let key = keygen(tmp.path(), "release");
    let allowed = tmp.path().join("allowed");
    allowed_signers(&allowed, &[("release@example.com", &key)]);
    let c1 = work.bump(
        "test",
        "1.1.0",
        "Merge pull request #11 from team/bump-test",
        Some(&key),
    );
    // A change to another key of the file is not a version change.
    std::fs::write(
        work.dir.join("environments/stage.toml"),
        "version = \"1.0.0\"\n# comment\n",
    )
    .unwrap();
    git(&work.dir, &["commit", "-qam", "Reword stage"]);
    let c2 = work.bump("stage", "1.1.0", "Bump stage to 1.1.0 (#12)", None);

    // A confirmation of stage 1.1.0, published to a served copy and fetched back.
    let base = tmp.path().join("served");
    std::fs::create_dir_all(&base).unwrap();
    let bare = bare_clone(&work.dir, &base, "config");
    let src = Source::open(SourceConfig::new(
        format!("file://{}", bare.display()),
        tmp.path().join("cache"),
    ))
    .unwrap();
    let report = StatusReport {
        env: "stage".into(),
        cluster: "stage-1".into(),
        config_commit: c2.clone(),
        version: "1.1.0".parse().unwrap(),
        state: RolloutState::Confirmed,
        since: "2099-01-01T00:00:00Z".parse().unwrap(),
        nodes: 3,
        nodes_at_version: 3,
        message: String::new(),
        detail: Default::default(),
    };
    let signed = PublishOptions::default()
        .with_signing_key_file(&agent_key)
        .unwrap();
    status::publish(&src, &report, &signed).unwrap();
    // A hand-made, unsigned confirmation of test 1.1.0 is not shown.
    let forged = StatusReport {
        env: "test".into(),
        cluster: "test-1".into(),
        ..report.clone()
    };
    status::publish(&src, &forged, &PublishOptions::default()).unwrap();
    git(
        &work.dir,
        &[
            "fetch",
            "-q",
            bare.to_str().unwrap(),
            "refs/heads/drover/status.d/*:refs/heads/drover/status.d/*",
        ],
    );

    let repo = work.dir.to_str().unwrap();
    let (code, out, err) = drover(&[
        "--repo",
        repo,
        "--format",
        "json",
        "log",
        "--allowed-signers",
        allowed.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let list = v.as_array().unwrap();
    let summary: Vec<(&str, &str, Option<&str>, &str)> = list
        .iter()
        .map(|e| {
            (
                e["env"].as_str().unwrap(),
                e["version"].as_str().unwrap(),
                e["previous"].as_str(),
                e["commit"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("stage", "1.1.0", Some("1.0.0"), c2.as_str()),
            ("test", "1.1.0", Some("1.0.0"), c1.as_str()),
            ("stage", "1.0.0", None, root.as_str()),
            ("test", "1.0.0", None, root.as_str()),
        ]
    );
    assert_eq!(
        (list[0]["pr"].as_u64(), list[1]["pr"].as_u64()),
        (Some(12), Some(11))
    );
    assert_eq!(
        (list[0]["verified"].as_bool(), list[0]["signer"].is_null()),
        (Some(false), true)
    );
    assert_eq!(list[1]["signer"], "release@example.com");
    assert_eq!(list[1]["verified"], true);
    assert_eq!(list[1]["author"], "Test Author <author@example.com>");
    assert!(list[1]["date"].as_str().unwrap().ends_with('Z'));
    assert_eq!(list[0]["confirmations"][0]["cluster"], "stage-1");
    assert_eq!(list[1]["confirmations"].as_array().unwrap().len(), 0);

    let (code, out, _) = drover(&["--repo", repo, "--format", "json", "log", "--env", "test"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(
        v[0]["signer"],
        serde_json::Value::Null,
        "no allowed signers, no signer"
    );

    let (code, out, _) = drover(&["--repo", repo, "log"]);
    assert_eq!(code, 0);
    assert!(
        out.lines().nth(1).unwrap().contains("stage")
            && out.contains("stage-1 2099-01-01T00:00:00Z"),
        "{out}"
    );
}
