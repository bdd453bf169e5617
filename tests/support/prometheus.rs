//! A real Prometheus server for tests (built from its Go module by
//! `tests/prometheus/build`, cached) scraping a small exporter the test
//! controls: [`Exporter`] serves one gauge the test sets, [`Prometheus`]
//! scrapes it every second on loopback; [`CountingFront`] counts the queries
//! that reach it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

/// How often the test Prometheus scrapes its target.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// Upper bound for a Prometheus start (the first run also builds it).
const START_TIMEOUT: Duration = Duration::from_secs(900);

/// The directory holding `tests/prometheus/build`.
pub fn harness_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/prometheus")
}

/// The cached Prometheus binary, built first if its sources changed.
pub fn binary() -> anyhow::Result<PathBuf> {
    let build = harness_dir().join("build");
    let out = Command::new(&build)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", build.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", build.display(), out.status);
    }
    let path = String::from_utf8(out.stdout)?.trim().to_owned();
    Ok(PathBuf::from(path))
}

/// An exporter serving `drover_test_value{app="demo"} V` on `/metrics`,
/// V set by the test; stops with the runtime it was started on.
pub struct Exporter {
    addr: SocketAddr,
    value: Arc<AtomicU64>,
}

impl Exporter {
    /// Serves the metric at `initial` on a free loopback port.
    pub async fn start(initial: f64) -> Exporter {
        let value = Arc::new(AtomicU64::new(initial.to_bits()));
        let served = value.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let v = f64::from_bits(served.load(Ordering::SeqCst));
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        format!(
                            "# HELP drover_test_value A value the test sets.\n\
                             # TYPE drover_test_value gauge\n\
                             drover_test_value{{app=\"demo\"}} {v}\n"
                        ),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the exporter");
        let addr = listener.local_addr().expect("exporter address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Exporter { addr, value }
    }

    /// Where Prometheus scrapes it.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the value the next scrape sees.
    pub fn set(&self, v: f64) {
        self.value.store(v.to_bits(), Ordering::SeqCst);
    }
}

/// A running Prometheus; killed when dropped.
pub struct Prometheus {
    url: String,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus on a free loopback port scraping `target` every
    /// [`SCRAPE_INTERVAL`]; returns once its API answers.
    pub fn start(target: SocketAddr) -> anyhow::Result<Prometheus> {
        let bin = binary()?;
        let dir = tempfile::Builder::new().prefix("drover-prom-").tempdir()?;
        let config = dir.path().join("prometheus.yml");
        let secs = SCRAPE_INTERVAL.as_secs();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {secs}s\n  scrape_timeout: {secs}s\n\
                 scrape_configs:\n  - job_name: exporter\n    static_configs:\n      \
                 - targets: [\"{target}\"]\n"
            ),
        )?;
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        // stdin stays a pipe we hold: Prometheus exits when it closes, so a
        // killed test binary leaves no server behind.
        let mut child = Command::new(&bin)
            .arg("--config")
            .arg(&config)
            .arg("--data")
            .arg(dir.path().join("data"))
            .arg("--listen")
            .arg("127.0.0.1:0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut prom = Prometheus {
            url: String::new(),
            child: Some(child),
            _dir: dir,
        };
        let line = rx
            .recv_timeout(START_TIMEOUT)
            .context("Prometheus did not report READY")?;
        match line.trim().strip_prefix("READY ") {
            Some(url) => prom.url = url.to_owned(),
            None => {
                let log = std::fs::read_to_string(prom._dir.path().join("prometheus.log"))
                    .unwrap_or_default();
                bail!("Prometheus did not start: {line:?}\n{log}");
            }
        }
        Ok(prom)
    }

    /// Its base URL, such as `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops it and waits until it has exited (its port then refuses).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A front of a real Prometheus that counts the instant queries it
/// forwards (`/api/v1/query`), as the server received them: how often the
/// agent asked, not what the agent says it asked.
pub struct CountingFront {
    url: String,
    queries: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingFront {
    /// In front of the Prometheus at `upstream` (its base URL).
    pub async fn start(upstream: &str) -> CountingFront {
        use http_body_util::{BodyExt, Full};
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let queries = Arc::new(AtomicUsize::new(0));
        let (q, upstream) = (queries.clone(), upstream.trim_end_matches('/').to_string());
        let client: Client<_, Full<hyper::body::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (q, upstream, client) = (q.clone(), upstream.clone(), client.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                        let (q, upstream, client) = (q.clone(), upstream.clone(), client.clone());
                        async move {
                            if req.uri().path() == "/api/v1/query" {
                                q.fetch_add(1, Ordering::SeqCst);
                            }
                            let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
                            let fwd = hyper::Request::get(format!("{upstream}{path}"))
                                .body(Full::default())
                                .unwrap();
                            let answer = match client.request(fwd).await {
                                Ok(r) => {
                                    let (parts, body) = r.into_parts();
                                    let bytes = body.collect().await.map(|b| b.to_bytes());
                                    hyper::Response::from_parts(
                                        parts,
                                        Full::new(bytes.unwrap_or_default()),
                                    )
                                }
                                Err(_) => hyper::Response::builder()
                                    .status(502)
                                    .body(Full::default())
                                    .unwrap(),
                            };
                            Ok::<_, std::convert::Infallible>(answer)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        CountingFront { url, queries, task }
    }

    /// Its base URL, to configure as the check's `url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Instant queries forwarded so far.
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
}

impl Drop for CountingFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
