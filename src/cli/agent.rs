//! `drover agent`: run the in-cluster agent.
//!
//! Every flag is also an environment variable (`DROVER_*`) and a key of the
//! optional `--config` TOML file (the flag's long name, e.g.
//! `poll-interval = "30s"`). Precedence: flag, then environment, then file,
//! then the default.

mod logging;

use super::{Global, Outcome};
use crate::agent::{self, AgentConfig, OffsetClock, SharedClock};
use crate::source::trigger::WebhookConfig;
use crate::source::{Auth, Secret};
use crate::status::PublishOptions;
use crate::trust;
use anyhow::{bail, Context};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Whether this build has the test hooks (`--clock-offset`): the `test-hooks`
/// cargo feature, which the tests turn on and no release build has. A cargo
/// feature rather than `debug_assertions`: the benches run an optimised
/// build that needs the hook, and a debug build run by hand must not have it.
const TEST_HOOKS: bool = cfg!(feature = "test-hooks");

/// Arguments of `drover agent`.
#[derive(Debug, Default, Clone, clap::Args, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Args {
    /// TOML file with any of these settings (keys are the flags' long names).
    #[arg(long, env = "DROVER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The environment this agent serves.
    #[arg(long, env = "DROVER_ENV")]
    pub env: Option<String>,
    /// The cluster name it reports as (listed under [clusters] in drover.toml).
    #[arg(long, env = "DROVER_CLUSTER")]
    pub cluster: Option<String>,
    /// Config repository URL (file, git, http(s), ssh); the global --repo also works.
    #[arg(long, env = "DROVER_REPO")]
    pub repo_url: Option<String>,
    /// Tracked branch.
    #[arg(long, env = "DROVER_BRANCH")]
    pub branch: Option<String>,
    /// Status branch name (the agent pushes to `<name>.d/<env>/<cluster>`):
    /// `[promotion] status_branch` of the config owns it; when given, a
    /// config naming another name is refused.
    #[arg(long, env = "DROVER_STATUS_BRANCH")]
    pub status_branch: Option<String>,
    /// Local git cache (an emptyDir in the cluster).
    #[arg(long, env = "DROVER_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Signature check: off, head or all.
    #[arg(long, env = "DROVER_VERIFY")]
    pub verify: Option<String>,
    /// The commit to trust (its full id) when the agent has neither an
    /// applied commit nor a signed report of its own: it and its ancestors
    /// are trusted, every later commit is verified (as the
    /// drover.dev/trust-commit annotation, which wins over it).
    #[arg(long, env = "DROVER_TRUST_COMMIT")]
    pub trust_commit: Option<String>,
    /// Allowed-signers file (git's SSH format), mounted from a Secret.
    #[arg(long, env = "DROVER_ALLOWED_SIGNERS")]
    pub allowed_signers: Option<PathBuf>,
    /// Armored OpenPGP public keys (e.g. GitHub's web-flow key): a file, or
    /// a directory of them (every file of a mounted Secret).
    #[arg(long, env = "DROVER_OPENPGP_KEYS")]
    pub openpgp_keys: Option<PathBuf>,
    /// HTTPS token file (sent as user x-access-token).
    #[arg(long, env = "DROVER_GIT_TOKEN_FILE")]
    pub git_token_file: Option<PathBuf>,
    /// HTTPS user name (with --git-password-file).
    #[arg(long, env = "DROVER_GIT_USERNAME")]
    pub git_username: Option<String>,
    /// HTTPS password file.
    #[arg(long, env = "DROVER_GIT_PASSWORD_FILE")]
    pub git_password_file: Option<PathBuf>,
    /// SSH private key file (with --known-hosts).
    #[arg(long, env = "DROVER_SSH_KEY")]
    pub ssh_key: Option<PathBuf>,
    /// known_hosts file for SSH.
    #[arg(long, env = "DROVER_KNOWN_HOSTS")]
    pub known_hosts: Option<PathBuf>,
    /// OpenSSH private key that signs status commits.
    #[arg(long, env = "DROVER_STATUS_SIGNING_KEY")]
    pub status_signing_key: Option<PathBuf>,
    /// Poll interval (e.g. 1m).
    #[arg(long, env = "DROVER_POLL_INTERVAL")]
    pub poll_interval: Option<String>,
    /// Longest time between reconcile passes.
    #[arg(long, env = "DROVER_TICK")]
    pub tick: Option<String>,
    /// Namespace of the Lease and the DroverStatus object.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// This replica's identity (the pod name, from the downward API).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Lease name (default drover-ENV-CLUSTER).
    #[arg(long, env = "DROVER_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// Lease duration (e.g. 15s).
    #[arg(long, env = "DROVER_LEASE_DURATION")]
    pub lease_duration: Option<String>,
    /// Act without leader election (a single replica only).
    #[arg(
        long,
        env = "DROVER_NO_LEADER_ELECTION",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub no_leader_election: Option<bool>,
    /// DroverStatus object name (default ENV-CLUSTER).
    #[arg(long, env = "DROVER_STATUS_NAME")]
    pub status_name: Option<String>,
    /// HTTP listen address for /metrics, /healthz, /readyz and /webhook.
    #[arg(long, env = "DROVER_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Serve /webhook on this address instead (its own port, for a NetworkPolicy).
    #[arg(long, env = "DROVER_WEBHOOK_LISTEN")]
    pub webhook_listen: Option<SocketAddr>,
    /// Namespace of the upgrade Jobs (default: the agent's namespace).
    #[arg(long, env = "DROVER_JOB_NAMESPACE")]
    pub job_namespace: Option<String>,
    /// File holding the webhook's HMAC secret (X-Hub-Signature-256).
    #[arg(long, env = "DROVER_WEBHOOK_SECRET_FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// File holding the webhook's plain token (X-Drover-Token).
    #[arg(long, env = "DROVER_WEBHOOK_TOKEN_FILE")]
    pub webhook_token_file: Option<PathBuf>,
    /// Send CloudEvents notifications to these http(s) URLs (comma-separated
    /// or repeated; docs/install.md, "Notifications").
    #[arg(long, env = "DROVER_NOTIFY_URL", value_delimiter = ',')]
    pub notify_url: Option<Vec<String>>,
    /// Which notifications: available, started, blocked, halted,
    /// rolled-back, revoked, confirmed (comma-separated; default all).
    #[arg(long, env = "DROVER_NOTIFY_EVENTS", value_delimiter = ',')]
    pub notify_events: Option<Vec<String>>,
    /// File holding the HMAC-SHA256 key that signs each notification
    /// (X-Drover-Signature: sha256=...).
    #[arg(long, env = "DROVER_NOTIFY_SECRET_FILE")]
    pub notify_secret_file: Option<PathBuf>,
    /// Most notifications waiting per receiver (default 1000; the oldest is dropped).
    #[arg(long, env = "DROVER_NOTIFY_QUEUE")]
    pub notify_queue: Option<usize>,
    /// Most delivery attempts of one notification (default 30).
    #[arg(long, env = "DROVER_NOTIFY_MAX_ATTEMPTS")]
    pub notify_max_attempts: Option<u32>,
    /// Oldest a notification may be and still be tried (default 1h).
    #[arg(long, env = "DROVER_NOTIFY_MAX_AGE")]
    pub notify_max_age: Option<String>,
    /// Test hook, only in builds with the `test-hooks` feature (never a
    /// release): shift the agent's clock (windows, gate, timeouts), e.g.
    /// "+30d" or "-2h". Any other build refuses to start when it is set.
    #[arg(
        long,
        env = "DROVER_CLOCK_OFFSET",
        allow_hyphen_values = true,
        hide = !TEST_HOOKS
    )]
    pub clock_offset: Option<String>,
    /// Log format: json or text.
    #[arg(long, env = "DROVER_LOG_FORMAT")]
    pub log_format: Option<String>,
}

impl Args {
    /// Flags (and environment) over the `--config` file.
    pub fn merged(self) -> anyhow::Result<Args> {
        let Some(path) = self.config.clone() else {
            return Ok(self);
        };
        let bytes = crate::config::read_regular(&path, "agent config files")
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("reading {}", path.display()))?;
        let text = String::from_utf8(bytes)
            .with_context(|| format!("reading {}: not UTF-8", path.display()))?;
        let file: Args =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(self.over(file))
    }

    fn over(self, f: Args) -> Args {
        Args {
            config: self.config,
            env: self.env.or(f.env),
            cluster: self.cluster.or(f.cluster),
            repo_url: self.repo_url.or(f.repo_url),
            branch: self.branch.or(f.branch),
            status_branch: self.status_branch.or(f.status_branch),
            cache_dir: self.cache_dir.or(f.cache_dir),
            verify: self.verify.or(f.verify),
            trust_commit: self.trust_commit.or(f.trust_commit),
            allowed_signers: self.allowed_signers.or(f.allowed_signers),
            openpgp_keys: self.openpgp_keys.or(f.openpgp_keys),
            git_token_file: self.git_token_file.or(f.git_token_file),
            git_username: self.git_username.or(f.git_username),
            git_password_file: self.git_password_file.or(f.git_password_file),
            ssh_key: self.ssh_key.or(f.ssh_key),
            known_hosts: self.known_hosts.or(f.known_hosts),
            status_signing_key: self.status_signing_key.or(f.status_signing_key),
            poll_interval: self.poll_interval.or(f.poll_interval),
            tick: self.tick.or(f.tick),
            namespace: self.namespace.or(f.namespace),
            pod_name: self.pod_name.or(f.pod_name),
            lease_name: self.lease_name.or(f.lease_name),
            lease_duration: self.lease_duration.or(f.lease_duration),
            no_leader_election: self.no_leader_election.or(f.no_leader_election),
            status_name: self.status_name.or(f.status_name),
            listen: self.listen.or(f.listen),
            webhook_listen: self.webhook_listen.or(f.webhook_listen),
            job_namespace: self.job_namespace.or(f.job_namespace),
            webhook_secret_file: self.webhook_secret_file.or(f.webhook_secret_file),
            webhook_token_file: self.webhook_token_file.or(f.webhook_token_file),
            notify_url: self.notify_url.or(f.notify_url),
            notify_events: self.notify_events.or(f.notify_events),
            notify_secret_file: self.notify_secret_file.or(f.notify_secret_file),
            notify_queue: self.notify_queue.or(f.notify_queue),
            notify_max_attempts: self.notify_max_attempts.or(f.notify_max_attempts),
            notify_max_age: self.notify_max_age.or(f.notify_max_age),
            clock_offset: self.clock_offset.or(f.clock_offset),
            log_format: self.log_format.or(f.log_format),
        }
    }

    /// The library configuration; `global_repo` is the global `--repo` when not the default.
    pub fn to_config(&self, global_repo: Option<&Path>) -> anyhow::Result<AgentConfig> {
        let env = self.env.clone().context("--env (DROVER_ENV) is required")?;
        let cluster = self
            .cluster
            .clone()
            .context("--cluster (DROVER_CLUSTER) is required")?;
        let url = match (&self.repo_url, global_repo) {
            (Some(u), _) => u.clone(),
            (None, Some(p)) => p.display().to_string(),
            (None, None) => bail!("--repo-url (DROVER_REPO) or --repo is required"),
        };
        let cache = self
            .cache_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("drover-cache-{env}-{cluster}")));
        let mut cfg = AgentConfig::new(&env, &cluster, &url, cache);
        if let Some(b) = &self.branch {
            cfg.source.branch = b.clone();
        }
        if let Some(b) = &self.status_branch {
            // Only until the first commit is admitted; then the policy in
            // force owns the branch and the flag must agree with it.
            cfg.source.status_branch = b.clone();
            cfg.status_branch = Some(b.clone());
        }
        cfg.source.auth = self.auth()?;
        if let Some(v) = &self.verify {
            cfg.verify = v.parse::<trust::Mode>().map_err(anyhow::Error::msg)?;
        }
        cfg.allowed_signers = self.allowed_signers.clone();
        cfg.openpgp_keys = self.openpgp_keys.clone();
        cfg.trust_commit = self.trust_commit.clone().filter(|c| !c.trim().is_empty());
        if let Some(k) = &self.status_signing_key {
            cfg.publish = PublishOptions::default().with_signing_key_file(k)?;
        }
        cfg.publish.name = format!("drover agent ({env}/{cluster})");
        if let Some(d) = &self.poll_interval {
            cfg.poll = duration("poll-interval", d, POLL_RANGE)?;
        }
        if let Some(d) = &self.tick {
            cfg.tick = duration("tick", d, TICK_RANGE)?;
        }
        if let Some(ns) = &self.namespace {
            cfg.namespace = ns.clone();
        }
        if let Some(p) = &self.pod_name {
            cfg.identity = p.clone();
        }
        if let Some(l) = &self.lease_name {
            cfg.lease_name = l.clone();
        }
        if let Some(d) = &self.lease_duration {
            cfg.lease_duration = duration("lease-duration", d, LEASE_RANGE)?;
        }
        cfg.leader_election = !self.no_leader_election.unwrap_or(false);
        if let Some(s) = &self.status_name {
            cfg.status_name = s.clone();
        }
        cfg.webhook_listen = self.webhook_listen;
        cfg.job_namespace = self.job_namespace.clone();
        if let Some(l) = self.listen {
            cfg.listen = l;
        }
        let hmac = self
            .webhook_secret_file
            .as_ref()
            .map(|p| read_secret(p))
            .transpose()?
            .flatten();
        let token = self
            .webhook_token_file
            .as_ref()
            .map(|p| read_secret(p))
            .transpose()?
            .flatten();
        if hmac.is_some() || token.is_some() {
            cfg.webhook = Some(WebhookConfig {
                hmac_secret: hmac,
                token,
            });
        }
        cfg.notify = self.notify_config()?;
        Ok(cfg)
    }

    /// The notifications' settings, each checked (`notify::Config::from_flags`).
    fn notify_config(&self) -> anyhow::Result<crate::agent::notify::Config> {
        let secret = match &self.notify_secret_file {
            Some(p) => read_secret(p)?,
            None => None,
        };
        let max_age = self
            .notify_max_age
            .as_deref()
            .map(|d| {
                duration(
                    "notify-max-age",
                    d,
                    (Duration::from_secs(1), Duration::from_secs(7 * DAY)),
                )
            })
            .transpose()?;
        crate::agent::notify::Config::from_flags(
            self.notify_url.as_deref().unwrap_or_default(),
            self.notify_events.as_deref(),
            secret,
            self.notify_queue,
            self.notify_max_attempts,
            max_age,
        )
        .map_err(anyhow::Error::msg)
    }

    fn auth(&self) -> anyhow::Result<Auth> {
        Ok(
            match (&self.ssh_key, &self.git_token_file, &self.git_password_file) {
                (Some(key), None, None) => Auth::Ssh {
                    username: self.git_username.clone(),
                    private_key: key.clone(),
                    known_hosts: self
                        .known_hosts
                        .clone()
                        .context("--ssh-key needs --known-hosts")?,
                },
                (None, Some(t), None) => Auth::Token(Secret::File(t.clone())),
                (None, None, Some(p)) => Auth::Basic {
                    username: self
                        .git_username
                        .clone()
                        .context("--git-password-file needs --git-username")?,
                    password: Secret::File(p.clone()),
                },
                (None, None, None) => Auth::None,
                _ => bail!("give one of --ssh-key, --git-token-file or --git-password-file"),
            },
        )
    }

    /// The agent's clock: the wall clock, shifted by `--clock-offset` in a
    /// build with the test hooks; any other build refuses the setting.
    pub fn clock(&self) -> anyhow::Result<SharedClock> {
        self.clock_in(TEST_HOOKS)
    }

    fn clock_in(&self, hooks: bool) -> anyhow::Result<SharedClock> {
        let offset = match (&self.clock_offset, hooks) {
            (None, _) => chrono::Duration::zero(),
            (Some(s), true) => parse_offset(s)?,
            // Parsed rather than unknown, so that an environment variable or
            // a config file key cannot be ignored silently either.
            (Some(_), false) => bail!(
                "--clock-offset (DROVER_CLOCK_OFFSET, clock-offset in --config) is a test hook \
                 that this build does not have: the gate, the windows and the timeouts read \
                 the wall clock; remove the setting (builds with the `test-hooks` cargo \
                 feature, which only the tests use, accept it)"
            ),
        };
        Ok(Arc::new(OffsetClock(offset)))
    }
}

/// A secret file's content; an empty file (the unfilled template) means "not configured".
fn read_secret(p: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    // Bounded like every file drover reads (a secret is a few bytes).
    let bytes = crate::config::read_regular(p, "secret files")
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("reading {}", p.display()))?;
    let s =
        String::from_utf8(bytes).with_context(|| format!("reading {}: not UTF-8", p.display()))?;
    let s = s.trim_end_matches(['\r', '\n']);
    Ok((!s.is_empty()).then(|| s.as_bytes().to_vec()))
}

/// The range a duration flag accepts, inclusive.
type Range = (Duration, Duration);

const DAY: u64 = 86_400;
/// `--poll-interval`: a second to a month (a webhook-driven agent may poll rarely).
const POLL_RANGE: Range = (Duration::from_secs(1), Duration::from_secs(30 * DAY));
/// `--tick`: a second to a day.
const TICK_RANGE: Range = (Duration::from_secs(1), Duration::from_secs(DAY));
/// `--lease-duration`: a second to an hour.
const LEASE_RANGE: Range = (Duration::from_secs(1), Duration::from_secs(3600));
/// `--clock-offset`: a century either way.
const OFFSET_MAX: Duration = Duration::from_secs(36_500 * DAY);

/// A duration flag's value, within `range`: the arithmetic it feeds (the
/// poll's jitter, the lease's renewal, the report cadence) then never
/// overflows, and a typo such as `30000000s` is an error rather than an
/// agent that never polls.
fn duration(flag: &str, s: &str, (min, max): Range) -> anyhow::Result<Duration> {
    let d = humantime::parse_duration(s)
        .with_context(|| format!("--{flag}: expected a duration such as 30s or 5m, got {s:?}"))?;
    if d < min || d > max {
        bail!(
            "--{flag}: {s:?} is out of range: expected between {} and {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        );
    }
    Ok(d)
}

/// Parse `+30d`, `-2h` or `90m` into a signed offset of at most a century.
pub fn parse_offset(s: &str) -> anyhow::Result<chrono::Duration> {
    let (neg, rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let d = humantime::parse_duration(rest.trim())
        .with_context(|| format!("--clock-offset: expected e.g. +30d or -2h, got {s:?}"))?;
    if d > OFFSET_MAX {
        bail!("--clock-offset: {s:?} is out of range: expected at most 36500d either way");
    }
    let d = chrono::Duration::from_std(d).context("--clock-offset is too large")?;
    Ok(if neg { -d } else { d })
}

/// Keep glibc's mmap threshold at its initial 128 KiB for good, unless the
/// operator set `MALLOC_MMAP_THRESHOLD_`.
///
/// glibc raises the threshold to the size of each large block freed, so
/// after the first few list pages and API bodies (hundreds of KiB each) such
/// buffers come from the heap instead, where they stay resident as free
/// space between live blocks. Fixed, they are unmapped when freed: during a
/// rollout with 1,000 nodes it lowered the agent's peak by ~2 MiB
/// (BENCHMARKS.md, "Agent under load").
fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // Blocks of at least this many bytes come straight from the kernel.
        const MMAP_THRESHOLD: i32 = 128 * 1024;
        // SAFETY: mallopt only sets an allocator parameter; it is called
        // before the runtime starts any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
}

/// Run `drover agent`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let args = args.merged()?;
    logging::init_logging(args.log_format.as_deref().unwrap_or("json"))?;
    let global_repo = g.repo_arg.as_deref();
    let cfg = args.to_config(global_repo)?;
    let clock = args.clock()?;
    fix_mmap_threshold();
    let rt = tokio::runtime::Builder::new_multi_thread()
        // The agent is I/O bound; two workers and a small blocking pool (git
        // work runs there, one call at a time) keep the footprint small.
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let signal = shutdown_signal();
        tokio::spawn(async move {
            signal.await;
            tracing::info!("shutdown requested");
            let _ = tx.send(true);
        });
        let kube_config = kube::Config::infer()
            .await
            .context("finding the API server (in-cluster or KUBECONFIG)")?;
        let backend =
            agent::KubeBackend::new(kube_config.clone(), cfg.jobs_namespace(), &cfg.namespace)
                .with_write_timeout(cfg.write_timeout());
        let agent = agent::Agent::new(cfg, kube_config, backend, clock).await?;
        agent.run(rx).await?;
        anyhow::Ok(())
    });
    // A fetch abandoned at shutdown may still sit on a blocking thread
    // waiting for a stalled server; exit without waiting for it.
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    result?;
    Ok(Outcome::Ok)
}

/// A future that completes on SIGTERM or Ctrl-C. The SIGTERM handler is
/// installed by this call, not on the future's first poll, so a SIGTERM that
/// arrives while the agent starts is not the default (fatal) action.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    #[test]
    fn openpgp_keys_come_from_the_flag_or_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "env = \"test\"\ncluster = \"test-1\"\nrepo-url = \"git://127.0.0.1/r.git\"\nopenpgp-keys = \"/etc/drover/openpgp\"\n",
        )
        .unwrap();
        let config = |extra: &[&str]| {
            let mut argv = vec!["x", "--config", file.to_str().unwrap()];
            argv.extend_from_slice(extra);
            let cfg = Cli::parse_from(argv).a.merged().unwrap();
            cfg.to_config(None).unwrap().openpgp_keys
        };
        assert_eq!(config(&[]), Some(PathBuf::from("/etc/drover/openpgp")));
        assert_eq!(
            config(&["--openpgp-keys", "/keys/web-flow.asc"]),
            Some(PathBuf::from("/keys/web-flow.asc"))
        );
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "env = \"stage\"\ncluster = \"stage-1\"\nrepo-url = \"git://127.0.0.1/r.git\"\npoll-interval = \"10s\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "x",
            "--config",
            file.to_str().unwrap(),
            "--poll-interval",
            "3s",
            "--clock-offset",
            "-2h",
            "--no-leader-election",
        ]);
        let args = cli.a.merged().unwrap();
        let cfg = args.to_config(None).unwrap();
        assert_eq!(cfg.env, "stage");
        assert_eq!(cfg.cluster, "stage-1");
        assert_eq!(cfg.poll, Duration::from_secs(3));
        assert_eq!(cfg.source.url, "git://127.0.0.1/r.git");
        assert_eq!(cfg.lease_name, "drover-stage-stage-1");
        assert!(!cfg.leader_election);
        assert_eq!(parse_offset("-2h").unwrap(), chrono::Duration::hours(-2));
        assert_eq!(parse_offset("+30d").unwrap(), chrono::Duration::days(30));
    }

    /// A build without the test hooks refuses the clock offset however it
    /// is given (flag, environment, config file), before anything starts;
    /// with them (the tests' build) it shifts the clock.
    #[test]
    fn clock_offset_is_refused_without_the_test_hooks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, "clock-offset = \"+30d\"\n").unwrap();
        let flag = Cli::parse_from(["x", "--clock-offset", "+30d"]).a;
        let from_file = Cli::parse_from(["x", "--config", file.to_str().unwrap()])
            .a
            .merged()
            .unwrap();
        for args in [&flag, &from_file] {
            let err = args.clock_in(false).err().expect("refused");
            assert!(
                format!("{err:#}").contains("is a test hook that this build does not have"),
                "{err:#}"
            );
            let shifted = args.clock_in(true).unwrap().now() - chrono::Utc::now();
            assert!(shifted > chrono::Duration::days(29), "{shifted}");
        }
        // Unset, every build runs on the wall clock.
        let plain = Cli::parse_from(["x"]).a;
        let drift = plain.clock_in(false).unwrap().now() - chrono::Utc::now();
        assert!(drift.num_seconds().abs() < 5, "{drift}");
        // This test binary has the hooks on: the tests' agents take the flag.
        const { assert!(TEST_HOOKS) };
    }

    #[test]
    fn durations_out_of_range_are_errors_naming_the_range() {
        let cli = Cli::parse_from([
            "x",
            "--env",
            "e",
            "--cluster",
            "c",
            "--poll-interval",
            "100years",
        ]);
        let err = cli.a.to_config(Some(Path::new("/r"))).unwrap_err();
        assert!(
            err.to_string().contains(
                "--poll-interval: \"100years\" is out of range: expected between 1s and 30days"
            ),
            "{err:#}"
        );
        for (flag, value) in [
            ("--tick", "0s"),
            ("--lease-duration", "2h"),
            ("--tick", "2days"),
        ] {
            let cli = Cli::parse_from(["x", "--env", "e", "--cluster", "c", flag, value]);
            let err = cli.a.to_config(Some(Path::new("/r"))).unwrap_err();
            assert!(
                err.to_string().contains("out of range"),
                "{flag} {value}: {err:#}"
            );
        }
        let cli = Cli::parse_from(["x", "--clock-offset", "+200000000d"]);
        assert!(cli.a.clock().is_err());
        // Control: the bounds themselves are accepted.
        let cli = Cli::parse_from([
            "x",
            "--env",
            "e",
            "--cluster",
            "c",
            "--poll-interval",
            "30d",
            "--tick",
            "1s",
            "--lease-duration",
            "1h",
            "--clock-offset",
            "-36500d",
        ]);
        let cfg = cli.a.to_config(Some(Path::new("/r"))).unwrap();
        assert_eq!(cfg.poll, Duration::from_secs(30 * DAY));
        assert!(cli.a.clock().is_ok());
    }

    /// Text a duration flag may be given: anything, or a number with a unit,
    /// signed or not, up to far past what the calendar holds.
    fn flag_value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let units = prop::sample::select(vec![
            "", "ns", "ms", "s", "m", "h", "d", "w", "M", "y", "years",
        ]);
        prop_oneof![
            1 => any::<String>(),
            // The edges of what humantime and Duration hold.
            1 => prop::sample::select(vec![
                "18446744073709551615s", "9223372036854775808s", "18446744073709551615ns",
                "584542046090years", "+292471208677years", "-9223372036854775807ms", "0s",
            ]).prop_map(String::from),
            1 => (prop::sample::select(vec!["", "+", "-"]), any::<u64>(), units.clone())
                .prop_map(|(sign, n, u)| format!("{sign}{n}{u}")),
            2 => (1u64..100_000, units).prop_map(|(n, u)| format!("{n}{u}")),
            4 => (1u64..=60, prop::sample::select(vec!["s", "m"]))
                .prop_map(|(n, u)| format!("{n}{u}")),
        ]
    }

    proptest::proptest! {
        /// No flag value makes the agent panic: parsing, the range checks,
        /// and the arithmetic the values feed (the clock's offset, the
        /// poll's jitter, the lease's renewal times, the report cadence).
        #[test]
        fn no_flag_value_panics(
            poll in flag_value(),
            tick in flag_value(),
            lease in flag_value(),
            offset in flag_value(),
            listen in proptest::prop_oneof![
                proptest::strategy::Just("127.0.0.1:0".to_string()),
                proptest::prelude::any::<String>(),
            ],
            pushed in proptest::prelude::any::<i64>(),
            later in proptest::prelude::any::<u32>(),
        ) {
            let argv = [
                "x", "--env", "e", "--cluster", "c", "--repo-url", "git://127.0.0.1/r.git",
                "--poll-interval", &poll, "--tick", &tick, "--lease-duration", &lease,
                "--clock-offset", &offset, "--listen", &listen,
            ];
            let Ok(cli) = Cli::try_parse_from(argv) else { return Ok(()) };
            let args = cli.a.merged().unwrap();
            if let Ok(clock) = args.clock() {
                let _ = clock.now();
            }
            let Ok(cfg) = args.to_config(None) else { return Ok(()) };
            let _ = crate::source::trigger::Trigger::new(cfg.poll).next_delay();
            let _ = crate::agent::leader::LeaseConfig::new("ns", "l", "id", cfg.lease_duration);
            let (lo, hi) = (
                chrono::DateTime::<chrono::Utc>::MIN_UTC.timestamp(),
                chrono::DateTime::<chrono::Utc>::MAX_UTC.timestamp(),
            );
            let at = chrono::DateTime::from_timestamp(pushed.clamp(lo, hi), 0).unwrap();
            let now = at
                .checked_add_signed(chrono::Duration::seconds(i64::from(later)))
                .unwrap_or(at);
            let report = |n| crate::status::StatusReport {
                env: "e".into(),
                cluster: "c".into(),
                config_commit: "a".repeat(40),
                version: semver::Version::new(1, 2, 3),
                state: crate::rollout::RolloutState::Rolling,
                since: at,
                nodes: 2,
                nodes_at_version: n,
                message: String::new(),
                detail: Default::default(),
            };
            let _ = crate::status::cadence::decide(Some((&report(0), at)), &report(1), now, cfg.poll);
        }
    }

    #[test]
    fn unknown_file_keys_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, "evn = \"stage\"\n").unwrap();
        let cli = Cli::parse_from(["x", "--config", file.to_str().unwrap()]);
        let err = cli.a.merged().unwrap_err();
        assert!(format!("{err:#}").contains("evn"), "{err:#}");
    }
}
