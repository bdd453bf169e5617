//! Which commits of the chain changed an environment's version or
//! `[promotion] revoked`: tree-entry ids of `environments/<env>.toml`
//! compared between a commit and its parent, a blob read only when its id
//! changed, the candidates read in batches, and each interpreted into a
//! [`Change`] with its signer, or a [`Revocation`].

use super::walk::{root_ids, toml_entries, Link};
use super::{parse_version, pull_request, rfc3339, Change, Error, LogOptions, Revocation};
use crate::trust::{self};
use git2::{Oid, Repository};
use std::collections::{HashMap, HashSet};

/// Where bytes sit in a [`Batch`]'s arena.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    start: usize,
    end: usize,
}

/// What the reading thread hands to the interpreting one; bytes are spans
/// of the batch's arena.
pub(super) enum Read {
    /// A blob's bytes, once per id; `None` when unreadable or over the bound.
    Blob(Oid, Option<Span>),
    /// An environment file whose blob changed in `commit`.
    Candidate {
        env: Span,
        blob: Oid,
        old: Option<Oid>,
        commit: Committed,
    },
}

/// What a change needs from its commit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Committed {
    id: Oid,
    time: i64,
    /// `Name <email>`.
    author: Span,
    message: Span,
    signer: Option<Span>,
    verified: bool,
}

/// Reads go over in batches of this many: one channel hand-over (and
/// wake-up) per read cost more than the parsing it moved.
pub(super) const BATCH: usize = 256;

/// A batch is handed over early once its arena holds this many bytes.
pub(super) const BATCH_BYTES: usize = 1024 * 1024;

/// At most this many batches wait for the interpreter: with blobs bounded
/// at 1 MiB, about 10 MiB in flight at worst (env files are a few hundred
/// bytes in practice).
pub(super) const IN_FLIGHT: usize = 4;

/// Reads and the bytes they point into.
///
/// Batches go back to the reader once interpreted and are reused, so the
/// interpreter never frees what the reader allocated: glibc returns such a
/// block to the reader's malloc arena under that arena's lock, and the two
/// threads then contended on it for every blob and commit.
#[derive(Default)]
pub(super) struct Batch {
    reads: Vec<Read>,
    bytes: Vec<u8>,
}

impl Batch {
    fn put(&mut self, parts: &[&[u8]]) -> Span {
        let start = self.bytes.len();
        for p in parts {
            self.bytes.extend_from_slice(p);
        }
        Span {
            start,
            end: self.bytes.len(),
        }
    }

    fn text(&self, span: Span) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes[span.start..span.end])
    }
}

/// The changes made by the commits of `chain`, each compared with the link
/// after it (its first parent; none after the root).
///
/// Two threads: this one reads objects through libgit2, a second parses the
/// versions and builds the changes meanwhile (about a tenth of the work on a
/// long history). libgit2 handles stay on this thread. A commit is read for
/// every changed file, also when only another key of it changed; the
/// interpreter then drops that candidate.
pub(super) fn changes_along(
    repo: &Repository,
    chain: &[Link],
    opts: &LogOptions<'_>,
) -> Result<(Vec<Change>, Vec<Revocation>), Error> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(IN_FLIGHT);
    let (back_tx, back) = std::sync::mpsc::channel::<Batch>();
    std::thread::scope(|s| {
        let interpreter = s.spawn(move || interpret(rx, back_tx));
        let mut out = Outbox {
            tx,
            back,
            batch: Batch::default(),
            sizes: crate::config::PackedSizes::open(repo),
        };
        let read = read_candidates(repo, chain, opts, &mut out);
        out.flush();
        drop(out);
        let changes = interpreter
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        read.map(|revocations| (changes, revocations))
    })
}

/// Walk `chain` and send every blob and candidate change the interpreter
/// needs, in order; return the revocations (drover.toml changes are rare,
/// so they are read here). Stops early, without error, if the interpreter
/// is gone.
pub(super) fn read_candidates(
    repo: &Repository,
    chain: &[Link],
    opts: &LogOptions<'_>,
    out: &mut Outbox,
) -> Result<Vec<Revocation>, Error> {
    let mut sent: HashSet<Oid> = HashSet::new();
    let mut revocations = Vec::new();
    let odb = repo.odb()?;
    // One scan of each root tree finds both environments/ and drover.toml.
    let root = |link: Option<&Link>| match link {
        Some(l) => root_ids(&odb, l.tree),
        None => Ok((None, None)),
    };
    // Each commit's entries serve as the parent side of one comparison and the
    // child side of the next, so every environments/ tree is read once.
    let entries = |dir: Option<Oid>| toml_entries(&odb, dir, opts.env);
    let Some(first) = chain.first() else {
        return Ok(revocations);
    };
    let (mut dir, mut root_file) = root(Some(first))?;
    let mut now = entries(dir)?;
    for (i, link) in chain.iter().enumerate() {
        let (parent_dir, parent_root_file) = root(chain.get(i + 1))?;
        if root_file != parent_root_file {
            if let Some(id) = root_file {
                let added = revoked_between(repo, parent_root_file, id);
                if !added.is_empty() {
                    let (commit, signer) = committed(repo, link.commit, opts.signers)?;
                    for (version, reason) in added {
                        revocations.push(revocation(&commit, signer.clone(), version, reason));
                    }
                }
            }
        }
        root_file = parent_root_file;
        let before = if parent_dir == dir {
            now.clone()
        } else {
            entries(parent_dir)?
        };
        if dir != parent_dir {
            let mut commit: Option<(git2::Commit<'_>, Option<String>)> = None;
            for (env, id) in &now {
                let old = before.iter().find(|(e, _)| e == env).map(|(_, b)| *b);
                if old == Some(*id) {
                    continue;
                }
                for blob in [Some(*id), old].into_iter().flatten() {
                    if sent.insert(blob) && !out.blob(repo, blob) {
                        return Ok(revocations);
                    }
                }
                let (commit, signer) = match &commit {
                    Some(c) => c,
                    None => commit.insert(committed(repo, link.commit, opts.signers)?),
                };
                if !out.candidate(env, *id, old, commit, signer.as_deref()) {
                    return Ok(revocations);
                }
            }
        }
        dir = parent_dir;
        now = before;
    }
    Ok(revocations)
}

/// The `[promotion] revoked` entries (version, reason) of drover.toml
/// blob `after` that blob `before` does not have. Read leniently, as a pin
/// is: an unreadable file revokes nothing here.
pub(super) fn revoked_between(
    repo: &Repository,
    before: Option<Oid>,
    after: Oid,
) -> Vec<(String, String)> {
    let list = |id: Option<Oid>| -> Vec<(String, String)> {
        let Some(blob) = id.and_then(|id| crate::config::bounded_blob(repo, id).ok()) else {
            return Vec::new();
        };
        let text = String::from_utf8_lossy(blob.content());
        let Ok(doc) = text.parse::<toml::Table>() else {
            return Vec::new();
        };
        let entries = doc
            .get("promotion")
            .and_then(|p| p.get("revoked"))
            .and_then(toml::Value::as_array);
        entries
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let v = e.get("version")?.as_str()?.to_owned();
                let r = e.get("reason").and_then(|r| r.as_str()).unwrap_or("");
                Some((v, r.to_owned()))
            })
            .collect()
    };
    let old = list(before);
    list(Some(after))
        .into_iter()
        .filter(|(v, _)| !old.iter().any(|(o, _)| o == v))
        .collect()
}

pub(super) fn revocation(
    commit: &git2::Commit<'_>,
    signer: Option<String>,
    version: String,
    reason: String,
) -> Revocation {
    let author = commit.author();
    Revocation {
        version,
        reason,
        commit: commit.id().to_string(),
        date: rfc3339(commit.committer().when().seconds()),
        author: format!(
            "{} <{}>",
            String::from_utf8_lossy(author.name_bytes()),
            String::from_utf8_lossy(author.email_bytes())
        ),
        verified: signer.is_some(),
        signer,
        pr: pull_request(&String::from_utf8_lossy(commit.message_bytes())),
    }
}

/// The reading side of the hand-over, sending [`BATCH`] reads at a time.
pub(super) struct Outbox {
    tx: std::sync::mpsc::SyncSender<Batch>,
    back: std::sync::mpsc::Receiver<Batch>,
    batch: Batch,
    sizes: crate::config::PackedSizes,
}

impl Outbox {
    /// Queue blob `id`'s bytes; false once the interpreter is gone.
    ///
    /// Bounded: an oversized (or non-blob) entry reads as unreadable, never loaded.
    fn blob(&mut self, repo: &Repository, id: Oid) -> bool {
        let bytes = crate::config::bounded_blob_sized(repo, id, &mut self.sizes)
            .ok()
            .map(|b| self.batch.put(&[b.content()]));
        self.push(Read::Blob(id, bytes))
    }

    /// Queue a candidate change of `env` made by `commit`; false once the interpreter is gone.
    fn candidate(
        &mut self,
        env: &str,
        blob: Oid,
        old: Option<Oid>,
        commit: &git2::Commit<'_>,
        signer: Option<&str>,
    ) -> bool {
        let b = &mut self.batch;
        let author = commit.author();
        let committed = Committed {
            id: commit.id(),
            time: commit.committer().when().seconds(),
            author: b.put(&[author.name_bytes(), b" <", author.email_bytes(), b">"]),
            message: b.put(&[commit.message_bytes()]),
            signer: signer.map(|s| b.put(&[s.as_bytes()])),
            verified: signer.is_some(),
        };
        let env = b.put(&[env.as_bytes()]);
        self.push(Read::Candidate {
            env,
            blob,
            old,
            commit: committed,
        })
    }

    fn push(&mut self, read: Read) -> bool {
        self.batch.reads.push(read);
        (self.batch.reads.len() < BATCH && self.batch.bytes.len() < BATCH_BYTES) || self.flush()
    }

    /// Hand over what is queued; false once the interpreter is gone.
    fn flush(&mut self) -> bool {
        let fresh = self.back.try_recv().unwrap_or_default();
        let full = std::mem::replace(&mut self.batch, fresh);
        self.tx.send(full).is_ok()
    }
}

/// Parse versions and build the changes, in the order they were read;
/// each batch goes back through `back` once done.
pub(super) fn interpret(
    rx: std::sync::mpsc::Receiver<Batch>,
    back: std::sync::mpsc::Sender<Batch>,
) -> Vec<Change> {
    let mut versions: HashMap<Oid, String> = HashMap::new();
    let mut out = Vec::new();
    for mut batch in rx {
        for read in &batch.reads {
            match *read {
                Read::Blob(id, bytes) => {
                    let v = match bytes {
                        Some(b) => parse_version(&batch.bytes[b.start..b.end]),
                        None => "(unreadable)".to_string(),
                    };
                    versions.insert(id, v);
                }
                Read::Candidate {
                    env,
                    blob,
                    old,
                    commit,
                } => {
                    // Every blob is sent before the first candidate naming it.
                    let version = versions.get(&blob).cloned().unwrap_or_default();
                    let previous = old.map(|o| versions.get(&o).cloned().unwrap_or_default());
                    // Another key of the file changed; the version did not.
                    if previous.as_deref() == Some(version.as_str()) {
                        continue;
                    }
                    out.push(Change {
                        env: batch.text(env).into_owned(),
                        version,
                        previous,
                        commit: commit.id.to_string(),
                        date: rfc3339(commit.time),
                        author: batch.text(commit.author).into_owned(),
                        signer: commit.signer.map(|s| batch.text(s).into_owned()),
                        verified: commit.verified,
                        pr: pull_request(&batch.text(commit.message)),
                        confirmations: Vec::new(),
                        failures: Vec::new(),
                    });
                }
            }
        }
        batch.reads.clear();
        batch.bytes.clear();
        // The reader is gone once it has sent its last batch.
        let _ = back.send(batch);
    }
    out
}

/// Read commit `id` and, when `signers` are given, the principal that
/// signed it (`None` when not verified).
pub(super) fn committed<'r>(
    repo: &'r Repository,
    id: Oid,
    signers: Option<trust::Signers<'_>>,
) -> Result<(git2::Commit<'r>, Option<String>), Error> {
    let signer = match signers {
        Some(s) => match trust::verify_commit(repo, id, s) {
            Ok(v) => Some(v.principal),
            Err(trust::Error::Refused(_)) => None,
            Err(e) => return Err(e.into()),
        },
        None => None,
    };
    Ok((repo.find_commit(id)?, signer))
}
