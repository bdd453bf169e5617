//! The simulation's forge: a bare origin the agent fetches from and pushes
//! its reports to (a local path, through the agent's own git code), the
//! merges a reviewer makes (commits written in-process, dated by the
//! virtual clock), another cluster's agent pushing its signed reports with
//! drover's own publisher, someone forging that cluster's branch and a
//! person repairing it, and an outage (the origin unreachable).

use chrono::{DateTime, Utc};
use drover::rollout::RolloutState;
use drover::source::{Source, SourceConfig};
use drover::status::{PublishOptions, StatusReport};
use git2::{Oid, Repository, Signature, Time};
use semver::Version;
use ssh_key::private::{Ed25519Keypair, PrivateKey};
use std::path::{Path, PathBuf};

pub const ENV: &str = "sim";
pub const CLUSTER: &str = "sim-1";
pub const PEER: &str = "peer-1";

/// A report signing key from a fixed seed: the same keys every run.
pub fn key(seed: u8) -> PrivateKey {
    PrivateKey::from(Ed25519Keypair::from_seed(&[seed; 32]))
}

/// The peer's status branch, as a ref on the origin.
fn peer_ref() -> String {
    let branch = drover::status_refs::cluster_branch("drover/status", ENV, PEER);
    format!("refs/heads/{branch}")
}

/// What an environment file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFile {
    pub version: Version,
    pub max_unavailable: u32,
    pub on_failure_rollback: bool,
    pub max_rollbacks: u32,
    pub paused: bool,
    /// A freeze over the whole simulated time.
    pub frozen: bool,
    /// Wave 1 is the peer, wave 2 this cluster.
    pub waves: bool,
    pub prepare: bool,
    pub allow_downgrade: bool,
}

impl EnvFile {
    fn text(&self) -> String {
        let mut t = format!(
            "version = \"{}\"\nallow_downgrade = {}\n\n[window]\nschedule = \"0 0 * * *\"\nduration = \"23h\"\ntimezone = \"UTC\"\n\n\
             [rollout]\nmax_unavailable = {}\ndrain_timeout = \"10m\"\nnode_timeout = \"30m\"\npaused = {}\n",
            self.version, self.allow_downgrade, self.max_unavailable, self.paused
        );
        if self.on_failure_rollback {
            t.push_str(&format!(
                "on_failure = \"rollback\"\nmax_rollbacks = {}\n",
                self.max_rollbacks
            ));
        }
        t.push_str("\n[health]\nsettle = \"1m\"\npod_ready_timeout = \"1m\"\n");
        t.push_str(&format!(
            "\n[driver]\nkind = \"job\"\nimage = \"example.com/updater:1\"\ncommand = [\"update\"]\nprepare = {}\n",
            self.prepare
        ));
        if self.frozen {
            t.push_str(
                "\n[[freeze]]\nstart = 2026-01-01T00:00:00Z\nend = 2028-01-01T00:00:00Z\nreason = \"simulated freeze\"\n",
            );
        }
        if self.waves {
            t.push_str(&format!(
                "\n[[wave]]\nclusters = [\"{PEER}\"]\nsoak = \"0s\"\n\n[[wave]]\nclusters = [\"{CLUSTER}\"]\n"
            ));
        }
        t
    }
}

/// The origin and the people and clusters writing to it.
pub struct Forge {
    pub dir: PathBuf,
    origin: PathBuf,
    revoked: Vec<Version>,
    peer: Option<Source>,
    /// While the peer's branch is forged: its tip before the forgery
    /// (`None`: the forgery created it).
    forged_over: Option<Option<Oid>>,
}

impl Forge {
    pub fn create(dir: &Path, first: &EnvFile, at: DateTime<Utc>) -> Forge {
        let origin = dir.join("origin.git");
        Repository::init_bare(&origin).expect("origin");
        let mut f = Forge {
            dir: dir.to_path_buf(),
            origin,
            revoked: Vec::new(),
            peer: None,
            forged_over: None,
        };
        f.merge(first, "initial configuration", at);
        f
    }

    /// The URL the agents fetch from and push to.
    pub fn url(&self) -> String {
        format!("file://{}", self.origin.display())
    }

    fn down_path(&self) -> PathBuf {
        self.origin.with_extension("down")
    }

    /// The origin unreachable (fetches and pushes fail) or back.
    pub fn set_down(&self, down: bool) {
        let (from, to) = if down {
            (self.origin.clone(), self.down_path())
        } else {
            (self.down_path(), self.origin.clone())
        };
        if from.exists() {
            std::fs::rename(from, to).expect("origin outage");
        }
    }

    fn repo(&self) -> Repository {
        let path = if self.origin.exists() {
            &self.origin
        } else {
            &self.down_path()
        };
        Repository::open_bare(path).expect("origin")
    }

    /// A reviewed merge to main: the whole config as `env` says.
    pub fn merge(&mut self, env: &EnvFile, message: &str, at: DateTime<Utc>) -> Oid {
        let repo = self.repo();
        let revoked: Vec<String> = self
            .revoked
            .iter()
            .map(|v| format!("{{ version = \"{v}\", reason = \"simulated\" }}"))
            .collect();
        let root = format!(
            "[promotion]\nchain = [\"{ENV}\"]\nevidence = \"status\"\nreport_signers = \"agents.allowed_signers\"\nrevoked = [{}]\n\n[clusters]\n{ENV} = [\"{PEER}\", \"{CLUSTER}\"]\n",
            revoked.join(", ")
        );
        let signers: String = [(PEER, 2u8), (CLUSTER, 1u8)]
            .iter()
            .map(|(c, k)| {
                let public = key(*k).public_key().to_openssh().expect("public key");
                format!("{ENV}/{c} namespaces=\"git\" {public}\n")
            })
            .collect();
        let blob = |text: &str| repo.blob(text.as_bytes()).expect("blob");
        let mut envs = repo.treebuilder(None).expect("tree");
        envs.insert(format!("{ENV}.toml"), blob(&env.text()), 0o100644)
            .expect("env file");
        let envs = envs.write().expect("tree");
        let mut top = repo.treebuilder(None).expect("tree");
        top.insert("drover.toml", blob(&root), 0o100644)
            .expect("root");
        top.insert("agents.allowed_signers", blob(&signers), 0o100644)
            .expect("signers");
        top.insert("environments", envs, 0o040000).expect("dir");
        let tree = repo.find_tree(top.write().expect("tree")).expect("tree");
        let sig = Signature::new(
            "Reviewer",
            "reviewer@example.com",
            &Time::new(at.timestamp(), 0),
        )
        .expect("signature");
        let parent = repo
            .refname_to_id("refs/heads/main")
            .ok()
            .and_then(|o| repo.find_commit(o).ok());
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        repo.commit(
            Some("refs/heads/main"),
            &sig,
            &sig,
            message,
            &tree,
            &parents,
        )
        .expect("commit")
    }

    /// Add `v` to `[promotion] revoked` from the next merge on.
    pub fn revoke(&mut self, v: &Version) {
        if !self.revoked.contains(v) {
            self.revoked.push(v.clone());
        }
    }

    pub fn revoked(&self) -> &[Version] {
        &self.revoked
    }

    /// This cluster's newest report on the origin, as its text.
    pub fn own_report(&self) -> Option<String> {
        let repo = self.repo();
        let branch = drover::status_refs::cluster_branch("drover/status", ENV, CLUSTER);
        let tip = repo.find_reference(&format!("refs/heads/{branch}")).ok()?;
        let tree = tip.peel_to_tree().ok()?;
        let entry = tree
            .get_path(Path::new(&drover::status::report_path(ENV, CLUSTER)))
            .ok()?;
        let blob = repo.find_blob(entry.id()).ok()?;
        Some(String::from_utf8_lossy(blob.content()).into_owned())
    }

    /// Every report the agent pushed to its branch, oldest first.
    pub fn own_reports(&self) -> Vec<String> {
        let repo = self.repo();
        let branch = drover::status_refs::cluster_branch("drover/status", ENV, CLUSTER);
        let Ok(tip) = repo.refname_to_id(&format!("refs/heads/{branch}")) else {
            return Vec::new();
        };
        let path = drover::status::report_path(ENV, CLUSTER);
        let mut walk = repo.revwalk().expect("revwalk");
        walk.push(tip).expect("tip");
        walk.simplify_first_parent().expect("first parent");
        let mut out: Vec<String> = walk
            .filter_map(|id| {
                let tree = repo.find_commit(id.ok()?).ok()?.tree().ok()?;
                let entry = tree.get_path(Path::new(&path)).ok()?;
                let blob = repo.find_blob(entry.id()).ok()?;
                Some(String::from_utf8_lossy(blob.content()).into_owned())
            })
            .collect();
        out.reverse();
        out
    }

    /// The peer's status branch deleted on the origin (a forgery on it
    /// goes with it).
    pub fn rewrite_peer(&mut self) {
        self.forged_over = None;
        if let Ok(mut r) = self.repo().find_reference(&peer_ref()) {
            let _ = r.delete();
        }
    }

    /// Whether the peer's branch holds a forgery now.
    pub fn peer_forged(&self) -> bool {
        self.forged_over.is_some()
    }

    /// An unsigned commit on the peer's branch, on top of its tip, whose
    /// report confirms `version` as the peer's own would: pushed by
    /// someone who can push but holds no agent's key.
    pub fn forge_peer(&mut self, version: &Version, at: DateTime<Utc>) {
        let repo = self.repo();
        let tip = repo.refname_to_id(&peer_ref()).ok();
        let report = StatusReport {
            env: ENV.into(),
            cluster: PEER.into(),
            config_commit: repo
                .refname_to_id("refs/heads/main")
                .map(|o| o.to_string())
                .unwrap_or_default(),
            version: version.clone(),
            state: RolloutState::Confirmed,
            since: at,
            nodes: 3,
            nodes_at_version: 3,
            message: "confirmed by nobody's agent".into(),
            detail: Default::default(),
        };
        // drover's own commit builder, without a key: the commit an agent
        // would make, but signed by nobody.
        let opts = PublishOptions {
            commit_time: Some(at),
            name: "Forger".into(),
            email: "forger@example.com".into(),
            ..PublishOptions::default()
        };
        let forged = drover::status::build_commit(&repo, &report, &opts, tip)
            .expect("forged commit")
            .expect("a new report");
        repo.reference(&peer_ref(), forged, true, "forged")
            .expect("forged branch");
        if self.forged_over.is_none() {
            self.forged_over = Some(tip);
        }
    }

    /// The forged branch reset to its tip before the forgery, or deleted
    /// when the forgery created it; whether there was one to repair.
    pub fn repair_peer(&mut self) -> bool {
        let Some(over) = self.forged_over.take() else {
            return false;
        };
        let repo = self.repo();
        match over {
            Some(tip) => {
                repo.reference(&peer_ref(), tip, true, "repaired")
                    .expect("reset");
            }
            None => {
                if let Ok(mut r) = repo.find_reference(&peer_ref()) {
                    let _ = r.delete();
                }
            }
        }
        true
    }

    /// The peer cluster's agent reports `state` for `version`, signed with
    /// its key, through drover's publisher (a failed push is its problem:
    /// the origin may be down).
    pub fn peer_reports(
        &mut self,
        state: RolloutState,
        version: &Version,
        at: DateTime<Utc>,
    ) -> bool {
        // drover's publisher refuses to build on a branch that does not
        // count as a whole (`PublishOptions::report_signers`, which this
        // stand-in for the peer's agent leaves unset): it reports again
        // once its branch is its own.
        if self.forged_over.is_some() {
            return false;
        }
        if self.peer.is_none() {
            let cfg = SourceConfig::new(self.url(), self.dir.join("peer-cache"));
            self.peer = Source::open(cfg).ok();
        }
        let Some(source) = &self.peer else {
            return false;
        };
        let fetched = match source.fetch() {
            Ok(f) => f,
            Err(e) => {
                if std::env::var("DROVER_SIM_TRACE").is_ok() {
                    eprintln!("{at}: the peer cannot fetch: {e}");
                }
                return false;
            }
        };
        let report = StatusReport {
            env: ENV.into(),
            cluster: PEER.into(),
            config_commit: fetched.head.to_string(),
            version: version.clone(),
            state,
            since: at,
            nodes: 3,
            nodes_at_version: if state == RolloutState::Confirmed {
                3
            } else {
                1
            },
            message: format!("{} by the simulation", state.as_str()),
            detail: Default::default(),
        };
        let opts = PublishOptions {
            signing_key: Some(key(2)),
            commit_time: Some(at),
            ..PublishOptions::default()
        };
        let published = drover::status::publish(source, &report, &opts);
        if std::env::var("DROVER_SIM_TRACE").is_ok() {
            eprintln!(
                "{at}: the peer reports {} for {version}: {published:?}",
                state.as_str()
            );
        }
        published.is_ok_and(|p| p.commit.is_some())
    }
}
