//! `drover plan`: what the agent would do now, and how the rollout would go
//! window by window. The nodes come from any [`crate::cluster::Cluster`]: a
//! real one read through `--kubeconfig` (observed only, never changed), or a
//! simulated one built from `--nodes`/`--version-now`. The forecast itself is
//! [`crate::forecast`]; this file reads the arguments and prints it.

use super::{parse_time, print_ok, Global, Outcome};
use crate::config::EnvConfig;
use crate::forecast::{plan, FirstGate, Plan, WaveInputs};
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
    /// The cluster's name: with --kubeconfig, and to plan in its wave's
    /// own window when its environment's `[[wave]]` gives it one.
    #[arg(long, default_value = "cluster")]
    pub cluster: String,
    /// Instead of the forecast, read the cluster (--kubeconfig, else
    /// $KUBECONFIG or in-cluster) and list what will block a drain or break
    /// a workload on the selected nodes; exit 1 when anything is found.
    #[arg(long)]
    pub preflight: bool,
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
    if args.preflight {
        return preflight(g, &args, env);
    }
    let now = args.now.unwrap_or_else(Utc::now);
    let waves = crate::gate::wave::waves(&repo, &args.env);
    let (first, evidence) = wave_evidence(g, &repo, env, now);
    let wave_inputs = || WaveInputs {
        env,
        waves: &waves,
        first: first.clone(),
        evidence: &evidence,
        cluster: &args.cluster,
    };
    // A cluster of a wave with a window of its own moves in that window.
    let env = &env.for_cluster(&args.cluster);
    // The calendar the agent asks (windows, freezes, pause): the forecast
    // and the decision below ask it the same way.
    let calendar = match crate::window::Calendar::of(env) {
        Ok(c) => c,
        Err(e) => {
            let file = format!("{}/{}.toml", crate::config::ENV_DIR, args.env);
            let d = crate::diag::Diagnostic::file(file, format!("[window]: {e}"));
            return super::reject(g, vec![d.into()]);
        }
    };
    let max_windows = args.max_windows as usize;
    let plan = match &args.kubeconfig {
        Some(path) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let config = super::kube_config(Some(path)).await?;
                // Jobs are never created: plan only observes (records in
                // the agent's namespace of deploy/base).
                let opts = crate::kubernetes::KubeOptions::from_env(
                    &args.cluster,
                    "default",
                    "drover-system",
                    env,
                );
                let cluster = crate::kubernetes::KubeCluster::new(config, opts).await?;
                plan(
                    &cluster,
                    env,
                    &calendar,
                    max_windows,
                    args.node_time,
                    now,
                    Some(wave_inputs()),
                )
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
            block_on(plan(
                &cluster,
                env,
                &calendar,
                max_windows,
                args.node_time,
                now,
                Some(wave_inputs()),
            ))
            .context("observing the cluster")?
        }
    };
    match g.format.is_document() {
        true => print_ok(g.format, &plan)?,
        false => print!("{}", render(&plan, args.node_time, env)),
    }
    Ok(Outcome::Ok)
}

/// What wave 1 waits on (the promotion gate for the environment's
/// version, judged as the agent judges it, by the policy in force at HEAD)
/// and what the environment's clusters reported, read by the one reader
/// out of the repository's status branches (local or `origin/`). Without
/// a readable repository the gate is assumed passed, as the forecast
/// always assumed.
fn wave_evidence(
    g: &Global,
    cfg: &crate::config::RepoConfig,
    env: &EnvConfig,
    now: DateTime<Utc>,
) -> (FirstGate, crate::gate::wave::EnvEvidence) {
    use crate::admit::{self, Change};
    use crate::gate::Decision;
    let waits_on = match cfg.lower(&env.name) {
        None => "nothing: the first environment of the chain".to_owned(),
        Some(lower) => format!(
            "the promotion gate: every cluster of {lower} ({}) confirmed {} at least {} \
             before ([promotion] soak)",
            cfg.clusters(lower).join(", "),
            env.version,
            crate::forecast::hours(env.promotion.soak)
        ),
    };
    let assumed = |why: String| {
        (
            FirstGate {
                waits_on: waits_on.clone(),
                now: format!("{why}; assumed passed"),
                passes_at: Some(now),
                basis: "assumed",
            },
            Default::default(),
        )
    };
    let read = || -> Result<_, String> {
        let repo = git2::Repository::open(&g.repo).map_err(|e| e.message().to_owned())?;
        let head = repo
            .head()
            .and_then(|h| h.peel_to_commit())
            .map_err(|e| e.message().to_owned())?
            .id();
        let snap = admit::snapshot(&repo, head, now)
            .map_err(|e| e.to_string())?
            .map_err(|d| format!("HEAD's config does not load ({} errors)", d.len()))?;
        let mut git = admit::GitEvidence::new(&repo, head, now);
        let change = Change {
            before: None,
            after: (&snap.config, &snap.policy),
        };
        let decision =
            admit::judge_env(change, &env.name, &mut git, now).map_err(|e| e.to_string())?;
        let evidence = admit::env_evidence(&repo, head, &env.name, None, &env.version, now)
            .map_err(|e| e.to_string())?;
        Ok((decision, evidence))
    };
    let (decision, evidence) = match read() {
        Ok(r) => r,
        Err(why) => return assumed(format!("the status branches could not be read: {why}")),
    };
    let (answer, passes_at, basis) = match &decision {
        Decision::Allowed(_) | Decision::Unchanged => ("passed".to_owned(), Some(now), "reports"),
        Decision::Refused(r) => match &r.reason {
            crate::gate::Reason::Soaking { passes_at, .. }
            | crate::gate::Reason::HistorySoaking { passes_at, .. } => {
                (r.to_string(), Some(*passes_at), "reports")
            }
            _ => (r.to_string(), None, "none"),
        },
    };
    (
        FirstGate {
            waits_on,
            now: answer,
            passes_at,
            basis,
        },
        evidence,
    )
}

/// An instant as `status` and `windows` print one: in the environment's
/// zone and in UTC, to the minute (`Tue 2026-12-08 02:00 CET (01:00 UTC)`).
fn when(t: DateTime<Utc>, env: &EnvConfig) -> String {
    when_in(t, env.windows[0].timezone)
}

/// [`when`] in the zone `tz`.
fn when_in(t: DateTime<Utc>, tz: chrono_tz::Tz) -> String {
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

use crate::terminal::count;

fn render(p: &Plan, node_time: Duration, env: &EnvConfig) -> String {
    use std::fmt::Write as _;
    let ts = |t: DateTime<Utc>| when(t, env);
    let d = &p.decision;
    let f = &p.forecast;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} on {}: target {}, {}, {} at target; now {}",
        p.env,
        p.cluster,
        p.target,
        count(d.nodes, "node", "nodes"),
        d.nodes_at_version,
        ts(p.now)
    );
    let state = d.state.as_str();
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
    let _ = writeln!(s, "{}", headline(p, node_time));
    for w in &f.windows {
        let view = crate::fleet::gather::window_view(
            env,
            crate::window::Window::new(w.start, w.end),
            p.now,
        );
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
    let _ = write!(
        s,
        "{}, last ends {end}; rollout {} (last node Ready at {fin}",
        count(f.windows_needed as u64, "window", "windows"),
        f.state.as_str()
    );
    match f.confirmed_at {
        Some(c) if f.settle.is_some() => {
            let _ = writeln!(s, ", confirmed at {} after the settle)", ts(c));
        }
        _ => {
            let _ = writeln!(s, ")");
        }
    }
    render_waves(&mut s, p);
    if let Some(c) = &f.cut_short {
        let _ = writeln!(
            s,
            "forecast cut short by --max-windows {}: {} still to upgrade, about {} more \
             needed; raise --max-windows to see the whole rollout",
            c.limit,
            count(c.nodes_left as u64, "node", "nodes"),
            count(c.more_windows_estimated as u64, "window", "windows")
        );
    }
    s
}

/// Each wave: its clusters and window, the gate it waits on and its answer
/// now, when it could start and when it would confirm, in its own zone.
fn render_waves(s: &mut String, p: &Plan) {
    use std::fmt::Write as _;
    if p.waves.is_empty() {
        return;
    }
    let _ = writeln!(s, "waves of {} for {}:", p.env, p.target);
    for w in &p.waves {
        let tz: chrono_tz::Tz = w.window.timezone.parse().unwrap_or(chrono_tz::Tz::UTC);
        let _ = writeln!(
            s,
            "  wave {}: {}; window \"{}\" for {} ({})",
            w.wave,
            w.clusters.join(", "),
            w.window.schedule,
            w.window.duration,
            w.window.timezone
        );
        let _ = writeln!(s, "    waits on {}", w.waits_on);
        let _ = writeln!(s, "    now: {}", w.gate_now);
        let by = match w.basis {
            "forecast" => " (by the forecast of the wave before)",
            "assumed" => " (gate assumed passed)",
            _ => "",
        };
        match w.could_start_at {
            Some(t) => {
                let _ = write!(s, "    could start {}{by}", when_in(t, tz));
                match w.confirmed_at {
                    Some(c) => {
                        let _ = writeln!(s, "; confirmed about {}", when_in(c, tz));
                    }
                    None => {
                        let _ = writeln!(s);
                    }
                }
            }
            None => {
                let _ = writeln!(
                    s,
                    "    could start: not by time alone (the gate needs a person or a report)"
                );
            }
        }
    }
}

/// The forecast in one line, from the forecast itself: what holds it, or
/// how many nodes at a time, how long each holds its place (with its health
/// watch), how many windows and at most how many nodes in one.
fn headline(p: &Plan, node_time: Duration) -> String {
    let f = &p.forecast;
    let d = &p.decision;
    if let (Some(held), 0) = (&f.held, f.windows_needed) {
        return format!(
            "{held}: the agent starts no node, so the forecast starts none ({} to upgrade)",
            count(f.nodes_to_upgrade as u64, "node", "nodes")
        );
    }
    let each = if f.node_cycle == crate::forecast::hours(node_time) {
        format!("{} each", f.node_cycle)
    } else {
        format!(
            "{} each ({} to Ready, then the [health] watch)",
            f.node_cycle,
            humantime::format_duration(node_time)
        )
    };
    let settle = f
        .settle
        .as_ref()
        .map(|s| format!(", then {s} settle"))
        .unwrap_or_default();
    let mut line = format!(
        "{} to upgrade, {} at a time, {each}{settle}: {}, at most {} started in one",
        count(f.nodes_to_upgrade as u64, "node", "nodes"),
        d.max_unavailable,
        count(f.windows_needed as u64, "window", "windows"),
        count(f.fit_per_window as u64, "node", "nodes")
    );
    if let Some(held) = &f.held {
        line.push_str(&format!("; now {held}"));
    }
    line
}

/// What `drover plan --preflight` prints as JSON or YAML.
#[derive(serde::Serialize)]
struct Preflight<'a> {
    env: &'a str,
    node_selector: &'a str,
    nodes: usize,
    findings: Vec<crate::preflight::Finding>,
}

/// `drover plan --preflight`: read the cluster, judge, print; exit 1 when
/// anything is found (for CI or cron), 0 when nothing is. A node held by
/// workload consent counts, though it blocks no drain: the window will not
/// upgrade it, which is what a run the day before a window is there to
/// tell; the text counts it apart from what blocks a drain.
fn preflight(g: &Global, args: &Args, env: &EnvConfig) -> anyhow::Result<Outcome> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let policy = crate::preflight::Policy::of(env);
    let selector = policy.node_selector.as_str();
    let checked = rt.block_on(async {
        let config = super::kube_config(args.kubeconfig.as_deref()).await?;
        let client = kube::Client::try_from(config)?;
        anyhow::Ok(crate::preflight::check(&client, &policy).await?)
    });
    let checked = match checked {
        Ok(c) => c,
        Err(e) => return super::reject(g, vec![super::explain::explain(&e).into()]),
    };
    let report = Preflight {
        env: &args.env,
        node_selector: selector,
        nodes: checked.nodes,
        findings: checked.findings,
    };
    if g.format.is_document() {
        // As doctor: ok false when anything is found, each finding also an error.
        let errors: Vec<super::output::Problem> = report
            .findings
            .iter()
            .map(|f| {
                format!(
                    "{} {}: {}; fix: {}",
                    f.kind.as_str(),
                    f.object,
                    f.why,
                    f.fix
                )
                .into()
            })
            .collect();
        super::output::print_document(g.format, errors.is_empty(), &errors, &report)?;
    } else {
        print!("{}", render_preflight(&report));
    }
    if report.findings.is_empty() {
        Ok(Outcome::Ok)
    } else {
        super::mark_rejected();
        Ok(Outcome::Rejected)
    }
}

fn render_preflight(r: &Preflight<'_>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let selected = if r.node_selector.is_empty() {
        "every node".to_string()
    } else {
        format!("nodes matching {:?}", r.node_selector)
    };
    let blocking = r.findings.iter().filter(|f| f.kind.blocks()).count();
    let _ = writeln!(
        out,
        "preflight for {} ({selected}, {}): {}, {blocking} of them blocking a drain",
        r.env,
        crate::terminal::count(r.nodes as u64, "node", "nodes"),
        crate::terminal::count(r.findings.len() as u64, "finding", "findings"),
    );
    for f in &r.findings {
        let _ = writeln!(
            out,
            "  {:<20} {}  on {}\n      {}\n      fix: {}",
            f.kind.as_str(),
            f.object,
            f.nodes.join(", "),
            f.why,
            f.fix
        );
    }
    out
}
