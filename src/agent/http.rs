//! The agent's HTTP server: `/metrics`, `/healthz`, `/readyz`, and the
//! webhook router from [`crate::source::trigger`] on `/webhook`.

use super::metrics::Metrics;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

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
    /// The server failed.
    #[error("http server: {0}")]
    Serve(#[source] std::io::Error),
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

    /// Serve `app` until `shutdown` becomes true, then finish in-flight requests.
    pub async fn serve(
        self,
        app: Router,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), Error> {
        axum::serve(self.listener, app)
            .with_graceful_shutdown(async move {
                let _ = shutdown.wait_for(|s| *s).await;
            })
            .await
            .map_err(Error::Serve)
    }
}
