//! What wakes the agent to fetch: a jittered poll, a webhook nudge, or a
//! file-system change when the repository is a local path (a git-sync volume).
//! Triggers only say "look now"; what to apply always comes from the fetch.

use axum::{
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode},
    routing::post,
    Router,
};
use hmac::{Hmac, Mac};
use http_body_util::BodyExt;
use sha2::Sha256;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

/// Largest webhook body accepted; forges send a few KiB.
pub const MAX_WEBHOOK_BODY: usize = 1 << 20;

/// Longest time a client may take to send a webhook body; a stalled sender
/// is cut off after it (the headers have their own bound in the HTTP server).
pub const WEBHOOK_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Default shortest time between two fetches started by nudges (webhooks,
/// local changes): a burst or a replay of deliveries costs one fetch per
/// interval, whatever its size.
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(5);

/// Errors of the triggers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The watch on a local repository could not be set up.
    #[error("cannot watch {path}: {source}")]
    Watch {
        /// The watched path.
        path: String,
        /// Cause.
        source: notify::Error,
    },
}

/// Why the agent woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The poll interval elapsed.
    Poll,
    /// An authenticated webhook arrived.
    Webhook,
    /// The local repository changed on disk.
    Watch,
}

/// Sends nudges to a [`Trigger`]; cheap to clone. Nudges coalesce: while one
/// is pending, more are dropped, since one fetch serves them all.
#[derive(Debug, Clone)]
pub struct Nudger(mpsc::Sender<Reason>);

impl Nudger {
    /// Ask for a fetch now.
    pub fn nudge(&self, why: Reason) {
        let _ = self.0.try_send(why);
    }
}

/// The combined trigger the agent awaits.
pub struct Trigger {
    poll: Duration,
    jitter: f64,
    min_interval: Duration,
    /// A nudge received and not yet answered (waiting for `min_interval`).
    pending: Option<Reason>,
    /// When [`Trigger::next`] last returned.
    last: Option<tokio::time::Instant>,
    /// When the next poll is due. Owned here, across calls, because the
    /// agent's loop drops `next()` whenever something else wakes it first
    /// (the tick, a cluster change): a sleep armed per call would restart on
    /// every turn and a poll longer than the tick would never fire.
    poll_at: Option<tokio::time::Instant>,
    tx: mpsc::Sender<Reason>,
    rx: mpsc::Receiver<Reason>,
    watcher: Option<notify::RecommendedWatcher>,
}

impl std::fmt::Debug for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trigger")
            .field("poll", &self.poll)
            .field("watching", &self.watcher.is_some())
            .finish()
    }
}

impl Trigger {
    /// Poll every `poll` (default in the agent: 1 minute), ±10 % jitter so a
    /// fleet's agents do not hit the server in step.
    pub fn new(poll: Duration) -> Self {
        let (tx, rx) = mpsc::channel(1);
        Self {
            poll,
            jitter: 0.1,
            min_interval: DEFAULT_MIN_INTERVAL,
            pending: None,
            last: None,
            poll_at: None,
            tx,
            rx,
            watcher: None,
        }
    }

    /// A handle for webhooks and other nudgers.
    pub fn nudger(&self) -> Nudger {
        Nudger(self.tx.clone())
    }

    /// Also wake when a ref under `path` changes, or anything outside its
    /// object store and reflogs (local repositories only; see [`announces`]).
    pub fn watch(&mut self, path: &Path) -> Result<(), Error> {
        use notify::{EventKind, RecursiveMode, Watcher};
        let nudger = self.nudger();
        let root = path.to_path_buf();
        let werr = |source| Error::Watch {
            path: path.display().to_string(),
            source,
        };
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            // Reads (our own fetches open files) must not re-trigger a fetch.
            if let Ok(ev) = res {
                if !matches!(ev.kind, EventKind::Access(_))
                    && ev.paths.iter().any(|p| announces(&root, p))
                {
                    nudger.nudge(Reason::Watch);
                }
            }
        })
        .map_err(werr)?;
        watcher
            .watch(path, RecursiveMode::Recursive)
            .map_err(werr)?;
        self.watcher = Some(watcher);
        Ok(())
    }

    /// The next poll delay, jittered.
    pub fn next_delay(&self) -> Duration {
        let f = 1.0 + crate::replay::random_between(-self.jitter, self.jitter);
        self.poll.mul_f64(f.max(0.0))
    }

    /// Nudges are answered no sooner than `d` after the previous answer
    /// (default [`DEFAULT_MIN_INTERVAL`]); the poll is not affected.
    pub fn set_min_interval(&mut self, d: Duration) {
        self.min_interval = d;
    }

    /// Wait for the next reason to fetch. Nudges coalesce: one is kept
    /// while it waits for the minimum interval, the others are dropped.
    /// Cancel-safe: a nudge received before cancellation is kept for the
    /// next call, and the poll stays due when it was due, however often the
    /// caller drops this future to serve something else.
    pub async fn next(&mut self) -> Reason {
        let due = match self.poll_at {
            Some(t) => t,
            None => *self
                .poll_at
                .insert(tokio::time::Instant::now() + self.next_delay()),
        };
        let poll = tokio::time::sleep_until(due);
        tokio::pin!(poll);
        loop {
            if let Some(r) = self.pending {
                let earliest = self
                    .last
                    .map(|t| t + self.min_interval)
                    .unwrap_or_else(tokio::time::Instant::now);
                // Biased (here and below): one order when both are ready, so
                // that a simulated run replays (crate::replay).
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(earliest) => {}
                    _ = &mut poll => {}
                }
                self.pending = None;
                // The fetch that answers the poll also answers the nudge.
                let r = if poll.is_elapsed() { Reason::Poll } else { r };
                return self.answered(r);
            }
            tokio::select! {
                biased;
                r = self.rx.recv() => match r {
                    Some(r) => self.pending = Some(r),
                    // Unreachable (we hold a sender); never spin on it.
                    None => { (&mut poll).await; return self.answered(Reason::Poll) }
                },
                _ = &mut poll => return self.answered(Reason::Poll),
            }
        }
    }

    /// Every answer is a fetch, so the next poll is due a (jittered) poll
    /// interval after it, as Flux requeues after any reconcile.
    fn answered(&mut self, r: Reason) -> Reason {
        let now = tokio::time::Instant::now();
        self.pending = None;
        self.last = Some(now);
        self.poll_at = Some(now + self.next_delay());
        r
    }
}

/// Whether a change to `path` in a watched repository can announce a new
/// commit. A push or a git-sync fetch writes its objects, the reflog and the
/// ref's lock file before it renames the lock over the ref; a fetch woken by
/// those earlier writes still sees the old head and spends the minimum
/// interval between nudged fetches, so the ref change itself waited up to
/// that interval (2–5 s with the default 5 s, against well under a second
/// over `git://`). Only ref files, `HEAD`s and anything outside the object
/// store (a worktree, git-sync's symlink swap) wake the agent.
fn announces(root: &Path, path: &Path) -> bool {
    // Names above the watched directory (a volume under /var/logs) are not the repository's.
    let inside = path.strip_prefix(root).unwrap_or(path);
    let in_git_internals = inside
        .components()
        .any(|c| matches!(c.as_os_str().to_str(), Some("objects" | "logs")));
    let lock = path.extension().is_some_and(|e| e == "lock");
    !in_git_internals && !lock
}

/// Secrets a webhook must prove; at least one must be set or every request is refused.
#[derive(Debug, Clone, Default)]
pub struct WebhookConfig {
    /// GitHub-style `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`.
    pub hmac_secret: Option<Vec<u8>>,
    /// Plain shared token in `X-Drover-Token`, for forges without HMAC.
    pub token: Option<Vec<u8>>,
}

#[derive(Clone)]
struct HookState {
    cfg: Arc<WebhookConfig>,
    nudger: Nudger,
}

/// Router serving `POST /webhook`; the agent mounts it. It only nudges a fetch.
pub fn webhook_router(cfg: WebhookConfig, nudger: Nudger) -> Router {
    Router::new()
        .route("/webhook", post(webhook))
        .with_state(HookState {
            cfg: Arc::new(cfg),
            nudger,
        })
}

const UNAUTHORIZED: (StatusCode, &str) = (
    StatusCode::UNAUTHORIZED,
    "signature or token missing or wrong\n",
);

/// Authenticates before keeping anything: a token is checked from the
/// headers alone (the body is never read), an HMAC signature is checked by
/// streaming the body through the MAC under [`MAX_WEBHOOK_BODY`] and
/// [`WEBHOOK_BODY_TIMEOUT`]. A bad request costs the bytes read, no buffer.
async fn webhook(
    State(st): State<HookState>,
    headers: HeaderMap,
    body: Body,
) -> (StatusCode, &'static str) {
    let ok = match check_headers(&st.cfg, &headers) {
        Check::Accept => true,
        Check::Refuse => false,
        Check::Mac(mac, given) => {
            let declared = headers
                .get(axum::http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > MAX_WEBHOOK_BODY as u64) {
                return too_large();
            }
            match tokio::time::timeout(WEBHOOK_BODY_TIMEOUT, stream_mac(*mac, body)).await {
                Ok(Ok(mac)) => mac.verify_slice(&given).is_ok(),
                Ok(Err(BodyError::TooLarge)) => return too_large(),
                Ok(Err(BodyError::Read)) => false,
                Err(_) => {
                    return (
                        StatusCode::REQUEST_TIMEOUT,
                        "the body did not arrive in time\n",
                    )
                }
            }
        }
    };
    if ok {
        st.nudger.nudge(Reason::Webhook);
        (StatusCode::ACCEPTED, "fetch scheduled\n")
    } else {
        UNAUTHORIZED
    }
}

fn too_large() -> (StatusCode, &'static str) {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        "webhook body over 1 MiB refused\n",
    )
}

enum BodyError {
    TooLarge,
    Read,
}

/// Feed the body into `mac` frame by frame, keeping none of it.
async fn stream_mac(mut mac: Hmac<Sha256>, mut body: Body) -> Result<Hmac<Sha256>, BodyError> {
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| BodyError::Read)?;
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen > MAX_WEBHOOK_BODY {
                return Err(BodyError::TooLarge);
            }
            mac.update(&data);
        }
    }
    Ok(mac)
}

/// What the headers alone decide.
enum Check {
    /// A valid token.
    Accept,
    /// No usable credential: refuse without reading the body.
    Refuse,
    /// A well-formed signature: the body's MAC must equal the given bytes.
    Mac(Box<Hmac<Sha256>>, Vec<u8>),
}

fn check_headers(cfg: &WebhookConfig, headers: &HeaderMap) -> Check {
    if let (Some(secret), Some(sig)) = (&cfg.hmac_secret, headers.get("x-hub-signature-256")) {
        let given = sig
            .to_str()
            .ok()
            .and_then(|s| s.strip_prefix("sha256="))
            .and_then(|h| hex::decode(h).ok())
            .filter(|g| g.len() == 32);
        return match (given, Hmac::<Sha256>::new_from_slice(secret)) {
            (Some(g), Ok(mac)) => Check::Mac(Box::new(mac), g),
            _ => Check::Refuse,
        };
    }
    if let (Some(token), Some(given)) = (&cfg.token, headers.get("x-drover-token")) {
        if bool::from(token.as_slice().ct_eq(given.as_bytes())) {
            return Check::Accept;
        }
    }
    Check::Refuse
}

/// Whether a request with `headers` and (whole) `body` proves one of the
/// configured secrets; the server itself streams the body instead.
pub fn authenticate(cfg: &WebhookConfig, headers: &HeaderMap, body: &[u8]) -> bool {
    match check_headers(cfg, headers) {
        Check::Accept => true,
        Check::Refuse => false,
        Check::Mac(mut mac, given) => {
            mac.update(body);
            mac.verify_slice(&given).is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::{sleep, Instant};

    /// The agent's loop: `next()` raced against a shorter tick, dropped and
    /// called anew on every turn. The poll must still fire on its own
    /// schedule (the defect: it never did once the tick was shorter).
    #[tokio::test(start_paused = true)]
    async fn poll_fires_while_a_shorter_tick_keeps_winning() {
        let poll = Duration::from_secs(60);
        let mut trigger = Trigger::new(poll);
        let start = Instant::now();
        let mut polls = Vec::new();
        while start.elapsed() < Duration::from_secs(600) {
            tokio::select! {
                r = trigger.next() => {
                    assert_eq!(r, Reason::Poll);
                    polls.push(start.elapsed());
                }
                _ = sleep(Duration::from_secs(30)) => {}
            }
        }
        // Ten minutes at 60 s ± 10 %: 9 or 10 polls, each within its interval.
        assert!((9..=10).contains(&polls.len()), "polls at {polls:?}");
        let mut prev = Duration::ZERO;
        for at in &polls {
            let gap = *at - prev;
            assert!(
                gap >= poll.mul_f64(0.9) && gap <= poll.mul_f64(1.1),
                "a poll {gap:?} after the previous one: {polls:?}"
            );
            prev = *at;
        }
    }

    /// A nudge answers at once and the next poll is a full interval after it.
    #[tokio::test(start_paused = true)]
    async fn a_nudge_is_answered_and_moves_the_next_poll() {
        let mut trigger = Trigger::new(Duration::from_secs(60));
        trigger.set_min_interval(Duration::ZERO);
        let nudger = trigger.nudger();
        sleep(Duration::from_secs(20)).await;
        nudger.nudge(Reason::Webhook);
        let start = Instant::now();
        assert_eq!(trigger.next().await, Reason::Webhook);
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(trigger.next().await, Reason::Poll);
        let gap = start.elapsed();
        assert!(
            gap >= Duration::from_secs(54) && gap <= Duration::from_secs(66),
            "{gap:?}"
        );
    }
}
