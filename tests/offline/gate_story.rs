//! The story of docs/design.md §0 as gate tests against
//! real git repositories: config commits on `main`, agent reports on the
//! status branch, each at a chosen time, judged at explicit times.

use crate::support::time::t;
use chrono::{DateTime, Utc};
use drover::admit::{self, check_base, ChangeReport, Error};
use drover::gate::Decision;
use git2::{IndexEntry, IndexTime, Oid, Repository, Signature, Time};
use std::path::Path;

fn check_changes_report(
    repo: &Path,
    base: &str,
    now: DateTime<Utc>,
) -> Result<ChangeReport, Error> {
    check_base(repo, base, now)
}

fn check_changes(
    repo: &Path,
    base: &str,
    now: DateTime<Utc>,
) -> Result<Vec<drover::diag::Diagnostic>, Error> {
    Ok(check_base(repo, base, now)?.diagnostics)
}

/// The report signing key of `<env>/<cluster>` (made from its name, so each
/// cluster has its own; never a key to use outside this test).
fn cluster_key(principal: &str) -> ssh_key::PrivateKey {
    use sha2::Digest;
    let seed: [u8; 32] = sha2::Sha256::digest(principal.as_bytes()).into();
    ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&seed))
}

fn report_signers() -> String {
    ["test/test-1", "stage/stage-1", "stage/stage-2"]
        .iter()
        .map(|p| {
            format!(
                "{p} namespaces=\"git\" {}\n",
                cluster_key(p).public_key().to_openssh().unwrap()
            )
        })
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
    repo: Repository,
}

const MAIN: &str = "refs/heads/main";
const STATUS: &str = "refs/heads/drover/status";

fn root_toml(evidence: &str, stage_clusters: &str) -> String {
    format!(
        "[promotion]\nchain = [\"test\", \"stage\", \"production\"]\nevidence = \"{evidence}\"\nstatus_branch = \"drover/status\"\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\ntest = [\"test-1\"]\nstage = [{stage_clusters}]\nproduction = [\"prod-eu-1\", \"prod-us-1\"]\n"
    )
}

fn env_toml(version: &str, day: u32, extra: &str) -> String {
    format!(
        "# pinned OS version\nversion = \"{version}\"\n{extra}\n[window]\nschedule = \"0 2 {day} * *\"\nduration = \"6h\"\ntimezone = \"Europe/Madrid\"\n\n[promotion]\nsoak = \"24h\"\n"
    )
}

fn report(env: &str, cluster: &str, version: &str, state: &str, since: &str) -> String {
    format!(
        "env = \"{env}\"\ncluster = \"{cluster}\"\nconfig_commit = \"abc\"\nversion = \"{version}\"\nstate = \"{state}\"\nsince = {since}\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"
    )
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init(dir.path()).expect("init");
        repo.set_head(MAIN).expect("head");
        Fixture { dir, repo }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Commit `files` on top of `refname` (or as its first commit) at `when`.
    fn commit(&self, refname: &str, files: &[(&str, &str)], when: &str) -> Oid {
        let parent = self
            .repo
            .find_reference(refname)
            .ok()
            .and_then(|r| r.peel_to_commit().ok());
        let mut index = git2::Index::new().expect("index");
        if let Some(p) = &parent {
            index
                .read_tree(&p.tree().expect("tree"))
                .expect("read tree");
        }
        for (path, content) in files {
            let entry = IndexEntry {
                ctime: IndexTime::new(0, 0),
                mtime: IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: 0o100644,
                uid: 0,
                gid: 0,
                file_size: content.len() as u32,
                id: self.repo.blob(content.as_bytes()).expect("blob"),
                flags: 0,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            };
            index.add(&entry).expect("add");
        }
        let tree_id = index.write_tree_to(&self.repo).expect("write tree");
        let tree = self.repo.find_tree(tree_id).expect("find tree");
        let sig = Signature::new("Dev", "dev@example.com", &Time::new(t(when).timestamp(), 0))
            .expect("sig");
        let parents: Vec<_> = parent.iter().collect();
        // A report is committed as its cluster's agent would: signed with
        // that cluster's own key.
        let cluster = files.first().and_then(|(p, _)| {
            p.strip_prefix("status/")?
                .strip_suffix(".toml")
                .map(str::to_owned)
        });
        let Some(principal) = cluster else {
            return self
                .repo
                .commit(Some(refname), &sig, &sig, "change", &tree, &parents)
                .expect("commit");
        };
        let buf = self
            .repo
            .commit_create_buffer(&sig, &sig, "status", &tree, &parents)
            .expect("buffer");
        let signature = cluster_key(&principal)
            .sign("git", ssh_key::HashAlg::Sha512, &buf)
            .expect("sign")
            .to_pem(ssh_key::LineEnding::LF)
            .expect("pem");
        let oid = self
            .repo
            .commit_signed(buf.as_str().unwrap(), signature.trim_end(), None)
            .expect("signed commit");
        self.repo
            .reference(refname, oid, true, "report")
            .expect("ref");
        oid
    }

    /// The story's starting point: everything at 1.12.0.
    fn story(evidence: &str, stage_clusters: &str) -> Self {
        let f = Fixture::new();
        f.commit(
            MAIN,
            &[
                ("drover.toml", &root_toml(evidence, stage_clusters)),
                ("agents.allowed_signers", &report_signers()),
                ("environments/test.toml", &env_toml("1.12.0", 1, "")),
                ("environments/stage.toml", &env_toml("1.12.0", 8, "")),
                ("environments/production.toml", &env_toml("1.12.0", 20, "")),
            ],
            "2026-11-01T00:00:00Z",
        );
        f
    }

    fn set_env(&self, env: &str, version: &str, extra: &str, when: &str) -> Oid {
        let day = match env {
            "test" => 1,
            "stage" => 8,
            _ => 20,
        };
        self.commit(
            MAIN,
            &[(
                &format!("environments/{env}.toml"),
                &env_toml(version, day, extra),
            )],
            when,
        )
    }

    fn confirm(&self, refname: &str, env: &str, cluster: &str, version: &str, since: &str) {
        self.commit(
            refname,
            &[(
                &format!("status/{env}/{cluster}.toml"),
                &report(env, cluster, version, "confirmed", since),
            )],
            since,
        );
    }

    fn check(&self, now: &str) -> Vec<drover::diag::Diagnostic> {
        check_changes(self.path(), "HEAD~1", t(now)).expect("gate runs")
    }
}

#[test]
fn stage_takes_1_13_2_once_test_confirmed_it_and_the_soak_passed() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.set_env("test", "1.13.2", "", "2026-11-28T10:00:00Z");
    f.confirm(STATUS, "test", "test-1", "1.13.2", "2026-12-01T04:12:00Z");
    f.set_env("stage", "1.13.2", "", "2026-12-01T09:00:00Z");

    let early = f.check("2026-12-01T10:00:00Z");
    assert_eq!(early.len(), 1, "{early:?}");
    let d = &early[0];
    assert_eq!(d.file, "environments/stage.toml");
    // `version = "1.13.2"` is on line 2, its value at column 11.
    assert_eq!((d.line, d.column), (2, 11), "{d}");
    assert!(d.message.contains("stage may not take 1.13.2 yet"), "{d}");
    assert!(d.message.contains("test-1 at 2026-12-01T04:12:00Z"), "{d}");
    assert!(
        d.message.contains("passes only at 2026-12-02T04:12:00Z"),
        "{d}"
    );

    assert_eq!(f.check("2026-12-03T00:00:00Z"), vec![]);
    let report = check_changes_report(f.path(), "HEAD~1", t("2026-12-03T00:00:00Z")).unwrap();
    assert_eq!(report.decisions.len(), 1);
    assert!(matches!(report.decisions[0].1, Decision::Allowed(_)));
}

#[test]
fn stage_may_not_take_1_13_3_until_test_confirms_it() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.set_env("test", "1.13.2", "", "2026-11-28T10:00:00Z");
    f.confirm(STATUS, "test", "test-1", "1.13.2", "2026-12-01T04:12:00Z");
    // 1.13.3 is out and test is rolling it; it has not confirmed it.
    f.commit(
        STATUS,
        &[(
            "status/test/test-1.toml",
            &report(
                "test",
                "test-1",
                "1.13.3",
                "rolling",
                "2026-12-05T02:00:00Z",
            ),
        )],
        "2026-12-05T02:00:00Z",
    );
    f.set_env("stage", "1.13.3", "", "2026-12-06T09:00:00Z");
    let diags = f.check("2026-12-07T00:00:00Z");
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert!(
        diags[0].message.contains("not confirmed by: test-1"),
        "{}",
        diags[0]
    );

    // The later report for 1.13.3 does not erase that test confirmed 1.13.2.
    f.set_env("stage", "1.13.2", "", "2026-12-06T10:00:00Z");
    let report = check_changes_report(f.path(), "HEAD~2", t("2026-12-07T00:00:00Z")).unwrap();
    assert_eq!(report.diagnostics, vec![], "{:?}", report.decisions);
}

#[test]
fn production_cannot_skip_stage() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.set_env("test", "1.13.2", "", "2026-11-28T10:00:00Z");
    f.confirm(STATUS, "test", "test-1", "1.13.2", "2026-12-01T04:12:00Z");
    f.set_env("stage", "1.13.2", "", "2026-12-03T09:00:00Z");
    // Stage is configured at 1.13.2 but stage-1 has not confirmed it.
    f.set_env("production", "1.13.2", "", "2026-12-04T09:00:00Z");
    let diags = f.check("2026-12-19T00:00:00Z");
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].file, "environments/production.toml");
    assert!(
        diags[0].message.contains("not every cluster of stage")
            && diags[0].message.contains("not confirmed by: stage-1"),
        "{}",
        diags[0]
    );

    f.confirm(STATUS, "stage", "stage-1", "1.13.2", "2026-12-08T05:30:00Z");
    assert_eq!(f.check("2026-12-19T00:00:00Z"), vec![]);
}

#[test]
fn every_cluster_of_the_lower_environment_must_confirm() {
    let f = Fixture::story("status", "\"stage-1\", \"stage-2\"");
    f.confirm(STATUS, "stage", "stage-1", "1.13.2", "2026-12-08T05:30:00Z");
    f.set_env("production", "1.13.2", "", "2026-12-10T09:00:00Z");
    let diags = f.check("2026-12-19T00:00:00Z");
    assert_eq!(diags.len(), 1, "{diags:?}");
    let msg = &diags[0].message;
    assert!(msg.contains("not confirmed by: stage-2"), "{msg}");
    assert!(
        msg.contains("confirmed by: stage-1 at 2026-12-08T05:30:00Z"),
        "{msg}"
    );

    f.confirm(STATUS, "stage", "stage-2", "1.13.2", "2026-12-09T06:00:00Z");
    assert_eq!(f.check("2026-12-19T00:00:00Z"), vec![]);
    // Soak counts from stage-2, the later of the two.
    let diags = f.check("2026-12-10T05:00:00Z");
    assert!(
        diags[0]
            .message
            .contains("passes only at 2026-12-10T06:00:00Z"),
        "{}",
        diags[0]
    );
}

#[test]
fn downgrade_refused_unless_allowed_in_the_same_change() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.set_env("test", "1.13.2", "", "2026-11-28T10:00:00Z");
    f.set_env("test", "1.12.0", "", "2026-12-02T10:00:00Z");
    let diags = f.check("2026-12-03T00:00:00Z");
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert!(
        diags[0]
            .message
            .contains("may not go down from 1.13.2 to 1.12.0"),
        "{}",
        diags[0]
    );
    assert!(
        diags[0].message.contains("allow_downgrade = true"),
        "{}",
        diags[0]
    );

    f.set_env(
        "test",
        "1.12.0",
        "allow_downgrade = true\n",
        "2026-12-02T11:00:00Z",
    );
    let report = check_changes_report(f.path(), "HEAD~2", t("2026-12-03T00:00:00Z")).unwrap();
    assert_eq!(report.diagnostics, vec![]);
    assert!(matches!(&report.decisions[0].1, Decision::Allowed(a) if a.downgrade));
}

#[test]
fn history_evidence_allows_after_the_soak_and_refuses_before() {
    let f = Fixture::story("history", "\"stage-1\"");
    f.set_env("test", "1.13.2", "", "2026-12-01T03:00:00Z");
    // An edit of test's file that keeps the version does not restart the soak.
    f.set_env("test", "1.13.2", "# reviewed\n", "2026-12-01T20:00:00Z");
    f.set_env("stage", "1.13.2", "", "2026-12-01T21:00:00Z");

    let diags = f.check("2026-12-01T22:00:00Z");
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert!(
        diags[0].message.contains("only since 2026-12-01T03:00:00Z")
            && diags[0].message.contains("passes at 2026-12-02T03:00:00Z"),
        "{}",
        diags[0]
    );
    assert_eq!(f.check("2026-12-02T03:00:00Z"), vec![]);

    // Test is not at 1.13.3: refused however long one waits.
    f.set_env("stage", "1.13.3", "", "2026-12-05T21:00:00Z");
    let diags = f.check("2027-06-01T00:00:00Z");
    assert!(
        diags[0]
            .message
            .contains("test is configured at 1.13.2, not 1.13.3"),
        "{}",
        diags[0]
    );
}

#[test]
fn status_branch_is_read_from_origin_when_there_is_no_local_branch() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.confirm(
        "refs/remotes/origin/drover/status",
        "test",
        "test-1",
        "1.13.2",
        "2026-12-01T04:12:00Z",
    );
    f.set_env("stage", "1.13.2", "", "2026-12-05T09:00:00Z");
    assert_eq!(f.check("2026-12-05T10:00:00Z"), vec![]);
    let repo = Repository::open(f.path()).unwrap();
    let found = drover::status::find_status_branch(&repo, "drover/status")
        .unwrap()
        .unwrap();
    assert_eq!(found.refname, "refs/remotes/origin/drover/status");
}

#[test]
fn missing_status_branch_means_no_confirmations() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.set_env("stage", "1.13.2", "", "2026-12-05T09:00:00Z");
    let diags = f.check("2026-12-05T10:00:00Z");
    assert_eq!(diags.len(), 1);
    assert!(
        diags[0].message.contains("not confirmed by: test-1"),
        "{}",
        diags[0]
    );
}

#[test]
fn unparsable_reports_are_skipped_and_surfaced() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.commit(
        STATUS,
        &[("status/test/test-1.toml", "state = confirmed???")],
        "2026-12-01T00:00:00Z",
    );
    f.confirm(STATUS, "test", "test-1", "1.13.2", "2026-12-01T04:12:00Z");
    f.set_env("stage", "1.13.2", "", "2026-12-05T09:00:00Z");
    let report = check_changes_report(f.path(), "HEAD~1", t("2026-12-05T10:00:00Z")).unwrap();
    assert_eq!(report.diagnostics, vec![]);
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert!(
        report.warnings[0].starts_with("status/test/test-1.toml in "),
        "{:?}",
        report.warnings
    );
}

#[test]
fn unknown_base_is_an_error() {
    let f = Fixture::story("status", "\"stage-1\"");
    let err = check_changes(f.path(), "no-such-rev", t("2026-12-05T10:00:00Z")).unwrap_err();
    assert!(matches!(err, Error::Rev { .. }), "{err}");
}

#[test]
fn edits_that_keep_the_version_are_not_judged() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.set_env(
        "stage",
        "1.12.0",
        "# comment only\n",
        "2026-12-05T09:00:00Z",
    );
    let report = check_changes_report(f.path(), "HEAD~1", t("2026-12-05T10:00:00Z")).unwrap();
    assert!(report.decisions.is_empty());
    assert!(report.diagnostics.is_empty());
}

#[test]
fn the_agent_judges_its_config_with_the_same_evidence() {
    let f = Fixture::story("status", "\"stage-1\"");
    f.set_env("test", "1.13.2", "", "2026-11-28T10:00:00Z");
    f.confirm(STATUS, "test", "test-1", "1.13.2", "2026-12-01T04:12:00Z");
    let base = f.set_env("stage", "1.12.0", "# reviewed\n", "2026-11-29T10:00:00Z");
    let head = f.set_env("stage", "1.13.2", "", "2026-12-01T09:00:00Z");
    let repo = Repository::open(f.path()).unwrap();
    let admit = |now: &str| {
        admit::admit_head(
            &repo,
            Some(base),
            head,
            "stage",
            &drover::admit::TrustCheck {
                mode: drover::trust::Mode::Off,
                signers: drover::trust::Signers::NONE,
                first_seen: &|_| t(now).timestamp(),
            },
            t(now),
        )
    };
    let early = admit("2026-12-01T05:00:00Z").unwrap_err();
    assert_eq!(early.code, "soaking", "{early}");
    assert_eq!(early.version, Some("1.13.2".parse().unwrap()));
    let late = admit("2026-12-08T05:00:00Z").unwrap();
    assert!(matches!(late.decision, Decision::Allowed(_)));
    // The same change through `drover check --base`.
    assert_eq!(f.check("2026-12-08T05:00:00Z"), vec![]);
    assert_eq!(f.check("2026-12-01T05:00:00Z").len(), 1);
}
