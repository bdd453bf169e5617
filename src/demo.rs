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

use crate::admit;
use crate::config::{self, DirFiles, RepoConfig};
use crate::gate::{Decision, Reason};
use crate::promote::{self, git, git_at, Choice};
use crate::rollout::{Engine, Labels, Policy, VirtualClock};
use crate::sim::{self, EventKind, Pdb, Pod, Sim, SimNode};
use crate::source::{Source, SourceConfig};
use crate::status::{self, PublishOptions, RolloutState, StatusReport};
use crate::window;
use chrono::{DateTime, SecondsFormat, Utc};
use semver::Version;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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
    /// Environment it concerns (`-` for the whole fleet).
    pub env: String,
    /// `at` in the environment's time zone (`Tue 12-08 02:00 CET`); empty for the whole fleet.
    pub local: String,
    /// What happened.
    pub event: String,
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
    /// Its last status report's state.
    pub state: String,
    /// Versions it confirmed, with the first confirmation's time.
    pub confirmed: Vec<(String, DateTime<Utc>)>,
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

/// One cluster's agent: its git cache, its simulated nodes, and what it applied.
struct Agent {
    env: String,
    cluster: String,
    source: Source,
    sim: Sim,
    clock: VirtualClock,
    /// The version and commit it last accepted (the last trusted state).
    applied: Option<(Version, git2::Oid)>,
    /// Its last report, to publish only on change.
    last_report: Option<(RolloutState, Version)>,
    /// How it signs its reports (its own key, generated at run time).
    publish: PublishOptions,
    /// Sim log entries already told.
    told: usize,
}

/// The forge and the people: a bare origin and a work tree to open pull requests from.
struct Forge {
    origin: PathBuf,
    work: PathBuf,
    pr: u32,
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
        }
    }
    story.say(
        "-",
        format!(
            "fleet: {} clusters of {} nodes, all at {from}; test upgrades on the 1st, stage on the 8th, production on the 20th",
            story.agents.len(),
            opts.nodes
        ),
    );
    story.tick().await?;

    story.advance_to("2026-11-27T10:00:00Z").await?;
    story.say("-", "OS 1.13.2 is released".into());
    story.bump("test", "1.13.2", "Bump test to 1.13.2")?;

    story.advance_to("2026-12-03T10:00:00Z").await?;
    story.say("-", "OS 1.13.3 is released".into());
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
    // §5a) halt the rollout at that node and stage reports `failed`, so
    // production may not take it; the version is revoked fleet-wide and the
    // next release goes through.
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
        "its pods crash-loop on stage-1 (stage's health checks halted the rollout)",
    )?;

    story.advance_to("2027-01-12T10:00:00Z").await?;
    story.say("-", "OS 1.13.4 is released".into());
    story.bump("test", "1.13.4", "Bump test to 1.13.4")?;
    story.advance_to("2027-02-03T09:00:00Z").await?;
    story.promote("stage")?;
    story.advance_to("2027-02-09T12:00:00Z").await?;
    story.finish()
}

struct Story {
    forge: Forge,
    agents: Vec<Agent>,
    lines: Vec<Line>,
    violations: Vec<String>,
    now: DateTime<Utc>,
    /// Every node start: (env, cluster, time, target), checked against windows and pins.
    starts: Vec<(String, String, DateTime<Utc>, Version)>,
    /// Each environment's time zone, for local times beside UTC.
    zones: BTreeMap<String, chrono_tz::Tz>,
}

impl Story {
    fn say(&mut self, env: &str, event: String) {
        self.say_at(self.now, env, event);
    }

    fn say_at(&mut self, at: DateTime<Utc>, env: &str, event: String) {
        let local = self.zones.get(env).map_or_else(String::new, |tz| {
            at.with_timezone(tz).format("%a %m-%d %H:%M %Z").to_string()
        });
        self.lines.push(Line {
            at,
            env: env.to_owned(),
            local,
            event,
        });
    }

    fn add_agent(
        &mut self,
        tmp: &Path,
        env: &str,
        cluster: &str,
        opts: &Options,
        version: &Version,
        key: Option<ssh_key::PrivateKey>,
    ) -> Result<(), Error> {
        let clock = VirtualClock::new(self.now);
        let sim = Sim::new(cluster, clock.clone());
        for i in 0..opts.nodes {
            // Two replicas of a web app per node pair, under a PDB, so drains
            // go through evictions the budget must allow.
            let pods = vec![
                Pod {
                    name: format!("{cluster}-web-{i}"),
                    pdb: Some("web".into()),
                },
                Pod {
                    name: format!("{cluster}-worker-{i}"),
                    pdb: None,
                },
            ];
            sim.add_node(
                SimNode::new(
                    format!("{cluster}-node-{i}"),
                    Some(version.clone()),
                    opts.node_time,
                )
                .with_pods(pods),
            );
        }
        sim.add_pdb(
            "web",
            Pdb {
                min_available: opts.nodes.saturating_sub(1).max(1),
                blocked_until: None,
            },
        );
        let mut cfg = SourceConfig::new(
            format!("file://{}", self.forge.origin.display()),
            tmp.join("agents").join(cluster),
        );
        cfg.timeout = Duration::from_secs(30);
        self.agents.push(Agent {
            env: env.to_owned(),
            cluster: cluster.to_owned(),
            source: Source::open(cfg)?,
            sim,
            clock,
            applied: None,
            last_report: None,
            publish: PublishOptions {
                signing_key: key,
                ..PublishOptions::default()
            },
            told: 0,
        });
        Ok(())
    }

    /// A person opens a pull request moving `env` to `version`; CI runs
    /// `drover check --base main`; it is merged when CI passes.
    fn bump(&mut self, env: &str, version: &str, title: &str) -> Result<(), Error> {
        let to: Version = version
            .parse()
            .map_err(|e| Error::Config(format!("{version}: {e}")))?;
        let pr = self.forge.open_pr(env, &to, title, self.now)?;
        self.review(env, pr, title)
    }

    /// A pull request adding a `[[freeze]]` to `env`; CI and merge as above,
    /// then what `drover windows` lists next.
    fn freeze(&mut self, env: &str, block: &str, title: &str) -> Result<(), Error> {
        let pr = self.forge.open_edit_pr(env, block, title, self.now)?;
        self.review(env, pr, title)?;
        let cfg = self.forge.config()?;
        let env_cfg = cfg
            .envs
            .get(env)
            .ok_or_else(|| Error::Config(format!("no environment {env}")))?;
        let calendar = window::Calendar::of(env_cfg)?;
        let tz = calendar.timezone();
        if let Some(p) = calendar.periods(self.now).next() {
            let local = |t: DateTime<Utc>| {
                t.with_timezone(&tz)
                    .format("%a %Y-%m-%d %H:%M %Z")
                    .to_string()
            };
            self.say(
                env,
                format!(
                    "`drover windows --env {env}`: next window {} – {}; the freeze holds the rest of it",
                    local(p.start),
                    local(p.end)
                ),
            );
        }
        Ok(())
    }

    /// A pull request adding `version` to `[promotion] revoked` in
    /// drover.toml (what `drover revoke` prepares); CI and merge as above.
    fn revoke(&mut self, version: &str, reason: &str) -> Result<(), Error> {
        let title = format!("Revoke {version}");
        let pr = self
            .forge
            .open_revoke_pr(version, reason, &title, self.now)?;
        self.review("-", pr, &title)
    }

    /// `drover promote env` prepares the pull request; CI and merge as above.
    fn promote(&mut self, env: &str) -> Result<(), Error> {
        let work = self.forge.work.clone();
        git(&work, &["fetch", "--quiet", "origin"])?;
        let cfg = self.forge.config()?;
        let repo = git2::Repository::open(&work)?;
        match promote::choose(&repo, &cfg, env, None, self.now).map_err(Error::Promote)? {
            Choice::Nothing(why) => {
                let why = why.join("; ");
                self.say(
                    env,
                    format!("`drover promote {env}`: nothing to promote: {why}"),
                );
                Ok(())
            }
            Choice::Promote(p) => {
                promote::write_branch(&work, &p, Some(self.now))?;
                self.forge.pr += 1;
                let pr = self.forge.pr;
                let title = format!("Promote {env} to {}", p.to);
                self.say(
                    env,
                    format!("`drover promote {env}` opens PR #{pr} \"{title}\""),
                );
                self.review(env, pr, &title)
            }
        }
    }

    /// CI on the open pull request (the work tree's current branch), then merge or close.
    fn review(&mut self, env: &str, pr: u32, title: &str) -> Result<(), Error> {
        let work = self.forge.work.clone();
        git(&work, &["fetch", "--quiet", "origin"])?;
        let invalid = match config::load(&DirFiles::new(&work)) {
            Ok(_) => Vec::new(),
            Err(d) => d.iter().map(ToString::to_string).collect(),
        };
        let refusals: Vec<String> = if invalid.is_empty() {
            admit::check_base(&work, "main", self.now)?
                .diagnostics
                .iter()
                .map(|d| d.message.clone())
                .collect()
        } else {
            invalid
        };
        let branch = git(&work, &["rev-parse", "--abbrev-ref", "HEAD"])?;
        let branch = branch.trim().to_owned();
        git(&work, &["switch", "--quiet", "main"])?;
        if refusals.is_empty() {
            let msg = format!("Merge pull request #{pr} from {branch}\n\n{title}");
            git_at(
                &work,
                &["merge", "--quiet", "--no-ff", "-m", &msg, &branch],
                Some(self.now),
            )?;
            git(&work, &["push", "--quiet", "origin", "main"])?;
            self.say(
                env,
                format!("PR #{pr} \"{title}\": `drover check --base main` passes; merged"),
            );
        } else {
            git(&work, &["branch", "--quiet", "-D", &branch])?;
            self.say(
                env,
                format!(
                    "PR #{pr} \"{title}\": `drover check --base main` refuses it, closed: {}",
                    refusals.join("; ")
                ),
            );
        }
        Ok(())
    }

    /// Let every agent work until `t`.
    async fn advance_to(&mut self, t: &str) -> Result<(), Error> {
        let until: DateTime<Utc> = t.parse().map_err(|e| Error::Config(format!("{t}: {e}")))?;
        // Agents act in virtual time independently; each runs to `until`.
        for i in 0..self.agents.len() {
            self.run_agent(i, until).await?;
        }
        self.now = until;
        self.lines.sort_by_key(|l| l.at);
        Ok(())
    }

    /// One reconcile of every agent at the current time.
    async fn tick(&mut self) -> Result<(), Error> {
        let now = self.now;
        self.advance_to(&now.to_rfc3339()).await
    }

    /// The agent's loop for one cluster from its clock to `until`: fetch,
    /// load, gate, window, engine, status report. The config only changes
    /// between calls (pull requests are merged at story instants), so one
    /// fetch per call sees every change an agent polling all along would.
    async fn run_agent(&mut self, i: usize, until: DateTime<Utc>) -> Result<(), Error> {
        let (env, cluster) = (self.agents[i].env.clone(), self.agents[i].cluster.clone());
        let at = self.agents[i].clock.now_utc();
        let fetched = self.agents[i].source.fetch()?;
        let previous = self.agents[i].applied.as_ref().map(|(v, _)| v.clone());
        // The same admission as the agent's: trust (the demo's commits are
        // unsigned, so `off`), config, then the gate commit by commit.
        let (env_cfg, decision, adopt) = {
            let repo = self.agents[i].source.repo();
            let last = self.agents[i].applied.as_ref().map(|(_, c)| *c);
            let head_cfg = admit::snapshot(repo, fetched.head, at)?.map_err(|d| {
                Error::Config(
                    d.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            })?;
            let Some(env_cfg) = head_cfg.config.envs.get(&env).cloned() else {
                return Err(Error::Config(format!("no environment {env}")));
            };
            // Adoption: before anything was applied, a fleet that already
            // runs the pinned version moves nothing and needs no gate.
            let adopt = last.is_none()
                && uniform_version(&self.agents[i].sim).as_ref() == Some(&env_cfg.version);
            let decision = if adopt {
                Decision::Unchanged
            } else {
                match admit::admit_head(
                    repo,
                    last,
                    fetched.head,
                    &env,
                    &crate::admit::TrustCheck {
                        mode: crate::trust::Mode::Off,
                        signers: &crate::trust::AllowedSigners::default(),
                        first_seen: &|_| at.timestamp(),
                    },
                    at,
                ) {
                    Ok(a) => a.decision,
                    Err(r) => match r.refusal {
                        Some(g) => Decision::Refused(*g),
                        None => return Err(Error::Config(r.to_string())),
                    },
                }
            };
            (env_cfg, decision, adopt)
        };
        let gate_from = match &decision {
            Decision::Allowed(_) | Decision::Unchanged => Some(at),
            Decision::Refused(r) => match &r.reason {
                Reason::Soaking { passes_at, .. } | Reason::HistorySoaking { passes_at, .. } => {
                    Some(*passes_at)
                }
                _ => None,
            },
        };
        let changed = self.agents[i].applied.as_ref().map(|(_, c)| *c) != Some(fetched.head);
        if changed {
            let version_changed = previous.as_ref() != Some(&env_cfg.version);
            match (&decision, version_changed) {
                (Decision::Refused(r), _) if gate_from.is_none() => {
                    self.say_at(at, &env, format!("{cluster}: agent refuses config {}: {r}", short(fetched.head)));
                    return self.idle_until(i, until);
                }
                (_, true) if adopt => self.say_at(
                    at,
                    &env,
                    format!(
                        "{cluster}: agent adopts the cluster at config {}: every node already runs the pinned {}, so nothing moves and no gate applies",
                        short(fetched.head),
                        env_cfg.version
                    ),
                ),
                (_, true) => self.say_at(
                    at,
                    &env,
                    format!(
                        "{cluster}: agent accepts config {} pinning {}; waiting for the next window",
                        short(fetched.head),
                        env_cfg.version
                    ),
                ),
                _ => {}
            }
            self.agents[i].source.accept(fetched.head)?;
            self.agents[i].applied = Some((env_cfg.version.clone(), fetched.head));
        }

        let calendar = window::Calendar::of(&env_cfg)?;
        let horizon_windows = windows_between(&calendar, at, until);
        let sim_schedule = sim::Schedule {
            windows: horizon_windows.clone(),
            calendar: Some(calendar),
            gate_from,
        };
        let engine = Engine::new(
            Policy::from_env(&env_cfg),
            Labels {
                env: env.clone(),
                commit: fetched.head.to_string(),
            },
            self.agents[i].clock.clone(),
        );
        let report = sim::drive(&self.agents[i].sim, &engine, &sim_schedule, until)
            .await
            .map_err(|e| Error::Engine(e.to_string()))?;
        self.tell_sim_events(i, &env_cfg.version, &horizon_windows);
        let state = report.last.state;
        let key = (state, env_cfg.version.clone());
        if self.agents[i].last_report.as_ref() != Some(&key) {
            let line = StatusReport {
                env: env.clone(),
                cluster: cluster.clone(),
                config_commit: fetched.head.to_string(),
                version: env_cfg.version.clone(),
                state,
                since: report.ended_at,
                nodes: report.last.nodes,
                nodes_at_version: report.last.nodes_at_version,
                message: report.last.message.clone(),
                detail: Default::default(),
            };
            let source = &self.agents[i].source;
            let published = status::publish(source, &line, &self.agents[i].publish)?;
            self.agents[i].last_report = Some(key);
            if published.commit.is_some() {
                let what = match state {
                    RolloutState::Confirmed => format!(
                        "all {} nodes Ready at {}: confirmation signed with {cluster}'s key, pushed to drover/status.d/{env}/{cluster}",
                        line.nodes, line.version
                    ),
                    other => format!(
                        "{} {} ({}/{} nodes at version) reported to drover/status {}",
                        other.as_str(),
                        line.version,
                        line.nodes_at_version,
                        line.nodes,
                        line.message
                    ),
                };
                self.say_at(report.ended_at, &env, format!("{cluster}: {what}"));
            }
        }
        self.idle_until(i, until)
    }

    fn idle_until(&mut self, i: usize, until: DateTime<Utc>) -> Result<(), Error> {
        self.agents[i].clock.set(until);
        Ok(())
    }

    /// Turn new sim events into story lines: window use and node counts.
    fn tell_sim_events(&mut self, i: usize, target: &Version, windows: &[Interval]) {
        let log = self.agents[i].sim.log();
        let (env, cluster) = (self.agents[i].env.clone(), self.agents[i].cluster.clone());
        let new = log.get(self.agents[i].told..).unwrap_or_default().to_vec();
        self.agents[i].told = log.len();
        let mut first_start = None;
        for e in &new {
            if let EventKind::DriverStart(v) = &e.kind {
                self.starts
                    .push((env.clone(), cluster.clone(), e.at, v.clone()));
                if v != target {
                    self.violations.push(format!(
                        "{cluster}: {} started towards {v}, but {env} pins {target}",
                        e.node
                    ));
                }
                if !windows.iter().any(|(s, end)| *s <= e.at && e.at < *end) {
                    self.violations.push(format!(
                        "{cluster}: {} started at {} outside every window of {env}",
                        e.node,
                        ts(e.at)
                    ));
                }
                first_start.get_or_insert(e.at);
            }
        }
        if let Some(at) = first_start {
            let opened = windows
                .iter()
                .find(|(s, end)| *s <= at && at < *end)
                .map(|(s, end)| format!("window {}–{}", ts(*s), ts(*end)))
                .unwrap_or_default();
            let starts = new
                .iter()
                .filter(|e| matches!(e.kind, EventKind::DriverStart(_)))
                .count();
            let evictions = new
                .iter()
                .filter(|e| matches!(e.kind, EventKind::Evicted(_)))
                .count();
            self.say_at(
                at,
                &env,
                format!(
                    "{cluster}: {opened} open; cordon, drain ({evictions} evictions through PDB \"web\"), upgrade {starts} nodes to {target}, one at a time"
                ),
            );
        }
        for v in self.agents[i].sim.violations() {
            if !self.violations.contains(&v) {
                self.violations.push(format!("{cluster}: {v}"));
            }
        }
    }

    fn finish(mut self) -> Result<Report, Error> {
        self.lines.sort_by_key(|l| l.at);
        let mut rows = Vec::new();
        let mut peak = 0;
        for a in &self.agents {
            let mut versions = BTreeMap::new();
            for n in a.sim.nodes() {
                let v = n.version.map_or("unreadable".into(), |v| v.to_string());
                *versions.entry(v).or_insert(0) += 1;
                if n.unschedulable {
                    self.violations
                        .push(format!("{}: {} left cordoned", a.cluster, n.name));
                }
            }
            peak = peak.max(a.sim.peak_unavailable());
            // Read the way the gate reads it: with the report signers of
            // the commit this agent applied.
            let applied = a
                .applied
                .as_ref()
                .map(|(_, c)| *c)
                .ok_or_else(|| Error::Config(format!("{}: nothing applied", a.cluster)))?;
            let mut evidence = admit::GitEvidence::new(a.source.repo(), applied);
            let head = admit::snapshot(a.source.repo(), applied, self.now)?
                .map_err(|d| Error::Config(join(&d)))?;
            let conf = evidence.confirmations(&head.policy)?;
            let mut confirmed: Vec<(String, DateTime<Utc>)> = conf
                .for_env(&a.env)
                .into_iter()
                .filter(|(c, _, _)| *c == a.cluster)
                .map(|(_, v, t)| (v.to_string(), t))
                .collect();
            confirmed.sort_by_key(|(_, t)| *t);
            rows.push(ClusterRow {
                env: a.env.clone(),
                cluster: a.cluster.clone(),
                nodes: a.sim.nodes().len(),
                versions,
                state: a
                    .last_report
                    .as_ref()
                    .map_or("none".into(), |(s, v)| format!("{} {v}", s.as_str())),
                confirmed,
            });
        }
        if peak > 1 {
            self.violations.push(format!(
                "{peak} nodes were unavailable at once; max_unavailable is 1"
            ));
        }
        let (fleet, timeline) = self.forge.fleet(self.now)?;
        Ok(Report {
            timeline: self.lines,
            clusters: rows,
            violations: self.violations,
            peak_unavailable: peak,
            fleet: Some(fleet),
            picture: Some(timeline),
        })
    }
}

impl Forge {
    /// A bare origin holding example-repo's first commit, and a clone to
    /// work in (at `keep` when given, else in `tmp`).
    fn create(
        tmp: &Path,
        keep: Option<&Path>,
        example: &Path,
        at: DateTime<Utc>,
        cfg: &RepoConfig,
        keys: &BTreeMap<(String, String), ssh_key::PrivateKey>,
    ) -> Result<Self, Error> {
        let origin = tmp.join("origin.git");
        let work = keep.map_or_else(|| tmp.join("config"), Path::to_path_buf);
        git(
            tmp,
            &[
                "init",
                "--quiet",
                "--bare",
                "-b",
                "main",
                path_str(&origin)?,
            ],
        )?;
        copy_dir(example, &work)?;
        if let Some(file) = &cfg.root.report_signers {
            let path = work.join(file);
            let mut text = std::fs::read_to_string(&path).unwrap_or_default();
            for ((env, cluster), key) in keys {
                let public = key
                    .public_key()
                    .to_openssh()
                    .map_err(|e| Error::Key(e.to_string()))?;
                text.push_str(&format!("{env}/{cluster} namespaces=\"git\" {public}\n"));
            }
            std::fs::write(path, text)?;
        }
        for args in [
            &["init", "--quiet", "-b", "main"][..],
            &["config", "user.name", "Platform Team"],
            &["config", "user.email", "platform@example.com"],
            &["config", "commit.gpgsign", "false"],
            &["remote", "add", "origin", path_str(&origin)?],
            &["add", "-A"],
        ] {
            git(&work, args)?;
        }
        git_at(
            &work,
            &[
                "commit",
                "--quiet",
                "-m",
                "Initial configuration: test, stage and production at 1.12.0",
            ],
            Some(at),
        )?;
        git(&work, &["push", "--quiet", "origin", "main"])?;
        Ok(Forge {
            origin,
            work,
            pr: 0,
        })
    }

    /// The fleet as `drover status` shows it at `now`, from the work tree
    /// with the status branch fetched as a local branch (so the work tree
    /// stands alone once the temporary origin is gone).
    fn fleet(
        &self,
        now: DateTime<Utc>,
    ) -> Result<(crate::fleet::Fleet, crate::fleet::Timeline), Error> {
        git(
            &self.work,
            &[
                "fetch",
                "--quiet",
                "origin",
                "+refs/heads/drover/status.d/*:refs/heads/drover/status.d/*",
            ],
        )?;
        let cfg = self.config()?;
        let repo = git2::Repository::open(&self.work)?;
        let mut fleet = crate::fleet::gather(&repo, &cfg, now, None)?;
        let (timeline, warnings) = crate::fleet::timeline(&repo, &cfg, now, None)?;
        fleet.warnings.extend(warnings);
        Ok((fleet, timeline))
    }

    fn config(&self) -> Result<RepoConfig, Error> {
        config::load(&DirFiles::new(&self.work)).map_err(|d| {
            Error::Config(
                d.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })
    }

    /// A branch with `env` moved to `to`, as a person would write it; returns the PR number.
    /// Open a pull request appending `block` to `env`'s file.
    fn open_edit_pr(
        &mut self,
        env: &str,
        block: &str,
        title: &str,
        at: DateTime<Utc>,
    ) -> Result<u32, Error> {
        self.pr += 1;
        let branch = format!("edit-{env}-{}", self.pr);
        git(&self.work, &["switch", "--quiet", "-c", &branch])?;
        let path = self.work.join(format!("{}/{env}.toml", config::ENV_DIR));
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str(block);
        std::fs::write(&path, text)?;
        git_at(&self.work, &["commit", "--quiet", "-am", title], Some(at))?;
        Ok(self.pr)
    }

    fn open_revoke_pr(
        &mut self,
        version: &str,
        reason: &str,
        title: &str,
        at: DateTime<Utc>,
    ) -> Result<u32, Error> {
        self.pr += 1;
        let branch = format!("revoke-{version}");
        git(&self.work, &["switch", "--quiet", "-c", &branch])?;
        let path = self.work.join("drover.toml");
        let text = std::fs::read_to_string(&path)?;
        let entry = format!("revoked = [{{ version = \"{version}\", reason = \"{reason}\" }}]");
        let new: Vec<String> = text
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("revoked") {
                    entry.clone()
                } else {
                    l.to_owned()
                }
            })
            .collect();
        if !new.contains(&entry) {
            return Err(Error::Config(
                "drover.toml has no `revoked` line to edit".into(),
            ));
        }
        std::fs::write(&path, new.join("\n") + "\n")?;
        git_at(&self.work, &["commit", "--quiet", "-am", title], Some(at))?;
        Ok(self.pr)
    }

    fn open_pr(
        &mut self,
        env: &str,
        to: &Version,
        title: &str,
        at: DateTime<Utc>,
    ) -> Result<u32, Error> {
        self.pr += 1;
        let branch = format!("bump-{env}-{to}");
        git(&self.work, &["switch", "--quiet", "-c", &branch])?;
        let rel = format!("{}/{env}.toml", config::ENV_DIR);
        let path = self.work.join(&rel);
        let text = std::fs::read_to_string(&path)?;
        let new = promote::set_version(&text, to).map_err(Error::Config)?;
        std::fs::write(&path, new)?;
        git_at(&self.work, &["commit", "--quiet", "-am", title], Some(at))?;
        Ok(self.pr)
    }
}

/// A window as `[start, end)`.
type Interval = (DateTime<Utc>, DateTime<Utc>);

/// The periods in which a node may start (what `drover windows` lists)
/// overlapping `[from, until]`, plus one past it so a rollout waiting for it
/// can say when.
fn windows_between(
    calendar: &window::Calendar,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Vec<Interval> {
    let mut out = Vec::new();
    for p in calendar.periods(from) {
        out.push((p.start, p.end));
        if p.start > until {
            break;
        }
    }
    out
}

fn join(d: &[crate::diag::Diagnostic]) -> String {
    d.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn uniform_version(sim: &Sim) -> Option<Version> {
    let nodes = sim.nodes();
    let first = nodes.first()?.version.clone()?;
    nodes
        .iter()
        .all(|n| n.version.as_ref() == Some(&first))
        .then_some(first)
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dest)?;
        } else {
            std::fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

fn path_str(p: &Path) -> Result<&str, Error> {
    p.to_str()
        .ok_or_else(|| Error::Config(format!("{} is not valid UTF-8", p.display())))
}

fn short(oid: git2::Oid) -> String {
    oid.to_string().chars().take(8).collect()
}

/// A time as the timeline prints it.
pub fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

trait NowUtc {
    fn now_utc(&self) -> DateTime<Utc>;
}

impl NowUtc for VirtualClock {
    fn now_utc(&self) -> DateTime<Utc> {
        crate::rollout::Clock::now(self)
    }
}
