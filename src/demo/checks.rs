//! What the story checks at its end: every invariant over what the
//! simulated clusters did (no node started outside its window or past its
//! gate, every cluster at its pin), and the waves' order, each wave
//! started only after the one before had confirmed and soaked.

use super::story::{hours, join, Story};
use super::{ts, ClusterRow, Confirmed, Error, Report};
use crate::admit;
use crate::gate::wave;
use crate::sim::{self};
use chrono::{DateTime, Utc};
use semver::Version;
use std::collections::BTreeMap;

impl Story {
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
    pub(super) fn wave_line(
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

    /// The wave invariant: no cluster of wave N started a version before
    /// every cluster of wave N−1 confirmed it at least that wave's soak
    /// before (the confirmations as the gate reads them, `rows`).
    pub(super) fn check_waves(&mut self, rows: &[ClusterRow]) -> Result<(), Error> {
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
