//! The gate's pure core (docs/design.md §4): values in, decision out, no I/O.

use crate::support::time::t;
use drover::gate::{
    judge, Basis, Decision, GateRequest, Lower, LowerEvidence, LowerHistory, Reason,
};
use semver::Version;
use std::collections::BTreeMap;
use std::time::Duration;

fn v(s: &str) -> Version {
    s.parse().expect("test version")
}

const DAY: Duration = Duration::from_secs(24 * 3600);

fn status_lower(env: &str, clusters: &[&str], confirmed: &[(&str, &str)]) -> Lower {
    Lower {
        env: env.into(),
        clusters: clusters.iter().map(|c| c.to_string()).collect(),
        evidence: LowerEvidence::Status {
            branch: "drover/status".into(),
            confirmations: confirmed
                .iter()
                .map(|(c, at)| (c.to_string(), t(at)))
                .collect::<BTreeMap<_, _>>(),
            notes: BTreeMap::new(),
            held: None,
        },
    }
}

fn request(env: &str, to: &str, from: &str, lower: Option<Lower>, now: &str) -> GateRequest {
    GateRequest {
        env: env.into(),
        version: v(to),
        previous: Some(v(from)),
        allow_downgrade: false,
        soak: DAY,
        lower,
        now: t(now),
    }
}

#[test]
fn unchanged_version_is_not_judged() {
    let r = request("stage", "1.13.2", "1.13.2", None, "2026-12-01T00:00:00Z");
    assert_eq!(judge(&r), Decision::Unchanged);
}

#[test]
fn first_environment_has_no_gate() {
    let r = request("test", "1.13.2", "1.12.0", None, "2026-12-01T00:00:00Z");
    let Decision::Allowed(a) = judge(&r) else {
        panic!("expected allowed")
    };
    assert_eq!(a.basis, Basis::FirstInChain);
    assert!(a.to_string().contains("first environment"), "{a}");
}

#[test]
fn first_environment_still_may_not_downgrade() {
    let r = request("test", "1.12.0", "1.13.2", None, "2026-12-01T00:00:00Z");
    let Decision::Refused(refusal) = judge(&r) else {
        panic!("expected refused")
    };
    assert_eq!(
        refusal.reason,
        Reason::Downgrade {
            previous: v("1.13.2")
        }
    );
    let msg = refusal.to_string();
    assert!(msg.contains("allow_downgrade = true"), "{msg}");
    assert!(msg.contains("1.13.2") && msg.contains("1.12.0"), "{msg}");

    let mut r = r;
    r.allow_downgrade = true;
    let Decision::Allowed(a) = judge(&r) else {
        panic!("expected allowed")
    };
    assert!(a.downgrade);
}

#[test]
fn soak_passes_exactly_at_confirmation_plus_soak() {
    let lower = status_lower("test", &["test-1"], &[("test-1", "2026-12-01T04:12:00Z")]);
    let before = request(
        "stage",
        "1.13.2",
        "1.12.0",
        Some(lower.clone()),
        "2026-12-02T04:11:59Z",
    );
    let Decision::Refused(r) = judge(&before) else {
        panic!("expected refused")
    };
    assert!(
        matches!(r.reason, Reason::Soaking { passes_at, .. } if passes_at == t("2026-12-02T04:12:00Z"))
    );
    let msg = r.to_string();
    assert!(msg.contains("2026-12-02T04:12:00Z"), "{msg}");
    assert!(msg.contains("test-1 at 2026-12-01T04:12:00Z"), "{msg}");

    let at = request(
        "stage",
        "1.13.2",
        "1.12.0",
        Some(lower),
        "2026-12-02T04:12:00Z",
    );
    let Decision::Allowed(a) = judge(&at) else {
        panic!("expected allowed")
    };
    assert!(matches!(a.basis, Basis::Confirmed { .. }));
}

#[test]
fn soak_counts_from_the_latest_confirmation() {
    let lower = status_lower(
        "production",
        &["prod-eu-1", "prod-us-1"],
        &[
            ("prod-eu-1", "2026-12-20T03:00:00Z"),
            ("prod-us-1", "2026-12-21T09:00:00Z"),
        ],
    );
    let r = request(
        "dr",
        "1.13.2",
        "1.12.0",
        Some(lower),
        "2026-12-22T00:00:00Z",
    );
    let Decision::Refused(refusal) = judge(&r) else {
        panic!("expected refused")
    };
    assert!(
        matches!(refusal.reason, Reason::Soaking { passes_at, .. } if passes_at == t("2026-12-22T09:00:00Z"))
    );
}

#[test]
fn missing_confirmations_are_named() {
    let lower = status_lower(
        "stage",
        &["stage-1", "stage-2"],
        &[
            ("stage-1", "2026-12-08T05:00:00Z"),
            ("other-cluster", "2026-12-08T05:00:00Z"),
        ],
    );
    let r = request(
        "production",
        "1.13.2",
        "1.12.0",
        Some(lower),
        "2026-12-19T00:00:00Z",
    );
    let Decision::Refused(refusal) = judge(&r) else {
        panic!("expected refused")
    };
    let Reason::NotConfirmed {
        confirmed, missing, ..
    } = &refusal.reason
    else {
        panic!("expected not confirmed: {refusal}")
    };
    assert_eq!(missing, &[("stage-2".to_string(), None)]);
    assert_eq!(
        confirmed,
        &[("stage-1".to_string(), t("2026-12-08T05:00:00Z"))]
    );
    let msg = refusal.to_string();
    assert!(msg.contains("not confirmed by: stage-2"), "{msg}");
    assert!(!msg.contains("other-cluster"), "{msg}");
}

#[test]
fn lower_environment_without_clusters_refuses() {
    let lower = status_lower("stage", &[], &[]);
    let r = request(
        "production",
        "1.13.2",
        "1.12.0",
        Some(lower),
        "2026-12-19T00:00:00Z",
    );
    assert!(matches!(
        judge(&r),
        Decision::Refused(ref x) if matches!(x.reason, Reason::NoLowerClusters { .. })
    ));
}

#[test]
fn new_environment_is_gated_without_downgrade_check() {
    let lower = status_lower("test", &["test-1"], &[]);
    let mut r = request(
        "stage",
        "1.0.0",
        "1.0.0",
        Some(lower),
        "2026-12-19T00:00:00Z",
    );
    r.previous = None;
    assert!(matches!(
        judge(&r),
        Decision::Refused(ref x) if matches!(x.reason, Reason::NotConfirmed { .. })
    ));
}

#[test]
fn history_evidence() {
    let lower = |h| Lower {
        env: "test".into(),
        clusters: vec!["test-1".into()],
        evidence: LowerEvidence::History(h),
    };
    let since = LowerHistory::AtVersionSince {
        since: t("2026-12-01T00:00:00Z"),
        commit: "0123456789abcdef".into(),
    };
    let early = request(
        "stage",
        "1.13.2",
        "1.12.0",
        Some(lower(since.clone())),
        "2026-12-01T12:00:00Z",
    );
    let Decision::Refused(r) = judge(&early) else {
        panic!("expected refused")
    };
    assert!(
        r.to_string().contains("passes at 2026-12-02T00:00:00Z"),
        "{r}"
    );

    let late = request(
        "stage",
        "1.13.2",
        "1.12.0",
        Some(lower(since)),
        "2026-12-02T00:00:00Z",
    );
    assert!(
        matches!(judge(&late), Decision::Allowed(ref a) if matches!(a.basis, Basis::History { .. }))
    );

    let other = request(
        "stage",
        "1.13.3",
        "1.12.0",
        Some(lower(LowerHistory::AtOtherVersion(Some(v("1.13.2"))))),
        "2026-12-09T00:00:00Z",
    );
    let Decision::Refused(r) = judge(&other) else {
        panic!("expected refused")
    };
    assert!(
        r.to_string()
            .contains("test is configured at 1.13.2, not 1.13.3"),
        "{r}"
    );
}
