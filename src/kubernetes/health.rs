//! Health observation (docs/design.md §5a): the conditions of the nodes
//! drover watches and the pods bound to them. Conditions come from a read of
//! the Node (the node watch keeps only what the rollout needs); pods from
//! the per-node pod watch, which also wakes the agent when a pod changes, so
//! a crash loop is seen as soon as the kubelet reports it.

use super::observe::Observer;
use super::Error;
use crate::cluster::NodeSeen;
use crate::health::observe::{is_watched, node_conditions, pod_seen};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

/// Most pods reported per node: a node runs at most a few hundred (the
/// kubelet's default `maxPods` is 110), so this only bounds a hostile case.
const MAX_PODS_PER_NODE: usize = 1000;

impl Observer {
    /// The health inputs of `nodes`; a node that vanished is left out.
    pub(crate) async fn health(&self, nodes: &[String]) -> Result<Vec<NodeSeen>, Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut out = Vec::with_capacity(nodes.len());
        for name in nodes {
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
            let mut pods: Vec<_> = store
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
        Ok(out)
    }
}
