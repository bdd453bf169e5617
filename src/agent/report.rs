//! Stage 4, report: one function from a decision and its window to what the
//! agent tells — the CRD status (`DroverStatus.status`), the status report
//! (the status branch file), Events and metrics — handed to the term's
//! writers (`crd::StatusWriter`, `reporter::Reporter`, the Events
//! publisher), which carry them out off the control loop: a pass never
//! waits for git, an Event or a status write, except the one write that
//! must be durable before the agent acts on a newly applied commit.

use super::conditions;
use super::crd::{Condition, DroverStatusStatus, FetchRecord, Refused, SeenFailure};
use super::events::Severity;
use super::health;
use super::reporter::{Outgoing, PushHealth, Verdict};
use super::told;
use super::{rfc3339, Acting, Active, ClusterBackend};
use crate::cluster::{NodeView, ProgressState};
use crate::rollout::{Outcome, RolloutState, WindowState};
use crate::status::StatusReport;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};

use super::conditions::{PUSH_REFUSED, REPORT_PUSHED};

/// What the cluster is told, as this process holds it: the status object's
/// content (`DroverStatus.status`) and the last telling of each channel.
/// `report.rs` is its one owner: its fields are private here, and every
/// other stage hands in its own part through one method named after it
/// (the fetch's outcome, the head, the wave gate's evidence, admission's
/// answer through `recorded.rs`, a status read back at a term's start).
#[derive(Default)]
pub(super) struct Telling {
    /// The CRD status as this term wants it.
    status: DroverStatusStatus,
    /// The version the refused head pins (reported as `refused`).
    refused_version: Option<semver::Version>,
    /// The last state told ([`told::Told::transition`]) in this process,
    /// so each transition gets one Event.
    seen: Option<told::Transition>,
    /// The newest status report handed to the reporter.
    last_published: Option<StatusReport>,
    /// Whether the window was open at the last reconcile of this term.
    window_seen: Option<bool>,
    /// (node, annotation) of earlier releases' annotations already named
    /// (`migrate.rs`): each is named once.
    named: BTreeSet<(String, String)>,
}

impl Telling {
    /// The status as this term wants it.
    pub(super) fn status(&self) -> &DroverStatusStatus {
        &self.status
    }

    /// The state of the newest status report handed to the reporter.
    pub(super) fn published_state(&self) -> Option<RolloutState> {
        self.last_published.as_ref().map(|r| r.state)
    }

    /// A new term: everything is told afresh to its writers.
    pub(super) fn new_term(&mut self) {
        self.last_published = None;
        self.window_seen = None;
    }

    /// The status read back (a term's start, another replica's write) is
    /// the one to go on from; true when it names another applied commit.
    pub(super) fn adopt(&mut self, status: DroverStatusStatus) -> bool {
        let moved = status.last_applied_commit != self.status.last_applied_commit;
        self.status = status;
        moved
    }

    /// A write of `status` is stored: it is the status now (`recorded.rs`).
    pub(super) fn stored(&mut self, status: DroverStatusStatus) {
        self.status = status;
    }

    /// The newest head's refusal and the version it pins (`recorded.rs`).
    pub(super) fn refused(&mut self, refused: Option<Refused>, version: Option<semver::Version>) {
        self.status.refused = refused;
        self.refused_version = version;
    }

    /// The newest head fetched (the pass).
    pub(super) fn head(&mut self, head: git2::Oid) {
        self.status.head_commit = Some(head.to_string());
    }

    /// How the last fetch ended (`fetch.rs`).
    pub(super) fn fetched(&mut self, record: FetchRecord) {
        self.status.last_fetch = Some(record);
    }

    /// What the wave gate read and remembers (`waves.rs`).
    pub(super) fn evidence(
        &mut self,
        failures_seen: Vec<SeenFailure>,
        held: Option<String>,
        halted_by: Vec<String>,
    ) {
        self.status.failures_seen = failures_seen;
        self.status.evidence_held = held;
        self.status.halted_by = halted_by;
    }

    /// Whether `annotation` on `node` is named for the first time (`migrate.rs`).
    pub(super) fn first_naming(&mut self, node: &str, annotation: &str) -> bool {
        self.named
            .insert((node.to_string(), annotation.to_string()))
    }

    /// Forget what was named once more than `max` were (a bound on memory
    /// that a forger's writes could grow).
    pub(super) fn bound_named(&mut self, max: usize) {
        if self.named.len() > max {
            self.named = BTreeSet::new();
        }
    }
}

impl<B: ClusterBackend> Acting<B> {
    /// Tell what a reconcile decided: Events for its actions and for state
    /// and window changes, the CRD status, and the status report to push.
    pub(super) async fn report(
        &mut self,
        active: &Active,
        outcome: &Outcome,
        window: &WindowState,
        observed: &[NodeView],
        now: DateTime<Utc>,
    ) {
        // Started off the loop when due, told once it has finished.
        if let Some(p) = self.preflight(active, window).await {
            self.told.status.preflight = Some(p);
        }
        let d = &outcome.decision;
        for a in &d.actions {
            health::count_failure(&self.edges.metrics, &self.cfg.env, a);
            self.durations(a, observed, now);
            self.edges.events.on_action(a).await;
        }
        // A budget pacing a drain is normal; it becomes a Warning
        // (DrainBlocked) only when the drain times out.
        for (node, msg) in &outcome.evictions_blocked {
            self.edges
                .events
                .on_node(
                    node,
                    Severity::Normal,
                    "EvictionRefused",
                    "Evict",
                    msg.clone(),
                )
                .await;
        }
        // Every rung beyond `evict` is evidence: a Warning on the node,
        // counted, and in the report's detail from the node's record.
        for (node, taken) in &outcome.drain_rungs {
            self.edges
                .metrics
                .drain_rung(&self.cfg.env, taken.rung.as_str(), &taken.rule);
            self.edges
                .events
                .on_node(
                    node,
                    Severity::Warning,
                    "DrainRung",
                    "Drain",
                    format!(
                        "drain rule {}: {}: {}",
                        taken.rule,
                        taken.rung.as_str(),
                        taken.detail
                    ),
                )
                .await;
        }
        let waiting = super::blocked::waiting(d, observed, &active.env.version);
        let told = told::told(&told::Situation {
            applied: Some(told::Applied {
                version: &active.env.version,
                revoked: active.revoked.as_deref(),
                state: d.state,
                nodes: d.nodes,
                nodes_at_version: d.nodes_at_version,
                message: &d.message,
                blocker: d.blocker,
                waiting: &waiting,
            }),
            refused: self.refused(),
        });
        self.tell(&told, now).await;
        // The first observation of a term is no transition (a restart would repeat it).
        let was_open = self.told.window_seen.replace(window.opened_at.is_some());
        if was_open.is_some_and(|w| w != window.opened_at.is_some()) {
            let note = match (window.closes_at, window.next_opens_at) {
                // Overlapping windows followed a year ahead: no end known.
                (Some(end), _) if window.continues => {
                    format!(
                        "maintenance window open, no close before {}",
                        rfc3339(followed_to(end))
                    )
                }
                (Some(end), _) => format!("maintenance window open until {}", rfc3339(end)),
                (None, Some(next)) => {
                    format!("maintenance window closed; next opens {}", rfc3339(next))
                }
                (None, None) => "maintenance window closed".to_string(),
            };
            let reason = if window.opened_at.is_some() {
                "WindowOpened"
            } else {
                "WindowClosed"
            };
            self.edges
                .events
                .on_status(Severity::Normal, reason, "Window", note)
                .await;
        }
        self.told.status.consent_overdue =
            super::consent::tell(&self.edges.metrics, &d.consent_overdue);
        self.told.status.target = Some(active.env.version.to_string());
        self.told.status.nodes = d.nodes;
        self.told.status.nodes_at_version = d.nodes_at_version;
        let counts = NodeCounts::of(observed, &active.env.version);
        counts.write(&mut self.told.status);
        self.told.status.at_version = Some(format!("{}/{}", d.nodes_at_version, d.nodes));
        self.told.status.window_open = window.opened_at.is_some();
        self.told.status.next_window = next_window(window);
        self.told.status.reporter = Some(self.cfg.identity.clone());
        let since = self
            .told
            .status
            .since
            .as_deref()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or(now);
        // The report tells what the status tells (`told`): for `refused`
        // its `version` is the refused one and `config_commit` the commit
        // the cluster stays on (docs/design.md §5).
        let report = told.report(StatusReport {
            env: self.cfg.env.clone(),
            cluster: self.cfg.cluster.clone(),
            config_commit: active.commit.to_string(),
            version: active.env.version.clone(),
            state: d.state,
            since,
            nodes: d.nodes,
            nodes_at_version: d.nodes_at_version,
            message: d.message.clone(),
            detail: crate::status::NodeDetail::of(observed, &active.env.version)
                .with_consent_overdue(&d.consent_overdue),
        });
        let same = self.told.last_published.as_ref().is_some_and(|p| {
            StatusReport {
                since: p.since,
                ..report.clone()
            } == *p
        });
        if !same {
            self.told.last_published = Some(report.clone());
            if let Some(t) = &self.term.tasks {
                t.reporter.offer(Outgoing {
                    report,
                    branch: active.status_branch.clone(),
                    progress_interval: active.progress_interval,
                });
            }
        }
    }

    /// No applied config: the state says why (refused, or nothing trusted yet).
    pub(super) async fn report_unconfigured(&mut self) {
        let told = told::told(&told::Situation {
            applied: None,
            refused: self.refused(),
        });
        let now = self.clock.now();
        self.tell(&told, now).await;
    }

    /// The newest head's refusal, with the version it pins when known.
    fn refused(&self) -> Option<told::Refusal<'_>> {
        self.told.status.refused.as_ref().map(|r| told::Refusal {
            refused: r,
            version: self.told.refused_version.as_ref(),
        })
    }

    /// Tell `told` everywhere but the report (which the caller builds from
    /// it): the metric, the status's state, message and `since` (when the
    /// state began, so a refusal kept for days keeps its `since`), and an
    /// Event when it is a transition.
    async fn tell(&mut self, told: &told::Told, now: DateTime<Utc>) {
        let before = self.told.seen.clone().or_else(|| {
            // A new term: what the status object already says is no news.
            let state = RolloutState::parse(self.told.status.state.as_deref()?)?;
            let refused = self
                .told
                .status
                .refused
                .as_ref()
                .filter(|_| state == RolloutState::Refused)
                .map(|r| (r.commit.clone(), r.stage.clone(), r.reason.clone()));
            Some((state, refused))
        });
        if before.as_ref() != Some(&told.transition) {
            let severity = match told.warns() {
                true => Severity::Warning,
                false => Severity::Normal,
            };
            self.edges
                .events
                .on_status(severity, &told.event_reason(), "Reconcile", told.note())
                .await;
        }
        self.told.seen = Some(told.transition.clone());
        told.write_status(&mut self.told.status, &rfc3339(now));
        told.write_metrics(&self.edges.metrics, &self.told.status, now);
    }

    pub(super) fn node_metrics(&self, nodes: &[NodeView]) {
        if nodes.is_empty() {
            return;
        }
        let mut counts: BTreeMap<(String, String), i64> = BTreeMap::new();
        for n in nodes {
            let version = n
                .version
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "unknown".into());
            let state = match &n.progress {
                Ok(Some(p)) => p.state.as_str(),
                Err(_) => "unreadable",
                Ok(None) if n.ready => "ready",
                Ok(None) => "notready",
            };
            *counts.entry((version, state.to_string())).or_default() += 1;
        }
        self.edges.metrics.set_nodes(&counts);
    }

    pub(super) fn durations(
        &self,
        action: &crate::rollout::Action,
        observed: &[NodeView],
        now: DateTime<Utc>,
    ) {
        use crate::rollout::Action;
        let secs = |since: DateTime<Utc>| (now - since).num_milliseconds().max(0) as f64 / 1000.0;
        match action {
            Action::StartUpgrade { progress, .. } => {
                self.edges
                    .metrics
                    .drain_duration
                    .observe(secs(progress.started_at));
            }
            Action::Complete { node, .. } | Action::Watch { node, .. } => {
                let started =
                    observed
                        .iter()
                        .find(|n| n.name == *node)
                        .and_then(|n| match &n.progress {
                            Ok(Some(p)) if p.state == ProgressState::Upgrading => {
                                Some(p.started_at)
                            }
                            _ => None,
                        });
                if let Some(s) = started {
                    self.edges.metrics.upgrade_duration.observe(secs(s));
                }
            }
            _ => {}
        }
    }

    /// Hand the pass's CRD status to the term's writer; returns at once.
    pub(super) fn hand_over(&mut self) {
        let Some(t) = &self.term.tasks else { return };
        let now = rfc3339(self.clock.now());
        let previous = self
            .told
            .status
            .conditions
            .iter()
            .find(|c| c.kind == REPORT_PUSHED)
            .cloned();
        let health = t.reporter.health();
        if let Some(c) = health.commit.as_ref() {
            self.told.status.last_report_commit = Some(c.clone());
        }
        if let Some(c) = report_condition(&health, previous.as_ref(), &now) {
            self.told
                .status
                .conditions
                .retain(|c| c.kind != REPORT_PUSHED);
            self.told.status.conditions.push(c);
        }
        let mut status = std::mem::take(&mut self.told.status);
        self.assemble_conditions(&mut status);
        self.told.status = status;
        let Some(t) = &self.term.tasks else { return };
        t.writer.offer(&self.told.status);
    }

    /// The status's kstatus conditions and observed generation, from what
    /// the status says (the one computation: [`conditions::conditions`]).
    pub(super) fn assemble_conditions(&self, status: &mut DroverStatusStatus) {
        let generation = self.status_object.generation();
        let now = rfc3339(self.clock.now());
        let facts = conditions::Facts::of(status);
        status.conditions = conditions::conditions(&facts, generation, &status.conditions, &now);
        status.observed_generation = generation;
    }

    /// When a write found that another replica wrote the status since this
    /// term read it: take what it left as this term's starting point.
    pub(super) fn adopt_superseded(&mut self) {
        let obj = self
            .term
            .tasks
            .as_ref()
            .and_then(|t| t.writer.take_superseded());
        if let Some(obj) = obj {
            self.adopt_status(&obj);
        }
    }
}

/// The node counts of the status, as scalars tools read without code
/// (kstatus, Argo CD's Lua health, `kubectl wait --for=jsonpath`, a fleet
/// hub's status feedback).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// At the target version.
    pub up_to_date: u32,
    /// Ready.
    pub ready: u32,
    /// Out of service by drover.
    pub in_flight: u32,
}

impl NodeCounts {
    /// The counts of the selected nodes `observed`, for `target`.
    pub fn of(observed: &[crate::cluster::NodeView], target: &semver::Version) -> Self {
        let n = |f: &dyn Fn(&crate::cluster::NodeView) -> bool| {
            u32::try_from(observed.iter().filter(|v| f(v)).count()).unwrap_or(u32::MAX)
        };
        NodeCounts {
            up_to_date: n(&|v| v.version.as_ref() == Some(target)),
            ready: n(&|v| v.ready),
            in_flight: n(&|v| matches!(&v.progress, Ok(Some(p)) if p.state.in_flight())),
        }
    }

    /// Write them into `status`.
    pub fn write(self, status: &mut super::crd::DroverStatusStatus) {
        status.up_to_date_nodes = self.up_to_date;
        status.ready_nodes = self.ready;
        status.in_flight_nodes = self.in_flight;
    }
}

/// The `ReportPushed` condition for `health`, keeping `previous`'s
/// transition time while its status holds; `None` before any attempt.
pub(super) fn report_condition(
    health: &PushHealth,
    previous: Option<&Condition>,
    now: &str,
) -> Option<Condition> {
    let (status, reason, message) = match health.last.as_ref()? {
        Verdict::Pushed => (
            "True",
            "Pushed",
            "the status branch holds the latest report".to_string(),
        ),
        Verdict::Failing(m) => (
            "False",
            "Unreachable",
            format!(
                "{} waiting, retried with backoff: {m}",
                crate::terminal::count(health.waiting as u64, "report", "reports")
            ),
        ),
        Verdict::Refused { branch, message } => (
            "False",
            PUSH_REFUSED,
            format!(
                "the git server refuses the status report on branch {branch} ({} \
                 waiting; not retried until the next report or five poll intervals): {message}",
                crate::terminal::count(health.waiting as u64, "report", "reports")
            ),
        ),
    };
    let since = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => now.to_string(),
    };
    Some(Condition {
        kind: REPORT_PUSHED.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: since,
        observed_generation: None,
    })
}

/// What the status's `nextWindow` says of `window`.
fn next_window(window: &WindowState) -> Option<String> {
    match (window.closes_at, window.next_opens_at) {
        (Some(end), _) if window.continues => Some(format!(
            "open, no close before {}",
            rfc3339(followed_to(end))
        )),
        (Some(end), _) => Some(format!("open until {}", rfc3339(end))),
        (None, Some(start)) => Some(rfc3339(start)),
        (None, None) => None,
    }
}

/// How far an open window followed to the horizon without a close is
/// said to be open: the start of the UTC day of `end`. The horizon is
/// counted from the instant asked about, so `end` moves with every pass;
/// said to the instant, an idle agent's status changed at every tick and
/// was written twice a minute (issue 36: 2.00 requests per idle minute at
/// 1,000 nodes, both status patches). An earlier instant is as true ("no
/// close before"), and this one changes once a day.
fn followed_to(end: DateTime<Utc>) -> DateTime<Utc> {
    end.date_naive()
        .and_hms_opt(0, 0, 0)
        .map_or(end, |d| d.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_always_open_windows_status_text_does_not_move_with_each_pass() {
        // Every 6 h for 6 h: open without end, followed to the horizon.
        let cal = crate::window::Calendar::new(
            &[crate::window::WindowSpec {
                schedule: "0 */6 * * *".into(),
                duration: std::time::Duration::from_secs(6 * 3600),
                timezone: chrono_tz::Tz::UTC,
            }],
            &[],
            false,
        )
        .unwrap();
        let at = |s: &str| {
            cal.state_at(
                s.parse::<DateTime<Utc>>().unwrap(),
                crate::window::Change::Other,
            )
        };
        let (a, b) = (at("2026-12-06T09:30:00Z"), at("2026-12-06T09:30:30Z"));
        assert!(a.continues && a.closes_at != b.closes_at, "{a:?} {b:?}");
        // Two passes a tick apart tell the same: no status write between them.
        assert_eq!(next_window(&a), next_window(&b));
        let text = next_window(&a).unwrap();
        assert!(
            text.starts_with("open, no close before 2027-12-0"),
            "{text}"
        );
        assert!(text.ends_with("T00:00:00Z"), "{text}");
        // A window with an end is told to the instant.
        let monthly = crate::window::Calendar::new(
            &[crate::window::WindowSpec {
                schedule: "0 2 1 * *".into(),
                duration: std::time::Duration::from_secs(6 * 3600),
                timezone: chrono_tz::Tz::UTC,
            }],
            &[],
            false,
        )
        .unwrap();
        let open = monthly.state_at(
            "2026-12-01T03:00:00Z".parse().unwrap(),
            crate::window::Change::Other,
        );
        assert_eq!(
            next_window(&open).as_deref(),
            Some("open until 2026-12-01T08:00:00Z")
        );
    }

    fn health(last: Option<Verdict>) -> PushHealth {
        PushHealth {
            waiting: 1,
            last,
            commit: None,
        }
    }

    #[test]
    fn the_report_condition_says_refused_with_the_remotes_words_and_keeps_its_transition_time() {
        assert_eq!(report_condition(&health(None), None, "t0"), None);
        let refused = report_condition(
            &health(Some(Verdict::Refused {
                branch: "drover/status.d/stage/stage-1".into(),
                message: "pre-receive hook declined".into(),
            })),
            None,
            "t1",
        )
        .unwrap();
        assert_eq!(
            (
                refused.status.as_str(),
                refused.reason.as_str(),
                refused.last_transition_time.as_str()
            ),
            ("False", "Refused", "t1")
        );
        assert!(refused.message.contains("pre-receive hook declined"));
        assert!(refused
            .message
            .contains("on branch drover/status.d/stage/stage-1"));
        // Still False (now failing to connect): the transition time stays.
        let failing = report_condition(
            &health(Some(Verdict::Failing("connection refused".into()))),
            Some(&refused),
            "t2",
        )
        .unwrap();
        assert_eq!(
            (
                failing.reason.as_str(),
                failing.last_transition_time.as_str()
            ),
            ("Unreachable", "t1")
        );
        // Pushed: True, from now.
        let pushed =
            report_condition(&health(Some(Verdict::Pushed)), Some(&failing), "t3").unwrap();
        assert_eq!(
            (pushed.status.as_str(), pushed.last_transition_time.as_str()),
            ("True", "t3")
        );
    }
}
