//! Where the agent's trust starts (docs/design.md §6, one bootstrap rule),
//! against the real API server:
//!
//! - a repository made by `drover init`, its first commit unsigned (as a
//!   forge's first push) and a signed merge on top: followed as `drover
//!   init` and docs/install.md print it, the agent on its default settings
//!   (`verify = "all"`) refuses the unsigned history, saying which commit to
//!   name; named, it adopts, confirms, and removes the annotation;
//! - a stale annotation naming an old commit (one pinning a version the head
//!   revokes, below what the nodes run) is ignored, with a Warning Event and
//!   removed, once the agent has a signed report of its own; and (the
//!   control) without one, the named commit is judged by the head's policy
//!   and refused, nothing moved.

use std::sync::Arc;

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim, POOL_LABEL};
use crate::support::cli::drover_command;
use crate::support::git::{allowed_signers, commit_file_on, git, keygen, GitDaemon};
use crate::support::kube::{events_for, ControlPlane, TestNamespace};
use drover::agent::crd::{DroverStatus, DroverStatusSpec};
use drover::rollout::VirtualClock;
use kube::api::{Api, Patch, PatchParams, PostParams};

const ANNOTATION: &str = "drover.dev/trust-commit";

/// Set `key=value` on the DroverStatus `name`, as `kubectl annotate` does.
async fn annotate(client: &kube::Client, ns: &str, name: &str, value: &str) {
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: value } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn annotation(client: &kube::Client, ns: &str, name: &str) -> Option<String> {
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns);
    api.get(name)
        .await
        .unwrap()
        .metadata
        .annotations
        .and_then(|a| a.get(ANNOTATION).cloned())
}

#[tokio::test]
async fn a_repository_made_by_drover_init_with_an_unsigned_first_commit_is_adopted_once_named() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "init").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("config");
    // drover init, as its docs say; one environment.
    let out = drover_command()
        .args(["init"])
        .arg(&work)
        .args(["--version", "1.12.0", "--envs", "test"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    // Its step 2: the cluster's report key, listed as the file says.
    let report_key = keygen(tmp.path(), "report-test-1");
    let signers_file = work.join("agents.allowed_signers");
    let header = std::fs::read_to_string(&signers_file).unwrap();
    allowed_signers(&tmp.path().join("line"), &[("test/test-1", &report_key)]);
    let line = std::fs::read_to_string(tmp.path().join("line")).unwrap();
    std::fs::write(&signers_file, format!("{header}{line}")).unwrap();
    // Step 4, as a forge's first push makes it: unsigned.
    git(&work, &["add", "-A"]);
    git(
        &work,
        &["commit", "-q", "-m", "Start the config repository"],
    );
    let root = git(&work, &["rev-parse", "HEAD"]);
    let served = tmp.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    git(
        &served,
        &["init", "-q", "--bare", "-b", "main", "config.git"],
    );
    let bare = served.join("config.git");
    git(&work, &["remote", "add", "origin", bare.to_str().unwrap()]);
    git(&work, &["push", "-q", "origin", "main"]);
    // Step 3: signing set up; a reviewed change (the clusters' nodes, the
    // test pool here) on a branch, merged with a signed merge.
    let reviewer = keygen(tmp.path(), "reviewer");
    let sk = format!("user.signingkey={}", reviewer.display());
    let sign = |args: &[&str]| {
        let mut all = vec!["-c", sk.as_str(), "-c", "commit.gpgsign=true"];
        all.extend_from_slice(args);
        git(&work, &all)
    };
    git(&work, &["checkout", "-q", "-b", "pool"]);
    let env = work.join("environments/test.toml");
    let text = std::fs::read_to_string(&env).unwrap();
    std::fs::write(
        &env,
        format!(
            "{text}\n[rollout]\nnode_selector = \"{POOL_LABEL}={}\"\n",
            ns.name()
        ),
    )
    .unwrap();
    git(&work, &["add", "-A"]);
    sign(&["commit", "-q", "-m", "test: the clusters' nodes"]);
    git(&work, &["checkout", "-q", "main"]);
    sign(&[
        "merge",
        "-q",
        "--no-ff",
        "-m",
        "Merge pull request #1",
        "pool",
    ]);
    git(&work, &["push", "-q", "origin", "main"]);
    let head = git(&work, &["rev-parse", "HEAD"]);
    assert_ne!(head, root);

    // The agent on its defaults (verify = all), the reviewer's key listed.
    let daemon = GitDaemon::start(&served);
    let signers = tmp.path().join("allowed_signers");
    allowed_signers(&signers, &[("reviewer@example.com", &reviewer)]);
    let mut cfg = drover::agent::AgentConfig::new(
        "test",
        "test-1",
        &daemon.url("config"),
        tmp.path().join("cache"),
    );
    let defaults = cfg.verify;
    assert_eq!(defaults, drover::trust::Mode::All);
    cfg.namespace = ns.name().into();
    cfg.allowed_signers = Some(signers);
    cfg.publish = drover::status::PublishOptions::default()
        .with_signing_key_file(&report_key)
        .unwrap();
    cfg.poll = std::time::Duration::from_millis(2500);
    cfg.tick = std::time::Duration::from_secs(2);
    cfg.lease_duration = std::time::Duration::from_secs(3);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.webhook = Some(drover::source::trigger::WebhookConfig {
        hmac_secret: None,
        token: Some(WEBHOOK_TOKEN.as_bytes().to_vec()),
    });
    let clock = VirtualClock::new(dec(5, 12, 0));
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    // The unsigned first commit is refused, and the refusal says what to do.
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "the history refused",
        |s| s.refused.as_ref().is_some_and(|r| r.stage == "trust"),
    )
    .await
    .status
    .unwrap();
    let r = st.refused.unwrap();
    assert_eq!(r.reason, "unsigned", "{}", r.message);
    assert!(
        r.message.contains(&root[..10]) && r.message.contains(ANNOTATION),
        "{}",
        r.message
    );
    for n in sim.node_names() {
        assert_eq!(sim.upgrades_started(&n), 0, "{n}");
    }
    // Step 5 as printed: annotate the DroverStatus with the reviewed head.
    let step = printed
        .lines()
        .skip_while(|l| !l.contains("kubectl -n drover-system annotate droverstatus"))
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        step.contains(&format!("{ANNOTATION}=$(git rev-parse origin/main)")),
        "{printed}"
    );
    git(&work, &["fetch", "-q", "origin"]);
    let named = git(&work, &["rev-parse", "origin/main"]);
    annotate(&client, ns.name(), "test-test-1", &named).await;
    assert_eq!(agent.webhook().await, 202);
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "adopted and confirmed",
        |s| {
            s.state.as_deref() == Some("confirmed")
                && s.last_applied_commit.as_deref() == Some(head.as_str())
        },
    )
    .await
    .status
    .unwrap();
    assert_eq!(st.at_version.as_deref(), Some("2/2"));
    // Used up: the annotation is removed, and the Events say so.
    crate::support::kube::retry_until("the annotation removed", || async {
        match annotation(&client, ns.name(), "test-test-1").await {
            None => Ok(()),
            Some(v) => Err(v),
        }
    })
    .await;
    let reasons: Vec<String> = events_for(&client, ns.name(), "test-test-1")
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r == "TrustCommitConsumed"),
        "{reasons:?}"
    );
    // From then on every later commit is verified: an unsigned one is refused.
    std::fs::write(work.join("README"), "unsigned\n").unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "pushed past review"]);
    git(&work, &["push", "-q", "origin", "main"]);
    let late = git(&work, &["rev-parse", "HEAD"]);
    assert_eq!(agent.webhook().await, 202);
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "a later unsigned commit",
        |s| s.refused.as_ref().is_some_and(|r| r.commit == late),
    )
    .await
    .status
    .unwrap();
    assert_eq!(st.refused.unwrap().reason, "unsigned");
    assert_eq!(st.last_applied_commit.as_deref(), Some(head.as_str()));
    for n in sim.node_names() {
        assert_eq!(sim.upgrades_started(&n), 0, "{n}");
    }
    agent.stop();
    drop(daemon);
    sim.shutdown().await;
}

/// test at 1.12.0 (the old commit), then at 1.13.0 with 1.12.0 revoked
/// (the head); every commit signed. The nodes run 1.13.0.
fn revoking_repo(pool: &str) -> (ConfigRepo, String, String) {
    let mut spec = EnvSpec::test_pool(pool);
    spec.schedule = "0 2 5 * *".into();
    let repo = ConfigRepo::new(&[spec]);
    let old = git(&repo.work, &["rev-parse", "HEAD"]);
    repo.bump("test", "1.13.0", true);
    let root = std::fs::read_to_string(repo.work.join("drover.toml")).unwrap();
    std::fs::write(
        repo.work.join("drover.toml"),
        root.replace(
            "report_signers = \"agents.allowed_signers\"\n",
            "report_signers = \"agents.allowed_signers\"\nrevoked = [{ version = \"1.12.0\", reason = \"kernel panic\" }]\n",
        ),
    )
    .unwrap();
    let head = repo.commit("revoke 1.12.0", true);
    repo.push();
    (repo, old, head)
}

/// The DroverStatus `name`, made before its agent starts, naming `value`
/// to trust (what a person left there).
async fn object_with_annotation(client: &kube::Client, ns: &str, name: &str, value: &str) {
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns);
    let mut obj = DroverStatus::new(
        name,
        DroverStatusSpec {
            environment: "test".into(),
            cluster: "test-1".into(),
        },
    );
    obj.metadata.annotations = Some([(ANNOTATION.to_owned(), value.to_owned())].into());
    api.create(&PostParams::default(), &obj).await.unwrap();
}

#[tokio::test]
async fn a_stale_trust_annotation_is_ignored_beside_the_agent_s_own_report_and_judged_by_the_head_without_one(
) {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "stale").await;
    let mut opts = pool_options(ns.name(), 1);
    opts.version = "1.13.0".into();
    let sim = start_sim(&client, opts).await;
    // Inside the window: only admission stands between a commit and the nodes.
    let clock = VirtualClock::new(dec(5, 3, 0));
    let untouched = |what: &str| {
        for n in sim.node_names() {
            assert_eq!(sim.upgrades_started(&n), 0, "{what}: {n} touched");
        }
    };

    // The agent's own signed report names the head; a stale annotation names the old commit.
    let (repo, old, head) = revoking_repo(ns.name());
    let own = format!(
        "env = \"test\"\ncluster = \"test-1\"\nconfig_commit = \"{head}\"\nversion = \"1.13.0\"\n\
         state = \"confirmed\"\nsince = 2026-12-04T00:00:00Z\nnodes = 1\nnodes_at_version = 1\nmessage = \"\"\n"
    );
    commit_file_on(
        &repo.bare,
        "drover/status.d/test/test-1",
        "status/test/test-1.toml",
        Some(own.as_bytes()),
        Some(&repo.report_keys["test-1"]),
        "status",
        Some("2026-12-04T00:00:00Z"),
    );
    object_with_annotation(&client, ns.name(), "stale", &old).await;
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "stale");
    cfg.status_name = "stale".into();
    cfg.lease_name = "stale".into();
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    let st = await_status(
        &client,
        ns.name(),
        "stale",
        "recovered from its own report",
        |s| {
            s.last_applied_commit.as_deref() == Some(head.as_str())
                && s.state.as_deref() == Some("confirmed")
        },
    )
    .await
    .status
    .unwrap();
    assert_eq!(st.applied_version.as_deref(), Some("1.13.0"));
    let reasons: Vec<String> = events_for(&client, ns.name(), "stale")
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r == "TrustCommitIgnored"),
        "{reasons:?}"
    );
    assert_eq!(annotation(&client, ns.name(), "stale").await, None);
    untouched("own report beside a stale annotation");
    agent.stop();

    // The control: no report of its own. The old commit, named, is judged by
    // the head's policy: its version is revoked there (and below the nodes').
    let (repo, old, _) = revoking_repo(ns.name());
    object_with_annotation(&client, ns.name(), "named", &old).await;
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "named");
    cfg.status_name = "named".into();
    cfg.lease_name = "named".into();
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    let st = await_status(
        &client,
        ns.name(),
        "named",
        "the named commit refused",
        |s| s.refused.as_ref().is_some_and(|r| r.commit == old),
    )
    .await
    .status
    .unwrap();
    let r = st.refused.unwrap();
    assert_eq!(
        (r.stage.as_str(), r.reason.as_str()),
        ("gate", "revoked"),
        "{}",
        r.message
    );
    assert!(r.message.contains("the head's"), "{}", r.message);
    assert_eq!(st.last_applied_commit, None);
    untouched("a named commit the head revokes");
    agent.stop();
    sim.shutdown().await;
}
