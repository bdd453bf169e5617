//! Health in the rollout decision (docs/design.md §5a), pure: which node a
//! failed check is pinned on, how often a watch is re-judged, and the
//! cluster-wide verdict of the Prometheus checks. [`super::decide`] calls
//! these; the checks themselves are [`crate::health::judge`].
//!
//! Choices where docs/design.md is silent:
//! - Health gating is on when the environment file has a `[health]`
//!   section (even an empty one, which takes the defaults); without it a
//!   node is done once Ready at the version, as before.
//! - A returned node is `watching` (uncordoned, counted against
//!   `max_unavailable`) until `pod_ready_timeout` has passed with every check
//!   holding; then `passed`. So with `max_unavailable = 1` the next node
//!   starts only after the previous one passed.
//! - A failed check is recorded as `failed` on the node it names; a failing
//!   Prometheus query names no node, so it is recorded on the node being
//!   watched or, between nodes and during settle, on the node that passed
//!   last. Before any node moved, a firing query only holds the rollout
//!   (nothing of the new version is running to blame).
//! - A Prometheus check that cannot be evaluated holds (`on_unreachable =
//!   "hold"`): no node starts or passes and nothing is confirmed; with no node
//!   in flight the state is `blocked` and the message says why.
//! - Confirmation clears the `passed` records, so `confirmed` sticks: checks
//!   are not judged again for that version once settle held.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::{HealthSpec, PrometheusCheck};
use crate::health::{judge, Failure, Observation, QueryOutcome, QueryResult, Verdict};

/// How often a watch or settle is judged again while it runs, on top of
/// node events: pods and Prometheus are polled, so this bounds how late a
/// crash loop or a firing query is seen.
pub const HEALTH_RECHECK: Duration = Duration::from_secs(2);

/// How often a settling cluster (every node passed its watch) is judged
/// again: settle lasts tens of minutes and judges every node, so it polls
/// less often than a watch; a failure during settle is seen within this.
pub const SETTLE_RECHECK: Duration = Duration::from_secs(30);

/// The reason recorded in a failed node's message for a failed health check.
pub const HEALTH_FAILED_PREFIX: &str = "health check failed: ";

/// The longest failure message recorded (node annotation, Event, report):
/// a query's series comes from Prometheus and may be long, and a node's
/// annotations must stay far below the API server's 256 KiB.
pub const MAX_FAILURE_MESSAGE: usize = 1024;

/// `msg` cut to [`MAX_FAILURE_MESSAGE`] bytes at a character boundary,
/// ending in `…` when cut.
pub fn bounded(mut msg: String) -> String {
    if msg.len() <= MAX_FAILURE_MESSAGE {
        return msg;
    }
    let cut = (0..=MAX_FAILURE_MESSAGE - 3)
        .rev()
        .find(|i| msg.is_char_boundary(*i))
        .unwrap_or(0);
    msg.truncate(cut);
    msg.push('…');
    msg
}

/// The verdict of the Prometheus checks alone, at `now`: healthy, holding or
/// unhealthy naming the query and its value.
pub fn queries_verdict(
    spec: &HealthSpec,
    queries: &[(PrometheusCheck, QueryOutcome)],
    now: DateTime<Utc>,
) -> Verdict {
    let results: Vec<QueryResult<'_>> = queries
        .iter()
        .map(|(check, outcome)| QueryResult {
            check,
            outcome: outcome.clone(),
        })
        .collect();
    judge(&Observation {
        spec,
        watch_until: now,
        nodes: &[],
        queries: &results,
        now,
    })
}

/// The node a failure names, if it names one (a query does not).
pub fn failure_node(f: &Failure) -> Option<&str> {
    match f {
        Failure::Condition { node, .. }
        | Failure::CrashLoop { node, .. }
        | Failure::NotReady { node, .. } => Some(node),
        Failure::Query { .. } => None,
    }
}

/// The check kind a failure is counted under in the
/// `drover_health_failures_total` metric.
pub fn failure_check(f: &Failure) -> &'static str {
    match f {
        Failure::Condition { .. } => "node_condition",
        Failure::CrashLoop { .. } => "crash_loop",
        Failure::NotReady { .. } => "pod_not_ready",
        Failure::Query { .. } => "prometheus",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_failure_message_is_cut_at_a_character_boundary() {
        let long = format!("query `x` returned {{label=\"{}\"}} = 1", "é".repeat(2000));
        let cut = bounded(long);
        assert!(cut.len() <= MAX_FAILURE_MESSAGE, "{}", cut.len());
        assert!(cut.ends_with('…'));
        // It keeps as much as fits: at most one two-byte character short
        // of the bound before the three bytes of `…` (a cut far below the
        // bound loses the series a person needs to find the failure).
        assert!(cut.len() >= MAX_FAILURE_MESSAGE - 1, "{}", cut.len());
        let ascii = bounded("x".repeat(5 * MAX_FAILURE_MESSAGE));
        assert_eq!(ascii.len(), MAX_FAILURE_MESSAGE);
        // Control: a short message is kept whole.
        assert_eq!(
            bounded("node n1: condition X is True".into()),
            "node n1: condition X is True"
        );
    }
}
