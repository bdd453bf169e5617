//! The pods of the nodes drover acts on, as the observation reads them: a
//! field-selected watch per node whose health is watched or whose blocked
//! drain may retry early (at most [`super::observe::MAX_POD_WATCHES`]),
//! a list every [`super::observe::BLOCKED_POLL`] for blocked nodes beyond
//! that, and a fresh list per drain pass for a draining node, kept for the
//! drain of the same pass (see `observe.rs`).

use super::objects::budgets_allow;
use super::observe::{
    bump, lock, spawn_reflector, Observer, PodWatch, BLOCKED_POLL, DRAIN_LIST_FRESH,
    LIST_PAGE_SIZE, MAX_DRAIN_PODS,
};
use super::Error;
use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::ResourceExt;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

impl Observer {
    /// The pod store of `node` if its watch has delivered its first list:
    /// the watch is started when the node is in the watch plan and has none;
    /// `None` while it syncs (its first list wakes the engine) and for a node
    /// beyond the plan. Never waits.
    pub(crate) fn pod_store(&self, node: &str) -> Option<Store<Pod>> {
        let store = {
            let mut watches = lock(&self.pod_watches);
            match watches.get(node) {
                Some(w) => w.store.clone(),
                None => {
                    if !lock(&self.watch_plan).contains(node) {
                        return None;
                    }
                    let (store, writer) = reflector::store::<Pod>();
                    let tx = self.changes.clone();
                    let task = spawn_reflector(
                        Api::<Pod>::all(self.client.clone()),
                        watcher::Config::default().fields(&format!("spec.nodeName={node}")),
                        writer,
                        format!("pods on node {node}"),
                        |_| {},
                        move |ev| {
                            if !matches!(ev, watcher::Event::Init | watcher::Event::InitApply(_)) {
                                bump(&tx);
                            }
                        },
                    );
                    watches.insert(
                        node.to_string(),
                        PodWatch {
                            store: store.clone(),
                            task,
                        },
                    );
                    store
                }
            }
        };
        matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))).then_some(store)
    }

    /// Whether every budget covering the pods a drain of blocked `node`
    /// would evict allows a disruption now: from its pod watch, or beyond
    /// the cap from a list made at most every [`BLOCKED_POLL`]. No answer
    /// (the watch syncing, the list failing) is `false`: the node then waits
    /// out its backoff, which is only ever shortened by this.
    pub(super) async fn blocked_budgets_allow(&self, node: &str) -> bool {
        if let Some(store) = self.pod_store(node) {
            return budgets_allow(&self.pdbs.state(), &store.state());
        }
        if lock(&self.watch_plan).contains(node) {
            return false;
        }
        if let Some((at, allow)) = lock(&self.polled).get(node) {
            if at.elapsed() < BLOCKED_POLL {
                return *allow;
            }
        }
        let allow = match self.list_pods(node).await {
            Ok(pods) => {
                let pods: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
                budgets_allow(&self.pdbs.state(), &pods)
            }
            Err(e) => {
                tracing::debug!(node, error = %e, "cannot list a blocked node's pods");
                false
            }
        };
        lock(&self.polled).insert(node.to_string(), (Instant::now(), allow));
        allow
    }

    /// The pods of draining `node` to evict as this pass's observation
    /// listed them, if it did within [`DRAIN_LIST_FRESH`]; taken, so a
    /// second drain without a new observation lists afresh.
    pub(crate) fn take_drain_list(&self, node: &str) -> Option<Vec<Pod>> {
        let (at, pods) = lock(&self.drain_lists).remove(node)?;
        (at.elapsed() < DRAIN_LIST_FRESH).then_some(pods)
    }

    /// [`Observer::list_pods`], named.
    pub(super) async fn list_named(&self, node: &str) -> (String, Result<Vec<Pod>, Error>) {
        (node.to_string(), self.list_pods(node).await)
    }

    /// The pods bound to `node`, listed now (pages of [`LIST_PAGE_SIZE`], at
    /// most [`MAX_DRAIN_PODS`]): what a drain pass reads, so that no watch
    /// is held open per draining node.
    pub(crate) async fn list_pods(&self, node: &str) -> Result<Vec<Pod>, Error> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let mut lp = ListParams::default()
            .fields(&format!("spec.nodeName={node}"))
            .limit(LIST_PAGE_SIZE);
        let mut pods = Vec::new();
        loop {
            let page = api.list(&lp).await.map_err(|source| Error::Node {
                node: node.to_string(),
                call: "list pods".into(),
                source,
            })?;
            pods.extend(page.items.into_iter().map(|mut p| {
                p.managed_fields_mut().clear();
                p
            }));
            if pods.len() > MAX_DRAIN_PODS {
                return Err(Error::TooManyPods {
                    node: node.to_string(),
                    limit: MAX_DRAIN_PODS,
                });
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp = lp.continue_token(&c),
                None => return Ok(pods),
            }
        }
    }

    // Plan the pod watches (`watching` first, then `blocked`, at most
    // KubeOptions::pod_watches) and stop the others; forget the evictions of nodes no
    // longer draining and the polls of nodes no longer blocked.
    pub(super) fn plan_pod_watches(
        &self,
        draining: &HashSet<String>,
        watching: &[String],
        blocked: &[String],
    ) {
        let plan: HashSet<String> = watching
            .iter()
            .chain(blocked)
            .take(self.opts.pod_watches)
            .cloned()
            .collect();
        lock(&self.evicted).retain(|node, _| draining.contains(node));
        lock(&self.polled).retain(|node, _| blocked.contains(node));
        lock(&self.drain_lists).retain(|node, _| draining.contains(node));
        lock(&self.pod_watches).retain(|node, w| {
            let keep = plan.contains(node);
            if !keep {
                w.task.abort();
            }
            keep
        });
        *lock(&self.watch_plan) = plan;
    }

    /// Pod watches running now.
    pub fn pod_watches(&self) -> usize {
        lock(&self.pod_watches).len()
    }

    /// Whether every pod watch running has delivered its first list.
    pub fn pod_watches_synced(&self) -> bool {
        lock(&self.pod_watches)
            .values()
            .all(|w| matches!(w.store.wait_until_ready().now_or_never(), Some(Ok(()))))
    }
}
