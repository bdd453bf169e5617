//! A notification receiver on loopback (CloudEvents over HTTP, as
//! src/agent/notify.rs sends them): it checks each request's HMAC signature
//! and notes when it arrived. agent_notify measures with it; the scenario
//! tests that reach `halted`, `blocked`, `revoked` and `rolled-back` give
//! their agent one and await the kind they cause.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover::agent::notify::{self, CloudEvent};

pub const SECRET: &[u8] = b"notify-test-secret";

/// One request the receiver got: the event, when, whether its signature held.
pub type Got = (CloudEvent, chrono::DateTime<chrono::Utc>, bool);

/// What the receiver got.
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<Vec<Got>>>);

impl Received {
    pub fn kinds(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(e, _, _)| e.kind.clone())
            .collect()
    }

    pub fn all(&self) -> Vec<Got> {
        self.0.lock().unwrap().clone()
    }

    /// Wait until `pred` holds of what arrived (polled: an HTTP receiver
    /// has nothing to watch), at most `within`.
    pub async fn until(&self, within: Duration, what: &str, pred: impl Fn(&[String]) -> bool) {
        let start = Instant::now();
        loop {
            if pred(&self.kinds()) {
                return;
            }
            assert!(start.elapsed() < within, "{what}: got {:?}", self.kinds());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A receiver on loopback: 200 for every POST, after checking its signature.
pub async fn receiver() -> (SocketAddr, Received) {
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Received::default();
    let sink = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let sink = sink.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let sink = sink.clone();
                    async move {
                        use http_body_util::BodyExt as _;
                        let sig = req
                            .headers()
                            .get("x-drover-signature")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        let ctype = req
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let ok = sig.as_deref()
                            == Some(&format!("sha256={}", notify::sign(SECRET, &body)))
                            && ctype.starts_with("application/cloudevents+json");
                        let event: CloudEvent = serde_json::from_slice(&body).unwrap();
                        sink.0.lock().unwrap().push((event, chrono::Utc::now(), ok));
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Empty::<hyper::body::Bytes>::new(),
                        ))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, got)
}

pub fn config(url: String) -> notify::Config {
    notify::Config {
        endpoints: vec![url],
        secret: Some(SECRET.to_vec()),
        timeout: Duration::from_secs(2),
        ..notify::Config::default()
    }
}

/// A receiver, and the agent config's notifications pointed at it.
pub async fn notified() -> (notify::Config, Received) {
    let (addr, got) = receiver().await;
    (config(format!("http://{addr}/hook")), got)
}

impl Received {
    /// Wait until a notification of `kind` (`halted`, `rolled-back`...)
    /// arrived, signed, at most `within`.
    pub async fn kind(&self, within: Duration, kind: &str) {
        let suffix = format!(".{kind}");
        self.until(within, kind, |k| k.iter().any(|t| t.ends_with(&suffix)))
            .await;
        assert!(
            self.all()
                .iter()
                .filter(|(e, _, _)| e.kind.ends_with(&suffix))
                .all(|(_, _, signed)| *signed),
            "{kind}: every request signed"
        );
    }
}
