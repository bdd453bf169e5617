//! Where config files are read from: a directory on disk or a git tree, and
//! the bounds every read obeys (docs/design.md §8, invariant 8).
//!
//! A config repository may come from a hostile pull request, so a file is
//! only read when it is a regular file inside the repository (a symlink is
//! followed only while it stays inside) and at most [`MAX_FILE_BYTES`] long.
//! The type and size are checked before any byte is read: a FIFO never
//! blocks, `/dev/zero` is never read, a 50 MB file is never loaded.

use super::packed::PackedSizes;
use git2::{Blob, ObjectType, Oid, Repository};
use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

/// The largest config file drover reads (1 MiB); real ones are a few KiB.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// How many symlinks one path may pass through in a git tree (as the
/// kernel's ELOOP guard does on disk).
const MAX_LINK_HOPS: usize = 8;

/// What a directory entry is, for reporting entries that are not config files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file (or a symlink to one inside the repository).
    File,
    /// A directory (or a git subtree).
    Directory,
    /// A symlink that cannot be followed inside the repository.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character or block device.
    Device,
    /// A git submodule.
    Submodule,
    /// A name that is not UTF-8.
    BadName,
}

impl EntryKind {
    /// How the kind reads in a message ("a directory", "a FIFO", ...).
    pub fn describe(self) -> &'static str {
        match self {
            EntryKind::File => "a regular file",
            EntryKind::Directory => "a directory",
            EntryKind::Symlink => "a symlink that leaves the repository or leads nowhere",
            EntryKind::Fifo => "a FIFO (named pipe)",
            EntryKind::Socket => "a socket",
            EntryKind::Device => "a device",
            EntryKind::Submodule => "a git submodule",
            EntryKind::BadName => "an entry whose name is not UTF-8",
        }
    }
}

/// One entry of a listed directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (lossy when [`EntryKind::BadName`]).
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
}

/// Read-only access to the files of a config repository at one state.
pub trait Files {
    /// The bytes of `path` (relative, `/`-separated): `Ok(None)` if absent,
    /// `Err(why)` if it exists but is refused (not a regular file, outside
    /// the repository, larger than [`MAX_FILE_BYTES`]); `why` says what
    /// would be valid.
    fn read(&self, path: &str) -> Result<Option<Vec<u8>>, String>;
    /// Every entry directly inside directory `dir`, sorted by name (empty
    /// when `dir` is absent).
    fn list(&self, dir: &str) -> Vec<DirEntry>;
}

/// What the files of a config repository are called in messages.
const CONFIG_FILES: &str = "config files";

fn too_large(size: u64, what: &str) -> String {
    format!("the file is {size} bytes; {what} must be at most {MAX_FILE_BYTES} bytes (1 MiB)")
}

/// The message for a git object that could not be read.
fn cannot_read(e: git2::Error) -> String {
    format!("cannot read: {}", e.message())
}

fn not_regular(kind: EntryKind, what: &str) -> String {
    format!("this is {}; {what} must be regular files", kind.describe())
}

/// The diagnostic for an entry of `environments/` that is not an
/// environment file: reported, so a typo or a planted FIFO is not ignored.
pub fn stray_entry(name: &str, kind: EntryKind) -> crate::diag::Diagnostic {
    let dir = super::ENV_DIR;
    let why = match kind {
        EntryKind::File => format!(
            "`{name}` is not an environment file: {dir}/ holds only files named <env>.toml; \
             rename it or move it out of {dir}/"
        ),
        kind => format!(
            "`{name}` is {}: {dir}/ holds only regular files named <env>.toml; remove it",
            kind.describe()
        ),
    };
    crate::diag::Diagnostic::file(format!("{dir}/{name}"), why)
}

/// The bytes of the regular file at `path` (symlinks followed), at most
/// [`MAX_FILE_BYTES`]. The type and size are checked before reading, and
/// the open does not block, so a FIFO, a device or a 50 MB file costs an
/// error saying what would be valid. For any file drover reads that a
/// repository or a person supplies (config files, allowed signers).
/// `what` names such files in the messages ("config files").
pub fn read_regular(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read it: {}", crate::diag::io_words(&e)))?;
    let kind = kind_of(meta.file_type());
    if kind != EntryKind::File {
        return Err(not_regular(kind, what));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large(meta.len(), what));
    }
    // O_NONBLOCK: if the file was swapped for a FIFO since the check,
    // opening it still returns at once, and the checks below refuse it.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot read it: {}", crate::diag::io_words(&e)))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read it: {}", crate::diag::io_words(&e)))?;
    if !meta.is_file() {
        return Err(not_regular(kind_of(meta.file_type()), what));
    }
    let mut bytes = Vec::with_capacity(meta.len().min(MAX_FILE_BYTES) as usize);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {}", crate::diag::io_words(&e)))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(bytes.len() as u64, what));
    }
    Ok(bytes)
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

    /// `full` resolved, provided it stays inside the (resolved) root.
    fn inside(&self, full: &Path) -> Result<PathBuf, String> {
        let root = self
            .root
            .canonicalize()
            .map_err(|e| format!("cannot resolve the repository directory: {e}"))?;
        let resolved = full.canonicalize().map_err(|e| {
            format!("this is a symlink that cannot be resolved ({e}); config files must be regular files inside the repository")
        })?;
        if resolved.starts_with(&root) {
            Ok(resolved)
        } else {
            Err(format!(
                "this resolves to {}, outside the repository; config files must be regular files inside it",
                resolved.display()
            ))
        }
    }
}

fn kind_of(t: std::fs::FileType) -> EntryKind {
    use std::os::unix::fs::FileTypeExt as _;
    if t.is_file() {
        EntryKind::File
    } else if t.is_dir() {
        EntryKind::Directory
    } else if t.is_symlink() {
        EntryKind::Symlink
    } else if t.is_fifo() {
        EntryKind::Fifo
    } else if t.is_socket() {
        EntryKind::Socket
    } else {
        EntryKind::Device
    }
}

impl Files for DirFiles {
    fn read(&self, path: &str) -> Result<Option<Vec<u8>>, String> {
        let full = self.root.join(path);
        // symlink_metadata never opens the file, so a FIFO cannot block here.
        match std::fs::symlink_metadata(&full) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read it: {}", crate::diag::io_words(&e))),
            Ok(_) => {}
        }
        // Every component resolved, so neither the file nor a directory on
        // its way may lead out of the repository.
        let resolved = self.inside(&full)?;
        read_regular(&resolved, CONFIG_FILES).map(Some)
    }

    fn list(&self, dir: &str) -> Vec<DirEntry> {
        let mut out: Vec<DirEntry> = std::fs::read_dir(self.root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| {
                let (name, bad) = match e.file_name().into_string() {
                    Ok(n) => (n, false),
                    Err(n) => (n.to_string_lossy().into_owned(), true),
                };
                let kind = match e.file_type().map(kind_of) {
                    _ if bad => EntryKind::BadName,
                    // A symlink counts as what it leads to, when that is
                    // inside the repository; otherwise it is reported.
                    Ok(EntryKind::Symlink) => match self.inside(&e.path()) {
                        Ok(p) => std::fs::metadata(p)
                            .map(|m| kind_of(m.file_type()))
                            .unwrap_or(EntryKind::Symlink),
                        Err(_) => EntryKind::Symlink,
                    },
                    Ok(k) => k,
                    Err(_) => EntryKind::Symlink,
                };
                DirEntry { name, kind }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// A config repository as it is in one git tree (a commit's snapshot).
pub struct GitTreeFiles<'r> {
    repo: &'r Repository,
    tree: git2::Tree<'r>,
}

impl<'r> GitTreeFiles<'r> {
    /// Files of `tree` in `repo`.
    pub fn new(repo: &'r Repository, tree: git2::Tree<'r>) -> Self {
        Self { repo, tree }
    }

    /// Files of the commit that `rev` (any rev-parse spec) names.
    pub fn at_rev(repo: &'r Repository, rev: &str) -> Result<Self, git2::Error> {
        let tree = repo.revparse_single(rev)?.peel_to_tree()?;
        Ok(Self { repo, tree })
    }

    /// Follow `path` through the tree, resolving symlinks that stay inside
    /// it: the blob it ends at, or what it is instead.
    fn resolve(&self, path: &str) -> Result<Option<Oid>, String> {
        let mut path = normalize(Path::new(path)).ok_or_else(|| {
            "the path leaves the repository; config files must be inside it".to_string()
        })?;
        for _ in 0..=MAX_LINK_HOPS {
            let entry = match self.tree.get_path(&path) {
                Ok(e) => e,
                Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
                Err(e) => return Err(cannot_read(e)),
            };
            match (entry.kind(), entry.filemode()) {
                (Some(ObjectType::Blob), 0o120000) => {
                    // A symlink's blob holds its target, relative to its directory.
                    let target = bounded_blob(self.repo, entry.id())?;
                    let target = String::from_utf8_lossy(target.content()).into_owned();
                    let joined = path.parent().unwrap_or(Path::new("")).join(&target);
                    path = match normalize(&joined) {
                        Some(p) if !Path::new(&target).is_absolute() => p,
                        _ => {
                            return Err(format!(
                                "this is a symlink to {target}, outside the repository; config files must be regular files inside it"
                            ))
                        }
                    };
                }
                (Some(ObjectType::Blob), _) => return Ok(Some(entry.id())),
                (Some(ObjectType::Tree), _) => {
                    return Err(not_regular(EntryKind::Directory, CONFIG_FILES))
                }
                _ => return Err(not_regular(EntryKind::Submodule, CONFIG_FILES)),
            }
        }
        Err(format!(
            "more than {MAX_LINK_HOPS} symlinks in a row; config files must be regular files inside the repository"
        ))
    }
}

/// `path` with `.` and `..` folded, or `None` when it climbs out of the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Load blob `id` only if it is at most [`MAX_FILE_BYTES`]: its size is read
/// from the object header first, so an oversized blob is never inflated.
/// The error says how large it is and what would be valid.
pub fn bounded_blob(repo: &Repository, id: Oid) -> Result<Blob<'_>, String> {
    let odb = repo.odb().map_err(cannot_read)?;
    let (size, kind) = odb.read_header(id).map_err(cannot_read)?;
    if kind != ObjectType::Blob {
        return Err(not_regular(EntryKind::Directory, CONFIG_FILES));
    }
    if size as u64 > MAX_FILE_BYTES {
        return Err(too_large(size as u64, CONFIG_FILES));
    }
    repo.find_blob(id).map_err(cannot_read)
}

/// [`bounded_blob`] for one of many blobs of `repo`: the size comes from
/// `sizes` when the blob is packed, so libgit2 does not walk its delta chain
/// for it (see [`PackedSizes`]); the type is checked once it is read.
pub fn bounded_blob_sized<'r>(
    repo: &'r Repository,
    id: Oid,
    sizes: &mut PackedSizes,
) -> Result<Blob<'r>, String> {
    let Some(size) = sizes.size(id) else {
        return bounded_blob(repo, id);
    };
    if size > MAX_FILE_BYTES {
        return Err(too_large(size, CONFIG_FILES));
    }
    repo.find_object(id, None)
        .map_err(cannot_read)?
        .into_blob()
        .map_err(|_| not_regular(EntryKind::Directory, CONFIG_FILES))
}

impl Files for GitTreeFiles<'_> {
    fn read(&self, path: &str) -> Result<Option<Vec<u8>>, String> {
        match self.resolve(path)? {
            Some(id) => Ok(Some(bounded_blob(self.repo, id)?.content().to_vec())),
            None => Ok(None),
        }
    }

    fn list(&self, dir: &str) -> Vec<DirEntry> {
        let Ok(entry) = self.tree.get_path(Path::new(dir)) else {
            return Vec::new();
        };
        let Ok(sub) = self.repo.find_tree(entry.id()) else {
            return Vec::new();
        };
        let mut out: Vec<DirEntry> = sub
            .iter()
            .map(|e| {
                let (name, bad) = match e.name() {
                    Ok(n) => (n.to_owned(), false),
                    Err(_) => (String::from_utf8_lossy(e.name_bytes()).into_owned(), true),
                };
                let kind = match (e.kind(), e.filemode()) {
                    _ if bad => EntryKind::BadName,
                    (Some(ObjectType::Blob), 0o120000) => {
                        match self.resolve(&format!("{dir}/{name}")) {
                            Ok(Some(_)) => EntryKind::File,
                            Ok(None) | Err(_) => EntryKind::Symlink,
                        }
                    }
                    (Some(ObjectType::Blob), _) => EntryKind::File,
                    (Some(ObjectType::Tree), _) => EntryKind::Directory,
                    _ => EntryKind::Submodule,
                };
                DirEntry { name, kind }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_refuses_climbing_out() {
        assert_eq!(
            normalize(Path::new("environments/../drover.toml")),
            Some(PathBuf::from("drover.toml"))
        );
        assert_eq!(normalize(Path::new("environments/../../etc/passwd")), None);
        assert_eq!(normalize(Path::new("/etc/passwd")), None);
    }

    #[test]
    fn disk_reads_are_bounded_and_typed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        std::fs::create_dir_all(root.join("environments")).unwrap();
        std::fs::write(root.join("drover.toml"), "x = 1\n").unwrap();
        std::fs::write(tmp.path().join("outside.toml"), "secret\n").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("outside.toml"), root.join("out.toml")).unwrap();
        std::os::unix::fs::symlink("drover.toml", root.join("in.toml")).unwrap();
        let big = std::fs::File::create(root.join("big.toml")).unwrap();
        big.set_len(MAX_FILE_BYTES + 1).unwrap();
        let f = DirFiles::new(&root);
        // Control: a regular file and a symlink that stays inside are read.
        assert_eq!(f.read("drover.toml").unwrap().unwrap(), b"x = 1\n");
        assert_eq!(f.read("in.toml").unwrap().unwrap(), b"x = 1\n");
        assert_eq!(f.read("absent.toml").unwrap(), None);
        assert!(f.read("out.toml").unwrap_err().contains("outside"));
        assert!(f.read("big.toml").unwrap_err().contains("at most 1048576"));
        assert!(f.read("environments").unwrap_err().contains("a directory"));
    }
}
