//! What `drover check --base` judges (docs/design.md §7): the merge of
//! HEAD into the base, computed in memory as `git merge-tree` computes it.

use super::Error;
use crate::config::ROOT_FILE;
use crate::diag::Diagnostic;
use git2::{Oid, Repository};

/// What a pull request at `tip` would land on `base`: `tip` itself when it
/// descends from `base` (a fast-forward), `base` when `tip` is behind it
/// with nothing of its own, else the merge of the two computed in memory
/// (as `git merge-tree` does: the trees and the merge commit go to an
/// in-memory object database, nothing is written to the repository). A
/// merge that conflicts is refused, one diagnostic per conflicting file,
/// since what would land cannot be known until the branch is rebased.
pub(super) fn landed(
    repo: &Repository,
    base: Oid,
    tip: Oid,
    base_name: &str,
) -> Result<Result<Oid, Vec<Diagnostic>>, Error> {
    if tip == base || repo.graph_descendant_of(tip, base)? {
        return Ok(Ok(tip));
    }
    if repo.graph_descendant_of(base, tip)? {
        return Ok(Ok(base));
    }
    if repo.merge_base(base, tip).is_err() {
        return Ok(Err(vec![Diagnostic::file(
            ROOT_FILE,
            format!(
                "HEAD and {base_name} share no history, so there is no change to judge: \
                 run drover check --base with the branch the pull request goes into"
            ),
        )]));
    }
    // Highest priority: every object the merge writes goes to memory.
    repo.odb()?.add_new_mempack_backend(1000)?;
    let (b, t) = (repo.find_commit(base)?, repo.find_commit(tip)?);
    let mut index = repo.merge_commits(&b, &t, None)?;
    if index.has_conflicts() {
        let mut files: Vec<String> = index
            .conflicts()?
            .filter_map(Result::ok)
            .filter_map(|c| c.our.or(c.their).or(c.ancestor))
            .map(|e| String::from_utf8_lossy(&e.path).into_owned())
            .collect();
        files.dedup();
        return Ok(Err(files
            .into_iter()
            .take(20)
            .map(|f| {
                Diagnostic::file(
                    f.clone(),
                    format!(
                        "HEAD does not merge cleanly into {base_name}: {f} changed on both \
                         sides, so what the pull request would land is unknown; rebase the \
                         branch onto {base_name} (or merge {base_name} into it), resolve, and \
                         run again"
                    ),
                )
            })
            .collect()));
    }
    let tree = repo.find_tree(index.write_tree_to(repo)?)?;
    let when = git2::Time::new(t.committer().when().seconds(), 0);
    let who = git2::Signature::new("drover", "drover@localhost", &when)?;
    let merged = repo.commit(
        None,
        &who,
        &who,
        &format!("what {tip:.10} would land on {base_name}"),
        &tree,
        &[&b, &t],
    )?;
    Ok(Ok(merged))
}
