//! Faults at the seams where the agent meets a git server, the API server
//! and a second replica, each put in mid-rollout against the real API
//! server, simulated kubelets and a real git daemon (docs/design.md §5
//! "Pushing without waiting", §9a "Handing over"):
//!
//! - the git server stopped, stalling (it accepts connections and sends
//!   nothing) or refusing the report with a pre-receive hook while a health
//!   check fails: the halt (invariant 7) still lands within 5 s of the
//!   crash loop showing, and once the server is back the status branch ends
//!   on the `failed` report (no final state lost). Control: the fault was
//!   real (the report was not on the branch meanwhile; a stalled server was
//!   dialled). A refusal is said (condition, metric, Event), not retried in
//!   a loop;
//! - Events throttled with 429s by a front of the API server: the halt
//!   still lands within 5 s. Control: Events were tried and refused while
//!   the status object went through the same front;
//! - the leader's API access stalled mid-drain: it stops acting before its
//!   lease could be taken, writes nothing after, and the new leader's
//!   writes all come after its last one, read from the API server's audit
//!   log (control: both replicas' evictions are in it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{
    await_node_record, pool_options, progress_of, record_progress, start_sim, POOL_LABEL,
};
use crate::support::kube::{
    daemon_pods_on, events_for, pod_held_by_a_pdb, retry_until, unschedulable, Audited,
    ControlPlane, TestNamespace, WAIT,
};
use crate::support::kubelet::{Fault, Kubelet};
use crate::support::proxy::{ApiProxy, Mode, TcpProxy};
use chrono::{DateTime, Utc};
use drover::cluster::ProgressState;
use drover::record::wire::DroverNode;
use drover::rollout::VirtualClock;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

/// The goal for a halt after a failed health check.
const HALT: Duration = Duration::from_secs(5);
const STEP: Duration = Duration::from_secs(90);

/// The environment file at `version`, with health checks.
fn env_text(version: &str, pool: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\ntimezone = \"UTC\"\n\n\
         [rollout]\nmax_unavailable = 1\ndrain_timeout = \"5m\"\nnode_timeout = \"10m\"\n\
         node_selector = \"{POOL_LABEL}={pool}\"\n\n[promotion]\nsoak = \"0s\"\n\n\
         [health]\nsettle = \"10m\"\npod_ready_timeout = \"5m\"\n"
    )
}

/// Two nodes each running a DaemonSet pod; a config repository whose git
/// daemon the agent reaches only through `git`; the agent adopted at 1.12.0
/// in its open window.
struct World {
    client: Client,
    _ns: TestNamespace,
    pool: String,
    sim: Kubelet,
    repo: ConfigRepo,
    git: TcpProxy,
    agent: RunningAgent,
    nodes: Vec<String>,
}

/// [`World`], the agent polling every `poll` and reaching the API server
/// as `api` says (`None`: directly, as admin).
async fn world(prefix: &str, poll: Duration, api: Option<kube::Config>) -> World {
    let client = ControlPlane::get().admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    let pool = ns.name().to_string();
    let sim = start_sim(&client, pool_options(&pool, 2)).await;
    let mut nodes = sim.node_names();
    nodes.sort();
    daemon_pods_on(&client, &pool, &nodes).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(&pool)]);
    let upstream: SocketAddr = format!("127.0.0.1:{}", repo.daemon.port).parse().unwrap();
    let git = TcpProxy::start(upstream).await;
    let mut cfg = agent_config(&repo, "test", "test-1", &pool, &format!("{prefix}-agent"));
    cfg.source.url = format!("git://{}/config", git.addr);
    cfg.poll = poll;
    let clock = Arc::new(VirtualClock::new(dec(1, 2, 30)));
    let agent = match api {
        Some(config) => RunningAgent::start_with_config(cfg, clock, config),
        None => RunningAgent::start(cfg, clock, None),
    };
    await_adopted(&client, &pool, "test-test-1").await;
    World {
        client,
        _ns: ns,
        pool,
        sim,
        repo,
        git,
        agent,
        nodes,
    }
}

/// Times a halt: when the first node's pods are first seen crash-looping,
/// and when its record first says `failed`.
struct HaltTimer {
    crash: tokio::task::JoinHandle<Instant>,
    failed: tokio::task::JoinHandle<Instant>,
}

impl HaltTimer {
    /// From the crash loop showing to the halt.
    async fn halt(self) -> Duration {
        let (crash, failed) = tokio::time::timeout(STEP, async {
            (self.crash.await.unwrap(), self.failed.await.unwrap())
        })
        .await
        .expect("no halt");
        failed.saturating_duration_since(crash)
    }
}

impl World {
    /// Move to 1.13.0 with the first node's pods crash-looping once it is
    /// back; returns once that node entered the rollout, the halt being timed.
    async fn start_failing_rollout(&self) -> HaltTimer {
        let first = self.nodes[0].clone();
        self.sim.set_fault(&first, Fault::CrashLoopAfterUpgrade);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.pool);
        let crash = tokio::spawn(first_seen(
            pods,
            watcher::Config::default().fields(&format!("spec.nodeName={first}")),
            |p: &Pod| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.state
                                .as_ref()
                                .and_then(|s| s.waiting.as_ref())
                                .and_then(|w| w.reason.as_deref())
                                == Some("CrashLoopBackOff")
                        })
                    })
            },
        ));
        let records: Api<DroverNode> = Api::namespaced(self.client.clone(), &self.pool);
        let failed = tokio::spawn(first_seen(
            records,
            watcher::Config::default().fields(&format!("metadata.name={first}")),
            |r: &DroverNode| record_progress(r).is_some_and(|p| p.state == ProgressState::Failed),
        ));
        self.repo.set_env_text(
            "test",
            &env_text("1.13.0", &self.pool),
            "test: move to 1.13.0",
        );
        assert_eq!(self.agent.webhook().await, 202);
        await_node_record(
            &self.client,
            &self.pool,
            &first,
            "in the rollout",
            |_, p| p.is_some(),
        )
        .await;
        HaltTimer { crash, failed }
    }

    /// The report on the served status branch, if it is `failed` for 1.13.0.
    fn failed_report_pushed(&self) -> bool {
        self.repo
            .report("test", "test-1")
            .is_some_and(|r| r.state.as_str() == "failed" && r.version.to_string() == "1.13.0")
    }

    /// The second node was never touched.
    async fn second_node_untouched(&self) {
        let n = Api::<Node>::all(self.client.clone())
            .get(&self.nodes[1])
            .await
            .unwrap();
        assert!(
            progress_of(&self.client, &self.pool, &self.nodes[1])
                .await
                .is_none()
                && !unschedulable(&n),
            "the second node started"
        );
        assert_eq!(self.sim.upgrades_started(&self.nodes[1]), 0);
    }
}

/// When an object of `api` (under `cfg`) first satisfies `cond`.
async fn first_seen<K>(api: Api<K>, cfg: watcher::Config, cond: fn(&K) -> bool) -> Instant
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let stream = watcher(api, cfg)
        .applied_objects()
        .try_filter(move |o| futures::future::ready(cond(o)));
    futures::pin_mut!(stream);
    stream.try_next().await.unwrap().expect("watch ended");
    Instant::now()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GitFault {
    Stopped,
    Stalling,
    HookRefuses,
}

async fn halts_in_time_and_reports_catch_up(fault: GitFault) {
    let prefix = match fault {
        GitFault::Stopped => "seam-git-down",
        GitFault::Stalling => "seam-git-stall",
        GitFault::HookRefuses => "seam-git-hook",
    };
    // A refused report is tried again after five poll intervals.
    let poll = if fault == GitFault::HookRefuses {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(2500)
    };
    let w = world(prefix, poll, None).await;
    let timer = w.start_failing_rollout().await;
    let dialled = w.git.accepted();
    match fault {
        GitFault::Stopped => w.git.set(Mode::Refuse),
        GitFault::Stalling => w.git.set(Mode::Stall),
        GitFault::HookRefuses => w
            .repo
            .refuse_status_pushes("status reports are frozen by the change board"),
    }

    let took = timer.halt().await;
    println!(
        "FIGURE seam_halt fault={fault:?} crash_loop_to_halt_ms={}",
        took.as_millis()
    );
    assert!(
        took < HALT,
        "the halt took {took:?} with the git server {fault:?}"
    );
    await_status(&w.client, &w.pool, "test-test-1", "failed", |s| {
        s.state.as_deref() == Some("failed")
    })
    .await;
    w.second_node_untouched().await;

    // The fault was real: the failed report could not reach the branch.
    let mut checks = 0;
    until_pass(&w.agent.handle, "a pass under the fault", STEP, || {
        checks += 1;
        checks > 1
    })
    .await;
    assert!(
        !w.failed_report_pushed(),
        "the report got through the fault"
    );
    match fault {
        // The agent dials at its next fetch or push, which may come after
        // the passes waited above (it did in 1 of 3 runs): await the dial
        // rather than race it.
        GitFault::Stalling => {
            until_pass(&w.agent.handle, "the stalled server dialled", STEP, || {
                w.git.accepted() > dialled
            })
            .await
        }
        GitFault::HookRefuses => {
            // Said once, in every place a person looks; not retried in a loop.
            let st = await_status(
                &w.client,
                &w.pool,
                "test-test-1",
                "ReportPushed=False",
                |s| {
                    s.conditions.iter().any(|c| {
                        c.kind == "ReportPushed" && c.status == "False" && c.reason == "Refused"
                    })
                },
            )
            .await
            .status
            .unwrap();
            let c = st
                .conditions
                .iter()
                .find(|c| c.kind == "ReportPushed")
                .unwrap();
            assert!(
                c.message.contains("frozen by the change board"),
                "{}",
                c.message
            );
            // The refusal, not the failed rollout, is what Stalled says
            // (the rollout's own reason follows in its message).
            let st = await_status(
                &w.client,
                &w.pool,
                "test-test-1",
                "Stalled for the refused report",
                |s| {
                    s.conditions.iter().any(|c| {
                        c.kind == "Stalled" && c.status == "True" && c.reason == "ReportRefused"
                    })
                },
            )
            .await
            .status
            .unwrap();
            let c = st.conditions.iter().find(|c| c.kind == "Stalled").unwrap();
            assert!(
                c.message.contains("on branch drover/status.d/test/test-1")
                    && c.message.contains("The rollout meanwhile: Failed"),
                "{}",
                c.message
            );
            let metrics = w.agent.metrics().await;
            assert_eq!(
                sample(&metrics, "drover_status_push_refused"),
                Some(1.0),
                "{metrics}"
            );
            let refused = |m: &str| {
                sample(m, r#"drover_status_pushes_total{result="refused"}"#).unwrap_or(0.0)
            };
            // The contract: a refused report is tried again only for a new
            // report or after five poll intervals. Over ten passes, at most
            // one attempt for a report the halt may still have been making
            // when `before` was read, plus one per five poll intervals that
            // passed (rounded up); a retry on every pass makes ten or more.
            let before = refused(&metrics);
            let t0 = std::time::Instant::now();
            let mut passes = 0;
            until_pass(&w.agent.handle, "passes with nothing new", STEP, || {
                passes += 1;
                passes > 10
            })
            .await;
            let slow_retries = (t0.elapsed().as_secs_f64() / (5.0 * poll.as_secs_f64())).ceil();
            let after = refused(&w.agent.metrics().await);
            assert!(
                before >= 1.0 && after - before <= 1.0 + slow_retries,
                "{before} then {after} refused pushes over ten passes in {:?}",
                t0.elapsed()
            );
            let evs = events_for(&w.client, &w.pool, "test-test-1").await;
            assert!(
                evs.iter()
                    .any(|e| e.reason.as_deref() == Some("ReportRefused")
                        && e.type_.as_deref() == Some("Warning")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.contains("pre-receive hook declined"))),
                "{evs:?}"
            );
        }
        GitFault::Stopped => {}
    }

    // The server is back: the branch ends on the failed report.
    match fault {
        GitFault::Stopped | GitFault::Stalling => w.git.set(Mode::Up),
        GitFault::HookRefuses => w.repo.accept_status_pushes(),
    }
    let back = Instant::now();
    until_pass(&w.agent.handle, "the failed report pushed", STEP, || {
        w.failed_report_pushed()
    })
    .await;
    println!(
        "FIGURE seam_catch_up fault={fault:?} back_to_report_ms={}",
        back.elapsed().as_millis()
    );
    let r = w.repo.report("test", "test-1").unwrap();
    assert!(r.message.contains("crash-looping"), "{}", r.message);
    if fault == GitFault::HookRefuses {
        await_status(
            &w.client,
            &w.pool,
            "test-test-1",
            "ReportPushed=True",
            |s| {
                s.conditions
                    .iter()
                    .any(|c| c.kind == "ReportPushed" && c.status == "True")
            },
        )
        .await;
        // Stalled by the failed rollout alone once the report is through.
        await_status(
            &w.client,
            &w.pool,
            "test-test-1",
            "Stalled for the failed rollout",
            |s| {
                s.conditions
                    .iter()
                    .any(|c| c.kind == "Stalled" && c.status == "True" && c.reason == "Failed")
            },
        )
        .await;
        let metrics = w.agent.metrics().await;
        assert_eq!(
            sample(&metrics, "drover_status_push_refused"),
            Some(0.0),
            "{metrics}"
        );
    }
    w.second_node_untouched().await;
    w.agent.stop();
    w.sim.shutdown().await;
}

#[tokio::test]
async fn with_the_git_server_stopped_the_halt_lands_in_time_and_the_report_catches_up() {
    halts_in_time_and_reports_catch_up(GitFault::Stopped).await;
}

#[tokio::test]
async fn with_the_git_server_stalling_the_halt_lands_in_time_and_the_report_catches_up() {
    halts_in_time_and_reports_catch_up(GitFault::Stalling).await;
}

#[tokio::test]
async fn a_hook_refusing_the_report_is_said_not_retried_in_a_loop_and_the_halt_lands_in_time() {
    halts_in_time_and_reports_catch_up(GitFault::HookRefuses).await;
}

#[tokio::test]
async fn events_throttled_with_429s_do_not_delay_the_halt() {
    let front = ApiProxy::start_as(config_as(None).await).await;
    let throttled = front.answer(
        429,
        "Too many requests, please try again later.",
        |_, path, _| path.starts_with("/apis/events.k8s.io/"),
    );
    let w = world(
        "seam-events",
        Duration::from_millis(2500),
        Some(front.config_with_user_agent("drover-test-throttled/1")),
    )
    .await;
    let timer = w.start_failing_rollout().await;
    let took = timer.halt().await;
    println!(
        "FIGURE seam_halt fault=EventsThrottled crash_loop_to_halt_ms={}",
        took.as_millis()
    );
    assert!(took < HALT, "the halt took {took:?} with Events throttled");
    // The status object went through the same front.
    await_status(&w.client, &w.pool, "test-test-1", "failed", |s| {
        s.state.as_deref() == Some("failed")
    })
    .await;
    w.second_node_untouched().await;
    // Control: Events were tried and refused, none got through.
    assert!(throttled.hits() > 0);
    let evs = events_for(&w.client, &w.pool, "test-test-1").await;
    assert!(evs.is_empty(), "{evs:?}");
    let metrics = w.agent.metrics().await;
    assert!(
        sample(&metrics, "drover_event_failures_total").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    until_pass(&w.agent.handle, "the failed report pushed", STEP, || {
        w.failed_report_pushed()
    })
    .await;
    w.agent.stop();
    w.sim.shutdown().await;
}

/// One renewal of the Lease as the test saw it.
#[derive(Debug, Clone)]
struct Renewal {
    holder: String,
    renewed: DateTime<Utc>,
}

fn renewal(l: &Lease) -> Option<Renewal> {
    let spec = l.spec.as_ref()?;
    let micros = spec.renew_time.as_ref()?.0.as_microsecond();
    Some(Renewal {
        holder: spec.holder_identity.clone().unwrap_or_default(),
        renewed: DateTime::from_timestamp_micros(micros)?,
    })
}

fn by(agent: &str) -> impl Fn(&&Audited) -> bool + '_ {
    move |a: &&Audited| a.user_agent.starts_with(agent)
}

#[tokio::test]
async fn a_leader_cut_off_mid_drain_stops_before_its_lease_can_be_taken_and_writes_nothing_after() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "seam-handoff").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let mut names = sim.node_names();
    names.sort();
    let node = names[0].clone();
    // The drain is held open: a PodDisruptionBudget refuses every eviction.
    pod_held_by_a_pdb(&client, ns.name(), &node).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);

    // A reaches the API server through a proxy that will stall; B directly.
    let admin = config_as(None).await;
    let upstream: SocketAddr = format!(
        "{}:{}",
        admin.cluster_url.host().unwrap(),
        admin.cluster_url.port_u16().unwrap()
    )
    .parse()
    .unwrap();
    let api_path = TcpProxy::start(upstream).await;
    let with_agent = |mut c: kube::Config, ua: &str| {
        c.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(ua).unwrap(),
        ));
        c
    };
    let mut a_config = with_agent(admin.clone(), "drover-test-a/1");
    a_config.cluster_url = format!("https://{}", api_path.addr).parse().unwrap();
    let b_config = with_agent(admin, "drover-test-b/1");
    let start = |id: &str, name: &str, config: kube::Config| {
        let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), id);
        cfg.poll = Duration::from_secs(600);
        cfg.publish.name = name.into();
        let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
        RunningAgent::start_with_config(cfg, clock, config)
    };
    let a = start("agent-a", "drover agent A", a_config);
    tokio::time::timeout(WAIT, a.handle.acting().wait_for(|x| *x))
        .await
        .expect("A never led")
        .unwrap();
    await_status(&client, ns.name(), "test-test-1", "adopted", |s| {
        s.state.as_deref() == Some("confirmed")
    })
    .await;
    let b = start("agent-b", "drover agent B", b_config);

    // Every renewal of the lease, as it happens.
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let renewals = Arc::new(Mutex::new(Vec::<Renewal>::new()));
    let seen = renewals.clone();
    let lease_watch = tokio::spawn(
        watcher(
            leases.clone(),
            watcher::Config::default().fields("metadata.name=drover-test-test-1"),
        )
        .applied_objects()
        .for_each(move |l| {
            if let Some(r) = l.ok().as_ref().and_then(renewal) {
                seen.lock().unwrap().push(r);
            }
            futures::future::ready(())
        }),
    );

    // Mid-drain: A cordons the node and keeps trying to evict.
    repo.bump("test", "1.13.0", true);
    assert_eq!(a.webhook().await, 202);
    await_node_record(&client, ns.name(), &node, "draining", |_, p| {
        p.is_some_and(|p| p.state == ProgressState::Draining)
    })
    .await;
    retry_until("A's evictions in the audit log", || async {
        let log = cp.audited(&client).await;
        let n = log
            .iter()
            .filter(by("drover-test-a"))
            .filter(|e| e.resource == "pods/eviction")
            .count();
        if n >= 2 {
            Ok(())
        } else {
            Err(n)
        }
    })
    .await;

    // A's path to the API server stalls: connections accepted, nothing answered.
    api_path.set(Mode::Stall);
    let mut acting = a.handle.acting();
    tokio::time::timeout(WAIT, acting.wait_for(|x| !*x))
        .await
        .expect("A kept acting")
        .unwrap();
    let a_stopped = Utc::now();
    tokio::time::timeout(WAIT, b.handle.acting().wait_for(|x| *x))
        .await
        .expect("B never took over")
        .unwrap();
    let last_by_a = renewals
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.holder == "agent-a")
        .map(|r| r.renewed)
        .max()
        .unwrap();
    // The lease lasts 3 s after its last renewal.
    let expiry = last_by_a + chrono::Duration::seconds(3);
    println!(
        "FIGURE seam_handoff a_stopped_before_expiry_ms={}",
        (expiry - a_stopped).num_milliseconds()
    );
    assert!(
        a_stopped < expiry,
        "A acted until {a_stopped}, its lease expired at {expiry}"
    );
    let lease = leases.get("drover-test-test-1").await.unwrap();
    assert_eq!(renewal(&lease).unwrap().holder, "agent-b");

    // B goes on with the drain; A's path heals (what the stall held is
    // lost, as a partition loses it) and A lives on as a follower.
    retry_until("B's evictions in the audit log", || async {
        let log = cp.audited(&client).await;
        let n = log
            .iter()
            .filter(by("drover-test-b"))
            .filter(|e| e.resource == "pods/eviction")
            .count();
        if n >= 2 {
            Ok(())
        } else {
            Err(n)
        }
    })
    .await;
    api_path.set(Mode::Refuse);
    api_path.set(Mode::Up);
    let healed = Utc::now();
    retry_until("A back on the API server (its lease reads)", || async {
        let log = cp.audited(&client).await;
        let back = log
            .iter()
            .filter(by("drover-test-a"))
            .any(|e| e.resource == "leases" && e.received > healed);
        if back {
            Ok(())
        } else {
            Err("not yet")
        }
    })
    .await;
    let mut passes = 0;
    until_pass(&b.handle, "passes of B with A back", STEP, || {
        passes += 1;
        passes > 2
    })
    .await;

    let log = cp.audited(&client).await;
    let writes = |agent: &str| -> Vec<Audited> {
        log.iter()
            .filter(by(agent))
            .filter(|e| e.is_write())
            .cloned()
            .collect()
    };
    let (a_writes, b_writes) = (writes("drover-test-a"), writes("drover-test-b"));
    // Control: both acted, each through its own path.
    assert!(
        a_writes.iter().any(|e| e.resource == "pods/eviction"),
        "{a_writes:#?}"
    );
    assert!(
        b_writes.iter().any(|e| e.resource == "pods/eviction"),
        "{b_writes:#?}"
    );
    // A wrote nothing once it stopped, and nothing it wrote arrived after
    // its lease could have been taken.
    let late: Vec<&Audited> = a_writes.iter().filter(|e| e.received > a_stopped).collect();
    assert!(
        late.is_empty(),
        "A wrote after it stopped acting: {late:#?}"
    );
    let a_last = a_writes.iter().map(|e| e.received).max().unwrap();
    assert!(
        a_last < expiry,
        "A's last write at {a_last}, its lease expired at {expiry}"
    );
    // The new leader's writes all come after the old one's.
    let b_first = b_writes.iter().map(|e| e.received).min().unwrap();
    assert!(
        b_first > a_last,
        "B wrote at {b_first} before A's last write at {a_last}"
    );
    // A pushed no status report after it stopped either.
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&repo.bare)
        .args(["log", "--format=%cn %ct", "drover/status.d/test/test-1"])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(t) = line.strip_prefix("drover agent A ") {
            let t: i64 = t.trim().parse().unwrap();
            assert!(
                t <= a_stopped.timestamp(),
                "A committed a report at {t}, after it stopped"
            );
        }
    }
    // The status object is B's.
    let st = await_status(&client, ns.name(), "test-test-1", "B's status", |s| {
        s.reporter.as_deref() == Some("agent-b")
    })
    .await;
    assert!(st.status.is_some());
    lease_watch.abort();
    b.stop();
    a.stop();
    sim.shutdown().await;
}
