//! `deploy/notify/chat-relay.py`, as docs/install.md ("Notifications") runs
//! it: a signed CloudEvent in, one line of text to the chat webhook out; an
//! unsigned or wrongly signed one refused and nothing posted.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One HTTP request read from `listener`, answered 200: its body.
fn take_request(listener: &TcpListener) -> String {
    let (stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut r = BufReader::new(stream.try_clone().unwrap());
    let mut len = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    let mut s = stream;
    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        .unwrap();
    String::from_utf8(body).unwrap()
}

/// POST `body` to `port` with `signature`; the status code.
fn post(port: u16, body: &str, signature: &str) -> u16 {
    for _ in 0..100 {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            std::thread::sleep(Duration::from_millis(50)); // the relay is starting
            continue;
        };
        write!(
            s,
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/cloudevents+json\r\nX-Drover-Signature: {signature}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        return answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    }
    panic!("the relay never listened");
}

#[test]
fn the_chat_relay_posts_one_line_per_signed_notification() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("notify");
    std::fs::write(&secret, "relay-secret\n").unwrap();
    let chat = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/notify/chat-relay.py");
    let mut relay = Command::new("python3")
        .arg(script)
        .env("DROVER_NOTIFY_SECRET_FILE", &secret)
        .env(
            "CHAT_WEBHOOK_URL",
            format!("http://{}/services/T/B/X", chat.local_addr().unwrap()),
        )
        .env("LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let event = serde_json::json!({
        "specversion": "1.0", "id": "1", "source": "drover/production/prod-eu-1",
        "type": "dev.drover.rollout.blocked", "subject": "ip-10-0-1-7", "time": "2026-12-20T01:00:00Z",
        "datacontenttype": "application/json",
        "data": {"env": "production", "cluster": "prod-eu-1", "reason": "RolloutBlocked",
                 "message": "node ip-10-0-1-7 blocked by PodDisruptionBudget web"}
    })
    .to_string();
    // Wrongly signed: refused, nothing posted (the chat's accept would hang).
    assert_eq!(post(port, &event, "sha256=00"), 401);
    let sig = format!(
        "sha256={}",
        drover::agent::notify::sign(b"relay-secret", event.as_bytes())
    );
    let relayed = std::thread::spawn(move || take_request(&chat));
    assert_eq!(post(port, &event, &sig), 204);
    let posted: serde_json::Value = serde_json::from_str(&relayed.join().unwrap()).unwrap();
    assert_eq!(
        posted,
        serde_json::json!({"text": "drover production/prod-eu-1: blocked: node ip-10-0-1-7 blocked by PodDisruptionBudget web"})
    );
    relay.kill().unwrap();
    let _ = relay.wait();
}
