//! The config repository's format: `drover.toml` (promotion chain, clusters)
//! and `environments/<env>.toml` (target version, window, rollout, driver).
//! Owns parsing, defaults and validation; every error carries a file, line
//! and column (see [`crate::diag`]).

mod drain;
mod env;
mod files;
mod health;
mod keys;
mod load;
mod model;
mod packed;
mod pin;
mod root;
mod selector;
mod spanned;
#[cfg(test)]
mod tests;
mod values;
mod waves;
mod windows;

pub use drain::{rule_for, taint_lead, DrainRule, Rung, RungKind, DRAIN_TAINT, DRAIN_TAINT_EFFECT};
pub use files::{
    bounded_blob, bounded_blob_sized, read_regular, DirEntry, DirFiles, EntryKind, Files,
    GitTreeFiles, MAX_FILE_BYTES,
};
pub use health::{HealthSpec, OnUnreachable, PrometheusCheck};
pub use load::{load, load_at, parse_env, parse_root};
pub use model::*;
pub use packed::PackedSizes;
pub use pin::{read_pin, Pin};
pub use selector::{LabelSelector, Requirement, SelectorError};
/// The rule for an exact version pin, shared with `drover revoke VERSION`.
pub(crate) use values::parse_version;
pub use values::{nearest, parse_version as parse_exact_version};
