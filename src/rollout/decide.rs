//! The pure decision core: policy, gates, window state and observed nodes
//! in, the next actions and the environment's state out. No I/O, no clock:
//! the same inputs always give the same decision.
//!
//! Choices where docs/design.md is silent:
//! - Budget: a node counts against `max_unavailable` when drover has it in
//!   flight (draining/upgrading) *or* it is NotReady for any reason: drover
//!   takes no more capacity down while the cluster is already degraded. A
//!   Ready node cordoned by someone else still runs its pods and does not count.
//! - A node cordoned by someone else without drover's record, a node whose
//!   version cannot be read, a NotReady idle node and a node with unreadable
//!   drover annotations are skipped and reported, never touched.
//! - Timeouts fire when `now - started_at >= timeout`, so the instant to wake
//!   at is exact. In `draining` only `drain_timeout` applies (the node is
//!   given back, blocked); in `upgrading` `node_timeout` (the node failed).
//! - Blocked nodes: with `skip` they are tried again once no never-attempted
//!   node is left to start, and not before their backoff ([`retry_backoff`]:
//!   5 minutes after the first give-back, doubling per retry, at most 2
//!   hours; the first retry comes earlier when every budget covering the
//!   node's pods allows a disruption again), so a budget that never relents
//!   cannot keep a node cordoned in a loop; with `stop` no node starts while a node blocked
//!   in the current window (or since it opened) remains, and a node blocked
//!   before the current window opened is eligible again, first. A retry
//!   annotation or a new target clears blocked and failed records at once.
//! - A failed node for the current target stops every new start until the
//!   target changes or `drover.dev/retry` is set on it.
//! - A node completes on its own recorded target; if the pinned version
//!   changed meanwhile, the node becomes idle and is moved again later.
//! - Confirmed needs at least one selected node: zero nodes is reported
//!   blocked, so an empty selector is never evidence for the next environment.
//! - States (docs/design.md §5): `failed` and `blocked` mean someone should
//!   look; a blocked node keeps the state `blocked` until another node is in
//!   flight. Outside a window the state is `pending`, under `paused` or a
//!   freeze `paused`. A patch update (same major.minor as every selected
//!   node) uses [`Inputs::patch_window`], which a `minor` freeze leaves open.

use super::decision::{Action, Decision, Inputs, Policy, Skipped};
use super::health::{
    bounded, failure_check, failure_node, queries_verdict, HEALTH_FAILED_PREFIX, SETTLE_RECHECK,
};
use super::RolloutState;
use crate::cluster::{NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::config::OnDrainTimeout;
use crate::health::{node_watch_until, observe, settle_until, Failure, Verdict};
use crate::window::Change;
use chrono::{DateTime, Utc};
use std::time::Duration;

fn elapsed(now: DateTime<Utc>, since: DateTime<Utc>, limit: Duration) -> (bool, DateTime<Utc>) {
    let limit = chrono::Duration::from_std(limit).unwrap_or(chrono::Duration::MAX);
    let deadline = since
        .checked_add_signed(limit)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    (now >= deadline, deadline)
}

/// How long a node given back after a drain timeout waits before its
/// retry number `attempts + 1`: 5 minutes, doubling, at most 2 hours.
pub fn retry_backoff(attempts: u32) -> Duration {
    let base = Duration::from_secs(5 * 60);
    base.saturating_mul(1u32 << attempts.min(5))
        .min(Duration::from_secs(2 * 3600))
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Decide the next actions. `nodes` may come in any order; the decision
/// handles them by name so that it is deterministic.
pub fn decide(
    policy: &Policy,
    inputs: &Inputs,
    nodes: &[NodeView],
    now: DateTime<Utc>,
) -> Decision {
    let mut order: Vec<&NodeView> = nodes.iter().collect();
    order.sort_unstable_by(|a, b| a.name.cmp(&b.name));

    let total = order.len();
    let budget = policy.max_unavailable.resolve(total);
    let target = &policy.target;
    let change = Change::of(target, order.iter().map(|n| n.version.as_ref()));
    let win = match change {
        Change::Patch => inputs.patch_window.as_ref().unwrap_or(&inputs.window),
        Change::Other => &inputs.window,
    };
    let mut wake = WakeAt(win.closes_at.or(win.next_opens_at));

    let mut releases = Vec::new();
    let mut advances = Vec::new();
    let mut skipped = Vec::new();
    let mut unavailable = 0usize;
    let mut in_flight = 0usize;
    let mut fresh: Vec<&NodeView> = Vec::new();
    let mut blocked_retry: Vec<&NodeView> = Vec::new();
    let mut failed: Option<(String, String)> = None;
    let mut stop_blocked: Option<(String, String)> = None;
    let mut blocked_count = 0usize;
    // The first blocked node and why, for the state message.
    let mut blocked_msg: Option<String> = None;
    let mut at_version = 0usize;
    let mut confirmed = total > 0;
    // Health (docs/design.md §5a): the Prometheus checks' verdict, nodes
    // that passed their watch (with when), the first watch in progress, why
    // the checks hold, and whether a firing query was pinned on a node.
    let health = policy.health.as_ref();
    let queries = health.map(|spec| queries_verdict(spec, &inputs.queries, now));
    let mut passed: Vec<(&NodeView, DateTime<Utc>)> = Vec::new();
    let mut watch_msg: Option<String> = None;
    let mut health_hold: Option<String> = None;
    let mut query_pinned = false;
    let mut poll_health = false;
    if let Some(Verdict::Held(why)) = &queries {
        health_hold = Some(bounded(format!(
            "held: {why}; no node starts or passes and nothing is confirmed until it answers"
        )));
    }

    for n in &order {
        let at_target = n.version.as_ref() == Some(target);
        if n.ready && at_target {
            at_version += 1;
        }
        let progress = match &n.progress {
            Ok(p) => p.as_ref(),
            Err(e) => {
                confirmed = false;
                unavailable += usize::from(!n.ready || n.unschedulable);
                skipped.push(skip(n, format!("unreadable drover annotations: {e}")));
                continue;
            }
        };
        // A node that passed its watch and is still Ready at the target is
        // done, like an idle one; settle is judged after the loop.
        let progress = match progress {
            Some(p)
                if health.is_some()
                    && p.state == ProgressState::Passed
                    && p.target == *target
                    && n.ready
                    && at_target =>
            {
                passed.push((n, p.started_at));
                None
            }
            other => other,
        };
        let Some(p) = progress else {
            // Idle node.
            unavailable += usize::from(!n.ready);
            if n.ready && at_target {
                continue;
            }
            confirmed = false;
            if at_target {
                skipped.push(skip(n, "NotReady".into()));
            } else if n.version.is_none() {
                skipped.push(skip(n, "OS version cannot be read".into()));
            } else if n.unschedulable {
                skipped.push(skip(n, "cordoned by someone else".into()));
            } else if !n.ready {
                skipped.push(skip(n, "NotReady".into()));
            } else {
                fresh.push(n);
            }
            continue;
        };
        confirmed = false;
        let name = n.name.clone();
        match p.state {
            ProgressState::Draining => {
                let (timed_out, deadline) = elapsed(now, p.started_at, policy.drain_timeout);
                if timed_out {
                    // The engine records which budgets refused which pods
                    // in the draining node's message.
                    let why = if p.message.is_empty() {
                        format!("{} pods left", n.pods_to_evict)
                    } else {
                        format!("{} pods left; {}", n.pods_to_evict, p.message)
                    };
                    let msg = format!(
                        "drain did not finish within drain_timeout ({}): {why}",
                        fmt_duration(policy.drain_timeout),
                    );
                    let retry_at = add(now, retry_backoff(p.attempts));
                    blocked_msg.get_or_insert_with(|| {
                        format!(
                            "node {} blocked since {}: {msg}; next try after {}",
                            n.name,
                            rfc3339(now),
                            rfc3339(retry_at)
                        )
                    });
                    if policy.on_drain_timeout == OnDrainTimeout::Skip {
                        wake.at(retry_at);
                    }
                    releases.push(Action::Block {
                        node: name,
                        progress: given_back(p, ProgressState::Blocked, now, msg),
                        uncordon: p.cordoned_by_drover,
                    });
                    blocked_count += 1;
                    unavailable += usize::from(!n.ready);
                    if policy.on_drain_timeout == OnDrainTimeout::Stop {
                        stop_blocked.get_or_insert((n.name.clone(), "drain timed out".into()));
                    }
                    continue;
                }
                wake.at(deadline);
                in_flight += 1;
                unavailable += 1;
                if n.pods_to_evict > 0 {
                    advances.push(Action::Evict { node: name });
                } else {
                    advances.push(Action::StartUpgrade {
                        node: name,
                        progress: NodeProgress {
                            state: ProgressState::Upgrading,
                            target: target.clone(),
                            ..p.clone()
                        },
                    });
                }
            }
            ProgressState::Upgrading => {
                let node_at_own_target = n.version.as_ref() == Some(&p.target);
                let (timed_out, deadline) = elapsed(now, p.started_at, policy.node_timeout);
                let failure = if n.ready && node_at_own_target && health.is_some() && at_target {
                    // Back at the version: its health is watched next, and
                    // it keeps counting against the budget meanwhile.
                    releases.push(Action::Watch {
                        node: name,
                        progress: watching(p, now),
                        uncordon: p.cordoned_by_drover,
                    });
                    in_flight += 1;
                    unavailable += 1;
                    poll_health = true;
                    continue;
                } else if n.ready && node_at_own_target {
                    releases.push(Action::Complete {
                        node: name,
                        uncordon: p.cordoned_by_drover,
                    });
                    continue;
                } else if let UpgradeStatus::Failed(m) = &n.upgrade {
                    Some(format!("upgrade driver failed: {m}"))
                } else if n.upgrade == UpgradeStatus::Succeeded && n.ready {
                    Some(match &n.version {
                        Some(v) => format!("node returned Ready at {v} instead of {}", p.target),
                        None => format!(
                            "node returned Ready but its OS version cannot be read (expected {})",
                            p.target
                        ),
                    })
                } else if timed_out {
                    Some(format!(
                        "node did not return Ready at {} within node_timeout ({})",
                        p.target,
                        fmt_duration(policy.node_timeout)
                    ))
                } else {
                    None
                };
                if let Some(msg) = failure {
                    if p.target == *target {
                        failed.get_or_insert((n.name.clone(), msg.clone()));
                    }
                    releases.push(Action::Fail {
                        node: name,
                        progress: given_back(p, ProgressState::Failed, now, msg),
                        uncordon: p.cordoned_by_drover,
                    });
                    unavailable += usize::from(!n.ready);
                    continue;
                }
                wake.at(deadline);
                in_flight += 1;
                unavailable += 1;
                if n.upgrade == UpgradeStatus::NotStarted {
                    // A crash between recording `upgrading` and starting the driver.
                    advances.push(Action::StartUpgrade {
                        node: name,
                        progress: p.clone(),
                    });
                }
            }
            ProgressState::Watching | ProgressState::Passed => {
                let Some(spec) = health.filter(|_| p.target == *target) else {
                    unavailable += usize::from(!n.ready);
                    releases.push(Action::Clear {
                        node: name,
                        reason: if p.target == *target {
                            "[health] removed".into()
                        } else {
                            format!("target changed from {} to {target}", p.target)
                        },
                    });
                    continue;
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
                    // Only a `passed` node that stopped being Ready at the
                    // version lands here: that fails the rollout as well.
                    unavailable += usize::from(!n.ready);
                    let msg = bounded(format!("{HEALTH_FAILED_PREFIX}node {}: {why}", n.name));
                    failed.get_or_insert((n.name.clone(), msg.clone()));
                    releases.push(unhealthy(p, name, now, msg, check));
                    continue;
                }
                // Watching: judge this node; the queries are judged once for
                // the cluster and pinned on the first watched node.
                in_flight += 1;
                unavailable += 1;
                let verdict = match inputs.health.iter().find(|s| s.name == n.name) {
                    Some(seen) => crate::health::judge(&crate::health::Observation {
                        spec,
                        watch_until: node_watch_until(spec, p.started_at),
                        nodes: &[observe::watched(seen, p.started_at)],
                        queries: &[],
                        now,
                    }),
                    None => Verdict::Held(format!("no health observation of node {}", n.name)),
                };
                let verdict = match (verdict, &queries) {
                    (Verdict::Unhealthy(f), _) => Verdict::Unhealthy(f),
                    (_, Some(Verdict::Unhealthy(f))) if !query_pinned => {
                        query_pinned = true;
                        Verdict::Unhealthy(f.clone())
                    }
                    (v, _) => v,
                };
                match verdict {
                    Verdict::Unhealthy(f) => {
                        in_flight -= 1;
                        unavailable -= 1;
                        let msg = bounded(format!("{HEALTH_FAILED_PREFIX}{f}"));
                        failed.get_or_insert((n.name.clone(), msg.clone()));
                        releases.push(unhealthy(p, name, now, msg, failure_check(&f)));
                    }
                    Verdict::Healthy if !matches!(queries, Some(Verdict::Held(_))) => {
                        in_flight -= 1;
                        unavailable -= 1;
                        releases.push(Action::Pass {
                            node: name,
                            progress: NodeProgress {
                                state: ProgressState::Passed,
                                started_at: now,
                                message: String::new(),
                                ..p.clone()
                            },
                        });
                        passed.push((n, now));
                    }
                    Verdict::Held(why) => {
                        health_hold.get_or_insert(bounded(format!("held: {why}")));
                        poll_health = true;
                    }
                    Verdict::Watching { until } => {
                        wake.at(until);
                        poll_health = true;
                        watch_msg.get_or_insert_with(|| {
                            format!(
                                "node {} is Ready at {target}; its health is watched until {}",
                                n.name,
                                rfc3339(until)
                            )
                        });
                    }
                    Verdict::Healthy => {
                        // Passed on its own, but a query cannot be judged.
                        poll_health = true;
                    }
                }
            }
            ProgressState::Blocked | ProgressState::Failed => {
                unavailable += usize::from(!n.ready);
                if n.retry
                    && p.state == ProgressState::Failed
                    && p.target == *target
                    && health.is_some()
                    && n.ready
                    && at_target
                {
                    // A retried node already at the version is watched again
                    // rather than taken for healthy.
                    releases.push(Action::Watch {
                        node: name,
                        progress: watching(p, now),
                        uncordon: false,
                    });
                    in_flight += 1;
                    unavailable += 1;
                    poll_health = true;
                    continue;
                }
                if p.target != *target || n.retry {
                    let reason = if n.retry {
                        "retry requested".to_string()
                    } else {
                        format!("target changed from {} to {target}", p.target)
                    };
                    releases.push(Action::Clear { node: name, reason });
                    continue;
                }
                if p.state == ProgressState::Failed {
                    failed.get_or_insert((n.name.clone(), p.message.clone()));
                    skipped.push(skip(n, format!("failed: {}", p.message)));
                    continue;
                }
                blocked_count += 1;
                let held = match policy.on_drain_timeout {
                    OnDrainTimeout::Skip => false,
                    OnDrainTimeout::Stop => {
                        win.opened_at.is_none_or(|opened| p.started_at >= opened)
                    }
                };
                let retry_at = add(p.started_at, retry_backoff(p.attempts));
                // Budgets that allow a disruption again cut only the first
                // wait short: a budget that relents only because the node
                // was given back must not turn retries into a loop.
                let relented = n.budgets_allow_drain && p.attempts == 0;
                let backing_off =
                    policy.on_drain_timeout == OnDrainTimeout::Skip && now < retry_at && !relented;
                blocked_msg.get_or_insert_with(|| {
                    let next = if backing_off {
                        format!("; next try after {}", rfc3339(retry_at))
                    } else {
                        String::new()
                    };
                    format!(
                        "node {} blocked since {}: {}{next}",
                        n.name,
                        rfc3339(p.started_at),
                        p.message
                    )
                });
                if backing_off {
                    wake.at(retry_at);
                    skipped.push(skip(
                        n,
                        format!("blocked, next try after {}", rfc3339(retry_at)),
                    ));
                } else if held {
                    stop_blocked.get_or_insert((n.name.clone(), p.message.clone()));
                    skipped.push(skip(n, format!("blocked: {}", p.message)));
                } else if n.unschedulable {
                    skipped.push(skip(n, "blocked, and cordoned by someone else".into()));
                } else if !n.ready {
                    skipped.push(skip(n, "blocked, and NotReady".into()));
                } else {
                    blocked_retry.push(n);
                }
            }
        }
    }

    // Health after the loop: settle once every node is done, or a firing
    // query between nodes (docs/design.md §5a).
    let mut settling: Option<DateTime<Utc>> = None;
    let last_passed = passed.iter().max_by_key(|(n, t)| (*t, &n.name)).copied();
    if let (Some(spec), Some((last, last_at))) = (health, last_passed) {
        if confirmed {
            let until = settle_until(spec, last_at);
            let mut seen = Vec::new();
            let mut missing = None;
            for (n, t) in &passed {
                match inputs.health.iter().find(|s| s.name == n.name) {
                    Some(s) => seen.push(observe::watched(s, *t)),
                    None => missing = Some(n.name.clone()),
                }
            }
            let results: Vec<crate::health::QueryResult<'_>> = inputs
                .queries
                .iter()
                .map(|(check, outcome)| crate::health::QueryResult {
                    check,
                    outcome: outcome.clone(),
                })
                .collect();
            let verdict = match missing {
                Some(node) => Verdict::Held(format!("no health observation of node {node}")),
                None => crate::health::judge(&crate::health::Observation {
                    spec,
                    watch_until: until,
                    nodes: &seen,
                    queries: &results,
                    now,
                }),
            };
            confirmed = false;
            match verdict {
                Verdict::Unhealthy(f) => {
                    let node = failure_node(&f)
                        .and_then(|name| passed.iter().find(|(n, _)| n.name == name))
                        .map_or(last, |(n, _)| *n);
                    pin_failure(node, &f, now, &mut failed, &mut releases);
                }
                Verdict::Held(why) => {
                    health_hold.get_or_insert(bounded(format!(
                        "held: {why}; nothing is confirmed until it answers"
                    )));
                    poll_health = true;
                }
                Verdict::Watching { until } => {
                    settling = Some(until);
                    wake.at(until);
                    wake.at(add(now, SETTLE_RECHECK));
                }
                Verdict::Healthy => {
                    // Settled: the records go, so `confirmed` sticks.
                    confirmed = true;
                    for (n, _) in &passed {
                        releases.push(Action::Clear {
                            node: n.name.clone(),
                            reason: "settled: every health check held".into(),
                        });
                    }
                }
            }
        } else if let Some(Verdict::Unhealthy(f)) = &queries {
            if !query_pinned && failed.is_none() {
                pin_failure(last, f, now, &mut failed, &mut releases);
            }
        }
    } else if let Some(Verdict::Unhealthy(f)) = &queries {
        if !query_pinned && !confirmed {
            // Before any node moved there is nothing of the new version to
            // blame: the query only holds the rollout.
            health_hold.get_or_insert(bounded(format!(
                "held: {f}; no node starts while it returns a sample"
            )));
        }
    }

    // Which nodes may start now, in order.
    let mut hold: Option<(RolloutState, String)> = None;
    if let Some((node, msg)) = &failed {
        hold = Some((
            RolloutState::Failed,
            format!("node {node} failed: {msg}; rollout stopped until retry or a new target"),
        ));
    } else if let Some((node, msg)) = &stop_blocked {
        hold = Some((
            RolloutState::Blocked,
            format!(
                "node {node} blocked ({msg}); on_drain_timeout = \"stop\": no node starts before the next window"
            ),
        ));
    } else if let Some(h) = &health_hold {
        hold = Some((RolloutState::Blocked, h.clone()));
    } else if !inputs.may_start {
        hold = Some((
            RolloutState::Blocked,
            if inputs.hold_reason.is_empty() {
                "may not start: gate or trust refused".into()
            } else {
                inputs.hold_reason.clone()
            },
        ));
    } else if !win.is_open() {
        let state = if win.held.is_some() {
            RolloutState::Paused
        } else {
            RolloutState::Pending
        };
        hold = Some((state, win.hold_message()));
    }
    let mut starts = Vec::new();
    if hold.is_none() && !confirmed {
        let candidates: Vec<&NodeView> = match policy.on_drain_timeout {
            OnDrainTimeout::Stop => blocked_retry.iter().chain(fresh.iter()).copied().collect(),
            OnDrainTimeout::Skip if fresh.is_empty() => blocked_retry.clone(),
            OnDrainTimeout::Skip => fresh.clone(),
        };
        for n in candidates {
            if unavailable >= budget {
                break;
            }
            unavailable += 1;
            in_flight += 1;
            starts.push(Action::Cordon {
                node: n.name.clone(),
                progress: NodeProgress {
                    state: ProgressState::Draining,
                    target: target.clone(),
                    started_at: now,
                    cordoned_by_drover: !n.unschedulable,
                    message: String::new(),
                    // A blocked node's retry counts, so its next backoff grows.
                    attempts: match &n.progress {
                        Ok(Some(p)) if p.state == ProgressState::Blocked => {
                            p.attempts.saturating_add(1)
                        }
                        _ => 0,
                    },
                },
            });
        }
    }

    let (state, message) = if let Some((node, msg)) = failed {
        (RolloutState::Failed, format!("node {node} failed: {msg}"))
    } else if confirmed {
        (RolloutState::Confirmed, String::new())
    } else if let Some(until) = settling {
        (
            RolloutState::Settling,
            format!(
                "every node is Ready at {target} and passed its watch; settling until {}",
                rfc3339(until)
            ),
        )
    } else if in_flight > 0 || releases.iter().any(|a| !matches!(a, Action::Block { .. })) {
        (
            RolloutState::Rolling,
            health_hold.or(watch_msg).unwrap_or_default(),
        )
    } else if let Some(b) = blocked_msg {
        (RolloutState::Blocked, b)
    } else if let Some(h) = hold {
        h
    } else if total == 0 {
        (RolloutState::Blocked, "no selected nodes".into())
    } else if blocked_count > 0 || !skipped.is_empty() {
        let list: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.node, s.reason))
            .collect();
        (
            RolloutState::Blocked,
            format!("nodes not moved: {}", list.join("; ")),
        )
    } else {
        (
            RolloutState::Blocked,
            format!("budget used up: {unavailable} of {budget} nodes unavailable"),
        )
    };

    let mut actions = releases;
    actions.append(&mut advances);
    actions.append(&mut starts);
    Decision {
        actions,
        state,
        message,
        nodes: total as u32,
        nodes_at_version: at_version as u32,
        max_unavailable: budget as u32,
        unavailable: unavailable as u32,
        skipped,
        wake_at: wake.0,
        poll_health,
    }
}

fn add(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    elapsed(t, t, d).1
}

/// The earliest instant the decision asks to be woken at (its `wake_at`).
struct WakeAt(Option<DateTime<Utc>>);

impl WakeAt {
    fn at(&mut self, t: DateTime<Utc>) {
        self.0 = Some(self.0.map_or(t, |w| w.min(t)));
    }
}

fn skip(n: &NodeView, reason: String) -> Skipped {
    Skipped {
        node: n.name.clone(),
        reason,
    }
}

/// The record of a node whose health watch starts at `now`.
fn watching(p: &NodeProgress, now: DateTime<Utc>) -> NodeProgress {
    NodeProgress {
        state: ProgressState::Watching,
        target: p.target.clone(),
        started_at: now,
        cordoned_by_drover: false,
        message: String::new(),
        attempts: p.attempts,
    }
}

/// The action recording a failed health check on a watched node.
fn unhealthy(
    p: &NodeProgress,
    node: String,
    now: DateTime<Utc>,
    msg: String,
    check: &str,
) -> Action {
    Action::Unhealthy {
        node,
        progress: given_back(p, ProgressState::Failed, now, msg),
        check: check.into(),
    }
}

/// Record `f` as failed on `node` (a passed node), unless a failure is recorded already.
fn pin_failure(
    node: &NodeView,
    f: &Failure,
    now: DateTime<Utc>,
    failed: &mut Option<(String, String)>,
    releases: &mut Vec<Action>,
) {
    if failed.is_some() {
        return;
    }
    let Ok(Some(p)) = &node.progress else {
        return;
    };
    let msg = bounded(format!("{HEALTH_FAILED_PREFIX}{f}"));
    *failed = Some((node.name.clone(), msg.clone()));
    releases.push(unhealthy(p, node.name.clone(), now, msg, failure_check(f)));
}

fn given_back(
    p: &NodeProgress,
    state: ProgressState,
    now: DateTime<Utc>,
    msg: String,
) -> NodeProgress {
    NodeProgress {
        state,
        target: p.target.clone(),
        started_at: now,
        cordoned_by_drover: false,
        message: msg,
        attempts: p.attempts,
    }
}
