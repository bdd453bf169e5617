//! A fault-injecting HTTP proxy in front of the real API server, for tests
//! of what drover does when one call fails: the request a rule picks (say,
//! the pod list of one node) is answered by the proxy with the status the
//! rule says, as the API server answers an error (a `Status` object); every
//! other request, watches included (streamed), goes to the API server.
//!
//! The client side is plain HTTP on loopback (kube's client speaks
//! `http://` as well as `https://`); upstream the proxy connects over TLS
//! as the control plane's **admin** identity, whoever the client is, so it
//! fronts admin clients only. [`ApiProxy::config`] is the admin client
//! config pointed at the proxy.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use super::backend::admin_config;
use super::kube::ControlPlane;

type Body = BoxBody<Bytes, hyper::Error>;
type Upstream = HttpClient<hyper_rustls::HttpsConnector<HttpConnector>, Incoming>;

/// Which requests a rule answers: method, path and query pairs (decoded).
pub type Matcher = dyn Fn(&Method, &str, &[(String, String)]) -> bool + Send + Sync;

/// A rule: the requests it picks are answered with `status` and `message`.
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

/// The proxy; it stops when dropped.
pub struct ApiProxy {
    addr: SocketAddr,
    rules: Arc<Mutex<Vec<Arc<Rule>>>>,
    task: tokio::task::AbortHandle,
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.task.abort();
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

impl ApiProxy {
    /// A proxy on a free loopback port in front of the control plane.
    pub async fn start() -> ApiProxy {
        let upstream_url = admin_config().await.cluster_url;
        let upstream = upstream_client();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let rules: Arc<Mutex<Vec<Arc<Rule>>>> = Arc::default();
        let r = rules.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (rules, upstream, base) = (r.clone(), upstream.clone(), upstream_url.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        serve(req, rules.clone(), upstream.clone(), base.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        })
        .abort_handle();
        ApiProxy { addr, rules, task }
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

    /// The admin client config, through the proxy.
    pub async fn config(&self) -> kube::Config {
        let mut config = admin_config().await;
        config.cluster_url = format!("http://{}", self.addr).parse().unwrap();
        config
    }
}

/// A TLS client to the API server as the admin identity.
fn upstream_client() -> Upstream {
    let pki = ControlPlane::get().dir().join("pki");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.join("ca.crt")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.join("admin.crt"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(pki.join("admin.key")).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)
    .unwrap();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    HttpClient::builder(TokioExecutor::new()).build(https)
}

async fn serve(
    req: Request<Incoming>,
    rules: Arc<Mutex<Vec<Arc<Rule>>>>,
    upstream: Upstream,
    base: http::Uri,
) -> Result<Response<Body>, hyper::Error> {
    let q = query(req.uri());
    let rule = rules
        .lock()
        .unwrap()
        .iter()
        .find(|r| (r.matches)(req.method(), req.uri().path(), &q))
        .cloned();
    if let Some(rule) = rule {
        rule.hits.fetch_add(1, Ordering::SeqCst);
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": rule.message,
            "reason": if rule.status == 403 { "Forbidden" } else { "InternalError" },
            "code": rule.status,
        });
        let body = Full::new(Bytes::from(status.to_string()))
            .map_err(|never| match never {})
            .boxed();
        return Ok(Response::builder()
            .status(StatusCode::from_u16(rule.status).unwrap())
            .header("content-type", "application/json")
            .body(body)
            .unwrap());
    }
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    parts.uri = format!(
        "{}://{}{path}",
        base.scheme_str().unwrap_or("https"),
        base.authority().unwrap()
    )
    .parse()
    .unwrap();
    parts.headers.remove(http::header::HOST);
    match upstream.request(Request::from_parts(parts, body)).await {
        Ok(resp) => Ok(resp.map(|b| b.boxed())),
        Err(e) => {
            let body = Full::new(Bytes::from(format!("proxy: upstream failed: {e}")))
                .map_err(|never| match never {})
                .boxed();
            Ok(Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(body)
                .unwrap())
        }
    }
}
