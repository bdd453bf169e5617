//! The plan forecast: how a rollout would go, window by window. The rollout
//! engine itself runs on an in-memory cluster seeded from the real nodes and a
//! virtual clock, so the forecast and the agent decide the same way. It
//! assumes the trust check passes, and keeps to the gate of the planned
//! cluster's wave as the plan's wave section answers it (no node starts
//! before it passes, none while only a person can lift it). `drover plan`
//! prints it; the agent never uses it.

use crate::cluster::{Cluster, NodeView};
use crate::config::EnvConfig;
use crate::gate::wave::WaveGate;
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
    /// The environment's waves (one of every cluster without `[[wave]]`):
    /// what each waits on and when it could start.
    pub waves: Vec<WavePlan>,
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
    waves: Option<WaveInputs<'_>>,
) -> Result<Plan, C::Error> {
    let policy = Policy::from_env(env);
    let views = cluster.observe().await?;
    let planned = waves.as_ref().map(|w| w.cluster);
    let waves = match waves {
        Some(w) => {
            plan_waves(
                w.env,
                w.waves,
                w.first,
                w.evidence,
                &views,
                node_time,
                max_windows,
                now,
            )
            .await
        }
        None => Vec::new(),
    };
    // The cluster's wave (the first, for a cluster no wave names) says
    // when its gate lets a node start: the decision and the forecast
    // start none before, and none at all when the gate needs a person or
    // a report, as the wave section below them says.
    let wave = waves
        .iter()
        .find(|w| w.clusters.iter().any(|c| Some(c.as_str()) == planned))
        .or(waves.first());
    let gate_from = match wave {
        Some(w) => w.gate_passes_at.map(|t| t.max(now)),
        None => Some(now),
    };
    let gate_hold = wave
        .filter(|_| gate_from != Some(now))
        .map(|w| format!("wave {}'s gate: {}", w.wave, w.gate_now));
    let mut schedule = Timeline::from_calendar(calendar, gate_from.unwrap_or(now), max_windows);
    schedule.gate_from = gate_from;
    schedule.gate_waits.clone_from(&gate_hold);
    let decision = decide(&policy, &schedule.inputs(now), &views, now);
    let mut forecast = forecast(&policy, &views, &schedule, node_time, now).await;
    let change = Change::of(&policy.target, views.iter().map(|v| v.version.as_ref()));
    forecast.held = match (calendar.opening(now, change).hold, gate_from) {
        (Some(h), _) => Some(h.describe()),
        (None, None) => gate_hold.map(|h| format!("{h} (no node starts by time alone)")),
        (None, Some(_)) => None,
    };
    Ok(Plan {
        env: env.name.clone(),
        cluster: cluster.name().to_string(),
        target: policy.target.clone(),
        now,
        decision,
        forecast,
        waves,
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

/// One wave of the environment in the plan: its clusters, its window, the
/// gate it waits on and when it could start (docs/design.md §4a).
#[derive(Debug, Clone, Serialize)]
pub struct WavePlan {
    /// Its number, from 1.
    pub wave: usize,
    /// Its clusters, in `drover.toml`'s order.
    pub clusters: Vec<String>,
    /// Its window: the cron schedule, how long each stays open, and the
    /// zone it is read in (the wave's own, or the environment's).
    pub window: WaveWindow,
    /// What it waits on: the promotion gate (the lower environment's
    /// confirmations and soak) for wave 1, wave N−1's confirmations and
    /// soak for wave N.
    pub waits_on: String,
    /// That gate's answer now, in a line (`passed`, or why not yet).
    pub gate_now: String,
    /// When the gate passes (or passed): from the signed reports when they
    /// say, else from this plan's forecast of the wave before; `None` when
    /// neither can tell (a refusal only a person can lift).
    pub gate_passes_at: Option<DateTime<Utc>>,
    /// Where `gate_passes_at` comes from: `reports` (the signed reports),
    /// `forecast` (this plan's forecast of the wave before), `assumed` (no
    /// reports could be read: the gate is assumed passed now), or `none`.
    pub basis: &'static str,
    /// The earliest a node of the wave could start: its first window open
    /// at or after the gate passes (freezes and the pause included).
    pub could_start_at: Option<DateTime<Utc>>,
    /// When its clusters would confirm, by the forecast (each cluster like
    /// the one planned for).
    pub confirmed_at: Option<DateTime<Utc>>,
}

/// A wave's window as its file writes it.
#[derive(Debug, Clone, Serialize)]
pub struct WaveWindow {
    /// Cron, five fields.
    pub schedule: String,
    /// How long each window stays open (`6h`).
    pub duration: String,
    /// IANA zone.
    pub timezone: String,
}

/// What [`plan`] needs to plan the environment's waves too.
#[derive(Debug, Clone)]
pub struct WaveInputs<'a> {
    /// The environment as its file says (each wave's window replaces its own).
    pub env: &'a EnvConfig,
    /// Its waves.
    pub waves: &'a [crate::gate::wave::Wave],
    /// What wave 1 waits on.
    pub first: FirstGate,
    /// The cluster planned for (`--cluster`): its wave's gate holds the
    /// decision and the forecast.
    pub cluster: &'a str,
    /// The environment's clusters' reports for its version.
    pub evidence: &'a crate::gate::wave::EnvEvidence,
}

/// What wave 1 waits on: the promotion gate for the environment's version.
#[derive(Debug, Clone)]
pub struct FirstGate {
    /// The gate, in words.
    pub waits_on: String,
    /// Its answer now.
    pub now: String,
    /// When it passes (or passed); `None`: not by time alone.
    pub passes_at: Option<DateTime<Utc>>,
    /// `reports`, `assumed` or `none` (see [`WavePlan::basis`]).
    pub basis: &'static str,
}

/// Plan every wave of `env` (the environment as its file says, before any
/// wave's window replaces its own): wave 1 from `first`, each later wave
/// from the wave before it: its clusters' standing confirmations in
/// `evidence` when every one has one, else this plan's forecast of it;
/// each forecast on a sim seeded from `views`, in the wave's own calendar.
#[allow(clippy::too_many_arguments)]
pub async fn plan_waves(
    env: &EnvConfig,
    waves: &[crate::gate::wave::Wave],
    first: FirstGate,
    evidence: &crate::gate::wave::EnvEvidence,
    views: &[NodeView],
    node_time: Duration,
    max_windows: usize,
    now: DateTime<Utc>,
) -> Vec<WavePlan> {
    let mut out: Vec<WavePlan> = Vec::new();
    for (i, w) in waves.iter().enumerate() {
        let wenv = w
            .clusters
            .first()
            .map_or_else(|| env.clone(), |c| env.for_cluster(c));
        let spec = &wenv.windows[0];
        let window = WaveWindow {
            schedule: spec.schedule.clone(),
            duration: hours(spec.duration),
            timezone: spec.timezone.to_string(),
        };
        // A halt or held evidence stops every wave whatever the forecast
        // says: asked of the one judgement of the gate, not worked out here.
        let stopped = w.clusters.first().and_then(|c| {
            match crate::gate::wave::judge(&crate::gate::wave::WaveRequest {
                env: &env.name,
                cluster: c,
                version: &env.version,
                waves,
                failure_budget: env.rollout.failure_budget,
                evidence,
                now,
            }) {
                g @ (WaveGate::Halted(_) | WaveGate::Held { .. }) => Some(g.to_string()),
                _ => None,
            }
        });
        let waits_on = match i.checked_sub(1) {
            None => first.waits_on.clone(),
            Some(p) => format!(
                "wave {}'s signed confirmations of {} ({}), then its soak of {}",
                p + 1,
                env.version,
                waves[p].clusters.join(", "),
                hours(waves[p].soak)
            ),
        };
        let (gate_now, passes_at, basis) = match (stopped, i.checked_sub(1)) {
            (Some(why), _) => (why, None, "none"),
            (None, None) => (first.now.clone(), first.passes_at, first.basis),
            (None, Some(p)) => {
                let prev = &waves[p];
                let soak = chrono::Duration::from_std(prev.soak).unwrap_or(chrono::Duration::MAX);
                let reported: Option<Vec<DateTime<Utc>>> = prev
                    .clusters
                    .iter()
                    .map(|c| evidence.confirmed.get(c).copied())
                    .collect();
                let latest = reported.and_then(|ts| ts.into_iter().max());
                let (at, basis) = match latest {
                    Some(t) => (t.checked_add_signed(soak), "reports"),
                    None => match out.last().and_then(|o| o.confirmed_at) {
                        Some(t) => (t.checked_add_signed(soak), "forecast"),
                        None => (None, "none"),
                    },
                };
                let gate_now = match (latest, at) {
                    (Some(_), Some(t)) if t <= now => "passed".to_owned(),
                    (Some(_), Some(t)) => format!(
                        "soaking until {}",
                        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                    _ => {
                        let missing: Vec<&str> = prev
                            .clusters
                            .iter()
                            .filter(|c| !evidence.confirmed.contains_key(*c))
                            .map(String::as_str)
                            .collect();
                        format!("not yet confirmed by {}", missing.join(", "))
                    }
                };
                (gate_now, at, basis)
            }
        };
        let calendar = Calendar::of(&wenv).ok();
        let from = passes_at.map(|t| t.max(now));
        let could_start_at = match (&calendar, from) {
            (Some(c), Some(t)) => c.periods(t).next().map(|p| p.start.max(t)),
            _ => None,
        };
        let confirmed_at = match (&calendar, could_start_at) {
            (Some(c), Some(start)) => {
                let schedule = Timeline::from_calendar(c, start, max_windows);
                let policy = Policy::from_env(&wenv);
                forecast(&policy, views, &schedule, node_time, start)
                    .await
                    .confirmed_at
            }
            _ => None,
        };
        out.push(WavePlan {
            wave: i + 1,
            clusters: w.clusters.clone(),
            window,
            waits_on,
            gate_now,
            gate_passes_at: passes_at,
            basis,
            could_start_at,
            confirmed_at,
        });
    }
    out
}
