//! git's wire protocol as the agent speaks it, for its fetches and its
//! status pushes: what it holds of a server's refs is bounded by the refs
//! it asks for, never by how many refs the server has.
//!
//! libgit2 speaks protocol v0 only, in which the server lists every ref it
//! has before anything is fetched or pushed, and libgit2 keeps that list
//! while connected (about 160 bytes a ref: 300,000 branches anyone may
//! create under `drover/status.d/` cost an agent 56 MB). Here gitoxide's
//! transport carries the protocol (git://, smart HTTP, and an SSH channel of
//! libssh2, the library git2 already links, so the host key is still
//! checked against the agent's known_hosts by drover), and
//! - a fetch asks for protocol v2 and names its refs as `ls-refs` prefixes,
//!   so the server sends only those (and any name that begins with one);
//! - where the server answers v0 (an old server, an SSH server that does not
//!   accept `GIT_PROTOCOL`) and for every push (receive-pack has no v2), the
//!   advertisement is read as a stream and each ref not asked for is dropped
//!   as it is read ([`refs`]): the server's list still crosses the wire, in
//!   time proportional to its size, but is never held.
//!
//! A local repository (a path, `file://`) is opened in-process and each ref
//! looked up by its name ([`local`]). Objects arrive as a pack written into
//! the cache through libgit2's indexer; a push sends a pack libgit2 builds.

mod fetch;
mod local;
mod push;
mod refs;
mod ssh;

pub(crate) use fetch::{fetch, FetchSpec};
pub(crate) use push::{PushConn, Update};

use super::{redact, Auth, Error, SourceConfig};
use gix_transport::client::blocking_io::Transport;
use gix_transport::client::TransportWithoutIO;
use gix_transport::Protocol;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A connection to a remote server (not a local repository).
type Conn = Box<dyn Transport>;

/// Where a URL leads.
enum Endpoint {
    /// A repository on this machine, read in-process.
    Local(PathBuf),
    /// A server, spoken to over the wire.
    Remote(Conn),
}

/// Open the endpoint of `cfg.url` for `service`, authenticated as `cfg.auth` says.
fn open(cfg: &SourceConfig, service: gix_transport::Service) -> Result<Endpoint, Error> {
    let url = cfg.url.as_str();
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("git://") {
        return git_daemon(cfg).map(Endpoint::Remote);
    }
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return http(cfg).map(Endpoint::Remote);
    }
    if lower.starts_with("ssh://") || super::ssh_host_port(url).is_some() {
        return ssh::connect(cfg, service).map(Endpoint::Remote);
    }
    let path = url.strip_prefix("file://").unwrap_or(url);
    Ok(Endpoint::Local(PathBuf::from(path)))
}

/// `cfg.url` parsed, for the transports that need its parts.
fn parsed(cfg: &SourceConfig) -> Result<gix_url::Url, Error> {
    gix_url::parse(gix_transport::bstr::BStr::new(cfg.url.as_bytes()))
        .map_err(|_| Error::Url(cfg.url.clone()))
}

/// A failure of the conversation with the server, in the server's or the
/// transport's words (every cause in the chain), credentials redacted.
pub(crate) fn remote_error(cfg: &SourceConfig, e: &(dyn std::error::Error + 'static)) -> Error {
    let mut detail = e.to_string();
    let mut cause = e.source();
    let mut timed_out = false;
    let mut unauthorized = false;
    let mut seen = 0;
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            timed_out |= matches!(
                io.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            );
            unauthorized |= io.kind() == std::io::ErrorKind::PermissionDenied
                && io
                    .get_ref()
                    .is_some_and(|i| i.to_string().contains("HTTP status 401"));
        }
        unauthorized |= err.to_string().contains("HTTP status 401");
        at = err.source();
        seen += 1;
        if seen > 16 {
            break;
        }
    }
    while let Some(c) = cause {
        let text = c.to_string();
        if !detail.contains(&text) {
            detail = format!("{detail}: {text}");
        }
        cause = c.source();
        if detail.len() > 2048 {
            break;
        }
    }
    if unauthorized {
        return Error::Auth {
            url: redact(&cfg.url),
            tried: cfg.auth.tried(&cfg.url),
        };
    }
    if timed_out {
        return Error::Timeout {
            url: redact(&cfg.url),
            timeout: cfg.timeout,
        };
    }
    Error::Remote {
        url: redact(&cfg.url),
        detail: redact(&detail),
    }
}

/// A `git daemon` (git://): a TCP connection with the source's timeout on
/// connecting, reading and writing.
fn git_daemon(cfg: &SourceConfig) -> Result<Conn, Error> {
    let url = parsed(cfg)?;
    let host = url.host().ok_or_else(|| Error::Url(cfg.url.clone()))?;
    let port = url.port.unwrap_or(9418);
    let io = |e: std::io::Error| remote_error(cfg, &e);
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(io)?
        .next()
        .ok_or_else(|| Error::Url(cfg.url.clone()))?;
    let stream = TcpStream::connect_timeout(&addr, cfg.timeout).map_err(io)?;
    stream.set_read_timeout(Some(cfg.timeout)).map_err(io)?;
    stream.set_write_timeout(Some(cfg.timeout)).map_err(io)?;
    let writer = stream.try_clone().map_err(io)?;
    Ok(Box::new(
        gix_transport::client::git::blocking_io::Connection::new(
            stream,
            writer,
            Protocol::V2,
            url.path.clone(),
            Some((host.to_owned(), url.port)),
            gix_transport::client::git::ConnectMode::Daemon,
            false,
        ),
    ))
}

/// Smart HTTP(S), with basic credentials from `cfg.auth` or the URL.
fn http(cfg: &SourceConfig) -> Result<Conn, Error> {
    use gix_transport::client::blocking_io::http;
    let mut url = parsed(cfg)?;
    let account = match &cfg.auth {
        Auth::Basic { username, password } => Some((username.clone(), password.read()?)),
        Auth::Token(token) => Some(("x-access-token".to_owned(), token.read()?)),
        // The URL's own `user:password@` (gix-url decodes `%XX` escapes).
        Auth::None => url
            .user()
            .zip(url.password())
            .map(|(u, p)| (u.to_owned(), p.to_owned())),
        Auth::Ssh { .. } => None,
    };
    url.set_user(None);
    url.set_password(None);
    let timeout = cfg.timeout;
    let tls_error: Arc<Mutex<Option<String>>> = Arc::default();
    let configure_client = {
        let tls_error = tls_error.clone();
        move |b: reqwest::blocking::ClientBuilder| match crate::tls::client_config() {
            Ok(c) => Ok(b
                .tls_backend_preconfigured(c)
                .timeout(timeout)
                .connect_timeout(timeout)),
            Err(e) => {
                let e = e.to_string();
                *tls_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                Err(gix_error::message!("{e}").into())
            }
        }
    };
    let backend = http::reqwest::Options {
        configure_client: Some(Box::new(configure_client)),
        configure_request: None,
    };
    let options = http::Options {
        connect_timeout: Some(timeout),
        backend: Some(Arc::new(Mutex::new(backend))),
        ..Default::default()
    };
    let mut t: http::Transport<http::reqwest::Remote> = http::connect(url, Protocol::V2, false);
    t.configure(&options).map_err(|e| Error::Remote {
        url: redact(&cfg.url),
        detail: e.to_string(),
    })?;
    if let Some((username, password)) = account {
        t.set_identity(gix_transport::client::Account {
            username,
            password,
            oauth_refresh_token: None,
        })
        .map_err(|e| remote_error(cfg, &e))?;
    }
    Ok(Box::new(t))
}

/// The shortest socket timeout libssh2 and the TCP connections take.
fn at_least_a_second(d: Duration) -> Duration {
    d.max(Duration::from_secs(1))
}
