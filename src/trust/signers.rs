//! git's SSH allowed-signers file (`gpg.ssh.allowedSignersFile`, see
//! ssh-keygen(1) "ALLOWED SIGNERS"): `principals [options] keytype base64key [comment]`.

use super::Error;
use chrono::{NaiveDate, NaiveDateTime, TimeZone, Utc};
use ssh_key::{public::KeyData, PublicKey};
use std::path::Path;
use std::sync::OnceLock;

/// One line of an allowed-signers file.
#[derive(Debug, Clone)]
pub struct SignerEntry {
    /// The principals (comma-separated in the file), e.g. e-mail addresses.
    pub principals: Vec<String>,
    /// `namespaces="..."`; `None` allows every namespace.
    pub namespaces: Option<Vec<String>>,
    /// `valid-after`, seconds since the epoch (UTC).
    pub valid_after: Option<i64>,
    /// `valid-before`, seconds since the epoch (UTC).
    pub valid_before: Option<i64>,
    /// The key.
    pub key: PublicKey,
    /// Line number in the file, for messages.
    pub line: usize,
    /// The Ed25519 point of `key`, decoded once for every signature it
    /// checks (a status read checks thousands per key): `None` for other
    /// key types or a key that is not a point.
    ed25519: OnceLock<Option<ed25519_dalek::VerifyingKey>>,
}

impl SignerEntry {
    /// Whether `sig` is this entry's key's signature of `msg` in `sig`'s own
    /// namespace: `ssh_key`'s check, with an Ed25519 key's point decoded
    /// once per entry rather than once per signature (about 5 % of a status
    /// read's time). Other keys, and signatures with reserved bytes, go
    /// through `ssh_key` as they are.
    pub fn verifies(&self, msg: &[u8], sig: &ssh_key::SshSig) -> bool {
        use ed25519_dalek::Verifier;
        let point = self.ed25519.get_or_init(|| match self.key.key_data() {
            KeyData::Ed25519(k) => ed25519_dalek::VerifyingKey::from_bytes(&k.0).ok(),
            _ => None,
        });
        match point {
            Some(vk) if sig.reserved().is_empty() && self.key.key_data() == sig.public_key() => {
                // The bytes `SshSig::verify` signs, with no reserved field.
                let Ok(signed) = ssh_key::SshSig::signed_data(sig.namespace(), sig.hash_alg(), msg)
                else {
                    return false;
                };
                let seen = verified::digest(vk.as_bytes(), sig.signature().as_bytes(), &signed);
                if verified::before(&seen) {
                    return true;
                }
                let ok = ed25519_dalek::Signature::try_from(sig.signature())
                    .is_ok_and(|s| vk.verify(&signed, &s).is_ok());
                if ok {
                    verified::remember(seen);
                }
                ok
            }
            _ => self.key.verify(sig.namespace(), msg, sig).is_ok(),
        }
    }

    /// The principals joined as in the file.
    pub fn principal(&self) -> String {
        self.principals.join(",")
    }

    /// Whether this entry allows signatures in `namespace`.
    pub fn allows_namespace(&self, namespace: &str) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|ns| ns.iter().any(|n| n == namespace))
    }
}

/// Ed25519 signatures this process has verified. The wave gate reads the
/// environment's status store every poll and the reporter judges its own
/// branch before each push: the same signed commits each time. What is
/// kept is a SHA-256 of the key, the signature and the bytes it signs, so
/// a hit is exactly the check made before; only successes are kept.
mod verified {
    use sha2::{Digest, Sha256};
    use std::collections::HashSet;
    use std::sync::{LazyLock, Mutex};

    /// Most verifications kept (32 bytes each); all are forgotten when full.
    const MAX_KEPT: usize = 4096;

    static KEPT: LazyLock<Mutex<HashSet<[u8; 32]>>> = LazyLock::new(Default::default);

    fn kept() -> std::sync::MutexGuard<'static, HashSet<[u8; 32]>> {
        KEPT.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What identifies one verification: each part length-prefixed, so
    /// no two different triples hash the same bytes.
    pub(super) fn digest(key: &[u8], signature: &[u8], signed: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [key, signature, signed] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        h.finalize().into()
    }

    pub(super) fn before(d: &[u8; 32]) -> bool {
        kept().contains(d)
    }

    pub(super) fn remember(d: [u8; 32]) {
        let mut k = kept();
        if k.len() >= MAX_KEPT {
            k.clear();
        }
        k.insert(d);
    }
}

/// A parsed allowed-signers file; parse once and reuse, since verifying many
/// commits must not re-read it.
#[derive(Debug, Clone, Default)]
pub struct AllowedSigners {
    entries: Vec<SignerEntry>,
}

impl AllowedSigners {
    /// No signers.
    pub const EMPTY: AllowedSigners = AllowedSigners {
        entries: Vec::new(),
    };

    /// Read and parse an allowed-signers file.
    pub fn load(path: &Path) -> Result<Self, Error> {
        // Bounded like a config file: CI may point this at a file of the
        // repository under review, which a pull request controls.
        let bytes =
            crate::config::read_regular(path, "allowed-signers files").map_err(|message| {
                Error::Signers {
                    path: path.display().to_string(),
                    line: 0,
                    message,
                }
            })?;
        let text = String::from_utf8(bytes).map_err(|_| Error::Signers {
            path: path.display().to_string(),
            line: 0,
            message: "the file is not UTF-8 text".into(),
        })?;
        Self::parse(&text).map_err(|e| match e {
            Error::Signers { line, message, .. } => Error::Signers {
                path: path.display().to_string(),
                line,
                message,
            },
            other => other,
        })
    }

    /// Parse the text of an allowed-signers file.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut entries = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            entries.push(parse_line(line, i + 1).map_err(|message| Error::Signers {
                path: "<allowed signers>".into(),
                line: i + 1,
                message,
            })?);
        }
        Ok(Self { entries })
    }

    /// The entries, in file order.
    pub fn entries(&self) -> &[SignerEntry] {
        &self.entries
    }

    /// Entries whose key is `key`.
    pub fn for_key<'a>(&'a self, key: &'a KeyData) -> impl Iterator<Item = &'a SignerEntry> + 'a {
        self.entries.iter().filter(move |e| e.key.key_data() == key)
    }

    /// Only the lines that list exactly `principal` (no patterns): a status
    /// report counts only when signed by a key listed for its own cluster.
    pub fn for_principal(&self, principal: &str) -> AllowedSigners {
        AllowedSigners {
            entries: self
                .entries
                .iter()
                .filter(|e| e.principals.iter().any(|p| p == principal))
                .cloned()
                .collect(),
        }
    }

    /// [`Self::for_principal`] for every principal the file lists, in one
    /// pass (a fleet's report signers list thousands of clusters).
    pub fn by_principal(&self) -> std::collections::HashMap<String, AllowedSigners> {
        let mut out: std::collections::HashMap<String, AllowedSigners> =
            std::collections::HashMap::new();
        for e in &self.entries {
            for p in &e.principals {
                // Each copy names its one principal: a line may list thousands.
                out.entry(p.clone()).or_default().entries.push(SignerEntry {
                    principals: vec![p.clone()],
                    namespaces: e.namespaces.clone(),
                    valid_after: e.valid_after,
                    valid_before: e.valid_before,
                    key: e.key.clone(),
                    line: e.line,
                    ed25519: e.ed25519.clone(),
                });
            }
        }
        out
    }

    /// True when the file lists no signer.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Split on whitespace, keeping double-quoted runs (option values) together.
fn tokens(line: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= bytes.len() {
            break;
        }
        let start = i;
        let mut quoted = false;
        while i < bytes.len() && (quoted || !bytes[i].is_ascii_whitespace()) {
            if bytes[i] == b'"' {
                quoted = !quoted;
            }
            i += 1;
        }
        if quoted {
            return Err("unterminated quote".into());
        }
        out.push(&line[start..i]);
    }
    Ok(out)
}

fn is_key_type(s: &str) -> bool {
    s.starts_with("ssh-") || s.starts_with("ecdsa-sha2-") || s.starts_with("sk-")
}

fn parse_line(line: &str, lineno: usize) -> Result<SignerEntry, String> {
    let toks = tokens(line)?;
    let Some((principals, rest)) = toks.split_first() else {
        return Err("empty line".into());
    };
    let principals: Vec<String> = principals
        .split(',')
        .map(|s| s.trim_matches('"').to_string())
        .collect();
    let (options, key_toks) = match rest.first() {
        Some(t) if is_key_type(t) => ("", rest),
        Some(t) => (*t, &rest[1..]),
        None => return Err("expected `principals [options] keytype base64key`".into()),
    };
    let (mut namespaces, mut valid_after, mut valid_before) = (None, None, None);
    for opt in split_options(options) {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n.to_ascii_lowercase(), Some(v.trim_matches('"'))),
            None => (opt.to_ascii_lowercase(), None),
        };
        match (name.as_str(), value) {
            ("namespaces", Some(v)) => {
                namespaces = Some(v.split(',').map(|s| s.trim().to_string()).collect())
            }
            ("valid-after", Some(v)) => valid_after = Some(parse_time(v)?),
            ("valid-before", Some(v)) => valid_before = Some(parse_time(v)?),
            ("cert-authority", _) => {
                return Err("`cert-authority` (SSH certificate signers) is not supported; list the signing keys themselves".into())
            }
            _ => {
                return Err(format!(
                    "unknown option `{opt}`; supported: namespaces=\"...\", valid-after=\"...\", valid-before=\"...\""
                ))
            }
        }
    }
    let (Some(kt), Some(b64)) = (key_toks.first(), key_toks.get(1)) else {
        return Err("expected a key type and a base64 key after the principals".into());
    };
    let key = PublicKey::from_openssh(&format!("{kt} {b64}"))
        .map_err(|e| format!("cannot parse the `{kt}` key: {e}"))?;
    Ok(SignerEntry {
        principals,
        namespaces,
        valid_after,
        valid_before,
        key,
        line: lineno,
        ed25519: OnceLock::new(),
    })
}

fn split_options(options: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in options.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&options[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < options.len() {
        out.push(&options[start..]);
    }
    out.into_iter().filter(|s| !s.is_empty()).collect()
}

/// `YYYYMMDD[HHMM[SS]][Z]`. ssh-keygen reads these in local time unless `Z`
/// is given; an agent runs in UTC, so both are read as UTC here.
fn parse_time(v: &str) -> Result<i64, String> {
    let s = v.strip_suffix(['Z', 'z']).unwrap_or(v);
    let bad = || format!("`{v}` is not a time of the form YYYYMMDD[HHMM[SS]]");
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| s[r].parse::<u32>().map_err(|_| bad());
    let (h, m, sec) = match s.len() {
        8 => (0, 0, 0),
        12 => (num(8..10)?, num(10..12)?, 0),
        14 => (num(8..10)?, num(10..12)?, num(12..14)?),
        _ => return Err(bad()),
    };
    let date =
        NaiveDate::from_ymd_opt(num(0..4)? as i32, num(4..6)?, num(6..8)?).ok_or_else(bad)?;
    let dt: NaiveDateTime = date.and_hms_opt(h, m, sec).ok_or_else(bad)?;
    Ok(Utc.from_utc_datetime(&dt).timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2sEDRbhZZtK5AKpgLtm9mnrUxYuc1WtPXBOwjqFqsc";

    #[test]
    fn parses_options_and_principals() {
        let text = format!(
            "# comment\na@x,b@x namespaces=\"git,file\",valid-after=\"20240101\",valid-before=\"20250102030405Z\" {KEY} laptop\nc@x {KEY}\n"
        );
        let s = AllowedSigners::parse(&text).unwrap();
        assert_eq!(s.entries().len(), 2);
        let e = &s.entries()[0];
        assert_eq!(e.principals, vec!["a@x", "b@x"]);
        assert!(e.allows_namespace("git") && !e.allows_namespace("ci"));
        assert_eq!(e.valid_after, Some(1704067200));
        assert_eq!(e.valid_before, Some(1735787045));
        assert!(s.entries()[1].allows_namespace("anything"));
    }

    /// A signature verified once is remembered, and the memory accepts
    /// nothing else: the same signature over other bytes, or presented
    /// for another key, is checked and refused, before and after the hit.
    #[test]
    fn a_remembered_verification_accepts_only_the_same_key_signature_and_bytes() {
        use ssh_key::{private::Ed25519Keypair, HashAlg, PrivateKey};
        let key = |seed: u8| PrivateKey::from(Ed25519Keypair::from_seed(&[seed; 32]));
        let entry = |k: &PrivateKey| {
            let line = format!("a@x {}", k.public_key().to_openssh().unwrap());
            AllowedSigners::parse(&line).unwrap().entries()[0].clone()
        };
        let (alice, mallory) = (key(41), key(42));
        let sig = |k: &PrivateKey, msg: &[u8]| k.sign("git", HashAlg::Sha512, msg).unwrap();
        let good = sig(&alice, b"tree 1\nreport\n");
        let forged = sig(&mallory, b"tree 1\nreport\n");
        for _ in 0..2 {
            assert!(entry(&alice).verifies(b"tree 1\nreport\n", &good));
            assert!(!entry(&alice).verifies(b"tree 2\nreport\n", &good));
            assert!(!entry(&mallory).verifies(b"tree 1\nreport\n", &good));
            assert!(!entry(&alice).verifies(b"tree 1\nreport\n", &forged));
        }
        // Distinct triples never share a digest, however their bytes split.
        assert_ne!(
            verified::digest(b"ab", b"c", b""),
            verified::digest(b"a", b"bc", b"")
        );
    }

    #[test]
    fn rejects_cert_authority_and_garbage() {
        let err = AllowedSigners::parse(&format!("a@x cert-authority {KEY}")).unwrap_err();
        assert!(err.to_string().contains("cert-authority"), "{err}");
        let err = AllowedSigners::parse("a@x ssh-ed25519 notbase64").unwrap_err();
        assert!(err.to_string().contains(":1: cannot parse"), "{err}");
        assert!(AllowedSigners::parse(&format!("a@x valid-after=\"2024\" {KEY}")).is_err());
    }
}
