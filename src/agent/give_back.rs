//! Giving nodes back when the agent cannot carry a rollout on: on SIGTERM,
//! and while no config is applicable. A node that drover cordoned and is
//! still draining goes back into service (uncordoned, drover's record
//! cleared), so that a single replica, a scale-down or an uninstall never
//! leaves it cordoned. A node already upgrading keeps its record: its driver
//! run is under way (the node may be rebooting), and the next leader
//! resumes it from that record.

use super::events::Severity;
use super::guard::Guarded;
use super::{Acting, ClusterBackend};
use crate::cluster::{Cluster, NodeView, ProgressState};
use crate::rollout::Action;
use std::time::Duration;
use tokio::sync::watch;

/// Upper bound on giving nodes back at shutdown, inside the pod's grace period.
const STOP_BUDGET: Duration = Duration::from_secs(10);

/// One node to give back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GiveBack {
    /// Node name.
    pub node: String,
    /// drover cordoned it, so drover uncordons it; otherwise only the record is cleared.
    pub uncordon: bool,
}

/// The nodes to give back: those drover is still draining. Upgrading,
/// blocked and failed nodes keep their records.
pub(super) fn to_give_back(nodes: &[NodeView]) -> Vec<GiveBack> {
    nodes
        .iter()
        .filter_map(|n| match &n.progress {
            Ok(Some(p)) if p.state == ProgressState::Draining => Some(GiveBack {
                node: n.name.clone(),
                uncordon: p.cordoned_by_drover,
            }),
            _ => None,
        })
        .collect()
}

/// Give `nodes` back on `cluster`, as the engine gives a node back
/// (uncordon, then its record idle), from what `observed` shows of them;
/// returns the nodes given back.
async fn give_back<C: Cluster>(
    cluster: &C,
    nodes: &[GiveBack],
    observed: &[NodeView],
    why: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<String> {
    let mut done = Vec::new();
    for g in nodes {
        let action = Action::GiveBack {
            node: g.node.clone(),
            uncordon: g.uncordon,
            reason: why.to_string(),
        };
        match crate::rollout::apply(cluster, &action, observed, now).await {
            Ok(_) => done.push(g.node.clone()),
            Err(e) => tracing::warn!(node = %g.node, error = %e, "could not give the node back"),
        }
    }
    done
}

impl<B: ClusterBackend> Acting<B> {
    /// On SIGTERM, after the last engine call finished and before the lease
    /// is released: give back the nodes still draining.
    pub(super) async fn give_back_on_stop(&mut self) {
        let Some((_, conn)) = self.cluster.connected.as_ref() else {
            return;
        };
        let now = self.clock.now();
        let work = async {
            let nodes = match conn.cluster.observe().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot observe the nodes to give back");
                    return Vec::new();
                }
            };
            give_back(
                &conn.cluster,
                &to_give_back(&nodes),
                &nodes,
                "the agent stopped while draining",
                now,
            )
            .await
        };
        let done = match tokio::time::timeout(STOP_BUDGET, work).await {
            Ok(d) => d,
            Err(_) => {
                tracing::warn!(
                    "giving nodes back at shutdown took too long; the next leader resumes them"
                );
                return;
            }
        };
        for node in &done {
            tracing::info!(node = %node, "node given back: the agent stops while it was draining");
            self.edges
                .events
                .on_node(
                    node,
                    Severity::Normal,
                    "GivenBack",
                    "Uncordon",
                    "the agent stopped while draining this node; uncordoned, record cleared".into(),
                )
                .await;
        }
    }

    /// No applicable config: give back the nodes still draining in the
    /// last cluster view, unless the term is ending.
    pub(super) async fn give_back_unconfigured(&mut self, cancel: &watch::Receiver<bool>) {
        let Some((_, conn)) = self.cluster.connected.as_ref() else {
            return;
        };
        let guarded = Guarded::new(&conn.cluster, cancel);
        let Ok(nodes) = guarded.observe().await else {
            return;
        };
        let done = give_back(
            &guarded,
            &to_give_back(&nodes),
            &nodes,
            "no applicable config",
            self.clock.now(),
        )
        .await;
        drop(guarded);
        for node in &done {
            self.edges
                .events
                .on_node(
                    node,
                    Severity::Warning,
                    "GivenBack",
                    "Uncordon",
                    "no applicable config: drain abandoned, uncordoned, record cleared".into(),
                )
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::NodeProgress;

    fn node(name: &str, state: Option<ProgressState>, cordoned: bool) -> NodeView {
        NodeView {
            name: name.into(),
            ready: true,
            unschedulable: state.is_some(),
            progress: Ok(state.map(|state| NodeProgress {
                state,
                target: semver::Version::new(1, 2, 3),
                started_at: chrono::Utc::now(),
                cordoned_by_drover: cordoned,
                message: String::new(),
                retries: 0,
                previous: None,
            })),
            ..NodeView::default()
        }
    }

    #[test]
    fn only_draining_nodes_are_given_back_and_only_drovers_cordon_is_undone() {
        let nodes = [
            node("idle", None, false),
            node("draining", Some(ProgressState::Draining), true),
            node(
                "draining-cordoned-by-someone",
                Some(ProgressState::Draining),
                false,
            ),
            node("upgrading", Some(ProgressState::Upgrading), true),
            node("blocked", Some(ProgressState::Blocked), false),
            node("failed", Some(ProgressState::Failed), false),
        ];
        assert_eq!(
            to_give_back(&nodes),
            [
                GiveBack {
                    node: "draining".into(),
                    uncordon: true
                },
                GiveBack {
                    node: "draining-cordoned-by-someone".into(),
                    uncordon: false
                },
            ]
        );
    }
}
