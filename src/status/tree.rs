//! What one status commit writes, read with bounds (docs/design.md §5):
//! a cluster branch's tree must hold exactly its cluster's report, and a
//! commit of the single branch of the older layout must change exactly one
//! report file against its parent. Every tree is sized from its object
//! header before it is loaded, so a tree of 400,000 files is refused
//! without being read. The whole-branch rule (`branch.rs`) asks this file
//! what each commit writes, and judges the rest.

use git2::{ObjectType, Odb, Oid, Repository, Tree};
use std::cmp::Ordering;

/// Largest tree object of a cluster's branch: one entry with a name of at
/// most 255 bytes.
const MAX_CLUSTER_TREE_BYTES: usize = 512;
/// Largest tree object of the single branch: `status/<env>/` with one file
/// per cluster of the largest fleet read.
const MAX_LEGACY_TREE_BYTES: usize = 1024 * 1024;

/// An object's size from its header, without loading it.
pub(super) fn size_of(odb: &Odb<'_>, oid: Oid) -> Result<usize, git2::Error> {
    Ok(odb.read_header(oid)?.0)
}

/// Load a tree no larger than `max` bytes; `Err` says why not.
fn small_tree<'r>(
    repo: &'r Repository,
    odb: &Odb<'_>,
    oid: Oid,
    max: usize,
    what: &str,
) -> Result<Result<Tree<'r>, String>, git2::Error> {
    let size = size_of(odb, oid)?;
    if size > max {
        return Ok(Err(format!(
            "has a tree {what} of {size} bytes, more than the {max} bytes {} may hold; it is not read",
            if max == MAX_CLUSTER_TREE_BYTES {
                "a cluster's branch (one report)"
            } else {
                "the single status branch"
            }
        )));
    }
    Ok(Ok(repo.find_tree(oid)?))
}

/// The blob of `status/<env>/<cluster>.toml` in a cluster branch's tree,
/// which must hold that file and nothing else.
pub(super) fn cluster_blob(
    repo: &Repository,
    odb: &Odb<'_>,
    tree: Oid,
    env: &str,
    cluster: &str,
) -> Result<Result<Oid, String>, git2::Error> {
    let file = format!("{cluster}.toml");
    let mut at = tree;
    for (level, (name, kind)) in [
        ("status", ObjectType::Tree),
        (env, ObjectType::Tree),
        (file.as_str(), ObjectType::Blob),
    ]
    .into_iter()
    .enumerate()
    {
        let path = ["/", "status/", &format!("status/{env}/")][level].to_owned();
        let t = match small_tree(repo, odb, at, MAX_CLUSTER_TREE_BYTES, &path)? {
            Ok(t) => t,
            Err(why) => return Ok(Err(why)),
        };
        let only = (t.len() == 1).then(|| t.get(0)).flatten();
        match only {
            Some(e) if e.name_bytes() == name.as_bytes() && e.kind() == Some(kind) => at = e.id(),
            _ => {
                let names: Vec<String> = t
                    .iter()
                    .take(3)
                    .map(|e| String::from_utf8_lossy(e.name_bytes()).into_owned())
                    .collect();
                return Ok(Err(format!(
                    "has {} in {path} ({}{}); a cluster's branch holds exactly status/{env}/{file}",
                    match t.len() {
                        0 => "nothing".to_owned(),
                        1 => "one other entry".to_owned(),
                        n => format!("{n} entries"),
                    },
                    names.join(", "),
                    if t.len() > 3 { ", ..." } else { "" }
                )));
            }
        }
    }
    Ok(Ok(at))
}

/// The order git keeps tree entries in (a tree's name compares as if it
/// ended in `/`).
fn git_order(a: &[u8], a_tree: bool, b: &[u8], b_tree: bool) -> Ordering {
    let ta = a.iter().chain(if a_tree { &b"/"[..] } else { &b""[..] });
    let tb = b.iter().chain(if b_tree { &b"/"[..] } else { &b""[..] });
    ta.cmp(tb)
}

/// Entries of a tree as (name, id), checking each has `kind` and, in
/// `env` trees, a `.toml` name, and that they are in git's order.
fn entries(tree: Option<&Tree<'_>>, kind: ObjectType) -> Result<Vec<(Vec<u8>, Oid)>, String> {
    let Some(tree) = tree else {
        return Ok(Vec::new());
    };
    let is_tree = kind == ObjectType::Tree;
    let mut out: Vec<(Vec<u8>, Oid)> = Vec::with_capacity(tree.len());
    for e in tree.iter() {
        let name = e.name_bytes();
        if e.kind() != Some(kind) || (!is_tree && !name.ends_with(b".toml")) {
            return Err(format!(
                "writes {:?}, which is not a status/<env>/<cluster>.toml file",
                String::from_utf8_lossy(name)
            ));
        }
        if let Some((last, _)) = out.last() {
            if git_order(last, is_tree, name, is_tree) != Ordering::Less {
                return Err("has a malformed tree (entries out of order)".into());
            }
        }
        out.push((name.to_vec(), e.id()));
    }
    Ok(out)
}

/// Differences between two sorted entry lists: (name, new, old).
fn changed(
    new: &[(Vec<u8>, Oid)],
    old: &[(Vec<u8>, Oid)],
    is_tree: bool,
) -> Vec<(Vec<u8>, Option<Oid>, Option<Oid>)> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < new.len() || j < old.len() {
        let ord = match (new.get(i), old.get(j)) {
            (Some(a), Some(b)) => git_order(&a.0, is_tree, &b.0, is_tree),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match ord {
            Ordering::Less => {
                out.push((new[i].0.clone(), Some(new[i].1), None));
                i += 1;
            }
            Ordering::Greater => {
                out.push((old[j].0.clone(), None, Some(old[j].1)));
                j += 1;
            }
            Ordering::Equal => {
                if new[i].1 != old[j].1 {
                    out.push((new[i].0.clone(), Some(new[i].1), Some(old[j].1)));
                }
                i += 1;
                j += 1;
            }
        }
        if out.len() > 1 {
            break;
        }
    }
    out
}

/// Trees of the single branch, loaded with their size bound.
fn legacy_tree<'r>(
    repo: &'r Repository,
    odb: &Odb<'_>,
    oid: Option<Oid>,
    what: &str,
) -> Result<Result<Option<Tree<'r>>, String>, git2::Error> {
    match oid {
        None => Ok(Ok(None)),
        Some(o) => Ok(small_tree(repo, odb, o, MAX_LEGACY_TREE_BYTES, what)?.map(Some)),
    }
}

/// The `status` subtree of a single-branch commit's root tree, which holds
/// nothing else (an empty tree is allowed).
pub(super) fn legacy_status(
    repo: &Repository,
    odb: &Odb<'_>,
    root: Oid,
) -> Result<Result<Option<Oid>, String>, git2::Error> {
    let t = match small_tree(repo, odb, root, MAX_CLUSTER_TREE_BYTES, "/")? {
        Ok(t) => t,
        Err(why) => return Ok(Err(why)),
    };
    let only = t.get(0).filter(|_| t.len() == 1);
    Ok(match only {
        None if t.is_empty() => Ok(None),
        Some(e) if e.name_bytes() == b"status" && e.kind() == Some(ObjectType::Tree) => {
            Ok(Some(e.id()))
        }
        _ => Err("has files outside status/; the status branch holds only status/<env>/<cluster>.toml files".into()),
    })
}

/// What a single-branch commit writes: (env, cluster, its new blob or
/// `None` when deleted), or why it breaks the rule.
type LegacyChange = Result<(String, String, Option<Oid>), String>;
/// An entry's name with its new and old object, or why the commit is refused.
type OneChange = Result<Option<(Vec<u8>, Option<Oid>, Option<Oid>)>, String>;

/// The one report file a single-branch commit writes, against its parent.
pub(super) fn legacy_change(
    repo: &Repository,
    odb: &Odb<'_>,
    new_status: Option<Oid>,
    old_status: Option<Oid>,
) -> Result<LegacyChange, git2::Error> {
    let none =
        || Err("writes no report; each commit of the status branch writes exactly one".to_owned());
    if new_status == old_status {
        return Ok(none());
    }
    let env_change = match one_change(
        repo,
        odb,
        new_status,
        old_status,
        "status/",
        ObjectType::Tree,
    )? {
        Ok(change) => change,
        Err(why) => return Ok(Err(why)),
    };
    let Some((env, new_env, old_env)) = env_change else {
        return Ok(none());
    };
    let Ok(env) = String::from_utf8(env) else {
        return Ok(Err("writes an environment whose name is not UTF-8".into()));
    };
    let path = format!("status/{env}/");
    let file_change = match one_change(repo, odb, new_env, old_env, &path, ObjectType::Blob)? {
        Ok(change) => change,
        Err(why) => return Ok(Err(why)),
    };
    let Some((file, blob, _)) = file_change else {
        return Ok(none());
    };
    let cluster = String::from_utf8_lossy(&file);
    let cluster = cluster.strip_suffix(".toml").unwrap_or(&cluster).to_owned();
    Ok(Ok((env, cluster, blob)))
}

/// One changed entry of `kind` between the trees at `path` of two commits'
/// status trees: `None` when nothing changed, a reason when more than one
/// did (a legacy commit writes one environment's one report).
fn one_change(
    repo: &Repository,
    odb: &Odb<'_>,
    new: Option<Oid>,
    old: Option<Oid>,
    path: &str,
    kind: ObjectType,
) -> Result<OneChange, git2::Error> {
    let trees = both(
        legacy_tree(repo, odb, new, path)?,
        legacy_tree(repo, odb, old, path)?,
    );
    let listed =
        trees.and_then(|(n, o)| both(entries(n.as_ref(), kind), entries(o.as_ref(), kind)));
    let (n, o) = match listed {
        Ok(pair) => pair,
        Err(why) => return Ok(Err(why)),
    };
    let mut changes = changed(&n, &o, kind == ObjectType::Tree);
    Ok(match changes.len() {
        0 => Ok(None),
        1 => Ok(changes.pop()),
        _ => Err(more_than_one()),
    })
}

fn more_than_one() -> String {
    "writes more than one report; each commit of the status branch writes exactly one, signed by its cluster's key".into()
}

/// Both reads of a new/old pair, or the first reason either could not be read.
fn both<T>(new: Result<T, String>, old: Result<T, String>) -> Result<(T, T), String> {
    Ok((new?, old?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_orders_a_tree_as_if_its_name_ended_in_a_slash() {
        assert_eq!(git_order(b"a", true, b"a-", true), Ordering::Greater);
        assert_eq!(git_order(b"a", false, b"a-", false), Ordering::Less);
        assert_eq!(
            git_order(b"a.toml", false, b"b.toml", false),
            Ordering::Less
        );
    }

    #[test]
    fn one_change_is_found_and_a_second_stops_the_comparison() {
        let o = |n: u8| Oid::from_bytes(&[n; 20]).unwrap();
        let old = vec![(b"a.toml".to_vec(), o(1)), (b"b.toml".to_vec(), o(2))];
        let new = vec![(b"a.toml".to_vec(), o(1)), (b"b.toml".to_vec(), o(3))];
        assert_eq!(
            changed(&new, &old, false),
            vec![(b"b.toml".to_vec(), Some(o(3)), Some(o(2)))]
        );
        let added = vec![
            (b"0.toml".to_vec(), o(9)),
            (b"a.toml".to_vec(), o(4)),
            (b"b.toml".to_vec(), o(2)),
        ];
        assert_eq!(changed(&added, &old, false).len(), 2);
        assert_eq!(
            changed(&[], &old, false),
            vec![
                (b"a.toml".to_vec(), None, Some(o(1))),
                (b"b.toml".to_vec(), None, Some(o(2)))
            ]
        );
    }
}
