//! The budget a rollback takes a place in is the whole cluster's, whatever
//! the nodes are called: the decision judges nodes in name order, and a
//! rollback judged before the nodes after it were counted took a place
//! they held (simulation seed 553: a passed node turning NotReady while
//! two others upgraded put three out of service under `max_unavailable =
//! 2`). The helpers are `rollback_tests.rs`'s.

use super::decide::decide;
use super::decision::*;
use super::rollback_tests::{at, moved, open, policy};
use crate::cluster::{NodeView, ProgressState};
use crate::config::OnFailure;

/// A passed node, `failing`, turned NotReady at the pin, and two nodes
/// upgrading, under `max_unavailable = 2`.
fn cluster(failing: &str, upgrading: [&str; 2]) -> Vec<NodeView> {
    let mut f = moved(failing, ProgressState::Passed, "");
    f.ready = false;
    let mut nodes = vec![f];
    for name in upgrading {
        let mut u = moved(name, ProgressState::Upgrading, "");
        u.unschedulable = true;
        u.ready = false;
        nodes.push(u);
    }
    nodes
}

#[test]
fn a_passed_node_is_not_rolled_back_into_a_place_others_hold_whatever_its_name() {
    let p = policy(OnFailure::Rollback, 2, 2);
    for (failing, upgrading) in [("a", ["m", "z"]), ("m", ["a", "z"]), ("z", ["a", "m"])] {
        let d = decide(&p, &open(), &cluster(failing, upgrading), at(30));
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::RollBack { .. })),
            "{failing}: {:?}",
            d.actions
        );
        // Recorded failed in service, its record saying why.
        let said = d
            .actions
            .iter()
            .find_map(|a| match a {
                Action::Unhealthy { node, progress, .. } if node == failing => {
                    Some(progress.message.clone())
                }
                _ => None,
            })
            .unwrap_or_default();
        assert!(
            said.contains("not rolled back: max_unavailable (2) has no room"),
            "{failing}: {said}"
        );
    }
}

#[test]
fn a_passed_node_is_rolled_back_when_a_place_is_free_whatever_its_name() {
    // The control: one node upgrading leaves a place under the same budget.
    let p = policy(OnFailure::Rollback, 2, 2);
    for (failing, other) in [("a", "z"), ("z", "a")] {
        let mut nodes = cluster(failing, [other, "unused"]);
        nodes.retain(|n| n.name != "unused");
        let d = decide(&p, &open(), &nodes, at(30));
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::RollBack { node, .. } if node == failing)),
            "{failing}: {:?}",
            d.actions
        );
        assert_eq!(d.unavailable, 2, "{failing}");
    }
}
