//! The checks against the config repository, done as the agent's first
//! pass would do them with the same settings: fetch the head and its
//! status branches, verify the head's signature, load the config, find
//! this cluster's report key, push a scratch branch beside its status
//! branch, and read the driver's image pin.

use super::Checks;
use crate::agent::AgentConfig;
use crate::config::RepoConfig;
use crate::source::{Source, SourceConfig};
use crate::trust::{AllowedSigners, OpenPgpKeys, Signers};
use std::time::Duration;

/// The checks [`check_git`] makes, in order.
pub(super) const GIT_CHECKS: [&str; 8] = [
    "repository",
    "signature",
    "config",
    "report-signer",
    "status-branches",
    "status-push",
    "updater-image",
    "next-window",
];

/// What the agent's first pass does with git, with the same settings:
/// fetch (the branch and every status branch), verify the head, load the
/// config, find this cluster's report key, the updater image, the window.
pub(super) fn check_git(
    cfg: &AgentConfig,
    state: &crate::agent::recover::AgentState,
    timeout: Duration,
) -> Checks {
    let mut c = Checks::default();
    let url = crate::source::redact(&cfg.source.url);
    let Ok(cache) = tempfile::tempdir() else {
        c.fail(
            "repository",
            "cannot make a temporary directory",
            "free disk space",
        );
        return c;
    };
    let mut source_cfg: SourceConfig = cfg.source.clone();
    source_cfg.cache_dir = cache.path().join("cache");
    source_cfg.timeout = timeout;
    // The agent's fetch: its status branches by name, as its scope says.
    let applied = state
        .applied
        .as_deref()
        .and_then(|c| git2::Oid::from_str(c).ok());
    let fetched = Source::open(source_cfg).and_then(|mut s| {
        s.fetch_scoped(|repo, head| {
            crate::admit::status_scope(repo, &[applied, head], &cfg.env, &cfg.cluster)
        })
        .map(|f| (s, f))
    });
    let (source, fetched) = match fetched {
        Ok(x) => x,
        Err(e) => {
            let fix = match &e {
                crate::source::Error::BranchMissing { .. } => format!(
                    "push the branch, or name the one you use in DROVER_BRANCH (now {})",
                    cfg.source.branch
                ),
                _ => "check DROVER_REPO and the credentials Secret (a token with read access to the repository and write access to this cluster's status branch)".to_owned(),
            };
            c.fail("repository", format!("cannot fetch {url}: {e}"), fix);
            for name in &GIT_CHECKS[1..] {
                c.skip(name, "needs the repository");
            }
            return c;
        }
    };
    c.pass(
        "repository",
        format!(
            "{url} reachable with the configured credentials; {} at {}",
            cfg.source.branch,
            &fetched.head.to_string()[..12]
        ),
    );
    let repo = source.repo();

    // The head's signature, against the keys the agent is configured with.
    if cfg.verify == crate::trust::Mode::Off {
        c.fail(
            "signature",
            "DROVER_VERIFY=off: any commit pushed to the branch is applied",
            "remove DROVER_VERIFY (the default, all, verifies every commit)",
        );
    } else {
        let ssh = cfg
            .allowed_signers
            .as_deref()
            .map(AllowedSigners::load)
            .transpose();
        let pgp = cfg
            .openpgp_keys
            .as_deref()
            .map(OpenPgpKeys::load)
            .transpose();
        match (ssh, pgp) {
            (Ok(None), Ok(None)) => c.fail(
                "signature",
                "no allowed-signers file and no OpenPGP keys configured",
                "mount the drover-allowed-signers Secret (docs/install.md, step 2)",
            ),
            (Err(e), _) | (_, Err(e)) => c.fail(
                "signature",
                e.to_string(),
                "fix the allowed_signers file (or the OpenPGP keys) of the overlay",
            ),
            (Ok(ssh), Ok(pgp)) => {
                let (ssh, pgp) = (ssh.unwrap_or_default(), pgp.unwrap_or_default());
                let signers = Signers {
                    ssh: &ssh,
                    openpgp: &pgp,
                };
                match crate::agent::recover::trust_verdict(cfg, state, repo, fetched.head, signers)
                {
                    Ok(message) => c.pass("signature", message),
                    Err(r) => c.fail("signature", r.message, r.fix),
                }
            }
        }
    }

    // The config at the head, and this cluster in it.
    let config = crate::config::GitTreeFiles::at_rev(repo, &fetched.head.to_string())
        .map_err(|e| e.to_string())
        .and_then(|files| {
            crate::config::load(&files).map_err(|d| {
                d.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
        });
    let config = match config {
        Ok(cfg) => cfg,
        Err(e) => {
            c.fail(
                "config",
                format!("the head's config is invalid: {e}"),
                "drover check in the config repository shows every problem",
            );
            for name in [
                "report-signer",
                "status-branches",
                "status-push",
                "updater-image",
                "next-window",
            ] {
                c.skip(name, "needs a valid config");
            }
            return c;
        }
    };
    let Some(env) = config.envs.get(&cfg.env) else {
        c.fail(
            "config",
            format!("the config has no environment {:?}", cfg.env),
            format!("set DROVER_ENV to one of {}", config.root.chain.join(", ")),
        );
        return c;
    };
    let listed = config
        .root
        .clusters
        .get(&cfg.env)
        .is_some_and(|cs| cs.contains(&cfg.cluster));
    if listed || !config.root.clusters.contains_key(&cfg.env) {
        c.pass(
            "config",
            format!("environment {} pins {}", cfg.env, env.version),
        );
    } else {
        c.fail(
            "config",
            format!(
                "cluster {} is not listed for {} under [clusters]",
                cfg.cluster, cfg.env
            ),
            "add it to [clusters] in drover.toml, or set DROVER_CLUSTER to the listed name",
        );
    }

    check_report_signer(cfg, repo, fetched.head, &config, &mut c);
    check_status_branches(cfg, repo, &config, &mut c);
    check_status_push(cfg, &source, fetched.head, &config, &mut c);
    check_updater_image(env, &mut c);
    let now = chrono::Utc::now();
    match crate::window::Calendar::of(env)
        .ok()
        .and_then(|cal| cal.periods(now).find(|p| p.patch_only.is_none()))
    {
        Some(w) => c.pass(
            "next-window",
            format!("{} to {}", w.start.to_rfc3339(), w.end.to_rfc3339()),
        ),
        None => c.fail(
            "next-window",
            "no window ahead",
            "check [window] and the freezes of the environment file",
        ),
    }
    c
}

/// The agent's report key is present, and `report_signers` lists it for
/// `<env>/<cluster>`, so the next environment's gate counts its reports.
pub(super) fn check_report_signer(
    cfg: &AgentConfig,
    repo: &git2::Repository,
    head: git2::Oid,
    config: &RepoConfig,
    c: &mut Checks,
) {
    let who = format!("{}/{}", cfg.env, cfg.cluster);
    let Some(key) = &cfg.publish.signing_key else {
        c.fail(
            "report-signer",
            "no status signing key: the agent's reports are unsigned and count for nothing",
            "mount the drover-report-signing-key Secret (docs/install.md, step 2)",
        );
        return;
    };
    let Some(path) = &config.root.report_signers else {
        c.fail(
            "report-signer",
            "drover.toml has no [promotion] report_signers",
            format!(
                "add an allowed-signers file listing {who}'s key and name it in report_signers"
            ),
        );
        return;
    };
    let public = key.public_key();
    let text = crate::config::GitTreeFiles::at_rev(repo, &head.to_string())
        .ok()
        .and_then(|f| crate::config::Files::read(&f, path).ok().flatten())
        .and_then(|b| String::from_utf8(b).ok());
    let line = format!(
        "{who} namespaces=\"git\" {}",
        public.to_openssh().unwrap_or_default()
    );
    let signers = text.as_deref().map(AllowedSigners::parse);
    match signers {
        Some(Ok(s)) => {
            let found = s.entries().iter().any(|e| {
                e.key.key_data() == public.key_data()
                    && e.principals.contains(&who)
                    && e.allows_namespace("git")
            });
            if found {
                c.pass(
                    "report-signer",
                    format!("{path} lists this cluster's key as {who}"),
                );
            } else {
                c.fail(
                    "report-signer",
                    format!("{path} does not list this cluster's key as {who}"),
                    format!("add this line to {path} in a reviewed change: {line}"),
                );
            }
        }
        Some(Err(e)) => c.fail(
            "report-signer",
            format!("{path}: {e}"),
            "fix the file (git's allowed-signers format)",
        ),
        None => c.fail(
            "report-signer",
            format!("{path} is missing at the head"),
            format!("add it with this line: {line}"),
        ),
    }
}

/// The status branches came with the fetch: how many, and this cluster's.
pub(super) fn check_status_branches(
    cfg: &AgentConfig,
    repo: &git2::Repository,
    config: &RepoConfig,
    c: &mut Checks,
) {
    let branch = &config.root.status_branch;
    let ns = crate::status::cluster_namespace(branch);
    let own = format!("{ns}{}/{}", cfg.env, cfg.cluster);
    let mut count = 0;
    let mut has_own = false;
    if let Ok(refs) = repo.references_glob(&format!("refs/remotes/origin/{ns}*")) {
        for r in refs.flatten() {
            count += 1;
            has_own |= r.name().ok() == Some(format!("refs/remotes/origin/{own}").as_str());
        }
    }
    if branch != &cfg.source.status_branch && cfg.status_branch.is_some() {
        c.fail(
            "status-branches",
            format!(
                "DROVER_STATUS_BRANCH is {}, the config's status_branch is {branch}",
                cfg.source.status_branch
            ),
            "remove DROVER_STATUS_BRANCH, or make them agree",
        );
        return;
    }
    c.pass(
        "status-branches",
        format!(
            "{count} fetched under {ns}; {own} {}",
            if has_own {
                "exists"
            } else {
                "not pushed yet (the agent pushes it after its first pass)"
            }
        ),
    );
}

/// The agent's credentials may push to this cluster's status branch: a
/// scratch branch beside it is pushed and deleted ([`crate::status::probe_push`]).
pub(super) fn check_status_push(
    cfg: &AgentConfig,
    source: &Source,
    head: git2::Oid,
    config: &RepoConfig,
    c: &mut Checks,
) {
    let own = crate::status::cluster_branch(&config.root.status_branch, &cfg.env, &cfg.cluster);
    let nonce = format!("{:08x}", rand::random::<u32>());
    let mut probe_cfg = source.config().clone();
    probe_cfg
        .status_branch
        .clone_from(&config.root.status_branch);
    let probed = Source::open(probe_cfg)
        .map_err(crate::status::PushError::from)
        .and_then(|s| crate::status::probe_push(&s, &cfg.env, &cfg.cluster, head, &nonce));
    let allow = format!(
        "let the agent's credentials push to {own}: the forge's branch protection or ruleset, \
         its pre-receive hooks, the deploy key's or token's write access (docs/status.md, \
         \"Per-agent write access\")"
    );
    match probed {
        Ok(crate::status::Probe::Allowed { scratch }) => c.pass(
            "status-push",
            format!("the git server takes a push beside {own} ({scratch} created and deleted)"),
        ),
        Ok(crate::status::Probe::LeftBehind { scratch, message }) => c.fail(
            "status-push",
            format!(
                "pushing works, but deleting the scratch branch {scratch} was refused: {message}"
            ),
            format!("delete the branch {scratch} on the forge"),
        ),
        Err(e) => c.fail(
            "status-push",
            format!("the agent's reports would be refused: {e}"),
            allow,
        ),
    }
}

/// The updater image the driver runs is pinned by a real digest.
pub(super) fn check_updater_image(env: &crate::config::EnvConfig, c: &mut Checks) {
    let image = match env.driver.updater_image() {
        Ok(image) => image,
        Err(why) => return c.fail("updater-image", why, "set [driver] image"),
    };
    if image == crate::config::TEST_UPDATER_IMAGE {
        return c.fail(
            "updater-image",
            format!("{image} is the tests' stand-in digest of a build with test hooks"),
            "run a release build of drover (drover --version names its updater image), or set [driver] image to a pushed image by digest",
        );
    }
    let digest = image.split_once("@sha256:").map(|(_, d)| d);
    match digest {
        Some(d) if d.len() == 64 && d.bytes().all(|b| b == b'0') => c.fail(
            "updater-image",
            format!("{image} is the all-zero placeholder digest, no image"),
            "run a release build of drover (drover --version names its updater image), or set [driver] image to a pushed image by digest",
        ),
        Some(_) => c.pass("updater-image", format!("{image} (pinned by digest)")),
        None => c.fail(
            "updater-image",
            format!("{image} is not pinned by digest: a tag can move or never be pushed"),
            "set [driver] image to name@sha256:<digest>",
        ),
    }
}
