//! The agent's health edge (docs/design.md §5a): it evaluates the
//! environment's Prometheus checks before each reconcile while a rollout
//! is not yet confirmed, and turns failed checks into the
//! `drover_health_failures_total` metric. Node and pod health come through
//! the cluster view ([`crate::cluster::Cluster::health`]); the decision is
//! the rollout core's.

use std::sync::OnceLock;

use crate::config::{EnvConfig, PrometheusCheck};
use crate::health::{PrometheusClient, QueryOutcome};
use crate::rollout::Action;
use crate::rollout::RolloutState;
use crate::status::StatusReport;

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

/// The outcome of every `[[health.prometheus]]` check of `env`, evaluated
/// now (concurrently, each bounded by its `timeout`). Nothing is queried
/// without `[health]`, or once `last` already confirmed this version: a
/// confirmed rollout is not judged again.
pub async fn evaluate_queries(
    env: &EnvConfig,
    last: Option<&StatusReport>,
) -> Vec<(PrometheusCheck, QueryOutcome)> {
    let checks = &env.health.prometheus;
    if !env.health.enabled || checks.is_empty() {
        return Vec::new();
    }
    if last.is_some_and(|r| r.state == RolloutState::Confirmed && r.version == env.version) {
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
