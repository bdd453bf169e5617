//! Tests that need no server: the CLI on temporary repositories, config and
//! its errors, the gate and admission, windows, the rollout core's
//! properties and simulation, fuzzing, the demo. `cargo test --test offline`
//! is the fast loop: it builds none of the Kubernetes support.

// Only the modules of the support tree that need no server.
#[allow(dead_code)]
#[path = "../support"]
mod support {
    pub mod cli;
    pub mod git;
    pub mod gpg;
    pub mod time;
    pub mod timeline;
}

mod action_check;
mod admit_differential;
mod admit_forgery;
mod admit_judge;
mod admit_split;
mod agent_http;
mod agent_manifests;
mod blocker_props;
mod check_fuzz;
mod check_json;
mod check_malformed;
mod check_merge;
mod cli_edges;
mod cli_newcomer;
mod cli_revoke;
mod cli_schema;
mod cli_watch;
mod cli_words;
mod demo;
mod docs_generated;
mod gate_judge;
mod gate_story;
mod git_log;
mod git_trigger;
mod git_trust;
mod hostile_files;
mod key_validity;
mod notify_relay;
mod openpgp_trust;
mod promote;
mod release_dry_run;
mod rollout_breaker;
mod rollout_pin_change;
mod rollout_props;
mod rollout_sim;
mod status_branches;
mod status_cli;
mod status_foreign_refs;
mod status_store;
mod terminal_escape;
mod timeline_readback;
mod trust_differential;
mod waves_props;
mod windows_cli;
mod windows_differential;
mod windows_merge;
mod windows_schedule;
mod workflows;
