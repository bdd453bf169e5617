//! git for the tests: the one `git()` runner (fixed identity, no user or
//! system config), SSH keys made with `ssh-keygen`, signed commits (reviewed
//! config changes and agents' status-report commits), config repositories,
//! and real git servers on loopback: `git daemon`, smart HTTP
//! (`git http-backend` behind lighttpd with basic auth) and `sshd`. Servers
//! are killed when dropped.

// Benches mount this file on its own and use a part of it.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fail with a message saying how to get a missing server binary.
pub fn require(bin: &str) -> PathBuf {
    let p = PathBuf::from(bin);
    assert!(
        p.exists(),
        "{bin} is missing: run the install step of .ci/run (apt-get install -y openssh-server lighttpd git)"
    );
    p
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(port: u16, child: &mut Child, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited ({status}) before listening on {port}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on 127.0.0.1:{port} within 15 s");
}

/// Run git in `dir` with a fixed identity; panics with stderr on failure.
/// When a fixture's config commits land, for tests that read the fleet at
/// fixed instants: `drover status --now T` reads the config in force at T,
/// so a commit dated by the wall clock would be in force only after the
/// day the tests run.
pub const CONFIGURED_AT: &str = "2026-11-30T00:00:00Z";

/// [`git`] `commit` with `args`, author and committer dated [`CONFIGURED_AT`].
pub fn commit_configured(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["commit"];
    all.extend_from_slice(args);
    git_env(dir, &all, Some(CONFIGURED_AT), &[])
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    git_env(dir, args, None, &[])
}

/// [`git`] with `env` set, author and committer dated `date` when given (any
/// date git reads, e.g. RFC 3339 or `<unix seconds> +0000`). Signing uses
/// SSH keys (`gpg.format=ssh`): name the key with `-c user.signingkey=KEY`.
pub fn git_env(dir: &Path, args: &[&str], date: Option<&str>, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args([
            "-c",
            "user.name=Test Author",
            "-c",
            "user.email=author@example.com",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "protocol.file.allow=always",
            "-c",
            "gpg.format=ssh",
        ]);
    if let Some(d) = date {
        cmd.env("GIT_AUTHOR_DATE", d).env("GIT_COMMITTER_DATE", d);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.args(args).output().expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} in {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Commit every change of the work tree `dir`, signed with the SSH key `key`
/// (`git commit -S`: a reviewed change) or unsigned with `None`, dated `date`
/// when given (the signer chooses it); returns the commit id.
pub fn commit_all(dir: &Path, message: &str, key: Option<&Path>, date: Option<&str>) -> String {
    git(dir, &["add", "-A"]);
    match key {
        Some(k) => {
            let sk = format!("user.signingkey={}", k.display());
            git_env(
                dir,
                &["-c", &sk, "commit", "-q", "-S", "-m", message],
                date,
                &[],
            );
        }
        None => {
            git_env(dir, &["commit", "-q", "-m", message], date, &[]);
        }
    }
    git(dir, &["rev-parse", "HEAD"])
}

/// One commit on `branch` of the repository `dir` (work tree or bare) that
/// writes `path` (deletes it with `None`) and nothing else, as an agent
/// writes its status report: signed with the SSH key `key` by
/// `git commit-tree -S` (unsigned with `None`), dated `date` when given;
/// the branch moves to it. Returns the commit id.
pub fn commit_file_on(
    dir: &Path,
    branch: &str,
    path: &str,
    content: Option<&[u8]>,
    key: Option<&Path>,
    message: &str,
    date: Option<&str>,
) -> String {
    // An index of its own, so that neither the work tree nor its index change.
    let scratch = tempfile::tempdir().expect("scratch dir");
    let index = scratch.path().join("index");
    let env = [("GIT_INDEX_FILE", index.to_str().unwrap())];
    let reference = format!("refs/heads/{branch}");
    let parent = Command::new("git")
        .current_dir(dir)
        .args(["rev-parse", "-q", "--verify", &reference])
        .output()
        .expect("run git");
    let parent = String::from_utf8_lossy(&parent.stdout).trim().to_owned();
    if !parent.is_empty() {
        git_env(dir, &["read-tree", &parent], None, &env);
    }
    match content {
        Some(bytes) => {
            let file = scratch.path().join("blob");
            std::fs::write(&file, bytes).unwrap();
            let blob = git(dir, &["hash-object", "-w", file.to_str().unwrap()]);
            let entry = format!("100644,{blob},{path}");
            git_env(
                dir,
                &["update-index", "--add", "--cacheinfo", &entry],
                None,
                &env,
            );
        }
        None => {
            git_env(dir, &["update-index", "--force-remove", path], None, &env);
        }
    }
    let tree = git_env(dir, &["write-tree"], None, &env);
    let sk = key.map(|k| format!("user.signingkey={}", k.display()));
    let mut args: Vec<&str> = Vec::new();
    if let Some(sk) = &sk {
        args.extend(["-c", sk]);
    }
    args.extend(["commit-tree", &tree, "-m", message]);
    if !parent.is_empty() {
        args.extend(["-p", &parent]);
    }
    if key.is_some() {
        args.push("-S");
    }
    let commit = git_env(dir, &args, date, &[]);
    git(dir, &["update-ref", &reference, &commit]);
    commit
}

/// Create an ed25519 key pair `dir/name` (+ `.pub`).
pub fn keygen(dir: &Path, name: &str) -> PathBuf {
    let key = dir.join(name);
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen");
    assert!(st.success());
    key
}

/// `keytype base64` of a key pair's public half.
pub fn public_key(key: &Path) -> String {
    let text = std::fs::read_to_string(format!("{}.pub", key.display())).unwrap();
    text.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A work repository with the drover layout.
pub struct WorkRepo {
    pub dir: PathBuf,
}

impl WorkRepo {
    /// `git init` with drover.toml and environments/{test,stage}.toml at 1.0.0, unsigned.
    pub fn init(dir: &Path) -> Self {
        std::fs::create_dir_all(dir.join("environments")).unwrap();
        git(dir, &["init", "-q", "-b", "main"]);
        std::fs::write(
            dir.join("drover.toml"),
            "[promotion]\nchain = [\"test\", \"stage\"]\nreport_signers = \"agents.allowed_signers\"\n\n[clusters]\ntest = [\"test-1\"]\nstage = [\"stage-1\"]\n",
        )
        .unwrap();
        // No cluster reports in these repositories: no report keys.
        std::fs::write(dir.join("agents.allowed_signers"), "").unwrap();
        let r = Self {
            dir: dir.to_path_buf(),
        };
        r.write_env("test", "1.0.0");
        r.write_env("stage", "1.0.0");
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-q", "-m", "initial configuration"]);
        r
    }

    /// Write `environments/{env}.toml` pinned to `version` (not committed).
    pub fn write_env(&self, env: &str, version: &str) {
        std::fs::write(
            self.dir.join(format!("environments/{env}.toml")),
            format!("version = \"{version}\"\n\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\n"),
        )
        .unwrap();
    }

    /// Commit a version bump, signed with `key` when given; returns the commit id.
    pub fn bump(&self, env: &str, version: &str, message: &str, key: Option<&Path>) -> String {
        self.write_env(env, version);
        commit_all(&self.dir, message, key, None)
    }

    /// HEAD's commit id.
    pub fn head(&self) -> String {
        git(&self.dir, &["rev-parse", "HEAD"])
    }

    /// Rewrite HEAD into a commit with the same gpgsig but a changed message,
    /// so the signature no longer matches; moves `main` to it and returns its id.
    pub fn tamper_head(&self) -> String {
        let raw = git(&self.dir, &["cat-file", "commit", "HEAD"]);
        assert!(
            raw.contains("gpgsig"),
            "HEAD must be signed to tamper with it"
        );
        let forged = format!("{raw} (tampered)\n");
        let path = self.dir.join(".git/forged");
        std::fs::write(&path, forged).unwrap();
        let oid = git(
            &self.dir,
            &["hash-object", "-t", "commit", "-w", path.to_str().unwrap()],
        );
        git(&self.dir, &["update-ref", "refs/heads/main", &oid]);
        oid
    }
}

/// A copy of `example-repo/` in a fresh repository on `main`, nothing
/// committed yet, with a repository-level identity for the commits drover
/// itself makes (`drover promote`, `drover revoke`).
pub fn example_checkout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo"),
        dir.path(),
    );
    git(dir.path(), &["init", "-q", "-b", "main"]);
    git(dir.path(), &["config", "user.name", "Test"]);
    git(dir.path(), &["config", "user.email", "test@example.com"]);
    git(dir.path(), &["config", "commit.gpgsign", "false"]);
    dir
}

/// The files of `example-repo/` (no git), with the `test` environment
/// selecting the nodes labelled `label` and pinned at `version`: a
/// repository for the commands that read a cluster (`plan --kubeconfig`).
pub fn example_files_selecting(label: &str, version: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo"),
        dir.path(),
    );
    let test = dir.path().join("environments/test.toml");
    let text = std::fs::read_to_string(&test)
        .unwrap()
        .replacen(
            "version = \"1.12.0\"",
            &format!("version = \"{version}\""),
            1,
        )
        .replacen(
            "node_selector = \"\"",
            &format!("node_selector = \"{label}\""),
            1,
        );
    std::fs::write(test, text).unwrap();
    dir
}

/// Copy the directory tree `from` into `to` (e.g. example-repo into a test's repository).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Write an allowed-signers file with `principal key` lines.
pub fn allowed_signers(path: &Path, entries: &[(&str, &Path)]) {
    let text: String = entries
        .iter()
        .map(|(p, k)| format!("{p} namespaces=\"git\" {}\n", public_key(k)))
        .collect();
    std::fs::write(path, text).unwrap();
}

/// Bare copy of `work` at `base/name.git`.
pub fn bare_clone(work: &Path, base: &Path, name: &str) -> PathBuf {
    let dest = base.join(format!("{name}.git"));
    git(
        base,
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            dest.to_str().unwrap(),
        ],
    );
    dest
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// `git daemon` serving every repository under `base`, with push enabled.
pub struct GitDaemon {
    child: Child,
    pub port: u16,
    pub base: PathBuf,
}

impl GitDaemon {
    pub fn start(base: &Path) -> Self {
        require("/usr/lib/git-core/git-daemon");
        let port = free_port();
        let log = base.join("daemon.log");
        // The daemon itself, not the `git daemon` wrapper: killing the wrapper
        // (SIGKILL, which it cannot pass on) would leave the daemon running.
        let mut child = Command::new("/usr/lib/git-core/git-daemon")
            .args([
                "--reuseaddr",
                "--export-all",
                "--enable=receive-pack",
                "--informative-errors",
                "--listen=127.0.0.1",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .arg(base)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start git daemon");
        wait_port(port, &mut child, "git daemon", &log);
        Self {
            child,
            port,
            base: base.to_path_buf(),
        }
    }

    pub fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{name}.git", self.port)
    }

    /// The daemon's process id (a bench starves it of CPU).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// Smart HTTP: lighttpd running `git http-backend` as CGI, basic auth required.
pub struct HttpServer {
    child: Child,
    pub port: u16,
    pub user: String,
    pub password: String,
}

impl HttpServer {
    pub fn start(root: &Path, work: &Path) -> Self {
        let lighttpd = require("/usr/sbin/lighttpd");
        require("/usr/lib/git-core/git-http-backend");
        let port = free_port();
        let (user, password) = ("deploy".to_string(), "s3cret-pass".to_string());
        std::fs::write(work.join("users"), format!("{user}:{password}\n")).unwrap();
        let log = work.join("lighttpd.log");
        let conf = format!(
            r#"server.document-root = "{root}"
server.port = {port}
server.bind = "127.0.0.1"
server.errorlog = "{log}"
server.modules = ("mod_access", "mod_alias", "mod_setenv", "mod_cgi", "mod_auth", "mod_authn_file")
alias.url = ("/git" => "/usr/lib/git-core/git-http-backend")
$HTTP["url"] =~ "^/git" {{
  cgi.assign = ("" => "")
  setenv.add-environment = ("GIT_PROJECT_ROOT" => "{root}", "GIT_HTTP_EXPORT_ALL" => "1")
}}
auth.backend = "plain"
auth.backend.plain.userfile = "{users}"
auth.require = ("/git" => ("method" => "basic", "realm" => "git", "require" => "valid-user"))
"#,
            root = root.display(),
            log = log.display(),
            users = work.join("users").display(),
        );
        let conf_path = work.join("lighttpd.conf");
        std::fs::write(&conf_path, conf).unwrap();
        std::fs::write(&log, "").unwrap();
        let mut child = Command::new(lighttpd)
            .arg("-D")
            .arg("-f")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join("lighttpd.stderr")).unwrap())
            .spawn()
            .expect("start lighttpd");
        wait_port(port, &mut child, "lighttpd", &work.join("lighttpd.stderr"));
        Self {
            child,
            port,
            user,
            password,
        }
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/git/{name}.git", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// sshd on a free port with a test host key and one authorized deploy key.
pub struct SshServer {
    child: Child,
    pub port: u16,
    pub host_key: PathBuf,
    pub client_key: PathBuf,
}

impl SshServer {
    pub fn start(work: &Path) -> Self {
        let sshd = require("/usr/sbin/sshd");
        std::fs::create_dir_all("/run/sshd").ok();
        let host_key = keygen(work, "ssh_host_ed25519");
        let client_key = keygen(work, "deploy_key");
        std::fs::write(
            work.join("authorized_keys"),
            format!("{}\n", public_key(&client_key)),
        )
        .unwrap();
        let port = free_port();
        let conf = format!(
            "HostKey {hk}\nPidFile {dir}/sshd.pid\nAuthorizedKeysFile {dir}/authorized_keys\nStrictModes no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
             PermitRootLogin prohibit-password\nUsePAM no\n",
            hk = host_key.display(),
            dir = work.display()
        );
        let conf_path = work.join("sshd_config");
        std::fs::write(&conf_path, conf).unwrap();
        let log = work.join("sshd.log");
        let mut child = Command::new(sshd)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&conf_path)
            .arg("-p")
            .arg(port.to_string())
            .args(["-o", "ListenAddress=127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start sshd");
        wait_port(port, &mut child, "sshd", &log);
        Self {
            child,
            port,
            host_key,
            client_key,
        }
    }

    /// URL of the repository at absolute `path`.
    pub fn url(&self, path: &Path) -> String {
        format!("ssh://root@127.0.0.1:{}{}", self.port, path.display())
    }

    /// A known_hosts line for this server.
    pub fn known_hosts_line(&self) -> String {
        format!("[127.0.0.1]:{} {}\n", self.port, public_key(&self.host_key))
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}
