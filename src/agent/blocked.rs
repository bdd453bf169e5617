//! Which nodes are not progressing and why, as [`super::told`] tells it:
//! the nodes a decision leaves waiting ([`waiting`]), each with the blocker
//! the decision names for it or the cluster's, and what the status object
//! and the metrics carry of them ([`Blocked`]). Pure: values in, values out.

use crate::cluster::{NodeView, ProgressState};
use crate::rollout::{Blocker, Decision};
use chrono::{DateTime, Utc};
use semver::Version;
use serde::Serialize;
use std::collections::BTreeMap;

/// A node the decision leaves where it is, before the cluster's blocker is
/// known: its own blocker when the decision names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Node name.
    pub node: String,
    /// Its own blocker (`None`: it waits on the cluster's, or for room in
    /// the budget while the cluster rolls).
    pub own: Option<Blocker>,
    /// Since when, when its record says (given back blocked or failed).
    pub since: Option<DateTime<Utc>>,
}

/// A node that is not progressing, and its one blocker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeBlocked {
    /// Node name.
    pub node: String,
    /// Why.
    pub blocker: Blocker,
    /// Since when, when its record says; else since the cluster's state.
    pub since: Option<DateTime<Utc>>,
}

/// The selected nodes `decision` leaves waiting: neither at `target` and
/// Ready, nor in flight, nor acted on by the decision, in name order.
pub fn waiting(decision: &Decision, observed: &[NodeView], target: &Version) -> Vec<Waiting> {
    let mut out: Vec<Waiting> = observed
        .iter()
        .filter_map(|n| {
            let progress = n.progress.as_ref().ok().and_then(Option::as_ref);
            let since = progress
                .filter(|p| matches!(p.state, ProgressState::Blocked | ProgressState::Failed))
                .map(|p| p.started_at);
            let skipped = decision.skipped.iter().find(|s| s.node == n.name);
            if let Some(s) = skipped {
                // Held by consent: since drover first saw the hold.
                let since = match s.blocker {
                    Blocker::Consent => n.consent_hold.map(|h| h.since).or(since),
                    _ => since,
                };
                return Some(Waiting {
                    node: n.name.clone(),
                    own: Some(s.blocker),
                    since,
                });
            }
            // Recording a consent hold's end moves nothing.
            let acted = decision.actions.iter().any(|a| {
                a.node() == n.name && !matches!(a, crate::rollout::Action::Consent { .. })
            });
            let moving = progress.is_some_and(|p| {
                p.state.in_flight()
                    || matches!(
                        p.state,
                        ProgressState::Preparing | ProgressState::Watching | ProgressState::Passed
                    )
            });
            let done = n.ready && n.version.as_ref() == Some(target);
            (!acted && !moving && !done).then(|| Waiting {
                node: n.name.clone(),
                own: progress
                    .filter(|p| p.state == ProgressState::Blocked)
                    .map(|_| Blocker::Pdb),
                since,
            })
        })
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// Each waiting node's one blocker: its own, else the cluster's, else
/// (the cluster rolls) `budget`.
pub fn resolve(waiting: &[Waiting], cluster: Option<Blocker>) -> Vec<NodeBlocked> {
    waiting
        .iter()
        .map(|w| NodeBlocked {
            node: w.node.clone(),
            blocker: w.own.or(cluster).unwrap_or(Blocker::Budget),
            since: w.since,
        })
        .collect()
}

/// What the status object and the metrics carry of the blocked nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blocked {
    /// How many nodes each blocker holds (only blockers that hold one).
    pub counts: BTreeMap<Blocker, u32>,
    /// Since when the longest-blocked node is blocked.
    pub oldest: Option<DateTime<Utc>>,
}

impl Blocked {
    /// The counts and the oldest of `nodes`, a node without a time of its
    /// own counted from `state_since` (when the cluster's state began).
    pub fn of(nodes: &[NodeBlocked], state_since: DateTime<Utc>) -> Self {
        let mut counts = BTreeMap::new();
        for n in nodes {
            *counts.entry(n.blocker).or_default() += 1;
        }
        let oldest = nodes.iter().map(|n| n.since.unwrap_or(state_since)).min();
        Blocked { counts, oldest }
    }

    /// The counts by name, as the status object and the report carry them.
    pub fn by_name(&self) -> BTreeMap<String, u32> {
        self.counts
            .iter()
            .map(|(b, n)| (b.as_str().to_string(), *n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::NodeProgress;
    use crate::rollout::{Action, RolloutState, Skipped};

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn node(name: &str, version: &str, state: Option<ProgressState>) -> NodeView {
        NodeView {
            name: name.into(),
            version: Some(v(version)),
            ready: true,
            progress: Ok(state.map(|state| NodeProgress {
                state,
                target: v("2.0.0"),
                started_at: DateTime::UNIX_EPOCH,
                cordoned_by_drover: false,
                message: String::new(),
                retries: 0,
                previous: None,
            })),
            ..Default::default()
        }
    }

    #[test]
    fn only_nodes_left_where_they_are_wait_and_each_gets_one_blocker() {
        let observed = vec![
            node("a-done", "2.0.0", None),
            node("b-draining", "1.0.0", Some(ProgressState::Draining)),
            node("c-consent", "1.0.0", None),
            node("d-idle", "1.0.0", None),
            node("e-blocked", "1.0.0", Some(ProgressState::Blocked)),
            node("f-cordoned-now", "1.0.0", None),
        ];
        let decision = Decision {
            actions: vec![Action::Evict {
                node: "f-cordoned-now".into(),
                cordoned_at: DateTime::UNIX_EPOCH,
            }],
            state: RolloutState::Pending,
            message: String::new(),
            blocker: Some(Blocker::Window),
            nodes: 6,
            nodes_at_version: 1,
            max_unavailable: 1,
            unavailable: 1,
            skipped: vec![Skipped {
                node: "c-consent".into(),
                reason: "waiting for consent".into(),
                blocker: Blocker::Consent,
            }],
            wake_at: None,
            poll_health: false,
            held: vec![],
            consent_overdue: vec![],
        };
        let w = waiting(&decision, &observed, &v("2.0.0"));
        let names: Vec<&str> = w.iter().map(|w| w.node.as_str()).collect();
        assert_eq!(names, ["c-consent", "d-idle", "e-blocked"]);
        let r = resolve(&w, Some(Blocker::Window));
        let got: Vec<Blocker> = r.iter().map(|n| n.blocker).collect();
        assert_eq!(got, [Blocker::Consent, Blocker::Window, Blocker::Pdb]);
        // While the cluster rolls, an idle node waits for room.
        assert_eq!(resolve(&w, None)[1].blocker, Blocker::Budget);
        let since = DateTime::UNIX_EPOCH + chrono::Duration::hours(1);
        let b = Blocked::of(&r, since);
        assert_eq!(
            b.oldest,
            Some(DateTime::UNIX_EPOCH),
            "the blocked record's time"
        );
        assert_eq!(b.by_name().get("window"), Some(&1));
    }
}
