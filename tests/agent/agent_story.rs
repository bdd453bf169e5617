//! The agent end to end against a real kube-apiserver, simulated kubelet
//! nodes and a real git server (`git daemon` on loopback): the story of docs/design.md §0
//! across three environments, a change pushed past review, and two replicas
//! of which the acting one is killed mid-rollout.

use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::nodes_in;
use crate::support::backend::{pool_options, progresses, start_sim, BudgetWatch, POOL_LABEL};
use crate::support::kube::{events_for, retry_until};
use crate::support::kube::{ControlPlane, TestNamespace};
use drover::rollout::VirtualClock;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::Client;

const STEP: Duration = Duration::from_secs(90);

fn env(env: &str, cluster: &str, schedule: &str, pool: &str) -> EnvSpec {
    EnvSpec {
        env: env.into(),
        cluster: cluster.into(),
        version: "1.12.0".into(),
        schedule: schedule.into(),
        selector: format!("{POOL_LABEL}={pool}"),
        soak: "1h".into(),
    }
}

/// Every node of the pool untouched by drover: schedulable, no record in
/// progress (the pool's agent keeps its records in the pool's namespace).
async fn untouched(client: &Client, pool: &str) -> bool {
    let nodes = nodes_in(client, pool).await;
    let records = progresses(client, pool, &nodes).await;
    nodes.iter().zip(records).all(|(n, p)| {
        !n.spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
            && p.is_none()
    })
}

#[tokio::test]
async fn a_bump_moves_through_test_stage_and_production_each_in_its_window() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns: Vec<TestNamespace> = futures::future::join_all(
        ["story-test", "story-stage", "story-prod"].map(|p| TestNamespace::create(&client, p)),
    )
    .await;
    let names: Vec<String> = ns.iter().map(|n| n.name().to_string()).collect();
    let mut sims = Vec::new();
    for n in &names {
        sims.push(start_sim(&client, pool_options(n, 3)).await);
    }
    let repo = ConfigRepo::new(&[
        env("test", "test-1", "0 2 1 * *", &names[0]),
        env("stage", "stage-1", "0 2 8 * *", &names[1]),
        env("production", "prod-1", "0 2 20 * *", &names[2]),
    ]);
    // One world clock for the three agents, before the test window opens.
    let clock = VirtualClock::new(dec(1, 0, 0));
    let shared = || -> drover::agent::SharedClock { Arc::new(clock.clone()) };
    let agents = [
        RunningAgent::start(
            agent_config(&repo, "test", "test-1", &names[0], "test-agent"),
            shared(),
            None,
        ),
        RunningAgent::start(
            agent_config(&repo, "stage", "stage-1", &names[1], "stage-agent"),
            shared(),
            None,
        ),
        RunningAgent::start(
            agent_config(&repo, "production", "prod-1", &names[2], "prod-agent"),
            shared(),
            None,
        ),
    ];
    let budgets = [
        BudgetWatch::start(&client, &names[0]).await,
        BudgetWatch::start(&client, &names[1]).await,
        BudgetWatch::start(&client, &names[2]).await,
    ];
    let status_name = |i: usize| ["test-test-1", "stage-stage-1", "production-prod-1"][i];

    // Fresh install: test confirms what its nodes already run.
    await_status(
        &client,
        &names[0],
        status_name(0),
        "test confirmed 1.12.0",
        |s| s.state.as_deref() == Some("confirmed") && s.at_version.as_deref() == Some("3/3"),
    )
    .await;
    until_pass(
        &agents[0].handle,
        "test's confirmation pushed",
        STEP,
        || {
            repo.report("test", "test-1")
                .is_some_and(|r| r.version.to_string() == "1.12.0")
        },
    )
    .await;

    // A reviewed bump of test, and (too early) of stage.
    repo.bump("test", "1.13.0", true);
    let stage_bump = repo.bump("stage", "1.13.0", true);
    for a in &agents {
        assert_eq!(a.webhook().await, 202);
    }
    // Test applies the head (which carries its bump) but its window is closed: no node moves.
    await_status(
        &client,
        &names[0],
        status_name(0),
        "test applied the bump",
        |s| {
            s.last_applied_commit.as_deref() == Some(stage_bump.as_str())
                && s.target.as_deref() == Some("1.13.0")
                && !s.window_open
        },
    )
    .await;
    assert!(
        untouched(&client, &names[0]).await,
        "test moved outside its window"
    );
    // Stage refuses: test has not confirmed 1.13.0.
    await_status(
        &client,
        &names[1],
        status_name(1),
        "stage refuses the early bump",
        |s| {
            s.refused.as_ref().is_some_and(|r| {
                r.commit == stage_bump && r.stage == "gate" && r.reason == "not_confirmed"
            })
        },
    )
    .await;
    let m = agents[1].metrics().await;
    assert_eq!(
        sample(&m, r#"drover_blocked{stage="gate",reason="not_confirmed"}"#),
        Some(1.0),
        "{m}"
    );

    // Test's window opens: it rolls, confirms, and the confirmation lands on the status branch.
    clock.set(dec(1, 2, 30));
    agents[0].handle.reconcile();
    await_status(
        &client,
        &names[0],
        status_name(0),
        "test confirmed 1.13.0",
        |s| {
            s.state.as_deref() == Some("confirmed")
                && s.target.as_deref() == Some("1.13.0")
                && s.at_version.as_deref() == Some("3/3")
        },
    )
    .await;
    until_pass(
        &agents[0].handle,
        "test's 1.13.0 confirmation pushed",
        STEP,
        || {
            repo.report("test", "test-1").is_some_and(|r| {
                r.version.to_string() == "1.13.0"
                    && r.state == drover::rollout::RolloutState::Confirmed
            })
        },
    )
    .await;
    for n in sims[0].node_names() {
        assert_eq!(sims[0].version(&n).as_deref(), Some("1.13.0"));
        assert_eq!(sims[0].upgrades_started(&n), 1);
    }
    // Stage saw nothing of it so far.
    assert!(untouched(&client, &names[1]).await);

    // Stage now has the evidence but must soak (1h) and wait for its own window.
    await_status(&client, &names[1], status_name(1), "stage soaking", |s| {
        s.refused.as_ref().is_some_and(|r| r.reason == "soaking")
    })
    .await;
    clock.set(dec(8, 2, 30));
    agents[1].handle.fetch();
    await_status(
        &client,
        &names[1],
        status_name(1),
        "stage confirmed 1.13.0",
        |s| {
            s.last_applied_commit.as_deref() == Some(stage_bump.as_str())
                && s.state.as_deref() == Some("confirmed")
                && s.at_version.as_deref() == Some("3/3")
                && s.refused.is_none()
        },
    )
    .await;
    until_pass(
        &agents[1].handle,
        "stage's confirmation pushed",
        STEP,
        || {
            repo.report("stage", "stage-1")
                .is_some_and(|r| r.version.to_string() == "1.13.0")
        },
    )
    .await;
    // Test's report is still on the branch: no report is lost to the other agent's push.
    assert!(repo.report("test", "test-1").is_some());

    // Production follows in its own window.
    let prod_bump = repo.bump("production", "1.13.0", true);
    clock.set(dec(20, 2, 30));
    agents[2].webhook().await;
    await_status(
        &client,
        &names[2],
        status_name(2),
        "production confirmed 1.13.0",
        |s| {
            s.last_applied_commit.as_deref() == Some(prod_bump.as_str())
                && s.state.as_deref() == Some("confirmed")
                && s.at_version.as_deref() == Some("3/3")
        },
    )
    .await;

    for (i, b) in budgets.iter().enumerate() {
        let (peak, which) = b.peak();
        assert!(
            peak <= 1,
            "env {i}: {peak} nodes unavailable at once: {which:?}"
        );
        assert!(
            untouched(&client, &names[i]).await,
            "env {i} left nodes cordoned or annotated"
        );
    }
    // Events on the status object tell the story. They are published beside
    // the status, not before it: wait for them.
    for (ns, object, reason) in [
        (names[1].as_str(), status_name(1).to_string(), "Refused"),
        (names[1].as_str(), status_name(1).to_string(), "Applied"),
        (
            names[1].as_str(),
            status_name(1).to_string(),
            "RolloutConfirmed",
        ),
        // Test saw its window open (it was running before).
        (
            names[0].as_str(),
            status_name(0).to_string(),
            "WindowOpened",
        ),
    ] {
        retry_until(&format!("Event {reason} on {object}"), || async {
            let ev = events_for(&client, ns, &object).await;
            if ev.iter().any(|e| e.reason.as_deref() == Some(reason)) {
                Ok(())
            } else {
                Err(ev
                    .iter()
                    .filter_map(|e| e.reason.clone())
                    .collect::<Vec<_>>())
            }
        })
        .await;
    }
    // The nodes' records, read by people, say they are done.
    for (i, sim) in sims.iter().enumerate() {
        for n in sim.node_names() {
            let r = crate::support::backend::record_of(&client, &names[i], &n)
                .await
                .expect("a record of each node moved");
            assert_eq!((r.progress, r.attempt), (None, 1), "{n}");
        }
    }
    for a in agents {
        a.stop();
    }
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test]
async fn a_change_pushed_without_review_is_not_applied() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "unsigned").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let mut e = env("test", "test-1", "0 2 1 * *", ns.name());
    e.soak = "0s".into();
    let repo = ConfigRepo::new(&[e]);
    // Inside the window: only the trust check stands between the push and the nodes.
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let agent = RunningAgent::start(
        agent_config(&repo, "test", "test-1", ns.name(), "agent-a"),
        clock.clone(),
        None,
    );
    let applied = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "initial config applied",
        |s| s.state.as_deref() == Some("confirmed"),
    )
    .await;
    let first = applied.status.unwrap().last_applied_commit.unwrap();

    let rogue = repo.bump("test", "1.13.0", false);
    agent.webhook().await;
    let refused = await_status(&client, ns.name(), "test-test-1", "refused", |s| {
        s.refused.as_ref().is_some_and(|r| r.commit == rogue)
    })
    .await;
    let st = refused.status.unwrap();
    let r = st.refused.unwrap();
    assert_eq!((r.stage.as_str(), r.reason.as_str()), ("trust", "unsigned"));
    assert_eq!(st.last_applied_commit.as_deref(), Some(first.as_str()));
    assert_eq!(st.target.as_deref(), Some("1.12.0"));
    let m = agent.metrics().await;
    assert_eq!(
        sample(&m, r#"drover_blocked{stage="trust",reason="unsigned"}"#),
        Some(1.0),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            r#"drover_applied_commit_info{{commit="{first}",version="1.12.0"}} 1"#
        )),
        "{m}"
    );
    let ev = events_for(&client, ns.name(), "test-test-1").await;
    let warn = ev
        .iter()
        .find(|e| e.reason.as_deref() == Some("Refused"))
        .unwrap_or_else(|| panic!("no Refused Event: {ev:?}"));
    assert_eq!(warn.type_.as_deref(), Some("Warning"));
    assert!(
        warn.note.as_deref().unwrap_or("").contains("unsigned"),
        "{warn:?}"
    );
    assert!(untouched(&client, ns.name()).await);
    for n in sim.node_names() {
        assert_eq!(sim.upgrades_started(&n), 0);
    }

    // The applied commit survives a restart on a fresh cache: the new process
    // still refuses the rogue head and still pins the last applied commit.
    agent.stop();
    let again = RunningAgent::start(
        agent_config(&repo, "test", "test-1", ns.name(), "agent-b"),
        clock,
        None,
    );
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "restarted agent reports",
        |s| s.reporter.as_deref() == Some("agent-b"),
    )
    .await
    .status
    .unwrap();
    assert_eq!(st.last_applied_commit.as_deref(), Some(first.as_str()));
    assert_eq!(st.refused.map(|r| r.reason).as_deref(), Some("unsigned"));
    let (code, _) = again.http_get("/readyz").await;
    assert_eq!(code, 200, "ready after the first fetch and sync");
    assert!(untouched(&client, ns.name()).await);
    again.stop();
    sim.shutdown().await;
}

#[tokio::test]
async fn two_replicas_one_acts_and_the_other_finishes_when_it_is_killed() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "replicas").await;
    let sim = start_sim(&client, pool_options(ns.name(), 4)).await;
    let mut e = env("test", "test-1", "0 2 1 * *", ns.name());
    e.soak = "0s".into();
    let repo = ConfigRepo::new(&[e]);
    let budget = BudgetWatch::start(&client, ns.name()).await;
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    // Polls too rare to matter: only a webhook can start the rollout.
    let replica = |id: &str| {
        let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), id);
        cfg.poll = Duration::from_secs(600);
        RunningAgent::start(cfg, clock.clone(), None)
    };
    let a = replica("replica-a");
    let b = replica("replica-b");
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "initial confirmation",
        |s| s.state.as_deref() == Some("confirmed"),
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let holder = leases
        .get("drover-test-test-1")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    let (leader, follower) = if holder == "replica-a" {
        (a, b)
    } else {
        (b, a)
    };
    // Exactly one acts: the metrics say so.
    assert_eq!(sample(&leader.metrics().await, "drover_leader"), Some(1.0));
    assert_eq!(
        sample(&follower.metrics().await, "drover_leader"),
        Some(0.0)
    );
    let bump = repo.bump("test", "1.13.0", true);
    // The webhook reaches the follower, which relays it to the leader.
    assert_eq!(follower.webhook().await, 202);
    // Mid-rollout: at least one node done, not all.
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "rollout under way",
        |s| {
            s.target.as_deref() == Some("1.13.0")
                && s.nodes_at_version >= 1
                && s.nodes_at_version < 4
        },
    )
    .await;
    leader.kill();
    let survivor = if holder == "replica-a" {
        "replica-b"
    } else {
        "replica-a"
    };
    let done = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "the other replica finishes",
        |s| {
            s.state.as_deref() == Some("confirmed")
                && s.at_version.as_deref() == Some("4/4")
                && s.reporter.as_deref() == Some(survivor)
        },
    )
    .await;
    assert_eq!(
        done.status.unwrap().last_applied_commit.as_deref(),
        Some(bump.as_str())
    );
    let (peak, which) = budget.peak();
    assert!(peak <= 1, "{peak} unavailable at once: {which:?}");
    assert!(
        untouched(&client, ns.name()).await,
        "nodes left cordoned or annotated"
    );
    for n in sim.node_names() {
        assert_eq!(sim.version(&n).as_deref(), Some("1.13.0"));
        assert_eq!(sim.upgrades_started(&n), 1, "{n} upgraded once");
    }
    let l = leases
        .get("drover-test-test-1")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(l.holder_identity.as_deref(), Some(survivor));
    follower.stop();
    // A graceful stop releases the lease.
    let l = leases
        .get("drover-test-test-1")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(l.holder_identity, None);
    sim.shutdown().await;
}

/// SIGTERM while the git server stalls in the middle of a fetch: the agent
/// process exits cleanly at once instead of waiting out the 60 s fetch
/// timeout, which is longer than a pod's default 30 s grace period.
#[tokio::test]
async fn sigterm_during_a_stalled_fetch_exits_at_once() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "sigterm").await;
    let repo = ConfigRepo::new(&[env("test", "test-1", "0 2 1 * *", ns.name())]);
    // A "git server" that accepts and then never says a word.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = stalled.local_addr().unwrap().port();
    let (accepted_tx, accepted) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for conn in stalled.incoming().flatten() {
            open.push(conn);
            let _ = accepted_tx.send(());
        }
    });
    let logs = repo.dir.path().join("agent.log");
    let url = format!("git://127.0.0.1:{port}/config");
    let mut child = agent_process(
        env!("CARGO_BIN_EXE_drover"),
        &repo,
        &url,
        ns.name(),
        "127.0.0.1:0",
        &logs,
    )
    .spawn()
    .unwrap();
    let pid = child.id().unwrap();
    let connected =
        tokio::task::spawn_blocking(move || accepted.recv_timeout(Duration::from_secs(60)).is_ok())
            .await
            .unwrap();
    assert!(connected, "the agent never connected to the git server");
    sigterm(pid);
    let sent = std::time::Instant::now();
    let exited = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let text = std::fs::read_to_string(&logs).unwrap();
    let code = exited
        .unwrap_or_else(|_| panic!("still running 10 s after SIGTERM:\n{text}"))
        .unwrap();
    assert!(code.success(), "exit after SIGTERM: {code}\n{text}");
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert!(text.contains("shutdown requested"), "{text}");
}
