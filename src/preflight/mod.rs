//! Preflight: before a window opens, what on the selected nodes will keep a
//! drain from finishing or break a workload when it does. A pure judgement
//! of what the cluster holds ([`Snapshot`]: the selected nodes, the pods on
//! them, the PodDisruptionBudgets, the replica counts of the pods' owners)
//! into a closed list of [`Finding`]s; [`read`] fills the snapshot from a
//! cluster, read-only; [`check`] is both, the one check `drover plan
//! --preflight` prints and the agent runs before a window opens
//! (`agent::preflight`).
//!
//! The rules follow what the Eviction API and `kubectl drain` do: a
//! DaemonSet's pods and static (mirror) pods are not evicted, finished pods
//! need no eviction, a PDB that allows no disruption refuses every eviction
//! it covers, a pod without a controller is gone for good once evicted, an
//! `emptyDir` is lost with its pod, and a workload of one replica has no
//! replica left while its only pod moves.

pub mod read;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What will block or break, from a closed list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A PDB whose spec can never allow a disruption (`minAvailable` at or
    /// above the pods it expects, `maxUnavailable` 0): every drain of a node
    /// holding one of its pods waits out `drain_timeout`.
    PdbNeverAllows,
    /// A PDB that allows no disruption now (a pod of it not Ready, say),
    /// though its spec could: it blocks until that changes.
    PdbAllowsNoneNow,
    /// A Deployment or StatefulSet of one replica: evicting its pod leaves
    /// no replica until the new one is Ready.
    SingleReplica,
    /// A pod no controller owns: evicted, nothing recreates it.
    NoController,
    /// A pod with an `emptyDir` volume: its data goes with the eviction.
    LocalStorage,
}

impl Kind {
    /// Every kind, in the order they are listed.
    pub const ALL: [Kind; 5] = [
        Kind::PdbNeverAllows,
        Kind::PdbAllowsNoneNow,
        Kind::SingleReplica,
        Kind::NoController,
        Kind::LocalStorage,
    ];

    /// The kind's name as printed and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::PdbNeverAllows => "pdb-never-allows",
            Kind::PdbAllowsNoneNow => "pdb-allows-none-now",
            Kind::SingleReplica => "single-replica",
            Kind::NoController => "no-controller",
            Kind::LocalStorage => "local-storage",
        }
    }

    /// Whether it keeps a drain from finishing (else it finishes, at a cost).
    pub fn blocks(self) -> bool {
        matches!(self, Kind::PdbNeverAllows | Kind::PdbAllowsNoneNow)
    }
}

/// One thing found, on the nodes it concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: Kind,
    /// `namespace/name` of the PDB, the owner or the pod.
    pub object: String,
    /// The selected nodes it is on, by name.
    pub nodes: Vec<String>,
    /// What was found, in words.
    pub why: String,
    /// What to do about it.
    pub fix: String,
}

/// An owner of pods, by kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    /// `Deployment` or `StatefulSet` (a ReplicaSet is read through to its Deployment).
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// What preflight reads of a cluster.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The nodes the environment's `node_selector` selects, by name.
    pub nodes: BTreeSet<String>,
    /// The pods bound to those nodes.
    pub pods: Vec<Pod>,
    /// Every PodDisruptionBudget.
    pub pdbs: Vec<PodDisruptionBudget>,
    /// Each pod's workload (`namespace/pod` → owner), where it has one
    /// that counts replicas.
    pub workloads: BTreeMap<String, Owner>,
    /// Each workload's desired replicas.
    pub replicas: BTreeMap<Owner, i32>,
}

/// Whether `pod` is evicted by a drain at all.
fn drained(pod: &Pod) -> bool {
    let meta = &pod.metadata;
    let mirror = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let daemon = controller(pod).is_some_and(|(kind, _)| kind == "DaemonSet");
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !(mirror || daemon || finished)
}

/// The pod's controller owner reference: (kind, name).
fn controller(pod: &Pod) -> Option<(&str, &str)> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.as_str(), o.name.as_str()))
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// Whether `selector` selects `labels` (matchLabels and matchExpressions;
/// an empty selector selects every pod of the namespace, as for a PDB).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expr = selector.match_expressions.iter().flatten().all(|e| {
        let have = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => !have.is_some_and(|v| values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            // An operator the API server would not have stored: select nothing.
            _ => false,
        }
    });
    by_labels && by_expr
}

/// `v` (an absolute number or a percentage of `of`, rounded up as the
/// disruption controller rounds `minAvailable`).
fn resolve(v: &IntOrString, of: i32) -> Option<i32> {
    match v {
        IntOrString::Int(n) => Some(*n),
        IntOrString::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.trim().parse().ok()?;
            Some(((pct * i64::from(of) + 99) / 100) as i32)
        }
    }
}

/// Whether the PDB's spec can never allow a disruption of the pods it
/// expects, and why.
fn never_allows(pdb: &PodDisruptionBudget) -> Option<String> {
    let spec = pdb.spec.as_ref()?;
    let expected = pdb
        .status
        .as_ref()
        .and_then(|s| s.expected_pods)
        .unwrap_or(0);
    if let Some(max) = &spec.max_unavailable {
        let n = resolve(max, expected)?;
        return (n <= 0).then(|| "maxUnavailable is 0".to_string());
    }
    let min = resolve(spec.min_available.as_ref()?, expected)?;
    (expected > 0 && min >= expected).then(|| {
        format!("minAvailable {min} with {expected} pod(s) expected: no pod may ever be evicted")
    })
}

/// What one preflight found: how many nodes it read, and every finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The selected nodes read.
    pub nodes: usize,
    /// Every finding, ordered by kind, then object ([`findings`]).
    pub findings: Vec<Finding>,
}

impl Checked {
    /// How many findings of each kind (kinds with none left out).
    pub fn counts(&self) -> BTreeMap<Kind, u32> {
        let mut out = BTreeMap::new();
        for f in &self.findings {
            *out.entry(f.kind).or_insert(0u32) += 1;
        }
        out
    }
}

/// The preflight of the nodes `node_selector` selects in `client`'s
/// cluster: read ([`read::snapshot`], bounded), then judged ([`findings`]).
/// `drover plan --preflight` and the agent both run this, and nothing else.
pub async fn check(client: &kube::Client, node_selector: &str) -> Result<Checked, read::ReadError> {
    let snap = read::snapshot(client, node_selector).await?;
    Ok(Checked {
        nodes: snap.nodes.len(),
        findings: findings(&snap),
    })
}

/// Judge `snap`: every finding, ordered by kind, then object.
pub fn findings(snap: &Snapshot) -> Vec<Finding> {
    let pods: Vec<&Pod> = snap
        .pods
        .iter()
        .filter(|p| node_of(p).is_some_and(|n| snap.nodes.contains(n)) && drained(p))
        .collect();
    let mut out = Vec::new();
    for pdb in &snap.pdbs {
        let ns = pdb.metadata.namespace.as_deref().unwrap_or_default();
        let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
            continue;
        };
        let nodes: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .filter(|p| {
                selects(
                    selector,
                    p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                )
            })
            .filter_map(|p| node_of(p).map(str::to_string))
            .collect();
        if nodes.is_empty() {
            continue;
        }
        let object = format!("{ns}/{}", pdb.metadata.name.as_deref().unwrap_or_default());
        let allowed = pdb
            .status
            .as_ref()
            .and_then(|s| s.disruptions_allowed)
            .unwrap_or(0);
        if let Some(why) = never_allows(pdb) {
            out.push(Finding {
                kind: Kind::PdbNeverAllows,
                object,
                nodes: nodes.into_iter().collect(),
                why: format!("PodDisruptionBudget: {why}"),
                fix:
                    "allow one disruption (maxUnavailable: 1, or minAvailable below the replicas), \
                      or add a replica"
                        .into(),
            });
        } else if allowed <= 0 {
            out.push(Finding {
                kind: Kind::PdbAllowsNoneNow,
                object,
                nodes: nodes.into_iter().collect(),
                why:
                    "PodDisruptionBudget allows 0 disruptions now (a pod it counts is not healthy)"
                        .into(),
                fix: "make its pods healthy before the window".into(),
            });
        }
    }
    let mut singles: BTreeMap<&Owner, BTreeSet<String>> = BTreeMap::new();
    for p in &pods {
        let node = node_of(p).unwrap_or_default().to_string();
        match snap.workloads.get(&key(p)) {
            Some(owner) if snap.replicas.get(owner) == Some(&1) => {
                singles.entry(owner).or_default().insert(node.clone());
            }
            _ => {}
        }
        if controller(p).is_none() {
            out.push(Finding {
                kind: Kind::NoController,
                object: key(p),
                nodes: vec![node.clone()],
                why: "a pod no controller owns: once evicted, nothing recreates it".into(),
                fix: "run it under a Deployment, StatefulSet or Job".into(),
            });
        }
        let empty_dir = p
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|v| v.iter().any(|v| v.empty_dir.is_some()));
        if empty_dir {
            out.push(Finding {
                kind: Kind::LocalStorage,
                object: key(p),
                nodes: vec![node],
                why: "an emptyDir volume: its data is lost when the pod is evicted".into(),
                fix: "keep data that must survive in a PersistentVolume".into(),
            });
        }
    }
    for (owner, nodes) in singles {
        out.push(Finding {
            kind: Kind::SingleReplica,
            object: format!("{}/{}", owner.namespace, owner.name),
            nodes: nodes.into_iter().collect(),
            why: format!(
                "a {} of one replica: none is available while its pod moves",
                owner.kind
            ),
            fix: "run two replicas, or accept the gap in the window".into(),
        });
    }
    out.sort_by(|a, b| (a.kind, &a.object).cmp(&(b.kind, &b.object)));
    out
}

#[cfg(test)]
mod tests;
