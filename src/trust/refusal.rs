//! Why a commit is refused (docs/design.md §6), said so that a person
//! knows what to do: which commit, which key, and what would be valid.

use serde::Serialize;
use std::fmt;

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
