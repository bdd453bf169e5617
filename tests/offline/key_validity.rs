//! Key validity (docs/design.md §6): `valid-after` / `valid-before` are
//! checked against the commit time *and* the time the commit was first
//! seen, so a retired key cannot sign today with a backdated commit. For
//! the agent, "first seen" is its fetch record in the cache repository
//! (src/source/seen.rs), which survives a restart; for `drover verify`,
//! which has no fetch history, it is the time of the run.

use crate::support::cli::drover;
use crate::support::git::*;
use chrono::{Duration, Utc};
use drover::source::seen::{Seen, SEEN_FILE};
use drover::source::{Source, SourceConfig};
use drover::trust::{self, AllowedSigners, Mode, Reason};
use git2::Oid;
use std::path::{Path, PathBuf};

/// `YYYYMMDDHHMMSSZ`, the allowed-signers time format, `hours` from now.
fn stamp(hours: i64) -> String {
    (Utc::now() + Duration::hours(hours))
        .format("%Y%m%d%H%M%SZ")
        .to_string()
}

/// A version bump signed with `key` whose author and committer dates are
/// `days` ago (the signer chooses them).
fn signed_bump_dated(work: &WorkRepo, env: &str, version: &str, key: &Path, days: i64) -> String {
    work.write_env(env, version);
    let date = format!("{} +0000", (Utc::now() - Duration::days(days)).timestamp());
    commit_all(&work.dir, "bump", Some(key), Some(&date))
}

struct Fixture {
    tmp: tempfile::TempDir,
    work: WorkRepo,
    key: PathBuf,
    allowed: PathBuf,
    root: String,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let root = work.head();
    let key = keygen(tmp.path(), "release");
    let allowed = tmp.path().join("allowed_signers");
    Fixture {
        tmp,
        work,
        key,
        allowed,
        root,
    }
}

impl Fixture {
    /// The release key, valid before `valid_before`.
    fn retire_at(&self, valid_before: &str) {
        std::fs::write(
            &self.allowed,
            format!(
                "release@example.com namespaces=\"git\",valid-before=\"{valid_before}\" {}\n",
                public_key(&self.key)
            ),
        )
        .unwrap();
    }

    fn verify(&self) -> (i32, serde_json::Value) {
        let (code, out, err) = drover(&[
            "--repo",
            self.work.dir.to_str().unwrap(),
            "--format",
            "json",
            "verify",
            "--allowed-signers",
            self.allowed.to_str().unwrap(),
            "--since",
            &self.root,
        ]);
        let doc = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out} {err}"));
        (code, doc)
    }
}

#[test]
fn verify_refuses_a_backdated_commit_by_a_retired_key() {
    let f = fixture();
    // The key was retired an hour ago; the commit claims to be two days old.
    let bad = signed_bump_dated(&f.work, "test", "1.1.0", &f.key, 2);
    f.retire_at(&stamp(-1));
    let (code, doc) = f.verify();
    assert_eq!(code, 1, "{doc}");
    assert_eq!(doc["error"]["commit"], bad.as_str());
    assert_eq!(doc["error"]["reason"], "expired_key", "{doc}");
    let msg = doc["error"]["message"].as_str().unwrap();
    assert!(msg.contains("first seen"), "{msg}");

    // Control: the same backdated commit while the key is still valid passes.
    f.retire_at(&stamp(24));
    let (code, doc) = f.verify();
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["signer"], "release@example.com");
}

#[test]
fn verify_refuses_a_forward_dated_commit_by_a_key_not_valid_yet() {
    let f = fixture();
    // The key becomes valid tomorrow; the commit claims to be from the day after.
    let early = signed_bump_dated(&f.work, "test", "1.1.0", &f.key, -2);
    let valid_after = |hours| {
        std::fs::write(
            &f.allowed,
            format!(
                "release@example.com valid-after=\"{}\" {}\n",
                stamp(hours),
                public_key(&f.key)
            ),
        )
        .unwrap()
    };
    valid_after(24);
    let (code, doc) = f.verify();
    assert_eq!(code, 1, "{doc}");
    assert_eq!(doc["error"]["commit"], early.as_str());
    assert_eq!(doc["error"]["reason"], "key_not_yet_valid", "{doc}");
    assert!(doc["error"]["message"]
        .as_str()
        .unwrap()
        .contains("first seen"));
    // Control: a key valid since yesterday accepts it.
    valid_after(-24);
    let (code, doc) = f.verify();
    assert_eq!(code, 0, "{doc}");
}

/// Open a cache for `bare` whose fetch record already says `commits` were
/// first fetched at `at`: what a previous run of the agent left behind.
fn cache_with_record(f: &Fixture, bare: &Path, commits: &[&str], at: i64) -> Source {
    let cache = f.tmp.path().join("cache");
    let src = Source::open(SourceConfig::new(
        format!("file://{}", bare.display()),
        &cache,
    ))
    .unwrap();
    let text: String = commits.iter().map(|c| format!("{c} {at}\n")).collect();
    std::fs::write(src.repo().path().join(SEEN_FILE), text).unwrap();
    src
}

/// The agent's trust step: the record's time, or now for an unrecorded commit.
fn check(src: &Source, signers: &AllowedSigners, last: &str, head: Oid) -> Result<(), Reason> {
    let seen = src.seen();
    let now = Utc::now().timestamp();
    let first_seen = |oid| seen.first_seen(oid).unwrap_or(now);
    let last = Oid::from_str(last).unwrap();
    match trust::check(
        src.repo(),
        Mode::All,
        signers,
        Some(last),
        head,
        &first_seen,
    ) {
        Ok(_) => Ok(()),
        Err(trust::Error::Refused(r)) => Err(r.reason),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn the_agent_judges_keys_at_its_first_fetch_and_remembers_it_across_restarts() {
    let f = fixture();
    let served = f.tmp.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    // Signed three days ago, while the key was valid; the agent fetched it then.
    let legit = signed_bump_dated(&f.work, "test", "1.1.0", &f.key, 3);
    let bare = bare_clone(&f.work.dir, &served, "config");
    let two_days_ago = (Utc::now() - Duration::days(2)).timestamp();
    f.retire_at(&stamp(-24));
    let signers = AllowedSigners::load(&f.allowed).unwrap();
    {
        let src = cache_with_record(&f, &bare, &[&legit], two_days_ago);
        let fetched = src.fetch().unwrap();
        // Control: first fetched two days ago, before the key was retired a day ago.
        assert_eq!(check(&src, &signers, &f.root, fetched.head), Ok(()));
        assert_eq!(src.seen().first_seen(fetched.head), Some(two_days_ago));
    }

    // The attacker, holding the retired key, signs a commit dated a week
    // ago; the agent (restarted: a fresh Source on the same cache)
    // fetches it now.
    let forged = signed_bump_dated(&f.work, "test", "1.2.0", &f.key, 7);
    git(&f.work.dir, &["push", "-q", bare.to_str().unwrap(), "main"]);
    let src = Source::open(SourceConfig::new(
        format!("file://{}", bare.display()),
        f.tmp.path().join("cache"),
    ))
    .unwrap();
    let fetched = src.fetch().unwrap();
    assert_eq!(fetched.head.to_string(), forged);
    let seen = Seen::load(src.repo().path());
    let recorded = seen
        .first_seen(fetched.head)
        .expect("the fetch recorded it");
    assert!(
        recorded > Utc::now().timestamp() - 60,
        "recorded at the fetch"
    );
    // The committer date alone would pass: it is a week old, before valid-before.
    let commit_time = src
        .repo()
        .find_commit(fetched.head)
        .unwrap()
        .time()
        .seconds();
    assert!(commit_time < Utc::now().timestamp() - 6 * 86_400);
    match check(&src, &signers, &f.root, fetched.head) {
        Err(Reason::ExpiredWhenSeen { principal, .. }) => {
            assert_eq!(principal, "release@example.com")
        }
        other => panic!("the backdated commit was not refused as expired: {other:?}"),
    }
    // The legitimate commit keeps its old record: still trusted on its own.
    assert_eq!(
        check(&src, &signers, &f.root, Oid::from_str(&legit).unwrap()),
        Ok(())
    );
}
