//! The story's time passing: each cluster's agent playing its passes up to
//! a story instant, one pass at a time: fetch, the gate
//! and the wave gate, the windows, the rollout engine against its simulated
//! nodes, and its signed status reports pushed to its own branch; what its
//! simulated cluster did, told as the story's lines.

use super::forge::short;
use super::story::{uniform_version, windows_between, Interval, NowUtc, Story};
use super::{ts, Error};
use crate::admit;
use crate::gate::{wave, Decision, Reason};
use crate::rollout::RolloutState;
use crate::rollout::{Engine, Labels, Policy};
use crate::sim::{self, EventKind};
use crate::status::{self, StatusReport};
use crate::window;
use chrono::{DateTime, Utc};
use semver::Version;

impl Story {
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
    pub(super) fn publish(
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
        // Told as an agent tells it: the state, its message and blocker.
        let told = crate::agent::told::told(&crate::agent::told::Situation {
            applied: Some(crate::agent::told::Applied {
                version,
                revoked: None,
                state,
                nodes: report.last.nodes,
                nodes_at_version: report.last.nodes_at_version,
                message: &report.last.message,
                blocker: report.last.blocker,
                waiting: &[],
            }),
            refused: None,
        });
        let line = told.report(StatusReport {
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
        });
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
}
