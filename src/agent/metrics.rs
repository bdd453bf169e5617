//! Prometheus metrics served on `/metrics`.
//!
//! State-like metrics (nodes, rollout state, blocked reason, applied commit)
//! are gauges whose label sets are cleared and re-set when what they say
//! changes, so a series that no longer applies disappears instead of
//! lingering at 1; a pass that says the same again leaves them alone.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, String)>;

/// The values last written into the state-like families ([`Metrics::said`]).
#[derive(Default)]
struct Said {
    nodes: Option<BTreeMap<(String, String), i64>>,
    rollout_state: Option<crate::rollout::RolloutState>,
    blocked: Option<(
        Option<crate::rollout::Blocker>,
        BTreeMap<crate::rollout::Blocker, u32>,
    )>,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    /// What the state-like families were last set to: a pass that says
    /// the same again (most passes of a long drain) leaves them as they
    /// are rather than clearing and re-creating every series.
    said: std::sync::Mutex<Said>,
    /// `drover_nodes{version,state}`: selected nodes by OS version and drover state.
    pub nodes: Family<Labels, Gauge>,
    /// `drover_rollout_state{state}`: 1 for the current rollout state.
    pub rollout_state: Family<Labels, Gauge>,
    /// `drover_blocked{stage,reason}`: 1 while the newest config head is not applied, and why.
    pub blocked: Family<Labels, Gauge>,
    /// `drover_blocker{blocker}`: 1 for the cluster's blocker, 0 for the
    /// others (all 0 while it progresses).
    pub blocker: Family<Labels, Gauge>,
    /// `drover_blocked_nodes{blocker}`: selected nodes not progressing, by blocker.
    pub blocked_nodes: Family<Labels, Gauge>,
    /// `drover_oldest_blocked_node_seconds`: how long the longest-blocked
    /// node has been blocked (0 when none is).
    pub oldest_blocked_node: Gauge<f64, AtomicU64>,
    /// `drover_consent_overdue_nodes`: selected nodes workload consent has
    /// held past `consent_limit` (reported, never forced).
    pub consent_overdue: Gauge,
    /// `drover_preflight_blockers{kind}`: what the last preflight before a
    /// window found, by kind (every kind, 0 when none).
    pub preflight_blockers: Family<Labels, Gauge>,
    /// `drover_preflight_timestamp_seconds`: when the last preflight ran.
    pub preflight_time: Gauge<f64, AtomicU64>,
    /// `drover_window_open`: 1 while a maintenance window is open.
    pub window_open: Gauge,
    /// `drover_last_fetch_timestamp_seconds`: when the last fetch finished.
    pub last_fetch_time: Gauge<f64, AtomicU64>,
    /// `drover_last_fetch_success`: 1 when the last fetch succeeded.
    pub last_fetch_success: Gauge,
    /// `drover_fetches_total{result}`: fetches by result (`ok` or `error`).
    pub fetches: Family<Labels, Counter>,
    /// `drover_applied_commit_info{commit,version}`: 1 for the last applied commit.
    pub applied_commit: Family<Labels, Gauge>,
    /// `drover_leader`: 1 while this replica holds the lease.
    pub leader: Gauge,
    /// `drover_reconciles_total{result}`: reconcile passes by result.
    pub reconciles: Family<Labels, Counter>,
    /// `drover_admissions_total`: new heads judged (trust, config and the
    /// gate's read of the evidence); a kept refusal is not judged again.
    pub admissions: Counter,
    /// `drover_drain_duration_seconds`: cordon to drained, per node.
    pub drain_duration: Histogram,
    /// `drover_node_upgrade_duration_seconds`: drain start to Ready at the target, per node.
    pub upgrade_duration: Histogram,
    /// `drover_health_failures_total{env,check}`: health checks that failed
    /// a node (docs/design.md §5a), by kind of check.
    pub health_failures: Family<Labels, Counter>,
    /// `drover_drain_rungs_total{env,rung,rule}`: drain rungs beyond
    /// `evict` used on a node (restart, wait, skip, delete; docs/config.md
    /// "Drain rules"), once per node, rung, version and attempt.
    pub drain_rungs: Family<Labels, Counter>,
    /// `drover_status_pushes_total{result}`: status report push attempts by
    /// result (`ok`, `unchanged`, `failed`, `timeout`, `refused`).
    pub status_pushes: Family<Labels, Counter>,
    /// `drover_status_reports_waiting`: status reports not yet pushed.
    pub status_reports_waiting: Gauge,
    /// `drover_status_push_refused`: 1 while the git server refuses the
    /// status report (a hook, a protected branch, credentials).
    pub status_push_refused: Gauge,
    /// `drover_events_dropped_total`: Events dropped because too many waited.
    pub events_dropped: Counter,
    /// `drover_notifications_*`: CloudEvents delivered, dropped, failed, waiting.
    pub notifications: super::notify::Counters,
    /// `drover_event_failures_total`: Events the API server refused or did not answer.
    pub event_failures: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Metrics {
    /// Count a failed health check of kind `check` in `env`.
    pub fn health_failed(&self, env: &str, check: &str) {
        self.health_failures
            .get_or_create(&labels(&[("env", env), ("check", check)]))
            .inc();
    }

    /// Count a drain rung `rung` of rule `rule` used on a node of `env`.
    pub fn drain_rung(&self, env: &str, rung: &str, rule: &str) {
        self.drain_rungs
            .get_or_create(&labels(&[("env", env), ("rung", rung), ("rule", rule)]))
            .inc();
    }

    /// Count a status report push attempt ending in `result`.
    pub fn status_pushed(&self, result: &str) {
        self.status_pushes
            .get_or_create(&labels(&[("result", result)]))
            .inc();
    }

    /// A fresh registry with every metric registered under the `drover_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("drover");
        let m = Metrics {
            said: Default::default(),
            nodes: Family::default(),
            rollout_state: Family::default(),
            blocked: Family::default(),
            blocker: Family::default(),
            blocked_nodes: Family::default(),
            oldest_blocked_node: Gauge::default(),
            consent_overdue: Gauge::default(),
            preflight_blockers: Family::default(),
            preflight_time: Gauge::default(),
            window_open: Gauge::default(),
            last_fetch_time: Gauge::default(),
            last_fetch_success: Gauge::default(),
            fetches: Family::default(),
            applied_commit: Family::default(),
            leader: Gauge::default(),
            reconciles: Family::default(),
            admissions: Counter::default(),
            // 1 s .. ~9 h: drains take seconds to the drain timeout.
            drain_duration: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
            // 10 s .. ~45 h: an upgrade includes a reboot.
            upgrade_duration: Histogram::new(exponential_buckets(10.0, 2.0, 15)),
            health_failures: Family::default(),
            drain_rungs: Family::default(),
            status_pushes: Family::default(),
            status_reports_waiting: Gauge::default(),
            status_push_refused: Gauge::default(),
            events_dropped: Counter::default(),
            notifications: Default::default(),
            event_failures: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "nodes",
            "Selected nodes by OS version and drover state",
            m.nodes.clone(),
        );
        registry.register(
            "rollout_state",
            "1 for the rollout's current state, 0 for the others (pending, paused, rolling, settling, confirmed, blocked, failed, revoked, refused)",
            m.rollout_state.clone(),
        );
        registry.register(
            "blocker",
            "1 for the blocker that keeps the cluster from progressing, 0 for the others (docs/status.md, Blockers)",
            m.blocker.clone(),
        );
        registry.register(
            "blocked_nodes",
            "Selected nodes that are not progressing, by blocker",
            m.blocked_nodes.clone(),
        );
        registry.register(
            "oldest_blocked_node_seconds",
            "How long the longest-blocked node has been blocked",
            m.oldest_blocked_node.clone(),
        );
        registry.register(
            "health_failures",
            "Health checks that failed a node, by environment and check (node_condition, crash_loop, pod_not_ready, prometheus, node_ready, node_version)",
            m.health_failures.clone(),
        );
        registry.register(
            "drain_rungs",
            "Drain rungs beyond evict used on a node (restart, wait, skip, delete), by environment, rung and drain rule",
            m.drain_rungs.clone(),
        );
        registry.register(
            "blocked",
            "1 while the newest config head is not applied; stage is trust, config or gate",
            m.blocked.clone(),
        );
        registry.register(
            "consent_overdue_nodes",
            "Selected nodes workload consent has held past consent_limit: reported, not forced",
            m.consent_overdue.clone(),
        );
        registry.register(
            "preflight_blockers",
            "What the last preflight before a window found would block a drain, by kind",
            m.preflight_blockers.clone(),
        );
        registry.register(
            "preflight_timestamp_seconds",
            "Unix time the last preflight before a window ran",
            m.preflight_time.clone(),
        );
        registry.register(
            "window_open",
            "1 while a maintenance window is open",
            m.window_open.clone(),
        );
        registry.register(
            "last_fetch_timestamp_seconds",
            "Unix time the last fetch of the config repository finished",
            m.last_fetch_time.clone(),
        );
        registry.register(
            "last_fetch_success",
            "1 when the last fetch succeeded",
            m.last_fetch_success.clone(),
        );
        registry.register("fetches", "Fetches by result", m.fetches.clone());
        registry.register(
            "applied_commit_info",
            "1 for the last applied config commit",
            m.applied_commit.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            m.leader.clone(),
        );
        registry.register(
            "reconciles",
            "Reconcile passes by result",
            m.reconciles.clone(),
        );
        registry.register(
            "admissions",
            "New config heads judged: trust, config and the gate's read of the evidence",
            m.admissions.clone(),
        );
        registry.register(
            "drain_duration_seconds",
            "Time from cordon to a drained node",
            m.drain_duration.clone(),
        );
        registry.register(
            "node_upgrade_duration_seconds",
            "Time from drain start to the node Ready at the target version",
            m.upgrade_duration.clone(),
        );
        registry.register(
            "status_pushes",
            "Status report push attempts by result (ok, unchanged, failed, timeout, refused)",
            m.status_pushes.clone(),
        );
        registry.register(
            "status_reports_waiting",
            "Status reports not yet pushed to the git server",
            m.status_reports_waiting.clone(),
        );
        registry.register(
            "status_push_refused",
            "1 while the git server refuses the status report (a hook, a protected branch, credentials)",
            m.status_push_refused.clone(),
        );
        registry.register(
            "notifications_delivered",
            "CloudEvents notifications a receiver took (2xx)",
            m.notifications.delivered.clone(),
        );
        registry.register(
            "notifications_dropped",
            "CloudEvents notifications dropped: queue_full (the oldest), attempts, age",
            m.notifications.dropped.clone(),
        );
        registry.register(
            "notification_attempts_failed",
            "notification requests that failed or were not answered in time (retried)",
            m.notifications.failed.clone(),
        );
        registry.register(
            "notifications_waiting",
            "CloudEvents notifications queued for their receivers",
            m.notifications.waiting.clone(),
        );
        registry.register(
            "events_dropped",
            "Events dropped because too many waited for the API server",
            m.events_dropped.clone(),
        );
        registry.register(
            "event_failures",
            "Events the API server refused or did not answer in time",
            m.event_failures.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// The memo of what was last said, whichever thread wrote it.
    fn said(&self) -> std::sync::MutexGuard<'_, Said> {
        self.said.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record the nodes by (version, state).
    pub fn set_nodes(&self, counts: &BTreeMap<(String, String), i64>) {
        let mut said = self.said();
        if said.nodes.as_ref() == Some(counts) {
            return;
        }
        said.nodes = Some(counts.clone());
        self.nodes.clear();
        for ((version, state), n) in counts {
            self.nodes
                .get_or_create(&labels(&[("version", version), ("state", state)]))
                .set(*n);
        }
    }

    /// Record the rollout state.
    pub fn set_rollout_state(&self, state: crate::rollout::RolloutState) {
        // One series per state, 0 or 1, so an alert on `blocked` or
        // `failed` sees a value rather than an absent series.
        let mut said = self.said();
        if said.rollout_state == Some(state) {
            return;
        }
        said.rollout_state = Some(state);
        self.rollout_state.clear();
        for s in crate::rollout::RolloutState::ALL {
            self.rollout_state
                .get_or_create(&labels(&[("state", s.as_str())]))
                .set(0);
        }
        self.rollout_state
            .get_or_create(&labels(&[("state", state.as_str())]))
            .set(1);
    }

    /// Record the cluster's blocker and its blocked nodes at `now`: one
    /// series per blocker for both, so an alert sees 0 rather than nothing.
    pub fn set_blocked_nodes(
        &self,
        cluster: Option<crate::rollout::Blocker>,
        nodes: &super::blocked::Blocked,
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let age = nodes
            .oldest
            .map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1000.0);
        self.oldest_blocked_node.set(age);
        let mut said = self.said();
        let this = (cluster, nodes.counts.clone());
        if said.blocked.as_ref() == Some(&this) {
            return;
        }
        said.blocked = Some(this);
        for b in crate::rollout::Blocker::ALL {
            let l = labels(&[("blocker", b.as_str())]);
            self.blocker
                .get_or_create(&l)
                .set(i64::from(cluster == Some(b)));
            let n = nodes.counts.get(&b).copied().unwrap_or(0);
            self.blocked_nodes.get_or_create(&l).set(i64::from(n));
        }
    }

    /// Record why the newest head is not applied (`None`: it is).
    pub fn set_blocked(&self, why: Option<(&str, &str)>) {
        self.blocked.clear();
        if let Some((stage, reason)) = why {
            self.blocked
                .get_or_create(&labels(&[("stage", stage), ("reason", reason)]))
                .set(1);
        }
    }

    /// Record the applied commit and version.
    pub fn set_applied(&self, commit: &str, version: &str) {
        self.applied_commit.clear();
        self.applied_commit
            .get_or_create(&labels(&[("commit", commit), ("version", version)]))
            .set(1);
    }

    /// Record a finished fetch.
    pub fn fetched(&self, ok: bool, unix_time: f64) {
        self.last_fetch_time.set(unix_time);
        self.last_fetch_success.set(i64::from(ok));
        self.fetches
            .get_or_create(&labels(&[("result", if ok { "ok" } else { "error" })]))
            .inc();
    }

    /// Count a reconcile pass.
    pub fn reconciled(&self, result: &str) {
        self.reconciles
            .get_or_create(&labels(&[("result", result)]))
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_series_are_replaced_not_accumulated() {
        let m = Metrics::new();
        m.set_blocked(Some(("trust", "unsigned")));
        m.set_rollout_state(crate::rollout::RolloutState::Rolling);
        m.set_rollout_state(crate::rollout::RolloutState::Confirmed);
        m.set_applied("abc", "1.2.3");
        m.fetched(true, 1.5);
        let mut counts = BTreeMap::new();
        counts.insert(("1.2.3".to_string(), "ready".to_string()), 4);
        m.set_nodes(&counts);
        let text = m.render();
        assert!(
            text.contains(r#"drover_blocked{stage="trust",reason="unsigned"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"drover_rollout_state{state="confirmed"} 1"#),
            "{text}"
        );
        // One series per state: the old one reads 0, not absent.
        assert!(
            text.contains(r#"drover_rollout_state{state="rolling"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"drover_rollout_state{state="blocked"} 0"#),
            "{text}"
        );
        assert!(text.contains(r#"drover_applied_commit_info{commit="abc",version="1.2.3"} 1"#));
        assert!(text.contains(r#"drover_nodes{version="1.2.3",state="ready"} 4"#));
        assert!(text.contains("drover_last_fetch_success 1"));
        assert!(text.contains(r#"drover_fetches_total{result="ok"} 1"#));
        m.set_blocked(None);
        assert!(!m.render().contains("drover_blocked{"));
    }

    /// A pass that says the same again leaves the series alone; what
    /// changes after it is still written.
    #[test]
    fn the_same_state_said_again_changes_nothing_and_a_new_one_is_written() {
        use crate::rollout::{Blocker, RolloutState};
        let m = Metrics::new();
        let mut counts = BTreeMap::new();
        counts.insert(("1.2.3".to_string(), "ready".to_string()), 4);
        let blocked = |n: u32| crate::agent::blocked::Blocked {
            counts: [(Blocker::Pdb, n)].into_iter().collect(),
            oldest: None,
        };
        let now = chrono::Utc::now();
        for _ in 0..2 {
            m.set_rollout_state(RolloutState::Confirmed);
            m.set_nodes(&counts);
            m.set_blocked_nodes(Some(Blocker::Pdb), &blocked(1), now);
        }
        let said = m.render();
        m.set_rollout_state(RolloutState::Rolling);
        counts.insert(("1.2.3".to_string(), "ready".to_string()), 3);
        m.set_nodes(&counts);
        m.set_blocked_nodes(None, &blocked(2), now);
        let text = m.render();
        for (before, after) in [
            (
                r#"drover_rollout_state{state="confirmed"} 1"#,
                r#"drover_rollout_state{state="confirmed"} 0"#,
            ),
            (
                r#"drover_rollout_state{state="rolling"} 0"#,
                r#"drover_rollout_state{state="rolling"} 1"#,
            ),
            (
                r#"drover_nodes{version="1.2.3",state="ready"} 4"#,
                r#"drover_nodes{version="1.2.3",state="ready"} 3"#,
            ),
            (
                r#"drover_blocker{blocker="pdb"} 1"#,
                r#"drover_blocker{blocker="pdb"} 0"#,
            ),
            (
                r#"drover_blocked_nodes{blocker="pdb"} 1"#,
                r#"drover_blocked_nodes{blocker="pdb"} 2"#,
            ),
        ] {
            assert!(said.contains(before), "{before} in {said}");
            assert!(text.contains(after), "{after} in {text}");
        }
    }
}
