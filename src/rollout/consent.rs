//! Workload consent: a node whose workload (or a person) asks drover to
//! wait, `drover.dev/upgrade=paused` on the Node, is not started. What the
//! decision makes of it: the skip (the blocker `consent`, no place held in
//! `max_unavailable`), drover's own record of when the hold began, the
//! report once the hold lasts past the environment's `consent_limit`
//! (reported, never forced), and the record cleared once the label goes.
//!
//! The label is the workload's input, never a record: when the hold began
//! is the time drover first saw it keep the node from starting, written in
//! drover's record of the node ([`crate::record::ConsentHold`]), which only
//! the agent writes. Nothing the node or its workloads write moves it, and
//! it survives a restart and a leadership handoff as the record does.
//!
//! Choices where docs/design.md is silent:
//! - A label removed and set again starts a new hold: the time counts the
//!   hold drover sees, not the workload's history.
//! - The report is made once per hold (the record's `overdue`): its Warning
//!   Event on the transition; the status, the metric and the signed report
//!   carry it for as long as it lasts.
//! - A hold past the limit is reported even when the window is closed: the
//!   limit measures the workload's hold, not drover's chances to act.

use super::decision::{Action, ConsentOverdue};
use super::tally::{elapsed, fmt_duration, rfc3339, skip, Ctx, Tally};
use super::Blocker;
use crate::cluster::{ConsentHold, NodeView};
use std::collections::BTreeSet;

/// `n` is labelled and would otherwise be a candidate to start: skip it,
/// record when drover first saw the hold, and report it once it is past
/// the limit.
pub(super) fn held<'a>(ctx: &Ctx<'_>, n: &'a NodeView, t: &mut Tally<'a>) {
    t.consent_held += 1;
    t.consent_nodes.insert(n.name.clone());
    let hold = n.consent_hold.unwrap_or_else(|| {
        let first = ConsentHold {
            since: ctx.now,
            overdue: false,
        };
        t.advances.push(Action::Consent {
            node: n.name.clone(),
            hold: Some(first),
        });
        first
    });
    let Some(limit) = ctx.policy.consent_limit else {
        t.skipped.push(skip(n, Blocker::Consent, wait()));
        return;
    };
    let (over, deadline) = elapsed(ctx.now, hold.since, limit);
    if !over {
        t.wake.at(deadline);
        t.skipped.push(skip(n, Blocker::Consent, wait()));
        return;
    }
    if !hold.overdue {
        t.advances.push(Action::Consent {
            node: n.name.clone(),
            hold: Some(ConsentHold {
                overdue: true,
                ..hold
            }),
        });
    }
    t.consent_overdue.push(ConsentOverdue {
        node: n.name.clone(),
        since: hold.since,
        limit,
    });
    t.skipped.push(skip(
        n,
        Blocker::Consent,
        format!(
            "{}; held since {}, past consent_limit ({}): reported, not forced",
            wait(),
            rfc3339(hold.since),
            fmt_duration(limit)
        ),
    ));
}

/// The record of every node drover recorded a hold on that consent no
/// longer holds (the label is gone, or the node needs no start) is
/// cleared; a node that starts in this step is cleared by its start's own
/// record write.
pub(super) fn released(nodes: &[&NodeView], starts: &[Action], t: &mut Tally<'_>) {
    let started: BTreeSet<&str> = starts.iter().map(Action::node).collect();
    for n in nodes {
        if n.consent_hold.is_some()
            && n.progress.is_ok()
            && !t.consent_nodes.contains(&n.name)
            && !started.contains(n.name.as_str())
        {
            t.advances.push(Action::Consent {
                node: n.name.clone(),
                hold: None,
            });
        }
    }
}

/// Why a node its workload holds is not started.
pub(super) fn wait() -> String {
    format!(
        "waiting for consent: labelled {}={}; started once the label is removed",
        crate::config::CONSENT_LABEL,
        crate::config::CONSENT_PAUSED
    )
}

/// The cluster's message while only held nodes are left: which, and those
/// past the limit.
pub(super) fn message(t: &Tally<'_>) -> String {
    let names: Vec<&str> = t.skipped.iter().map(|s| s.node.as_str()).collect();
    let mut m = format!(
        "waiting for consent on {}: {}",
        crate::terminal::count(names.len() as u64, "node", "nodes"),
        names.join(", ")
    );
    if let Some(first) = t.consent_overdue.first() {
        let over: Vec<&str> = t.consent_overdue.iter().map(|o| o.node.as_str()).collect();
        m.push_str(&format!(
            "; overdue, held past consent_limit ({}): {}",
            fmt_duration(first.limit),
            over.join(", ")
        ));
    }
    m
}
