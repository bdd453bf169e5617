//! Health: whether the upgraded nodes and the workloads on them are working,
//! not just Ready at the version (docs/design.md §5a).
//!
//! Owns the pure verdict ([`verdict`]: node conditions, pods over time and
//! Prometheus results in, healthy / unhealthy naming what failed / held /
//! still watching out) and the Prometheus query client ([`prometheus`]).
//! [`observe`] reads those inputs off Nodes and Pods, purely.
//! The `[health]` grammar is in [`crate::config`]; observing nodes and pods
//! and acting on the verdict belong to the agent.

pub mod observe;
pub mod prometheus;
pub mod verdict;

pub use prometheus::{PrometheusClient, QueryOutcome};
pub use verdict::{
    judge, node_watch_until, settle_until, Failure, NodeHealth, Observation, PodHealth,
    QueryResult, Verdict,
};
