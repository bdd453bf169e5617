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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(min: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 4, 0, 0).unwrap() + chrono::Duration::minutes(min)
    }

    fn pod(name: &str, ready: bool) -> PodHealth {
        PodHealth {
            name: format!("apps/{name}"),
            since: t(0),
            ready,
            restarts_at_start: 0,
            restarts: 0,
            waiting_reason: None,
        }
    }

    fn node(name: &str, pods: Vec<PodHealth>) -> NodeHealth {
        NodeHealth {
            name: name.into(),
            conditions: vec![
                ("Ready".into(), "True".into()),
                ("MemoryPressure".into(), "False".into()),
            ],
            pods,
        }
    }

    fn judge_at(
        spec: &HealthSpec,
        nodes: &[NodeHealth],
        queries: &[QueryResult<'_>],
        now: i64,
    ) -> Verdict {
        judge(&Observation {
            spec,
            watch_until: node_watch_until(spec, t(0)),
            nodes,
            queries,
            now: t(now),
        })
    }

    #[test]
    fn all_healthy_watches_until_the_timeout_then_passes() {
        let spec = HealthSpec::default(); // pod_ready_timeout 10m
        let nodes = [node("n1", vec![pod("web", true), pod("db", true)])];
        assert_eq!(
            judge_at(&spec, &nodes, &[], 3),
            Verdict::Watching { until: t(10) }
        );
        assert_eq!(judge_at(&spec, &nodes, &[], 10), Verdict::Healthy);
    }

    #[test]
    fn a_crash_loop_fails_at_once_naming_node_pod_and_restarts() {
        let spec = HealthSpec::default();
        let mut p = pod("web", false);
        p.restarts_at_start = 1;
        p.restarts = 4;
        p.waiting_reason = Some(CRASHLOOP_REASON.into());
        let nodes = [node("n1", vec![pod("db", true), p])];
        let v = judge_at(&spec, &nodes, &[], 1);
        let Verdict::Unhealthy(f) = v else {
            panic!("{v:?}")
        };
        assert_eq!(
            f.to_string(),
            "node n1: pod apps/web is crash-looping (3 restarts since the node returned, waiting: CrashLoopBackOff)"
        );
    }

    #[test]
    fn growing_restarts_alone_are_a_crash_loop_but_one_restart_is_tolerated() {
        let spec = HealthSpec::default();
        let mut p = pod("web", true);
        p.restarts = 1;
        let nodes = [node("n1", vec![p.clone()])];
        assert_eq!(
            judge_at(&spec, &nodes, &[], 2),
            Verdict::Watching { until: t(10) }
        );
        p.restarts = 2;
        let nodes = [node("n1", vec![p])];
        assert!(matches!(
            judge_at(&spec, &nodes, &[], 2),
            Verdict::Unhealthy(Failure::CrashLoop { restarts: 2, .. })
        ));
    }

    #[test]
    fn a_listed_condition_fails_naming_it_and_an_unlisted_one_does_not() {
        let mut spec = HealthSpec::default();
        let mut n = node("n1", vec![pod("web", true)]);
        n.conditions[1].1 = "True".into();
        let v = judge_at(&spec, std::slice::from_ref(&n), &[], 1);
        let Verdict::Unhealthy(f) = v else {
            panic!("{v:?}")
        };
        assert_eq!(f.to_string(), "node n1: condition MemoryPressure is True");
        spec.node_conditions = vec!["DiskPressure".into()];
        assert_eq!(judge_at(&spec, &[n], &[], 11), Verdict::Healthy);
    }

    #[test]
    fn a_pod_never_ready_fails_at_its_deadline_naming_its_reason() {
        let spec = HealthSpec::default();
        let mut p = pod("web", false);
        p.waiting_reason = Some("ImagePullBackOff".into());
        let nodes = [node("n1", vec![p])];
        assert_eq!(
            judge_at(&spec, &nodes, &[], 9),
            Verdict::Watching { until: t(10) }
        );
        let v = judge_at(&spec, &nodes, &[], 10);
        let Verdict::Unhealthy(f) = v else {
            panic!("{v:?}")
        };
        assert_eq!(
            f.to_string(),
            "node n1: pod apps/web not Ready after 10m (waiting: ImagePullBackOff)"
        );
    }

    #[test]
    fn a_pod_landing_late_gets_its_own_deadline() {
        let spec = HealthSpec::default();
        let mut p = pod("late", false);
        p.since = t(8);
        let nodes = [node("n1", vec![p])];
        assert_eq!(
            judge_at(&spec, &nodes, &[], 11),
            Verdict::Watching { until: t(18) }
        );
    }

    #[test]
    fn a_firing_query_fails_naming_query_and_value_and_unreachable_holds() {
        let spec = HealthSpec::default();
        let check = |on_unreachable| PrometheusCheck {
            url: "http://prom:9090".into(),
            query: "errors > 0".into(),
            timeout: Duration::from_secs(10),
            on_unreachable,
        };
        let (hold, ignore) = (check(OnUnreachable::Hold), check(OnUnreachable::Ignore));
        let nodes = [node("n1", vec![pod("web", true)])];
        let firing = [QueryResult {
            check: &hold,
            outcome: QueryOutcome::Firing {
                series: "errors{job=\"app\"}".into(),
                value: "3".into(),
                samples: 1,
            },
        }];
        let v = judge_at(&spec, &nodes, &firing, 11);
        let Verdict::Unhealthy(f) = v else {
            panic!("{v:?}")
        };
        assert_eq!(
            f.to_string(),
            "query `errors > 0` returned errors{job=\"app\"} = 3"
        );

        let down = |c| {
            [QueryResult {
                check: c,
                outcome: QueryOutcome::Unreachable("connection refused".into()),
            }]
        };
        let v = judge_at(&spec, &nodes, &down(&hold), 11);
        assert_eq!(
            v,
            Verdict::Held(
                "Prometheus http://prom:9090 unreachable for `errors > 0`: connection refused"
                    .into()
            )
        );
        assert_eq!(
            judge_at(&spec, &nodes, &down(&ignore), 11),
            Verdict::Healthy
        );
        // A refused query is a config error: never skipped.
        let rejected = [QueryResult {
            check: &ignore,
            outcome: QueryOutcome::Rejected("bad_data".into()),
        }];
        assert!(matches!(
            judge_at(&spec, &nodes, &rejected, 11),
            Verdict::Held(_)
        ));
        let clear = [QueryResult {
            check: &hold,
            outcome: QueryOutcome::Clear,
        }];
        assert_eq!(judge_at(&spec, &nodes, &clear, 11), Verdict::Healthy);
    }

    #[test]
    fn settle_watches_every_node_until_it_ends() {
        let spec = HealthSpec {
            settle: Duration::from_secs(30 * 60),
            ..HealthSpec::default()
        };
        let nodes = [
            node("n1", vec![pod("a", true)]),
            node("n2", vec![pod("b", true)]),
        ];
        let obs = |now| Observation {
            spec: &spec,
            watch_until: settle_until(&spec, t(20)),
            nodes: &nodes,
            queries: &[],
            now: t(now),
        };
        assert_eq!(judge(&obs(30)), Verdict::Watching { until: t(50) });
        assert_eq!(judge(&obs(50)), Verdict::Healthy);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn arb_pod() -> impl Strategy<Value = PodHealth> {
            (
                0i64..30,
                any::<bool>(),
                0u32..3,
                0u32..5,
                prop::option::of(prop_oneof![
                    Just("CrashLoopBackOff".to_string()),
                    Just("ImagePullBackOff".to_string()),
                ]),
            )
                .prop_map(|(since, ready, start, grew, reason)| PodHealth {
                    name: "ns/p".into(),
                    since: t(since),
                    ready,
                    restarts_at_start: start,
                    restarts: start + grew,
                    waiting_reason: reason,
                })
        }

        fn arb_node() -> impl Strategy<Value = NodeHealth> {
            (
                prop::collection::vec(
                    (
                        prop_oneof![Just("MemoryPressure"), Just("DiskPressure"), Just("Other")],
                        prop_oneof![Just("True"), Just("False"), Just("Unknown")],
                    ),
                    0..3,
                ),
                prop::collection::vec(arb_pod(), 0..4),
            )
                .prop_map(|(conds, pods)| NodeHealth {
                    name: "n".into(),
                    conditions: conds
                        .into_iter()
                        .map(|(t, s)| (t.to_string(), s.to_string()))
                        .collect(),
                    pods,
                })
        }

        proptest! {
            /// Healthy only when the watch is over and nothing is wrong
            /// anywhere; any listed condition True or crash-looping pod is
            /// always a failure, whatever the clock says.
            #[test]
            fn healthy_means_nothing_wrong_and_the_watch_over(
                nodes in prop::collection::vec(arb_node(), 0..3),
                until in 0i64..40,
                now in 0i64..60,
            ) {
                let spec = HealthSpec::default();
                let v = judge(&Observation { spec: &spec, watch_until: t(until), nodes: &nodes, queries: &[], now: t(now) });
                let condition = nodes.iter().any(|n| n.conditions.iter().any(|(t, s)| {
                    s == "True" && spec.node_conditions.contains(t)
                }));
                let crash = nodes.iter().flat_map(|n| &n.pods).any(|p| {
                    p.waiting_reason.as_deref() == Some(CRASHLOOP_REASON)
                        || p.restarts - p.restarts_at_start >= CRASHLOOP_RESTARTS
                });
                if condition || crash {
                    prop_assert!(matches!(v, Verdict::Unhealthy(_)), "{v:?}");
                }
                if v == Verdict::Healthy {
                    prop_assert!(t(now) >= t(until));
                    prop_assert!(nodes.iter().flat_map(|n| &n.pods).all(|p| p.ready));
                }
                if let Verdict::Watching { until: u } = v {
                    prop_assert!(t(now) < u);
                }
            }
        }
    }
}
