//! The real kube-apiserver: one control plane per test binary, a client and
//! a namespace per test, waits driven by watches, and manifests for what the
//! tests create (the simulated kubelet is [`super::kubelet`]). See `tests/README.md`.

use std::fmt::Debug;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, Scope};
use kube::runtime::wait::await_condition;
use kube::{Client, Config, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::kubelet::KubeletOptions;

/// Upper bound for every wait on the cluster; generous because the machine is shared.
pub const WAIT: Duration = Duration::from_secs(60);

/// Environment variable naming the directory holding the harness's `start` and `stop`.
pub const HARNESS_ENV: &str = "DROVER_CONTROLPLANE_DIR";

/// Environment variable that, set to 1, keeps the control plane's state directory after the run.
pub const KEEP_ENV: &str = "DROVER_KEEP_CONTROLPLANE";

/// The audit policy of the tests' control plane: every write, and every
/// call on a Lease, at Metadata level; not the reads, the API server's own
/// traffic, nor the simulated kubelets' heartbeats (node and pod status,
/// node Leases), which would make the log large and tell nothing.
const AUDIT_WRITES: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  users: ["system:apiserver"]
- level: None
  namespaces: ["kube-node-lease"]
- level: Metadata
  resources:
  - group: "coordination.k8s.io"
    resources: ["leases"]
- level: None
  verbs: ["get", "list", "watch"]
- level: None
  resources:
  - group: ""
    resources: ["nodes/status", "pods/status"]
  - group: "batch"
    resources: ["jobs/status"]
  - group: "policy"
    resources: ["poddisruptionbudgets/status"]
- level: Metadata
"#;

/// One request as the API server's audit log recorded it.
#[derive(Debug, Clone)]
pub struct Audited {
    /// The client's User-Agent.
    pub user_agent: String,
    /// `create`, `update`, `patch`, `delete`, `get`, ...
    pub verb: String,
    /// The resource, with `/subresource` when there is one (`pods/eviction`).
    pub resource: String,
    /// The object's namespace and name, as far as the request named them.
    pub namespace: String,
    pub name: String,
    /// When the API server received it.
    pub received: chrono::DateTime<chrono::Utc>,
    /// The answer's HTTP status.
    pub code: u16,
}

impl Audited {
    /// Whether it changed or tried to change something.
    pub fn is_write(&self) -> bool {
        !matches!(self.verb.as_str(), "get" | "list" | "watch")
    }
}

/// The control plane shared by every test in this binary.
pub struct ControlPlane {
    dir: PathBuf,
    // Its stdin is the pipe whose closing (this process exiting) stops the control plane.
    _watchdog: Mutex<Child>,
}

static CONTROL_PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// Directory holding the harness scripts `start` and `stop`.
pub fn harness_dir() -> PathBuf {
    match std::env::var_os(HARNESS_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/controlplane"),
    }
}

impl ControlPlane {
    /// The binary's control plane, started by the first caller; panics if it cannot start.
    pub fn get() -> &'static ControlPlane {
        // Blocks other tests' threads until it is up; a failure is reported to every test.
        let cp = CONTROL_PLANE.get_or_init(|| ControlPlane::start().map_err(|e| format!("{e:#}")));
        match cp {
            Ok(cp) => cp,
            Err(e) => panic!("control plane did not start: {e}"),
        }
    }

    /// A control plane of the caller's own, stopped when it is dropped (or
    /// when the test binary exits): for a test that must start from an
    /// empty cluster or owns cluster-wide names, such as docs/install.md's
    /// steps. Costs a start (~10 s); prefer [`ControlPlane::get`].
    pub fn start_own() -> anyhow::Result<ControlPlane> {
        ControlPlane::start()
    }

    fn start() -> anyhow::Result<ControlPlane> {
        let harness = harness_dir();
        let (start, stop) = (harness.join("start"), harness.join("stop"));
        for script in [&start, &stop] {
            if !script.is_file() {
                bail!(
                    "{} not found (set {HARNESS_ENV} to the directory holding start/stop)",
                    script.display()
                );
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("drover-cp-")
            .tempdir()
            .context("creating the control plane directory")?
            .keep();
        // Started first so that a half-started control plane is stopped too. It ignores
        // SIGINT/SIGHUP so that ^C on the test run still reaches the stop script.
        let keep = std::env::var(KEEP_ENV).is_ok_and(|v| v == "1");
        let script = format!(
            r#"trap '' INT HUP; cat >/dev/null; "$0" "$1" {} >/dev/null 2>&1"#,
            if keep { "" } else { "--purge" }
        );
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(&stop)
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning the control plane watchdog")?;
        // A file, not a pipe: the servers it leaves running would hold a pipe open forever.
        let log_path = dir.join("start.log");
        let log = File::create(&log_path)?;
        // --watch-pid: a second way down should the watchdog itself be killed.
        let mut cmd = Command::new(&start);
        cmd.arg(&dir)
            .arg("--watch-pid")
            .arg(std::process::id().to_string());
        // An audit log of the writes (see `audited`); CONTROLPLANE_AUDIT=1
        // (benches counting reads) keeps the harness's log-everything policy.
        let mut apiserver = Vec::new();
        if std::env::var("CONTROLPLANE_AUDIT").as_deref() != Ok("1") {
            let policy = dir.join("audit-writes.yaml");
            std::fs::write(&policy, AUDIT_WRITES)?;
            cmd.arg("--audit");
            apiserver.push(format!("--audit-policy-file={}", policy.display()));
        }
        // A node's own credential is limited as in a real cluster: the Node
        // authorizer (on by default here) and NodeRestriction admission.
        apiserver.push("--enable-admission-plugins=NodeRestriction".to_string());
        cmd.arg("--").args(&apiserver);
        let status = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .with_context(|| format!("running {}", start.display()))?;
        let cp = ControlPlane {
            dir,
            _watchdog: Mutex::new(watchdog),
        };
        if !status.success() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "{} {} failed ({status}):\n{log}",
                start.display(),
                cp.dir.display()
            );
        }
        for kc in [cp.kubeconfig_path(), cp.restricted_kubeconfig_path()] {
            if !kc.is_file() {
                bail!("{} did not write {}", start.display(), kc.display());
            }
        }
        Ok(cp)
    }

    /// The control plane's state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every request in the audit log (writes, and every call on a Lease;
    /// see [`AUDIT_WRITES`]) up to now: a marker request made through
    /// `client` is awaited in the log first, so everything answered before
    /// this call is in.
    pub async fn audited(&self, client: &Client) -> Vec<Audited> {
        let marker = format!("audit-marker-{:08x}", rand::random::<u32>());
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client.clone(), "default");
        let _ = leases.get_opt(&marker).await;
        let path = self.dir.join("audit.log");
        let text = retry_until("the audit log shows the marker request", || async {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.contains(&marker) {
                Ok(text)
            } else {
                Err("not yet")
            }
        })
        .await;
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            // A watch is logged when it opens (`ResponseStarted`, with the
            // harness's log-everything policy) and again when it closes:
            // counted once, when it opened, so a watch still open counts.
            .filter(|e| match e["verb"].as_str() {
                Some("watch") => e["stage"] == "ResponseStarted",
                _ => e["stage"] == "ResponseComplete",
            })
            .filter_map(|e| {
                let o = &e["objectRef"];
                let sub = o["subresource"].as_str();
                Some(Audited {
                    user_agent: e["userAgent"].as_str().unwrap_or("").to_string(),
                    verb: e["verb"].as_str()?.to_string(),
                    resource: match sub {
                        Some(sub) => format!("{}/{sub}", o["resource"].as_str().unwrap_or("")),
                        None => o["resource"].as_str().unwrap_or("").to_string(),
                    },
                    namespace: o["namespace"].as_str().unwrap_or("").to_string(),
                    name: o["name"].as_str().unwrap_or("").to_string(),
                    received: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                    code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                })
            })
            .collect()
    }

    /// Admin kubeconfig (group system:masters).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// Kubeconfig of user `drover-restricted`, which has no RBAC grants of its own.
    pub fn restricted_kubeconfig_path(&self) -> PathBuf {
        self.dir.join("restricted.kubeconfig")
    }

    /// A new admin client, bound to the calling test's runtime.
    pub async fn admin_client(&self) -> Client {
        init_tracing();
        client_from(&self.kubeconfig_path())
            .await
            .expect("admin client")
    }

    /// An admin client without kube's 429 retry layer, which otherwise hides a
    /// refused eviction for minutes (drover's own client turns it off too).
    /// Other clients keep it: a new CRD's storage answers 429 while it starts.
    pub async fn admin_client_without_retry(&self) -> Client {
        let kc = Kubeconfig::read_from(self.kubeconfig_path()).expect("admin kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("admin config");
        config.default_retry = false;
        Client::try_from(config).expect("admin client")
    }

    /// A new client for `drover-restricted`, bound to the calling test's runtime.
    pub async fn restricted_client(&self) -> Client {
        client_from(&self.restricted_kubeconfig_path())
            .await
            .expect("restricted client")
    }
}

/// Shows the simulator's warnings in test output; `DROVER_TEST_LOG` (e.g.
/// `drover=debug`, to see what the backend does) or `RUST_LOG` sets the filter.
pub fn init_tracing() {
    let filter = std::env::var("DROVER_TEST_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .or_else(|| tracing_subscriber::EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| "warn".into());
    // Every test calls this; only the first one installs it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// An admin client and a namespace of the test's own, drover's node
/// record CRD installed.
pub async fn setup(prefix: &str) -> (Client, TestNamespace) {
    let client = ControlPlane::get().admin_client().await;
    super::backend::install_record_crd(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    (client, ns)
}

/// The user name in `restricted.kubeconfig`.
pub const RESTRICTED_USER: &str = "drover-restricted";

/// A client from a kubeconfig file.
pub async fn client_from(path: &Path) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A namespace of its own for one test; deleted (best-effort) when dropped.
pub struct TestNamespace {
    name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// Creates `{prefix}-{random}`.
    pub async fn create(client: &Client, prefix: &str) -> TestNamespace {
        let suffix: String = (0..6)
            .map(|_| (b'a' + rand::random_range(0..26u8)) as char)
            .collect();
        let mut prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        prefix.truncate(40);
        let name = format!("{}-{suffix}", prefix.trim_matches('-'));
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": name, "labels": { "drover.dev/test": "true" } },
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        TestNamespace {
            name,
            kubeconfig: ControlPlane::get().kubeconfig_path(),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Drop can't await, and the test's runtime may be unwinding: use a runtime of our own.
        // Without kube-controller-manager the namespace stays Terminating, which is fine.
        let (name, kubeconfig) = (self.name.clone(), self.kubeconfig.clone());
        let deleted = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let client = client_from(&kubeconfig).await.ok()?;
                Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::default())
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(deleted, Ok(Some(_))) {
            eprintln!("warning: namespace {} not deleted", self.name);
        }
    }
}

/// Simulator options for one test: nodes named `{ns}-node-N`, its PDB controller limited
/// to `ns`, and short simulated times.
pub fn sim_options(ns: &str) -> KubeletOptions {
    KubeletOptions {
        name_prefix: format!("{ns}-node-"),
        nodes: 1,
        version: "1.12.0".into(),
        reboot: Duration::from_secs(2),
        grace_cap: Some(Duration::from_secs(5)),
        lease_interval: Duration::from_secs(2),
        status_interval: Duration::from_secs(10),
        pdb_namespace: Some(ns.to_string()),
        ..KubeletOptions::default()
    }
}

/// Waits, through a watch, until `name` exists and satisfies `cond`; panics after [`WAIT`]
/// showing the object as it last was.
pub async fn await_object<K>(api: &Api<K>, name: &str, what: &str, cond: impl Fn(&K) -> bool) -> K
where
    K: Resource + Clone + Debug + Send + DeserializeOwned + Serialize + 'static,
{
    let waited = tokio::time::timeout(
        WAIT,
        await_condition(api.clone(), name, move |o: Option<&K>| o.is_some_and(&cond)),
    )
    .await;
    match waited {
        Ok(Ok(Some(obj))) => obj,
        Ok(Ok(None)) => unreachable!("the condition requires the object"),
        Ok(Err(e)) => panic!("watching {name} for {what}: {e}"),
        Err(_) => {
            let last = api.get_opt(name).await;
            let last = match last {
                Ok(Some(o)) => serde_json::to_string_pretty(&o).unwrap_or_default(),
                other => format!("{other:?}"),
            };
            panic!("timed out after {WAIT:?} waiting for {name}: {what}; it is now:\n{last}")
        }
    }
}

/// Waits, through a watch, until `name` does not exist.
pub async fn await_gone<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + Debug + Send + DeserializeOwned + 'static,
{
    let waited = tokio::time::timeout(
        WAIT,
        await_condition(api.clone(), name, |o: Option<&K>| o.is_none()),
    )
    .await;
    match waited {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => panic!("watching {name} until gone: {e}"),
        Err(_) => panic!("timed out after {WAIT:?} waiting for {name} to be deleted"),
    }
}

/// Waits until node `name` satisfies `cond`.
pub async fn await_node(
    client: &Client,
    name: &str,
    what: &str,
    cond: impl Fn(&Node) -> bool,
) -> Node {
    await_object(&Api::all(client.clone()), name, what, cond).await
}

/// Waits until pod `ns/name` satisfies `cond`.
pub async fn await_pod(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    cond: impl Fn(&Pod) -> bool,
) -> Pod {
    await_object(&Api::namespaced(client.clone(), ns), name, what, cond).await
}

/// Waits until Job `ns/name` satisfies `cond`.
pub async fn await_job(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    cond: impl Fn(&Job) -> bool,
) -> Job {
    await_object(&Api::namespaced(client.clone(), ns), name, what, cond).await
}

/// Creates `obj` through `api`; a refusal fails the test with the API's answer.
pub async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    api.create(&PostParams::default(), obj)
        .await
        .unwrap_or_else(|e| panic!("create {:?}: {e}", obj.meta().name))
}

/// Waits until PDB `ns/name` satisfies `cond`.
pub async fn await_pdb(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    cond: impl Fn(&PodDisruptionBudget) -> bool,
) -> PodDisruptionBudget {
    await_object(&Api::namespaced(client.clone(), ns), name, what, cond).await
}

/// Retries `f` with backoff until it returns `Ok`, for the few changes no watch can show
/// (RBAC grants reach the API server's authorizer through its own informer cache).
pub async fn retry_until<T, E: Debug, Fut>(what: &str, mut f: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut delay = Duration::from_millis(20);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if tokio::time::Instant::now() + delay > deadline => {
                panic!("timed out after {WAIT:?}: {what}; last error: {e:?}")
            }
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// The status of a node's `Ready` condition ("True", "False", "Unknown"), if any.
pub fn node_ready(node: &Node) -> Option<&str> {
    node_condition(node, "Ready").map(|c| c.status.as_str())
}

/// A node's condition of type `type_`.
pub fn node_condition<'a>(
    node: &'a Node,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// A node's `status.nodeInfo.osImage` ("" if unset).
pub fn os_image(node: &Node) -> &str {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map_or("", |i| i.os_image.as_str())
}

/// Whether a Job has condition `type_` True (`"Complete"`, `"Failed"`, ...).
pub fn job_condition(job: &Job, type_: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Whether a pod is Running with its Ready condition True.
/// A Running pod on `node` in a namespace then deleted: the API server
/// refuses its eviction (403, NamespaceTerminating), as `kubectl drain`
/// sees when a team deletes its namespace mid-drain. Keep the namespace
/// returned for as long as the pod must stay.
pub async fn pod_in_a_terminating_namespace(
    client: &Client,
    prefix: &str,
    node: &str,
) -> TestNamespace {
    let doomed = TestNamespace::create(client, prefix).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), doomed.name());
    create(&pods, &pod_on("stuck", node, &[("app", "stuck")], 1)).await;
    await_pod(
        client,
        doomed.name(),
        "stuck",
        "Running and Ready",
        pod_running_ready,
    )
    .await;
    Api::<Namespace>::all(client.clone())
        .delete(doomed.name(), &DeleteParams::default())
        .await
        .unwrap();
    doomed
}

/// A Running pod `web-0` on `node` in `ns` under a PodDisruptionBudget
/// that allows no disruption: a drain of `node` is held open until the
/// budget changes.
pub async fn pod_held_by_a_pdb(client: &Client, ns: &str, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create(&pods, &pod_on("web-0", node, &[("app", "web")], 1)).await;
    await_pod(client, ns, "web-0", "Running and Ready", pod_running_ready).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    create(
        &pdbs,
        &pdb_min_available("web", "web", serde_json::json!(1)),
    )
    .await;
    await_pdb(client, ns, "web", "0 allowed", |p| {
        pdb_settled(p, |s| {
            s.current_healthy == Some(1) && s.disruptions_allowed == Some(0)
        })
    })
    .await;
}

pub fn pod_running_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A minimal pod bound to `node` (no scheduler runs), with `labels` and a termination grace period.
pub fn pod_on(name: &str, node: &str, labels: &[(&str, &str)], grace_secs: i64) -> Pod {
    let labels: std::collections::BTreeMap<_, _> = labels.iter().copied().collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": labels },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace_secs,
            "containers": [{ "name": "app", "image": "registry.example/app:1" }],
        },
    }))
    .unwrap()
}

/// The controller reference of an `apps/v1` workload (`kind` `name`, its
/// `uid`), as its controller sets it on what it owns.
pub fn controller_ref(
    kind: &str,
    name: &str,
    uid: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        ..Default::default()
    }
}

/// A pod of a DaemonSet on `node` (drains leave it there, so it lives
/// through the upgrade, as node agents and log shippers do).
pub fn daemon_pod(name: &str, node: &str) -> Pod {
    let mut pod = pod_on(name, node, &[("app", "node-agent")], 1);
    pod.metadata.owner_references = Some(vec![controller_ref(
        "DaemonSet",
        "node-agent",
        "00000000-0000-0000-0000-000000000001",
    )]);
    pod
}

/// A [`daemon_pod`] `node-agent-<i>` on each of `nodes` in `ns`, each
/// awaited Running and Ready.
pub async fn daemon_pods_on(client: &Client, ns: &str, nodes: &[String]) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for (i, node) in nodes.iter().enumerate() {
        let name = format!("node-agent-{i}");
        create(&pods, &daemon_pod(&name, node)).await;
        await_pod(client, ns, &name, "Running and Ready", pod_running_ready).await;
    }
}

/// A PDB selecting `app=<app>` with `minAvailable` (an integer or a percentage).
pub fn pdb_min_available(
    name: &str,
    app: &str,
    min_available: serde_json::Value,
) -> PodDisruptionBudget {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": { "name": name },
        "spec": { "minAvailable": min_available, "selector": { "matchLabels": { "app": app } } },
    }))
    .unwrap()
}

/// Whether a PDB's status is current (observedGeneration caught up) and satisfies `f`.
pub fn pdb_settled(
    pdb: &PodDisruptionBudget,
    f: impl Fn(&k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus) -> bool,
) -> bool {
    match pdb.status.as_ref() {
        Some(s) => {
            s.observed_generation.is_some()
                && s.observed_generation == pdb.metadata.generation
                && f(s)
        }
        None => false,
    }
}

/// Server-side apply (field manager `drover-install`, forced) every document
/// of `deploy/FILE`, in order, as an installer applies the manifests as they
/// ship; an object without a namespace goes to `default_ns`. Returns
/// `Kind/name` of each object applied.
pub async fn apply_deploy_file(client: &Client, file: &str, default_ns: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    apply_yaml(client, &text, default_ns, false)
        .await
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Server-side apply (field manager `drover-install`, forced) every document
/// of the multi-document YAML `text`, in order; an object without a
/// namespace goes to `default_ns`. `dry_run`: the API server validates and
/// admits each object (schema, unknown fields, admission) and stores none.
/// Returns `Kind/name` of each object, or the first refusal.
pub async fn apply_yaml(
    client: &Client,
    text: &str,
    default_ns: &str,
    dry_run: bool,
) -> Result<Vec<String>, String> {
    let mut applied = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value: serde_json::Value =
            serde::Deserialize::deserialize(doc).map_err(|e| e.to_string())?;
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(value).map_err(|e| e.to_string())?;
        let tm = obj
            .types
            .clone()
            .ok_or("an object without apiVersion/kind")?;
        let (group, version) = match tm.api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), tm.api_version.clone()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, &tm.kind);
        let (ar, caps) = pinned_kind(client, &gvk)
            .await
            .map_err(|e| format!("{}: {e}", tm.kind))?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or(default_ns),
                &ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let name = obj.metadata.name.clone().unwrap_or_default();
        let mut pp = PatchParams::apply("drover-install").force();
        pp.dry_run = dry_run;
        api.patch(&name, &pp, &Patch::Apply(&obj))
            .await
            .map_err(|e| format!("server-side apply of {} {name}: {e}", tm.kind))?;
        applied.push(format!("{}/{name}", tm.kind));
    }
    Ok(applied)
}

/// Whether the node is cordoned (`spec.unschedulable`), by whoever.
pub fn unschedulable(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The Events in `ns` about the object named `name`.
pub async fn events_for(client: &Client, ns: &str, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// The HTTP status code of a failed API call, if it was an API error.
pub fn api_code<T: Debug>(result: &Result<T, kube::Error>) -> Option<u16> {
    match result {
        Err(kube::Error::Api(s)) => Some(s.code),
        _ => None,
    }
}
