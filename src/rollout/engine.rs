//! The engine: one reconcile step observes the cluster, decides with
//! [`decide`], and applies the actions. It keeps nothing between steps, so a
//! restarted engine resumes from what the nodes record.
//!
//! The actions of a step are applied one node's calls in their order and
//! several nodes' at once, so a step's length does not grow with the nodes
//! in flight; a place freed in the step is filled in the same step, by a
//! cordon served as soon as the give-backs that landed make room for it
//! (`pacing.rs`; BENCHMARKS.md, "Agent under load").

pub use super::apply::EngineError;
use super::apply::{apply_on, NodeCalls};
use super::decide::decide;
use super::decision::{Action, Decision, Held, Inputs, Policy};
use super::health::bounded;
use super::pacing::{Room, Slots, Turn};
use crate::cluster::{Cluster, NodeProgress, NodeSeen, NodeView, ProgressState, RungTaken};
use crate::config::DrainRule;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::Instrument;

/// Where the engine reads the time.
pub trait Clock {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told; clones share the same time.
#[derive(Debug, Clone)]
pub struct VirtualClock(Arc<Mutex<DateTime<Utc>>>);

impl VirtualClock {
    /// A clock showing `t`.
    pub fn new(t: DateTime<Utc>) -> Self {
        VirtualClock(Arc::new(Mutex::new(t)))
    }

    /// Move the clock to `t` (never backwards).
    pub fn set(&self, t: DateTime<Utc>) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if t > *g {
            *g = t;
        }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What one reconcile step did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// The decision taken (state, counts, next wake-up); its actions are the
    /// ones that landed: a call that failed holds its node (`held`), and a
    /// start the budget no longer had room for (a give-back failed) is dropped.
    pub decision: Decision,
    /// Drains that PodDisruptionBudgets newly hold back (or hold back
    /// differently): (node, the message recorded on the node). A budget that
    /// keeps refusing the same pods is reported once, not per pass.
    pub evictions_blocked: Vec<(String, String)>,
    /// Drain rungs beyond `evict` (restart, wait, skip, delete) newly used
    /// on a node and recorded on its record: (node, what). Each is said
    /// once per rung, version and attempt.
    pub drain_rungs: Vec<(String, RungTaken)>,
    /// The step changed something that the next observation should see at
    /// once: call `reconcile` again now rather than waiting for `wake_at`.
    pub again: bool,
    /// Some drain still has pods that could not be evicted: retry soon.
    pub retry_evictions: bool,
    /// The nodes held by a fault of their own after this step, by name: the
    /// decision's holds, less the nodes whose call landed now, plus the calls
    /// that failed. Pass them as the next step's [`Inputs::held`].
    pub held: Vec<Held>,
}

/// Labels for the reconcile span.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    /// Environment name.
    pub env: String,
    /// Config commit being applied.
    pub commit: String,
}

/// The rollout engine for one environment in one cluster. It holds no
/// progress, only its policy and clock: dropping and re-creating it is a restart.
#[derive(Debug, Clone)]
pub struct Engine<K: Clock> {
    /// The policy being applied.
    pub policy: Policy,
    /// Labels for tracing.
    pub labels: Labels,
    /// Where the time comes from.
    pub clock: K,
}

impl<K: Clock> Engine<K> {
    /// An engine applying `policy`.
    pub fn new(policy: Policy, labels: Labels, clock: K) -> Self {
        Engine {
            policy,
            labels,
            clock,
        }
    }

    /// One step at the clock's current time.
    pub async fn reconcile<C: Cluster>(
        &self,
        cluster: &C,
        inputs: &Inputs,
    ) -> Result<Outcome, EngineError<C::Error>> {
        let span = tracing::info_span!(
            "reconcile",
            env = %self.labels.env,
            cluster = %cluster.name(),
            commit = %self.labels.commit,
        );
        // One `reconcile` span per reconcile: inside the agent's own span
        // (which names the head and applied commit) no second one is opened.
        let work = reconcile(cluster, &self.policy, inputs, self.clock.now());
        if tracing::Span::current().is_none() {
            work.instrument(span).await
        } else {
            work.await
        }
    }
}

/// One step: observe → decide → apply, at `now`.
///
/// One node's trouble stays that node's: a node the backend could not
/// observe in full is held by the decision, and a call that fails holds its
/// node (in [`Outcome::held`]) while the step goes on with every other
/// action. Only when a give-back failed are starts dropped, as many as it
/// takes for the nodes still out to fit the budget.
pub async fn reconcile<C: Cluster>(
    cluster: &C,
    policy: &Policy,
    inputs: &Inputs,
    now: DateTime<Utc>,
) -> Result<Outcome, EngineError<C::Error>> {
    let nodes = cluster.observe().await.map_err(EngineError::Observe)?;
    let watched = watched_nodes(policy, &nodes);
    let with_health;
    let inputs = if watched.is_empty() {
        inputs
    } else {
        // A failed read holds the verdicts of the nodes it was for; it
        // stops no timeout, give-back or other node.
        let health = match cluster.health(&watched).await {
            Ok(h) => h,
            Err(e) => watched
                .iter()
                .map(|n| NodeSeen::unread(n.clone(), format!("cannot read its health: {e}")))
                .collect(),
        };
        with_health = Inputs {
            health,
            ..inputs.clone()
        };
        &with_health
    };
    let mut decision = decide(policy, inputs, &nodes, now);
    tracing::debug!(
        state = ?decision.state,
        nodes = decision.nodes,
        at_version = decision.nodes_at_version,
        actions = decision.actions.len(),
        held = decision.held.len(),
        "decided"
    );
    let mut run = Run::default();
    let room = Room::for_step(&decision, policy.prestage.is_zero());
    for d in apply_all(
        cluster,
        &decision.actions,
        (&nodes, &policy.drain),
        &decision.held,
        now,
        &room,
    )
    .await
    {
        run.fold(d);
    }
    let withheld = room.withheld();
    if withheld > 0 {
        tracing::warn!(
            withheld,
            "starts withheld: nodes whose give-back failed still count against the budget"
        );
    }
    let held = run.held(&decision.held, &inputs.held, now);
    decision.actions = run.landed;
    Ok(Outcome {
        decision,
        evictions_blocked: run.evictions_blocked,
        drain_rungs: run.rungs,
        again: run.again,
        retry_evictions: run.retry_evictions,
        held,
    })
}

/// Apply `actions`, each node's in their order (a note before the
/// eviction pass it explains), different nodes' concurrently as [`Slots`]
/// serve them, cordons as `room` lets them; the outcomes in `actions`'
/// order (a withheld cordon has none).
async fn apply_all<C: Cluster>(
    cluster: &C,
    actions: &[Action],
    (nodes, rules): (&[NodeView], &[DrainRule]),
    held: &[Held],
    now: DateTime<Utc>,
    room: &Room,
) -> Vec<Done> {
    let mut by_node: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, a) in actions.iter().enumerate() {
        match by_node.iter_mut().find(|(n, _)| *n == a.node()) {
            Some((_, is)) => is.push(i),
            None => by_node.push((a.node(), vec![i])),
        }
    }
    let slots = Slots::new();
    // Futures made by a named fn, not a closure's async block: the
    // agent's pass must stay `Send`, which closures over borrows defeat.
    let groups = by_node.into_iter().map(|(_, is)| {
        in_order(
            cluster,
            actions,
            is,
            (nodes, rules),
            held,
            now,
            room,
            &slots,
        )
    });
    let mut done: Vec<(usize, Done)> = futures::future::join_all(groups)
        .await
        .into_iter()
        .flatten()
        .collect();
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, d)| d).collect()
}

/// One node's actions (`is`, indexes into `actions`), one after another,
/// in one call slot (given up while a cordon waits for room).
#[allow(clippy::too_many_arguments)]
async fn in_order<C: Cluster>(
    cluster: &C,
    actions: &[Action],
    is: Vec<usize>,
    (nodes, rules): (&[NodeView], &[DrainRule]),
    held: &[Held],
    now: DateTime<Utc>,
    room: &Room,
    slots: &Slots,
) -> Vec<(usize, Done)> {
    let mut out = Vec::with_capacity(is.len());
    let mut stopped = false;
    let mut slot = None;
    let name = is.first().map_or("", |i| actions[*i].node());
    let mut calls =
        NodeCalls::new(name, nodes.iter().find(|n| n.name == name), now).with_rules(rules);
    for i in is {
        let action = &actions[i];
        if stopped {
            // Not applied: the node's calls after a failed write (they
            // build on the record it would have stored) or a withheld
            // cordon wait for a later step.
            if action.gives_back() {
                room.resolved(false);
            }
            out.push((i, Done::skipped(action)));
            continue;
        }
        let ticket = room.ticket(i);
        if let Some(ticket) = ticket {
            slot = None;
            if !room.wait(ticket).await {
                stopped = true;
                continue;
            }
        }
        if slot.is_none() {
            let turn = if room.fills_place(i) {
                Turn::Start(i)
            } else {
                Turn::Call(i)
            };
            slot = Some(slots.acquire(turn).await);
        }
        // Boxed: every node's future is made at once, and the call's own
        // state (a few KiB for an API request) is only needed by the
        // `CALLS_AT_ONCE` holding a slot.
        let done = Box::pin(attempt(cluster, action, &mut calls, held, now)).await;
        if action.gives_back() {
            room.resolved(done.landed);
        }
        stopped = !done.landed && !matches!(action, Action::Evict { .. });
        out.push((i, done));
    }
    out
}

/// What one action came to.
struct Done {
    action: Action,
    landed: bool,
    /// (node, why) when the call failed (a note's failure holds nothing new).
    failure: Option<(String, String)>,
    /// The step changed something the next observation should see at once.
    again: bool,
    /// An eviction pass left pods on its node.
    retry_evictions: bool,
    /// (node, message) of a drain newly held back by budgets.
    evictions_blocked: Option<(String, String)>,
    /// The drain rungs beyond `evict` newly recorded on the node.
    rungs: Vec<(String, RungTaken)>,
}

impl Done {
    /// An action not applied (its node's hold says why).
    fn skipped(action: &Action) -> Done {
        Done {
            action: action.clone(),
            landed: false,
            failure: None,
            again: false,
            retry_evictions: false,
            evictions_blocked: None,
            rungs: Vec::new(),
        }
    }
}

/// Apply `action` (see [`Run::fold`] for what its outcome does).
async fn attempt<C: Cluster>(
    cluster: &C,
    action: &Action,
    calls: &mut NodeCalls<'_>,
    held: &[Held],
    now: DateTime<Utc>,
) -> Done {
    let mut done = Done::skipped(action);
    let pass = match apply_on(cluster, action, calls).await {
        Ok(pass) => pass,
        Err(e) => {
            let why = bounded(match &e {
                EngineError::Apply { source, .. } => source.to_string(),
                other => other.to_string(),
            });
            let node = action.node();
            // Once per hold and reason: a fault that lasts is not news at every pass.
            if held.iter().any(|h| h.node == node && h.why == why) {
                tracing::debug!(action = action.kind(), node, error = %why, "call failed again");
            } else {
                tracing::warn!(
                    action = action.kind(),
                    node,
                    error = %why,
                    "call failed; the node is held, the others go on"
                );
            }
            if !matches!(action, Action::Note { .. }) {
                done.failure = Some((node.to_string(), why));
            }
            return done;
        }
    };
    done.landed = true;
    if matches!(action, Action::Cordon { .. }) {
        let node = action.node().to_string();
        done.rungs = calls.taint_taken().map(|t| (node, t)).into_iter().collect();
    }
    let Some(pass) = pass.filter(|p| p.remaining > 0) else {
        // Something changed (a drain that emptied the node: the upgrade
        // can start now).
        done.again = true;
        return done;
    };
    done.retry_evictions = true;
    if !pass.rungs.is_empty() {
        let node = action.node().to_string();
        match calls.note_rungs(cluster, &pass.rungs).await {
            Ok(new) => {
                done.again |= new.iter().any(|t| t.rung == crate::config::RungKind::Skip);
                done.rungs = new.into_iter().map(|t| (node.clone(), t)).collect();
            }
            Err(e) => {
                tracing::warn!(node = %node, error = %e, "could not record the drain's rungs");
                done.failure = Some((node, bounded(format!("recording the drain's rungs: {e}"))));
                return done;
            }
        }
    }
    let progress = calls.progress();
    let (false, Some(p)) = (pass.blocked_by.is_empty(), progress) else {
        return done;
    };
    let Some(msg) = refusal_message(&p.message, &pass, now) else {
        return done;
    };
    let node = action.node().to_string();
    let recorded = NodeProgress {
        message: msg.clone(),
        ..p
    };
    match calls.note(cluster, &recorded).await {
        Ok(()) => done.evictions_blocked = Some((node, msg)),
        Err(e) => {
            tracing::warn!(node = %node, error = %e, "could not record the refusal");
            done.failure = Some((node, bounded(format!("recording the refusal: {e}"))));
        }
    }
    done
}

/// What the actions of one step came to.
#[derive(Default)]
struct Run {
    landed: Vec<Action>,
    /// (node, why) of each call that failed.
    failures: Vec<(String, String)>,
    evictions_blocked: Vec<(String, String)>,
    rungs: Vec<(String, RungTaken)>,
    again: bool,
    retry_evictions: bool,
}

impl Run {
    /// Take one action's outcome in: a landed call is kept in the
    /// decision, a failed one holds its node (unless the action only
    /// recorded a hold: the hold stands as it was).
    fn fold(&mut self, d: Done) {
        if d.landed {
            self.landed.push(d.action);
        }
        self.failures.extend(d.failure);
        self.again |= d.again;
        self.retry_evictions |= d.retry_evictions;
        self.evictions_blocked.extend(d.evictions_blocked);
        self.rungs.extend(d.rungs);
    }

    /// The holds after the step: `decided`, less the nodes whose call
    /// landed (a note only records a hold), plus the failures; a node held
    /// before keeps its `since`.
    fn held(&self, decided: &[Held], carried: &[Held], now: DateTime<Utc>) -> Vec<Held> {
        let mut held: BTreeMap<String, Held> = decided
            .iter()
            .map(|h| (h.node.clone(), h.clone()))
            .collect();
        for a in &self.landed {
            if !matches!(a, Action::Note { .. }) {
                held.remove(a.node());
            }
        }
        for (node, why) in &self.failures {
            let since = decided
                .iter()
                .chain(carried)
                .find(|h| h.node == *node)
                .map_or(now, |h| h.since);
            held.insert(
                node.clone(),
                Held {
                    node: node.clone(),
                    why: why.clone(),
                    since,
                    last: now,
                },
            );
        }
        held.into_values().collect()
    }
}

/// The nodes whose health the decision judges: with `[health]`, those
/// `watching` at the target, those rolled back and Ready at their previous
/// version (checked there before they are uncordoned), and once every node
/// is done (Ready at the target, passed or idle) the `passed` ones, for settle.
pub fn watched_nodes(policy: &Policy, nodes: &[NodeView]) -> Vec<String> {
    if policy.health.is_none() {
        return Vec::new();
    }
    let at_target = |p: &NodeProgress| p.target == policy.target;
    let settling = nodes.iter().all(|n| match &n.progress {
        Ok(Some(p)) => p.state == ProgressState::Passed && at_target(p),
        Ok(None) => n.ready && n.version.as_ref() == Some(&policy.target),
        Err(_) => false,
    });
    nodes
        .iter()
        .filter(|n| {
            let back = |p: &NodeProgress| {
                p.state == ProgressState::RollingBack
                    && n.ready
                    && n.version.as_ref() == Some(p.run_version())
            };
            matches!(&n.progress, Ok(Some(p)) if back(p) || (at_target(p)
                && (p.state == ProgressState::Watching
                    || (settling && p.state == ProgressState::Passed))))
        })
        .map(|n| n.name.clone())
        .collect()
}

/// The most pod names a refusal message lists (node annotations and Event
/// notes stay small).
const MAX_PODS_NAMED: usize = 10;

/// The draining node's new message after a pass that PDBs refused, or
/// `None` when `old` already says the same (its "since" is then kept).
fn refusal_message(
    old: &str,
    pass: &crate::cluster::EvictionPass,
    now: DateTime<Utc>,
) -> Option<String> {
    let mut pods: Vec<&str> = pass
        .refused_pods
        .iter()
        .take(MAX_PODS_NAMED)
        .map(String::as_str)
        .collect();
    let more = pass.refused_pods.len().saturating_sub(MAX_PODS_NAMED);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    if pods.is_empty() {
        pods.push("pods");
    }
    let what = format!(
        "PodDisruptionBudget{} {} refused evicting {}{more}",
        if pass.blocked_by.len() == 1 { "" } else { "s" },
        pass.blocked_by.join(", "),
        pods.join(", ")
    );
    if old.starts_with(&format!("{what} since ")) {
        return None;
    }
    Some(format!(
        "{what} since {}",
        now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    ))
}
