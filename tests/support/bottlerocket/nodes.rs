//! Simulated Bottlerocket nodes behind the kubelet simulator's pods: each
//! node has a simulated API of its own ([`super::BottlerocketApi`], from a
//! [`Scenario`] the test gives per node) and a state directory (the host's
//! `/var/lib/drover`), and the pod of each drover Job runs drover's driver
//! script, exactly as the updater image holds it, against it
//! (support/kubelet.rs, [`PodDriver`]): the Job's environment, the host's
//! apiclient (the stand-in), the pod's termination message. When the script
//! asks for the reboot, the kubelet's graceful shutdown stops it with
//! SIGTERM and the node boots what its partition flags say.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::script::{script_path, stand_in_dir, UNIT};
use super::{BottlerocketApi, Scenario};
use crate::support::kubelet::{DriverRun, PodDriver};

/// Longest one run of the script may take here before it counts as hung.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// The nodes, by name, created on their first Job from the test's scenario.
pub struct BottlerocketNodes {
    dir: tempfile::TempDir,
    scenario: Box<dyn Fn(&str) -> Scenario + Send + Sync>,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
}

impl fmt::Debug for BottlerocketNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BottlerocketNodes")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// One simulated node.
pub struct Node {
    api: BottlerocketApi,
    dir: PathBuf,
    runs: AtomicUsize,
    /// The run that asked for the reboot, until the shutdown stops it.
    rebooting: Mutex<Option<Child>>,
}

impl Node {
    /// The node's API (its state, faults to inject, the partition flags).
    pub fn api(&self) -> &BottlerocketApi {
        &self.api
    }

    /// Everything the script's runs on this node wrote, in order.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for i in 0..self.runs.load(Ordering::SeqCst) {
            let log =
                std::fs::read_to_string(self.dir.join(format!("run-{i}.log"))).unwrap_or_default();
            out.push_str(&format!("--- run {i}\n{log}"));
        }
        out
    }

    fn run(&self, env: Vec<(String, String)>) -> DriverRun {
        let i = self.runs.fetch_add(1, Ordering::SeqCst);
        let state = self.dir.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let termination = self.dir.join(format!("termination-{i}.log"));
        let out = std::fs::File::create(self.dir.join(format!("run-{i}.log"))).unwrap();
        let path = format!(
            "{}:{}",
            stand_in_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let before = self.api.reboot_requests();
        let mut child = Command::new(script_path())
            .env_clear()
            .envs(env)
            .env("PATH", path)
            .env("APICLIENT_SOCKET", self.api.socket())
            .env("DROVER_STATE_DIR", &state)
            .env("DROVER_TIME_UNIT", UNIT)
            .env("DROVER_TERMINATION_LOG", &termination)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start the driver script");
        let deadline = Instant::now() + RUN_LIMIT;
        loop {
            if let Some(status) = child.try_wait().expect("wait for the script") {
                let message = std::fs::read_to_string(&termination).ok();
                return DriverRun::Exited {
                    code: status.code().unwrap_or(137),
                    message,
                };
            }
            if self.api.reboot_requests() > before {
                *self.rebooting.lock().unwrap() = Some(child);
                return DriverRun::Rebooting;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return DriverRun::Exited {
                    code: 137,
                    message: Some(format!("the script hung for {RUN_LIMIT:?}")),
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&self) -> i32 {
        let Some(mut child) = self.rebooting.lock().unwrap().take() else {
            return 143;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("wait for the script") {
                return status.code().unwrap_or(143);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return 137;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl BottlerocketNodes {
    /// Nodes whose APIs start as `scenario(node name)` says.
    pub fn new(scenario: impl Fn(&str) -> Scenario + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(BottlerocketNodes {
            dir: tempfile::tempdir().unwrap(),
            scenario: Box::new(scenario),
            nodes: Mutex::new(HashMap::new()),
        })
    }

    /// Node `name` (created now if no Job ran on it yet).
    pub fn node(&self, name: &str) -> Arc<Node> {
        let mut nodes = self.nodes.lock().unwrap();
        nodes
            .entry(name.to_string())
            .or_insert_with(|| {
                let dir = self.dir.path().join(name);
                std::fs::create_dir_all(&dir).unwrap();
                Arc::new(Node {
                    api: BottlerocketApi::start(&dir, (self.scenario)(name)),
                    dir,
                    runs: AtomicUsize::new(0),
                    rebooting: Mutex::new(None),
                })
            })
            .clone()
    }
}

impl PodDriver for BottlerocketNodes {
    fn run(
        &self,
        node: &str,
        env: Vec<(String, String)>,
    ) -> futures::future::BoxFuture<'static, DriverRun> {
        let node = self.node(node);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || node.run(env))
                .await
                .expect("the driver's run")
        })
    }

    fn stop(&self, node: &str) -> futures::future::BoxFuture<'static, i32> {
        let node = self.node(node);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || node.stop())
                .await
                .expect("the driver's stop")
        })
    }

    fn reboot(&self, node: &str) -> String {
        let node = self.node(node);
        node.api.reboot_now();
        node.api.running().to_string()
    }
}
