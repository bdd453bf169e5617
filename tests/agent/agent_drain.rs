//! Drain rules (`[[drain]]`, docs/config.md): a single-replica Deployment
//! (PodDisruptionBudget `minAvailable: 1`, `maxSurge: 1`) drained by the
//! `restart` rung with no moment of zero Ready replicas, measured by a
//! watch of the test's own; a single-replica StatefulSet completing where
//! a rule restarts it; no pod deleted by any ladder without `allow_delete`
//! (and deleted with it, the control); every rung used in the node's
//! record, a Warning Event, and the signed report. Against the real API
//! server with simulated kubelet nodes. No controller-manager runs there,
//! so the test plays the Deployment and StatefulSet controllers for the
//! one workload (`Controller`), creating the new pod on another node, which
//! the simulated kubelet makes Ready.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{
    await_node_record, pool_options, request_retry, start_sim, POOL_LABEL,
};
use crate::support::kube::{
    await_gone, await_object, await_pdb, await_pod, controller_ref, events_for, os_image,
    pdb_min_available, pdb_settled, pod_held_by_a_pdb, pod_on, pod_running_ready, unschedulable,
    ControlPlane, TestNamespace,
};
use crate::support::kubelet::Kubelet;
use drover::cluster::ProgressState;
use drover::config::DRAIN_TAINT;
use drover::record::wire::DroverNode;
use drover::rollout::VirtualClock;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

const STEP: Duration = Duration::from_secs(60);

/// Two simulated nodes, an agent at 1.12.0 in an open window, one node at
/// a time; the workload is made by the test before the bump.
struct World {
    client: Client,
    ns: TestNamespace,
    sim: Kubelet,
    nodes: Vec<String>,
    repo: ConfigRepo,
    agent: RunningAgent,
}

async fn world(prefix: &str) -> World {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    repo.set_max_unavailable(1);
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let agent = RunningAgent::start(cfg, clock, None);
    await_status(&client, ns.name(), "test-test-1", "confirmed", |s| {
        s.state.as_deref() == Some("confirmed")
    })
    .await;
    World {
        client,
        ns,
        sim,
        nodes,
        repo,
        agent,
    }
}

impl World {
    /// Bump to 1.13.0 with `rules` as the file's `[[drain]]` tables.
    async fn bump_with(&self, rules: &str) {
        self.repo.set_drain(rules);
        self.repo.bump("test", "1.13.0", true);
        assert_eq!(self.agent.webhook().await, 202);
    }

    /// Wait until both nodes run 1.13.0 and the cluster confirmed it.
    async fn await_upgraded(&self) {
        await_status(
            &self.client,
            self.ns.name(),
            "test-test-1",
            "both nodes at 1.13.0, confirmed",
            |s| {
                s.state.as_deref() == Some("confirmed")
                    && s.target.as_deref() == Some("1.13.0")
                    && s.at_version.as_deref() == Some("2/2")
            },
        )
        .await;
    }

    /// The signed report once its detail names a drain rung with `needle`.
    async fn report_naming(&self, needle: &str) -> drover::status::StatusReport {
        until_pass(&self.agent.handle, "report naming the rung", STEP, || {
            self.repo
                .report("test", "test-1")
                .is_some_and(|r| r.detail.drain_rungs.iter().any(|l| l.contains(needle)))
        })
        .await;
        self.repo.report("test", "test-1").unwrap()
    }

    /// The Warning Events `DrainRung` about `node`.
    async fn rung_events(&self, node: &str) -> Vec<String> {
        events_for(&self.client, "default", node)
            .await
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("DrainRung") && e.type_.as_deref() == Some("Warning")
            })
            .map(|e| e.note.unwrap_or_default())
            .collect()
    }
}

/// A pod of the workload `app=web` on `node`, owned by `by`.
fn web_pod(name: &str, node: &str, by: OwnerReference) -> Pod {
    let mut pod = pod_on(name, node, &[("app", "web")], 1);
    pod.metadata.owner_references = Some(vec![by]);
    pod
}

fn template() -> serde_json::Value {
    json!({
        "metadata": { "labels": { "app": "web" } },
        "spec": { "containers": [{ "name": "app", "image": "registry.example/app:1" }] },
    })
}

/// Which workload the test's controller plays.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Deployment,
    StatefulSet,
}

/// The one workload `web` (one replica) with its pod on `node`, its
/// status current, and a PDB `minAvailable: 1` over it: no eviction of
/// its pod is ever allowed.
pub(crate) async fn workload(client: &Client, ns: &str, node: &str, kind: Kind) {
    let pp = PostParams::default();
    let (owner_ref, pod) = match kind {
        Kind::Deployment => {
            let d: Deployment = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": { "name": "web" },
                "spec": {
                    "replicas": 1,
                    "selector": { "matchLabels": { "app": "web" } },
                    "strategy": { "type": "RollingUpdate",
                                  "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } },
                    "template": template(),
                },
            }))
            .unwrap();
            let d = Api::<Deployment>::namespaced(client.clone(), ns)
                .create(&pp, &d)
                .await
                .unwrap();
            let rs = replicaset(client, ns, &d, 1).await;
            (
                controller_ref("ReplicaSet", &rs.name_any(), &rs.uid().unwrap()),
                "web-1",
            )
        }
        Kind::StatefulSet => {
            let s: StatefulSet = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": { "name": "web" },
                "spec": {
                    "replicas": 1,
                    "serviceName": "web",
                    "selector": { "matchLabels": { "app": "web" } },
                    "template": template(),
                },
            }))
            .unwrap();
            let s = Api::<StatefulSet>::namespaced(client.clone(), ns)
                .create(&pp, &s)
                .await
                .unwrap();
            (
                controller_ref("StatefulSet", "web", &s.uid().unwrap()),
                "web-0",
            )
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&pp, &web_pod(pod, node, owner_ref))
        .await
        .unwrap();
    await_pod(client, ns, pod, "Running and Ready", pod_running_ready).await;
    settle_status(client, ns, kind).await;
    Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .create(&pp, &pdb_min_available("web", "web", json!(1)))
        .await
        .unwrap();
    await_pdb(client, ns, "web", "0 allowed", |p| {
        pdb_settled(p, |s| {
            s.current_healthy == Some(1) && s.disruptions_allowed == Some(0)
        })
    })
    .await;
}

/// A ReplicaSet `web-<n>` of `d`.
async fn replicaset(client: &Client, ns: &str, d: &Deployment, n: u32) -> ReplicaSet {
    let rs: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": { "name": format!("web-rs{n}"),
                      "ownerReferences": [controller_ref("Deployment", "web", &d.uid().unwrap())] },
        "spec": { "replicas": 1, "selector": { "matchLabels": { "app": "web" } },
                  "template": template() },
    }))
    .unwrap();
    Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &rs)
        .await
        .unwrap()
}

/// The workload's status as its controller writes it once a rollout is
/// done: observed, one replica updated, ready and available.
async fn settle_status(client: &Client, ns: &str, kind: Kind) {
    let pp = PatchParams::default();
    match kind {
        Kind::Deployment => {
            let api = Api::<Deployment>::namespaced(client.clone(), ns);
            let g = api.get("web").await.unwrap().metadata.generation;
            let st = json!({ "status": { "observedGeneration": g, "replicas": 1,
                "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1 } });
            api.patch_status("web", &pp, &Patch::Merge(&st))
                .await
                .unwrap();
        }
        Kind::StatefulSet => {
            let api = Api::<StatefulSet>::namespaced(client.clone(), ns);
            let g = api.get("web").await.unwrap().metadata.generation;
            let st = json!({ "status": { "observedGeneration": g, "replicas": 1,
                "readyReplicas": 1, "currentReplicas": 1, "updatedReplicas": 1,
                "currentRevision": format!("web-{}", g.unwrap_or(0)),
                "updateRevision": format!("web-{}", g.unwrap_or(0)) } });
            api.patch_status("web", &pp, &Patch::Merge(&st))
                .await
                .unwrap();
        }
    }
}

/// A schedulable node of the pool other than `but`: not cordoned, not
/// tainted by drover's pre-drain taint.
async fn schedulable_node(client: &Client, ns: &str, but: &str) -> String {
    let nodes: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{POOL_LABEL}={ns}"));
    let mut stream = watcher(
        nodes,
        watcher::Config::default().labels(&format!("{POOL_LABEL}={ns}")),
    )
    .boxed();
    let fits = |n: &Node| {
        n.name_any() != but
            && !unschedulable(n)
            && !n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == DRAIN_TAINT))
    };
    let list = Api::<Node>::all(client.clone()).list(&lp).await.unwrap();
    if let Some(n) = list.items.iter().find(|n| fits(n)) {
        return n.name_any();
    }
    while let Some(ev) = stream.next().await {
        if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev {
            if fits(&n) {
                return n.name_any();
            }
        }
    }
    unreachable!("the node watch ended")
}

/// Wait until the owner "web" has a generation its status (`observed`)
/// has not caught up with.
async fn template_changed<K>(client: &Client, ns: &str, observed: fn(&K) -> Option<i64>)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(client.clone(), ns);
    kube::runtime::wait::await_condition(api, "web", move |o: Option<&K>| {
        o.is_some_and(|o| o.meta().generation.unwrap_or(0) > observed(o).unwrap_or(0))
    })
    .await
    .unwrap();
}

/// The test's controller for the one workload: on every change of its
/// pod template (drover's restart), it rolls the workload as the real
/// controller does. A Deployment (`maxSurge: 1`, `maxUnavailable: 0`):
/// a new ReplicaSet and pod on another schedulable node, Ready, then the
/// old pod deleted. A StatefulSet: its pod deleted, then made again on
/// another schedulable node. Returns the rollouts it made.
pub(crate) async fn controller(client: Client, ns: String, kind: Kind) -> u32 {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut rollouts = 0;
    loop {
        // Wait for a template change the status has not observed.
        match kind {
            Kind::Deployment => {
                template_changed::<Deployment>(&client, &ns, |d| {
                    d.status.as_ref().and_then(|s| s.observed_generation)
                })
                .await
            }
            Kind::StatefulSet => {
                template_changed::<StatefulSet>(&client, &ns, |s| {
                    s.status.as_ref().and_then(|s| s.observed_generation)
                })
                .await
            }
        }
        rollouts += 1;
        let old: Vec<Pod> = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        let old_node = old
            .first()
            .and_then(|p| p.spec.as_ref()?.node_name.clone())
            .unwrap_or_default();
        match kind {
            Kind::Deployment => {
                let d = Api::<Deployment>::namespaced(client.clone(), &ns)
                    .get("web")
                    .await
                    .unwrap();
                let rs = replicaset(&client, &ns, &d, rollouts + 1).await;
                let to = schedulable_node(&client, &ns, &old_node).await;
                let name = format!("web-{}", rollouts + 1);
                let by = controller_ref("ReplicaSet", &rs.name_any(), &rs.uid().unwrap());
                pods.create(&PostParams::default(), &web_pod(&name, &to, by))
                    .await
                    .unwrap();
                await_pod(&client, &ns, &name, "the surge Ready", pod_running_ready).await;
                for p in &old {
                    let _ = pods.delete(&p.name_any(), &Default::default()).await;
                }
                for p in &old {
                    await_gone(&pods, &p.name_any()).await;
                }
            }
            Kind::StatefulSet => {
                for p in &old {
                    let _ = pods.delete(&p.name_any(), &Default::default()).await;
                    await_gone(&pods, &p.name_any()).await;
                }
                let s = Api::<StatefulSet>::namespaced(client.clone(), &ns)
                    .get("web")
                    .await
                    .unwrap();
                let to = schedulable_node(&client, &ns, &old_node).await;
                let by = controller_ref("StatefulSet", "web", &s.uid().unwrap());
                pods.create(&PostParams::default(), &web_pod("web-0", &to, by))
                    .await
                    .unwrap();
                await_pod(
                    &client,
                    &ns,
                    "web-0",
                    "made again, Ready",
                    pod_running_ready,
                )
                .await;
            }
        }
        settle_status(&client, &ns, kind).await;
    }
}

/// The test's own measure of the workload's availability: a watch of the
/// pods `app=web`, summing the time no pod of it was Ready (terminating
/// pods count as not Ready) from the first Ready pod on.
#[derive(Clone, Default)]
struct Availability(Arc<Mutex<AvailabilityState>>);

#[derive(Default)]
struct AvailabilityState {
    ready: BTreeMap<String, bool>,
    seen_ready: bool,
    down_since: Option<Instant>,
    down: Duration,
    outages: u32,
}

impl Availability {
    fn start(client: &Client, ns: &str) -> (Availability, tokio::task::JoinHandle<()>) {
        let me = Availability::default();
        let state = me.0.clone();
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let task = tokio::spawn(async move {
            let mut stream = watcher(pods, watcher::Config::default().labels("app=web")).boxed();
            while let Some(ev) = stream.next().await {
                let mut s = state.lock().unwrap();
                match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        let up = pod_running_ready(&p) && p.metadata.deletion_timestamp.is_none();
                        s.ready.insert(p.name_any(), up);
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        s.ready.remove(&p.name_any());
                    }
                    _ => continue,
                }
                let up = s.ready.values().any(|r| *r);
                s.seen_ready |= up;
                match (up, s.down_since) {
                    (false, None) if s.seen_ready => {
                        s.down_since = Some(Instant::now());
                        s.outages += 1;
                    }
                    (true, Some(t)) => {
                        s.down += t.elapsed();
                        s.down_since = None;
                    }
                    _ => {}
                }
            }
        });
        (me, task)
    }

    /// (time with no Ready replica, outages) so far.
    fn measured(&self) -> (Duration, u32) {
        let s = self.0.lock().unwrap();
        let open = s.down_since.map_or(Duration::ZERO, |t| t.elapsed());
        (s.down + open, s.outages)
    }
}

pub(crate) const SINGLETONS: &str =
    "[[drain]]\nname = \"singletons\"\nselector = \"app=web\"\nladder = [\"restart\"]\n";

#[tokio::test]
async fn a_single_replica_deployment_is_drained_by_a_restart_with_no_moment_without_a_ready_replica(
) {
    let w = world("drain-deploy").await;
    workload(&w.client, w.ns.name(), &w.nodes[0], Kind::Deployment).await;
    let (availability, watch) = Availability::start(&w.client, w.ns.name());
    let ctl = tokio::spawn(controller(
        w.client.clone(),
        w.ns.name().to_string(),
        Kind::Deployment,
    ));
    w.bump_with(SINGLETONS).await;
    w.await_upgraded().await;
    let (down, outages) = availability.measured();
    watch.abort();
    ctl.abort();
    assert_eq!(
        (down, outages),
        (Duration::ZERO, 0),
        "the Deployment had no Ready replica for {down:?} in {outages} outages"
    );
    // Restarted, never evicted nor deleted: the PDB allowed nothing.
    let d = Api::<Deployment>::namespaced(w.client.clone(), w.ns.name())
        .get("web")
        .await
        .unwrap();
    assert!(d.metadata.generation.unwrap_or(0) >= 2, "{d:?}");
    for n in &w.nodes {
        assert!(
            os_image(&Api::<Node>::all(w.client.clone()).get(n).await.unwrap()).contains("1.13.0")
        );
    }
    // The evidence: the report, a Warning on the node.
    let report = w.report_naming("restart (rule singletons").await;
    assert!(
        report
            .detail
            .drain_rungs
            .iter()
            .any(|l| l.starts_with(&format!(
                "{}: restart (rule singletons, attempt 1): restarted Deployment",
                w.nodes[0]
            ))),
        "{:?}",
        report.detail
    );
    let evs = w.rung_events(&w.nodes[0]).await;
    assert!(
        evs.iter()
            .any(|e| e.contains("drain rule singletons: restart: restarted Deployment")),
        "{evs:?}"
    );
    w.sim.shutdown().await;
}

#[tokio::test]
async fn a_single_replica_statefulset_completes_where_a_rule_restarts_it() {
    let w = world("drain-sts").await;
    workload(&w.client, w.ns.name(), &w.nodes[0], Kind::StatefulSet).await;
    let (availability, watch) = Availability::start(&w.client, w.ns.name());
    let ctl = tokio::spawn(controller(
        w.client.clone(),
        w.ns.name().to_string(),
        Kind::StatefulSet,
    ));
    w.bump_with(SINGLETONS).await;
    w.await_upgraded().await;
    ctl.abort();
    // The control of the Deployment's measure: a StatefulSet's restart
    // deletes its one pod before making it again, and the watch sees it.
    let (down, outages) = availability.measured();
    watch.abort();
    assert!(outages >= 1 && down > Duration::ZERO, "{down:?} {outages}");
    let pod = await_pod(&w.client, w.ns.name(), "web-0", "Ready", pod_running_ready).await;
    assert!(pod.spec.unwrap().node_name.is_some());
    let report = w.report_naming("restarted StatefulSet").await;
    assert!(
        report
            .detail
            .drain_rungs
            .iter()
            .any(|l| l.contains("restart (rule singletons")),
        "{:?}",
        report.detail
    );
    w.sim.shutdown().await;
}

/// One rule over the pod `app=web` with `ladder`.
fn rule(ladder: &str, allow_delete: bool) -> String {
    format!(
        "[[drain]]\nname = \"web\"\nselector = \"app=web\"\nladder = {ladder}\nallow_delete = {allow_delete}\n"
    )
}

impl World {
    /// Wait until `node`'s record holds a rung `rung` of the current attempt.
    async fn await_rung(&self, node: &str, rung: &str) {
        let api: Api<DroverNode> = Api::namespaced(self.client.clone(), self.ns.name());
        await_object(&api, node, &format!("the rung {rung} recorded"), |r| {
            r.status.as_ref().is_some_and(|s| {
                s.drain_rungs
                    .iter()
                    .any(|u| u.rung == rung && u.attempt == s.attempt)
            })
        })
        .await;
    }

    /// The deletes of pods in the test's namespace, from the audit log.
    async fn pod_deletes(&self) -> Vec<String> {
        ControlPlane::get()
            .audited(&self.client)
            .await
            .into_iter()
            .filter(|a| a.verb == "delete" && a.resource == "pods" && a.namespace == self.ns.name())
            .map(|a| format!("{} by {}", a.name, a.user_agent))
            .collect()
    }
}

#[tokio::test]
async fn no_ladder_deletes_a_pod_without_an_allow_and_one_that_allows_it_does() {
    let w = world("drain-nodelete").await;
    let node = w.nodes[0].clone();
    // A pod of no controller, its PDB allowing no eviction.
    pod_held_by_a_pdb(&w.client, w.ns.name(), &node).await;
    let pods: Api<Pod> = Api::namespaced(w.client.clone(), w.ns.name());
    let uid = pods.get("web-0").await.unwrap().uid();
    // `restart` on a pod no Deployment or StatefulSet owns: evicted, refused.
    w.bump_with(&rule("[\"restart\"]", false)).await;
    await_node_record(
        &w.client,
        w.ns.name(),
        &node,
        "draining, refused",
        |_, p| {
            p.is_some_and(|p| {
                p.state == ProgressState::Draining && p.message.contains("refused evicting")
            })
        },
    )
    .await;
    // `wait`: left alone.
    w.repo.set_drain(&rule("[\"wait 1h\"]", false));
    w.repo.bump("test", "1.13.0", true);
    assert_eq!(w.agent.webhook().await, 202);
    w.await_rung(&node, "wait").await;
    // `skip`: given back, blocked as skipped, not failed.
    w.repo.set_drain(&rule("[\"skip\"]", false));
    w.repo.bump("test", "1.13.0", true);
    assert_eq!(w.agent.webhook().await, 202);
    await_node_record(
        &w.client,
        w.ns.name(),
        &node,
        "given back, skipped",
        |n, p| {
            !unschedulable(n)
                && p.is_some_and(|p| {
                    p.state == ProgressState::Blocked
                        && p.message.contains("skipped by drain rule web")
                })
        },
    )
    .await;
    assert_eq!(
        pods.get("web-0").await.unwrap().uid(),
        uid,
        "web-0 was replaced"
    );
    assert_eq!(w.pod_deletes().await, Vec::<String>::new());
    let report = w.report_naming("skip (rule web").await;
    assert!(
        report
            .detail
            .drain_rungs
            .iter()
            .any(|l| l.contains("wait (rule web")),
        "{:?}",
        report.detail
    );

    // The control: a rule that allows it deletes the pod, once the node is
    // tried again, and says so.
    w.repo.set_drain(&rule("[\"delete\"]", true));
    w.repo.bump("test", "1.13.0", true);
    assert_eq!(w.agent.webhook().await, 202);
    w.await_rung(&node, "skip").await;
    request_retry(&w.client, w.ns.name(), &node).await;
    w.await_upgraded().await;
    assert!(pods.get_opt("web-0").await.unwrap().is_none());
    // drover's one delete (the simulated kubelet then finishes it, as a
    // kubelet does, with a delete of its own).
    let deletes = w.pod_deletes().await;
    assert_eq!(
        deletes.iter().filter(|d| d.contains(" by drover/")).count(),
        1,
        "{deletes:?}"
    );
    w.report_naming("delete (rule web").await;
    let evs = w.rung_events(&node).await;
    assert!(
        evs.iter()
            .any(|e| e.contains("drain rule web: delete: deleted pod")),
        "{evs:?}"
    );
    w.sim.shutdown().await;
}
