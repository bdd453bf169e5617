//! The promotion gate (docs/design.md §4): may an environment take a version, given
//! the evidence from the one below.
//!
//! [`judge`] is the pure core: values in, a [`Decision`] out that explains
//! itself. The admission path (`crate::admit`) gathers the evidence by the
//! policy in force and calls it; reading that evidence out of git is
//! `crate::admit`'s (history evidence in `admit/history.rs`), so this module
//! does no I/O.
//!
//! Choices where docs/design.md is silent:
//! - A downgrade needs `allow_downgrade = true` set by the change that
//!   lowers the version (the caller passes whether it did).
//!   The gate still applies to a downgrade: the older version needs the same
//!   evidence from the lower environment as an upgrade.
//! - A lower environment that lists no clusters gives no status evidence, so
//!   `evidence = "status"` refuses (rather than passing vacuously).
//! - A revocation names a release: it covers every build-metadata variant
//!   of its version ([`revokes`]).
//! - The soak is measured from the latest of the lower clusters' standing
//!   confirmations (status), or from the (monotone) commit time of the
//!   commit that set the lower environment's file to the version (history);
//!   it has passed when `now >= that + soak`.

pub mod wave;

use chrono::{DateTime, SecondsFormat, Utc};
use semver::Version;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Everything the gate needs to judge one environment taking one version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateRequest {
    /// The environment taking the version.
    pub env: String,
    /// The version it would take.
    pub version: Version,
    /// The version it had before this change; `None` for a new environment.
    pub previous: Option<Version>,
    /// Whether the change itself sets `allow_downgrade = true` (it was not before).
    pub allow_downgrade: bool,
    /// The environment's `[promotion] soak`.
    pub soak: Duration,
    /// The environment below in the chain; `None` for the first one.
    pub lower: Option<Lower>,
    /// The time to judge at.
    pub now: DateTime<Utc>,
}

/// The lower environment and its evidence for the requested version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lower {
    /// Its name.
    pub env: String,
    /// Its clusters, from `drover.toml` `[clusters]`.
    pub clusters: Vec<String>,
    /// What it shows about the requested version.
    pub evidence: LowerEvidence,
}

/// Evidence the lower environment gives for the requested version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LowerEvidence {
    /// `evidence = "status"`: first confirmation of the version per cluster.
    Status {
        /// Status branch the confirmations were read from.
        branch: String,
        /// Cluster -> since when its standing, trusted confirmation of the
        /// version counts (any cluster; those not listed for the lower
        /// environment are ignored).
        confirmations: BTreeMap<String, DateTime<Utc>>,
        /// Cluster -> why the branch holds no standing confirmation from it
        /// (withdrawn by `failed`, reports ignored), named in refusals.
        notes: BTreeMap<String, String>,
        /// Why the lower environment's evidence is held, if it is: the store
        /// cannot be read or is refused, or a branch of its clusters does
        /// not count. Missing evidence holds: the gate refuses.
        held: Option<String>,
    },
    /// `evidence = "history"`: the lower environment's configured version.
    History(LowerHistory),
}

/// The lower environment's configured version at HEAD, from the config history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LowerHistory {
    /// Configured at the requested version, continuously since this commit time.
    AtVersionSince {
        /// Commit time of the commit that set it.
        since: DateTime<Utc>,
        /// That commit.
        commit: String,
    },
    /// Configured at another version (`None`: no or unreadable file).
    AtOtherVersion(Option<Version>),
}

/// The gate's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The version did not change: nothing to judge.
    Unchanged,
    /// The environment may take the version.
    Allowed(Allowed),
    /// The environment may not take the version.
    Refused(Refusal),
}

impl Decision {
    /// Whether the change may go ahead (allowed or nothing to judge).
    pub fn is_allowed(&self) -> bool {
        !matches!(self, Decision::Refused(_))
    }
}

/// Why a version was allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The environment.
    pub env: String,
    /// The version.
    pub version: Version,
    /// Evidence that allowed it.
    pub basis: Basis,
    /// Whether this is a downgrade that `allow_downgrade` let through.
    pub downgrade: bool,
}

/// The evidence behind an allowed version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Basis {
    /// First environment of the chain: no gate.
    FirstInChain,
    /// Every cluster of the lower environment confirmed it, long enough ago.
    Confirmed {
        /// Lower environment.
        lower: String,
        /// Its clusters' first confirmations.
        confirmed: Vec<(String, DateTime<Utc>)>,
        /// When the soak passed.
        soaked_at: DateTime<Utc>,
    },
    /// The lower environment has been configured at it long enough.
    History {
        /// Lower environment.
        lower: String,
        /// Since when.
        since: DateTime<Utc>,
        /// When the soak passed.
        soaked_at: DateTime<Utc>,
    },
}

/// Why a version was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The environment.
    pub env: String,
    /// The version.
    pub version: Version,
    /// The reason.
    pub reason: Reason,
}

/// The reason for a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Lower than the previous version, without `allow_downgrade = true`.
    Downgrade {
        /// The version before the change.
        previous: Version,
    },
    /// The lower environment lists no clusters, so nothing can confirm.
    NoLowerClusters {
        /// Lower environment.
        lower: String,
    },
    /// Not every cluster of the lower environment confirmed the version.
    NotConfirmed {
        /// Lower environment.
        lower: String,
        /// Status branch read.
        branch: String,
        /// Clusters that confirmed, with when.
        confirmed: Vec<(String, DateTime<Utc>)>,
        /// Clusters that did not, each with why when the branch says (withdrawn, ignored).
        missing: Vec<(String, Option<String>)>,
    },
    /// The change edits the promotion policy and moves a version together.
    PolicyAndVersion {
        /// The policy keys the change edits.
        edits: Vec<String>,
    },
    /// `evidence = "status"` without `report_signers`: no report can be trusted.
    NoReportSigners,
    /// The lower environment's evidence is held: the status store cannot
    /// be read or is refused, or a branch of its clusters does not count.
    EvidenceHeld {
        /// Lower environment.
        lower: String,
        /// Why.
        why: String,
    },
    /// The version is listed in `[promotion] revoked` of the policy in force.
    Revoked {
        /// Why, as the entry says.
        why: String,
    },

    /// Every cluster confirmed, but the latest confirmation is younger than the soak.
    Soaking {
        /// Lower environment.
        lower: String,
        /// Clusters' confirmations.
        confirmed: Vec<(String, DateTime<Utc>)>,
        /// The soak.
        soak: Duration,
        /// When it will have passed.
        passes_at: DateTime<Utc>,
    },
    /// History evidence: the lower environment is not configured at the version.
    LowerNotAtVersion {
        /// Lower environment.
        lower: String,
        /// What it is configured at.
        lower_version: Option<Version>,
    },
    /// History evidence: configured at the version, but not for the soak yet.
    HistorySoaking {
        /// Lower environment.
        lower: String,
        /// Since when it is configured at the version.
        since: DateTime<Utc>,
        /// The commit that set it.
        commit: String,
        /// The soak.
        soak: Duration,
        /// When it will have passed.
        passes_at: DateTime<Utc>,
    },
}

/// Whether a `revoked` entry for `revoked` covers `version`: the same
/// release, whatever build metadata either carries (semver: build metadata
/// does not make another version), so `1.13.3+rebuild` is as revoked as
/// `1.13.3`. A pre-release is another version and is revoked by its own entry.
pub fn revokes(revoked: &Version, version: &Version) -> bool {
    revoked.cmp_precedence(version) == std::cmp::Ordering::Equal
}

/// Judge `req`: the pure core of the gate.
pub fn judge(req: &GateRequest) -> Decision {
    let refuse = |reason| {
        Decision::Refused(Refusal {
            env: req.env.clone(),
            version: req.version.clone(),
            reason,
        })
    };
    let mut downgrade = false;
    if let Some(prev) = &req.previous {
        if *prev == req.version {
            return Decision::Unchanged;
        }
        if req.version < *prev {
            if !req.allow_downgrade {
                return refuse(Reason::Downgrade {
                    previous: prev.clone(),
                });
            }
            downgrade = true;
        }
    }
    let allow = |basis| {
        Decision::Allowed(Allowed {
            env: req.env.clone(),
            version: req.version.clone(),
            basis,
            downgrade,
        })
    };
    let Some(lower) = &req.lower else {
        return allow(Basis::FirstInChain);
    };
    let soaked = |since: DateTime<Utc>| -> DateTime<Utc> {
        chrono::Duration::from_std(req.soak)
            .ok()
            .and_then(|d| since.checked_add_signed(d))
            // A soak too long to represent never passes.
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    };
    match &lower.evidence {
        LowerEvidence::Status {
            branch,
            confirmations,
            notes,
            held,
        } => {
            if let Some(why) = held {
                return refuse(Reason::EvidenceHeld {
                    lower: lower.env.clone(),
                    why: why.clone(),
                });
            }
            if lower.clusters.is_empty() {
                return refuse(Reason::NoLowerClusters {
                    lower: lower.env.clone(),
                });
            }
            let mut confirmed = Vec::new();
            let mut missing = Vec::new();
            for c in &lower.clusters {
                match confirmations.get(c) {
                    Some(t) => confirmed.push((c.clone(), *t)),
                    None => missing.push((c.clone(), notes.get(c).cloned())),
                }
            }
            if !missing.is_empty() {
                return refuse(Reason::NotConfirmed {
                    lower: lower.env.clone(),
                    branch: branch.clone(),
                    confirmed,
                    missing,
                });
            }
            let latest = confirmed
                .iter()
                .map(|(_, t)| *t)
                .max()
                .unwrap_or(DateTime::<Utc>::MAX_UTC);
            let passes_at = soaked(latest);
            if req.now < passes_at {
                return refuse(Reason::Soaking {
                    lower: lower.env.clone(),
                    confirmed,
                    soak: req.soak,
                    passes_at,
                });
            }
            allow(Basis::Confirmed {
                lower: lower.env.clone(),
                confirmed,
                soaked_at: passes_at,
            })
        }
        LowerEvidence::History(LowerHistory::AtOtherVersion(v)) => {
            refuse(Reason::LowerNotAtVersion {
                lower: lower.env.clone(),
                lower_version: v.clone(),
            })
        }
        LowerEvidence::History(LowerHistory::AtVersionSince { since, commit }) => {
            let passes_at = soaked(*since);
            if req.now < passes_at {
                return refuse(Reason::HistorySoaking {
                    lower: lower.env.clone(),
                    since: *since,
                    commit: commit.clone(),
                    soak: req.soak,
                    passes_at,
                });
            }
            allow(Basis::History {
                lower: lower.env.clone(),
                since: *since,
                soaked_at: passes_at,
            })
        }
    }
}

fn ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Soaks are written as "24h" in the config; echo them the same way rather
/// than as humantime's "1day".
fn soak_text(d: &Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => humantime::format_duration(*d).to_string(),
        s if d.subsec_nanos() == 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if d.subsec_nanos() == 0 && s % 60 == 0 => format!("{}m", s / 60),
        _ => humantime::format_duration(*d).to_string(),
    }
}

fn list_confirmed(confirmed: &[(String, DateTime<Utc>)]) -> String {
    if confirmed.is_empty() {
        return "none".into();
    }
    confirmed
        .iter()
        .map(|(c, t)| format!("{c} at {}", ts(t)))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (env, v) = (&self.env, &self.version);
        match &self.reason {
            Reason::Downgrade { previous } => write!(
                f,
                "{env} may not go down from {previous} to {v}: a downgrade needs `allow_downgrade = true` in environments/{env}.toml in the same change"
            ),
            Reason::NoLowerClusters { lower } => write!(
                f,
                "{env} may not take {v}: {lower} lists no clusters under [clusters] in drover.toml, so nothing can confirm {v} there"
            ),
            Reason::NotConfirmed {
                lower,
                branch,
                confirmed,
                missing,
            } => write!(
                f,
                "{env} may not take {v}: not every cluster of {lower} has confirmed it on its status branch ({}); not confirmed by: {}; confirmed by: {}",
                crate::status::cluster_branch(branch, lower, "<cluster>"),
                missing
                    .iter()
                    .map(|(c, why)| match why {
                        Some(w) => format!("{c} ({w})"),
                        None => c.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                list_confirmed(confirmed)
            ),
            Reason::PolicyAndVersion { edits } => write!(
                f,
                "{env} may not take {v} in a change that also edits the promotion policy ({}): the policy is judged by the policy before it, so make the policy change and the version change separately",
                edits.join(", ")
            ),
            Reason::EvidenceHeld { lower, why } => write!(
                f,
                "{env} may not take {v}: {lower}'s evidence is held, and missing evidence never opens the gate: {why}"
            ),
            Reason::Revoked { why } => write!(
                f,
                "{env} may not take {v}: it is revoked in [promotion] revoked of drover.toml ({why})"
            ),
            Reason::NoReportSigners => write!(
                f,
                "{env} may not take {v}: evidence = \"status\" needs `report_signers` in [promotion] of drover.toml (an allowed-signers file naming each cluster's key as <env>/<cluster>), so no status report can be trusted"
            ),

            Reason::Soaking {
                lower,
                confirmed,
                soak,
                passes_at,
            } => write!(
                f,
                "{env} may not take {v} yet: {lower} confirmed it ({}), but {env}'s soak of {} passes only at {}",
                list_confirmed(confirmed),
                soak_text(soak),
                ts(passes_at)
            ),
            Reason::LowerNotAtVersion {
                lower,
                lower_version,
            } => match lower_version {
                Some(lv) => write!(
                    f,
                    "{env} may not take {v}: {lower} is configured at {lv}, not {v} (evidence = \"history\")"
                ),
                None => write!(
                    f,
                    "{env} may not take {v}: {lower} has no readable version at HEAD (evidence = \"history\")"
                ),
            },
            Reason::HistorySoaking {
                lower,
                since,
                commit,
                soak,
                passes_at,
            } => write!(
                f,
                "{env} may not take {v} yet: {lower} has been configured at {v} only since {} (commit {commit:.10}); {env}'s soak of {} passes at {}",
                ts(since),
                soak_text(soak),
                ts(passes_at)
            ),
        }
    }
}

impl fmt::Display for Allowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (env, v) = (&self.env, &self.version);
        let down = if self.downgrade {
            " (downgrade allowed by allow_downgrade = true)"
        } else {
            ""
        };
        match &self.basis {
            Basis::FirstInChain => {
                write!(f, "{env} may take {v}: first environment of the chain{down}")
            }
            Basis::Confirmed {
                lower,
                confirmed,
                soaked_at,
            } => write!(
                f,
                "{env} may take {v}: {lower} confirmed it ({}) and the soak passed at {}{down}",
                list_confirmed(confirmed),
                ts(soaked_at)
            ),
            Basis::History {
                lower,
                since,
                soaked_at,
            } => write!(
                f,
                "{env} may take {v}: {lower} has been configured at it since {} and the soak passed at {}{down}",
                ts(since),
                ts(soaked_at)
            ),
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Unchanged => write!(f, "version unchanged: nothing to judge"),
            Decision::Allowed(a) => a.fmt(f),
            Decision::Refused(r) => r.fmt(f),
        }
    }
}
