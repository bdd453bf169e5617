//! Preflight: before a window opens, what on the selected nodes will keep a
//! drain from finishing or break a workload when it does, and which nodes
//! workload consent holds. A pure judgement of what the cluster holds
//! ([`Snapshot`]: the selected nodes and their consent labels, the pods on
//! them, the PodDisruptionBudgets, the replica counts of the pods' owners)
//! by the environment's [`Policy`] (its drain rules) into a closed list of
//! [`Finding`]s; [`read`] fills the snapshot from a cluster, read-only;
//! [`check`] is both, the one check `drover plan --preflight` prints and
//! the agent runs before a window opens (`agent::preflight`).
//!
//! The rules follow what the Eviction API and `kubectl drain` do: a
//! DaemonSet's pods and static (mirror) pods are not evicted, finished pods
//! need no eviction, a PDB that allows no disruption refuses every eviction
//! it covers, a pod without a controller is gone for good once evicted, an
//! `emptyDir` is lost with its pod, and a workload of one replica has no
//! replica left while its only pod moves. And what the drain does beyond
//! them: a pod whose drain rule (`config::rule_for`, the matcher the drain
//! itself uses) climbs to `restart` before `drain_timeout`, and whose owner
//! has one replica, is not evicted but moved by a restart of its owner,
//! which no PDB refuses; a node labelled [`CONSENT_LABEL`]`=`
//! [`CONSENT_PAUSED`] is not started at all.

pub mod read;

use crate::config::{rule_for, DrainRule, EnvConfig, RungKind, CONSENT_LABEL, CONSENT_PAUSED};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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
    /// A node workload consent holds ([`CONSENT_LABEL`]` = `
    /// [`CONSENT_PAUSED`]): the agent does not start it while the label is
    /// there. It blocks no drain (the node is not drained at all, and holds
    /// no place in `max_unavailable`), but the window will not upgrade it.
    ConsentHeld,
}

impl Kind {
    /// Every kind, in the order they are listed.
    pub const ALL: [Kind; 6] = [
        Kind::PdbNeverAllows,
        Kind::PdbAllowsNoneNow,
        Kind::SingleReplica,
        Kind::NoController,
        Kind::LocalStorage,
        Kind::ConsentHeld,
    ];

    /// The kind's name as printed and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::PdbNeverAllows => "pdb-never-allows",
            Kind::PdbAllowsNoneNow => "pdb-allows-none-now",
            Kind::SingleReplica => "single-replica",
            Kind::NoController => "no-controller",
            Kind::LocalStorage => "local-storage",
            Kind::ConsentHeld => "consent-held",
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
    /// `namespace/name` of the PDB, the owner or the pod; the node's name
    /// for [`Kind::ConsentHeld`].
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
    /// The value of [`CONSENT_LABEL`] on each of those nodes that carries it.
    pub consent: BTreeMap<String, String>,
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

/// What of the environment preflight judges by. Both callers build it
/// with [`Policy::of`], so they judge by the same rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// `[rollout] node_selector`: the nodes read (empty: every node).
    pub node_selector: String,
    /// `[[drain]]`: the drain rules, first match first.
    pub drain: Vec<DrainRule>,
    /// `[rollout] drain_timeout`: a rung that would start later is never climbed.
    pub drain_timeout: Duration,
}

impl Policy {
    /// The policy of the environment `env`.
    pub fn of(env: &EnvConfig) -> Self {
        Policy {
            node_selector: env.rollout.node_selector.clone(),
            drain: env.drain.clone(),
            drain_timeout: env.rollout.drain_timeout,
        }
    }

    /// Whether the drain moves `pod` by restarting its owner, not by
    /// evicting it: its rule (the drain's own matcher) climbs to `restart`
    /// before `drain_timeout`, and `owner` has one replica (the restart
    /// rung evicts the pod of a larger one).
    fn restarts(&self, pod: &Pod, owner_replicas: Option<i32>) -> bool {
        let empty = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        owner_replicas == Some(1)
            && rule_for(&self.drain, ns, labels)
                .is_some_and(|r| r.reaches(RungKind::Restart, self.drain_timeout))
    }
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

/// The preflight of the nodes `policy`'s `node_selector` selects in
/// `client`'s cluster: read ([`read::snapshot`], bounded), then judged by
/// `policy` ([`findings`]). `drover plan --preflight` and the agent both
/// run this, and nothing else.
pub async fn check(client: &kube::Client, policy: &Policy) -> Result<Checked, read::ReadError> {
    let snap = read::snapshot(client, &policy.node_selector).await?;
    Ok(Checked {
        nodes: snap.nodes.len(),
        findings: findings(&snap, policy),
    })
}

/// Judge `snap` by `policy`: every finding, ordered by kind, then object.
pub fn findings(snap: &Snapshot, policy: &Policy) -> Vec<Finding> {
    let replicas_of = |p: &Pod| {
        snap.workloads
            .get(&key(p))
            .and_then(|o| snap.replicas.get(o).copied())
    };
    let pods: Vec<&Pod> = snap
        .pods
        .iter()
        .filter(|p| node_of(p).is_some_and(|n| snap.nodes.contains(n)) && drained(p))
        .collect();
    // The pods the drain evicts; the others it moves by a restart, which
    // neither a PDB nor a replica count holds up.
    let evicted: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|p| !policy.restarts(p, replicas_of(p)))
        .collect();
    let mut out = consent_held(snap);
    for pdb in &snap.pdbs {
        let ns = pdb.metadata.namespace.as_deref().unwrap_or_default();
        let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
            continue;
        };
        let nodes: BTreeSet<String> = evicted
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
    for p in &evicted {
        if let Some(owner) = snap.workloads.get(&key(p)) {
            if replicas_of(p) == Some(1) {
                let node = node_of(p).unwrap_or_default().to_string();
                singles.entry(owner).or_default().insert(node);
            }
        }
    }
    for p in &pods {
        let node = node_of(p).unwrap_or_default().to_string();
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
            fix: "run two replicas, give it a [[drain]] rule with a `restart` rung, or accept \
                  the gap in the window"
                .into(),
        });
    }
    out.sort_by(|a, b| (a.kind, &a.object).cmp(&(b.kind, &b.object)));
    out
}

/// The selected nodes workload consent holds, one finding each.
fn consent_held(snap: &Snapshot) -> Vec<Finding> {
    snap.consent
        .iter()
        .filter(|(node, v)| v.as_str() == CONSENT_PAUSED && snap.nodes.contains(*node))
        .map(|(node, _)| Finding {
            kind: Kind::ConsentHeld,
            object: node.clone(),
            nodes: vec![node.clone()],
            why: format!(
                "labelled {CONSENT_LABEL}={CONSENT_PAUSED}: workload consent holds it, so the \
                 agent does not start it (skipped, not failed) while the label is there"
            ),
            fix: format!(
                "whoever holds it removes the label when the node may go (`kubectl label node \
                 {node} {CONSENT_LABEL}-`); the agent takes it within a minute"
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests;
