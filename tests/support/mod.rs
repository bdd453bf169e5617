//! drover's test support: one tree that every test binary, the benches and
//! the `kubelet-sim` example mount. Each module owns one world a test may
//! need; `tests/README.md` describes each and how the test binaries are
//! grouped by world.
//!
//! - [`cli`]: the drover binary as a command.
//! - [`git`]: `git()`, SSH keys, signed commits, config repositories, git
//!   servers on loopback.
//! - [`gpg`]: OpenPGP keys and signed commits (merge-button merges
//!   included) made by a real `gpg` in a keyring of its own.
//! - [`time`]: `t()`, an instant from RFC 3339 text.
//! - [`kube`]: the real kube-apiserver (one control plane per test binary),
//!   clients, namespaces, waits on watches.
//! - [`identity`]: client certificates of the test control plane's CA (a
//!   node's kubelet credential).
//! - [`kubelet`]: the simulated kubelet and disruption controller.
//! - [`backend`]: simulated node pools and the engine driven through the
//!   Kubernetes backend.
//! - [`agent`]: the agent's world: a signed config repository served by
//!   `git daemon`, the CRD, agents in-process or as processes.
//! - [`preflight`]: the preflight's fixtures: 50 planted blockers, ten of
//!   each kind, and a healthy control pool.
//! - [`prometheus`]: a real Prometheus scraping an exporter the test sets.
//! - [`bottlerocket_api`]: a node's Bottlerocket API on a Unix socket.
//! - [`notify`]: a notification receiver on loopback that checks each
//!   request's signature.
//! - [`proxy`]: faults between a client and a real server: a TCP proxy
//!   that refuses or stalls, an HTTP front of the API server that answers
//!   the requests a test picks with an error (one node's pod list failing,
//!   Events throttled with 429s).

// Each test binary and bench uses a different part of the tree.
#![allow(dead_code)]

pub mod agent;
pub mod backend;
pub mod bottlerocket_api;
pub mod cli;
pub mod git;
pub mod gpg;
pub mod identity;
pub mod kube;
pub mod kubelet;
pub mod notify;
pub mod preflight;
pub mod prometheus;
pub mod proxy;
pub mod time;
pub mod timeline;
