//! The status store's layout (docs/design.md §5): one branch per cluster,
//! `drover/status.d/<env>/<cluster>`, read together with the single
//! `drover/status` branch of the older layout. Each trust decision has an
//! attack that must not count and a control that must.

use crate::support::git::*;
use drover::rollout::RolloutState;
use drover::status::{self, PublishOptions, StatusReport, MAX_STATUS_BRANCHES};
use drover::trust::AllowedSigners;
use git2::{Oid, Repository};
use semver::Version;
use std::path::{Path, PathBuf};

const BRANCH: &str = "drover/status";

fn report(cluster: &str, state: RolloutState, since: &str) -> StatusReport {
    StatusReport {
        env: "stage".into(),
        cluster: cluster.into(),
        config_commit: "c".repeat(40),
        version: "1.13.2".parse().unwrap(),
        state,
        since: since.parse().unwrap(),
        nodes: 3,
        nodes_at_version: 3,
        message: String::new(),
        detail: Default::default(),
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    repo: Repository,
    keys: Vec<(String, PathBuf)>,
    signers: AllowedSigners,
}

impl Fixture {
    /// A repository and one key per stage cluster, each listed for exactly its cluster.
    fn new(clusters: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init(tmp.path().join("repo")).unwrap();
        let keys: Vec<(String, PathBuf)> = clusters
            .iter()
            .map(|c| (format!("stage/{c}"), keygen(tmp.path(), c)))
            .collect();
        let listed: Vec<(&str, &Path)> = keys
            .iter()
            .map(|(p, k)| (p.as_str(), k.as_path()))
            .collect();
        let file = tmp.path().join("agents.allowed_signers");
        allowed_signers(&file, &listed);
        let signers = AllowedSigners::load(&file).unwrap();
        Fixture {
            _tmp: tmp,
            repo,
            keys,
            signers,
        }
    }

    /// A commit on `tip` writing `r`, signed with `signer`'s key.
    fn commit(&self, r: &StatusReport, signer: &str, tip: Option<Oid>) -> Oid {
        let key = &self
            .keys
            .iter()
            .find(|(p, _)| p == &format!("stage/{signer}"))
            .unwrap()
            .1;
        let opts = PublishOptions::default()
            .with_signing_key_file(key)
            .unwrap();
        status::build_commit(&self.repo, r, &opts, tip)
            .unwrap()
            .unwrap()
    }

    fn set(&self, branch: &str, oid: Oid) {
        self.repo
            .reference(&format!("refs/heads/{branch}"), oid, true, "test")
            .unwrap();
    }

    fn read(&self) -> status::Confirmations {
        status::read_confirmations(&self.repo, BRANCH, Some(&self.signers), chrono::Utc::now())
    }
}

fn v() -> Version {
    "1.13.2".parse().unwrap()
}

#[test]
fn a_report_on_another_clusters_branch_does_not_count() {
    let f = Fixture::new(&["stage-1", "stage-2"]);
    // stage-2's own, validly signed confirmation, put on stage-1's branch.
    let forged = f.commit(
        &report("stage-2", RolloutState::Confirmed, "2026-12-01T04:00:00Z"),
        "stage-2",
        None,
    );
    f.set("drover/status.d/stage/stage-1", forged);
    // And a ref in the namespace that names no <env>/<cluster>.
    f.set("drover/status.d/stage-2", forged);
    let conf = f.read();
    assert_eq!(conf.confirmed_at("stage", "stage-2", &v()), None);
    assert_eq!(conf.confirmed_at("stage", "stage-1", &v()), None);
    // stage-1's branch holds another cluster's file: the whole branch does not count.
    let why = conf.why_not("stage", "stage-1", &v()).expect("named");
    assert!(
        why.contains("drover/status.d/stage/stage-1 does not count as a whole")
            && why.contains("a cluster's branch holds exactly status/stage/stage-1.toml"),
        "{why}"
    );
    assert!(
        conf.ignored
            .iter()
            .any(|i| i.why.contains("is not a cluster's status branch")),
        "{:?}",
        conf.ignored
    );

    // Control: the very same commit on stage-2's own branch counts.
    f.set("drover/status.d/stage/stage-2", forged);
    let conf = f.read();
    assert!(conf.confirmed_at("stage", "stage-2", &v()).is_some());
    assert_eq!(conf.confirmed_at("stage", "stage-1", &v()), None);
}

#[test]
fn a_clusters_branch_counts_only_its_own_key() {
    let f = Fixture::new(&["stage-1", "stage-2"]);
    // stage-1's own file on its own branch, but signed with stage-2's key.
    let r = report("stage-1", RolloutState::Confirmed, "2026-12-01T04:00:00Z");
    let wrong = f.commit(&r, "stage-2", None);
    f.set("drover/status.d/stage/stage-1", wrong);
    let conf = f.read();
    assert_eq!(conf.confirmed_at("stage", "stage-1", &v()), None);
    let why = conf.why_not("stage", "stage-1", &v()).unwrap();
    assert!(why.contains("stage/stage-2's key"), "{why}");
    // Control: signed with its own key.
    let right = f.commit(&r, "stage-1", None);
    f.set("drover/status.d/stage/stage-1", right);
    assert!(f.read().confirmed_at("stage", "stage-1", &v()).is_some());
}

#[test]
fn every_commit_of_a_clusters_branch_is_checked_and_one_bad_commit_voids_it() {
    // A status branch counts only as a whole: a commit anywhere in it that
    // is not signed by the cluster's own key makes none of it count.
    let f = Fixture::new(&["stage-1", "stage-2"]);
    let at = |c: &status::Confirmations| c.confirmed_at("stage", "stage-1", &v());
    // An older `rolling` signed with stage-2's key, under stage-1's own
    // confirmation: the confirmation does not count either.
    let noise = f.commit(
        &report("stage-1", RolloutState::Rolling, "2030-01-30T00:00:00Z"),
        "stage-2",
        None,
    );
    let confirmed = f.commit(
        &report("stage-1", RolloutState::Confirmed, "2030-02-01T00:00:00Z"),
        "stage-1",
        Some(noise),
    );
    f.set("drover/status.d/stage/stage-1", confirmed);
    let conf = f.read();
    assert_eq!(at(&conf), None);
    let why = conf.why_not("stage", "stage-1", &v()).unwrap();
    assert!(
        why.contains(&format!(
            "commit {:.10} is signed by stage/stage-2's key",
            noise
        )),
        "{why}"
    );
    assert_eq!(conf.untrusted.len(), 1, "{:?}", conf.untrusted);

    // Control: the same history signed by stage-1 throughout counts.
    let own = f.commit(
        &report("stage-1", RolloutState::Rolling, "2030-01-30T00:00:00Z"),
        "stage-1",
        None,
    );
    let confirmed = f.commit(
        &report("stage-1", RolloutState::Confirmed, "2030-02-01T00:00:00Z"),
        "stage-1",
        Some(own),
    );
    let tip = f.commit(
        &report("stage-1", RolloutState::Rolling, "2030-02-01T01:00:00Z"),
        "stage-1",
        Some(confirmed),
    );
    f.set("drover/status.d/stage/stage-1", tip);
    let conf = f.read();
    assert_eq!(at(&conf), Some("2030-02-01T00:00:00Z".parse().unwrap()));
    assert!(conf.ignored.is_empty(), "{:?}", conf.ignored);

    // A `failed` signed by stage-1 withdraws it; one signed by another key voids the branch.
    let failed = f.commit(
        &report("stage-1", RolloutState::Failed, "2030-02-01T02:00:00Z"),
        "stage-1",
        Some(tip),
    );
    f.set("drover/status.d/stage/stage-1", failed);
    let conf = f.read();
    assert_eq!(at(&conf), None);
    assert!(conf
        .why_not("stage", "stage-1", &v())
        .unwrap()
        .contains("withdrawn"));
    let wrong_tip = f.commit(
        &report("stage-1", RolloutState::Rolling, "2030-02-01T03:00:00Z"),
        "stage-2",
        Some(tip),
    );
    f.set("drover/status.d/stage/stage-1", wrong_tip);
    let conf = f.read();
    assert_eq!(at(&conf), None);
    assert!(
        conf.ignored
            .iter()
            .any(|i| i.commit == wrong_tip.to_string() && i.why.contains("stage/stage-2's key")),
        "{:?}",
        conf.ignored
    );
}

#[test]
fn the_older_single_branch_is_read_and_a_clusters_own_branch_continues_it() {
    let f = Fixture::new(&["stage-1", "stage-2"]);
    // The older layout: both clusters confirmed on the one shared branch.
    let c1 = f.commit(
        &report("stage-1", RolloutState::Confirmed, "2030-01-01T00:00:00Z"),
        "stage-1",
        None,
    );
    let c2 = f.commit(
        &report("stage-2", RolloutState::Confirmed, "2030-01-02T00:00:00Z"),
        "stage-2",
        Some(c1),
    );
    f.set(BRANCH, c2);
    let only_old = f.read();
    let at = |c: &status::Confirmations, cluster| c.confirmed_at("stage", cluster, &v());
    assert_eq!(
        at(&only_old, "stage-1"),
        Some("2030-01-01T00:00:00Z".parse().unwrap())
    );
    assert!(at(&only_old, "stage-2").is_some());

    // stage-1 moves to its own branch and re-publishes `confirmed`: the run
    // that began on the older branch goes on (the soak is not restarted).
    let again = f.commit(
        &report("stage-1", RolloutState::Confirmed, "2030-02-01T00:00:00Z"),
        "stage-1",
        None,
    );
    f.set("drover/status.d/stage/stage-1", again);
    let both = f.read();
    assert_eq!(
        at(&both, "stage-1"),
        Some("2030-01-01T00:00:00Z".parse().unwrap())
    );
    assert_eq!(
        both.branch.as_ref().unwrap().refname,
        "refs/heads/drover/status"
    );

    // A `failed` on its own branch withdraws the confirmation the older branch holds.
    let failed = f.commit(
        &report("stage-1", RolloutState::Failed, "2030-03-01T00:00:00Z"),
        "stage-1",
        Some(again),
    );
    f.set("drover/status.d/stage/stage-1", failed);
    let withdrawn = f.read();
    assert_eq!(at(&withdrawn, "stage-1"), None);
    assert!(withdrawn
        .why_not("stage", "stage-1", &v())
        .unwrap()
        .contains("withdrawn"));
    // stage-2, which has no branch of its own yet, still counts from the older branch.
    assert!(at(&withdrawn, "stage-2").is_some());
}

#[test]
fn more_status_branches_than_the_bound_are_refused_not_read_in_part() {
    let f = Fixture::new(&["stage-1"]);
    let tip = f.commit(
        &report("stage-1", RolloutState::Confirmed, "2026-12-01T04:00:00Z"),
        "stage-1",
        None,
    );
    let packed = |n: usize| {
        let mut text = String::from("# pack-refs with: peeled fully-peeled sorted \n");
        let mut names: Vec<String> = (0..n)
            .map(|i| format!("refs/heads/drover/status.d/stage/c{i:05}"))
            .collect();
        names.sort();
        for name in names {
            text.push_str(&format!("{tip} {name}\n"));
        }
        std::fs::write(f.repo.path().join("packed-refs"), text).unwrap();
    };
    // Control: exactly the bound is read.
    packed(MAX_STATUS_BRANCHES);
    let store = status::find_store(&f.repo, BRANCH, status::Scope::Every).unwrap();
    assert_eq!(store.clusters.len(), MAX_STATUS_BRANCHES);
    // One more and nothing is read: every environment's evidence is
    // held, saying why (missing evidence never opens anything).
    packed(MAX_STATUS_BRANCHES + 1);
    let conf = status::read_confirmations(&f.repo, BRANCH, Some(&f.signers), chrono::Utc::now());
    let held = conf.held("stage", None).expect("held");
    assert!(
        held.contains(&format!(
            "more than {MAX_STATUS_BRANCHES} per-cluster branches"
        )),
        "{held}"
    );
    assert!(conf.for_version("stage", &v()).is_empty());
}

/// What a reader of the store is told, in order, as text.
#[derive(Default)]
struct Told(Vec<String>);

impl status::Visitor for Told {
    fn version(&mut self, v: status::ReportVersion) {
        let report = match &v.report {
            Ok(r) => format!("{} {} {}", r.state.as_str(), r.since, r.message.len()),
            Err(why) => why.clone(),
        };
        self.0.push(format!(
            "{}/{} {} {} {report}",
            v.env, v.cluster, v.commit, v.committed
        ));
    }

    fn branch(&mut self, b: &status::BranchRead<'_>) {
        self.0.push(format!(
            "{} {:?} {:?} {}",
            b.refname, b.verdict, b.broken, b.truncated
        ));
    }
}

#[test]
fn threads_tell_the_reader_what_one_thread_tells_it_in_the_same_order() {
    // The cluster branches are read by several threads and handed over in
    // name order: the same versions, verdicts and order as one thread,
    // whichever thread finishes first, with a branch that breaks the rule
    // deep in its history and one too large for a thread to hold.
    let names: Vec<String> = (1..=7).map(|i| format!("stage-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let f = Fixture::new(&refs);
    let at = |h: u32| format!("2030-02-01T{h:02}:00:00Z");
    for (i, c) in names.iter().enumerate() {
        let mut tip = None;
        // stage-3 holds reports of 60 KB each, more than a thread holds of a branch.
        let (count, message) = match i {
            2 => (24, "x".repeat(60_000)),
            _ => (3 + i, String::new()),
        };
        for n in 0..count {
            let state = [RolloutState::Rolling, RolloutState::Confirmed][n % 2];
            let mut r = report(c, state, &at(n as u32));
            r.message = message.clone();
            // stage-5's second commit is signed by stage-6's key.
            let signer = if i == 4 && n == 1 { "stage-6" } else { c };
            tip = Some(f.commit(&r, signer, tip));
        }
        f.set(&format!("drover/status.d/stage/{c}"), tip.unwrap());
    }
    let store = status::find_store(&f.repo, BRANCH, status::Scope::Every).unwrap();
    let judge = status::Judge {
        signers: Some(&f.signers),
        now: chrono::Utc::now(),
        seen: None,
    };
    let told = |threads: usize| {
        let mut t = Told::default();
        status::walk_store_threads(&f.repo, &store, &judge, &mut t, threads).unwrap();
        t.0
    };
    let one = told(1);
    assert_eq!(told(status::MAX_READ_THREADS), one);
    assert_eq!(told(2), one);
    // What one thread is told is the whole store: each branch's versions
    // (stage-5's down to the commit that breaks it), then its verdict.
    assert_eq!(one.len(), 3 + 4 + 24 + 6 + 6 + 8 + 9 + 7, "{one:#?}");
    let broken = one
        .iter()
        .find(|l| l.starts_with("refs/heads/drover/status.d/stage/stage-5 Err"))
        .unwrap();
    assert!(broken.contains("stage/stage-6's key"), "{broken}");
    assert_eq!(
        one.iter()
            .filter(|l| l.starts_with("stage/stage-3 ") && l.ends_with(" 60000"))
            .count(),
        24
    );
}
