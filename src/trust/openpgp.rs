//! OpenPGP commit signatures (what GitHub's merge button and GitLab's
//! instance key make) against a file of armored public keys, as
//! `gpg --export --armor` writes them and as GitHub publishes its web-flow
//! key (`https://github.com/web-flow.gpg`).
//!
//! The file holds keys and nothing else: no principals, no validity options.
//! A key's validity is what its owner published in it, read from the
//! self-signatures that verify:
//!
//! - **creation**: a key is not valid before its creation time (the
//!   `valid-after` of an allowed-signers line);
//! - **expiry**: the newest self-signature's key expiration time, for the
//!   primary key (its newest direct-key signature or user ID
//!   self-certification: a user ID's revocation revokes that user ID and
//!   nothing else, RFC 9580) and, separately, for each subkey (its newest
//!   binding); a subkey ends when its primary does (the `valid-before`);
//! - **revocation**: a revocation of the primary key revokes every subkey. A
//!   revocation giving the reason "superseded" or "retired" (a soft one)
//!   ends the key's validity at the revocation's time, like a
//!   `valid-before`; any other reason, or none, means the key may have been
//!   compromised, and no signature by it is trusted whenever it was made
//!   (RFC 9580, §5.2.3.31).
//!
//! Only keys allowed to sign count: the primary key unless its key flags
//! withhold signing, and subkeys whose binding grants signing and carries
//! the subkey's back-signature. Principals come from the key's primary user
//! ID, for messages only: an OpenPGP key is trusted for what it signs, never
//! through an SSH allowed-signers line, and an SSH key never through this file.

use super::validity::{Bound, Limit, Validity};
use super::Reason;
use pgp::composed::{Deserializable, DetachedSignature, SignedPublicKey, SignedPublicSubKey};
use pgp::crypto::hash::HashAlgorithm;
use pgp::packet::{
    KeyFlags, PublicKey, PublicSubkey, RevocationCode, Signature, SignatureType, SubpacketData,
};
use pgp::ser::Serialize;
use pgp::types::{Fingerprint, KeyDetails, KeyId, PublicParams, Tag};
use std::path::Path;

/// The smallest RSA modulus accepted for a signing key, in bits.
const MIN_RSA_BITS: usize = 2048;

/// The most files read from a directory of keys.
pub const MAX_KEY_FILES: usize = 32;

/// The most bytes read from a directory of keys, all files together.
const MAX_KEY_BYTES: u64 = 1024 * 1024;

/// A parsed file of OpenPGP public keys; parse once and reuse.
#[derive(Debug, Clone, Default)]
pub struct OpenPgpKeys {
    certs: Vec<Cert>,
}

/// One listed key (an OpenPGP certificate): its signing keys and who it names.
#[derive(Debug, Clone)]
struct Cert {
    /// The primary user ID, or the primary fingerprint when it has none.
    principal: String,
    /// The primary key and its signing subkeys, each with its validity.
    keys: Vec<Key>,
}

/// A key that may sign data: the primary key or a subkey.
#[derive(Debug, Clone)]
struct Key {
    material: Material,
    fingerprint: Fingerprint,
    key_id: KeyId,
    created: i64,
    /// When it stops being valid: its own expiry or its primary's, the earlier.
    expires: Option<i64>,
    revoked: Option<Revocation>,
}

#[derive(Debug, Clone)]
enum Material {
    Primary(PublicKey),
    Subkey(PublicSubkey),
}

/// A verified revocation of a key (or of its primary key).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Revocation {
    /// Compromised, or no reason given: nothing it ever signed is trusted.
    Hard(String),
    /// Superseded or retired: valid until `at`.
    Soft { at: i64, why: String },
}

/// A signature that verified against a listed key.
pub(super) struct Match<'k> {
    cert: &'k Cert,
    key: &'k Key,
    /// The signature's creation time, as the signer states it.
    pub signed: i64,
}

impl Match<'_> {
    /// Who the key names.
    pub fn principal(&self) -> &str {
        &self.cert.principal
    }

    /// The signing key's fingerprint, upper-case hex as gpg prints it.
    pub fn fingerprint(&self) -> String {
        hex(&self.key.fingerprint)
    }

    /// A hard revocation: the key is refused whatever the times.
    pub fn hard_revocation(&self) -> Option<&str> {
        match &self.key.revoked {
            Some(Revocation::Hard(why)) => Some(why),
            _ => None,
        }
    }

    /// The key's validity, in the terms the SSH allowed-signers lines use.
    pub fn validity(&self) -> Validity {
        let expiry = self.key.expires.map(|at| Bound {
            at,
            limit: Limit::Expires,
        });
        let soft = match &self.key.revoked {
            Some(Revocation::Soft { at, why }) => Some(Bound {
                at: *at,
                limit: Limit::Revoked(why.clone()),
            }),
            _ => None,
        };
        Validity {
            principal: self.cert.principal.clone(),
            after: Some(Bound {
                at: self.key.created,
                limit: Limit::Created,
            }),
            // Whichever ends the key first is the one to report.
            before: match (expiry, soft) {
                (Some(e), Some(s)) => Some(if s.at <= e.at { s } else { e }),
                (e, s) => e.or(s),
            },
        }
    }
}

impl OpenPgpKeys {
    /// No keys.
    pub const EMPTY: OpenPgpKeys = OpenPgpKeys { certs: Vec::new() };

    /// Read and parse a file of armored public keys, or every file of a
    /// directory (a mounted Secret: one key per Secret key, as Flux reads
    /// `verify.secretRef`; hidden entries such as the kubelet's `..data` are
    /// skipped), each with the bounds of a config file and at most
    /// [`MAX_KEY_FILES`] files and 1 MiB in all.
    pub fn load(path: &Path) -> Result<Self, super::Error> {
        let dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
        if !dir {
            return Self::load_file(path, &mut 0);
        }
        let fail = |message: String| super::Error::Signers {
            path: path.display().to_string(),
            line: 0,
            message,
        };
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| fail(format!("cannot read the directory: {e}")))?
            .filter_map(Result::ok)
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| e.path())
            .collect();
        if files.len() > MAX_KEY_FILES {
            return Err(fail(format!(
                "{} files; at most {MAX_KEY_FILES} key files are read",
                files.len()
            )));
        }
        files.sort();
        let (mut all, mut total) = (OpenPgpKeys::default(), 0);
        for file in files {
            all.certs.extend(Self::load_file(&file, &mut total)?.certs);
        }
        Ok(all)
    }

    /// One key file, its size added to `total` (bounded for a directory).
    fn load_file(path: &Path, total: &mut u64) -> Result<Self, super::Error> {
        let at = |line, message| super::Error::Signers {
            path: path.display().to_string(),
            line,
            message,
        };
        let bytes = crate::config::read_regular(path, "OpenPGP key files").map_err(|m| at(0, m))?;
        *total += bytes.len() as u64;
        if *total > MAX_KEY_BYTES {
            return Err(at(
                0,
                format!(
                    "the key files hold more than {} KiB in all",
                    MAX_KEY_BYTES / 1024
                ),
            ));
        }
        let text =
            String::from_utf8(bytes).map_err(|_| at(0, "the file is not UTF-8 text".into()))?;
        Self::parse(&text).map_err(|(line, message)| at(line, message))
    }

    /// Parse armored public key blocks; blank lines and `#` comments may
    /// stand between them. `Err` names the 1-based line and what is wrong.
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut certs = Vec::new();
        for (line, block) in blocks(text)? {
            let (parsed, _) = SignedPublicKey::from_string_many(block)
                .map_err(|e| (line, format!("cannot read the key block: {e}")))?;
            for cert in parsed {
                let cert = cert.map_err(|e| (line, format!("cannot read a key: {e}")))?;
                certs.push(Cert::of(&cert).map_err(|m| (line, m))?);
            }
        }
        Ok(Self { certs })
    }

    /// True when no key is listed.
    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }

    /// The listed key that made the armored detached signature `armored`
    /// over `data`, once it verifies; otherwise why not.
    pub(super) fn verify(&self, armored: &str, data: &[u8]) -> Result<Match<'_>, Reason> {
        let sig = parse_signature(armored)?;
        let signed = sig
            .created()
            .map(|t| i64::from(t.as_secs()))
            .ok_or_else(|| unsupported("the OpenPGP signature has no creation time".into()))?;
        let fprs = sig.issuer_fingerprint();
        let ids = sig.issuer_key_id();
        let Some(issuer) = fprs.first().map(hex).or_else(|| ids.first().map(hex)) else {
            return Err(unsupported(
                "the OpenPGP signature names no issuer key".into(),
            ));
        };
        let mut candidates = self
            .certs
            .iter()
            .flat_map(|c| c.keys.iter().map(move |k| (c, k)))
            .filter(|(_, k)| fprs.contains(&&k.fingerprint) || ids.contains(&&k.key_id))
            .peekable();
        let Some((first, _)) = candidates.peek().copied() else {
            return Err(Reason::UnknownKey {
                fingerprint: format!("OpenPGP key {issuer}"),
            });
        };
        candidates
            .find(|(_, k)| k.material.verifies(&sig, data))
            .map(|(cert, key)| Match { cert, key, signed })
            .ok_or_else(|| Reason::BadSignature {
                principal: first.principal.clone(),
            })
    }
}

impl Material {
    fn verifies(&self, sig: &Signature, data: &[u8]) -> bool {
        match self {
            Material::Primary(k) => sig.verify(k, data).is_ok(),
            Material::Subkey(k) => sig.verify(k, data).is_ok(),
        }
    }
}

fn unsupported(detail: String) -> Reason {
    Reason::UnsupportedSignature { detail }
}

/// The one binary or text signature of a git `gpgsig` header, with a hash
/// that still resists collisions.
fn parse_signature(armored: &str) -> Result<Signature, Reason> {
    let (sigs, _) = DetachedSignature::from_string_many(armored)
        .map_err(|e| unsupported(format!("cannot parse the OpenPGP signature: {e}")))?;
    let mut sigs = sigs
        .take(2)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unsupported(format!("cannot parse the OpenPGP signature: {e}")))?;
    if sigs.len() != 1 {
        return Err(unsupported(format!(
            "{} OpenPGP signatures where git makes one",
            if sigs.is_empty() { "no" } else { "several" }
        )));
    }
    let sig = sigs.remove(0).signature;
    if !matches!(sig.typ(), Some(SignatureType::Binary | SignatureType::Text)) {
        return Err(unsupported(format!(
            "an OpenPGP signature of type {:?}, not a signature over the commit",
            sig.typ()
        )));
    }
    match sig.hash_alg() {
        Some(
            HashAlgorithm::Sha256
            | HashAlgorithm::Sha384
            | HashAlgorithm::Sha512
            | HashAlgorithm::Sha224
            | HashAlgorithm::Sha3_256
            | HashAlgorithm::Sha3_512,
        ) => Ok(sig),
        // SHA-1 and older: a signer could be made to sign one of two
        // colliding commits and the other would verify too.
        other => Err(unsupported(format!(
            "the OpenPGP signature uses {other:?}; drover accepts SHA-2 and SHA-3 only"
        ))),
    }
}

/// The armored public key blocks of `text`, each with its first line.
fn blocks(text: &str) -> Result<Vec<(usize, &str)>, (usize, String)> {
    const BEGIN: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----";
    const END: &str = "-----END PGP PUBLIC KEY BLOCK-----";
    let mut out = Vec::new();
    let mut open: Option<(usize, usize)> = None;
    let mut offset = 0;
    for (i, raw) in text.split_inclusive('\n').enumerate() {
        let line = raw.trim();
        match open {
            None if line.is_empty() || line.starts_with('#') => {}
            None if line == BEGIN => open = Some((i + 1, offset)),
            None if line.starts_with("-----BEGIN PGP PRIVATE KEY BLOCK") => {
                return Err((
                    i + 1,
                    "a private key: list public keys only (gpg --export --armor KEYID)".into(),
                ))
            }
            None => {
                return Err((
                    i + 1,
                    format!("expected `{BEGIN}` (gpg --export --armor) or a # comment"),
                ))
            }
            Some((first, start)) if line == END => {
                out.push((first, &text[start..offset + raw.len()]));
                open = None;
            }
            Some(_) => {}
        }
        offset += raw.len();
    }
    if let Some((first, _)) = open {
        return Err((first, format!("the key block has no `{END}` line")));
    }
    Ok(out)
}

fn hex(bytes: &impl AsRef<[u8]>) -> String {
    bytes.as_ref().iter().map(|b| format!("{b:02X}")).collect()
}

fn secs(t: pgp::types::Timestamp) -> i64 {
    i64::from(t.as_secs())
}

fn created(sig: &Signature) -> i64 {
    sig.created().map_or(0, secs)
}

/// The key flags a self-signature states, if it states any.
fn stated_flags(sig: &Signature) -> Option<&KeyFlags> {
    sig.config()?
        .hashed_subpackets()
        .find_map(|p| match &p.data {
            SubpacketData::KeyFlags(f) => Some(f),
            _ => None,
        })
}

/// When a key with this creation time and governing self-signature expires.
fn expiry(created: i64, sig: &Signature) -> Option<i64> {
    sig.key_expiration_time()
        .map(|d| i64::from(d.as_secs()))
        .filter(|d| *d > 0)
        .map(|d| created + d)
}

/// The strongest of a key's verified revocations: any hard one, else the earliest soft one.
fn revocation<'s>(sigs: impl Iterator<Item = &'s Signature>) -> Option<Revocation> {
    sigs.map(|s| {
        let why = match s.revocation_reason_code() {
            Some(RevocationCode::KeySuperseded) => Err("key superseded"),
            Some(RevocationCode::KeyRetired) => Err("key retired"),
            Some(RevocationCode::KeyCompromised) => Ok("key compromised"),
            Some(RevocationCode::NoReason) | None => Ok("no reason given"),
            Some(_) => Ok("an unknown reason"),
        };
        match why {
            Ok(hard) => Revocation::Hard(hard.into()),
            Err(soft) => Revocation::Soft {
                at: created(s),
                why: soft.into(),
            },
        }
    })
    .reduce(stronger)
}

fn stronger(a: Revocation, b: Revocation) -> Revocation {
    match (a, b) {
        (h @ Revocation::Hard(_), _) | (_, h @ Revocation::Hard(_)) => h,
        (Revocation::Soft { at: x, why: wx }, Revocation::Soft { at: y, why: wy }) => {
            if x <= y {
                Revocation::Soft { at: x, why: wx }
            } else {
                Revocation::Soft { at: y, why: wy }
            }
        }
    }
}

/// Refuse signing keys too weak to trust (small RSA moduli, DSA).
fn check_strength(params: &PublicParams, fingerprint: &str) -> Result<(), String> {
    match params {
        PublicParams::RSA(rsa) => {
            // An MPI starts with its length in bits (RFC 9580, §3.2); n comes first.
            let bytes = rsa.to_bytes().map_err(|e| e.to_string())?;
            let bits = bytes
                .get(..2)
                .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
            if bits < MIN_RSA_BITS {
                return Err(format!(
                    "signing key {fingerprint} is RSA with {bits} bits: too weak, drover accepts RSA of at least {MIN_RSA_BITS} bits, EdDSA and ECDSA"
                ));
            }
            Ok(())
        }
        PublicParams::DSA(_) => Err(format!(
            "signing key {fingerprint} is DSA, which RFC 9580 deprecates: drover accepts RSA of at least {MIN_RSA_BITS} bits, EdDSA and ECDSA"
        )),
        _ => Ok(()),
    }
}

impl Cert {
    /// The signing keys of `cert` with their validity, from the self-signatures that verify.
    fn of(cert: &SignedPublicKey) -> Result<Cert, String> {
        let primary = &cert.primary_key;
        let fpr = hex(&primary.fingerprint());
        let (binding, principal) = primary_binding(cert)
            .ok_or_else(|| format!("key {fpr} has no valid self-signature, so nothing says it may sign: export it again with gpg --export --armor"))?;
        let created = secs(primary.created_at());
        let expires = expiry(created, binding);
        let revoked = revocation(
            cert.details
                .revocation_signatures
                .iter()
                .filter(|s| s.typ() == Some(SignatureType::KeyRevocation))
                .filter(|s| s.verify_key(primary).is_ok()),
        );
        let mut keys = Vec::new();
        if stated_flags(binding).is_none_or(|f| f.sign()) {
            check_strength(primary.public_params(), &fpr)?;
            keys.push(Key {
                material: Material::Primary(primary.clone()),
                fingerprint: primary.fingerprint(),
                key_id: primary.legacy_key_id(),
                created,
                expires,
                revoked: revoked.clone(),
            });
        }
        for sub in &cert.public_subkeys {
            if let Some(mut key) = signing_subkey(primary, sub)? {
                key.expires = match (key.expires, expires) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                key.revoked = match (key.revoked, revoked.clone()) {
                    (Some(a), Some(b)) => Some(stronger(a, b)),
                    (a, b) => a.or(b),
                };
                keys.push(key);
            }
        }
        Ok(Cert {
            principal: principal.unwrap_or_else(|| format!("OpenPGP key {fpr}")),
            keys,
        })
    }
}

/// Whether `sig` names `primary` as its issuer (or names none): a key taken
/// from a keyserver may carry hundreds of third parties' certifications,
/// and checking each against the primary key would only cost time.
fn self_issued(sig: &Signature, primary: &PublicKey) -> bool {
    let (fprs, ids) = (sig.issuer_fingerprint(), sig.issuer_key_id());
    (fprs.is_empty() && ids.is_empty())
        || fprs.contains(&&primary.fingerprint())
        || ids.contains(&&primary.legacy_key_id())
}

/// The self-signature that states the primary key's flags and expiry, and
/// the user ID to name the key by (RFC 9580, §5.2.3.10 and §10.1): the
/// newest verified direct-key signature (0x1F) or self-certification of a
/// user ID (0x10 to 0x13; gpg makes positive ones, 0x13). A user ID's
/// revocation (0x30) is neither: it revokes that user ID and nothing else,
/// so it never stands in for the key's flags or expiry (a revocation states
/// none, and taking it as the binding made an expired key valid again and
/// a certify-only primary key a signing one). The key is named by a user ID
/// that is not revoked: the one marked primary, else the first certified.
fn primary_binding(cert: &SignedPublicKey) -> Option<(&Signature, Option<String>)> {
    let primary = &cert.primary_key;
    let direct = cert
        .details
        .direct_signatures
        .iter()
        .filter(|s| s.typ() == Some(SignatureType::Key) && s.verify_key(primary).is_ok())
        .map(|s| (s, None));
    let certifies = |s: &Signature| {
        matches!(
            s.typ(),
            Some(
                SignatureType::CertGeneric
                    | SignatureType::CertPersona
                    | SignatureType::CertCasual
                    | SignatureType::CertPositive
            )
        )
    };
    let own = |s: &&Signature, u: &pgp::types::SignedUser| {
        self_issued(s, primary) && s.verify_certification(primary, Tag::UserId, &u.id).is_ok()
    };
    let certified = cert.details.users.iter().flat_map(|u| {
        u.signatures
            .iter()
            .filter(move |s| certifies(s) && own(s, u))
            .map(move |s| (s, Some(u)))
    });
    let all: Vec<_> = direct.chain(certified).collect();
    let binding = all.iter().max_by_key(|(s, _)| created(s))?.0;
    // A user ID stands unless a verified revocation of it is at least as
    // new as its newest certification (a later one certifies it again).
    let stands = |u: &pgp::types::SignedUser| {
        let newest = u
            .signatures
            .iter()
            .filter(|s| certifies(s) && own(s, u))
            .map(created)
            .max();
        let revoked = u
            .signatures
            .iter()
            .filter(|s| s.typ() == Some(SignatureType::CertRevocation) && own(s, u))
            .map(created)
            .max();
        match (newest, revoked) {
            (Some(c), Some(r)) => c > r,
            (Some(_), None) => true,
            (None, _) => false,
        }
    };
    let users = || {
        all.iter()
            .filter_map(|(s, u)| u.map(|u| (*s, u)))
            .filter(|(_, u)| stands(u))
    };
    let named = users()
        .filter(|(s, _)| s.is_primary())
        .max_by_key(|(s, _)| created(s))
        .or_else(|| users().next())
        .map(|(_, u)| String::from_utf8_lossy(u.id.id()).into_owned());
    Some((binding, named))
}

/// `sub` as a signing key, when its newest verified binding grants signing
/// and carries a back-signature by the subkey (so no one can claim another
/// person's signing key as their subkey).
fn signing_subkey(primary: &PublicKey, sub: &SignedPublicSubKey) -> Result<Option<Key>, String> {
    let binding = sub
        .signatures
        .iter()
        .filter(|s| s.typ() == Some(SignatureType::SubkeyBinding))
        .filter(|s| s.verify_subkey_binding(primary, &sub.key).is_ok())
        .max_by_key(|s| created(s));
    let Some(binding) = binding else {
        return Ok(None);
    };
    let signs = stated_flags(binding).is_some_and(|f| f.sign())
        && binding
            .embedded_signature()
            .is_some_and(|back| back.verify_primary_key_binding(&sub.key, primary).is_ok());
    if !signs {
        return Ok(None);
    }
    let fpr = hex(&sub.key.fingerprint());
    check_strength(sub.key.public_params(), &fpr)?;
    let created = secs(sub.key.created_at());
    Ok(Some(Key {
        material: Material::Subkey(sub.key.clone()),
        fingerprint: sub.key.fingerprint(),
        key_id: sub.key.legacy_key_id(),
        created,
        expires: expiry(created, binding),
        revoked: revocation(
            sub.signatures
                .iter()
                .filter(|s| s.typ() == Some(SignatureType::SubkeyRevocation))
                .filter(|s| s.verify_subkey_binding(primary, &sub.key).is_ok()),
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_allow_comments_and_name_the_line_of_what_is_not_a_key() {
        let text = "# web-flow\n\n-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nabc\n-----END PGP PUBLIC KEY BLOCK-----\n";
        let b = blocks(text).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].0, 3);
        assert!(b[0].1.starts_with("-----BEGIN") && b[0].1.ends_with("BLOCK-----\n"));
        let (line, msg) = blocks("# ok\nssh-ed25519 AAAA x\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(msg.contains("BEGIN PGP PUBLIC KEY BLOCK"), "{msg}");
        let (line, msg) = blocks("\n-----BEGIN PGP PRIVATE KEY BLOCK-----\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(msg.contains("private key"), "{msg}");
        let (line, msg) = blocks("-----BEGIN PGP PUBLIC KEY BLOCK-----\nabc\n").unwrap_err();
        assert_eq!(line, 1);
        assert!(msg.contains("no `-----END"), "{msg}");
        assert!(OpenPgpKeys::parse("# nothing yet\n").unwrap().is_empty());
    }

    #[test]
    fn a_hard_revocation_outweighs_any_soft_one_and_the_earliest_soft_one_wins() {
        let soft = |at| Revocation::Soft {
            at,
            why: "key retired".into(),
        };
        let hard = Revocation::Hard("key compromised".into());
        assert_eq!(stronger(soft(5), hard.clone()), hard);
        assert_eq!(stronger(hard.clone(), soft(5)), hard);
        assert_eq!(stronger(soft(9), soft(5)), soft(5));
    }
}
