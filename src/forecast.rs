//! The plan forecast: how a rollout would go, window by window. The rollout
//! engine itself runs on an in-memory cluster seeded from the real nodes and a
//! virtual clock, so the forecast and the agent decide the same way. It
//! assumes the promotion gate and the trust check pass. `drover plan` prints
//! it; the agent never uses it.

use crate::cluster::{Cluster, NodeView};
use crate::config::EnvConfig;
use crate::rollout::{decide, Decision, Engine, Labels, Policy, RolloutState, VirtualClock};
use crate::sim::{drive, EventKind, Sim, Timeline};
use crate::window::{Calendar, Change};
use chrono::{DateTime, Utc};
use semver::Version;
use serde::Serialize;
use std::time::Duration;

/// One window of the forecast.
#[derive(Debug, Clone, Serialize)]
pub struct WindowForecast {
    /// Window start (UTC).
    pub start: DateTime<Utc>,
    /// Window end (UTC).
    pub end: DateTime<Utc>,
    /// Nodes that start their upgrade in this window.
    pub started: usize,
    /// Nodes that return Ready at the target between this window's start and the next one's.
    pub completed: usize,
}

/// How the rollout would go.
#[derive(Debug, Clone, Serialize)]
pub struct Forecast {
    /// How the forecast ended: confirmed, failed, blocked, paused (held
    /// throughout), or rolling (ran out of windows).
    pub state: RolloutState,
    /// Nodes that need the upgrade.
    pub nodes_to_upgrade: usize,
    /// The most nodes the forecast starts in one window.
    pub fit_per_window: usize,
    /// How long one node holds its place in the budget: `node_time`, plus
    /// its health watch (`[health] pod_ready_timeout`) when `[health]` is on.
    pub node_cycle: String,
    /// `[health] settle` after the last node, before `confirmed`; `None`
    /// without `[health]`.
    pub settle: Option<String>,
    /// From the first node's start to the confirmation, ignoring the time
    /// between windows: node cycles × waves + settle.
    pub ideal_duration: String,
    /// Windows in which some node starts.
    pub windows_needed: usize,
    /// When the last node is Ready at the target.
    pub finishes_at: Option<DateTime<Utc>>,
    /// When the cluster would report `confirmed` (after the last node's
    /// watch and the settle).
    pub confirmed_at: Option<DateTime<Utc>>,
    /// End of the last window used.
    pub last_window_end: Option<DateTime<Utc>>,
    /// The windows used, in order.
    pub windows: Vec<WindowForecast>,
    /// What holds every node start at the instant planned for (the pause,
    /// or a freeze), in one line; the forecast counts with it.
    pub held: Option<String>,
    /// Why the forecast stopped before the rollout ended, if it did
    /// (`windows_needed` is then a lower bound).
    pub cut_short: Option<CutShort>,
}

/// A forecast that ran out of windows before the rollout ended.
#[derive(Debug, Clone, Serialize)]
pub struct CutShort {
    /// What stopped it: `max_windows` (the `--max-windows` limit).
    pub by: &'static str,
    /// The limit's value.
    pub limit: usize,
    /// Nodes not yet at the target when it stopped.
    pub nodes_left: usize,
    /// Windows still needed by arithmetic (nodes left / nodes a window fits).
    pub more_windows_estimated: usize,
}

/// The plan for one environment.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Environment.
    pub env: String,
    /// Cluster the nodes came from.
    pub cluster: String,
    /// Target version.
    pub target: Version,
    /// The instant planned for.
    pub now: DateTime<Utc>,
    /// The decision the agent would take now.
    pub decision: Decision,
    /// The rollout, window by window.
    pub forecast: Forecast,
}

/// Plan against any cluster: decide on its nodes as they are now (without
/// acting), then forecast on a sim seeded from them, through the first
/// `max_windows` stretches in which a node may start. Both ask the
/// environment's calendar exactly as the agent does (windows, freezes and
/// the pause: [`Calendar::opening`]).
pub async fn plan<C: Cluster>(
    cluster: &C,
    env: &EnvConfig,
    calendar: &Calendar,
    max_windows: usize,
    node_time: Duration,
    now: DateTime<Utc>,
) -> Result<Plan, C::Error> {
    let policy = Policy::from_env(env);
    let schedule = Timeline {
        windows: calendar
            .periods(now)
            .take(max_windows)
            .map(|p| (p.start, p.end))
            .collect(),
        calendar: Some(calendar.clone()),
        gate_from: Some(now),
    };
    let views = cluster.observe().await?;
    let decision = decide(&policy, &schedule.inputs(now), &views, now);
    let mut forecast = forecast(&policy, &views, &schedule, node_time, now).await;
    let change = Change::of(&policy.target, views.iter().map(|v| v.version.as_ref()));
    forecast.held = calendar.opening(now, change).hold.map(|h| h.describe());
    Ok(Plan {
        env: env.name.clone(),
        cluster: cluster.name().to_string(),
        target: policy.target.clone(),
        now,
        decision,
        forecast,
    })
}

/// Run the engine on a sim seeded from `views` through `schedule`, and count
/// what happened window by window.
async fn forecast(
    policy: &Policy,
    views: &[NodeView],
    schedule: &Timeline,
    node_time: Duration,
    now: DateTime<Utc>,
) -> Forecast {
    let clock = VirtualClock::new(now);
    let sim = Sim::from_views("forecast", clock.clone(), views, node_time);
    let engine = Engine::new(policy.clone(), Labels::default(), clock);
    let horizon = schedule.windows.last().map_or(now, |w| w.1)
        + chrono::Duration::from_std(policy.node_timeout).unwrap_or(chrono::Duration::zero());
    // The sim cannot fail, and nothing is injected; a blocked forecast still reports.
    let (state, ended_at) = match drive(&sim, &engine, schedule, horizon).await {
        Ok(r) => (r.last.state, r.ended_at),
        Err(_) => (RolloutState::Blocked, now),
    };
    let log = sim.log();
    let budget = policy.max_unavailable.resolve(views.len()).max(1);
    let to_upgrade = views
        .iter()
        .filter(|v| v.version.as_ref() != Some(&policy.target))
        .count();
    let mut out = Vec::new();
    for (i, (s, e)) in schedule.windows.iter().enumerate() {
        let next = schedule
            .windows
            .get(i + 1)
            .map_or(DateTime::<Utc>::MAX_UTC, |w| w.0);
        let started = log
            .iter()
            .filter(|ev| {
                matches!(ev.kind, EventKind::Cordon | EventKind::Adopt) && *s <= ev.at && ev.at < *e
            })
            .count();
        let completed = log
            .iter()
            .filter(|ev| {
                matches!(&ev.kind, EventKind::Returned(Some(v)) if *v == policy.target)
                    && *s <= ev.at
                    && ev.at < next
            })
            .count();
        if started > 0 || completed > 0 {
            out.push(WindowForecast {
                start: *s,
                end: *e,
                started,
                completed,
            });
        }
    }
    let confirmed = state == RolloutState::Confirmed;
    let finishes_at = log
        .iter()
        .filter(|ev| matches!(ev.kind, EventKind::Returned(_)))
        .map(|ev| ev.at)
        .max()
        .filter(|_| confirmed);
    let watch = policy
        .health
        .as_ref()
        .map_or(Duration::ZERO, |h| h.pod_ready_timeout);
    let settle = policy.health.as_ref().map(|h| h.settle);
    let cycle = node_time + watch;
    let waves = to_upgrade.div_ceil(budget) as u32;
    let fit = out.iter().map(|w| w.started).max().unwrap_or(0);
    // Nodes still to upgrade and the last window given was still in use
    // (or none was given): the limit, not the rollout, ended the forecast.
    let done: usize = out.iter().map(|w| w.completed).sum();
    let nodes_left = to_upgrade.saturating_sub(done);
    let last_used = schedule.windows.last().is_none_or(|last| {
        out.last()
            .is_some_and(|w| w.start == last.0 && w.started > 0)
    });
    let unfinished = !matches!(
        state,
        RolloutState::Confirmed | RolloutState::Failed | RolloutState::Paused
    );
    let cut_short = (unfinished && nodes_left > 0 && last_used).then(|| CutShort {
        by: "max_windows",
        limit: schedule.windows.len(),
        nodes_left,
        more_windows_estimated: nodes_left.div_ceil(fit.max(1)),
    });
    Forecast {
        state,
        nodes_to_upgrade: to_upgrade,
        fit_per_window: fit,
        node_cycle: hours(cycle),
        settle: settle.map(hours),
        ideal_duration: hours(cycle * waves + settle.unwrap_or_default()),
        windows_needed: out.iter().filter(|w| w.started > 0).count(),
        finishes_at,
        confirmed_at: confirmed.then_some(ended_at),
        last_window_end: out.iter().rev().find(|w| w.started > 0).map(|w| w.end),
        windows: out,
        held: None,
        cut_short,
    }
}

/// "75h", "2h30m", "45m": a rollout's length reads best in hours.
pub fn hours(d: Duration) -> String {
    let m = d.as_secs().div_ceil(60);
    match (m / 60, m % 60) {
        (0, m) => format!("{m}m"),
        (h, 0) => format!("{h}h"),
        (h, m) => format!("{h}h{m}m"),
    }
}
