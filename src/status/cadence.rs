//! When a cluster's agent pushes a status report (docs/status.md, "How
//! often reports are pushed"), and the per-node detail a report carries.
//! Pure: values in, decisions out.
//!
//! A report is pushed at once when the cluster's state changes (state,
//! version, config commit, or anything while not rolling: a `blocked`
//! message that names other pods is news). While rolling, progress (more
//! nodes at the version, other nodes in progress) is pushed at most once per
//! interval, so a 200-node rollout writes a handful of commits instead of one
//! per node, and the last progress is never lost: it is pushed when the
//! interval has passed, or folded into the next state change.

use super::StatusReport;
use crate::cluster::NodeView;
use crate::rollout::RolloutState;
use chrono::{DateTime, Utc};
use semver::Version;
use serde::{Deserialize, Serialize};

/// Most bytes of node names one report's detail holds; the rest are counted
/// in [`NodeDetail::omitted`], so a report of any fleet stays far below the
/// 64 KiB a reader accepts.
pub const MAX_DETAIL_BYTES: usize = 32 * 1024;
/// The most bytes of one entry of [`NodeDetail::failed_checks`].
pub const MAX_CHECK_BYTES: usize = 512;

/// Which nodes are where: the `[detail]` table of a report. Unknown keys
/// are ignored rather than refused: the table only informs (the gate reads
/// none of it), and a newer agent may name more lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDetail {
    /// Nodes drover is moving now (draining, or their upgrade under way),
    /// by name: not a node it gave back (blocked, failed) nor one cordoned
    /// by someone else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_progress: Vec<String>,
    /// Selected nodes Ready at the report's version, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub at_version: Vec<String>,
    /// Nodes given back failed (they did not reach the version, or a health
    /// check failed on them), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
    /// Nodes given back blocked (their drain timed out), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<String>,
    /// Nodes rolled back from the report's version (`on_failure =
    /// "rollback"`): back at the version they ran before, never moved to
    /// this one again. Also in `failed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled_back: Vec<String>,
    /// What failed on each failed, rolling-back or rolled-back node at the
    /// report's version: `"<node>: <what failed>"` (the check and its
    /// detail, and what became of the rollback), each at most
    /// [`MAX_CHECK_BYTES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_checks: Vec<String>,
    /// Every drain rung beyond `evict` used on a node for the report's
    /// version (docs/config.md, "Drain rules"): `"<node>: <rung> (rule
    /// <rule>, attempt <n>): <what it did>"`, each at most
    /// [`MAX_CHECK_BYTES`]: restarts, waits, skips and deletes are evidence
    /// a reviewer of the next environment sees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_rungs: Vec<String>,
    /// The retries the OS driver made on each node whose record's last
    /// attempt installs (or installed) the report's version, where it made
    /// any: `"<node>: <kind> <n> times, ..."` (a run that succeeded after
    /// transient failures, as its termination message said), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub driver_retries: Vec<String>,
    /// Nodes workload consent has held past the environment's
    /// `consent_limit` (docs/config.md, "Workload consent"): `"<node>:
    /// held by consent since <time>, past consent_limit (<limit>)"`, by
    /// name: reported, never forced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consent_overdue: Vec<String>,
    /// Names left out of the lists to stay within [`MAX_DETAIL_BYTES`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: u32,
    /// How many nodes each phase of drover's records holds (`draining`,
    /// `upgrading`, `failed`, ...; idle nodes are not counted): at most one
    /// entry per phase, whatever the fleet's size. Read from the same
    /// records as `kubectl get drovernodes`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub phases: std::collections::BTreeMap<String, u32>,
    /// Why the cluster is not progressing (`crate::rollout::Blocker`'s
    /// name), when it is not. Kept as the word written, so a report naming
    /// a blocker a newer agent added still reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocker: Option<String>,
    /// Each node that is not progressing, by name, and its blocker's name;
    /// bounded like the lists ([`NodeDetail::bounded`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub blockers: std::collections::BTreeMap<String, String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl NodeDetail {
    /// True when the report names no node (reports of older agents).
    pub fn is_empty(&self) -> bool {
        self.in_progress.is_empty()
            && self.at_version.is_empty()
            && self.failed.is_empty()
            && self.blocked.is_empty()
            && self.rolled_back.is_empty()
            && self.failed_checks.is_empty()
            && self.drain_rungs.is_empty()
            && self.driver_retries.is_empty()
            && self.consent_overdue.is_empty()
            && self.omitted == 0
            && self.phases.is_empty()
            && self.blocker.is_none()
            && self.blockers.is_empty()
    }

    /// The cluster's blocker, when the report names one drover knows.
    pub fn blocker(&self) -> Option<crate::rollout::Blocker> {
        self.blocker
            .as_deref()
            .and_then(crate::rollout::Blocker::parse)
    }

    /// The detail naming the nodes of `overdue` (the decision's), within
    /// [`MAX_DETAIL_BYTES`] with the lists: the rest are counted in
    /// `omitted`.
    pub fn with_consent_overdue(mut self, overdue: &[crate::rollout::ConsentOverdue]) -> Self {
        let used: usize = self.lists().map(|n| n.len() + 4).sum();
        let mut budget = MAX_DETAIL_BYTES.saturating_sub(used);
        for o in overdue {
            let line = format!(
                "{}: held by consent since {}, past consent_limit ({})",
                o.node,
                o.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                humantime::format_duration(o.limit)
            );
            let cost = line.len() + 4;
            if cost > budget || line.len() > MAX_CHECK_BYTES {
                self.omitted += 1;
                continue;
            }
            budget -= cost;
            self.consent_overdue.push(line);
        }
        self
    }

    /// Every name of the lists the budget counts.
    fn lists(&self) -> impl Iterator<Item = &String> {
        [
            &self.in_progress,
            &self.at_version,
            &self.failed,
            &self.blocked,
            &self.rolled_back,
            &self.failed_checks,
            &self.drain_rungs,
            &self.driver_retries,
            &self.consent_overdue,
        ]
        .into_iter()
        .flat_map(|l| l.iter())
    }

    /// The detail with its `blockers` cut to [`MAX_DETAIL_BYTES`] less what
    /// the lists use, the nodes left out counted in `omitted`.
    pub fn bounded(mut self) -> Self {
        let lists: usize = self.lists().map(|n| n.len() + 4).sum();
        let mut budget = MAX_DETAIL_BYTES.saturating_sub(lists);
        let mut omitted = 0u32;
        self.blockers.retain(|node, blocker| {
            // The key, its quotes, the value and its quotes, ` = ` and a newline.
            let cost = node.len() + blocker.len() + 8;
            if cost > budget {
                omitted += 1;
                return false;
            }
            budget -= cost;
            true
        });
        self.omitted += omitted;
        self
    }

    /// The detail of `nodes` moving to `version`: names sorted, nodes in
    /// progress, failed and blocked first (they are what a person looks
    /// for), bounded by [`MAX_DETAIL_BYTES`].
    pub fn of(nodes: &[NodeView], version: &Version) -> Self {
        use crate::cluster::ProgressState as P;
        let at = |n: &NodeView| n.ready && n.version.as_ref() == Some(version);
        let state = |n: &NodeView| match &n.progress {
            Ok(Some(p)) => Some(p.state),
            _ => None,
        };
        let names = |keep: &dyn Fn(&NodeView) -> bool| -> Vec<&str> {
            let mut v: Vec<&str> = nodes
                .iter()
                .filter(|n| keep(n))
                .map(|n| n.name.as_str())
                .collect();
            v.sort_unstable();
            v
        };
        let in_flight =
            |n: &NodeView| matches!(state(n), Some(P::Draining | P::Upgrading | P::RollingBack));
        let lists = [
            names(&|n| !at(n) && in_flight(n)),
            names(&|n| state(n) == Some(P::Failed)),
            names(&|n| state(n) == Some(P::Blocked)),
            names(&|n| n.rolled_back.contains(version)),
            names(&at),
        ];
        let mut out = NodeDetail::default();
        for n in nodes {
            if let Some(s) = state(n) {
                *out.phases.entry(s.as_str().to_string()).or_default() += 1;
            }
        }
        let mut budget = MAX_DETAIL_BYTES;
        let checks = failed_checks(nodes, version);
        let rungs = drain_rungs(nodes, version);
        let retries = driver_retries(nodes, version);
        let [in_progress, failed, blocked, rolled_back, at_version] = lists;
        for (names, into) in [
            (in_progress, &mut out.in_progress),
            (failed, &mut out.failed),
            (blocked, &mut out.blocked),
            (rolled_back, &mut out.rolled_back),
            (
                checks.iter().map(String::as_str).collect(),
                &mut out.failed_checks,
            ),
            (
                rungs.iter().map(String::as_str).collect(),
                &mut out.drain_rungs,
            ),
            (
                retries.iter().map(String::as_str).collect(),
                &mut out.driver_retries,
            ),
            (at_version, &mut out.at_version),
        ] {
            for name in names {
                // The name, its quotes and separator.
                let cost = name.len() + 4;
                if cost > budget {
                    out.omitted += 1;
                    continue;
                }
                budget -= cost;
                into.push(name.to_owned());
            }
        }
        out
    }
}

/// `"<node>: <rung> (rule <rule>, attempt <n>): <detail>"` for every drain
/// rung beyond `evict` a node's record holds for `version`, by node, each
/// bounded by [`MAX_CHECK_BYTES`].
fn drain_rungs(nodes: &[NodeView], version: &Version) -> Vec<String> {
    let mut out: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.record.as_ref().map(|s| (n, s)))
        .flat_map(|(n, s)| {
            s.record
                .drain_rungs
                .iter()
                .filter(|u| u.version == *version)
                .map(move |u| {
                    let mut line = format!(
                        "{}: {} (rule {}, attempt {}): {}",
                        n.name,
                        u.rung.as_str(),
                        u.rule,
                        u.attempt,
                        u.detail
                    );
                    if line.len() > MAX_CHECK_BYTES {
                        let mut end = MAX_CHECK_BYTES;
                        while !line.is_char_boundary(end) {
                            end -= 1;
                        }
                        line.truncate(end);
                    }
                    line
                })
        })
        .collect();
    out.sort();
    out
}

/// `"<node>: <message>"` for every node whose record at `version` says it
/// failed or is rolling back, by name, each bounded by [`MAX_CHECK_BYTES`].
fn failed_checks(nodes: &[NodeView], version: &Version) -> Vec<String> {
    use crate::cluster::ProgressState as P;
    let mut out: Vec<String> = nodes
        .iter()
        .filter_map(|n| match &n.progress {
            Ok(Some(p))
                if p.target == *version && matches!(p.state, P::Failed | P::RollingBack) =>
            {
                let mut line = format!("{}: {}", n.name, p.message);
                if line.len() > MAX_CHECK_BYTES {
                    let mut end = MAX_CHECK_BYTES - 3;
                    while !line.is_char_boundary(end) {
                        end -= 1;
                    }
                    line.truncate(end);
                    line.push_str("...");
                }
                Some(line)
            }
            _ => None,
        })
        .collect();
    out.sort_unstable();
    out
}

/// `"<node>: <retries in words>"` for every node whose record's run
/// installs `version` and whose driver runs of that attempt retried
/// anything, by name (at most [`crate::record::MAX_DRIVER_RUNS`] runs of
/// [`crate::record::MAX_RETRY_KINDS`] kinds each: a short line).
fn driver_retries(nodes: &[NodeView], version: &Version) -> Vec<String> {
    let mut out: Vec<String> = nodes
        .iter()
        .filter_map(|n| {
            let r = &n.record.as_ref()?.record;
            if r.run.as_ref()?.version != *version || r.driver_retries() == 0 {
                return None;
            }
            let mut by_kind = std::collections::BTreeMap::<String, u32>::new();
            for d in &r.driver_runs {
                for (k, c) in &d.retries {
                    let e = by_kind.entry(k.clone()).or_default();
                    *e = e.saturating_add(*c);
                }
            }
            let words = crate::record::DriverRun::new("", by_kind).describe();
            Some(format!("{}: {words}", n.name))
        })
        .collect();
    out.sort_unstable();
    out
}

/// What to do with the newest report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Push it now.
    Now,
    /// Rolling progress inside the interval: push it at this time (or with
    /// the next state change, whichever comes first).
    At(DateTime<Utc>),
    /// The remote already holds this report (only `since` may differ).
    Nothing,
}

/// When to push `next`, given the last report that reached the remote and
/// when it did (`None`: nothing pushed yet by this agent), at `now`, with
/// rolling progress pushed at most once per `interval`.
pub fn decide(
    last: Option<(&StatusReport, DateTime<Utc>)>,
    next: &StatusReport,
    now: DateTime<Utc>,
    interval: std::time::Duration,
) -> Push {
    let Some((last, pushed_at)) = last else {
        return Push::Now;
    };
    if *last
        == (StatusReport {
            since: last.since,
            ..next.clone()
        })
    {
        return Push::Nothing;
    }
    let progress_only = last.state == RolloutState::Rolling
        && next.state == RolloutState::Rolling
        && last.version == next.version
        && last.config_commit == next.config_commit
        && last.env == next.env
        && last.cluster == next.cluster;
    if !progress_only {
        return Push::Now;
    }
    // Checked: an interval too long for the calendar is never due (a state
    // change still goes out at once), where adding it would panic.
    let due = chrono::Duration::from_std(interval)
        .ok()
        .and_then(|d| pushed_at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    if now >= due {
        Push::Now
    } else {
        Push::At(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{NodeProgress, ProgressState};
    use std::time::Duration;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn rep(state: RolloutState, at: u32) -> StatusReport {
        StatusReport {
            env: "stage".into(),
            cluster: "stage-1".into(),
            config_commit: "a".repeat(40),
            version: "1.13.2".parse().unwrap(),
            state,
            since: t("2026-12-08T02:00:00Z"),
            nodes: 200,
            nodes_at_version: at,
            message: String::new(),
            detail: NodeDetail::default(),
        }
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn state_changes_push_at_once_and_progress_waits_for_the_interval() {
        let at0 = t("2026-12-08T02:00:00Z");
        let rolling = rep(RolloutState::Rolling, 10);
        assert_eq!(decide(None, &rolling, at0, MINUTE), Push::Now);
        // Pending -> rolling is a state change.
        let pending = rep(RolloutState::Pending, 0);
        assert_eq!(
            decide(Some((&pending, at0)), &rolling, at0, MINUTE),
            Push::Now
        );
        // Progress inside the interval waits until it has passed...
        let more = rep(RolloutState::Rolling, 11);
        assert_eq!(
            decide(
                Some((&rolling, at0)),
                &more,
                t("2026-12-08T02:00:30Z"),
                MINUTE
            ),
            Push::At(t("2026-12-08T02:01:00Z"))
        );
        // ...and goes out once it has.
        assert_eq!(
            decide(
                Some((&rolling, at0)),
                &more,
                t("2026-12-08T02:01:00Z"),
                MINUTE
            ),
            Push::Now
        );
        // Rolling -> confirmed, failed or blocked: at once, inside the interval too.
        for s in [
            RolloutState::Confirmed,
            RolloutState::Failed,
            RolloutState::Blocked,
        ] {
            assert_eq!(
                decide(
                    Some((&rolling, at0)),
                    &rep(s, 200),
                    t("2026-12-08T02:00:01Z"),
                    MINUTE
                ),
                Push::Now,
                "{s:?}"
            );
        }
        // A new version or config commit while rolling is a change too.
        let mut other = rep(RolloutState::Rolling, 10);
        other.version = "1.14.0".parse().unwrap();
        assert_eq!(
            decide(Some((&rolling, at0)), &other, at0, MINUTE),
            Push::Now
        );
        let mut other = rep(RolloutState::Rolling, 10);
        other.config_commit = "b".repeat(40);
        assert_eq!(
            decide(Some((&rolling, at0)), &other, at0, MINUTE),
            Push::Now
        );
    }

    #[test]
    fn an_identical_report_is_not_pushed_and_other_news_is() {
        let at0 = t("2026-12-08T02:00:00Z");
        let blocked = rep(RolloutState::Blocked, 3);
        let mut later = blocked.clone();
        later.since = t("2026-12-08T03:00:00Z");
        assert_eq!(
            decide(Some((&blocked, at0)), &later, at0, MINUTE),
            Push::Nothing
        );
        // A blocked cluster whose message now names other pods: news, at once.
        let mut news = blocked.clone();
        news.message = "pdb web-pdb allows no disruption".into();
        assert_eq!(decide(Some((&blocked, at0)), &news, at0, MINUTE), Push::Now);
    }

    /// One 200-node rollout, a node every 3 s (10 minutes): the old rule
    /// (a push per change of the count) against this one.
    #[test]
    fn a_200_node_rollout_pushes_a_handful_of_reports() {
        let start = t("2026-12-08T02:00:00Z");
        let mut reports = vec![(start, rep(RolloutState::Pending, 0))];
        for n in 0..=200u32 {
            let state = if n == 200 {
                RolloutState::Confirmed
            } else {
                RolloutState::Rolling
            };
            let at = start + chrono::Duration::seconds(60 + 3 * i64::from(n));
            reports.push((at, rep(state, n)));
        }
        let mut pushed: Option<(StatusReport, DateTime<Utc>)> = None;
        let mut held: Option<(StatusReport, DateTime<Utc>)> = None;
        let mut commits = 0;
        let mut push = |r: &StatusReport, at, pushed: &mut Option<_>| {
            commits += 1;
            *pushed = Some((r.clone(), at));
        };
        for (at, r) in &reports {
            // A held report whose time has come goes out before the next observation.
            if let Some((h, due)) = held.take() {
                if due <= *at {
                    push(&h, due, &mut pushed);
                }
            }
            match decide(pushed.as_ref().map(|(r, t)| (r, *t)), r, *at, MINUTE) {
                Push::Now => push(r, *at, &mut pushed),
                Push::At(due) => held = Some((r.clone(), due)),
                Push::Nothing => {}
            }
        }
        assert!(held.is_none(), "the confirmation is never held");
        let (last, _) = pushed.unwrap();
        assert_eq!(last.state, RolloutState::Confirmed);
        // pending, first rolling, one per minute of the 10-minute roll, confirmed.
        assert!((12..=14).contains(&commits), "{commits} commits");
    }

    #[test]
    fn any_interval_is_arithmetic_without_a_panic() {
        let at0 = t("2026-12-08T02:00:00Z");
        let rolling = rep(RolloutState::Rolling, 10);
        let more = rep(RolloutState::Rolling, 11);
        // Past what chrono can add (the old fallback overflowed as well):
        // progress is held, never pushed by time alone.
        for interval in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
            assert_eq!(
                decide(Some((&rolling, at0)), &more, at0, interval),
                Push::At(DateTime::<Utc>::MAX_UTC)
            );
        }
        // Control: a long but representable interval is honoured as given.
        let year = Duration::from_secs(365 * 86_400);
        assert_eq!(
            decide(Some((&rolling, at0)), &more, at0, year),
            Push::At(at0 + chrono::Duration::days(365))
        );
        // A state change goes out at once whatever the interval.
        assert_eq!(
            decide(
                Some((&rolling, at0)),
                &rep(RolloutState::Confirmed, 200),
                at0,
                Duration::MAX
            ),
            Push::Now
        );
    }

    proptest::proptest! {
        /// Any interval, any instants: an answer, never a panic.
        #[test]
        fn the_cadence_never_panics(
            secs in proptest::prelude::any::<u64>(),
            nanos in 0u32..1_000_000_000,
            pushed in proptest::prelude::any::<i64>(),
            now in proptest::prelude::any::<i64>(),
        ) {
            let (lo, hi) = (DateTime::<Utc>::MIN_UTC.timestamp(), DateTime::<Utc>::MAX_UTC.timestamp());
            let at = |s: i64| DateTime::from_timestamp(s.clamp(lo, hi), 0).unwrap();
            let interval = Duration::new(secs, nanos);
            let rolling = rep(RolloutState::Rolling, 10);
            let more = rep(RolloutState::Rolling, 11);
            let _ = decide(Some((&rolling, at(pushed))), &more, at(now), interval);
        }
    }

    fn node(name: &str, version: &str, ready: bool, cordoned: bool) -> NodeView {
        NodeView {
            name: name.into(),
            version: Some(version.parse().unwrap()),
            ready,
            unschedulable: cordoned,
            budgets_allow_drain: true,
            ..NodeView::default()
        }
    }

    #[test]
    fn detail_names_nodes_at_the_version_and_in_progress_within_its_bound() {
        let v: Version = "1.13.2".parse().unwrap();
        let with = |mut n: NodeView, state: ProgressState| {
            n.progress = Ok(Some(NodeProgress {
                state,
                target: v.clone(),
                started_at: t("2026-12-01T02:00:00Z"),
                cordoned_by_drover: true,
                message: String::new(),
                retries: 0,
                previous: None,
            }));
            n
        };
        let nodes = [
            node("b", "1.13.2", true, false),
            node("a", "1.13.2", true, false),
            with(node("c", "1.13.1", true, true), ProgressState::Draining),
            node("d", "1.13.1", true, false),
            node("e", "1.13.2", false, false),
            // Cordoned by someone else: not drover's, not in progress.
            node("f", "1.13.1", true, true),
            with(node("g", "1.13.1", true, false), ProgressState::Blocked),
            with(node("h", "1.13.2", true, false), ProgressState::Failed),
            with(node("i", "1.13.1", false, true), ProgressState::Upgrading),
        ];
        let d = NodeDetail::of(&nodes, &v);
        assert_eq!(d.at_version, ["a", "b", "h"]);
        assert_eq!(d.in_progress, ["c", "i"]);
        assert_eq!(d.failed, ["h"]);
        assert_eq!(d.blocked, ["g"]);
        assert_eq!(d.omitted, 0);
        // Each phase counted once, idle nodes not at all.
        assert_eq!(
            d.phases,
            [
                ("blocked".to_string(), 1),
                ("draining".to_string(), 1),
                ("failed".to_string(), 1),
                ("upgrading".to_string(), 1)
            ]
            .into()
        );
        // A node whose driver retried at the version is named with its
        // retries, once given back; one at another version is not.
        let retried = |name: &str, run_version: &str| {
            let mut n = node(name, "1.13.2", true, false);
            let r = crate::record::NodeRecord::new(name, "id").start(NodeProgress {
                state: ProgressState::Draining,
                target: run_version.parse().unwrap(),
                started_at: t("2026-12-01T02:00:00Z"),
                cordoned_by_drover: true,
                message: String::new(),
                retries: 0,
                previous: None,
            });
            let said = crate::record::DriverRun::new(
                r.run.as_ref().unwrap().name.clone(),
                [("refresh".to_string(), 2)],
            );
            n.record = Some(crate::record::Stored {
                record: r.driver_said(&said).with_progress(None),
                resource_version: "1".into(),
                generation: 1,
                conditions: Vec::new(),
                requests: Default::default(),
            });
            n
        };
        let d = NodeDetail::of(&[retried("r", "1.13.2"), retried("s", "1.13.1")], &v);
        assert_eq!(d.driver_retries, ["r: refresh 2 times"]);
        let mut r = rep(RolloutState::Confirmed, 1);
        r.detail = d;
        assert_eq!(StatusReport::from_toml(&r.to_toml()).unwrap(), r);
        // A list a newer agent adds is ignored, not refused.
        let text = "in_progress = [\"c\"]\ncordoned = [\"f\"]\n";
        let read: NodeDetail = toml::from_str(text).unwrap();
        assert_eq!(read.in_progress, ["c"]);

        let many: Vec<NodeView> = (0..2000)
            .map(|i| node(&format!("{i:0>60}"), "1.13.2", true, false))
            .collect();
        let d = NodeDetail::of(&many, &v);
        assert_eq!(d.at_version.len() as u32 + d.omitted, 2000);
        assert!(d.omitted > 0);
        let mut r = rep(RolloutState::Confirmed, 2000);
        r.detail = d;
        let text = r.to_toml();
        assert!(
            text.len() < crate::status::MAX_REPORT_BYTES,
            "{}",
            text.len()
        );
        assert_eq!(StatusReport::from_toml(&text).unwrap(), r);
    }
}
