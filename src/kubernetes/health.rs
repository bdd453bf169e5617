//! Health observation (docs/design.md §5a): the conditions of the nodes
//! drover watches and the pods bound to them.
//!
//! Each node's inputs are read whole or not at all: a list that fails or a
//! node with more pods than a read takes ([`MAX_DRAIN_PODS`]) is reported as
//! [`NodeSeen::unread`], and the checks hold rather than judge part of them.
//!
//! - Pods: a node in its `watching` phase keeps a pod watch (within
//!   [`super::KubeOptions::pod_watches`]), which also wakes the agent when a
//!   pod changes, so a crash loop is seen as soon as the kubelet reports it.
//!   Any other node (a settling cluster's, one beyond the cap, one whose
//!   watch has not synced yet) has its pods listed with a field selector on
//!   its name, [`READS_AT_ONCE`] nodes at a time: the cost grows with the
//!   upgraded nodes, never with the cluster.
//! - Conditions (the node watch keeps only what the rollout needs): one read
//!   of the Node for one node, else one paged list of the selected Nodes.

use std::collections::{HashMap, HashSet};

use super::observe::{Observer, MAX_DRAIN_PODS};
use super::Error;
use crate::cluster::{NodeSeen, PodSeen};
use crate::health::observe::{is_watched, node_conditions, pod_seen};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;

/// Nodes listed per page for their conditions.
const PAGE: u32 = 100;
/// Most pages of Nodes read (100,000 nodes): past it the read is an error,
/// never a partial answer.
const MAX_PAGES: usize = 1000;
/// Nodes whose pods are listed at once.
pub const READS_AT_ONCE: usize = 8;

type Conditions = Vec<(String, String)>;

impl Observer {
    /// The health inputs of `nodes`, each read whole or marked unread; a node
    /// that vanished is left out.
    pub(crate) async fn health(&self, nodes: &[String]) -> Result<Vec<NodeSeen>, Error> {
        let conditions = self.conditions_of(nodes).await;
        // Boxed: a stream of borrowing futures in a Send future needs a
        // concrete type for the compiler to see it is Send for every lifetime.
        let reads: Vec<BoxFuture<'_, Option<NodeSeen>>> = nodes
            .iter()
            .map(|name| self.node_health(name, &conditions).boxed())
            .collect();
        let seen: Vec<Option<NodeSeen>> = futures::stream::iter(reads)
            .buffered(READS_AT_ONCE)
            .collect()
            .await;
        Ok(seen.into_iter().flatten().collect())
    }

    async fn node_health(
        &self,
        name: &str,
        conditions: &Result<HashMap<String, Conditions>, String>,
    ) -> Option<NodeSeen> {
        let conditions = match conditions {
            Ok(all) => all.get(name)?.clone(),
            Err(why) => return Some(NodeSeen::unread(name, why.clone())),
        };
        match self.watched_pods(name).await {
            Ok(mut pods) => {
                pods.sort_by(|a, b| a.name.cmp(&b.name));
                Some(NodeSeen {
                    name: name.to_string(),
                    conditions,
                    pods,
                    unread: None,
                })
            }
            Err(e) => Some(NodeSeen::unread(
                name,
                format!("its pods cannot be read: {e}"),
            )),
        }
    }

    /// The watched pods of `node`: from its pod watch when it has one that
    /// synced, else listed now; all of them or an error.
    async fn watched_pods(&self, node: &str) -> Result<Vec<PodSeen>, Error> {
        let seen = |pods: &mut dyn Iterator<Item = &Pod>| {
            pods.filter(|p| is_watched(p)).map(pod_seen).collect()
        };
        match self.pod_store(node) {
            Some(store) => {
                let pods = store.state();
                if pods.len() > MAX_DRAIN_PODS {
                    return Err(Error::TooManyPods {
                        node: node.to_string(),
                        limit: MAX_DRAIN_PODS,
                    });
                }
                Ok(seen(&mut pods.iter().map(|p| p.as_ref())))
            }
            None => Ok(seen(&mut self.list_pods(node).await?.iter())),
        }
    }

    /// The conditions of `nodes`, by name (a vanished node is missing), or
    /// why they cannot be read.
    async fn conditions_of(&self, nodes: &[String]) -> Result<HashMap<String, Conditions>, String> {
        let api: Api<Node> = Api::all(self.client.clone());
        if let [name] = nodes {
            return match api.get_opt(name).await {
                Ok(Some(n)) => Ok(HashMap::from([(name.clone(), node_conditions(&n))])),
                Ok(None) => Ok(HashMap::new()),
                Err(e) => Err(format!("cannot read node {name}: {e}")),
            };
        }
        let wanted: HashSet<&str> = nodes.iter().map(String::as_str).collect();
        let mut lp = ListParams::default().limit(PAGE);
        if !self.opts.node_selector.is_empty() {
            lp = lp.labels(&self.opts.node_selector);
        }
        let mut out = HashMap::new();
        for _ in 0..MAX_PAGES {
            let page = api
                .list(&lp)
                .await
                .map_err(|e| format!("cannot list the nodes for their health: {e}"))?;
            for n in &page.items {
                let name = n.name_any();
                if wanted.contains(name.as_str()) {
                    out.insert(name, node_conditions(n));
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp = lp.continue_token(&c),
                None => return Ok(out),
            }
        }
        Err(format!(
            "more than {} selected nodes: their health is not read in part",
            PAGE as usize * MAX_PAGES
        ))
    }
}
