//! The agent with its shipped intervals (poll 60 s, tick 30 s) and no
//! webhook, as an operator without a forge hook runs it: a pushed commit
//! is fetched within one poll interval (plus its 10 % jitter). Before the
//! poll kept its own deadline, the tick dropped the poll's sleep on every
//! turn and a poll longer than the tick never fired at all.

use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::start_sim;
use crate::support::kube::{ControlPlane, TestNamespace};
use drover::agent::crd::DroverStatus;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};

/// The shipped `--poll-interval`, plus its jitter and the time a fetch and a
/// status write take on a loaded test machine.
const POLL: Duration = Duration::from_secs(60);
const BOUND: Duration = Duration::from_secs(66 + 5);

#[tokio::test]
async fn with_the_shipped_intervals_and_no_webhook_a_pushed_commit_is_fetched_within_one_poll() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "poll-defaults").await;
    let sim = start_sim(&client, crate::support::backend::pool_options(ns.name(), 1)).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let logs = repo.dir.path().join("agent.log");
    // No DROVER_POLL_INTERVAL, DROVER_TICK or webhook secret: the defaults.
    let mut child = agent_process(
        env!("CARGO_BIN_EXE_drover"),
        &repo,
        &repo.url(),
        ns.name(),
        "127.0.0.1:0",
        &logs,
    )
    .env("DROVER_JOB_NAMESPACE", ns.name())
    .env_remove("DROVER_POLL_INTERVAL")
    .env_remove("DROVER_TICK")
    .spawn()
    .unwrap();
    let first = crate::support::git::git(&repo.work, &["rev-parse", "HEAD"])
        .trim()
        .to_owned();
    await_status(&client, ns.name(), "test-test-1", "the first fetch", |s| {
        s.head_commit.as_deref() == Some(first.as_str())
    })
    .await;

    // A reviewed change that moves nothing (the window is next month).
    let pushed_at = Instant::now();
    let second = repo.bump("test", "1.12.1", true).trim().to_owned();
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns.name());
    let seen = watcher(
        api,
        watcher::Config::default().fields("metadata.name=test-test-1"),
    )
    .applied_objects();
    let fetched = async {
        futures::pin_mut!(seen);
        use futures::StreamExt;
        while let Some(Ok(o)) = seen.next().await {
            if o.status.as_ref().and_then(|s| s.head_commit.as_deref()) == Some(second.as_str()) {
                return;
            }
        }
    };
    let log = || std::fs::read_to_string(&logs).unwrap_or_default();
    if tokio::time::timeout(BOUND, fetched).await.is_err() {
        panic!(
            "the commit pushed {:?} ago was not fetched (shipped poll {POLL:?}):\n{}",
            pushed_at.elapsed(),
            log()
        );
    }
    let took = pushed_at.elapsed();
    eprintln!("pushed commit fetched after {took:?} (poll {POLL:?} ± 10 %)");
    assert!(took <= BOUND, "{took:?}");
    let _ = child.kill().await;
    sim.shutdown().await;
}
