//! `revoked` refuses in the agent (docs/design.md §4), end to end: a person
//! runs `drover revoke` in the config repository with git set to sign, the
//! commit is merged and pushed, the agent applies the policy change; then a
//! bump to the revoked version is refused with the reason and touches no
//! node, while a bump to another version (the control) rolls out. Against
//! the real API server, simulated kubelet nodes and a real git server.

use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::git::git;
use crate::support::kube::{await_node, ControlPlane, TestNamespace};
use drover::cluster::ANN_STATE;
use drover::rollout::VirtualClock;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::ResourceExt;

#[tokio::test]
async fn a_bump_to_a_version_revoked_with_drover_revoke_is_refused_by_the_agent() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "revoked-agent").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let agent = RunningAgent::start(cfg, clock, None);
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "confirmed at 1.12.0",
        |s| s.state.as_deref() == Some("confirmed"),
    )
    .await;

    let revocation = revoke(&repo, "1.13.1", "kernel panic on m7i");
    assert_eq!(agent.webhook().await, 202);
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "revocation applied",
        |s| s.last_applied_commit.as_deref() == Some(revocation.as_str()),
    )
    .await;

    // Control: another version still rolls out under the new policy.
    repo.bump("test", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "confirmed at 1.13.0",
        |s| s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some("1.13.0"),
    )
    .await;
    assert_eq!(sim.version(&node).as_deref(), Some("1.13.0"));
    assert_eq!(sim.upgrades_started(&node), 1);

    // The revoked version: refused by the gate, with the reason; no node touched.
    let bump = repo.bump("test", "1.13.1", true);
    assert_eq!(agent.webhook().await, 202);
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "refused as revoked",
        |s| s.refused.as_ref().is_some_and(|r| r.commit == bump),
    )
    .await;
    let st = st.status.unwrap();
    let refused = st.refused.unwrap();
    assert_eq!(
        (refused.stage.as_str(), refused.reason.as_str()),
        ("gate", "revoked")
    );
    assert!(
        refused.message.contains("kernel panic on m7i"),
        "{}",
        refused.message
    );
    assert_eq!(
        st.last_applied_commit.as_deref(),
        Some(git(&repo.work, &["rev-parse", "HEAD~1"]).as_str()),
        "the 1.13.0 commit stays applied"
    );
    assert_eq!(st.target.as_deref(), Some("1.13.0"));
    let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert!(
        !n.annotations().contains_key(ANN_STATE),
        "no node started: {:?}",
        n.metadata.annotations
    );
    assert_eq!(sim.upgrades_started(&node), 1, "no second upgrade");
    // Still Ready and schedulable at 1.13.0.
    await_node(&client, &node, "Ready at 1.13.0", |n| {
        crate::support::kube::node_ready(n) == Some("True")
            && crate::support::kube::os_image(n).contains("1.13.0")
            && !n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
    })
    .await;
    agent.stop();
    sim.shutdown().await;
}

/// A version revoked after it was pinned: the agent starts no node, says
/// why, and keeps the nodes as they are, although the window opens.
#[tokio::test]
async fn a_pinned_version_revoked_afterwards_starts_no_further_node() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "revoked-pinned").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    // Before the window (02:00-08:00 on the 1st).
    let clock = Arc::new(VirtualClock::new(dec(1, 1, 0)));
    let shared: drover::agent::SharedClock = clock.clone();
    let agent = RunningAgent::start(cfg, shared, None);
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "confirmed at 1.12.0",
        |s| s.state.as_deref() == Some("confirmed"),
    )
    .await;
    repo.bump("test", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
    await_status(&client, ns.name(), "test-test-1", "1.13.0 pending", |s| {
        s.state.as_deref() == Some("pending") && s.target.as_deref() == Some("1.13.0")
    })
    .await;

    let revocation = revoke(&repo, "1.13.0", "breaks the CNI");
    assert_eq!(agent.webhook().await, 202);
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "revocation applied",
        |s| s.last_applied_commit.as_deref() == Some(revocation.as_str()),
    )
    .await;

    // The window opens: held, naming the revocation and its reason.
    clock.set(dec(1, 2, 0));
    let st = await_status(&client, ns.name(), "test-test-1", "held as revoked", |s| {
        s.state.as_deref() == Some("paused")
            && s.message.contains("1.13.0 is revoked: breaks the CNI")
    })
    .await;
    assert_eq!(st.status.unwrap().target.as_deref(), Some("1.13.0"));
    let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert!(
        !n.annotations().contains_key(ANN_STATE),
        "no node started: {:?}",
        n.metadata.annotations
    );
    assert_eq!(sim.upgrades_started(&node), 0);
    assert_eq!(sim.version(&node).as_deref(), Some("1.12.0"));
    agent.stop();
    sim.shutdown().await;
}

/// A release engineer runs `drover revoke` with git set to sign (as a
/// reviewed merge is signed), merges the branch and pushes; the merge commit.
fn revoke(repo: &ConfigRepo, version: &str, reason: &str) -> String {
    let w = &repo.work;
    for (k, v) in [
        ("user.name", "Release Engineer"),
        ("user.email", "re@example.com"),
        ("gpg.format", "ssh"),
        ("user.signingkey", repo.key.to_str().unwrap()),
        ("commit.gpgsign", "true"),
    ] {
        git(w, &["config", k, v]);
    }
    let out = crate::support::cli::drover_command()
        .arg("--repo")
        .arg(w)
        .args(["revoke", version, "--reason", reason])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    git(w, &["switch", "-q", "main"]);
    git(
        w,
        &[
            "merge",
            "-q",
            "--ff-only",
            &format!("drover/revoke-{version}"),
        ],
    );
    let head = git(w, &["rev-parse", "HEAD"]);
    repo.push();
    head
}
