//! The story's cast and its steps: each cluster's agent, the story's lines
//! as it tells them, pull requests merged after review, and the story's
//! clock. An agent's passes are `pass.rs`, the checks at the end `checks.rs`.

use super::forge::Forge;
use super::{Error, Line, Options};
use crate::admit;
use crate::config::{self, DirFiles};
use crate::promote::{self, git, git_at, Choice};
use crate::rollout::RolloutState;
use crate::rollout::VirtualClock;
use crate::sim::{Pdb, Pod, Sim, SimNode};
use crate::source::{Source, SourceConfig};
use crate::status::PublishOptions;
use crate::window;
use chrono::{DateTime, Utc};
use semver::Version;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// One cluster's agent: its git cache, its simulated nodes, and what it applied.
pub(super) struct Agent {
    pub(super) env: String,
    pub(super) cluster: String,
    pub(super) source: Source,
    pub(super) sim: Sim,
    pub(super) clock: VirtualClock,
    /// The version and commit it last accepted (the last trusted state).
    pub(super) applied: Option<(Version, git2::Oid)>,
    /// Its last report, to publish only on change.
    pub(super) last_report: Option<(RolloutState, Version)>,
    /// That report's message: a pending cluster reports again when what it waits on changes.
    pub(super) last_message: String,
    /// Its time zone: its wave's window's, else its environment's.
    pub(super) zone: Option<chrono_tz::Tz>,
    /// How it signs its reports (its own key, generated at run time).
    pub(super) publish: PublishOptions,
    /// Sim log entries already told.
    pub(super) told: usize,
}

pub(super) struct Story {
    pub(super) forge: Forge,
    pub(super) agents: Vec<Agent>,
    pub(super) lines: Vec<Line>,
    pub(super) violations: Vec<String>,
    pub(super) now: DateTime<Utc>,
    /// Every node start: (env, cluster, time, target), checked against windows and pins.
    pub(super) starts: Vec<(String, String, DateTime<Utc>, Version)>,
    /// Each environment's time zone, for local times beside UTC.
    pub(super) zones: BTreeMap<String, chrono_tz::Tz>,
    /// Pull requests `drover check --base` refused, for the timeline page
    /// (a forge's closed pull requests are not in git).
    pub(super) refused: Vec<crate::fleet::Event>,
}

impl Story {
    pub(super) fn say(&mut self, env: &str, event: String) {
        self.say_at(self.now, env, event);
    }

    /// A line about the whole fleet (no environment, no local time).
    pub(super) fn say_fleet(&mut self, event: String) {
        self.lines.push(Line {
            at: self.now,
            env: None,
            local: None,
            event,
        });
    }

    /// A line about agent `i`'s cluster, in its own time zone.
    pub(super) fn say_cluster(&mut self, at: DateTime<Utc>, i: usize, event: String) {
        let a = &self.agents[i];
        let (env, tz) = (a.env.clone(), a.zone.or(self.zones.get(&a.env).copied()));
        let event = format!("{}: {event}", a.cluster);
        self.say_in(at, &env, tz, event);
    }

    pub(super) fn say_at(&mut self, at: DateTime<Utc>, env: &str, event: String) {
        let tz = self.zones.get(env).copied();
        self.say_in(at, env, tz, event);
    }

    fn say_in(&mut self, at: DateTime<Utc>, env: &str, tz: Option<chrono_tz::Tz>, event: String) {
        let local = tz.map(|tz| {
            at.with_timezone(&tz)
                .format("%a %m-%d %H:%M %Z")
                .to_string()
        });
        self.lines.push(Line {
            at,
            env: Some(env.to_owned()),
            local,
            event,
        });
    }

    pub(super) fn add_agent(
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
            last_message: String::new(),
            zone: None,
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
    pub(super) fn bump(&mut self, env: &str, version: &str, title: &str) -> Result<(), Error> {
        let to: Version = version
            .parse()
            .map_err(|e| Error::Config(format!("{version}: {e}")))?;
        let pr = self.forge.open_pr(env, &to, title, self.now)?;
        self.review(Some(env), pr, title)
    }

    /// A pull request adding a `[[freeze]]` to `env`; CI and merge as above,
    /// then what `drover windows` lists next.
    pub(super) fn freeze(&mut self, env: &str, block: &str, title: &str) -> Result<(), Error> {
        let pr = self.forge.open_edit_pr(env, block, title, self.now)?;
        self.review(Some(env), pr, title)?;
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

    /// `drover revoke VERSION --reason TEXT` prepares the pull request
    /// adding `version` to `[promotion] revoked`; CI and merge as above.
    pub(super) fn revoke(&mut self, version: &str, reason: &str) -> Result<(), Error> {
        let cfg = self.forge.config()?;
        let work = self.forge.work.clone();
        let r = crate::revoke::prepare(&cfg, version, reason)
            .map_err(|e| Error::Config(format!("drover revoke {version}: {e}")))?;
        crate::revoke::write_branch(&work, &r, Some(self.now))
            .map_err(|e| Error::Config(format!("drover revoke {version}: {e}")))?;
        self.forge.pr += 1;
        let pr = self.forge.pr;
        let title = format!("Revoke {version}");
        self.say_fleet(format!(
            "`drover revoke {version} --reason ...` opens PR #{pr} \"{title}\""
        ));
        self.review(None, pr, &title)
    }

    /// `drover promote env` prepares the pull request; CI and merge as above.
    pub(super) fn promote(&mut self, env: &str) -> Result<(), Error> {
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
                self.review(Some(env), pr, &title)
            }
        }
    }

    /// CI on the open pull request (the work tree's current branch), then
    /// merge or close; the lines concern `env`, or the whole fleet.
    pub(super) fn review(&mut self, env: Option<&str>, pr: u32, title: &str) -> Result<(), Error> {
        let work = self.forge.work.clone();
        git(&work, &["fetch", "--quiet", "origin"])?;
        let loaded = config::load(&DirFiles::new(&work));
        let version = match (&loaded, env) {
            (Ok(cfg), Some(env)) => cfg.envs.get(env).map(|e| e.version.to_string()),
            _ => None,
        };
        let invalid = match loaded {
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
            let line = format!("PR #{pr} \"{title}\": `drover check --base main` passes; merged");
            match env {
                Some(env) => self.say(env, line),
                None => self.say_fleet(line),
            }
        } else {
            git(&work, &["branch", "--quiet", "-D", &branch])?;
            let line = format!(
                "PR #{pr} \"{title}\": `drover check --base main` refuses it, closed: {}",
                refusals.join("; ")
            );
            self.refused.push(crate::fleet::Event {
                at: self.now,
                kind: crate::fleet::EventKind::RefusedPullRequest,
                env: env.map(str::to_owned),
                cluster: None,
                version: version.unwrap_or_default(),
                message: format!("PR #{pr} \"{title}\": {}", refusals.join("; ")),
                commit: None,
            });
            match env {
                Some(env) => self.say(env, line),
                None => self.say_fleet(line),
            }
        }
        Ok(())
    }
}

impl Story {}

/// A window as `[start, end)`.
pub(super) type Interval = (DateTime<Utc>, DateTime<Utc>);

/// The periods in which a node may start (what `drover windows` lists)
/// overlapping `[from, until]`, plus one past it so a rollout waiting for it
/// can say when.
pub(super) fn windows_between(
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

/// A soak as the config writes it: `24h`.
pub(super) fn hours(d: Duration) -> String {
    match d.as_secs() {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        _ => humantime::format_duration(d).to_string(),
    }
}

pub(super) fn join(d: &[crate::diag::Diagnostic]) -> String {
    d.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

pub(super) fn uniform_version(sim: &Sim) -> Option<Version> {
    let nodes = sim.nodes();
    let first = nodes.first()?.version.clone()?;
    nodes
        .iter()
        .all(|n| n.version.as_ref() == Some(&first))
        .then_some(first)
}

/// The virtual clock read as a time of day (the story tells UTC times).
pub(super) trait NowUtc {
    fn now_utc(&self) -> DateTime<Utc>;
}

impl NowUtc for VirtualClock {
    fn now_utc(&self) -> DateTime<Utc> {
        crate::rollout::Clock::now(self)
    }
}
