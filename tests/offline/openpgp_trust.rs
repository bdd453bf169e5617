//! OpenPGP commit signatures (docs/design.md §6), made by a real `gpg` and
//! `git commit -S`: `drover verify --openpgp-keys` with RSA and EdDSA keys
//! beside SSH ones, and every way around it with its control: a key not
//! listed, a signature over other content, an expired key (at the commit
//! time and when first seen), a revoked subkey (compromised: never again;
//! superseded: from its revocation on), and a key listed for one kind of
//! signature only.

use crate::support::cli::drover;
use crate::support::git::*;
use crate::support::gpg::{Gpg, Revoke};
use chrono::Utc;
use drover::trust::{self, AllowedSigners, Mode, OpenPgpKeys, Reason, Signers};
use git2::{Oid, Repository};
use std::path::{Path, PathBuf};

const DAY: i64 = 86_400;

struct Fixture {
    tmp: tempfile::TempDir,
    gpg: Gpg,
    work: WorkRepo,
    root: String,
    /// The OpenPGP key file `drover verify` is given.
    keys: PathBuf,
    /// The SSH allowed-signers file it is given.
    allowed: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let work = WorkRepo::init(&tmp.path().join("work"));
    let root = work.head();
    let keys = tmp.path().join("openpgp.asc");
    let allowed = tmp.path().join("allowed_signers");
    std::fs::write(&keys, "# no OpenPGP key yet\n").unwrap();
    std::fs::write(&allowed, "").unwrap();
    Fixture {
        tmp,
        gpg: Gpg::new(),
        work,
        root,
        keys,
        allowed,
    }
}

impl Fixture {
    /// Dana's key, the usual reviewer's: EdDSA, signing, never expiring.
    fn dana(&self) -> String {
        self.gpg.key(
            "Dana Dev <dana@example.com>",
            "ed25519",
            "sign",
            "never",
            None,
        )
    }

    /// List `fprs` (exported armored, one block) as the trusted OpenPGP keys.
    fn list(&self, fprs: &[&str]) {
        self.gpg.export(fprs, &self.keys);
    }

    /// Pin `env` to `version` in a commit signed by `key` through gpg, at `at` or now.
    fn bump(&self, env: &str, version: &str, key: &str, at: Option<i64>) -> String {
        self.work.write_env(env, version);
        self.gpg
            .commit_all(&self.work.dir, &format!("{env}: {version}"), key, at)
    }

    fn verify(&self, extra: &[&str]) -> (i32, serde_json::Value, String) {
        let mut args = vec![
            "--repo",
            self.work.dir.to_str().unwrap(),
            "--format",
            "json",
            "verify",
            "--allowed-signers",
            self.allowed.to_str().unwrap(),
            "--openpgp-keys",
            self.keys.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = drover(&args);
        let json = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
        (code, json, err)
    }

    fn assert_ok(&self, extra: &[&str]) -> serde_json::Value {
        let (code, json, err) = self.verify(extra);
        assert_eq!(code, 0, "{json} {err}");
        assert_eq!(json["ok"], true, "{json}");
        json
    }

    /// Refused at `commit` for `reason`; returns the message.
    fn assert_refused(&self, extra: &[&str], commit: &str, reason: &str) -> String {
        let (code, json, err) = self.verify(extra);
        assert_eq!(code, 1, "{json} {err}");
        assert_eq!(json["error"]["commit"], commit, "{json}");
        assert_eq!(json["error"]["reason"], reason, "{json}");
        json["error"]["message"].as_str().unwrap().to_string()
    }

    /// The agent's trust step over `(root, head]`, each commit first seen at `seen(commit)`.
    fn check(&self, head: &str, seen: &dyn Fn(Oid) -> i64) -> Result<(), Reason> {
        let repo = Repository::open(&self.work.dir).unwrap();
        let keys = OpenPgpKeys::load(&self.keys).unwrap();
        let signers = Signers {
            ssh: &AllowedSigners::EMPTY,
            openpgp: &keys,
        };
        let root = Oid::from_str(&self.root).unwrap();
        let head = Oid::from_str(head).unwrap();
        match trust::check(&repo, Mode::All, signers, Some(root), head, seen) {
            Ok(_) => Ok(()),
            Err(trust::Error::Refused(r)) => Err(r.reason),
            Err(e) => panic!("{e}"),
        }
    }
}

fn now() -> i64 {
    Utc::now().timestamp()
}

#[test]
fn rsa_and_eddsa_signatures_verify_beside_ssh_ones_and_name_their_signer() {
    let f = fixture();
    let rsa = f.gpg.key(
        "Release Bot <release@example.com>",
        "rsa2048",
        "sign",
        "never",
        None,
    );
    let ed = f.dana();
    // Two armored blocks with a comment between them, as an operator
    // concatenates `gpg --export --armor` outputs.
    let (a, b) = (f.tmp.path().join("a.asc"), f.tmp.path().join("b.asc"));
    f.gpg.export(&[&rsa], &a);
    f.gpg.export(&[&ed], &b);
    std::fs::write(
        &f.keys,
        format!(
            "# the release bot\n{}\n# Dana\n{}",
            std::fs::read_to_string(&a).unwrap(),
            std::fs::read_to_string(&b).unwrap()
        ),
    )
    .unwrap();
    // And an SSH signer in the same history.
    let ssh = keygen(f.tmp.path(), "ssh-signer");
    allowed_signers(&f.allowed, &[("sam@example.com", &ssh)]);

    f.bump("test", "1.1.0", &rsa, None);
    f.work
        .bump("stage", "1.1.0", "stage: 1.1.0 (SSH)", Some(&ssh));
    let head = f.bump("test", "1.2.0", &ed, None);
    let json = f.assert_ok(&["--since", &f.root]);
    assert_eq!(json["checked"], 3);
    assert_eq!(json["head"], head);
    assert_eq!(json["signer"], "Dana Dev <dana@example.com>");
    let (code, out, err) = drover(&[
        "--repo",
        f.work.dir.to_str().unwrap(),
        "verify",
        "--openpgp-keys",
        f.keys.to_str().unwrap(),
        "--mode",
        "head",
    ]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(
        out.contains("Dana Dev <dana@example.com>") && out.contains(&ed),
        "the text names the signer and the key's fingerprint: {out}"
    );
    let head = f.bump("stage", "1.2.0", &rsa, None);
    let json = f.assert_ok(&["--mode", "head"]);
    assert_eq!(json["head"], head);
    assert_eq!(json["signer"], "Release Bot <release@example.com>");

    // `drover log` names the same signers, SSH and OpenPGP alike.
    let (code, out, err) = drover(&[
        "--repo",
        f.work.dir.to_str().unwrap(),
        "--format",
        "json",
        "log",
        "--allowed-signers",
        f.allowed.to_str().unwrap(),
        "--openpgp-keys",
        f.keys.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let log: serde_json::Value = serde_json::from_str(&out).unwrap();
    let signers: Vec<(&str, &str, bool)> = log["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["previous"].is_string())
        .map(|e| {
            (
                e["env"].as_str().unwrap(),
                e["signer"].as_str().unwrap_or("-"),
                e["verified"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        signers,
        vec![
            ("stage", "Release Bot <release@example.com>", true),
            ("test", "Dana Dev <dana@example.com>", true),
            ("stage", "sam@example.com", true),
            ("test", "Release Bot <release@example.com>", true),
        ]
    );
}

#[test]
fn a_key_not_listed_is_refused_even_under_a_listed_name() {
    let f = fixture();
    let listed = f.gpg.key(
        "GitHub <noreply@github.com>",
        "ed25519",
        "sign",
        "never",
        None,
    );
    // The impostor's key claims the same user ID.
    let impostor = f.gpg.key(
        "GitHub <noreply@github.com>",
        "ed25519",
        "sign",
        "never",
        None,
    );
    // (RSA impostors: tests/agent/agent_github_merge.rs.)
    f.list(&[&listed]);
    f.bump("test", "1.1.0", &listed, None);
    f.assert_ok(&["--since", &f.root]);
    let bad = f.bump("test", "1.2.0", &impostor, None);
    let message = f.assert_refused(&["--since", &f.root], &bad, "unknown_key");
    assert!(
        message.contains(&format!("OpenPGP key {impostor}")),
        "{message}"
    );
    assert!(message.contains("--openpgp-keys"), "{message}");

    // Without --openpgp-keys, an OpenPGP signature has nothing to verify against.
    let (code, out, err) = drover(&[
        "--repo",
        f.work.dir.to_str().unwrap(),
        "--format",
        "json",
        "verify",
        "--allowed-signers",
        f.allowed.to_str().unwrap(),
        "--mode",
        "head",
    ]);
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        out.contains("unknown_key") && out.contains("--openpgp-keys"),
        "{out}"
    );
    // And with neither file, verify cannot run.
    let (code, _, err) = drover(&["--repo", f.work.dir.to_str().unwrap(), "verify"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--allowed-signers") && err.contains("--openpgp-keys"),
        "{err}"
    );
}

#[test]
fn a_signature_over_other_content_is_refused() {
    let f = fixture();
    let key = f.dana();
    f.list(&[&key]);
    let signed = f.bump("test", "1.1.0", &key, None);
    f.assert_ok(&["--mode", "head"]);
    // The same signature on a commit with another message.
    let forged = f.work.tamper_head();
    assert_ne!(forged, signed);
    f.assert_refused(&["--since", &f.root], &forged, "bad_signature");
}

#[test]
fn an_expired_key_is_refused_for_what_is_first_seen_after_its_expiry() {
    let f = fixture();
    let made = now() - 10 * DAY;
    // Valid for two days, ten days ago.
    let expired = f.gpg.key(
        "Old Bot <old@example.com>",
        "ed25519",
        "sign",
        "2d",
        Some(made),
    );
    let current = f.gpg.key(
        "Bot <bot@example.com>",
        "ed25519",
        "sign",
        "30d",
        Some(made),
    );
    f.list(&[&expired, &current]);
    // Signed (and dated) nine days ago, while the key was valid.
    let old = f.bump("test", "1.1.0", &expired, Some(made + DAY));
    // drover verify sees it now, after the expiry: refused.
    let message = f.assert_refused(&["--since", &f.root], &old, "expired_key");
    assert!(
        message.contains("first seen") && message.contains("OpenPGP key expired"),
        "{message}"
    );
    // Control: an agent that fetched it nine days ago keeps trusting it.
    assert_eq!(f.check(&old, &|_| made + DAY + 60), Ok(()));
    // An agent that first sees it now refuses it, whatever it says of its time.
    assert!(
        matches!(
            f.check(&old, &|_| now()),
            Err(Reason::ExpiredWhenSeen { .. })
        ),
        "{:?}",
        f.check(&old, &|_| now())
    );
    // Control: a key valid for 30 days signs today.
    let head = f.bump("test", "1.2.0", &current, None);
    let json = f.assert_ok(&["--since", &old]);
    assert_eq!(json["head"], head);
}

/// RFC 9580: a user ID's revocation (0x30) revokes that user ID and
/// nothing else; the key's expiry and flags stay those of its newest
/// self-certification or direct-key signature.
#[test]
fn an_expired_key_stays_expired_after_its_owner_revokes_a_user_id() {
    let f = fixture();
    let made = now() - 10 * DAY;
    let uid = "Old Bot <old@example.com>";
    let key = f.gpg.key(uid, "ed25519", "sign", "2d", Some(made));
    let extra = "Old Bot (ops) <ops@example.com>";
    f.gpg.add_uid(&key, extra, Some(made + DAY / 2));
    // Signed (and dated) nine days ago, while the key was valid.
    let old = f.bump("test", "1.1.0", &key, Some(made + DAY));
    f.list(&[&key]);
    // Control: before the revocation, expired for what is first seen now.
    f.assert_refused(&["--since", &f.root], &old, "expired_key");
    // The owner revokes the second user ID while the key was still valid:
    // the newest self-signature is now that revocation, which states no expiry.
    f.gpg.revoke_uid(&key, extra, Some(made + DAY + 3600));
    f.list(&[&key]);
    let message = f.assert_refused(&["--since", &f.root], &old, "expired_key");
    assert!(message.contains("OpenPGP key expired"), "{message}");
    // Control: an agent that fetched it while the key was valid still trusts it,
    // and names the key by the user ID that stands.
    assert_eq!(f.check(&old, &|_| made + DAY + 60), Ok(()));
    let repo = Repository::open(&f.work.dir).unwrap();
    let keys = OpenPgpKeys::load(&f.keys).unwrap();
    let signers = Signers {
        ssh: &AllowedSigners::EMPTY,
        openpgp: &keys,
    };
    let v = trust::verify_commit(&repo, Oid::from_str(&old).unwrap(), signers).unwrap();
    assert_eq!(v.principal, uid);
}

#[test]
fn a_certify_only_primary_key_does_not_sign_again_after_a_user_id_revocation() {
    let f = fixture();
    let made = now() - 3 * 3600;
    let primary = f.gpg.key(
        "Platform Team <platform@example.com>",
        "ed25519",
        "sign",
        "never",
        Some(made),
    );
    let sub = f.gpg.subkey(&primary, "ed25519", "sign", Some(made));
    let extra = "Platform Team (old) <old-platform@example.com>";
    f.gpg.add_uid(&primary, extra, Some(made + 60));
    // The primary key signs once, then is made certify-only: from then on
    // only its subkey signs.
    let by_primary = f.bump("test", "1.1.0", &primary, Some(made + 120));
    f.gpg.certify_only(&primary, Some(made + 180));
    let by_sub = f.bump("stage", "1.1.0", &sub, Some(made + 240));
    f.list(&[&primary]);
    f.assert_refused(&["--since", &f.root], &by_primary, "unknown_key");
    // Control: the subkey signs.
    f.assert_ok(&["--since", &by_primary]);
    // A user ID revoked: the newest self-signature states no key flags,
    // which must not give the primary key its signing back.
    f.gpg.revoke_uid(&primary, extra, Some(made + 300));
    f.list(&[&primary]);
    f.assert_refused(&["--since", &f.root], &by_primary, "unknown_key");
    let json = f.assert_ok(&["--since", &by_primary]);
    assert_eq!(json["head"], by_sub);
}

#[test]
fn a_revoked_subkey_is_refused_while_its_sibling_still_signs() {
    let f = fixture();
    let made = now() - 3 * 3600;
    // A certify-only primary key with signing subkeys, as many teams keep them.
    let primary = f.gpg.key(
        "Platform Team <platform@example.com>",
        "ed25519",
        "cert",
        "never",
        Some(made),
    );
    let lost = f.gpg.subkey(&primary, "ed25519", "sign", Some(made));
    let kept = f.gpg.subkey(&primary, "rsa2048", "sign", Some(made));
    let retired = f.gpg.subkey(&primary, "ed25519", "sign", Some(made));
    let by_lost = f.bump("test", "1.1.0", &lost, Some(made + 600));
    let by_retired = f.bump("stage", "1.1.0", &retired, Some(made + 1200));
    let by_kept = f.bump("test", "1.2.0", &kept, None);
    f.list(&[&primary]);
    f.assert_ok(&["--since", &f.root]);

    // The laptop with `lost` is stolen: revoked as compromised, nothing it
    // signed is trusted any more, even what was fetched long before.
    f.gpg
        .revoke_subkey(&primary, &lost, Revoke::Compromised, None);
    f.list(&[&primary]);
    let message = f.assert_refused(&["--since", &f.root], &by_lost, "revoked_key");
    assert!(message.contains("key compromised"), "{message}");
    assert!(
        matches!(
            f.check(&by_lost, &|_| made + 700),
            Err(Reason::Revoked { .. })
        ),
        "a hard revocation counts whenever the commit was seen"
    );
    // Control: the sibling subkey of the same key still signs.
    let json = f.assert_ok(&["--since", &by_retired]);
    assert_eq!(json["head"], by_kept);
    let json = f.assert_ok(&["--mode", "head"]);
    assert_eq!(json["signer"], "Platform Team <platform@example.com>");

    // `retired` is superseded an hour ago: what it signed before and the
    // agent fetched before stays trusted; first seen after, refused.
    let revoked_at = now() - 3600;
    f.gpg
        .revoke_subkey(&primary, &retired, Revoke::Superseded, Some(revoked_at));
    f.list(&[&primary]);
    let range_end = by_retired.as_str();
    let lost_oid = Oid::from_str(&by_lost).unwrap();
    // (`lost` is out of the way: judge only from its commit on.)
    let seen_before = |_| revoked_at - 60;
    let from_lost = |head: &str, seen: &dyn Fn(Oid) -> i64| {
        let repo = Repository::open(&f.work.dir).unwrap();
        let keys = OpenPgpKeys::load(&f.keys).unwrap();
        let signers = Signers {
            ssh: &AllowedSigners::EMPTY,
            openpgp: &keys,
        };
        trust::check(
            &repo,
            Mode::All,
            signers,
            Some(lost_oid),
            Oid::from_str(head).unwrap(),
            seen,
        )
        .map(|_| ())
        .map_err(|e| match e {
            trust::Error::Refused(r) => r.reason,
            e => panic!("{e}"),
        })
    };
    assert_eq!(from_lost(range_end, &seen_before), Ok(()));
    match from_lost(range_end, &|_| now()) {
        Err(Reason::Revoked { detail, .. }) => {
            assert!(
                detail.contains("key superseded") && detail.contains("first seen"),
                "{detail}"
            )
        }
        other => panic!("first seen after a soft revocation: {other:?}"),
    }
    f.assert_refused(&["--since", &by_lost], &by_retired, "revoked_key");
}

#[test]
fn an_oversized_signature_is_refused_unread() {
    let f = fixture();
    // A commit whose gpgsig header is 64 KiB: an attacker's, not git's.
    let tree = git(&f.work.dir, &["rev-parse", "HEAD^{tree}"]);
    let junk: String = (0..1024)
        .map(|_| " AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n")
        .collect();
    let raw = format!(
        "tree {tree}\nparent {}\nauthor A <a@x> 1800000000 +0000\ncommitter A <a@x> 1800000000 +0000\ngpgsig -----BEGIN PGP SIGNATURE-----\n{junk} -----END PGP SIGNATURE-----\n\nhuge\n",
        f.root
    );
    let path = f.tmp.path().join("huge");
    std::fs::write(&path, raw).unwrap();
    let huge = git(
        &f.work.dir,
        &["hash-object", "-t", "commit", "-w", path.to_str().unwrap()],
    );
    git(&f.work.dir, &["update-ref", "refs/heads/main", &huge]);
    let message = f.assert_refused(&["--mode", "head"], &huge, "unsupported_signature");
    assert!(message.contains("at most 16 KiB"), "{message}");
}

/// An OpenSSH private key with the key material of the gpg EdDSA key `fpr`
/// (and its `.pub`), at `dir/name`: the same key, usable by `ssh-keygen`.
fn ssh_key_from_gpg(gpg: &Gpg, fpr: &str, dir: &Path, name: &str) -> PathBuf {
    use pgp::composed::{Deserializable, SignedSecretKey};
    use pgp::crypto::eddsa_legacy;
    use pgp::types::{PlainSecretParams, SecretParams};
    let (secret, _) = SignedSecretKey::from_string(&gpg.export_secret(fpr)).unwrap();
    let seed = match secret.primary_key.secret_params() {
        SecretParams::Plain(PlainSecretParams::EdDSALegacy(eddsa_legacy::SecretKey::Ed25519(
            k,
        ))) => *k.as_bytes(),
        other => panic!("not an unprotected EdDSA key: {other:?}"),
    };
    let pair = ssh_key::private::Ed25519Keypair::from_seed(&seed);
    let key = ssh_key::PrivateKey::new(ssh_key::private::KeypairData::Ed25519(pair), name).unwrap();
    let path = dir.join(name);
    key.write_openssh_file(&path, ssh_key::LineEnding::LF)
        .unwrap();
    std::fs::write(
        format!("{}.pub", path.display()),
        key.public_key().to_openssh().unwrap(),
    )
    .unwrap();
    path
}

#[test]
fn a_key_listed_for_one_kind_of_signature_does_not_vouch_for_the_other() {
    let f = fixture();
    let pgp = f.dana();
    // The very same Ed25519 key, as an SSH key.
    let ssh = ssh_key_from_gpg(&f.gpg, &pgp, f.tmp.path(), "dana-ssh");

    // Listed for SSH only: an OpenPGP signature by the same key material is
    // not vouched for by the allowed-signers line.
    allowed_signers(&f.allowed, &[("dana@example.com", &ssh)]);
    let by_pgp = f.bump("test", "1.1.0", &pgp, None);
    let message = f.assert_refused(&["--mode", "head"], &by_pgp, "unknown_key");
    assert!(message.contains(&format!("OpenPGP key {pgp}")), "{message}");
    // Control: her SSH signature is.
    let by_ssh = f.work.bump("test", "1.2.0", "SSH-signed", Some(&ssh));
    f.assert_ok(&["--since", &by_pgp]);

    // Listed for OpenPGP only: the SSH signature by the same key material is refused.
    std::fs::write(&f.allowed, "").unwrap();
    f.list(&[&pgp]);
    let message = f.assert_refused(&["--since", &by_pgp], &by_ssh, "unknown_key");
    assert!(message.contains("SHA256:"), "{message}");
    // Control: her OpenPGP signature is.
    f.bump("stage", "1.2.0", &pgp, None);
    f.assert_ok(&["--since", &by_ssh]);
}

#[test]
fn a_bad_key_file_is_named_with_its_line_and_what_would_be_valid() {
    let f = fixture();
    let key = f.dana();
    let weak = f
        .gpg
        .key("Old <old@example.com>", "rsa1024", "sign", "never", None);
    let cases: Vec<(String, &str, &str)> = vec![
        (
            format!("# keys\n{}", f.gpg.export_secret(&key)),
            ":2:",
            "list public keys only",
        ),
        (
            "# an SSH key is not an OpenPGP key\nssh-ed25519 AAAA dana\n".into(),
            ":2:",
            "BEGIN PGP PUBLIC KEY BLOCK",
        ),
        (
            "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nnot base64 at all\n-----END PGP PUBLIC KEY BLOCK-----\n"
                .into(),
            ":1:",
            "cannot read",
        ),
        (
            {
                f.gpg.export(&[&weak], &f.keys);
                std::fs::read_to_string(&f.keys).unwrap()
            },
            ":1:",
            "too weak",
        ),
    ];
    for (text, line, what) in cases {
        std::fs::write(&f.keys, &text).unwrap();
        let (code, _, err) = f.verify(&["--mode", "head"]);
        assert_eq!(code, 2, "{text}\n{err}");
        let at = format!("{}{line}", f.keys.display());
        assert!(
            err.contains(&at) && err.contains(what),
            "want {at} … {what}: {err}"
        );
    }

    // A directory of key files, as a Secret mounts them: every visible file counts.
    let dir = f.tmp.path().join("mounted");
    std::fs::create_dir_all(dir.join("..2026_12_01")).unwrap();
    f.gpg.export(&[&key], &dir.join("dana.asc"));
    std::fs::write(dir.join("..data"), "ignored").unwrap();
    f.bump("test", "1.1.0", &key, None);
    let (code, out, err) = drover(&[
        "--repo",
        f.work.dir.to_str().unwrap(),
        "verify",
        "--openpgp-keys",
        dir.to_str().unwrap(),
        "--mode",
        "head",
    ]);
    assert_eq!(code, 0, "{out} {err}");
}
