//! The forgery table through the agent, against the real API server and
//! simulated kubelet nodes (tests/offline/admit_forgery.rs runs the same table
//! through `drover check --base`): each forgery leaves every node untouched
//! and the agent reports `refused` with the reason; each control is applied.
//! Also the state that survives: recovery from the agent's own signed
//! reports after its DroverStatus object is deleted, a restart on an empty
//! cache mid-rollout, and adoption of a cluster already at its pin.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim, POOL_LABEL};
use crate::support::git::{commit_all, commit_file_on, keygen};
use crate::support::kube::{await_gone, ControlPlane, TestNamespace};
use drover::agent::crd::{DroverStatus, DroverStatusStatus};
use drover::rollout::RolloutState;
use drover::rollout::VirtualClock;
use kube::api::{Api, DeleteParams};
use kube::Client;

/// Long enough before the production window (Dec 20) for a 24h soak.
pub(crate) const OLD: &str = "2026-12-10T12:00:00Z";
/// Younger than the soak at the agent's clock.
pub(crate) const RECENT: &str = "2026-12-20T02:30:00Z";

pub(crate) fn spec(env: &str, cluster: &str, pool: &str) -> EnvSpec {
    EnvSpec {
        env: env.into(),
        cluster: cluster.into(),
        version: "1.12.0".into(),
        // Production's window is open on the agent's clock; the others have no agent.
        schedule: "0 2 20 * *".into(),
        selector: format!("{POOL_LABEL}={pool}"),
        soak: "24h".into(),
    }
}

pub(crate) fn config_repo(pool: &str) -> ConfigRepo {
    ConfigRepo::new(&[
        spec("test", "test-1", "none"),
        spec("stage", "stage-1", "none"),
        spec("production", "prod-1", pool),
    ])
}

pub(crate) fn report_text(
    env: &str,
    cluster: &str,
    version: &str,
    state: &str,
    since: &str,
) -> String {
    format!(
        "env = \"{env}\"\ncluster = \"{cluster}\"\nconfig_commit = \"abc\"\nversion = \"{version}\"\nstate = \"{state}\"\nsince = {since}\nnodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"
    )
}

/// One commit on the served `drover/status` writing a report for
/// `stage/<cluster>`, signed with `key` (unsigned with `None`), dated `since`.
pub(crate) fn push_report(
    repo: &ConfigRepo,
    cluster: &str,
    version: &str,
    state: &str,
    since: &str,
    key: Option<&Path>,
) {
    let report = report_text("stage", cluster, version, state, since);
    commit_file_on(
        &repo.bare,
        "drover/status",
        &format!("status/stage/{cluster}.toml"),
        Some(report.as_bytes()),
        key,
        "status",
        Some(since),
    );
}

/// Rewrite a file of the work tree.
pub(crate) fn edit(repo: &ConfigRepo, path: &str, f: impl FnOnce(String) -> String) {
    let p = repo.work.join(path);
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, f(text)).unwrap();
}

/// A signed commit of the work tree dated `date`.
fn commit_dated(repo: &ConfigRepo, msg: &str, date: &str) -> String {
    commit_all(&repo.work, msg, Some(&repo.key), Some(date))
}

fn set_version(text: String, version: &str) -> String {
    text.replacen(
        "version = \"1.12.0\"",
        &format!("version = \"{version}\""),
        1,
    )
}

/// Makes a case's change in the repository; returns the head to judge.
type Setup = fn(&ConfigRepo) -> String;

struct Case {
    name: &'static str,
    /// A reviewed change the agent applies before the forgery arrives.
    first: Option<Setup>,
    setup: Setup,
    reason: &'static str,
    says: &'static str,
}

fn bump_production(repo: &ConfigRepo) -> String {
    repo.bump("production", "1.13.0", true)
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "unsigned report",
            first: None,
            setup: |r| {
                push_report(r, "stage-1", "1.13.0", "confirmed", OLD, None);
                bump_production(r)
            },
            // The branch holding the report does not count: stage is held.
            reason: "evidence_held",
            says: "unsigned",
        },
        Case {
            name: "stage/stage-1 report signed by test/test-1's key",
            first: None,
            setup: |r| {
                push_report(
                    r,
                    "stage-1",
                    "1.13.0",
                    "confirmed",
                    OLD,
                    Some(&r.report_keys["test-1"]),
                );
                bump_production(r)
            },
            // The branch holding the report does not count: stage is held.
            reason: "evidence_held",
            says: "signed by test/test-1's key",
        },
        Case {
            name: "key not in report_signers",
            first: None,
            setup: |r| {
                let rogue = keygen(r.dir.path(), "rogue");
                push_report(r, "stage-1", "1.13.0", "confirmed", OLD, Some(&rogue));
                bump_production(r)
            },
            // The branch holding the report does not count: stage is held.
            reason: "evidence_held",
            says: "not listed for stage/stage-1",
        },
        Case {
            name: "key added in the change being judged",
            first: None,
            setup: |r| {
                let rogue = keygen(r.dir.path(), "rogue");
                push_report(r, "stage-1", "1.13.0", "confirmed", OLD, Some(&rogue));
                let public = std::fs::read_to_string(format!("{}.pub", rogue.display())).unwrap();
                edit(r, "agents.allowed_signers", |t| {
                    format!("{t}stage/stage-1 namespaces=\"git\" {public}")
                });
                edit(r, "environments/production.toml", |t| {
                    set_version(t, "1.13.0")
                });
                let c = r.commit("production: 1.13.0, with a new key for stage-1", true);
                r.push();
                c
            },
            reason: "policy_and_version",
            says: "the keys in agents.allowed_signers",
        },
        Case {
            name: "confirmation withdrawn by a later failed",
            first: None,
            setup: |r| {
                let k = r.report_keys["stage-1"].clone();
                push_report(r, "stage-1", "1.13.0", "confirmed", OLD, Some(&k));
                push_report(
                    r,
                    "stage-1",
                    "1.13.0",
                    "failed",
                    "2026-12-11T12:00:00Z",
                    Some(&k),
                );
                bump_production(r)
            },
            reason: "not_confirmed",
            says: "withdrawn by a later `failed` report",
        },
        Case {
            name: "confirmation younger than the soak",
            first: None,
            setup: |r| {
                let k = r.report_keys["stage-1"].clone();
                push_report(r, "stage-1", "1.13.0", "confirmed", RECENT, Some(&k));
                bump_production(r)
            },
            reason: "soaking",
            says: "soak of 24h",
        },
        Case {
            name: "chain reordered with a bump",
            first: None,
            setup: |r| {
                edit(r, "drover.toml", |t| {
                    t.replace(
                        "chain = [\"test\", \"stage\", \"production\"]",
                        "chain = [\"production\", \"test\", \"stage\"]",
                    )
                });
                edit(r, "environments/production.toml", |t| {
                    set_version(t, "1.13.0")
                });
                let c = r.commit("production first", true);
                r.push();
                c
            },
            reason: "policy_and_version",
            says: "(chain)",
        },
        Case {
            name: "status_branch pointed at the change",
            first: None,
            setup: |r| {
                edit(r, "drover.toml", |t| {
                    t.replace(
                        "evidence = \"status\"",
                        "evidence = \"status\"\nstatus_branch = \"forged\"",
                    )
                });
                std::fs::create_dir_all(r.work.join("status/stage")).unwrap();
                std::fs::write(
                    r.work.join("status/stage/stage-1.toml"),
                    report_text("stage", "stage-1", "1.13.0", "confirmed", OLD),
                )
                .unwrap();
                edit(r, "environments/production.toml", |t| {
                    set_version(t, "1.13.0")
                });
                let c = r.commit("status on the change's own branch", true);
                r.push();
                crate::support::git::git(
                    &r.work,
                    &["push", "-q", r.bare.to_str().unwrap(), "main:forged"],
                );
                c
            },
            reason: "policy_and_version",
            says: "(status_branch)",
        },
        Case {
            name: "backdated history inside the change",
            first: Some(|r| {
                edit(r, "drover.toml", |t| {
                    t.replace("evidence = \"status\"", "evidence = \"history\"")
                });
                let c = commit_dated(r, "history evidence", "2026-12-19T00:00:00Z");
                r.push();
                c
            }),
            setup: |r| {
                edit(r, "environments/test.toml", |t| set_version(t, "1.13.0"));
                commit_dated(r, "test 1.13.0", "2026-11-02T00:00:00Z");
                edit(r, "environments/stage.toml", |t| set_version(t, "1.13.0"));
                commit_dated(r, "stage 1.13.0", "2026-11-03T00:00:00Z");
                edit(r, "environments/production.toml", |t| {
                    set_version(t, "1.13.0")
                });
                let c = commit_dated(r, "production 1.13.0", "2026-12-19T01:00:00Z");
                r.push();
                c
            },
            reason: "lower_not_at_version",
            says: "stage is configured at 1.12.0",
        },
        Case {
            name: "stale allow_downgrade",
            // The flag set by an earlier change, applied on its own (set in
            // the same push as the downgrade, it would be the change's own).
            first: Some(|r| {
                edit(r, "environments/production.toml", |t| {
                    t.replacen(
                        "version = \"1.12.0\"",
                        "version = \"1.12.0\"\nallow_downgrade = true",
                        1,
                    )
                });
                let c = r.commit("production may go down", true);
                r.push();
                c
            }),
            setup: |r| {
                let k = r.report_keys["stage-1"].clone();
                push_report(r, "stage-1", "1.0.0", "confirmed", OLD, Some(&k));
                edit(r, "environments/production.toml", |t| {
                    t.replacen("version = \"1.12.0\"", "version = \"1.0.0\"", 1)
                });
                let c = r.commit("production down to 1.0.0", true);
                r.push();
                c
            },
            reason: "downgrade",
            says: "may not go down from 1.12.0 to 1.0.0",
        },
    ]
}

pub(crate) async fn status_of(client: &Client, ns: &str, name: &str) -> DroverStatusStatus {
    Api::<DroverStatus>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// Start a production agent for `repo` on `clock`, named `name`; wait until it adopted the cluster.
pub(crate) async fn start_adopted(
    client: &Client,
    repo: &ConfigRepo,
    ns: &str,
    name: &str,
    clock: &VirtualClock,
    nodes: u32,
) -> (RunningAgent, String) {
    let mut cfg = agent_config(repo, "production", "prod-1", ns, name);
    cfg.status_name = name.into();
    cfg.lease_name = name.into();
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    // Adoption: production pins 1.12.0, which its nodes run and stage never
    // confirmed; nothing moves, so no gate applies.
    let st = await_adopted(client, ns, name).await.status.unwrap();
    assert_eq!(st.nodes, nodes, "the true node count");
    assert!(st.window_open, "the true window state");
    assert!(st.refused.is_none(), "{:?}", st.refused);
    until_pass(
        &agent.handle,
        "adoption reported",
        Duration::from_secs(60),
        || {
            repo.report("production", "prod-1").is_some_and(|r| {
                r.state == RolloutState::Confirmed && r.version.to_string() == "1.12.0"
            })
        },
    )
    .await;
    (agent, st.last_applied_commit.unwrap())
}

#[tokio::test]
async fn forgeries_are_refused_by_the_agent_and_controls_are_applied() {
    crate::support::kube::init_tracing();
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "evidence").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    // Inside production's window: only admission stands between a push and the nodes.
    let open = VirtualClock::new(dec(20, 3, 0));

    for (i, case) in cases().into_iter().enumerate() {
        let repo = config_repo(ns.name());
        let name = format!("forgery-{i}");
        let (agent, mut adopted) = start_adopted(&client, &repo, ns.name(), &name, &open, 2).await;
        if let Some(first) = case.first {
            let c = first(&repo);
            assert_eq!(agent.webhook().await, 202);
            await_status(
                &client,
                ns.name(),
                &name,
                "the earlier change applied",
                |s| s.last_applied_commit.as_deref() == Some(c.as_str()),
            )
            .await;
            adopted = c;
        }
        let head = (case.setup)(&repo);
        assert_eq!(agent.webhook().await, 202);
        let st = await_status(&client, ns.name(), &name, case.name, |s| {
            s.refused.as_ref().is_some_and(|r| r.commit == head)
        })
        .await
        .status
        .unwrap();
        let r = st.refused.clone().unwrap();
        assert_eq!(
            (r.stage.as_str(), r.reason.as_str()),
            ("gate", case.reason),
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
        assert_eq!(
            st.last_applied_commit.as_deref(),
            Some(adopted.as_str()),
            "{}",
            case.name
        );
        assert_eq!(st.state.as_deref(), Some("refused"), "{}", case.name);
        until_pass(
            &agent.handle,
            "refused reported",
            Duration::from_secs(60),
            || {
                repo.report("production", "prod-1").is_some_and(|rep| {
                    rep.state == RolloutState::Refused
                        && rep.config_commit == adopted
                        && rep.message.contains(case.reason)
                })
            },
        )
        .await;
        for n in sim.node_names() {
            assert_eq!(sim.upgrades_started(&n), 0, "{}: {n} touched", case.name);
            assert_eq!(sim.version(&n).as_deref(), Some("1.12.0"));
        }
        agent.stop();
    }

    // Controls, with the window closed so that an accepted change moves no node.
    let closed = VirtualClock::new(dec(21, 12, 0));
    let controls: Vec<(&str, Setup)> = vec![
        ("a policy change alone", |r| {
            edit(r, "drover.toml", |t| {
                t.replace(
                    "evidence = \"status\"",
                    "evidence = \"status\"\nstatus_branch = \"fleet/status\"",
                )
            });
            let c = r.commit("report to fleet/status", true);
            r.push();
            c
        }),
        ("a downgrade that sets the flag in its change", |r| {
            let k = r.report_keys["stage-1"].clone();
            push_report(r, "stage-1", "1.0.0", "confirmed", OLD, Some(&k));
            edit(r, "environments/production.toml", |t| {
                t.replacen(
                    "version = \"1.12.0\"",
                    "version = \"1.0.0\"\nallow_downgrade = true",
                    1,
                )
            });
            let c = r.commit("production down to 1.0.0", true);
            r.push();
            c
        }),
    ];
    for (i, (what, setup)) in controls.into_iter().enumerate() {
        let repo = config_repo(ns.name());
        let name = format!("control-{i}");
        let mut cfg = agent_config(&repo, "production", "prod-1", ns.name(), &name);
        cfg.status_name = name.clone();
        cfg.lease_name = name.clone();
        let agent = RunningAgent::start(cfg, Arc::new(closed.clone()), None);
        await_status(&client, ns.name(), &name, "adopted", |s| {
            s.last_applied_commit.is_some()
        })
        .await;
        let head = setup(&repo);
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

    // The last control moves the nodes: a properly signed, soaked confirmation.
    // Mid-rollout the agent restarts on an empty cache, and resumes.
    let repo = config_repo(ns.name());
    let (agent, _) = start_adopted(&client, &repo, ns.name(), "control-signed", &open, 2).await;
    let k = repo.report_keys["stage-1"].clone();
    push_report(&repo, "stage-1", "1.13.0", "confirmed", OLD, Some(&k));
    let head = bump_production(&repo);
    assert_eq!(agent.webhook().await, 202);
    await_status(&client, ns.name(), "control-signed", "rolling", |s| {
        s.last_applied_commit.as_deref() == Some(head.as_str())
            && s.state.as_deref() == Some("rolling")
    })
    .await;
    agent.kill();
    let mut cfg = agent_config(&repo, "production", "prod-1", ns.name(), "control-signed-2");
    cfg.status_name = "control-signed".into();
    cfg.lease_name = "control-signed".into();
    cfg.lease_duration = Duration::from_secs(1);
    let again = RunningAgent::start(cfg, Arc::new(open.clone()), None);
    let st = await_status(
        &client,
        ns.name(),
        "control-signed",
        "resumed and confirmed",
        |s| s.state.as_deref() == Some("confirmed") && s.target.as_deref() == Some("1.13.0"),
    )
    .await
    .status
    .unwrap();
    assert_eq!(st.at_version.as_deref(), Some("2/2"));
    assert_eq!(st.reporter.as_deref(), Some("control-signed-2"));
    for n in sim.node_names() {
        assert_eq!(sim.version(&n).as_deref(), Some("1.13.0"));
        assert_eq!(sim.upgrades_started(&n), 1, "{n} upgraded once");
    }
    again.stop();
    sim.shutdown().await;
}

#[tokio::test]
async fn lost_status_object_then_a_force_push_to_an_older_commit_is_refused() {
    crate::support::kube::init_tracing();
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "recover").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    // Window closed: no node would move either way; admission is what is tested.
    let clock = VirtualClock::new(dec(21, 12, 0));
    let repo = config_repo(ns.name());
    let mut cfg = agent_config(&repo, "production", "prod-1", ns.name(), "recover-a");
    cfg.status_name = "recover".into();
    cfg.lease_name = "recover".into();
    let agent = RunningAgent::start(cfg.clone(), Arc::new(clock.clone()), None);
    let first = await_status(&client, ns.name(), "recover", "adopted", |s| {
        s.last_applied_commit.is_some()
    })
    .await
    .status
    .unwrap()
    .last_applied_commit
    .unwrap();
    // A newer reviewed commit is applied and reported.
    edit(&repo, "environments/production.toml", |t| {
        t.replace("soak = \"24h\"", "soak = \"48h\"")
    });
    let newer = repo.commit("production: longer soak", true);
    repo.push();
    agent.webhook().await;
    until_pass(
        &agent.handle,
        "newer commit reported",
        Duration::from_secs(60),
        || {
            repo.report("production", "prod-1")
                .is_some_and(|r| r.config_commit == newer)
        },
    )
    .await;
    agent.stop();

    // The status object is lost and main is force-pushed back to the older commit.
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns.name());
    api.delete("recover", &DeleteParams::default())
        .await
        .unwrap();
    await_gone(&api, "recover").await;
    crate::support::git::git(
        &repo.work,
        &[
            "push",
            "-q",
            "-f",
            repo.bare.to_str().unwrap(),
            &format!("{first}:main"),
        ],
    );
    // A new pod, empty cache: it recovers `newer` from its own signed report.
    cfg.identity = "recover-b".into();
    cfg.source.cache_dir = repo.dir.path().join("cache-recover-b");
    let again = RunningAgent::start(cfg, Arc::new(clock), None);
    let st = await_status(&client, ns.name(), "recover", "rollback refused", |s| {
        s.refused.is_some()
    })
    .await
    .status
    .unwrap();
    let r = st.refused.unwrap();
    assert_eq!(
        (r.stage.as_str(), r.reason.as_str()),
        ("trust", "not_descendant"),
        "{}",
        r.message
    );
    assert_eq!(r.commit, first);
    assert_eq!(st.last_applied_commit.as_deref(), Some(newer.as_str()));
    for n in sim.node_names() {
        assert_eq!(sim.upgrades_started(&n), 0);
    }
    again.stop();
    sim.shutdown().await;
}

#[tokio::test]
async fn without_any_trusted_state_nothing_is_applied_until_a_person_confirms() {
    crate::support::kube::init_tracing();
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "notrust").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let clock = VirtualClock::new(dec(20, 3, 0));
    let repo = config_repo(ns.name());
    // The nodes run 1.12.0, the config pins 1.13.0, and nothing says which commit to trust.
    let head = bump_production(&repo);
    let mut cfg = agent_config(&repo, "production", "prod-1", ns.name(), "notrust");
    cfg.status_name = "notrust".into();
    cfg.lease_name = "notrust".into();
    let agent = RunningAgent::start(cfg, Arc::new(clock), None);
    let st = await_status(&client, ns.name(), "notrust", "no trusted state", |s| {
        s.refused
            .as_ref()
            .is_some_and(|r| r.reason == "no_trusted_state")
    })
    .await
    .status
    .unwrap();
    let msg = st.refused.unwrap().message;
    assert!(
        msg.contains(&format!(
            "kubectl -n {} annotate droverstatus notrust drover.dev/trust-commit=<full commit id>",
            ns.name()
        )),
        "{msg}"
    );
    assert!(msg.contains(&head), "{msg}");
    assert!(st.last_applied_commit.is_none());
    for n in sim.node_names() {
        assert_eq!(sim.upgrades_started(&n), 0);
    }
    assert!(status_of(&client, ns.name(), "notrust")
        .await
        .last_applied_commit
        .is_none());

    // A person confirms the head as the message says: the commit is trusted,
    // and still judged by the gate (stage has not confirmed 1.13.0).
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), ns.name());
    let patch = serde_json::json!({
        "metadata": { "annotations": { "drover.dev/trust-commit": head } }
    });
    api.patch(
        "notrust",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    agent.handle.reconcile();
    let st = await_status(&client, ns.name(), "notrust", "gate refuses", |s| {
        s.refused
            .as_ref()
            .is_some_and(|r| r.commit == head && r.reason == "not_confirmed")
    })
    .await
    .status
    .unwrap();
    assert!(st.last_applied_commit.is_none());
    // Stage's signed confirmation arrives: the head is applied and rolled.
    let k = repo.report_keys["stage-1"].clone();
    push_report(&repo, "stage-1", "1.13.0", "confirmed", OLD, Some(&k));
    assert_eq!(agent.webhook().await, 202);
    let st = await_status(
        &client,
        ns.name(),
        "notrust",
        "confirmed by a person",
        |s| {
            s.last_applied_commit.as_deref() == Some(head.as_str())
                && s.state.as_deref() == Some("confirmed")
                && s.target.as_deref() == Some("1.13.0")
        },
    )
    .await
    .status
    .unwrap();
    assert!(st.refused.is_none(), "{:?}", st.refused);
    agent.stop();
    sim.shutdown().await;
}
