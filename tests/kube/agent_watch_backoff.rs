//! The status object's watcher against an API server that refuses it (403):
//! it retries with backoff and logs once, instead of relisting in a tight
//! loop (before: 37 LIST/s, a full core, thousands of lines a second).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::kube::ControlPlane;
use drover::agent::crd::{DroverStatusSpec, StatusObject};
use futures::StreamExt;
use tracing_subscriber::layer::SubscriberExt;

/// Counts warnings from drover's modules.
struct Count(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *e.metadata().level() <= tracing::Level::WARN
            && e.metadata().target().starts_with("drover")
        {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// utime + stime of this test's thread, in clock ticks. The thread, not the
/// process: other tests of the binary run beside it, and the watcher runs
/// here, on the test's current-thread runtime.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[tokio::test]
async fn a_refused_status_watch_backs_off_and_logs_once() {
    let warnings = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(Count(warnings.clone()));
    let _guard = tracing::subscriber::set_default(subscriber);
    let cp = ControlPlane::get();
    // No RBAC at all: every LIST and WATCH is refused with 403.
    let client = cp.restricted_client().await;
    let store = StatusObject::new(
        client,
        "drover-system",
        "test-test-1",
        DroverStatusSpec {
            environment: "test".into(),
            cluster: "test-1".into(),
        },
    );
    let mut stream = store.fetch_requests(None);
    let (t0, cpu0) = (Instant::now(), cpu_ticks());
    // Nothing can ever be yielded; run the watcher for 10 s.
    let r = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
    assert!(r.is_err(), "a refused watch yielded a fetch request");
    // Linux clock ticks are 10 ms (USER_HZ = 100).
    let cpu_ms = (cpu_ticks() - cpu0) * 10;
    let lines = warnings.load(Ordering::Relaxed);
    println!(
        "FIGURE refused_watch seconds={:.0} warnings={lines} cpu_ms={cpu_ms}",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(lines, 1, "one warning, then one a minute");
    assert!(cpu_ms < 500, "{cpu_ms} ms of CPU in 10 s");
}
