//! Status branches that cannot be bent (docs/design.md §5, "a status branch
//! counts only as a whole"), through the binary: each attack is refused by
//! `drover check --base`, named by `drover check` and `drover status` with
//! the commit and why, and each has a control that passes.
//!
//! - a merge commit hiding a `failed` report;
//! - a cluster branch created at an old commit of the single branch of the
//!   older layout, hiding that branch's later `failed`;
//! - a retired report key signing a backdated report;
//! - a branch whose tree holds 400,000 files.
//!
//! Reports are written as agents write them: one commit per report, signed
//! with git's SSH signature by `ssh-keygen` keys made for the test.

use crate::support::cli::drover;
use crate::support::git::{commit_all, commit_file_on, git, git_env, keygen, public_key};
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const NOW: &str = "2026-12-20T12:00:00Z";
/// Long enough before NOW for a 24h soak.
const OLD: &str = "2026-12-10T12:00:00Z";
const LATER: &str = "2026-12-11T12:00:00Z";
const SINGLE: &str = "drover/status";
const STAGE_1: &str = "drover/status.d/stage/stage-1";

fn report(cluster: &str, version: &str, state: &str, since: &str) -> String {
    format!(
        "env = \"stage\"\ncluster = \"{cluster}\"\nconfig_commit = \"abc\"\nversion = \"{version}\"\nstate = \"{state}\"\nsince = {since}\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"
    )
}

pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub(crate) repo: PathBuf,
    keys: PathBuf,
}

impl Fixture {
    /// main: test, stage, production at 1.12.0; stage-1's report key listed
    /// by `signers` (the allowed-signers lines for stage/stage-1, given the
    /// fixture's key directory).
    fn new(signers: impl Fn(&Fixture) -> String) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let keys = dir.path().join("keys");
        std::fs::create_dir_all(repo.join("environments")).unwrap();
        std::fs::create_dir_all(&keys).unwrap();
        for k in ["stage-1", "stage-1-old", "rogue"] {
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
            "[promotion]\nchain = [\"test\", \"stage\", \"production\"]\nevidence = \"status\"\nstatus_branch = \"drover/status\"\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\ntest = [\"test-1\"]\nstage = [\"stage-1\"]\nproduction = [\"prod-1\"]\n",
        );
        f.write("agents.allowed_signers", &signers(&f));
        for e in ["test", "stage", "production"] {
            f.write(&format!("environments/{e}.toml"), &env_toml("1.12.0"));
        }
        commit_all(
            &f.repo,
            "initial configuration",
            None,
            Some("2026-11-01T00:00:00Z"),
        );
        f
    }

    /// The usual report signers: stage-1's one key.
    pub(crate) fn plain() -> Fixture {
        Fixture::new(|f| line("stage/stage-1", "", &f.key("stage-1")))
    }

    fn key(&self, name: &str) -> PathBuf {
        self.keys.join(name)
    }

    fn write(&self, path: &str, text: &str) {
        let dest = self.repo.join(path);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, text).unwrap();
    }

    /// A report of stage's `cluster` on `branch`, signed with `key`, committed at `date`.
    fn report(
        &self,
        branch: &str,
        cluster: &str,
        version: &str,
        state: &str,
        (since, date): (&str, &str),
        key: Option<&str>,
    ) -> String {
        let key = key.map(|k| self.key(k));
        commit_file_on(
            &self.repo,
            branch,
            &format!("status/stage/{cluster}.toml"),
            Some(report(cluster, version, state, since).as_bytes()),
            key.as_deref(),
            &format!("status: {cluster} {state} {version}"),
            Some(date),
        )
    }

    /// stage-1's signed confirmation of 1.13.0 on its own branch, soaked by NOW.
    pub(crate) fn stage_1_confirmed(&self) -> String {
        self.report(
            STAGE_1,
            "stage-1",
            "1.13.0",
            "confirmed",
            (OLD, OLD),
            Some("stage-1"),
        )
    }

    fn set(&self, branch: &str, commit: &str) {
        git(
            &self.repo,
            &["update-ref", &format!("refs/heads/{branch}"), commit],
        );
    }

    /// production to 1.13.0 on a pull request branch.
    pub(crate) fn production_pr(&self) {
        git(&self.repo, &["switch", "-q", "-c", "pr", "main"]);
        self.write("environments/production.toml", &env_toml("1.13.0"));
        commit_all(
            &self.repo,
            "production 1.13.0",
            None,
            Some("2026-12-20T11:00:00Z"),
        );
    }

    /// `drover check --base main --now NOW`: (exit code, stdout + stderr).
    pub(crate) fn check(&self) -> (i32, String) {
        let repo = self.repo.to_str().unwrap();
        let (code, out, err) = drover(&["check", "--repo", repo, "--base", "main", "--now", NOW]);
        (code, format!("{out}{err}"))
    }

    /// `drover status --format json --now NOW`.
    fn status(&self) -> Value {
        let repo = self.repo.to_str().unwrap();
        let (code, out, err) =
            drover(&["--repo", repo, "--format", "json", "status", "--now", NOW]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }
}

fn env_toml(version: &str) -> String {
    format!(
        "version = \"{version}\"\n\n[window]\nschedule = \"0 2 8 * *\"\nduration = \"6h\"\n\n[promotion]\nsoak = \"24h\"\n"
    )
}

/// An allowed-signers line for `principal` with `options`.
fn line(principal: &str, options: &str, key: &std::path::Path) -> String {
    format!(
        "{principal} namespaces=\"git\"{options} {}\n",
        public_key(key)
    )
}

fn refused(f: &Fixture, why: &[&str]) -> String {
    let (code, out) = f.check();
    assert_eq!(code, 1, "expected a refusal: {out}");
    for w in why {
        assert!(out.contains(w), "expected {w:?} in: {out}");
    }
    out
}

pub(crate) fn passes(f: &Fixture) -> String {
    let (code, out) = f.check();
    assert_eq!(code, 0, "expected the change to pass: {out}");
    out
}

/// stage-1 as `drover status` shows it: (trust, why untrusted).
fn stage_1(v: &Value) -> (String, String) {
    let stage = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "stage")
        .unwrap();
    let c = &stage["clusters"][0];
    (
        c["trust"].as_str().unwrap().to_owned(),
        c["untrusted_reason"].as_str().unwrap_or("").to_owned(),
    )
}

fn warns(v: &Value, what: &[&str]) {
    let w = v["warnings"].as_array().unwrap();
    assert!(
        w.iter()
            .any(|w| what.iter().all(|x| w.as_str().unwrap().contains(x))),
        "no warning with {what:?} in {w:#?}"
    );
}

#[test]
fn a_merge_commit_hiding_a_failed_report_is_refused_and_named() {
    let f = Fixture::plain();
    let confirmed = f.stage_1_confirmed();
    let failed = f.report(
        STAGE_1,
        "stage-1",
        "1.13.0",
        "failed",
        (LATER, LATER),
        Some("stage-1"),
    );
    // Anyone who can push to the branch: an unsigned merge whose tree and
    // first parent are the `confirmed` commit and whose second parent is the
    // `failed` tip, a fast-forward that denyNonFastForwards allows.
    let tree = git(&f.repo, &["rev-parse", &format!("{confirmed}^{{tree}}")]);
    let merge = git_env(
        &f.repo,
        &[
            "commit-tree",
            &tree,
            "-p",
            &confirmed,
            "-p",
            &failed,
            "-m",
            "Merge",
        ],
        Some(LATER),
        &[],
    );
    f.set(STAGE_1, &merge);
    let base = git(&f.repo, &["merge-base", "--is-ancestor", &failed, &merge]);
    assert_eq!(base, "", "a fast-forward from the failed tip");
    f.production_pr();
    let short = &merge[..10];
    // Held: a branch that does not count may hide a `failed`.
    refused(
        &f,
        &[
            "stage's evidence is held",
            "note: ignored status report status/stage/stage-1.toml",
            &format!("commit {short} is a merge commit"),
        ],
    );
    let v = f.status();
    let (trust, why) = stage_1(&v);
    assert_eq!(trust, "untrusted");
    assert!(
        why.contains(&format!("commit {short} is a merge commit")),
        "{why}"
    );
    warns(
        &v,
        &["drover/status.d/stage/stage-1", short, "merge commit"],
    );

    // Controls: without the merge the `failed` withdraws the confirmation
    // (the merge did not resurrect it)...
    f.set(STAGE_1, &failed);
    refused(&f, &["withdrawn by a later `failed` report"]);
    // ...and before the failure, the same confirmation counts.
    f.set(STAGE_1, &confirmed);
    passes(&f);
    assert_eq!(stage_1(&f.status()).0, "trusted");
}

#[test]
fn a_cluster_branch_made_at_an_old_commit_of_the_single_branch_does_not_hide_its_failed() {
    let f = Fixture::plain();
    // The older layout: stage-1 confirmed, then failed, on the single branch.
    let confirmed = f.report(
        SINGLE,
        "stage-1",
        "1.13.0",
        "confirmed",
        (OLD, OLD),
        Some("stage-1"),
    );
    f.report(
        SINGLE,
        "stage-1",
        "1.13.0",
        "failed",
        (LATER, LATER),
        Some("stage-1"),
    );
    // stage-1's own branch created at the old `confirmed` commit: its every
    // commit is signed by stage-1 and its tree holds only stage-1's file.
    f.set(STAGE_1, &confirmed);
    f.production_pr();
    refused(
        &f,
        &[
            "not confirmed by: stage-1",
            "withdrawn by a later `failed` report at 2026-12-11T12:00:00Z",
        ],
    );

    // Control: a confirmation after the failure, on stage-1's own branch, counts.
    f.report(
        STAGE_1,
        "stage-1",
        "1.13.0",
        "confirmed",
        ("2026-12-12T12:00:00Z", "2026-12-12T12:00:00Z"),
        Some("stage-1"),
    );
    passes(&f);

    // Control: a cluster branch made at a commit of the single branch is
    // fine in itself, when nothing later withdraws it.
    let g = Fixture::plain();
    let confirmed = g.report(
        SINGLE,
        "stage-1",
        "1.13.0",
        "confirmed",
        (OLD, OLD),
        Some("stage-1"),
    );
    g.set(STAGE_1, &confirmed);
    g.production_pr();
    passes(&g);
}

#[test]
fn a_retired_report_key_cannot_add_a_backdated_report() {
    // stage-1's old key was retired 30 days before NOW; its new key signs since.
    let signers = |f: &Fixture| {
        line(
            "stage/stage-1",
            ",valid-before=\"20261120000000Z\"",
            &f.key("stage-1-old"),
        ) + &line("stage/stage-1", "", &f.key("stage-1"))
    };
    let f = Fixture::new(signers);
    let old = "2026-11-05T00:00:00Z";
    let rotated = "2026-11-25T00:00:00Z";
    let backdated = "2026-11-10T00:00:00Z";
    f.report(
        STAGE_1,
        "stage-1",
        "1.12.0",
        "confirmed",
        (old, old),
        Some("stage-1-old"),
    );
    f.report(
        STAGE_1,
        "stage-1",
        "1.13.0",
        "rolling",
        (rotated, rotated),
        Some("stage-1"),
    );
    // The old key signs a confirmation today, dated (and `since`) inside its validity.
    let forged = f.report(
        STAGE_1,
        "stage-1",
        "1.13.0",
        "confirmed",
        (backdated, backdated),
        Some("stage-1-old"),
    );
    f.production_pr();
    // It is the branch's newest commit, by a key retired since (and its
    // time goes backwards against the new key's report under it).
    refused(
        &f,
        &[
            "stage's evidence is held",
            &format!("commit {} is the branch's newest commit", &forged[..10]),
        ],
    );
    // Dated honestly, today, it is past the key's valid-before.
    f.set(
        STAGE_1,
        &git(&f.repo, &["rev-parse", &format!("{forged}^")]),
    );
    let today = f.report(
        STAGE_1,
        "stage-1",
        "1.13.0",
        "confirmed",
        ("2026-12-20T10:00:00Z", "2026-12-20T10:00:00Z"),
        Some("stage-1-old"),
    );
    refused(&f, &[&format!("commit {}", &today[..10]), "expired key"]);

    // Control: the same key, with an honest date inside its validity and
    // the new key's reports after it: its confirmation still counts.
    let g = Fixture::new(signers);
    g.report(
        STAGE_1,
        "stage-1",
        "1.13.0",
        "confirmed",
        (backdated, backdated),
        Some("stage-1-old"),
    );
    g.report(
        STAGE_1,
        "stage-1",
        "1.14.0",
        "rolling",
        (rotated, rotated),
        Some("stage-1"),
    );
    g.production_pr();
    passes(&g);
    assert_eq!(stage_1(&g.status()).0, "trusted");
}

/// The agent refuses a retired key's backdated report it first fetched
/// after the key's `valid-before`; `drover check` in a fresh clone has no
/// such record, and a newly created branch has no newer report for the
/// backdated one to go backwards against. The newest commit of a branch
/// must be signed by a key valid now, for every reader.
#[test]
fn a_retired_report_key_cannot_create_a_branch_with_a_backdated_report() {
    let signers = |f: &Fixture| {
        line(
            "stage/stage-1",
            ",valid-before=\"20261120000000Z\"",
            &f.key("stage-1-old"),
        ) + &line("stage/stage-1", "", &f.key("stage-1"))
    };
    let f = Fixture::new(signers);
    // stage-1 has no branch yet; the retired key creates one, its only
    // report dated inside the key's validity.
    let backdated = "2026-11-10T00:00:00Z";
    let forged = f.report(
        STAGE_1,
        "stage-1",
        "1.13.0",
        "confirmed",
        (backdated, backdated),
        Some("stage-1-old"),
    );
    f.production_pr();
    let out = refused(
        &f,
        &[
            "stage's evidence is held",
            &format!("commit {} is the branch's newest commit", &forged[..10]),
            "no longer valid",
        ],
    );
    assert!(out.contains("valid-before"), "{out}");
    let (trust, why) = stage_1(&f.status());
    assert_eq!(trust, "untrusted", "{why}");
    assert!(why.contains("newest commit"), "{why}");

    // Control: the cluster's next report, signed by its current key, on
    // top of an honest one the old key signed while valid: the old
    // confirmation counts again.
    let g = Fixture::new(signers);
    g.report(
        STAGE_1,
        "stage-1",
        "1.13.0",
        "confirmed",
        (backdated, backdated),
        Some("stage-1-old"),
    );
    g.production_pr();
    refused(&g, &["newest commit", "no longer valid"]);
    g.report(
        STAGE_1,
        "stage-1",
        "1.14.0",
        "pending",
        ("2026-11-25T00:00:00Z", "2026-11-25T00:00:00Z"),
        Some("stage-1"),
    );
    passes(&g);
    assert_eq!(stage_1(&g.status()).0, "trusted");
}

/// A commit on `branch` whose root tree holds `files` files sharing one blob,
/// written straight into the object store (about 38 bytes an entry).
fn huge_tree_commit(f: &Fixture, branch: &str, files: usize) -> String {
    let repo = git2::Repository::open(&f.repo).unwrap();
    let blob = repo.blob(b"flood\n").unwrap();
    let mut raw = Vec::with_capacity(files * 40);
    for i in 0..files {
        raw.extend_from_slice(format!("100644 f{i:07}.toml\0").as_bytes());
        raw.extend_from_slice(blob.as_bytes());
    }
    let tree = repo
        .odb()
        .unwrap()
        .write(git2::ObjectType::Tree, &raw)
        .unwrap();
    let commit = git_env(
        &f.repo,
        &["commit-tree", &tree.to_string(), "-m", "flood"],
        Some(OLD),
        &[],
    );
    f.set(branch, &commit);
    commit
}

#[test]
fn a_status_branch_whose_tree_holds_400000_files_is_named_and_not_read() {
    // stage-1 and a cluster `flood` [clusters] lists too.
    let f = Fixture::new(|f| {
        line("stage/stage-1", "", &f.key("stage-1")) + &line("stage/flood", "", &f.key("rogue"))
    });
    f.write(
        "drover.toml",
        &std::fs::read_to_string(f.repo.join("drover.toml"))
            .unwrap()
            .replace("stage = [\"stage-1\"]", "stage = [\"stage-1\", \"flood\"]"),
    );
    commit_all(&f.repo, "flood", None, Some("2026-11-02T00:00:00Z"));
    f.stage_1_confirmed();
    let flood = huge_tree_commit(&f, "drover/status.d/stage/flood", 400_000);
    f.production_pr();
    // The flood is named, not read, and holds stage's evidence.
    let t0 = Instant::now();
    let out = refused(&f, &["stage's evidence is held"]);
    let took = t0.elapsed();
    assert!(
        out.contains(&format!("commit {}", &flood[..10]))
            && out.contains("more than the 512 bytes a cluster's branch (one report) may hold"),
        "{out}"
    );
    // Refusing it reads no more than its header: well inside a debug build's budget.
    assert!(took < Duration::from_secs(20), "check took {took:?}");
    warns(
        &f.status(),
        &["drover/status.d/stage/flood", &flood[..10], "not read"],
    );
    // Control: the same flood on a branch of a cluster no [clusters] lists
    // is neither read nor named; the genuine confirmation passes.
    let g = Fixture::plain();
    g.stage_1_confirmed();
    let unlisted = huge_tree_commit(&g, "drover/status.d/stage/flood", 400_000);
    g.production_pr();
    let out = passes(&g);
    assert!(!out.contains(&unlisted[..10]), "{out}");

    // The same flood on stage-1's own branch voids stage-1's reports and
    // holds stage's evidence.
    let on_own = huge_tree_commit(&g, STAGE_1, 400_000);
    refused(
        &g,
        &[
            "stage's evidence is held",
            &format!("commit {}", &on_own[..10]),
        ],
    );
}

/// `check --base` reads the branches of the environments its gates need
/// and no others: a production bump reads stage's, so a bent branch of
/// test's neither slows it nor is named by it; `drover status`, which shows
/// every environment, still names that branch.
#[test]
fn check_reads_only_the_environments_its_gates_need() {
    let f = Fixture::new(|f| {
        line("stage/stage-1", "", &f.key("stage-1")) + &line("test/test-1", "", &f.key("rogue"))
    });
    f.stage_1_confirmed();
    // test-1's branch: an unsigned report, which would void the branch.
    let unsigned = commit_file_on(
        &f.repo,
        "drover/status.d/test/test-1",
        "status/test/test-1.toml",
        Some(
            report("test-1", "1.13.0", "confirmed", OLD)
                .replace("env = \"stage\"", "env = \"test\"")
                .as_bytes(),
        ),
        None,
        "status: test-1 confirmed 1.13.0",
        Some(OLD),
    );
    f.production_pr();
    let repo = f.repo.to_str().unwrap();
    let (code, out, err) = drover(&[
        "-o", "json", "check", "--repo", repo, "--base", "main", "--now", NOW,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let refs = v["status_branches"]["refs"].as_array().expect("refs");
    assert_eq!(
        refs,
        &vec![Value::from(format!("refs/heads/{STAGE_1}"))],
        "{out}"
    );
    let short = &unsigned[..10];
    assert!(!out.contains(short) && !err.contains(short), "{out}{err}");
    // Control: the fleet view reads test's branch and names it.
    warns(
        &f.status(),
        &["drover/status.d/test/test-1", short, "not signed"],
    );
}
