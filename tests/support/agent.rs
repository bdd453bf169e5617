//! For the agent tests: a signed config repository served
//! by `git daemon` on loopback, the CRD, agents run each on a runtime of
//! their own (so that killing one kills all its tasks, as a crash would),
//! and waits driven by the agents' passes or by watches.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use drover::agent::crd::{self, DroverStatus};
use drover::agent::{
    Agent, AgentConfig, AgentHandle, ClusterBackend, Connected, KubeBackend, SharedClock,
};
use drover::source::trigger::WebhookConfig;
use drover::status::StatusReport;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::backend::install_crd_of;
use super::git::{allowed_signers, commit_all, git, keygen, GitDaemon};
use super::kube::{await_object, retry_until, ControlPlane, WAIT};

/// Token the test webhooks send.
pub const WEBHOOK_TOKEN: &str = "test-token";

/// One environment of the test config repository.
#[derive(Clone, Debug)]
pub struct EnvSpec {
    /// Environment name.
    pub env: String,
    /// Its one cluster.
    pub cluster: String,
    /// Pinned version.
    pub version: String,
    /// Cron line of the window.
    pub schedule: String,
    /// Node selector (the test pool's label).
    pub selector: String,
    /// `[promotion] soak`.
    pub soak: String,
}

impl EnvSpec {
    /// Environment `test`, cluster `test-1`, at 1.12.0 with a window on the
    /// 1st at 02:00 and no soak, on the simulated pool of namespace `ns`
    /// (`support::backend::POOL_LABEL`): the world most agent tests start from.
    pub fn test_pool(ns: &str) -> EnvSpec {
        EnvSpec {
            env: "test".into(),
            cluster: "test-1".into(),
            version: "1.12.0".into(),
            schedule: "0 2 1 * *".into(),
            selector: format!("{}={ns}", super::backend::POOL_LABEL),
            soak: "0s".into(),
        }
    }
}

/// A config repository: a work tree, and its bare copy served by `git daemon`.
pub struct ConfigRepo {
    pub dir: tempfile::TempDir,
    pub work: PathBuf,
    pub bare: PathBuf,
    pub key: PathBuf,
    pub signers: PathBuf,
    pub daemon: GitDaemon,
    /// Each cluster's report signing key (listed in agents.allowed_signers as `<env>/<cluster>`).
    pub report_keys: std::collections::BTreeMap<String, PathBuf>,
    envs: Vec<EnvSpec>,
    /// `[rollout] max_unavailable` written from the next commit on (default 1).
    max_unavailable: std::cell::Cell<u32>,
    /// `[driver] prestage` written from the next commit on (default: none,
    /// the config's `"0s"`).
    prestage: std::cell::RefCell<Option<String>>,
    drain: std::cell::RefCell<String>,
}

impl ConfigRepo {
    /// A repository with `envs` in this chain order, every commit signed by an allowed key.
    pub fn new(envs: &[EnvSpec]) -> ConfigRepo {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let served = dir.path().join("served");
        std::fs::create_dir_all(work.join("environments")).unwrap();
        std::fs::create_dir_all(&served).unwrap();
        let key = keygen(dir.path(), "reviewer");
        let signers = dir.path().join("allowed_signers");
        allowed_signers(&signers, &[("reviewer@example.com", &key)]);
        git(&work, &["init", "-q", "-b", "main"]);
        let chain: Vec<String> = envs.iter().map(|e| format!("\"{}\"", e.env)).collect();
        let clusters: String = envs
            .iter()
            .map(|e| format!("{} = [\"{}\"]\n", e.env, e.cluster))
            .collect();
        std::fs::write(
            work.join("drover.toml"),
            format!(
                "[promotion]\nchain = [{}]\nevidence = \"status\"\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\n{clusters}",
                chain.join(", ")
            ),
        )
        .unwrap();
        // Every cluster's agent signs its reports with a key of its own.
        let mut report_keys = std::collections::BTreeMap::new();
        for e in envs {
            report_keys.insert(
                e.cluster.clone(),
                keygen(dir.path(), &format!("report-{}", e.cluster)),
            );
        }
        let principals: Vec<(String, &std::path::Path)> = envs
            .iter()
            .map(|e| {
                (
                    format!("{}/{}", e.env, e.cluster),
                    report_keys[&e.cluster].as_path(),
                )
            })
            .collect();
        let entries: Vec<(&str, &std::path::Path)> =
            principals.iter().map(|(p, k)| (p.as_str(), *k)).collect();
        allowed_signers(&work.join("agents.allowed_signers"), &entries);
        let repo = ConfigRepo {
            dir,
            work,
            bare: served.join("config.git"),
            key,
            signers,
            daemon: GitDaemon::start(&served),
            report_keys,
            envs: envs.to_vec(),
            max_unavailable: std::cell::Cell::new(1),
            prestage: Default::default(),
            drain: Default::default(),
        };
        for e in envs {
            repo.write_env(e);
        }
        repo.commit("initial configuration", true);
        git(
            &served,
            &["init", "-q", "--bare", "-b", "main", "config.git"],
        );
        repo.push();
        repo
    }

    fn write_env(&self, e: &EnvSpec) {
        let driver = match &*self.prestage.borrow() {
            Some(p) => format!("\n[driver]\nprestage = \"{p}\"\n"),
            None => String::new(),
        };
        std::fs::write(
            self.work.join(format!("environments/{}.toml", e.env)),
            format!(
                "version = \"{}\"\n\n[window]\nschedule = \"{}\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
                 [rollout]\nmax_unavailable = {}\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\nnode_selector = \"{}\"\n\n\
                 [promotion]\nsoak = \"{}\"\n{driver}{}",
                e.version,
                e.schedule,
                self.max_unavailable.get(),
                e.selector,
                e.soak,
                self.drain.borrow()
            ),
        )
        .unwrap();
    }

    /// Add `version` to `[promotion] revoked` (a signed, reviewed change of
    /// the policy alone).
    pub fn revoke(&self, version: &str, reason: &str) -> String {
        let path = self.work.join("drover.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let line = format!("revoked = [{{ version = \"{version}\", reason = \"{reason}\" }}]\n");
        std::fs::write(
            &path,
            text.replacen("[promotion]\n", &format!("[promotion]\n{line}"), 1),
        )
        .unwrap();
        let commit = self.commit(&format!("revoke {version}: {reason}"), true);
        self.push();
        commit
    }

    /// Commit every change of the work tree (signed: a reviewed merge).
    pub fn commit(&self, message: &str, signed: bool) -> String {
        commit_all(&self.work, message, signed.then_some(&*self.key), None)
    }

    /// Push main to the served repository.
    pub fn push(&self) {
        git(
            &self.work,
            &["push", "-q", self.bare.to_str().unwrap(), "main:main"],
        );
    }

    /// Nodes upgraded at once, in the environment files of the next commits.
    pub fn set_max_unavailable(&self, n: u32) {
        self.max_unavailable.set(n);
    }

    /// `[driver] prestage` (a duration, `"2h"`), in the environment files
    /// of the next commits.
    pub fn set_prestage(&self, prestage: &str) {
        *self.prestage.borrow_mut() = Some(prestage.to_string());
    }

    /// `[[drain]]` tables (TOML text), in the environment files of the next commits.
    pub fn set_drain(&self, tables: &str) {
        *self.drain.borrow_mut() = format!("\n{tables}");
    }

    /// Pin `env` to `version` in a commit (signed: a reviewed merge; unsigned: pushed past review) and push it.
    pub fn bump(&self, env: &str, version: &str, signed: bool) -> String {
        let mut e = self.envs.iter().find(|e| e.env == env).unwrap().clone();
        e.version = version.into();
        self.write_env(&e);
        let c = self.commit(&format!("{env}: move to {version}"), signed);
        self.push();
        c
    }

    /// Replace `env`'s file with `text` in a signed (reviewed) commit and push it.
    pub fn set_env_text(&self, env: &str, text: &str, message: &str) -> String {
        std::fs::write(self.work.join(format!("environments/{env}.toml")), text).unwrap();
        let c = self.commit(message, true);
        self.push();
        c
    }

    /// Make the served repository refuse every push to a status branch
    /// with `words`, as a forge's branch rule or pre-receive hook does (a
    /// pre-receive hook: the config branch still takes the test's pushes).
    pub fn refuse_status_pushes(&self, words: &str) {
        use std::os::unix::fs::PermissionsExt;
        assert!(!words.contains('\''), "{words}");
        let hook = self.bare.join("hooks/pre-receive");
        std::fs::write(
            &hook,
            format!(
                "#!/bin/sh\nwhile read old new ref; do\n  case \"$ref\" in refs/heads/drover/status.d/*)\n    \
                 echo '{words}' >&2; exit 1;;\n  esac\ndone\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Take status pushes again (undo [`ConfigRepo::refuse_status_pushes`]).
    pub fn accept_status_pushes(&self) {
        std::fs::remove_file(self.bare.join("hooks/pre-receive")).unwrap();
    }

    /// Repository URL as the agents fetch it.
    pub fn url(&self) -> String {
        self.daemon.url("config")
    }

    /// The commit at the tip of `env`/`cluster`'s served status branch, if any.
    pub fn report_commit(&self, env: &str, cluster: &str) -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&self.bare)
            .args([
                "rev-parse",
                &format!("refs/heads/drover/status.d/{env}/{cluster}"),
            ])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The report for `env`/`cluster` on its served status branch, if any.
    pub fn report(&self, env: &str, cluster: &str) -> Option<StatusReport> {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&self.bare)
            .args([
                "show",
                &format!("drover/status.d/{env}/{cluster}:status/{env}/{cluster}.toml"),
            ])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        StatusReport::from_toml(&String::from_utf8_lossy(&out.stdout)).ok()
    }
}

/// Install (server-side apply) drover's CRDs, `DroverStatus` and
/// `DroverNode`, and wait until both serve.
pub async fn install_crd(client: &Client) {
    install_crd_of(client, crd::crd()).await;
    // Established is not yet servable: the resource's storage answers 429
    // ("storage is (re)initializing") for a moment, and clients here do not retry 429.
    let dst: Api<DroverStatus> = Api::all(client.clone());
    let lp = kube::api::ListParams::default().limit(1);
    retry_until("droverstatuses servable", || dst.list(&lp)).await;
    super::backend::install_record_crd(client).await;
}

/// The admin kubeconfig, or one impersonating `as_user`.
pub async fn config_as(as_user: Option<&str>) -> Config {
    let path = ControlPlane::get().kubeconfig_path();
    let kc = Kubeconfig::read_from(&path).unwrap();
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    if let Some(u) = as_user {
        config.auth_info.impersonate = Some(u.to_string());
    }
    config
}

/// An admin client, or one impersonating `as_user`.
pub async fn client_as(as_user: Option<&str>) -> Client {
    Client::try_from(config_as(as_user).await).unwrap()
}

/// A `drover agent` process for env `test`, cluster `test-1` in namespace
/// `ns`, configured through environment variables as the Deployment does:
/// git at `repo_url`, the signers of `repo`, HTTP on `listen`, JSON logs
/// (stdout) into `logs`. Killed if dropped before it exits.
pub fn agent_process(
    bin: &str,
    repo: &ConfigRepo,
    repo_url: &str,
    ns: &str,
    listen: &str,
    logs: &std::path::Path,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("agent")
        .env("KUBECONFIG", ControlPlane::get().kubeconfig_path())
        .env("DROVER_ENV", "test")
        .env("DROVER_CLUSTER", "test-1")
        .env("DROVER_REPO", repo_url)
        .env("POD_NAME", format!("{ns}-agent"))
        .env("POD_NAMESPACE", ns)
        .env("DROVER_CACHE_DIR", repo.dir.path().join("cache"))
        .env("DROVER_ALLOWED_SIGNERS", &repo.signers)
        .env("DROVER_STATUS_SIGNING_KEY", &repo.report_keys["test-1"])
        .env("DROVER_LISTEN", listen)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(logs).unwrap())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    cmd
}

/// A kubeconfig of the admin that impersonates `user` (what the drover
/// binary reads through `KUBECONFIG` to act as a ServiceAccount).
pub fn kubeconfig_as(user: &str) -> PathBuf {
    let cp = ControlPlane::get();
    let mut kc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(cp.kubeconfig_path()).unwrap()).unwrap();
    kc["users"][0]["user"]["as"] = user.into();
    let dir = cp.dir().join("identities");
    std::fs::create_dir_all(&dir).unwrap();
    let file: String = user
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let path = dir.join(format!("as-{file}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&kc).unwrap()).unwrap();
    path
}

/// The ServiceAccount deploy/base runs the agent as.
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:drover-system:drover";

/// Server-side apply every document of every file deploy/base's
/// kustomization lists, in its order (the CRDs awaited until they serve).
pub async fn apply_base(client: &Client) -> Vec<String> {
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base");
    let k: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(base.join("kustomization.yaml")).unwrap())
            .unwrap();
    let mut applied = Vec::new();
    for file in k["resources"].as_sequence().unwrap() {
        let file = format!("base/{}", file.as_str().unwrap());
        let objects = super::kube::apply_deploy_file(client, &file, "drover-system").await;
        if objects
            .iter()
            .any(|o| o.starts_with("CustomResourceDefinition/"))
        {
            install_crd(client).await;
        }
        applied.extend(objects);
    }
    applied
}

/// Send SIGTERM to `pid`.
pub fn sigterm(pid: u32) {
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -TERM {pid}");
}

/// Settings for one test agent.
pub fn agent_config(
    repo: &ConfigRepo,
    env: &str,
    cluster: &str,
    ns: &str,
    id: &str,
) -> AgentConfig {
    let cache = repo
        .dir
        .path()
        .join(format!("cache-{id}-{}", rand::random::<u32>()));
    let mut cfg = AgentConfig::new(env, cluster, &repo.url(), cache);
    cfg.namespace = ns.into();
    cfg.identity = id.into();
    cfg.allowed_signers = Some(repo.signers.clone());
    if let Some(key) = repo.report_keys.get(cluster) {
        cfg.publish = drover::status::PublishOptions::default()
            .with_signing_key_file(key)
            .unwrap();
    }
    // The poll is longer than the tick, as with the shipped defaults (60 s
    // and 30 s): every agent test runs the loop the way production does.
    cfg.poll = Duration::from_millis(2500);
    cfg.tick = Duration::from_secs(2);
    cfg.evict_retry = Duration::from_millis(250);
    cfg.debounce = Duration::from_millis(50);
    cfg.lease_duration = Duration::from_secs(3);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    // Tests poll every 2.5 s; webhooks right after a poll should not wait the default 5 s.
    cfg.webhook_min_interval = Duration::from_millis(500);
    cfg.webhook = Some(WebhookConfig {
        hmac_secret: None,
        token: Some(WEBHOOK_TOKEN.as_bytes().to_vec()),
    });
    cfg
}

/// How a test agent reaches the API server.
enum Reach {
    /// The admin kubeconfig, impersonating this user when given.
    As(Option<String>),
    /// This config.
    Config(Box<Config>),
}

/// Run an agent on `backend` until it stops or is killed, handing out its handle once built.
async fn serve<B: ClusterBackend>(
    cfg: AgentConfig,
    config: Config,
    backend: B,
    clock: SharedClock,
    handle_tx: std::sync::mpsc::Sender<AgentHandle>,
    (shutdown_rx, kill_rx): (watch::Receiver<bool>, tokio::sync::oneshot::Receiver<()>),
) {
    let agent = Agent::new(cfg, config, backend, clock)
        .await
        .expect("agent starts");
    handle_tx.send(agent.handle()).unwrap();
    tokio::select! {
        r = agent.run(shutdown_rx) => r.expect("agent runs"),
        _ = kill_rx => {}
    }
}

/// The Kubernetes backend with the node selector replaced by `selector`.
/// Each cluster of a real environment is a Kubernetes cluster of its own,
/// where the environment's one `node_selector` picks that cluster's nodes;
/// the tests run an environment's clusters against one API server, so each
/// agent gets its pool this way, and everything else of its view (driver,
/// version regex, Jobs) comes from the environment's config as shipped.
pub struct PoolBackend {
    inner: KubeBackend,
    selector: String,
}

impl ClusterBackend for PoolBackend {
    type Cluster = <KubeBackend as ClusterBackend>::Cluster;
    type Error = <KubeBackend as ClusterBackend>::Error;
    type Settings = <KubeBackend as ClusterBackend>::Settings;

    fn settings(&self, cluster_name: &str, env: &drover::config::EnvConfig) -> Self::Settings {
        let mut settings = self.inner.settings(cluster_name, env);
        settings.node_selector = self.selector.clone();
        settings
    }

    async fn connect(
        &mut self,
        settings: &Self::Settings,
    ) -> Result<Connected<Self::Cluster>, Self::Error> {
        self.inner.connect(settings).await
    }
}

/// An agent on a runtime (and thread) of its own.
pub struct RunningAgent {
    pub handle: AgentHandle,
    shutdown: watch::Sender<bool>,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningAgent {
    /// Start an agent with `cfg` on `clock`, as `as_user` when given (impersonation).
    pub fn start(cfg: AgentConfig, clock: SharedClock, as_user: Option<&str>) -> RunningAgent {
        Self::start_on(cfg, clock, Reach::As(as_user.map(String::from)))
    }

    /// Start an agent with `cfg` on `clock` that reaches the API server as
    /// `config` says (through a proxy, with a User-Agent of its own, ...).
    pub fn start_with_config(cfg: AgentConfig, clock: SharedClock, config: Config) -> RunningAgent {
        Self::start_on(cfg, clock, Reach::Config(Box::new(config)))
    }

    /// Start an agent with `cfg` on `clock` that sees only the nodes
    /// `selector` chooses, whatever `[rollout] node_selector` says: one
    /// cluster of an environment whose clusters all run against this one
    /// API server, each on a pool of its own ([`PoolBackend`]).
    pub fn start_on_pool(cfg: AgentConfig, clock: SharedClock, selector: &str) -> RunningAgent {
        Self::start_with(cfg, clock, Reach::As(None), Some(selector.to_string()))
    }

    fn start_on(cfg: AgentConfig, clock: SharedClock, reach: Reach) -> RunningAgent {
        Self::start_with(cfg, clock, reach, None)
    }

    fn start_with(
        cfg: AgentConfig,
        clock: SharedClock,
        reach: Reach,
        pool: Option<String>,
    ) -> RunningAgent {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (kill, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let config = match reach {
                    Reach::As(as_user) => config_as(as_user.as_deref()).await,
                    Reach::Config(c) => *c,
                };
                let backend =
                    KubeBackend::new(config.clone(), cfg.jobs_namespace(), &cfg.namespace)
                        .with_write_timeout(cfg.write_timeout());
                let (handle_tx, stop) = (handle_tx, (shutdown_rx, kill_rx));
                match pool {
                    None => serve(cfg, config, backend, clock, handle_tx, stop).await,
                    Some(selector) => {
                        let backend = PoolBackend {
                            inner: backend,
                            selector,
                        };
                        serve(cfg, config, backend, clock, handle_tx, stop).await
                    }
                }
            });
            // A kill: every task of this agent dies at its next await, no lease release.
            rt.shutdown_background();
        });
        let handle = handle_rx.recv_timeout(WAIT).expect("agent did not start");
        RunningAgent {
            handle,
            shutdown,
            kill: Some(kill),
            thread: Some(thread),
        }
    }

    /// Kill the agent as a crash would (no release of the lease, no cleanup).
    pub fn kill(mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Stop gracefully (as on SIGTERM) and wait until it exited.
    pub fn stop(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// GET a path of its HTTP server.
    pub async fn http_get(&self, path: &str) -> (u16, String) {
        http(self.handle.http_addr().unwrap(), "GET", path, &[], "").await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.http_get("/metrics").await.1
    }

    /// POST the webhook (with the token).
    pub async fn webhook(&self) -> u16 {
        http(
            self.handle.webhook_addr().unwrap(),
            "POST",
            "/webhook",
            &[("X-Drover-Token", WEBHOOK_TOKEN)],
            "{}",
        )
        .await
        .0
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
    }
}

/// A minimal HTTP/1.0 client over loopback.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (code, body)
}

/// Wait until `cond` holds, checking after every pass of `agent` (and once at once).
pub async fn until_pass(
    agent: &AgentHandle,
    what: &str,
    within: Duration,
    mut cond: impl FnMut() -> bool,
) {
    let mut rx = agent.subscribe();
    let run = async {
        loop {
            if cond() {
                return;
            }
            match rx.recv().await {
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    panic!("agent stopped while waiting for {what}")
                }
            }
        }
    };
    tokio::time::timeout(within, run)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// Wait (through a watch) until the status object satisfies `cond`.
pub async fn await_status(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    cond: impl Fn(&crd::DroverStatusStatus) -> bool,
) -> DroverStatus {
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns);
    await_object(&api, name, what, |o: &DroverStatus| {
        o.status.as_ref().is_some_and(&cond)
    })
    .await
}

/// The DroverStatus `name` once its agent adopted the config at start:
/// confirmed at its version, with a last applied commit.
pub async fn await_adopted(client: &Client, ns: &str, name: &str) -> DroverStatus {
    await_status(client, ns, name, "adopted", |s| {
        s.state.as_deref() == Some("confirmed") && s.last_applied_commit.is_some()
    })
    .await
}

/// `hh:mm` UTC on a day of December 2026.
pub fn dec(day: u32, hh: u32, mm: u32) -> DateTime<Utc> {
    format!("2026-12-{day:02}T{hh:02}:{mm:02}:00Z")
        .parse()
        .unwrap()
}

/// The value of a metric sample line `name{labels}` in `/metrics` text.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len()..].trim().parse().ok())
}
