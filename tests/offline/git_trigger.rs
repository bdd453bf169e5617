//! Triggers: webhook authentication and body cap, local watch latency (a
//! push into a watched repository wakes it once the branch moved), poll.

use axum::http::StatusCode;
use drover::source::trigger::{webhook_router, Reason, Trigger, WebhookConfig, MAX_WEBHOOK_BODY};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::git::{bare_clone, git, WorkRepo};

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

/// A push into a watched bare repository (a `file://` source, or git-sync's
/// volume) writes its objects before it moves the branch. The trigger must
/// wake once the branch moved: a fetch woken by the object writes would see
/// the old head and spend the minimum interval between nudged fetches, so
/// the push would be acted on only 2–5 s later.
#[tokio::test]
async fn a_push_into_a_watched_repository_wakes_the_trigger_after_the_branch_moved() {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let bare = bare_clone(&work.dir, tmp.path(), "config");
    let mut trigger = Trigger::new(Duration::from_secs(3600));
    trigger.watch(&bare).unwrap();
    let pushed = work.bump("test", "1.1.0", "Bump test to 1.1.0", None);
    let (dir, url) = (work.dir.clone(), bare.display().to_string());
    let push = tokio::task::spawn_blocking(move || {
        git(&dir, &["push", "-q", &url, "main"]);
        Instant::now()
    });
    let why = tokio::time::timeout(Duration::from_secs(10), trigger.next())
        .await
        .expect("the push woke nothing");
    let woke = Instant::now();
    // What a fetch started now would see.
    let head = git(&bare, &["rev-parse", "refs/heads/main"]);
    let push_done = push.await.unwrap();
    assert_eq!(why, Reason::Watch);
    assert_eq!(
        head, pushed,
        "the trigger woke before the push moved the branch"
    );
    assert!(
        woke < push_done + Duration::from_secs(1),
        "woke {:?} after the push ended",
        woke - push_done
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
