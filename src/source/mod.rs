//! The git source: fetching the config repository and reading it at a commit.
//!
//! The agent keeps a bare cache repository across restarts. A fetch writes
//! only `refs/drover/fetched/head` (the tracked branch) and the status
//! branches it is asked for under `refs/remotes/origin/` (the agent asks for
//! those of the clusters its policy needs, by name: [`Source::set_status_scope`]);
//! the commit the agent acts on lives
//! in `refs/drover/current` and moves only when the caller, after the trust
//! check, calls [`Source::accept`]. A failed, partial or refused fetch thus
//! never replaces the last good state.

pub mod known_hosts;
pub mod seen;
pub mod trigger;
pub(crate) mod wire;

use git2::{Oid, Repository};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ref holding the tracked branch as last fetched (not yet trusted).
pub const FETCHED_REF: &str = "refs/drover/fetched/head";
/// Where a fetch takes the tracked branch before it becomes [`FETCHED_REF`].
const FETCHING_REF: &str = "refs/drover/fetching/head";
/// Ref holding the commit the caller accepted (trusted, being applied).
pub const CURRENT_REF: &str = "refs/drover/current";

/// Errors of the git source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server's SSH host key is not in known_hosts, differs from it, or is revoked.
    #[error("host key of {host} refused: {detail} (known_hosts: {known_hosts}); host keys are never trusted on first use")]
    HostKey {
        /// `host` or `[host]:port`.
        host: String,
        /// What was wrong.
        detail: String,
        /// The known_hosts file consulted.
        known_hosts: String,
    },
    /// The server rejected the credentials.
    #[error("authentication to {url} failed: the server rejected {tried}")]
    Auth {
        /// Remote URL, credentials redacted.
        url: String,
        /// Which credential was tried, e.g. "the token (user x-access-token)".
        tried: String,
    },
    /// A credential could not be read.
    #[error("cannot read the {what}: {detail}")]
    Credential {
        /// Which credential.
        what: String,
        /// Why.
        detail: String,
    },
    /// The fetch did not finish within the configured time.
    #[error("fetch from {url} timed out after {timeout:?}")]
    Timeout {
        /// Remote URL.
        url: String,
        /// The limit.
        timeout: Duration,
    },
    /// The tracked branch does not exist on the remote.
    #[error("branch `{branch}` not found on {url}")]
    BranchMissing {
        /// Remote URL.
        url: String,
        /// Branch name.
        branch: String,
    },
    /// The URL is not one drover can fetch.
    #[error(
        "unsupported repository URL `{}`: expected file://, a path, git://, http(s):// or ssh://", redact(.0)
    )]
    Url(String),
    /// The server, or the connection to it, failed (the transport's or the
    /// server's words, credentials in URLs redacted).
    #[error("git protocol with {url}: {detail}")]
    Remote {
        /// Remote URL, credentials redacted.
        url: String,
        /// What failed.
        detail: String,
    },
    /// Any other git failure (libgit2's message, credentials in URLs redacted).
    #[error("git: {}", redact(.0.message()))]
    Git(#[from] git2::Error),
}

/// A secret read at each use, so rotated credentials are picked up without a restart.
/// Its `Debug` names where the secret comes from, never a literal value.
#[derive(Clone)]
pub enum Secret {
    /// Value of an environment variable.
    Env(String),
    /// Content of a file (trailing newline removed), e.g. a mounted Kubernetes Secret.
    File(PathBuf),
    /// A literal (tests, or values already read elsewhere).
    Value(String),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Env(n) => f.debug_tuple("Env").field(n).finish(),
            Secret::File(p) => f.debug_tuple("File").field(p).finish(),
            Secret::Value(_) => f.write_str("Value(***)"),
        }
    }
}

impl Secret {
    /// Read the secret.
    pub fn read(&self) -> Result<String, Error> {
        match self {
            Secret::Env(name) => std::env::var(name).map_err(|e| Error::Credential {
                what: format!("environment variable {name}"),
                detail: e.to_string(),
            }),
            Secret::File(p) => std::fs::read_to_string(p)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
                .map_err(|e| Error::Credential {
                    what: format!("file {}", p.display()),
                    detail: e.to_string(),
                }),
            Secret::Value(v) => Ok(v.clone()),
        }
    }
}

/// How to authenticate to the remote.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    /// No credentials (file://, git://, anonymous HTTP).
    #[default]
    None,
    /// HTTP basic authentication.
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: Secret,
    },
    /// HTTP token, sent as basic authentication with user `x-access-token`
    /// (what GitHub, GitLab and Gitea all accept).
    Token(Secret),
    /// SSH with a private key; the server's host key must be in `known_hosts`.
    Ssh {
        /// User name when the URL has none (default `git`).
        username: Option<String>,
        /// Unencrypted OpenSSH private key file.
        private_key: PathBuf,
        /// known_hosts file listing the server's host key.
        known_hosts: PathBuf,
    },
}

impl Auth {
    /// The credential sent to `url`, named without its secret, for the
    /// authentication error.
    fn tried(&self, url: &str) -> String {
        match self {
            Auth::None => match url_userinfo(url) {
                Some((user, true)) => {
                    format!("the user and password in the repository URL (user `{user}`)")
                }
                Some((_, false)) => "the user name in the repository URL (no password)".into(),
                None => "anonymous access (no credentials configured)".into(),
            },
            Auth::Basic { username, .. } => format!("basic credentials (user `{username}`)"),
            Auth::Token(_) => "the token (sent as basic credentials, user `x-access-token`)".into(),
            Auth::Ssh { private_key, .. } => {
                format!("the SSH key {}", private_key.display())
            }
        }
    }
}

/// The userinfo of an `scheme://user[:password]@host/...` URL: the user and
/// whether a password follows it.
fn url_userinfo(url: &str) -> Option<(String, bool)> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    match userinfo.split_once(':') {
        Some((u, _)) => Some((u.to_string(), true)),
        None => Some((userinfo.to_string(), false)),
    }
}

/// `text` with the secrets of every URL in it replaced by `***`: the
/// password of `scheme://user:password@`, and a lone user of http(s) URLs
/// (a token passed as the user name). SSH user names stay, they are no
/// secret. Every URL drover prints, logs or reports goes through this.
pub fn redact(text: &str) -> String {
    static URL_USERINFO: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#@\s]*)@").expect("valid regex")
    });
    URL_USERINFO
        .replace_all(text, |c: &regex::Captures<'_>| {
            let scheme = &c[1];
            let info = &c[2];
            let shown = match info.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None if scheme.to_ascii_lowercase().starts_with("http") => "***".to_string(),
                None => info.to_string(),
            };
            format!("{scheme}{shown}@")
        })
        .into_owned()
}

/// Where and how to fetch.
#[derive(Clone)]
pub struct SourceConfig {
    /// Remote URL or local path.
    pub url: String,
    /// Tracked branch (default `main`).
    pub branch: String,
    /// Status branch (default `drover/status`).
    pub status_branch: String,
    /// Local cache repository, kept across restarts.
    pub cache_dir: PathBuf,
    /// Credentials.
    pub auth: Auth,
    /// Upper bound on one fetch or push.
    pub timeout: Duration,
}

impl SourceConfig {
    /// A config with the defaults: branch `main`, status branch `drover/status`, 60 s timeout.
    pub fn new(url: impl Into<String>, cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            url: url.into(),
            branch: "main".into(),
            status_branch: "drover/status".into(),
            cache_dir: cache_dir.into(),
            auth: Auth::None,
            timeout: Duration::from_secs(60),
        }
    }
}

impl std::fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceConfig")
            .field("url", &redact(&self.url))
            .field("branch", &self.branch)
            .field("status_branch", &self.status_branch)
            .field("cache_dir", &self.cache_dir)
            .field("auth", &self.auth)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What a fetch found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchResult {
    /// Tip of the tracked branch on the remote (not yet trusted).
    pub head: Oid,
    /// Tip of the status branch, when the remote has one.
    pub status_tip: Option<Oid>,
    /// Objects received by this fetch (0 when nothing was new).
    pub received_objects: usize,
}

/// The remote host and port an SSH URL points at.
fn ssh_host_port(url: &str) -> Option<(String, u16)> {
    let rest = if let Some(r) = url.strip_prefix("ssh://") {
        r.split('/').next()?
    } else if !url.contains("://") && url.contains(':') && !Path::new(url).exists() {
        // scp-like `user@host:path`
        url.split(':').next()?
    } else {
        return None;
    };
    let host_port = rest.rsplit('@').next()?;
    if let Some(v6) = host_port.strip_prefix('[') {
        let (h, p) = v6.split_once(']')?;
        let port = p
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .unwrap_or(22);
        return Some((h.to_string(), port));
    }
    match host_port.split_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((host_port.to_string(), 22)),
    }
}

/// The git source: a remote and the agent's local cache of it.
pub struct Source {
    cfg: SourceConfig,
    repo: Repository,
    abort: Arc<AtomicBool>,
    /// The per-cluster status branches fetched, by name (`None`: every
    /// one under the namespace, for `drover doctor` and the benches).
    status_scope: Option<crate::status_refs::Listed>,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("url", &redact(&self.cfg.url))
            .field("cache", &self.cfg.cache_dir)
            .finish()
    }
}

impl Source {
    /// Open (or create) the cache repository for `cfg`.
    pub fn open(cfg: SourceConfig) -> Result<Self, Error> {
        if !(cfg.url.starts_with("file://")
            || cfg.url.starts_with("git://")
            || cfg.url.starts_with("http://")
            || cfg.url.starts_with("https://")
            || cfg.url.starts_with("ssh://")
            || ssh_host_port(&cfg.url).is_some()
            || Path::new(&cfg.url).exists())
        {
            return Err(Error::Url(cfg.url));
        }
        let repo = match Repository::open_bare(&cfg.cache_dir) {
            Ok(r) => r,
            Err(_) => {
                std::fs::create_dir_all(&cfg.cache_dir).map_err(|e| Error::Credential {
                    what: format!("cache directory {}", cfg.cache_dir.display()),
                    detail: e.to_string(),
                })?;
                Repository::init_bare(&cfg.cache_dir)?
            }
        };
        Ok(Self {
            cfg,
            repo,
            abort: Arc::default(),
            status_scope: None,
        })
    }

    /// A flag that, once set, stops a fetch in progress at its next progress
    /// callback (the caller clears it before the next fetch). Taken before
    /// the source is locked for the fetch, so another task can set it.
    pub fn abort_flag(&self) -> Arc<AtomicBool> {
        self.abort.clone()
    }

    /// The configuration.
    pub fn config(&self) -> &SourceConfig {
        &self.cfg
    }

    /// Read and write reports on `branch` from now on: the status branch is
    /// owned by the policy in force, which the agent learns only after
    /// admitting a commit.
    pub fn set_status_branch(&mut self, branch: &str) {
        self.cfg.status_branch = branch.to_owned();
    }

    /// Fetch only these clusters' status branches from now on, each by its
    /// name (the agent's: its own environment's clusters and the lower
    /// environment's, as its policy lists them), so that whatever else the
    /// status namespace holds, however many refs, is never fetched nor
    /// stored. At most [`crate::status_refs::MAX_STATUS_BRANCHES`] are taken.
    pub fn set_status_scope(&mut self, listed: crate::status_refs::Listed) {
        self.status_scope = Some(listed);
    }

    /// The local cache repository (bare).
    pub fn repo(&self) -> &Repository {
        &self.repo
    }

    /// The directory to watch when the remote is a local path (a git-sync volume).
    pub fn local_path(&self) -> Option<PathBuf> {
        let p = self
            .cfg
            .url
            .strip_prefix("file://")
            .unwrap_or(&self.cfg.url);
        let p = Path::new(p);
        (p.is_absolute() || p.exists())
            .then(|| p.to_path_buf())
            .filter(|p| p.exists())
    }

    /// Fetch the tracked branch and the status branch. Only the fetched refs
    /// move; [`Source::current`] is untouched until [`Source::accept`].
    pub fn fetch(&self) -> Result<FetchResult, Error> {
        let fetched = self.fetch_head()?;
        self.record_status_seen();
        Ok(fetched)
    }

    /// [`Source::fetch`] without recording when the status branches moved.
    fn fetch_head(&self) -> Result<FetchResult, Error> {
        let branch_ref = format!("refs/heads/{}", self.cfg.branch);
        // The head lands in a ref of its own first, gone before the fetch,
        // so that a branch the remote no longer has is told apart from an
        // older fetch (the remote's list of refs is never copied out: it may
        // be hundreds of thousands long).
        if let Ok(mut r) = self.repo.find_reference(FETCHING_REF) {
            r.delete()?;
        }
        let mut specs = vec![format!("+{branch_ref}:{FETCHING_REF}")];
        specs.extend(self.status_refspecs());
        let received = self.fetch_refspecs(&specs)?;
        let Ok(head) = self.repo.refname_to_id(FETCHING_REF) else {
            return Err(Error::BranchMissing {
                url: redact(&self.cfg.url),
                branch: self.cfg.branch.clone(),
            });
        };
        self.repo
            .reference(FETCHED_REF, head, true, "drover: fetched")?;
        self.repo.find_reference(FETCHING_REF)?.delete()?;
        self.record_seen(head);
        Ok(FetchResult {
            head,
            status_tip: self.status_tip(),
            received_objects: received,
        })
    }

    /// [`Source::fetch`] with the status branches `scope` names for the
    /// head fetched before (`None` in an empty cache), fetched again, alone,
    /// when the head just fetched names others (a first fetch, a change of
    /// `[clusters]` or of the chain): the branches read are those the new
    /// head asks for, in one fetch of the trigger.
    pub fn fetch_scoped(
        &mut self,
        scope: impl Fn(&Repository, Option<Oid>) -> crate::status_refs::Listed,
    ) -> Result<FetchResult, Error> {
        let before = scope(&self.repo, self.fetched());
        self.set_status_scope(before.clone());
        let mut fetched = self.fetch_head()?;
        let after = scope(&self.repo, Some(fetched.head));
        if after != before {
            self.set_status_scope(after);
            self.fetch_refspecs(&self.status_refspecs())?;
            fetched.status_tip = self.status_tip();
        }
        // One record of when the status branches moved, after both: what a
        // first fetch brings in two steps is all there when the agent starts.
        self.record_status_seen();
        Ok(fetched)
    }

    /// Note when the commits up to `head` were first fetched (key validity,
    /// see [`seen`]). A record that cannot be written only makes the trust
    /// check stricter, so it does not fail the fetch.
    fn record_seen(&self, head: Oid) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        if let Err(e) = self.seen().record(&self.repo, head, now) {
            tracing::warn!(error = %e, "cannot record when the fetched commits were first seen");
        }
    }

    /// Note when the status branches last moved (report key validity, see
    /// [`seen::StatusSeen`]); like [`Self::record_seen`], a failure to write
    /// only makes the check stricter.
    fn record_status_seen(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let tips = seen::status_tips(&self.repo, &self.cfg.status_branch);
        let mut record = seen::StatusSeen::load(self.repo.path());
        if let Err(e) = record.record(&self.repo, &tips, now) {
            tracing::warn!(error = %e, "cannot record when the status branches were first seen");
        }
    }

    /// When this cache first fetched each commit.
    pub fn seen(&self) -> seen::Seen {
        seen::Seen::load(self.repo.path())
    }

    /// Refspecs of the status store (docs/design.md §5): the single status
    /// branch of the older layout, and each per-cluster branch
    /// `<status_branch>.d/<env>/<cluster>` of the scope (every one under
    /// the namespace without a scope), each to `refs/remotes/origin/`.
    pub fn status_refspecs(&self) -> Vec<String> {
        let sb = &self.cfg.status_branch;
        let ns = crate::status_refs::cluster_namespace(sb);
        let mut specs = vec![format!("+refs/heads/{sb}:refs/remotes/origin/{sb}")];
        match &self.status_scope {
            None => specs.push(format!("+refs/heads/{ns}*:refs/remotes/origin/{ns}*")),
            Some(listed) => specs.extend(
                listed
                    .iter()
                    .flat_map(|(env, clusters)| clusters.iter().map(move |c| (env, c)))
                    .take(crate::status_refs::MAX_STATUS_BRANCHES)
                    .map(|(env, c)| {
                        format!("+refs/heads/{ns}{env}/{c}:refs/remotes/origin/{ns}{env}/{c}")
                    }),
            ),
        }
        specs
    }

    /// Fetch only the status store (the branches of the scope); returns
    /// the remote tip of the single status branch of the older layout.
    pub fn fetch_status(&self) -> Result<Option<Oid>, Error> {
        self.fetch_refspecs(&self.status_refspecs())?;
        self.record_status_seen();
        Ok(self.status_tip())
    }

    /// The single status branch of the older layout as last fetched.
    fn status_tip(&self) -> Option<Oid> {
        let name = format!("refs/remotes/origin/{}", self.cfg.status_branch);
        self.repo.refname_to_id(&name).ok()
    }

    /// Fetch `specs` (`+src:dst`, exact or a prefix ending in `*`) over
    /// the wire client ([`wire`]): the remote's refs are asked for by
    /// these names, never listed whole. Returns the objects received.
    fn fetch_refspecs(&self, specs: &[String]) -> Result<usize, Error> {
        let deadline = Instant::now() + self.cfg.timeout;
        let parsed = specs
            .iter()
            .map(|s| {
                wire::FetchSpec::parse(s)
                    .ok_or_else(|| Error::Git(git2::Error::from_str(&format!("bad refspec `{s}`"))))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let timed_out = std::cell::Cell::new(false);
        let go_on = || {
            let ok = Instant::now() < deadline;
            timed_out.set(!ok);
            ok && !self.abort.load(Ordering::Relaxed)
        };
        match wire::fetch(
            &self.repo,
            &self.cfg,
            &parsed,
            crate::status::MAX_STATUS_BRANCHES,
            &go_on,
        ) {
            Ok(received) => Ok(received),
            Err(_) if timed_out.get() || Instant::now() >= deadline => Err(Error::Timeout {
                url: redact(&self.cfg.url),
                timeout: self.cfg.timeout,
            }),
            Err(e) => Err(e),
        }
    }

    /// The accepted commit, if any.
    pub fn current(&self) -> Option<Oid> {
        self.repo.refname_to_id(CURRENT_REF).ok()
    }

    /// The last fetched (untrusted) head, if any.
    pub fn fetched(&self) -> Option<Oid> {
        self.repo.refname_to_id(FETCHED_REF).ok()
    }

    /// Record `oid` as the accepted commit (call after the trust check passed).
    pub fn accept(&self, oid: Oid) -> Result<(), Error> {
        self.repo
            .reference(CURRENT_REF, oid, true, "drover: accept")?;
        Ok(())
    }

    /// Content of `path` at `commit`, `None` when absent.
    pub fn read_file(&self, commit: Oid, path: &str) -> Result<Option<Vec<u8>>, Error> {
        let tree = self.repo.find_commit(commit)?.tree()?;
        match tree.get_path(Path::new(path)) {
            Ok(entry) => Ok(Some(self.repo.find_blob(entry.id())?.content().to_vec())),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redact_hides_passwords_and_http_tokens_but_keeps_ssh_users() {
        assert_eq!(
            redact("fetch from https://alice:s3cret@git.example/r.git failed"),
            "fetch from https://alice:***@git.example/r.git failed"
        );
        assert_eq!(
            redact("http://ghp_tok@git.example/r.git"),
            "http://***@git.example/r.git"
        );
        assert_eq!(
            redact("ssh://git@host:2222/r.git"),
            "ssh://git@host:2222/r.git"
        );
        assert_eq!(
            redact("HTTPS://u:p@h/x and https://v:q@h/y"),
            "HTTPS://u:***@h/x and https://v:***@h/y"
        );
        assert_eq!(
            redact("https://git.example/r.git"),
            "https://git.example/r.git"
        );
        let e = Error::Url("https://bob:pw@/".into()).to_string();
        assert!(!e.contains("pw"), "{e}");
    }

    #[test]
    fn the_auth_error_names_the_credential_tried() {
        let url = "https://bob:pw@git.example/r.git";
        assert_eq!(
            Auth::None.tried(url),
            "the user and password in the repository URL (user `bob`)"
        );
        assert_eq!(
            Auth::None.tried("https://git.example/r.git"),
            "anonymous access (no credentials configured)"
        );
        assert!(Auth::Token(Secret::Value("t".into()))
            .tried(url)
            .contains("x-access-token"));
        assert_eq!(format!("{:?}", Secret::Value("t0p".into())), "Value(***)");
    }

    use super::*;

    #[test]
    fn ssh_urls() {
        assert_eq!(
            ssh_host_port("ssh://git@127.0.0.1:2222/repo.git"),
            Some(("127.0.0.1".into(), 2222))
        );
        assert_eq!(
            ssh_host_port("ssh://example.org/repo.git"),
            Some(("example.org".into(), 22))
        );
        assert_eq!(
            ssh_host_port("git@example.org:org/repo.git"),
            Some(("example.org".into(), 22))
        );
        assert_eq!(ssh_host_port("https://example.org/repo.git"), None);
    }
}
