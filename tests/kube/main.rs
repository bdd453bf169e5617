//! Tests against the real kube-apiserver (one control plane for the whole
//! binary, a namespace per test): the test support itself, the simulated
//! kubelet's faults, the Kubernetes backend, `drover plan` on a cluster, the
//! admission policy for upgrade Jobs, leadership, the status watch, and the
//! Bottlerocket driver script against a simulated node API, and the
//! documented walks (docs/install.md, docs/quickstart.md).

#[path = "../support/mod.rs"]
mod support;

mod agent_jobs_policy;
mod agent_leader;
mod agent_status_writes;
mod agent_watch_backoff;
mod bottlerocket_driver;
mod bottlerocket_failures;
mod bottlerocket_prepare;
mod bottlerocket_selection;
mod bottlerocket_shutdown;
mod drain_taint;
mod install_docs;
mod k8s_backend_crash;
mod k8s_backend_isolation;
mod k8s_backend_ops;
mod k8s_backend_rollout;
mod k8s_smoke;
mod k8s_write_bound;
mod kubelet_faults;
mod plan_kube;
mod preflight_kube;
mod quickstart;
