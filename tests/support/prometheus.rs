//! A real Prometheus server for tests (built from its Go module by
//! `tests/prometheus/build`, cached) scraping a small exporter the test
//! controls: [`Exporter`] serves one gauge the test sets, [`Prometheus`]
//! scrapes it every second on loopback.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
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
