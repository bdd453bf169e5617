//! What a cluster's nodes ran over time, read from its status reports (the
//! timeline's rows). Pure: reports in, drawn values out.
//!
//! A report says how many selected nodes run its version (`nodes`,
//! `nodes_at_version`), not what the others run; they run what they ran at
//! the report before. So the mix is carried from report to report: the
//! nodes at the report's version are taken from the other versions oldest
//! first (an upgrade moves the oldest nodes), and nodes no report accounts
//! for (a grown cluster, the first report's other nodes) are shown as
//! unknown rather than guessed. A `refused` report names the refused version
//! while its counts are of the version the cluster stays on, so it changes
//! no mix: it is an event. Nothing is drawn solid past `now`.

use super::model::{Alarm, Event, EventKind, Mark, Run, TimelineRow, VersionCount, Waiting};
use super::reports::Entry;
use crate::rollout::RolloutState;
use chrono::{DateTime, Utc};
use semver::Version;

/// The mix of versions after `r`, given the mix before it (`prev`, oldest
/// version first, unknown first of all).
pub fn mix_after(prev: &[VersionCount], r: &crate::status::StatusReport) -> Vec<VersionCount> {
    let target = r.version.to_string();
    let at = r.nodes_at_version.min(r.nodes);
    let mut rest = r.nodes - at;
    // The other versions the nodes ran, newest first: the oldest give way.
    let mut others: Vec<VersionCount> = prev
        .iter()
        .filter(|c| c.version.as_deref() != Some(target.as_str()) && c.nodes > 0)
        .cloned()
        .collect();
    others.reverse();
    let mut out = Vec::new();
    for mut c in others {
        let keep = c.nodes.min(rest);
        rest -= keep;
        c.nodes = keep;
        if keep > 0 {
            out.push(c);
        }
    }
    if rest > 0 {
        match out.iter_mut().find(|c| c.version.is_none()) {
            Some(u) => u.nodes += rest,
            None => out.push(VersionCount {
                version: None,
                nodes: rest,
            }),
        }
    }
    if at > 0 {
        out.push(VersionCount {
            version: Some(target),
            nodes: at,
        });
    }
    sort(&mut out);
    out
}

/// Oldest version first, unknown first of all.
fn sort(mix: &mut [VersionCount]) {
    let key = |c: &VersionCount| c.version.as_deref().and_then(|v| Version::parse(v).ok());
    mix.sort_by_key(key);
}

/// One cluster's row from its reports (oldest first), over `[from, now]`;
/// `next_window` is when its environment's next window opens, so a
/// cluster still waiting at `now` is drawn waiting (hatched) until then.
/// Refusals in the reports come back as events.
pub fn row(
    cluster: &str,
    env: &str,
    reports: &[&Entry],
    from: DateTime<Utc>,
    now: DateTime<Utc>,
    next_window: Option<DateTime<Utc>>,
) -> (TimelineRow, Vec<Event>) {
    let mut out = TimelineRow {
        cluster: cluster.to_owned(),
        reported: !reports.is_empty(),
        runs: Vec::new(),
        pending: Vec::new(),
        alarms: Vec::new(),
        confirmations: Vec::new(),
        wave: None,
        windows: Vec::new(),
        waits_on: None,
    };
    let mut events = Vec::new();
    let mut mix: Vec<VersionCount> = Vec::new();
    // Only what was reported by `now` is drawn.
    let reports: Vec<&&Entry> = reports.iter().filter(|e| e.report.since <= now).collect();
    for (i, e) in reports.iter().enumerate() {
        let r = &e.report;
        let next = reports.get(i + 1).map(|n| n.report.since.max(r.since));
        let end = next.unwrap_or(now).min(now);
        if r.state == RolloutState::Refused {
            events.push(Event {
                at: r.since,
                kind: EventKind::Refused,
                env: Some(env.to_owned()),
                cluster: Some(cluster.to_owned()),
                version: r.version.to_string(),
                message: r.message.clone(),
                commit: None,
            });
        } else {
            mix = mix_after(&mix, r);
        }
        if end < from {
            continue;
        }
        let start = r.since.max(from);
        if !mix.is_empty() {
            out.runs.push(Run {
                start,
                end,
                versions: mix.clone(),
                state: r.state.as_str().to_owned(),
                target: r.version.to_string(),
                message: r.message.clone(),
                status_commit: e.commit.to_string(),
                trust: e.trust,
                signer: e.signer.clone(),
            });
        }
        match r.state {
            RolloutState::Pending | RolloutState::Paused => {
                // The newest report still waiting: until the window it waits for.
                let until = match next {
                    Some(n) => n,
                    None => next_window.filter(|w| *w > now).unwrap_or(now),
                };
                out.pending.push(Waiting {
                    start,
                    end: until,
                    version: r.version.to_string(),
                    state: r.state.as_str().to_owned(),
                    message: r.message.clone(),
                });
            }
            // A revoked version no node runs yet marks no node.
            RolloutState::Revoked if r.nodes_at_version == 0 => {}
            RolloutState::Failed
            | RolloutState::Blocked
            | RolloutState::Revoked
            | RolloutState::Halted => {
                out.alarms.push(alarm(r, start, end, &mix));
            }
            RolloutState::Confirmed => out.confirmations.push(Mark {
                at: r.since,
                version: r.version.to_string(),
                status_commit: e.commit.to_string(),
                trust: e.trust,
                signer: e.signer.clone(),
            }),
            _ => {}
        }
    }
    (out, events)
}

/// A `failed` or `blocked` report on the nodes it names (`[detail]`), a
/// `revoked` one on the nodes that run the revoked version, or on one
/// node when it names none: on the report's version when some
/// nodes run it (a health check failed after the upgrade), else on the
/// oldest version (the node did not get there).
fn alarm(
    r: &crate::status::StatusReport,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    mix: &[VersionCount],
) -> Alarm {
    let target = r.version.to_string();
    let named = match r.state {
        RolloutState::Failed => &r.detail.failed,
        RolloutState::Revoked => &r.detail.at_version,
        _ => &r.detail.blocked,
    };
    let on_target = if named.is_empty() {
        r.nodes_at_version > 0
    } else {
        named.iter().all(|n| r.detail.at_version.contains(n))
    };
    let runs = if on_target {
        Some(target.clone())
    } else {
        mix.iter()
            .find(|c| c.version.as_deref() != Some(target.as_str()))
            .and_then(|c| c.version.clone())
    };
    Alarm {
        start,
        end,
        state: r.state.as_str().to_owned(),
        version: target,
        runs,
        nodes: named.clone(),
        count: u32::try_from(named.len()).unwrap_or(u32::MAX).max(1),
        message: r.message.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{NodeDetail, StatusReport};

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn report(version: &str, state: RolloutState, at: u32, since: &str) -> StatusReport {
        StatusReport {
            env: "stage".into(),
            cluster: "stage-1".into(),
            config_commit: "0".repeat(40),
            version: version.parse().unwrap(),
            state,
            since: t(since),
            nodes: 5,
            nodes_at_version: at,
            message: String::new(),
            detail: NodeDetail::default(),
        }
    }

    fn vc(v: Option<&str>, n: u32) -> VersionCount {
        VersionCount {
            version: v.map(Into::into),
            nodes: n,
        }
    }

    #[test]
    fn the_mix_follows_the_counts_and_unknown_nodes_stay_unknown() {
        use RolloutState::*;
        let first = mix_after(&[], &report("1.13.2", Pending, 0, "2026-12-01T00:00:00Z"));
        assert_eq!(first, [vc(None, 5)]);
        let confirmed = mix_after(
            &first,
            &report("1.13.2", Confirmed, 5, "2026-12-01T03:00:00Z"),
        );
        assert_eq!(confirmed, [vc(Some("1.13.2"), 5)]);
        // Pending a newer version: every node still runs 1.13.2.
        let pending = mix_after(
            &confirmed,
            &report("1.13.3", Pending, 0, "2026-12-03T00:00:00Z"),
        );
        assert_eq!(pending, [vc(Some("1.13.2"), 5)]);
        // One node moved and failed its health check: a mixed cluster.
        let failed = mix_after(
            &pending,
            &report("1.13.3", Failed, 1, "2027-01-08T01:20:00Z"),
        );
        assert_eq!(failed, [vc(Some("1.13.2"), 4), vc(Some("1.13.3"), 1)]);
        // Then 1.13.4 over a mixed cluster: the oldest give way first.
        let rolling = mix_after(
            &failed,
            &report("1.13.4", Rolling, 2, "2027-02-08T01:00:00Z"),
        );
        assert_eq!(
            rolling,
            [
                vc(Some("1.13.2"), 2),
                vc(Some("1.13.3"), 1),
                vc(Some("1.13.4"), 2)
            ]
        );
    }

    fn entry(r: StatusReport) -> Entry {
        Entry {
            report: r,
            commit: git2::Oid::ZERO_SHA1,
            committed: t("2026-12-01T00:00:00Z"),
            trust: crate::fleet::Trust::Unverified,
            signer: None,
            untrusted: None,
        }
    }

    #[test]
    fn nothing_is_drawn_solid_past_now_and_waiting_runs_to_the_window() {
        use RolloutState::*;
        let es = [
            entry(report("1.13.2", Confirmed, 5, "2026-12-01T03:00:00Z")),
            entry(report("1.13.3", Pending, 0, "2026-12-03T00:00:00Z")),
            // From after `now`: not drawn at all.
            entry(report("1.13.3", Rolling, 1, "2027-01-01T05:00:00Z")),
        ];
        let refs: Vec<&Entry> = es.iter().collect();
        let now = t("2026-12-20T00:00:00Z");
        let (row, events) = row(
            "test-1",
            "test",
            &refs,
            t("2026-11-30T00:00:00Z"),
            now,
            Some(t("2027-01-01T05:00:00Z")),
        );
        assert!(events.is_empty());
        assert_eq!(row.runs.len(), 2);
        assert!(row.runs.iter().all(|r| r.end <= now), "{:?}", row.runs);
        assert_eq!(row.runs[1].versions, [vc(Some("1.13.2"), 5)]);
        assert_eq!(row.pending.len(), 1);
        assert_eq!(row.pending[0].end, t("2027-01-01T05:00:00Z"));
        assert_eq!(row.confirmations.len(), 1);

        let (never, _) = super::row("prod-us-1", "production", &[], now, now, None);
        assert!(!never.reported);
    }

    #[test]
    fn a_failure_is_marked_on_the_nodes_it_names_and_a_refusal_is_an_event() {
        use RolloutState::*;
        let mut failed = report("1.13.3", Failed, 1, "2027-01-08T01:20:00Z");
        failed.detail.at_version = vec!["n1".into()];
        failed.detail.failed = vec!["n1".into()];
        let mut refused = report("1.13.3", Refused, 5, "2027-01-09T00:00:00Z");
        refused.message = "commit abc refused (gate check, revoked)".into();
        let es = [
            entry(report("1.13.2", Confirmed, 5, "2026-12-08T03:00:00Z")),
            entry(failed),
            entry(refused),
        ];
        let refs: Vec<&Entry> = es.iter().collect();
        let (row, events) = row(
            "stage-1",
            "stage",
            &refs,
            t("2026-12-01T00:00:00Z"),
            t("2027-01-10T00:00:00Z"),
            None,
        );
        assert_eq!(row.alarms.len(), 1);
        let a = &row.alarms[0];
        assert_eq!((a.count, a.runs.as_deref()), (1, Some("1.13.3")));
        assert_eq!(a.nodes, ["n1"]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::Refused);
        // The refusal changed no mix.
        let last = row.runs.last().unwrap();
        assert_eq!(
            last.versions,
            [vc(Some("1.13.2"), 4), vc(Some("1.13.3"), 1)]
        );
    }

    #[test]
    fn a_version_revoked_mid_rollout_is_marked_on_the_nodes_that_run_it() {
        use RolloutState::*;
        let mut revoked = report("1.13.3", Revoked, 2, "2027-01-08T02:00:00Z");
        revoked.detail.at_version = vec!["n1".into(), "n2".into()];
        let es = [
            entry(report("1.13.2", Confirmed, 5, "2026-12-08T03:00:00Z")),
            entry(revoked),
        ];
        let refs: Vec<&Entry> = es.iter().collect();
        let (row, events) = row(
            "stage-1",
            "stage",
            &refs,
            t("2026-12-01T00:00:00Z"),
            t("2027-01-10T00:00:00Z"),
            None,
        );
        assert!(events.is_empty());
        assert_eq!(row.alarms.len(), 1);
        let a = &row.alarms[0];
        assert_eq!(a.state, "revoked");
        assert_eq!((a.count, a.runs.as_deref()), (2, Some("1.13.3")));
        assert_eq!(a.nodes, ["n1", "n2"]);
        assert_eq!(
            row.runs.last().unwrap().versions,
            [vc(Some("1.13.2"), 3), vc(Some("1.13.3"), 2)]
        );
        // Revoked before any node ran it: no node to mark.
        let none = [entry(report("1.13.3", Revoked, 0, "2027-01-08T02:00:00Z"))];
        let refs: Vec<&Entry> = none.iter().collect();
        let (row, _) = super::row(
            "stage-1",
            "stage",
            &refs,
            t("2026-12-01T00:00:00Z"),
            t("2027-01-10T00:00:00Z"),
            None,
        );
        assert!(row.alarms.is_empty());
    }
}
