//! Trust (docs/design.md §6): SSH commit signatures against an allowed-signers file, and ancestry checks.
//!
//! Signatures are checked in pure Rust (sshsig format, namespace `git`), so
//! the agent image needs no `ssh-keygen`. The signed data is the commit
//! object without its `gpgsig` header, as git itself signs it.

mod signers;

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
    /// The allowed-signers file could not be read or parsed.
    #[error("{path}:{line}: {message}")]
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
    /// The signature is not an SSH signature or cannot be parsed.
    UnsupportedSignature {
        /// Detail.
        detail: String,
    },
    /// The signing key is not in the allowed-signers file.
    UnknownKey {
        /// SHA256 fingerprint of the signing key.
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
    /// The key's `valid-before` is at or before the commit time.
    Expired {
        /// Principal of the key.
        principal: String,
    },
    /// The key's `valid-after` is after the commit time.
    NotYetValid {
        /// Principal of the key.
        principal: String,
    },
    /// The key's `valid-before` had passed when the commit was first seen
    /// (fetched by the agent; for `drover verify`, the time of the check),
    /// whatever its commit time says: a backdated commit by a retired key.
    ExpiredWhenSeen {
        /// Principal of the key.
        principal: String,
        /// When the commit was first seen (RFC 3339).
        seen: String,
    },
    /// The key's `valid-after` was still ahead when the commit was first seen.
    NotYetValidWhenSeen {
        /// Principal of the key.
        principal: String,
        /// When the commit was first seen (RFC 3339).
        seen: String,
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
            Reason::NotDescendant { .. } => "not_descendant",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Unsigned => write!(f, "unsigned: the commit carries no signature"),
            Reason::UnsupportedSignature { detail } => write!(f, "unsupported signature: {detail}"),
            Reason::UnknownKey { fingerprint } => {
                write!(f, "unknown key: {fingerprint} is not in the allowed signers")
            }
            Reason::BadSignature { principal } => write!(
                f,
                "bad signature: the signature by {principal}'s key does not match the commit"
            ),
            Reason::WrongNamespace { namespace, principal } => write!(
                f,
                "wrong namespace: signed in namespace `{namespace}` by {principal}, expected `git` and a key allowed for it"
            ),
            Reason::Expired { principal } => {
                write!(f, "expired key: {principal}'s key was no longer valid at the commit time (valid-before)")
            }
            Reason::NotYetValid { principal } => {
                write!(f, "key not yet valid: {principal}'s key was not valid yet at the commit time (valid-after)")
            }
            Reason::ExpiredWhenSeen { principal, seen } => write!(
                f,
                "expired key: {principal}'s key was no longer valid when the commit was first seen at {seen} (valid-before), whatever its commit time says"
            ),
            Reason::NotYetValidWhenSeen { principal, seen } => write!(
                f,
                "key not yet valid: {principal}'s key was not valid yet when the commit was first seen at {seen} (valid-after)"
            ),
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
    /// Principals of the allowed-signers line that matched.
    pub principal: String,
    /// SHA256 fingerprint of the key.
    pub fingerprint: String,
}

/// Verify one commit's SSH signature against `signers`, at the commit's
/// committer time only (for showing who signed; the trust check of
/// [`check`] also uses when the commit was first seen, [`verify_commit_seen`]).
pub fn verify_commit(
    repo: &Repository,
    oid: Oid,
    signers: &AllowedSigners,
) -> Result<Verified, Error> {
    verify_commit_inner(repo, oid, signers, None)
}

/// [`verify_commit`], with the key's validity also checked at `seen`
/// (seconds since the epoch): when the commit was first seen, a time the
/// signer cannot choose.
pub fn verify_commit_seen(
    repo: &Repository,
    oid: Oid,
    signers: &AllowedSigners,
    seen: i64,
) -> Result<Verified, Error> {
    verify_commit_inner(repo, oid, signers, Some(seen))
}

fn verify_commit_inner(
    repo: &Repository,
    oid: Oid,
    signers: &AllowedSigners,
    seen: Option<i64>,
) -> Result<Verified, Error> {
    let (sig, data) = match repo.extract_signature(&oid, None) {
        Ok(pair) => pair,
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            // extract_signature also says NotFound for a missing commit; tell them apart.
            repo.find_commit(oid)?;
            return Err(refused(oid, Reason::Unsigned));
        }
        Err(e) => return Err(e.into()),
    };
    let time = repo.find_commit(oid)?.committer().when().seconds();
    verify_buffer(oid, &sig, &data, time, seen, signers)
}

/// Verify an sshsig `armored` signature over `data` made at `time`, first
/// seen at `seen` when known (seconds since the epoch).
fn verify_buffer(
    oid: Oid,
    armored: &[u8],
    data: &[u8],
    time: i64,
    seen: Option<i64>,
    signers: &AllowedSigners,
) -> Result<Verified, Error> {
    let text = std::str::from_utf8(armored).unwrap_or("");
    if !text
        .trim_start()
        .starts_with("-----BEGIN SSH SIGNATURE-----")
    {
        let detail = if text.contains("BEGIN PGP") {
            "OpenPGP signature; only SSH signatures (gpg.format=ssh) are supported".to_string()
        } else {
            "not an SSH signature".to_string()
        };
        return Err(refused(oid, Reason::UnsupportedSignature { detail }));
    }
    let sshsig = SshSig::from_pem(text.trim()).map_err(|e| {
        refused(
            oid,
            Reason::UnsupportedSignature {
                detail: format!("cannot parse the SSH signature: {e}"),
            },
        )
    })?;
    let key = sshsig.public_key();
    let entries: Vec<&SignerEntry> = signers.for_key(key).collect();
    let Some(first) = entries.first() else {
        let fingerprint = ssh_key::PublicKey::from(key.clone())
            .fingerprint(HashAlg::Sha256)
            .to_string();
        return Err(refused(oid, Reason::UnknownKey { fingerprint }));
    };
    if sshsig.namespace() != GIT_NAMESPACE {
        return Err(refused(
            oid,
            Reason::WrongNamespace {
                namespace: sshsig.namespace().to_string(),
                principal: first.principal(),
            },
        ));
    }
    if first.key.verify(GIT_NAMESPACE, data, &sshsig).is_err() {
        return Err(refused(
            oid,
            Reason::BadSignature {
                principal: first.principal(),
            },
        ));
    }
    // A key may be listed on several lines (e.g. rotated validity); any line
    // that admits the signature is enough, otherwise report the first line's fault.
    let mut fault = None;
    for e in &entries {
        let reason = if !e.allows_namespace(GIT_NAMESPACE) {
            Reason::WrongNamespace {
                namespace: sshsig.namespace().to_string(),
                principal: e.principal(),
            }
        } else if e.valid_after.is_some_and(|t| time < t) {
            Reason::NotYetValid {
                principal: e.principal(),
            }
        } else if e.valid_before.is_some_and(|t| time >= t) {
            Reason::Expired {
                principal: e.principal(),
            }
        } else if let Some(s) = seen.filter(|s| e.valid_after.is_some_and(|t| *s < t)) {
            Reason::NotYetValidWhenSeen {
                principal: e.principal(),
                seen: rfc3339(s),
            }
        } else if let Some(s) = seen.filter(|s| e.valid_before.is_some_and(|t| *s >= t)) {
            Reason::ExpiredWhenSeen {
                principal: e.principal(),
                seen: rfc3339(s),
            }
        } else {
            return Ok(Verified {
                commit: oid.to_string(),
                principal: e.principal(),
                fingerprint: e.key.fingerprint(HashAlg::Sha256).to_string(),
            });
        };
        fault.get_or_insert(reason);
    }
    Err(refused(
        oid,
        fault.unwrap_or(Reason::BadSignature {
            principal: first.principal(),
        }),
    ))
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
pub fn check(
    repo: &Repository,
    mode: Mode,
    signers: &AllowedSigners,
    last: Option<Oid>,
    head: Oid,
    seen: &dyn Fn(Oid) -> i64,
) -> Result<Checked, Error> {
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
