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
use drover::rollout::VirtualClock;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

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
    let p = crate::support::backend::progress_of(&client, ns.name(), &node).await;
    assert!(
        p.is_none() && !crate::support::kube::unschedulable(&n),
        "no node started: {p:?}"
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
    let (notify, notified) = crate::support::notify::notified().await;
    cfg.notify = notify;
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

    // The window opens: revoked (not `paused`), naming the reason.
    clock.set(dec(1, 2, 0));
    let st = await_status(&client, ns.name(), "test-test-1", "held as revoked", |s| {
        s.state.as_deref() == Some("revoked")
            && s.message.contains("1.13.0 is revoked: breaks the CNI")
    })
    .await;
    assert_eq!(st.status.unwrap().target.as_deref(), Some("1.13.0"));
    // Whoever listens is told, from the agent's own transition.
    notified.kind(Duration::from_secs(30), "revoked").await;
    let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    let p = crate::support::backend::progress_of(&client, ns.name(), &node).await;
    assert!(
        p.is_none() && !crate::support::kube::unschedulable(&n),
        "no node started: {p:?}"
    );
    assert_eq!(sim.upgrades_started(&node), 0);
    assert_eq!(sim.version(&node).as_deref(), Some("1.12.0"));
    agent.stop();
    sim.shutdown().await;
}

/// One state, told alike (`drover::agent::told`): the metric, the
/// DroverStatus (state, message, `Stalled`), the Event of its transition
/// and the report pushed to the status branch say the same, for a refused
/// head (a downgrade; then the documented way out, a reviewed revert) and
/// for a version revoked mid-rollout (one node moved, the other held
/// draining by a PodDisruptionBudget when the revocation lands).
#[tokio::test]
async fn a_refused_head_and_a_version_revoked_mid_rollout_are_told_alike_everywhere() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "revoked-told").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    // Inside the window (02:00-08:00 on the 1st); the clock stands still,
    // so the held drain never times out into `blocked`.
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let agent = RunningAgent::start(cfg, clock, None);
    await_status(&client, ns.name(), "test-test-1", "confirmed", |s| {
        s.state.as_deref() == Some("confirmed")
    })
    .await;

    // A refused head: while it is refused the state says so, not `confirmed`.
    let downgrade = repo.bump("test", "1.11.0", true);
    assert_eq!(agent.webhook().await, 202);
    await_status(&client, ns.name(), "test-test-1", "refused", |s| {
        s.state.as_deref() == Some("refused")
            && s.refused.as_ref().is_some_and(|r| r.commit == downgrade)
    })
    .await;
    let (st, report) = told_alike(&agent, &client, &repo, ns.name(), "refused").await;
    assert!(
        st.message.starts_with(&format!(
            "commit {} refused (gate check, downgrade): ",
            &downgrade[..12]
        )) && st
            .message
            .ends_with("; stays on 1.12.0 (confirmed 2/2 nodes)"),
        "{}",
        st.message
    );
    assert_eq!(report.version.to_string(), "1.11.0", "the refused version");
    assert_eq!(stalled(&st), Some(("True", "RefusedByGate")));

    // The way out (docs/install.md): a reviewed revert of the refused edit.
    git(&repo.work, &["revert", "--no-commit", "HEAD"]);
    let revert = repo.commit("revert the downgrade", true);
    repo.push();
    assert_eq!(agent.webhook().await, 202);
    await_status(&client, ns.name(), "test-test-1", "out of refused", |s| {
        s.last_applied_commit.as_deref() == Some(revert.as_str())
            && s.state.as_deref() == Some("confirmed")
            && s.refused.is_none()
    })
    .await;

    // Revoked mid-rollout: the first node moves, the second's drain is held.
    crate::support::kube::pod_held_by_a_pdb(&client, ns.name(), &nodes[1]).await;
    repo.bump("test", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
    await_status(&client, ns.name(), "test-test-1", "1 of 2 moved", |s| {
        s.target.as_deref() == Some("1.13.0")
            && s.state.as_deref() == Some("rolling")
            && s.nodes_at_version == 1
    })
    .await;
    revoke(&repo, "1.13.0", "breaks the CNI");
    assert_eq!(agent.webhook().await, 202);
    await_status(&client, ns.name(), "test-test-1", "revoked", |s| {
        s.state.as_deref() == Some("revoked")
    })
    .await;
    let (st, report) = told_alike(&agent, &client, &repo, ns.name(), "revoked").await;
    assert!(
        st.message
            .starts_with("1.13.0 is revoked: breaks the CNI; 1/2 nodes run it"),
        "{}",
        st.message
    );
    assert_eq!(report.version.to_string(), "1.13.0");
    assert_eq!(report.nodes_at_version, 1);
    assert_eq!(stalled(&st), Some(("True", "Revoked")));
    assert_eq!(sim.version(&nodes[0]).as_deref(), Some("1.13.0"));
    assert_eq!(sim.upgrades_started(&nodes[1]), 0, "no further node starts");
    agent.stop();
    sim.shutdown().await;
}

/// The `Stalled` condition's status and reason.
fn stalled(st: &drover::agent::crd::DroverStatusStatus) -> Option<(&str, &str)> {
    st.conditions
        .iter()
        .find(|c| c.kind == "Stalled")
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// The status object in `state`, and the report pushed for it: the metric
/// reads `state` alone, the status's conditions carry its message, an
/// Event `Rollout<State>` tells it and the report on the status branch
/// has the same state and message.
async fn told_alike(
    agent: &RunningAgent,
    client: &kube::Client,
    repo: &ConfigRepo,
    ns: &str,
    state: &str,
) -> (
    drover::agent::crd::DroverStatusStatus,
    drover::status::StatusReport,
) {
    let st = crate::agent_evidence::status_of(client, ns, "test-test-1").await;
    assert_eq!(st.state.as_deref(), Some(state));
    assert!(!st.message.is_empty());
    assert!(
        st.conditions
            .iter()
            .all(|c| c.kind == "ReportPushed" || c.message.contains(&st.message)),
        "{:#?}",
        st.conditions
    );
    until_pass(
        &agent.handle,
        "the report pushed",
        Duration::from_secs(60),
        || {
            repo.report("test", "test-1")
                .is_some_and(|r| r.state.as_str() == state && r.message == st.message)
        },
    )
    .await;
    let report = repo.report("test", "test-1").unwrap();
    let metrics = agent.metrics().await;
    for s in drover::rollout::RolloutState::ALL {
        let want = if s.as_str() == state { 1.0 } else { 0.0 };
        assert_eq!(
            sample(
                &metrics,
                &format!(r#"drover_rollout_state{{state="{}"}}"#, s.as_str())
            ),
            Some(want),
            "{metrics}"
        );
    }
    let reason = format!("Rollout{}{}", state[..1].to_uppercase(), &state[1..]);
    let event = crate::support::kube::retry_until(&format!("Event {reason}"), || async {
        let ev = crate::support::kube::events_for(client, ns, "test-test-1").await;
        ev.iter()
            .find(|e| e.reason.as_deref() == Some(reason.as_str()))
            .cloned()
            .ok_or_else(|| {
                ev.iter()
                    .filter_map(|e| e.reason.clone())
                    .collect::<Vec<_>>()
            })
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    // The Event names the blocker the status names, after the state.
    let blocker = st.blocker.as_deref().expect("a blocker");
    assert!(
        note.starts_with(&format!("{state} ({blocker}) ")) && note.ends_with(&st.message),
        "{note:?} / {:?}",
        st.message
    );
    (st, report)
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

/// The fix pinned with the revocation: 1.13.0 pinned and waiting for its
/// window, then "revoke 1.13.0" and "pin 1.13.1" merged one after the other
/// and fetched in one poll. The span changes the policy and the pin, so the
/// gate refuses it whole (as it refuses a split push); the revocation in it
/// still stops 1.13.0, because a revocation only stops (simulation seed
/// 514 went on moving nodes to the version just revoked). Attack: the same
/// revocation in a commit nobody signed is not honoured: its head fails the
/// trust check and 1.13.0 rolls out as the applied commit says.
#[tokio::test]
async fn a_revocation_in_a_head_the_gate_refuses_stops_the_applied_version_only_when_signed() {
    for signed in [true, false] {
        let cp = ControlPlane::get();
        let client = cp.admin_client().await;
        install_crd(&client).await;
        let ns = TestNamespace::create(&client, "revoked-span").await;
        let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
        let node = sim.node_names()[0].clone();
        let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
        let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
        cfg.poll = Duration::from_secs(600);
        // Before the window (02:00-08:00 on the 1st).
        let clock = Arc::new(VirtualClock::new(dec(1, 1, 0)));
        let shared: drover::agent::SharedClock = clock.clone();
        let agent = RunningAgent::start(cfg, shared, None);
        await_status(&client, ns.name(), "test-test-1", "confirmed", |s| {
            s.state.as_deref() == Some("confirmed")
        })
        .await;
        let pinned = repo.bump("test", "1.13.0", true);
        assert_eq!(agent.webhook().await, 202);
        await_status(&client, ns.name(), "test-test-1", "1.13.0 pending", |s| {
            s.last_applied_commit.as_deref() == Some(pinned.as_str())
        })
        .await;

        // Both merges land before the agent fetches again.
        let path = repo.work.join("drover.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let line = "revoked = [{ version = \"1.13.0\", reason = \"breaks the CNI\" }]\n";
        std::fs::write(
            &path,
            text.replacen("[promotion]\n", &format!("[promotion]\n{line}"), 1),
        )
        .unwrap();
        repo.commit("revoke 1.13.0", signed);
        let fix = repo.bump("test", "1.13.1", true);
        assert_eq!(agent.webhook().await, 202);
        let st = await_status(&client, ns.name(), "test-test-1", "span refused", |s| {
            s.refused.as_ref().is_some_and(|r| r.commit == fix)
        })
        .await;
        let refused = st.status.unwrap().refused.unwrap();
        let stage = if signed { "gate" } else { "trust" };
        assert_eq!(refused.stage, stage, "{}", refused.message);
        assert_eq!(
            st_applied(&client, ns.name()).await.as_deref(),
            Some(pinned.as_str()),
            "the 1.13.0 commit stays applied"
        );

        // The window opens.
        clock.set(dec(1, 2, 0));
        if signed {
            let st = await_status(&client, ns.name(), "test-test-1", "held as revoked", |s| {
                s.state.as_deref() == Some("revoked") && s.message.contains("breaks the CNI")
            })
            .await;
            let msg = st.status.unwrap().message;
            assert!(msg.contains("a signed change the gate refused"), "{msg}");
            let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
            let p = crate::support::backend::progress_of(&client, ns.name(), &node).await;
            assert!(
                p.is_none() && !crate::support::kube::unschedulable(&n),
                "no node started: {p:?}"
            );
            assert_eq!(sim.upgrades_started(&node), 0);
        } else {
            // Moved, the state still naming the refused head.
            await_status(
                &client,
                ns.name(),
                "test-test-1",
                "1.13.0 on every node",
                |s| s.target.as_deref() == Some("1.13.0") && s.nodes_at_version == 1,
            )
            .await;
            assert_eq!(sim.version(&node).as_deref(), Some("1.13.0"));
        }
        agent.stop();
        sim.shutdown().await;
    }
}

/// The status's last applied commit.
async fn st_applied(client: &kube::Client, ns: &str) -> Option<String> {
    let api: Api<drover::agent::crd::DroverStatus> = Api::namespaced(client.clone(), ns);
    api.get("test-test-1")
        .await
        .ok()?
        .status?
        .last_applied_commit
}
