//! `drover plan`: what the agent would do now, and how the rollout would go
//! window by window. The nodes come from any [`crate::cluster::Cluster`]: a
//! real one read through `--kubeconfig` (observed only, never changed), or a
//! simulated one built from `--nodes`/`--version-now`. The forecast itself is
//! [`crate::forecast`]; this file reads the arguments and prints it.

use super::{parse_time, print_ok, Global, Outcome};
use crate::config::EnvConfig;
use crate::forecast::{plan, Plan};
use crate::rollout::VirtualClock;
use crate::sim::Sim;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::executor::block_on;
use semver::Version;
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

/// The largest `--max-windows`: the windows are listed in memory.
pub const MAX_WINDOWS: u64 = 10_000;
/// The largest `--nodes`: the simulated cluster is held in memory.
pub const MAX_NODES: u64 = 100_000;

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
    match g.format.is_document() {
        true => print_ok(g.format, &plan)?,
        false => print!("{}", render(&plan, args.node_time, env)),
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

/// An instant as `status` and `windows` print one: in the environment's
/// zone and in UTC, to the minute (`Tue 2026-12-08 02:00 CET (01:00 UTC)`).
fn when(t: DateTime<Utc>, env: &EnvConfig) -> String {
    let tz = env.windows[0].timezone;
    let local = t.with_timezone(&tz);
    let utc = if local.date_naive() == t.date_naive() {
        t.format("%H:%M UTC").to_string()
    } else {
        t.format("%Y-%m-%d %H:%M UTC").to_string()
    };
    if tz == chrono_tz::Tz::UTC {
        return t.format("%a %Y-%m-%d %H:%M UTC").to_string();
    }
    format!("{} ({utc})", local.format("%a %Y-%m-%d %H:%M %Z"))
}

fn render(p: &Plan, node_time: Duration, env: &EnvConfig) -> String {
    use std::fmt::Write as _;
    let ts = |t: DateTime<Utc>| when(t, env);
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
        let view = crate::fleet::gather::window_view(env, w.start, w.end, p.now);
        let _ = writeln!(
            s,
            "  window {}: {} started, {} done",
            crate::fleet::text::window_line(&view),
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
