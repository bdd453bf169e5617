//! drover: a controlled upgrade path for the node OS of Kubernetes fleets.
//!
//! The crate is split into a pure core that decides (config, window, gate,
//! rollout) and thin edges that act (source for git, kubernetes for the
//! API server, agent for the in-cluster loop, cli for people and CI).

pub mod admit;
pub mod agent;
pub mod audit;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod demo;
pub mod diag;
pub mod example;
pub mod fleet;
pub mod forecast;
pub mod gate;
pub mod health;
pub mod kubernetes;
pub mod preflight;
pub mod promote;
pub mod record;
pub mod replay;
pub mod retry;
pub mod revoke;
pub mod rollout;
pub mod sim;
pub mod source;
pub mod status;
pub mod status_refs;
pub mod terminal;
pub mod tls;
pub mod trust;
pub mod window;
