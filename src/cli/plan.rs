//! `drover plan`: what the agent would do now, and how the rollout would go
//! window by window. The nodes come from any [`Cluster`]: a real one read
//! through `--kubeconfig` (observed only, never changed), or a simulated one
//! built from `--nodes`/`--version-now`; the forecast always runs on a sim
//! seeded from those nodes. It assumes the promotion gate and trust check pass.

use super::{parse_time, print_json, Global, Outcome};
use crate::cluster::{Cluster, NodeView};
use crate::config::EnvConfig;
use crate::rollout::{decide, Decision, Engine, Labels, Policy, RolloutState, VirtualClock};
use crate::sim::{drive, EventKind, Schedule, Sim};
use anyhow::Context as _;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::executor::block_on;
use semver::Version;
use serde::Serialize;
use std::time::Duration;

/// Arguments of `drover plan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The environment to plan for.
    #[arg(long)]
    pub env: String,
    /// Nodes in the simulated cluster (at most 100000).
    #[arg(long, default_value_t = 10)]
    pub nodes: u64,
    /// Time one node takes from drain start to Ready at the new version.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub node_time: Duration,
    /// Plan as of this instant (RFC 3339; default now).
    #[arg(long, value_parser = parse_time)]
    pub now: Option<DateTime<Utc>>,
    /// Version the simulated nodes run now (default: an older unnamed version, 0.0.0).
    #[arg(long)]
    pub version_now: Option<Version>,
    /// Give up the forecast after this many windows (at most 10000); the
    /// output says when the forecast was cut short by it.
    #[arg(long, default_value_t = 120)]
    pub max_windows: u64,
    /// Read the nodes from this cluster instead of simulating them (read-only).
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The cluster's name, with --kubeconfig.
    #[arg(long, default_value = "cluster")]
    pub cluster: String,
}

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
    /// How the forecast ended: confirmed, failed, blocked, or rolling (ran out of windows).
    pub state: RolloutState,
    /// Nodes that need the upgrade.
    pub nodes_to_upgrade: usize,
    /// Nodes per window by arithmetic: ceil(duration / node_time) × max_unavailable.
    pub fit_per_window: usize,
    /// node_time × ceil(nodes to upgrade / max_unavailable).
    pub ideal_duration: String,
    /// Windows in which some node starts.
    pub windows_needed: usize,
    /// When the last node is Ready at the target.
    pub finishes_at: Option<DateTime<Utc>>,
    /// End of the last window used.
    pub last_window_end: Option<DateTime<Utc>>,
    /// The windows used, in order.
    pub windows: Vec<WindowForecast>,
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

/// The largest `--max-windows`: the windows are listed in memory.
pub const MAX_WINDOWS: u64 = 10_000;
/// The largest `--nodes`: the simulated cluster is held in memory.
pub const MAX_NODES: u64 = 100_000;

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

/// Run `drover plan`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    if args.max_windows > MAX_WINDOWS {
        return super::reject(
            g,
            vec![format!(
                "--max-windows {} is more than {MAX_WINDOWS}; give a limit from 0 to {MAX_WINDOWS}",
                args.max_windows
            )
            .into()],
        );
    }
    if args.nodes > MAX_NODES {
        return super::reject(
            g,
            vec![format!(
                "--nodes {} is more than {MAX_NODES}; give a count from 0 to {MAX_NODES}",
                args.nodes
            )
            .into()],
        );
    }
    let Some(repo) = super::load_repo(g) else {
        return Ok(Outcome::Rejected);
    };
    let env = match super::known_env(g, &repo, &args.env) {
        Ok(env) => env,
        Err(rejected) => return rejected,
    };
    let now = args.now.unwrap_or_else(Utc::now);
    let windows = match windows_ahead(env, now, args.max_windows as usize) {
        Ok(w) => w,
        Err(e) => {
            let file = format!("{}/{}.toml", crate::config::ENV_DIR, args.env);
            let d = crate::diag::Diagnostic::file(file, format!("[window]: {e}"));
            return super::reject(g, vec![d.into()]);
        }
    };
    let plan = match &args.kubeconfig {
        Some(path) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .with_context(|| format!("using {}", path.display()))?;
                // Jobs are never created: plan only observes.
                let opts = crate::kubernetes::KubeOptions::from_env(&args.cluster, "default", env);
                let cluster = crate::kubernetes::KubeCluster::new(config, opts).await?;
                plan(&cluster, env, &windows, args.node_time, now)
                    .await
                    .context("observing the cluster")
            })?
        }
        None => {
            let version_now = args.version_now.clone().unwrap_or(Version::new(0, 0, 0));
            let cluster = Sim::uniform(
                "simulated",
                VirtualClock::new(now),
                args.nodes as usize,
                &version_now,
                args.node_time,
            );
            block_on(plan(&cluster, env, &windows, args.node_time, now))
                .context("observing the cluster")?
        }
    };
    match g.format {
        super::Format::Json => print_json(&plan)?,
        super::Format::Text => print!("{}", render(&plan, args.node_time)),
    }
    Ok(Outcome::Ok)
}

/// The single place windows come from.
fn windows_ahead(
    env: &EnvConfig,
    from: DateTime<Utc>,
    count: usize,
) -> anyhow::Result<Vec<(DateTime<Utc>, DateTime<Utc>)>> {
    // The periods `drover windows` lists, without those where only a patch
    // update may start: a forecast does not assume the change is a patch.
    let cal = crate::window::Calendar::of(env)
        .with_context(|| format!("computing the windows of {}", env.name))?;
    Ok(cal
        .periods(from)
        .filter(|p| p.patch_only.is_none())
        .take(count)
        .map(|w| (w.start, w.end))
        .collect())
}

/// Plan against any cluster: decide on its nodes as they are now (without
/// acting), then forecast on a sim seeded from them.
pub async fn plan<C: Cluster>(
    cluster: &C,
    env: &EnvConfig,
    windows: &[(DateTime<Utc>, DateTime<Utc>)],
    node_time: Duration,
    now: DateTime<Utc>,
) -> Result<Plan, C::Error> {
    let policy = Policy::from_env(env);
    let schedule = Schedule {
        windows: windows.to_vec(),
        calendar: None,
        gate_from: Some(now),
    };
    let views = cluster.observe().await?;
    let decision = decide(&policy, &schedule.inputs(now), &views, now);
    let forecast = forecast(&policy, env, &views, &schedule, node_time, now).await;
    Ok(Plan {
        env: env.name.clone(),
        cluster: cluster.name().to_string(),
        target: policy.target.clone(),
        now,
        decision,
        forecast,
    })
}

async fn forecast(
    policy: &Policy,
    env: &EnvConfig,
    views: &[NodeView],
    schedule: &Schedule,
    node_time: Duration,
    now: DateTime<Utc>,
) -> Forecast {
    let clock = VirtualClock::new(now);
    let sim = Sim::from_views("forecast", clock.clone(), views, node_time);
    let engine = Engine::new(policy.clone(), Labels::default(), clock);
    let horizon = schedule.windows.last().map_or(now, |w| w.1)
        + chrono::Duration::from_std(policy.node_timeout).unwrap_or(chrono::Duration::zero());
    // The sim cannot fail, and nothing is injected; a blocked forecast still reports.
    let state = match drive(&sim, &engine, schedule, horizon).await {
        Ok(r) => r.last.state,
        Err(_) => RolloutState::Blocked,
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
    let finishes_at = log
        .iter()
        .filter(|ev| matches!(ev.kind, EventKind::Returned(_)))
        .map(|ev| ev.at)
        .max()
        .filter(|_| state == RolloutState::Confirmed);
    let node_ns = node_time.as_nanos().max(1);
    let fit = env.windows[0].duration.as_nanos().div_ceil(node_ns) as usize * budget;
    let waves = to_upgrade.div_ceil(budget) as u32;
    // Nodes still to upgrade and the last window given was still in use
    // (or none was given): the limit, not the rollout, ended the forecast.
    let done: usize = out.iter().map(|w| w.completed).sum();
    let nodes_left = to_upgrade.saturating_sub(done);
    let last_used = schedule.windows.last().is_none_or(|last| {
        out.last()
            .is_some_and(|w| w.start == last.0 && w.started > 0)
    });
    let unfinished = !matches!(state, RolloutState::Confirmed | RolloutState::Failed);
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
        ideal_duration: hours(node_time * waves),
        windows_needed: out.iter().filter(|w| w.started > 0).count(),
        finishes_at,
        last_window_end: out.iter().rev().find(|w| w.started > 0).map(|w| w.end),
        windows: out,
        cut_short,
    }
}

/// "75h", "2h30m", "45m": a rollout's length reads best in hours.
fn hours(d: Duration) -> String {
    let m = d.as_secs().div_ceil(60);
    match (m / 60, m % 60) {
        (0, m) => format!("{m}m"),
        (h, 0) => format!("{h}h"),
        (h, m) => format!("{h}h{m}m"),
    }
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

fn render(p: &Plan, node_time: Duration) -> String {
    use std::fmt::Write as _;
    let d = &p.decision;
    let f = &p.forecast;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} on {}: target {}, {} nodes, {} at target; now {}",
        p.env,
        p.cluster,
        p.target,
        d.nodes,
        d.nodes_at_version,
        ts(p.now)
    );
    let state = format!("{:?}", d.state).to_lowercase();
    if d.message.is_empty() {
        let _ = writeln!(s, "state now: {state}");
    } else {
        let _ = writeln!(s, "state now: {state} ({})", d.message);
    }
    if d.actions.is_empty() {
        let _ = writeln!(s, "the agent would do nothing now");
    }
    for a in &d.actions {
        let _ = writeln!(s, "  would {} {}", a.kind(), a.node());
    }
    for sk in &d.skipped {
        let _ = writeln!(s, "  skips {}: {}", sk.node, sk.reason);
    }
    let _ = writeln!(
        s,
        "{} nodes at {} at a time × {} = {}; windows fit {} nodes each",
        f.nodes_to_upgrade,
        d.max_unavailable,
        humantime::format_duration(node_time),
        f.ideal_duration,
        f.fit_per_window
    );
    for w in &f.windows {
        let _ = writeln!(
            s,
            "  window {} – {}: {} started, {} done",
            ts(w.start),
            ts(w.end),
            w.started,
            w.completed
        );
    }
    let end = f.last_window_end.map_or("-".to_string(), ts);
    let fin = f.finishes_at.map_or("-".to_string(), ts);
    let _ = writeln!(
        s,
        "{} windows, last ends {end}; rollout {} (last node Ready at {fin})",
        f.windows_needed,
        format!("{:?}", f.state).to_lowercase()
    );
    if let Some(c) = &f.cut_short {
        let _ = writeln!(
            s,
            "forecast cut short by --max-windows {}: {} nodes still to upgrade, about {} more \
             windows needed; raise --max-windows to see the whole rollout",
            c.limit, c.nodes_left, c.more_windows_estimated
        );
    }
    s
}
