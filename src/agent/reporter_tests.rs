//! `reporter.rs`'s tests, in a file of their own so the reporter stays readable.

use super::*;

fn report(version: &str, state: RolloutState, at: u32) -> Outgoing {
    Outgoing {
        report: StatusReport {
            env: "stage".into(),
            cluster: "stage-1".into(),
            config_commit: "c".repeat(40),
            version: version.parse().unwrap(),
            state,
            since: "2026-12-08T02:00:00Z".parse().unwrap(),
            nodes: 4,
            nodes_at_version: at,
            message: String::new(),
            detail: Default::default(),
        },
        branch: "drover/status".into(),
        progress_interval: Duration::from_secs(600),
    }
}

fn states(o: &Outbox) -> Vec<(String, RolloutState, u32)> {
    o.reports()
        .iter()
        .map(|r| (r.version.to_string(), r.state, r.nodes_at_version))
        .collect()
}

#[test]
fn progress_is_coalesced_and_every_change_of_state_is_kept_in_order() {
    let mut o = Outbox::default();
    o.offer(report("1.13.0", RolloutState::Pending, 0));
    o.offer(report("1.13.0", RolloutState::Rolling, 1));
    o.offer(report("1.13.0", RolloutState::Rolling, 2));
    o.offer(report("1.13.0", RolloutState::Blocked, 2));
    o.offer(report("1.13.0", RolloutState::Rolling, 3));
    assert_eq!(
        states(&o),
        [
            ("1.13.0".into(), RolloutState::Pending, 0),
            ("1.13.0".into(), RolloutState::Rolling, 2),
            ("1.13.0".into(), RolloutState::Blocked, 2),
            ("1.13.0".into(), RolloutState::Rolling, 3),
        ]
    );
    assert_eq!(o.dropped, 0);
}

#[test]
fn evidence_is_kept_in_order_and_replaced_only_by_a_newer_one_of_its_kind() {
    let mut o = Outbox::default();
    o.offer(report("1.13.0", RolloutState::Failed, 1));
    o.offer(report("1.13.0", RolloutState::Failed, 2));
    o.offer(report("1.13.0", RolloutState::Rolling, 2));
    o.offer(report("1.13.0", RolloutState::Confirmed, 4));
    o.offer(report("1.13.1", RolloutState::Rolling, 0));
    assert_eq!(
        states(&o),
        [
            ("1.13.0".into(), RolloutState::Failed, 2),
            ("1.13.0".into(), RolloutState::Rolling, 2),
            ("1.13.0".into(), RolloutState::Confirmed, 4),
            ("1.13.1".into(), RolloutState::Rolling, 0),
        ]
    );
}

#[test]
fn held_progress_waits_for_its_interval_and_gives_way_to_a_newer_state() {
    let t0: DateTime<Utc> = "2026-12-08T02:00:00Z".parse().unwrap();
    let pushed = report("1.13.0", RolloutState::Rolling, 1).report;
    let mut o = Outbox::default();
    o.offer(report("1.13.0", RolloutState::Rolling, 2));
    let at = t0 + chrono::Duration::seconds(30);
    let due = t0 + chrono::Duration::seconds(600);
    assert!(matches!(o.next(Some((&pushed, t0)), at), Next::Until(d) if d == due));
    assert!(
        matches!(o.next(Some((&pushed, t0)), due), Next::Push(w) if w.len() == 1 && w[0].out.report.nodes_at_version == 2)
    );
    // A state change behind held progress goes out at once, carrying it.
    o.offer(report("1.13.0", RolloutState::Blocked, 2));
    match o.next(Some((&pushed, t0)), at) {
        Next::Push(w) => assert_eq!(
            w.iter().map(|w| w.out.report.state).collect::<Vec<_>>(),
            [RolloutState::Blocked]
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(o.len(), 1);
    // What the remote already holds is not pushed again.
    let mut o = Outbox::default();
    o.offer(report("1.13.0", RolloutState::Rolling, 1));
    assert!(matches!(o.next(Some((&pushed, t0)), at), Next::Idle));
}

/// The reporter's loop in virtual time against a remote whose pushes
/// take `durations` in turn (a `None` fails after that time, and is
/// retried 1 s later): the reports that landed, and when.
fn drive(
    offers: &[(i64, Outgoing)],
    durations: &[(i64, bool)],
) -> (Vec<(StatusReport, DateTime<Utc>)>, Outbox) {
    let t0: DateTime<Utc> = "2026-12-08T02:00:00Z".parse().unwrap();
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let mut o = Outbox::default();
    let mut remote: Vec<(StatusReport, DateTime<Utc>)> = Vec::new();
    let (mut t, mut i, mut attempt) = (t0, 0, 0);
    let deliver = |o: &mut Outbox, i: &mut usize, until: DateTime<Utc>| {
        while *i < offers.len() && at(offers[*i].0) <= until {
            o.offer(offers[*i].1.clone());
            *i += 1;
        }
    };
    loop {
        deliver(&mut o, &mut i, t);
        let last = remote.last().map(|(r, t)| (r, *t));
        let next_offer = offers.get(i).map(|(s, _)| at(*s));
        match o.next(last, t) {
            Next::Push(chain) => {
                let (secs, ok) = durations[attempt % durations.len()];
                attempt += 1;
                let end = t + chrono::Duration::seconds(secs);
                deliver(&mut o, &mut i, end);
                if ok {
                    o.done(chain.last().unwrap().seq);
                    remote.extend(chain.into_iter().map(|w| (w.out.report, t)));
                    t = end;
                } else {
                    t = end + chrono::Duration::seconds(1);
                }
            }
            Next::Until(due) => t = next_offer.map_or(due, |n| n.min(due)),
            Next::Idle => match next_offer {
                Some(n) => t = n,
                None => return (remote, o),
            },
        }
    }
}

fn run_of(r: &StatusReport) -> (RolloutState, semver::Version) {
    (r.state, r.version.clone())
}

/// Consecutive duplicates removed.
fn runs<'a>(
    reports: impl Iterator<Item = &'a StatusReport>,
) -> Vec<(RolloutState, semver::Version)> {
    let mut v: Vec<(RolloutState, semver::Version)> = Vec::new();
    for r in reports {
        if v.last() != Some(&run_of(r)) {
            v.push(run_of(r));
        }
    }
    v
}

proptest::proptest! {
    /// Whatever the order and pace of reports and however slow or
    /// failing the pushes: every change of state reaches the remote in
    /// order, the newest report is the last one on it, and progress
    /// alone is never pushed more often than the interval allows.
    #[test]
    fn no_change_of_state_is_lost(
        steps in proptest::collection::vec((0i64..120, 0usize..8, 0u32..5, proptest::prelude::any::<bool>()), 1..60),
        durations in proptest::collection::vec((0i64..60, proptest::prelude::any::<bool>()), 1..8),
    ) {
        let mut durations = durations;
        // The remote takes a push now and then.
        durations.push((5, true));
        let mut t = 0;
        let mut offers = Vec::new();
        let mut at = 0u32;
        for (gap, state, more, newer) in steps {
            t += gap;
            at += more;
            let version = if newer { "1.14.0" } else { "1.13.0" };
            offers.push((t, report(version, RolloutState::ALL[state], at)));
        }
        let (remote, o) = drive(&offers, &durations);
        let offered: Vec<&StatusReport> = offers.iter().map(|(_, o)| &o.report).collect();
        let landed: Vec<&StatusReport> = remote.iter().map(|(r, _)| r).collect();
        let (offered_runs, landed_runs) = (runs(offered.iter().copied()), runs(landed.iter().copied()));
        if o.dropped == 0 {
            proptest::prop_assert_eq!(&offered_runs, &landed_runs);
        } else {
            // More than MAX_WAITING changes waited on a failing remote:
            // some were dropped, in order, the newest never.
            let mut rest = offered_runs.iter();
            proptest::prop_assert!(landed_runs.iter().all(|r| rest.any(|o| o == r)));
        }
        proptest::prop_assert_eq!(landed.last(), offered.last());
        for w in remote.windows(2) {
            if run_of(&w[0].0) == run_of(&w[1].0) && w[0].0.state == RolloutState::Rolling {
                proptest::prop_assert!(w[1].1 - w[0].1 >= chrono::Duration::seconds(600));
            }
        }
    }
}

/// A starved forge: every push takes 40 s while the cluster moves on
/// every 10 s. What waited goes in one push, a commit each, so the
/// final state lands with the second push instead of queueing behind
/// one push per change of state.
#[test]
fn an_agent_behind_a_slow_server_catches_up_in_one_push_with_every_state_in_order() {
    let offers = [
        (0, report("1.13.0", RolloutState::Pending, 0)),
        (10, report("1.13.0", RolloutState::Rolling, 1)),
        (20, report("1.13.0", RolloutState::Rolling, 2)),
        (25, report("1.13.0", RolloutState::Blocked, 2)),
        (30, report("1.13.0", RolloutState::Rolling, 3)),
        (35, report("1.13.0", RolloutState::Confirmed, 4)),
    ];
    let (remote, o) = drive(&offers, &[(40, true)]);
    let t0: DateTime<Utc> = "2026-12-08T02:00:00Z".parse().unwrap();
    let landed: Vec<(RolloutState, u32, i64)> = remote
        .iter()
        .map(|(r, t)| (r.state, r.nodes_at_version, (*t - t0).num_seconds()))
        .collect();
    // First push at 0 s; the second, at 40 s, carries all that waited
    // then (progress 1 replaced by progress 2 while it waited).
    assert_eq!(
        landed,
        [
            (RolloutState::Pending, 0, 0),
            (RolloutState::Rolling, 2, 40),
            (RolloutState::Blocked, 2, 40),
            (RolloutState::Rolling, 3, 40),
            (RolloutState::Confirmed, 4, 40),
        ]
    );
    assert_eq!(o.len(), 0);
    // A report that replaced the newest of a chain while it was pushed
    // stays to be pushed after it.
    let mut o = Outbox::default();
    o.offer(report("1.13.0", RolloutState::Blocked, 2));
    o.offer(report("1.13.0", RolloutState::Rolling, 3));
    let Next::Push(chain) = o.next(None, t0) else {
        panic!("a chain")
    };
    o.offer(report("1.13.0", RolloutState::Rolling, 4));
    o.done(chain.last().unwrap().seq);
    assert_eq!(states(&o), [("1.13.0".into(), RolloutState::Rolling, 4)]);
}

#[test]
fn the_outbox_is_bounded_and_never_drops_the_newest() {
    let mut o = Outbox::default();
    for minor in 0..40 {
        o.offer(report(&format!("1.{minor}.0"), RolloutState::Confirmed, 4));
    }
    o.offer(report("2.0.0", RolloutState::Rolling, 1));
    assert_eq!(o.len(), MAX_WAITING);
    assert_eq!(o.dropped, 40 + 1 - MAX_WAITING as u64);
    let last = o.reports().last().map(|r| (r.version.to_string(), r.state));
    assert_eq!(last, Some(("2.0.0".into(), RolloutState::Rolling)));
}

#[test]
fn only_the_report_attempted_is_removed_when_it_lands() {
    let mut o = Outbox::default();
    o.offer(report("1.13.0", RolloutState::Rolling, 1));
    let first = o.front().unwrap();
    // Superseded while its push was under way.
    o.offer(report("1.13.0", RolloutState::Rolling, 2));
    o.done(first.seq);
    assert_eq!(states(&o), [("1.13.0".into(), RolloutState::Rolling, 2)]);
}

#[test]
fn an_attempt_takes_the_poll_interval_within_bounds_well_inside_the_progress_interval() {
    assert_eq!(
        attempt_budget(Duration::from_secs(60)),
        Duration::from_secs(60)
    );
    assert_eq!(
        attempt_budget(Duration::from_secs(30)),
        Duration::from_secs(30)
    );
    assert_eq!(
        attempt_budget(Duration::from_millis(2500)),
        Duration::from_secs(5)
    );
    assert_eq!(
        attempt_budget(Duration::from_secs(3600)),
        Duration::from_secs(60)
    );
    // Abandoned well before its progress would be superseded.
    assert!(
        attempt_budget(Duration::from_secs(3600)) * 10 <= crate::config::DEFAULT_PROGRESS_INTERVAL
    );
}
