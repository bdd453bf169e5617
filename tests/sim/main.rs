//! The deterministic simulation of the whole agent (TESTING.md,
//! "agent_sim"): `cargo test --test sim`. `scripts/test` builds it (and
//! clippy checks it) but does not run it while its open findings
//! (TESTING.md) make some seeds fail now and then: a run that fails at
//! random would hide every other result of CI behind it.

mod agent_sim;
