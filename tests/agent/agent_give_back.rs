//! No node left cordoned (invariant 2): a node drover is still draining is
//! given back when the agent stops (SIGTERM) and when no config is
//! applicable any more, while a node already rebooting into the new
//! version keeps its cordon, record and Job for the next leader, which
//! finishes it without a second reboot; a follower taking over before it
//! has fetched what the leader applied keeps the drain (not knowing the
//! config is not "no config"). Against the real API server,
//! simulated kubelet nodes and a real git server; the drain is held open
//! by a PodDisruptionBudget so the node is reliably caught in `draining`.

use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{await_node_record, pool_options, progress_of, start_sim};
use crate::support::kube::unschedulable;
use crate::support::kube::{await_node, pod_held_by_a_pdb, ControlPlane, TestNamespace};
use crate::support::kubelet::Kubelet;
use drover::agent::crd::DroverStatus;
use drover::cluster::{NodeProgress, ProgressState};
use drover::kubernetes::objects::NODE_LABEL;
use drover::rollout::VirtualClock;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

fn draining(n: &Node, p: Option<&NodeProgress>) -> bool {
    unschedulable(n) && p.is_some_and(|p| p.state == ProgressState::Draining)
}

fn given_back(n: &Node, p: Option<&NodeProgress>) -> bool {
    !unschedulable(n) && p.is_none()
}

/// One node running a pod that a PDB forbids evicting (and `idle` nodes
/// without pods); an agent whose config pins 1.12.0 (what the nodes run)
/// in an open window.
struct World {
    client: Client,
    ns: TestNamespace,
    sim: Kubelet,
    node: String,
    idle: Vec<String>,
    repo: ConfigRepo,
    agent: Option<RunningAgent>,
}

async fn world(prefix: &str) -> World {
    world_with(prefix, 0, None, true).await
}

/// [`world`] with `idle` more nodes, an upgrade that keeps a node
/// rebooting for `reboot` when given, and its agent started (and the
/// initial confirmation awaited) only when `agent`.
async fn world_with(prefix: &str, idle: usize, reboot: Option<Duration>, agent: bool) -> World {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    let mut opts = pool_options(ns.name(), 1 + idle);
    if let Some(r) = reboot {
        opts.reboot = r;
    }
    let sim = start_sim(&client, opts).await;
    let names = sim.node_names();
    let (node, idle) = (names[0].clone(), names[1..].to_vec());
    pod_held_by_a_pdb(&client, ns.name(), &node).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    repo.set_max_unavailable(1 + idle.len() as u32);
    let agent = agent.then(|| start_agent(&repo, &ns, "agent-a"));
    if agent.is_some() {
        await_confirmed(&client, &ns).await;
    }
    World {
        client,
        ns,
        sim,
        node,
        idle,
        repo,
        agent,
    }
}

async fn await_confirmed(client: &Client, ns: &TestNamespace) {
    await_status(
        client,
        ns.name(),
        "test-test-1",
        "initial confirmation",
        |s| s.state.as_deref() == Some("confirmed"),
    )
    .await;
}

/// An agent `id` for the world's cluster, in its open window (Dec 1, 03:00).
fn start_agent(repo: &ConfigRepo, ns: &TestNamespace, id: &str) -> RunningAgent {
    let mut cfg = agent_config(repo, "test", "test-1", ns.name(), id);
    cfg.poll = Duration::from_secs(600);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    RunningAgent::start(cfg, clock, None)
}

impl World {
    /// Delete the PDB holding the node's drain and wait until the node is
    /// given back at 1.13.0 (`what` names who upgraded it).
    async fn lift_pdb_and_await_upgraded(&self, what: &str) {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), self.ns.name());
        pdbs.delete("web", &Default::default()).await.unwrap();
        await_node_record(&self.client, self.ns.name(), &self.node, what, |n, p| {
            given_back(n, p) && crate::support::kube::os_image(n).contains("1.13.0")
        })
        .await;
    }

    /// Bump to 1.13.0 and wait until the node is cordoned and draining (held by the PDB).
    async fn start_draining(&self) {
        self.repo.bump("test", "1.13.0", true);
        if let Some(agent) = &self.agent {
            assert_eq!(agent.webhook().await, 202);
        }
        await_node_record(
            &self.client,
            self.ns.name(),
            &self.node,
            "cordoned and draining",
            draining,
        )
        .await;
    }
}

#[tokio::test]
async fn sigterm_gives_back_a_node_still_draining() {
    let mut w = world("giveback-stop").await;
    w.start_draining().await;
    // The SIGTERM path: shutdown, then the lease is released.
    w.agent.take().unwrap().stop();
    await_node_record(
        &w.client,
        w.ns.name(),
        &w.node,
        "uncordoned, record cleared",
        given_back,
    )
    .await;
    // It was not upgraded meanwhile: given back, not finished.
    assert_eq!(w.sim.version(&w.node).as_deref(), Some("1.12.0"));
    assert_eq!(w.sim.upgrades_started(&w.node), 0);
    let leases: Api<Lease> = Api::namespaced(w.client.clone(), w.ns.name());
    let l = leases.get("drover-test-test-1").await.unwrap();
    assert_eq!(
        l.spec.unwrap().holder_identity,
        None,
        "lease released after the give-back"
    );
    w.sim.shutdown().await;
}

#[tokio::test]
async fn a_real_sigterm_to_the_agent_process_gives_back_the_draining_node() {
    // The `drover agent` binary, configured as the Deployment configures it,
    // stopped by the signal the kubelet sends: the handler, the shutdown
    // path and the give-back together.
    let w = world_with("giveback-signal", 0, None, false).await;
    let logs = w.repo.dir.path().join("agent.log");
    // Its real clock moved into test's window (Dec 1, 03:00 UTC).
    let offset = (dec(1, 3, 0) - chrono::Utc::now()).num_seconds();
    let mut child = agent_process(
        env!("CARGO_BIN_EXE_drover"),
        &w.repo,
        &w.repo.url(),
        w.ns.name(),
        "127.0.0.1:0",
        &logs,
    )
    .env("DROVER_CLOCK_OFFSET", format!("{offset:+}s"))
    .env("DROVER_POLL_INTERVAL", "1s")
    .env("DROVER_JOB_NAMESPACE", w.ns.name())
    .spawn()
    .unwrap();
    await_confirmed(&w.client, &w.ns).await;
    w.start_draining().await;

    sigterm(child.id().unwrap());
    let exited = tokio::time::timeout(crate::support::kube::WAIT, child.wait()).await;
    let text = std::fs::read_to_string(&logs).unwrap();
    let code = exited
        .unwrap_or_else(|_| panic!("still running after SIGTERM:\n{text}"))
        .unwrap();
    assert!(code.success(), "exit after SIGTERM: {code}\n{text}");
    // Given back before the process exited: no watch needed, it is done.
    let n = Api::<Node>::all(w.client.clone())
        .get(&w.node)
        .await
        .unwrap();
    let p = progress_of(&w.client, w.ns.name(), &w.node).await;
    assert!(given_back(&n, p.as_ref()), "{p:?}\n{text}");
    assert!(text.contains("node given back"), "{text}");
    assert_eq!(w.sim.upgrades_started(&w.node), 0);
    let leases: Api<Lease> = Api::namespaced(w.client.clone(), w.ns.name());
    let l = leases.get("drover-test-test-1").await.unwrap();
    assert_eq!(l.spec.unwrap().holder_identity, None, "lease released");
    w.sim.shutdown().await;
}

#[tokio::test]
async fn sigterm_leaves_a_rebooting_node_to_the_next_leader_which_finishes_it() {
    // Two nodes out at once: one held draining by its PDB, one rebooting
    // into 1.13.0 for long enough that the agent stops in the middle.
    let mut w = world_with("giveback-reboot", 1, Some(Duration::from_secs(8)), true).await;
    let rebooting = w.idle[0].clone();
    w.start_draining().await;
    // Upgrading: its record says draining, and its upgrade Job (what
    // rebooted it) is the record of the upgrade.
    await_node_record(
        &w.client,
        w.ns.name(),
        &rebooting,
        "upgrading and rebooting",
        |n, p| draining(n, p) && crate::support::kube::node_ready(n) == Some("False"),
    )
    .await;

    w.agent.take().unwrap().stop();
    // The stop came mid-reboot: the simulated OS update has not finished.
    assert_eq!(w.sim.version(&rebooting).as_deref(), Some("1.12.0"));
    // The draining node is given back...
    await_node_record(
        &w.client,
        w.ns.name(),
        &w.node,
        "uncordoned, record cleared",
        given_back,
    )
    .await;
    assert_eq!(w.sim.upgrades_started(&w.node), 0);
    // ...the rebooting one keeps its cordon, its record and its Job (the
    // Job is what says it is upgrading, not draining).
    let nodes: Api<Node> = Api::all(w.client.clone());
    let n = nodes.get(&rebooting).await.unwrap();
    assert!(unschedulable(&n), "still cordoned");
    let p = progress_of(&w.client, w.ns.name(), &rebooting)
        .await
        .unwrap();
    assert_eq!(
        p.state,
        ProgressState::Draining,
        "its record: draining, its run named"
    );
    assert_eq!(p.target, semver::Version::new(1, 13, 0));
    let jobs: Api<Job> = Api::namespaced(w.client.clone(), w.ns.name());
    let listed = jobs
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={rebooting}")))
        .await
        .unwrap();
    // (Its prepare Job, finished before the drain, is kept with it.)
    let upgrades = listed
        .items
        .iter()
        .filter(|j| j.annotations().get("drover.dev/action").map(String::as_str) != Some("prepare"))
        .count();
    assert_eq!(upgrades, 1, "the upgrade Job is kept");

    // With no agent running, the node comes back at 1.13.0 and stays
    // cordoned with drover's record: nobody has finished it yet.
    let n = await_node(&w.client, &rebooting, "back Ready at 1.13.0", |n| {
        crate::support::kube::node_ready(n) == Some("True")
            && crate::support::kube::os_image(n).contains("1.13.0")
    })
    .await;
    assert!(unschedulable(&n));
    assert!(progress_of(&w.client, w.ns.name(), &rebooting)
        .await
        .is_some());

    // The next leader resumes it from the record: uncordoned, record
    // cleared, without a second reboot.
    let next = start_agent(&w.repo, &w.ns, "agent-b");
    await_node_record(
        &w.client,
        w.ns.name(),
        &rebooting,
        "finished by the next leader",
        given_back,
    )
    .await;
    assert_eq!(w.sim.version(&rebooting).as_deref(), Some("1.13.0"));
    assert_eq!(w.sim.upgrades_started(&rebooting), 1, "not rebooted twice");
    // And it carries the rollout on: once the PDB is lifted, the node
    // given back is drained again and upgraded.
    w.lift_pdb_and_await_upgraded("upgraded by the next leader")
        .await;
    assert_eq!(w.sim.upgrades_started(&w.node), 1);
    next.stop();
    w.sim.shutdown().await;
}

#[tokio::test]
async fn a_node_draining_when_no_config_applies_any_more_is_given_back() {
    let mut w = world("giveback-noconfig").await;
    w.start_draining().await;
    let agent = w.agent.take().unwrap();
    // Take the lease away so the agent stops acting, as during a takeover.
    let leases: Api<Lease> = Api::namespaced(w.client.clone(), w.ns.name());
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    leases
        .patch(
            "drover-test-test-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": {
                "holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                "acquireTime": now, "renewTime": now,
            }})),
        )
        .await
        .unwrap();
    until_metric(&agent, "drover_leader", 0.0).await;
    // Meanwhile the applied commit is lost (a restored status object, a
    // rewritten remote) and the only head is unsigned: nothing applies.
    let dst: Api<DroverStatus> = Api::namespaced(w.client.clone(), w.ns.name());
    dst.patch_status(
        "test-test-1",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": {
            "lastAppliedCommit": "0123456789012345678901234567890123456789"
        }})),
    )
    .await
    .unwrap();
    w.repo.bump("test", "1.14.0", false);
    // Control: still draining and cordoned while nobody acts.
    let n = Api::<Node>::all(w.client.clone())
        .get(&w.node)
        .await
        .unwrap();
    let p = progress_of(&w.client, w.ns.name(), &w.node).await;
    assert!(
        draining(&n, p.as_ref()),
        "the node must still be draining before the agent leads again"
    );
    leases
        .patch(
            "drover-test-test-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "holderIdentity": null, "renewTime": null } })),
        )
        .await
        .unwrap();
    await_node_record(
        &w.client,
        w.ns.name(),
        &w.node,
        "given back without a config",
        given_back,
    )
    .await;
    let st = await_status(
        &w.client,
        w.ns.name(),
        "test-test-1",
        "refused without config",
        |s| s.state.as_deref() == Some("refused") && s.refused.is_some(),
    )
    .await;
    assert_eq!(st.status.unwrap().refused.unwrap().stage, "trust");
    assert_eq!(w.sim.upgrades_started(&w.node), 0);
    agent.stop();
    w.sim.shutdown().await;
}

/// Poll the agent's `/metrics` until `series` has `value` (metrics cannot be watched).
async fn until_metric(agent: &RunningAgent, series: &str, value: f64) {
    let check = async {
        loop {
            if sample(&agent.metrics().await, series) == Some(value) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(crate::support::kube::WAIT, check)
        .await
        .unwrap_or_else(|_| panic!("{series} never became {value}"));
}

/// Counts `node`'s cordon changes as the API server records them, from
/// the moment it is started: (cordons, uncordons).
struct CordonCount {
    counts: Arc<std::sync::Mutex<(u32, u32)>>,
    task: tokio::task::JoinHandle<()>,
}

impl CordonCount {
    async fn start(client: &Client, node: &str) -> CordonCount {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let api: Api<Node> = Api::all(client.clone());
        let cfg = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let counts = Arc::new(std::sync::Mutex::new((0, 0)));
        let c = counts.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut last: Option<bool> = None;
            let stream = watcher(api, cfg);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        let now = unschedulable(&n);
                        let mut g = c.lock().unwrap();
                        match (last, now) {
                            (Some(false), true) => g.0 += 1,
                            (Some(true), false) => g.1 += 1,
                            _ => {}
                        }
                        last = Some(now);
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("cordon watch: {e}"),
                }
            }
        });
        ready_rx.await.expect("the cordon watch lists the node");
        CordonCount { counts, task }
    }

    fn get(&self) -> (u32, u32) {
        *self.counts.lock().unwrap()
    }
}

impl Drop for CordonCount {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_follower_taking_over_mid_drain_keeps_the_drain_it_has_not_fetched_yet() {
    // Two replicas; the follower fetched once when it warmed up and has
    // only relayed the webhook since, so the bump the leader applied is not
    // in its cache when it takes over. Not knowing the applied config is
    // not "no config": the drain is kept, not abandoned and redone.
    let w = world_with("giveback-takeover", 0, None, false).await;
    let a = start_agent(&w.repo, &w.ns, "agent-a");
    let b = start_agent(&w.repo, &w.ns, "agent-b");
    await_confirmed(&w.client, &w.ns).await;
    let leases: Api<Lease> = Api::namespaced(w.client.clone(), w.ns.name());
    let holder = leases
        .get("drover-test-test-1")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    let (leader, follower, survivor) = if holder == "agent-a" {
        (a, b, "agent-b")
    } else {
        (b, a, "agent-a")
    };
    let bump = w.repo.bump("test", "1.13.0", true);
    // The webhook reaches the follower, which relays it to the leader.
    assert_eq!(follower.webhook().await, 202);
    await_node_record(
        &w.client,
        w.ns.name(),
        &w.node,
        "cordoned and draining",
        draining,
    )
    .await;
    let cordons = CordonCount::start(&w.client, &w.node).await;
    leader.kill();
    // The survivor leads, has fetched the bump and acts on it.
    await_status(
        &w.client,
        w.ns.name(),
        "test-test-1",
        "the survivor reports on the applied bump",
        |s| {
            s.reporter.as_deref() == Some(survivor)
                && s.last_applied_commit.as_deref() == Some(bump.as_str())
                && s.head_commit.as_deref() == Some(bump.as_str())
        },
    )
    .await;
    let n = Api::<Node>::all(w.client.clone())
        .get(&w.node)
        .await
        .unwrap();
    let p = progress_of(&w.client, w.ns.name(), &w.node).await;
    assert!(draining(&n, p.as_ref()), "still draining: {p:?}");
    assert_eq!(cordons.get(), (0, 0), "(cordons, uncordons) since the kill");
    // The drain it kept finishes once the PDB allows it: one cordon, one
    // uncordon, one upgrade in all.
    w.lift_pdb_and_await_upgraded("upgraded by the survivor")
        .await;
    assert_eq!(cordons.get(), (0, 1), "(cordons, uncordons) since the kill");
    assert_eq!(w.sim.upgrades_started(&w.node), 1);
    follower.stop();
    w.sim.shutdown().await;
}
