//! The audit trail: version changes from git history, with signers,
//! confirmations and failures from the status branches, and the
//! revocations of `[promotion] revoked` (`drover log`).
//!
//! Fast on long histories: it walks first parents only (merges of reviewed
//! pull requests are the changes), taking each commit's tree and parent from
//! git's commit-graph file where git wrote one, compares tree-entry ids of
//! `environments/<env>.toml` between a commit and its parent instead of
//! diffing trees, and reads a blob only when its id changed. Trees are read
//! raw and the one or two names wanted are looked up in place.
//!
//! The commit-graph is trusted as `git log` trusts it: it is local state of
//! the clone being read. One that is inconsistent (a position past its end, a
//! loop) is dropped and the walk starts over from the object store.

use crate::config::Pin;
use crate::trust::{self, AllowedSigners};
use chrono::{SecondsFormat, TimeZone, Utc};
use git2::{Oid, Repository};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

/// Errors of the audit trail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the repository failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    /// An object the history names as a tree is not one, or is malformed.
    #[error("git: object {0} is not a well-formed tree")]
    NotATree(Oid),
    /// Checking a signature failed for a reason other than a refusal.
    #[error(transparent)]
    Trust(#[from] trust::Error),
}

/// A cluster's confirmation of a version, from the status branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confirmation {
    /// Environment.
    pub env: String,
    /// Cluster.
    pub cluster: String,
    /// Confirmed version.
    pub version: String,
    /// When the cluster confirmed (RFC 3339 UTC).
    pub since: String,
    /// Config commit the agent was applying.
    pub config_commit: String,
    /// Status-branch commit that recorded the confirmation.
    pub status_commit: String,
}

/// One version change of one environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Environment.
    pub env: String,
    /// New version.
    pub version: String,
    /// Version before the change; `None` when the file was created.
    pub previous: Option<String>,
    /// The commit (on the first-parent history) that made the change.
    pub commit: String,
    /// Committer date, RFC 3339 UTC.
    pub date: String,
    /// Author, `Name <email>`.
    pub author: String,
    /// Principal of the verified signer; `None` without allowed signers or when not verified.
    pub signer: Option<String>,
    /// Whether the signature verified against the allowed signers.
    pub verified: bool,
    /// Pull request number from the message (`Merge pull request #N`, `(#N)`).
    pub pr: Option<u64>,
    /// Confirmations of this version by the environment's clusters.
    pub confirmations: Vec<Confirmation>,
    /// `failed` reports of this version by the environment's clusters.
    pub failures: Vec<Failure>,
}

/// A cluster's `failed` report of a version, from the status branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Environment.
    pub env: String,
    /// Cluster.
    pub cluster: String,
    /// The version it failed to reach.
    pub version: String,
    /// When the rollout failed (RFC 3339 UTC).
    pub since: String,
    /// Why, as the agent reported it.
    pub message: String,
    /// Status-branch commit that recorded the failure.
    pub status_commit: String,
}

/// A version added to `[promotion] revoked` of drover.toml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Revocation {
    /// The revoked version.
    pub version: String,
    /// Why, as recorded.
    pub reason: String,
    /// The commit (on the first-parent history) that revoked it.
    pub commit: String,
    /// Committer date, RFC 3339 UTC.
    pub date: String,
    /// Author, `Name <email>`.
    pub author: String,
    /// Principal of the verified signer.
    pub signer: Option<String>,
    /// Whether the signature verified against the allowed signers.
    pub verified: bool,
    /// Pull request number from the message.
    pub pr: Option<u64>,
}

/// What `drover log` lists: the version changes and the revocations, each newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct History {
    /// Version changes, newest first.
    pub changes: Vec<Change>,
    /// Revocations, newest first.
    pub revocations: Vec<Revocation>,
}

/// What to list.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogOptions<'a> {
    /// Only this environment.
    pub env: Option<&'a str>,
    /// Verify signers against these (SSH and OpenPGP keys).
    pub signers: Option<trust::Signers<'a>>,
    /// Status store whose confirmations to attach.
    pub status: Option<&'a crate::status::Store>,
    /// Keys whose reports count (`report_signers` of the config); `None` trusts none.
    pub report_signers: Option<&'a AllowedSigners>,
}

fn parse_version(content: &[u8]) -> String {
    match crate::config::read_pin(&String::from_utf8_lossy(content)) {
        Pin::Set(v) | Pin::NotAString(v) => v,
        Pin::Missing => "(none)".into(),
        Pin::Unreadable => "(invalid)".into(),
    }
}

/// `Merge pull request #N` (GitHub merges) or `(#N)` (squash merges) in the message.
pub fn pull_request(message: &str) -> Option<u64> {
    static MERGE: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"Merge pull request #(\d+)").expect("valid regex"));
    static SQUASH: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"\(#(\d+)\)").expect("valid regex"));
    MERGE
        .captures(message)
        .or_else(|| SQUASH.captures(message.lines().next().unwrap_or("")))
        .and_then(|c| c[1].parse().ok())
}

fn rfc3339(seconds: i64) -> String {
    Utc.timestamp_opt(seconds, 0)
        .single()
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// Tree `id` read raw: its entries are looked up in place, without
/// libgit2 building a tree object (an allocation and a parse of every entry)
/// for the one or two names a walk asks of it.
fn raw_tree<'o>(odb: &'o git2::Odb<'_>, id: Oid) -> Result<git2::OdbObject<'o>, Error> {
    let obj = odb.read(id)?;
    if obj.kind() != git2::ObjectType::Tree {
        return Err(Error::NotATree(id));
    }
    Ok(obj)
}

/// The entries of raw tree `id` (`data`), in order; a malformed one is an error.
fn tree_entries(
    id: Oid,
    data: &[u8],
) -> impl Iterator<Item = Result<gix_object::tree::EntryRef<'_>, Error>> {
    gix_object::TreeRefIter::from_bytes(data, gix_hash::Kind::Sha1)
        .map(move |e| e.map_err(|_| Error::NotATree(id)))
}

fn to_oid(id: &gix_hash::oid) -> Oid {
    Oid::from_bytes(id.as_bytes()).expect("a tree entry id is 20 bytes")
}

/// `(file name, blob id)` of the `.toml` files in tree `dir`, or only of
/// `<only>.toml`.
fn toml_entries(
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
struct Link {
    commit: Oid,
    tree: Oid,
}

/// Version changes reachable from `head` along first parents, newest first.
pub fn version_history(
    repo: &Repository,
    head: Oid,
    opts: &LogOptions<'_>,
) -> Result<Vec<Change>, Error> {
    Ok(history(repo, head, opts)?.changes)
}

/// Version changes and revocations reachable from `head` along first
/// parents, newest first, with the status branches' confirmations and
/// failures beside the changes they concern.
pub fn history(repo: &Repository, head: Oid, opts: &LogOptions<'_>) -> Result<History, Error> {
    let chain = first_parents(repo, head)?;
    // Objects are read on this thread only: libgit2 shares one reader per
    // pack file among all handles, behind mutexes, so a second reading thread
    // only waited on the first (BENCHMARKS.md, "drover log").
    let (mut changes, revocations) = changes_along(repo, &chain, opts)?;
    if let Some(store) = opts.status {
        for c in confirmations(repo, store, opts.report_signers)? {
            if let Some(ch) = concerned(&mut changes, &c.env, &c.version, &c.since) {
                ch.confirmations.push(c);
            }
        }
        for f in failures(repo, store, opts.report_signers)? {
            if let Some(ch) = concerned(&mut changes, &f.env, &f.version, &f.since) {
                ch.failures.push(f);
            }
        }
    }
    Ok(History {
        changes,
        revocations,
    })
}

/// The first-parent chain from `head` down to the root, newest first.
///
/// Read from git's commit-graph file when it holds the commits (as `git log`
/// does): it gives each commit's tree and parents without inflating the
/// commit, a third of the objects a walk would otherwise read. Commits newer
/// than the graph are read from the object store.
fn first_parents(repo: &Repository, head: Oid) -> Result<Vec<Link>, git2::Error> {
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
fn walk(
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

enum Step {
    Found(Oid, Option<Oid>),
    Absent,
    Inconsistent,
}

fn graph_step(graph: &gix_commitgraph::Graph, id: Oid) -> Step {
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

/// Where bytes sit in a [`Batch`]'s arena.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
}

/// What the reading thread hands to the interpreting one; bytes are spans
/// of the batch's arena.
enum Read {
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
struct Committed {
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
const BATCH: usize = 256;

/// A batch is handed over early once its arena holds this many bytes.
const BATCH_BYTES: usize = 1024 * 1024;

/// At most this many batches wait for the interpreter: with blobs bounded
/// at 1 MiB, about 10 MiB in flight at worst (env files are a few hundred
/// bytes in practice).
const IN_FLIGHT: usize = 4;

/// Reads and the bytes they point into.
///
/// Batches go back to the reader once interpreted and are reused, so the
/// interpreter never frees what the reader allocated: glibc returns such a
/// block to the reader's malloc arena under that arena's lock, and the two
/// threads then contended on it for every blob and commit.
#[derive(Default)]
struct Batch {
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
fn changes_along(
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
fn read_candidates(
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

/// Ids of `environments/` and `drover.toml` in root tree `id`.
fn root_ids(odb: &git2::Odb<'_>, id: Oid) -> Result<(Option<Oid>, Option<Oid>), Error> {
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

/// The `[promotion] revoked` entries (version, reason) of drover.toml
/// blob `after` that blob `before` does not have. Read leniently, as a pin
/// is: an unreadable file revokes nothing here.
fn revoked_between(repo: &Repository, before: Option<Oid>, after: Oid) -> Vec<(String, String)> {
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

fn revocation(
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
struct Outbox {
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
fn interpret(
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
fn committed<'r>(
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

/// Every standing confirmation in the status store, read by
/// the one report reader (`status::confirmations_in`): only reports signed by
/// their own cluster's key in `report_signers` count, and a later `failed`
/// withdraws a confirmation.
pub fn confirmations(
    repo: &Repository,
    status: &crate::status::Store,
    report_signers: Option<&AllowedSigners>,
) -> Result<Vec<Confirmation>, Error> {
    // `drover log` has no `--now`: the clock judges which status commits are
    // dated in the future.
    let found = crate::status::confirmations_in(repo, status, report_signers, chrono::Utc::now())?;
    let mut out: Vec<Confirmation> = found
        .standing()
        .map(|(env, cluster, version, s)| Confirmation {
            env: env.to_owned(),
            cluster: cluster.to_owned(),
            version: version.to_string(),
            since: s.at.to_rfc3339_opts(SecondsFormat::Secs, true),
            config_commit: s.config_commit.clone(),
            status_commit: s.status_commit.to_string(),
        })
        .collect();
    out.sort_by(|a, b| (&a.since, &a.cluster).cmp(&(&b.since, &b.cluster)));
    Ok(out)
}

/// Every `failed` report in the status store, once per failed run (the
/// reader's trusted reports only: signed by their own cluster's key).
pub fn failures(
    repo: &Repository,
    status: &crate::status::Store,
    report_signers: Option<&AllowedSigners>,
) -> Result<Vec<Failure>, Error> {
    // As for confirmations, the clock judges which status commits are dated in the future.
    let all = crate::status::trusted_reports(repo, status, report_signers, Utc::now(), |v, r| {
        (r.state == crate::rollout::RolloutState::Failed).then(|| Failure {
            env: r.env.clone(),
            cluster: r.cluster.clone(),
            version: r.version.to_string(),
            since: r.since.to_rfc3339_opts(SecondsFormat::Secs, true),
            message: r.message.clone(),
            status_commit: v.commit.to_string(),
        })
    })?;
    let mut out: Vec<Failure> = Vec::new();
    for f in all {
        // Every report of one failed run has the same `since`: keep the first.
        if !out.iter().any(|o| {
            (&o.env, &o.cluster, &o.version, &o.since) == (&f.env, &f.cluster, &f.version, &f.since)
        }) {
            out.push(f);
        }
    }
    out.sort_by(|a, b| (&a.since, &a.cluster).cmp(&(&b.since, &b.cluster)));
    Ok(out)
}

/// The change a report of `version` in `env` at `at` concerns: the newest
/// change of that environment to that version made before it, else the
/// oldest such change.
fn concerned<'c>(
    changes: &'c mut [Change],
    env: &str,
    version: &str,
    at: &str,
) -> Option<&'c mut Change> {
    // Changes are newest first; RFC 3339 UTC strings of equal shape compare as times.
    let i = changes
        .iter()
        .position(|ch| ch.env == env && ch.version == version && ch.date.as_str() <= at)
        .or_else(|| {
            changes
                .iter()
                .rposition(|ch| ch.env == env && ch.version == version)
        })?;
    changes.get_mut(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_request_conventions() {
        assert_eq!(
            pull_request("Merge pull request #42 from team/bump\n\nBump"),
            Some(42)
        );
        assert_eq!(
            pull_request("Bump stage to 1.2.3 (#7)\n\nbody (#9)"),
            Some(7)
        );
        assert_eq!(pull_request("Bump stage\n\nsee (#9)"), None);
        assert_eq!(pull_request("no number"), None);
    }

    #[test]
    fn version_key_only() {
        assert_eq!(
            parse_version(b"version = \"1.2.3\"\n[window]\nx = 1\n"),
            "1.2.3"
        );
        assert_eq!(parse_version(b"[window]\n"), "(none)");
        assert_eq!(parse_version(b"version = "), "(invalid)");
    }
}
