//! The agent's HTTP server: `/metrics`, `/healthz`, `/readyz`, and the
//! webhook router from [`crate::source::trigger`] on `/webhook`.
//!
//! Every connection is bounded: at most [`MAX_CONNECTIONS`] are served at
//! once (more wait in the listen backlog, costing no memory here), request
//! headers must arrive within [`HEADER_TIMEOUT`] and fit in
//! [`MAX_HEADER_BYTES`], and a connection lives at most
//! [`CONNECTION_LIFETIME`]. A client that opens connections and stalls thus
//! holds a bounded number of small buffers for a bounded time.

use super::metrics::Metrics;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// Connections served at once; Prometheus, the kubelet's probes and a forge need a handful.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a client has to send a request's headers (each request of a keep-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one connection; a keep-alive client simply reconnects.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Read buffer of a connection, which bounds a request's headers (hyper's minimum is 8 KiB).
pub const MAX_HEADER_BYTES: usize = 16 << 10;
/// Time in-flight requests get to finish on shutdown.
const DRAIN: Duration = Duration::from_secs(5);

/// What `/readyz` waits for: the first fetch and the first cluster sync.
#[derive(Debug, Default)]
pub struct Readiness {
    fetched: AtomicBool,
    synced: AtomicBool,
}

impl Readiness {
    /// The first fetch finished (successfully or not: the remote answered or failed, we know).
    pub fn set_fetched(&self) {
        self.fetched.store(true, Ordering::Release);
    }

    /// The first observation of the cluster's nodes succeeded.
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// Both happened.
    pub fn is_ready(&self) -> bool {
        self.fetched.load(Ordering::Acquire) && self.synced.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
}

/// The router: metrics and probes, merged with `webhook` (which serves `/webhook`).
pub fn router(metrics: Arc<Metrics>, ready: Arc<Readiness>, webhook: Option<Router>) -> Router {
    let base = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, ready });
    match webhook {
        Some(w) => base.merge(w),
        None => base,
    }
}

async fn metrics_handler(State(st): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        st.metrics.render(),
    )
}

async fn readyz(State(st): State<AppState>) -> (StatusCode, &'static str) {
    if st.ready.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first fetch and cluster sync\n",
        )
    }
}

/// Errors of the HTTP server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A bound server; [`Server::serve`] runs it until `shutdown` becomes true.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
}

impl Server {
    /// Bind `addr` (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        Ok(Server { listener })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serve `app` until `shutdown` becomes true, then give in-flight
    /// requests [`DRAIN`] to finish.
    pub async fn serve(
        self,
        app: Router,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), Error> {
        let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut conns = tokio::task::JoinSet::new();
        let mut accept_errors = crate::retry::Quiet::new(Duration::from_secs(60));
        loop {
            while conns.try_join_next().is_some() {}
            // Take a slot before accepting: past the limit, clients wait in the backlog.
            let permit = tokio::select! {
                p = limit.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = shutdown.wait_for(|s| *s) => break,
            };
            let accepted = tokio::select! {
                r = self.listener.accept() => r,
                _ = shutdown.wait_for(|s| *s) => break,
            };
            let sock = match accepted {
                Ok((sock, _)) => sock,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    if let Some(n) = accept_errors.allow() {
                        tracing::warn!(error = %e, suppressed = n, "accepting a connection failed");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            conns.spawn(serve_connection(
                sock,
                app.clone(),
                shutdown.clone(),
                permit,
            ));
        }
        let _ =
            tokio::time::timeout(DRAIN, async { while conns.join_next().await.is_some() {} }).await;
        Ok(())
    }
}

async fn serve_connection(
    sock: tokio::net::TcpStream,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    let svc = hyper_util::service::TowerToHyperService::new(app);
    let conn = builder.serve_connection(TokioIo::new(sock), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = tokio::time::sleep(CONNECTION_LIFETIME) => {}
        _ = shutdown.wait_for(|s| *s) => {}
    }
    // Finish the request in progress, then close; a stalled one is dropped.
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(DRAIN, conn).await;
}
