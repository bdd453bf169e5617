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
//! both at the time the commit claims and when the commit was first seen
//! (`validity.rs`). Why a commit is refused is said in `refusal.rs`.

mod openpgp;
mod refusal;
mod signers;
mod validity;

pub use openpgp::OpenPgpKeys;
pub use refusal::{Reason, Refusal};
pub use signers::{AllowedSigners, SignerEntry};

use git2::{Oid, Repository, Sort};
use serde::{Deserialize, Serialize};
use ssh_key::{HashAlg, SshSig};

fn refused(commit: Oid, reason: Reason) -> Error {
    Error::Refused(Refusal {
        commit: commit.to_string(),
        reason,
    })
}

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
