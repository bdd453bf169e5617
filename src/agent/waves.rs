//! The wave gate and the fleet-wide halt for this agent's cluster
//! (docs/design.md §4a): what its environment's other clusters reported
//! is read by the one reader (`crate::admit::env_evidence`, the policy in
//! force at the applied commit) when the status store, the applied commit
//! or the target moves, or a poll interval after the last read; each pass
//! then asks the pure `crate::gate::wave::judge`. A fetch (each poll, and
//! each push webhook, status branches included) brings the branches.

use super::{blocking, lock, Acting, Active, ClusterBackend};
use crate::gate::wave::{self, EnvEvidence, WaveGate};
use chrono::{DateTime, Utc};
use git2::Oid;
use semver::Version;

/// The evidence as last read, and what it was read at.
pub(super) struct Read {
    store: u64,
    applied: Oid,
    version: Version,
    at: DateTime<Utc>,
    /// `None`: the applied commit's config could not be read, or the store could not.
    evidence: Option<(EnvEvidence, DateTime<Utc>)>,
}

impl<B: ClusterBackend> Acting<B> {
    /// The wave gate for this cluster and `active`'s version at `now`.
    pub(super) async fn wave_gate(&mut self, active: &Active, now: DateTime<Utc>) -> WaveGate {
        let store = self.store_state().await;
        let fresh = self.waves_read.as_ref().is_some_and(|r| {
            r.store == store
                && r.applied == active.commit
                && r.version == active.env.version
                && now - r.at < chrono::Duration::from_std(self.cfg.poll).unwrap_or_default()
        });
        if !fresh {
            let src = self.source.clone();
            let (env, version, applied) = (
                self.cfg.env.clone(),
                active.env.version.clone(),
                active.commit,
            );
            let evidence = blocking(move || {
                let s = lock(&src);
                crate::admit::env_evidence(s.repo(), applied, &env, &version, now)
            })
            .await
            .and_then(|r| {
                r.map_err(
                    |e| tracing::warn!(error = %e, "cannot read the environment's status reports"),
                )
                .ok()
            })
            .flatten();
            self.waves_read = Some(Read {
                store,
                applied: active.commit,
                version: active.env.version.clone(),
                at: now,
                evidence,
            });
        }
        // Nothing readable: the first wave goes as before waves; a later
        // wave has no evidence that the one before it confirmed.
        let none = (EnvEvidence::default(), DateTime::<Utc>::MIN_UTC);
        let (evidence, since) = self
            .waves_read
            .as_ref()
            .and_then(|r| r.evidence.as_ref())
            .unwrap_or(&none);
        wave::judge(&wave::WaveRequest {
            env: &self.cfg.env,
            cluster: &self.cfg.cluster,
            version: &active.env.version,
            waves: &active.waves,
            failure_budget: active.failure_budget,
            since: *since,
            evidence,
            now,
        })
    }
}
