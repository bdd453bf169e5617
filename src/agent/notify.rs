//! Notifications: CloudEvents 1.0 over HTTP (structured mode, the spec's
//! JSON format) for what the agent tells people through its Events:
//! `available` (a version admitted for the environment: `Applied`),
//! `started` (`RolloutRolling`), `blocked`, `halted`, `revoked` (the
//! rollout's state Events), `rolled-back` (a node's `RolledBack`) and
//! `confirmed` (the signed confirmation recorded on the status branch).
//! The one place they are made is [`super::events::Events`], so a
//! notification says what the Event says.
//!
//! Never waited on: [`Notifier::notify`] takes a lock, pushes and returns.
//! Each endpoint has its own queue, bounded by `queue` (a full queue drops
//! its oldest, counted in `drover_notifications_dropped_total{reason=
//! "queue_full"}` and logged), and a task that delivers it in order, each
//! request bounded by `timeout`, a failed one retried with backoff (0.5 s
//! doubling to 10 s, so a receiver back up is served within 10 s) until it
//! lands, it has been tried `attempts` times, or it is older than
//! `max_age` (then dropped, counted and logged). A receiver that is down
//! loses nothing queued within those bounds.
//!
//! Signed: with a secret, every request carries `X-Drover-Signature:
//! sha256=<hex HMAC-SHA256 of the body>` (GitHub's webhook form), so a
//! receiver can tell the agent's notifications from anyone's POST.
//!
//! Why not the `cloudevents-sdk` crate: a structured-mode event is seven
//! string attributes and a JSON `data` (the spec's JSON format, section 3),
//! which serde writes; the SDK brings `url`, `uuid`, `snafu` and
//! `delegate-attr` and its own HTTP bindings for what is one
//! `#[derive(Serialize)]`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The kinds of notification, by the name they are configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A version admitted for the environment (the agent applies its commit).
    Available,
    /// The rollout started moving nodes.
    Started,
    /// Nodes cannot be moved: someone should look.
    Blocked,
    /// Another cluster of the environment failed the version.
    Halted,
    /// A node failed its health checks and was rolled back.
    RolledBack,
    /// The pinned version was revoked.
    Revoked,
    /// The cluster's signed confirmation is on its status branch.
    Confirmed,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 7] = [
        Kind::Available,
        Kind::Started,
        Kind::Blocked,
        Kind::Halted,
        Kind::RolledBack,
        Kind::Revoked,
        Kind::Confirmed,
    ];

    /// The name it is configured with.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Available => "available",
            Kind::Started => "started",
            Kind::Blocked => "blocked",
            Kind::Halted => "halted",
            Kind::RolledBack => "rolled-back",
            Kind::Revoked => "revoked",
            Kind::Confirmed => "confirmed",
        }
    }

    /// The CloudEvents `type`: `dev.drover.rollout.<kind>`.
    pub fn event_type(self) -> String {
        format!("dev.drover.rollout.{}", self.as_str())
    }

    /// Parse a configured name.
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s.trim())
    }

    /// The notification an Event of `reason` makes, if any.
    pub fn of_event(reason: &str) -> Option<Kind> {
        Some(match reason {
            "Applied" => Kind::Available,
            "RolloutRolling" => Kind::Started,
            "RolloutBlocked" => Kind::Blocked,
            "RolloutHalted" => Kind::Halted,
            "RolledBack" => Kind::RolledBack,
            "RolloutRevoked" => Kind::Revoked,
            "Confirmed" => Kind::Confirmed,
            _ => return None,
        })
    }
}

/// How notifications are sent (flags `--notify-*`, docs/install.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Receivers: http(s) URLs, each gets every notification.
    pub endpoints: Vec<String>,
    /// The kinds sent (every kind when configured empty).
    pub kinds: Vec<Kind>,
    /// The HMAC-SHA256 key (the secret file's bytes, trailing newline cut).
    pub secret: Option<Vec<u8>>,
    /// Most notifications waiting per endpoint.
    pub queue: usize,
    /// Most delivery attempts of one notification.
    pub attempts: u32,
    /// Oldest a notification may be and still be tried.
    pub max_age: Duration,
    /// Longest wait for one request.
    pub timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            endpoints: Vec::new(),
            kinds: Kind::ALL.to_vec(),
            secret: None,
            queue: 1000,
            attempts: 30,
            max_age: Duration::from_secs(3600),
            timeout: Duration::from_secs(10),
        }
    }
}

impl Config {
    /// The settings as the agent's flags give them, each checked: http(s)
    /// URLs with a host, known kinds, the bounds' ranges; the error names
    /// the flag and what would be valid.
    pub fn from_flags(
        urls: &[String],
        kinds: Option<&[String]>,
        secret: Option<Vec<u8>>,
        queue: Option<usize>,
        attempts: Option<u32>,
        max_age: Option<Duration>,
    ) -> Result<Config, String> {
        let mut n = Config {
            secret,
            ..Config::default()
        };
        for url in urls.iter().map(|u| u.trim()).filter(|u| !u.is_empty()) {
            let ok = url.parse::<http::Uri>().is_ok_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            });
            if !ok {
                return Err(format!(
                    "--notify-url: {url:?} must be an http:// or https:// URL with a host"
                ));
            }
            n.endpoints.push(url.to_owned());
        }
        if let Some(names) = kinds {
            n.kinds = names
                .iter()
                .filter(|s| !s.trim().is_empty())
                .map(|s| {
                    Kind::parse(s).ok_or_else(|| {
                        format!(
                            "--notify-events: {s:?} is not a notification; valid: {}",
                            Kind::ALL.map(Kind::as_str).join(", ")
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(q) = queue {
            if !(1..=100_000).contains(&q) {
                return Err(format!("--notify-queue: {q} is out of range 1 to 100000"));
            }
            n.queue = q;
        }
        if let Some(a) = attempts {
            if !(1..=1000).contains(&a) {
                return Err(format!(
                    "--notify-max-attempts: {a} is out of range 1 to 1000"
                ));
            }
            n.attempts = a;
        }
        if let Some(d) = max_age {
            n.max_age = d;
        }
        Ok(n)
    }
}

/// Where notifications are counted.
#[derive(Clone, Default)]
pub struct Counters {
    /// `drover_notifications_delivered_total`.
    pub delivered: Counter,
    /// `drover_notifications_dropped_total{reason}`: `queue_full`,
    /// `attempts`, `age`.
    pub dropped: Family<Vec<(String, String)>, Counter>,
    /// `drover_notification_attempts_failed_total`.
    pub failed: Counter,
    /// `drover_notifications_waiting`.
    pub waiting: Gauge,
}

/// A CloudEvent in the spec's JSON format (structured mode).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CloudEvent {
    /// `1.0`.
    pub specversion: String,
    /// Unique per source.
    pub id: String,
    /// `drover/<env>/<cluster>`.
    pub source: String,
    /// `dev.drover.rollout.<kind>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The object it is about: the node, or the status object.
    pub subject: String,
    /// When the agent told it (RFC 3339).
    pub time: String,
    /// `application/json`.
    pub datacontenttype: String,
    /// What happened.
    pub data: Data,
}

/// The event's `data`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Data {
    /// Environment.
    pub env: String,
    /// Cluster.
    pub cluster: String,
    /// The Event's reason (`Applied`, `RolloutBlocked`...).
    pub reason: String,
    /// The Event's note: what happened, the version named.
    pub message: String,
}

/// One notification waiting for an endpoint.
#[derive(Debug, Clone)]
struct Pending {
    body: Arc<Vec<u8>>,
    signature: Option<Arc<str>>,
    made: Instant,
    tries: u32,
}

/// One endpoint's queue.
struct Queue {
    url: String,
    items: Mutex<VecDeque<Pending>>,
    wake: tokio::sync::Notify,
}

/// Sends the agent's notifications; cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: Config,
    source: String,
    env: String,
    cluster: String,
    queues: Vec<Arc<Queue>>,
    counters: Counters,
    seq: std::sync::atomic::AtomicU64,
    /// Drops are logged at most once a minute, with a count.
    pace: crate::retry::Paced,
    /// When this notifier was made (Unix nanoseconds): with the sequence,
    /// an id no other notification of this source has, across restarts.
    boot: i64,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("endpoints", &self.inner.cfg.endpoints)
            .finish()
    }
}

impl Notifier {
    /// A notifier for `env`/`cluster`; delivers once [`Notifier::start`]ed.
    pub fn new(cfg: Config, env: &str, cluster: &str, counters: Counters) -> Self {
        let queues = cfg
            .endpoints
            .iter()
            .map(|url| {
                Arc::new(Queue {
                    url: url.clone(),
                    items: Mutex::new(VecDeque::new()),
                    wake: tokio::sync::Notify::new(),
                })
            })
            .collect();
        Notifier {
            inner: Arc::new(Inner {
                source: format!("drover/{env}/{cluster}"),
                env: env.to_owned(),
                cluster: cluster.to_owned(),
                cfg,
                queues,
                counters,
                seq: Default::default(),
                pace: Default::default(),
                boot: chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0),
            }),
        }
    }

    /// Start one delivery task per endpoint on the current runtime; they
    /// end when `stop` reads true (what is still queued is dropped with
    /// the process).
    pub fn start(
        &self,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let http = match client() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "notifications cannot be sent: no HTTP client");
                return Vec::new();
            }
        };
        self.inner
            .queues
            .iter()
            .map(|q| {
                let inner = self.inner.clone();
                let q = q.clone();
                let http = http.clone();
                let stop = stop.clone();
                tokio::spawn(async move { deliver(inner, q, http, stop).await })
            })
            .collect()
    }

    /// The notification for an Event with `reason` and `note` about
    /// `subject`, when its kind is configured: queued for every endpoint.
    /// Never waits.
    pub fn notify_event(&self, reason: &str, subject: &str, note: &str) {
        let Some(kind) = Kind::of_event(reason) else {
            return;
        };
        let inner = &self.inner;
        if inner.queues.is_empty() || !inner.cfg.kinds.contains(&kind) {
            return;
        }
        let seq = inner.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = chrono::Utc::now();
        let event = CloudEvent {
            specversion: "1.0".into(),
            id: format!("{:x}-{seq}", inner.boot),
            source: inner.source.clone(),
            kind: kind.event_type(),
            subject: subject.to_owned(),
            time: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            datacontenttype: "application/json".into(),
            data: Data {
                env: inner.env.clone(),
                cluster: inner.cluster.clone(),
                reason: reason.to_owned(),
                message: note.to_owned(),
            },
        };
        let Ok(body) = serde_json::to_vec(&event) else {
            return;
        };
        let signature = inner
            .cfg
            .secret
            .as_deref()
            .map(|k| Arc::<str>::from(format!("sha256={}", sign(k, &body))));
        let pending = Pending {
            body: Arc::new(body),
            signature,
            made: Instant::now(),
            tries: 0,
        };
        for q in &inner.queues {
            let full = {
                let mut items = lock(&q.items);
                items.push_back(pending.clone());
                (items.len() > inner.cfg.queue).then(|| items.pop_front())
            };
            if full.is_some() {
                inner.dropped("queue_full", &q.url);
            }
            q.wake.notify_one();
        }
        inner.count_waiting();
    }
}

impl Inner {
    fn dropped(&self, reason: &'static str, url: &str) {
        self.counters
            .dropped
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
        if let Some(n) = self.pace.allow(reason) {
            tracing::warn!(endpoint = %url, reason, suppressed = n, "a notification was dropped");
        }
    }

    fn count_waiting(&self) {
        let n: usize = self.queues.iter().map(|q| lock(&q.items).len()).sum();
        self.counters
            .waiting
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// `hex(HMAC-SHA256(key, body))`.
pub fn sign(key: &[u8], body: &[u8]) -> String {
    use hmac::Mac as _;
    let mut mac = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(key)
        .expect("HMAC takes a key of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

type Http = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<hyper::body::Bytes>,
>;

fn client() -> Result<Http, crate::tls::Error> {
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(Duration::from_secs(5)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(crate::tls::client_config()?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(1)
            .build(https),
    )
}

/// Deliver `q` in order until `stop`.
async fn deliver(
    inner: Arc<Inner>,
    q: Arc<Queue>,
    http: Http,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff =
        crate::retry::Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    loop {
        let head = lock(&q.items).front().cloned();
        let Some(head) = head else {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                _ = q.wake.notified() => continue,
            }
        };
        if head.made.elapsed() > inner.cfg.max_age {
            pop_if_head(&q, &head);
            inner.dropped("age", &q.url);
            inner.count_waiting();
            continue;
        }
        let result = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            r = tokio::time::timeout(inner.cfg.timeout, post(&http, &q.url, &head)) => r,
        };
        let error = match result {
            Ok(Ok(())) => {
                pop_if_head(&q, &head);
                inner.counters.delivered.inc();
                inner.count_waiting();
                backoff.reset();
                continue;
            }
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {:?}", inner.cfg.timeout),
        };
        inner.counters.failed.inc();
        let tries = {
            let mut items = lock(&q.items);
            match items.front_mut() {
                Some(p) if Arc::ptr_eq(&p.body, &head.body) => {
                    p.tries += 1;
                    p.tries
                }
                _ => 0,
            }
        };
        if tries >= inner.cfg.attempts {
            pop_if_head(&q, &head);
            inner.dropped("attempts", &q.url);
            inner.count_waiting();
        } else if let Some(n) = inner.pace.allow("notify-failed") {
            tracing::warn!(endpoint = %q.url, error = %error, suppressed = n, "a notification could not be delivered; retrying with backoff");
        }
        let delay = backoff.next_delay();
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Remove the queue's head if it is still `p` (a full queue may have dropped it).
fn pop_if_head(q: &Queue, p: &Pending) {
    let mut items = lock(&q.items);
    if items.front().is_some_and(|h| Arc::ptr_eq(&h.body, &p.body)) {
        items.pop_front();
    }
}

async fn post(http: &Http, url: &str, p: &Pending) -> Result<(), String> {
    let mut req = hyper::Request::post(url)
        .header(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        )
        .header("user-agent", concat!("drover/", env!("CARGO_PKG_VERSION")));
    if let Some(s) = &p.signature {
        req = req.header("x-drover-signature", s.as_ref());
    }
    let req = req
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            p.body.as_ref().clone(),
        )))
        .map_err(|e| format!("bad request for {url}: {e}"))?;
    let resp = http.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    // The body is not read: a receiver's answer is its status.
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("the receiver answered {status}"))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_event_and_round_trips_its_name() {
        let reasons = [
            "Applied",
            "RolloutRolling",
            "RolloutBlocked",
            "RolloutHalted",
            "RolledBack",
            "RolloutRevoked",
            "Confirmed",
        ];
        let kinds: Vec<Kind> = reasons.iter().filter_map(|r| Kind::of_event(r)).collect();
        assert_eq!(kinds, Kind::ALL);
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        assert_eq!(Kind::of_event("RolloutPending"), None);
        assert_eq!(
            Kind::RolledBack.event_type(),
            "dev.drover.rollout.rolled-back"
        );
    }

    #[test]
    fn flags_are_checked_naming_the_flag() {
        let urls = |u: &[&str]| u.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = Config::from_flags(
            &urls(&["http://relay:8080/", " https://hooks.example/x "]),
            Some(&urls(&["started", "rolled-back"])),
            None,
            Some(10),
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            c.endpoints,
            ["http://relay:8080/", "https://hooks.example/x"]
        );
        assert_eq!(c.kinds, [Kind::Started, Kind::RolledBack]);
        assert_eq!((c.queue, c.attempts), (10, 30));
        for (u, k, q, want) in [
            (&["ftp://x/"][..], None, None, "--notify-url"),
            (&["/relative"][..], None, None, "--notify-url"),
            (
                &[][..],
                Some(&["stared"][..]),
                None,
                "valid: available, started",
            ),
            (&[][..], None, Some(0), "--notify-queue"),
        ] {
            let e = Config::from_flags(&urls(u), k.map(urls).as_deref(), None, q, None, None)
                .unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn the_signature_is_githubs_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
