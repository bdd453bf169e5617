//! A simulated kubelet (and the controllers drover relies on) for tests against
//! a real kube-apiserver that runs without kube-controller-manager, kube-scheduler
//! or any kubelet.
//!
//! Everything goes through the API server, driven by watches; the only timers
//! are for simulated time (reboot duration, termination grace periods, lease
//! and status heartbeats, the disruption controller's 2-minute recheck).
//!
//! What it plays, for the nodes it registers:
//!
//! - **kubelet, node side**: creates each `Node`, then writes its `/status`
//!   (Ready condition with heartbeat, `nodeInfo.osImage` from a template with
//!   `{version}`, `kubeletVersion`, capacity/allocatable, addresses), and keeps
//!   its `Lease` in `kube-node-lease` fresh. A node that is rebooting renews
//!   neither, like a real one.
//! - **kubelet, pod side**: a Pending pod bound to one of its nodes
//!   (`spec.nodeName`) is made Running and Ready; a pod with
//!   `metadata.deletionTimestamp` is deleted with grace 0 once its grace period
//!   (scaled by [`KubeletOptions::grace_scale`], capped by
//!   [`KubeletOptions::grace_cap`]) has passed. The annotation
//!   [`SLOW_TERMINATION_ANNOTATION`] (`"<seconds>"`) overrides both.
//! - **disruption controller**: keeps every PodDisruptionBudget's status
//!   (`currentHealthy`, `desiredHealthy`, `expectedPods`, `disruptionsAllowed`,
//!   `disruptedPods`, `observedGeneration`, the `DisruptionAllowed` condition)
//!   as the real controller computes it, so the API server's eviction
//!   subresource allows or refuses (429) for real. Terminating pods and pods in
//!   `status.disruptedPods` younger than 2 minutes do not count as healthy, so
//!   an evicted-but-not-yet-gone pod never re-opens the budget. Unlike the real
//!   controller, `expectedPods` is always the number of matching pods (there are
//!   no workload controllers whose scale could be read).
//! - **OS update driver** (see the contract below): runs drover's upgrade Jobs
//!   by rebooting the node into the target version.
//!
//! # Upgrade Job contract (drover Kubernetes backend ⇄ simulator)
//!
//! A Job is an upgrade request for node `N` to version `V` when it carries the
//! labels [`MANAGED_BY_LABEL`]`=`[`MANAGED_BY_VALUE`] (`app.kubernetes.io/managed-by=drover`),
//! [`NODE_LABEL`]`=N` (`drover.dev/node`) and [`TARGET_VERSION_LABEL`]`=V`
//! (`drover.dev/target-version`, a semver), and its pod template has
//! `spec.nodeName=N`. The version is read from the label only. No Pods are
//! created for it (there is no scheduler), unless the simulator plays the
//! graceful node shutdown (below); the Job's status is the whole answer:
//!
//! 1. `status.startTime` and `status.active=1` are set; the node's Ready
//!    condition goes False (reason [`NOT_READY_REASON`], message
//!    [`REBOOT_MESSAGE`]) for [`KubeletOptions::reboot`].
//! 2. The node comes back Ready with `osImage` rendered for `V`, then the Job
//!    completes: `active=0`, `succeeded=1`, `completionTime`, conditions
//!    `SuccessCriteriaMet=True` and `Complete=True` (the 1.36 API server rejects
//!    `Complete` without `SuccessCriteriaMet`, `startTime` or `completionTime`).
//! 3. A Job for a node already at `V` completes at once without a reboot, so
//!    retries are idempotent; [`Kubelet::upgrades_started`] counts reboots only.
//! 4. A Job that breaks the contract (no version label, template `nodeName`
//!    different from the node label) fails: conditions `FailureTarget=True` and
//!    `Failed=True`, reason `InvalidUpgradeJob`, `failed=1`.
//! 5. A Job whose `drover.dev/action` annotation is `prepare` (drover's
//!    download before the drain, `DROVER_ACTION=prepare`) never reboots: it
//!    takes [`KubeletOptions::download`], stages `V` on the node and
//!    completes, as the Bottlerocket script does (refresh + prepare, state
//!    Staged). An upgrade Job finding `V` staged goes straight to the
//!    reboot; one that does not first spends `download` (the script
//!    downloads inside the drain then). [`Kubelet::downloads`] counts both.
//!
//! Faults ([`Fault`], per node, via [`Kubelet::set_fault`] or the example's
//! `--fault`): the node never comes back (stays NotReady, the Job stays
//! active), comes back at its old or another version (the Job still
//! succeeds, as an OS updater that believes it succeeded would), or the Job
//! fails without a reboot (`reason: UpdateFailed`), or the node's update
//! repository does not offer the version (`not-in-repository`: a prepare or
//! upgrade Job fails with the script's "V is not offered to this node",
//! without a download or reboot). Two faults break the
//! node's health rather than its upgrade, both once it returns from an
//! upgrade (a later upgrade heals them, like a fixed release):
//! `crashloop-after-upgrade` makes every pod on it crash-loop (not Ready,
//! containers waiting in `CrashLoopBackOff`, `restartCount` growing every
//! [`CRASH_INTERVAL`]), and `condition:TYPE` turns node condition TYPE
//! (`MemoryPressure`, or any other type) True.
//!
//! # Graceful node shutdown ([`KubeletOptions::graceful_shutdown`])
//!
//! In this mode the simulator also plays the kubelet's graceful node
//! shutdown and, for upgrade Jobs, the Job controller, so that a Job's
//! `podFailurePolicy` and `backoffLimit` decide as they do in a cluster.
//! Upstream behaviour (kubernetes v1.36.3):
//!
//! - **Job controller** (`pkg/controller/job`): creates the Job's pod from its
//!   template; judges each failed pod by the first `podFailurePolicy` rule
//!   that matches (`matchPodFailurePolicy`: `onExitCodes` against terminated
//!   containers with a non-zero exit code, `onPodConditions` against the
//!   pod's conditions): `Ignore` does not count it, `FailJob` fails the Job
//!   (reason `PodFailurePolicy`), `Count` or no match counts it in
//!   `status.failed`, and more than `backoffLimit` counted failures fail the
//!   Job (`BackoffLimitExceeded`). A replacement pod is created
//!   [`KubeletOptions::job_backoff`] × 2^(n-1) after the n-th failure, ignored
//!   ones included (`backoff_utils.go`: 10 s doubling to 10 min upstream).
//!   A succeeded pod completes the Job.
//! - **kubelet** (`pkg/kubelet/nodeshutdown`, `kubelet.go` `rejectPod`): when
//!   the driver asks for the reboot, the node shuts down for
//!   `graceful_shutdown`: its Ready condition turns False ("node is shutting
//!   down"), the running pod is killed (phase `Failed`, reason `Terminated`,
//!   condition `DisruptionTarget` with reason `TerminationByKubelet`, the
//!   container terminated with exit code 143), and every pod bound to the
//!   node meanwhile is rejected at admission (phase `Failed`, reason
//!   `NodeShutdown`, "Pod was rejected: Pod was rejected as the node is
//!   shutting down.", no container status and no condition). Then the node is
//!   down for [`KubeletOptions::reboot`]; a pod bound to it stays Pending
//!   until it is back.
//! - **the driver** (the pod): on a node below the Job's version it asks for
//!   the reboot; on a node at the version it exits 0; on a node that already
//!   rebooted for this Job and runs another version it exits 1, as drover's
//!   Bottlerocket script does (so does [`Fault::JobFails`], without a reboot).
//!
//! Only the Job's own pod is played; other pods on the node are left as they
//! are, as in the default mode.
//!
//! # A real driver in the pod ([`KubeletOptions::driver`])
//!
//! With a [`PodDriver`] the pod of every drover Job (prepare, upgrade and
//! rollback alike) runs it instead of the simulated driver, under the Job
//! controller and the graceful shutdown above: the driver gets the pod's
//! environment; when it exits, the pod ends with its exit code and its
//! termination message (`state.terminated.message`); when it asks its node
//! for a reboot, the graceful shutdown kills the pod (the driver is stopped
//! as SIGTERM stops it), and the node comes back at whatever version the
//! driver's node boots. `support/bottlerocket/nodes.rs` runs drover's
//! Bottlerocket script there, each node with a simulated Bottlerocket API.
//!
//! Several simulators may share one API server (one per test): each handles
//! only pods and Jobs bound to its own nodes, and [`KubeletOptions::pdb_namespace`]
//! keeps their disruption controllers apart.

// Each test binary and the example use a different subset of this module.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::{Job, PodFailurePolicy};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Label every drover-managed object carries (`app.kubernetes.io/managed-by`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on drover's upgrade Jobs.
pub const MANAGED_BY_VALUE: &str = "drover";
/// Annotation of a drover Job naming its `DROVER_ACTION` (`prepare` never reboots).
pub const ACTION_ANNOTATION: &str = "drover.dev/action";
/// Label naming the node an upgrade Job is for.
pub const NODE_LABEL: &str = "drover.dev/node";
/// Label holding the version an upgrade Job moves its node to.
pub const TARGET_VERSION_LABEL: &str = "drover.dev/target-version";
/// Pod annotation (`"<seconds>"`): terminate after this long, ignoring grace scale and cap.
pub const SLOW_TERMINATION_ANNOTATION: &str = "sim.drover.dev/slow-termination";
/// Ready condition reason while a node reboots.
pub const NOT_READY_REASON: &str = "KubeletNotReady";
/// Ready condition message while a node reboots.
pub const REBOOT_MESSAGE: &str = "rebooting for OS update";
/// Ready condition message during a graceful node shutdown (the kubelet's own).
pub const SHUTDOWN_MESSAGE: &str = "node is shutting down";
/// `status.reason` of a pod the kubelet rejects while the node shuts down.
pub const NODE_SHUTDOWN_REASON: &str = "NodeShutdown";
/// `status.reason` of a pod the kubelet's graceful shutdown killed.
pub const SHUTDOWN_KILLED_REASON: &str = "Terminated";
/// Label the Job controller puts on its pods (and the simulator reads).
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// Namespace of node heartbeat Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long the disruption controller honours a `status.disruptedPods` entry.
pub const DISRUPTED_POD_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a crash-looping pod's containers restart (simulated time).
pub const CRASH_INTERVAL: Duration = Duration::from_secs(1);
/// Reason of a condition turned True by [`Fault::Condition`].
pub const FAULT_CONDITION_REASON: &str = "SimulatedFault";
/// Field manager of every write the simulator makes.
pub const FIELD_MANAGER: &str = "kubelet-sim";

/// How the simulator behaves.
#[derive(Clone, Debug)]
pub struct KubeletOptions {
    /// Node names are `{name_prefix}{index}`, index from 0.
    pub name_prefix: String,
    /// Nodes registered by [`Kubelet::start`].
    pub nodes: usize,
    /// `nodeInfo.osImage` template; `{version}` is replaced by the node's version.
    pub os_image: String,
    /// Version the nodes start at.
    pub version: String,
    /// `nodeInfo.kubeletVersion`.
    pub kubelet_version: String,
    /// Extra labels on every node.
    pub labels: BTreeMap<String, String>,
    /// How long an upgrade keeps the node NotReady.
    pub reboot: Duration,
    /// Factor applied to pod termination grace periods.
    pub grace_scale: f64,
    /// Upper bound on the (scaled) termination grace period.
    pub grace_cap: Option<Duration>,
    /// Lease renewal interval.
    pub lease_interval: Duration,
    /// Node status heartbeat interval.
    pub status_interval: Duration,
    /// Run the disruption controller at all.
    pub pdb_controller: bool,
    /// Only manage PDBs in this namespace (None: all namespaces).
    pub pdb_namespace: Option<String>,
    /// Delete the nodes and their Leases on [`Kubelet::shutdown`].
    pub remove_nodes_on_shutdown: bool,
    /// Play the kubelet's graceful node shutdown for this long before each
    /// reboot, and the Job controller for upgrade Jobs (module docs); None:
    /// Jobs complete without pods.
    pub graceful_shutdown: Option<Duration>,
    /// The Job controller's pod failure backoff, doubled per failure (10 s upstream).
    pub job_backoff: Duration,
    /// How long downloading an update takes (a prepare Job, or an upgrade
    /// Job that finds nothing staged).
    pub download: Duration,
    /// What the Jobs' pods run (module docs); None: the simulated driver.
    pub driver: Option<Arc<dyn PodDriver>>,
}

/// A driver that runs in the pods of drover's Jobs (module docs).
pub trait PodDriver: Send + Sync + fmt::Debug + 'static {
    /// Run the driver on `node` with the pod's environment, until it exits
    /// or asks for a reboot.
    fn run(
        &self,
        node: &str,
        env: Vec<(String, String)>,
    ) -> futures::future::BoxFuture<'static, DriverRun>;
    /// The shutdown's SIGTERM: stop the run that asked for the reboot; its exit code.
    fn stop(&self, node: &str) -> futures::future::BoxFuture<'static, i32>;
    /// The node reboots now; the version it runs after.
    fn reboot(&self, node: &str) -> String;
}

/// How a [`PodDriver`] run ended.
#[derive(Debug)]
pub enum DriverRun {
    /// It exited with this code, having written this termination message.
    Exited { code: i32, message: Option<String> },
    /// It asked its node for a reboot (and runs until stopped).
    Rebooting,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        Self {
            name_prefix: "sim-".into(),
            nodes: 1,
            os_image: "Bottlerocket OS {version} (aws-k8s-1.36)".into(),
            version: "1.0.0".into(),
            kubelet_version: "v1.36.3".into(),
            labels: BTreeMap::new(),
            reboot: Duration::from_secs(3),
            grace_scale: 1.0,
            grace_cap: None,
            lease_interval: Duration::from_secs(10),
            status_interval: Duration::from_secs(60),
            pdb_controller: true,
            pdb_namespace: None,
            remove_nodes_on_shutdown: true,
            graceful_shutdown: None,
            job_backoff: Duration::from_secs(10),
            download: Duration::ZERO,
            driver: None,
        }
    }
}

impl KubeletOptions {
    /// `osImage` of a node at `version`.
    pub fn os_image_for(&self, version: &str) -> String {
        self.os_image.replace("{version}", version)
    }
}

/// A misbehaviour injected into one node's upgrades.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Behave.
    #[default]
    None,
    /// After the reboot the node stays NotReady; the Job stays active.
    NeverReady,
    /// The node comes back Ready at its old version; the Job succeeds.
    OldVersion,
    /// The node comes back Ready at this version; the Job succeeds.
    WrongVersion(String),
    /// The Job fails (`UpdateFailed`) without a reboot.
    JobFails,
    /// The node's update repository does not offer the Job's version: a
    /// prepare or upgrade Job fails (`UpdateFailed`) without downloading.
    NotInRepository,
    /// Once the node returns from an upgrade, every pod on it crash-loops.
    CrashLoopAfterUpgrade,
    /// Once the node returns from an upgrade to this version (and only this
    /// one: a version that breaks a workload), every pod on it crash-loops;
    /// an upgrade or rollback to another version heals it.
    CrashLoopAt(String),
    /// Once the node returns from an upgrade, this node condition is True.
    Condition(String),
}

impl FromStr for Fault {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "none" => Fault::None,
            "never-ready" => Fault::NeverReady,
            "old-version" => Fault::OldVersion,
            "job-fails" => Fault::JobFails,
            "not-in-repository" => Fault::NotInRepository,
            "crashloop-after-upgrade" => Fault::CrashLoopAfterUpgrade,
            _ => match (s.strip_prefix("version:"), s.strip_prefix("condition:")) {
                (Some(v), _) if !v.is_empty() => Fault::WrongVersion(v.to_string()),
                _ if s.starts_with("crashloop-at:") && s.len() > "crashloop-at:".len() => {
                    Fault::CrashLoopAt(s["crashloop-at:".len()..].to_string())
                }
                (_, Some(c)) if !c.is_empty() && c != "Ready" => Fault::Condition(c.to_string()),
                _ => bail!(
                    "unknown fault {s:?}: expected none, never-ready, old-version, version:X.Y.Z, \
                     job-fails, not-in-repository, crashloop-after-upgrade, crashloop-at:X.Y.Z or condition:TYPE \
                     (TYPE not Ready)"
                ),
            },
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::None => f.write_str("none"),
            Fault::NeverReady => f.write_str("never-ready"),
            Fault::OldVersion => f.write_str("old-version"),
            Fault::WrongVersion(v) => write!(f, "version:{v}"),
            Fault::JobFails => f.write_str("job-fails"),
            Fault::NotInRepository => f.write_str("not-in-repository"),
            Fault::CrashLoopAfterUpgrade => f.write_str("crashloop-after-upgrade"),
            Fault::CrashLoopAt(v) => write!(f, "crashloop-at:{v}"),
            Fault::Condition(c) => write!(f, "condition:{c}"),
        }
    }
}

/// Something the simulator did, for tests that need to know a simulated step happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimEvent {
    /// A node went NotReady to reboot into `target`.
    UpgradeStarted { node: String, target: String },
    /// A node is Ready again, reporting `version`.
    NodeReturned { node: String, version: String },
    /// A node's reboot ended and it will stay NotReady ([`Fault::NeverReady`]).
    NodeStaysDown { node: String },
    /// An upgrade Job was marked complete.
    JobCompleted { namespace: String, job: String },
    /// An upgrade Job was marked failed.
    JobFailed {
        namespace: String,
        job: String,
        reason: String,
    },
    /// The kubelet rejected a pod at admission (graceful shutdown mode).
    PodRejected {
        namespace: String,
        pod: String,
        reason: String,
    },
    /// A terminating pod was deleted for good.
    PodTerminated { namespace: String, pod: String },
}

/// Handle on a running simulator; its tasks stop on [`Kubelet::shutdown`] or drop.
pub struct Kubelet {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    opts: KubeletOptions,
    nodes: Mutex<BTreeMap<String, Arc<SimNode>>>,
    next_index: AtomicUsize,
    faults: Mutex<HashMap<String, Fault>>,
    upgrades: Mutex<HashMap<String, usize>>,
    // Downloads per node: (by a prepare Job, inside an upgrade Job).
    downloads: Mutex<HashMap<String, (usize, usize)>>,
    pods: Store<Pod>,
    jobs: Store<Job>,
    pods_started: Mutex<HashSet<String>>,
    pods_terminating: Mutex<HashSet<String>>,
    // Restart counts of crash-looping pods, by uid.
    crash_restarts: Mutex<HashMap<String, i32>>,
    jobs_seen: Mutex<HashSet<String>>,
    // "namespace/name" of the pods the Job controller part created: their
    // status is the Job's task's to write, not handle_pod's.
    job_pods: Mutex<HashSet<String>>,
    pod_rescan: Notify,
    job_rescan: Notify,
    pdb_dirty: Notify,
    events: broadcast::Sender<SimEvent>,
    tasks: Mutex<JoinSet<()>>,
}

struct SimNode {
    name: String,
    index: usize,
    state: Mutex<NodeState>,
    // Held across each status write so writes reach the API server in order.
    write_lock: tokio::sync::Mutex<()>,
    // Serialises upgrades of one node, so a duplicate Job sees the finished one.
    upgrade_lock: tokio::sync::Mutex<()>,
    // Woken whenever `state` changes (a pod waiting for the node to return).
    changed: Notify,
}

#[derive(Clone)]
struct NodeState {
    version: String,
    ready: bool,
    // Rebooting or stuck: no lease renewals, no heartbeats.
    down: bool,
    // In a graceful shutdown: NotReady, rejecting pods, still heartbeating.
    shutting_down: bool,
    transition: String,
    boot_id: String,
    // The version a prepare Job downloaded and staged, not yet booted.
    staged: Option<String>,
    // Health faults in force since the last upgrade returned.
    crashloop: bool,
    condition: Option<String>,
}

fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn now_micro() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

fn random_uuid() -> String {
    let h = random_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

// A stable private address per name; no traffic is ever sent to it.
fn address_for(name: &str, base: [u8; 2]) -> String {
    let h = name
        .bytes()
        .fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619));
    format!(
        "{}.{}.{}.{}",
        base[0],
        base[1],
        (h >> 8) as u8,
        (h as u8).clamp(1, 254)
    )
}

fn is_api_error(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}

fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Nodes [`Kubelet::add_nodes`] registers at once.
const REGISTER_AT_ONCE: usize = 8;

impl Kubelet {
    /// Starts the watches and controllers, then registers `opts.nodes` nodes.
    pub async fn start(client: Client, opts: KubeletOptions) -> anyhow::Result<Kubelet> {
        let (pods, pod_writer) = reflector::store::<Pod>();
        let (jobs, job_writer) = reflector::store::<Job>();
        let (events, _) = broadcast::channel(1024);
        let inner = Arc::new(Inner {
            client,
            opts,
            nodes: Mutex::new(BTreeMap::new()),
            next_index: AtomicUsize::new(0),
            faults: Mutex::new(HashMap::new()),
            upgrades: Mutex::new(HashMap::new()),
            downloads: Mutex::new(HashMap::new()),
            pods,
            jobs,
            pods_started: Mutex::new(HashSet::new()),
            pods_terminating: Mutex::new(HashSet::new()),
            crash_restarts: Mutex::new(HashMap::new()),
            jobs_seen: Mutex::new(HashSet::new()),
            job_pods: Mutex::new(HashSet::new()),
            pod_rescan: Notify::new(),
            job_rescan: Notify::new(),
            pdb_dirty: Notify::new(),
            events,
            tasks: Mutex::new(JoinSet::new()),
        });
        inner.spawn(Inner::run_pods(inner.clone(), pod_writer));
        inner.spawn(Inner::run_jobs(inner.clone(), job_writer));
        if inner.opts.pdb_controller {
            inner.spawn(Inner::run_pdbs(inner.clone()));
        }
        let kubelet = Kubelet { inner };
        let n = kubelet.inner.opts.nodes;
        kubelet.add_nodes(n).await?;
        Ok(kubelet)
    }

    /// Registers `n` more nodes (Ready, at the starting version) and returns their names.
    /// [`REGISTER_AT_ONCE`] register at a time: one after the other, the
    /// three requests each made registering 5,000 nodes take most of an hour
    /// on a loaded machine.
    pub async fn add_nodes(&self, n: usize) -> anyhow::Result<Vec<String>> {
        let nodes: Vec<Arc<SimNode>> = (0..n)
            .map(|_| {
                let index = self.inner.next_index.fetch_add(1, Ordering::SeqCst);
                Arc::new(SimNode {
                    name: format!("{}{}", self.inner.opts.name_prefix, index),
                    index,
                    state: Mutex::new(NodeState {
                        version: self.inner.opts.version.clone(),
                        ready: true,
                        down: false,
                        shutting_down: false,
                        transition: now_rfc3339(),
                        boot_id: random_uuid(),
                        staged: None,
                        crashloop: false,
                        condition: None,
                    }),
                    write_lock: tokio::sync::Mutex::new(()),
                    upgrade_lock: tokio::sync::Mutex::new(()),
                    changed: Notify::new(),
                })
            })
            .collect();
        let mut registered = futures::stream::iter(nodes.iter().cloned())
            .map(|node| async move { self.inner.register(&node).await.map(|()| node) })
            .buffer_unordered(REGISTER_AT_ONCE);
        while let Some(node) = registered.next().await {
            let node = node?;
            self.inner
                .nodes
                .lock()
                .unwrap()
                .insert(node.name.clone(), node.clone());
            self.inner
                .spawn(Inner::run_heartbeat(self.inner.clone(), node));
        }
        // Pods or Jobs bound to these names may already have been seen and skipped.
        self.inner.pod_rescan.notify_one();
        self.inner.job_rescan.notify_one();
        Ok(nodes.iter().map(|n| n.name.clone()).collect())
    }

    /// Names of the simulated nodes, in order of registration.
    pub fn node_names(&self) -> Vec<String> {
        let nodes = self.inner.nodes.lock().unwrap();
        let mut v: Vec<_> = nodes.values().map(|n| (n.index, n.name.clone())).collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect()
    }

    /// The version a node currently reports, if it is one of ours.
    pub fn version(&self, node: &str) -> Option<String> {
        self.inner
            .node(node)
            .map(|n| n.state.lock().unwrap().version.clone())
    }

    /// Injects (or with [`Fault::None`] clears) a fault for a node's next upgrades.
    pub fn set_fault(&self, node: &str, fault: Fault) {
        let mut faults = self.inner.faults.lock().unwrap();
        if fault == Fault::None {
            faults.remove(node);
        } else {
            faults.insert(node.to_string(), fault);
        }
    }

    /// How many reboots into a new version a node has started.
    pub fn upgrades_started(&self, node: &str) -> usize {
        self.inner
            .upgrades
            .lock()
            .unwrap()
            .get(node)
            .copied()
            .unwrap_or(0)
    }

    /// The downloads a node made: (by prepare Jobs, inside upgrade Jobs).
    pub fn downloads(&self, node: &str) -> (usize, usize) {
        self.inner
            .downloads
            .lock()
            .unwrap()
            .get(node)
            .copied()
            .unwrap_or_default()
    }

    /// A stream of what the simulator does from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<SimEvent> {
        self.inner.events.subscribe()
    }

    /// The options it runs with.
    pub fn options(&self) -> &KubeletOptions {
        &self.inner.opts
    }

    /// Stops every task and, if configured, deletes the nodes and their Leases.
    pub async fn shutdown(self) {
        self.inner.tasks.lock().unwrap().abort_all();
        if !self.inner.opts.remove_nodes_on_shutdown {
            return;
        }
        let nodes: Api<Node> = Api::all(self.inner.client.clone());
        let leases: Api<Lease> = Api::namespaced(self.inner.client.clone(), LEASE_NAMESPACE);
        for name in self.node_names() {
            if let Err(e) = nodes.delete(&name, &DeleteParams::default()).await {
                tracing::warn!(node = %name, error = %e, "deleting node");
            }
            if let Err(e) = leases.delete(&name, &DeleteParams::default()).await {
                tracing::debug!(node = %name, error = %e, "deleting lease");
            }
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        // Tasks hold the Inner; without this they would keep it, and themselves, alive.
        if let Ok(mut tasks) = self.inner.tasks.lock() {
            tasks.abort_all();
        }
    }
}

impl Inner {
    fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().unwrap();
        while tasks.try_join_next().is_some() {}
        tasks.spawn(fut);
    }

    fn node(&self, name: &str) -> Option<Arc<SimNode>> {
        self.nodes.lock().unwrap().get(name).cloned()
    }

    fn fault(&self, node: &str) -> Fault {
        self.faults
            .lock()
            .unwrap()
            .get(node)
            .cloned()
            .unwrap_or_default()
    }

    fn emit(&self, event: SimEvent) {
        tracing::debug!(?event, "kubelet-sim");
        // No subscriber is fine.
        let _ = self.events.send(event);
    }

    // ---- nodes ----------------------------------------------------------

    async fn register(&self, node: &SimNode) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), node.name.clone()),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        ]);
        labels.extend(self.opts.labels.clone());
        let obj: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": node.name, "labels": labels },
            "spec": {},
        }))?;
        let created = match nodes.create(&PostParams::default(), &obj).await {
            Ok(n) => n,
            Err(e) if is_api_error(&e, 409) => {
                // Left over from an earlier run under the same name: adopt it.
                let patch =
                    json!({ "metadata": { "labels": labels }, "spec": { "unschedulable": null } });
                nodes
                    .patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("adopting node {}", node.name))?
            }
            Err(e) => return Err(e).with_context(|| format!("creating node {}", node.name)),
        };
        self.write_node_status(node)
            .await
            .with_context(|| format!("writing status of node {}", node.name))?;

        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let lease: Lease = serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": node.name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node",
                    "name": node.name, "uid": created.uid().unwrap_or_default(),
                }],
            },
            "spec": {
                "holderIdentity": node.name,
                "leaseDurationSeconds": 40,
                "renewTime": now_micro(),
            },
        }))?;
        match leases.create(&PostParams::default(), &lease).await {
            Ok(_) => {}
            Err(e) if is_api_error(&e, 409) => self.renew_lease(&node.name).await?,
            Err(e) => return Err(e).with_context(|| format!("creating lease {}", node.name)),
        }
        Ok(())
    }

    async fn renew_lease(&self, name: &str) -> anyhow::Result<()> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let patch = json!({ "spec": { "holderIdentity": name, "renewTime": now_micro() } });
        leases
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("renewing lease {name}"))?;
        Ok(())
    }

    fn node_status(&self, node: &SimNode, st: &NodeState) -> Value {
        let now = now_rfc3339();
        let ok = |type_: &str, reason: &str, message: &str| {
            json!({
                "type": type_, "status": "False", "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": st.transition,
            })
        };
        let ready = if st.ready {
            json!({
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now, "lastTransitionTime": st.transition,
            })
        } else {
            json!({
                "type": "Ready", "status": "False", "reason": NOT_READY_REASON,
                "message": if st.shutting_down { SHUTDOWN_MESSAGE } else { REBOOT_MESSAGE },
                "lastHeartbeatTime": now, "lastTransitionTime": st.transition,
            })
        };
        let mut conditions = vec![
            ok(
                "MemoryPressure",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            ok(
                "DiskPressure",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
            ok(
                "PIDPressure",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            ready,
        ];
        if let Some(bad) = &st.condition {
            let fault = json!({
                "type": bad, "status": "True", "reason": FAULT_CONDITION_REASON,
                "message": format!("simulated {bad} after the upgrade"),
                "lastHeartbeatTime": now, "lastTransitionTime": st.transition,
            });
            match conditions.iter_mut().find(|c| c["type"] == json!(bad)) {
                Some(c) => *c = fault,
                None => conditions.push(fault),
            }
        }
        json!({
            "status": {
                "conditions": conditions,
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": st.boot_id,
                    "containerRuntimeVersion": "containerd://2.1.4",
                    "kernelVersion": "6.12.40",
                    "kubeProxyVersion": "",
                    "kubeletVersion": self.opts.kubelet_version,
                    "machineID": format!("{:032x}", node.index + 1),
                    "operatingSystem": "linux",
                    "osImage": self.opts.os_image_for(&st.version),
                    "systemUUID": format!("ec2{:029x}", node.index + 1),
                },
                "capacity": { "cpu": "2", "memory": "8035444Ki", "pods": "110", "ephemeral-storage": "20959212Ki" },
                "allocatable": { "cpu": "1930m", "memory": "7271540Ki", "pods": "110", "ephemeral-storage": "18242267924" },
                "addresses": [
                    { "type": "InternalIP", "address": address_for(&node.name, [10, 0]) },
                    { "type": "Hostname", "address": node.name },
                ],
                "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            }
        })
    }

    async fn write_node_status(&self, node: &SimNode) -> anyhow::Result<()> {
        let _order = node.write_lock.lock().await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut last = None;
        for attempt in 0..3u32 {
            let status = {
                let st = node.state.lock().unwrap().clone();
                self.node_status(node, &st)
            };
            match nodes
                .patch_status(&node.name, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if is_api_error(&e, 404) => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(node = %node.name, error = %e, attempt, "node status write failed");
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
        Err(last.expect("three failed attempts").into())
    }

    async fn set_node(&self, node: &SimNode, change: impl FnOnce(&mut NodeState)) {
        {
            let mut st = node.state.lock().unwrap();
            let was_ready = st.ready;
            change(&mut st);
            if st.ready != was_ready {
                st.transition = now_rfc3339();
            }
        }
        node.changed.notify_waiters();
        if let Err(e) = self.write_node_status(node).await {
            tracing::warn!(node = %node.name, error = %e, "node status not written");
        }
    }

    async fn run_heartbeat(self: Arc<Self>, node: Arc<SimNode>) {
        let start = Instant::now();
        let mut lease =
            tokio::time::interval_at(start + self.opts.lease_interval, self.opts.lease_interval);
        let mut status =
            tokio::time::interval_at(start + self.opts.status_interval, self.opts.status_interval);
        loop {
            tokio::select! {
                _ = lease.tick() => {
                    if !node.state.lock().unwrap().down {
                        if let Err(e) = self.renew_lease(&node.name).await {
                            tracing::warn!(node = %node.name, error = %e, "lease renewal failed");
                        }
                    }
                }
                _ = status.tick() => {
                    if !node.state.lock().unwrap().down {
                        if let Err(e) = self.write_node_status(&node).await {
                            tracing::warn!(node = %node.name, error = %e, "heartbeat failed");
                        }
                    }
                }
            }
        }
    }

    // ---- pods -----------------------------------------------------------

    async fn run_pods(self: Arc<Self>, writer: reflector::store::Writer<Pod>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(event)) => {
                        self.pdb_dirty.notify_one();
                        match event {
                            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                                self.handle_pod(&pod)
                            }
                            watcher::Event::Delete(pod) => {
                                if let Some(uid) = pod.uid() {
                                    self.pods_started.lock().unwrap().remove(&uid);
                                    self.pods_terminating.lock().unwrap().remove(&uid);
                                }
                            }
                            watcher::Event::Init | watcher::Event::InitDone => {}
                        }
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "pod watch"),
                    None => return,
                },
                _ = self.pod_rescan.notified() => {
                    for pod in self.pods.state() {
                        self.handle_pod(&pod);
                    }
                }
            }
        }
    }

    fn handle_pod(self: &Arc<Self>, pod: &Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            return;
        };
        if self.node(node).is_none() {
            return;
        }
        let Some(uid) = pod.uid() else { return };
        let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        if self.job_pods.lock().unwrap().contains(&key) {
            return;
        }
        if pod.metadata.deletion_timestamp.is_some() {
            if self.pods_terminating.lock().unwrap().insert(uid) {
                self.spawn(Inner::finish_deletion(self.clone(), pod.clone()));
            }
            return;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, None | Some("Pending")) && self.pods_started.lock().unwrap().insert(uid)
        {
            self.spawn(Inner::make_running(self.clone(), pod.clone()));
        }
    }

    async fn make_running(self: Arc<Self>, pod: Pod) {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let spec = pod.spec.clone().unwrap_or_default();
        let node = spec.node_name.clone().unwrap_or_default();
        if self
            .node(&node)
            .is_some_and(|n| n.state.lock().unwrap().crashloop)
        {
            // The node's crash-loop task writes this pod's status from now on.
            self.crash_pod(&pod).await;
            return;
        }
        let now = now_rfc3339();
        let running = |c: &k8s_openapi::api::core::v1::Container| {
            json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "containerID": format!("containerd://{}", random_hex(32)),
                "ready": true, "started": true, "restartCount": 0,
                "state": { "running": { "startedAt": now } },
            })
        };
        let init: Vec<Value> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                json!({
                    "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                    "containerID": format!("containerd://{}", random_hex(32)),
                    "ready": true, "restartCount": 0,
                    "state": { "terminated": { "exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now } },
                })
            })
            .collect();
        let cond = |t: &str| json!({ "type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now });
        let host_ip = address_for(&node, [10, 0]);
        let pod_ip = address_for(
            &format!("{ns}/{name}/{}", pod.uid().unwrap_or_default()),
            [10, 244],
        );
        let status = json!({
            "status": {
                "phase": "Running",
                "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
                "hostIP": host_ip, "hostIPs": [{ "ip": host_ip }],
                "podIP": pod_ip, "podIPs": [{ "ip": pod_ip }],
                "startTime": now,
                "initContainerStatuses": init,
                "containerStatuses": spec.containers.iter().map(running).collect::<Vec<_>>(),
            }
        });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => {}
            Err(e) if is_api_error(&e, 404) => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "could not start pod");
                // Let the next event on this pod try again.
                if let Some(uid) = pod.uid() {
                    self.pods_started.lock().unwrap().remove(&uid);
                }
            }
        }
    }

    fn termination_delay(&self, pod: &Pod) -> Duration {
        if let Some(secs) = pod
            .annotations()
            .get(SLOW_TERMINATION_ANNOTATION)
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
        {
            return Duration::from_secs_f64(secs);
        }
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                pod.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30)
            .max(0) as f64;
        let scaled = Duration::from_secs_f64(grace * self.opts.grace_scale.max(0.0));
        match self.opts.grace_cap {
            Some(cap) => scaled.min(cap),
            None => scaled,
        }
    }

    async fn finish_deletion(self: Arc<Self>, pod: Pod) {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        tokio::time::sleep(self.termination_delay(&pod)).await;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let dp = DeleteParams::default()
            .grace_period(0)
            .preconditions(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            });
        match api.delete(&name, &dp).await {
            Ok(_) => self.emit(SimEvent::PodTerminated {
                namespace: ns,
                pod: name,
            }),
            // Already gone, or replaced by a new pod of the same name.
            Err(e) if is_api_error(&e, 404) || is_api_error(&e, 409) => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "could not finish deletion");
                if let Some(uid) = pod.uid() {
                    self.pods_terminating.lock().unwrap().remove(&uid);
                }
            }
        }
    }

    // ---- upgrade jobs ---------------------------------------------------

    async fn run_jobs(self: Arc<Self>, writer: reflector::store::Writer<Job>) {
        let api: Api<Job> = Api::all(self.client.clone());
        let config =
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
        let stream = watcher(api, config).default_backoff().reflect(writer);
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job))) => {
                        self.handle_job(&job)
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::warn!(error = %e, "job watch"),
                    None => return,
                },
                _ = self.job_rescan.notified() => {
                    for job in self.jobs.state() {
                        self.handle_job(&job);
                    }
                }
            }
        }
    }

    fn handle_job(self: &Arc<Self>, job: &Job) {
        let Some(node) = job.labels().get(NODE_LABEL) else {
            return;
        };
        if self.node(node).is_none() || job_finished(job) {
            return;
        }
        let Some(uid) = job.uid() else { return };
        if self.jobs_seen.lock().unwrap().insert(uid) {
            self.spawn(Inner::run_job(self.clone(), job.clone()));
        }
    }

    async fn run_job(self: Arc<Self>, job: Job) {
        let node_name = job.labels()[NODE_LABEL].clone();
        let Some(node) = self.node(&node_name) else {
            return;
        };
        let target = job.labels().get(TARGET_VERSION_LABEL).cloned();
        let pinned = job
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.node_name.clone());
        let target = match (target, pinned) {
            (Some(t), Some(p)) if !t.is_empty() && p == node_name => t,
            (t, p) => {
                let message = format!(
                    "not a drover upgrade job: {TARGET_VERSION_LABEL}={t:?}, template nodeName={p:?}, {NODE_LABEL}={node_name:?}"
                );
                self.fail_job(
                    &job,
                    &job_start_time(&job),
                    "InvalidUpgradeJob",
                    &message,
                    1,
                )
                .await;
                return;
            }
        };

        let _one_at_a_time = node.upgrade_lock.lock().await;
        // Computed once: startTime is immutable once set on an unsuspended Job.
        let start = job_start_time(&job);
        if self.opts.driver.is_some() {
            // A real driver decides everything, prepares included.
            self.run_job_pods(&job, &node, &target, &start).await;
            return;
        }
        let prepare =
            job.annotations().get(ACTION_ANNOTATION).map(String::as_str) == Some("prepare");
        // A prepare ends here; an upgrade goes on unless its version is not offered.
        let checked = prepare || self.fault(&node_name) == Fault::NotInRepository;
        if checked && (!self.download(&job, &node, &target, &start, prepare).await || prepare) {
            return;
        }
        if self.opts.graceful_shutdown.is_some() {
            self.run_job_pods(&job, &node, &target, &start).await;
            return;
        }
        let current = node.state.lock().unwrap().version.clone();
        if current == target {
            self.complete_job(&job, &start, &node_name).await;
            return;
        }
        if self.fault(&node_name) == Fault::JobFails {
            let message = format!("simulated failure updating {node_name} to {target}");
            self.fail_job(&job, &start, "UpdateFailed", &message, 1)
                .await;
            return;
        }

        self.patch_job_status(
            &job,
            json!({ "status": { "startTime": start, "active": 1 } }),
        )
        .await;
        let staged = node.state.lock().unwrap().staged.clone();
        if staged.as_deref() != Some(target.as_str()) && !self.opts.download.is_zero() {
            // Nothing staged before the drain: the script downloads now.
            self.downloads
                .lock()
                .unwrap()
                .entry(node_name.clone())
                .or_default()
                .1 += 1;
            tokio::time::sleep(self.opts.download).await;
        }
        self.start_reboot(&node, &target, false).await;
        tokio::time::sleep(self.opts.reboot).await;
        if self.finish_reboot(&node, &current, &target, None).await {
            self.complete_job(&job, &start, &node_name).await;
        }
    }

    /// A prepare Job (`prepare`), or the check an upgrade Job makes first: a
    /// version the node's repository does not offer fails the Job; a
    /// prepare downloads for [`KubeletOptions::download`], stages `target`
    /// and completes. False when the Job failed.
    async fn download(
        &self,
        job: &Job,
        node: &SimNode,
        target: &str,
        start: &Value,
        prepare: bool,
    ) -> bool {
        let current = node.state.lock().unwrap().version.clone();
        if current == target {
            if prepare {
                self.complete_job(job, start, &node.name).await;
            }
            return true;
        }
        match self.fault(&node.name) {
            Fault::NotInRepository => {
                let message = format!("{target} is not offered to this node (offered: {current})");
                self.fail_job(job, start, "UpdateFailed", &message, 1).await;
                return false;
            }
            Fault::JobFails if prepare => {
                let message = format!("simulated failure downloading {target} on {}", node.name);
                self.fail_job(job, start, "UpdateFailed", &message, 1).await;
                return false;
            }
            _ => {}
        }
        if !prepare {
            return true;
        }
        self.patch_job_status(
            job,
            json!({ "status": { "startTime": start, "active": 1 } }),
        )
        .await;
        tokio::time::sleep(self.opts.download).await;
        self.downloads
            .lock()
            .unwrap()
            .entry(node.name.clone())
            .or_default()
            .0 += 1;
        node.state.lock().unwrap().staged = Some(target.to_string());
        self.complete_job(job, start, &node.name).await;
        true
    }

    /// The node goes down for an upgrade to `target` (NotReady, no
    /// heartbeats; with `graceful`, first shutting down: NotReady but
    /// heartbeating and rejecting pods).
    async fn start_reboot(&self, node: &SimNode, target: &str, graceful: bool) {
        *self
            .upgrades
            .lock()
            .unwrap()
            .entry(node.name.clone())
            .or_default() += 1;
        self.set_node(node, |st| {
            st.ready = false;
            st.down = !graceful;
            st.shutting_down = graceful;
            st.crashloop = false;
            st.condition = None;
        })
        .await;
        self.emit(SimEvent::UpgradeStarted {
            node: node.name.clone(),
            target: target.to_string(),
        });
    }

    /// The end of a reboot from `current` towards `target`: the node comes
    /// back as its fault says; false if it stays down ([`Fault::NeverReady`]).
    async fn finish_reboot(
        self: &Arc<Self>,
        node: &Arc<SimNode>,
        current: &str,
        target: &str,
        booted: Option<String>,
    ) -> bool {
        let node_name = node.name.clone();
        // Read now, not at the start, so a test can break a node mid-reboot.
        let fault = self.fault(&node_name);
        let version = match fault.clone() {
            _ if booted.is_some() => booted.clone().expect("checked"),
            Fault::NeverReady => {
                self.emit(SimEvent::NodeStaysDown { node: node_name });
                return false;
            }
            Fault::OldVersion => current.to_string(),
            Fault::WrongVersion(v) => v,
            Fault::None
            | Fault::JobFails
            | Fault::NotInRepository
            | Fault::CrashLoopAfterUpgrade
            | Fault::CrashLoopAt(_)
            | Fault::Condition(_) => target.to_string(),
        };
        let crashloop = match &fault {
            Fault::CrashLoopAfterUpgrade => true,
            Fault::CrashLoopAt(v) => *v == version,
            _ => false,
        };
        self.set_node(node, |st| {
            st.version = version.clone();
            st.staged = None;
            st.ready = true;
            st.down = false;
            st.shutting_down = false;
            st.boot_id = random_uuid();
            st.crashloop = crashloop;
            st.condition = match &fault {
                Fault::Condition(c) => Some(c.clone()),
                _ => None,
            };
        })
        .await;
        if crashloop {
            self.spawn(Inner::run_crashloop(self.clone(), node.clone()));
        } else {
            // The reboot restarted every container: pods a crash loop of the
            // version before left not Ready run again (a rollback heals them).
            for pod in self.pods.state() {
                let here = pod.metadata.deletion_timestamp.is_none()
                    && pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(node_name.as_str());
                let running =
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                if here && running && !pod_ready(&pod) {
                    self.spawn(Inner::make_running(self.clone(), (*pod).clone()));
                }
            }
        }
        if let Err(e) = self.renew_lease(&node_name).await {
            tracing::warn!(node = %node_name, error = %e, "lease renewal after reboot failed");
        }
        self.emit(SimEvent::NodeReturned {
            node: node_name,
            version,
        });
        true
    }

    // ---- graceful shutdown mode: the Job controller and the kubelet ----

    /// The Job controller's loop for one upgrade Job (module docs): a pod at
    /// a time, each judged by the Job's `podFailurePolicy` when it fails.
    async fn run_job_pods(
        self: &Arc<Self>,
        job: &Job,
        node: &Arc<SimNode>,
        target: &str,
        start: &Value,
    ) {
        let spec = job.spec.clone().unwrap_or_default();
        let backoff_limit = spec.backoff_limit.unwrap_or(6);
        let (mut counted, mut failures) = (0i32, 0u32);
        let mut rebooted = false;
        self.patch_job_status(
            job,
            json!({ "status": { "startTime": start, "active": 1 } }),
        )
        .await;
        loop {
            if failures > 0 {
                // backoff_utils.go: base × 2^(failures-1), at most 10 minutes.
                let delay = self
                    .opts
                    .job_backoff
                    .saturating_mul(1 << (failures - 1).min(6))
                    .min(Duration::from_secs(600));
                tokio::time::sleep(delay).await;
            }
            if !self.job_exists(job) {
                return;
            }
            let Some(pod) = self.create_job_pod(job).await else {
                return;
            };
            let status = self.kubelet_runs(&pod, node, target, &mut rebooted).await;
            let Some(status) = status else { return };
            if status.phase.as_deref() == Some("Succeeded") {
                self.complete_job(job, start, &node.name).await;
                return;
            }
            failures += 1;
            match pod_failure_action(spec.pod_failure_policy.as_ref(), &status, &pod) {
                FailureAction::Ignore => {}
                FailureAction::FailJob(message) => {
                    self.fail_job(job, start, "PodFailurePolicy", &message, counted + 1)
                        .await;
                    return;
                }
                FailureAction::Count => {
                    counted += 1;
                    if counted > backoff_limit {
                        let message = "Job has reached the specified backoff limit";
                        self.fail_job(job, start, "BackoffLimitExceeded", message, counted)
                            .await;
                        return;
                    }
                    self.patch_job_status(job, json!({ "status": { "failed": counted } }))
                        .await;
                }
            }
        }
    }

    /// Whether `job` (this very object) still exists and is not being deleted.
    fn job_exists(&self, job: &Job) -> bool {
        let key =
            reflector::ObjectRef::new(&job.name_any()).within(&job.namespace().unwrap_or_default());
        self.jobs
            .get(&key)
            .is_some_and(|j| j.uid() == job.uid() && j.metadata.deletion_timestamp.is_none())
    }

    /// The Job's next pod, from its template, as the Job controller makes it.
    async fn create_job_pod(&self, job: &Job) -> Option<Pod> {
        let ns = job.namespace().unwrap_or_default();
        let name = format!("{}-{}", job.name_any(), random_hex(3));
        let template = job.spec.as_ref()?.template.clone();
        let mut labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert(JOB_NAME_LABEL.into(), job.name_any());
        labels.insert(
            "batch.kubernetes.io/controller-uid".into(),
            job.uid().unwrap_or_default(),
        );
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": ns, "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job", "name": job.name_any(),
                    "uid": job.uid().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": template.spec,
        }))
        .ok()?;
        self.job_pods.lock().unwrap().insert(format!("{ns}/{name}"));
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api.create(&PostParams::default(), &pod).await {
            Ok(created) => Some(created),
            Err(e) => {
                tracing::warn!(job = %job.name_any(), error = %e, "could not create the Job's pod");
                None
            }
        }
    }

    /// The kubelet's part for one pod of an upgrade Job: its final status
    /// (None if the node never comes back). The pod plays the driver.
    async fn kubelet_runs(
        self: &Arc<Self>,
        pod: &Pod,
        node: &Arc<SimNode>,
        target: &str,
        rebooted: &mut bool,
    ) -> Option<PodStatus> {
        // Admission: wait while the node is down (no kubelet runs).
        let st = loop {
            let changed = node.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let st = node.state.lock().unwrap().clone();
            if !st.down {
                break st;
            }
            changed.await;
        };
        let now = now_rfc3339();
        if st.shutting_down {
            // kubelet.go rejectPod with the shutdown manager's Admit result.
            let status = json!({
                "phase": "Failed", "reason": NODE_SHUTDOWN_REASON,
                "message": "Pod was rejected: Pod was rejected as the node is shutting down.",
                "startTime": now,
            });
            self.emit(SimEvent::PodRejected {
                namespace: pod.namespace().unwrap_or_default(),
                pod: pod.name_any(),
                reason: NODE_SHUTDOWN_REASON.into(),
            });
            return self.write_pod_status(pod, status).await;
        }
        Inner::make_running(self.clone(), pod.clone()).await;
        let container_said = |code: i32, reason: &str, message: Option<&str>| {
            let mut terminated = json!({ "exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now_rfc3339() });
            if let Some(m) = message {
                terminated["message"] = json!(m);
            }
            json!([{
                "name": pod.spec.as_ref().map(|s| s.containers[0].name.clone()).unwrap_or_default(),
                "image": pod.spec.as_ref().and_then(|s| s.containers[0].image.clone()).unwrap_or_default(),
                "imageID": "", "ready": false, "restartCount": 0, "started": false,
                "containerID": format!("containerd://{}", random_hex(32)),
                "state": { "terminated": terminated },
            }])
        };
        let container = |code: i32, reason: &str| container_said(code, reason, None);
        let not_ready = |reason: &str| {
            json!([
                { "type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": now },
                { "type": "ContainersReady", "status": "False", "reason": reason, "lastTransitionTime": now },
                { "type": "Initialized", "status": "True", "lastTransitionTime": now },
                { "type": "PodScheduled", "status": "True", "lastTransitionTime": now },
            ])
        };
        let driver = self.opts.driver.clone();
        if let Some(driver) = &driver {
            let env: Vec<(String, String)> = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers[0].env.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|e| (e.name, e.value.unwrap_or_default()))
                .collect();
            if let DriverRun::Exited { code, message } = driver.run(&node.name, env).await {
                let (phase, reason) = if code == 0 {
                    ("Succeeded", "Completed")
                } else {
                    ("Failed", "Error")
                };
                let status = json!({
                    "phase": phase,
                    "conditions": not_ready(if code == 0 { "PodCompleted" } else { "PodFailed" }),
                    "containerStatuses": container_said(code, reason, message.as_deref()),
                });
                return self.write_pod_status(pod, status).await;
            }
        } else if st.version == target {
            let status = json!({
                "phase": "Succeeded", "conditions": not_ready("PodCompleted"),
                "containerStatuses": container(0, "Completed"),
            });
            return self.write_pod_status(pod, status).await;
        }
        if driver.is_none() && (*rebooted || self.fault(&node.name) == Fault::JobFails) {
            let status = json!({
                "phase": "Failed", "conditions": not_ready("PodFailed"),
                "containerStatuses": container(1, "Error"),
            });
            return self.write_pod_status(pod, status).await;
        }
        // The driver asks for the reboot: the graceful shutdown kills this
        // pod, then the node is down, then back (in the background, while the
        // Job controller goes on).
        *rebooted = true;
        self.start_reboot(node, target, true).await;
        if let Some(driver) = &driver {
            // The shutdown's SIGTERM reaches the driver.
            let code = driver.stop(&node.name).await;
            tracing::debug!(node = %node.name, code, "driver stopped by the shutdown");
        }
        let mut conditions = not_ready("PodFailed");
        conditions.as_array_mut().expect("a list").push(json!({
            "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
            "message": "Pod was terminated in response to imminent node shutdown.",
            "lastTransitionTime": now,
        }));
        let status = json!({
            "phase": "Failed", "reason": SHUTDOWN_KILLED_REASON,
            "message": "Pod was terminated in response to imminent node shutdown.",
            "conditions": conditions, "containerStatuses": container(143, "Error"),
        });
        let written = self.write_pod_status(pod, status).await;
        let (me, node, target) = (self.clone(), node.clone(), target.to_string());
        let window = self.opts.graceful_shutdown.unwrap_or_default();
        self.spawn(async move {
            tokio::time::sleep(window).await;
            let current = node.state.lock().unwrap().version.clone();
            me.set_node(&node, |st| {
                st.shutting_down = false;
                st.down = true;
            })
            .await;
            tokio::time::sleep(me.opts.reboot).await;
            let booted = me.opts.driver.as_ref().map(|d| d.reboot(&node.name));
            me.finish_reboot(&node, &current, &target, booted).await;
        });
        written
    }

    /// Writes `status` as the pod's status; returns it as the API server stored it.
    async fn write_pod_status(&self, pod: &Pod, status: Value) -> Option<PodStatus> {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        match api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
        {
            Ok(p) => p.status,
            Err(e) => {
                tracing::warn!(pod = %pod.name_any(), error = %e, "pod status not written");
                None
            }
        }
    }

    /// While `node` has its crash-loop fault, restarts every pod on it each
    /// [`CRASH_INTERVAL`]; ends when a new upgrade heals the node.
    async fn run_crashloop(self: Arc<Self>, node: Arc<SimNode>) {
        let mut tick = tokio::time::interval(CRASH_INTERVAL);
        loop {
            tick.tick().await;
            if !node.state.lock().unwrap().crashloop {
                return;
            }
            let pods: Vec<Arc<Pod>> = self
                .pods
                .state()
                .into_iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                            == Some(node.name.as_str())
                })
                .collect();
            for pod in pods {
                if let Some(uid) = pod.uid() {
                    *self.crash_restarts.lock().unwrap().entry(uid).or_default() += 1;
                }
                self.crash_pod(&pod).await;
            }
        }
    }

    /// Writes `pod`'s status as crash-looping: Running but not Ready, every
    /// container waiting in `CrashLoopBackOff` after exiting 1.
    async fn crash_pod(&self, pod: &Pod) {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let restarts = pod
            .uid()
            .and_then(|uid| self.crash_restarts.lock().unwrap().get(&uid).copied())
            .unwrap_or(0);
        let now = now_rfc3339();
        let spec = pod.spec.clone().unwrap_or_default();
        let containers: Vec<Value> = spec
            .containers
            .iter()
            .map(|c| {
                json!({
                    "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                    "ready": false, "started": false, "restartCount": restarts,
                    "state": { "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": format!("back-off restarting failed container {} in pod {name}", c.name),
                    } },
                    "lastState": { "terminated": {
                        "exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now,
                    } },
                })
            })
            .collect();
        let cond = |t: &str, ok: bool| {
            let mut c = json!({ "type": t, "status": if ok { "True" } else { "False" },
                "lastProbeTime": null, "lastTransitionTime": now });
            if !ok {
                c["reason"] = json!("ContainersNotReady");
            }
            c
        };
        let node = spec.node_name.clone().unwrap_or_default();
        let host_ip = address_for(&node, [10, 0]);
        let status = json!({
            "status": {
                "phase": "Running",
                "conditions": [cond("PodReadyToStartContainers", true), cond("Initialized", true),
                    cond("Ready", false), cond("ContainersReady", false), cond("PodScheduled", true)],
                "hostIP": host_ip, "hostIPs": [{ "ip": host_ip }],
                "startTime": pod.status.as_ref().and_then(|s| s.start_time.clone()).map_or(json!(now), |t| json!(t)),
                "containerStatuses": containers,
            }
        });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => {}
            Err(e) if is_api_error(&e, 404) => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "could not crash pod")
            }
        }
    }

    async fn complete_job(&self, job: &Job, start: &Value, node: &str) {
        let now = now_rfc3339();
        let cond = |t: &str| {
            json!({
                "type": t, "status": "True", "reason": "CompletionsReached",
                "message": format!("node {node} reports the target version"),
                "lastProbeTime": now, "lastTransitionTime": now,
            })
        };
        let status = json!({ "status": {
            "startTime": start,
            "active": 0, "succeeded": 1, "completionTime": now,
            "conditions": [cond("SuccessCriteriaMet"), cond("Complete")],
        }});
        if self.patch_job_status(job, status).await {
            self.emit(SimEvent::JobCompleted {
                namespace: job.namespace().unwrap_or_default(),
                job: job.name_any(),
            });
        }
    }

    async fn fail_job(&self, job: &Job, start: &Value, reason: &str, message: &str, failed: i32) {
        let now = now_rfc3339();
        let cond = |t: &str| {
            json!({
                "type": t, "status": "True", "reason": reason, "message": message,
                "lastProbeTime": now, "lastTransitionTime": now,
            })
        };
        let status = json!({ "status": {
            "startTime": start,
            "active": 0, "failed": failed,
            "conditions": [cond("FailureTarget"), cond("Failed")],
        }});
        if self.patch_job_status(job, status).await {
            self.emit(SimEvent::JobFailed {
                namespace: job.namespace().unwrap_or_default(),
                job: job.name_any(),
                reason: reason.to_string(),
            });
        }
    }

    async fn patch_job_status(&self, job: &Job, status: Value) -> bool {
        let api: Api<Job> =
            Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default());
        match api
            .patch_status(
                &job.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(job = %job.name_any(), error = %e, "job status not written");
                false
            }
        }
    }

    // ---- disruption controller -----------------------------------------

    async fn run_pdbs(self: Arc<Self>) {
        let api: Api<PodDisruptionBudget> = match &self.opts.pdb_namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let (pdbs, writer) = reflector::store::<PodDisruptionBudget>();
        let stream = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        let mut stream = std::pin::pin!(stream);
        if self.pods.wait_until_ready().await.is_err() {
            return;
        }
        let mut pdbs_ready = false;
        let mut recheck: Option<Instant> = None;
        // uid -> resourceVersion our last write was based on; its echo is still due.
        let mut written: HashMap<String, String> = HashMap::new();
        loop {
            let wake = async {
                match recheck {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(watcher::Event::InitDone)) => pdbs_ready = true,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::warn!(error = %e, "pdb watch"),
                    None => return,
                },
                _ = self.pdb_dirty.notified() => {}
                _ = wake => {}
            }
            if !pdbs_ready {
                continue;
            }
            recheck = None;
            let pods = self.pods.state();
            for pdb in pdbs.state() {
                let (uid, rv) = (pdb.uid().unwrap_or_default(), pdb.resource_version());
                if rv.is_some() && written.get(&uid) == rv.as_ref() {
                    continue;
                }
                let now = chrono::Utc::now();
                let (status, next) = disruption_status(&pdb, &pods, now);
                if let Some(next) = next {
                    let at = Instant::now() + (next - now).to_std().unwrap_or_default();
                    recheck = Some(recheck.map_or(at, |r| r.min(at)));
                }
                if !status_differs(pdb.status.as_ref(), &status) {
                    continue;
                }
                let mut updated = (*pdb).clone();
                updated.status = Some(status);
                match api
                    .replace_status(&pdb.name_any(), &PostParams::default(), &updated)
                    .await
                {
                    Ok(_) => {
                        if let Some(rv) = rv {
                            written.insert(uid, rv);
                        }
                    }
                    // Someone (an eviction) wrote first; its watch event brings us back.
                    Err(e) if is_api_error(&e, 409) => {}
                    Err(e) if is_api_error(&e, 404) => {}
                    Err(e) => {
                        tracing::warn!(pdb = %pdb.name_any(), error = %e, "pdb status not written");
                        let at = Instant::now() + Duration::from_secs(1);
                        recheck = Some(recheck.map_or(at, |r| r.min(at)));
                    }
                }
            }
        }
    }
}

/// What the Job controller does with a failed pod (`matchPodFailurePolicy`,
/// pkg/controller/job/pod_failure_policy.go).
#[derive(Debug, PartialEq)]
enum FailureAction {
    Ignore,
    Count,
    FailJob(String),
}

/// The first rule of `policy` that matches the failed pod decides; no
/// policy, or no rule matching, counts the failure.
fn pod_failure_action(
    policy: Option<&PodFailurePolicy>,
    status: &PodStatus,
    pod: &Pod,
) -> FailureAction {
    let Some(policy) = policy else {
        return FailureAction::Count;
    };
    let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    for (index, rule) in policy.rules.iter().enumerate() {
        let matched = if let Some(req) = &rule.on_exit_codes {
            // Terminated containers with a non-zero exit code only.
            status
                .container_statuses
                .iter()
                .flatten()
                .chain(status.init_container_statuses.iter().flatten())
                .filter(|c| req.container_name.as_ref().is_none_or(|n| *n == c.name))
                .filter_map(|c| Some((c.name.clone(), c.state.as_ref()?.terminated.as_ref()?.exit_code)))
                .find(|(_, code)| {
                    *code != 0
                        && match req.operator.as_str() {
                            "In" => req.values.contains(code),
                            "NotIn" => !req.values.contains(code),
                            _ => false,
                        }
                })
                .map(|(c, code)| {
                    format!(
                        "Container {c} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                        rule.action
                    )
                })
        } else if let Some(patterns) = &rule.on_pod_conditions {
            status
                .conditions
                .iter()
                .flatten()
                .find(|c| {
                    patterns.iter().any(|p| {
                        p.type_ == c.type_ && p.status.as_deref().unwrap_or("True") == c.status
                    })
                })
                .map(|c| {
                    format!(
                        "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                        c.type_, rule.action
                    )
                })
        } else {
            None
        };
        if let Some(message) = matched {
            return match rule.action.as_str() {
                "Ignore" => FailureAction::Ignore,
                "FailJob" => FailureAction::FailJob(message),
                _ => FailureAction::Count,
            };
        }
    }
    FailureAction::Count
}

fn job_start_time(job: &Job) -> Value {
    match job.status.as_ref().and_then(|s| s.start_time.as_ref()) {
        Some(t) => serde_json::to_value(t).unwrap_or(Value::Null),
        // The copy in hand may predate the start patch: derive the same value every time.
        None => match job.metadata.creation_timestamp.as_ref() {
            Some(t) => serde_json::to_value(t).unwrap_or(Value::Null),
            None => Value::String(now_rfc3339()),
        },
    }
}

fn scaled(value: &IntOrString, total: i32) -> i32 {
    match value {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => {
            let pct: i64 = s.trim_end_matches('%').trim().parse().unwrap_or(0);
            ((pct * total as i64 + 99) / 100) as i32
        }
    }
}

fn time_to_chrono(t: &Time) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

/// The status the disruption controller would write for `pdb` given all `pods`,
/// and when it must be recomputed because a `disruptedPods` entry expires.
pub fn disruption_status(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    now: chrono::DateTime<chrono::Utc>,
) -> (
    PodDisruptionBudgetStatus,
    Option<chrono::DateTime<chrono::Utc>>,
) {
    let ns = pdb.namespace();
    let spec = pdb.spec.clone().unwrap_or_default();
    // policy/v1: a missing selector selects nothing, an empty one everything.
    let selector: Option<Selector> = spec.selector.clone().and_then(|s| s.try_into().ok());
    let matching: Vec<&Arc<Pod>> = match &selector {
        None => vec![],
        Some(sel) => pods
            .iter()
            .filter(|p| p.namespace() == ns && sel.matches(p.labels()))
            .collect(),
    };
    let expected = matching.len() as i32;
    let desired = if let Some(max) = &spec.max_unavailable {
        (expected - scaled(max, expected)).max(0)
    } else if let Some(min) = &spec.min_available {
        scaled(min, expected)
    } else {
        0
    };

    let old = pdb.status.clone().unwrap_or_default();
    let old_disrupted = old.disrupted_pods.clone().unwrap_or_default();
    let mut disrupted = BTreeMap::new();
    let mut next: Option<chrono::DateTime<chrono::Utc>> = None;
    let mut healthy = 0;
    for pod in &matching {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(at) = old_disrupted.get(&pod.name_any()) {
            let expires =
                time_to_chrono(at) + chrono::Duration::from_std(DISRUPTED_POD_TIMEOUT).unwrap();
            if expires > now {
                disrupted.insert(pod.name_any(), at.clone());
                next = Some(next.map_or(expires, |n| n.min(expires)));
                continue;
            }
        }
        if pod_ready(pod) {
            healthy += 1;
        }
    }
    let allowed = if expected <= 0 {
        0
    } else {
        (healthy - desired).max(0)
    };
    let generation = pdb.metadata.generation.unwrap_or(0);

    let (cond_status, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let previous = old
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionAllowed");
    let transition = match previous {
        Some(c) if c.status == cond_status => c.last_transition_time.clone(),
        _ => Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let mut conditions: Vec<Condition> = old
        .conditions
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != "DisruptionAllowed")
        .collect();
    conditions.push(Condition {
        type_: "DisruptionAllowed".into(),
        status: cond_status.into(),
        reason: reason.into(),
        message: String::new(),
        observed_generation: Some(generation),
        last_transition_time: transition,
    });

    let status = PodDisruptionBudgetStatus {
        current_healthy: Some(healthy),
        desired_healthy: Some(desired),
        expected_pods: Some(expected),
        disruptions_allowed: Some(allowed),
        disrupted_pods: if disrupted.is_empty() {
            None
        } else {
            Some(disrupted)
        },
        observed_generation: Some(generation),
        conditions: Some(conditions),
    };
    (status, next)
}

fn status_differs(
    old: Option<&PodDisruptionBudgetStatus>,
    new: &PodDisruptionBudgetStatus,
) -> bool {
    let Some(old) = old else { return true };
    let secs = |m: &Option<BTreeMap<String, Time>>| -> BTreeMap<String, i64> {
        m.iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.as_second()))
            .collect()
    };
    let cond = |s: &PodDisruptionBudgetStatus| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionAllowed")
            .map(|c| (c.status.clone(), c.observed_generation))
    };
    old.current_healthy.unwrap_or(0) != new.current_healthy.unwrap_or(0)
        || old.desired_healthy.unwrap_or(0) != new.desired_healthy.unwrap_or(0)
        || old.expected_pods.unwrap_or(0) != new.expected_pods.unwrap_or(0)
        || old.disruptions_allowed.unwrap_or(0) != new.disruptions_allowed.unwrap_or(0)
        || old.observed_generation != new.observed_generation
        || secs(&old.disrupted_pods) != secs(&new.disrupted_pods)
        || cond(old) != cond(new)
}

/// An upgrade Job for `node` to `version` as the contract describes (module docs);
/// what drover's Kubernetes backend creates, minus its real driver's image and command.
pub fn upgrade_job(name: &str, node: &str, version: &str) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY_VALUE,
                NODE_LABEL: node,
                TARGET_VERSION_LABEL: version,
            },
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": { "labels": { MANAGED_BY_LABEL: MANAGED_BY_VALUE, NODE_LABEL: node } },
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "update",
                        "image": "registry.example/drover-os-update:1",
                        "env": [{ "name": "DROVER_TARGET_VERSION", "value": version }],
                    }],
                },
            },
        },
    }))
    .expect("a valid Job")
}
