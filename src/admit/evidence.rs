//! What the agent's waves and halt read of the status store, and which
//! status branches it fetches for them and for its gate (docs/design.md
//! §4a, §5): the clusters of its own environment and of the one below, as
//! its configs list them, each branch looked up by name.

use super::git::GitEvidence;
use super::snapshot::snapshot_recent;
use super::Error;
use crate::status::Confirmations;
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use semver::Version;
use std::collections::BTreeSet;

/// What `env`'s clusters reported for `version`, read by the one reader
/// (the status store) by the policy in force at `applied`, the agent's last
/// applied commit: the wave gate's evidence (`crate::gate::wave`), as
/// `own` (a cluster of `env`, whose own branch does not hold the others;
/// `None` for a reader outside the environment) reads it. Held when the
/// applied commit's config cannot be read: nothing says which branches to
/// read.
pub fn env_evidence(
    repo: &Repository,
    applied: Oid,
    env: &str,
    own: Option<&str>,
    version: &Version,
    now: DateTime<Utc>,
) -> Result<crate::gate::wave::EnvEvidence, Error> {
    let snap = match snapshot_recent(repo, applied, now)? {
        Ok(s) => s,
        Err(d) => {
            return Ok(crate::gate::wave::EnvEvidence {
                held: Some(format!(
                    "the config of the applied commit {applied:.10} cannot be read ({}), so \
                     nothing says which status branches to read",
                    d.first().map(ToString::to_string).unwrap_or_default()
                )),
                ..Default::default()
            })
        }
    };
    let mut evidence = GitEvidence::new(repo, applied, now);
    // The wave gate weighs `env`'s own clusters only: their branches are read.
    let conf = evidence.confirmations_of(&snap.policy, &BTreeSet::from([env.to_owned()]))?;
    Ok(evidence_of(
        conf,
        snap.config.clusters(env),
        env,
        own,
        version,
    ))
}

/// The wave gate's evidence for `env`'s `clusters` and `version` out of
/// what the one reader found: standing confirmations, standing failures,
/// each cluster's newest trusted report of the version, why a cluster has
/// no confirmation, and whether the environment's evidence is held (but
/// for `own`'s branch).
pub fn evidence_of(
    conf: &Confirmations,
    clusters: &[String],
    env: &str,
    own: Option<&str>,
    version: &Version,
) -> crate::gate::wave::EnvEvidence {
    let mut out = crate::gate::wave::EnvEvidence {
        confirmed: conf.for_version(env, version),
        held: conf.held(env, own),
        ..Default::default()
    };
    for c in clusters {
        if let Some(l) = conf.latest(env, c, version) {
            out.latest.insert(c.clone(), (l.at, l.failed));
        }
    }
    for (c, f) in conf.failures(env, version) {
        out.failed.insert(
            c,
            crate::gate::wave::Failure {
                at: f.at,
                message: f.message,
            },
        );
    }
    for c in clusters {
        if !out.confirmed.contains_key(c) {
            if let Some(why) = conf.why_not(env, c, version) {
                out.notes.insert(c.clone(), why);
            }
        }
    }
    out
}

/// The status branches an agent of `env`/`cluster` reads, and so fetches,
/// as the configs at `heads` (its applied commit, its last fetched head)
/// list them: the clusters of `env`
/// and of the environment below it in each one's chain, and always
/// `env`/`cluster` itself (what recovery reads before anything is applied).
pub fn status_scope(
    repo: &git2::Repository,
    heads: &[Option<git2::Oid>],
    env: &str,
    cluster: &str,
) -> crate::status::Listed {
    scope_of(
        env,
        cluster,
        heads
            .iter()
            .flatten()
            .map(|h| scope_at(repo, *h, env).unwrap_or_default()),
    )
}

/// The `(env, cluster)` pairs the config at `head` lists for `env` and the
/// environment below it in its chain; `None` when it does not load (the
/// commit may not be fetched yet). A commit's config never changes, so a
/// caller may keep what loaded per commit.
pub fn scope_at(
    repo: &git2::Repository,
    head: git2::Oid,
    env: &str,
) -> Option<Vec<(String, String)>> {
    let files = crate::config::GitTreeFiles::at_rev(repo, &head.to_string()).ok()?;
    let cfg = crate::config::load(&files).ok()?;
    let chain = &cfg.root.chain;
    let lower = chain
        .iter()
        .position(|e| e == env)
        .and_then(|i| i.checked_sub(1))
        .map(|i| chain[i].clone());
    let mut out = Vec::new();
    for e in std::iter::once(env.to_owned()).chain(lower) {
        for c in cfg.root.clusters.get(&e).into_iter().flatten() {
            out.push((e.clone(), c.clone()));
        }
    }
    Some(out)
}

/// [`status_scope`] from each head's [`scope_at`].
pub fn scope_of(
    env: &str,
    cluster: &str,
    heads: impl IntoIterator<Item = Vec<(String, String)>>,
) -> crate::status::Listed {
    let mut out = crate::status::Listed::new();
    let mut add = |e: &str, c: &str| {
        let have = out.entry(e.to_owned()).or_default();
        if !have.iter().any(|h| h == c) {
            have.push(c.to_owned());
        }
    };
    add(env, cluster);
    for (e, c) in heads.into_iter().flatten() {
        add(&e, &c);
    }
    out
}
