//! The rollout: a pure decision core over observed nodes ([`decide`]), and
//! the engine that applies its decisions to a [`crate::cluster::Cluster`].

pub mod decide;
pub mod decision;
pub mod engine;
pub mod health;
mod state;

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod health_tests;

pub use decide::decide;
pub use decision::{Action, Decision, Inputs, Policy, Skipped, WindowState};
pub use engine::{
    apply, reconcile, Clock, Engine, EngineError, Labels, Outcome, SystemClock, VirtualClock,
};
pub use state::RolloutState;
