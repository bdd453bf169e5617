//! Crash safety: the engine is stopped abruptly at 20 points of a rollout
//! and restarted each time with a new engine and a new backend (fresh
//! watches). The budget holds at every moment, the rollout completes, and no
//! node is upgraded twice.
//!
//! The crash points are deterministic: a wrapper counts the backend calls
//! of each run and, at call K (seeded), stops for good, either before the
//! call reaches the API server or after it took effect but before the engine
//! sees the answer. The test then aborts the engine's task.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drover::cluster::{
    Cluster, Cordoned, EvictionPass, NodeView, RecordWrite, RunLink, RunStart, Stored,
};
use drover::kubernetes::{Error, KubeCluster};
use drover::rollout::RolloutState;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;

use crate::support::backend::*;
use crate::support::kube::*;

/// Where a run stops.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// Call K never reaches the API server.
    Before(usize),
    /// Call K takes effect; its answer is lost.
    After(usize),
}

struct Crashy {
    inner: KubeCluster,
    calls: AtomicUsize,
    crash: Crash,
    crashed: Arc<Notify>,
}

impl Crashy {
    async fn gate<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let k = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        match self.crash {
            Crash::Before(at) if k >= at => {
                self.crashed.notify_one();
                std::future::pending().await
            }
            Crash::After(at) if k >= at => {
                let _ = call.await;
                self.crashed.notify_one();
                std::future::pending().await
            }
            _ => call.await,
        }
    }
}

impl Cluster for Crashy {
    type Error = Error;
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn observe(&self) -> Result<Vec<NodeView>, Error> {
        self.gate(self.inner.observe()).await
    }
    async fn write_record(&self, w: &RecordWrite) -> Result<Stored, Error> {
        self.gate(self.inner.write_record(w)).await
    }
    async fn cordon(&self, node: &str) -> Result<Cordoned, Error> {
        self.gate(self.inner.cordon(node)).await
    }
    async fn taint(&self, node: &str) -> Result<(), Error> {
        self.gate(self.inner.taint(node)).await
    }
    async fn uncordon(&self, node: &str) -> Result<(), Error> {
        self.gate(self.inner.uncordon(node)).await
    }
    async fn evict(
        &self,
        node: &str,
        order: &drover::cluster::DrainOrder<'_>,
    ) -> Result<EvictionPass, Error> {
        self.gate(self.inner.evict(node, order)).await
    }
    async fn start_run(&self, node: &str, start: &RunStart) -> Result<(), Error> {
        self.gate(self.inner.start_run(node, start)).await
    }
    async fn stop_run(&self, node: &str, run: &RunLink) -> Result<(), Error> {
        self.gate(self.inner.stop_run(node, run)).await
    }
}

// The engine loop of `support::backend::drive`, over the crashing wrapper.
async fn run(cluster: Crashy, target: &'static str) -> RolloutState {
    let engine = engine(policy(
        target,
        2,
        Duration::from_secs(60),
        Duration::from_secs(60),
    ));
    let inputs = open_window();
    let mut rx = cluster.inner.changes();
    loop {
        rx.borrow_and_update();
        let out = match engine.reconcile(&cluster, &inputs).await {
            Ok(out) => out,
            Err(e) => {
                eprintln!("reconcile failed (retrying): {e}");
                tokio::time::sleep(TICK).await;
                continue;
            }
        };
        if out.decision.state == RolloutState::Confirmed
            || out.decision.state == RolloutState::Failed
        {
            return out.decision.state;
        }
        if out.again {
            continue;
        }
        let wait = if out.retry_evictions {
            Duration::from_millis(250)
        } else {
            TICK
        };
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[tokio::test]
async fn a_rollout_survives_twenty_abrupt_restarts() {
    let (client, ns) = setup("crash").await;
    let sim = start_sim(&client, pool_options(ns.name(), 6)).await;
    let names = sim.node_names();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    for (i, n) in names.iter().enumerate() {
        create(&pods, &pod_on(&format!("app-{i}"), n, &[("app", "app")], 1)).await;
    }
    let watch = BudgetWatch::start(&client, ns.name()).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    let started = std::time::Instant::now();
    let mut crashes = Vec::new();
    for round in 0..20 {
        let k = rng.random_range(1..=8usize);
        let crash = if rng.random_bool(0.5) {
            Crash::Before(k)
        } else {
            Crash::After(k)
        };
        let crashed = Arc::new(Notify::new());
        let cluster = Crashy {
            inner: cluster(ns.name()).await,
            calls: AtomicUsize::new(0),
            crash,
            crashed: crashed.clone(),
        };
        let mut task = tokio::spawn(run(cluster, "1.13.0"));
        let finished = tokio::time::timeout(WAIT, async {
            tokio::select! {
                _ = crashed.notified() => false,
                r = &mut task => { r.expect("engine task"); true }
            }
        })
        .await
        .expect("the crash point is reached");
        if !finished {
            task.abort();
            let _ = task.await;
        }
        crashes.push(format!("round {round}: {crash:?}"));
    }
    // The last run, uninterrupted.
    let done = Crashy {
        inner: cluster(ns.name()).await,
        calls: AtomicUsize::new(0),
        crash: Crash::Before(usize::MAX),
        crashed: Arc::new(Notify::new()),
    };
    let state = tokio::time::timeout(3 * WAIT, run(done, "1.13.0"))
        .await
        .expect("the rollout completes after the crashes");
    assert_eq!(state, RolloutState::Confirmed);
    eprintln!(
        "20 crashes ({crashes:?}) and completion in {:?}",
        started.elapsed()
    );

    let (peak, which) = watch.peak();
    assert!(peak <= 2, "{peak} nodes unavailable at once: {which:?}");
    for n in &names {
        let node = Api::<Node>::all(client.clone()).get(n).await.unwrap();
        assert_eq!(
            sim.upgrades_started(n),
            1,
            "{n} upgraded {} times",
            sim.upgrades_started(n)
        );
        assert!(crate::support::kube::os_image(&node).contains("1.13.0"));
        assert!(
            !node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            "{n} left cordoned"
        );
        assert!(
            no_drover_annotations(&node),
            "{n}: {:?}",
            node.metadata.annotations
        );
        let r = record_of(&client, ns.name(), n).await.expect("a record");
        assert_eq!(r.progress, None, "{n} idle: {r:?}");
    }
    // Finished runs are left to their TTL: one per node, each complete.
    let jobs = Api::<Job>::namespaced(client.clone(), ns.name())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(jobs.items.len(), names.len(), "one run per node");
    for j in &jobs.items {
        assert!(job_condition(j, "Complete"), "{:?}", j.metadata.name);
    }
    sim.shutdown().await;
}
