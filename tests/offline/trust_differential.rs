//! `drover doctor`'s trust check against the agent's (docs/design.md §6,
//! one bootstrap rule): for every trust case, doctor's `signature` verdict
//! (`drover::agent::recover::trust_verdict`, which doctor's `signature`
//! check calls, on what the agent recorded and
//! would find) equals the agent's: its trust stage, through the entry
//! points the agent calls in the order it calls them (its own signed
//! report, else a named commit, else adoption from the first commit; its
//! applied commit when it has one).
//!
//! Cases: an unsigned first commit with and without a named commit (the
//! root, the head, a short id, a commit of another branch), an applied
//! commit with signed, unsigned and foreign-signed heads and a force-push,
//! the agent's own report outranking a named commit, and `verify = head`.

use crate::support::git::*;
use drover::admit::{self, TrustCheck};
use drover::agent::recover::{trust_verdict, AgentState};
use drover::agent::AgentConfig;
use drover::status::{PublishOptions, StatusReport};
use drover::trust::{AllowedSigners, Mode, OpenPgpKeys, Signers};
use git2::{Oid, Repository};
use std::path::{Path, PathBuf};

const NOW: &str = "2026-12-20T12:00:00Z";

struct World {
    _tmp: tempfile::TempDir,
    work: WorkRepo,
    signer: PathBuf,
    stranger: PathBuf,
    allowed: AllowedSigners,
    report_key: PathBuf,
}

/// An unsigned first commit (as a forge's first push), then `signed`
/// commits signed by an allowed key.
fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let signer = keygen(tmp.path(), "reviewer");
    let stranger = keygen(tmp.path(), "stranger");
    let report_key = keygen(tmp.path(), "report-test-1");
    let path = tmp.path().join("allowed_signers");
    allowed_signers(&path, &[("reviewer@example.com", &signer)]);
    World {
        allowed: AllowedSigners::load(&path).unwrap(),
        _tmp: tmp,
        work,
        signer,
        stranger,
        report_key,
    }
}

impl World {
    fn repo(&self) -> Repository {
        Repository::open(&self.work.dir).unwrap()
    }

    fn bump(&self, version: &str, key: Option<&Path>) -> String {
        self.work
            .bump("test", version, &format!("test {version}"), key)
    }

    /// This cluster's own signed report, naming `commit` as applied.
    fn own_report(&self, commit: &str) {
        let repo = self.repo();
        let r = StatusReport {
            env: "test".into(),
            cluster: "test-1".into(),
            config_commit: commit.into(),
            version: "1.0.0".parse().unwrap(),
            state: drover::rollout::RolloutState::Confirmed,
            since: "2026-12-01T00:00:00Z".parse().unwrap(),
            nodes: 1,
            nodes_at_version: 1,
            message: String::new(),
            detail: Default::default(),
        };
        let opts = PublishOptions::default()
            .with_signing_key_file(&self.report_key)
            .unwrap();
        let c = drover::status::build_commit(&repo, &r, &opts, None)
            .unwrap()
            .unwrap();
        repo.reference("refs/heads/drover/status.d/test/test-1", c, true, "report")
            .unwrap();
    }

    fn cfg(&self, mode: Mode, flag: Option<&str>) -> AgentConfig {
        let mut cfg = AgentConfig::new("test", "test-1", "unused", self.work.dir.join("cache"));
        cfg.verify = mode;
        cfg.trust_commit = flag.map(str::to_owned);
        cfg.publish = PublishOptions::default()
            .with_signing_key_file(&self.report_key)
            .unwrap();
        cfg
    }
}

/// A trust verdict: passed, or refused with the trust stage's reason code
/// (`None`: refused after the trust stage, which passed).
type Verdict = Result<(), Option<String>>;

/// The agent's trust stage, as it runs: with an applied commit, the span
/// from it; else its own newest signed report; else the commit a person
/// named (annotation, else flag); else adoption from the first commit.
fn agent(w: &World, cfg: &AgentConfig, state: &AgentState) -> Verdict {
    let repo = w.repo();
    let head = repo.head().unwrap().peel_to_commit().unwrap().id();
    let now = NOW.parse().unwrap();
    let signers = Signers {
        ssh: &w.allowed,
        openpgp: &OpenPgpKeys::EMPTY,
    };
    let first_seen = |_| chrono::Utc::now().timestamp();
    let trusted = TrustCheck {
        mode: cfg.verify,
        signers,
        first_seen: &first_seen,
    };
    let stage = |r: admit::Rejection| match r.stage {
        admit::Stage::Trust => Err(Some(r.code)),
        _ => Err(None),
    };
    let applied = state.applied.as_deref().map(|c| Oid::from_str(c).unwrap());
    if let Some(a) = applied {
        return admit::admit_head(&repo, Some(a), head, "test", &trusted, now)
            .map(|_| ())
            .or_else(stage);
    }
    let own = drover::agent::recover::own_signers(
        cfg.publish.signing_key.as_ref().unwrap(),
        "test",
        "test-1",
    )
    .unwrap();
    let recovered = drover::agent::recover::from_own_reports(
        &repo,
        "drover/status",
        "test",
        "test-1",
        &own,
        chrono::Utc::now(),
    );
    if let Some(c) = recovered {
        return admit::admit_head(&repo, Some(c), head, "test", &trusted, now)
            .map(|_| ())
            .or_else(stage);
    }
    if let Some(named) = state.annotation.as_deref().or(cfg.trust_commit.as_deref()) {
        let c = match drover::agent::recover::annotated_commit(&repo, named, head, "main") {
            Ok(c) => c,
            Err(_) => return Err(Some("trust_commit".into())),
        };
        // Every node runs the named commit's version: it moves nothing.
        return admit::admit_named(&repo, c, head, "test", &trusted, (true, None), now)
            .map(|_| ())
            .or_else(stage);
    }
    admit::admit_adoption(&repo, head, "test", &trusted, now)
        .map(|_| ())
        .or_else(stage)
}

/// `drover doctor`'s `signature` check on the same world.
fn doctor(w: &World, cfg: &AgentConfig, state: &AgentState) -> Verdict {
    let repo = w.repo();
    let head = repo.head().unwrap().peel_to_commit().unwrap().id();
    let signers = Signers {
        ssh: &w.allowed,
        openpgp: &OpenPgpKeys::EMPTY,
    };
    trust_verdict(cfg, state, &repo, head, signers)
        .map(|_| ())
        .map_err(|r| Some(r.code))
}

fn state(applied: Option<&str>, annotation: Option<&str>) -> AgentState {
    AgentState {
        applied: applied.map(str::to_owned),
        annotation: annotation.map(str::to_owned),
    }
}

#[test]
fn doctor_and_the_agent_give_the_same_trust_verdict_in_every_case() {
    let mut cases: Vec<(String, Verdict)> = Vec::new();
    let mut both = |name: &str, w: &World, cfg: &AgentConfig, st: &AgentState, want: Verdict| {
        let (a, d) = (agent(w, cfg, st), doctor(w, cfg, st));
        assert_eq!(a, want, "{name}: the agent");
        assert_eq!(d, a, "{name}: doctor against the agent");
        cases.push((name.to_owned(), a));
    };
    let all = |w: &World| w.cfg(Mode::All, None);

    // An unsigned first commit, a signed one on top (drover init's world).
    let w = world();
    let root = w.work.head();
    let head = w.bump("1.1.0", Some(&w.signer));
    let refused = |c: &str| Err(Some(c.to_owned()));
    both(
        "nothing recorded",
        &w,
        &all(&w),
        &state(None, None),
        refused("unsigned"),
    );
    both(
        "the root named",
        &w,
        &all(&w),
        &state(None, Some(&root)),
        Ok(()),
    );
    both(
        "the head named",
        &w,
        &all(&w),
        &state(None, Some(&head)),
        Ok(()),
    );
    both(
        "the head named by --trust-commit",
        &w,
        &w.cfg(Mode::All, Some(&head)),
        &state(None, None),
        Ok(()),
    );
    both(
        "a short id named",
        &w,
        &all(&w),
        &state(None, Some(&head[..12])),
        refused("trust_commit"),
    );
    git(&w.work.dir, &["branch", "side", &root]);
    git(&w.work.dir, &["checkout", "-q", "side"]);
    let side = w.bump("1.0.1", Some(&w.signer));
    git(&w.work.dir, &["checkout", "-q", "main"]);
    both(
        "a commit of another branch named",
        &w,
        &all(&w),
        &state(None, Some(&side)),
        refused("trust_commit"),
    );
    both(
        "verify = head",
        &w,
        &w.cfg(Mode::Head, None),
        &state(None, None),
        Ok(()),
    );

    // An applied commit: the span after it.
    both(
        "applied, a signed head",
        &w,
        &all(&w),
        &state(Some(&root), None),
        Ok(()),
    );
    let unsigned = w.bump("1.2.0", None);
    both(
        "applied, an unsigned head",
        &w,
        &all(&w),
        &state(Some(&head), None),
        refused("unsigned"),
    );
    // The root named beside an unsigned commit after the head: verified.
    both(
        "the root named, an unsigned commit later",
        &w,
        &all(&w),
        &state(None, Some(&root)),
        refused("unsigned"),
    );
    both(
        "the unsigned head named",
        &w,
        &all(&w),
        &state(None, Some(&unsigned)),
        Ok(()),
    );
    let foreign = w.bump("1.3.0", Some(&w.stranger));
    both(
        "applied, a head signed by a key not listed",
        &w,
        &all(&w),
        &state(Some(&unsigned), None),
        refused("unknown_key"),
    );
    git(&w.work.dir, &["reset", "-q", "--hard", &root]);
    let rewritten = w.bump("1.4.0", Some(&w.signer));
    both(
        "applied, a head that does not descend from it",
        &w,
        &all(&w),
        &state(Some(&foreign), None),
        refused("not_descendant"),
    );

    // The agent's own report outranks a commit named: here it names the
    // root, so the (signed) commit after it is verified, whatever was named.
    let w = world();
    let root = w.work.head();
    let middle = w.bump("1.1.0", None);
    let head = w.bump("1.2.0", Some(&w.signer));
    w.own_report(&root);
    both(
        "own report at the root, the head named",
        &w,
        &all(&w),
        &state(None, Some(&head)),
        refused("unsigned"),
    );
    w.own_report(&middle);
    both(
        "own report past the unsigned commit",
        &w,
        &all(&w),
        &state(None, Some(&root)),
        Ok(()),
    );
    let _ = rewritten;
    assert!(cases.len() >= 14, "{cases:?}");
}
