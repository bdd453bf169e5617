//! Trust (docs/design.md §6) through `drover verify` and through the source/trust API.

use crate::support::cli::drover;
use crate::support::git::*;
use drover::source::{Source, SourceConfig};
use drover::trust::{self, AllowedSigners, Mode, Reason};
use git2::Oid;
use std::path::{Path, PathBuf};

struct Fixture {
    _tmp: tempfile::TempDir,
    work: WorkRepo,
    signer: PathBuf,
    stranger: PathBuf,
    allowed: PathBuf,
    root: String,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let root = work.head();
    let signer = keygen(tmp.path(), "release");
    let stranger = keygen(tmp.path(), "stranger");
    let allowed = tmp.path().join("allowed_signers");
    allowed_signers(&allowed, &[("release@example.com", &signer)]);
    Fixture {
        _tmp: tmp,
        work,
        signer,
        stranger,
        allowed,
        root,
    }
}

fn verify(f: &Fixture, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let mut args = vec![
        "--repo",
        f.work.dir.to_str().unwrap(),
        "--format",
        "json",
        "verify",
        "--allowed-signers",
        f.allowed.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = drover(&args);
    let json = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
    (code, json, err)
}

fn assert_refused(f: &Fixture, extra: &[&str], commit: &str, reason: &str) {
    let (code, json, err) = verify(f, extra);
    assert_eq!(code, 1, "{json} {err}");
    assert_eq!(json["ok"], false);
    assert_eq!(json["error"]["commit"], commit, "{json}");
    assert_eq!(json["error"]["reason"], reason, "{json}");
    assert!(json["error"]["message"].as_str().unwrap().contains(commit));
}

#[test]
fn signed_history_verifies_and_reports_the_signer() {
    let f = fixture();
    f.work
        .bump("test", "1.1.0", "Bump test (#1)", Some(&f.signer));
    let head = f
        .work
        .bump("stage", "1.1.0", "Bump stage (#2)", Some(&f.signer));
    let (code, json, err) = verify(&f, &["--since", &f.root]);
    assert_eq!(code, 0, "{json} {err}");
    assert_eq!(json["checked"], 2);
    assert_eq!(json["head"], head);
    assert_eq!(json["signer"], "release@example.com");
    // Without --since, `all` covers the whole history, whose root is unsigned.
    assert_refused(&f, &[], &f.root, "unsigned");
    let (code, json, _) = verify(&f, &["--mode", "head"]);
    assert_eq!(code, 0, "{json}");
    // Text output names the signer too.
    let (code, out, _) = drover(&[
        "--repo",
        f.work.dir.to_str().unwrap(),
        "verify",
        "--allowed-signers",
        f.allowed.to_str().unwrap(),
        "--since",
        &f.root,
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("release@example.com"), "{out}");
}

#[test]
fn unsigned_commit_is_refused() {
    let f = fixture();
    f.work.bump("test", "1.1.0", "signed", Some(&f.signer));
    let bad = f.work.bump("test", "1.2.0", "unsigned", None);
    f.work
        .bump("test", "1.3.0", "signed again", Some(&f.signer));
    assert_refused(&f, &["--since", &f.root], &bad, "unsigned");
}

#[test]
fn unknown_key_is_refused() {
    let f = fixture();
    let bad = f
        .work
        .bump("test", "1.1.0", "by a stranger", Some(&f.stranger));
    assert_refused(&f, &["--since", &f.root], &bad, "unknown_key");
    assert_refused(&f, &["--mode", "head"], &bad, "unknown_key");
}

#[test]
fn tampered_commit_is_refused_as_bad_signature() {
    let f = fixture();
    f.work.bump("test", "1.1.0", "signed", Some(&f.signer));
    let forged = f.work.tamper_head();
    assert_refused(&f, &["--since", &f.root], &forged, "bad_signature");
}

#[test]
fn head_not_descending_from_since_is_refused() {
    let f = fixture();
    let older = f.work.bump("test", "1.1.0", "signed", Some(&f.signer));
    let newer = f.work.bump("test", "1.2.0", "signed", Some(&f.signer));
    git(&f.work.dir, &["reset", "-q", "--hard", &older]);
    assert_refused(&f, &["--since", &newer], &older, "not_descendant");
}

#[test]
fn validity_and_namespace_options_are_enforced() {
    let f = fixture();
    let head = f.work.bump("test", "1.1.0", "signed", Some(&f.signer));
    let key = public_key(&f.signer);
    std::fs::write(
        &f.allowed,
        format!("release@example.com valid-before=\"20000101\" {key}\n"),
    )
    .unwrap();
    assert_refused(&f, &["--since", &f.root], &head, "expired_key");
    std::fs::write(
        &f.allowed,
        format!("release@example.com valid-after=\"29990101\" {key}\n"),
    )
    .unwrap();
    assert_refused(&f, &["--since", &f.root], &head, "key_not_yet_valid");
    std::fs::write(
        &f.allowed,
        format!("release@example.com namespaces=\"file\" {key}\n"),
    )
    .unwrap();
    assert_refused(&f, &["--since", &f.root], &head, "wrong_namespace");
    std::fs::write(
        &f.allowed,
        format!("release@example.com cert-authority {key}\n"),
    )
    .unwrap();
    let (code, _, err) = verify(&f, &[]);
    assert_eq!(code, 2);
    assert!(err.contains("cert-authority"), "{err}");
}

#[test]
fn all_mode_checks_every_parent_of_a_merge() {
    let f = fixture();
    git(&f.work.dir, &["checkout", "-q", "-b", "feature"]);
    let side = f.work.bump("stage", "1.1.0", "unsigned side commit", None);
    git(&f.work.dir, &["checkout", "-q", "main"]);
    f.work.bump("test", "1.1.0", "signed", Some(&f.signer));
    let sk = format!("user.signingkey={}", f.signer.display());
    git(
        &f.work.dir,
        &[
            "-c",
            "gpg.format=ssh",
            "-c",
            &sk,
            "merge",
            "-q",
            "-S",
            "--no-ff",
            "-m",
            "Merge pull request #3",
            "feature",
        ],
    );
    assert_refused(&f, &["--since", &f.root], &side, "unsigned");
    let (code, _, _) = verify(&f, &["--mode", "head"]);
    assert_eq!(code, 0);
}

#[test]
fn cannot_run_exits_2() {
    let f = fixture();
    let (code, _, err) = verify(&f, &["--since", "no-such-rev"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = drover(&[
        "--repo",
        f.work.dir.to_str().unwrap(),
        "verify",
        "--allowed-signers",
        "/nonexistent",
    ]);
    assert_eq!(code, 2, "{err}");
}

/// The agent's path: fetch, check against the last trusted commit, accept only on success.
fn fetch_and_check(src: &Source, signers: &AllowedSigners) -> Result<Oid, trust::Error> {
    let fetched = src.fetch().expect("fetch");
    let seen = src.seen();
    let now = chrono::Utc::now().timestamp();
    let first_seen = |oid| seen.first_seen(oid).unwrap_or(now);
    trust::check(
        src.repo(),
        Mode::All,
        signers,
        src.current(),
        fetched.head,
        &first_seen,
    )?;
    src.accept(fetched.head).unwrap();
    Ok(fetched.head)
}

fn force_push(work: &Path, bare: &Path) {
    git(work, &["push", "-q", "-f", bare.to_str().unwrap(), "main"]);
}

#[test]
fn source_keeps_the_last_trusted_commit_when_a_change_is_refused() {
    let f = fixture();
    let base = f._tmp.path().join("served");
    std::fs::create_dir_all(&base).unwrap();
    let first = f.work.bump("test", "1.1.0", "signed", Some(&f.signer));
    let bare = bare_clone(&f.work.dir, &base, "config");
    let signers = AllowedSigners::load(&f.allowed).unwrap();
    let src = Source::open(SourceConfig::new(
        format!("file://{}", bare.display()),
        f._tmp.path().join("cache"),
    ))
    .unwrap();
    // First start: the whole history must be signed, and the root is not.
    let err = fetch_and_check(&src, &signers).unwrap_err();
    assert!(
        matches!(&err, trust::Error::Refused(r) if r.reason == Reason::Unsigned && r.commit == f.root)
    );
    assert_eq!(src.current(), None);
    // An operator seeds the trust anchor, as `--since` does for verify.
    src.accept(Oid::from_str(&f.root).unwrap()).unwrap();
    assert_eq!(fetch_and_check(&src, &signers).unwrap().to_string(), first);

    let trusted = Some(Oid::from_str(&first).unwrap());
    type MakeBadCommit<'a> = Box<dyn Fn() -> String + 'a>;
    let cases: Vec<(MakeBadCommit<'_>, &str)> = vec![
        (
            Box::new(|| f.work.bump("test", "1.2.0", "unsigned", None)),
            "unsigned",
        ),
        (
            Box::new(|| f.work.bump("test", "1.3.0", "stranger", Some(&f.stranger))),
            "unknown_key",
        ),
        (
            Box::new(|| {
                f.work.bump("test", "1.4.0", "to tamper", Some(&f.signer));
                f.work.tamper_head()
            }),
            "bad_signature",
        ),
    ];
    for (make, code) in cases {
        git(&f.work.dir, &["reset", "-q", "--hard", &first]);
        let bad = make();
        force_push(&f.work.dir, &bare);
        let err = fetch_and_check(&src, &signers).unwrap_err();
        let trust::Error::Refused(r) = err else {
            panic!("{err}")
        };
        assert_eq!((r.reason.code(), r.commit.as_str()), (code, bad.as_str()));
        assert_eq!(
            src.current(),
            trusted,
            "the last trusted commit stays current"
        );
    }
    // Force-push to older (signed) history: refused as not descending.
    git(&f.work.dir, &["reset", "-q", "--hard", &first]);
    let newer = f.work.bump("test", "2.0.0", "signed", Some(&f.signer));
    force_push(&f.work.dir, &bare);
    assert_eq!(fetch_and_check(&src, &signers).unwrap().to_string(), newer);
    git(&f.work.dir, &["reset", "-q", "--hard", &first]);
    force_push(&f.work.dir, &bare);
    let err = fetch_and_check(&src, &signers).unwrap_err();
    assert!(
        matches!(&err, trust::Error::Refused(r) if r.reason.code() == "not_descendant" && r.commit == first),
        "{err}"
    );
    assert_eq!(src.current().unwrap().to_string(), newer);
}
