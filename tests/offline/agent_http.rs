//! The agent's HTTP surface under hostile clients, over real loopback TCP:
//! stalled headers are cut off, a bad credential is refused before any body
//! byte is read, connections are limited, and a flood of valid webhooks
//! starts at most one fetch per interval.

use drover::agent::http::{self, Readiness, Server, HEADER_TIMEOUT, MAX_CONNECTIONS};
use drover::agent::metrics::Metrics;
use drover::source::trigger::{webhook_router, Trigger, WebhookConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

const TOKEN: &str = "hook-token";

/// Serve the agent's router with a token-authenticated webhook; returns the
/// address, the trigger the webhook nudges, and the shutdown switch.
async fn serve(min_interval: Duration) -> (SocketAddr, Trigger, watch::Sender<bool>) {
    let mut trigger = Trigger::new(Duration::from_secs(3600));
    trigger.set_min_interval(min_interval);
    let hook = webhook_router(
        WebhookConfig {
            hmac_secret: Some(b"hmac-secret".to_vec()),
            token: Some(TOKEN.as_bytes().to_vec()),
        },
        trigger.nudger(),
    );
    let app = http::router(
        Arc::new(Metrics::new()),
        Arc::new(Readiness::default()),
        Some(hook),
    );
    let server = Server::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(server.serve(app, rx));
    (addr, trigger, tx)
}

/// Read until the server closes or `within` passes; `None` on timeout.
async fn answer(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    match tokio::time::timeout(within, s.read_to_end(&mut out)).await {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

fn status(resp: &str) -> u16 {
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn half_sent_headers_are_cut_off_after_the_header_timeout() {
    let (addr, _trigger, _stop) = serve(Duration::from_secs(1)).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /webhook HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let t = Instant::now();
    let got = answer(&mut s, HEADER_TIMEOUT + Duration::from_secs(5)).await;
    assert!(
        got.is_some(),
        "a half-sent request was still open {:?} later",
        t.elapsed()
    );
    assert!(t.elapsed() >= HEADER_TIMEOUT - Duration::from_millis(500));

    // Control: a complete request on a fresh connection is answered at once.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.unwrap();
    let resp = answer(&mut s, Duration::from_secs(2)).await.unwrap();
    assert_eq!(status(&resp), 200, "{resp}");
}

#[tokio::test]
async fn a_bad_credential_is_refused_before_the_body_is_read() {
    let (addr, _trigger, _stop) = serve(Duration::from_secs(1)).await;
    // Announce 1 MiB − 1 and send none of it: the answer must not wait for it.
    for cred in [
        "X-Drover-Token: wrong".to_string(),
        "X-Hub-Signature-256: sha256=nothex".to_string(),
        String::new(),
    ] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n{cred}{}\r\n",
            (1 << 20) - 1,
            if cred.is_empty() { "" } else { "\r\n" }
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let resp = answer(&mut s, Duration::from_secs(2)).await;
        let resp = resp.unwrap_or_else(|| panic!("{cred:?}: no answer while the body is withheld"));
        assert_eq!(status(&resp), 401, "{cred:?}: {resp}");
    }
    // A signature with an announced body over the cap: refused without reading it.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nX-Hub-Signature-256: sha256={}\r\n\r\n",
        (1 << 20) + 1,
        "00".repeat(32)
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let resp = answer(&mut s, Duration::from_secs(2)).await.unwrap();
    assert_eq!(status(&resp), 413, "{resp}");

    // Control: the right token is accepted.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /webhook HTTP/1.0\r\nX-Drover-Token: {TOKEN}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let resp = answer(&mut s, Duration::from_secs(2)).await.unwrap();
    assert_eq!(status(&resp), 202, "{resp}");
}

#[tokio::test]
async fn connections_over_the_limit_wait_until_a_slot_frees() {
    let (addr, _trigger, _stop) = serve(Duration::from_secs(1)).await;
    // Fill every slot with a connection that sends nothing.
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    let opened = Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.unwrap();
    // Not served while the slots are held...
    let mut buf = [0u8; 1];
    let early = tokio::time::timeout(HEADER_TIMEOUT / 2, s.peek(&mut buf)).await;
    assert!(early.is_err(), "served past the connection limit");
    // ...and served once the stalled ones are cut off by the header timeout.
    let resp = answer(&mut s, HEADER_TIMEOUT * 2)
        .await
        .expect("served after the flood");
    assert_eq!(status(&resp), 200, "{resp}");
    assert!(opened.elapsed() >= HEADER_TIMEOUT - Duration::from_millis(500));
    drop(held);
}

#[tokio::test]
async fn replayed_webhooks_start_at_most_one_fetch_per_interval() {
    let interval = Duration::from_secs(1);
    let (addr, mut trigger, _stop) = serve(interval).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let follower = tokio::spawn(async move {
        loop {
            trigger.next().await;
            if tx.send(Instant::now()).is_err() {
                return;
            }
        }
    });
    // 2,000 valid deliveries, 20 at a time, as a replaying attacker would send them.
    let start = Instant::now();
    let req = Arc::new(format!(
        "POST /webhook HTTP/1.0\r\nX-Drover-Token: {TOKEN}\r\nContent-Length: 2\r\n\r\n{{}}"
    ));
    let mut accepted = 0;
    for _ in 0..100 {
        let batch: Vec<_> = (0..20)
            .map(|_| {
                let req = req.clone();
                tokio::spawn(async move {
                    let mut s = TcpStream::connect(addr).await.unwrap();
                    s.write_all(req.as_bytes()).await.unwrap();
                    status(&answer(&mut s, Duration::from_secs(5)).await.unwrap())
                })
            })
            .collect();
        for b in batch {
            if b.await.unwrap() == 202 {
                accepted += 1;
            }
        }
    }
    let flood = start.elapsed();
    assert_eq!(accepted, 2000);
    // Let a queued nudge come through, then count.
    let settle = tokio::time::timeout(interval * 2, rx.recv()).await;
    let mut fetches: Vec<Instant> = settle.ok().flatten().into_iter().collect();
    while let Ok(t) = rx.try_recv() {
        fetches.push(t);
    }
    fetches.sort();
    follower.abort();
    let allowed = (start.elapsed().as_secs_f64() / interval.as_secs_f64()).ceil() as usize + 1;
    assert!(!fetches.is_empty(), "the webhooks started no fetch");
    assert!(
        fetches.len() <= allowed,
        "{} fetches for 2,000 webhooks over {flood:?} (at most {allowed})",
        fetches.len()
    );
    for w in fetches.windows(2) {
        assert!(
            w[1] - w[0] >= interval - Duration::from_millis(50),
            "two fetches {:?} apart",
            w[1] - w[0]
        );
    }
}
