//! What each drain rung adds to one node's API writes (issue 40: "within
//! the published budget plus what each rung used costs"), counted from the
//! API server's audit log by the agent's own User-Agent, as
//! `agent_writes` counts the budget of 7 (`[driver] prepare`, no rule).
//! One node upgraded to 1.13.0 per test, through a rule that uses one
//! rung: `taint`, `wait`, `delete`, `restart` (a Deployment of one
//! replica, the test playing its controller, `agent_drain`), and `skip`
//! (the attempt given back, counted until it is). Each test asserts the
//! exact writes; BENCHMARKS.md ("API writes per drain rung") has the
//! figures and the command.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::agent_writes::{counts, given_back_at_target, node_writes};
use crate::support::agent::*;
use crate::support::backend::{await_node_record, pool_options, start_sim};
use crate::support::kube::{create, pod_held_by_a_pdb, pod_on, ControlPlane, TestNamespace};
use crate::support::kubelet::Kubelet;
use chrono::Utc;
use drover::cluster::ProgressState;
use drover::rollout::VirtualClock;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::Client;

/// One rung's world: a pool of `n` nodes, an agent at 1.12.0 in its open
/// window (Dec 1, 03:00, virtual: the test moves it) sending `ua`.
struct Rung {
    client: Client,
    ns: TestNamespace,
    sim: Kubelet,
    nodes: Vec<String>,
    repo: ConfigRepo,
    agent: RunningAgent,
    clock: VirtualClock,
    ua: String,
}

async fn rung_world(prefix: &str, n: usize) -> Rung {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    let mut opts = pool_options(ns.name(), n);
    opts.reboot = Duration::from_secs(1);
    let sim = start_sim(&client, opts).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    repo.set_max_unavailable(1);
    let ua = format!("drover-test-{prefix}/1");
    let mut config = config_as(None).await;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&ua).unwrap(),
    ));
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-r");
    cfg.poll = Duration::from_secs(600);
    let clock = VirtualClock::new(dec(1, 3, 0));
    let agent = RunningAgent::start_with_config(cfg, Arc::new(clock.clone()), config);
    await_status(&client, ns.name(), "test-test-1", "confirmed", |s| {
        s.state.as_deref() == Some("confirmed")
    })
    .await;
    Rung {
        client,
        ns,
        sim,
        nodes,
        repo,
        agent,
        clock,
        ua,
    }
}

impl Rung {
    /// Bump to 1.13.0 with `rules`; returns when the bump was sent.
    async fn bump_with(&self, rules: &str) -> chrono::DateTime<Utc> {
        let from = Utc::now();
        self.repo.set_drain(rules);
        self.repo.bump("test", "1.13.0", true);
        assert_eq!(self.agent.webhook().await, 202);
        from
    }

    /// Wait until `node`'s record holds the rung `rung` of its attempt.
    async fn await_rung(&self, node: &str, rung: &str) {
        let api: Api<drover::record::wire::DroverNode> =
            Api::namespaced(self.client.clone(), self.ns.name());
        crate::support::kube::await_object(&api, node, &format!("the rung {rung}"), |r| {
            r.status.as_ref().is_some_and(|s| {
                s.drain_rungs
                    .iter()
                    .any(|u| u.rung == rung && u.attempt == s.attempt)
            })
        })
        .await;
    }

    /// Wait until `node` runs 1.13.0, given back; then every write about
    /// it since `from` (the Events published off the loop are awaited
    /// over a few passes).
    async fn writes_until_upgraded(
        &self,
        node: &str,
        from: chrono::DateTime<Utc>,
    ) -> BTreeMap<String, usize> {
        await_node_record(
            &self.client,
            self.ns.name(),
            node,
            "upgraded and given back",
            given_back_at_target,
        )
        .await;
        self.settled_writes(node, from, Some(Utc::now())).await
    }

    /// The writes about `node` since `from`, once two passes went by
    /// without a new one (the Event publisher is off the loop).
    /// Pods, Deployments and StatefulSets are the namespace's, not the
    /// node's: with `done`, those written after it belong to the next
    /// node's drain (its restart of the same one-replica owner, whose pod
    /// moved there), not to this one's.
    async fn settled_writes(
        &self,
        node: &str,
        from: chrono::DateTime<Utc>,
        done: Option<chrono::DateTime<Utc>>,
    ) -> BTreeMap<String, usize> {
        let cp = ControlPlane::get();
        let mut last = BTreeMap::new();
        let mut same = 0;
        for _ in 0..60 {
            until_pass(
                &self.agent.handle,
                "a pass",
                Duration::from_secs(30),
                || true,
            )
            .await;
            let log: Vec<_> = cp
                .audited(&self.client)
                .await
                .into_iter()
                .filter(|a| {
                    let shared =
                        matches!(a.resource.as_str(), "pods" | "deployments" | "statefulsets");
                    !(shared && done.is_some_and(|d| a.received > d))
                })
                .collect();
            let (landed, _) = node_writes(&log, &self.ua, from, self.ns.name(), node);
            if landed == last {
                same += 1;
                if same >= 3 {
                    break;
                }
            } else {
                same = 0;
                last = landed;
            }
        }
        println!("{}: writes about {node}: {last:?}", self.ua);
        last
    }
}

/// The budget's writes (`agent_writes`: with `prepare`, 7) and `extra`.
fn budget_and(extra: &[(&str, usize)]) -> BTreeMap<String, usize> {
    let mut want = counts(&[
        ("create drovernodes", 1),
        ("patch drovernodes", 2),
        ("create jobs", 2),
        ("patch nodes", 2),
    ]);
    for (k, n) in extra {
        *want.entry(k.to_string()).or_default() += n;
    }
    want
}

fn total(m: &BTreeMap<String, usize>) -> usize {
    m.values().sum()
}

#[tokio::test]
async fn the_taint_rung_costs_its_taint_and_its_event() {
    let r = rung_world("rw-taint", 1).await;
    let node = r.nodes[0].clone();
    let pods: Api<Pod> = Api::namespaced(r.client.clone(), r.ns.name());
    create(&pods, &pod_on("web", &node, &[("app", "web")], 1)).await;
    let from = r
        .bump_with("[[drain]]\nname = \"db\"\nselector = \"app=web\"\ntaint = \"1m\"\nladder = [\"evict\"]\n")
        .await;
    r.await_rung(&node, "taint").await;
    // The lead is over: cordoned, drained, upgraded.
    r.clock.set(dec(1, 3, 2));
    let got = r.writes_until_upgraded(&node, from).await;
    // The taint (a node patch; the uncordon removes it in its own patch)
    // and the DrainRung Event; the rung is recorded in the drain's first
    // record write, which the budget counts already.
    let want = budget_and(&[("patch nodes", 1), ("create events", 1)]);
    assert_eq!(got, want);
    assert_eq!(total(&got), 7 + 2);
    r.sim.shutdown().await;
}

#[tokio::test]
async fn the_wait_rung_costs_its_record_write_and_its_event() {
    let r = rung_world("rw-wait", 1).await;
    let node = r.nodes[0].clone();
    let pods: Api<Pod> = Api::namespaced(r.client.clone(), r.ns.name());
    create(&pods, &pod_on("web", &node, &[("app", "web")], 1)).await;
    let from = r
        .bump_with(
            "[[drain]]\nname = \"web\"\nselector = \"app=web\"\nladder = [\"wait 1m\", \"evict\"]\n",
        )
        .await;
    r.await_rung(&node, "wait").await;
    r.clock.set(dec(1, 3, 2));
    let got = r.writes_until_upgraded(&node, from).await;
    let want = budget_and(&[("patch drovernodes", 1), ("create events", 1)]);
    assert_eq!(got, want);
    assert_eq!(total(&got), 7 + 2);
    r.sim.shutdown().await;
}

#[tokio::test]
async fn the_delete_rung_costs_its_delete_its_record_write_and_its_event() {
    let r = rung_world("rw-delete", 1).await;
    let node = r.nodes[0].clone();
    // Held by a PDB that allows nothing: only the delete moves it.
    pod_held_by_a_pdb(&r.client, r.ns.name(), &node).await;
    let from = r
        .bump_with(
            "[[drain]]\nname = \"web\"\nselector = \"app=web\"\nladder = [\"delete\"]\nallow_delete = true\n",
        )
        .await;
    let got = r.writes_until_upgraded(&node, from).await;
    let want = budget_and(&[
        ("delete pods", 1),
        ("patch drovernodes", 1),
        ("create events", 1),
    ]);
    assert_eq!(got, want);
    assert_eq!(total(&got), 7 + 3);
    r.sim.shutdown().await;
}

#[tokio::test]
async fn the_restart_rung_costs_its_restart_its_record_write_and_its_event() {
    use crate::agent_drain::{controller, workload, Kind, SINGLETONS};
    let r = rung_world("rw-restart", 2).await;
    let node = r.nodes[0].clone();
    workload(&r.client, r.ns.name(), &node, Kind::Deployment).await;
    let ctl = tokio::spawn(controller(
        r.client.clone(),
        r.ns.name().to_string(),
        Kind::Deployment,
    ));
    let from = r.bump_with(SINGLETONS).await;
    let got = r.writes_until_upgraded(&node, from).await;
    ctl.abort();
    let want = budget_and(&[
        ("patch deployments", 1),
        ("patch drovernodes", 1),
        ("create events", 1),
    ]);
    assert_eq!(got, want);
    assert_eq!(total(&got), 7 + 3);
    r.sim.shutdown().await;
}

#[tokio::test]
async fn the_skip_rung_gives_the_attempt_back_for_its_record_write_its_event_and_the_give_back() {
    let r = rung_world("rw-skip", 1).await;
    let node = r.nodes[0].clone();
    pod_held_by_a_pdb(&r.client, r.ns.name(), &node).await;
    let from = r
        .bump_with("[[drain]]\nname = \"web\"\nselector = \"app=web\"\nladder = [\"skip\"]\n")
        .await;
    await_node_record(
        &r.client,
        r.ns.name(),
        &node,
        "given back, skipped",
        |_, p| p.is_some_and(|p| p.state == ProgressState::Blocked),
    )
    .await;
    let got = r.settled_writes(&node, from, None).await;
    // The attempt up to its give-back: its record (preparing, created),
    // the prepare Job, its record (draining), the cordon; then the skip's
    // record write and Event, the uncordon and its record (blocked) with
    // the give-back's Event (DrainBlocked). No upgrade Job.
    let want = counts(&[
        ("create drovernodes", 1),
        ("patch drovernodes", 3),
        ("create jobs", 1),
        ("patch nodes", 2),
        ("create events", 2),
    ]);
    assert_eq!(got, want);
    r.sim.shutdown().await;
}
