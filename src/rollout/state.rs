//! The rollout state: the one word a cluster's state is told in, which the
//! CRD status, the status report, Events and the metrics all carry, and
//! what each state asks of whoever watches it ([`Attention`]).
//!
//! A new state (a fleet-wide `halted`, a `rolled-back`) joins here: a
//! variant, its name, its place in [`RolloutState::ALL`] and its
//! [`Attention`]; every table that maps states (the kstatus conditions,
//! the docs' generated lists) is an exhaustive match or reads these, so the
//! compiler and `tests/offline/docs_generated.rs` name what else to write.

use serde::{Deserialize, Serialize};

/// State of a cluster's rollout, as decided and as reported on the status branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
    /// The pinned `version` was revoked after it was pinned (`[promotion]
    /// revoked`): nodes in flight finish, no further node starts, and the
    /// nodes already moved keep running it until another version is pinned.
    Revoked,
    /// A newer head was refused by trust or the gate; the agent stays on its
    /// last trusted state and `version` is the refused one.
    Refused,
    /// More clusters of the environment failed `version` than its
    /// `failure_budget` allows: no node starts here until a new version or
    /// a reviewed change; the message names the clusters, nodes and checks.
    Halted,
}

/// What a state asks of the person watching the fleet: the one table the
/// alert advice (docs/install.md), Events' severity and `drover wait` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// Nothing: the agent goes on by itself, a person chose to hold it, or
    /// the rollout is done.
    None,
    /// Alert at once: only a person can move the cluster on.
    Now,
    /// Alert when it lasts: a person is needed unless it clears by itself
    /// (a gate refusal waiting for another cluster's confirmation or a soak).
    Lasting,
}

impl RolloutState {
    /// Every state, for metrics that keep one series per state.
    pub const ALL: [RolloutState; 10] = [
        RolloutState::Pending,
        RolloutState::Paused,
        RolloutState::Rolling,
        RolloutState::Settling,
        RolloutState::Confirmed,
        RolloutState::Blocked,
        RolloutState::Failed,
        RolloutState::Revoked,
        RolloutState::Refused,
        RolloutState::Halted,
    ];

    /// The name written in reports (`pending`, `paused`, `rolling`,
    /// `settling`, `confirmed`, `blocked`, `failed`, `revoked`, `refused`,
    /// `halted`).
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Pending => "pending",
            RolloutState::Paused => "paused",
            RolloutState::Rolling => "rolling",
            RolloutState::Settling => "settling",
            RolloutState::Confirmed => "confirmed",
            RolloutState::Blocked => "blocked",
            RolloutState::Failed => "failed",
            RolloutState::Revoked => "revoked",
            RolloutState::Refused => "refused",
            RolloutState::Halted => "halted",
        }
    }

    /// The state named `s`, as [`Self::as_str`] writes it.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// What this state asks of the person watching (see [`Attention`]).
    pub fn attention(self) -> Attention {
        match self {
            RolloutState::Pending
            | RolloutState::Paused
            | RolloutState::Rolling
            | RolloutState::Settling
            | RolloutState::Confirmed => Attention::None,
            RolloutState::Blocked
            | RolloutState::Failed
            | RolloutState::Revoked
            | RolloutState::Halted => Attention::Now,
            RolloutState::Refused => Attention::Lasting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_parse_and_serde() {
        for s in RolloutState::ALL {
            assert_eq!(RolloutState::parse(s.as_str()), Some(s));
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
        assert_eq!(RolloutState::parse("bogus"), None);
    }
}
