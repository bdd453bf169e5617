//! What wakes the agent to fetch: a jittered poll, a webhook nudge, or a
//! file-system change when the repository is a local path (a git-sync volume).
//! Triggers only say "look now"; what to apply always comes from the fetch.

use axum::{
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, StatusCode},
    routing::post,
    Router,
};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

/// Largest webhook body accepted; forges send a few KiB.
pub const MAX_WEBHOOK_BODY: usize = 1 << 20;

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
            tx,
            rx,
            watcher: None,
        }
    }

    /// A handle for webhooks and other nudgers.
    pub fn nudger(&self) -> Nudger {
        Nudger(self.tx.clone())
    }

    /// Also wake when anything under `path` changes (local repositories only).
    pub fn watch(&mut self, path: &Path) -> Result<(), Error> {
        use notify::{EventKind, RecursiveMode, Watcher};
        let nudger = self.nudger();
        let werr = |source| Error::Watch {
            path: path.display().to_string(),
            source,
        };
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            // Reads (our own fetches open files) must not re-trigger a fetch.
            if let Ok(ev) = res {
                if !matches!(ev.kind, EventKind::Access(_)) {
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
        let f = 1.0 + rand::random_range(-self.jitter..=self.jitter);
        self.poll.mul_f64(f.max(0.0))
    }

    /// Wait for the next reason to fetch.
    pub async fn next(&mut self) -> Reason {
        let delay = self.next_delay();
        tokio::select! {
            r = self.rx.recv() => r.unwrap_or(Reason::Poll),
            _ = tokio::time::sleep(delay) => Reason::Poll,
        }
    }
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
        .layer(DefaultBodyLimit::max(MAX_WEBHOOK_BODY))
        .with_state(HookState {
            cfg: Arc::new(cfg),
            nudger,
        })
}

async fn webhook(
    State(st): State<HookState>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    if authenticate(&st.cfg, &headers, &body) {
        st.nudger.nudge(Reason::Webhook);
        (StatusCode::ACCEPTED, "fetch scheduled\n")
    } else {
        (
            StatusCode::UNAUTHORIZED,
            "signature or token missing or wrong\n",
        )
    }
}

/// Whether the request proves one of the configured secrets.
pub fn authenticate(cfg: &WebhookConfig, headers: &HeaderMap, body: &[u8]) -> bool {
    if let (Some(secret), Some(sig)) = (&cfg.hmac_secret, headers.get("x-hub-signature-256")) {
        let Some(given) = sig
            .to_str()
            .ok()
            .and_then(|s| s.strip_prefix("sha256="))
            .and_then(|h| hex::decode(h).ok())
        else {
            return false;
        };
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
            return false;
        };
        mac.update(body);
        let want = mac.finalize().into_bytes();
        return bool::from(want.as_slice().ct_eq(&given));
    }
    if let (Some(token), Some(given)) = (&cfg.token, headers.get("x-drover-token")) {
        return bool::from(token.as_slice().ct_eq(given.as_bytes()));
    }
    false
}
