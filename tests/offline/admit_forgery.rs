//! The forgery table (docs/design.md §4–§6): each forgery of evidence or of
//! the policy that judges a change is refused by `drover check --base`,
//! and each control, the legitimate twin of a forgery, passes — so a check
//! that refused everything could not look green.
//!
//! Reports are written to the status branch as agents write them: one
//! commit per report, signed with git's SSH signature (namespace `git`) by
//! `ssh-keygen` keys made for the test.

use crate::support::cli::drover;
use crate::support::git::{commit_all, commit_file_on, git, keygen, public_key};
use std::path::PathBuf;

const NOW: &str = "2026-12-20T12:00:00Z";
/// Long enough before NOW for a 24h soak.
const OLD: &str = "2026-12-10T12:00:00Z";
/// Younger than the soak at NOW.
const RECENT: &str = "2026-12-20T10:00:00Z";

fn env_toml(version: &str, extra: &str) -> String {
    format!(
        "version = \"{version}\"\n{extra}\n[window]\nschedule = \"0 2 8 * *\"\nduration = \"6h\"\n\n[promotion]\nsoak = \"24h\"\n"
    )
}

fn report(env: &str, cluster: &str, version: &str, state: &str, since: &str) -> String {
    format!(
        "env = \"{env}\"\ncluster = \"{cluster}\"\nconfig_commit = \"abc\"\nversion = \"{version}\"\nstate = \"{state}\"\nsince = {since}\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"
    )
}

struct Fixture {
    _dir: tempfile::TempDir,
    repo: PathBuf,
    keys: PathBuf,
}

impl Fixture {
    /// main: test, stage, production at 1.12.0, report signers for test-1 and stage-1.
    fn new(evidence: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let keys = dir.path().join("keys");
        std::fs::create_dir_all(repo.join("environments")).unwrap();
        std::fs::create_dir_all(&keys).unwrap();
        for k in ["test-1", "stage-1", "rogue"] {
            keygen(&keys, k);
        }
        let f = Fixture {
            _dir: dir,
            repo,
            keys,
        };
        git(&f.repo, &["init", "-q", "-b", "main"]);
        f.write(
            "drover.toml",
            &Self::root(evidence, "[\"test\", \"stage\", \"production\"]", ""),
        );
        f.write(
            "agents.allowed_signers",
            &format!(
                "test/test-1 namespaces=\"git\" {}\nstage/stage-1 namespaces=\"git\" {}\n",
                public_key(&f.key("test-1")),
                public_key(&f.key("stage-1"))
            ),
        );
        for e in ["test", "stage", "production"] {
            f.write(&format!("environments/{e}.toml"), &env_toml("1.12.0", ""));
        }
        f.commit_all("initial configuration", "2026-11-01T00:00:00Z");
        f
    }

    fn root(evidence: &str, chain: &str, extra: &str) -> String {
        format!(
            "[promotion]\nchain = {chain}\nevidence = \"{evidence}\"\nstatus_branch = \"drover/status\"\nreport_signers = \"agents.allowed_signers\"\n{extra}\n[clusters]\ntest = [\"test-1\"]\nstage = [\"stage-1\"]\nproduction = [\"prod-1\"]\n"
        )
    }

    fn key(&self, name: &str) -> PathBuf {
        self.keys.join(name)
    }

    fn write(&self, path: &str, text: &str) {
        let dest = self.repo.join(path);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, text).unwrap();
    }

    fn commit_all(&self, msg: &str, date: &str) {
        commit_all(&self.repo, msg, None, Some(date));
    }

    /// Open a pull request branch off main.
    fn branch(&self, name: &str) {
        git(&self.repo, &["switch", "-q", "-c", name, "main"]);
    }

    /// One status commit writing `path` (or deleting it with `None`) on
    /// drover/status, signed by `key` (unsigned with `None`), dated `date`.
    fn status_commit(&self, path: &str, content: Option<&str>, key: Option<&str>, date: &str) {
        let key = key.map(|k| self.key(k));
        commit_file_on(
            &self.repo,
            "drover/status",
            path,
            content.map(str::as_bytes),
            key.as_deref(),
            &format!("status: {path}"),
            Some(date),
        );
    }

    /// A report by `cluster` of `env`, signed with `key`.
    fn report(
        &self,
        env: &str,
        cluster: &str,
        version: &str,
        state: &str,
        since: &str,
        key: Option<&str>,
    ) {
        self.status_commit(
            &format!("status/{env}/{cluster}.toml"),
            Some(&report(env, cluster, version, state, since)),
            key,
            since,
        );
    }

    /// `drover check --base main --now NOW`: (exit code, stdout + stderr).
    fn check(&self) -> (i32, String) {
        let repo = self.repo.to_str().unwrap();
        let (code, out, err) = drover(&["check", "--repo", repo, "--base", "main", "--now", NOW]);
        (code, format!("{out}{err}"))
    }

    /// stage-1's report, signed by stage-1's own key: the genuine evidence.
    fn stage_1_signs(&self, version: &str, state: &str, since: &str) {
        self.report("stage", "stage-1", version, state, since, Some("stage-1"));
    }

    fn bump(&self, env: &str, version: &str, extra: &str, date: &str) {
        self.write(
            &format!("environments/{env}.toml"),
            &env_toml(version, extra),
        );
        self.commit_all(&format!("Bump {env} to {version}"), date);
    }
}

fn refused(f: &Fixture, why: &[&str]) {
    let (code, out) = f.check();
    assert_eq!(code, 1, "expected a refusal: {out}");
    for w in why {
        assert!(out.contains(w), "expected {w:?} in: {out}");
    }
}

fn passes(f: &Fixture) {
    let (code, out) = f.check();
    assert_eq!(code, 0, "expected the change to pass: {out}");
}

/// Production bumped to 1.13.0 on a pull request branch.
fn production_pr(f: &Fixture) {
    f.branch("pr");
    f.bump("production", "1.13.0", "", "2026-12-20T11:00:00Z");
}

#[test]
fn unsigned_report_is_refused() {
    let f = Fixture::new("status");
    f.report("stage", "stage-1", "1.13.0", "confirmed", OLD, None);
    production_pr(&f);
    // Held: the branch holding stage-1's reports does not count.
    refused(
        &f,
        &[
            "stage's evidence is held",
            "unsigned",
            "note: ignored status report status/stage/stage-1.toml",
        ],
    );
}

#[test]
fn report_signed_by_another_clusters_key_is_refused() {
    let f = Fixture::new("status");
    f.report(
        "stage",
        "stage-1",
        "1.13.0",
        "confirmed",
        OLD,
        Some("test-1"),
    );
    production_pr(&f);
    refused(
        &f,
        &[
            "stage-1",
            "signed by test/test-1's key, which is not listed for stage/stage-1",
        ],
    );
}

#[test]
fn report_signed_by_a_key_not_in_report_signers_is_refused() {
    let f = Fixture::new("status");
    f.report(
        "stage",
        "stage-1",
        "1.13.0",
        "confirmed",
        OLD,
        Some("rogue"),
    );
    production_pr(&f);
    refused(&f, &["stage-1", "which is not listed for stage/stage-1"]);
}

#[test]
fn key_added_in_the_change_being_judged_does_not_count() {
    let f = Fixture::new("status");
    f.report(
        "stage",
        "stage-1",
        "1.13.0",
        "confirmed",
        OLD,
        Some("rogue"),
    );
    f.branch("pr");
    let mut signers = std::fs::read_to_string(f.repo.join("agents.allowed_signers")).unwrap();
    signers.push_str(&format!(
        "stage/stage-1 namespaces=\"git\" {}\n",
        public_key(&f.key("rogue"))
    ));
    f.write("agents.allowed_signers", &signers);
    f.bump("production", "1.13.0", "", "2026-12-20T11:00:00Z");
    refused(
        &f,
        &["also edits the promotion policy (the keys in agents.allowed_signers)"],
    );
}

#[test]
fn confirmation_withdrawn_by_a_later_failed_report_is_refused() {
    let f = Fixture::new("status");
    f.stage_1_signs("1.13.0", "confirmed", OLD);
    f.stage_1_signs("1.13.0", "failed", "2026-12-11T12:00:00Z");
    production_pr(&f);
    refused(
        &f,
        &["stage-1 (its confirmation was withdrawn by a later `failed` report"],
    );
}

#[test]
fn confirmation_younger_than_the_soak_is_refused() {
    let f = Fixture::new("status");
    f.stage_1_signs("1.13.0", "confirmed", RECENT);
    production_pr(&f);
    refused(&f, &["production may not take 1.13.0 yet", "soak of 24h"]);
}

#[test]
fn backdated_since_in_a_late_commit_counts_from_the_commit() {
    let f = Fixture::new("status");
    // The file claims an old `since`, but the signed commit is recent.
    f.status_commit(
        "status/stage/stage-1.toml",
        Some(&report("stage", "stage-1", "1.13.0", "confirmed", OLD)),
        Some("stage-1"),
        RECENT,
    );
    production_pr(&f);
    refused(&f, &["production may not take 1.13.0 yet", "soak of 24h"]);
}

#[test]
fn chain_reordered_with_a_bump_is_refused() {
    let f = Fixture::new("status");
    f.branch("pr");
    f.write(
        "drover.toml",
        &Fixture::root("status", "[\"production\", \"test\", \"stage\"]", ""),
    );
    f.bump("production", "1.13.0", "", "2026-12-20T11:00:00Z");
    refused(&f, &["also edits the promotion policy (chain)"]);
}

#[test]
fn status_branch_pointed_at_the_change_is_refused() {
    let f = Fixture::new("status");
    f.branch("pr");
    let root = Fixture::root("status", "[\"test\", \"stage\", \"production\"]", "")
        .replace("drover/status", "pr");
    f.write("drover.toml", &root);
    f.write(
        "status/stage/stage-1.toml",
        &report("stage", "stage-1", "1.13.0", "confirmed", OLD),
    );
    f.bump("production", "1.13.0", "", "2026-12-20T11:00:00Z");
    refused(&f, &["also edits the promotion policy (status_branch)"]);
}

#[test]
fn backdated_history_inside_the_change_is_refused() {
    let f = Fixture::new("history");
    f.branch("pr");
    // Backdated commits inside the change: test and stage "long ago", then production.
    f.bump("test", "1.13.0", "", "2026-11-02T00:00:00Z");
    f.bump("stage", "1.13.0", "", "2026-11-03T00:00:00Z");
    f.bump("production", "1.13.0", "", "2026-12-20T11:00:00Z");
    refused(
        &f,
        &["production may not take 1.13.0: stage is configured at 1.12.0"],
    );
}

#[test]
fn stale_allow_downgrade_is_refused() {
    let f = Fixture::new("status");
    f.bump(
        "production",
        "1.12.0",
        "allow_downgrade = true",
        "2026-11-02T00:00:00Z",
    );
    f.stage_1_signs("1.0.0", "confirmed", OLD);
    f.branch("pr");
    f.bump(
        "production",
        "1.0.0",
        "allow_downgrade = true",
        "2026-12-20T11:00:00Z",
    );
    refused(&f, &["production may not go down from 1.12.0 to 1.0.0"]);
}

#[test]
fn oversized_report_is_ignored_and_named() {
    let f = Fixture::new("status");
    let mut big = report("stage", "stage-1", "1.13.0", "confirmed", OLD);
    big.push_str(&format!("# {}\n", "x".repeat(70 * 1024)));
    f.status_commit(
        "status/stage/stage-1.toml",
        Some(&big),
        Some("stage-1"),
        OLD,
    );
    production_pr(&f);
    refused(&f, &["larger than the 64 KiB a report may have"]);
}

#[test]
fn report_deleted_from_the_tip_no_longer_counts() {
    let f = Fixture::new("status");
    f.stage_1_signs("1.13.0", "confirmed", OLD);
    f.status_commit(
        "status/stage/stage-1.toml",
        None,
        Some("stage-1"),
        "2026-12-11T00:00:00Z",
    );
    production_pr(&f);
    refused(&f, &["deleted at the branch tip"]);
}

#[test]
fn evidence_status_without_report_signers_trusts_no_report() {
    let f = Fixture::new("status");
    f.stage_1_signs("1.13.0", "confirmed", OLD);
    f.write(
        "drover.toml",
        &Fixture::root("status", "[\"test\", \"stage\", \"production\"]", "")
            .replace("report_signers = \"agents.allowed_signers\"\n", ""),
    );
    f.commit_all("drop report_signers", "2026-11-02T00:00:00Z");
    production_pr(&f);
    refused(&f, &["needs `report_signers`"]);
}

// Controls: each is the legitimate twin of a forgery above, and must pass.

#[test]
fn control_properly_signed_confirmation_passes() {
    let f = Fixture::new("status");
    f.report("test", "test-1", "1.13.0", "confirmed", OLD, Some("test-1"));
    f.stage_1_signs("1.13.0", "confirmed", OLD);
    production_pr(&f);
    passes(&f);
}

#[test]
fn control_reconfirmation_after_failure_counts_from_the_new_confirmation() {
    let f = Fixture::new("status");
    f.stage_1_signs("1.13.0", "confirmed", "2026-12-05T00:00:00Z");
    f.stage_1_signs("1.13.0", "failed", "2026-12-06T00:00:00Z");
    f.stage_1_signs("1.13.0", "confirmed", OLD);
    production_pr(&f);
    passes(&f);
}

#[test]
fn control_policy_change_alone_passes() {
    let f = Fixture::new("status");
    f.branch("pr");
    f.write(
        "drover.toml",
        &Fixture::root("status", "[\"test\", \"stage\", \"production\"]", "")
            .replace("drover/status", "fleet/status"),
    );
    let mut signers = std::fs::read_to_string(f.repo.join("agents.allowed_signers")).unwrap();
    signers.push_str(&format!(
        "production/prod-1 namespaces=\"git\" {}\n",
        public_key(&f.key("rogue"))
    ));
    f.write("agents.allowed_signers", &signers);
    f.commit_all(
        "Report to fleet/status; add prod-1's key",
        "2026-12-20T11:00:00Z",
    );
    passes(&f);
}

#[test]
fn control_downgrade_setting_the_flag_in_its_change_passes() {
    let f = Fixture::new("status");
    f.stage_1_signs("1.0.0", "confirmed", OLD);
    f.branch("pr");
    f.bump(
        "production",
        "1.0.0",
        "allow_downgrade = true",
        "2026-12-20T11:00:00Z",
    );
    passes(&f);
}

#[test]
fn control_history_already_on_the_base_passes() {
    let f = Fixture::new("history");
    f.bump("test", "1.13.0", "", "2026-12-01T00:00:00Z");
    f.bump("stage", "1.13.0", "", "2026-12-02T00:00:00Z");
    production_pr(&f);
    passes(&f);
}

#[test]
fn control_backdated_commit_on_the_base_counts_from_its_parent() {
    let f = Fixture::new("history");
    f.bump("test", "1.13.0", "", "2026-12-01T00:00:00Z");
    f.bump("production", "1.12.0", "# touched", "2026-12-20T09:00:00Z");
    // On the base, but dated before its parent: counts from its parent's time.
    f.bump("stage", "1.13.0", "", "2026-12-02T00:00:00Z");
    production_pr(&f);
    refused(
        &f,
        &["stage has been configured at 1.13.0 only since 2026-12-20T09:00:00Z"],
    );
}

#[test]
fn revoked_version_is_refused_even_in_the_first_environment() {
    let f = Fixture::new("status");
    f.write(
        "drover.toml",
        &Fixture::root(
            "status",
            "[\"test\", \"stage\", \"production\"]",
            "revoked = [{ version = \"1.13.0\", reason = \"kernel panic on m7i\" }]",
        ),
    );
    f.commit_all("Revoke 1.13.0", "2026-11-02T00:00:00Z");
    f.branch("pr");
    f.bump("test", "1.13.0", "", "2026-12-20T11:00:00Z");
    refused(
        &f,
        &[
            "test may not take 1.13.0: it is revoked",
            "kernel panic on m7i",
        ],
    );
}

#[test]
fn control_revoking_alone_passes_and_a_bad_entry_is_named() {
    let f = Fixture::new("status");
    f.branch("pr");
    f.write(
        "drover.toml",
        &Fixture::root(
            "status",
            "[\"test\", \"stage\", \"production\"]",
            "revoked = [{ version = \"1.13.0\", reason = \"kernel panic on m7i\" }]",
        ),
    );
    f.commit_all("Revoke 1.13.0", "2026-12-20T11:00:00Z");
    passes(&f);

    f.write(
        "drover.toml",
        &Fixture::root(
            "status",
            "[\"test\", \"stage\", \"production\"]",
            "revoked = [{ version = \"1.13\", why = \"x\" }]",
        ),
    );
    f.commit_all("A bad entry", "2026-12-20T11:30:00Z");
    refused(
        &f,
        &[
            "drover.toml:",
            "unknown key `why` in a `revoked` entry",
            "revoked version \"1.13\" is not valid",
        ],
    );
}
