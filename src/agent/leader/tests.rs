//! The lease decision's tests: pure, no API server.

use super::*;

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn lease(holder: Option<&str>, renewed: &str, secs: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: holder.map(String::from),
        renew_time: Some(to_micro(t(renewed))),
        acquire_time: Some(to_micro(t(renewed))),
        lease_duration_seconds: Some(secs),
        lease_transitions: Some(3),
        ..Default::default()
    }
}

#[test]
fn no_lease_is_created() {
    assert_eq!(decide(None, "a", t("2026-01-01T00:00:00Z")), Step::Create);
}

#[test]
fn own_lease_is_renewed_even_when_expired() {
    let l = lease(Some("a"), "2026-01-01T00:00:00Z", 15);
    assert_eq!(
        decide(Some(&l), "a", t("2026-01-01T00:00:05Z")),
        Step::Renew
    );
    // Expired but still ours: renewing is safe, nobody else took it.
    assert_eq!(
        decide(Some(&l), "a", t("2026-01-01T01:00:00Z")),
        Step::Renew
    );
}

#[test]
fn someone_elses_live_lease_is_waited_for_until_it_expires() {
    let l = lease(Some("b"), "2026-01-01T00:00:00Z", 15);
    let wait = Step::Wait {
        holder: "b".into(),
        until: t("2026-01-01T00:00:15Z"),
    };
    assert_eq!(decide(Some(&l), "a", t("2026-01-01T00:00:10Z")), wait);
    // Exactly at renewTime + duration it is not yet expired (strictly less than now).
    assert_eq!(decide(Some(&l), "a", t("2026-01-01T00:00:15Z")), wait);
    assert_eq!(
        decide(Some(&l), "a", t("2026-01-01T00:00:15.000001Z")),
        Step::Acquire
    );
}

#[test]
fn free_or_incomplete_lease_is_acquired() {
    let released = lease(None, "2026-01-01T00:00:00Z", 15);
    assert_eq!(
        decide(Some(&released), "a", t("2026-01-01T00:00:01Z")),
        Step::Acquire
    );
    let empty = lease(Some(""), "2026-01-01T00:00:00Z", 15);
    assert_eq!(
        decide(Some(&empty), "a", t("2026-01-01T00:00:01Z")),
        Step::Acquire
    );
    let no_time = LeaseSpec {
        holder_identity: Some("b".into()),
        ..Default::default()
    };
    assert_eq!(
        decide(Some(&no_time), "a", t("2026-01-01T00:00:01Z")),
        Step::Acquire
    );
}

#[test]
fn takeover_counts_a_transition_and_renewal_does_not() {
    let now = t("2026-01-01T00:01:00Z");
    let l = lease(Some("b"), "2026-01-01T00:00:00Z", 15);
    let taken = next_spec(Some(&l), &Step::Acquire, "a", Duration::from_secs(15), now);
    assert_eq!(taken.holder_identity.as_deref(), Some("a"));
    assert_eq!(taken.lease_transitions, Some(4));
    assert_eq!(taken.renew_time, Some(to_micro(now)));
    assert_eq!(taken.acquire_time, Some(to_micro(now)));
    let later = t("2026-01-01T00:01:05Z");
    let renewed = next_spec(
        Some(&taken),
        &Step::Renew,
        "a",
        Duration::from_secs(15),
        later,
    );
    assert_eq!(renewed.lease_transitions, Some(4));
    assert_eq!(renewed.acquire_time, Some(to_micro(now)));
    assert_eq!(renewed.renew_time, Some(to_micro(later)));
    let created = next_spec(None, &Step::Create, "a", Duration::from_secs(15), now);
    assert_eq!(created.lease_transitions, Some(0));
    assert_eq!(created.lease_duration_seconds, Some(15));
}

#[test]
fn timings_must_nest() {
    let ok = LeaseConfig::new("ns", "l", "a", Duration::from_secs(15));
    assert!(ok.validate().is_ok());
    let mut bad = ok.clone();
    bad.renew_deadline = Duration::from_secs(20);
    assert!(bad.validate().is_err());
}

#[test]
fn a_write_started_while_leading_ends_before_the_lease_can_be_taken() {
    let c = LeaseConfig::new("ns", "l", "a", Duration::from_secs(15));
    assert_eq!(c.write_timeout(), Duration::from_secs(4));
    for secs in [1, 3, 15, 60] {
        let c = LeaseConfig::new("ns", "l", "a", Duration::from_secs(secs));
        assert!(
            c.renew_deadline + c.write_timeout() < c.duration,
            "{secs}s: {c:?}"
        );
        assert!(!c.write_timeout().is_zero());
    }
}

#[test]
fn no_two_replicas_share_the_default_identity() {
    let (a, b) = (
        crate::agent::default_identity(),
        crate::agent::default_identity(),
    );
    assert_ne!(a, b);
    assert!(
        a.starts_with("drover-") && a.len() == "drover-".len() + 16,
        "{a}"
    );
    assert_ne!(a, format!("drover-{}", std::process::id()));
}
