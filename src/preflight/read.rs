//! Fill a [`Snapshot`] from a cluster, read-only: the selected nodes (and
//! their workload consent label), the pods bound to them (listed in pages, the others dropped as they come),
//! every PodDisruptionBudget, and the replica counts of the pods'
//! Deployments (through their ReplicaSets) and StatefulSets.

use super::{Owner, Snapshot};
use crate::config::CONSENT_LABEL;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;

/// Items asked per list page.
const PAGE: u32 = 500;
/// The most objects of one kind kept (pods on the selected nodes, PDBs,
/// nodes); a cluster with more is refused, not read without bound.
pub const MAX_OBJECTS: usize = 200_000;

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("listing {what}: {source}")]
    List {
        what: &'static str,
        source: kube::Error,
    },
    #[error("more than {MAX_OBJECTS} {what}: preflight reads at most that many")]
    TooMany { what: &'static str },
}

/// Every object of `api` that `keep` keeps, in pages of [`PAGE`].
async fn list<K>(
    api: &Api<K>,
    params: ListParams,
    what: &'static str,
    mut keep: impl FnMut(&K) -> bool,
) -> Result<Vec<K>, ReadError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = params.limit(PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|source| ReadError::List { what, source })?;
        for item in page.items {
            if keep(&item) {
                if out.len() == MAX_OBJECTS {
                    return Err(ReadError::TooMany { what });
                }
                out.push(item);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(out),
        }
    }
}

/// Read what preflight judges from `client`'s cluster, for the nodes
/// `node_selector` selects (empty: every node).
pub async fn snapshot(client: &Client, node_selector: &str) -> Result<Snapshot, ReadError> {
    let mut params = ListParams::default();
    if !node_selector.is_empty() {
        params = params.labels(node_selector);
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let nodes = list(&nodes, params, "nodes", |_| true).await?;
    let consent = nodes
        .iter()
        .filter_map(|n| Some((n.name_any(), n.labels().get(CONSENT_LABEL)?.clone())))
        .collect();
    let nodes: std::collections::BTreeSet<String> = nodes.iter().map(|n| n.name_any()).collect();
    let pods: Api<Pod> = Api::all(client.clone());
    let pods = list(
        &pods,
        ListParams::default(),
        "pods on the selected nodes",
        |p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| nodes.contains(n))
        },
    )
    .await?;
    let pdbs: Api<PodDisruptionBudget> = Api::all(client.clone());
    let pdbs = list(&pdbs, ListParams::default(), "PodDisruptionBudgets", |_| {
        true
    })
    .await?;
    let (workloads, replicas) = owners(client, &pods).await;
    Ok(Snapshot {
        nodes,
        consent,
        pods,
        pdbs,
        workloads,
        replicas,
    })
}

/// The controller owner reference of `meta`: (kind, name).
fn controller_of<K: Resource>(obj: &K) -> Option<(String, String)> {
    obj.meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone()))
}

/// Each pod's Deployment or StatefulSet, and their replicas. An owner that
/// cannot be read is left out: its pods are judged without it.
async fn owners(client: &Client, pods: &[Pod]) -> (BTreeMap<String, Owner>, BTreeMap<Owner, i32>) {
    let mut workloads = BTreeMap::new();
    let mut replicas: BTreeMap<Owner, i32> = BTreeMap::new();
    // A ReplicaSet's Deployment, looked up once per ReplicaSet.
    let mut through: BTreeMap<(String, String), Option<String>> = BTreeMap::new();
    for pod in pods {
        let ns = pod.namespace().unwrap_or_default();
        let Some((kind, name)) = controller_of(pod) else {
            continue;
        };
        let owner = match kind.as_str() {
            "ReplicaSet" => {
                let key = (ns.clone(), name.clone());
                if !through.contains_key(&key) {
                    let rs: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
                    let dep = rs
                        .get_opt(&name)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|rs| controller_of(&rs))
                        .filter(|(k, _)| k == "Deployment")
                        .map(|(_, n)| n);
                    through.insert(key.clone(), dep);
                }
                match &through[&key] {
                    Some(d) => Owner {
                        kind: "Deployment".into(),
                        namespace: ns.clone(),
                        name: d.clone(),
                    },
                    None => continue,
                }
            }
            "StatefulSet" => Owner {
                kind: "StatefulSet".into(),
                namespace: ns.clone(),
                name,
            },
            _ => continue,
        };
        if !replicas.contains_key(&owner) {
            let n = match owner.kind.as_str() {
                "Deployment" => Api::<Deployment>::namespaced(client.clone(), &ns)
                    .get_opt(&owner.name)
                    .await
                    .ok()
                    .flatten()
                    .map(|d| d.spec.and_then(|s| s.replicas).unwrap_or(1)),
                _ => Api::<StatefulSet>::namespaced(client.clone(), &ns)
                    .get_opt(&owner.name)
                    .await
                    .ok()
                    .flatten()
                    .map(|s| s.spec.and_then(|s| s.replicas).unwrap_or(1)),
            };
            let Some(n) = n else { continue };
            replicas.insert(owner.clone(), n);
        }
        workloads.insert(format!("{ns}/{}", pod.name_any()), owner);
    }
    (workloads, replicas)
}
