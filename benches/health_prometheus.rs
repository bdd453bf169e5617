//! The figures in BENCHMARKS.md (## Health checks), measured against a real
//! Prometheus (tests/prometheus) scraping an exporter on loopback:
//! - one evaluation of a `[[health.prometheus]]` check (`PrometheusClient::evaluate`);
//! - the time from the exporter's value flipping to the check seeing the
//!   sample (and back to clear), as a ratio of the scrape interval measured
//!   in the same run (the spacing of the scraped samples' timestamps).
//!
//! `DROVER_FIGURE_FLIPS=N` changes the number of flips (default 10).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use drover::config::{OnUnreachable, PrometheusCheck};
use drover::health::{PrometheusClient, QueryOutcome};
use support::prometheus::{Exporter, Prometheus};

const WAIT: Duration = Duration::from_secs(60);

fn check(url: &str, query: &str) -> PrometheusCheck {
    PrometheusCheck {
        url: url.into(),
        query: query.into(),
        timeout: Duration::from_secs(5),
        on_unreachable: OnUnreachable::Hold,
    }
}

/// Evaluates `c` back to back until `cond`; returns the elapsed time.
async fn until(
    client: &PrometheusClient,
    c: &PrometheusCheck,
    cond: impl Fn(&QueryOutcome) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let o = client.evaluate(c).await;
        if cond(&o) {
            return start.elapsed();
        }
        assert!(start.elapsed() < WAIT, "still {o:?} after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn value(o: &QueryOutcome) -> Option<f64> {
    match o {
        QueryOutcome::Firing { value, .. } => value.parse().ok(),
        _ => None,
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists benches; nothing to list.
    }
    let flips: usize = std::env::var("DROVER_FIGURE_FLIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let exporter = Exporter::start(0.0).await;
    let prom = tokio::task::block_in_place(|| Prometheus::start(exporter.addr()))
        .expect("Prometheus starts");
    let client = PrometheusClient::new().expect("client");
    let health = check(prom.url(), "drover_test_value > 0");
    let stamp = check(prom.url(), "timestamp(drover_test_value)");
    until(&client, &stamp, |o| value(o).is_some()).await;

    // Baseline: the scrape interval as Prometheus ran it.
    let mut intervals = Vec::new();
    let mut last = value(&client.evaluate(&stamp).await).unwrap();
    while intervals.len() < 5 {
        until(&client, &stamp, |o| value(o).is_some_and(|v| v != last)).await;
        let now = value(&client.evaluate(&stamp).await).unwrap();
        intervals.push(Duration::from_secs_f64(now - last));
        last = now;
    }
    let interval = median(intervals);

    // One evaluation of a clear health check.
    let mut evals = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        assert_eq!(client.evaluate(&health).await, QueryOutcome::Clear);
        evals.push(t.elapsed());
    }

    let (mut to_unhealthy, mut to_clear) = (Vec::new(), Vec::new());
    for _ in 0..flips {
        exporter.set(1.0);
        to_unhealthy.push(
            until(&client, &health, |o| {
                matches!(o, QueryOutcome::Firing { .. })
            })
            .await,
        );
        exporter.set(0.0);
        to_clear.push(until(&client, &health, |o| *o == QueryOutcome::Clear).await);
    }
    let worst = *to_unhealthy.iter().max().unwrap();
    let (m_up, m_clear) = (median(to_unhealthy), median(to_clear));
    println!("scrape interval (measured, median of 5): {}", ms(interval));
    println!("one evaluation (median of 50): {}", ms(median(evals)));
    println!(
        "flip -> unhealthy (median of {flips}): {} = {:.2} scrape intervals; worst {} = {:.2}",
        ms(m_up),
        m_up.as_secs_f64() / interval.as_secs_f64(),
        ms(worst),
        worst.as_secs_f64() / interval.as_secs_f64()
    );
    println!(
        "flip back -> clear (median of {flips}): {} = {:.2} scrape intervals",
        ms(m_clear),
        m_clear.as_secs_f64() / interval.as_secs_f64()
    );
    assert!(
        worst < interval * 2,
        "a flip took {worst:?}, more than two scrape intervals"
    );
}
