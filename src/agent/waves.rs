//! The wave gate and the fleet-wide halt for this agent's cluster
//! (docs/design.md §4a): what its environment's other clusters reported
//! is read by the one reader (`crate::admit::env_evidence`, the policy in
//! force at the applied commit) when the status store, the applied commit
//! or the target moves, or a poll interval after the last read; each pass
//! then asks the pure `crate::gate::wave::judge`. A fetch (each poll, and
//! each push webhook, status branches included) brings the branches.
//!
//! Missing evidence holds: a store that cannot be read, a branch of the
//! environment that does not count, an applied config that cannot be read
//! hold every wave (no node starts) rather than open it. And the agent
//! remembers the trusted failures it has seen for its target (at most
//! [`MAX_REMEMBERED`], in its `DroverStatus`, so a restart or another
//! leader keeps them): a branch rewritten or broken after its `failed`
//! cannot lift the halt. A remembered failure ends only as a failure in the
//! store does: that cluster's own later trusted report of the version, a
//! new pin, or the version revoked.

use super::crd::SeenFailure;
use super::{blocking, lock, Acting, Active, ClusterBackend};
use crate::gate::wave::{self, EnvEvidence, WaveGate};
use chrono::{DateTime, SecondsFormat, Utc};
use git2::Oid;
use semver::Version;

/// Most failures remembered (the newest are kept).
pub const MAX_REMEMBERED: usize = 32;
/// Longest message kept of a remembered failure.
const MAX_REMEMBERED_MESSAGE: usize = 256;

/// The evidence as last read, and what it was read at.
pub(super) struct Read {
    store: u64,
    applied: Oid,
    version: Version,
    at: DateTime<Utc>,
    evidence: EnvEvidence,
}

impl<B: ClusterBackend> Acting<B> {
    /// The wave gate for this cluster and `active`'s version at `now`.
    pub(super) async fn wave_gate(&mut self, active: &Active, now: DateTime<Utc>) -> WaveGate {
        let store = self.store_state().await;
        let fresh = self.cluster.waves_read.as_ref().is_some_and(|r| {
            r.stands(
                store,
                active.commit,
                &active.env.version,
                now,
                self.cfg.poll,
            )
        });
        if !fresh {
            let src = self.source.clone();
            let (env, own, version, applied) = (
                self.cfg.env.clone(),
                self.cfg.cluster.clone(),
                active.env.version.clone(),
                active.commit,
            );
            let evidence = blocking(move || {
                let s = lock(&src);
                crate::admit::env_evidence(s.repo(), applied, &env, Some(&own), &version, now)
            })
            .await
            .unwrap_or_else(|| {
                Err(crate::admit::Error::Git(git2::Error::from_str(
                    "the task reading the status store failed",
                )))
            })
            .unwrap_or_else(|e| unreadable(&e));
            self.cluster.waves_read = Some(Read {
                store,
                applied: active.commit,
                version: active.env.version.clone(),
                at: now,
                evidence,
            });
        }
        let mut evidence = self
            .cluster
            .waves_read
            .as_ref()
            .map(|r| r.evidence.clone())
            .unwrap_or_default();
        let remembered = remember(
            &self.told.status().failures_seen,
            &mut evidence,
            &self.cfg.cluster,
            &active.env.version,
            active.revoked.is_some(),
        );
        let gate = wave::judge(&wave::WaveRequest {
            env: &self.cfg.env,
            cluster: &self.cfg.cluster,
            version: &active.env.version,
            waves: &active.waves,
            failure_budget: active.failure_budget,
            evidence: &evidence,
            now,
        });
        self.told.evidence(
            remembered,
            gate.held().map(str::to_owned),
            match &gate {
                WaveGate::Halted(h) => h.failed.iter().map(|(c, _)| c.clone()).collect(),
                _ => Vec::new(),
            },
        );
        gate
    }
}

impl Read {
    /// Whether this read still stands at `now`: the store (other clusters'
    /// branches), the applied commit and the version are as it read them,
    /// and a poll interval has not passed (what a report's signature or
    /// commit time allows depends on the time).
    fn stands(
        &self,
        store: u64,
        applied: Oid,
        version: &Version,
        now: DateTime<Utc>,
        poll: std::time::Duration,
    ) -> bool {
        self.store == store
            && self.applied == applied
            && &self.version == version
            && now - self.at < chrono::Duration::from_std(poll).unwrap_or_default()
    }
}

/// The evidence of a read of the store that failed: held, so no wave opens
/// (missing evidence holds).
fn unreadable(e: &dyn std::fmt::Display) -> EnvEvidence {
    tracing::warn!(error = %e, "cannot read the environment's status reports");
    EnvEvidence {
        held: Some(format!("the status store cannot be read: {e}")),
        ..Default::default()
    }
}

/// The failures to remember after a read of the store, given those
/// remembered before: each standing failure the store shows (of another
/// cluster, for `version`), and each remembered one the store no longer
/// shows unless it ended (that cluster's newer trusted report of the
/// version says something else). `evidence.failed` gains the remembered
/// ones. Failures of other versions are dropped (a new pin ends them), and
/// every one when `version` is revoked. The newest [`MAX_REMEMBERED`] are kept.
pub(super) fn remember(
    before: &[SeenFailure],
    evidence: &mut EnvEvidence,
    own: &str,
    version: &Version,
    revoked: bool,
) -> Vec<SeenFailure> {
    if revoked {
        return Vec::new();
    }
    let v = version.to_string();
    let time = |s: &str| DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc));
    for f in before.iter().filter(|f| f.version == v && f.cluster != own) {
        let Ok(at) = time(&f.at) else { continue };
        let ended = evidence
            .latest
            .get(&f.cluster)
            .is_some_and(|(newer, failed)| *newer > at && !failed);
        if ended || evidence.failed.contains_key(&f.cluster) {
            continue;
        }
        evidence.failed.insert(
            f.cluster.clone(),
            wave::Failure {
                at,
                message: format!(
                    "{} (remembered: its branch no longer shows it as trusted)",
                    f.message
                ),
            },
        );
    }
    let mut out: Vec<SeenFailure> = evidence
        .failed
        .iter()
        .filter(|(c, _)| c.as_str() != own)
        .map(|(c, f)| SeenFailure {
            cluster: c.clone(),
            version: v.clone(),
            at: f.at.to_rfc3339_opts(SecondsFormat::Secs, true),
            message: cut(f
                .message
                .strip_suffix(" (remembered: its branch no longer shows it as trusted)")
                .unwrap_or(&f.message)),
        })
        .collect();
    out.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.cluster.cmp(&b.cluster)));
    out.truncate(MAX_REMEMBERED);
    out
}

fn cut(s: &str) -> String {
    let end = (0..=s.len().min(MAX_REMEMBERED_MESSAGE))
        .rev()
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0);
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn seen(cluster: &str, version: &str, at: &str) -> SeenFailure {
        SeenFailure {
            cluster: cluster.into(),
            version: version.into(),
            at: at.into(),
            message: "node n-1 failed".into(),
        }
    }

    #[test]
    fn a_failure_seen_once_stands_until_its_cluster_reports_the_version_again() {
        let v = Version::new(1, 13, 0);
        let before = vec![seen("prod-1", "1.13.0", "2026-12-20T03:00:00Z")];
        // The store no longer shows it (the branch was rewritten or broken).
        let mut ev = EnvEvidence::default();
        let kept = remember(&before, &mut ev, "prod-2", &v, false);
        assert_eq!(kept, before);
        assert!(ev.failed["prod-1"].message.contains("remembered"));
        // An older report of that cluster, or a newer `failed`, ends nothing.
        let mut ev = EnvEvidence::default();
        ev.latest
            .insert("prod-1".into(), (t("2026-12-20T02:00:00Z"), false));
        assert_eq!(remember(&before, &mut ev, "prod-2", &v, false), before);
        // Nor does one of the failure's own second: a report ends it only
        // when it is later (a rewritten branch can restamp a report).
        let mut ev = EnvEvidence::default();
        ev.latest
            .insert("prod-1".into(), (t("2026-12-20T03:00:00Z"), false));
        assert_eq!(remember(&before, &mut ev, "prod-2", &v, false), before);
        // Its own later trusted report of the version ends it.
        let mut ev = EnvEvidence::default();
        ev.latest
            .insert("prod-1".into(), (t("2026-12-20T04:00:00Z"), false));
        assert!(remember(&before, &mut ev, "prod-2", &v, false).is_empty());
        assert!(ev.failed.is_empty());
        // A new pin, or the version revoked, ends it.
        let mut ev = EnvEvidence::default();
        assert!(remember(&before, &mut ev, "prod-2", &Version::new(1, 14, 0), false).is_empty());
        assert!(remember(&before, &mut ev, "prod-2", &v, true).is_empty());
        // The agent's own failure is its own state, never remembered.
        let mut ev = EnvEvidence::default();
        assert!(remember(&before, &mut ev, "prod-1", &v, false).is_empty());
    }

    #[test]
    fn a_read_stands_until_the_store_the_applied_commit_or_the_version_moves_or_a_poll_passes() {
        let at = t("2026-12-20T03:00:00Z");
        let applied = Oid::from_str("1111111111111111111111111111111111111111").unwrap();
        let v = Version::new(1, 13, 0);
        let read = Read {
            store: 7,
            applied,
            version: v.clone(),
            at,
            evidence: EnvEvidence::default(),
        };
        let poll = std::time::Duration::from_secs(60);
        let secs = chrono::Duration::seconds;
        // Nothing moved: read again only once a poll interval has passed.
        assert!(read.stands(7, applied, &v, at, poll));
        assert!(read.stands(7, applied, &v, at + secs(59), poll));
        assert!(!read.stands(7, applied, &v, at + secs(60), poll));
        // Another cluster's branch, the applied commit or the version moved.
        assert!(!read.stands(8, applied, &v, at, poll));
        assert!(!read.stands(
            7,
            Oid::from_str("2222222222222222222222222222222222222222").unwrap(),
            &v,
            at,
            poll
        ));
        assert!(!read.stands(7, applied, &Version::new(1, 14, 0), at, poll));
    }

    #[test]
    fn a_store_that_cannot_be_read_holds_even_the_first_wave() {
        let v = Version::new(1, 13, 0);
        let evidence = unreadable(&"object not found");
        let gate = wave::judge(&wave::WaveRequest {
            env: "production",
            cluster: "prod-1",
            version: &v,
            waves: &[wave::Wave {
                clusters: vec!["prod-1".into(), "prod-2".into()],
                soak: std::time::Duration::ZERO,
                max_concurrency: None,
            }],
            failure_budget: 0,
            evidence: &evidence,
            now: t("2026-12-20T03:00:00Z"),
        });
        assert!(matches!(gate, WaveGate::Held { .. }), "{gate:?}");
        assert!(gate.held().is_some_and(|w| w.contains("object not found")));
    }

    #[test]
    fn what_is_remembered_is_bounded_and_keeps_the_newest() {
        let v = Version::new(1, 13, 0);
        let mut ev = EnvEvidence::default();
        for i in 0..100 {
            ev.failed.insert(
                format!("c-{i:03}"),
                wave::Failure {
                    at: t("2026-12-20T00:00:00Z") + chrono::Duration::minutes(i),
                    message: "x".repeat(10_000),
                },
            );
        }
        let kept = remember(&[], &mut ev, "own", &v, false);
        assert_eq!(kept.len(), MAX_REMEMBERED);
        assert_eq!(kept[0].cluster, "c-099");
        assert!(kept
            .iter()
            .all(|f| f.message.len() <= MAX_REMEMBERED_MESSAGE));
    }
}
