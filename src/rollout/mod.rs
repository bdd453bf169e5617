//! The rollout: a pure decision core over observed nodes, and the engine that applies its decisions.
