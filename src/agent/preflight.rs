//! The preflight the agent runs before a window opens: the one check
//! `drover plan --preflight` runs ([`crate::preflight::check`]), on the
//! environment's selected nodes, [`LEAD`] before the next window opens and
//! again at most every [`EVERY`] until it does; told as an Event on the
//! status object (`PreflightBlockers`, a Warning, when it finds anything;
//! `PreflightClear` when not; `PreflightFailed` when the cluster could not
//! be read), the status's `preflight` summary and the metrics
//! `drover_preflight_blockers{kind}` and
//! `drover_preflight_timestamp_seconds`.
//!
//! Never on the control loop's path: a pass only starts the check as a
//! task of its own (bounded by [`READ_TIMEOUT`], its lists by
//! `preflight::read`'s page size and object bound) and picks up a finished
//! one's result; a pass or a halt never waits for it. A backend without a
//! cluster to read (the simulations) runs none.

use super::events::Severity;
use super::{rfc3339, Acting, Active, ClusterBackend};
use crate::preflight::{Checked, Kind};
use crate::window::WindowState;
use chrono::{DateTime, Utc};
use futures::FutureExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long before a window opens the first preflight runs.
pub const LEAD: Duration = Duration::from_secs(3600);
/// The shortest time between two preflights before the same window.
pub const EVERY: Duration = Duration::from_secs(15 * 60);
/// The longest one preflight may take (every list of it included).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The most findings an Event names (the status and the metric count all).
const MAX_NAMED: usize = 8;

/// A summary of the last preflight before a window.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightStatus {
    /// When it ran (RFC 3339).
    pub time: String,
    /// The window it ran before (RFC 3339 of its opening).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Selected nodes it read.
    #[serde(default)]
    pub nodes: u32,
    /// What it found, by kind (`pdb-never-allows`, `single-replica`, ...;
    /// kinds with none left out).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub blockers: std::collections::BTreeMap<String, u32>,
    /// Why it could not read the cluster, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One preflight's outcome: what it found, or why it could not read.
type Outcome = Result<Checked, String>;

/// The preflight's state across passes.
#[derive(Default)]
pub(super) struct Preflight {
    /// The last start: when, and the opening of the window it was for.
    last: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The check running, and the window it is for.
    running: Option<(DateTime<Utc>, tokio::task::JoinHandle<Outcome>)>,
}

/// The opening of the window a preflight is due for at `now`, if one is:
/// the next window opens within [`LEAD`], and none ran for it yet or the
/// last ran [`EVERY`] ago or more.
pub fn due(
    window: &WindowState,
    last: Option<(DateTime<Utc>, DateTime<Utc>)>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let opens = window
        .next_opens_at
        .filter(|_| window.opened_at.is_none())?;
    let ahead = (opens - now).to_std().ok()?;
    if ahead.is_zero() || ahead > LEAD {
        return None;
    }
    let fresh = last.is_some_and(|(at, for_window)| {
        for_window == opens && (now - at).to_std().is_ok_and(|d| d < EVERY)
    });
    (!fresh).then_some(opens)
}

/// The status's summary of `outcome`, run at `at` before the window opening `window`.
pub fn summary(outcome: &Outcome, at: DateTime<Utc>, window: DateTime<Utc>) -> PreflightStatus {
    let mut s = PreflightStatus {
        time: rfc3339(at),
        window: Some(rfc3339(window)),
        ..PreflightStatus::default()
    };
    match outcome {
        Ok(c) => {
            s.nodes = u32::try_from(c.nodes).unwrap_or(u32::MAX);
            s.blockers = c
                .counts()
                .into_iter()
                .map(|(k, n)| (k.as_str().to_string(), n))
                .collect();
        }
        Err(e) => s.error = Some(e.clone()),
    }
    s
}

/// The Event of `outcome`: its severity, reason and note.
pub fn event(outcome: &Outcome, window: DateTime<Utc>) -> (Severity, &'static str, String) {
    let before = format!("preflight before the window opening {}", rfc3339(window));
    match outcome {
        Err(e) => (
            Severity::Warning,
            "PreflightFailed",
            format!("{before}: the cluster could not be read: {e}"),
        ),
        Ok(c) if c.findings.is_empty() => (
            Severity::Normal,
            "PreflightClear",
            format!(
                "{before}: nothing found on {}",
                crate::terminal::count(c.nodes as u64, "selected node", "selected nodes")
            ),
        ),
        Ok(c) => {
            let kinds: Vec<String> = c
                .counts()
                .iter()
                .map(|(k, n)| format!("{n} {}", k.as_str()))
                .collect();
            let named: Vec<String> = c
                .findings
                .iter()
                .take(MAX_NAMED)
                .map(|f| format!("{} {} on {}", f.kind.as_str(), f.object, f.nodes.join(", ")))
                .collect();
            let more = c.findings.len().saturating_sub(MAX_NAMED);
            let more = if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            };
            (
                Severity::Warning,
                "PreflightBlockers",
                format!(
                    "{before}: {} on {} ({}): {}{more}; `drover plan --preflight` lists them \
                     with what to do",
                    crate::terminal::count(c.findings.len() as u64, "finding", "findings"),
                    crate::terminal::count(c.nodes as u64, "selected node", "selected nodes"),
                    kinds.join(", "),
                    named.join("; ")
                ),
            )
        }
    }
}

impl<B: ClusterBackend> Acting<B> {
    /// Tell a preflight that finished since the last pass (its Event and
    /// metrics; its summary is returned for the status, which `report.rs`
    /// alone writes), and start one when it is due; returns at once either
    /// way.
    pub(super) async fn preflight(
        &mut self,
        active: &Active,
        window: &WindowState,
    ) -> Option<PreflightStatus> {
        let now = self.clock.now();
        let finished = self
            .preflight
            .running
            .as_mut()
            .and_then(|(w, task)| task.now_or_never().map(|r| (*w, r)));
        let mut told = None;
        if let Some((for_window, result)) = finished {
            self.preflight.running = None;
            let outcome = result.unwrap_or_else(|e| Err(format!("the check stopped: {e}")));
            told = Some(self.tell_preflight(&outcome, now, for_window).await);
        }
        if self.preflight.running.is_some() {
            return told;
        }
        let Some(opens) = due(window, self.preflight.last, now) else {
            return told;
        };
        let Some(client) = self.backend.reader() else {
            return told;
        };
        self.preflight.last = Some((now, opens));
        let policy = crate::preflight::Policy::of(&active.env);
        let task = tokio::spawn(async move {
            match tokio::time::timeout(READ_TIMEOUT, crate::preflight::check(&client, &policy))
                .await
            {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err(format!(
                    "no answer within {}",
                    humantime::format_duration(READ_TIMEOUT)
                )),
            }
        });
        self.preflight.running = Some((opens, task));
        told
    }

    /// The Event and metrics of `outcome`; its summary for the status.
    async fn tell_preflight(
        &mut self,
        outcome: &Outcome,
        now: DateTime<Utc>,
        window: DateTime<Utc>,
    ) -> PreflightStatus {
        let (severity, reason, note) = event(outcome, window);
        self.edges
            .events
            .on_status(severity, reason, "Preflight", note)
            .await;
        let metrics = &self.edges.metrics;
        let counts = outcome.as_ref().map(Checked::counts).unwrap_or_default();
        for kind in Kind::ALL {
            let n = counts.get(&kind).copied().unwrap_or(0);
            metrics
                .preflight_blockers
                .get_or_create(&vec![("kind".to_string(), kind.as_str().to_string())])
                .set(i64::from(n));
        }
        metrics
            .preflight_time
            .set(now.timestamp_millis() as f64 / 1000.0);
        summary(outcome, now, window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        format!("2026-12-08T{s}:00Z").parse().unwrap()
    }

    fn closed_until(opens: &str) -> WindowState {
        WindowState {
            next_opens_at: Some(at(opens)),
            ..WindowState::default()
        }
    }

    #[test]
    fn due_within_the_lead_once_then_every_fifteen_minutes_and_never_in_a_window() {
        let w = closed_until("02:00");
        assert_eq!(due(&w, None, at("00:59")), None, "more than an hour ahead");
        assert_eq!(due(&w, None, at("01:00")), Some(at("02:00")));
        let ran = Some((at("01:00"), at("02:00")));
        assert_eq!(due(&w, ran, at("01:14")), None);
        assert_eq!(due(&w, ran, at("01:15")), Some(at("02:00")));
        // Another window (the config changed): at once.
        let other = closed_until("01:30");
        assert_eq!(due(&other, ran, at("01:05")), Some(at("01:30")));
        // Inside a window, or none ahead: never.
        let open = WindowState {
            opened_at: Some(at("02:00")),
            next_opens_at: Some(at("03:00")),
            ..WindowState::default()
        };
        assert_eq!(due(&open, None, at("02:30")), None);
        assert_eq!(due(&WindowState::default(), None, at("01:30")), None);
    }

    #[test]
    fn the_summary_and_event_count_by_kind_and_name_a_bounded_few() {
        let f = |kind, i: usize| crate::preflight::Finding {
            kind,
            object: format!("ns/o{i}"),
            nodes: vec!["n1".into()],
            why: String::new(),
            fix: String::new(),
        };
        let mut findings: Vec<_> = (0..10).map(|i| f(Kind::SingleReplica, i)).collect();
        findings.insert(0, f(Kind::PdbNeverAllows, 99));
        let c: Outcome = Ok(Checked { nodes: 3, findings });
        let s = summary(&c, at("01:00"), at("02:00"));
        assert_eq!(s.nodes, 3);
        assert_eq!(s.blockers.get("single-replica"), Some(&10));
        assert_eq!(s.blockers.get("pdb-never-allows"), Some(&1));
        let (sev, reason, note) = event(&c, at("02:00"));
        assert_eq!((sev, reason), (Severity::Warning, "PreflightBlockers"));
        assert!(note.contains("11 findings on 3 selected nodes"), "{note}");
        assert!(
            note.ends_with("; and 3 more; `drover plan --preflight` lists them with what to do"),
            "{note}"
        );
        let clear: Outcome = Ok(Checked {
            nodes: 3,
            findings: vec![],
        });
        assert_eq!(event(&clear, at("02:00")).1, "PreflightClear");
        assert!(summary(&clear, at("01:00"), at("02:00"))
            .blockers
            .is_empty());
        let failed: Outcome = Err("403".into());
        assert_eq!(event(&failed, at("02:00")).1, "PreflightFailed");
        assert_eq!(
            summary(&failed, at("01:00"), at("02:00")).error.as_deref(),
            Some("403")
        );
    }
}
