//! Where config files are read from: a directory on disk or a git tree.

use std::path::{Path, PathBuf};

/// Read-only access to the files of a config repository at one state.
pub trait Files {
    /// The bytes of `path` (relative, `/`-separated), or `None` if absent.
    fn read(&self, path: &str) -> Option<Vec<u8>>;
    /// The file names (not paths) directly inside directory `dir`, sorted.
    fn list(&self, dir: &str) -> Vec<String>;
}

/// A config repository checked out on disk.
pub struct DirFiles {
    root: PathBuf,
}

impl DirFiles {
    /// Files below `root`.
    pub fn new(root: impl AsRef<Path>) -> Self {
        Self {
            root: root.as_ref().to_path_buf(),
        }
    }
}

impl Files for DirFiles {
    fn read(&self, path: &str) -> Option<Vec<u8>> {
        std::fs::read(self.root.join(path)).ok()
    }

    fn list(&self, dir: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }
}

/// A config repository as it is in one git tree (a commit's snapshot).
pub struct GitTreeFiles<'r> {
    repo: &'r git2::Repository,
    tree: git2::Tree<'r>,
}

impl<'r> GitTreeFiles<'r> {
    /// Files of `tree` in `repo`.
    pub fn new(repo: &'r git2::Repository, tree: git2::Tree<'r>) -> Self {
        Self { repo, tree }
    }

    /// Files of the commit that `rev` (any rev-parse spec) names.
    pub fn at_rev(repo: &'r git2::Repository, rev: &str) -> Result<Self, git2::Error> {
        let tree = repo.revparse_single(rev)?.peel_to_tree()?;
        Ok(Self { repo, tree })
    }
}

impl Files for GitTreeFiles<'_> {
    fn read(&self, path: &str) -> Option<Vec<u8>> {
        let entry = self.tree.get_path(Path::new(path)).ok()?;
        let blob = self.repo.find_blob(entry.id()).ok()?;
        Some(blob.content().to_vec())
    }

    fn list(&self, dir: &str) -> Vec<String> {
        let Ok(entry) = self.tree.get_path(Path::new(dir)) else {
            return Vec::new();
        };
        let Ok(sub) = self.repo.find_tree(entry.id()) else {
            return Vec::new();
        };
        let mut names: Vec<String> = sub
            .iter()
            .filter(|e| e.kind() == Some(git2::ObjectType::Blob))
            .filter_map(|e| e.name().ok().map(str::to_owned))
            .collect();
        names.sort();
        names
    }
}
