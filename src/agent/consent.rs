//! What the agent tells of nodes workload consent holds past the
//! environment's `consent_limit` (`rollout::consent` decides which): the
//! status object's `consentOverdue` and the gauge
//! `drover_consent_overdue_nodes`, from the decision of every pass. The
//! Warning Event `ConsentOverdue` is the record write's (`events.rs`), once
//! per hold, and the signed report carries them in `detail.consent_overdue`
//! (`status::NodeDetail::with_consent_overdue`). Pure but for the gauge.

use super::metrics::Metrics;
use crate::rollout::ConsentOverdue;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A node held by workload consent past `consent_limit`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsentOverdueStatus {
    /// The node.
    pub node: String,
    /// When drover first saw consent hold it (RFC 3339, its record's).
    pub since: String,
}

/// The most nodes the status object names; the gauge counts them all.
pub const MAX_NAMED: usize = 32;

/// The Warning Event's note for a hold drover first saw at `since`, now
/// past the limit.
pub fn overdue_note(since: chrono::DateTime<chrono::Utc>) -> String {
    format!(
        "workload consent ({}={}) has held the node since {}, past the environment's \
         consent_limit: reported, not forced; the node is started once the label is removed",
        crate::config::CONSENT_LABEL,
        crate::config::CONSENT_PAUSED,
        super::rfc3339(since)
    )
}

/// The logged (not published) note of a hold beginning or ending: the
/// workload's routine, not a person's concern.
pub fn routine_note(held: bool) -> &'static str {
    if held {
        "workload consent holds the node: not started"
    } else {
        "workload consent no longer holds the node"
    }
}

/// Set the gauge to `overdue` and return what the status names of it
/// (the status object is report.rs's to write).
pub fn tell(metrics: &Metrics, overdue: &[ConsentOverdue]) -> Vec<ConsentOverdueStatus> {
    metrics
        .consent_overdue
        .set(i64::try_from(overdue.len()).unwrap_or(i64::MAX));
    overdue
        .iter()
        .take(MAX_NAMED)
        .map(|o| ConsentOverdueStatus {
            node: o.node.clone(),
            since: super::rfc3339(o.since),
        })
        .collect()
}
