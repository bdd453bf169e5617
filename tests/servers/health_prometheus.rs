//! The Prometheus health check against a real Prometheus server (built from
//! its Go module, tests/prometheus) scraping an exporter the test controls.

use std::time::{Duration, Instant};

use crate::support::prometheus::{Exporter, Prometheus, SCRAPE_INTERVAL};
use drover::config::{HealthSpec, OnUnreachable, PrometheusCheck};
use drover::health::{
    judge, Failure, Observation, PrometheusClient, QueryOutcome, QueryResult, Verdict,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Upper bound on waiting for Prometheus to see a change.
const WAIT: Duration = Duration::from_secs(60);

fn check(url: &str, query: &str, on_unreachable: OnUnreachable) -> PrometheusCheck {
    PrometheusCheck {
        url: url.to_owned(),
        query: query.to_owned(),
        timeout: Duration::from_secs(5),
        on_unreachable,
    }
}

/// Evaluates `check` until `cond` holds (each evaluation is a real query;
/// Prometheus offers no watch), failing after [`WAIT`].
async fn await_outcome(
    client: &PrometheusClient,
    check: &PrometheusCheck,
    what: &str,
    cond: impl Fn(&QueryOutcome) -> bool,
) -> QueryOutcome {
    let deadline = Instant::now() + WAIT;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        let outcome = client.evaluate(check).await;
        if cond(&outcome) {
            return outcome;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {outcome:?} after {WAIT:?}"
        );
    }
}

fn verdict(spec: &HealthSpec, check: &PrometheusCheck, outcome: QueryOutcome) -> Verdict {
    let now = chrono::Utc::now();
    judge(&Observation {
        spec,
        watch_until: now,
        nodes: &[],
        queries: &[QueryResult { check, outcome }],
        now,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_that_starts_returning_a_sample_turns_unhealthy_and_a_stopped_prometheus_holds() {
    let exporter = Exporter::start(0.0).await;
    let mut prom = tokio::task::block_in_place(|| Prometheus::start(exporter.addr()))
        .expect("Prometheus starts");
    let client = PrometheusClient::new().expect("client");
    let spec = HealthSpec::default();
    let failing = check(prom.url(), "drover_test_value > 0", OnUnreachable::Hold);

    // Control: the series is scraped (so the query below really looks at
    // data) and the health query is clear.
    let scraped = check(prom.url(), "drover_test_value", OnUnreachable::Hold);
    await_outcome(&client, &scraped, "first scrape", |o| {
        matches!(o, QueryOutcome::Firing { .. })
    })
    .await;
    let clear = client.evaluate(&failing).await;
    assert_eq!(clear, QueryOutcome::Clear);
    let both = client
        .evaluate_all(&[failing.clone(), scraped.clone()])
        .await;
    assert_eq!(both[0], QueryOutcome::Clear);
    assert!(
        matches!(&both[1], QueryOutcome::Firing { value, .. } if value == "0"),
        "{both:?}"
    );
    assert_eq!(verdict(&spec, &failing, clear), Verdict::Healthy);

    // The exporter flips: within a scrape interval or two the query returns
    // the sample, and the verdict names the query and its value.
    let flipped = Instant::now();
    exporter.set(7.0);
    let firing = await_outcome(&client, &failing, "flip seen", |o| {
        matches!(o, QueryOutcome::Firing { .. })
    })
    .await;
    let seen_after = flipped.elapsed();
    assert!(
        seen_after < SCRAPE_INTERVAL * 5,
        "the flip took {seen_after:?} to show"
    );
    match verdict(&spec, &failing, firing) {
        Verdict::Unhealthy(f @ Failure::Query { .. }) => assert_eq!(
            f.to_string(),
            "query `drover_test_value > 0` returned \
             drover_test_value{app=\"demo\", instance=\""
                .to_owned()
                + &exporter.addr().to_string()
                + "\", job=\"exporter\"} = 7"
        ),
        other => panic!("expected a query failure, got {other:?}"),
    }

    // A query Prometheus refuses is rejected (a config error), not clear.
    let bad = check(prom.url(), "drover_test_value{", OnUnreachable::Ignore);
    let rejected = client.evaluate(&bad).await;
    assert!(
        matches!(&rejected, QueryOutcome::Rejected(m) if m.contains("bad_data")),
        "{rejected:?}"
    );

    // Prometheus stopped: unreachable, which holds the rollout and says so,
    // unless the check says to ignore it.
    prom.stop();
    let down = client.evaluate(&failing).await;
    assert!(matches!(&down, QueryOutcome::Unreachable(_)), "{down:?}");
    match verdict(&spec, &failing, down.clone()) {
        Verdict::Held(msg) => assert!(
            msg.starts_with(&format!(
                "Prometheus {} unreachable for `drover_test_value > 0`:",
                prom.url()
            )),
            "{msg}"
        ),
        other => panic!("expected held, got {other:?}"),
    }
    let ignoring = check(prom.url(), "drover_test_value > 0", OnUnreachable::Ignore);
    assert_eq!(verdict(&spec, &ignoring, down), Verdict::Healthy);
}

#[tokio::test]
async fn a_silent_server_times_out_and_an_oversized_answer_is_refused() {
    let client = PrometheusClient::new().expect("client");

    // Accepts, reads, never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let mut c = check(&silent_url, "up", OnUnreachable::Hold);
    c.timeout = Duration::from_millis(500);
    let started = Instant::now();
    let outcome = client.evaluate(&c).await;
    assert_eq!(
        outcome,
        QueryOutcome::Unreachable("no answer within 500ms".into())
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    // Answers 200 with an endless body: cut at the bound, not buffered.
    let big = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let big_url = format!("http://{}", big.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = big.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n")
                    .await;
                let chunk = vec![b' '; 64 * 1024];
                loop {
                    if s.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let c = check(&big_url, "up", OnUnreachable::Ignore);
    let outcome = client.evaluate(&c).await;
    assert_eq!(
        outcome,
        QueryOutcome::Rejected("response larger than 1024 KiB".into())
    );
}
