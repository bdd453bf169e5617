//! The first-parent chain of a history, each commit with its tree, taken
//! from git's commit-graph file where git wrote one (as `git log` does) and
//! from the object store past it; and trees read raw, the one or two names
//! wanted looked up in place. A graph found inconsistent (a position past
//! its end, a loop) is dropped and the walk starts over without it.

use super::Error;
use git2::{Oid, Repository};

/// Tree `id` read raw: its entries are looked up in place, without
/// libgit2 building a tree object (an allocation and a parse of every entry)
/// for the one or two names a walk asks of it.
pub(super) fn raw_tree<'o>(odb: &'o git2::Odb<'_>, id: Oid) -> Result<git2::OdbObject<'o>, Error> {
    let obj = odb.read(id)?;
    if obj.kind() != git2::ObjectType::Tree {
        return Err(Error::NotATree(id));
    }
    Ok(obj)
}

/// The entries of raw tree `id` (`data`), in order; a malformed one is an error.
pub(super) fn tree_entries(
    id: Oid,
    data: &[u8],
) -> impl Iterator<Item = Result<gix_object::tree::EntryRef<'_>, Error>> {
    gix_object::TreeRefIter::from_bytes(data, gix_hash::Kind::Sha1)
        .map(move |e| e.map_err(|_| Error::NotATree(id)))
}

pub(super) fn to_oid(id: &gix_hash::oid) -> Oid {
    Oid::from_bytes(id.as_bytes()).expect("a tree entry id is 20 bytes")
}

/// `(file name, blob id)` of the `.toml` files in tree `dir`, or only of
/// `<only>.toml`.
pub(super) fn toml_entries(
    odb: &git2::Odb<'_>,
    dir: Option<Oid>,
    only: Option<&str>,
) -> Result<Vec<(String, Oid)>, Error> {
    let Some(id) = dir else {
        return Ok(Vec::new());
    };
    let raw = raw_tree(odb, id)?;
    let mut out = Vec::new();
    for e in tree_entries(id, raw.data()) {
        let e = e?;
        let Some(env) = e.filename.strip_suffix(b".toml") else {
            continue;
        };
        match only {
            Some(only) if env != only.as_bytes() => continue,
            Some(only) => return Ok(vec![(only.to_owned(), to_oid(e.oid))]),
            None => {
                if let Ok(env) = std::str::from_utf8(env) {
                    out.push((env.to_owned(), to_oid(e.oid)));
                }
            }
        }
    }
    Ok(out)
}

/// A commit on the first-parent chain and its root tree.
#[derive(Debug, Clone, Copy)]
pub(super) struct Link {
    pub(super) commit: Oid,
    pub(super) tree: Oid,
}

/// The first-parent chain from `head` down to the root, newest first.
///
/// Read from git's commit-graph file when it holds the commits (as `git log`
/// does): it gives each commit's tree and parents without inflating the
/// commit, a third of the objects a walk would otherwise read. Commits newer
/// than the graph are read from the object store.
pub(super) fn first_parents(repo: &Repository, head: Oid) -> Result<Vec<Link>, git2::Error> {
    // A shallow clone's graft points are not in the graph; a graph that
    // cannot be opened is only a slower walk.
    let graph = (!repo.is_shallow())
        .then(|| {
            gix_commitgraph::Graph::from_info_dir(
                &repo.path().join("objects/info"),
                gix_hash::Kind::Sha1,
            )
            .ok()
        })
        .flatten();
    if let Some(graph) = &graph {
        if let Some(chain) = walk(repo, head, Some(graph))? {
            return Ok(chain);
        }
    }
    Ok(walk(repo, head, None)?.unwrap_or_default())
}

/// Walk first parents; `None` when the graph turns out inconsistent (a
/// position out of range, or more steps than it has commits: a loop).
pub(super) fn walk(
    repo: &Repository,
    head: Oid,
    graph: Option<&gix_commitgraph::Graph>,
) -> Result<Option<Vec<Link>>, git2::Error> {
    let mut out = Vec::new();
    let mut from_graph: u64 = 0;
    let mut next = Some(head);
    while let Some(id) = next {
        let known = match graph {
            Some(g) => match graph_step(g, id) {
                Step::Found(tree, parent) => Some((tree, parent)),
                Step::Absent => None,
                Step::Inconsistent => return Ok(None),
            },
            None => None,
        };
        let (tree, parent) = match known {
            Some(found) => {
                from_graph += 1;
                if graph.is_some_and(|g| from_graph > u64::from(g.num_commits())) {
                    return Ok(None);
                }
                found
            }
            None => {
                let c = repo.find_commit(id)?;
                (c.tree_id(), c.parent_id(0).ok())
            }
        };
        out.push(Link { commit: id, tree });
        next = parent;
    }
    Ok(Some(out))
}

pub(super) enum Step {
    Found(Oid, Option<Oid>),
    Absent,
    Inconsistent,
}

pub(super) fn graph_step(graph: &gix_commitgraph::Graph, id: Oid) -> Step {
    let Ok(key) = gix_hash::oid::try_from_bytes(id.as_bytes()) else {
        return Step::Absent;
    };
    let Some(commit) = graph.commit_by_id(key) else {
        return Step::Absent;
    };
    let Ok(tree) = Oid::from_bytes(commit.root_tree_id().as_bytes()) else {
        return Step::Inconsistent;
    };
    let parent = match commit.iter_parents().next() {
        None => None,
        Some(Ok(pos)) if pos.0 < graph.num_commits() => {
            match Oid::from_bytes(graph.id_at(pos).as_bytes()) {
                Ok(p) => Some(p),
                Err(_) => return Step::Inconsistent,
            }
        }
        Some(_) => return Step::Inconsistent,
    };
    Step::Found(tree, parent)
}

/// Ids of `environments/` and `drover.toml` in root tree `id`.
pub(super) fn root_ids(odb: &git2::Odb<'_>, id: Oid) -> Result<(Option<Oid>, Option<Oid>), Error> {
    let raw = raw_tree(odb, id)?;
    let (mut dir, mut file) = (None, None);
    for e in tree_entries(id, raw.data()) {
        let e = e?;
        if e.filename == crate::config::ENV_DIR.as_bytes() && e.mode.is_tree() {
            dir = Some(to_oid(e.oid));
        } else if e.filename == crate::config::ROOT_FILE.as_bytes() && e.mode.is_blob() {
            file = Some(to_oid(e.oid));
        }
    }
    Ok((dir, file))
}
