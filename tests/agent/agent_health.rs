//! Health-gated rollouts (docs/design.md §5a) with the agent against a real
//! kube-apiserver, simulated kubelet nodes, a real git server and a real
//! Prometheus: a crash loop or a node condition on the first upgraded node
//! halts the rollout at that node, stage reports `failed` and production's
//! `drover check --base` refuses the version; a healthy rollout confirms only
//! once `settle` has held, and a later `failed` for the same version
//! withdraws that confirmation; a query that starts firing mid-rollout halts
//! it, and a stopped Prometheus holds it.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{await_node_record, nodes_in, progress_of};
use crate::support::backend::{pool_options, start_sim, POOL_LABEL};
use crate::support::kube::{
    await_pod, create, daemon_pod, os_image, pod_running_ready, ControlPlane, TestNamespace,
};
use crate::support::kube::{events_for, unschedulable};
use crate::support::kubelet::Fault;
use crate::support::prometheus::{CountingFront, Exporter, Prometheus};
use drover::cluster::{NodeProgress, ProgressState};
use drover::config::{OnUnreachable, PrometheusCheck};
use drover::health::{PrometheusClient, QueryOutcome};
use drover::rollout::health::HEALTH_RECHECK;
use drover::rollout::VirtualClock;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::{Client, ResourceExt};

pub(crate) const STEP: Duration = Duration::from_secs(90);

pub(crate) fn spec(env: &str, cluster: &str, pool: &str) -> EnvSpec {
    EnvSpec {
        env: env.into(),
        cluster: cluster.into(),
        version: "1.12.0".into(),
        schedule: "0 2 1 * *".into(),
        selector: format!("{POOL_LABEL}={pool}"),
        soak: "0s".into(),
    }
}

/// Stage's file at `version` with `health` (a `[health]` section) added.
fn stage_text(version: &str, pool: &str, health: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
         [rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\n\
         node_selector = \"{POOL_LABEL}={pool}\"\n\n[promotion]\nsoak = \"0s\"\n\n{health}"
    )
}

/// The progress drover's record of node `n` holds (records are in the pool's namespace).
pub(crate) async fn progress(w: &World, n: &Node) -> Option<NodeProgress> {
    progress_of(&w.client, &w.pool, &n.name_any()).await
}

/// A pool of `n` nodes, each running a pod made by `pod(i, node)` (Running
/// and Ready before the agent starts), a stage+production config
/// repository, and stage's agent, adopted at 1.12.0 inside its window.
pub(crate) struct World {
    pub(crate) client: Client,
    _ns: TestNamespace,
    pub(crate) pool: String,
    pub(crate) sim: crate::support::kubelet::Kubelet,
    pub(crate) repo: ConfigRepo,
    pub(crate) clock: VirtualClock,
    pub(crate) agent: RunningAgent,
    pub(crate) nodes: Vec<String>,
    /// What the agent's notifications told a receiver.
    pub(crate) notified: crate::support::notify::Received,
}

/// [`World`] with a node agent's DaemonSet pod on each node.
async fn world(prefix: &str, n: usize) -> World {
    world_with(prefix, n, |i, node| {
        daemon_pod(&format!("node-agent-{i}"), node)
    })
    .await
}

pub(crate) async fn world_with(prefix: &str, n: usize, pod: fn(usize, &str) -> Pod) -> World {
    world_tuned(prefix, n, pod, |_| {}).await
}

/// [`world_with`], the simulator's options changed by `tune` first.
pub(crate) async fn world_tuned(
    prefix: &str,
    n: usize,
    pod: fn(usize, &str) -> Pod,
    tune: impl FnOnce(&mut crate::support::kubelet::KubeletOptions),
) -> World {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    let pool = ns.name().to_string();
    let mut opts = pool_options(&pool, n);
    tune(&mut opts);
    let sim = start_sim(&client, opts).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pool);
    for (i, node) in nodes.iter().enumerate() {
        let p = pod(i, node);
        create(&pods, &p).await;
        let name = p.metadata.name.unwrap();
        await_pod(
            &client,
            &pool,
            &name,
            "Running and Ready",
            pod_running_ready,
        )
        .await;
    }
    let repo = ConfigRepo::new(&[
        spec("stage", "stage-1", &pool),
        spec("production", "prod-1", &format!("{pool}-prod")),
    ]);
    let clock = VirtualClock::new(dec(1, 2, 30));
    let (notify, notified) = crate::support::notify::notified().await;
    let mut cfg = agent_config(&repo, "stage", "stage-1", &pool, &format!("{prefix}-agent"));
    cfg.notify = notify;
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    await_adopted(&client, &pool, "stage-stage-1").await;
    World {
        client,
        _ns: ns,
        pool,
        sim,
        repo,
        clock,
        agent,
        nodes,
        notified,
    }
}

/// `drover check --base main` on a change moving production to `version`,
/// in a clone of the served repository (status branch as `origin/drover/status`).
fn production_check(repo: &ConfigRepo, version: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("c");
    // `--no-local`: the agent pushes reports into the repository while it
    // is cloned, and a local clone copies its object directory file by
    // file, a push's quarantine directory (`tmp_objdir-incoming-*`) too,
    // which vanished mid-copy once in CI; upload-pack serves a snapshot.
    let ok = Command::new("git")
        .args(["clone", "-q", "--no-local"])
        .arg(&repo.bare)
        .arg(&work)
        .status()
        .unwrap();
    assert!(ok.success());
    let file = work.join("environments/production.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("version = \"1.12.0\"", &format!("version = \"{version}\"")),
    )
    .unwrap();
    for args in [
        vec!["checkout", "-q", "-b", "promote"],
        vec![
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-qam",
            "promote",
        ],
    ] {
        assert!(Command::new("git")
            .current_dir(&work)
            .args(&args)
            .status()
            .unwrap()
            .success());
    }
    // The agent's reports are committed at the wall clock's time, and evidence
    // counts from its commit's time: judge a day after today, whatever day it is.
    let now = (chrono::Utc::now() + chrono::Duration::days(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let out = crate::support::cli::drover_command()
        .args(["check", "--repo"])
        .arg(&work)
        .args(["--base", "main", "--now", &now])
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

/// Stage moves to 1.13.0 with `fault` on its first node: the rollout halts
/// there, and every place names `what`.
async fn halts_at_the_first_node(
    prefix: &str,
    fault: Fault,
    check: &str,
    what: &dyn Fn(&World) -> String,
) {
    let w = world(prefix, 3).await;
    let first = w.nodes[0].clone();
    w.sim.set_fault(&first, fault);
    w.repo.set_env_text(
        "stage",
        &stage_text(
            "1.13.0",
            &w.pool,
            "[health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n",
        ),
        "stage: move to 1.13.0",
    );
    w.agent.handle.fetch();
    let expected = what(&w);
    let status = await_status(&w.client, &w.pool, "stage-stage-1", "failed", |s| {
        s.state.as_deref() == Some("failed")
    })
    .await
    .status
    .unwrap();
    assert!(status.message.contains(&expected), "{}", status.message);
    assert!(status.message.contains(&first), "{}", status.message);

    // Exactly one node upgraded, recorded failed naming the check, in service;
    // no other node touched, over several more passes.
    let mut passes = 0;
    until_pass(&w.agent.handle, "several passes", STEP, || {
        passes += 1;
        passes > 4
    })
    .await;
    let nodes = nodes_in(&w.client, &w.pool).await;
    let upgraded: Vec<String> = nodes
        .iter()
        .filter(|n| os_image(n).contains("1.13.0"))
        .map(|n| n.name_any())
        .collect();
    assert_eq!(upgraded, std::slice::from_ref(&first));
    let p = progress(&w, &nodes[0]).await.unwrap();
    assert_eq!(p.state, ProgressState::Failed);
    assert!(p.message.contains(&expected), "{}", p.message);
    assert!(!unschedulable(&nodes[0]));
    for n in &nodes[1..] {
        assert!(
            progress(&w, n).await.is_none() && !unschedulable(n),
            "{} was touched",
            n.name_any()
        );
    }

    // The Event, the metric and the signed report.
    let evs = events_for(&w.client, "default", &first).await;
    assert!(
        evs.iter()
            .any(|e| e.reason.as_deref() == Some("HealthCheckFailed")
                && e.type_.as_deref() == Some("Warning")
                && e.note.as_deref().is_some_and(|n| n.contains(&expected))),
        "{evs:?}"
    );
    let metrics = w.agent.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            &format!(r#"drover_health_failures_total{{env="stage",check="{check}"}}"#)
        ),
        Some(1.0),
        "{metrics}"
    );
    until_pass(&w.agent.handle, "failed report pushed", STEP, || {
        w.repo.report("stage", "stage-1").is_some_and(|r| {
            r.state.as_str() == "failed"
                && r.version.to_string() == "1.13.0"
                && r.message.contains(&expected)
        })
    })
    .await;

    // Production may not take the version stage failed.
    let (code, out) = production_check(&w.repo, "1.13.0");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("stage-1"), "{out}");
    w.agent.stop();
    w.sim.shutdown().await;
}

#[tokio::test]
async fn a_crash_loop_on_the_first_upgraded_node_halts_there_and_production_refuses() {
    halts_at_the_first_node(
        "health-crash",
        Fault::CrashLoopAfterUpgrade,
        "crash_loop",
        &|w| format!("pod {}/node-agent-0 is crash-looping", w.pool),
    )
    .await;
}

#[tokio::test]
async fn a_node_condition_on_the_first_upgraded_node_halts_there_naming_it() {
    halts_at_the_first_node(
        "health-cond",
        Fault::Condition("MemoryPressure".into()),
        "node_condition",
        &|_| "condition MemoryPressure is True".to_string(),
    )
    .await;
}

/// Until the status object's state is `state`; returns its message.
async fn state_is(w: &World, state: &str) -> String {
    await_status(&w.client, &w.pool, "stage-stage-1", state, |s| {
        s.state.as_deref() == Some(state)
    })
    .await
    .status
    .unwrap()
    .message
}

#[tokio::test]
async fn a_healthy_rollout_confirms_only_after_settle() {
    let w = world("health-settle", 2).await;
    w.repo.set_env_text(
        "stage",
        &stage_text(
            "1.13.0",
            &w.pool,
            "[health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n",
        ),
        "stage: move to 1.13.0",
    );
    w.agent.handle.fetch();
    // The first node returns and is watched until 02:35; the second waits.
    let (watched, _watched_record) =
        await_node_record(&w.client, &w.pool, &w.nodes[0], "watching", |_, p| {
            p.is_some_and(|p| p.state == ProgressState::Watching)
        })
        .await;
    assert!(!unschedulable(&watched));
    await_status(
        &w.client,
        &w.pool,
        "stage-stage-1",
        "rolling, watched",
        |s| {
            s.state.as_deref() == Some("rolling")
                && s.message.contains(&format!(
                    "node {} is Ready at 1.13.0; its health is watched until 2026-12-01T02:35:00Z",
                    w.nodes[0]
                ))
        },
    )
    .await;
    let mut passes = 0;
    until_pass(&w.agent.handle, "passes while watched", STEP, || {
        passes += 1;
        passes > 3
    })
    .await;
    let second = nodes_in(&w.client, &w.pool).await.remove(1);
    assert!(
        progress(&w, &second).await.is_none() && !unschedulable(&second),
        "started during the watch"
    );

    // The watch ends: the first passes, the second starts and is watched.
    w.clock.set(dec(1, 2, 36));
    await_node_record(&w.client, &w.pool, &w.nodes[0], "passed", |_n, p| {
        p.is_some_and(|p| p.state == ProgressState::Passed)
    })
    .await;
    await_node_record(&w.client, &w.pool, &w.nodes[1], "watching", |_n, p| {
        p.is_some_and(|p| p.state == ProgressState::Watching)
    })
    .await;
    w.clock.set(dec(1, 2, 42));
    // Every node passed: settling until 02:52, and not confirmed before.
    let msg = state_is(&w, "settling").await;
    assert!(msg.contains("settling until 2026-12-01T02:52:00Z"), "{msg}");
    until_pass(&w.agent.handle, "settling report pushed", STEP, || {
        w.repo
            .report("stage", "stage-1")
            .is_some_and(|r| r.state.as_str() == "settling")
    })
    .await;
    let (code, out) = production_check(&w.repo, "1.13.0");
    assert_eq!(code, 1, "refused while stage settles: {out}");
    w.clock.set(dec(1, 2, 51));
    let mut passes = 0;
    until_pass(&w.agent.handle, "passes before settle ends", STEP, || {
        passes += 1;
        passes > 3
    })
    .await;
    let r = w.repo.report("stage", "stage-1").unwrap();
    assert_eq!(
        r.state.as_str(),
        "settling",
        "confirmed before settle ended"
    );

    // Settle ends: confirmed, the records cleared, production may follow.
    w.clock.set(dec(1, 2, 52));
    state_is(&w, "confirmed").await;
    until_pass(&w.agent.handle, "confirmed report pushed", STEP, || {
        w.repo
            .report("stage", "stage-1")
            .is_some_and(|r| r.state.as_str() == "confirmed" && r.version.to_string() == "1.13.0")
    })
    .await;
    for n in nodes_in(&w.client, &w.pool).await {
        assert!(os_image(&n).contains("1.13.0"));
        assert!(
            progress(&w, &n).await.is_none(),
            "records cleared on confirmation"
        );
    }
    let (code, out) = production_check(&w.repo, "1.13.0");
    assert_eq!(
        code, 0,
        "control: production may take a settled version: {out}"
    );

    // A node joins later at the old version, and on 1.13.0 its workload
    // crash-loops: stage reports `failed` for 1.13.0, which withdraws its
    // earlier confirmation, so production's check refuses the version again.
    let added = w.sim.add_nodes(1).await.unwrap().remove(0);
    w.sim.set_fault(&added, Fault::CrashLoopAfterUpgrade);
    let pods: Api<Pod> = Api::namespaced(w.client.clone(), &w.pool);
    create(&pods, &daemon_pod("node-agent-late", &added)).await;
    let msg = state_is(&w, "failed").await;
    assert!(msg.contains("node-agent-late is crash-looping"), "{msg}");
    until_pass(&w.agent.handle, "failed report pushed", STEP, || {
        w.repo
            .report("stage", "stage-1")
            .is_some_and(|r| r.state.as_str() == "failed" && r.version.to_string() == "1.13.0")
    })
    .await;
    let (code, out) = production_check(&w.repo, "1.13.0");
    assert_eq!(
        code, 1,
        "the failed report withdraws the confirmation: {out}"
    );
    assert!(out.contains("withdrawn"), "{out}");
    w.agent.stop();
    w.sim.shutdown().await;
}

#[tokio::test]
async fn a_query_firing_mid_rollout_halts_within_one_evaluation_and_a_stopped_prometheus_holds() {
    let exporter = Exporter::start(0.0).await;
    let mut prom = Prometheus::start(exporter.addr()).expect("prometheus starts");
    let query = "drover_test_value > 0";
    let w = world("health-prom", 3).await;
    let health = format!(
        "[health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n\n[[health.prometheus]]\nurl = \"{}\"\nquery = \"{query}\"\ntimeout = \"2s\"\n",
        prom.url()
    );
    w.repo.set_env_text(
        "stage",
        &stage_text("1.13.0", &w.pool, &health),
        "stage: move to 1.13.0",
    );
    w.agent.handle.fetch();

    // Control: with the query clear, the first node passes and the second starts.
    await_node_record(&w.client, &w.pool, &w.nodes[0], "watching", |_n, p| {
        p.is_some_and(|p| p.state == ProgressState::Watching)
    })
    .await;
    w.clock.set(dec(1, 2, 36));
    await_node_record(&w.client, &w.pool, &w.nodes[1], "watching", |_n, p| {
        p.is_some_and(|p| p.state == ProgressState::Watching)
    })
    .await;

    // The exporter flips; from the moment Prometheus returns a sample the
    // halt comes within one evaluation interval (plus the pass it lands in).
    exporter.set(1.0);
    let client = PrometheusClient::new().unwrap();
    let check = PrometheusCheck {
        url: prom.url().to_string(),
        query: query.into(),
        timeout: Duration::from_secs(2),
        on_unreachable: OnUnreachable::Hold,
    };
    let deadline = Instant::now() + STEP;
    while !matches!(client.evaluate(&check).await, QueryOutcome::Firing { .. }) {
        assert!(Instant::now() < deadline, "Prometheus never saw the flip");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let firing_at = Instant::now();
    let msg = state_is(&w, "failed").await;
    let took = firing_at.elapsed();
    assert!(
        took < HEALTH_RECHECK + Duration::from_secs(2),
        "halt took {took:?}"
    );
    assert!(msg.contains(&format!("query `{query}` returned")), "{msg}");
    let nodes = nodes_in(&w.client, &w.pool).await;
    assert_eq!(
        progress(&w, &nodes[1]).await.unwrap().state,
        ProgressState::Failed
    );
    assert!(
        progress(&w, &nodes[2]).await.is_none() && !unschedulable(&nodes[2]),
        "third node started"
    );

    // Retry with the query clear again, then Prometheus stops: the watch
    // cannot end, the rollout holds and says so.
    exporter.set(0.0);
    while !matches!(client.evaluate(&check).await, QueryOutcome::Clear) {
        assert!(
            Instant::now() < deadline + STEP,
            "Prometheus never saw the clear"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    prom.stop();
    // A person asks for a retry on the node's record.
    crate::support::backend::request_retry(&w.client, &w.pool, &w.nodes[1]).await;
    await_node_record(&w.client, &w.pool, &w.nodes[1], "watched again", |_n, p| {
        p.is_some_and(|p| p.state == ProgressState::Watching)
    })
    .await;
    w.clock.set(dec(1, 2, 50));
    let msg = state_is(&w, "rolling").await;
    let held = await_status(&w.client, &w.pool, "stage-stage-1", "held", |s| {
        s.message.contains("unreachable")
    })
    .await
    .status
    .unwrap();
    assert!(
        held.message.contains(prom.url()),
        "{msg} / {}",
        held.message
    );
    let mut passes = 0;
    until_pass(
        &w.agent.handle,
        "passes while Prometheus is down",
        STEP,
        || {
            passes += 1;
            passes > 3
        },
    )
    .await;
    let nodes = nodes_in(&w.client, &w.pool).await;
    assert_eq!(
        progress(&w, &nodes[1]).await.unwrap().state,
        ProgressState::Watching,
        "passed without Prometheus"
    );
    assert!(progress(&w, &nodes[2]).await.is_none() && !unschedulable(&nodes[2]));
    w.agent.stop();
    w.sim.shutdown().await;
}

#[tokio::test]
async fn a_restarted_agent_resumes_the_watch_from_the_node_record() {
    let mut w = world("health-restart", 2).await;
    w.repo.set_env_text(
        "stage",
        &stage_text(
            "1.13.0",
            &w.pool,
            "[health]\nsettle = \"0s\"\npod_ready_timeout = \"5m\"\n",
        ),
        "stage: move to 1.13.0",
    );
    w.agent.handle.fetch();
    let (_watched, watched_record) =
        await_node_record(&w.client, &w.pool, &w.nodes[0], "watching", |_, p| {
            p.is_some_and(|p| p.state == ProgressState::Watching)
        })
        .await;
    let since = watched_record.unwrap().started_at;
    // The rolling report (the state the new agent recovers from) is out.
    until_pass(&w.agent.handle, "rolling report pushed", STEP, || {
        w.repo
            .report("stage", "stage-1")
            .is_some_and(|r| r.state.as_str() == "rolling" && r.version.to_string() == "1.13.0")
    })
    .await;
    // A crash: the new agent has no memory but the node's record.
    let agent = std::mem::replace(
        &mut w.agent,
        RunningAgent::start(
            agent_config(&w.repo, "stage", "stage-1", &w.pool, "health-restart-2"),
            Arc::new(w.clock.clone()),
            None,
        ),
    );
    agent.kill();
    let mut passes = 0;
    until_pass(&w.agent.handle, "passes of the new agent", STEP, || {
        passes += 1;
        passes > 3
    })
    .await;
    let nodes = nodes_in(&w.client, &w.pool).await;
    let p = progress(&w, &nodes[0]).await.unwrap();
    assert_eq!(
        (p.state, p.started_at),
        (ProgressState::Watching, since),
        "the watch goes on from its recorded start"
    );
    assert!(progress(&w, &nodes[1]).await.is_none() && !unschedulable(&nodes[1]));
    // It ends when the record says, and the rollout finishes, each node upgraded once.
    w.clock.set(dec(1, 2, 36));
    await_node_record(
        &w.client,
        &w.pool,
        &w.nodes[1],
        "second watched",
        |_n, p| p.is_some_and(|p| p.state == ProgressState::Watching),
    )
    .await;
    w.clock.set(dec(1, 2, 42));
    state_is(&w, "confirmed").await;
    for n in &w.nodes {
        assert_eq!(w.sim.upgrades_started(n), 1, "{n} upgraded more than once");
    }
    w.agent.stop();
    w.sim.shutdown().await;
}

#[tokio::test]
async fn a_confirmed_cluster_asks_prometheus_nothing_while_a_newer_head_is_refused() {
    let exporter = Exporter::start(0.0).await;
    let prom = Prometheus::start(exporter.addr()).expect("prometheus starts");
    let front = CountingFront::start(prom.url()).await;
    let w = world("health-quiet", 1).await;
    let health = format!(
        "[health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n\n[[health.prometheus]]\nurl = \"{}\"\nquery = \"drover_test_value > 0\"\ntimeout = \"2s\"\n",
        front.url()
    );
    w.repo.set_env_text(
        "stage",
        &stage_text("1.13.0", &w.pool, &health),
        "stage: move to 1.13.0",
    );
    w.agent.handle.fetch();
    await_node_record(&w.client, &w.pool, &w.nodes[0], "watching", |_n, p| {
        p.is_some_and(|p| p.state == ProgressState::Watching)
    })
    .await;
    w.clock.set(dec(1, 2, 36));
    state_is(&w, "settling").await;
    w.clock.set(dec(1, 3, 0));
    state_is(&w, "confirmed").await;
    // Control: the watch and the settle asked Prometheus, through the front.
    assert!(front.queries() > 0, "the rollout was judged by its queries");

    // A newer head that is refused (unsigned): the cluster stays confirmed
    // at 1.13.0, nothing can start or be watched, so nothing is asked.
    w.repo.bump("stage", "1.14.0", false);
    w.agent.handle.fetch();
    state_is(&w, "refused").await;
    let before = front.queries();
    let mut passes = 0;
    until_pass(&w.agent.handle, "passes while refused", STEP, || {
        passes += 1;
        passes > 5
    })
    .await;
    assert_eq!(
        front.queries() - before,
        0,
        "queries asked in {} passes of a confirmed cluster under a refused head",
        passes - 1
    );
    w.agent.stop();
    w.sim.shutdown().await;
}
