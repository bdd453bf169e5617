//! The rollout state: the one word a decision ends in, which the CRD status,
//! the status report and the metrics all carry.

use serde::{Deserialize, Serialize};

/// State of a cluster's rollout, as decided and as reported on the status branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutState {
    /// Accepted, waiting for a window; the message names the next one.
    Pending,
    /// Held by `[rollout] paused` or a freeze; the message says which.
    Paused,
    /// Nodes are being moved to `version` (or a moved node's health is watched).
    Rolling,
    /// Every node runs `version` and passed its watch; every health check
    /// must hold until the time the message names before `confirmed`.
    Settling,
    /// Every selected node is Ready at `version`.
    Confirmed,
    /// Someone should look: a drain timed out (the message names the
    /// PodDisruptionBudgets and pods left), or no node can be moved.
    Blocked,
    /// A node failed to reach `version`; the rollout stopped.
    Failed,
    /// A newer head was refused by trust or the gate; the agent stays on its
    /// last trusted state and `version` is the refused one.
    Refused,
}

impl RolloutState {
    /// Every state, for metrics that keep one series per state.
    pub const ALL: [RolloutState; 8] = [
        RolloutState::Pending,
        RolloutState::Paused,
        RolloutState::Rolling,
        RolloutState::Settling,
        RolloutState::Confirmed,
        RolloutState::Blocked,
        RolloutState::Failed,
        RolloutState::Refused,
    ];

    /// The name written in reports (`pending`, `paused`, `rolling`, `settling`, `confirmed`, `blocked`, `failed`, `refused`).
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Pending => "pending",
            RolloutState::Paused => "paused",
            RolloutState::Rolling => "rolling",
            RolloutState::Settling => "settling",
            RolloutState::Confirmed => "confirmed",
            RolloutState::Blocked => "blocked",
            RolloutState::Failed => "failed",
            RolloutState::Refused => "refused",
        }
    }
}
