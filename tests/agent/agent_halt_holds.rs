//! Missing evidence holds; it never opens (docs/design.md §4a), through
//! the agent against the real API server. One world: production's two
//! clusters, `prod-1` (no agent: its reports stand in for it, signed with
//! its key) and `prod-2` (an agent on a pool of simulated nodes, inside its
//! window); `test` below, which confirmed 1.13.0. prod-1 reports a signed
//! `failed` for 1.13.0, production is bumped to it, and prod-2 is halted.
//!
//! Each attack below lifted the halt before (prod-2 then moved nodes to
//! 1.13.0); each must leave prod-2 halted, no node started, with the
//! reason in its `DroverStatus` (state, condition reason, `evidenceHeld`),
//! its signed status report and `drover status`:
//! - an unsigned fast-forward commit on prod-1's branch;
//! - the single branch `drover/status` of the older layout, created with a
//!   commit that writes two files;
//! - 10,001 branch names under `drover/status.d/`;
//! - a routine bump of `test`, merged after the failure;
//! - a config commit dated in the future;
//! - prod-1's branch deleted, and prod-2's agent restarted on a fresh cache
//!   (the agent remembers the failures it has seen).
//!
//! The control: prod-1's own later signed report of 1.13.0 (its node
//! retried) ends the halt, and prod-2 starts a node.
//!
//! `DROVER_HALT_ONLY=<n>` runs only attack n (0-based), to see one fail alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim, POOL_LABEL};
use crate::support::cli::drover_at;
use crate::support::git::{allowed_signers, commit_all, commit_file_on, git, keygen};
use crate::support::kube::{ControlPlane, TestNamespace};
use drover::agent::crd::DroverStatusStatus;
use drover::rollout::{RolloutState, VirtualClock};

const FAILED_AT: &str = "2026-12-20T02:30:00Z";
const PROD_1: &str = "drover/status.d/production/prod-1";

/// test (test-1) and production (prod-1, and prod-2 on `pool`), each
/// cluster with its report key.
fn world(pool: &str) -> ConfigRepo {
    let repo = ConfigRepo::new(&[
        EnvSpec {
            env: "test".into(),
            cluster: "test-1".into(),
            version: "1.12.0".into(),
            schedule: "0 2 1 * *".into(),
            selector: format!("{POOL_LABEL}=nowhere"),
            soak: "0s".into(),
        },
        EnvSpec {
            env: "production".into(),
            cluster: "prod-2".into(),
            version: "1.12.0".into(),
            schedule: "0 2 20 * *".into(),
            selector: format!("{POOL_LABEL}={pool}"),
            soak: "0s".into(),
        },
    ]);
    let k = keygen(repo.dir.path(), "report-prod-1");
    let mut keys: Vec<(String, PathBuf)> = repo
        .report_keys
        .iter()
        .map(|(c, k)| {
            let env = if c == "test-1" { "test" } else { "production" };
            (format!("{env}/{c}"), k.clone())
        })
        .collect();
    keys.push(("production/prod-1".into(), k));
    let entries: Vec<(&str, &Path)> = keys
        .iter()
        .map(|(p, k)| (p.as_str(), k.as_path()))
        .collect();
    allowed_signers(&repo.work.join("agents.allowed_signers"), &entries);
    let root = std::fs::read_to_string(repo.work.join("drover.toml")).unwrap();
    std::fs::write(
        repo.work.join("drover.toml"),
        root.replace(
            "production = [\"prod-2\"]",
            "production = [\"prod-1\", \"prod-2\"]",
        ),
    )
    .unwrap();
    repo.commit("production has two clusters", true);
    repo.push();
    repo
}

fn prod_1_key(repo: &ConfigRepo) -> PathBuf {
    repo.dir.path().join("report-prod-1")
}

/// A report of `env`/`cluster` on its branch of the served repository,
/// signed with `key` (unsigned with `None`), committed at `at`.
fn report(
    repo: &ConfigRepo,
    (env, cluster): (&str, &str),
    (version, state, message): (&str, &str, &str),
    at: &str,
    key: Option<&Path>,
) -> String {
    let text = format!(
        "env = \"{env}\"\ncluster = \"{cluster}\"\nconfig_commit = \"abc\"\nversion = \"{version}\"\n\
         state = \"{state}\"\nsince = {at}\nnodes = 3\nnodes_at_version = 1\nmessage = \"{message}\"\n"
    );
    commit_file_on(
        &repo.bare,
        &format!("drover/status.d/{env}/{cluster}"),
        &format!("status/{env}/{cluster}.toml"),
        Some(text.as_bytes()),
        key,
        "status",
        Some(at),
    )
}

fn set_ref(repo: &ConfigRepo, branch: &str, commit: Option<&str>) {
    let name = format!("refs/heads/{branch}");
    match commit {
        Some(c) => git(&repo.bare, &["update-ref", &name, c]),
        None => git(&repo.bare, &["update-ref", "-d", &name]),
    };
}

/// `drover status -o json` in the work tree, with the served status branches fetched.
fn drover_status(repo: &ConfigRepo) -> serde_json::Value {
    let bare = repo.bare.to_str().unwrap();
    git(
        &repo.work,
        &[
            "fetch",
            "-q",
            "--prune",
            bare,
            "+refs/heads/drover/*:refs/remotes/origin/drover/*",
        ],
    );
    let (code, out, err) = drover_at(
        &repo.work,
        &["-o", "json", "status", "--now", "2026-12-20T03:00:00Z"],
    );
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn prod_2(v: &serde_json::Value) -> serde_json::Value {
    let production = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "production")
        .unwrap();
    production["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "prod-2")
        .unwrap()
        .clone()
}

fn reason(s: &DroverStatusStatus) -> &str {
    s.conditions
        .iter()
        .find(|c| c.kind == "Stalled")
        .map_or("", |c| c.reason.as_str())
}

/// One attack: what it does to the served repository, what prod-2's
/// status must then say it is held by (`None`: halted by the failure
/// alone), and how to undo it.
struct Attack {
    name: &'static str,
    run: Box<dyn Fn(&ConfigRepo)>,
    held_by: Option<&'static str>,
    undo: Box<dyn Fn(&ConfigRepo)>,
}

fn attacks(failed: String) -> Vec<Attack> {
    let restore = failed.clone();
    vec![
        Attack {
            name: "an unsigned fast-forward commit on prod-1's branch",
            run: Box::new(|r| {
                // A `rolling` report of 1.13.0 would end prod-1's failure, if it counted.
                report(
                    r,
                    ("production", "prod-1"),
                    ("1.13.0", "rolling", ""),
                    "2026-12-20T02:40:00Z",
                    None,
                );
            }),
            held_by: Some(PROD_1),
            undo: Box::new(move |r| set_ref(r, PROD_1, Some(&restore))),
        },
        Attack {
            name: "the single branch drover/status, one commit writing two files",
            run: Box::new(|r| {
                let scratch = tempfile::tempdir().unwrap();
                let index = scratch.path().join("index");
                let env = [("GIT_INDEX_FILE", index.to_str().unwrap())];
                let text = |c: &str| {
                    format!(
                        "env = \"production\"\ncluster = \"{c}\"\nconfig_commit = \"abc\"\n\
                         version = \"1.13.0\"\nstate = \"confirmed\"\nsince = 2026-12-20T02:40:00Z\n\
                         nodes = 3\nnodes_at_version = 3\nmessage = \"\"\n"
                    )
                };
                for c in ["prod-1", "prod-2"] {
                    let file = scratch.path().join(c);
                    std::fs::write(&file, text(c)).unwrap();
                    let blob = git(&r.bare, &["hash-object", "-w", file.to_str().unwrap()]);
                    let entry = format!("100644,{blob},status/production/{c}.toml");
                    crate::support::git::git_env(
                        &r.bare,
                        &["update-index", "--add", "--cacheinfo", &entry],
                        None,
                        &env,
                    );
                }
                let tree = crate::support::git::git_env(&r.bare, &["write-tree"], None, &env);
                let c = crate::support::git::git_env(
                    &r.bare,
                    &["commit-tree", &tree, "-m", "status"],
                    Some("2026-12-20T02:40:00Z"),
                    &[],
                );
                set_ref(r, "drover/status", Some(&c));
            }),
            held_by: Some("drover/status does not count as a whole"),
            undo: Box::new(|r| set_ref(r, "drover/status", None)),
        },
        Attack {
            name: "10,001 branch names under drover/status.d/",
            run: Box::new(move |r| {
                // Written as packed refs, straight into the served repository.
                let mut names: Vec<String> = (0..10_001)
                    .map(|i| match i % 2 {
                        0 => format!("refs/heads/drover/status.d/production/junk-{i:05}"),
                        _ => format!("refs/heads/drover/status.d/x/{i:05}/y"),
                    })
                    .collect();
                names.sort();
                let mut text = String::from("# pack-refs with: peeled fully-peeled sorted \n");
                for n in names {
                    text.push_str(&format!("{failed} {n}\n"));
                }
                std::fs::write(r.bare.join("packed-refs"), text).unwrap();
            }),
            held_by: None,
            undo: Box::new(|r| std::fs::remove_file(r.bare.join("packed-refs")).unwrap()),
        },
        Attack {
            name: "a routine bump of test, merged after the failure",
            run: Box::new(|r| {
                let path = r.work.join("environments/test.toml");
                let text = std::fs::read_to_string(&path).unwrap();
                std::fs::write(&path, text.replace("1.12.0", "1.14.0")).unwrap();
                commit_all(
                    &r.work,
                    "test: 1.14.0",
                    Some(&r.key),
                    Some("2026-12-20T02:45:00Z"),
                );
                r.push();
            }),
            held_by: None,
            undo: Box::new(|_| {}),
        },
        Attack {
            name: "a config commit dated in the future",
            run: Box::new(|r| {
                let path = r.work.join("environments/test.toml");
                let text = std::fs::read_to_string(&path).unwrap();
                std::fs::write(&path, format!("{text}\n# reviewed\n")).unwrap();
                commit_all(
                    &r.work,
                    "test: a comment",
                    Some(&r.key),
                    Some("2030-01-01T00:00:00Z"),
                );
                r.push();
            }),
            held_by: None,
            undo: Box::new(|_| {}),
        },
    ]
}

/// Until prod-2's agent has applied the served head and fetched at least
/// two seconds after now (a fetch that began after what the test just
/// pushed), so what its status says next was judged on it.
async fn fetched_after(client: &kube::Client, ns: &str, repo: &ConfigRepo, what: &str) {
    let after = chrono::Utc::now() + chrono::Duration::seconds(2);
    let head = git(&repo.work, &["rev-parse", "HEAD"]);
    await_status(
        client,
        ns,
        "production-prod-2",
        &format!("{what}: fetched"),
        |s| {
            s.last_applied_commit.as_deref() == Some(head.as_str())
                && s.last_fetch.as_ref().is_some_and(|f| {
                    f.result == "ok"
                        && chrono::DateTime::parse_from_rfc3339(&f.time).is_ok_and(|t| t > after)
                })
        },
    )
    .await;
}

/// prod-2 halted by prod-1's failure (and held by `held_by`, when given),
/// no node started, said in its status, its report and `drover status`.
async fn assert_halted(
    client: &kube::Client,
    ns: &str,
    agent: &RunningAgent,
    repo: &ConfigRepo,
    what: &str,
    held_by: Option<&str>,
    started: &dyn Fn() -> usize,
) {
    let st = await_status(client, ns, "production-prod-2", what, |s| {
        s.state.as_deref() == Some("halted")
            && s.halted_by == ["prod-1"]
            && match held_by {
                Some(h) => s.evidence_held.as_deref().is_some_and(|e| e.contains(h)),
                None => s.evidence_held.is_none(),
            }
    })
    .await
    .status
    .unwrap();
    assert_eq!(reason(&st), "Halted", "{what}: {}", st.message);
    assert!(st.message.contains("prod-1"), "{what}: {}", st.message);
    assert!(
        st.failures_seen
            .iter()
            .any(|f| f.cluster == "prod-1" && f.version == "1.13.0"),
        "{what}: {:?}",
        st.failures_seen
    );
    if let Some(h) = held_by {
        assert!(st.message.contains(h), "{what}: {}", st.message);
    }
    until_pass(
        &agent.handle,
        &format!("{what}: the report says halted"),
        Duration::from_secs(60),
        || {
            repo.report("production", "prod-2").is_some_and(|r| {
                r.state == RolloutState::Halted
                    && r.message.contains("prod-1")
                    && held_by.is_none_or(|h| r.message.contains(h))
            })
        },
    )
    .await;
    // `drover status` shows prod-2's signed report, and while the store
    // itself still shows the failure (or holds), what prod-2 waits on.
    let shown = prod_2(&drover_status(repo));
    assert_eq!(shown["report"]["state"], "halted", "{what}: {shown:#}");
    if repo.report("production", "prod-1").is_some() {
        assert!(!shown["waits_on"].is_null(), "{what}: {shown:#}");
    }
    assert_eq!(started(), 0, "{what}: a node started");
}

#[tokio::test]
async fn a_halt_is_kept_whatever_breaks_or_hides_the_failure_and_ends_with_its_clusters_next_report(
) {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "halt").await;
    let sim = start_sim(&client, pool_options(ns.name(), 2)).await;
    let clock = VirtualClock::new(dec(20, 3, 0));
    let started = || -> usize {
        sim.node_names()
            .iter()
            .map(|n| sim.upgrades_started(n))
            .sum()
    };
    let repo = world(ns.name());
    let (notify, notified) = crate::support::notify::notified().await;
    let start = |cache: Option<&Path>| {
        let mut cfg = agent_config(&repo, "production", "prod-2", ns.name(), "halt-agent");
        cfg.notify = notify.clone();
        if let Some(c) = cache {
            cfg.source.cache_dir = c.to_path_buf();
        }
        RunningAgent::start(cfg, Arc::new(clock.clone()), None)
    };
    let mut agent = start(None);
    await_adopted(&client, ns.name(), "production-prod-2").await;

    // test confirmed 1.13.0; prod-1 failed it; production moves to it.
    report(
        &repo,
        ("test", "test-1"),
        ("1.13.0", "confirmed", ""),
        "2026-12-19T00:00:00Z",
        Some(&repo.report_keys["test-1"]),
    );
    let failed = report(
        &repo,
        ("production", "prod-1"),
        (
            "1.13.0",
            "failed",
            "node prod-1-n2 failed: pod shop/web-7 crash-looping",
        ),
        FAILED_AT,
        Some(&prod_1_key(&repo)),
    );
    let bump = repo.bump("production", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
    await_status(
        &client,
        ns.name(),
        "production-prod-2",
        "the bump applied",
        |s| s.last_applied_commit.as_deref() == Some(bump.as_str()),
    )
    .await;
    assert_halted(
        &client,
        ns.name(),
        &agent,
        &repo,
        "prod-1 failed",
        None,
        &started,
    )
    .await;
    notified.kind(Duration::from_secs(30), "halted").await;

    let only: Option<usize> = std::env::var("DROVER_HALT_ONLY")
        .ok()
        .and_then(|s| s.parse().ok());
    for (i, attack) in attacks(failed.clone()).into_iter().enumerate() {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let t0 = Instant::now();
        (attack.run)(&repo);
        assert_eq!(agent.webhook().await, 202);
        fetched_after(&client, ns.name(), &repo, attack.name).await;
        assert_halted(
            &client,
            ns.name(),
            &agent,
            &repo,
            attack.name,
            attack.held_by,
            &started,
        )
        .await;
        eprintln!("{}: held after {:?}", attack.name, t0.elapsed());
        (attack.undo)(&repo);
        assert_eq!(agent.webhook().await, 202);
        fetched_after(&client, ns.name(), &repo, attack.name).await;
        assert_halted(
            &client,
            ns.name(),
            &agent,
            &repo,
            &format!("{}, undone", attack.name),
            None,
            &started,
        )
        .await;
    }

    // prod-1's branch deleted, and prod-2's agent restarted on a fresh
    // cache: the failure it saw is remembered in its DroverStatus.
    set_ref(&repo, PROD_1, None);
    agent.stop();
    let fresh = repo.dir.path().join("cache-after-restart");
    agent = start(Some(&fresh));
    assert_halted(
        &client,
        ns.name(),
        &agent,
        &repo,
        "prod-1's branch deleted, prod-2 restarted",
        None,
        &started,
    )
    .await;
    let st = await_status(&client, ns.name(), "production-prod-2", "remembered", |s| {
        s.message.contains("remembered")
    })
    .await;
    assert_eq!(st.status.unwrap().halted_by, ["prod-1"]);
    until_pass(
        &agent.handle,
        "the report says it remembers",
        Duration::from_secs(60),
        || {
            repo.report("production", "prod-2")
                .is_some_and(|r| r.message.contains("remembered"))
        },
    )
    .await;
    let shown = prod_2(&drover_status(&repo));
    assert!(
        shown["report"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("remembered")),
        "{shown:#}"
    );

    // The control: prod-1's node retried, its next signed report ends the halt.
    set_ref(&repo, PROD_1, Some(&failed));
    report(
        &repo,
        ("production", "prod-1"),
        ("1.13.0", "rolling", ""),
        "2026-12-20T02:50:00Z",
        Some(&prod_1_key(&repo)),
    );
    assert_eq!(agent.webhook().await, 202);
    await_status(&client, ns.name(), "production-prod-2", "rolling", |s| {
        s.state.as_deref() == Some("rolling") && s.halted_by.is_empty()
    })
    .await;
    until_pass(
        &agent.handle,
        "a node started",
        Duration::from_secs(60),
        || started() >= 1,
    )
    .await;
    agent.stop();
    sim.shutdown().await;
}
