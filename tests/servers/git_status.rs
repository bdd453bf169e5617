//! Status reports (docs/design.md §5) pushed to a real `git daemon`.

use crate::support::git::*;
use drover::rollout::RolloutState;
use drover::source::{Source, SourceConfig};
use drover::status::{self, PublishOptions, StatusReport};
use drover::trust::AllowedSigners;
use std::path::Path;

fn report(env: &str, cluster: &str, n: u32) -> StatusReport {
    StatusReport {
        env: env.into(),
        cluster: cluster.into(),
        config_commit: format!("{n:040x}"),
        version: "1.13.2".parse().unwrap(),
        state: if n >= 50 {
            RolloutState::Confirmed
        } else {
            RolloutState::Rolling
        },
        since: "2026-12-01T04:12:00Z".parse().unwrap(),
        nodes: 50,
        nodes_at_version: n,
        message: format!("report {n}"),
        detail: Default::default(),
    }
}

fn served(tmp: &Path) -> GitDaemon {
    let base = tmp.join("served");
    std::fs::create_dir_all(&base).unwrap();
    let work = WorkRepo::init(&tmp.join("work"));
    bare_clone(&work.dir, &base, "config");
    GitDaemon::start(&base)
}

fn blob_at(repo: &Path, rev: &str, path: &str) -> String {
    git(repo, &["show", &format!("{rev}:{path}")])
}

#[test]
fn publish_creates_the_branch_skips_identical_reports_and_signs() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = served(tmp.path());
    let src = Source::open(SourceConfig::new(
        daemon.url("config"),
        tmp.path().join("cache"),
    ))
    .unwrap();
    let agent_key = keygen(tmp.path(), "agent");
    let opts = PublishOptions::default()
        .with_signing_key_file(&agent_key)
        .unwrap();

    let first = status::publish(&src, &report("test", "test-1", 1), &opts).unwrap();
    let c1 = first.commit.expect("a commit");
    assert_eq!(first.attempts, 1);
    let again = status::publish(&src, &report("test", "test-1", 1), &opts).unwrap();
    assert_eq!(
        again.commit, None,
        "identical content is not committed again"
    );

    let bare = daemon.base.join("config.git");
    // The report lands on the cluster's own branch; no shared branch is made.
    let own = "drover/status.d/test/test-1";
    assert_eq!(git(&bare, &["rev-parse", own]), c1.to_string());
    assert_eq!(
        git(
            &bare,
            &["for-each-ref", "--format=%(refname)", "refs/heads/drover/"]
        ),
        "refs/heads/drover/status.d/test/test-1"
    );
    assert_eq!(
        git(&bare, &["rev-list", "--count", own]),
        "1",
        "orphan root"
    );
    assert_eq!(
        git(&bare, &["ls-tree", "-r", "--name-only", own]),
        "status/test/test-1.toml",
        "the branch holds only its own cluster's file"
    );
    let text = blob_at(&bare, own, "status/test/test-1.toml");
    assert_eq!(
        StatusReport::from_toml(&text).unwrap(),
        report("test", "test-1", 1)
    );

    // git itself accepts the agent's signature.
    let allowed = tmp.path().join("agents");
    allowed_signers(&allowed, &[("test/test-1", &agent_key)]);
    let asf = format!("gpg.ssh.allowedSignersFile={}", allowed.display());
    let out = std::process::Command::new("git")
        .current_dir(&bare)
        .args(["-c", &asf, "verify-commit", own])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The gate's check: the confirmation's introducing commit is signed by an allowed agent.
    let c2 = status::publish(&src, &report("test", "test-1", 50), &opts)
        .unwrap()
        .commit
        .unwrap();
    // Another cluster's unsigned report on top does not change who introduced test-1's.
    let unsigned = PublishOptions::default();
    let c3 = status::publish(&src, &report("stage", "stage-1", 2), &unsigned)
        .unwrap()
        .commit
        .unwrap();
    let signers = AllowedSigners::load(&allowed).unwrap();
    // A fetch brings every cluster's branch (and there is no single branch).
    assert_eq!(src.fetch().unwrap().status_tip, None);
    let store = status::find_store(src.repo(), "drover/status", status::Scope::Every).unwrap();
    let tips: Vec<(String, String, git2::Oid)> = store
        .clusters
        .iter()
        .map(|b| (b.env.clone(), b.cluster.clone(), b.branch.tip))
        .collect();
    assert_eq!(
        tips,
        [
            ("stage".into(), "stage-1".into(), c3),
            ("test".into(), "test-1".into(), c2)
        ]
    );
    // The gate's reader: test-1's confirmation, written by its signed c2, counts;
    // stage-1's unsigned report is ignored and named.
    let conf = status::read_confirmations(
        src.repo(),
        "drover/status",
        Some(&signers),
        chrono::Utc::now(),
    );
    let v: semver::Version = "1.13.2".parse().unwrap();
    assert!(conf.confirmed_at("test", "test-1", &v).is_some());
    let ignored: Vec<String> = conf.ignored.iter().map(ToString::to_string).collect();
    assert_eq!(ignored.len(), 1, "{ignored:?}");
    assert!(
        ignored[0].starts_with("status/stage/stage-1.toml in ") && ignored[0].contains("unsigned"),
        "{ignored:?}"
    );
    assert!(conf.why_not("stage", "stage-1", &v).is_some());
    assert_ne!(c2, c3);
}

#[test]
fn three_agents_pushing_concurrently_lose_no_report_and_never_retry() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = served(tmp.path());
    let clusters = [
        ("test", "test-1"),
        ("stage", "stage-1"),
        ("production", "prod-eu-1"),
    ];
    std::thread::scope(|s| {
        for (i, (env, cluster)) in clusters.iter().enumerate() {
            let url = daemon.url("config");
            let cache = tmp.path().join(format!("cache-{i}"));
            s.spawn(move || {
                let src = Source::open(SourceConfig::new(url, cache)).unwrap();
                let opts = PublishOptions::default();
                for n in 1..=50 {
                    let p = status::publish(&src, &report(env, cluster, n), &opts)
                        .unwrap_or_else(|e| panic!("{cluster} report {n}: {e}"));
                    assert!(p.commit.is_some());
                    // Each agent owns its branch: no push waits behind another agent's.
                    assert_eq!(p.attempts, 1, "{cluster} report {n}");
                }
            });
        }
    });
    let bare = daemon.base.join("config.git");
    for (env, cluster) in clusters {
        let branch = format!("drover/status.d/{env}/{cluster}");
        let path = format!("status/{env}/{cluster}.toml");
        let text = blob_at(&bare, &branch, &path);
        assert_eq!(
            StatusReport::from_toml(&text).unwrap(),
            report(env, cluster, 50)
        );
        // Every one of the cluster's 50 reports is in the history.
        let touching = git(&bare, &["rev-list", "--count", &branch, "--", &path]);
        assert_eq!(touching, "50", "{path}");
    }
}

#[test]
fn a_remote_with_only_the_older_single_branch_still_works_and_gains_cluster_branches() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = served(tmp.path());
    let bare = daemon.base.join("config.git");
    let agent_key = keygen(tmp.path(), "agent");
    let opts = PublishOptions::default()
        .with_signing_key_file(&agent_key)
        .unwrap();
    let allowed = tmp.path().join("agents");
    allowed_signers(&allowed, &[("test/test-1", &agent_key)]);
    let signers = AllowedSigners::load(&allowed).unwrap();
    let v: semver::Version = "1.13.2".parse().unwrap();

    // An older agent's confirmation on the single `drover/status` branch.
    let old = {
        let repo = git2::Repository::open_bare(&bare).unwrap();
        let oid = status::build_commit(&repo, &report("test", "test-1", 50), &opts, None)
            .unwrap()
            .unwrap();
        repo.reference("refs/heads/drover/status", oid, true, "older agent")
            .unwrap();
        oid
    };
    let src = Source::open(SourceConfig::new(
        daemon.url("config"),
        tmp.path().join("cache"),
    ))
    .unwrap();
    assert_eq!(src.fetch().unwrap().status_tip, Some(old));
    let conf = status::read_confirmations(
        src.repo(),
        "drover/status",
        Some(&signers),
        chrono::Utc::now(),
    );
    assert!(conf.confirmed_at("test", "test-1", &v).is_some());

    // A new agent's report lands on its own branch beside the older one
    // (the `.d` namespace does not clash with the older branch's ref).
    let p = status::publish(&src, &report("test", "test-1", 49), &opts).unwrap();
    assert_eq!(
        git(&bare, &["rev-parse", "drover/status.d/test/test-1"]),
        p.commit.unwrap().to_string()
    );
    assert_eq!(git(&bare, &["rev-parse", "drover/status"]), old.to_string());
    src.fetch().unwrap();
    let conf = status::read_confirmations(
        src.repo(),
        "drover/status",
        Some(&signers),
        chrono::Utc::now(),
    );
    // The confirmation on the older branch still stands (a `rolling` report
    // does not withdraw it), read from both branches of the store.
    assert!(conf.confirmed_at("test", "test-1", &v).is_some());
    let store = status::find_store(src.repo(), "drover/status", status::Scope::Every).unwrap();
    assert_eq!(store.clusters.len(), 1);
    assert_eq!(
        store.legacy.unwrap().refname,
        "refs/remotes/origin/drover/status"
    );
}

#[test]
fn a_stale_cache_is_rebuilt_on_the_new_tip_and_a_hook_refusal_stops_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = served(tmp.path());
    let bare = daemon.base.join("config.git");
    let open = |name: &str| {
        Source::open(SourceConfig::new(
            daemon.url("config"),
            tmp.path().join(name),
        ))
        .unwrap()
    };
    let (a, b) = (open("cache-a"), open("cache-b"));
    let opts = PublishOptions::default();
    let own = "drover/status.d/test/test-1";
    status::publish(&a, &report("test", "test-1", 1), &opts).unwrap();
    // A second writer of the branch (a replica with its own cache) moves it on.
    let theirs = status::publish(&b, &report("test", "test-1", 2), &opts)
        .unwrap()
        .commit
        .unwrap();
    // A's cache is stale: it fetches the branch's tip and builds on it.
    let ours = status::publish(&a, &report("test", "test-1", 3), &opts).unwrap();
    assert_eq!(
        ours.attempts, 2,
        "one attempt finds the tip unknown, the next lands"
    );
    assert_eq!(
        git(&bare, &["rev-parse", &format!("{own}^")]),
        theirs.to_string(),
        "built on the other writer's commit, nothing lost"
    );

    // A pre-receive hook says no: refused at once, with its reason, nothing pushed.
    let hook = bare.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\necho 'status branches are read-only during the audit' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tip = git(&bare, &["rev-parse", own]);
    let t0 = std::time::Instant::now();
    let err = status::publish(&a, &report("test", "test-1", 4), &opts).unwrap_err();
    assert!(
        matches!(&err, status::PushError::Refused { message, .. }
            if message.contains("pre-receive hook declined")
                && message.contains("read-only during the audit")),
        "{err}"
    );
    assert!(err.needs_a_person());
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(git(&bare, &["rev-parse", own]), tip);

    // Control: without the hook the same report lands.
    std::fs::remove_file(&hook).unwrap();
    // A caller that asked to stop sends nothing.
    let stop = std::sync::atomic::AtomicBool::new(true);
    let stopped = status::publish_until(
        &a,
        std::slice::from_ref(&report("test", "test-1", 4)),
        &opts,
        &stop,
    );
    assert!(
        matches!(stopped, Err(status::PushError::Stopped { .. })),
        "{stopped:?}"
    );
    assert_eq!(git(&bare, &["rev-parse", own]), tip);
    let landed = status::publish(&a, &report("test", "test-1", 4), &opts).unwrap();
    assert_eq!(
        git(&bare, &["rev-parse", own]),
        landed.commit.unwrap().to_string()
    );
}

/// `drover doctor`'s push check against a real `git daemon`: a scratch
/// branch beside the cluster's own is created and deleted (the server's
/// update hook logs both), the own branch is never touched; a
/// pre-receive hook refusing status branches refuses it with its words and
/// nothing is left; a server that takes the push but not the deletion
/// leaves the scratch branch, and says which.
#[test]
fn a_push_probe_meets_the_servers_hooks_and_leaves_nothing_behind() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let daemon = served(tmp.path());
    let bare = daemon.base.join("config.git");
    let src = Source::open(SourceConfig::new(
        daemon.url("config"),
        tmp.path().join("cache"),
    ))
    .unwrap();
    let head = src.fetch().unwrap().head;
    let own = "drover/status.d/test/test-1";
    status::publish(
        &src,
        &report("test", "test-1", 1),
        &PublishOptions::default(),
    )
    .unwrap();
    let tip = git(&bare, &["rev-parse", own]);
    let hook = |name: &str, body: &str| {
        let path = bare.join("hooks").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    let log = tmp.path().join("received");
    // The update hook runs before the server answers (post-receive may not).
    hook(
        "update",
        &format!("echo \"$2 $3 $1\" >> '{}'\n", log.display()),
    );
    let branches = || {
        git(
            &bare,
            &["for-each-ref", "--format=%(refname)", "refs/heads/drover/"],
        )
    };

    // Allowed: created at the config head, then deleted.
    let probe = status::probe_push(&src, "test", "test-1", head, "0a1b2c3d").unwrap();
    let scratch = format!("{own}.doctor-0a1b2c3d");
    assert_eq!(
        probe,
        status::Probe::Allowed {
            scratch: scratch.clone()
        }
    );
    let received = std::fs::read_to_string(&log).unwrap();
    let zero = "0".repeat(40);
    assert_eq!(
        received.lines().collect::<Vec<_>>(),
        [
            format!("{zero} {head} refs/heads/{scratch}"),
            format!("{head} {zero} refs/heads/{scratch}"),
        ],
        "{received}"
    );
    assert_eq!(branches(), format!("refs/heads/{own}"));
    assert_eq!(git(&bare, &["rev-parse", own]), tip);

    // A pre-receive hook refusing the status branches: refused, with its words.
    let pre = hook(
        "pre-receive",
        "while read old new ref; do case \"$ref\" in refs/heads/drover/status.d/*)\n\
         echo 'status branches are protected' >&2; exit 1;; esac; done\n",
    );
    let err = status::probe_push(&src, "test", "test-1", head, "1b2c3d4e").unwrap_err();
    assert!(
        matches!(&err, status::PushError::Refused { message, branch, .. }
            if message.contains("status branches are protected")
                && branch == &format!("{own}.doctor-1b2c3d4e")),
        "{err}"
    );
    assert!(err.needs_a_person());
    assert_eq!(branches(), format!("refs/heads/{own}"));
    std::fs::remove_file(&pre).unwrap();

    // A server that takes the push but refuses deletions: said, and named.
    let pre = hook(
        "pre-receive",
        &format!(
            "while read old new ref; do [ \"$new\" = {zero} ] && {{ echo 'no deletions' >&2; exit 1; }}; done; exit 0\n"
        ),
    );
    let probe = status::probe_push(&src, "test", "test-1", head, "2c3d4e5f").unwrap();
    let left = format!("{own}.doctor-2c3d4e5f");
    assert!(
        matches!(&probe, status::Probe::LeftBehind { scratch, message }
            if scratch == &left && message.contains("no deletions")),
        "{probe:?}"
    );
    assert_eq!(branches(), format!("refs/heads/{own}\nrefs/heads/{left}"));
    std::fs::remove_file(&pre).unwrap();
    assert_eq!(git(&bare, &["rev-parse", own]), tip);
}

/// An agent behind a slow server pushes what waited as one chain: a commit
/// per report, in order, in one push. When a push it gave up on landed
/// after all, the retry (here from a second cache, which has not seen the
/// tip) writes only what the branch lacks: no report twice, none out of order.
#[test]
fn a_chain_of_reports_lands_in_one_push_and_a_retry_writes_only_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = served(tmp.path());
    let cache = |name: &str| {
        Source::open(SourceConfig::new(
            daemon.url("config"),
            tmp.path().join(name),
        ))
        .unwrap()
    };
    let (src, other) = (cache("cache"), cache("other-cache"));
    let opts = PublishOptions::default()
        .with_signing_key_file(&keygen(tmp.path(), "agent"))
        .unwrap();
    let r = |n| report("stage", "stage-1", n);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let first = status::publish_until(&src, &[r(1), r(2), r(3)], &opts, &stop).unwrap();
    assert_eq!(first.attempts, 1, "one push");
    let bare = daemon.base.join("config.git");
    let own = "drover/status.d/stage/stage-1";
    let on_branch = || -> Vec<u32> {
        let revs = git(&bare, &["rev-list", "--reverse", own]);
        revs.lines()
            .map(|c| {
                let text = blob_at(&bare, c, "status/stage/stage-1.toml");
                StatusReport::from_toml(&text).unwrap().nodes_at_version
            })
            .collect()
    };
    assert_eq!(on_branch(), [1, 2, 3]);
    assert_eq!(
        git(&bare, &["rev-parse", own]),
        first.commit.unwrap().to_string()
    );
    // The retry of a chain whose push landed, with a newer report behind.
    let retry = status::publish_until(&other, &[r(2), r(3), r(50)], &opts, &stop).unwrap();
    assert!(retry.commit.is_some());
    assert_eq!(on_branch(), [1, 2, 3, 50]);
    // Everything already there: nothing written.
    let again = status::publish_until(&src, &[r(3), r(50)], &opts, &stop).unwrap();
    assert_eq!((again.commit, on_branch()), (None, vec![1, 2, 3, 50]));
}
