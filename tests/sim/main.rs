//! The deterministic simulation of the whole agent (TESTING.md,
//! "agent_sim"): `cargo test --test sim`, which `scripts/test` runs with
//! the rest: 40 seeds, the replay check, the kept regression seeds and
//! the checks' unit tests. `DROVER_SIM_SEEDS` and `DROVER_SIM_FIRST` run
//! more (`agent_sim/mod.rs`).

mod agent_sim;
