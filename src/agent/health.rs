//! The agent's health edge (docs/design.md §5a): it evaluates the
//! environment's Prometheus checks before each reconcile whose decision can
//! use them (a watch or settle runs, or a node may start), and turns failed checks into the
//! `drover_health_failures_total` metric. Node and pod health come through
//! the cluster view ([`crate::cluster::Cluster::health`]); the decision is
//! the rollout core's.

use std::sync::OnceLock;

use crate::config::{EnvConfig, PrometheusCheck};
use crate::health::{PrometheusClient, QueryOutcome};
use crate::rollout::Action;
use crate::rollout::RolloutState;

use super::metrics::Metrics;

/// One client for the process: its connection pool is reused across
/// reconciles, and the root certificates are loaded once.
fn client() -> Result<&'static PrometheusClient, String> {
    static CLIENT: OnceLock<Result<PrometheusClient, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| PrometheusClient::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

/// What the engine decided last in this term, as far as the queries care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The version it rolled out.
    pub version: semver::Version,
    /// Its own state (before a refused head or a halt is told on top).
    pub state: RolloutState,
    /// A health watch or settle was running.
    pub poll_health: bool,
}

impl Decided {
    pub fn of(version: &semver::Version, d: &crate::rollout::Decision) -> Decided {
        Decided {
            version: version.clone(),
            state: d.state,
            poll_health: d.poll_health,
        }
    }
}

/// Whether this pass's decision can use the queries' answers: a watch or
/// settle runs, or a node may start. Not when the engine last confirmed
/// `version` (a newer head refused on top changes nothing here), nor while
/// `no_start` (a halt, the wave gate or a revocation, judged for this
/// pass) lets no node start and nothing is watched. The first pass of a
/// term does not know: it asks.
pub fn queries_wanted(version: &semver::Version, last: Option<&Decided>, no_start: bool) -> bool {
    let Some(last) = last else { return true };
    if last.poll_health {
        return true;
    }
    let confirmed = last.state == RolloutState::Confirmed && &last.version == version;
    !(confirmed || no_start)
}

/// The outcome of every `[[health.prometheus]]` check of `env`, evaluated
/// now (concurrently, each bounded by its `timeout`). Nothing is queried
/// without `[health]`, or when the decision cannot use them
/// ([`queries_wanted`]).
pub async fn evaluate_queries(
    env: &EnvConfig,
    wanted: bool,
) -> Vec<(PrometheusCheck, QueryOutcome)> {
    let checks = &env.health.prometheus;
    if !env.health.enabled || checks.is_empty() || !wanted {
        return Vec::new();
    }
    let outcomes = match client() {
        Ok(c) => c.evaluate_all(checks).await,
        Err(e) => checks
            .iter()
            .map(|_| QueryOutcome::Unreachable(format!("no HTTP client: {e}")))
            .collect(),
    };
    for (check, outcome) in checks.iter().zip(&outcomes) {
        if let QueryOutcome::Unreachable(why) | QueryOutcome::Rejected(why) = outcome {
            tracing::warn!(url = %check.url, query = %check.query, error = %why, "health query not answered");
        }
    }
    checks.iter().cloned().zip(outcomes).collect()
}

/// Count a failed health check that `action` records.
pub fn count_failure(metrics: &Metrics, env: &str, action: &Action) {
    match action {
        Action::Unhealthy { check, .. } => metrics.health_failed(env, check),
        // A retried rollback fails no check of its own.
        Action::RollBack { check, .. } if check != "retry" => metrics.health_failed(env, check),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decided(state: RolloutState, poll_health: bool) -> Decided {
        Decided {
            version: semver::Version::new(1, 13, 0),
            state,
            poll_health,
        }
    }

    #[test]
    fn queries_are_asked_only_when_the_decision_can_use_them() {
        let v = semver::Version::new(1, 13, 0);
        let next = semver::Version::new(1, 14, 0);
        use RolloutState::*;
        // A term's first pass does not know what it will decide.
        assert!(queries_wanted(&v, None, true));
        // Confirmed at this version: nothing to judge, whatever is told on top.
        assert!(!queries_wanted(&v, Some(&decided(Confirmed, false)), false));
        // A new version to roll out: starts are gated on them.
        assert!(queries_wanted(
            &next,
            Some(&decided(Confirmed, false)),
            false
        ));
        // Nothing can start and nothing is watched.
        for s in [Rolling, Pending, Halted, Revoked, Blocked] {
            assert!(!queries_wanted(&v, Some(&decided(s, false)), true), "{s:?}");
            assert!(queries_wanted(&v, Some(&decided(s, false)), false), "{s:?}");
        }
        // A watch or settle running needs them, halt or not.
        for s in [Rolling, Settling, Halted, Revoked] {
            assert!(queries_wanted(&v, Some(&decided(s, true)), true), "{s:?}");
        }
    }
}
