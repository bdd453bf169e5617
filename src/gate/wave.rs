//! The wave gate (docs/design.md §4a): may a cluster of an environment
//! start a version now, given its environment's waves and what the other
//! clusters of the environment reported. Pure: values in, a [`WaveGate`]
//! out that explains itself; the evidence is read by the one reader
//! (`crate::admit::env_evidence`), judged by the policy in force.
//!
//! Where the environment's gate ([`super::judge`]) asks whether an
//! environment may take a version at all, this asks, every pass, whether
//! one of its clusters may start nodes for it yet:
//!
//! - **The halt.** Once more than `failure_budget` clusters of the
//!   environment have a standing trusted `failed` report for the version
//!   (it is still that cluster's newest trusted report of the version),
//!   no cluster starts a node for it. That cluster's own later trusted
//!   report of the version (its node retried), a new pin, a revocation of
//!   the version or a larger `failure_budget` ends it; never another
//!   environment's change nor a clock. A cluster's own failure does not
//!   halt itself: it is its `failed` state, which a retry of the node
//!   resumes (docs/design.md §5a).
//! - **Held.** When the environment's evidence cannot be read (the status
//!   store cannot be read or is refused, a branch of one of its clusters
//!   does not count), no cluster starts a node either: missing evidence
//!   holds, it never opens.
//! - **Waves.** A cluster of wave N (N > 1) may start the version only
//!   when every cluster of wave N−1 has a standing trusted confirmation of
//!   it at least wave N−1's `soak` old. Wave 1 is gated by the lower
//!   environment, as before waves.
//! - **`max_concurrency`.** Within a wave, a cluster rolls only while fewer
//!   than `max_concurrency` clusters listed before it have not confirmed
//!   the version: a fixed order every agent computes alike, so no two
//!   agents need to agree on who goes next (Argo CD's progressive sync
//!   `maxUpdate` and AKS Fleet's `maxConcurrency` count the same thing).

use chrono::{DateTime, SecondsFormat, Utc};
use semver::Version;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// One wave, resolved to cluster names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    /// Its clusters, in `drover.toml`'s order.
    pub clusters: Vec<String>,
    /// How long its clusters' confirmations must stand before the next wave starts.
    pub soak: Duration,
    /// How many of its clusters may roll at once; `None` = all.
    pub max_concurrency: Option<u32>,
}

/// `env`'s waves in `cfg`, resolved to its clusters in `drover.toml`; one
/// wave of every cluster when it has no `[[wave]]`.
pub fn waves(cfg: &crate::config::RepoConfig, env: &str) -> Vec<Wave> {
    let specs = cfg.envs.get(env).map(|e| e.waves.as_slice()).unwrap_or(&[]);
    cfg.waves(env)
        .into_iter()
        .enumerate()
        .map(|(i, clusters)| Wave {
            clusters,
            soak: specs.get(i).map_or(Duration::ZERO, |w| w.soak),
            max_concurrency: specs.get(i).and_then(|w| w.max_concurrency),
        })
        .collect()
}

/// A trusted `failed` report of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// When it was reported.
    pub at: DateTime<Utc>,
    /// What failed: the node and the check, as the report says.
    pub message: String,
}

/// What the environment's clusters reported for the version, read by the
/// one reader by the policy in force.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvEvidence {
    /// Cluster -> since when its standing trusted confirmation counts.
    pub confirmed: BTreeMap<String, DateTime<Utc>>,
    /// Cluster -> its newest trusted `failed` report.
    pub failed: BTreeMap<String, Failure>,
    /// Cluster -> why it has no standing confirmation (withdrawn, branch untrusted).
    pub notes: BTreeMap<String, String>,
    /// Why the environment's evidence is held, if it is.
    pub held: Option<String>,
    /// Cluster -> when its newest trusted report of the version was
    /// committed, and whether it says `failed` (what ends a failure the
    /// agent remembers).
    pub latest: BTreeMap<String, (DateTime<Utc>, bool)>,
}

/// Everything the wave gate needs for one cluster and one version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaveRequest<'a> {
    /// The environment.
    pub env: &'a str,
    /// The cluster asking.
    pub cluster: &'a str,
    /// The version it would start.
    pub version: &'a Version,
    /// The environment's waves; one wave of every cluster without `[[wave]]`.
    pub waves: &'a [Wave],
    /// `[rollout] failure_budget`.
    pub failure_budget: u32,
    /// What the clusters reported.
    pub evidence: &'a EnvEvidence,
    /// The time to judge at.
    pub now: DateTime<Utc>,
}

/// The wave gate's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaveGate {
    /// The cluster may start nodes (within its window and budget).
    Open {
        /// Its wave, from 1.
        wave: usize,
    },
    /// The environment is halted for the version.
    Halted(Halt),
    /// The environment's evidence is held: no node starts.
    Held {
        /// The environment.
        env: String,
        /// The version.
        version: Version,
        /// Why.
        why: String,
    },
    /// The previous wave has not confirmed the version everywhere.
    Waiting {
        /// The cluster's wave, from 1.
        wave: usize,
        /// The clusters of wave − 1 without a standing confirmation, with why when known.
        missing: Vec<(String, Option<String>)>,
    },
    /// The previous wave confirmed, but its soak has not passed.
    Soaking {
        /// The cluster's wave, from 1.
        wave: usize,
        /// When it passes.
        passes_at: DateTime<Utc>,
    },
    /// Its wave's `max_concurrency` clusters listed before it are rolling.
    Queued {
        /// The cluster's wave, from 1.
        wave: usize,
        /// The clusters ahead of it that have not confirmed.
        ahead: Vec<String>,
        /// The wave's `max_concurrency`.
        max: u32,
    },
}

/// Why an environment is halted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    /// The environment.
    pub env: String,
    /// The version.
    pub version: Version,
    /// The clusters whose failures count, with their reports.
    pub failed: Vec<(String, Failure)>,
    /// `failure_budget`.
    pub budget: u32,
    /// Why the environment's evidence is also held, if it is.
    pub held: Option<String>,
}

impl WaveGate {
    /// Whether the cluster may start nodes.
    pub fn is_open(&self) -> bool {
        matches!(self, WaveGate::Open { .. })
    }

    /// What the rollout decision is told (`rollout::Inputs::halted`,
    /// `rollout::Inputs::waiting`): the halt's message, or why the wave waits.
    pub fn holds(&self) -> (Option<String>, Option<String>) {
        match self {
            WaveGate::Open { .. } => (None, None),
            WaveGate::Halted(h) => (Some(h.to_string()), None),
            held @ WaveGate::Held { .. } => (Some(held.to_string()), None),
            other => (None, Some(other.to_string())),
        }
    }

    /// The blocker its hold is (`crate::rollout::Blocker`); `None` when open.
    pub fn blocker(&self) -> Option<crate::rollout::Blocker> {
        use crate::rollout::Blocker;
        match self {
            WaveGate::Open { .. } => None,
            WaveGate::Halted(_) => Some(Blocker::Halted),
            WaveGate::Held { .. } => Some(Blocker::Evidence),
            WaveGate::Waiting { .. } | WaveGate::Queued { .. } => Some(Blocker::Wave),
            WaveGate::Soaking { .. } => Some(Blocker::Soak),
        }
    }

    /// Why the environment's evidence is held, if it is (held alone, or
    /// beside a halt).
    pub fn held(&self) -> Option<&str> {
        match self {
            WaveGate::Held { why, .. } => Some(why),
            WaveGate::Halted(h) => h.held.as_deref(),
            _ => None,
        }
    }

    /// When the answer changes by time alone (a soak passing).
    pub fn changes_at(&self) -> Option<DateTime<Utc>> {
        match self {
            WaveGate::Soaking { passes_at, .. } => Some(*passes_at),
            _ => None,
        }
    }
}

/// The halt of `env` for `version`, if more than the budget of `clusters`
/// have a standing failure of it.
pub fn halt(
    env: &str,
    version: &Version,
    budget: u32,
    evidence: &EnvEvidence,
    clusters: &[String],
) -> Option<Halt> {
    let failed: Vec<(String, Failure)> = evidence
        .failed
        .iter()
        .filter(|(c, _)| clusters.contains(c))
        .map(|(c, f)| (c.clone(), f.clone()))
        .collect();
    (failed.len() > budget as usize).then(|| Halt {
        env: env.to_owned(),
        version: version.clone(),
        failed,
        budget,
        held: evidence.held.clone(),
    })
}

/// Judge `req`: the pure core of the wave gate.
pub fn judge(req: &WaveRequest<'_>) -> WaveGate {
    // A cluster's own failure is its own `failed` state, which a retry of
    // the node (`drover.dev/retry`) resumes; it halts the others.
    let all: Vec<String> = req
        .waves
        .iter()
        .flat_map(|w| w.clusters.iter())
        .filter(|c| *c != req.cluster)
        .cloned()
        .collect();
    if let Some(h) = halt(req.env, req.version, req.failure_budget, req.evidence, &all) {
        return WaveGate::Halted(h);
    }
    if let Some(why) = &req.evidence.held {
        return WaveGate::Held {
            env: req.env.to_owned(),
            version: req.version.clone(),
            why: why.clone(),
        };
    }
    let Some(i) = req
        .waves
        .iter()
        .position(|w| w.clusters.iter().any(|c| c == req.cluster))
    else {
        // A cluster no wave holds (drover check refuses it): the first wave's rules.
        return WaveGate::Open { wave: 1 };
    };
    let wave = i + 1;
    if let Some(prev) = i.checked_sub(1).map(|j| &req.waves[j]) {
        let ev = req.evidence;
        let missing: Vec<(String, Option<String>)> = prev
            .clusters
            .iter()
            .filter(|c| !ev.confirmed.contains_key(*c))
            .map(|c| (c.clone(), ev.notes.get(c).cloned()))
            .collect();
        if !missing.is_empty() || prev.clusters.is_empty() {
            return WaveGate::Waiting { wave, missing };
        }
        let latest = prev
            .clusters
            .iter()
            .filter_map(|c| ev.confirmed.get(c))
            .max()
            .copied()
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let passes_at = chrono::Duration::from_std(prev.soak)
            .ok()
            .and_then(|d| latest.checked_add_signed(d))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        if req.now < passes_at {
            return WaveGate::Soaking { wave, passes_at };
        }
    }
    let this = &req.waves[i];
    if let Some(max) = this.max_concurrency {
        let ahead: Vec<String> = this
            .clusters
            .iter()
            .take_while(|c| *c != req.cluster)
            .filter(|c| !req.evidence.confirmed.contains_key(*c))
            .cloned()
            .collect();
        if ahead.len() >= max as usize {
            return WaveGate::Queued { wave, ahead, max };
        }
    }
    WaveGate::Open { wave }
}

fn ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl fmt::Display for Halt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = self
            .failed
            .iter()
            .map(|(c, fl)| format!("{c} at {}: {}", ts(&fl.at), fl.message))
            .collect::<Vec<_>>()
            .join("; ");
        write!(
            f,
            "{} halted for {}: {} cluster(s) failed it, more than failure_budget = {} ({list}); \
             no node starts for {} until each failed cluster reports it again (a retry of its \
             node), or a reviewed change pins another version or raises failure_budget \
             (`drover revoke {}` stops it everywhere)",
            self.env,
            self.version,
            self.failed.len(),
            self.budget,
            self.version,
            self.version,
        )?;
        if let Some(why) = &self.held {
            write!(f, "; its evidence is also held: {why}")?;
        }
        Ok(())
    }
}

impl fmt::Display for WaveGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaveGate::Open { wave } => write!(f, "wave {wave}: may start"),
            WaveGate::Halted(h) => h.fmt(f),
            WaveGate::Held { env, version, why } => write!(
                f,
                "{env} held for {version}: its status reports cannot be trusted to show every \
                 failure, and missing evidence never lets a node start: {why}"
            ),
            WaveGate::Waiting { wave, missing } => write!(
                f,
                "wave {wave} waits for wave {} to confirm: not yet confirmed by {}",
                wave - 1,
                missing
                    .iter()
                    .map(|(c, why)| match why {
                        Some(w) => format!("{c} ({w})"),
                        None => c.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            WaveGate::Soaking { wave, passes_at } => write!(
                f,
                "wave {wave} waits for wave {}'s soak, which passes at {}",
                wave - 1,
                ts(passes_at)
            ),
            WaveGate::Queued { wave, ahead, max } => write!(
                f,
                "wave {wave} rolls {max} cluster(s) at a time (max_concurrency); ahead: {}",
                ahead.join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn waves() -> Vec<Wave> {
        vec![
            Wave {
                clusters: vec!["eu-1".into(), "eu-2".into()],
                soak: Duration::from_secs(3600),
                max_concurrency: None,
            },
            Wave {
                clusters: vec!["us-1".into(), "us-2".into(), "us-3".into()],
                soak: Duration::from_secs(3600),
                max_concurrency: Some(1),
            },
        ]
    }

    fn req<'a>(
        cluster: &'a str,
        ev: &'a EnvEvidence,
        w: &'a [Wave],
        v: &'a Version,
    ) -> WaveRequest<'a> {
        WaveRequest {
            env: "production",
            cluster,
            version: v,
            waves: w,
            failure_budget: 0,
            evidence: ev,
            now: t("2026-12-20T12:00:00Z"),
        }
    }

    #[test]
    fn the_first_wave_is_open_and_the_second_waits_for_every_confirmation_and_the_soak() {
        let (w, v) = (waves(), Version::new(1, 13, 2));
        let mut ev = EnvEvidence::default();
        assert_eq!(judge(&req("eu-2", &ev, &w, &v)), WaveGate::Open { wave: 1 });
        ev.confirmed
            .insert("eu-1".into(), t("2026-12-20T10:00:00Z"));
        assert_eq!(
            judge(&req("us-1", &ev, &w, &v)),
            WaveGate::Waiting {
                wave: 2,
                missing: vec![("eu-2".into(), None)]
            }
        );
        ev.confirmed
            .insert("eu-2".into(), t("2026-12-20T11:30:00Z"));
        assert_eq!(
            judge(&req("us-1", &ev, &w, &v)),
            WaveGate::Soaking {
                wave: 2,
                passes_at: t("2026-12-20T12:30:00Z")
            }
        );
        let mut later = req("us-1", &ev, &w, &v);
        later.now = t("2026-12-20T12:30:00Z");
        assert_eq!(judge(&later), WaveGate::Open { wave: 2 });
        // max_concurrency = 1: us-2 waits for us-1's confirmation.
        let mut r = req("us-2", &ev, &w, &v);
        r.now = later.now;
        assert!(matches!(judge(&r), WaveGate::Queued { ahead, .. } if ahead == ["us-1"]));
        ev.confirmed
            .insert("us-1".into(), t("2026-12-20T13:00:00Z"));
        let mut r = req("us-2", &ev, &w, &v);
        r.now = t("2026-12-20T13:00:00Z");
        assert_eq!(judge(&r), WaveGate::Open { wave: 2 });
    }

    #[test]
    fn more_failures_than_the_budget_halt_every_wave_until_a_reviewed_change() {
        let (w, v) = (waves(), Version::new(1, 13, 2));
        let mut ev = EnvEvidence::default();
        let failure = Failure {
            at: t("2026-12-20T10:00:00Z"),
            message: "node n-3 failed: pod web-1 crash-looping".into(),
        };
        ev.failed.insert("eu-1".into(), failure.clone());
        let gate = judge(&req("eu-2", &ev, &w, &v));
        let WaveGate::Halted(h) = &gate else {
            panic!("{gate:?}")
        };
        assert_eq!(h.failed, vec![("eu-1".to_owned(), failure)]);
        assert!(gate.to_string().contains("node n-3 failed"), "{gate}");
        assert!(gate.to_string().contains("drover revoke 1.13.2"), "{gate}");
        // Within the budget: not halted.
        let mut r = req("eu-2", &ev, &w, &v);
        r.failure_budget = 1;
        assert!(judge(&r).is_open());
        // Held evidence beside the failure: still halted, naming both.
        ev.held = Some("status branch of eu-3 does not count".into());
        let gate = judge(&req("eu-2", &ev, &w, &v));
        assert!(matches!(&gate, WaveGate::Halted(_)), "{gate:?}");
        assert!(gate.to_string().contains("also held"), "{gate}");
        ev.held = None;
        // The failing cluster itself is not halted by its own failure.
        assert!(judge(&req("eu-1", &ev, &w, &v)).is_open());
        // Held evidence without a failure holds every wave, the first too.
        let mut held = EnvEvidence {
            held: Some("the status store cannot be read".into()),
            ..Default::default()
        };
        for c in ["eu-1", "us-1"] {
            let gate = judge(&req(c, &held, &w, &v));
            assert!(matches!(&gate, WaveGate::Held { .. }), "{c}: {gate:?}");
            assert!(
                gate.holds().0.is_some(),
                "{c}: the decision is told it halts"
            );
        }
        held.held = None;
        assert!(judge(&req("eu-1", &held, &w, &v)).is_open());
        // A cluster of another environment never counts.
        ev.failed.clear();
        ev.failed.insert(
            "stage-1".into(),
            Failure {
                at: t("2026-12-20T10:00:00Z"),
                message: String::new(),
            },
        );
        assert!(judge(&req("eu-2", &ev, &w, &v)).is_open());
    }
}
