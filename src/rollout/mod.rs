//! The rollout: a pure decision core over observed nodes ([`decide`]), and
//! the engine that applies its decisions to a [`crate::cluster::Cluster`].
//!
//! The core is split by question, not by size: `decide.rs` runs the
//! questions over the nodes and concludes; `in_flight.rs` (what a draining or
//! upgrading node needs next), `given_back.rs` (blocked and failed nodes),
//! `watch.rs` (health watch and settle), `held.rs` (nodes held by a fault of
//! their own), `rollback.rs` (a node failed after its upgrade, driven back)
//! `prepare.rs` (a node downloading its update before the drain) and
//! `start.rs` (which nodes may start) answer them. `engine.rs` applies a
//! decision, each action as `apply.rs` says (the node's record written
//! first, then the call it records), its calls paced by `pacing.rs` (calls
//! at once, cordons as give-backs make room).

mod apply;
mod blocker;
mod consent;
pub mod decide;
pub mod decision;
pub mod engine;
mod given_back;
pub mod health;
mod held;
mod in_flight;
mod pacing;
mod prepare;
mod rollback;
mod start;
mod state;
mod tally;
mod watch;

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod consent_tests;
#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod drain_tests;
#[cfg(test)]
mod failure_tests;
#[cfg(test)]
mod health_tests;
#[cfg(test)]
mod held_tests;
#[cfg(test)]
mod pin_tests;
#[cfg(test)]
mod prepare_tests;
#[cfg(test)]
mod retry_tests;
#[cfg(test)]
mod rollback_tests;

pub use apply::apply;
pub use blocker::{Blocker, Mover};
pub use decide::decide;
pub use decision::{
    Action, ConsentOverdue, Decision, Held, Inputs, Policy, Skipped, WindowState, HELD_RETRY,
};
pub use engine::{
    reconcile, Clock, Engine, EngineError, Labels, Outcome, SystemClock, VirtualClock,
};
pub use held::HELD_PREFIX;
pub use pacing::CALLS_AT_ONCE;
pub use rollback::{ROLLBACK_FAILED_PREFIX, ROLLED_BACK_PREFIX};
pub use state::{Attention, RolloutState};
