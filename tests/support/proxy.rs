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
//! - [`ApiProxy`]: a plain-HTTP front of the API server that answers the
//!   requests a test's rule picks (method, path, query) with the error the
//!   rule says, as the API server answers one (a `Status` object; a 429
//!   carries `Retry-After: 1`, as API priority and fairness sends it), and
//!   forwards every other request, watches included (streamed), with the
//!   identity it was started with (the admin's unless told otherwise):
//!   one node's pod list failing, an eviction refused, Events throttled.
//!
//! Each runs on a thread and runtime of its own, as the agents do: a test
//! that blocks its own thread (joining an agent that stops through the
//! proxy) must not stop the proxy too. Dropping one stops it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::Method;

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

/// Which requests a rule answers: method, path and query pairs (decoded).
pub type Matcher = dyn Fn(&Method, &str, &[(String, String)]) -> bool + Send + Sync;

/// A rule of an [`ApiProxy`]: the requests it picks are answered with
/// `status` and `message`.
pub struct Rule {
    matches: Box<Matcher>,
    status: u16,
    message: String,
    hits: AtomicUsize,
}

impl Rule {
    /// Requests answered by this rule so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// The decoded query pairs of `uri`.
pub fn query(uri: &http::Uri) -> Vec<(String, String)> {
    form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// A matcher for one node's pod *list* (not its watch): what a drain pass
/// and the observation of a draining node read.
pub fn pod_list_of(node: &str) -> impl Fn(&Method, &str, &[(String, String)]) -> bool {
    let selector = format!("spec.nodeName={node}");
    move |method, path, q| {
        *method == Method::GET
            && path == "/api/v1/pods"
            && q.iter()
                .any(|(k, v)| k == "fieldSelector" && *v == selector)
            && !q.iter().any(|(k, v)| k == "watch" && v == "true")
    }
}

type Rules = Arc<Mutex<Vec<Arc<Rule>>>>;

/// A plain-HTTP front of the API server (see the module docs); it stops
/// when dropped.
pub struct ApiProxy {
    pub addr: SocketAddr,
    rules: Rules,
    _stop: watch::Sender<()>,
}

impl ApiProxy {
    /// A front of the control plane, forwarding as its admin.
    pub async fn start() -> ApiProxy {
        ApiProxy::start_as(super::backend::admin_config().await).await
    }

    /// A front forwarding to the API server as `config` says: its
    /// identity is added to every request (clients send none), and kube's
    /// retry layer is off, so an answer reaches the client as it is.
    pub async fn start_as(mut config: kube::Config) -> ApiProxy {
        config.default_retry = false;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let rules: Rules = Arc::default();
        let (stop, mut stopped) = watch::channel(());
        let r = rules.clone();
        on_own_runtime(async move {
            let listener = TcpListener::from_std(std_listener).unwrap();
            let client = kube::Client::try_from(config).unwrap();
            loop {
                let accepted = tokio::select! {
                    r = listener.accept() => r,
                    _ = stopped.changed() => return,
                };
                let Ok((stream, _)) = accepted else {
                    continue;
                };
                let (client, rules) = (client.clone(), r.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let client = client.clone();
                        let rule = rule_for(&rules, &req);
                        async move { Ok::<_, Infallible>(serve(req, client, rule).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        ApiProxy {
            addr,
            rules,
            _stop: stop,
        }
    }

    /// Answer the requests `matches` picks with `status` (and a `Status`
    /// object carrying `message`), from now on; returns the rule, to count
    /// its hits.
    pub fn answer(
        &self,
        status: u16,
        message: &str,
        matches: impl Fn(&Method, &str, &[(String, String)]) -> bool + Send + Sync + 'static,
    ) -> Arc<Rule> {
        let rule = Arc::new(Rule {
            matches: Box::new(matches),
            status,
            message: message.to_string(),
            hits: AtomicUsize::new(0),
        });
        self.rules.lock().unwrap().push(rule.clone());
        rule
    }

    /// Forward everything again.
    pub fn clear(&self) {
        self.rules.lock().unwrap().clear();
    }

    /// A client config reaching the API server through this proxy (plain
    /// HTTP, no credentials: the proxy adds them).
    pub fn config(&self) -> kube::Config {
        kube::Config::new(format!("http://{}", self.addr).parse().unwrap())
    }

    /// [`ApiProxy::config`] sending `user_agent`.
    pub fn config_with_user_agent(&self, user_agent: &str) -> kube::Config {
        let mut c = self.config();
        c.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(user_agent).unwrap(),
        ));
        c
    }
}

/// The first rule picking `req`, counted as a hit.
fn rule_for<B>(rules: &Rules, req: &http::Request<B>) -> Option<Arc<Rule>> {
    let q = query(req.uri());
    let rule = rules
        .lock()
        .unwrap()
        .iter()
        .find(|r| (r.matches)(req.method(), req.uri().path(), &q))
        .cloned();
    if let Some(r) = &rule {
        r.hits.fetch_add(1, Ordering::SeqCst);
    }
    rule
}

async fn serve(
    req: http::Request<hyper::body::Incoming>,
    client: kube::Client,
    rule: Option<Arc<Rule>>,
) -> http::Response<kube::client::Body> {
    use http_body_util::BodyExt;
    if let Some(rule) = rule {
        let reason = match rule.status {
            403 => "Forbidden",
            429 => "TooManyRequests",
            _ => "InternalError",
        };
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": rule.message,
            "reason": reason, "code": rule.status,
        });
        let mut resp = http::Response::builder()
            .status(rule.status)
            .header("content-type", "application/json");
        if rule.status == 429 {
            resp = resp.header("retry-after", "1");
        }
        return resp
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
        if k != http::header::HOST
            && k != http::header::CONNECTION
            && k != http::header::TRANSFER_ENCODING
        {
            fwd = fwd.header(k, v);
        }
    }
    let fwd = fwd.body(kube::client::Body::from(bytes.to_vec())).unwrap();
    match client.send(fwd).await {
        Ok(r) => r,
        Err(e) => http::Response::builder()
            .status(502)
            .body(kube::client::Body::from(
                format!("proxy: upstream failed: {e}").into_bytes(),
            ))
            .unwrap(),
    }
}
