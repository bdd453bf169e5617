//! A repository on this machine (a path, `file://`: a git-sync volume, the
//! tests' bare repositories), read and written in-process: each ref asked
//! for is looked up by its name (a binary search of `packed-refs`), never
//! listed, and objects go from one object database to the other as a pack
//! libgit2 builds and indexes.

use super::refs::Asked;
use git2::{Oid, Repository};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Open the repository at `path` (bare, or a work tree's).
pub(super) fn open(path: &Path) -> Result<Repository, git2::Error> {
    Repository::open(path)
}

/// The refs of `remote` that `asked` names, each looked up by its name;
/// those under a prefix listed, at most `asked.max` of them.
pub(super) fn discover(
    remote: &Repository,
    asked: &Asked,
) -> Result<BTreeMap<String, Oid>, super::refs::Error> {
    let mut refs = BTreeMap::new();
    let git = |e: git2::Error| super::refs::Error::Malformed(e.message().to_owned());
    for name in &asked.exact {
        if let Some(oid) = lookup(remote, name).map_err(git)? {
            refs.insert(name.clone(), oid);
        }
    }
    for prefix in &asked.prefixes {
        for r in remote.references_glob(&format!("{prefix}*")).map_err(git)? {
            let r = r.map_err(git)?;
            let (Ok(name), Some(oid)) = (r.name(), r.target()) else {
                continue;
            };
            if refs.len() >= asked.max && !refs.contains_key(name) {
                return Err(super::refs::Error::TooMany {
                    max: asked.max,
                    prefixes: asked.prefixes.join(", "),
                });
            }
            refs.insert(name.to_owned(), oid);
        }
    }
    Ok(refs)
}

/// Where the ref `name` of `repo` points, `None` when it does not exist.
pub(super) fn lookup(repo: &Repository, name: &str) -> Result<Option<Oid>, git2::Error> {
    match repo.find_reference(name) {
        Ok(r) => Ok(r.resolve()?.target()),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) if e.code() == git2::ErrorCode::InvalidSpec => Ok(None),
        Err(e) => Err(e),
    }
}

/// Copy into `to` the objects reachable from `wants` in `from` and not
/// from `haves`, as one pack; returns the objects sent. `go_on` is asked
/// between chunks.
pub(super) fn copy_objects(
    from: &Repository,
    to: &Repository,
    wants: &[Oid],
    haves: &[Oid],
    go_on: &dyn Fn() -> bool,
) -> Result<usize, git2::Error> {
    let mut pack = from.packbuilder()?;
    let mut walk = from.revwalk()?;
    let mut commits = false;
    for w in wants {
        if walk.push(*w).is_ok() {
            commits = true;
        } else {
            pack.insert_recursive(*w, None)?;
        }
    }
    let odb = from.odb()?;
    for h in haves {
        if odb.exists(*h) {
            // A have that is no commit here (or not one at all) hides nothing.
            let _ = walk.hide(*h);
        }
    }
    if commits {
        pack.insert_walk(&mut walk)?;
    }
    let sent = pack.object_count();
    if sent == 0 {
        return Ok(0);
    }
    let target = to.odb()?;
    let mut writer = target.packwriter()?;
    let mut failed = None;
    let written = pack.foreach(|chunk| {
        if !go_on() {
            failed = Some(git2::Error::from_str("stopped"));
            return false;
        }
        match writer.write_all(chunk) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(git2::Error::from_str(&e.to_string()));
                false
            }
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    written?;
    writer.commit()?;
    Ok(sent)
}
