//! The fleet view model: plain values that `drover status` prints as text or
//! JSON and the timeline page draws. Filled by [`super::gather`]; nothing in
//! here reads git or the clock, so the renderers are tested on values alone.
//!
//! The JSON form of [`Fleet`] is a documented, stable contract
//! (docs/status.md, docs/cli.schema.json): fields are only ever added, never
//! renamed or removed. `ok` and `errors` are the command line's envelope.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The whole fleet as the config and the status branch tell it at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fleet {
    /// The instant the view was computed for (`--now`, default the clock).
    pub now: DateTime<Utc>,
    /// Where the reports were read from.
    pub status_branch: StatusBranch,
    /// Environments in chain order (only `--env` when given).
    pub environments: Vec<EnvView>,
    /// Reports that could not be used and windows that could not be computed, one line each.
    pub warnings: Vec<String>,
}

/// The status branch as found in the repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusBranch {
    /// Branch name from `drover.toml` (`[promotion] status_branch`).
    pub name: String,
    /// Full ref the single branch of the older layout was read from (local
    /// branch, else `origin/`); `None` when absent.
    #[serde(rename = "ref")]
    pub refname: Option<String>,
    /// Commit at its tip; `None` when absent.
    pub tip: Option<String>,
    /// Per-cluster status branches read (`<name>.d/<env>/<cluster>`).
    pub cluster_branches: usize,
}

/// One environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvView {
    /// Environment name.
    pub name: String,
    /// The version its file pins.
    pub version: String,
    /// IANA time zone of its windows.
    pub timezone: String,
    /// The window open now, or else the next one; `None` if it cannot be computed.
    pub next_window: Option<WindowView>,
    /// The gate's answer for promoting the lower environment's version into this one.
    pub gate: GateView,
    /// Its clusters, in `drover.toml` order.
    pub clusters: Vec<ClusterView>,
}

/// A window, in UTC and in the environment's time zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WindowView {
    /// First instant open (UTC).
    pub start: DateTime<Utc>,
    /// First instant closed again (UTC).
    pub end: DateTime<Utc>,
    /// `start` in the environment's zone, RFC 3339 with its offset.
    pub start_local: String,
    /// `end` in the environment's zone, RFC 3339 with its offset.
    pub end_local: String,
    /// Zone abbreviation at `start` (`CET`, `CEST`, `UTC`).
    pub zone: String,
    /// Whether it is open at `now`.
    pub open: bool,
}

/// What the gate answers for the next promotion into an environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateView {
    /// The environment below; `None` for the first of the chain.
    pub lower: Option<String>,
    /// The version that would be promoted (the lower environment's pin).
    pub version: Option<String>,
    /// The answer in one word.
    pub answer: GateAnswer,
    /// When a soak passes (`waiting`), or passed (`allowed`).
    pub after: Option<DateTime<Utc>>,
    /// One line a person reads ("production may take 1.13.2 after 2026-12-21T02:40Z").
    pub message: String,
}

/// The gate's answer in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GateAnswer {
    /// First environment of the chain: no gate.
    NoGate,
    /// Already pins the lower environment's version: nothing to promote.
    Current,
    /// The promotion would pass now.
    Allowed,
    /// Every lower cluster confirmed; the soak passes at `after`.
    Waiting,
    /// Refused (not confirmed, downgrade, no lower clusters...); `message` says why.
    Refused,
    /// The gate could not read its evidence; `message` says why.
    Unknown,
}

impl GateAnswer {
    /// The word as printed and serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            GateAnswer::NoGate => "no_gate",
            GateAnswer::Current => "current",
            GateAnswer::Allowed => "allowed",
            GateAnswer::Waiting => "waiting",
            GateAnswer::Refused => "refused",
            GateAnswer::Unknown => "unknown",
        }
    }
}

/// One cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterView {
    /// Cluster name.
    pub name: String,
    /// Its latest report; `None` when it never reported.
    pub report: Option<ReportView>,
    /// Whether that report counts as evidence.
    pub trust: Trust,
    /// Principal of the key that signed the report, when verified.
    pub signer: Option<String>,
    /// Why the report does not count, when `trust` is `untrusted`: the
    /// commit of its status branch that breaks the rule, and why.
    pub untrusted_because: Option<String>,
}

/// A status report as shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReportView {
    /// Version the cluster is moving to or confirmed.
    pub version: String,
    /// `pending`, `rolling`, `paused`, `blocked`, `refused`, `failed` or `confirmed`.
    pub state: String,
    /// When the cluster entered the state.
    pub since: DateTime<Utc>,
    /// Selected nodes.
    pub nodes: u32,
    /// Selected nodes Ready at `version`.
    pub nodes_at_version: u32,
    /// Why, in one line (may be empty).
    pub message: String,
    /// Config commit the agent was applying.
    pub config_commit: String,
    /// Status-branch commit that wrote this report.
    pub status_commit: String,
}

/// Whether a report counts as evidence (docs/design.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// Signed by a key listed for exactly this `<env>/<cluster>`.
    Trusted,
    /// Unsigned or signed by a key not listed for this cluster: ignored by the gate.
    Untrusted,
    /// No signature check was made (no `report_signers` configured).
    Unverified,
    /// The cluster has no report.
    None,
}

impl Trust {
    /// The word as printed and serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Trusted => "trusted",
            Trust::Untrusted => "untrusted",
            Trust::Unverified => "unverified",
            Trust::None => "none",
        }
    }
}

/// What the timeline page draws, over `[from, to]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Timeline {
    /// Left edge.
    pub from: DateTime<Utc>,
    /// Right edge.
    pub to: DateTime<Utc>,
    /// "Now" (a vertical line).
    pub now: DateTime<Utc>,
    /// Environments in chain order.
    pub envs: Vec<TimelineEnv>,
    /// Version changes of an environment that had a lower one, drawn as arrows.
    pub promotions: Vec<Promotion>,
}

/// One environment's rows and bands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineEnv {
    /// Environment name.
    pub name: String,
    /// Its windows' time zone.
    pub timezone: String,
    /// Windows overlapping the range.
    pub windows: Vec<Band>,
    /// Freezes overlapping the range.
    pub freezes: Vec<Band>,
    /// A row per cluster.
    pub rows: Vec<TimelineRow>,
}

/// An interval drawn as a band.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Band {
    /// Start (UTC).
    pub start: DateTime<Utc>,
    /// End (UTC).
    pub end: DateTime<Utc>,
    /// Hover text.
    pub label: String,
}

/// One cluster's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineRow {
    /// Cluster name.
    pub cluster: String,
    /// The version the cluster ran or moved to before its first report in range.
    pub initial_version: Option<String>,
    /// One segment per report, each until the next report (the last until `to`).
    pub segments: Vec<Segment>,
    /// Confirmations.
    pub confirmations: Vec<Mark>,
}

/// A stretch of time in one reported state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Segment {
    /// Start (the report's `since`).
    pub start: DateTime<Utc>,
    /// End (the next report's `since`, or the timeline's end).
    pub end: DateTime<Utc>,
    /// Reported version.
    pub version: String,
    /// Reported state.
    pub state: String,
    /// Nodes at version / nodes.
    pub nodes_at_version: u32,
    /// Selected nodes.
    pub nodes: u32,
    /// The report's message.
    pub message: String,
    /// Status commit that wrote the report.
    pub status_commit: String,
    /// Whether the report counts as evidence.
    pub trust: Trust,
    /// Verified signer, if any.
    pub signer: Option<String>,
}

/// A confirmation, drawn as a mark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mark {
    /// When the cluster confirmed.
    pub at: DateTime<Utc>,
    /// The version confirmed.
    pub version: String,
    /// Status commit.
    pub status_commit: String,
    /// Whether it counts as evidence.
    pub trust: Trust,
    /// Verified signer, if any.
    pub signer: Option<String>,
}

/// An environment moved to a version (a merged change), drawn as an arrow
/// from the lower environment's evidence to the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Promotion {
    /// The lower environment.
    pub from_env: String,
    /// When the lower environment proved the version (its latest
    /// confirmation before the change), or `None` when it did not.
    pub from_at: Option<DateTime<Utc>>,
    /// The environment that moved.
    pub to_env: String,
    /// When (commit time of the change).
    pub at: DateTime<Utc>,
    /// The version it moved to.
    pub version: String,
    /// The version before.
    pub previous: Option<String>,
    /// Config commit.
    pub commit: String,
    /// Its author.
    pub author: String,
    /// Verified signer, if any.
    pub signer: Option<String>,
    /// Pull request number.
    pub pr: Option<u64>,
}
