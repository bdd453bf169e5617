//! The story of docs/design.md §0 end to end (`drover demo`): a company with test, stage
//! and production, each upgrading in its own monthly window, and never to a
//! version the environment below has not confirmed.
//!
//! Everything but the clusters and the clock is real: a bare git repository
//! plays the forge, pull requests are branches judged by the same code as
//! `drover check --base`, promotions are made by `drover promote`, each
//! cluster's agent fetches through the git source into its own cache, runs
//! the gate and the windows, drives the rollout engine against a simulated
//! cluster, and pushes its status reports to the status branch, where the
//! next environment's gate reads them.
//!
//! `run` below is the script of the story; [`story`] plays its steps (pull
//! requests, the narration), [`pass`] each agent's passes, [`checks`] the
//! checks of every invariant at the end, and [`forge`] is the git side: the
//! bare origin and the work tree pull requests are opened from.

mod checks;
mod forge;
mod pass;
mod story;

use forge::Forge;
use story::Story;

use crate::admit;
use crate::config::{self, DirFiles};
use crate::promote::{self};
use crate::sim::{self};
use crate::status::{self};
use crate::window;
use chrono::{DateTime, SecondsFormat, Utc};
use semver::Version;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Errors that stop the demo from telling its story.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Setting up or using the demo's git repositories failed.
    #[error("git: {0}")]
    Promote(#[from] promote::Error),
    /// The git source failed.
    #[error(transparent)]
    Source(#[from] crate::source::Error),
    /// Pushing a status report failed.
    #[error(transparent)]
    Push(#[from] status::PushError),
    /// Reading the status branch failed.
    #[error(transparent)]
    Status(#[from] status::Error),
    /// Admission could not read its evidence.
    #[error(transparent)]
    Admit(#[from] admit::Error),
    /// A report signing key could not be made.
    #[error("signing key: {0}")]
    Key(String),
    /// The example repository or a commit of it does not load.
    #[error("config: {0}")]
    Config(String),
    /// A window could not be computed.
    #[error(transparent)]
    Window(#[from] window::Error),
    /// The simulated rollout failed to step.
    #[error("rollout: {0}")]
    Engine(String),
    /// A file operation failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A git2 operation failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    /// The fleet view at the end could not be built.
    #[error(transparent)]
    Fleet(#[from] crate::fleet::Error),
}

/// How big the simulated fleet is.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes per cluster.
    pub nodes: usize,
    /// Time one node takes from drain to Ready at the new version.
    pub node_time: Duration,
    /// The example repository to copy.
    pub example_repo: PathBuf,
    /// Keep the config repository (with its status branch) here after the
    /// story, for `drover status --repo`; default a temporary directory.
    pub keep_repo: Option<PathBuf>,
}

/// One line of the story.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// When (virtual time, UTC).
    pub at: DateTime<Utc>,
    /// Environment it concerns; `None` for the whole fleet.
    pub env: Option<String>,
    /// `at` in the environment's time zone (`Tue 12-08 02:00 CET`); `None` for the whole fleet.
    pub local: Option<String>,
    /// What happened.
    pub event: String,
}

/// A version a cluster confirmed, and when it first did.
#[derive(Debug, Clone, Serialize)]
pub struct Confirmed {
    /// The version.
    pub version: String,
    /// The first confirmation's time.
    pub at: DateTime<Utc>,
}

/// One cluster at the end of the story.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRow {
    /// Environment.
    pub env: String,
    /// Cluster.
    pub cluster: String,
    /// Nodes.
    pub nodes: usize,
    /// Versions its nodes run, with how many run each.
    pub versions: BTreeMap<String, usize>,
    /// Its last status report: state and version (`failed 1.13.3`); `None` before the first.
    pub state: Option<String>,
    /// Versions it confirmed, with the first confirmation's time.
    pub confirmed: Vec<Confirmed>,
}

/// What the demo showed.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The story, in time order.
    pub timeline: Vec<Line>,
    /// Every cluster at the end.
    pub clusters: Vec<ClusterRow>,
    /// Invariant violations (empty when all held).
    pub violations: Vec<String>,
    /// Most nodes unavailable at once in any cluster, and the budget.
    pub peak_unavailable: usize,
    /// The fleet at the end, as `drover status` shows it.
    pub fleet: Option<crate::fleet::Fleet>,
    /// What the timeline page draws (`drover demo --html`).
    #[serde(skip)]
    pub picture: Option<crate::fleet::Timeline>,
}

/// Run the story; the report says whether every invariant held.
pub async fn run(opts: &Options) -> Result<Report, Error> {
    let tmp = tempfile::Builder::new().prefix("drover-demo-").tempdir()?;
    let start: DateTime<Utc> = "2026-11-25T09:00:00Z".parse().unwrap_or_default();
    // Every cluster signs its reports with its own key, made here and never
    // written to disk; the public halves go into the report signers file.
    let example_cfg = config::load(&DirFiles::new(&opts.example_repo)).map_err(|d| {
        Error::Config(
            d.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    let mut keys = BTreeMap::new();
    for env in &example_cfg.root.chain {
        for cluster in example_cfg.clusters(env) {
            let seed: [u8; 32] = rand::random();
            let key = ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&seed));
            keys.insert((env.clone(), cluster.clone()), key);
        }
    }
    let mut story = Story {
        forge: Forge::create(
            tmp.path(),
            opts.keep_repo.as_deref(),
            &opts.example_repo,
            start,
            &example_cfg,
            &keys,
        )?,
        agents: Vec::new(),
        zones: BTreeMap::new(),
        lines: Vec::new(),
        violations: Vec::new(),
        now: start,
        starts: Vec::new(),
        refused: Vec::new(),
    };
    let cfg = story.forge.config()?;
    story.zones = cfg
        .envs
        .iter()
        .map(|(name, e)| (name.clone(), e.windows[0].timezone))
        .collect();
    let from: Version = "1.12.0".parse().unwrap_or(Version::new(1, 12, 0));
    for env in &cfg.root.chain {
        for cluster in cfg.clusters(env) {
            let key = keys.get(&(env.clone(), cluster.clone())).cloned();
            story.add_agent(tmp.path(), env, cluster, opts, &from, key)?;
            if let (Some(agent), Some(e)) = (story.agents.last_mut(), cfg.envs.get(env)) {
                agent.zone = Some(e.for_cluster(cluster).windows[0].timezone);
            }
        }
    }
    story.say_fleet(
        format!(
            "fleet: {} clusters of {}, all at {from}; test upgrades on the 1st, stage on the 8th, production in two waves: prod-eu-1 on the 20th in Madrid, then prod-us-1 the next night in New York once prod-eu-1's signed confirmation has soaked 24h",
            story.agents.len(),
            crate::terminal::count(opts.nodes as u64, "node", "nodes")
        ),
    );
    story.tick().await?;

    story.advance_to("2026-11-27T10:00:00Z").await?;
    story.say_fleet("OS 1.13.2 is released".into());
    story.bump("test", "1.13.2", "Bump test to 1.13.2")?;

    story.advance_to("2026-12-03T10:00:00Z").await?;
    story.say_fleet("OS 1.13.3 is released".into());
    story.bump("test", "1.13.3", "Bump test to 1.13.3")?;

    story.advance_to("2026-12-04T09:00:00Z").await?;
    story.bump("stage", "1.13.3", "Bump stage to 1.13.3")?;
    story.promote("stage")?;
    story.promote("production")?;

    story.advance_to("2026-12-12T09:00:00Z").await?;
    story.promote("production")?;

    // A holiday freeze, merged like any reviewed change: test's 1 January
    // window only opens when the freeze ends.
    story.advance_to("2026-12-22T09:00:00Z").await?;
    story.freeze(
        "test",
        "\n[[freeze]]\nstart = 2026-12-31T00:00:00\nend = 2027-01-01T06:00:00\nscope = \"all\"\nreason = \"New Year change freeze\"\n",
        "Freeze test over New Year",
    )?;

    story.advance_to("2027-01-02T12:00:00Z").await?;

    // 1.13.3 breaks a workload that only stage runs: its pods crash-loop on
    // the first node stage upgrades. Stage's health checks (docs/design.md
    // §5a) halt the rollout at that node, and stage's `on_failure =
    // "rollback"` (§5b) drives the node back to 1.13.2, healthy and
    // uncordoned; stage reports `failed`, so production may not take it;
    // the version is revoked fleet-wide and the next release goes through.
    if let Some(stage) = story.agents.iter().find(|a| a.env == "stage") {
        if let Some(first) = stage.sim.nodes().iter().map(|n| n.name.clone()).min() {
            stage
                .sim
                .set_health_fault(&first, Version::new(1, 13, 3), sim::HealthFault::CrashLoop);
        }
    }
    story.advance_to("2027-01-04T09:00:00Z").await?;
    story.promote("stage")?;
    story.advance_to("2027-01-08T12:00:00Z").await?;
    story.bump("production", "1.13.3", "Bump production to 1.13.3")?;
    story.revoke(
        "1.13.3",
        "its pods crash-loop on stage-1 (stage rolled that node back to 1.13.2 and halted)",
    )?;

    story.advance_to("2027-01-12T10:00:00Z").await?;
    story.say_fleet("OS 1.13.4 is released".into());
    story.bump("test", "1.13.4", "Bump test to 1.13.4")?;
    story.advance_to("2027-02-03T09:00:00Z").await?;
    story.promote("stage")?;
    story.advance_to("2027-02-09T12:00:00Z").await?;
    story.finish()
}

/// A time as the timeline prints it.
pub fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}
