//! The blocker: the one word saying why an environment, a cluster or a node
//! is not progressing, from a closed list, with who can move it
//! ([`Mover`]). The rollout decision names the cause of its state and of
//! each node it leaves alone; `agent::told` settles the one blocker a
//! cluster is told in, which the CRD status (a column and the `Blocked`
//! condition's reason), the signed status report, the metrics and `drover
//! status` all carry.
//!
//! A new blocker joins here: a variant, its name, its place in
//! [`Blocker::ALL`], its meaning and its mover; `tests/offline/docs_generated.rs`
//! holds docs/status.md's table to this list.

use serde::{Deserialize, Serialize};

/// How `rollback::idle_rolled_back` names a node rolled back from the target.
const ROLLED_BACK_FROM: &str = "rolled back from ";

/// Why something is not progressing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Blocker {
    /// Outside every maintenance window.
    Window,
    /// A freeze in force holds the change.
    Freeze,
    /// `[rollout] paused = true`.
    Paused,
    /// The promotion gate: the lower environment has not confirmed the version.
    Gate,
    /// The cluster's wave waits for the wave before it (or its turn in it).
    Wave,
    /// A soak has not passed (the lower environment's, or the wave before's).
    Soak,
    /// More clusters of the environment failed the version than
    /// `failure_budget` allows.
    Halted,
    /// The pinned version is revoked.
    Revoked,
    /// A newer head is refused by the trust or config check, or by a gate
    /// rule no time cures (a downgrade, a policy edit with a version bump).
    Refused,
    /// `max_unavailable` nodes are out of service: the next waits for room.
    Budget,
    /// A drain timed out: PodDisruptionBudgets (or pods that would not
    /// leave) kept the node's pods from being evicted.
    Pdb,
    /// The node's workload asks drover to wait (`drover.dev/upgrade=paused`).
    Consent,
    /// A health check failed, or the node is NotReady or was rolled back.
    Health,
    /// The OS driver failed (its run, or the node did not come back at the
    /// version in time), or its stopped run is still there.
    Driver,
    /// What drover must read to decide cannot be read: the lower
    /// environment's status reports, a node's record, its OS version, or a
    /// call about the node did not answer.
    Evidence,
    /// The node is someone else's now: cordoned by someone else, managed by
    /// another updater, or running a version newer than the pin.
    Foreign,
    /// The environment's selector selects no node in this cluster.
    Selector,
    /// No trusted config has been fetched yet.
    Source,
}

/// Who can move a blocker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mover {
    /// It moves by itself, at a time the calendar or the evidence says.
    Time,
    /// A person: a reviewed change to the config, a retry on a node's
    /// record, or the workload's owner.
    Person,
    /// drover retries by itself; a person is needed if it lasts.
    Retry,
}

impl Blocker {
    /// Every blocker, in the order the docs list them.
    pub const ALL: [Blocker; 18] = [
        Blocker::Window,
        Blocker::Freeze,
        Blocker::Paused,
        Blocker::Gate,
        Blocker::Wave,
        Blocker::Soak,
        Blocker::Halted,
        Blocker::Revoked,
        Blocker::Refused,
        Blocker::Budget,
        Blocker::Pdb,
        Blocker::Consent,
        Blocker::Health,
        Blocker::Driver,
        Blocker::Evidence,
        Blocker::Foreign,
        Blocker::Selector,
        Blocker::Source,
    ];

    /// The name every surface carries.
    pub fn as_str(self) -> &'static str {
        match self {
            Blocker::Window => "window",
            Blocker::Freeze => "freeze",
            Blocker::Paused => "paused",
            Blocker::Gate => "gate",
            Blocker::Wave => "wave",
            Blocker::Soak => "soak",
            Blocker::Halted => "halted",
            Blocker::Revoked => "revoked",
            Blocker::Refused => "refused",
            Blocker::Budget => "budget",
            Blocker::Pdb => "pdb",
            Blocker::Consent => "consent",
            Blocker::Health => "health",
            Blocker::Driver => "driver",
            Blocker::Evidence => "evidence",
            Blocker::Foreign => "foreign",
            Blocker::Selector => "selector",
            Blocker::Source => "source",
        }
    }

    /// The blocker named `s`, as [`Self::as_str`] writes it.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.as_str() == s)
    }

    /// Who can move it.
    pub fn mover(self) -> Mover {
        match self {
            Blocker::Window | Blocker::Soak | Blocker::Wave | Blocker::Gate | Blocker::Budget => {
                Mover::Time
            }
            Blocker::Freeze => Mover::Time,
            Blocker::Paused
            | Blocker::Halted
            | Blocker::Revoked
            | Blocker::Refused
            | Blocker::Consent
            | Blocker::Health
            | Blocker::Driver
            | Blocker::Foreign
            | Blocker::Selector => Mover::Person,
            Blocker::Pdb | Blocker::Evidence | Blocker::Source => Mover::Retry,
        }
    }

    /// What a person does to move it, in one line (`drover status --explain`).
    pub fn remedy(self) -> &'static str {
        match self {
            Blocker::Window => "nothing: it moves when the next maintenance window opens",
            Blocker::Freeze => "nothing: it moves when the freeze ends and a window is open",
            Blocker::Paused => "a reviewed change setting [rollout] paused = false",
            Blocker::Gate => {
                "every cluster of the lower environment confirms the version (or a person \
                 fixes what keeps it from confirming there)"
            }
            Blocker::Wave => "the wave before confirms the version",
            Blocker::Soak => "nothing: it moves when the soak has passed",
            Blocker::Halted => {
                "a new version pinned, or a reviewed change raising failure_budget, after \
                 looking at the failed clusters"
            }
            Blocker::Revoked => "a reviewed change pinning a version that is not revoked",
            Blocker::Refused => {
                "a signed, valid commit the gate admits (the refusal says what is wrong)"
            }
            Blocker::Budget => "nothing: the next node starts when one in flight is back",
            Blocker::Pdb => {
                "the workloads' owners let their PodDisruptionBudgets allow a disruption; \
                 drover retries with backoff"
            }
            Blocker::Consent => {
                "the workload's owner removes the label drover.dev/upgrade=paused from the node"
            }
            Blocker::Health => {
                "a person looks at the failed check or NotReady node, then asks for a retry \
                 on its DroverNode record (drover.dev/retry) or pins another version"
            }
            Blocker::Driver => {
                "a person looks at the driver's run, then asks for a retry on its DroverNode \
                 record (drover.dev/retry)"
            }
            Blocker::Evidence => {
                "drover reads again by itself; a person restores what cannot be read if it lasts"
            }
            Blocker::Foreign => {
                "a person uncordons the node, removes the other updater's label, or sets \
                 allow_downgrade = true"
            }
            Blocker::Selector => "a reviewed change to the environment's node selector",
            Blocker::Source => {
                "drover fetches again by itself; a person fixes the repository's URL or \
                 credentials if it lasts"
            }
        }
    }

    /// Why a node given back failed: its record's message as drover wrote
    /// it (drover alone writes records, `record`), the prefixes the health
    /// watch and the rollback write.
    pub fn of_failure(message: &str) -> Blocker {
        if message.starts_with(super::health::HEALTH_FAILED_PREFIX)
            || message.starts_with(super::ROLLED_BACK_PREFIX)
            || message.starts_with(ROLLED_BACK_FROM)
        {
            Blocker::Health
        } else if message.starts_with(super::HELD_PREFIX) {
            Blocker::Evidence
        } else {
            Blocker::Driver
        }
    }

    /// The blocker of a refused head: its check (`trust`, `config`,
    /// `gate`) and reason code (`admit::reason_code`).
    pub fn of_refusal(stage: &str, reason: &str) -> Blocker {
        match (stage, reason) {
            ("gate", "not_confirmed" | "lower_not_at_version" | "no_lower_clusters") => {
                Blocker::Gate
            }
            ("gate", "soaking" | "history_soaking") => Blocker::Soak,
            ("gate", "evidence_held" | "no_report_signers") => Blocker::Evidence,
            ("gate", "revoked") => Blocker::Revoked,
            _ => Blocker::Refused,
        }
    }
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_parse_and_serde() {
        for b in Blocker::ALL {
            assert_eq!(Blocker::parse(b.as_str()), Some(b));
            // As the status line, the fleet page and the metrics' labels print it.
            assert_eq!(b.to_string(), b.as_str());
            assert_eq!(
                serde_json::to_string(&b).unwrap(),
                format!("\"{}\"", b.as_str())
            );
            assert!(!b.remedy().is_empty());
        }
        assert_eq!(Blocker::parse("bogus"), None);
    }

    #[test]
    fn each_blocker_says_its_own_remedy_and_nothing_only_when_time_moves_it() {
        // `drover status --explain` prints the remedy beside the blocker:
        // two blockers sharing one would tell a person the wrong thing to do.
        let mut seen = std::collections::BTreeSet::new();
        for b in Blocker::ALL {
            let r = b.remedy();
            assert!(
                seen.insert(r),
                "{} repeats another's remedy: {r}",
                b.as_str()
            );
            if r.starts_with("nothing") {
                assert_eq!(b.mover(), Mover::Time, "{}: {r}", b.as_str());
            }
        }
    }

    #[test]
    fn a_failure_is_the_health_checks_or_the_drivers_as_its_record_says() {
        assert_eq!(
            Blocker::of_failure("health check failed: node n-1: NotReady"),
            Blocker::Health
        );
        assert_eq!(
            Blocker::of_failure("rolled back to 1.13.2: health check failed"),
            Blocker::Health
        );
        assert_eq!(
            Blocker::of_failure("upgrade job failed: exit 1"),
            Blocker::Driver
        );
        assert_eq!(
            Blocker::of_failure("rollback failed: job failed"),
            Blocker::Driver
        );
    }

    #[test]
    fn a_refused_head_is_named_by_its_check_and_reason_code() {
        // Every reason code the gate gives (`admit::reason_code`), and the
        // other checks' refusals, which a person answers by a new change.
        for (stage, reason, blocker) in [
            ("gate", "not_confirmed", Blocker::Gate),
            ("gate", "lower_not_at_version", Blocker::Gate),
            ("gate", "no_lower_clusters", Blocker::Gate),
            ("gate", "soaking", Blocker::Soak),
            ("gate", "history_soaking", Blocker::Soak),
            ("gate", "evidence_held", Blocker::Evidence),
            ("gate", "no_report_signers", Blocker::Evidence),
            ("gate", "revoked", Blocker::Revoked),
            ("gate", "downgrade", Blocker::Refused),
            ("gate", "policy_and_version", Blocker::Refused),
            ("trust", "not_confirmed", Blocker::Refused),
            ("config", "revoked", Blocker::Refused),
        ] {
            assert_eq!(
                Blocker::of_refusal(stage, reason),
                blocker,
                "{stage}/{reason}"
            );
        }
    }
}
