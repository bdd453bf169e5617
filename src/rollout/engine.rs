//! The engine: one reconcile step observes the cluster, decides with
//! [`decide`], and applies the actions. It keeps nothing between steps, so a
//! restarted engine resumes from what the nodes record.

use super::decide::decide;
use super::decision::{Action, Decision, Inputs, Policy};
use crate::cluster::{Cluster, NodeProgress, ProgressState};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::sync::{Arc, Mutex};
use tracing::Instrument;

/// Where the engine reads the time.
pub trait Clock {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told; clones share the same time.
#[derive(Debug, Clone)]
pub struct VirtualClock(Arc<Mutex<DateTime<Utc>>>);

impl VirtualClock {
    /// A clock showing `t`.
    pub fn new(t: DateTime<Utc>) -> Self {
        VirtualClock(Arc::new(Mutex::new(t)))
    }

    /// Move the clock to `t` (never backwards).
    pub fn set(&self, t: DateTime<Utc>) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if t > *g {
            *g = t;
        }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A reconcile step that could not complete.
#[derive(Debug, thiserror::Error)]
pub enum EngineError<E: std::error::Error + 'static> {
    /// The nodes could not be observed; nothing was done.
    #[error("cannot observe the nodes: {0}")]
    Observe(#[source] E),
    /// An action failed; the actions before it were applied, the rest were not.
    #[error("{action} on node {node} failed: {source}")]
    Apply {
        /// The action's kind.
        action: &'static str,
        /// The node.
        node: String,
        /// The backend's error.
        #[source]
        source: E,
    },
}

/// What one reconcile step did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// The decision taken (state, counts, actions, next wake-up).
    pub decision: Decision,
    /// Drains that PodDisruptionBudgets newly hold back (or hold back
    /// differently): (node, the message recorded on the node). A budget that
    /// keeps refusing the same pods is reported once, not per pass.
    pub evictions_blocked: Vec<(String, String)>,
    /// The step changed something that the next observation should see at
    /// once: call `reconcile` again now rather than waiting for `wake_at`.
    pub again: bool,
    /// Some drain still has pods that could not be evicted: retry soon.
    pub retry_evictions: bool,
}

/// Labels for the reconcile span.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    /// Environment name.
    pub env: String,
    /// Config commit being applied.
    pub commit: String,
}

/// The rollout engine for one environment in one cluster. It holds no
/// progress, only its policy and clock: dropping and re-creating it is a restart.
#[derive(Debug, Clone)]
pub struct Engine<K: Clock> {
    /// The policy being applied.
    pub policy: Policy,
    /// Labels for tracing.
    pub labels: Labels,
    /// Where the time comes from.
    pub clock: K,
}

impl<K: Clock> Engine<K> {
    /// An engine applying `policy`.
    pub fn new(policy: Policy, labels: Labels, clock: K) -> Self {
        Engine {
            policy,
            labels,
            clock,
        }
    }

    /// One step at the clock's current time.
    pub async fn reconcile<C: Cluster>(
        &self,
        cluster: &C,
        inputs: &Inputs,
    ) -> Result<Outcome, EngineError<C::Error>> {
        let span = tracing::info_span!(
            "reconcile",
            env = %self.labels.env,
            cluster = %cluster.name(),
            commit = %self.labels.commit,
        );
        // One `reconcile` span per reconcile: inside the agent's own span
        // (which names the head and applied commit) no second one is opened.
        let work = reconcile(cluster, &self.policy, inputs, self.clock.now());
        if tracing::Span::current().is_none() {
            work.instrument(span).await
        } else {
            work.await
        }
    }
}

/// One step: observe → decide → apply, at `now`.
pub async fn reconcile<C: Cluster>(
    cluster: &C,
    policy: &Policy,
    inputs: &Inputs,
    now: DateTime<Utc>,
) -> Result<Outcome, EngineError<C::Error>> {
    let nodes = cluster.observe().await.map_err(EngineError::Observe)?;
    let watched = watched_nodes(policy, &nodes);
    let with_health;
    let inputs = if watched.is_empty() {
        inputs
    } else {
        let health = cluster
            .health(&watched)
            .await
            .map_err(EngineError::Observe)?;
        with_health = Inputs {
            health,
            ..inputs.clone()
        };
        &with_health
    };
    let decision = decide(policy, inputs, &nodes, now);
    tracing::debug!(
        state = ?decision.state,
        nodes = decision.nodes,
        at_version = decision.nodes_at_version,
        actions = decision.actions.len(),
        "decided"
    );
    let mut evictions_blocked = Vec::new();
    let mut again = false;
    let mut retry_evictions = false;
    for action in &decision.actions {
        match apply(cluster, action).await? {
            Some(pass) if pass.remaining > 0 => {
                retry_evictions = true;
                let progress = nodes
                    .iter()
                    .find(|n| n.name == action.node())
                    .and_then(|n| n.progress.as_ref().ok().cloned().flatten());
                if let (false, Some(p)) = (pass.blocked_by.is_empty(), progress) {
                    if let Some(msg) = refusal_message(&p.message, &pass, now) {
                        let node = action.node().to_string();
                        let recorded = NodeProgress {
                            message: msg.clone(),
                            ..p
                        };
                        cluster
                            .set_progress(&node, Some(&recorded))
                            .await
                            .map_err(|source| EngineError::Apply {
                                action: "record_refusal",
                                node: node.clone(),
                                source,
                            })?;
                        evictions_blocked.push((node, msg));
                    }
                }
            }
            // A drain that emptied the node: the upgrade can start now.
            _ => again = true,
        }
    }
    Ok(Outcome {
        decision,
        evictions_blocked,
        again,
        retry_evictions,
    })
}

/// The nodes whose health the decision judges: with `[health]`, those
/// `watching` at the target, and once every node is done (Ready at the
/// target, passed or idle) the `passed` ones, for settle.
pub fn watched_nodes(policy: &Policy, nodes: &[crate::cluster::NodeView]) -> Vec<String> {
    if policy.health.is_none() {
        return Vec::new();
    }
    let at_target = |p: &NodeProgress| p.target == policy.target;
    let settling = nodes.iter().all(|n| match &n.progress {
        Ok(Some(p)) => p.state == ProgressState::Passed && at_target(p),
        Ok(None) => n.ready && n.version.as_ref() == Some(&policy.target),
        Err(_) => false,
    });
    nodes
        .iter()
        .filter(|n| {
            matches!(&n.progress, Ok(Some(p)) if at_target(p)
                && (p.state == ProgressState::Watching
                    || (settling && p.state == ProgressState::Passed)))
        })
        .map(|n| n.name.clone())
        .collect()
}

/// The most pod names a refusal message lists (node annotations and Event
/// notes stay small).
const MAX_PODS_NAMED: usize = 10;

/// The draining node's new message after a pass that PDBs refused, or
/// `None` when `old` already says the same (its "since" is then kept).
fn refusal_message(
    old: &str,
    pass: &crate::cluster::EvictionPass,
    now: DateTime<Utc>,
) -> Option<String> {
    let mut pods: Vec<&str> = pass
        .refused_pods
        .iter()
        .take(MAX_PODS_NAMED)
        .map(String::as_str)
        .collect();
    let more = pass.refused_pods.len().saturating_sub(MAX_PODS_NAMED);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    if pods.is_empty() {
        pods.push("pods");
    }
    let what = format!(
        "PodDisruptionBudget{} {} refused evicting {}{more}",
        if pass.blocked_by.len() == 1 { "" } else { "s" },
        pass.blocked_by.join(", "),
        pods.join(", ")
    );
    if old.starts_with(&format!("{what} since ")) {
        return None;
    }
    Some(format!(
        "{what} since {}",
        now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    ))
}

/// Apply one action; returns the eviction pass for `Evict`.
pub async fn apply<C: Cluster>(
    cluster: &C,
    action: &Action,
) -> Result<Option<crate::cluster::EvictionPass>, EngineError<C::Error>> {
    let err = |source| EngineError::Apply {
        action: action.kind(),
        node: action.node().to_string(),
        source,
    };
    tracing::info!(action = action.kind(), node = action.node(), "apply");
    match action {
        Action::Cordon { node, progress } => cluster.cordon(node, progress).await.map_err(err)?,
        Action::Evict { node } => return cluster.evict(node).await.map(Some).map_err(err),
        Action::StartUpgrade { node, progress } => {
            // Record first: a crash before the driver starts is seen as
            // `upgrading` with no run, and the start is repeated.
            cluster
                .set_progress(node, Some(progress))
                .await
                .map_err(err)?;
            cluster.start_upgrade(node, progress).await.map_err(err)?;
        }
        Action::Block {
            node,
            progress,
            uncordon,
        }
        | Action::Fail {
            node,
            progress,
            uncordon,
        } => give_back(cluster, node, Some(progress), *uncordon)
            .await
            .map_err(err)?,
        Action::Complete { node, uncordon } => give_back(cluster, node, None, *uncordon)
            .await
            .map_err(err)?,
        Action::Watch {
            node,
            progress,
            uncordon,
        } => give_back(cluster, node, Some(progress), *uncordon)
            .await
            .map_err(err)?,
        Action::Pass { node, progress } | Action::Unhealthy { node, progress, .. } => cluster
            .set_progress(node, Some(progress))
            .await
            .map_err(err)?,
        Action::Clear { node, .. } => cluster.set_progress(node, None).await.map_err(err)?,
    }
    Ok(None)
}

async fn give_back<C: Cluster>(
    cluster: &C,
    node: &str,
    progress: Option<&NodeProgress>,
    uncordon: bool,
) -> Result<(), C::Error> {
    if uncordon {
        cluster.uncordon(node, progress).await
    } else {
        cluster.set_progress(node, progress).await
    }
}
