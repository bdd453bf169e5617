//! Split pushes through `drover check --base` (docs/design.md §4): a policy
//! edit in one commit and a version move in the next are one change that
//! does both, judged as the agent judges everything since its last applied
//! commit. Each attack has its control: with the policy edit as the base
//! (applied first, as the agent applies it alone), the same move is judged
//! by the policy it brought. Also: a refused commit with a fix on top, a
//! revoked version under build metadata, and `report_signers` required
//! with `evidence = "status"`, named at its line.

use crate::support::cli::drover;
use crate::support::git::{commit_all, commit_file_on, git, keygen, public_key};
use std::path::PathBuf;

const NOW: &str = "2026-12-20T12:00:00Z";
/// Long before NOW: past a 24h soak.
const OLD: &str = "2026-12-10T12:00:00Z";
/// Two hours before NOW: past a 1h soak, not a 24h one.
const RECENT: &str = "2026-12-20T10:00:00Z";
const CHAIN: &str = "[\"test\", \"stage\", \"production\"]";

fn env_toml(version: &str, soak: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"0 2 20 * *\"\nduration = \"6h\"\n\n[promotion]\nsoak = \"{soak}\"\n"
    )
}

fn root(chain: &str, revoked: &str, clusters: &str) -> String {
    format!(
        "[promotion]\nchain = {chain}\nevidence = \"status\"\nreport_signers = \"agents.allowed_signers\"\nrevoked = [{revoked}]\n\n[clusters]\n{clusters}"
    )
}

const CLUSTERS: &str = "test = [\"test-1\"]\nstage = [\"stage-1\"]\nproduction = [\"prod-1\"]\n";

struct Repo {
    _dir: tempfile::TempDir,
    path: PathBuf,
    keys: PathBuf,
}

impl Repo {
    /// main: test, stage, production at 1.12.0, 24h soaks, `revoked` as given.
    fn new(revoked: &str) -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("repo");
        let keys = dir.path().join("keys");
        std::fs::create_dir_all(path.join("environments")).unwrap();
        std::fs::create_dir_all(&keys).unwrap();
        for k in ["stage-1", "rogue"] {
            keygen(&keys, k);
        }
        let r = Repo {
            _dir: dir,
            path,
            keys,
        };
        git(&r.path, &["init", "-q", "-b", "main"]);
        r.write("drover.toml", &root(CHAIN, revoked, CLUSTERS));
        r.write(
            "agents.allowed_signers",
            &format!(
                "stage/stage-1 namespaces=\"git\" {}\n",
                public_key(&r.keys.join("stage-1"))
            ),
        );
        for e in ["test", "stage", "production"] {
            r.write(
                &format!("environments/{e}.toml"),
                &env_toml("1.12.0", "24h"),
            );
        }
        r.commit("initial configuration");
        git(&r.path, &["switch", "-q", "-c", "pr"]);
        r
    }

    fn write(&self, path: &str, text: &str) {
        std::fs::write(self.path.join(path), text).unwrap();
    }

    fn commit(&self, msg: &str) -> String {
        commit_all(&self.path, msg, None, Some("2026-12-20T11:00:00Z"))
    }

    /// A confirmation by stage-1 signed with `key`, dated `since`.
    fn confirm(&self, version: &str, since: &str, key: &str) {
        let report = format!(
            "env = \"stage\"\ncluster = \"stage-1\"\nconfig_commit = \"abc\"\nversion = \"{version}\"\nstate = \"confirmed\"\nsince = {since}\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"
        );
        commit_file_on(
            &self.path,
            "drover/status.d/stage/stage-1",
            "status/stage/stage-1.toml",
            Some(report.as_bytes()),
            Some(&self.keys.join(key)),
            "status",
            Some(since),
        );
    }

    fn bump_production(&self, version: &str) -> String {
        self.write("environments/production.toml", &env_toml(version, "24h"));
        self.commit(&format!("production: {version}"))
    }

    /// `drover check --base BASE --now NOW` on HEAD: (exit code, output).
    fn check(&self, base: &str) -> (i32, String) {
        let repo = self.path.to_str().unwrap();
        let (code, out, err) = drover(&["check", "--repo", repo, "--base", base, "--now", NOW]);
        (code, format!("{out}{err}"))
    }
}

fn refused(r: &Repo, base: &str, why: &[&str]) {
    let (code, out) = r.check(base);
    assert_eq!(code, 1, "expected a refusal over {base}: {out}");
    for w in why {
        assert!(out.contains(w), "expected {w:?} in: {out}");
    }
}

fn passes(r: &Repo, base: &str) {
    let (code, out) = r.check(base);
    assert_eq!(code, 0, "expected a pass over {base}: {out}");
}

#[test]
fn chain_reorder_then_bump_is_one_change() {
    let r = Repo::new("");
    r.write(
        "drover.toml",
        &root("[\"production\", \"test\", \"stage\"]", "", CLUSTERS),
    );
    let edit = r.commit("production first");
    r.bump_production("9.9.9");
    refused(
        &r,
        "main",
        &["may not take 9.9.9 in a change that also edits the promotion policy (chain)"],
    );
    // Control: with the reorder applied, production is first: no gate.
    passes(&r, &edit);
}

#[test]
fn delete_then_re_add_is_one_change() {
    let r = Repo::new("");
    r.write(
        "drover.toml",
        &root(
            "[\"test\", \"stage\"]",
            "",
            "test = [\"test-1\"]\nstage = [\"stage-1\"]\n",
        ),
    );
    git(&r.path, &["rm", "-q", "environments/production.toml"]);
    let deleted = r.commit("production deleted");
    r.write(
        "drover.toml",
        &root("[\"production\", \"test\", \"stage\"]", "", CLUSTERS),
    );
    r.bump_production("9.9.9");
    refused(&r, "main", &["also edits the promotion policy (chain)"]);
    // Control: over the deletion, production is an environment the policy
    // in force does not have: placed first it has no gate...
    passes(&r, &deleted);
    // ...and placed after stage it is judged by the policy in force, which
    // asks stage's confirmation of 9.9.9.
    r.write("drover.toml", &root(CHAIN, "", CLUSTERS));
    r.commit("production after stage");
    refused(
        &r,
        &deleted,
        &["production may not take 9.9.9: not every cluster of stage has confirmed it"],
    );
}

#[test]
fn un_revoke_then_bump_is_one_change() {
    let r = Repo::new("{ version = \"1.13.3\", reason = \"kernel panic\" }");
    r.confirm("1.13.3", OLD, "stage-1");
    r.write("drover.toml", &root(CHAIN, "", CLUSTERS));
    let edit = r.commit("1.13.3 is fine after all");
    r.bump_production("1.13.3");
    refused(&r, "main", &["also edits the promotion policy (revoked)"]);
    passes(&r, &edit);
}

#[test]
fn new_report_key_then_bump_is_one_change() {
    let r = Repo::new("");
    r.confirm("1.13.0", OLD, "rogue");
    let signers = std::fs::read_to_string(r.path.join("agents.allowed_signers")).unwrap();
    r.write(
        "agents.allowed_signers",
        &format!(
            "{signers}stage/stage-1 namespaces=\"git\" {}\n",
            public_key(&r.keys.join("rogue"))
        ),
    );
    let edit = r.commit("a second key for stage-1");
    r.bump_production("1.13.0");
    refused(
        &r,
        "main",
        &["also edits the promotion policy (the keys in agents.allowed_signers)"],
    );
    passes(&r, &edit);
}

#[test]
fn soak_cut_then_bump_is_one_change() {
    let r = Repo::new("");
    r.confirm("1.13.0", RECENT, "stage-1");
    r.write("environments/production.toml", &env_toml("1.12.0", "1h"));
    let edit = r.commit("production soaks 1h");
    r.write("environments/production.toml", &env_toml("1.13.0", "1h"));
    r.commit("production: 1.13.0");
    refused(
        &r,
        "main",
        &["also edits the promotion policy (soak of production)"],
    );
    passes(&r, &edit);
    // And the bump alone under the 24h soak is still soaking.
    let r = Repo::new("");
    r.confirm("1.13.0", RECENT, "stage-1");
    r.bump_production("1.13.0");
    refused(&r, "main", &["soak of 24h"]);
}

/// The agent judges where the branch is: a refused commit followed by a
/// commit that takes the move back is judged as the two together.
#[test]
fn a_fix_on_top_of_a_refused_commit_is_judged_with_it() {
    let r = Repo::new("");
    r.write(
        "drover.toml",
        &root("[\"production\", \"test\", \"stage\"]", "", CLUSTERS),
    );
    r.write("environments/production.toml", &env_toml("9.9.9", "24h"));
    r.commit("production first, at 9.9.9");
    refused(&r, "main", &["(chain)"]);
    r.write("environments/production.toml", &env_toml("1.12.0", "24h"));
    r.commit("revert the bump");
    passes(&r, "main");
}

#[test]
fn a_revoked_version_is_revoked_under_any_build_metadata() {
    let r = Repo::new("{ version = \"1.13.3\", reason = \"kernel panic\" }");
    r.confirm("1.13.3+rebuild", OLD, "stage-1");
    r.bump_production("1.13.3+rebuild");
    refused(
        &r,
        "main",
        &[
            "production may not take 1.13.3+rebuild: it is revoked",
            "kernel panic",
        ],
    );
    // Control: the next patch release, confirmed, passes.
    let r = Repo::new("{ version = \"1.13.3\", reason = \"kernel panic\" }");
    r.confirm("1.13.4", OLD, "stage-1");
    r.bump_production("1.13.4");
    passes(&r, "main");
}

/// `evidence = "status"` without `report_signers` (or naming a missing
/// file) is an error at the key's line, in `check` and in `check --base`.
#[test]
fn status_evidence_needs_a_readable_report_signers_at_its_line() {
    let r = Repo::new("");
    let repo = r.path.to_str().unwrap();
    // The key missing: named at `evidence`, the third line.
    r.write(
        "drover.toml",
        &root(CHAIN, "", CLUSTERS).replace("report_signers = \"agents.allowed_signers\"\n", ""),
    );
    let (code, out, err) = drover(&["check", "--repo", repo]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("drover.toml:3:12: error: evidence = \"status\" needs `report_signers`"),
        "{out}"
    );
    // The file missing: named at the `report_signers` value, line 4.
    r.write("drover.toml", &root(CHAIN, "", CLUSTERS));
    std::fs::remove_file(r.path.join("agents.allowed_signers")).unwrap();
    let (code, out, err) = drover(&["check", "--repo", repo]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("drover.toml:4:18: error: report_signers names agents.allowed_signers, which does not exist"),
        "{out}"
    );
    // check --base reads HEAD's tree: the file present in the work tree but
    // never committed is named at its line there too, not at line 0.
    r.write("agents.allowed_signers", "");
    git(&r.path, &["rm", "-q", "--cached", "agents.allowed_signers"]);
    std::fs::write(r.path.join(".git/info/exclude"), "agents.allowed_signers\n").unwrap();
    r.bump_production("1.13.0");
    let (code, out) = r.check("main");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("drover.toml:4:18: error: report_signers names agents.allowed_signers"),
        "{out}"
    );
    // Control: a readable, valid file passes.
    let r = Repo::new("");
    let (code, out, err) = drover(&["check", "--repo", r.path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
}
