//! What tests, benchmarks and the CLI hold of a running agent: its handle,
//! the record of each pass, and the clocks (the shared clock, the
//! `--clock-offset` test hook, the engine's view of the shared clock) and
//! what woke a pass.

use super::crd::Refused;
use super::metrics::Metrics;
use crate::rollout::{Clock, RolloutState};
use crate::source::trigger::{Nudger, Reason};
use chrono::{DateTime, Utc};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::broadcast;

/// One reconcile pass, for tests and benchmarks that follow the agent.
#[derive(Debug, Clone)]
pub struct PassRecord {
    /// What woke the pass.
    pub wake: Wake,
    /// When the pass started (after its fetch, before trust and the engine).
    pub started: Instant,
    /// The fetched head, if any.
    pub head: Option<String>,
    /// The last applied commit after the pass.
    pub applied: Option<String>,
    /// The rollout state after the pass.
    pub state: Option<RolloutState>,
    /// Why the head is not applied, if it is not.
    pub refused: Option<Refused>,
}

/// What woke a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// First pass of a leadership term.
    Start,
    /// A source trigger (poll, webhook, local change): fetch first.
    Source(Reason),
    /// The cluster changed.
    Cluster,
    /// A timer: the decision's wake-up, an eviction retry or the fallback tick.
    Timer,
    /// Asked through [`AgentHandle::reconcile`].
    Manual,
}

/// Handles to a running agent.
#[derive(Clone, Debug)]
pub struct AgentHandle {
    pub(super) nudger: Nudger,
    pub(super) manual: tokio::sync::mpsc::Sender<()>,
    pub(super) passes: broadcast::Sender<PassRecord>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) addr: Option<SocketAddr>,
    pub(super) webhook_addr: Option<SocketAddr>,
    pub(super) acting: tokio::sync::watch::Receiver<bool>,
}

impl AgentHandle {
    /// Ask for a fetch now (as a webhook would).
    pub fn fetch(&self) {
        self.nudger.nudge(Reason::Webhook);
    }

    /// Ask for a reconcile pass without fetching (e.g. after moving a test clock).
    pub fn reconcile(&self) {
        let _ = self.manual.try_send(());
    }

    /// Follow the passes.
    pub fn subscribe(&self) -> broadcast::Receiver<PassRecord> {
        self.passes.subscribe()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Where the HTTP server listens.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// True while this replica acts (a leadership term runs); false once a
    /// term has ended, every call of it given up and its writers stopped.
    pub fn acting(&self) -> tokio::sync::watch::Receiver<bool> {
        self.acting.clone()
    }

    /// Where `/webhook` is served (the HTTP server's address unless it has its own).
    pub fn webhook_addr(&self) -> Option<SocketAddr> {
        self.webhook_addr.or(self.addr)
    }
}

/// The clock the agent reads windows, gates and timeouts from.
pub type SharedClock = Arc<dyn Clock + Send + Sync>;

/// The wall clock shifted by a fixed offset (`--clock-offset`, a test hook).
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock(pub chrono::Duration);

impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.0
    }
}

/// The shared clock as the engine's clock type.
#[derive(Clone)]
pub(super) struct ClockRef(pub(super) SharedClock);

impl Clock for ClockRef {
    fn now(&self) -> DateTime<Utc> {
        self.0.now()
    }
}
