//! A fetch: the refs asked for (and nothing else) found on the remote,
//! their missing objects received as one pack into the cache, the local
//! refs they map to moved, and those whose remote ref is gone deleted.

use super::refs::{self, Asked};
use super::{local, open, remote_error, Endpoint};
use crate::source::{Error, SourceConfig};
use git2::{Oid, Repository};
use gix_protocol::fetch::{Arguments, Response};
use gix_protocol::Command;
use gix_transport::client::blocking_io::Transport;
use gix_transport::client::MessageKind;
use gix_transport::Protocol;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::ops::ControlFlow;

/// One forced refspec, `+src:dst`, or `+src*:dst*` for every ref under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FetchSpec {
    src: String,
    dst: String,
    glob: bool,
}

impl FetchSpec {
    /// Parse `+src:dst` (the `+` optional: every update is forced, as the
    /// cache mirrors the remote); a `*` may end both sides.
    pub(crate) fn parse(spec: &str) -> Option<Self> {
        let (src, dst) = spec.strip_prefix('+').unwrap_or(spec).split_once(':')?;
        match (src.strip_suffix('*'), dst.strip_suffix('*')) {
            (Some(s), Some(d)) => Some(Self {
                src: s.to_owned(),
                dst: d.to_owned(),
                glob: true,
            }),
            (None, None) if !src.contains('*') && !dst.contains('*') => Some(Self {
                src: src.to_owned(),
                dst: dst.to_owned(),
                glob: false,
            }),
            _ => None,
        }
    }
}

/// Most haves sent: the tips of the cache's refs, enough for the server to
/// send only what is new after an ordinary advance.
const MAX_HAVES: usize = 256;

/// Fetch `specs` from `cfg.url` into `repo`; returns the objects received.
/// Refs under a glob's prefix are at most `max_glob`, more is an error.
/// `go_on` is asked as data arrives; once it says no, the fetch stops.
pub(crate) fn fetch(
    repo: &Repository,
    cfg: &SourceConfig,
    specs: &[FetchSpec],
    max_glob: usize,
    go_on: &dyn Fn() -> bool,
) -> Result<usize, Error> {
    let asked = Asked {
        exact: specs
            .iter()
            .filter(|s| !s.glob)
            .map(|s| s.src.clone())
            .collect(),
        prefixes: specs
            .iter()
            .filter(|s| s.glob)
            .map(|s| s.src.clone())
            .collect(),
        max: specs.iter().filter(|s| !s.glob).count() + max_glob,
    };
    let discovery = |e: refs::Error| match e {
        refs::Error::TooMany { .. } | refs::Error::Malformed(_) => Error::Remote {
            url: crate::source::redact(&cfg.url),
            detail: e.to_string(),
        },
        e => remote_error(cfg, &e),
    };
    let haves = haves(repo)?;
    let received;
    let found = match open(cfg, gix_transport::Service::UploadPack)? {
        Endpoint::Local(path) => {
            let remote = local::open(&path)?;
            let found = remote.discover(&asked).map_err(discovery)?;
            let wants = wants(repo, &found)?;
            received = if wants.is_empty() {
                0
            } else {
                let from = local::pack_source(repo, &remote)?;
                local::copy_objects(&from, repo, &wants, &haves, go_on)?
            };
            found
        }
        Endpoint::Remote(mut conn) => {
            let found = refs::discover(&mut conn, gix_transport::Service::UploadPack, &asked)
                .map_err(discovery)?;
            let wants = wants(repo, &found.refs)?;
            received = if wants.is_empty() {
                // A v0 conversation ends with a flush where no want follows.
                if found.protocol != Protocol::V2
                    && conn.connection_persists_across_multiple_requests()
                {
                    let _ = conn
                        .request(
                            gix_transport::client::WriteMode::OneLfTerminatedLinePerWriteCall,
                            MessageKind::Flush,
                            false,
                        )
                        .and_then(|w| w.into_read().map_err(Into::into));
                }
                0
            } else {
                receive_pack(repo, &mut conn, &found, &wants, &haves, go_on)
                    .map_err(|e| remote_error(cfg, &*e))?
            };
            found.refs
        }
    };
    update_refs(repo, specs, &found)?;
    Ok(received)
}

/// The tips of the cache's refs that are commits, at most [`MAX_HAVES`].
fn haves(repo: &Repository) -> Result<Vec<Oid>, Error> {
    let mut out = BTreeSet::new();
    for r in repo.references()?.flatten() {
        if out.len() >= MAX_HAVES {
            break;
        }
        if let Ok(c) = r.peel_to_commit() {
            out.insert(c.id());
        }
    }
    Ok(out.into_iter().collect())
}

/// The objects the remote's refs point at that the cache lacks.
fn wants(repo: &Repository, found: &BTreeMap<String, Oid>) -> Result<Vec<Oid>, Error> {
    let odb = repo.odb()?;
    let set: BTreeSet<Oid> = found
        .values()
        .copied()
        .filter(|o| !odb.exists(*o))
        .collect();
    Ok(set.into_iter().collect())
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Ask for `wants` (telling `haves`, then `done`: one round) and write the
/// pack the server sends into the cache; returns the objects received.
fn receive_pack(
    repo: &Repository,
    conn: &mut super::Conn,
    found: &refs::Found,
    wants: &[Oid],
    haves: &[Oid],
    go_on: &dyn Fn() -> bool,
) -> Result<usize, Failure> {
    let id = |o: &Oid| gix_hash::ObjectId::from_bytes_or_panic(o.as_bytes());
    let mut features = Command::Fetch.default_features(found.protocol, &found.capabilities);
    // A deadline or a stop request is checked on each chunk; the server's
    // progress text is not wanted.
    if found.capabilities.contains("no-progress") || found.protocol == Protocol::V2 {
        features.push(("no-progress", None));
    }
    features.retain(|(f, _)| found.protocol == Protocol::V2 || *f != "include-tag");
    let sideband_all = features.iter().any(|(f, _)| *f == "sideband-all");
    let mut args = Arguments::new(found.protocol, features, false);
    for w in wants {
        args.want(id(w));
    }
    for h in haves {
        args.have(id(h));
    }
    let mut reader = args.send(conn, true)?;
    let progress = move |_is_error: bool, _text: &[u8]| {
        if go_on() {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    };
    // Side-band demultiplexing starts with the pack, or at once where the
    // whole response is multiplexed (v2's `sideband-all`).
    if sideband_all {
        reader.set_progress_handler(Some(Box::new(progress)));
    }
    let response =
        Response::from_line_reader(found.protocol, &mut reader, true, !haves.is_empty())?;
    if !sideband_all {
        reader.set_progress_handler(Some(Box::new(progress)));
    }
    if !response.has_pack() {
        return Err("the server sent no pack".into());
    }
    let received = std::cell::Cell::new(0usize);
    let odb = repo.odb()?;
    let mut writer = odb.packwriter()?;
    writer.progress(|p| {
        received.set(p.received_objects());
        true
    });
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        if !go_on() {
            return Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into());
        }
        writer.write_all(&chunk[..n])?;
    }
    writer.commit()?;
    drop(writer);
    Ok(received.get())
}

/// Move each spec's local ref to where the remote's points; delete those
/// whose remote ref is gone (for a glob: every local ref under its
/// destination the remote no longer has), as a fresh clone would read.
fn update_refs(
    repo: &Repository,
    specs: &[FetchSpec],
    found: &BTreeMap<String, Oid>,
) -> Result<(), Error> {
    let set = |dst: &str, oid: Oid| -> Result<(), Error> {
        if local::lookup(repo, dst)? != Some(oid) {
            repo.reference(dst, oid, true, "drover: fetch")?;
        }
        Ok(())
    };
    let delete = |dst: &str| -> Result<(), Error> {
        match repo.find_reference(dst) {
            Ok(mut r) => Ok(r.delete()?),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    };
    for spec in specs {
        if !spec.glob {
            match found.get(&spec.src) {
                Some(oid) => set(&spec.dst, *oid)?,
                None => delete(&spec.dst)?,
            }
            continue;
        }
        let mut kept = BTreeSet::new();
        for (name, oid) in found.range(spec.src.clone()..) {
            let Some(rest) = name.strip_prefix(&spec.src) else {
                break;
            };
            let dst = format!("{}{rest}", spec.dst);
            set(&dst, *oid)?;
            kept.insert(dst);
        }
        let stale: Vec<String> = repo
            .references_glob(&format!("{}*", spec.dst))?
            .flatten()
            .filter_map(|r| r.name().ok().map(str::to_owned))
            .filter(|n| !kept.contains(n))
            .collect();
        for name in stale {
            delete(&name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refspecs_are_exact_or_a_prefix() {
        assert_eq!(
            FetchSpec::parse("+refs/heads/main:refs/drover/fetching/head"),
            Some(FetchSpec {
                src: "refs/heads/main".into(),
                dst: "refs/drover/fetching/head".into(),
                glob: false
            })
        );
        assert_eq!(
            FetchSpec::parse("+refs/heads/s.d/*:refs/remotes/origin/s.d/*").map(|s| s.glob),
            Some(true)
        );
        assert_eq!(FetchSpec::parse("refs/heads/a*b:x"), None);
        assert_eq!(FetchSpec::parse("refs/heads/a"), None);
    }
}
