//! Trust (docs/design.md §6): commit signatures against the listed signers,
//! and ancestry checks.
//!
//! A commit is trusted when its signature verifies against a listed key of
//! its own kind: an SSH signature (sshsig, namespace `git`) against git's
//! allowed-signers file, an OpenPGP signature (what a forge's merge button
//! makes) against a file of armored OpenPGP public keys. Both are checked
//! in pure Rust, so the agent image needs neither `ssh-keygen` nor `gpg`,
//! and no keyring or agent state can change a verdict. The signed data is
//! the commit object without its `gpgsig` header, as git itself signs it.
//!
//! Either kind of key has a validity window, from the allowed-signers line
//! (`valid-after`, `valid-before`) or from the OpenPGP key itself
//! (creation, expiry, revocation; `openpgp.rs`), and the key must be valid
//! both at the time the commit claims and when the commit was first seen.

mod openpgp;
mod signers;

pub use openpgp::OpenPgpKeys;
pub use signers::{AllowedSigners, SignerEntry};

use git2::{Oid, Repository, Sort};
use serde::{Deserialize, Serialize};
use ssh_key::{HashAlg, SshSig};
use std::fmt;

/// The sshsig namespace git uses for commit signatures.
pub const GIT_NAMESPACE: &str = "git";

/// Errors of the trust layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A commit was refused; the change must not be applied.
    #[error("{0}")]
    Refused(Refusal),
    /// A signers file (allowed signers, OpenPGP keys) could not be read or parsed.
    #[error("{path}{}: {message}", if *line > 0 { format!(":{line}") } else { String::new() })]
    Signers {
        /// File path.
        path: String,
        /// 1-based line, 0 when the file could not be read.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Reading the repository failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
}

/// How much of the history must be signed (`verify` in the agent config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Nothing is checked.
    Off,
    /// Only the new head must be signed.
    Head,
    /// Every commit between the last applied commit and the new head must be signed.
    #[default]
    All,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Mode::Off),
            "head" => Ok(Mode::Head),
            "all" => Ok(Mode::All),
            _ => Err(format!(
                "unknown verify mode `{s}`; expected off, head or all"
            )),
        }
    }
}

/// Why a commit was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// The commit carries no signature.
    Unsigned,
    /// The signature is neither an SSH nor an OpenPGP signature, or cannot be parsed.
    UnsupportedSignature {
        /// Detail.
        detail: String,
    },
    /// The signing key is not listed (for its kind: SSH or OpenPGP).
    UnknownKey {
        /// SHA256 fingerprint of the SSH key, or `OpenPGP key <fingerprint>`.
        fingerprint: String,
    },
    /// The signature does not match the commit.
    BadSignature {
        /// Principal of the key that supposedly signed.
        principal: String,
    },
    /// The signature's namespace is not `git`, or the key is not allowed for `git`.
    WrongNamespace {
        /// The namespace found in the signature.
        namespace: String,
        /// Principal of the key.
        principal: String,
    },
    /// The key's end (`valid-before`, an OpenPGP expiry) is at or before
    /// the commit time (for OpenPGP, also the signature's own time).
    Expired {
        /// Principal of the key.
        principal: String,
        /// Which end: `valid-before`, or the OpenPGP expiry with its time.
        limit: String,
    },
    /// The key's start (`valid-after`, an OpenPGP key's creation) is after the commit time.
    NotYetValid {
        /// Principal of the key.
        principal: String,
        /// Which start: `valid-after`, or the OpenPGP creation with its time.
        limit: String,
    },
    /// The key's end had passed when the commit was first seen (fetched by
    /// the agent; for `drover verify`, the time of the check), whatever its
    /// commit time says: a backdated commit by a retired key.
    ExpiredWhenSeen {
        /// Principal of the key.
        principal: String,
        /// When the commit was first seen (RFC 3339).
        seen: String,
        /// Which end.
        limit: String,
    },
    /// The key's start was still ahead when the commit was first seen.
    NotYetValidWhenSeen {
        /// Principal of the key.
        principal: String,
        /// When the commit was first seen (RFC 3339).
        seen: String,
        /// Which start.
        limit: String,
    },
    /// The OpenPGP key (or its primary key) is revoked: for a compromised
    /// key whenever the commit was made, for a superseded or retired one
    /// from the revocation's time (at the commit time or when first seen).
    Revoked {
        /// Principal of the key.
        principal: String,
        /// The revocation: its reason and, when it counts from a time, which.
        detail: String,
    },
    /// The new head does not descend from the last applied commit (force-push or rollback).
    NotDescendant {
        /// The last applied commit.
        last: String,
    },
}

impl Reason {
    /// Short machine-readable name (`unsigned`, `unknown_key`, ...).
    pub fn code(&self) -> &'static str {
        match self {
            Reason::Unsigned => "unsigned",
            Reason::UnsupportedSignature { .. } => "unsupported_signature",
            Reason::UnknownKey { .. } => "unknown_key",
            Reason::BadSignature { .. } => "bad_signature",
            Reason::WrongNamespace { .. } => "wrong_namespace",
            Reason::Expired { .. } | Reason::ExpiredWhenSeen { .. } => "expired_key",
            Reason::NotYetValid { .. } | Reason::NotYetValidWhenSeen { .. } => "key_not_yet_valid",
            Reason::Revoked { .. } => "revoked_key",
            Reason::NotDescendant { .. } => "not_descendant",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Unsigned => write!(f, "unsigned: the commit carries no signature"),
            Reason::UnsupportedSignature { detail } => write!(f, "unsupported signature: {detail}"),
            Reason::UnknownKey { fingerprint } => write!(
                f,
                "unknown key: {fingerprint} is not listed (SSH keys in --allowed-signers, OpenPGP keys in --openpgp-keys)"
            ),
            Reason::BadSignature { principal } => write!(
                f,
                "bad signature: the signature by {principal}'s key does not match the commit"
            ),
            Reason::WrongNamespace { namespace, principal } => write!(
                f,
                "wrong namespace: signed in namespace `{namespace}` by {principal}, expected `git` and a key allowed for it"
            ),
            Reason::Expired { principal, limit } => {
                write!(f, "expired key: {principal}'s key was no longer valid at the commit time ({limit})")
            }
            Reason::NotYetValid { principal, limit } => {
                write!(f, "key not yet valid: {principal}'s key was not valid yet at the commit time ({limit})")
            }
            Reason::ExpiredWhenSeen { principal, seen, limit } => write!(
                f,
                "expired key: {principal}'s key was no longer valid when the commit was first seen at {seen} ({limit}), whatever its commit time says"
            ),
            Reason::NotYetValidWhenSeen { principal, seen, limit } => write!(
                f,
                "key not yet valid: {principal}'s key was not valid yet when the commit was first seen at {seen} ({limit})"
            ),
            Reason::Revoked { principal, detail } => {
                write!(f, "revoked key: {principal}'s OpenPGP key {detail}")
            }
            Reason::NotDescendant { last } => write!(
                f,
                "not descending: the new head does not descend from the last trusted commit {last} (force-push or rollback)"
            ),
        }
    }
}

/// A refused commit and the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The commit that failed.
    pub commit: String,
    /// Why.
    #[serde(flatten)]
    pub reason: Reason,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "commit {} refused: {}", self.commit, self.reason)
    }
}

fn refused(commit: Oid, reason: Reason) -> Error {
    Error::Refused(Refusal {
        commit: commit.to_string(),
        reason,
    })
}

/// A commit whose signature verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// The commit.
    pub commit: String,
    /// Principals of the allowed-signers line that matched, or the OpenPGP key's user ID.
    pub principal: String,
    /// SHA256 fingerprint of the SSH key, or the OpenPGP signing key's fingerprint (hex).
    pub fingerprint: String,
}

/// Who may sign: the SSH keys of an allowed-signers file and the keys of an
/// OpenPGP key file. Each kind vouches only for signatures of its kind.
#[derive(Debug, Clone, Copy)]
pub struct Signers<'a> {
    /// git's SSH allowed signers.
    pub ssh: &'a AllowedSigners,
    /// Armored OpenPGP public keys.
    pub openpgp: &'a OpenPgpKeys,
}

impl Signers<'static> {
    /// Nobody: every signature is refused (for `verify = off`, where none is read).
    pub const NONE: Signers<'static> = Signers {
        ssh: &AllowedSigners::EMPTY,
        openpgp: &OpenPgpKeys::EMPTY,
    };
}

impl<'a> From<&'a AllowedSigners> for Signers<'a> {
    /// SSH signers only (status reports, `drover log --allowed-signers`).
    fn from(ssh: &'a AllowedSigners) -> Self {
        Signers {
            ssh,
            openpgp: Signers::NONE.openpgp,
        }
    }
}

/// Verify one commit's signature against `signers`, at the commit's
/// committer time only (for showing who signed; the trust check of
/// [`check`] also uses when the commit was first seen, [`verify_commit_seen`]).
pub fn verify_commit<'a>(
    repo: &Repository,
    oid: Oid,
    signers: impl Into<Signers<'a>>,
) -> Result<Verified, Error> {
    verify_commit_inner(repo, oid, signers.into(), None)
}

/// [`verify_commit`], with the key's validity also checked at `seen`
/// (seconds since the epoch): when the commit was first seen, a time the
/// signer cannot choose.
pub fn verify_commit_seen<'a>(
    repo: &Repository,
    oid: Oid,
    signers: impl Into<Signers<'a>>,
    seen: i64,
) -> Result<Verified, Error> {
    verify_commit_inner(repo, oid, signers.into(), Some(seen))
}

/// [`verify_commit`] (with [`verify_commit_seen`]'s `seen` when known) of
/// a commit the status reader has loaded, with its committer time (seconds
/// since the epoch) and its object's size (from its header): the signature
/// is taken from the loaded commit rather than by reading the object again,
/// as libgit2 takes it ([`signed_parts_loaded`]).
pub fn verify_loaded_commit<'a>(
    repo: &Repository,
    commit: &git2::Commit<'_>,
    size: usize,
    signers: impl Into<Signers<'a>>,
    time: i64,
    seen: Option<i64>,
) -> Result<Verified, Error> {
    let oid = commit.id();
    let (sig, data) = match signed_parts_loaded(commit, size) {
        Some(Some(parts)) => parts,
        Some(None) => return Err(refused(oid, Reason::Unsigned)),
        None => {
            let (sig, data) = signed_parts(repo, oid)?;
            (sig.to_vec(), data.to_vec())
        }
    };
    verify_buffer(oid, &sig, &data, time, seen, signers.into()).map_err(|r| refused(oid, r))
}

/// A commit's signature and the bytes it signs.
type SignedParts = (Vec<u8>, Vec<u8>);

/// The signature (`gpgsig` header) of a loaded commit and the data it
/// signs, split exactly as libgit2's `git_commit_extract_signature` splits
/// the object: `Some(None)` when it has none, `None` when the loaded commit
/// cannot give its object's bytes back (a NUL byte in it, or no blank line
/// after its header: libgit2's copies of both parts stop short) or the
/// header is malformed, so the caller asks libgit2 itself.
fn signed_parts_loaded(commit: &git2::Commit<'_>, size: usize) -> Option<Option<SignedParts>> {
    let (header, message) = (commit.raw_header_bytes(), commit.message_raw_bytes());
    if header.len() + 1 + message.len() != size {
        return None;
    }
    let mut buf = Vec::with_capacity(size);
    buf.extend_from_slice(header);
    buf.push(b'\n');
    buf.extend_from_slice(message);
    extract_signature(&buf, b"gpgsig").ok()
}

/// libgit2's `git_commit__extract_signature` over the bytes of a commit
/// object that holds no NUL (so its C string walk sees all of it): the
/// first line that starts with `field` and a space, with the lines after it
/// that start with a space, is the signature; every other byte is signed,
/// except the name of a line that starts with `field` but no space (libgit2
/// skips it). `Err` where libgit2 says the header is malformed.
fn extract_signature(buf: &[u8], field: &[u8]) -> Result<Option<SignedParts>, ()> {
    let newline = |from: usize| {
        buf.get(from..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
            .map(|i| from + i)
    };
    let mut signed = Vec::with_capacity(buf.len());
    let mut at = 0;
    while let Some(nl) = newline(at).filter(|nl| nl + 1 < buf.len()) {
        if !buf[at..].starts_with(field) {
            signed.extend_from_slice(&buf[at..=nl]);
            at = nl + 1;
            continue;
        }
        let name_end = at + field.len();
        if buf[name_end] != b' ' {
            at = name_end;
            continue;
        }
        let mut eol = newline(name_end).ok_or(())?;
        let mut sig = buf[name_end + 1..eol].to_vec();
        while buf.get(eol + 1) == Some(&b' ') {
            sig.push(b'\n');
            let start = eol + 2;
            eol = newline(start).ok_or(())?;
            sig.extend_from_slice(&buf[start..eol]);
        }
        signed.extend_from_slice(&buf[eol + 1..]);
        return Ok(Some((sig, signed)));
    }
    Ok(None)
}

/// A commit's signature and the data it signs.
fn signed_parts(repo: &Repository, oid: Oid) -> Result<(git2::Buf, git2::Buf), Error> {
    match repo.extract_signature(&oid, None) {
        Ok(pair) => Ok(pair),
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            // extract_signature also says NotFound for a missing commit; tell them apart.
            repo.find_commit(oid)?;
            Err(refused(oid, Reason::Unsigned))
        }
        Err(e) => Err(e.into()),
    }
}

fn verify_commit_inner(
    repo: &Repository,
    oid: Oid,
    signers: Signers<'_>,
    seen: Option<i64>,
) -> Result<Verified, Error> {
    let (sig, data) = signed_parts(repo, oid)?;
    let time = repo.find_commit(oid)?.committer().when().seconds();
    verify_buffer(oid, &sig, &data, time, seen, signers).map_err(|r| refused(oid, r))
}

/// The largest signature read: an RSA-4096 OpenPGP signature is under 1 KiB
/// armored, and the commit is attacker-controlled.
const MAX_SIGNATURE_BYTES: usize = 16 * 1024;

/// Verify the armored signature `armored` over `data` made at `time`, first
/// seen at `seen` when known (seconds since the epoch), with the listed keys of its kind.
fn verify_buffer(
    oid: Oid,
    armored: &[u8],
    data: &[u8],
    time: i64,
    seen: Option<i64>,
    signers: Signers<'_>,
) -> Result<Verified, Reason> {
    let unsupported = |detail: &str| Reason::UnsupportedSignature {
        detail: detail.into(),
    };
    if armored.len() > MAX_SIGNATURE_BYTES {
        return Err(unsupported(&format!(
            "a signature of {} bytes; at most {} KiB are read",
            armored.len(),
            MAX_SIGNATURE_BYTES / 1024
        )));
    }
    let text = std::str::from_utf8(armored).unwrap_or("").trim();
    if text.starts_with("-----BEGIN SSH SIGNATURE-----") {
        verify_ssh(oid, text, data, time, seen, signers.ssh)
    } else if text.starts_with("-----BEGIN PGP SIGNATURE-----") {
        verify_openpgp(oid, text, data, time, seen, signers.openpgp)
    } else {
        Err(unsupported(
            "neither an SSH nor an OpenPGP signature (X.509 signatures are not supported)",
        ))
    }
}

/// An sshsig signature, against the allowed-signers lines of its key.
fn verify_ssh(
    oid: Oid,
    text: &str,
    data: &[u8],
    time: i64,
    seen: Option<i64>,
    signers: &AllowedSigners,
) -> Result<Verified, Reason> {
    let sshsig = SshSig::from_pem(text).map_err(|e| Reason::UnsupportedSignature {
        detail: format!("cannot parse the SSH signature: {e}"),
    })?;
    let key = sshsig.public_key();
    let entries: Vec<&SignerEntry> = signers.for_key(key).collect();
    let Some(first) = entries.first() else {
        let fingerprint = ssh_key::PublicKey::from(key.clone())
            .fingerprint(HashAlg::Sha256)
            .to_string();
        return Err(Reason::UnknownKey { fingerprint });
    };
    if sshsig.namespace() != GIT_NAMESPACE {
        return Err(Reason::WrongNamespace {
            namespace: sshsig.namespace().to_string(),
            principal: first.principal(),
        });
    }
    if !first.verifies(data, &sshsig) {
        return Err(Reason::BadSignature {
            principal: first.principal(),
        });
    }
    // A key may be listed on several lines (e.g. rotated validity); any line
    // that admits the signature is enough, otherwise report the first line's fault.
    let mut fault = None;
    for e in &entries {
        let verdict = if e.allows_namespace(GIT_NAMESPACE) {
            e.validity().judge((time, time), seen)
        } else {
            Err(Reason::WrongNamespace {
                namespace: sshsig.namespace().to_string(),
                principal: e.principal(),
            })
        };
        match verdict {
            Ok(()) => {
                return Ok(Verified {
                    commit: oid.to_string(),
                    principal: e.principal(),
                    fingerprint: e.key.fingerprint(HashAlg::Sha256).to_string(),
                })
            }
            Err(reason) => {
                fault.get_or_insert(reason);
            }
        }
    }
    Err(fault.unwrap_or(Reason::BadSignature {
        principal: first.principal(),
    }))
}

/// An OpenPGP signature, against the listed OpenPGP key that made it. The
/// key must be valid at the commit time and at the signature's own time
/// (both the signer's claims), and when the commit was first seen.
fn verify_openpgp(
    oid: Oid,
    text: &str,
    data: &[u8],
    time: i64,
    seen: Option<i64>,
    keys: &OpenPgpKeys,
) -> Result<Verified, Reason> {
    let found = keys.verify(text, data)?;
    if let Some(why) = found.hard_revocation() {
        return Err(Reason::Revoked {
            principal: found.principal().to_string(),
            detail: format!("is revoked ({why}): nothing it signed is trusted, whenever"),
        });
    }
    let claimed = (time.min(found.signed), time.max(found.signed));
    found.validity().judge(claimed, seen)?;
    Ok(Verified {
        commit: oid.to_string(),
        principal: found.principal().to_string(),
        fingerprint: found.fingerprint(),
    })
}

/// When a listed key may sign, from its list entry or from the key itself.
struct Validity {
    principal: String,
    after: Option<Bound>,
    before: Option<Bound>,
}

/// One end of a key's validity.
struct Bound {
    at: i64,
    limit: Limit,
}

/// What sets a [`Bound`].
enum Limit {
    ValidAfter,
    ValidBefore,
    Created,
    Expires,
    /// A soft OpenPGP revocation (superseded, retired), with its reason.
    Revoked(String),
}

impl Bound {
    fn describe(&self) -> String {
        match &self.limit {
            Limit::ValidAfter => "valid-after".into(),
            Limit::ValidBefore => "valid-before".into(),
            Limit::Created => format!("OpenPGP key created {}", rfc3339(self.at)),
            Limit::Expires => format!("OpenPGP key expired {}", rfc3339(self.at)),
            Limit::Revoked(why) => why.clone(),
        }
    }

    /// The refusal for a time at or past this end; `seen` when that time is the first sighting.
    fn passed(&self, principal: &str, seen: Option<i64>) -> Reason {
        let principal = principal.to_string();
        match (&self.limit, seen) {
            (Limit::Revoked(why), None) => Reason::Revoked {
                principal,
                detail: format!(
                    "was revoked ({why}) at {}, before the commit time",
                    rfc3339(self.at)
                ),
            },
            (Limit::Revoked(why), Some(s)) => Reason::Revoked {
                principal,
                detail: format!(
                    "was revoked ({why}) at {}, before the commit was first seen at {}",
                    rfc3339(self.at),
                    rfc3339(s)
                ),
            },
            (_, None) => Reason::Expired {
                principal,
                limit: self.describe(),
            },
            (_, Some(s)) => Reason::ExpiredWhenSeen {
                principal,
                seen: rfc3339(s),
                limit: self.describe(),
            },
        }
    }
}

impl Validity {
    /// Whether the key was valid over `claimed` (the earliest and latest
    /// time the signer states) and at `seen`, when the commit was first seen.
    fn judge(&self, claimed: (i64, i64), seen: Option<i64>) -> Result<(), Reason> {
        let principal = || self.principal.clone();
        if let Some(a) = self.after.as_ref().filter(|a| claimed.0 < a.at) {
            return Err(Reason::NotYetValid {
                principal: principal(),
                limit: a.describe(),
            });
        }
        if let Some(b) = self.before.as_ref().filter(|b| claimed.1 >= b.at) {
            return Err(b.passed(&self.principal, None));
        }
        let Some(s) = seen else { return Ok(()) };
        if let Some(a) = self.after.as_ref().filter(|a| s < a.at) {
            return Err(Reason::NotYetValidWhenSeen {
                principal: principal(),
                seen: rfc3339(s),
                limit: a.describe(),
            });
        }
        if let Some(b) = self.before.as_ref().filter(|b| s >= b.at) {
            return Err(b.passed(&self.principal, Some(s)));
        }
        Ok(())
    }
}

impl SignerEntry {
    fn validity(&self) -> Validity {
        Validity {
            principal: self.principal(),
            after: self.valid_after.map(|at| Bound {
                at,
                limit: Limit::ValidAfter,
            }),
            before: self.valid_before.map(|at| Bound {
                at,
                limit: Limit::ValidBefore,
            }),
        }
    }
}

fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| secs.to_string())
}

/// Outcome of an accepted [`check`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Checked {
    /// The head that was checked.
    pub head: String,
    /// Number of commits whose signature was verified.
    pub checked: usize,
    /// The head's signer, when the head was verified.
    pub head_signer: Option<Verified>,
}

/// The trust check of docs/design.md §6 for moving from `last` (the last applied,
/// trusted commit; `None` on first start) to `head`.
///
/// In `head` and `all` modes `head` must equal or descend from `last`. In
/// `all` mode every commit reachable from `head` and not from `last` (all
/// parents, not only first parents) is verified, oldest first, so the refusal
/// names the earliest bad commit. Without `last`, `all` checks every commit
/// reachable from `head`.
///
/// A key must be valid both at a commit's committer time and at
/// `seen(commit)`, when the checker first saw the commit (seconds since the
/// epoch): the agent's fetch record, or the time of the check where there
/// is no such record (`drover verify`).
pub fn check<'a>(
    repo: &Repository,
    mode: Mode,
    signers: impl Into<Signers<'a>>,
    last: Option<Oid>,
    head: Oid,
    seen: &dyn Fn(Oid) -> i64,
) -> Result<Checked, Error> {
    let signers = signers.into();
    let mut out = Checked {
        head: head.to_string(),
        checked: 0,
        head_signer: None,
    };
    if mode == Mode::Off {
        return Ok(out);
    }
    if let Some(last) = last {
        // A last commit missing from the fetched history (it was force-pushed
        // away) cannot be an ancestor of the head.
        let known = repo.find_commit(last).is_ok();
        if last != head && (!known || !repo.graph_descendant_of(head, last)?) {
            return Err(refused(
                head,
                Reason::NotDescendant {
                    last: last.to_string(),
                },
            ));
        }
    }
    match mode {
        Mode::Off => {}
        Mode::Head => {
            out.head_signer = Some(verify_commit_seen(repo, head, signers, seen(head))?);
            out.checked = 1;
        }
        Mode::All => {
            let mut walk = repo.revwalk()?;
            walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
            walk.push(head)?;
            if let Some(last) = last {
                walk.hide(last)?;
            }
            for oid in walk {
                let oid = oid?;
                let v = verify_commit_seen(repo, oid, signers, seen(oid))?;
                out.checked += 1;
                if oid == head {
                    out.head_signer = Some(v);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Header lines and message lines a commit may carry, the awkward ones
    /// included: a signature field with and without continuation lines, a
    /// field that only starts like it, one in the message, a NUL byte.
    const HEADERS: &[&str] = &[
        "gpgsig -----BEGIN SSH SIGNATURE-----\n U1NIU0lH\n -----END SSH SIGNATURE-----\n",
        "gpgsig one-line\n",
        "gpgsig \n",
        "gpgsigx not a signature\n",
        "gpgsig-sha256 other\n",
        "encoding ISO-8859-1\n",
        "mergetag object 0000000000000000000000000000000000000000\n type commit\n",
        "x-extra value\n",
    ];
    const MESSAGES: &[&str] = &[
        "status: stage-1 confirmed 1.13.0\n",
        "gpgsig in the message\n",
        "two\n\nparagraphs\n",
        "",
        "no newline at the end",
        "a NUL \0 inside\n",
        " starts with a space\n",
    ];

    proptest! {
        /// The signature taken from a loaded commit is libgit2's own,
        /// byte for byte, whenever it is taken there at all; the rest are
        /// left to libgit2.
        #[test]
        fn a_loaded_commit_splits_as_libgit2_splits_it(
            headers in proptest::collection::vec(0..HEADERS.len(), 0..4),
            message in 0..MESSAGES.len(),
            blank in any::<bool>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let repo = Repository::init(dir.path()).unwrap();
            let tree = repo.treebuilder(None).unwrap().write().unwrap();
            let mut raw = format!(
                "tree {tree}\nauthor A <a@example.com> 1700000000 +0000\ncommitter A <a@example.com> 1700000000 +0000\n"
            );
            for h in &headers {
                raw.push_str(HEADERS[*h]);
            }
            if blank {
                raw.push('\n');
            }
            raw.push_str(MESSAGES[message]);
            let oid = repo.odb().unwrap().write(git2::ObjectType::Commit, raw.as_bytes()).unwrap();
            let commit = repo.find_commit(oid).unwrap();
            let libgit2 = repo.extract_signature(&oid, None);
            match signed_parts_loaded(&commit, raw.len()) {
                Some(Some((sig, data))) => {
                    let (s, d) = libgit2.expect("libgit2 finds the signature too");
                    prop_assert_eq!(&sig[..], &s[..]);
                    prop_assert_eq!(&data[..], &d[..]);
                }
                Some(None) => prop_assert_eq!(
                    libgit2.err().map(|e| e.code()),
                    Some(git2::ErrorCode::NotFound)
                ),
                // Left to libgit2: only a NUL byte or no blank line.
                None => prop_assert!(!blank || raw.contains('\0')),
            }
        }
    }
}
