//! The conditions of the CRD status (`Ready`, `Reconciling`, `Stalled`),
//! as kstatus (sigs.k8s.io/cli-utils/pkg/kstatus), Flux's health checks,
//! `kubectl wait --for=condition=...` and Argo CD read them. This is the one
//! place they are computed: a pure function of what the status says (the
//! rollout state, a refused head, whether a config is applied), the
//! object's generation, the conditions written before and the time.
//!
//! The mapping, which docs/install.md ("Health checks") documents:
//!
//! | rollout state | Ready | Reconciling | Stalled | reason | kstatus |
//! |---|---|---|---|---|---|
//! | `pending` | False | True | False | `WaitingForWindow` | InProgress |
//! | `paused` | False | False | False | `Paused` | InProgress (Ready False) |
//! | `rolling` | False | True | False | `Rolling` | InProgress |
//! | `settling` | False | True | False | `Settling` | InProgress |
//! | `confirmed` | True | False | False | `Confirmed` | Current |
//! | `blocked` | False | False | True | `Blocked` | Failed |
//! | `failed` | False | False | True | `Failed` | Failed |
//! | `halted` (more clusters failed the version than `failure_budget` allows) | False | False | True | `Halted` | Failed |
//! | `halted` (the environment's status evidence is held: unreadable, refused, a branch that does not count) | False | False | True | `EvidenceHeld` | Failed |
//! | `revoked` | False | False | True | `Revoked` | Failed |
//! | `refused` (trust, config, or a gate refusal no time cures) | False | False | True | `RefusedByTrust`, `RefusedByConfig`, `RefusedByGate` | Failed |
//! | `refused` (the gate waits for a confirmation or a soak) | False | True | False | `AwaitingEvidence` | InProgress |
//! | no config applied yet, none refused | False | True | False | `WaitingForConfig` | InProgress |
//! | a config applied, no decision yet | False | True | False | `Applying` | InProgress |
//! | any of the above while the git server refuses the status report (`ReportPushed` False, reason `Refused`) | False | False | True | `ReportRefused` | Failed |
//!
//! The principle: `Stalled` is True exactly when only a person can move the
//! cluster on (the kstatus and Flux meaning: an error the controller will
//! not recover from by itself); `Reconciling` is True while the agent has
//! work it will go on with by itself, even if it waits for a window; and
//! `Ready` is True only when the cluster runs the pinned version and passed
//! its health checks. A pause is a person's choice: neither work in
//! progress nor an error, and not Ready.
//!
//! A status report the git server refuses for good (a pre-receive hook, a
//! protected branch, credentials or a signing key that do not work) stalls
//! more than this cluster: the gate of every later environment reads this
//! cluster's confirmations and failures from its status branch, so they
//! wait for a person too. It outranks whatever the rollout says (the
//! message keeps that), so `kubectl wait --for=condition=Stalled` and
//! kstatus see it even mid-rollout; a git server that is merely down is
//! retried by the agent and stalls nothing.
//!
//! A fourth, `Blocked`, says why the cluster is not progressing: True
//! with the blocker's name as its reason (`window`, `consent`...: the word
//! of the `BLOCKER` column, docs/status.md "Blockers") while the status
//! names a blocker, else False with the reason `Progressing`. It is read by
//! `kubectl get -o jsonpath`, and by nothing kstatus judges.
//!
//! All three are always present, True or False (metav1.Condition's shape:
//! `type`, `status`, `observedGeneration`, `lastTransitionTime`, `reason`,
//! `message`); `lastTransitionTime` changes only when `status` does.
//! Conditions of other types already on the status are kept as they are.

use super::crd::{Condition, DroverStatusStatus, Refused};
use crate::rollout::RolloutState;

/// `Ready`: the cluster runs the pinned version and held its health checks.
pub const READY: &str = "Ready";
/// `Reconciling`: the agent has work left that it goes on with by itself.
pub const RECONCILING: &str = "Reconciling";
/// `Stalled`: the rollout cannot go on until a person acts.
pub const STALLED: &str = "Stalled";
/// `Blocked`: the cluster is not progressing; the reason is the blocker.
pub const BLOCKED: &str = "Blocked";
/// The condition saying whether the status report reaches the git server
/// (written with the report, `report.rs`).
pub const REPORT_PUSHED: &str = "ReportPushed";
/// `ReportPushed`'s reason while the git server refuses the report for good
/// (it also makes the status `Stalled`).
pub const PUSH_REFUSED: &str = "Refused";

/// The longest message a condition carries (metav1.Condition's bound).
const MAX_MESSAGE: usize = 32 * 1024;

/// Gate refusals that resolve by themselves: a lower cluster's
/// confirmation arrives, a soak passes (docs/design.md §4).
const AWAITING_EVIDENCE: &[&str] = &["not_confirmed", "soaking", "history_soaking"];

/// What the conditions are computed from: what the CRD status says.
#[derive(Debug, Clone, Copy, Default)]
pub struct Facts<'a> {
    /// The rollout state shown (`None`: no decision yet).
    pub state: Option<RolloutState>,
    /// Whether a config is applied (the status names a last applied commit).
    pub configured: bool,
    /// The newest head, when it was refused.
    pub refused: Option<&'a Refused>,
    /// The pinned version.
    pub target: Option<&'a str>,
    /// Selected nodes, and those Ready at the target.
    pub nodes: u32,
    /// Selected nodes Ready at the target.
    pub nodes_at_version: u32,
    /// Why the state is what it is.
    pub message: &'a str,
    /// Why the last fetch failed, when it did.
    pub fetch_error: Option<&'a str>,
    /// Why the environment's evidence is held, when it is, and whether
    /// that alone halts it (no cluster's standing failure does).
    pub held_alone: bool,
    /// The `ReportPushed` condition's message while the git server refuses
    /// the status report (status False, reason `Refused`); it names the
    /// branch and the server's words.
    pub report_refused: Option<&'a str>,
    /// The blocker the status names (`told.rs`), when it names one.
    pub blocker: Option<&'a str>,
}

impl<'a> Facts<'a> {
    /// The facts a CRD status shows.
    pub fn of(status: &'a DroverStatusStatus) -> Self {
        Facts {
            state: status.state.as_deref().and_then(parse_state),
            configured: status.last_applied_commit.is_some(),
            refused: status.refused.as_ref(),
            target: status.target.as_deref(),
            nodes: status.nodes,
            nodes_at_version: status.nodes_at_version,
            message: &status.message,
            held_alone: status.evidence_held.is_some() && status.halted_by.is_empty(),
            fetch_error: status
                .last_fetch
                .as_ref()
                .map(|f| f.result.as_str())
                .filter(|r| *r != "ok"),
            report_refused: status
                .conditions
                .iter()
                .find(|c| {
                    c.kind == REPORT_PUSHED && c.status == "False" && c.reason == PUSH_REFUSED
                })
                .map(|c| c.message.as_str()),
            blocker: status.blocker.as_deref(),
        }
    }
}

fn parse_state(s: &str) -> Option<RolloutState> {
    RolloutState::parse(s)
}

/// One condition's verdict: status, reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Said {
    status: bool,
    reason: String,
    message: String,
}

/// The verdicts for Ready, Reconciling and Stalled.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    ready: Said,
    reconciling: Said,
    stalled: Said,
}

/// Which of the three conditions is True (at most one), the reason all
/// three carry, and the message.
fn verdict(f: &Facts) -> Verdict {
    #[derive(Clone, Copy)]
    enum True {
        Ready,
        Reconciling,
        Stalled,
        None,
    }
    let progress = || {
        let mut m = format!(
            "{}/{} nodes at {}",
            f.nodes_at_version,
            f.nodes,
            f.target.unwrap_or("the target")
        );
        if !f.message.is_empty() {
            m.push_str(": ");
            m.push_str(f.message);
        }
        m
    };
    // A refusal's verdict: its message is the status's (the one told,
    // `told.rs`), else said from the refusal itself.
    let refusal = |r: &Refused| {
        let message = if f.message.is_empty() {
            format!(
                "commit {} refused ({} check, {}): {}",
                r.commit.get(..10).unwrap_or(&r.commit),
                r.stage,
                r.reason,
                r.message
            )
        } else {
            f.message.to_string()
        };
        if r.stage == "gate" && AWAITING_EVIDENCE.contains(&r.reason.as_str()) {
            (True::Reconciling, "AwaitingEvidence", message)
        } else {
            let reason = match r.stage.as_str() {
                "trust" => "RefusedByTrust",
                "config" => "RefusedByConfig",
                _ => "RefusedByGate",
            };
            (True::Stalled, reason, message)
        }
    };
    let (which, reason, message) = if !f.configured {
        if let Some(r) = f.refused {
            refusal(r)
        } else {
            let mut message = if f.message.is_empty() {
                "no trusted config fetched yet".to_string()
            } else {
                f.message.to_string()
            };
            if let Some(e) = f.fetch_error {
                message.push_str("; the last fetch failed: ");
                message.push_str(e);
            }
            (True::Reconciling, "WaitingForConfig", message)
        }
    } else {
        match f.state {
            None => (
                True::Reconciling,
                "Applying",
                format!(
                    "applying the config that pins {}",
                    f.target.unwrap_or("a new version")
                ),
            ),
            Some(RolloutState::Pending) => (True::Reconciling, "WaitingForWindow", progress()),
            Some(RolloutState::Paused) => (True::None, "Paused", progress()),
            Some(RolloutState::Rolling) => (True::Reconciling, "Rolling", progress()),
            Some(RolloutState::Settling) => (True::Reconciling, "Settling", progress()),
            Some(RolloutState::Confirmed) => (True::Ready, "Confirmed", progress()),
            Some(RolloutState::Blocked) => (True::Stalled, "Blocked", progress()),
            Some(RolloutState::Failed) => (True::Stalled, "Failed", progress()),
            // Another cluster's failure stopped the environment: a person must look.
            Some(RolloutState::Halted) if f.held_alone => {
                (True::Stalled, "EvidenceHeld", progress())
            }
            Some(RolloutState::Halted) => (True::Stalled, "Halted", progress()),
            Some(RolloutState::Revoked) => (True::Stalled, "Revoked", progress()),
            Some(RolloutState::Refused) => match f.refused {
                Some(r) => refusal(r),
                // A refused state without its refusal (an older status): stalled.
                None => (True::Stalled, "RefusedByGate", progress()),
            },
        }
    };
    let (which, reason, message) = match f.report_refused {
        Some(refusal) => (
            True::Stalled,
            "ReportRefused",
            format!(
                "{refusal}. Until the agent may push there, later environments cannot \
                 read this cluster's evidence: let the agent's git credentials push to its \
                 status branch (the forge's branch protection or pre-receive hook, the deploy \
                 key's write access, the agent's signing key; `drover doctor` checks the \
                 push); the agent tries again by itself with its next report or after five \
                 poll intervals. The rollout meanwhile: {reason}: {message}"
            ),
        ),
        None => (which, reason, message),
    };
    let message = bounded(message);
    let said = |status: bool| Said {
        status,
        reason: reason.to_string(),
        message: message.clone(),
    };
    Verdict {
        ready: said(matches!(which, True::Ready)),
        reconciling: said(matches!(which, True::Reconciling)),
        stalled: said(matches!(which, True::Stalled)),
    }
}

fn bounded(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let cut = (0..=MAX_MESSAGE)
            .rev()
            .find(|i| s.is_char_boundary(*i))
            .unwrap_or(0);
        s.truncate(cut);
    }
    s
}

/// The conditions for `facts` on an object at `generation`, given the
/// conditions it had (`previous`) and the time `now` (RFC 3339): Ready,
/// Reconciling and Stalled, then any other condition of `previous` as it
/// was. A condition keeps its `lastTransitionTime` while its status holds.
pub fn conditions(
    facts: &Facts,
    generation: Option<i64>,
    previous: &[Condition],
    now: &str,
) -> Vec<Condition> {
    let v = verdict(facts);
    let blocked = Said {
        status: facts.blocker.is_some(),
        reason: facts.blocker.unwrap_or("Progressing").to_string(),
        message: v.ready.message.clone(),
    };
    let ours = [
        (READY, v.ready),
        (RECONCILING, v.reconciling),
        (STALLED, v.stalled),
        (BLOCKED, blocked),
    ];
    let mut out: Vec<Condition> = ours
        .into_iter()
        .map(|(kind, said)| {
            let status = if said.status { "True" } else { "False" };
            let since = previous
                .iter()
                .find(|c| c.kind == kind && c.status == status)
                .map_or_else(|| now.to_string(), |c| c.last_transition_time.clone());
            Condition {
                kind: kind.into(),
                status: status.into(),
                observed_generation: generation,
                last_transition_time: since,
                reason: said.reason,
                message: said.message,
            }
        })
        .collect();
    out.extend(
        previous
            .iter()
            .filter(|c| ![READY, RECONCILING, STALLED, BLOCKED].contains(&c.kind.as_str()))
            .cloned(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(state: RolloutState) -> Facts<'static> {
        Facts {
            state: Some(state),
            configured: true,
            target: Some("1.13.2"),
            nodes: 3,
            nodes_at_version: 1,
            ..Facts::default()
        }
    }

    /// (Ready, Reconciling, Stalled, reason) for `f`.
    fn said(f: &Facts) -> (&'static str, &'static str, &'static str, String) {
        let c = conditions(f, Some(1), &[], "t0");
        let s = |i: usize| match c[i].status.as_str() {
            "True" => "True",
            _ => "False",
        };
        assert_eq!(
            c.iter().map(|c| c.kind.as_str()).collect::<Vec<_>>(),
            [READY, RECONCILING, STALLED, BLOCKED]
        );
        assert!(c[..3].iter().all(|x| x.reason == c[0].reason));
        // `Blocked` names the status's blocker, whatever the three say.
        assert_eq!(c[3].reason, f.blocker.unwrap_or("Progressing"));
        assert_eq!(c[3].status == "True", f.blocker.is_some());
        (s(0), s(1), s(2), c[0].reason.clone())
    }

    /// kstatus's rules (sigs.k8s.io/cli-utils/pkg/kstatus/status, Compute)
    /// for an object whose generation is observed: Reconciling True is
    /// InProgress, Stalled True is Failed, else a Ready condition decides
    /// (True Current, otherwise InProgress).
    fn kstatus(c: &[Condition]) -> &'static str {
        let is = |k: &str, s: &str| c.iter().any(|x| x.kind == k && x.status == s);
        if is(RECONCILING, "True") {
            "InProgress"
        } else if is(STALLED, "True") {
            "Failed"
        } else if is(READY, "True") {
            "Current"
        } else {
            "InProgress"
        }
    }

    #[test]
    fn every_rollout_state_has_its_conditions() {
        use RolloutState::*;
        let cases = [
            (
                Pending,
                ("False", "True", "False", "WaitingForWindow"),
                "InProgress",
            ),
            (Paused, ("False", "False", "False", "Paused"), "InProgress"),
            (Rolling, ("False", "True", "False", "Rolling"), "InProgress"),
            (
                Settling,
                ("False", "True", "False", "Settling"),
                "InProgress",
            ),
            (
                Confirmed,
                ("True", "False", "False", "Confirmed"),
                "Current",
            ),
            (Blocked, ("False", "False", "True", "Blocked"), "Failed"),
            (Failed, ("False", "False", "True", "Failed"), "Failed"),
            (Revoked, ("False", "False", "True", "Revoked"), "Failed"),
            (
                Refused,
                ("False", "False", "True", "RefusedByGate"),
                "Failed",
            ),
            (Halted, ("False", "False", "True", "Halted"), "Failed"),
        ];
        for (state, want, k) in cases {
            let f = facts(state);
            let (r, rc, st, reason) = said(&f);
            assert_eq!((r, rc, st, reason.as_str()), want, "{state:?}");
            assert_eq!(kstatus(&conditions(&f, Some(1), &[], "t0")), k, "{state:?}");
        }
        assert_eq!(RolloutState::ALL.len(), cases.len());
        // Halted because the environment's evidence is held, no failure standing.
        let f = Facts {
            held_alone: true,
            ..facts(Halted)
        };
        let (r, rc, st, reason) = said(&f);
        assert_eq!(
            (r, rc, st, reason.as_str()),
            ("False", "False", "True", "EvidenceHeld")
        );
    }

    #[test]
    fn a_refusal_is_stalled_unless_time_or_evidence_cures_it() {
        let refusal = |stage: &str, reason: &str| Refused {
            commit: "0123456789abcdef".into(),
            stage: stage.into(),
            reason: reason.into(),
            message: "why".into(),
        };
        for (stage, reason, want) in [
            (
                "trust",
                "unsigned",
                ("False", "False", "True", "RefusedByTrust"),
            ),
            (
                "trust",
                "no_trusted_state",
                ("False", "False", "True", "RefusedByTrust"),
            ),
            (
                "config",
                "invalid",
                ("False", "False", "True", "RefusedByConfig"),
            ),
            (
                "gate",
                "revoked",
                ("False", "False", "True", "RefusedByGate"),
            ),
            (
                "gate",
                "downgrade",
                ("False", "False", "True", "RefusedByGate"),
            ),
            (
                "gate",
                "not_confirmed",
                ("False", "True", "False", "AwaitingEvidence"),
            ),
            (
                "gate",
                "soaking",
                ("False", "True", "False", "AwaitingEvidence"),
            ),
            (
                "gate",
                "history_soaking",
                ("False", "True", "False", "AwaitingEvidence"),
            ),
        ] {
            let r = refusal(stage, reason);
            // The state told while the head is refused (`told.rs`).
            let f = Facts {
                refused: Some(&r),
                ..facts(RolloutState::Refused)
            };
            let (a, b, c, why) = said(&f);
            assert_eq!((a, b, c, why.as_str()), want, "{stage}/{reason}");
            let c = conditions(&f, None, &[], "t0");
            assert!(
                c[0].message.contains("commit 0123456789 refused (")
                    && c[0].message.contains(reason),
                "{}",
                c[0].message
            );
        }
    }

    #[test]
    fn before_any_config_the_agent_is_reconciling_and_says_why() {
        let f = Facts {
            fetch_error: Some("authentication failed"),
            message: "no trusted config fetched yet",
            ..Facts::default()
        };
        let (a, b, c, why) = said(&f);
        assert_eq!(
            (a, b, c, why.as_str()),
            ("False", "True", "False", "WaitingForConfig")
        );
        let m = &conditions(&f, None, &[], "t")[0].message;
        assert!(m.contains("authentication failed"), "{m}");
        let f = Facts {
            state: None,
            ..facts(RolloutState::Rolling)
        };
        assert_eq!(said(&f).3, "Applying");
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_does() {
        let rolling = conditions(&facts(RolloutState::Rolling), Some(1), &[], "t1");
        // Still rolling, more nodes done: the message moves, the times stay.
        let f = Facts {
            nodes_at_version: 2,
            ..facts(RolloutState::Rolling)
        };
        let later = conditions(&f, Some(1), &rolling, "t2");
        assert!(later.iter().all(|c| c.last_transition_time == "t1"));
        assert!(later[0].message.starts_with("2/3 nodes at 1.13.2"));
        // Settling: every status is as it was (Reconciling still True), so
        // no time moves although the reason does.
        let settling = conditions(&facts(RolloutState::Settling), Some(1), &later, "t3");
        assert!(settling.iter().all(|c| c.last_transition_time == "t1"));
        assert_eq!(settling[1].reason, "Settling");
        // Confirmed: Ready and Reconciling flip, Stalled holds.
        let done = conditions(&facts(RolloutState::Confirmed), Some(2), &settling, "t4");
        let times: Vec<_> = done
            .iter()
            .map(|c| c.last_transition_time.as_str())
            .collect();
        assert_eq!(times, ["t4", "t4", "t1", "t1"]);
        assert!(done.iter().all(|c| c.observed_generation == Some(2)));
    }

    #[test]
    fn a_report_the_git_server_refuses_stalls_whatever_the_rollout_says() {
        let refusal = "the git server refuses the status report on branch \
                       drover/status.d/test/test-1 (1 report waiting; not retried until the \
                       next report or five poll intervals): pre-receive hook declined";
        for state in RolloutState::ALL {
            let f = Facts {
                report_refused: Some(refusal),
                ..facts(state)
            };
            let (a, b, c, why) = said(&f);
            assert_eq!(
                (a, b, c, why.as_str()),
                ("False", "False", "True", "ReportRefused"),
                "{state:?}"
            );
            let c = conditions(&f, Some(1), &[], "t0");
            assert_eq!(kstatus(&c), "Failed", "{state:?}");
            let m = &c[2].message;
            // The branch, the server's words, what to do, and the rollout.
            assert!(
                m.contains("on branch drover/status.d/test/test-1")
                    && m.contains("pre-receive hook declined")
                    && m.contains("let the agent's git credentials push to its status branch")
                    && m.contains("drover doctor"),
                "{m}"
            );
            assert!(
                m.contains(&format!(
                    "The rollout meanwhile: {}: ",
                    said(&facts(state)).3
                )),
                "{m}"
            );
        }
        // A refused head and a refused report: both in the message.
        let r = Refused {
            commit: "0123456789abcdef".into(),
            stage: "trust".into(),
            reason: "unsigned".into(),
            message: "why".into(),
        };
        let f = Facts {
            refused: Some(&r),
            report_refused: Some(refusal),
            ..facts(RolloutState::Refused)
        };
        let c = conditions(&f, Some(1), &[], "t0");
        assert_eq!(c[2].reason, "ReportRefused");
        assert!(c[2]
            .message
            .contains("RefusedByTrust: commit 0123456789 refused"));
    }

    #[test]
    fn only_a_refusal_read_from_report_pushed_stalls_not_an_outage_nor_a_push() {
        let pushed = |status: &str, reason: &str| Condition {
            kind: "ReportPushed".into(),
            status: status.into(),
            observed_generation: None,
            last_transition_time: "t0".into(),
            reason: reason.into(),
            message: "on branch drover/status.d/test/test-1: words".into(),
        };
        let status = |c: Condition| DroverStatusStatus {
            state: Some("rolling".into()),
            last_applied_commit: Some("abc".into()),
            conditions: vec![c],
            ..Default::default()
        };
        let refused = status(pushed("False", "Refused"));
        let f = Facts::of(&refused);
        assert_eq!(
            f.report_refused,
            Some(refused.conditions[0].message.as_str())
        );
        assert_eq!(said(&f).3, "ReportRefused");
        // Controls: a git server that is down is retried by the agent, and
        // a report that landed says nothing: the rollout decides.
        for control in [pushed("False", "Unreachable"), pushed("True", "Pushed")] {
            let s = status(control);
            let f = Facts::of(&s);
            assert_eq!(f.report_refused, None);
            assert_eq!(said(&f), ("False", "True", "False", "Rolling".into()));
        }
        // Fixed: the next computation is the rollout's again, and Stalled's
        // transition time moves with its status.
        let stalled = conditions(&Facts::of(&refused), Some(1), &[], "t1");
        let s = status(pushed("True", "Pushed"));
        let back = conditions(&Facts::of(&s), Some(1), &stalled, "t2");
        assert_eq!(
            (
                back[2].status.as_str(),
                back[2].last_transition_time.as_str()
            ),
            ("False", "t2")
        );
        assert_eq!(back[1].reason, "Rolling");
    }

    #[test]
    fn conditions_of_other_types_are_kept() {
        let other = Condition {
            kind: "ReportPushed".into(),
            status: "False".into(),
            observed_generation: None,
            last_transition_time: "t0".into(),
            reason: "Unreachable".into(),
            message: "connection refused".into(),
        };
        let c = conditions(
            &facts(RolloutState::Rolling),
            Some(1),
            std::slice::from_ref(&other),
            "t1",
        );
        assert_eq!(c.len(), 5);
        assert_eq!(c[4], other);
    }

    #[test]
    fn reasons_are_what_metav1_condition_admits_and_messages_are_bounded() {
        let reason = regex::Regex::new("^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$").unwrap();
        let long = "x".repeat(100_000);
        for state in RolloutState::ALL {
            let f = Facts {
                message: &long,
                ..facts(state)
            };
            for c in conditions(&f, Some(1), &[], "t") {
                assert!(reason.is_match(&c.reason), "{}", c.reason);
                assert!(c.reason.len() <= 1024);
                assert!(c.message.len() <= MAX_MESSAGE);
            }
        }
    }

    #[test]
    fn facts_are_read_from_the_status_as_written() {
        let status = DroverStatusStatus {
            state: Some("settling".into()),
            last_applied_commit: Some("abc".into()),
            target: Some("1.13.2".into()),
            nodes: 3,
            nodes_at_version: 3,
            ..Default::default()
        };
        let f = Facts::of(&status);
        assert_eq!(f.state, Some(RolloutState::Settling));
        assert!(f.configured);
        assert_eq!(said(&f).3, "Settling");
        assert_eq!(parse_state("bogus"), None);
    }
}
