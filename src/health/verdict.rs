//! The pure health verdict: observations and the clock in, a decision out.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::prometheus::QueryOutcome;
use crate::config::{HealthSpec, OnUnreachable, PrometheusCheck};

/// A pod whose restart count grew by at least this much since its watch
/// began is crash-looping even before the kubelet says `CrashLoopBackOff`.
/// One restart is tolerated: a liveness probe that trips once while the
/// node settles after its reboot is not a broken release.
pub const CRASHLOOP_RESTARTS: u32 = 2;

/// The kubelet's waiting reason for a container in restart back-off.
pub const CRASHLOOP_REASON: &str = "CrashLoopBackOff";

/// A node as the checks see it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeHealth {
    /// The node's name.
    pub name: String,
    /// Its conditions, `(type, status)` as reported (`"True"`, `"False"`,
    /// `"Unknown"`).
    pub conditions: Vec<(String, String)>,
    /// The pods bound to it. The edge leaves out pods being deleted and pods
    /// that ran to completion (`Succeeded`): neither is expected to be Ready.
    pub pods: Vec<PodHealth>,
}

/// A pod on a watched node, observed over time.
#[derive(Debug, Clone, PartialEq)]
pub struct PodHealth {
    /// `namespace/name`.
    pub name: String,
    /// When its Ready clock started: the later of the node's return and the
    /// pod landing on the node.
    pub since: DateTime<Utc>,
    /// Whether its `Ready` condition is True.
    pub ready: bool,
    /// Sum of its containers' restart counts when its watch began.
    pub restarts_at_start: u32,
    /// Sum of its containers' restart counts now.
    pub restarts: u32,
    /// The first waiting reason among its containers, if any
    /// (`CrashLoopBackOff`, `ImagePullBackOff`, ...).
    pub waiting_reason: Option<String>,
}

/// One Prometheus check and what its latest evaluation returned.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryResult<'a> {
    /// The configured check.
    pub check: &'a PrometheusCheck,
    /// Its latest outcome.
    pub outcome: QueryOutcome,
}

/// Everything the verdict looks at, as of `now`.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    /// The environment's `[health]`.
    pub spec: &'a HealthSpec,
    /// Until when the current watch runs: a returned node's
    /// [`node_watch_until`] or the cluster's [`settle_until`].
    pub watch_until: DateTime<Utc>,
    /// Every node whose checks must hold (the returned ones).
    pub nodes: &'a [NodeHealth],
    /// The latest outcome of every `[[health.prometheus]]` check.
    pub queries: &'a [QueryResult<'a>],
    /// The clock.
    pub now: DateTime<Utc>,
}

/// What the checks conclude.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every check held for the whole watch: the next node may start, or the
    /// cluster may report `confirmed`.
    Healthy,
    /// A check failed: start no further node and report `failed`.
    Unhealthy(Failure),
    /// No check failed, but one could not be evaluated (Prometheus did not
    /// answer): start nothing, confirm nothing, keep watching.
    Held(String),
    /// No check failed so far; the watch runs until `until`.
    Watching {
        /// When the watch can end (if nothing fails before).
        until: DateTime<Utc>,
    },
}

/// The failed check: enough to name node, pod, condition or query and its value.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// A listed node condition is True.
    Condition {
        /// The node.
        node: String,
        /// The condition type.
        condition: String,
    },
    /// A pod on the node is crash-looping.
    CrashLoop {
        /// The node.
        node: String,
        /// `namespace/name`.
        pod: String,
        /// Restarts since its watch began.
        restarts: u32,
        /// Its waiting reason, if any.
        reason: Option<String>,
    },
    /// A pod did not become Ready within `pod_ready_timeout`.
    NotReady {
        /// The node.
        node: String,
        /// `namespace/name`.
        pod: String,
        /// How long it has been waiting.
        waited: Duration,
        /// Its waiting reason, if any.
        reason: Option<String>,
    },
    /// A Prometheus query returned a sample.
    Query {
        /// The PromQL.
        query: String,
        /// The first sample's series, such as `{instance="a"}`.
        series: String,
        /// The first sample's value.
        value: String,
        /// How many samples it returned.
        samples: usize,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Condition { node, condition } => {
                write!(f, "node {node}: condition {condition} is True")
            }
            Failure::CrashLoop {
                node,
                pod,
                restarts,
                reason,
            } => {
                write!(
                    f,
                    "node {node}: pod {pod} is crash-looping ({restarts} restarts since the node returned"
                )?;
                match reason {
                    Some(r) => write!(f, ", waiting: {r})"),
                    None => write!(f, ")"),
                }
            }
            Failure::NotReady {
                node,
                pod,
                waited,
                reason,
            } => {
                write!(
                    f,
                    "node {node}: pod {pod} not Ready after {}",
                    humantime::format_duration(*waited)
                )?;
                match reason {
                    Some(r) => write!(f, " (waiting: {r})"),
                    None => Ok(()),
                }
            }
            Failure::Query {
                query,
                series,
                value,
                samples,
            } => {
                write!(f, "query `{query}` returned {series} = {value}")?;
                if *samples > 1 {
                    write!(f, " and {} more", samples - 1)?;
                }
                Ok(())
            }
        }
    }
}

/// Until when a node that returned Ready at the version at `returned_at` is watched.
pub fn node_watch_until(spec: &HealthSpec, returned_at: DateTime<Utc>) -> DateTime<Utc> {
    returned_at + to_chrono(spec.pod_ready_timeout)
}

/// Until when the cluster settles when the last node passed at `since`.
pub fn settle_until(spec: &HealthSpec, since: DateTime<Utc>) -> DateTime<Utc> {
    since + to_chrono(spec.settle)
}

/// The verdict on `obs`. A failure wins over everything (the first one in
/// node, pod, query order, so the message is stable); then an unanswered
/// query holds; then pods still within their Ready deadline and the watch
/// itself keep it watching; only then is it healthy.
pub fn judge(obs: &Observation<'_>) -> Verdict {
    let spec = obs.spec;
    let mut until = obs.watch_until;
    for node in obs.nodes {
        if let Some(condition) = node.conditions.iter().find_map(|(t, status)| {
            (status == "True" && spec.node_conditions.iter().any(|c| c == t)).then_some(t)
        }) {
            return Verdict::Unhealthy(Failure::Condition {
                node: node.name.clone(),
                condition: condition.clone(),
            });
        }
        for pod in &node.pods {
            let grew = pod.restarts.saturating_sub(pod.restarts_at_start);
            let backoff = pod.waiting_reason.as_deref() == Some(CRASHLOOP_REASON);
            if backoff || grew >= CRASHLOOP_RESTARTS {
                return Verdict::Unhealthy(Failure::CrashLoop {
                    node: node.name.clone(),
                    pod: pod.name.clone(),
                    restarts: grew,
                    reason: pod.waiting_reason.clone(),
                });
            }
            if pod.ready {
                continue;
            }
            let deadline = pod.since + to_chrono(spec.pod_ready_timeout);
            if obs.now >= deadline {
                return Verdict::Unhealthy(Failure::NotReady {
                    node: node.name.clone(),
                    pod: pod.name.clone(),
                    waited: (obs.now - pod.since).to_std().unwrap_or_default(),
                    reason: pod.waiting_reason.clone(),
                });
            }
            until = until.max(deadline);
        }
    }
    let mut held: Option<String> = None;
    for q in obs.queries {
        match &q.outcome {
            QueryOutcome::Clear => {}
            QueryOutcome::Firing {
                series,
                value,
                samples,
            } => {
                return Verdict::Unhealthy(Failure::Query {
                    query: q.check.query.clone(),
                    series: series.clone(),
                    value: value.clone(),
                    samples: *samples,
                })
            }
            // Skipped by configuration; the edge still logs why.
            QueryOutcome::Unreachable(_) if q.check.on_unreachable == OnUnreachable::Ignore => {}
            QueryOutcome::Unreachable(why) => {
                held.get_or_insert_with(|| {
                    format!(
                        "Prometheus {} unreachable for `{}`: {why}",
                        q.check.url, q.check.query
                    )
                });
            }
            QueryOutcome::Rejected(why) => {
                held.get_or_insert_with(|| {
                    format!(
                        "Prometheus {} rejected `{}`: {why}",
                        q.check.url, q.check.query
                    )
                });
            }
        }
    }
    if let Some(why) = held {
        return Verdict::Held(why);
    }
    if obs.now < until {
        return Verdict::Watching { until };
    }
    Verdict::Healthy
}

fn to_chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}
