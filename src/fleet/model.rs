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
    /// The config commit read, for an instant the user named (`status
    /// --now T`: the one in force at T); `None`: the checkout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_commit: Option<String>,
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
    /// The stretch of a window in which a node may start, open now or else
    /// the next (windows minus `all` and `minor` freezes, as
    /// `drover windows` lists them without its patch-only stretches);
    /// `None` while paused, when none comes, or when it cannot be computed.
    pub next_window: Option<WindowView>,
    /// `[rollout] paused`: no node starts in any window while true.
    pub paused: bool,
    /// What holds every node start at `now` (the pause, else a freeze in
    /// force); `None` when nothing does.
    pub hold: Option<HoldView>,
    /// Freezes in force at `now` or ahead, soonest first (at most
    /// [`MAX_FREEZES_SHOWN`]).
    pub freezes: Vec<FreezeView>,
    /// The gate's answer for promoting the lower environment's version into this one.
    pub gate: GateView,
    /// The halt of the environment's version: more clusters failed it than
    /// `failure_budget` allows (docs/design.md §4a).
    pub halt: Option<HaltView>,
    /// Its clusters, in `drover.toml` order.
    pub clusters: Vec<ClusterView>,
    /// Why the environment is not progressing (docs/status.md,
    /// "Blockers"): `halted` when it is, else what holds every start (the
    /// pause, a freeze), else the first of its clusters' blockers in
    /// `drover.toml` order; `None` when none is blocked.
    pub blocker: Option<String>,
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
    /// Open before `start` too: windows overlap without a gap for longer
    /// than drover looks back (a year), as hourly windows of two hours do.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub opened_earlier: bool,
    /// Still open at `end`: windows overlap without a gap for longer than
    /// drover looks ahead (a year); `end` is how far it looked.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub continues: bool,
}

impl WindowView {
    /// What a window cut by the horizon needs said beside its times
    /// (empty for a window that opens and closes as shown).
    pub fn overlap_note(&self) -> &'static str {
        match (self.opened_earlier, self.continues) {
            (true, true) => "windows overlap without a gap: open before and after these times",
            (false, true) => "windows overlap without a gap: still open at the end shown",
            (true, false) => "windows overlap without a gap: open before the start shown",
            (false, false) => "",
        }
    }
}

/// Most freezes one environment shows (the config bounds them anyway).
pub const MAX_FREEZES_SHOWN: usize = 8;

/// What holds every node start now, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HoldView {
    /// `paused` (`[rollout] paused = true`) or `freeze`.
    pub kind: HoldKind,
    /// The freeze's reason as written, or where the pause is set.
    pub reason: String,
    /// When the hold ends by itself; `None` for a pause (a reviewed change ends it).
    pub until: Option<DateTime<Utc>>,
    /// One line a person reads.
    pub message: String,
}

/// What kind of hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HoldKind {
    /// `[rollout] paused = true`.
    Paused,
    /// A `[[freeze]]` in force.
    Freeze,
}

/// A freeze, in UTC and in the zone it was written in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FreezeView {
    /// First frozen instant (UTC).
    pub start: DateTime<Utc>,
    /// First instant no longer frozen (UTC).
    pub end: DateTime<Utc>,
    /// `start` in the freeze's zone, RFC 3339 with its offset.
    pub start_local: String,
    /// `end` in the freeze's zone, RFC 3339 with its offset.
    pub end_local: String,
    /// Zone abbreviation at `start` (`CET`, `EST`, `UTC`).
    pub zone: String,
    /// `all` (no node starts) or `minor` (only a patch update starts).
    pub scope: String,
    /// Why, as written.
    pub reason: String,
    /// Whether it is in force at `now`.
    pub active: bool,
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

/// An environment halted for its version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HaltView {
    /// The version.
    pub version: String,
    /// `[rollout] failure_budget`.
    pub failure_budget: u32,
    /// The clusters that failed it, each with its report.
    pub failed: Vec<HaltFailure>,
    /// The command that stops the version everywhere.
    pub revoke: String,
}

/// One cluster's trusted `failed` report of a halted version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HaltFailure {
    /// The cluster.
    pub cluster: String,
    /// When it reported.
    pub at: DateTime<Utc>,
    /// What failed: the node and the check.
    pub message: String,
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
    /// Why the report does not count, when `trust` is `untrusted`: who
    /// signed it (or that nobody did), or the commit of its status branch
    /// that breaks the rule, and why.
    pub untrusted_reason: Option<String>,
    /// Its wave (from 1) when the environment has `[[wave]]`.
    pub wave: Option<usize>,
    /// What the wave gate holds it on for the environment's version (the
    /// previous wave's confirmations or soak, its wave's `max_concurrency`,
    /// the halt); `None` when it may start.
    pub waits_on: Option<String>,
    /// When what the wave gate holds it on passes by time alone (a soak).
    pub waits_until: Option<DateTime<Utc>>,
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
    /// Nodes per phase of drover's records (the report's `[detail]`
    /// `phases`; idle nodes not counted), e.g. `draining: 2`.
    pub phases: std::collections::BTreeMap<String, u32>,
    /// Why, in one line (may be empty).
    pub message: String,
    /// Why the cluster is not progressing, one word of the closed list
    /// (docs/status.md, "Blockers"), as the report names it; `None` while
    /// it progresses, and in reports of earlier agents.
    pub blocker: Option<String>,
    /// Each node the report names as not progressing, and its blocker.
    pub blockers: std::collections::BTreeMap<String, String>,
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

/// What the timeline page draws, over `[from, to]`: what the nodes ran,
/// never anything solid past `now`.
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
    /// Revocations and refused changes, drawn as marks on the axis (or on
    /// the row of the cluster they concern).
    pub events: Vec<Event>,
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
    /// The version its file pinned, stretch by stretch (the config's
    /// history), drawn as a thin mark above each cluster's bar.
    pub pins: Vec<Pin>,
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

/// The version an environment's file pinned over a stretch of time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pin {
    /// When the change that pinned it was committed (or the range's start).
    pub start: DateTime<Utc>,
    /// When the next change was committed (or the range's end: a pin is
    /// configuration, so it is drawn past now, dashed).
    pub end: DateTime<Utc>,
    /// The pinned version.
    pub version: String,
    /// The config commit that pinned it.
    pub commit: String,
}

/// One cluster's history, from its status reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineRow {
    /// Cluster name.
    pub cluster: String,
    /// Whether the cluster ever reported; a row without reports says so.
    pub reported: bool,
    /// What its nodes ran, stretch by stretch, each until the next report
    /// or `now`, whichever is first.
    pub runs: Vec<Run>,
    /// Stretches in which the cluster waited for a target (`pending`, or
    /// `paused` by a pause or freeze), drawn hatched in the target's colour.
    pub pending: Vec<Waiting>,
    /// `failed` and `blocked` reports, marked on the nodes they concern.
    pub alarms: Vec<Alarm>,
    /// Confirmations.
    pub confirmations: Vec<Mark>,
    /// Its wave (from 1) when the environment has `[[wave]]`.
    pub wave: Option<usize>,
    /// Its wave's own windows, when the wave has a window of its own
    /// (drawn on its row in place of the environment's); empty otherwise.
    pub windows: Vec<Band>,
    /// What its wave waits on now, as the fleet view says
    /// ([`ClusterView::waits_on`]); filled in by the page.
    pub waits_on: Option<String>,
}

/// How many of a cluster's nodes ran one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionCount {
    /// The version; `None` when no report says what these nodes run (they
    /// ran something before the first report read).
    pub version: Option<String>,
    /// How many nodes.
    pub nodes: u32,
}

/// A stretch of time in which a cluster's nodes ran one mix of versions
/// (one report, until the next or `now`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    /// Start (the report's `since`, or the range's start).
    pub start: DateTime<Utc>,
    /// End (the next report's `since`, or `now`).
    pub end: DateTime<Utc>,
    /// The versions the nodes ran, oldest version first; the counts add up
    /// to the report's `nodes`.
    pub versions: Vec<VersionCount>,
    /// The report's state.
    pub state: String,
    /// The version the report names (the target, or a refused one).
    pub target: String,
    /// The report's message.
    pub message: String,
    /// Status commit that wrote the report.
    pub status_commit: String,
    /// Whether the report counts as evidence.
    pub trust: Trust,
    /// Verified signer, if any.
    pub signer: Option<String>,
}

/// A cluster waiting for a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiting {
    /// From (the report's `since`).
    pub start: DateTime<Utc>,
    /// Until the next report; for the newest report, until the
    /// environment's next window when that is later than now (it is drawn
    /// hatched, never solid).
    pub end: DateTime<Utc>,
    /// The version waited for.
    pub version: String,
    /// `pending` or `paused`.
    pub state: String,
    /// The report's message (the next window, the pause or freeze).
    pub message: String,
}

/// A `failed` or `blocked` report on the nodes it concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alarm {
    /// From (the report's `since`).
    pub start: DateTime<Utc>,
    /// Until the next report or `now`.
    pub end: DateTime<Utc>,
    /// `failed` or `blocked`.
    pub state: String,
    /// The version the report names.
    pub version: String,
    /// The version those nodes run (where in the bar the mark sits).
    pub runs: Option<String>,
    /// The nodes it names (the report's `[detail]`), when it names them.
    pub nodes: Vec<String>,
    /// How many nodes it concerns (at least one).
    pub count: u32,
    /// The report's message.
    pub message: String,
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

/// Something that happened to a version or a change, drawn as a mark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// When.
    pub at: DateTime<Utc>,
    /// What.
    pub kind: EventKind,
    /// The environment it concerns, when one.
    pub env: Option<String>,
    /// The cluster it concerns (an agent's refusal), when one.
    pub cluster: Option<String>,
    /// The version concerned.
    pub version: String,
    /// One line: the reason, the refusal.
    pub message: String,
    /// The commit concerned (the revocation, the refused head), when known.
    pub commit: Option<String>,
}

/// What kind of event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A version added to `[promotion] revoked`.
    Revoked,
    /// A pull request `drover check --base` refused (known to the demo,
    /// which opens them; a forge's closed pull requests are not in git).
    RefusedPullRequest,
    /// An agent refused a newer head (a `refused` report).
    Refused,
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
