//! Triggers: webhook authentication and body cap, local watch latency, poll.

use axum::http::StatusCode;
use drover::source::trigger::{webhook_router, Reason, Trigger, WebhookConfig, MAX_WEBHOOK_BODY};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Serve `router` on a loopback port.
async fn serve(router: axum::Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    port
}

async fn post(port: u16, headers: &[(&str, String)], body: Vec<u8>) -> StatusCode {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut head = format!(
        "POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    // The server may answer 413 and close before reading an oversized body.
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.write_all(&body).await;
    let mut resp = Vec::new();
    let _ = conn.read_to_end(&mut resp).await;
    let text = String::from_utf8_lossy(&resp);
    let code: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("HTTP status line");
    StatusCode::from_u16(code).unwrap()
}

#[tokio::test]
async fn webhook_authenticates_and_only_nudges() {
    let mut trigger = Trigger::new(Duration::from_secs(3600));
    let cfg = WebhookConfig {
        hmac_secret: Some(b"hook-secret".to_vec()),
        token: Some(b"plain-token".to_vec()),
    };
    let router = serve(webhook_router(cfg, trigger.nudger())).await;
    let body = br#"{"ref":"refs/heads/main"}"#.to_vec();

    assert_eq!(
        post(router, &[], body.clone()).await,
        StatusCode::UNAUTHORIZED
    );
    let bad = sign(b"other", &body);
    assert_eq!(
        post(router, &[("x-hub-signature-256", bad)], body.clone()).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        post(router, &[("x-drover-token", "nope".into())], body.clone()).await,
        StatusCode::UNAUTHORIZED
    );
    let big = vec![b'x'; MAX_WEBHOOK_BODY + 1];
    let sig = sign(b"hook-secret", &big);
    assert_eq!(
        post(router, &[("x-hub-signature-256", sig)], big).await,
        StatusCode::PAYLOAD_TOO_LARGE
    );

    let good = sign(b"hook-secret", &body);
    assert_eq!(
        post(router, &[("x-hub-signature-256", good)], body.clone()).await,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), trigger.next())
            .await
            .unwrap(),
        Reason::Webhook
    );
    assert_eq!(
        post(router, &[("x-drover-token", "plain-token".into())], body).await,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), trigger.next())
            .await
            .unwrap(),
        Reason::Webhook
    );
}

#[tokio::test]
async fn local_repository_change_is_seen_within_a_second() {
    let tmp = tempfile::tempdir().unwrap();
    let mut trigger = Trigger::new(Duration::from_secs(3600));
    trigger.watch(tmp.path()).unwrap();
    let started = Instant::now();
    std::fs::write(tmp.path().join("HEAD"), "ref: refs/heads/main\n").unwrap();
    let why = tokio::time::timeout(Duration::from_secs(5), trigger.next())
        .await
        .unwrap();
    assert_eq!(why, Reason::Watch);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn poll_fires_with_jitter() {
    let slow = Trigger::new(Duration::from_secs(60));
    let delays: Vec<Duration> = (0..50).map(|_| slow.next_delay()).collect();
    assert!(delays
        .iter()
        .all(|d| *d >= Duration::from_secs(54) && *d <= Duration::from_secs(66)));
    assert!(delays.iter().any(|d| *d != delays[0]), "jittered");
    let mut fast = Trigger::new(Duration::from_millis(50));
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), fast.next())
            .await
            .unwrap(),
        Reason::Poll
    );
}
