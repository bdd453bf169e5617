//! Key validity in the agent (docs/design.md §6), end to end against a real
//! kube-apiserver and a real git server on loopback: after the signing key
//! is retired (`valid-before` in the past), a commit it signs with a
//! backdated committer date is refused, because the agent first fetched it
//! after the key's retirement; a commit signed while the key is valid is
//! applied (the control).

use std::sync::Arc;

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::git::{commit_all, public_key};
use crate::support::kube::{ControlPlane, TestNamespace};
use chrono::{Duration, Utc};
use drover::rollout::VirtualClock;

/// The reviewer key, with `valid-before` `hours` from now.
fn retire_key(repo: &ConfigRepo, hours: i64) {
    let at = (Utc::now() + Duration::hours(hours)).format("%Y%m%d%H%M%SZ");
    std::fs::write(
        &repo.signers,
        format!(
            "reviewer@example.com namespaces=\"git\",valid-before=\"{at}\" {}\n",
            public_key(&repo.key)
        ),
    )
    .unwrap();
}

/// Pin test to `version` in a commit signed by the reviewer key, committed
/// `days_ago` (the signer chooses the date), and push it.
fn signed_bump_dated(repo: &ConfigRepo, version: &str, days_ago: i64) -> String {
    let path = repo.work.join("environments/test.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("version = \"").unwrap() + "version = \"".len();
    let end = start + text[start..].find('"').unwrap();
    std::fs::write(
        &path,
        format!("{}{version}{}", &text[..start], &text[end..]),
    )
    .unwrap();
    let date = format!(
        "{} +0000",
        (Utc::now() - Duration::days(days_ago)).timestamp()
    );
    let message = format!("test: move to {version}");
    let head = commit_all(&repo.work, &message, Some(&repo.key), Some(&date));
    repo.push();
    head
}

#[tokio::test]
async fn a_backdated_commit_by_a_retired_key_is_refused_and_a_valid_one_applied() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "keyvalid").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let agent = RunningAgent::start(
        agent_config(&repo, "test", "test-1", ns.name(), "agent-a"),
        clock,
        None,
    );
    let applied = await_status(&client, ns.name(), "test-test-1", "initial apply", |s| {
        s.last_applied_commit.is_some()
    })
    .await;
    let first = applied.status.unwrap().last_applied_commit.unwrap();

    // The key is retired an hour ago; its holder signs a commit dated two
    // days back, when the key was still valid by the committer date alone.
    retire_key(&repo, -1);
    let forged = signed_bump_dated(&repo, "1.13.0", 2);
    agent.webhook().await;
    let refused = await_status(&client, ns.name(), "test-test-1", "refused", |s| {
        s.refused.as_ref().is_some_and(|r| r.commit == forged)
    })
    .await;
    let st = refused.status.unwrap();
    let r = st.refused.unwrap();
    assert_eq!(
        (r.stage.as_str(), r.reason.as_str()),
        ("trust", "expired_key")
    );
    assert!(r.message.contains("first seen"), "{}", r.message);
    assert_eq!(st.last_applied_commit.as_deref(), Some(first.as_str()));

    // Control: with the key valid again (a later valid-before), a commit it
    // signs now is applied, the earlier one included in the check.
    retire_key(&repo, 24);
    let valid = signed_bump_dated(&repo, "1.13.1", 0);
    agent.webhook().await;
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "valid commit applied",
        |s| s.last_applied_commit.as_deref() == Some(valid.as_str()),
    )
    .await
    .status
    .unwrap();
    assert_eq!(st.refused, None);
    agent.stop();
    sim.shutdown().await;
}
