//! Tests of the agent as it runs: agents in-process and as `drover agent`
//! processes against the real kube-apiserver (one control plane for the
//! whole binary, a namespace per test), a signed config repository served by
//! `git daemon`, and for health, a real Prometheus.

#[path = "../support/mod.rs"]
mod support;

mod agent_bootstrap;
mod agent_bottlerocket;
mod agent_conditions;
mod agent_consent;
mod agent_doctor;
mod agent_drain;
mod agent_durable;
mod agent_evidence;
mod agent_gate;
mod agent_github_merge;
mod agent_give_back;
mod agent_halt_holds;
mod agent_health;
mod agent_held;
mod agent_key_validity;
mod agent_migrate;
mod agent_notify;
mod agent_outage;
mod agent_poll;
mod agent_preflight;
mod agent_rbac;
mod agent_records;
mod agent_revoked;
mod agent_rollback;
mod agent_rung_writes;
mod agent_seams;
mod agent_status_branches;
mod agent_story;
mod agent_waves;
mod agent_windows;
mod agent_writes;
