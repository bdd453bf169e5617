//! The API server unreachable for 60 s in the middle of a rollout: the
//! agent process logs fewer than 100 lines and uses under 5 % of a core
//! meanwhile, and the rollout resumes and finishes once the server is back.
//! The outage is a loopback TCP proxy between the agent and the real API
//! server that drops every connection and refuses new ones (what a
//! restarting or partitioned API server looks like to a client); the
//! simulated kubelets talk to the API server directly and keep running.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim, POOL_LABEL};
use crate::support::kube::{ControlPlane, TestNamespace, WAIT};
use drover::record::wire::DroverNode;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::config::Kubeconfig;
use kube::runtime::{watcher, WatchStreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const OUTAGE: Duration = Duration::from_secs(60);

/// A TCP proxy on a fixed loopback port: up, it forwards to `upstream`;
/// down, it drops every open connection and refuses new ones.
struct Proxy {
    addr: SocketAddr,
    up: watch::Sender<bool>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, _) = watch::channel(true);
        let state = up.subscribe();
        tokio::spawn(Self::run(Some(listener), addr, upstream, state));
        Proxy { addr, up }
    }

    async fn run(
        mut listener: Option<TcpListener>,
        addr: SocketAddr,
        upstream: SocketAddr,
        mut state: watch::Receiver<bool>,
    ) {
        loop {
            let Some(l) = listener.as_ref() else {
                // Down: nothing listens (connection refused) until up again.
                if state.wait_for(|u| *u).await.is_err() {
                    return;
                }
                listener = Some(
                    TcpListener::bind(addr)
                        .await
                        .expect("rebind the proxy port"),
                );
                continue;
            };
            let mut down = state.clone();
            tokio::select! {
                r = l.accept() => {
                    let Ok((client, _)) = r else { continue };
                    let mut conn_state = state.clone();
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(upstream).await else { return };
                        let (mut client, mut server) = (client, server);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = conn_state.wait_for(|u| !*u) => {}
                        }
                    });
                }
                r = down.wait_for(|u| !*u) => {
                    if r.is_err() { return }
                    listener = None;
                }
            }
        }
    }

    fn set(&self, up: bool) {
        self.up.send_replace(up);
    }
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    let hz: f64 = String::from_utf8(
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    ticks / hz
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

#[tokio::test]
async fn an_api_server_outage_of_a_minute_costs_few_lines_little_cpu_and_the_rollout_resumes() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "outage").await;
    let sim = start_sim(&client, pool_options(ns.name(), 4)).await;
    let repo = ConfigRepo::new(&[EnvSpec {
        env: "test".into(),
        cluster: "test-1".into(),
        version: "1.12.0".into(),
        // Replaced below by windows that do not touch.
        schedule: "0 */6 * * *".into(),
        selector: format!("{POOL_LABEL}={}", ns.name()),
        soak: "0s".into(),
    }]);

    // Open all day but for a minute every 6 h: windows that touch merge into
    // one that never ends, which is a far costlier question for the calendar
    // than this test's subject; a rollout here lasts well under 6 h.
    let env_text = |version: &str| {
        format!(
            "version = \"{version}\"\n\n[window]\nschedule = \"0 */6 * * *\"\nduration = \"5h59m\"\ntimezone = \"UTC\"\n\n\
             [rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\nnode_selector = \"{POOL_LABEL}={}\"\n\n\
             [promotion]\nsoak = \"0s\"\n",
            ns.name()
        )
    };
    repo.set_env_text(
        "test",
        &env_text("1.12.0"),
        "test: windows that never touch",
    );

    // The agent reaches the API server only through the proxy.
    let mut kc = Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
    let server = kc.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap();
    let upstream: SocketAddr = server.trim_start_matches("https://").parse().unwrap();
    let proxy = Proxy::start(upstream).await;
    kc.clusters[0].cluster.as_mut().unwrap().server = Some(format!("https://{}", proxy.addr));
    let kc_path = repo.dir.path().join("proxied.kubeconfig");
    std::fs::write(&kc_path, serde_yaml::to_string(&kc).unwrap()).unwrap();
    let token = repo.dir.path().join("webhook-token");
    std::fs::write(&token, WEBHOOK_TOKEN).unwrap();

    let port = crate::support::git::free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let logs = repo.dir.path().join("agent.log");
    let mut child = agent_process(
        env!("CARGO_BIN_EXE_drover"),
        &repo,
        &repo.url(),
        ns.name(),
        &addr.to_string(),
        &logs,
    )
    .env("KUBECONFIG", &kc_path)
    .env("DROVER_WEBHOOK_TOKEN_FILE", &token)
    .env("DROVER_POLL_INTERVAL", "10m")
    .spawn()
    .unwrap();
    let pid = child.id().unwrap();
    await_status(
        &client,
        ns.name(),
        "test-test-1",
        "initial confirmation",
        |s| s.state.as_deref() == Some("confirmed") && s.at_version.as_deref() == Some("4/4"),
    )
    .await;

    // Start the rollout, and cut the API server off once the first node drains.
    repo.set_env_text("test", &env_text("1.13.0"), "test: move to 1.13.0");
    let hook = http(
        addr,
        "POST",
        "/webhook",
        &[("X-Drover-Token", WEBHOOK_TOKEN)],
        "{}",
    )
    .await;
    assert_eq!(hook.0, 202);
    let nodes: Api<Node> = Api::all(client.clone());
    let sel = format!("{POOL_LABEL}={}", ns.name());
    let records: Api<DroverNode> = Api::namespaced(client.clone(), ns.name());
    let first = watcher(records, watcher::Config::default())
        .applied_objects()
        .try_filter(|r: &DroverNode| {
            futures::future::ready(crate::support::backend::record_progress(r).is_some())
        });
    futures::pin_mut!(first);
    use futures::TryStreamExt;
    tokio::time::timeout(WAIT, first.try_next())
        .await
        .expect("no node entered the rollout")
        .unwrap();

    proxy.set(false);
    let (lines0, cpu0, t0) = (lines(&logs), cpu_seconds(pid), Instant::now());
    tokio::time::sleep(OUTAGE).await;
    let (lines1, cpu1, elapsed) = (lines(&logs), cpu_seconds(pid), t0.elapsed());
    proxy.set(true);

    let logged = lines1 - lines0;
    let cpu = (cpu1 - cpu0) / elapsed.as_secs_f64() * 100.0;
    println!(
        "FIGURE outage seconds={:.0} log_lines={logged} cpu_percent={cpu:.2}",
        elapsed.as_secs_f64()
    );
    let text = std::fs::read_to_string(&logs).unwrap();
    let during: Vec<&str> = text.lines().skip(lines0).take(logged).collect();
    // What was logged, by message, for the figure's detail.
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for l in &during {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
        let msg = v["fields"]["message"].as_str().unwrap_or(l).to_string();
        *kinds.entry(msg).or_default() += 1;
    }
    println!("outage log lines by message: {kinds:?}");
    assert!(
        logged < 100,
        "{logged} log lines during the outage:\n{}",
        during.join("\n")
    );
    assert!(logged > 0, "an outage must be reported, not silent");
    assert!(cpu < 5.0, "{cpu:.2} % CPU during the outage");

    // Back: the rollout resumes and finishes.
    let done = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "rollout finished after the outage",
        |s| {
            s.target.as_deref() == Some("1.13.0")
                && s.state.as_deref() == Some("confirmed")
                && s.at_version.as_deref() == Some("4/4")
        },
    )
    .await;
    assert!(done.status.is_some());
    for n in sim.node_names() {
        assert_eq!(sim.version(&n).as_deref(), Some("1.13.0"));
    }
    let left = nodes
        .list(&ListParams::default().labels(&sel))
        .await
        .unwrap();
    let records = crate::support::backend::progresses(&client, ns.name(), &left.items).await;
    assert!(records.iter().all(Option::is_none), "{records:?}");
    assert!(left
        .items
        .iter()
        .all(|n| !crate::support::kube::unschedulable(n)));
    sigterm(pid);
    assert!(child.wait().await.unwrap().success());
    drop(proxy);
    sim.shutdown().await;
}
