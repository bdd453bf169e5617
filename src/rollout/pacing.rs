//! How one step's calls are paced: at most [`CALLS_AT_ONCE`] at a time
//! ([`Slots`]), and each cordon as soon as the give-backs that landed make
//! room for it in the budget ([`Room`]).
//!
//! A step at 1,000 nodes with 50 in flight decides ~100 calls; a batch of
//! nodes coming back gives back 50 of them and starts 50 more in one step.
//! Served in the decision's order, the first place freed waited for every
//! other give-back of the step before its next node was cordoned (a
//! freed place waited a median 0.24 s, BENCHMARKS.md, "Agent under load").
//! So a start that fills a place (a cordon with room; without `prestage` a
//! prepare) is served before every call still queued, and a cordon never
//! holds a slot while it waits for room (the give-backs it waits for could
//! not get one).

use super::decision::{Action, Decision};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

/// Nodes whose calls one step makes at once. Each call in flight holds an
/// HTTP/1.1 connection to the API server with its TLS and read buffers
/// (~200 KiB): 16 at once added ~3 MiB to the agent's peak at 1,000 nodes,
/// 4 keep it within the memory goal (BENCHMARKS.md, "Agent under load").
pub const CALLS_AT_ONCE: usize = 4;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The room a step's cordons start within, as its give-backs land.
///
/// The decision counts the nodes it gives back as back already; a cordon
/// may go out once the give-backs that landed make room for it, and a
/// give-back that failed keeps its node counted, so the last cordons are
/// withheld ([`Decision::starts_within_budget`]).
pub(super) struct Room {
    state: Mutex<RoomState>,
    changed: Notify,
}

struct RoomState {
    /// Cordons the budget has room for now (negative while more
    /// give-backs are pending than the budget is short).
    room: isize,
    /// Give-backs not resolved yet.
    pending: usize,
    /// Index in the step's actions → the cordon's place in line.
    tickets: BTreeMap<usize, usize>,
    /// Cordons decided.
    cordons: usize,
    /// Indexes of the prepares that fill a place (without `prestage`).
    placing: BTreeSet<usize>,
}

impl Room {
    /// `prepares_place`: a prepare starts a node in its place (no
    /// `prestage`), rather than staging one ahead of its turn.
    pub(super) fn for_step(decision: &Decision, prepares_place: bool) -> Room {
        let pending = decision.actions.iter().filter(|a| a.gives_back()).count();
        let tickets: BTreeMap<usize, usize> = decision
            .actions
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Action::Cordon { .. }))
            .enumerate()
            .map(|(ticket, (i, _))| (i, ticket))
            .collect();
        let cordons = tickets.len();
        let placing = decision
            .actions
            .iter()
            .enumerate()
            .filter(|(_, a)| prepares_place && matches!(a, Action::Prepare { .. }))
            .map(|(i, _)| i)
            .collect();
        // The room once every give-back landed, less those still pending.
        let full = decision.starts_within_budget(0);
        Room {
            state: Mutex::new(RoomState {
                room: full as isize - pending as isize,
                pending,
                tickets,
                cordons,
                placing,
            }),
            changed: Notify::new(),
        }
    }

    /// The place in line of the cordon at `index`, if it is one.
    pub(super) fn ticket(&self, index: usize) -> Option<usize> {
        lock(&self.state).tickets.get(&index).copied()
    }

    /// The action at `index` fills a place: a cordon, or a prepare that
    /// starts its node in its place.
    pub(super) fn fills_place(&self, index: usize) -> bool {
        let s = lock(&self.state);
        s.tickets.contains_key(&index) || s.placing.contains(&index)
    }

    /// Wait until the cordon with `ticket` fits (true) or every give-back
    /// resolved without making room for it (false: withheld).
    pub(super) async fn wait(&self, ticket: usize) -> bool {
        loop {
            // Made before the check: a change between the two still wakes it.
            let changed = self.changed.notified();
            {
                let s = lock(&self.state);
                if (ticket as isize) < s.room {
                    return true;
                }
                if s.pending == 0 {
                    return false;
                }
            }
            changed.await;
        }
    }

    /// A give-back was applied (`landed`) or not.
    pub(super) fn resolved(&self, landed: bool) {
        {
            let mut s = lock(&self.state);
            s.pending = s.pending.saturating_sub(1);
            s.room += isize::from(landed);
        }
        self.changed.notify_waiters();
    }

    /// Cordons the budget had no room for once every give-back resolved.
    pub(super) fn withheld(&self) -> usize {
        let s = lock(&self.state);
        s.cordons.saturating_sub(s.room.max(0) as usize)
    }
}

/// Who is served first for a call slot: starts that fill a place, then
/// the rest; within each, the decision's order (cordons before prepares,
/// give-backs before other calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Turn {
    /// A start that fills a place: a cordon the budget has room for, or
    /// without `prestage` a prepare (it leaves its node in service, so it
    /// needs no room). With `prestage` a prepare stages a node ahead of its
    /// turn and waits like any other call.
    Start(usize),
    /// Any other call, by its index in the decision.
    Call(usize),
}

/// At most [`CALLS_AT_ONCE`] calls at once, served by [`Turn`].
pub(super) struct Slots {
    state: Mutex<SlotState>,
    freed: Notify,
}

struct SlotState {
    free: usize,
    waiting: BTreeSet<Turn>,
}

/// A call slot; given back when dropped.
pub(super) struct Slot<'a>(&'a Slots);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).free += 1;
        self.0.freed.notify_waiters();
    }
}

/// A place in the queue; left when dropped (served, or the step cancelled).
struct InLine<'a>(&'a Slots, Turn);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).waiting.remove(&self.1);
        // The next in line may be served now.
        self.0.freed.notify_waiters();
    }
}

impl Slots {
    pub(super) fn new() -> Slots {
        Slots {
            state: Mutex::new(SlotState {
                free: CALLS_AT_ONCE,
                waiting: BTreeSet::new(),
            }),
            freed: Notify::new(),
        }
    }

    /// Wait for a slot: served when one is free and no one before `turn`
    /// waits.
    pub(super) async fn acquire(&self, turn: Turn) -> Slot<'_> {
        lock(&self.state).waiting.insert(turn);
        let _in_line = InLine(self, turn);
        loop {
            let freed = self.freed.notified();
            {
                let mut s = lock(&self.state);
                if s.free > 0 && s.waiting.first() == Some(&turn) {
                    s.free -= 1;
                    return Slot(self);
                }
            }
            freed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use futures::future::join_all;
    use std::future::Future;
    use std::sync::Mutex as StdMutex;

    #[test]
    fn a_cordon_with_room_is_served_before_the_calls_queued_before_it() {
        let slots = Slots::new();
        let order = StdMutex::new(Vec::new());
        let held: Vec<Slot<'_>> = (0..CALLS_AT_ONCE)
            .map(|i| block_on(slots.acquire(Turn::Call(i))))
            .collect();
        let call = |turn: Turn| {
            let (slots, order) = (&slots, &order);
            async move {
                let _slot = slots.acquire(turn).await;
                order.lock().unwrap().push(turn);
            }
        };
        let waiting = [
            Turn::Call(10),
            Turn::Call(11),
            Turn::Start(0),
            Turn::Call(12),
            Turn::Start(1),
        ];
        block_on(async {
            let all = join_all(waiting.into_iter().map(call));
            let free = async {
                drop(held);
            };
            futures::join!(all, free);
        });
        assert_eq!(
            *order.lock().unwrap(),
            [
                Turn::Start(0),
                Turn::Start(1),
                Turn::Call(10),
                Turn::Call(11),
                Turn::Call(12)
            ]
        );
    }

    #[test]
    fn no_more_than_calls_at_once_hold_a_slot_and_a_dropped_wait_leaves_the_line() {
        let slots = Slots::new();
        let held: Vec<Slot<'_>> = (0..CALLS_AT_ONCE)
            .map(|i| block_on(slots.acquire(Turn::Call(i))))
            .collect();
        // A fifth waits; dropping it leaves the line, so the next is served.
        {
            let mut fifth = Box::pin(slots.acquire(Turn::Start(0)));
            let waker = futures::task::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(fifth.as_mut().poll(&mut cx).is_pending());
        }
        assert!(lock(&slots.state).waiting.is_empty());
        drop(held);
        let _a = block_on(slots.acquire(Turn::Call(7)));
        assert_eq!(lock(&slots.state).free, CALLS_AT_ONCE - 1);
    }

    #[test]
    fn a_prepare_fills_a_place_only_when_it_starts_its_node_and_no_other_call_does() {
        use crate::config::OnDrainTimeout;
        use crate::rollout::decide_tests::{open, policy, t};
        let progress = crate::rollout::drain_tests::draining(true, &[])
            .progress
            .expect("a record")
            .expect("in flight");
        let mut d = crate::rollout::decide::decide(
            &policy(2, OnDrainTimeout::Skip),
            &open(),
            &[],
            t("03:00"),
        );
        d.actions = vec![
            Action::Cordon {
                node: "a".into(),
                progress: progress.clone(),
            },
            Action::Evict {
                node: "b".into(),
                cordoned_at: t("02:50"),
            },
            Action::Prepare {
                node: "c".into(),
                progress,
            },
        ];
        // Without `prestage` a prepare starts its node in its place.
        let room = Room::for_step(&d, true);
        assert_eq!(
            (0..3).map(|i| room.fills_place(i)).collect::<Vec<_>>(),
            [true, false, true]
        );
        // With it, a prepare stages a node ahead of its turn: a call like
        // any other.
        let room = Room::for_step(&d, false);
        assert_eq!(
            (0..3).map(|i| room.fills_place(i)).collect::<Vec<_>>(),
            [true, false, false]
        );
    }
}
