//! OpenPGP keys made and used by a real `gpg` (Debian's gnupg): a keyring of
//! its own in a temporary `GNUPGHOME`, whose `gpg-agent` is stopped when it
//! is dropped. Keys (RSA, EdDSA; expiring, with signing subkeys, made at a
//! chosen time), subkey revocation, armored exports, and commits signed by
//! `git` through this gpg: a reviewed change, and a merge as GitHub's merge
//! button makes it (two parents, committer GitHub, signed by the web-flow key).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::git::{git, git_env};

/// A gpg home; every call passes `--batch` and an empty passphrase through
/// loopback pinentry, so nothing ever prompts.
pub struct Gpg {
    home: tempfile::TempDir,
}

/// Why a subkey is revoked (gpg's menu: compromised is hard, the others soft).
#[derive(Clone, Copy, Debug)]
pub enum Revoke {
    Compromised,
    Superseded,
}

impl Default for Gpg {
    fn default() -> Self {
        Self::new()
    }
}

impl Gpg {
    /// An empty keyring.
    pub fn new() -> Gpg {
        assert!(
            Command::new("gpg").arg("--version").output().is_ok(),
            "gpg is missing: scripts/test installs it (apt-get install -y gnupg)"
        );
        // A short path: gpg-agent's socket lives in it.
        let home = tempfile::Builder::new()
            .prefix("gpg")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(
            home.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        Gpg { home }
    }

    /// The `GNUPGHOME`.
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// Run gpg with `args` (at Unix time `at` when given, as if the clock
    /// said so), `stdin` fed in; returns stdout, panics with stderr on failure.
    /// A faked clock is frozen (`!`): a running one ticks on during a slow key
    /// generation, and a subkey made "at the same time" would then predate
    /// its primary key ("Time conflict").
    pub fn run(&self, args: &[&str], stdin: Option<&str>, at: Option<i64>) -> String {
        let mut cmd = Command::new("gpg");
        cmd.env("GNUPGHOME", self.home()).args([
            "--batch",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
        ]);
        if let Some(t) = at {
            cmd.args(["--faked-system-time", &format!("{t}!")]);
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run gpg");
        {
            use std::io::Write;
            let mut input = child.stdin.take().unwrap();
            if let Some(s) = stdin {
                input.write_all(s.as_bytes()).unwrap();
            }
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "gpg {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A new key for `uid` (another key may have the same user ID):
    /// `algo` (`rsa2048`, `ed25519`), `usage` (`sign`, `cert`, ...),
    /// `expire` (`never`, `1d`, ...), created at `at` (Unix time) or now.
    /// Returns its fingerprint.
    pub fn key(&self, uid: &str, algo: &str, usage: &str, expire: &str, at: Option<i64>) -> String {
        let status = self.run(
            &[
                "--yes",
                "--status-fd",
                "1",
                "--quick-gen-key",
                uid,
                algo,
                usage,
                expire,
            ],
            None,
            at,
        );
        // `[GNUPG:] KEY_CREATED P <fingerprint>`
        status
            .lines()
            .find_map(|l| l.strip_prefix("[GNUPG:] KEY_CREATED P "))
            .map(|f| f.split_whitespace().next().unwrap().to_string())
            .unwrap_or_else(|| panic!("no KEY_CREATED in {status}"))
    }

    /// A new subkey of `primary`, created at `at` or now; returns its fingerprint.
    pub fn subkey(&self, primary: &str, algo: &str, usage: &str, at: Option<i64>) -> String {
        let before = self.fingerprints(primary);
        self.run(
            &["--quick-add-key", primary, algo, usage, "never"],
            None,
            at,
        );
        self.fingerprints(primary)
            .into_iter()
            .find(|f| !before.contains(f))
            .expect("the new subkey")
    }

    /// The fingerprints of the key `who` (user ID or fingerprint): primary first, then subkeys.
    pub fn fingerprints(&self, who: &str) -> Vec<String> {
        self.run(&["--with-colons", "--list-keys", who], None, None)
            .lines()
            .filter(|l| l.starts_with("fpr:"))
            .map(|l| l.split(':').nth(9).unwrap().to_string())
            .collect()
    }

    /// Revoke `subkey` of `primary` for `why`, at `at` or now.
    pub fn revoke_subkey(&self, primary: &str, subkey: &str, why: Revoke, at: Option<i64>) {
        // gpg's reasons: 1 compromised, 2 superseded (its edit menu's numbers).
        let code = match why {
            Revoke::Compromised => 1,
            Revoke::Superseded => 2,
        };
        let script = format!("key {subkey}\nrevkey\ny\n{code}\n\ny\nsave\n");
        self.run(
            &["--command-fd", "0", "--edit-key", primary],
            Some(&script),
            at,
        );
    }

    /// Add the user ID `uid` to `primary`, at `at` or now.
    pub fn add_uid(&self, primary: &str, uid: &str, at: Option<i64>) {
        self.run(&["--quick-add-uid", primary, uid], None, at);
    }

    /// Revoke the user ID `uid` of `primary` (a signature of type 0x30), at `at` or now.
    pub fn revoke_uid(&self, primary: &str, uid: &str, at: Option<i64>) {
        self.run(&["--quick-revoke-uid", primary, uid], None, at);
    }

    /// Take the signing capability away from the primary key `primary`
    /// (gpg's expert `change-usage`: a new self-signature whose key flags
    /// say certify only), at `at` or now.
    pub fn certify_only(&self, primary: &str, at: Option<i64>) {
        self.run(
            &["--command-fd", "0", "--expert", "--edit-key", primary],
            Some("change-usage\nS\nQ\nsave\n"),
            at,
        );
        let caps = self
            .run(&["--with-colons", "--list-keys", primary], None, None)
            .lines()
            .find(|l| l.starts_with("pub:"))
            .map(|l| l.split(':').nth(11).unwrap_or("").to_string())
            .unwrap_or_default();
        assert!(!caps.contains('s'), "{primary} still signs: {caps}");
    }

    /// Write the armored public keys `fprs` to `path` (as `gpg --export --armor`).
    pub fn export(&self, fprs: &[&str], path: &Path) {
        let mut args = vec!["--armor", "--export"];
        args.extend_from_slice(fprs);
        std::fs::write(path, self.run(&args, None, None)).unwrap();
    }

    /// The unprotected secret key `fpr`, armored (to read its key material).
    pub fn export_secret(&self, fpr: &str) -> String {
        self.run(&["--armor", "--export-secret-keys", fpr], None, None)
    }

    /// A `gpg` for git to call: this home, and the clock at `at` when given.
    fn program(&self, at: Option<i64>) -> PathBuf {
        let path = self.home().join(format!(
            "gpg-at-{}",
            at.map_or("now".into(), |t| t.to_string())
        ));
        let faked = at.map_or(String::new(), |t| format!(" --faked-system-time {t}!"));
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nexec gpg --homedir '{}' --pinentry-mode loopback --passphrase ''{faked} \"$@\"\n",
                self.home().display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path
    }

    /// git `args` in `dir`, signing with `key` (a fingerprint; a subkey is
    /// used as given) through this gpg at `at`, commits dated `at` too.
    pub fn git_signed(
        &self,
        dir: &Path,
        args: &[&str],
        key: &str,
        at: Option<i64>,
        env: &[(&str, &str)],
    ) -> String {
        let program = format!("gpg.program={}", self.program(at).display());
        let signing = format!("user.signingkey={key}!");
        let mut all = vec!["-c", "gpg.format=openpgp", "-c", &program, "-c", &signing];
        all.extend_from_slice(args);
        let date = at.map(|t| format!("{t} +0000"));
        git_env(dir, &all, date.as_deref(), env)
    }

    /// Commit every change of the work tree `dir`, signed by `key` through
    /// gpg (`git commit -S`) at `at` or now; returns the commit id.
    pub fn commit_all(&self, dir: &Path, message: &str, key: &str, at: Option<i64>) -> String {
        git(dir, &["add", "-A"]);
        self.git_signed(dir, &["commit", "-q", "-S", "-m", message], key, at, &[]);
        git(dir, &["rev-parse", "HEAD"])
    }

    /// Merge `branch` into the checked-out branch of `dir` as GitHub's merge
    /// button does: a merge commit even when a fast-forward would do, two
    /// parents, committed by "GitHub <noreply@github.com>", signed by `key`
    /// (the web-flow key, or whoever stands in for it). Returns the merge.
    pub fn merge_button(
        &self,
        dir: &Path,
        branch: &str,
        pr: u32,
        title: &str,
        key: &str,
    ) -> String {
        let message = format!("Merge pull request #{pr} from platform/{branch}");
        self.git_signed(
            dir,
            &[
                "merge", "-q", "--no-ff", "-S", "-m", &message, "-m", title, branch,
            ],
            key,
            None,
            &[
                ("GIT_COMMITTER_NAME", "GitHub"),
                ("GIT_COMMITTER_EMAIL", "noreply@github.com"),
            ],
        );
        let merge = git(dir, &["rev-parse", "HEAD"]);
        let parents = git(dir, &["rev-list", "--parents", "-n", "1", &merge]);
        assert_eq!(parents.split_whitespace().count(), 3, "a two-parent merge");
        merge
    }
}

impl Drop for Gpg {
    fn drop(&mut self) {
        // No gpg-agent may outlive the test.
        let _ = Command::new("gpgconf")
            .env("GNUPGHOME", self.home())
            .args(["--kill", "all"])
            .status();
    }
}
