//! Waves and the fleet-wide halt through the agent (docs/design.md §4a),
//! against the real API server, simulated kubelet nodes and a real git
//! server. Production has three clusters in two waves (`eu-1`, `eu-2`, then
//! `us-1`), each on a pool of simulated nodes of its own.
//!
//! Wave 1 played by its agents: `eu-1`'s and `eu-2`'s agents roll and push
//! confirmations signed with their keys; `us-1`'s agent starts no node
//! while they roll nor until their soak has passed, then upgrades its own.
//! The three agents share the API server (each selecting its own pool,
//! `support::agent::PoolBackend`), the git server and the clock.
//!
//! Wave 1 stood in by reports on its status branches (signed with its
//! clusters' report keys as their agents sign them, or forged), against
//! `us-1`'s agent alone:
//! - the attack: wave 1's confirmations forged (unsigned) on their branches
//!   do not release wave 2, whatever the clock says: branches that do not
//!   count hold the environment;
//! - the control: signed confirmations release wave 2 once wave 1's soak
//!   has passed, not before;
//! - a `failed` report of wave 1 halts wave 2's agent within 60 s of landing
//!   (measured: BENCHMARKS.md), the node in flight finishes, no node
//!   starts, and the halt is in the DroverStatus and the status report,
//!   naming the cluster, the node and the check.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim, POOL_LABEL};
use crate::support::git::{allowed_signers, commit_file_on, keygen};
use crate::support::kube::{ControlPlane, TestNamespace};
use drover::rollout::{RolloutState, VirtualClock};

fn env_text(pool: &str, version: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"0 2 20 * *\"\nduration = \"6h\"\n\
         timezone = \"UTC\"\n\n[rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\n\
         node_timeout = \"10m\"\nnode_selector = \"{POOL_LABEL}={pool}\"\n\n[promotion]\n\
         soak = \"0s\"\n\n[[wave]]\nclusters = [\"eu-*\"]\nsoak = \"1h\"\n\n[[wave]]\n\
         clusters = [\"us-1\"]\n"
    )
}

/// Production alone (no lower environment: only the waves gate it), its
/// three clusters each with a report key, `us-1`'s nodes in `pool`.
fn repo(dir_pool: &str) -> ConfigRepo {
    let mut repo = ConfigRepo::new(&[EnvSpec {
        env: "production".into(),
        cluster: "us-1".into(),
        version: "1.12.0".into(),
        schedule: "0 2 20 * *".into(),
        selector: format!("{POOL_LABEL}={dir_pool}"),
        soak: "0s".into(),
    }]);
    for c in ["eu-1", "eu-2"] {
        let k = keygen(repo.dir.path(), &format!("report-{c}"));
        repo.report_keys.insert(c.into(), k);
    }
    let entries: Vec<(String, PathBuf)> = ["eu-1", "eu-2", "us-1"]
        .iter()
        .map(|c| (format!("production/{c}"), repo.report_keys[*c].clone()))
        .collect();
    let entries: Vec<(&str, &Path)> = entries
        .iter()
        .map(|(p, k)| (p.as_str(), k.as_path()))
        .collect();
    allowed_signers(&repo.work.join("agents.allowed_signers"), &entries);
    let root = std::fs::read_to_string(repo.work.join("drover.toml")).unwrap();
    std::fs::write(
        repo.work.join("drover.toml"),
        root.replace(
            "production = [\"us-1\"]",
            "production = [\"eu-1\", \"eu-2\", \"us-1\"]",
        ),
    )
    .unwrap();
    repo.set_env_text(
        "production",
        &env_text(dir_pool, "1.12.0"),
        "production in two waves",
    );
    repo
}

/// A report of `cluster` on its own status branch, as its agent writes it:
/// signed with its key (`None`: unsigned, a forgery), dated `at`.
fn report(
    repo: &ConfigRepo,
    cluster: &str,
    state: &str,
    message: &str,
    at: &str,
    key: Option<&Path>,
) {
    let text = format!(
        "env = \"production\"\ncluster = \"{cluster}\"\nconfig_commit = \"abc\"\nversion = \"1.13.0\"\n\
         state = \"{state}\"\nsince = {at}\nnodes = 3\nnodes_at_version = 3\nmessage = \"{message}\"\n"
    );
    commit_file_on(
        &repo.bare,
        &format!("drover/status.d/production/{cluster}"),
        &format!("status/production/{cluster}.toml"),
        Some(text.as_bytes()),
        key,
        "status",
        Some(at),
    );
}

/// Start `us-1`'s agent on `clock`; it adopts 1.12.0, which its nodes run.
async fn start(
    client: &kube::Client,
    repo: &ConfigRepo,
    ns: &str,
    name: &str,
    clock: &VirtualClock,
) -> RunningAgent {
    let mut cfg = agent_config(repo, "production", "us-1", ns, name);
    cfg.status_name = name.into();
    cfg.lease_name = name.into();
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    await_adopted(client, ns, name).await;
    agent
}

#[tokio::test]
async fn wave_two_waits_for_signed_soaked_confirmations_and_halts_on_a_failure_in_wave_one() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "waves").await;
    let mut opts = pool_options(ns.name(), 2);
    // A node stays in flight long enough for the halt to meet it.
    opts.reboot = Duration::from_secs(15);
    let sim = start_sim(&client, opts).await;
    let clock = VirtualClock::new(dec(20, 3, 0));
    let untouched = |what: &str| {
        for n in sim.node_names() {
            assert_eq!(sim.upgrades_started(&n), 0, "{what}: {n} touched");
        }
    };

    // The attack: wave 1's confirmations, unsigned, long past the soak.
    let forged = repo(ns.name());
    let agent = start(&client, &forged, ns.name(), "waves-attack", &clock).await;
    forged.set_env_text(
        "production",
        &env_text(ns.name(), "1.13.0"),
        "production: move to 1.13.0",
    );
    assert_eq!(agent.webhook().await, 202);
    await_status(&client, ns.name(), "waves-attack", "wave 2 waiting", |s| {
        s.state.as_deref() == Some("pending") && s.message.contains("wave 2 waits for wave 1")
    })
    .await;
    for c in ["eu-1", "eu-2"] {
        report(&forged, c, "confirmed", "", "2026-12-20T01:00:00Z", None);
    }
    assert_eq!(agent.webhook().await, 202);
    // The agent read the forged branches (it names them): branches of
    // production that do not count hold it, so nothing starts.
    let st = await_status(&client, ns.name(), "waves-attack", "forgeries read", |s| {
        s.evidence_held.as_deref().is_some_and(|h| {
            h.contains("drover/status.d/production/eu-1")
                && h.contains("drover/status.d/production/eu-2")
        })
    })
    .await
    .status
    .unwrap();
    assert_eq!(st.state.as_deref(), Some("halted"), "{}", st.message);
    let stalled = st.conditions.iter().find(|c| c.kind == "Stalled").unwrap();
    assert_eq!(stalled.reason, "EvidenceHeld", "{}", st.message);
    until_pass(
        &agent.handle,
        "three more passes",
        Duration::from_secs(30),
        {
            let mut n = 0;
            move || {
                n += 1;
                n > 3
            }
        },
    )
    .await;
    untouched("forged confirmations");
    agent.stop();

    // The control: signed confirmations, released only once wave 1's soak passed.
    let repo = repo(ns.name());
    let agent = start(&client, &repo, ns.name(), "waves", &clock).await;
    repo.set_env_text(
        "production",
        &env_text(ns.name(), "1.13.0"),
        "production: move to 1.13.0",
    );
    report(
        &repo,
        "eu-1",
        "confirmed",
        "",
        "2026-12-20T02:20:00Z",
        Some(&repo.report_keys["eu-1"]),
    );
    report(
        &repo,
        "eu-2",
        "confirmed",
        "",
        "2026-12-20T02:30:00Z",
        Some(&repo.report_keys["eu-2"]),
    );
    assert_eq!(agent.webhook().await, 202);
    let st = await_status(&client, ns.name(), "waves", "wave 1's soak", |s| {
        s.message.contains("wave 2 waits for wave 1's soak")
    })
    .await
    .status
    .unwrap();
    assert!(
        st.message.contains("2026-12-20T03:30:00Z"),
        "{}",
        st.message
    );
    untouched("inside wave 1's soak");
    clock.set(dec(20, 3, 31));
    await_status(&client, ns.name(), "waves", "wave 2 rolling", |s| {
        s.state.as_deref() == Some("rolling")
    })
    .await;
    let started = || -> usize {
        sim.node_names()
            .iter()
            .map(|n| sim.upgrades_started(n))
            .sum()
    };
    until_pass(
        &agent.handle,
        "wave 2's first node upgrading",
        Duration::from_secs(60),
        || started() == 1,
    )
    .await;

    // A failed check in wave 1, pushed while wave 2's first node is in flight.
    let pushed = Instant::now();
    report(
        &repo,
        "eu-1",
        "failed",
        "node eu-1-n3 failed: pod shop/web-7 crash-looping",
        "2026-12-20T03:31:00Z",
        Some(&repo.report_keys["eu-1"]),
    );
    // No webhook: the poll alone must find it.
    let st = await_status(&client, ns.name(), "waves", "halted", |s| {
        s.state.as_deref() == Some("halted")
    })
    .await
    .status
    .unwrap();
    let latency = pushed.elapsed();
    eprintln!(
        "halt latency (poll {:?}): {latency:?}",
        Duration::from_millis(2500)
    );
    assert!(
        latency < Duration::from_secs(60),
        "halted after {latency:?}"
    );
    assert!(st.message.contains("eu-1"), "{}", st.message);
    assert!(
        st.message
            .contains("node eu-1-n3 failed: pod shop/web-7 crash-looping"),
        "{}",
        st.message
    );
    assert!(
        st.message.contains("drover revoke 1.13.0"),
        "{}",
        st.message
    );
    let halted = st
        .conditions
        .iter()
        .find(|c| c.kind == "Stalled")
        .expect("Stalled");
    assert_eq!(
        (halted.status.as_str(), halted.reason.as_str()),
        ("True", "Halted")
    );
    // The node in flight finishes; no other starts.
    until_pass(
        &agent.handle,
        "the node in flight finished",
        Duration::from_secs(90),
        || {
            sim.node_names()
                .iter()
                .filter(|n| sim.version(n).as_deref() == Some("1.13.0"))
                .count()
                == 1
        },
    )
    .await;
    until_pass(
        &agent.handle,
        "halt reported",
        Duration::from_secs(60),
        || {
            repo.report("production", "us-1").is_some_and(|r| {
                r.state == RolloutState::Halted && r.message.contains("node eu-1-n3 failed")
            })
        },
    )
    .await;
    assert_eq!(started(), 1, "no node started after the halt");
    agent.stop();
}

/// Wave 1 played by its own agents: `eu-1` and `eu-2` roll 1.13.0 on
/// their pools, confirm, and push reports signed with their keys; `us-1`
/// starts no node while they roll nor until their soak has passed, then
/// upgrades its own. One API server, one git server, one clock.
#[tokio::test]
async fn wave_two_follows_wave_one_agents_after_their_signed_confirmations_and_soak() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let clusters = ["eu-1", "eu-2", "us-1"];
    let ns: Vec<TestNamespace> = futures::future::join_all(
        ["waves-eu-1", "waves-eu-2", "waves-us-1"].map(|p| TestNamespace::create(&client, p)),
    )
    .await;
    let names: Vec<String> = ns.iter().map(|n| n.name().to_string()).collect();
    let mut sims = Vec::new();
    for (n, nodes) in names.iter().zip([1, 1, 2]) {
        sims.push(start_sim(&client, pool_options(n, nodes)).await);
    }
    // The environment's file names us-1's pool; each agent sees its own.
    let repo = repo(&names[2]);
    let clock = VirtualClock::new(dec(20, 3, 0));
    let agents: Vec<RunningAgent> = clusters
        .iter()
        .zip(&names)
        .map(|(c, n)| {
            let mut cfg = agent_config(&repo, "production", c, n, &format!("{c}-agent"));
            if c.starts_with("eu-") {
                // Wave 1 moves only when the test says so (its webhook), so
                // that wave 2 is seen waiting before wave 1 has started.
                cfg.poll = Duration::from_secs(600);
            }
            RunningAgent::start_on_pool(cfg, Arc::new(clock.clone()), &format!("{POOL_LABEL}={n}"))
        })
        .collect();
    let status = |i: usize| format!("production-{}", clusters[i]);
    for (i, n) in names.iter().enumerate() {
        await_status(&client, n, &status(i), "adopted 1.12.0", |s| {
            s.state.as_deref() == Some("confirmed") && s.last_applied_commit.is_some()
        })
        .await;
    }
    let started = |i: usize| -> usize {
        sims[i]
            .node_names()
            .iter()
            .map(|n| sims[i].upgrades_started(n))
            .sum()
    };

    let bump = repo.set_env_text(
        "production",
        &env_text(&names[2], "1.13.0"),
        "production: move to 1.13.0",
    );
    assert_eq!(agents[2].webhook().await, 202);
    await_status(&client, &names[2], &status(2), "wave 2 waits", |s| {
        s.last_applied_commit.as_deref() == Some(bump.as_str())
            && s.state.as_deref() == Some("pending")
            && s.message
                .contains("wave 2 waits for wave 1 to confirm: not yet confirmed by eu-1, eu-2")
    })
    .await;

    // Wave 1's agents take the bump, roll and confirm.
    for a in &agents[..2] {
        assert_eq!(a.webhook().await, 202);
    }
    for i in 0..2 {
        await_status(&client, &names[i], &status(i), "wave 1 confirmed", |s| {
            s.state.as_deref() == Some("confirmed")
                && s.target.as_deref() == Some("1.13.0")
                && s.at_version.as_deref() == Some("1/1")
        })
        .await;
        until_pass(
            &agents[i].handle,
            "wave 1's confirmation pushed",
            Duration::from_secs(60),
            || {
                repo.report("production", clusters[i]).is_some_and(|r| {
                    r.state == RolloutState::Confirmed && r.version.to_string() == "1.13.0"
                })
            },
        )
        .await;
        for n in sims[i].node_names() {
            assert_eq!(sims[i].version(&n).as_deref(), Some("1.13.0"), "{n}");
            assert_eq!(sims[i].upgrades_started(&n), 1, "{n}");
        }
    }
    // us-1 fetched them on its poll and trusts them (signed by wave 1's
    // keys): what it waits for now is their soak, an hour from 03:00.
    let st = await_status(&client, &names[2], &status(2), "wave 1's soak", |s| {
        s.message.contains("wave 2 waits for wave 1's soak")
    })
    .await
    .status
    .unwrap();
    assert!(
        st.message.contains("2026-12-20T04:00:00Z") && !st.message.contains("ignored"),
        "{}",
        st.message
    );
    assert_eq!(st.state.as_deref(), Some("pending"), "{}", st.message);
    assert_eq!(started(2), 0, "wave 2 moved before wave 1's soak");

    // The soak has passed: us-1 upgrades its nodes.
    clock.set(dec(20, 4, 1));
    agents[2].handle.reconcile();
    await_status(&client, &names[2], &status(2), "wave 2 confirmed", |s| {
        s.state.as_deref() == Some("confirmed")
            && s.target.as_deref() == Some("1.13.0")
            && s.at_version.as_deref() == Some("2/2")
    })
    .await;
    for n in sims[2].node_names() {
        assert_eq!(sims[2].version(&n).as_deref(), Some("1.13.0"), "{n}");
        assert_eq!(sims[2].upgrades_started(&n), 1, "{n}");
    }
    until_pass(
        &agents[2].handle,
        "wave 2's confirmation pushed",
        Duration::from_secs(60),
        || {
            repo.report("production", "us-1").is_some_and(|r| {
                r.state == RolloutState::Confirmed && r.version.to_string() == "1.13.0"
            })
        },
    )
    .await;
    for a in agents {
        a.stop();
    }
    for s in sims {
        s.shutdown().await;
    }
}
