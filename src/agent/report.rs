//! Stage 4, report: one function from a decision and its window to what the
//! agent tells — the CRD status (`DroverStatus.status`), the status report
//! (the status branch file), Events and metrics — and the writes and pushes
//! that carry them out.

use super::events::Severity;
use super::health;
use super::{blocking, lock, rfc3339, short, Acting, Active, ClusterBackend};
use crate::cluster::{NodeView, ProgressState};
use crate::rollout::{Outcome, RolloutState, WindowState};
use crate::status::StatusReport;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

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
        let d = &outcome.decision;
        for a in &d.actions {
            health::count_failure(&self.metrics, &self.cfg.env, a);
            self.durations(a, observed, now);
            self.events.on_action(a).await;
        }
        // A budget pacing a drain is normal; it becomes a Warning
        // (DrainBlocked) only when the drain times out.
        for (node, msg) in &outcome.evictions_blocked {
            self.events
                .on_node(
                    node,
                    Severity::Normal,
                    "EvictionRefused",
                    "Evict",
                    msg.clone(),
                )
                .await;
        }
        let state = d.state.as_str();
        if self.crd_status.state.as_deref() != Some(state) {
            self.events
                .on_status(
                    if matches!(d.state, RolloutState::Failed | RolloutState::Blocked) {
                        Severity::Warning
                    } else {
                        Severity::Normal
                    },
                    &format!("Rollout{}", capitalise(state)),
                    "Reconcile",
                    format!(
                        "{} {}/{} nodes at {}{}",
                        state,
                        d.nodes_at_version,
                        d.nodes,
                        active.env.version,
                        if d.message.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", d.message)
                        }
                    ),
                )
                .await;
            self.crd_status.since = Some(rfc3339(now));
        }
        // The first observation of a term is no transition (a restart would repeat it).
        let was_open = self.window_seen.replace(window.opened_at.is_some());
        if was_open.is_some_and(|w| w != window.opened_at.is_some()) {
            let note = match (window.closes_at, window.next_opens_at) {
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
            self.events
                .on_status(Severity::Normal, reason, "Window", note)
                .await;
        }
        self.metrics.set_rollout_state(state);
        self.crd_status.state = Some(state.into());
        self.crd_status.target = Some(active.env.version.to_string());
        self.crd_status.nodes = d.nodes;
        self.crd_status.nodes_at_version = d.nodes_at_version;
        self.crd_status.at_version = Some(format!("{}/{}", d.nodes_at_version, d.nodes));
        self.crd_status.window_open = window.opened_at.is_some();
        self.crd_status.next_window = match (window.closes_at, window.next_opens_at) {
            (Some(end), _) => Some(format!("open until {}", rfc3339(end))),
            (None, Some(start)) => Some(rfc3339(start)),
            (None, None) => None,
        };
        self.crd_status.message = d.message.clone();
        self.crd_status.reporter = Some(self.cfg.identity.clone());
        let since = self
            .crd_status
            .since
            .as_deref()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or(now);
        let report = StatusReport {
            env: self.cfg.env.clone(),
            cluster: self.cfg.cluster.clone(),
            config_commit: active.commit.to_string(),
            version: active.env.version.clone(),
            state: d.state,
            since,
            nodes: d.nodes,
            nodes_at_version: d.nodes_at_version,
            message: d.message.clone(),
            detail: crate::status::NodeDetail::of(observed, &active.env.version),
        };
        // A refused newer head is what the cluster reports (docs/design.md §5):
        // `version` is the refused one, `config_commit` the commit it stays on.
        let report = match (&self.crd_status.refused, &self.refused_version) {
            (Some(r), Some(v)) => {
                let mut message = format!(
                    "commit {} refused ({} check, {}): {}",
                    short(&r.commit),
                    r.stage,
                    r.reason,
                    r.message
                );
                if message.len() > 1000 {
                    let cut = (0..=1000)
                        .rev()
                        .find(|i| message.is_char_boundary(*i))
                        .unwrap_or(0);
                    message.truncate(cut);
                }
                self.crd_status.state = Some("refused".into());
                StatusReport {
                    version: v.clone(),
                    state: RolloutState::Refused,
                    message,
                    ..report
                }
            }
            _ => report,
        };
        let same = self.last_published.as_ref().is_some_and(|p| {
            StatusReport {
                since: p.since,
                ..report.clone()
            } == *p
        });
        if !same {
            self.last_published = Some(report);
            self.publish_pending = true;
        }
    }

    /// No applied config: the CRD status says why (refused, or nothing trusted yet).
    pub(super) fn report_unconfigured(&mut self) {
        self.crd_status.state = Some(if self.crd_status.refused.is_some() {
            "refused".into()
        } else {
            "blocked".into()
        });
        self.crd_status.message = match &self.crd_status.refused {
            Some(r) => format!("no applied config: {}", r.message),
            None => "no trusted config fetched yet".into(),
        };
        self.metrics.set_rollout_state("blocked");
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
        self.metrics.set_nodes(&counts);
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
                self.metrics
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
                    self.metrics.upgrade_duration.observe(secs(s));
                }
            }
            _ => {}
        }
    }

    /// Write the status object if it changed; false when the write failed.
    pub(super) async fn write_crd_status(&mut self) -> bool {
        if self.crd_written.as_ref() == Some(&self.crd_status) {
            return true;
        }
        match self.status_object.write(&self.crd_status).await {
            Ok(()) => {
                self.crd_written = Some(self.crd_status.clone());
                true
            }
            Err(e) => {
                if let Some(n) = self.pace.allow("status-write") {
                    tracing::warn!(error = %e, suppressed = n, "cannot write the status object");
                }
                false
            }
        }
    }

    /// Push the status report if it changed since the last successful push.
    pub(super) async fn publish(&mut self) {
        if !self.publish_pending {
            return;
        }
        let Some(report) = self.last_published.clone() else {
            return;
        };
        // State changes go out at once, rolling progress at most once per poll interval.
        let now = self.clock.now();
        let last = self.pushed.as_ref().map(|(r, t)| (r, *t));
        self.publish_due = None;
        match crate::status::cadence::decide(last, &report, now, self.cfg.poll) {
            crate::status::cadence::Push::Nothing => {
                self.publish_pending = false;
                return;
            }
            crate::status::cadence::Push::At(due) => {
                self.publish_due = Some(due);
                return;
            }
            crate::status::cadence::Push::Now => {}
        }
        let src = self.source.clone();
        let opts = self.cfg.publish.clone();
        let r = report.clone();
        match blocking(move || crate::status::publish(&lock(&src), &r, &opts)).await {
            Some(Ok(p)) => {
                self.publish_pending = false;
                self.pushed = Some((report.clone(), now));
                if let Some(c) = p.commit {
                    tracing::info!(commit = %c, state = ?report.state, "status report pushed");
                }
                if report.state == RolloutState::Confirmed && p.commit.is_some() {
                    self.events
                        .on_status(
                            Severity::Normal,
                            "Confirmed",
                            "Report",
                            format!(
                                "confirmed {} on {}; recorded on the status branch",
                                report.version,
                                self.active
                                    .as_ref()
                                    .map_or(&self.cfg.source.status_branch, |a| &a.status_branch)
                            ),
                        )
                        .await;
                }
            }
            Some(Err(e)) => {
                if let Some(n) = self.pace.allow("push") {
                    tracing::warn!(error = %e, suppressed = n, "status push failed; will retry")
                }
            }
            None => tracing::warn!("status push task failed; will retry"),
        }
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}
