//! Health observation (docs/design.md §5a): the conditions of the nodes
//! drover watches and the pods bound to them.
//!
//! A node in its `watching` phase (at most `max_unavailable` of them) keeps
//! the per-node pod watch the drain started, which also wakes the agent when
//! a pod changes, so a crash loop is seen as soon as the kubelet reports it;
//! its conditions come from one read of the Node (the node watch keeps only
//! what the rollout needs). During settle every node is judged: then one
//! paged list of the selected Nodes and one paged list of Pods serve them
//! all, so the cost does not grow into a watch or a read per node.

use std::collections::{BTreeMap, HashSet};

use super::observe::Observer;
use super::Error;
use crate::cluster::{NodeSeen, PodSeen};
use crate::health::observe::{is_watched, node_conditions, pod_seen};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;

/// Most pods reported per node: a node runs at most a few hundred (the
/// kubelet's default `maxPods` is 110), so this only bounds a hostile case.
const MAX_PODS_PER_NODE: usize = 1000;
/// Objects per page of the settle lists.
const PAGE: u32 = 250;
/// Most pages read per list (so 250,000 objects): a bound, not a target.
const MAX_PAGES: usize = 1000;
/// Up to this many nodes without a pod watch are read one by one (a
/// restarted agent's watched node); more is a settling cluster, listed.
const READ_ONE_BY_ONE: usize = 1;

impl Observer {
    /// The health inputs of `nodes`; a node that vanished is left out.
    pub(crate) async fn health(&self, nodes: &[String]) -> Result<Vec<NodeSeen>, Error> {
        let unwatched = nodes.iter().filter(|n| !self.has_pod_watch(n)).count();
        let (one_by_one, listed): (Vec<&String>, Vec<&String>) = if unwatched <= READ_ONE_BY_ONE {
            (nodes.iter().collect(), Vec::new())
        } else {
            nodes.iter().partition(|n| self.has_pod_watch(n))
        };
        let mut out = Vec::with_capacity(nodes.len());
        let api: Api<Node> = Api::all(self.client.clone());
        for name in one_by_one {
            let node = match api.get_opt(name).await {
                Ok(Some(n)) => n,
                Ok(None) => continue,
                Err(source) => {
                    return Err(Error::Node {
                        node: name.clone(),
                        call: "read conditions".into(),
                        source,
                    })
                }
            };
            let store = self.pods_of(name).await?;
            let mut pods: Vec<PodSeen> = store
                .state()
                .iter()
                .filter(|p| is_watched(p))
                .take(MAX_PODS_PER_NODE)
                .map(|p| pod_seen(p))
                .collect();
            pods.sort_by(|a, b| a.name.cmp(&b.name));
            out.push(NodeSeen {
                name: name.clone(),
                conditions: node_conditions(&node),
                pods,
            });
        }
        if !listed.is_empty() {
            out.extend(self.health_listed(&listed).await?);
        }
        Ok(out)
    }

    /// The health inputs of many nodes from one paged list of Nodes and one of Pods.
    async fn health_listed(&self, nodes: &[&String]) -> Result<Vec<NodeSeen>, Error> {
        let wanted: HashSet<&str> = nodes.iter().map(|n| n.as_str()).collect();
        let mut seen: BTreeMap<String, NodeSeen> = BTreeMap::new();
        let api: Api<Node> = Api::all(self.client.clone());
        let mut lp = ListParams::default().limit(PAGE);
        if !self.opts.node_selector.is_empty() {
            lp = lp.labels(&self.opts.node_selector);
        }
        for _ in 0..MAX_PAGES {
            let page = api.list(&lp).await.map_err(|source| Error::Api {
                call: "list nodes for their health".into(),
                source,
            })?;
            for n in &page.items {
                let name = n.name_any();
                if wanted.contains(name.as_str()) {
                    seen.insert(
                        name.clone(),
                        NodeSeen {
                            name,
                            conditions: node_conditions(n),
                            pods: Vec::new(),
                        },
                    );
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp = lp.continue_token(&c),
                None => break,
            }
        }
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut lp = ListParams::default().limit(PAGE);
        for _ in 0..MAX_PAGES {
            let page = pods.list(&lp).await.map_err(|source| Error::Api {
                call: "list pods for their health".into(),
                source,
            })?;
            for p in page.items.iter().filter(|p| is_watched(p)) {
                let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                if let Some(entry) = node.and_then(|n| seen.get_mut(n)) {
                    if entry.pods.len() < MAX_PODS_PER_NODE {
                        entry.pods.push(pod_seen(p));
                    }
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp = lp.continue_token(&c),
                None => break,
            }
        }
        Ok(seen
            .into_values()
            .map(|mut n| {
                n.pods.sort_by(|a, b| a.name.cmp(&b.name));
                n
            })
            .collect())
    }
}
