//! Fetching over each transport from real servers on loopback.

use crate::support::git::*;
use drover::source::{Auth, Error, Secret, Source, SourceConfig};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Served {
    tmp: tempfile::TempDir,
    work: WorkRepo,
    base: PathBuf,
    bare: PathBuf,
}

/// A work repo with a status branch, served from `base/config.git`.
fn served() -> Served {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    git(&work.dir, &["branch", "drover/status"]);
    let base = tmp.path().join("served");
    std::fs::create_dir_all(&base).unwrap();
    let bare = bare_clone(&work.dir, &base, "config");
    Served {
        tmp,
        work,
        base,
        bare,
    }
}

fn source(s: &Served, url: String, auth: Auth) -> Source {
    let mut cfg = SourceConfig::new(url, s.tmp.path().join("cache"));
    cfg.auth = auth;
    cfg.timeout = Duration::from_secs(20);
    Source::open(cfg).unwrap()
}

fn rev(dir: &Path, r: &str) -> String {
    git(dir, &["rev-parse", r])
}

/// Fetch, check both tips, then push a change and see an incremental fetch pick it up.
fn fetch_round_trip(s: &Served, src: &Source) {
    let r = src
        .fetch()
        .unwrap_or_else(|e| panic!("fetch {}: {e}", src.config().url));
    assert_eq!(r.head.to_string(), rev(&s.bare, "main"));
    assert_eq!(
        r.status_tip.map(|o| o.to_string()),
        Some(rev(&s.bare, "drover/status"))
    );
    assert_eq!(src.fetched(), Some(r.head));
    assert_eq!(
        src.current(),
        None,
        "a fetch never moves the current commit"
    );
    assert!(src
        .read_file(r.head, "environments/test.toml")
        .unwrap()
        .is_some());
    let again = src.fetch().unwrap();
    assert_eq!(
        (again.head, again.received_objects),
        (r.head, 0),
        "nothing new, nothing received"
    );
    let next = s.work.bump("test", "1.1.0", "Bump test (#5)", None);
    git(
        &s.work.dir,
        &["push", "-q", s.bare.to_str().unwrap(), "main"],
    );
    let after = src.fetch().unwrap();
    assert_eq!(after.head.to_string(), next);
    assert!(
        after.received_objects > 0 && after.received_objects < 10,
        "incremental: {}",
        after.received_objects
    );
}

#[test]
fn file_url_and_plain_path() {
    let s = served();
    let src = source(&s, format!("file://{}", s.bare.display()), Auth::None);
    fetch_round_trip(&s, &src);
    assert_eq!(src.local_path().as_deref(), Some(s.bare.as_path()));
}

#[test]
fn git_daemon() {
    let s = served();
    let daemon = GitDaemon::start(&s.base);
    let src = source(&s, daemon.url("config"), Auth::None);
    fetch_round_trip(&s, &src);
    // The cache survives a restart: reopening sees the last fetched state.
    let head = src.fetched();
    drop(src);
    let reopened = source(&s, daemon.url("config"), Auth::None);
    assert_eq!(reopened.fetched(), head);
}

#[test]
fn smart_http_with_basic_auth_and_token_file() {
    let s = served();
    let http = HttpServer::start(&s.base, s.tmp.path());
    let good = Auth::Basic {
        username: http.user.clone(),
        password: Secret::Value(http.password.clone()),
    };
    let src = source(&s, http.url("config"), good);
    fetch_round_trip(&s, &src);

    let wrong = Auth::Basic {
        username: http.user.clone(),
        password: Secret::Value("wrong".into()),
    };
    let err = source(&s, http.url("config"), wrong).fetch().unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("rejected basic credentials (user `deploy`)"),
        "{err}"
    );

    let err = source(&s, http.url("config"), Auth::None)
        .fetch()
        .unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err}");

    let missing = Auth::Token(Secret::File(s.tmp.path().join("no-such-token")));
    let err = source(&s, http.url("config"), missing).fetch().unwrap_err();
    assert!(err.to_string().contains("no-such-token"), "{err}");
}

#[test]
fn ssh_with_deploy_key_and_known_hosts() {
    let s = served();
    let sshd = SshServer::start(s.tmp.path());
    let kh = s.tmp.path().join("known_hosts");
    let auth = |kh: &Path| Auth::Ssh {
        username: None,
        private_key: sshd.client_key.clone(),
        known_hosts: kh.to_path_buf(),
    };
    std::fs::write(&kh, sshd.known_hosts_line()).unwrap();
    let src = source(&s, sshd.url(&s.bare), auth(&kh));
    fetch_round_trip(&s, &src);

    // Unknown host: never trusted on first use.
    std::fs::write(&kh, "").unwrap();
    let err = source(&s, sshd.url(&s.bare), auth(&kh))
        .fetch()
        .unwrap_err();
    assert!(
        matches!(&err, Error::HostKey { detail, .. } if detail.contains("not listed")),
        "{err}"
    );

    // Changed host key.
    let other = keygen(s.tmp.path(), "other_host");
    std::fs::write(
        &kh,
        format!("[127.0.0.1]:{} {}\n", sshd.port, public_key(&other)),
    )
    .unwrap();
    let err = source(&s, sshd.url(&s.bare), auth(&kh))
        .fetch()
        .unwrap_err();
    assert!(
        matches!(&err, Error::HostKey { detail, .. } if detail.contains("does not match")),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("[127.0.0.1]:{}", sshd.port)),
        "{err}"
    );

    // Right host, wrong client key.
    std::fs::write(&kh, sshd.known_hosts_line()).unwrap();
    let stranger = keygen(s.tmp.path(), "stranger");
    let wrong = Auth::Ssh {
        username: None,
        private_key: stranger,
        known_hosts: kh.clone(),
    };
    let err = source(&s, sshd.url(&s.bare), wrong).fetch().unwrap_err();
    assert!(
        matches!(
            err,
            Error::Auth { ref tried, .. } if tried.starts_with("the SSH key")
        ),
        "{err}"
    );
}

#[test]
fn missing_branch_and_stalled_server() {
    let s = served();
    let mut cfg = SourceConfig::new(
        format!("file://{}", s.bare.display()),
        s.tmp.path().join("cache"),
    );
    cfg.branch = "release".into();
    let err = Source::open(cfg).unwrap().fetch().unwrap_err();
    assert!(matches!(err, Error::BranchMissing { .. }), "{err}");

    // A server that accepts and then says nothing: the fetch gives up in bounded time.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let holder = std::thread::spawn(move || listener.accept().map(|(conn, _)| conn));
    let mut cfg = SourceConfig::new(
        format!("git://127.0.0.1:{port}/config.git"),
        s.tmp.path().join("cache2"),
    );
    cfg.timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = Source::open(cfg).unwrap().fetch().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    drop(holder.join());
}
