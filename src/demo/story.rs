//! The story's steps: pull requests merged after review, each cluster's agent
//! playing its passes against its simulated nodes, and the invariants checked
//! at the end.

use super::forge::{short, Forge};
use super::{ts, ClusterRow, Confirmed, Error, Line, Options, Report};
use crate::admit;
use crate::config::{self, DirFiles};
use crate::gate::{wave, Decision, Reason};
use crate::promote::{self, git, git_at, Choice};
use crate::rollout::RolloutState;
use crate::rollout::{Engine, Labels, Policy, VirtualClock};
use crate::sim::{self, EventKind, Pdb, Pod, Sim, SimNode};
use crate::source::{Source, SourceConfig};
use crate::status::{self, PublishOptions, StatusReport};
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

    /// Let every agent work until `t`.
    pub(super) async fn advance_to(&mut self, t: &str) -> Result<(), Error> {
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
    pub(super) async fn tick(&mut self) -> Result<(), Error> {
        let now = self.now;
        self.advance_to(&now.to_rfc3339()).await
    }

    /// The agent's loop for one cluster from its clock to `until`: fetch,
    /// load, gate, window, engine, status report. The config only changes
    /// between calls (pull requests are merged at story instants), so one
    /// fetch per call sees every change an agent polling all along would.
    pub(super) async fn run_agent(&mut self, i: usize, until: DateTime<Utc>) -> Result<(), Error> {
        let (env, cluster) = (self.agents[i].env.clone(), self.agents[i].cluster.clone());
        let at = self.agents[i].clock.now_utc();
        let fetched = self.agents[i].source.fetch()?;
        let previous = self.agents[i].applied.as_ref().map(|(v, _)| v.clone());
        // The same admission as the agent's: trust (the demo's commits are
        // unsigned, so `off`), config, then the gate commit by commit.
        let (env_cfg, waves, decision, adopt) = {
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
            // The cluster moves in its wave's window when the wave has one.
            let Some(env_cfg) = head_cfg
                .config
                .envs
                .get(&env)
                .map(|e| e.for_cluster(&cluster))
            else {
                return Err(Error::Config(format!("no environment {env}")));
            };
            let waves = wave::waves(&head_cfg.config, &env);
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
                        signers: crate::trust::Signers::NONE,
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
            (env_cfg, waves, decision, adopt)
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
                    self.say_cluster(at, i, format!("agent refuses config {}: {r}", short(fetched.head)));
                    return self.idle_until(i, until);
                }
                (_, true) if adopt => self.say_cluster(
                    at,
                    i,
                    format!(
                        "agent adopts the cluster at config {}: every node already runs the pinned {}, so nothing moves and no gate applies",
                        short(fetched.head),
                        env_cfg.version
                    ),
                ),
                (_, true) => {
                    let then = if waves.len() > 1 {
                        let w = self.wave_schedule(i, &env_cfg, &waves, fetched.head, until)?;
                        match w.at(at) {
                            wave::WaveGate::Open { wave } => {
                                format!("wave {wave}: waiting for its next window")
                            }
                            gate => gate.to_string(),
                        }
                    } else {
                        "waiting for the next window".to_owned()
                    };
                    self.say_cluster(
                        at,
                        i,
                        format!(
                            "agent accepts config {} pinning {}; {then}",
                            short(fetched.head),
                            env_cfg.version
                        ),
                    )
                }
                _ => {}
            }
            self.agents[i].source.accept(fetched.head)?;
            self.agents[i].applied = Some((env_cfg.version.clone(), fetched.head));
        }

        let calendar = window::Calendar::of(&env_cfg)?;
        let horizon_windows = windows_between(&calendar, at, until);
        // The wave gate and the halt, from the reports of the environment's
        // other clusters (the agents before this one ran to `until`).
        let wave = match gate_from {
            Some(_) if !adopt => {
                Some(self.wave_schedule(i, &env_cfg, &waves, fetched.head, until)?)
            }
            _ => None,
        };
        // With waves, the story stops where the wave gate changes, says
        // why, and reports from there, as the agent would on its next poll.
        let mut stops = vec![];
        let moves = uniform_version(&self.agents[i].sim).as_ref() != Some(&env_cfg.version);
        if let Some(w) = wave.as_ref().filter(|_| waves.len() > 1 && moves) {
            stops.push((at, None));
            stops.extend(w.changes(at, until).into_iter().map(|(t, g)| (t, Some(g))));
        }
        stops.push((until, None));
        let sim_schedule = sim::Timeline {
            windows: horizon_windows.clone(),
            calendar: Some(calendar),
            gate_from,
            gate_waits: None,
        };
        let engine = Engine::new(
            Policy::from_env(&env_cfg),
            Labels {
                env: env.clone(),
                commit: fetched.head.to_string(),
            },
            self.agents[i].clock.clone(),
        );
        for (stop, gate) in stops {
            if let Some(gate) = gate {
                let line = self.wave_line(&env_cfg, &waves, &gate);
                self.say_cluster(stop, i, line);
            }
            let report = sim::drive_in_waves(
                &self.agents[i].sim,
                &engine,
                &sim_schedule,
                wave.as_ref(),
                stop,
            )
            .await
            .map_err(|e| Error::Engine(e.to_string()))?;
            self.tell_sim_events(i, &env_cfg.version, &horizon_windows);
            self.publish(i, &env_cfg.version, fetched.head, &report)?;
        }
        self.idle_until(i, until)
    }

    /// Push the cluster's status report when its state (or, waiting on a
    /// wave, what it waits on) changed since the last one.
    fn publish(
        &mut self,
        i: usize,
        version: &Version,
        head: git2::Oid,
        report: &sim::DriveReport,
    ) -> Result<(), Error> {
        let (env, cluster) = (self.agents[i].env.clone(), self.agents[i].cluster.clone());
        let state = report.last.state;
        let key = (state, version.clone());
        let same = self.agents[i].last_report.as_ref() == Some(&key)
            && (state != RolloutState::Pending
                || self.agents[i].last_message == report.last.message);
        if same {
            return Ok(());
        }
        let line = StatusReport {
            env: env.clone(),
            cluster: cluster.clone(),
            config_commit: head.to_string(),
            version: version.clone(),
            state,
            since: report.ended_at,
            nodes: report.last.nodes,
            nodes_at_version: report.last.nodes_at_version,
            message: report.last.message.clone(),
            detail: Default::default(),
        };
        // Committed at the story's time, not today's: evidence counts from
        // its commit's time, and the story must read the same any day.
        self.agents[i].publish.commit_time = Some(report.ended_at);
        let source = &self.agents[i].source;
        let published = status::publish(source, &line, &self.agents[i].publish)?;
        self.agents[i].last_report = Some(key);
        self.agents[i].last_message = report.last.message.clone();
        if published.commit.is_some() {
            let branch = status::cluster_branch(
                &self.agents[i].source.config().status_branch,
                &env,
                &cluster,
            );
            let what = match state {
                RolloutState::Confirmed => format!(
                    "all {} nodes Ready at {}: confirmation signed with {cluster}'s key, pushed to {branch}",
                    line.nodes, line.version
                ),
                other => format!(
                    "{} {} ({}/{} nodes at version) reported to {branch} {}",
                    other.as_str(),
                    line.version,
                    line.nodes_at_version,
                    line.nodes,
                    line.message
                ),
            };
            self.say_cluster(report.ended_at, i, what);
        }
        Ok(())
    }

    /// The wave gate of agent `i` for `env`'s version: the reports of its
    /// environment's clusters read by the one reader up to `until`, by the
    /// policy in force at `applied`.
    pub(super) fn wave_schedule(
        &self,
        i: usize,
        env: &crate::config::EnvConfig,
        waves: &[wave::Wave],
        applied: git2::Oid,
        until: DateTime<Utc>,
    ) -> Result<sim::WaveSchedule, Error> {
        let a = &self.agents[i];
        let evidence = admit::env_evidence(
            a.source.repo(),
            applied,
            &a.env,
            Some(&a.cluster),
            &env.version,
            until,
        )?;
        Ok(sim::WaveSchedule {
            env: a.env.clone(),
            cluster: a.cluster.clone(),
            version: env.version.clone(),
            waves: waves.to_vec(),
            failure_budget: env.rollout.failure_budget,
            evidence,
        })
    }

    /// What a change of the wave gate means, in the story's words (the
    /// report pushed next says what the cluster waits on then).
    fn wave_line(
        &self,
        env: &crate::config::EnvConfig,
        waves: &[wave::Wave],
        gate: &wave::WaveGate,
    ) -> String {
        let prev = |w: &usize| {
            let p = waves.get(w.wrapping_sub(2));
            (
                p.map(|p| p.clusters.join(", ")).unwrap_or_default(),
                p.map(|p| hours(p.soak)).unwrap_or_default(),
            )
        };
        match gate {
            wave::WaveGate::Soaking { wave, .. } => {
                let (clusters, soak) = prev(wave);
                format!(
                    "wave {} ({clusters}) has confirmed {} in signed reports; wave {wave} waits {soak} for its soak",
                    wave - 1,
                    env.version
                )
            }
            wave::WaveGate::Open { wave } if *wave > 1 => {
                let (clusters, soak) = prev(wave);
                format!(
                    "wave {} ({clusters})'s confirmations of {} are {soak} old: wave {wave} may start it in its window",
                    wave - 1,
                    env.version
                )
            }
            other => other.to_string(),
        }
    }

    pub(super) fn idle_until(&mut self, i: usize, until: DateTime<Utc>) -> Result<(), Error> {
        self.agents[i].clock.set(until);
        Ok(())
    }

    /// Turn new sim events into story lines: window use and node counts.
    pub(super) fn tell_sim_events(&mut self, i: usize, target: &Version, windows: &[Interval]) {
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
            self.say_cluster(
                at,
                i,
                format!(
                    "{opened} open; cordon, drain ({} through PDB \"web\"), upgrade {} to {target}, one at a time",
                    crate::terminal::count(evictions as u64, "eviction", "evictions"),
                    crate::terminal::count(starts as u64, "node", "nodes")
                ),
            );
        }
        for e in &new {
            if let EventKind::RollbackStart(v) = &e.kind {
                self.say_cluster(
                    e.at,
                    i,
                    format!(
                        "{} failed its health checks at {target}: cordon, drain, roll it back to {v} (on_failure = \"rollback\")",
                        e.node
                    ),
                );
            }
        }
        for v in self.agents[i].sim.violations() {
            if !self.violations.contains(&v) {
                self.violations.push(format!("{cluster}: {v}"));
            }
        }
    }

    pub(super) fn finish(mut self) -> Result<Report, Error> {
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
            let mut evidence = admit::GitEvidence::new(a.source.repo(), applied, self.now);
            let head = admit::snapshot(a.source.repo(), applied, self.now)?
                .map_err(|d| Error::Config(join(&d)))?;
            let conf = evidence.confirmations(&head.policy)?;
            let mut confirmed: Vec<Confirmed> = conf
                .for_env(&a.env)
                .into_iter()
                .filter(|(c, _, _)| *c == a.cluster)
                .map(|(_, v, t)| Confirmed {
                    version: v.to_string(),
                    at: t,
                })
                .collect();
            confirmed.sort_by_key(|c| c.at);
            rows.push(ClusterRow {
                env: a.env.clone(),
                cluster: a.cluster.clone(),
                nodes: a.sim.nodes().len(),
                versions,
                state: a
                    .last_report
                    .as_ref()
                    .map(|(s, v)| format!("{} {v}", s.as_str())),
                confirmed,
            });
        }
        self.check_waves(&rows)?;
        if peak > 1 {
            self.violations.push(format!(
                "{peak} nodes were unavailable at once; max_unavailable is 1"
            ));
        }
        let (fleet, mut timeline) = self.forge.fleet(self.now)?;
        timeline.events.append(&mut self.refused);
        timeline.events.sort_by_key(|e| e.at);
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

impl Story {
    /// The wave invariant: no cluster of wave N started a version before
    /// every cluster of wave N−1 confirmed it at least that wave's soak
    /// before (the confirmations as the gate reads them, `rows`).
    fn check_waves(&mut self, rows: &[ClusterRow]) -> Result<(), Error> {
        let cfg = self.forge.config()?;
        let confirmed = |cluster: &str, v: &Version| {
            rows.iter()
                .filter(|r| r.cluster == cluster)
                .flat_map(|r| r.confirmed.iter())
                .find(|c| c.version == v.to_string())
                .map(|c| c.at)
        };
        for (env, cluster, at, v) in &self.starts {
            let waves = wave::waves(&cfg, env);
            let Some(n) = waves.iter().position(|w| w.clusters.contains(cluster)) else {
                continue;
            };
            let Some(prev) = n.checked_sub(1).map(|p| &waves[p]) else {
                continue;
            };
            let soak = chrono::Duration::from_std(prev.soak).unwrap_or(chrono::Duration::MAX);
            for c in &prev.clusters {
                let soaked = confirmed(c, v).and_then(|t| t.checked_add_signed(soak));
                if soaked.is_none_or(|t| t > *at) {
                    self.violations.push(format!(
                        "{cluster} (wave {}) started {v} at {} before {c} (wave {n}) had confirmed it {} before",
                        n + 1,
                        ts(*at),
                        hours(prev.soak)
                    ));
                }
            }
        }
        Ok(())
    }
}

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
fn hours(d: Duration) -> String {
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

pub(super) trait NowUtc {
    fn now_utc(&self) -> DateTime<Utc>;
}

impl NowUtc for VirtualClock {
    fn now_utc(&self) -> DateTime<Utc> {
        crate::rollout::Clock::now(self)
    }
}
