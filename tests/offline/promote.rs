//! `drover promote` on a real git repository built from example-repo, with
//! confirmations on the status branch.

use crate::support::git::{example_checkout, git};
use std::path::Path;

/// The report signing key of `<env>/<cluster>`, made from its name.
fn cluster_key(principal: &str) -> ssh_key::PrivateKey {
    use sha2::Digest;
    let seed: [u8; 32] = sha2::Sha256::digest(principal.as_bytes()).into();
    ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&seed))
}

/// example-repo as a git repository with test at `test_version`.
fn repo(test_version: &str) -> tempfile::TempDir {
    let dir = example_checkout();
    let f = dir.path().join("environments/test.toml");
    let text = std::fs::read_to_string(&f).unwrap().replacen(
        "\"1.12.0\"",
        &format!("\"{test_version}\""),
        1,
    );
    std::fs::write(f, text).unwrap();
    // test-1's key may sign its reports.
    let signers = dir.path().join("agents.allowed_signers");
    let mut text = std::fs::read_to_string(&signers).unwrap();
    text.push_str(&format!(
        "test/test-1 namespaces=\"git\" {}\n",
        cluster_key("test/test-1")
            .public_key()
            .to_openssh()
            .unwrap()
    ));
    std::fs::write(signers, text).unwrap();
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-q", "-m", "initial"]);
    dir
}

/// Commit a confirmed report for `cluster` of `env` on the status branch.
fn confirm(dir: &Path, env: &str, cluster: &str, version: &str, since: &str) {
    let repo = git2::Repository::open(dir).unwrap();
    let report = drover::status::StatusReport {
        env: env.into(),
        cluster: cluster.into(),
        config_commit: "0".repeat(40),
        version: version.parse().unwrap(),
        state: drover::rollout::RolloutState::Confirmed,
        since: since.parse().unwrap(),
        nodes: 3,
        nodes_at_version: 3,
        message: String::new(),
        detail: Default::default(),
    };
    let parent = repo
        .find_reference("refs/heads/drover/status")
        .ok()
        .map(|r| r.peel_to_commit().unwrap());
    let mut index = git2::Index::new().unwrap();
    if let Some(p) = &parent {
        index.read_tree(&p.tree().unwrap()).unwrap();
    }
    let blob = repo.blob(report.to_toml().as_bytes()).unwrap();
    let entry = git2::IndexEntry {
        ctime: git2::IndexTime::new(0, 0),
        mtime: git2::IndexTime::new(0, 0),
        dev: 0,
        ino: 0,
        mode: 0o100644,
        uid: 0,
        gid: 0,
        file_size: 0,
        id: blob,
        flags: 0,
        flags_extended: 0,
        path: report.path().into_bytes(),
    };
    index.add(&entry).unwrap();
    let tree = repo.find_tree(index.write_tree_to(&repo).unwrap()).unwrap();
    let at: chrono::DateTime<chrono::Utc> = since.parse().unwrap();
    let sig = git2::Signature::new(
        "agent",
        "agent@example.com",
        &git2::Time::new(at.timestamp(), 0),
    )
    .unwrap();
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    // Signed by the cluster's own key, as its agent signs.
    let buf = repo
        .commit_create_buffer(&sig, &sig, "status", &tree, &parents)
        .unwrap();
    let pem = cluster_key(&format!("{env}/{cluster}"))
        .sign("git", ssh_key::HashAlg::Sha512, &buf)
        .unwrap()
        .to_pem(ssh_key::LineEnding::LF)
        .unwrap();
    let oid = repo
        .commit_signed(buf.as_str().unwrap(), pem.trim_end(), None)
        .unwrap();
    repo.reference("refs/heads/drover/status", oid, true, "report")
        .unwrap();
}

fn promote(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = crate::support::cli::drover_command()
        .arg("--repo")
        .arg(dir)
        .arg("promote")
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn promotes_stage_to_the_version_test_confirmed_once_soaked() {
    let dir = repo("1.13.2");
    confirm(
        dir.path(),
        "test",
        "test-1",
        "1.13.2",
        "2026-12-01T04:12:00Z",
    );

    let (code, out) = promote(dir.path(), &["stage", "--now", "2026-12-01T20:00:00Z"]);
    assert_eq!(code, 1, "refused before the soak passed: {out}");
    assert!(
        out.contains("2026-12-02T04:12:00Z"),
        "says when the soak passes: {out}"
    );

    let (code, out) = promote(dir.path(), &["stage", "--now", "2026-12-07T00:00:00Z"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        git(dir.path(), &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "drover/promote-stage-1.13.2"
    );
    let file = std::fs::read_to_string(dir.path().join("environments/stage.toml")).unwrap();
    assert!(file.contains("version = \"1.13.2\""), "{file}");
    assert!(file.contains("# exact OS version"), "comments kept: {file}");
    let msg = git(dir.path(), &["log", "-1", "--format=%B"]);
    assert!(msg.starts_with("Promote stage to 1.13.2"), "{msg}");
    assert!(
        msg.contains("test-1") && msg.contains("2026-12-01T04:12:00Z"),
        "evidence in message: {msg}"
    );

    // The commit passes `drover check --base main` at the same moment.
    let out = crate::support::cli::drover_command()
        .args(["--repo"])
        .arg(dir.path())
        .args(["check", "--base", "main", "--now", "2026-12-07T00:00:00Z"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn refuses_a_version_the_lower_environment_did_not_confirm() {
    let dir = repo("1.13.3");
    confirm(
        dir.path(),
        "test",
        "test-1",
        "1.13.2",
        "2026-12-01T04:12:00Z",
    );
    let (code, out) = promote(
        dir.path(),
        &["stage", "--to", "1.13.3", "--now", "2026-12-07T00:00:00Z"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("not confirmed by: test-1"), "{out}");
    assert_eq!(
        git(dir.path(), &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "main",
        "no branch made"
    );
}

#[test]
fn production_cannot_skip_stage() {
    let dir = repo("1.13.2");
    confirm(
        dir.path(),
        "test",
        "test-1",
        "1.13.2",
        "2026-12-01T04:12:00Z",
    );
    let (code, out) = promote(dir.path(), &["production", "--now", "2026-12-30T00:00:00Z"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("stage has proven no version newer"), "{out}");
    let (code, _) = promote(dir.path(), &["test"]);
    assert_eq!(code, 1, "the first environment is bumped directly");
}
