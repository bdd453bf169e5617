//! Validated config values. Everything here has passed validation: a
//! `RepoConfig` in hand is a config the agent may act on.

pub use crate::window::{Freeze, FreezeScope, WindowSpec};
use chrono_tz::Tz;
use semver::Version;
use std::collections::BTreeMap;
use std::time::Duration;

/// Path of the root file.
pub const ROOT_FILE: &str = "drover.toml";
/// Directory of the environment files.
pub const ENV_DIR: &str = "environments";

/// Default `[promotion] evidence` of `drover.toml`.
pub const DEFAULT_EVIDENCE: Evidence = Evidence::Status;
/// Default `[promotion] status_branch` of `drover.toml`.
pub const DEFAULT_STATUS_BRANCH: &str = "drover/status";
/// Default `[status] progress_interval` of `drover.toml`: while a cluster
/// rolls, progress alone is pushed at most this often (state changes go out
/// at once). Ten minutes keeps a 200-node rollout to a score of commits
/// while `drover status` is never more than one interval behind.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(10 * 60);
/// Largest `[status] progress_interval`.
pub const MAX_PROGRESS_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// Default `[window] schedule`: 02:00 on the 1st of every month. Chosen so a
/// file without a schedule still gets one monthly window rather than none.
pub const DEFAULT_SCHEDULE: &str = "0 2 1 * *";
/// Default `[window] duration`.
pub const DEFAULT_WINDOW_DURATION: Duration = Duration::from_secs(6 * 3600);
/// Default `[window] timezone`.
pub const DEFAULT_TIMEZONE: Tz = Tz::UTC;
/// Default `[rollout] max_unavailable`.
pub const DEFAULT_MAX_UNAVAILABLE: MaxUnavailable = MaxUnavailable::Count(1);
/// Default `[rollout] drain_timeout`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// Default `[rollout] node_timeout`.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(45 * 60);
/// Default `[rollout] node_selector`: empty, which selects every node.
pub const DEFAULT_NODE_SELECTOR: &str = "";
/// Default `[rollout] on_drain_timeout`.
pub const DEFAULT_ON_DRAIN_TIMEOUT: OnDrainTimeout = OnDrainTimeout::Skip;
/// Default `[rollout] on_failure`: today's behaviour, the rollout stops.
pub const DEFAULT_ON_FAILURE: OnFailure = OnFailure::Halt;
/// Default `[rollout] max_rollbacks` (per cluster and version).
pub const DEFAULT_MAX_ROLLBACKS: u32 = 1;
/// Default `[promotion] soak` of an environment file.
pub const DEFAULT_SOAK: Duration = Duration::from_secs(24 * 3600);
/// Default `soak` of a `[[wave]]`: the same day as between environments, so
/// one word has one default.
pub const DEFAULT_WAVE_SOAK: Duration = DEFAULT_SOAK;
/// The updater image a release build was given (`DROVER_UPDATER_IMAGE`,
/// checked by build.rs: pinned by a digest that is not all zeros), "" for
/// any other build.
const RELEASE_UPDATER_IMAGE: &str = env!("DROVER_RELEASE_UPDATER_IMAGE");
/// The default `[driver] image` of builds with the test hooks (the tests'
/// and benches' builds, never shipped) when no release image was given: a
/// digest no registry serves, so that the tests' Jobs have an image.
pub const TEST_UPDATER_IMAGE: &str =
    "ghcr.io/drover-dev/bottlerocket-updater@sha256:7e577e577e577e577e577e577e577e577e577e577e577e577e577e577e577e57";
/// Default `[driver] image` of `kind = "bottlerocket"` (`kind = "job"`
/// requires its own image): the updater image the release built from
/// `deploy/updater/` (`deploy/updater/build`, reproducibly), pinned by the
/// digest the release computed and wrote into this binary and into the
/// admission policy's `updater.env` of the tag it published. None in a
/// build that was not given one (not a release): the agent then refuses to
/// drive Bottlerocket nodes until `[driver] image` is set
/// ([`DriverSpec::updater_image`]); there is no placeholder digest.
pub const DEFAULT_BOTTLEROCKET_IMAGE: Option<&str> = if !RELEASE_UPDATER_IMAGE.is_empty() {
    Some(RELEASE_UPDATER_IMAGE)
} else if cfg!(feature = "test-hooks") {
    Some(TEST_UPDATER_IMAGE)
} else {
    None
};
/// Default `[nodes] version_regex`.
pub const DEFAULT_VERSION_REGEX: &str = r"(\d+\.\d+\.\d+)";
/// Default `[nodes] os_image_regex` of `kind = "bottlerocket"`: the start of
/// Bottlerocket's `PRETTY_NAME`, which the kubelet reports as `osImage`
/// ("Bottlerocket OS 1.26.0 (aws-k8s-1.31)"). `kind = "job"` selects every
/// node by default.
pub const DEFAULT_BOTTLEROCKET_OS_IMAGE_REGEX: &str = "^Bottlerocket OS ";
/// The label the Bottlerocket update operator (brupop) drives nodes by
/// (its models/src/constants.rs `LABEL_BRUPOP_INTERFACE_NAME`; its agent
/// runs only on nodes carrying it): `[nodes] brupop = "skip"`, the default,
/// leaves such a node alone, since two updaters driving one node's update
/// API undo each other's version lock and reboot it behind each other's drain.
pub const BRUPOP_LABEL: &str = "bottlerocket.aws/updater-interface-version";
/// Workload consent: a node labelled `drover.dev/upgrade=paused` (by a
/// workload's operator or a person) is not started, as AKS's
/// `kubernetes.azure.com/upgrade-status=paused`: it is skipped, not failed,
/// holds no place in `max_unavailable`, and is taken once the label goes.
/// A node already moving finishes.
pub const CONSENT_LABEL: &str = "drover.dev/upgrade";
/// The value of [`CONSENT_LABEL`] that holds a node.
pub const CONSENT_PAUSED: &str = "paused";

/// The whole config repository at one commit.
#[derive(Debug, Clone, PartialEq)]
pub struct RepoConfig {
    /// `drover.toml`.
    pub root: RootConfig,
    /// `environments/<env>.toml`, keyed by environment name.
    pub envs: BTreeMap<String, EnvConfig>,
}

impl RepoConfig {
    /// The environment just below `env` in the chain, if any.
    pub fn lower(&self, env: &str) -> Option<&str> {
        let i = self.root.chain.iter().position(|e| e == env)?;
        i.checked_sub(1).map(|j| self.root.chain[j].as_str())
    }

    /// The waves of `env`: each wave's clusters, in `drover.toml`'s order;
    /// one wave of every cluster when the environment has no `[[wave]]`.
    pub fn waves(&self, env: &str) -> Vec<Vec<String>> {
        let clusters = self.clusters(env);
        match self.envs.get(env).map(|e| e.waves.as_slice()) {
            None | Some([]) => vec![clusters.to_vec()],
            Some(waves) => waves
                .iter()
                .map(|w| clusters.iter().filter(|c| w.holds(c)).cloned().collect())
                .collect(),
        }
    }

    /// The clusters that make up `env` (empty when none are listed).
    pub fn clusters(&self, env: &str) -> &[String] {
        self.root
            .clusters
            .get(env)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

/// `drover.toml`.
#[derive(Debug, Clone, PartialEq)]
pub struct RootConfig {
    /// Environments, lowest first.
    pub chain: Vec<String>,
    /// What counts as proof that the lower environment runs a version.
    /// Default `status`.
    pub evidence: Evidence,
    /// Branch holding the agents' status reports. Default `drover/status`.
    pub status_branch: String,
    /// `report_signers`: allowed-signers file (in the config repository)
    /// whose principals `<env>/<cluster>` may sign status reports.
    pub report_signers: Option<String>,
    /// `revoked`: versions never rolled out again, each with why.
    pub revoked: Vec<Revoked>,
    /// Cluster names per environment.
    pub clusters: BTreeMap<String, Vec<String>>,
    /// `[status] progress_interval`: while rolling, progress alone is
    /// pushed at most once per this interval. Default 10 minutes.
    pub progress_interval: Duration,
}

/// One `[promotion] revoked` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    /// The version.
    pub version: Version,
    /// Why it must never be rolled out.
    pub reason: String,
}

/// Kind of evidence the promotion gate requires (docs/design.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// Confirmations written by agents on the status branch.
    Status,
    /// The lower environment's configured version, from git history.
    History,
}

/// `environments/<env>.toml`.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvConfig {
    /// Environment name (the file stem).
    pub name: String,
    /// The pinned OS version.
    pub version: Version,
    /// Whether this change may lower the version. Default `false`.
    pub allow_downgrade: bool,
    /// When nodes may start upgrading: `[window]` or `[[window]]`, at least one.
    pub windows: Vec<WindowSpec>,
    /// `[[freeze]]`: intervals in which no node (or only a patch update) starts.
    pub freezes: Vec<Freeze>,
    /// How nodes are taken through the upgrade.
    pub rollout: RolloutSpec,
    /// Promotion requirements towards this environment.
    pub promotion: PromotionSpec,
    /// How the OS update is applied to a node.
    pub driver: DriverSpec,
    /// `[driver] prepare` and `prestage`: whether the driver downloads the
    /// update before the drain, and how long before a window it may.
    pub prepare: PrepareSpec,
    /// How a node's OS version is read.
    pub nodes: NodesSpec,
    /// What "confirmed" means beyond "Ready at the version".
    pub health: super::HealthSpec,
    /// `[[wave]]`: the environment's clusters in the order they take a
    /// version, each wave gated on the one before (docs/design.md §4a);
    /// empty = one wave of every cluster, as before waves existed.
    pub waves: Vec<WaveSpec>,
    /// `[[drain]]`: how a drain treats the pods each rule matches, first
    /// match first (`config::drain`); empty = every pod evicted until
    /// `drain_timeout`.
    pub drain: Vec<super::DrainRule>,
}

/// An environment file configures its calendar (`window::Calendar::of`).
impl crate::window::Configured for EnvConfig {
    fn windows(&self) -> &[WindowSpec] {
        &self.windows
    }
    fn freezes(&self) -> &[Freeze] {
        &self.freezes
    }
    fn paused(&self) -> bool {
        self.rollout.paused
    }
}

impl EnvConfig {
    /// The index of the wave `cluster` is in; `None` without waves (or
    /// for a cluster no wave holds, which `drover check` refuses).
    pub fn wave_of(&self, cluster: &str) -> Option<usize> {
        self.waves.iter().position(|w| w.holds(cluster))
    }

    /// The environment as `cluster`'s agent acts on it: its wave's own
    /// window, when it has one, in place of the environment's windows
    /// (freezes and pause stay the environment's).
    pub fn for_cluster(&self, cluster: &str) -> EnvConfig {
        let mut env = self.clone();
        if let Some(w) = self
            .wave_of(cluster)
            .and_then(|i| self.waves[i].window.clone())
        {
            env.windows = vec![w];
        }
        env
    }
}

/// One `[[wave]]` of an environment file.
#[derive(Debug, Clone, PartialEq)]
pub struct WaveSpec {
    /// Cluster names or glob patterns (`*`, `?`) over the environment's
    /// clusters in `drover.toml`, as written.
    pub clusters: Vec<String>,
    /// The wave's own window, replacing the environment's windows for its
    /// clusters; `None` = the environment's.
    pub window: Option<WindowSpec>,
    /// How long every cluster of this wave must have confirmed a version
    /// before the next wave may start it. Default [`DEFAULT_WAVE_SOAK`].
    pub soak: Duration,
    /// How many of the wave's clusters may roll a version at once; `None`
    /// (the default) = all of them.
    pub max_concurrency: Option<u32>,
}

impl WaveSpec {
    /// Whether `cluster` is one of this wave's (by name or pattern).
    pub fn holds(&self, cluster: &str) -> bool {
        self.clusters.iter().any(|p| pattern_matches(p, cluster))
    }
}

/// Whether the glob `pattern` (`*` any run of characters, `?` one; nothing
/// else is special) matches `name` whole.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    if !pattern.contains(['*', '?']) {
        return pattern == name;
    }
    let mut re = String::from("^");
    for c in pattern.chars() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            c => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    re.push('$');
    // Escaped literals and two metacharacters: always a valid expression.
    regex::Regex::new(&re).is_ok_and(|r| r.is_match(name))
}

/// `[rollout]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutSpec {
    /// Selected nodes that may be unavailable because of drover at once.
    /// Default 1.
    pub max_unavailable: MaxUnavailable,
    /// Longest a drain may take before the node is given back. Default 20m.
    pub drain_timeout: Duration,
    /// Longest from drain start to Ready at the new version. Default 45m;
    /// never shorter than `drain_timeout`.
    pub node_timeout: Duration,
    /// Label selector choosing the nodes; empty (the default) selects all.
    pub node_selector: String,
    /// What a drain timeout does to the rest of the rollout. Default `skip`.
    pub on_drain_timeout: OnDrainTimeout,
    /// What a node that fails its health checks after its upgrade becomes.
    /// Default `halt`.
    pub on_failure: OnFailure,
    /// Nodes of one cluster that may be rolled back from one version before
    /// the cluster halts with its nodes as they are. Default 1.
    pub max_rollbacks: u32,
    /// Finish the node in flight, start no new one. Default `false`.
    pub paused: bool,
    /// Clusters of the environment that may report `failed` for a version
    /// before the whole environment halts it (docs/design.md §4a). Default 0.
    pub failure_budget: u32,
    /// `consent_limit`: how long workload consent ([`CONSENT_LABEL`]) may
    /// hold a node, counted from when drover first saw it holding the node
    /// (its own record's), after which the node is reported overdue (a
    /// Warning Event, the status, a metric, the signed report), never
    /// forced. Default `None`: no limit, a held node is never reported.
    pub consent_limit: Option<Duration>,
}

/// `max_unavailable`: a count or a percentage of the selected nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnavailable {
    /// At most this many nodes (>= 1).
    Count(u32),
    /// At most this percentage (1..=100) of the selected nodes, rounded
    /// down but never below one node.
    Percent(u32),
}

impl MaxUnavailable {
    /// The number of nodes this allows out of `total` selected nodes.
    pub fn resolve(self, total: usize) -> usize {
        match self {
            MaxUnavailable::Count(n) => n as usize,
            MaxUnavailable::Percent(p) => (total * p as usize / 100).max(1),
        }
    }
}

/// `on_drain_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDrainTimeout {
    /// Give the node back, mark it blocked, go on with the others and retry
    /// it after them. Default.
    Skip,
    /// Give the node back, mark it blocked and start no further node.
    Stop,
}

/// `on_failure`: what a node that failed its health checks after its
/// upgrade becomes (docs/design.md §5b).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// The node stays as it is (in service at the new version) and the
    /// rollout stops until a retry or a new version. Default.
    Halt,
    /// The node is driven back to the version it ran before, checked at it,
    /// uncordoned and never moved to this version again; the rollout stops.
    Rollback,
}

/// `[promotion]` of an environment file.
#[derive(Debug, Clone, PartialEq)]
pub struct PromotionSpec {
    /// Time the lower environment must have run the version. Default 24h.
    pub soak: Duration,
}

/// `[driver]`. Default `Bottlerocket` with [`DEFAULT_BOTTLEROCKET_IMAGE`].
#[derive(Debug, Clone, PartialEq)]
pub enum DriverSpec {
    /// Bottlerocket's API: version-lock, update, reboot.
    Bottlerocket {
        /// Image of the helper that talks to the Bottlerocket API socket;
        /// None when neither the config nor this build names one.
        image: Option<String>,
    },
    /// A user-supplied Job; gets `DROVER_TARGET_VERSION`.
    Job {
        /// Container image.
        image: String,
        /// Command and arguments.
        command: Vec<String>,
    },
}

impl DriverSpec {
    /// The image the driver's Jobs run, or why there is none: a
    /// Bottlerocket driver with no `[driver] image` in a build without an
    /// updater image of its own (docs/drivers.md). The message names the
    /// setting.
    pub fn updater_image(&self) -> Result<&str, String> {
        match self {
            DriverSpec::Job { image, .. } => Ok(image),
            DriverSpec::Bottlerocket { image: Some(image) } => Ok(image),
            DriverSpec::Bottlerocket { image: None } => Err(NO_UPDATER_IMAGE.to_owned()),
        }
    }
}

/// Why the Bottlerocket driver has no image ([`DriverSpec::updater_image`]).
pub const NO_UPDATER_IMAGE: &str = "the Bottlerocket driver has no updater image: set [driver] \
     image = \"REPOSITORY@sha256:<digest>\" in the environment's file; this build of drover has \
     none of its own (only a release build has: `drover --version` names it; docs/drivers.md)";

/// `[driver] prepare` and `[driver] prestage` (docs/config.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrepareSpec {
    /// The driver is run with `DROVER_ACTION=prepare` before the drain:
    /// the target is checked available and downloaded while the node still
    /// serves, and the node is cordoned once it is staged. Default true for
    /// the Bottlerocket driver, false for `kind = "job"` (opt-in).
    pub enabled: bool,
    /// How long before a maintenance window opens the next nodes may
    /// prepare (download), at most `max_unavailable` of them ahead.
    /// Default zero: downloads start inside the window only.
    pub prestage: std::time::Duration,
}

/// `[nodes]`.
#[derive(Debug, Clone)]
pub struct NodesSpec {
    /// Applied to `status.nodeInfo.osImage`; the first capture group is the
    /// version. Default `(\d+\.\d+\.\d+)`.
    pub version_regex: regex::Regex,
    /// Of the nodes `[rollout] node_selector` selects, only those whose
    /// `status.nodeInfo.osImage` matches are drover's; None takes every one.
    /// Default [`DEFAULT_BOTTLEROCKET_OS_IMAGE_REGEX`] for the Bottlerocket
    /// driver (its Job could only fail elsewhere), None for `kind = "job"`.
    pub os_image_regex: Option<regex::Regex>,
    /// `[nodes] brupop`: a node carrying [`BRUPOP_LABEL`] is managed by the
    /// Bottlerocket update operator, and drover leaves it alone (skipped,
    /// with the reason) unless it already has a record of drover's. Default
    /// true (`"skip"`); `"take"` drives it anyway.
    pub skip_brupop: bool,
}

impl PartialEq for NodesSpec {
    fn eq(&self, other: &Self) -> bool {
        self.version_regex.as_str() == other.version_regex.as_str()
            && self.os_image_regex.as_ref().map(regex::Regex::as_str)
                == other.os_image_regex.as_ref().map(regex::Regex::as_str)
            && self.skip_brupop == other.skip_brupop
    }
}

impl NodesSpec {
    /// Whether a node whose `osImage` is `os_image` is one of drover's.
    pub fn selects(&self, os_image: &str) -> bool {
        self.os_image_regex
            .as_ref()
            .is_none_or(|re| re.is_match(os_image))
    }

    /// Why drover leaves a node alone whose [`BRUPOP_LABEL`] is `brupop`
    /// (None: the node has no such label, or `[nodes] brupop = "take"`).
    pub fn managed_by(&self, brupop: Option<&str>) -> Option<String> {
        let value = brupop.filter(|_| self.skip_brupop)?;
        Some(format!(
            "managed by the Bottlerocket update operator (label {BRUPOP_LABEL}={value}): \
             left alone; set [nodes] brupop = \"take\" to drive it"
        ))
    }

    /// The version in an `osImage` string, if the regex finds a valid one.
    pub fn version_of(&self, os_image: &str) -> Option<semver::Version> {
        let caps = self.version_regex.captures(os_image)?;
        let m = caps.get(1).or_else(|| caps.get(0))?;
        semver::Version::parse(m.as_str()).ok()
    }
}

impl Default for WindowSpec {
    fn default() -> Self {
        Self {
            schedule: DEFAULT_SCHEDULE.to_owned(),
            duration: DEFAULT_WINDOW_DURATION,
            timezone: DEFAULT_TIMEZONE,
        }
    }
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_unavailable: DEFAULT_MAX_UNAVAILABLE,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            node_selector: DEFAULT_NODE_SELECTOR.to_owned(),
            on_drain_timeout: DEFAULT_ON_DRAIN_TIMEOUT,
            on_failure: DEFAULT_ON_FAILURE,
            max_rollbacks: DEFAULT_MAX_ROLLBACKS,
            paused: false,
            failure_budget: 0,
            consent_limit: None,
        }
    }
}

impl Default for PromotionSpec {
    fn default() -> Self {
        Self { soak: DEFAULT_SOAK }
    }
}

impl Default for DriverSpec {
    fn default() -> Self {
        DriverSpec::Bottlerocket {
            image: DEFAULT_BOTTLEROCKET_IMAGE.map(str::to_owned),
        }
    }
}

/// [`DEFAULT_VERSION_REGEX`], compiled once per process: every config load
/// needs it for each environment that does not set its own, and compiling
/// it cost more than reading the rest of the config.
pub fn default_version_regex() -> regex::Regex {
    static DEFAULT: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        // A constant known to compile (unit-tested), not input.
        regex::Regex::new(DEFAULT_VERSION_REGEX).expect("the default version regex compiles")
    });
    DEFAULT.clone()
}

impl Default for NodesSpec {
    /// The defaults of the default driver (Bottlerocket).
    fn default() -> Self {
        Self {
            version_regex: default_version_regex(),
            // A constant known to compile (unit-tested), not input.
            os_image_regex: Some(
                regex::Regex::new(DEFAULT_BOTTLEROCKET_OS_IMAGE_REGEX)
                    .expect("the default OS image regex compiles"),
            ),
            skip_brupop: true,
        }
    }
}
