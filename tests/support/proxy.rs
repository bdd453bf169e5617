//! Faults between a client and a real server on loopback.
//!
//! - [`TcpProxy`]: forwards TCP to a server (a git daemon, the API server)
//!   and can be switched, at any time, to refuse connections (a stopped
//!   server: open connections are dropped, new ones refused) or to stall
//!   (a server that accepts connections and sends nothing: connections are
//!   accepted, nothing is read or forwarded in either direction, bytes wait
//!   in the kernel's buffers). Back up, stalled connections go on where
//!   they stopped; going through `Refuse` first drops them instead, as a
//!   path that lost the packets meanwhile would.
//! - [`ThrottleProxy`]: a plain-HTTP front of the API server that answers
//!   429 (`TooManyRequests`, `Retry-After: 1`), as API priority and fairness
//!   does, to every request the test's predicate picks, and forwards the
//!   rest (watches included) through an admin client.
//!
//! Each runs on a thread and runtime of its own, as the agents do: a test
//! that blocks its own thread (joining an agent that stops through the
//! proxy) must not stop the proxy too. Dropping one stops it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What a [`TcpProxy`] does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Up,
    /// Refuse new connections and drop open ones.
    Refuse,
    /// Accept connections, read and forward nothing.
    Stall,
}

/// The mode, and how many times `Refuse` was set: a connection older than
/// the last `Refuse` is dropped even if the proxy is up again by the time
/// it looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    mode: Mode,
    resets: u64,
}

/// A TCP proxy on a loopback port of its own (see the module docs).
pub struct TcpProxy {
    pub addr: SocketAddr,
    state: watch::Sender<State>,
    /// Connections accepted so far.
    accepted: Arc<AtomicU64>,
}

impl TcpProxy {
    /// A proxy to `upstream`, forwarding.
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let (state, state_rx) = watch::channel(State {
            mode: Mode::Up,
            resets: 0,
        });
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        on_own_runtime(async move {
            let listener = TcpListener::from_std(std_listener).unwrap();
            accept(Some(listener), addr, upstream, state_rx, count).await;
        });
        TcpProxy {
            addr,
            state,
            accepted,
        }
    }

    /// Switch to `mode`.
    pub fn set(&self, mode: Mode) {
        self.state.send_modify(|s| {
            s.mode = mode;
            if mode == Mode::Refuse {
                s.resets += 1;
            }
        });
    }

    /// Connections accepted so far (a stalled server still accepts).
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// Run `f` on a thread and current-thread runtime of its own; the runtime
/// is dropped (its tasks with it) once `f` returns.
fn on_own_runtime(f: impl std::future::Future<Output = ()> + Send + 'static) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(f);
        rt.shutdown_background();
    });
}

async fn accept(
    mut listener: Option<TcpListener>,
    addr: SocketAddr,
    upstream: SocketAddr,
    mut state: watch::Receiver<State>,
    accepted: Arc<AtomicU64>,
) {
    loop {
        let Some(l) = listener.as_ref() else {
            // Refusing: nothing listens until the mode changes.
            if state.wait_for(|s| s.mode != Mode::Refuse).await.is_err() {
                return;
            }
            listener = Some(
                TcpListener::bind(addr)
                    .await
                    .expect("rebind the proxy port"),
            );
            continue;
        };
        let mut refuse = state.clone();
        tokio::select! {
            r = l.accept() => {
                let Ok((client, _)) = r else { continue };
                accepted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(forward(client, upstream, state.clone()));
            }
            r = refuse.wait_for(|s| s.mode == Mode::Refuse) => {
                if r.is_err() { return }
                listener = None;
            }
        }
    }
}

/// One connection: forwards while up, holds while stalled, ends at the
/// next `Refuse` (even one already followed by `Up`).
async fn forward(mut client: TcpStream, upstream: SocketAddr, mut state: watch::Receiver<State>) {
    let born = state.borrow().resets;
    let mut server: Option<TcpStream> = None;
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        let now = *state.borrow_and_update();
        if now.resets != born {
            return;
        }
        match now.mode {
            Mode::Refuse => return,
            Mode::Stall => {
                if state.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Mode::Up => {}
        }
        if server.is_none() {
            match TcpStream::connect(upstream).await {
                Ok(s) => server = Some(s),
                Err(_) => return,
            }
        }
        let s = server.as_mut().unwrap();
        // A mode switch is seen before any byte that came after it: a write
        // sent once the path stalls is held, never forwarded.
        tokio::select! {
            biased;
            r = state.changed() => if r.is_err() { return },
            r = client.read(&mut up) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => if s.write_all(&up[..n]).await.is_err() { return },
            },
            r = s.read(&mut down) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => if client.write_all(&down[..n]).await.is_err() { return },
            },
        }
    }
}

/// A plain-HTTP front of the API server that throttles what `throttled`
/// picks (see the module docs).
pub struct ThrottleProxy {
    pub addr: SocketAddr,
    /// Requests answered 429 so far.
    pub refused: Arc<AtomicU64>,
    on: watch::Sender<bool>,
}

impl ThrottleProxy {
    /// Forward to the API server as `config` says (the admin's: the proxy
    /// adds the credentials, its clients send none; without kube's retry
    /// layer, so that a refusal reaches the client as it is), throttling
    /// every request for which `throttled(method, path)` holds while
    /// switched on (it starts on).
    pub async fn start(
        mut config: kube::Config,
        throttled: fn(&http::Method, &str) -> bool,
    ) -> ThrottleProxy {
        config.default_retry = false;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let refused = Arc::new(AtomicU64::new(0));
        let (on, mut on_rx) = watch::channel(true);
        let count = refused.clone();
        on_own_runtime(async move {
            let listener = TcpListener::from_std(std_listener).unwrap();
            let client = kube::Client::try_from(config).unwrap();
            loop {
                let accepted = tokio::select! {
                    r = listener.accept() => r,
                    r = on_rx.changed() => if r.is_err() { return } else { continue },
                };
                let Ok((stream, _)) = accepted else {
                    continue;
                };
                let (client, count, on) = (client.clone(), count.clone(), on_rx.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (client, count) = (client.clone(), count.clone());
                        let throttle = *on.borrow() && throttled(req.method(), req.uri().path());
                        async move { Ok::<_, Infallible>(answer(req, client, count, throttle).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        ThrottleProxy { addr, refused, on }
    }

    /// Throttle (true) or forward everything (false).
    pub fn throttle(&self, on: bool) {
        self.on.send_replace(on);
    }

    /// A client config reaching the API server through this proxy, with
    /// `user_agent` (plain HTTP, no credentials: the proxy adds them).
    pub fn config(&self, user_agent: &str) -> kube::Config {
        let mut c = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        c.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(user_agent).unwrap(),
        ));
        c
    }
}

async fn answer(
    req: http::Request<hyper::body::Incoming>,
    client: kube::Client,
    count: Arc<AtomicU64>,
    throttle: bool,
) -> http::Response<kube::client::Body> {
    use http_body_util::BodyExt;
    if throttle {
        count.fetch_add(1, Ordering::Relaxed);
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "TooManyRequests", "code": 429,
            "message": "Too many requests, please try again later.",
        });
        return http::Response::builder()
            .status(429)
            .header("content-type", "application/json")
            .header("retry-after", "1")
            .body(kube::client::Body::from(status.to_string().into_bytes()))
            .unwrap();
    }
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut fwd = http::Request::builder().method(parts.method).uri(
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/"),
    );
    for (k, v) in &parts.headers {
        if k != http::header::HOST && k != http::header::CONNECTION {
            fwd = fwd.header(k, v);
        }
    }
    let fwd = fwd.body(kube::client::Body::from(bytes.to_vec())).unwrap();
    match client.send(fwd).await {
        Ok(r) => r,
        Err(e) => http::Response::builder()
            .status(502)
            .body(kube::client::Body::from(e.to_string().into_bytes()))
            .unwrap(),
    }
}
