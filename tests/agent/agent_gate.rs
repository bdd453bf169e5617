//! The gate holds on every path into the agent (docs/design.md §4, §6),
//! against the real API server, simulated kubelet nodes and a real git
//! server:
//! - split pushes: a policy edit and a bump in two signed commits pushed
//!   together are one change, refused as `drover check --base <last
//!   applied>` refuses it (chain reorder, delete + re-add, un-revoke, new
//!   report key, soak cut); no node is touched, and the refusal is in the
//!   DroverStatus, the status report and an Event. Control: the halves
//!   pushed one after the other are applied, the bump judged by the policy
//!   the first half brought;
//! - the trust annotation takes only the full id of a commit of the tracked
//!   branch (it and its ancestors trusted, the commits after it verified),
//!   that commit still passes the gate, and the annotation is used up;
//! - a refusal is kept as state: over 20 passes one Event, a stable
//!   `since`, one judgement.

use std::sync::Arc;
use std::time::Duration;

use crate::agent_evidence::{config_repo, edit, push_report, start_adopted, OLD, RECENT};
use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::git::{commit_all, git, keygen};
use crate::support::kube::{events_for, ControlPlane, TestNamespace};
use drover::agent::crd::{DroverStatus, DroverStatusStatus};
use drover::rollout::{RolloutState, VirtualClock};
use kube::api::{Api, Patch, PatchParams};
use kube::Client;

/// Production's window (02:00-08:00 on the 20th) is open.
fn open() -> chrono::DateTime<chrono::Utc> {
    dec(20, 3, 0)
}

/// Production's window has closed: an applied change moves no node.
fn closed() -> chrono::DateTime<chrono::Utc> {
    dec(20, 9, 0)
}

fn set_version(text: String, version: &str) -> String {
    let at = text.find("version = \"").expect("a version line") + "version = \"".len();
    let end = at + text[at..].find('"').unwrap();
    format!("{}{version}{}", &text[..at], &text[end..])
}

fn pin(repo: &ConfigRepo, version: &str) {
    edit(repo, "environments/production.toml", |t| {
        set_version(t, version)
    });
}

/// A signed commit of the work tree (a reviewed merge), not pushed.
fn commit(repo: &ConfigRepo, msg: &str) -> String {
    repo.commit(msg, true)
}

/// One split push: what makes its evidence, the policy half, the version it
/// moves production to, and what the refusal names.
struct Split {
    name: &'static str,
    before: fn(&ConfigRepo),
    policy: fn(&ConfigRepo),
    version: &'static str,
    edits: &'static str,
}

fn splits() -> Vec<Split> {
    vec![
        Split {
            name: "chain reorder",
            before: |_| {},
            policy: |r| {
                edit(r, "drover.toml", |t| {
                    t.replace(
                        "chain = [\"test\", \"stage\", \"production\"]",
                        "chain = [\"production\", \"test\", \"stage\"]",
                    )
                })
            },
            version: "9.9.9",
            edits: "(chain)",
        },
        Split {
            name: "delete and re-add",
            before: |_| {},
            policy: |r| {
                // Commit 1 deletes production (file, chain, clusters); the
                // bump commit adds it back, first in the chain.
                let text =
                    std::fs::read_to_string(r.work.join("environments/production.toml")).unwrap();
                let root = std::fs::read_to_string(r.work.join("drover.toml")).unwrap();
                let without = root
                    .replace("\"test\", \"stage\", \"production\"", "\"test\", \"stage\"")
                    .replace("production = [\"prod-1\"]\n", "");
                std::fs::write(r.work.join("drover.toml"), without).unwrap();
                git(&r.work, &["rm", "-q", "environments/production.toml"]);
                commit(r, "production retired");
                std::fs::write(
                    r.work.join("drover.toml"),
                    root.replace(
                        "\"test\", \"stage\", \"production\"",
                        "\"production\", \"test\", \"stage\"",
                    ),
                )
                .unwrap();
                std::fs::write(r.work.join("environments/production.toml"), text).unwrap();
            },
            version: "9.9.9",
            edits: "(chain)",
        },
        Split {
            name: "un-revoke",
            before: |r| {
                let k = r.report_keys["stage-1"].clone();
                push_report(r, "stage-1", "1.13.3", "confirmed", OLD, Some(&k));
            },
            policy: |r| {
                edit(r, "drover.toml", |t| {
                    t.replace(
                        "\nrevoked = [{ version = \"1.13.3\", reason = \"panics\" }]",
                        "",
                    )
                })
            },
            version: "1.13.3",
            edits: "(revoked)",
        },
        Split {
            name: "new report key",
            before: |r| {
                let rogue = keygen(r.dir.path(), "rogue");
                push_report(r, "stage-1", "1.13.0", "confirmed", OLD, Some(&rogue));
            },
            policy: |r| {
                let rogue = r.dir.path().join("rogue");
                let public = std::fs::read_to_string(format!("{}.pub", rogue.display())).unwrap();
                edit(r, "agents.allowed_signers", |t| {
                    format!("{t}stage/stage-1 namespaces=\"git\" {public}")
                });
            },
            version: "1.13.0",
            edits: "(the keys in agents.allowed_signers)",
        },
        Split {
            name: "soak cut",
            before: |r| {
                let k = r.report_keys["stage-1"].clone();
                push_report(r, "stage-1", "1.13.0", "confirmed", RECENT, Some(&k));
            },
            policy: |r| {
                edit(r, "environments/production.toml", |t| {
                    t.replace("soak = \"24h\"", "soak = \"10m\"")
                })
            },
            version: "1.13.0",
            edits: "(soak of production)",
        },
    ]
}

async fn await_applied(client: &Client, ns: &str, name: &str, what: &str, commit: &str) {
    let st = await_status(client, ns, name, what, |s| {
        s.last_applied_commit.as_deref() == Some(commit)
    })
    .await
    .status
    .unwrap();
    assert!(st.refused.is_none(), "{what}: {:?}", st.refused);
}

/// One split push and its control, with an agent of its own.
async fn split_case(
    client: &Client,
    ns: &str,
    i: usize,
    case: Split,
    nodes: &[String],
    sim: &crate::support::kubelet::Kubelet,
) {
    let repo = config_repo(ns);
    // 1.13.3 is revoked from the start (only the un-revoke case lifts it).
    edit(&repo, "drover.toml", |t| {
        t.replace(
            "evidence = \"status\"",
            "evidence = \"status\"\nrevoked = [{ version = \"1.13.3\", reason = \"panics\" }]",
        )
    });
    commit(&repo, "1.13.3 panics");
    repo.push();
    let name = format!("split-{i}");
    let clock = VirtualClock::new(open());
    let (agent, adopted) =
        start_adopted(client, &repo, ns, &name, &clock, nodes.len() as u32).await;
    (case.before)(&repo);

    // Two signed commits, pushed at once: the policy half, then the bump.
    (case.policy)(&repo);
    commit(&repo, &format!("{}: the policy half", case.name));
    pin(&repo, case.version);
    let bump = commit(&repo, &format!("production: {}", case.version));
    repo.push();
    assert_eq!(agent.webhook().await, 202);
    let st = await_status(client, ns, &name, case.name, |s| {
        s.refused.as_ref().is_some_and(|r| r.commit == bump)
    })
    .await
    .status
    .unwrap();
    let r = st.refused.clone().unwrap();
    assert_eq!(
        (r.stage.as_str(), r.reason.as_str()),
        ("gate", "policy_and_version"),
        "{}: {}",
        case.name,
        r.message
    );
    assert!(
        r.message.contains(case.edits),
        "{}: {}",
        case.name,
        r.message
    );
    assert_eq!(st.state.as_deref(), Some("refused"), "{}", case.name);
    assert!(
        st.message.contains("policy_and_version"),
        "{}: kubectl get dst -o wide shows {:?}",
        case.name,
        st.message
    );
    assert_eq!(
        st.last_applied_commit.as_deref(),
        Some(adopted.as_str()),
        "{}",
        case.name
    );
    until_pass(
        &agent.handle,
        "refusal reported",
        Duration::from_secs(60),
        || {
            repo.report("production", "prod-1").is_some_and(|rep| {
                rep.state == RolloutState::Refused
                    && rep.config_commit == adopted
                    && rep.message.contains("policy_and_version")
            })
        },
    )
    .await;
    let events = events_for(client, ns, &name).await;
    let refused: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Refused"))
        .collect();
    assert_eq!(refused.len(), 1, "{}: {events:#?}", case.name);
    assert!(
        refused[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("policy_and_version") && n.contains(case.edits)),
        "{}: {:?}",
        case.name,
        refused[0].note
    );
    for n in nodes {
        assert_eq!(sim.upgrades_started(n), 0, "{}: {n} touched", case.name);
    }

    // Control, with the window closed: the bump taken back, the policy half
    // alone is applied; the bump pushed again is judged by that policy.
    clock.set(closed());
    let text =
        std::fs::read_to_string(repo.dir.path().join("work/environments/production.toml")).unwrap();
    pin(&repo, "1.12.0");
    let fix = commit(&repo, "production: back to 1.12.0");
    repo.push();
    assert_eq!(agent.webhook().await, 202);
    await_applied(
        client,
        ns,
        &name,
        &format!("{}: the policy half", case.name),
        &fix,
    )
    .await;
    std::fs::write(repo.work.join("environments/production.toml"), text).unwrap();
    let again = commit(&repo, &format!("production: {} again", case.version));
    repo.push();
    assert_eq!(agent.webhook().await, 202);
    await_applied(
        client,
        ns,
        &name,
        &format!("{}: the bump alone", case.name),
        &again,
    )
    .await;
    agent.stop();
}

#[tokio::test]
async fn split_pushes_are_one_change_and_their_halves_pushed_apart_are_applied() {
    crate::support::kube::init_tracing();
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "split").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let nodes = sim.node_names();
    // The five cases at once: each has its repository, git server and agent.
    let cases = splits()
        .into_iter()
        .enumerate()
        .map(|(i, c)| split_case(&client, ns.name(), i, c, &nodes, &sim));
    futures::future::join_all(cases).await;
    for n in &nodes {
        assert_eq!(sim.upgrades_started(n), 0);
        assert_eq!(sim.version(n).as_deref(), Some("1.12.0"));
    }
    sim.shutdown().await;
}

async fn annotate(client: &Client, ns: &str, name: &str, value: &str) {
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({
        "metadata": { "annotations": { "drover.dev/trust-commit": value } }
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Annotate, and wait for the refusal of `commit` for `reason`.
async fn refused_annotation(
    client: &Client,
    agent: &RunningAgent,
    ns: &str,
    value: &str,
    commit: &str,
    reason: &str,
) -> DroverStatusStatus {
    annotate(client, ns, "trust", value).await;
    agent.handle.reconcile();
    let st = await_status(client, ns, "trust", &format!("{value} refused"), |s| {
        s.refused
            .as_ref()
            .is_some_and(|r| r.commit == commit && r.reason == reason)
    })
    .await
    .status
    .unwrap();
    assert!(st.last_applied_commit.is_none(), "{value}: {st:?}");
    st
}

#[tokio::test]
async fn the_trust_annotation_takes_a_signed_commit_of_the_branch_and_the_gate_still_judges() {
    crate::support::kube::init_tracing();
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "trust-commit").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let repo = config_repo(ns.name());
    let first = git(&repo.work, &["rev-parse", "HEAD"]);
    // Off the branch: a signed commit of a pull request never merged, which
    // the agent's cache holds because it sits under a status branch name.
    git(&repo.work, &["switch", "-q", "-c", "unmerged"]);
    pin(&repo, "9.9.9");
    let off = commit(&repo, "production: 9.9.9 (never merged)");
    git(
        &repo.work,
        &[
            "push",
            "-q",
            repo.bare.to_str().unwrap(),
            "unmerged:refs/heads/drover/status.d/production/unmerged",
        ],
    );
    git(&repo.work, &["switch", "-q", "main"]);
    // An unsigned commit on the branch (pushed past review; no policy in
    // it), then a signed bump.
    edit(&repo, "environments/production.toml", |t| {
        t.replace("duration = \"6h\"", "duration = \"7h\"")
    });
    let unsigned = commit_all(&repo.work, "production: a longer window", None, None);
    pin(&repo, "1.13.0");
    let head = commit(&repo, "production: 1.13.0");
    repo.push();

    // verify = head: only the named commit's own signature matters here.
    let mut cfg = agent_config(&repo, "production", "prod-1", ns.name(), "trust");
    cfg.status_name = "trust".into();
    cfg.lease_name = "trust".into();
    cfg.verify = drover::trust::Mode::Head;
    let clock = VirtualClock::new(open());
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    await_status(&client, ns.name(), "trust", "no trusted state", |s| {
        s.refused
            .as_ref()
            .is_some_and(|r| r.reason == "no_trusted_state")
    })
    .await;

    // A revspec, even one naming the right commit: refused, it would follow
    // whatever the repository says.
    for revspec in ["HEAD", "main~2", &head[..12]] {
        let st =
            refused_annotation(&client, &agent, ns.name(), revspec, revspec, "trust_commit").await;
        assert!(
            st.refused
                .unwrap()
                .message
                .contains("full 40-hex object id"),
            "{revspec}"
        );
    }
    // A signed commit off the branch.
    let st = refused_annotation(&client, &agent, ns.name(), &off, &off, "trust_commit").await;
    // (Its ref names no cluster the config lists: it is not even fetched.)
    let m = st.refused.unwrap().message;
    assert!(
        m.contains("which is not on main") || m.contains("not a commit of the fetched repository"),
        "off the branch: {m}"
    );
    // The signed head itself: trusted, and still judged by the gate (stage
    // never confirmed 1.13.0); the nodes run 1.12.0, so it would move them.
    let st = refused_annotation(&client, &agent, ns.name(), &head, &head, "not_confirmed").await;
    assert_eq!(st.refused.unwrap().stage, "gate");
    assert_eq!(sim.upgrades_started(&node), 0);

    // Control: a commit of the branch, unsigned (a person's word trusts it
    // and its ancestors as they are), whose version every node runs, is the
    // starting point and the annotation is used up; the head after it is
    // verified and judged over it, and applied once stage's signed
    // confirmation arrives.
    let _ = first;
    annotate(&client, ns.name(), "trust", &unsigned).await;
    agent.handle.reconcile();
    let st = await_status(&client, ns.name(), "trust", "named commit trusted", |s| {
        s.last_applied_commit.as_deref() == Some(unsigned.as_str())
            && s.refused.as_ref().is_some_and(|r| r.commit == head)
    })
    .await
    .status
    .unwrap();
    assert_eq!(st.refused.unwrap().reason, "not_confirmed");
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns.name());
    crate::support::kube::retry_until("the annotation used up", || async {
        let o = api.get("trust").await.map_err(|e| e.to_string())?;
        match o
            .metadata
            .annotations
            .and_then(|a| a.get("drover.dev/trust-commit").cloned())
        {
            None => Ok(()),
            Some(v) => Err(v),
        }
    })
    .await;
    let k = repo.report_keys["stage-1"].clone();
    push_report(&repo, "stage-1", "1.13.0", "confirmed", OLD, Some(&k));
    assert_eq!(agent.webhook().await, 202);
    await_applied(&client, ns.name(), "trust", "head applied", &head).await;
    agent.stop();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_soak_refusal_is_kept_as_state_over_twenty_passes() {
    crate::support::kube::init_tracing();
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "kept").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let repo = config_repo(ns.name());
    let clock = VirtualClock::new(open());
    let (agent, _) = start_adopted(&client, &repo, ns.name(), "kept", &clock, 1).await;
    let k = repo.report_keys["stage-1"].clone();
    push_report(&repo, "stage-1", "1.13.0", "confirmed", RECENT, Some(&k));
    let judged =
        || async { sample(&agent.metrics().await, "drover_admissions_total").unwrap_or(0.0) };
    let before = judged().await;
    let bump = repo.bump("production", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
    let st = await_status(&client, ns.name(), "kept", "soaking", |s| {
        s.refused
            .as_ref()
            .is_some_and(|r| r.commit == bump && r.reason == "soaking")
            && s.state.as_deref() == Some("refused")
    })
    .await
    .status
    .unwrap();
    let since = st.since.clone();
    assert!(since.is_some());
    assert_eq!(judged().await, before + 1.0, "judged once");

    let mut passes = agent.handle.subscribe();
    for _ in 0..20 {
        agent.handle.reconcile();
        tokio::time::timeout(WAIT_PASS, passes.recv())
            .await
            .expect("a pass")
            .expect("the agent runs");
    }
    let st = crate::agent_evidence::status_of(&client, ns.name(), "kept").await;
    assert_eq!(st.since, since, "since unchanged");
    assert_eq!(st.state.as_deref(), Some("refused"));
    assert_eq!(
        judged().await,
        before + 1.0,
        "the gate read once over 20 passes"
    );
    let refused: Vec<_> = events_for(&client, ns.name(), "kept")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Refused"))
        .collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(refused[0].series.is_none(), "{:?}", refused[0].series);

    // The kept verdict ends when the soak passes: judged again, applied.
    clock.set(dec(21, 3, 0));
    agent.handle.reconcile();
    await_applied(&client, ns.name(), "kept", "soak passed", &bump).await;
    assert_eq!(judged().await, before + 2.0);
    agent.stop();
    sim.shutdown().await;
}

/// How long one asked-for pass may take.
const WAIT_PASS: Duration = Duration::from_secs(30);
