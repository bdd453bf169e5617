//! The one computation of the state a cluster is in, as the agent tells
//! it: the `drover_rollout_state` metric, the `DroverStatus`'s state and
//! message (and so its conditions, `conditions.rs`), the Event on each
//! change and the signed status report all carry [`told`]'s answer, so
//! they cannot disagree. Pure: values in, the state out.
//!
//! Several things can be true at once (the applied rollout failed, its
//! version was revoked since, a newer head was refused); one state is
//! told, the one closest to the nodes, and the message names the others:
//!
//! 1. `failed`, then `blocked`: what the nodes did. A `failed` report is
//!    evidence the gate reads (it withdraws a confirmation), so nothing
//!    may hide it.
//! 2. `revoked`: the pinned version was revoked after it was pinned; the
//!    nodes already moved run a release nobody may take, and stay on it
//!    until a person pins another version.
//! 3. `refused`: a newer head is refused; the report names the refused
//!    version, the message the refusal and what the cluster stays on.
//! 4. the applied rollout's own state (`pending`, `paused`, `rolling`,
//!    `settling`, `confirmed`).
//!
//! Without an applied config the state is `refused` (the refusal says
//! why) or `blocked` (nothing trusted fetched yet).

use super::blocked::{self, Blocked, NodeBlocked, Waiting};
use super::crd::{DroverStatusStatus, Refused};
use crate::rollout::{Attention, Blocker, RolloutState};
use crate::status::StatusReport;
use semver::Version;

/// The longest message told (a status report's message is read back by
/// every `drover status`; the full refusal stays in the status's `refused`).
const MAX_MESSAGE: usize = 1000;

/// The applied config and what the rollout decided for it.
#[derive(Debug, Clone, Copy)]
pub struct Applied<'a> {
    /// The pinned version.
    pub version: &'a Version,
    /// Why the pinned version is revoked by the policy in force, if it is.
    pub revoked: Option<&'a str>,
    /// The decision's state.
    pub state: RolloutState,
    /// Selected nodes.
    pub nodes: u32,
    /// Selected nodes Ready at the version.
    pub nodes_at_version: u32,
    /// The decision's message.
    pub message: &'a str,
    /// Why the decision does not progress (`Decision::blocker`).
    pub blocker: Option<Blocker>,
    /// The nodes it leaves waiting ([`blocked::waiting`]).
    pub waiting: &'a [Waiting],
}

/// A newer head refused, and the version it pins when readable.
#[derive(Debug, Clone, Copy)]
pub struct Refusal<'a> {
    /// The refusal as the status shows it.
    pub refused: &'a Refused,
    /// The version the refused head pins.
    pub version: Option<&'a Version>,
}

/// Everything the told state depends on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Situation<'a> {
    /// The applied config's rollout (`None`: no config applied).
    pub applied: Option<Applied<'a>>,
    /// The newest head, when it is refused.
    pub refused: Option<Refusal<'a>>,
}

/// What identifies a telling for Events: the state, and for `refused`
/// the refused commit, check and reason.
pub type Transition = (RolloutState, Option<(String, String, String)>);

/// The state told, with what the report and the Event say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    /// The one state.
    pub state: RolloutState,
    /// The version the report names: the refused head's for `refused`,
    /// else the pinned one (`None`: neither is known).
    pub version: Option<Version>,
    /// Why, bounded; never empty outside the quiet states.
    pub message: String,
    /// Nodes Ready at the applied version, of the selected ones.
    pub nodes_at_version: u32,
    /// Selected nodes.
    pub nodes: u32,
    /// What identifies this telling for Events: a new value is a
    /// transition (a state, or another refused commit or reason).
    pub transition: Transition,
    /// Why the cluster is not progressing: exactly when the state is one
    /// of `pending`, `paused`, `blocked`, `failed`, `halted`, `revoked`,
    /// `refused` (docs/status.md, "Blockers").
    pub blocker: Option<Blocker>,
    /// The selected nodes that are not progressing, each with its one
    /// blocker, in name order.
    pub blocked_nodes: Vec<NodeBlocked>,
}

impl Told {
    /// The Event's reason for this state: `Rollout` and the state's name
    /// (`RolloutRevoked`, `RolloutRefused`...).
    pub fn event_reason(&self) -> String {
        let name = self.state.as_str();
        let mut c = name.chars();
        let cap: String = c
            .next()
            .map(|f| f.to_uppercase().chain(c).collect())
            .unwrap_or_default();
        format!("Rollout{cap}")
    }

    /// Whether the Event is a Warning: the state asks for a person.
    pub fn warns(&self) -> bool {
        self.state.attention() != Attention::None
    }

    /// `report` telling this state: its state, version (the pinned one,
    /// `report`'s, when none is known), node counts and message.
    pub fn report(&self, report: StatusReport) -> StatusReport {
        StatusReport {
            version: self.version.clone().unwrap_or(report.version),
            state: self.state,
            nodes: self.nodes,
            nodes_at_version: self.nodes_at_version,
            message: self.message.clone(),
            detail: crate::status::NodeDetail {
                blocker: self.blocker.map(|b| b.as_str().to_string()),
                blockers: self
                    .blocked_nodes
                    .iter()
                    .map(|n| (n.node.clone(), n.blocker.as_str().to_string()))
                    .collect(),
                ..report.detail
            }
            .bounded(),
            ..report
        }
    }

    /// Write this state into the metrics: the rollout state, the blocker
    /// and the blocked nodes, their age at `now` counted from `status`'s
    /// `since` for a node without a time of its own.
    pub fn write_metrics(
        &self,
        metrics: &super::metrics::Metrics,
        status: &DroverStatusStatus,
        now: chrono::DateTime<chrono::Utc>,
    ) {
        metrics.set_rollout_state(self.state);
        let since = status
            .since
            .as_deref()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .map_or(now, |t| t.with_timezone(&chrono::Utc));
        metrics.set_blocked_nodes(self.blocker, &self.blocked(since), now);
    }

    /// The blocked nodes' counts and the oldest, a node without a time of
    /// its own counted from `state_since`.
    pub fn blocked(&self, state_since: chrono::DateTime<chrono::Utc>) -> Blocked {
        Blocked::of(&self.blocked_nodes, state_since)
    }

    /// Write this state into the status: its state and message, and
    /// `since` (`now`) when the state changes, so a refusal kept for days
    /// keeps its `since`.
    pub fn write_status(&self, status: &mut DroverStatusStatus, now: &str) {
        let state = self.state.as_str();
        if status.state.as_deref() != Some(state) {
            status.since = Some(now.to_string());
        }
        status.state = Some(state.into());
        status.message.clone_from(&self.message);
        status.blocker = self.blocker.map(|b| b.as_str().to_string());
        let since = status
            .since
            .as_deref()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .map_or(chrono::DateTime::UNIX_EPOCH, |t| {
                t.with_timezone(&chrono::Utc)
            });
        status.blocked_nodes = self.blocked(since).by_name();
    }

    /// The Event's note: the state, its blocker when it has one (the same
    /// word of the closed list the status and the report carry), the node
    /// count and the message: "blocked (pdb) 2/3 nodes at 1.13.2: ...".
    pub fn note(&self) -> String {
        let blocker = self
            .blocker
            .map(|b| format!(" ({})", b.as_str()))
            .unwrap_or_default();
        let mut s = format!(
            "{}{blocker} {}/{} nodes at {}",
            self.state.as_str(),
            self.nodes_at_version,
            self.nodes,
            self.version
                .as_ref()
                .map_or_else(|| "no version".to_string(), ToString::to_string)
        );
        if !self.message.is_empty() {
            s.push_str(": ");
            s.push_str(&self.message);
        }
        s
    }
}

/// The state a cluster is in (see the module docs for the order).
pub fn told(s: &Situation) -> Told {
    let refused_key = s.refused.map(|r| {
        (
            r.refused.commit.clone(),
            r.refused.stage.clone(),
            r.refused.reason.clone(),
        )
    });
    let (state, version, message) = match (&s.applied, &s.refused) {
        (None, None) => (
            RolloutState::Blocked,
            None,
            "no trusted config fetched yet".to_string(),
        ),
        (None, Some(r)) => (
            RolloutState::Refused,
            r.version.cloned(),
            format!("{}; no config applied yet", refusal(r.refused)),
        ),
        (Some(a), r) => match (a.state, a.revoked, r) {
            (RolloutState::Failed | RolloutState::Blocked, _, _) => (
                a.state,
                Some(a.version.clone()),
                with_others(a.message.to_string(), a, r, false),
            ),
            (_, Some(why), r) => (
                RolloutState::Revoked,
                Some(a.version.clone()),
                with_others(revoked(a, why), a, r, true),
            ),
            (_, None, Some(r)) => (
                RolloutState::Refused,
                r.version.cloned().or_else(|| Some(a.version.clone())),
                format!(
                    "{}; stays on {} ({} {}/{} nodes)",
                    refusal(r.refused),
                    a.version,
                    a.state.as_str(),
                    a.nodes_at_version,
                    a.nodes
                ),
            ),
            (state, None, None) => (state, Some(a.version.clone()), a.message.to_string()),
        },
    };
    let (nodes, nodes_at_version) = s.applied.map_or((0, 0), |a| (a.nodes, a.nodes_at_version));
    let blocker = match state {
        RolloutState::Revoked => Some(Blocker::Revoked),
        RolloutState::Refused => s
            .refused
            .map(|r| Blocker::of_refusal(&r.refused.stage, &r.refused.reason)),
        _ => match &s.applied {
            None => Some(Blocker::Source),
            Some(a) => a.blocker,
        },
    };
    let blocked_nodes = blocked::resolve(s.applied.map_or(&[][..], |a| a.waiting), blocker);
    Told {
        blocker,
        blocked_nodes,
        state,
        version,
        message: bounded(message),
        nodes,
        nodes_at_version,
        transition: (
            state,
            refused_key.filter(|_| state == RolloutState::Refused),
        ),
    }
}

/// `commit 0123456789ab refused (gate check, revoked): why`.
fn refusal(r: &Refused) -> String {
    format!(
        "commit {} refused ({} check, {}): {}",
        super::short(&r.commit),
        r.stage,
        r.reason,
        r.message
    )
}

fn revoked(a: &Applied, why: &str) -> String {
    format!(
        "{} is revoked: {why}; {}/{} nodes run it and keep it, no further node starts; \
         pin a version that is not revoked in this environment's file",
        a.version, a.nodes_at_version, a.nodes
    )
}

/// `message`, then what else holds: the revocation (unless `message` is
/// it), and a newer head's refusal in short.
fn with_others(mut message: String, a: &Applied, r: &Option<Refusal>, is_revoked: bool) -> String {
    let add = |m: &mut String, more: String| {
        if !m.is_empty() {
            m.push_str("; ");
        }
        m.push_str(&more);
    };
    if let (false, Some(why)) = (is_revoked, a.revoked) {
        add(&mut message, format!("{} is revoked: {why}", a.version));
    }
    if let Some(r) = r {
        add(
            &mut message,
            format!(
                "newer commit {} refused ({} check, {})",
                super::short(&r.refused.commit),
                r.refused.stage,
                r.refused.reason
            ),
        );
    }
    message
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

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn refused(reason: &str) -> Refused {
        Refused {
            commit: "0123456789abcdef0123".into(),
            stage: "gate".into(),
            reason: reason.into(),
            message: format!("why: {reason}"),
        }
    }

    fn applied<'a>(version: &'a Version, state: RolloutState) -> Applied<'a> {
        Applied {
            version,
            revoked: None,
            state,
            nodes: 10,
            nodes_at_version: 4,
            message: "",
            blocker: decided_blocker(state),
            waiting: &[],
        }
    }

    /// A blocker a decision in `state` may name (`rollout::decide`).
    fn decided_blocker(state: RolloutState) -> Option<Blocker> {
        match state {
            RolloutState::Pending => Some(Blocker::Window),
            RolloutState::Paused => Some(Blocker::Freeze),
            RolloutState::Blocked => Some(Blocker::Pdb),
            RolloutState::Failed => Some(Blocker::Health),
            RolloutState::Halted => Some(Blocker::Halted),
            _ => None,
        }
    }

    #[test]
    fn the_applied_rollout_is_told_as_decided_when_nothing_else_holds() {
        let pinned = v("1.13.2");
        for state in [
            RolloutState::Pending,
            RolloutState::Paused,
            RolloutState::Rolling,
            RolloutState::Settling,
            RolloutState::Confirmed,
            RolloutState::Blocked,
            RolloutState::Failed,
        ] {
            let t = told(&Situation {
                applied: Some(Applied {
                    message: "m",
                    ..applied(&pinned, state)
                }),
                refused: None,
            });
            assert_eq!(t.state, state);
            assert_eq!(t.version.as_ref(), Some(&pinned));
            assert_eq!(t.message, "m");
            assert_eq!(t.transition, (state, None));
        }
    }

    #[test]
    fn a_version_revoked_mid_rollout_is_revoked_and_alerts_whatever_the_window_says() {
        let pinned = v("1.13.3");
        for decided in [
            RolloutState::Pending,
            RolloutState::Paused,
            RolloutState::Rolling,
            RolloutState::Settling,
            RolloutState::Confirmed,
        ] {
            let t = told(&Situation {
                applied: Some(Applied {
                    revoked: Some("kernel panic on m7i"),
                    message: "1.13.3 is revoked: kernel panic on m7i",
                    ..applied(&pinned, decided)
                }),
                refused: None,
            });
            assert_eq!(t.state, RolloutState::Revoked, "{decided:?}");
            assert_eq!(t.state.attention(), Attention::Now);
            assert!(t.warns());
            assert_eq!(t.event_reason(), "RolloutRevoked");
            assert_eq!(t.version.as_ref(), Some(&pinned));
            assert!(
                t.message
                    .starts_with("1.13.3 is revoked: kernel panic on m7i; 4/10 nodes run it"),
                "{}",
                t.message
            );
            assert!(t
                .note()
                .starts_with("revoked (revoked) 4/10 nodes at 1.13.3: "));
        }
    }

    #[test]
    fn a_refused_head_is_told_refused_not_what_the_applied_rollout_says() {
        let pinned = v("1.13.2");
        let head = v("1.13.3");
        let r = refused("soaking");
        let t = told(&Situation {
            applied: Some(applied(&pinned, RolloutState::Confirmed)),
            refused: Some(Refusal {
                refused: &r,
                version: Some(&head),
            }),
        });
        assert_eq!(t.state, RolloutState::Refused);
        assert_eq!(t.version.as_ref(), Some(&head), "the refused version");
        assert_eq!(
            t.message,
            "commit 0123456789ab refused (gate check, soaking): why: soaking; \
             stays on 1.13.2 (confirmed 4/10 nodes)"
        );
        assert_eq!(t.state.attention(), Attention::Lasting);
        // Another refused commit or reason is another transition.
        let r2 = refused("downgrade");
        let t2 = told(&Situation {
            applied: Some(applied(&pinned, RolloutState::Confirmed)),
            refused: Some(Refusal {
                refused: &r2,
                version: None,
            }),
        });
        assert_ne!(t.transition, t2.transition);
        assert_eq!(
            t2.version.as_ref(),
            Some(&pinned),
            "unreadable: the applied one"
        );
    }

    #[test]
    fn what_the_nodes_did_wins_over_a_revocation_and_a_refusal_which_the_message_names() {
        let pinned = v("1.13.3");
        let r = refused("unsigned");
        for state in [RolloutState::Failed, RolloutState::Blocked] {
            let t = told(&Situation {
                applied: Some(Applied {
                    revoked: Some("bad"),
                    message: "node n-1 failed",
                    ..applied(&pinned, state)
                }),
                refused: Some(Refusal {
                    refused: &r,
                    version: None,
                }),
            });
            assert_eq!(t.state, state);
            assert_eq!(t.version.as_ref(), Some(&pinned));
            assert_eq!(
                t.message,
                "node n-1 failed; 1.13.3 is revoked: bad; \
                 newer commit 0123456789ab refused (gate check, unsigned)"
            );
            assert_eq!(t.transition, (state, None));
        }
        // A revocation wins over a refusal.
        let t = told(&Situation {
            applied: Some(Applied {
                revoked: Some("bad"),
                ..applied(&pinned, RolloutState::Rolling)
            }),
            refused: Some(Refusal {
                refused: &r,
                version: None,
            }),
        });
        assert_eq!(t.state, RolloutState::Revoked);
        assert!(t
            .message
            .ends_with("; newer commit 0123456789ab refused (gate check, unsigned)"));
    }

    #[test]
    fn without_an_applied_config_the_state_is_refused_or_blocked_and_says_why() {
        let t = told(&Situation::default());
        assert_eq!(t.state, RolloutState::Blocked);
        assert_eq!(t.message, "no trusted config fetched yet");
        let r = refused("no_trusted_state");
        let head = v("1.13.3");
        let t = told(&Situation {
            applied: None,
            refused: Some(Refusal {
                refused: &r,
                version: Some(&head),
            }),
        });
        assert_eq!(t.state, RolloutState::Refused);
        assert!(
            t.message.ends_with("; no config applied yet"),
            "{}",
            t.message
        );
    }

    #[test]
    fn every_state_but_the_quiet_ones_says_why_and_messages_are_bounded() {
        let pinned = v("1.0.0");
        let long = "é".repeat(5_000);
        let r = Refused {
            message: long.clone(),
            ..refused("invalid")
        };
        // Every state a decision ends in (it never decides the last two).
        let decided = RolloutState::ALL
            .into_iter()
            .filter(|s| !matches!(s, RolloutState::Revoked | RolloutState::Refused));
        for state in decided {
            for revoked in [None, Some(long.as_str())] {
                for refusal in [None, Some(&r)] {
                    let t = told(&Situation {
                        applied: Some(Applied {
                            revoked,
                            message: "",
                            ..applied(&pinned, state)
                        }),
                        refused: refusal.map(|r| Refusal {
                            refused: r,
                            version: None,
                        }),
                    });
                    assert!(t.message.len() <= MAX_MESSAGE);
                    if t.state.attention() != Attention::None
                        // The decision's own message says why for these.
                        && !matches!(
                            t.state,
                            RolloutState::Failed | RolloutState::Blocked | RolloutState::Halted
                        )
                    {
                        assert!(!t.message.is_empty(), "{state:?} {revoked:?}");
                    }
                }
            }
        }
    }

    /// A situation told in each state, in `RolloutState::ALL`'s order.
    fn situations<'a>(
        pinned: &'a Version,
        head: &'a Version,
        r: &'a Refused,
    ) -> Vec<(RolloutState, Situation<'a>)> {
        RolloutState::ALL
            .into_iter()
            .map(|state| {
                let mut a = Applied {
                    message: "the decision's words",
                    ..applied(pinned, state)
                };
                let mut refused = None;
                match state {
                    RolloutState::Revoked => {
                        a.state = RolloutState::Rolling;
                        a.revoked = Some("kernel panic");
                    }
                    RolloutState::Refused => {
                        a.state = RolloutState::Confirmed;
                        refused = Some(Refusal {
                            refused: r,
                            version: Some(head),
                        });
                    }
                    _ => {}
                }
                (
                    state,
                    Situation {
                        applied: Some(a),
                        refused,
                    },
                )
            })
            .collect()
    }

    /// The metric, the DroverStatus (state, message, conditions), the
    /// Event and the signed report say the same for every state, through
    /// the calls the agent makes (`report.rs`: `tell`, `report`).
    #[test]
    fn every_state_is_told_alike_by_the_metric_the_status_the_event_and_the_report() {
        use crate::agent::conditions::{conditions, Facts};
        use crate::agent::metrics::Metrics;
        let (pinned, head) = (v("1.13.2"), v("1.13.3"));
        let r = refused("unsigned");
        let all = situations(&pinned, &head, &r);
        assert_eq!(all.len(), RolloutState::ALL.len());
        for (want, situation) in all {
            let t = told(&situation);
            assert_eq!(t.state, want);
            // Exactly the states that do not progress name one blocker.
            assert_eq!(
                t.blocker.is_some(),
                !matches!(
                    want,
                    RolloutState::Rolling | RolloutState::Settling | RolloutState::Confirmed
                ),
                "{want:?}"
            );
            let blocker = t.blocker.map(Blocker::as_str);
            // The metric: one series at 1, this state's.
            let m = Metrics::new();
            m.set_rollout_state(t.state);
            let text = m.render();
            let ones: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("drover_rollout_state{") && l.ends_with(" 1"))
                .collect();
            assert_eq!(
                ones,
                [format!(
                    r#"drover_rollout_state{{state="{}"}} 1"#,
                    want.as_str()
                )],
                "{want:?}"
            );
            // The DroverStatus and its conditions.
            let mut status = DroverStatusStatus {
                last_applied_commit: Some("abc".into()),
                refused: situation.refused.map(|r| r.refused.clone()),
                target: Some(pinned.to_string()),
                nodes: t.nodes,
                nodes_at_version: t.nodes_at_version,
                ..Default::default()
            };
            t.write_status(&mut status, "2027-01-01T00:00:00Z");
            assert_eq!(status.state.as_deref(), Some(want.as_str()));
            assert_eq!(status.blocker.as_deref(), blocker, "{want:?}");
            m.set_blocked_nodes(
                t.blocker,
                &t.blocked(chrono::DateTime::UNIX_EPOCH),
                chrono::DateTime::UNIX_EPOCH,
            );
            let text = m.render();
            let named: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("drover_blocker{") && l.ends_with(" 1"))
                .collect();
            let want_named: Vec<String> = blocker
                .map(|b| format!(r#"drover_blocker{{blocker="{b}"}} 1"#))
                .into_iter()
                .collect();
            assert_eq!(named, want_named, "{want:?}");
            assert_eq!(status.message, t.message);
            assert!(!t.message.is_empty(), "{want:?}");
            let c = conditions(&Facts::of(&status), Some(1), &[], "t");
            assert_eq!(c[3].kind, "Blocked");
            assert_eq!(c[3].status == "True", blocker.is_some());
            assert_eq!(c[3].reason, blocker.unwrap_or("Progressing"), "{want:?}");
            assert!(
                c.iter().all(|c| c.message.contains(&t.message)),
                "{want:?}: {c:?}"
            );
            let stalled = c[2].status == "True";
            assert_eq!(
                stalled,
                want.attention() != Attention::None,
                "{want:?}: Stalled is the alert states'"
            );
            // The Event.
            assert_eq!(
                t.event_reason().to_lowercase(),
                format!("rollout{}", want.as_str())
            );
            let opening = match blocker {
                Some(b) => format!("{} ({b}) ", want.as_str()),
                None => format!("{} ", want.as_str()),
            };
            assert!(
                t.note().starts_with(&opening) && t.note().ends_with(&t.message),
                "{want:?}: {}",
                t.note()
            );
            assert_eq!(t.warns(), want.attention() != Attention::None);
            // The signed report, as it is written to and read from git.
            let report = t.report(StatusReport {
                env: "stage".into(),
                cluster: "stage-1".into(),
                config_commit: "abc".into(),
                version: pinned.clone(),
                state: RolloutState::Rolling,
                since: chrono::DateTime::UNIX_EPOCH,
                nodes: 0,
                nodes_at_version: 0,
                message: String::new(),
                detail: Default::default(),
            });
            let back = StatusReport::from_toml(&report.to_toml()).unwrap();
            assert_eq!(back.state, want);
            assert_eq!(back.detail.blocker.as_deref(), blocker, "{want:?}");
            assert_eq!(back.message, status.message);
            assert_eq!(
                (back.nodes, back.nodes_at_version),
                (status.nodes, status.nodes_at_version)
            );
            let version = if want == RolloutState::Refused {
                &head
            } else {
                &pinned
            };
            assert_eq!(&back.version, version, "{want:?}");
        }
    }
}
