//! `drover wait`: block until an environment's clusters confirm a version,
//! as `kubectl rollout status` blocks on a Deployment. It reads what
//! `drover status` reads (the status branches, through [`crate::fleet`]),
//! fetching them from `origin` each round, and exits 0 when the condition
//! holds, 1 when it timed out or cannot hold without someone acting (a
//! cluster reported `failed`, `revoked` or `refused` for the version), 2 when it could
//! not run.

use super::{output, Global, Outcome, Problem};
use crate::fleet::{self, ClusterView, Trust};
use anyhow::Context as _;
use chrono::Utc;
use semver::Version;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

/// Arguments of `drover wait`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The environment whose clusters to wait for.
    #[arg(long)]
    pub env: String,
    /// Only this cluster of the environment.
    #[arg(long)]
    pub cluster: Option<String>,
    /// `confirmed`: the version the environment's file pins now;
    /// `version=V`: version V.
    #[arg(long = "for", value_name = "CONDITION", default_value = "confirmed", value_parser = parse_condition)]
    pub condition: Condition,
    /// Give up after this long (exit 1); 0 waits without end.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How often to read the status branches again.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Read the status branches as they are locally; fetch nothing from origin.
    #[arg(long)]
    pub no_fetch: bool,
}

/// What `drover wait --for` waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The version the environment pins.
    Confirmed,
    /// This version.
    Version(Version),
}

fn parse_condition(s: &str) -> Result<Condition, String> {
    match s.split_once('=') {
        None if s == "confirmed" => Ok(Condition::Confirmed),
        Some(("version", v)) => crate::config::parse_exact_version(v).map(Condition::Version),
        _ => Err(format!(
            "expected `confirmed` or `version=V` (such as version=1.13.2); found {s:?}"
        )),
    }
}

/// One cluster as `drover wait` judges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterWait {
    /// Cluster name.
    pub cluster: String,
    /// Its latest report's state, `none` without a report.
    pub state: String,
    /// The version of that report.
    pub version: Option<String>,
    /// Nodes, and nodes at the report's version.
    pub nodes: Option<u32>,
    /// Nodes Ready at the report's version.
    pub nodes_at_version: Option<u32>,
    /// Whether the report counts (`trusted`, `untrusted`, `unverified`, `none`).
    pub trust: &'static str,
    /// Whether this cluster meets the condition.
    pub done: bool,
}

/// The document of `drover wait -o json`.
#[derive(Debug, Serialize)]
struct Output<'a> {
    env: &'a str,
    version: String,
    clusters: &'a [ClusterWait],
    /// Seconds waited.
    waited: u64,
}

/// How one round ended.
enum Verdict {
    Done,
    Waiting,
    /// Cannot be met without someone acting; why.
    Stuck(String),
}

/// Run `drover wait`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let Some(cfg) = super::load_repo(g) else {
        return Ok(Outcome::Rejected);
    };
    let env = match super::known_env(g, &cfg, &args.env) {
        Ok(env) => env,
        Err(rejected) => return rejected,
    };
    let clusters = cfg.clusters(&env.name).to_vec();
    if let Some(c) = &args.cluster {
        if !clusters.contains(c) {
            return super::reject(g, vec![super::unknown("cluster", c, &clusters)]);
        }
    }
    if clusters.is_empty() {
        return super::reject(
            g,
            vec![format!(
                "{} lists no clusters under [clusters] in drover.toml: nothing reports for it",
                env.name
            )
            .into()],
        );
    }
    let target = match &args.condition {
        Condition::Confirmed => env.version.clone(),
        Condition::Version(v) => v.clone(),
    };
    let repo = super::open_git(g)?;
    let started = Instant::now();
    let mut last_said: Option<Vec<ClusterWait>> = None;
    loop {
        if !args.no_fetch {
            fetch_status(&g.repo, &cfg.root.status_branch);
        }
        let view = fleet::gather(&repo, &cfg, Utc::now(), Some(&env.name))
            .context("reading the status branches")?;
        let rows = judge(&view, &env.name, args.cluster.as_deref(), &target);
        let verdict = verdict(&rows, &target);
        if !g.format.is_document() && last_said.as_ref() != Some(&rows) {
            for r in &rows {
                eprintln!("{}", describe(&env.name, r, &target));
            }
            last_said = Some(rows.clone());
        }
        let waited = started.elapsed();
        let out = Output {
            env: &env.name,
            version: target.to_string(),
            clusters: &rows,
            waited: waited.as_secs(),
        };
        let failure = match verdict {
            Verdict::Done => {
                if g.format.is_document() {
                    output::print_ok(g.format, &out)?;
                } else {
                    println!(
                        "{} confirmed {target} on every cluster waited for ({})",
                        env.name,
                        rows.iter()
                            .map(|r| r.cluster.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                return Ok(Outcome::Ok);
            }
            Verdict::Stuck(why) => Some(why),
            Verdict::Waiting if !args.timeout.is_zero() && waited >= args.timeout => Some(format!(
                "timed out after {} waiting for {} to confirm {target}",
                humantime::format_duration(args.timeout),
                env.name
            )),
            Verdict::Waiting => None,
        };
        if let Some(why) = failure {
            super::mark_rejected();
            let errors = [Problem::from(why)];
            if g.format.is_document() {
                output::print_document(g.format, false, &errors, &out)?;
            } else {
                eprintln!("{}", errors[0].text());
            }
            return Ok(Outcome::Rejected);
        }
        let left = match args.timeout.is_zero() {
            true => args.interval,
            false => args.interval.min(args.timeout.saturating_sub(waited)),
        };
        std::thread::sleep(left.max(Duration::from_millis(10)));
    }
}

/// Each cluster waited for, judged against `target`.
fn judge(view: &fleet::Fleet, env: &str, only: Option<&str>, target: &Version) -> Vec<ClusterWait> {
    view.environments
        .iter()
        .filter(|e| e.name == env)
        .flat_map(|e| &e.clusters)
        .filter(|c| only.is_none_or(|o| o == c.name))
        .map(|c| cluster_wait(c, target))
        .collect()
}

fn cluster_wait(c: &ClusterView, target: &Version) -> ClusterWait {
    let counts = matches!(c.trust, Trust::Trusted | Trust::Unverified);
    let r = c.report.as_ref();
    ClusterWait {
        cluster: c.name.clone(),
        state: r.map_or_else(|| "none".to_owned(), |r| r.state.clone()),
        version: r.map(|r| r.version.clone()),
        nodes: r.map(|r| r.nodes),
        nodes_at_version: r.map(|r| r.nodes_at_version),
        trust: c.trust.as_str(),
        done: counts
            && r.is_some_and(|r| r.state == "confirmed" && r.version == target.to_string()),
    }
}

fn verdict(rows: &[ClusterWait], target: &Version) -> Verdict {
    let stuck: Vec<String> = rows
        .iter()
        .filter(|r| r.trust != "untrusted")
        .filter(|r| r.version.as_deref() == Some(target.to_string().as_str()))
        .filter(|r| matches!(r.state.as_str(), "failed" | "revoked" | "refused"))
        .map(|r| format!("{} reports {} for {target}", r.cluster, r.state))
        .collect();
    if !stuck.is_empty() {
        return Verdict::Stuck(format!(
            "{}: it will not confirm without someone acting (drover status says why)",
            stuck.join("; ")
        ));
    }
    if rows.iter().all(|r| r.done) {
        Verdict::Done
    } else {
        Verdict::Waiting
    }
}

/// `stage/stage-1: rolling 1.13.2, 3/5 nodes at version` and the like.
fn describe(env: &str, r: &ClusterWait, target: &Version) -> String {
    let what = match (&r.version, r.nodes, r.nodes_at_version) {
        (Some(v), Some(n), Some(at)) => format!("{} {v}, {at}/{n} nodes at version", r.state),
        _ => "no report yet".to_owned(),
    };
    let trust = match r.trust {
        "untrusted" => " (untrusted: not counted)",
        _ => "",
    };
    let mark = if r.done { "done" } else { "waiting" };
    format!("{env}/{}: {what}{trust} [{mark} for {target}]", r.cluster)
}

/// Fetch the status branches from `origin` into `refs/remotes/origin/`,
/// where every reader looks (docs/status.md). A repository without
/// `origin` reads what it has; a failed fetch is said and the round reads
/// what was fetched before (the next round tries again).
pub fn fetch_status(repo: &Path, status_branch: &str) {
    let has_origin = git2::Repository::open(repo)
        .and_then(|r| r.find_remote("origin").map(|_| ()))
        .is_ok();
    if !has_origin {
        return;
    }
    let ns = crate::status::cluster_namespace(status_branch);
    let per_cluster = format!("+refs/heads/{ns}*:refs/remotes/origin/{ns}*");
    if let Err(e) = crate::promote::git(
        repo,
        &["fetch", "--quiet", "--no-tags", "origin", &per_cluster],
    ) {
        eprintln!("drover: warning: fetching the status branches from origin: {e}");
    }
    // The single branch of the older layout, where one still exists.
    let legacy = format!("+refs/heads/{status_branch}:refs/remotes/origin/{status_branch}");
    let _ = crate::promote::git(repo, &["fetch", "--quiet", "--no-tags", "origin", &legacy]);
}
