//! The health of returned nodes and the cluster's settle (docs/design.md
//! §5a): a `watching` node passes or fails its watch, a `passed` node that
//! stopped being Ready at the version fails, and once every node is done the
//! cluster settles before `confirmed`. The checks are
//! [`crate::health::judge`]; the choices are in `health.rs`.
//!
//! A node whose health inputs could not be read in full
//! ([`crate::cluster::NodeSeen::unread`]) or are missing holds: it is never
//! judged on part of its pods.

use super::decision::Action;
use super::health::{bounded, failure_check, failure_node, HEALTH_FAILED_PREFIX, SETTLE_RECHECK};
use super::rollback;
use super::tally::{add, rfc3339, Ctx, Tally};
use crate::cluster::{NodeProgress, NodeSeen, NodeView, ProgressState};
use crate::health::{node_watch_until, observe, settle_until, Failure, Verdict};

/// What the decision reads of node `n`'s health: its observation, or why
/// there is none to judge.
fn seen<'i>(ctx: &Ctx<'i>, n: &NodeView) -> Result<&'i NodeSeen, String> {
    if let Some(f) = &n.fault {
        return Err(format!("node {}: {f}", n.name));
    }
    match ctx.inputs.health.iter().find(|s| s.name == n.name) {
        Some(s) => match &s.unread {
            Some(why) => Err(format!("node {}: {why}", n.name)),
            None => Ok(s),
        },
        None => Err(format!("no health observation of node {}", n.name)),
    }
}

/// A node recorded `watching` or `passed` (and not simply done).
pub(super) fn watched<'a>(
    ctx: &Ctx<'_>,
    n: &'a NodeView,
    p: &NodeProgress,
    at_target: bool,
    t: &mut Tally<'a>,
) {
    let target = ctx.target;
    let now = ctx.now;
    let name = n.name.clone();
    let Some(spec) = ctx.health.filter(|_| p.target == *target) else {
        t.unavailable += usize::from(!n.ready);
        t.releases.push(Action::Clear {
            node: name,
            reason: if p.target == *target {
                "[health] removed".into()
            } else {
                format!("target changed from {} to {target}", p.target)
            },
            stop_run: false,
        });
        return;
    };
    let failure = if !n.ready {
        Some(("node_ready", "node became NotReady".to_string()))
    } else if !at_target {
        Some((
            "node_version",
            match &n.version {
                Some(v) => format!("node now runs {v}"),
                None => "node's OS version cannot be read".into(),
            },
        ))
    } else {
        None
    };
    if let Some((check, why)) = failure {
        // Only a `passed` node that stopped being Ready at the version
        // lands here: that fails the rollout as well.
        let msg = bounded(format!("{HEALTH_FAILED_PREFIX}node {}: {why}", n.name));
        if !rollback::failed_health(ctx, n, p, msg, check, t) {
            t.unavailable += usize::from(!n.ready);
        }
        return;
    }
    // Watching: judge this node; the queries are judged once for the
    // cluster and pinned on the first watched node.
    let verdict = match seen(ctx, n) {
        Ok(seen) => crate::health::judge(&crate::health::Observation {
            spec,
            watch_until: node_watch_until(spec, p.started_at),
            nodes: &[observe::watched(seen, p.started_at)],
            queries: &[],
            now,
        }),
        Err(why) => Verdict::Held(why),
    };
    let verdict = match (verdict, &ctx.queries) {
        (Verdict::Unhealthy(f), _) => Verdict::Unhealthy(f),
        (_, Some(Verdict::Unhealthy(f))) if !t.query_pinned => {
            t.query_pinned = true;
            Verdict::Unhealthy(f.clone())
        }
        (v, _) => v,
    };
    match verdict {
        Verdict::Unhealthy(f) => {
            let msg = bounded(format!("{HEALTH_FAILED_PREFIX}{f}"));
            rollback::failed_health(ctx, n, p, msg, failure_check(&f), t);
        }
        Verdict::Healthy if !matches!(ctx.queries, Some(Verdict::Held(_))) => {
            t.releases.push(Action::Pass {
                node: name,
                progress: NodeProgress {
                    state: ProgressState::Passed,
                    started_at: now,
                    message: String::new(),
                    ..p.clone()
                },
            });
            t.passed.push((n, now));
        }
        still => {
            // Still watched: it counts against the budget and keeps the
            // rollout rolling.
            t.in_flight = true;
            t.unavailable += 1;
            t.poll_health = true;
            match still {
                Verdict::Held(why) => {
                    t.health_hold.get_or_insert(bounded(format!("held: {why}")));
                }
                Verdict::Watching { until } => {
                    t.wake.at(until);
                    t.watch_msg.get_or_insert_with(|| {
                        format!(
                            "node {} is Ready at {target}; its health is watched until {}",
                            n.name,
                            rfc3339(until)
                        )
                    });
                }
                // Passed on its own, but a query cannot be judged.
                _ => {}
            }
        }
    }
}

/// Health after the loop: settle once every node is done, or a firing
/// query between nodes (docs/design.md §5a).
pub(super) fn settle(ctx: &Ctx<'_>, t: &mut Tally<'_>) {
    let now = ctx.now;
    let last_passed = t
        .passed
        .iter()
        .max_by_key(|(n, at)| (*at, &n.name))
        .copied();
    let (Some(spec), Some((last, last_at))) = (ctx.health, last_passed) else {
        if let Some(Verdict::Unhealthy(f)) = &ctx.queries {
            if !t.query_pinned && !t.confirmed {
                // Before any node moved there is nothing of the new version
                // to blame: the query only holds the rollout.
                t.health_hold.get_or_insert(bounded(format!(
                    "held: {f}; no node starts while it returns a sample"
                )));
            }
        }
        return;
    };
    if !t.confirmed {
        if let Some(Verdict::Unhealthy(f)) = &ctx.queries {
            if !t.query_pinned && t.failed.is_none() {
                pin_failure(ctx, last, f, t);
            }
        }
        return;
    }
    let until = settle_until(spec, last_at);
    let mut nodes = Vec::new();
    let mut unseen = None;
    for (n, at) in &t.passed {
        match seen(ctx, n) {
            Ok(s) => nodes.push(observe::watched(s, *at)),
            Err(why) => {
                unseen.get_or_insert(why);
            }
        }
    }
    let results: Vec<crate::health::QueryResult<'_>> = ctx
        .inputs
        .queries
        .iter()
        .map(|(check, outcome)| crate::health::QueryResult {
            check,
            outcome: outcome.clone(),
        })
        .collect();
    let verdict = match unseen {
        Some(why) => Verdict::Held(why),
        None => crate::health::judge(&crate::health::Observation {
            spec,
            watch_until: until,
            nodes: &nodes,
            queries: &results,
            now,
        }),
    };
    t.confirmed = false;
    match verdict {
        Verdict::Unhealthy(f) => {
            let node = failure_node(&f)
                .and_then(|name| t.passed.iter().find(|(n, _)| n.name == name))
                .map_or(last, |(n, _)| *n);
            pin_failure(ctx, node, &f, t);
        }
        Verdict::Held(why) => {
            t.health_hold.get_or_insert(bounded(format!(
                "held: {why}; nothing is confirmed until it answers"
            )));
            // Settle judges every node: it is read again at its own pace,
            // not at the watch's.
            t.wake.at(add(now, SETTLE_RECHECK));
        }
        Verdict::Watching { until } => {
            t.settling = Some(until);
            t.wake.at(until);
            t.wake.at(add(now, SETTLE_RECHECK));
        }
        Verdict::Healthy => {
            // Settled: the records go, so `confirmed` sticks.
            t.confirmed = true;
            for (n, _) in &t.passed {
                t.releases.push(Action::Clear {
                    node: n.name.clone(),
                    reason: "settled: every health check held".into(),
                    stop_run: false,
                });
            }
        }
    }
}

/// Record `f` as failed on `node` (a passed node), unless a failure is
/// recorded already; with `on_failure = "rollback"` it is rolled back.
fn pin_failure<'a>(ctx: &Ctx<'_>, node: &'a NodeView, f: &Failure, t: &mut Tally<'a>) {
    if t.failed.is_some() {
        return;
    }
    let Ok(Some(p)) = &node.progress else {
        return;
    };
    let msg = bounded(format!("{HEALTH_FAILED_PREFIX}{f}"));
    rollback::failed_health(ctx, node, p, msg, failure_check(f), t);
}
