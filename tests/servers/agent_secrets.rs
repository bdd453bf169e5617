//! Credentials are never printed: a repository URL carrying `user:password@`
//! is redacted in every source error (which the agent logs and reports as
//! `status.lastFetch.result`), and the authentication error says which
//! credential was tried. Against lighttpd + git http-backend on loopback.

use crate::support::git::*;
use drover::source::{Auth, Error, Source, SourceConfig};
use std::time::Duration;

fn source(tmp: &std::path::Path, url: String) -> Source {
    let mut cfg = SourceConfig::new(url, tmp.join(format!("cache-{}", rand::random::<u32>())));
    cfg.auth = Auth::None;
    cfg.timeout = Duration::from_secs(20);
    Source::open(cfg).unwrap()
}

#[test]
fn a_password_in_the_url_is_never_printed_and_the_error_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let base = tmp.path().join("served");
    std::fs::create_dir_all(&base).unwrap();
    bare_clone(&work.dir, &base, "config");
    let http = HttpServer::start(&base, tmp.path());
    let plain = http.url("config");
    let with = |user: &str, pw: &str| plain.replacen("http://", &format!("http://{user}:{pw}@"), 1);

    // Control: the right password in the URL fetches, so the refusal below is
    // the server's answer to a wrong password, not a URL drover cannot use.
    let ok = source(tmp.path(), with(&http.user, &http.password)).fetch();
    assert!(ok.is_ok(), "{}", ok.unwrap_err());

    let src = source(tmp.path(), with("deploy", "hunter2-wrong"));
    let err = src.fetch().unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Auth { .. }), "{text}");
    assert!(!text.contains("hunter2-wrong"), "password printed: {text}");
    assert!(
        text.contains("the user and password in the repository URL (user `deploy`)"),
        "the error must say which credential was tried, not \"anonymous\": {text}"
    );
    assert!(text.contains("deploy:***@127.0.0.1"), "{text}");
    assert!(!format!("{src:?}").contains("hunter2"), "{src:?}");
    assert!(!format!("{:?}", src.config()).contains("hunter2"));

    // No credentials at all: said as such.
    let err = source(tmp.path(), plain).fetch().unwrap_err();
    assert!(
        err.to_string()
            .contains("anonymous access (no credentials configured)"),
        "{err}"
    );

    // A server that does not answer at all: the timeout and git errors carry the URL too.
    let port = free_port();
    let dead = format!("http://deploy:hunter2-wrong@127.0.0.1:{port}/git/config.git");
    let err = source(tmp.path(), dead).fetch().unwrap_err().to_string();
    assert!(!err.contains("hunter2"), "{err}");
}
