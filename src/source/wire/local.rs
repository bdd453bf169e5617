//! A repository on this machine (a path, `file://`: a git-sync volume, the
//! tests' bare repositories), read and written in-process: each ref asked
//! for is looked up by its name (a binary search of `packed-refs`), those
//! under a prefix read from where the prefix begins, a branch updated by a
//! loose-ref transaction (gitoxide's ref store: libgit2 loads every packed
//! ref to write one), and objects go from one object database to the other
//! as a pack libgit2 builds and indexes.

use super::refs::Asked;
use git2::{Oid, Repository};
use gix_ref::file::Store;
use gix_ref::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};
use gix_ref::{FullName, Target};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Most symbolic refs followed from one name.
const MAX_SYMBOLIC: usize = 5;

/// A repository on this machine: its objects through libgit2, its refs
/// through gitoxide's store.
pub(super) struct Local {
    pub repo: Repository,
    refs: Store,
}

/// Open the repository at `path` (bare, or a work tree's).
pub(super) fn open(path: &Path) -> Result<Local, git2::Error> {
    let repo = Repository::open(path)?;
    let refs = Store::at_opts(
        repo.commondir().to_owned(),
        gix_hash::Kind::Sha1,
        gix_ref::store::init::Options {
            // As git leaves a bare repository's branches without logs.
            write_reflog: gix_ref::store::WriteReflog::Disable,
            ..Default::default()
        },
    );
    Ok(Local { repo, refs })
}

fn ref_error(e: impl std::fmt::Display) -> git2::Error {
    git2::Error::from_str(&e.to_string())
}

fn oid(id: &gix_hash::oid) -> Result<Oid, git2::Error> {
    Oid::from_bytes(id.as_bytes())
}

impl Local {
    /// Where the ref `name` points (symbolic refs followed), `None` when
    /// it does not exist or is no valid ref name.
    pub(super) fn lookup(&self, name: &str) -> Result<Option<Oid>, git2::Error> {
        let mut name = name.to_owned();
        for _ in 0..MAX_SYMBOLIC {
            let Ok(partial) = <&gix_ref::PartialNameRef>::try_from(name.as_str()) else {
                return Ok(None);
            };
            match self.refs.try_find(partial).map_err(ref_error)? {
                None => return Ok(None),
                Some(r) => match r.target {
                    Target::Object(id) => return oid(&id).map(Some),
                    Target::Symbolic(to) => name = to.to_string(),
                },
            }
        }
        Err(git2::Error::from_str(&format!(
            "more than {MAX_SYMBOLIC} symbolic refs from `{name}`"
        )))
    }

    /// The refs `asked` names, each looked up by its name; those under a
    /// prefix read from where it begins, at most `asked.max` of them.
    pub(super) fn discover(
        &self,
        asked: &Asked,
    ) -> Result<BTreeMap<String, Oid>, super::refs::Error> {
        let git = |e: git2::Error| super::refs::Error::Malformed(e.message().to_owned());
        let mut refs = BTreeMap::new();
        for name in &asked.exact {
            if let Some(oid) = self.lookup(name).map_err(git)? {
                refs.insert(name.clone(), oid);
            }
        }
        let platform = self.refs.iter().map_err(|e| git(ref_error(e)))?;
        for prefix in &asked.prefixes {
            let relative = <&gix_path::RelativePath>::try_from(prefix.as_str())
                .map_err(|e| git(ref_error(e)))?;
            for r in platform.prefixed(relative)? {
                // A ref that cannot be read, or whose name is not UTF-8,
                // is no branch drover reads.
                let Ok(r) = r else { continue };
                let (Ok(name), Target::Object(id)) =
                    (std::str::from_utf8(r.name.as_bstr()), &r.target)
                else {
                    continue;
                };
                if !name.starts_with(prefix.as_str()) {
                    continue;
                }
                if refs.len() >= asked.max && !refs.contains_key(name) {
                    return Err(super::refs::Error::TooMany {
                        max: asked.max,
                        prefixes: asked.prefixes.join(", "),
                    });
                }
                refs.insert(name.to_owned(), oid(id).map_err(git)?);
            }
        }
        Ok(refs)
    }

    /// Move `branch` from `old` to `new` (`None`: absent). `Ok(false)` when
    /// it is no longer at `old` or another writer holds its lock.
    pub(super) fn update(
        &self,
        branch: &str,
        old: Option<Oid>,
        new: Option<Oid>,
    ) -> Result<bool, git2::Error> {
        let name = FullName::try_from(branch).map_err(ref_error)?;
        let target = |o: Oid| {
            gix_hash::ObjectId::try_from(o.as_bytes())
                .map(Target::Object)
                .map_err(ref_error)
        };
        let expected = match old {
            Some(o) => PreviousValue::MustExistAndMatch(target(o)?),
            None => PreviousValue::MustNotExist,
        };
        let change = match new {
            Some(n) => Change::Update {
                log: LogChange {
                    message: "drover: push".into(),
                    ..Default::default()
                },
                expected,
                new: target(n)?,
            },
            None if old.is_none() => return Ok(true),
            None => Change::Delete {
                expected,
                log: RefLog::AndReference,
            },
        };
        let fail = gix_lock::acquire::Fail::Immediately;
        let done = self
            .refs
            .transaction()
            .prepare([RefEdit::new(name, change)], fail, fail)
            .and_then(|t| t.commit(None));
        match done {
            Ok(_) => Ok(true),
            // Refused because the branch moved or is being written: what a
            // remote says of a stale update. Anything else is an error.
            Err(e) if self.lookup(branch)? != old || self.locked(branch) => {
                tracing::debug!(branch, error = %e, "local ref update refused");
                Ok(false)
            }
            Err(e) => Err(ref_error(e)),
        }
    }

    fn locked(&self, branch: &str) -> bool {
        let dir = self.repo.commondir();
        dir.join(format!("{branch}.lock")).exists() || dir.join("packed-refs.lock").exists()
    }
}

/// Where the ref `name` of the cache `repo` points, `None` when it does
/// not exist (the cache holds only the refs asked for).
pub(super) fn lookup(repo: &Repository, name: &str) -> Result<Option<Oid>, git2::Error> {
    match repo.find_reference(name) {
        Ok(r) => Ok(r.resolve()?.target()),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) if e.code() == git2::ErrorCode::InvalidSpec => Ok(None),
        Err(e) => Err(e),
    }
}

/// A repository to build the pack of a fetch from `remote` in: the cache
/// `to` opened anew, with `remote`'s objects as an alternate. libgit2 lists
/// every ref of the repository it builds a pack in (for its tags); the
/// cache holds only the refs asked for.
pub(super) fn pack_source(to: &Repository, remote: &Local) -> Result<Repository, git2::Error> {
    let builder = Repository::open(to.path())?;
    let objects = remote.repo.commondir().join("objects");
    let objects = objects
        .to_str()
        .ok_or_else(|| git2::Error::from_str("the repository's path is not UTF-8"))?;
    builder.odb()?.add_disk_alternate(objects)?;
    Ok(builder)
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
