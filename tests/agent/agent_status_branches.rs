//! Status branches that cannot be bent, through the agent against the real
//! API server (tests/offline/status_branches.rs runs the same attacks through
//! `drover check --base` and `drover status`): each attack on the evidence
//! for production's bump leaves every node untouched and the agent reports
//! `refused` with the reason; each control is applied.
//!
//! - a merge commit hiding stage-1's `failed` report;
//! - stage-1's branch created at an old commit of the single branch;
//! - a retired report key signing a backdated report after the agent
//!   started (first seen after its `valid-before`);
//! - a status branch whose tree holds 400,000 files: the agent names it, and
//!   still applies a genuine bump promptly and stops promptly.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent_evidence::{config_repo, OLD};
use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::git::{commit_file_on, git, keygen, public_key};
use crate::support::kube::{ControlPlane, TestNamespace};
use chrono::Utc;
use drover::rollout::VirtualClock;
use kube::Client;

const LATER: &str = "2026-12-11T12:00:00Z";
const STAGE_1: &str = "drover/status.d/stage/stage-1";

/// A report of stage-1 on `branch` of the served repository, signed with
/// `key` (unsigned with `None`), committed at `date`.
fn stage_report(
    repo: &ConfigRepo,
    branch: &str,
    version: &str,
    state: &str,
    (since, date): (&str, &str),
    key: Option<&Path>,
) -> String {
    let text = format!(
        "env = \"stage\"\ncluster = \"stage-1\"\nconfig_commit = \"abc\"\nversion = \"{version}\"\nstate = \"{state}\"\nsince = {since}\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"
    );
    commit_file_on(
        &repo.bare,
        branch,
        "status/stage/stage-1.toml",
        Some(text.as_bytes()),
        key,
        "status",
        Some(date),
    )
}

fn set_ref(repo: &ConfigRepo, branch: &str, commit: &str) {
    git(
        &repo.bare,
        &["update-ref", &format!("refs/heads/{branch}"), commit],
    );
}

/// A commit on `branch` of the served repository whose root tree holds
/// `files` files sharing one blob.
fn huge_tree(repo: &ConfigRepo, branch: &str, files: usize) -> String {
    let r = git2::Repository::open_bare(&repo.bare).unwrap();
    let blob = r.blob(b"flood\n").unwrap();
    let mut raw = Vec::with_capacity(files * 40);
    for i in 0..files {
        raw.extend_from_slice(format!("100644 f{i:07}.toml\0").as_bytes());
        raw.extend_from_slice(blob.as_bytes());
    }
    let tree = r
        .odb()
        .unwrap()
        .write(git2::ObjectType::Tree, &raw)
        .unwrap();
    let sig =
        git2::Signature::new("x", "x@example.com", &git2::Time::new(1_790_000_000, 0)).unwrap();
    let c = r
        .commit(None, &sig, &sig, "flood", &r.find_tree(tree).unwrap(), &[])
        .unwrap();
    r.reference(&format!("refs/heads/{branch}"), c, true, "test")
        .unwrap();
    c.to_string()
}

/// Replace stage-1's line of the report signers: its current key retired
/// at `valid_before` (UTC, `YYYYMMDDhhmmssZ`), plus a new key; a reviewed
/// change. Returns the old key.
fn rotate_stage_key(repo: &ConfigRepo, valid_before: &str) -> std::path::PathBuf {
    let old = repo.report_keys["stage-1"].clone();
    let new = keygen(repo.dir.path(), "report-stage-1-new");
    let path = repo.work.join("agents.allowed_signers");
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: String = text
        .lines()
        .filter(|l| !l.starts_with("stage/stage-1 "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(
        &path,
        format!(
            "{kept}stage/stage-1 namespaces=\"git\",valid-before=\"{valid_before}\" {}\nstage/stage-1 namespaces=\"git\" {}\n",
            public_key(&old),
            public_key(&new)
        ),
    )
    .unwrap();
    repo.commit("rotate stage-1's report key", true);
    repo.push();
    old
}

/// Start a production agent `name` on `clock`; wait until it adopted the cluster.
async fn start(
    client: &Client,
    repo: &ConfigRepo,
    ns: &str,
    name: &str,
    clock: &VirtualClock,
) -> (RunningAgent, String) {
    let mut cfg = agent_config(repo, "production", "prod-1", ns, name);
    cfg.status_name = name.into();
    cfg.lease_name = name.into();
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    let st = await_status(client, ns, name, "adopted", |s| {
        s.last_applied_commit.is_some()
    })
    .await
    .status
    .unwrap();
    (agent, st.last_applied_commit.unwrap())
}

/// Makes a case's store (before the agent starts, then after), returns nothing.
type Before = fn(&ConfigRepo);
type After = fn(&ConfigRepo);

struct Case {
    name: &'static str,
    before: Before,
    after: After,
    says: &'static str,
}

/// Wall-clock dates, `days` ago: first-seen times are the agent's fetch
/// times, which the wall clock dates.
fn days_ago(days: i64) -> String {
    (Utc::now() - chrono::Duration::days(days))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn retire_30_days_ago(repo: &ConfigRepo) {
    let at = (Utc::now() - chrono::Duration::days(30)).format("%Y%m%d%H%M%SZ");
    rotate_stage_key(repo, &at.to_string());
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "an unsigned merge hiding stage-1's failed",
            before: |_| {},
            after: |r| {
                let k = r.report_keys["stage-1"].clone();
                let confirmed =
                    stage_report(r, STAGE_1, "1.13.0", "confirmed", (OLD, OLD), Some(&k));
                let failed = stage_report(r, STAGE_1, "1.13.0", "failed", (LATER, LATER), Some(&k));
                let tree = git(&r.bare, &["rev-parse", &format!("{confirmed}^{{tree}}")]);
                let merge = crate::support::git::git_env(
                    &r.bare,
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
                set_ref(r, STAGE_1, &merge);
            },
            says: "is a merge commit",
        },
        Case {
            name: "stage-1's branch created at an old commit of the single branch",
            before: |_| {},
            after: |r| {
                let k = r.report_keys["stage-1"].clone();
                let confirmed = stage_report(
                    r,
                    "drover/status",
                    "1.13.0",
                    "confirmed",
                    (OLD, OLD),
                    Some(&k),
                );
                stage_report(
                    r,
                    "drover/status",
                    "1.13.0",
                    "failed",
                    (LATER, LATER),
                    Some(&k),
                );
                set_ref(r, STAGE_1, &confirmed);
            },
            says: "withdrawn by a later `failed` report",
        },
        Case {
            name: "a retired key's backdated report, first seen after its valid-before",
            before: |r| {
                retire_30_days_ago(r);
                let k = r.report_keys["stage-1"].clone();
                let old = days_ago(50);
                stage_report(r, STAGE_1, "1.12.0", "confirmed", (&old, &old), Some(&k));
            },
            after: |r| {
                // Dated inside the key's validity, pushed today: monotone
                // and in the past, so only when it was first seen tells.
                let k = r.report_keys["stage-1"].clone();
                let backdated = days_ago(40);
                stage_report(
                    r,
                    STAGE_1,
                    "1.13.0",
                    "confirmed",
                    (&backdated, &backdated),
                    Some(&k),
                );
                // Under the cluster's next report by its current key: the
                // branch's newest commit is valid now, so only the record of
                // when the backdated one was first fetched refuses it.
                let new = r.dir.path().join("report-stage-1-new");
                let now = days_ago(0);
                stage_report(r, STAGE_1, "1.14.0", "pending", (&now, &now), Some(&new));
            },
            says: "when the commit was first seen",
        },
        Case {
            name: "400,000 files on stage-1's own branch",
            before: |_| {},
            after: |r| {
                huge_tree(r, STAGE_1, 400_000);
            },
            says: "it is not read",
        },
    ]
}

#[tokio::test]
async fn bent_status_branches_are_refused_by_the_agent_and_controls_are_applied() {
    crate::support::kube::init_tracing();
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "branches").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    // Inside production's window: only admission stands between a push and the nodes.
    let open = VirtualClock::new(dec(20, 3, 0));
    for (i, case) in cases().into_iter().enumerate() {
        let repo = config_repo(ns.name());
        (case.before)(&repo);
        let name = format!("bent-{i}");
        let (agent, adopted) = start(&client, &repo, ns.name(), &name, &open).await;
        (case.after)(&repo);
        let head = repo.bump("production", "1.13.0", true);
        assert_eq!(agent.webhook().await, 202);
        let st = await_status(&client, ns.name(), &name, case.name, |s| {
            s.refused.as_ref().is_some_and(|r| r.commit == head)
        })
        .await
        .status
        .unwrap();
        let r = st.refused.unwrap();
        // A `failed` withdraws the confirmation; a branch that does not
        // count holds stage's evidence.
        let reason = if case.says.contains("withdrawn") {
            "not_confirmed"
        } else {
            "evidence_held"
        };
        assert_eq!(
            (r.stage.as_str(), r.reason.as_str()),
            ("gate", reason),
            "{}: {}",
            case.name,
            r.message
        );
        assert!(
            r.message.contains(case.says),
            "{}: {}",
            case.name,
            r.message
        );
        assert_eq!(st.last_applied_commit.as_deref(), Some(adopted.as_str()));
        for n in sim.node_names() {
            assert_eq!(sim.upgrades_started(&n), 0, "{}: {n} touched", case.name);
        }
        agent.stop();
    }

    // Controls, with the window closed so that an accepted change moves no node.
    let closed = VirtualClock::new(dec(21, 12, 0));
    let controls: Vec<(&str, Before, After)> = vec![
        (
            "the same confirmation on a linear branch",
            |_| {},
            |r| {
                let k = r.report_keys["stage-1"].clone();
                stage_report(r, STAGE_1, "1.13.0", "confirmed", (OLD, OLD), Some(&k));
            },
        ),
        (
            "a branch made at a commit of the single branch, nothing later",
            |_| {},
            |r| {
                let k = r.report_keys["stage-1"].clone();
                let c = stage_report(
                    r,
                    "drover/status",
                    "1.13.0",
                    "confirmed",
                    (OLD, OLD),
                    Some(&k),
                );
                set_ref(r, STAGE_1, &c);
            },
        ),
        (
            "the retired key's report, dated honestly inside its validity, there before",
            |r| {
                retire_30_days_ago(r);
                let k = r.report_keys["stage-1"].clone();
                let old = days_ago(50);
                stage_report(r, STAGE_1, "1.12.0", "confirmed", (&old, &old), Some(&k));
                let honest = days_ago(40);
                stage_report(
                    r,
                    STAGE_1,
                    "1.13.0",
                    "confirmed",
                    (&honest, &honest),
                    Some(&k),
                );
                // The agent restarted with its new key when the old one was
                // retired (docs/status.md, "Rotating a cluster's report
                // key", step 2) and pushed its state again.
                let new = r.dir.path().join("report-stage-1-new");
                let rotated = days_ago(30);
                stage_report(
                    r,
                    STAGE_1,
                    "1.13.0",
                    "confirmed",
                    (&rotated, &rotated),
                    Some(&new),
                );
            },
            |_| {},
        ),
    ];
    for (i, (what, before, after)) in controls.into_iter().enumerate() {
        let repo = config_repo(ns.name());
        before(&repo);
        let name = format!("control-{i}");
        let (agent, _) = start(&client, &repo, ns.name(), &name, &closed).await;
        after(&repo);
        let head = repo.bump("production", "1.13.0", true);
        assert_eq!(agent.webhook().await, 202);
        let st = await_status(&client, ns.name(), &name, what, |s| {
            s.last_applied_commit.as_deref() == Some(head.as_str())
        })
        .await
        .status
        .unwrap();
        assert!(st.refused.is_none(), "{what}: {:?}", st.refused);
        agent.stop();
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn a_400000_file_branch_in_the_store_does_not_slow_a_genuine_bump_or_a_stop() {
    crate::support::kube::init_tracing();
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "flood").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let repo = config_repo(ns.name());
    let closed = VirtualClock::new(dec(21, 12, 0));
    let (agent, _) = start(&client, &repo, ns.name(), "flood", &closed).await;
    // A genuine confirmation, and a branch of someone else's whose tree
    // holds 400,000 files (about a megabyte on the wire).
    let k = repo.report_keys["stage-1"].clone();
    stage_report(&repo, STAGE_1, "1.13.0", "confirmed", (OLD, OLD), Some(&k));
    huge_tree(&repo, "drover/status.d/stage/flood", 400_000);
    let head = repo.bump("production", "1.13.0", true);
    let t0 = Instant::now();
    assert_eq!(agent.webhook().await, 202);
    let st = await_status(&client, ns.name(), "flood", "applied", |s| {
        s.last_applied_commit.as_deref() == Some(head.as_str())
    })
    .await
    .status
    .unwrap();
    let took = t0.elapsed();
    assert!(st.refused.is_none(), "{:?}", st.refused);
    // The fetch and one admission; the flood is refused from its header.
    assert!(took < Duration::from_secs(30), "applied after {took:?}");
    let t0 = Instant::now();
    agent.stop();
    let stopping = t0.elapsed();
    assert!(
        stopping < Duration::from_secs(10),
        "stopped after {stopping:?}"
    );
    sim.shutdown().await;
}
