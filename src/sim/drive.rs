//! Driving the engine against the sim: the [`Timeline`] of windows and gate
//! a simulated rollout runs under, and [`drive`], which jumps from one
//! interesting instant to the next until the rollout ends.

use super::{Sim, SimError};
use crate::gate::wave::{self, EnvEvidence, Wave, WaveGate};
use crate::rollout::{
    Clock, Decision, Engine, EngineError, Inputs, RolloutState, VirtualClock, WindowState,
};
use chrono::{DateTime, Utc};
use semver::Version;
use serde::Serialize;

/// When nodes may start: the windows and the gate as functions of time (the
/// simulated counterpart of what the agent asks of the window and the gate).
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// Windows as `[start, end)`, sorted; used when `calendar` is `None`.
    pub windows: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// The environment's windows, freezes and pause: when set, the windows
    /// come from it exactly as the agent computes them.
    pub calendar: Option<crate::window::Calendar>,
    /// The gate passes from this instant on; `None` = never.
    pub gate_from: Option<DateTime<Utc>>,
    /// What the gate waits on, when it is a wave's (`plan`): until it
    /// passes the rollout is `pending` with this message, as an agent whose
    /// wave waits is; `None`: `blocked`, the promotion gate not passed.
    pub gate_waits: Option<String>,
}

/// The wave gate (`crate::gate::wave`) as a function of time: the reports
/// of the environment's other clusters, read once up to the end of the
/// drive, judged at each instant on those made by then, as an agent
/// polling all along would have seen them.
#[derive(Debug, Clone)]
pub struct WaveSchedule {
    /// The environment.
    pub env: String,
    /// The cluster driven.
    pub cluster: String,
    /// The version it would start.
    pub version: Version,
    /// The environment's waves.
    pub waves: Vec<Wave>,
    /// `[rollout] failure_budget`.
    pub failure_budget: u32,
    /// Every report read, whenever it was made.
    pub evidence: EnvEvidence,
}

/// At most this many instants at which the wave gate changes are looked
/// at ahead of a drive (the reports of one environment are few).
const MAX_WAVE_CHANGES: usize = 1024;

impl WaveSchedule {
    /// The wave gate at `now`, on the reports made by then.
    pub fn at(&self, now: DateTime<Utc>) -> WaveGate {
        let evidence = EnvEvidence {
            confirmed: (self.evidence.confirmed.iter())
                .filter(|(_, t)| **t <= now)
                .map(|(c, t)| (c.clone(), *t))
                .collect(),
            failed: (self.evidence.failed.iter())
                .filter(|(_, f)| f.at <= now)
                .map(|(c, f)| (c.clone(), f.clone()))
                .collect(),
            notes: self.evidence.notes.clone(),
            held: self.evidence.held.clone(),
            latest: self.evidence.latest.clone(),
        };
        wave::judge(&wave::WaveRequest {
            env: &self.env,
            cluster: &self.cluster,
            version: &self.version,
            waves: &self.waves,
            failure_budget: self.failure_budget,
            evidence: &evidence,
            now,
        })
    }

    /// The next instant after `now` at which the answer may change: a
    /// report landing, or a soak passing.
    pub fn next_change(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let reports = (self.evidence.confirmed.values())
            .chain(self.evidence.failed.values().map(|f| &f.at))
            .copied();
        reports
            .chain(self.at(now).changes_at())
            .filter(|t| *t > now)
            .min()
    }

    /// The instants in `(from, until]` at which the answer changes, with
    /// the answer from then on (the story tells them).
    pub fn changes(
        &self,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Vec<(DateTime<Utc>, WaveGate)> {
        let mut out = Vec::new();
        let (mut now, mut last) = (from, self.at(from));
        for _ in 0..MAX_WAVE_CHANGES {
            let Some(t) = self.next_change(now).filter(|t| *t <= until) else {
                break;
            };
            let gate = self.at(t);
            if std::mem::discriminant(&gate) != std::mem::discriminant(&last) {
                out.push((t, gate.clone()));
            }
            (now, last) = (t, gate);
        }
        out
    }
}

impl Timeline {
    /// Always open, gate passed.
    pub fn always() -> Self {
        Timeline {
            windows: vec![(DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC)],
            calendar: None,
            gate_from: Some(DateTime::<Utc>::MIN_UTC),
            gate_waits: None,
        }
    }

    /// `calendar`'s first `max_windows` windows from `from`, the gate passed
    /// from `from` on: a forecast's schedule.
    pub fn from_calendar(
        calendar: &crate::window::Calendar,
        from: DateTime<Utc>,
        max_windows: usize,
    ) -> Self {
        Timeline {
            windows: calendar
                .periods(from)
                .take(max_windows)
                .map(|p| (p.start, p.end))
                .collect(),
            calendar: Some(calendar.clone()),
            gate_from: Some(from),
            gate_waits: None,
        }
    }

    /// The engine's inputs at `now`.
    pub fn inputs(&self, now: DateTime<Utc>) -> Inputs {
        let (window, patch_window) = match &self.calendar {
            Some(c) => c.inputs_at(now),
            None => (WindowState::from_intervals(&self.windows, now), None),
        };
        let passed = self.gate_from.is_some_and(|g| now >= g);
        let waiting = self.gate_waits.clone().filter(|_| !passed);
        let may_start = passed || waiting.is_some();
        Inputs {
            may_start,
            hold_reason: if may_start {
                String::new()
            } else {
                "promotion gate not passed".into()
            },
            waiting,
            window,
            patch_window,
            ..Default::default()
        }
    }

    /// Whether a node may start at `now`.
    pub fn allows(&self, now: DateTime<Utc>) -> bool {
        let i = self.inputs(now);
        i.may_start && i.waiting.is_none() && i.window.is_open()
    }

    fn next_change(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.gate_from.filter(|g| *g > now)
    }
}

/// How a [`drive`] ended.
#[derive(Debug, Clone, Serialize)]
pub struct DriveReport {
    /// The last decision.
    pub last: Decision,
    /// Virtual time when it ended.
    pub ended_at: DateTime<Utc>,
    /// Reconcile steps taken.
    pub steps: usize,
    /// It ended because nothing more could happen (not because of the horizon).
    pub settled: bool,
}

/// Run the engine against the sim from the clock's time until the rollout
/// is confirmed or failed with nothing in flight, nothing more can happen,
/// or `until`. Time jumps to the next event.
pub async fn drive(
    sim: &Sim,
    engine: &Engine<VirtualClock>,
    schedule: &Timeline,
    until: DateTime<Utc>,
) -> Result<DriveReport, EngineError<SimError>> {
    drive_in_waves(sim, engine, schedule, None, until).await
}

/// [`drive`] under the wave gate and the fleet-wide halt as well: `wave`
/// says, at each instant, whether the cluster's wave may start and whether
/// its environment is halted.
pub async fn drive_in_waves(
    sim: &Sim,
    engine: &Engine<VirtualClock>,
    schedule: &Timeline,
    wave: Option<&WaveSchedule>,
    until: DateTime<Utc>,
) -> Result<DriveReport, EngineError<SimError>> {
    let mut steps = 0;
    let mut same_instant = 0;
    let mut held = Vec::new();
    loop {
        let now = sim.clock.now();
        let gate = wave.map(|w| w.at(now));
        let (halted, waiting) = gate.as_ref().map_or((None, None), WaveGate::holds);
        let given = schedule.inputs(now);
        let inputs = Inputs {
            held: std::mem::take(&mut held),
            wave_blocker: gate
                .as_ref()
                .and_then(WaveGate::blocker)
                .or(given.wave_blocker),
            halted,
            waiting: waiting.or(given.waiting.clone()),
            ..given
        };
        let out = engine.reconcile(sim, &inputs).await?;
        held = out.held.clone();
        steps += 1;
        let finished = matches!(
            out.decision.state,
            RolloutState::Confirmed | RolloutState::Failed | RolloutState::Halted
        ) && sim.in_flight() == 0;
        if finished {
            return Ok(DriveReport {
                last: out.decision,
                ended_at: now,
                steps,
                settled: true,
            });
        }
        // Each extra step at one instant moves some node forward; the bound
        // only guards against a bug looping forever.
        if out.again && same_instant < 8 + 4 * out.decision.nodes as usize {
            same_instant += 1;
            continue;
        }
        same_instant = 0;
        let next = [
            sim.next_event(now),
            out.decision.wake_at,
            schedule.next_change(now),
            wave.and_then(|w| w.next_change(now)),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .min();
        match next {
            Some(t) if t <= until => sim.clock.set(t),
            _ => {
                return Ok(DriveReport {
                    last: out.decision,
                    ended_at: now,
                    steps,
                    settled: next.is_none(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::wave::Failure;
    use std::time::Duration;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn schedule(evidence: EnvEvidence) -> WaveSchedule {
        WaveSchedule {
            env: "production".into(),
            cluster: "us-1".into(),
            version: Version::new(1, 13, 2),
            waves: vec![
                Wave {
                    clusters: vec!["eu-1".into()],
                    soak: Duration::from_secs(24 * 3600),
                    max_concurrency: None,
                },
                Wave {
                    clusters: vec!["us-1".into()],
                    soak: Duration::ZERO,
                    max_concurrency: None,
                },
            ],
            failure_budget: 0,
            evidence,
        }
    }

    #[test]
    fn the_wave_gate_over_time_sees_each_report_only_once_it_is_made() {
        let mut ev = EnvEvidence::default();
        ev.confirmed
            .insert("eu-1".into(), t("2026-12-20T03:35:00Z"));
        let w = schedule(ev);
        let from = t("2026-12-12T09:00:00Z");
        assert!(matches!(w.at(from), WaveGate::Waiting { wave: 2, .. }));
        assert_eq!(
            w.changes(from, t("2026-12-31T00:00:00Z")),
            vec![
                (
                    t("2026-12-20T03:35:00Z"),
                    WaveGate::Soaking {
                        wave: 2,
                        passes_at: t("2026-12-21T03:35:00Z")
                    }
                ),
                (t("2026-12-21T03:35:00Z"), WaveGate::Open { wave: 2 }),
            ]
        );
        // Up to the horizon only.
        assert_eq!(w.changes(from, t("2026-12-20T00:00:00Z")), vec![]);
    }

    #[test]
    fn a_failure_halts_the_wave_from_the_instant_it_is_reported() {
        let mut ev = EnvEvidence::default();
        ev.confirmed
            .insert("eu-1".into(), t("2026-12-20T03:35:00Z"));
        ev.failed.insert(
            "eu-1".into(),
            Failure {
                at: t("2026-12-20T05:00:00Z"),
                message: "node n-1 failed".into(),
            },
        );
        let w = schedule(ev);
        assert!(matches!(
            w.at(t("2026-12-20T04:00:00Z")),
            WaveGate::Soaking { .. }
        ));
        assert!(matches!(
            w.at(t("2026-12-20T05:00:00Z")),
            WaveGate::Halted(_)
        ));
        assert_eq!(
            w.next_change(t("2026-12-20T04:00:00Z")),
            Some(t("2026-12-20T05:00:00Z"))
        );
    }
}
