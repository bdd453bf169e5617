//! Tests against real servers on loopback other than the API server: git
//! (`git daemon`, smart HTTP behind lighttpd, `sshd`), Prometheus, and
//! headless Chromium rendering the timeline page.

#[path = "../support/mod.rs"]
mod support;

mod agent_secrets;
mod git_fetch;
mod git_foreign_refs;
mod git_status;
mod health_prometheus;
mod timeline_browser;
