//! The one judgement, differentially (docs/design.md §4): the agent never
//! applies a version move that `drover check --base <its last applied
//! commit>` refuses, and refuses nothing check allows but for trust.
//!
//! Random config histories — every kind of policy edit (chain order,
//! evidence, status branch, report signers, revocations, soaks), bumps and
//! downgrades, environments deleted and added back, freezes, invalid
//! configs, signed, unsigned and foreign-signed commits, merges of side
//! branches, and signed, forged and unsigned status reports — are pushed in
//! random batches. For every batch the agent's admission (`admit_head`, the
//! function the agent's admit stage calls) is compared with
//! `check_base` (what `drover check --base` runs) over the same span, and
//! with a model of the rules written here from the design, not from the
//! code: a span that edits the policy and moves the agent's environment is
//! refused whatever the commits on the way did.
//!
//! Everything is in-process: git2 repositories, ed25519 keys from fixed
//! seeds signing with the `ssh-key` crate (as the agent signs its status
//! commits), status commits made by `drover::status::build_commit`.
//! `DROVER_DIFF_SEED` replays one history; a failure prints its seed.

use chrono::{DateTime, Duration, TimeZone, Utc};
use drover::admit::{self, Admitted, Rejection, Stage, TrustCheck};
use drover::gate::Decision;
use drover::rollout::RolloutState;
use drover::status::{PublishOptions, StatusReport};
use drover::trust::{self, AllowedSigners};
use git2::{ObjectType, Oid, Repository, Signature};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ssh_key::private::Ed25519Keypair;
use ssh_key::{HashAlg, LineEnding, PrivateKey};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Environments a history draws from; the first three start the chain.
const ENVS: [&str; 4] = ["test", "stage", "production", "canary"];
const VERSIONS: [&str; 7] = [
    "1.12.0",
    "1.13.0",
    "1.13.3",
    "1.13.3+rebuild",
    "1.14.0-rc.1",
    "1.0.0",
    "9.9.9",
];
const BRANCHES: [&str; 2] = ["drover/status", "fleet/status"];
/// Operations per history.
const OPS: usize = 34;
/// The property's floor: generated cases, each one agent's admission of
/// one push compared with check --base over the same span. Histories are
/// generated until it is reached (about 210 of them, 12 pushes each,
/// judged by an agent of each of the four environments).
const MIN_CASES: usize = 10_000;

fn key(seed: u8) -> PrivateKey {
    PrivateKey::from(Ed25519Keypair::from_seed(&[seed; 32]))
}

fn public(k: &PrivateKey) -> String {
    k.public_key().to_openssh().unwrap()
}

struct Keys {
    reviewer: PrivateKey,
    /// Signs config commits but is no allowed signer of the agent.
    stranger: PrivateKey,
    /// Each cluster's report key, by cluster.
    clusters: BTreeMap<String, PrivateKey>,
    /// A report key listed for stage/stage-1 only by some policies.
    rogue: PrivateKey,
    /// The report signers file without and with the rogue key.
    report_signers: [String; 2],
}

impl Keys {
    fn new() -> Keys {
        let clusters: BTreeMap<String, PrivateKey> = ENVS
            .iter()
            .enumerate()
            .map(|(i, e)| (format!("{e}-1"), key(10 + i as u8)))
            .collect();
        let rogue = key(3);
        let listed: String = clusters
            .iter()
            .map(|(c, k)| {
                let env = c.trim_end_matches("-1");
                format!("{env}/{c} namespaces=\"git\" {}\n", public(k))
            })
            .collect();
        let with_rogue = format!(
            "{listed}stage/stage-1 namespaces=\"git\" {}\n",
            public(&rogue)
        );
        Keys {
            reviewer: key(1),
            stranger: key(2),
            rogue,
            clusters,
            report_signers: [listed, with_rogue],
        }
    }
}

/// One environment as a config commit writes it.
#[derive(Clone, Debug, PartialEq)]
struct Env {
    version: &'static str,
    soak_hours: u32,
    allow_downgrade: bool,
    freeze: bool,
}

/// The config a commit writes: the model the generator mutates.
#[derive(Clone, Debug, PartialEq)]
struct World {
    chain: Vec<&'static str>,
    envs: BTreeMap<&'static str, Env>,
    history: bool,
    branch: &'static str,
    rogue_listed: bool,
    revoked: Vec<&'static str>,
}

impl World {
    fn initial() -> World {
        let env = Env {
            version: "1.12.0",
            soak_hours: 24,
            allow_downgrade: false,
            freeze: false,
        };
        World {
            chain: vec!["test", "stage", "production"],
            envs: ENVS[..3].iter().map(|e| (*e, env.clone())).collect(),
            history: false,
            branch: BRANCHES[0],
            rogue_listed: false,
            revoked: Vec::new(),
        }
    }

    fn files(&self, keys: &Keys, broken: Option<u8>) -> Vec<(String, Vec<u8>)> {
        let quoted = |v: &[&str]| {
            v.iter()
                .map(|e| format!("\"{e}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let revoked: Vec<String> = self
            .revoked
            .iter()
            .map(|v| format!("{{ version = \"{v}\", reason = \"bad {v}\" }}"))
            .collect();
        let clusters: String = self
            .chain
            .iter()
            .map(|e| format!("{e} = [\"{e}-1\"]\n"))
            .collect();
        let mut root = format!(
            "[promotion]\nchain = [{}]\nevidence = \"{}\"\nstatus_branch = \"{}\"\n\
             report_signers = \"agents.allowed_signers\"\nrevoked = [{}]\n\n[clusters]\n{clusters}",
            quoted(&self.chain),
            if self.history { "history" } else { "status" },
            self.branch,
            revoked.join(", ")
        );
        let mut signers = keys.report_signers[usize::from(self.rogue_listed)].clone();
        let mut out = Vec::new();
        for e in &self.chain {
            let env = &self.envs[e];
            let mut text = format!("version = \"{}\"\n", env.version);
            if env.allow_downgrade {
                text.push_str("allow_downgrade = true\n");
            }
            text.push_str("\n[window]\nschedule = \"0 2 1 * *\"\nduration = \"6h\"\n");
            if env.freeze {
                text.push_str(
                    "\n[[freeze]]\nstart = 2026-12-18T00:00:00\nend = 2027-01-04T00:00:00\nreason = \"holidays\"\n",
                );
            }
            text.push_str(&format!("\n[promotion]\nsoak = \"{}h\"\n", env.soak_hours));
            out.push((format!("environments/{e}.toml"), text.into_bytes()));
        }
        match broken {
            Some(0) => root.push_str("chain = \"twice\"\n"),
            Some(1) => {
                if let Some((_, t)) = out.first_mut() {
                    *t = b"version = \"latest\"\n".to_vec();
                }
            }
            Some(_) => signers.push_str("stage/stage-1 not-a-key\n"),
            None => {}
        }
        out.push(("drover.toml".into(), root.into_bytes()));
        out.push(("agents.allowed_signers".into(), signers.into_bytes()));
        out
    }
}

/// How a commit is signed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Signed {
    Reviewer,
    Stranger,
    Unsigned,
}

/// A nested tree holding `files`, writing only what `written` lacks (most
/// commits change one file of five).
fn tree_of(repo: &Repository, written: &mut HashSet<Oid>, files: &[(String, Vec<u8>)]) -> Oid {
    let mut dirs: BTreeMap<String, Vec<(String, Vec<u8>)>> = BTreeMap::new();
    let mut entries: Vec<(String, Oid, i32)> = Vec::new();
    for (path, bytes) in files {
        match path.split_once('/') {
            Some((dir, rest)) => dirs
                .entry(dir.to_owned())
                .or_default()
                .push((rest.to_owned(), bytes.clone())),
            None => {
                let oid = Oid::hash_object(ObjectType::Blob, bytes).unwrap();
                if written.insert(oid) {
                    repo.blob(bytes).unwrap();
                }
                entries.push((path.clone(), oid, 0o100644));
            }
        }
    }
    for (dir, inner) in dirs {
        let sub = tree_of(repo, written, &inner);
        entries.push((dir, sub, 0o040000));
    }
    entries.sort();
    let mut raw = Vec::new();
    for (name, oid, mode) in &entries {
        raw.extend_from_slice(format!("{mode:o} {name}\0").as_bytes());
        raw.extend_from_slice(oid.as_bytes());
    }
    let oid = Oid::hash_object(ObjectType::Tree, &raw).unwrap();
    if written.insert(oid) {
        let mut tb = repo.treebuilder(None).unwrap();
        for (name, oid, mode) in &entries {
            tb.insert(name, *oid, *mode).unwrap();
        }
        assert_eq!(tb.write().unwrap(), oid);
    }
    oid
}

/// The generator's repository and what it knows about every commit.
/// Objects are written to memory and packed at each push ([`Repo::flush`]):
/// thousands of small loose files cost more than judging them.
struct Repo<'r> {
    path: std::path::PathBuf,
    repo: &'r Repository,
    odb: &'r git2::Odb<'r>,
    mempack: git2::Mempack<'r>,
    keys: Keys,
    /// Every config commit: its parents and how it is signed.
    commits: HashMap<Oid, (Vec<Oid>, Signed)>,
    main: Oid,
    /// The World at each main commit (`None`: the commit's config is invalid).
    worlds: HashMap<Oid, Option<World>>,
    /// Blobs and trees already written.
    written: HashSet<Oid>,
}

impl<'r> Repo<'r> {
    fn new(
        repo: &'r Repository,
        odb: &'r git2::Odb<'r>,
        path: std::path::PathBuf,
        world: &World,
        at: DateTime<Utc>,
    ) -> Repo<'r> {
        // Above the loose backend: every write goes to memory.
        let mempack = odb.add_new_mempack_backend(1000).unwrap();
        let mut r = Repo {
            path,
            repo,
            odb,
            mempack,
            keys: Keys::new(),
            commits: HashMap::new(),
            main: Oid::ZERO_SHA1,
            worlds: HashMap::new(),
            written: HashSet::new(),
        };
        let files = world.files(&r.keys, None);
        let c = r.commit(&files, &[], at, Signed::Reviewer);
        r.main = c;
        r.worlds.insert(c, Some(world.clone()));
        r
    }

    /// Everything written since the last flush, as one pack on disk, where
    /// `drover check --base` (a repository opened anew) finds it.
    fn flush(&self) {
        let mut buf = git2::Buf::new();
        self.mempack.dump(self.repo, &mut buf).unwrap();
        let mut w = self.odb.packwriter().unwrap();
        std::io::Write::write_all(&mut w, &buf).unwrap();
        w.commit().unwrap();
        self.mempack.reset().unwrap();
    }

    fn commit(
        &mut self,
        files: &[(String, Vec<u8>)],
        parents: &[Oid],
        at: DateTime<Utc>,
        signed: Signed,
    ) -> Oid {
        let repo = self.repo;
        let tree = repo
            .find_tree(tree_of(repo, &mut self.written, files))
            .unwrap();
        let who = Signature::new(
            "Reviewer",
            "r@example.com",
            &git2::Time::new(at.timestamp(), 0),
        )
        .unwrap();
        let parent_commits: Vec<git2::Commit<'_>> = parents
            .iter()
            .map(|p| repo.find_commit(*p).unwrap())
            .collect();
        let refs: Vec<&git2::Commit<'_>> = parent_commits.iter().collect();
        let buf = repo
            .commit_create_buffer(&who, &who, "change", &tree, &refs)
            .unwrap();
        let key = match signed {
            Signed::Reviewer => Some(&self.keys.reviewer),
            Signed::Stranger => Some(&self.keys.stranger),
            Signed::Unsigned => None,
        };
        let oid = match key {
            Some(k) => {
                let sig = k.sign(trust::GIT_NAMESPACE, HashAlg::Sha512, &buf).unwrap();
                let pem = sig.to_pem(LineEnding::LF).unwrap();
                repo.commit_signed(buf.as_str().unwrap(), pem.trim_end(), None)
                    .unwrap()
            }
            None => repo.odb().unwrap().write(ObjectType::Commit, &buf).unwrap(),
        };
        self.commits.insert(oid, (parents.to_vec(), signed));
        oid
    }

    /// A commit on main writing `world` (invalid with `broken`).
    fn main_commit(
        &mut self,
        world: &World,
        broken: Option<u8>,
        at: DateTime<Utc>,
        signed: Signed,
    ) {
        let files = world.files(&self.keys, broken);
        let c = self.commit(&files, &[self.main], at, signed);
        self.main = c;
        self.worlds
            .insert(c, broken.is_none().then(|| world.clone()));
    }

    /// A side branch off an older main commit writing `world`, merged into
    /// main by a merge commit with the same tree.
    fn merge(&mut self, world: &World, fork: Oid, at: DateTime<Utc>, side: Signed, merge: Signed) {
        let files = world.files(&self.keys, None);
        let s = self.commit(&files, &[fork], at - Duration::hours(1), side);
        let m = self.commit(&files, &[self.main, s], at, merge);
        self.main = m;
        self.worlds.insert(m, Some(world.clone()));
    }

    /// A status report of `cluster` on `branch`'s cluster branch (or the
    /// single branch), signed by `key` (unsigned with `None`).
    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        branch: &str,
        legacy: bool,
        cluster: &str,
        version: &str,
        state: RolloutState,
        since: DateTime<Utc>,
        key: Option<&PrivateKey>,
    ) {
        let env = cluster.trim_end_matches("-1");
        let report = StatusReport {
            env: env.into(),
            cluster: cluster.into(),
            config_commit: "0".repeat(40),
            version: version.parse().unwrap(),
            state,
            since,
            nodes: 3,
            nodes_at_version: 3,
            message: String::new(),
            detail: Default::default(),
        };
        let opts = PublishOptions {
            signing_key: key.cloned(),
            commit_time: Some(since),
            ..PublishOptions::default()
        };
        let name = if legacy {
            format!("refs/heads/{branch}")
        } else {
            format!(
                "refs/heads/{}",
                drover::status::cluster_branch(branch, env, cluster)
            )
        };
        let tip = self.repo.refname_to_id(&name).ok();
        if let Some(c) = drover::status::build_commit(self.repo, &report, &opts, tip).unwrap() {
            self.repo.reference(&name, c, true, "report").unwrap();
        }
    }

    /// Every commit reachable from `head` and not from `base`, by the
    /// generator's own record of parents.
    fn span(&self, base: Oid, head: Oid) -> Vec<Oid> {
        let reach = |from: Oid| {
            let mut seen = HashSet::new();
            let mut todo = vec![from];
            while let Some(c) = todo.pop() {
                if seen.insert(c) {
                    todo.extend(self.commits[&c].0.iter().copied());
                }
            }
            seen
        };
        let old = reach(base);
        reach(head)
            .into_iter()
            .filter(|c| !old.contains(c))
            .collect()
    }
}

/// The policy keys the model says a span edits, seen from the agent's
/// environment (`new`: it is not in the base's config).
fn model_edits(base: &World, head: &World, new: bool) -> bool {
    let chain_edited = if new {
        let kept: Vec<_> = head
            .chain
            .iter()
            .filter(|e| base.chain.contains(e))
            .collect();
        kept != base.chain.iter().collect::<Vec<_>>()
    } else {
        head.chain != base.chain
    };
    let soaks = base
        .chain
        .iter()
        .any(|e| head.chain.contains(e) && head.envs[e].soak_hours != base.envs[e].soak_hours);
    chain_edited
        || soaks
        || base.history != head.history
        || base.branch != head.branch
        || base.rogue_listed != head.rogue_listed
        || base.revoked != head.revoked
}

/// What one history counted.
#[derive(Default, Clone, Copy)]
struct Tally {
    /// Admissions compared with check --base (trust passed).
    compared: usize,
    applied: usize,
    gate_refused: usize,
    /// Admissions refused by trust, as the generator's record says they must be.
    trust_refused: usize,
}

impl std::ops::Add for Tally {
    type Output = Tally;
    fn add(self, o: Tally) -> Tally {
        Tally {
            compared: self.compared + o.compared,
            applied: self.applied + o.applied,
            gate_refused: self.gate_refused + o.gate_refused,
            trust_refused: self.trust_refused + o.trust_refused,
        }
    }
}

/// One environment's agent: its last applied commit moves only when its
/// admission applies a push.
struct Agent {
    env: &'static str,
    last: Oid,
}

/// A history's fleet: an agent per environment, one trust configuration.
struct Fleet {
    seed: u64,
    mode: trust::Mode,
    signers: AllowedSigners,
    agents: Vec<Agent>,
    tally: Tally,
}

impl Fleet {
    fn fail(&self, agent: &Agent, head: Oid, what: String) -> ! {
        panic!(
            "admission and check --base disagree (history seed {}, env {}, verify {:?}, \
             last applied {:.10}, head {:.10}): {what}\n\
             replay: DROVER_DIFF_SEED={} cargo test --test offline admit_differential",
            self.seed, agent.env, self.mode, agent.last, head, self.seed
        )
    }

    /// A push of main: every agent judges its span, each compared with
    /// `check --base <its last applied>` (run once per distinct base).
    /// Returns whether every agent that judged was refused by trust.
    fn push(&mut self, repo: &mut Repo<'_>, now: DateTime<Utc>) -> bool {
        let head = repo.main;
        repo.flush();
        repo.repo.set_head_detached(head).unwrap();
        let mut checks: HashMap<Oid, admit::ChangeReport> = HashMap::new();
        let (mut judged, mut by_trust) = (0, 0);
        let mut agents = std::mem::take(&mut self.agents);
        for agent in &mut agents {
            if agent.last == head {
                continue;
            }
            judged += 1;
            let check = match checks.get(&agent.last) {
                Some(c) => c.clone(),
                None => {
                    let c = admit::check_base(&repo.path, &agent.last.to_string(), now)
                        .unwrap_or_else(|e| {
                            self.fail(agent, head, format!("check --base could not run: {e}"))
                        });
                    checks.insert(agent.last, c.clone());
                    c
                }
            };
            if self.judge(agent, repo, &check, now) {
                by_trust += 1;
            }
        }
        self.agents = agents;
        judged > 0 && by_trust == judged
    }

    /// One agent's admission of main over its last applied commit, compared
    /// with `check`; returns whether trust refused it.
    fn judge(
        &mut self,
        agent: &mut Agent,
        repo: &Repo<'_>,
        check: &admit::ChangeReport,
        now: DateTime<Utc>,
    ) -> bool {
        let head = repo.main;
        let env = agent.env;
        let first_seen = |_| now.timestamp();
        let trusted = TrustCheck {
            mode: self.mode,
            signers: (&self.signers).into(),
            first_seen: &first_seen,
        };
        let admitted = admit::admit_head(repo.repo, Some(agent.last), head, env, &trusted, now);

        // Trust, by the generator's record of how each commit is signed.
        let suspects = match self.mode {
            trust::Mode::All => repo.span(agent.last, head),
            _ => vec![head],
        };
        let untrusted = suspects
            .iter()
            .any(|c| repo.commits[c].1 != Signed::Reviewer);
        match (&admitted, untrusted) {
            (Err(r), true) if r.stage == Stage::Trust => {
                self.tally.trust_refused += 1;
                return true;
            }
            (_, true) => self.fail(
                agent,
                head,
                format!("an unsigned or foreign commit in the span passed trust: {admitted:?}"),
            ),
            (Err(r), false) if r.stage == Stage::Trust => self.fail(
                agent,
                head,
                format!("every commit is signed, yet trust refused: {r}"),
            ),
            _ => {}
        }
        self.tally.compared += 1;

        let base_world = repo.worlds[&agent.last]
            .clone()
            .expect("the agent only applies valid configs");
        let head_world = repo.worlds[&head].clone();
        let verdict = check
            .decisions
            .iter()
            .find(|(e, _)| e == env)
            .map(|(_, d)| d.clone());
        let env_file = format!("environments/{env}.toml");
        match &admitted {
            Err(Rejection {
                stage: Stage::Config,
                code,
                ..
            }) if code == "invalid" => {
                if head_world.is_some()
                    || check.diagnostics.is_empty()
                    || !check.decisions.is_empty()
                {
                    self.fail(
                        agent,
                        head,
                        format!(
                            "config refused by the agent; check: {:?}",
                            check.diagnostics
                        ),
                    );
                }
            }
            Err(Rejection {
                stage: Stage::Config,
                code,
                ..
            }) if code == "unknown_env" => {
                let has = head_world.as_ref().is_some_and(|w| w.chain.contains(&env));
                if has || verdict.is_some() {
                    self.fail(
                        agent,
                        head,
                        format!("unknown_env, but check says {verdict:?}"),
                    );
                }
            }
            Err(Rejection {
                stage: Stage::Gate,
                refusal: Some(r),
                code,
                ..
            }) => {
                self.tally.gate_refused += 1;
                if verdict != Some(Decision::Refused((**r).clone())) {
                    self.fail(
                        agent,
                        head,
                        format!("the agent refused ({code}: {r}); check --base: {verdict:?}"),
                    );
                }
                if !check
                    .diagnostics
                    .iter()
                    .any(|d| d.file == env_file && d.message == r.to_string())
                {
                    self.fail(
                        agent,
                        head,
                        format!(
                            "no check --base diagnostic for {env}: {:?}",
                            check.diagnostics
                        ),
                    );
                }
            }
            Ok(Admitted { decision, .. }) => {
                self.tally.applied += 1;
                let expected = match decision {
                    Decision::Unchanged => None,
                    d => Some(d.clone()),
                };
                if verdict != expected || check.diagnostics.iter().any(|d| d.file == env_file) {
                    self.fail(
                        agent,
                        head,
                        format!(
                            "the agent applied ({decision}); check --base: {verdict:?} {:?}",
                            check.diagnostics
                        ),
                    );
                }
                // The split push, by the model: a span that edits the policy
                // and moves this environment's version is never applied.
                let w = head_world.as_ref().expect("applied a valid config");
                let new = !base_world.chain.contains(&env);
                let moved = new || base_world.envs[env].version != w.envs[env].version;
                if moved && model_edits(&base_world, w, new) {
                    self.fail(
                        agent,
                        head,
                        format!("applied a span that edits the policy and moves {env}: {decision}"),
                    );
                }
                agent.last = head;
            }
            Err(r) => self.fail(agent, head, format!("unexpected rejection: {r:?}")),
        }
        false
    }
}

/// One history: random operations, each followed by a push a third of the
/// time (and always at the end), judged by an agent of every environment.
fn history(seed: u64) -> Tally {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now: DateTime<Utc> = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
    let mut world = World::initial();
    // In memory where the system has it.
    let dir = match std::path::Path::new("/dev/shm") {
        shm if shm.is_dir() => tempfile::tempdir_in(shm),
        _ => tempfile::tempdir(),
    }
    .unwrap();
    let path = dir.path().join("repo");
    let git = Repository::init(&path).unwrap();
    let odb = git.odb().unwrap();
    let mut repo = Repo::new(&git, &odb, path, &world, now);
    let mut fleet = Fleet {
        seed,
        mode: if rng.random_bool(0.75) {
            trust::Mode::All
        } else {
            trust::Mode::Head
        },
        signers: AllowedSigners::parse(&format!(
            "reviewer@example.com namespaces=\"git\" {}\n",
            public(&repo.keys.reviewer)
        ))
        .unwrap(),
        agents: ENVS
            .iter()
            .map(|env| Agent {
                env,
                last: repo.main,
            })
            .collect(),
        tally: Tally::default(),
    };
    // Main's commits in order, to find the newest of the agents' commits.
    let mut order: HashMap<Oid, usize> = HashMap::from([(repo.main, 0)]);
    let pick = |rng: &mut StdRng, v: &[&'static str]| v[rng.random_range(0..v.len())];
    for op in 0..=OPS {
        now += Duration::hours(rng.random_range(1..40));
        let signed = match rng.random_range(0..300) {
            0..=1 => Signed::Unsigned,
            2 => Signed::Stranger,
            _ => Signed::Reviewer,
        };
        let mut next = world.clone();
        match rng.random_range(0..100) {
            // The last operation is a push of everything.
            _ if op == OPS => {}
            // Bumps, downgrades (with and without the flag) of an environment.
            0..=29 => {
                let e = pick(&mut rng, &next.chain.clone());
                let env = next.envs.get_mut(e).unwrap();
                env.version = pick(&mut rng, &VERSIONS);
                env.allow_downgrade = rng.random_bool(0.3);
            }
            30..=36 => {
                let e = pick(&mut rng, &next.chain.clone());
                next.envs.get_mut(e).unwrap().soak_hours = [0, 1, 24, 72][rng.random_range(0..4)];
            }
            37..=41 => {
                let i = rng.random_range(0..next.chain.len());
                let j = rng.random_range(0..next.chain.len());
                next.chain.swap(i, j);
            }
            // An environment deleted (file, chain, clusters) or added back.
            42..=47 if next.chain.len() > 1 => {
                let e = pick(&mut rng, &next.chain.clone());
                next.chain.retain(|x| *x != e);
                next.envs.remove(e);
            }
            48..=53 if next.chain.len() < ENVS.len() => {
                let deleted: Vec<&'static str> = ENVS
                    .iter()
                    .copied()
                    .filter(|e| !next.chain.contains(e))
                    .collect();
                let e = pick(&mut rng, &deleted);
                let at = rng.random_range(0..=next.chain.len());
                next.chain.insert(at, e);
                next.envs.insert(
                    e,
                    Env {
                        version: pick(&mut rng, &VERSIONS),
                        soak_hours: [0, 24][rng.random_range(0..2)],
                        allow_downgrade: false,
                        freeze: false,
                    },
                );
            }
            54..=58 => {
                let v = pick(&mut rng, &["1.13.3", "1.13.3+rebuild", "9.9.9", "1.13.0"]);
                if next.revoked.contains(&v) {
                    next.revoked.retain(|x| *x != v);
                } else {
                    next.revoked.push(v);
                }
            }
            59..=62 => {
                let e = pick(&mut rng, &next.chain.clone());
                let f = &mut next.envs.get_mut(e).unwrap().freeze;
                *f = !*f;
            }
            63..=64 => next.history = !next.history,
            65..=66 => next.branch = pick(&mut rng, &BRANCHES),
            67..=69 => next.rogue_listed = !next.rogue_listed,
            // A commit whose config is invalid; the next one writes the world again.
            70..=72 => repo.main_commit(&world, Some(rng.random_range(0..3u8)), now, signed),
            // A side branch off main, merged by a merge commit: it brings a bump.
            73..=78 => {
                let e = pick(&mut rng, &next.chain.clone());
                next.envs.get_mut(e).unwrap().version = pick(&mut rng, &VERSIONS);
                let side = if rng.random_bool(0.03) {
                    Signed::Unsigned
                } else {
                    Signed::Reviewer
                };
                let fork = repo.main;
                repo.merge(&next, fork, now, side, signed);
                world = next.clone();
            }
            // Status reports: confirmations and failures, signed by their
            // cluster, by the rogue key, or not at all, on either branch
            // name, per cluster or on the single branch of the older layout.
            _ => {
                let cluster = format!("{}-1", pick(&mut rng, &ENVS));
                let version = pick(&mut rng, &VERSIONS);
                let state = if rng.random_bool(0.8) {
                    RolloutState::Confirmed
                } else {
                    RolloutState::Failed
                };
                let since = now - Duration::hours(rng.random_range(0..96));
                let key = match rng.random_range(0..10) {
                    0 => None,
                    1 => Some(repo.keys.rogue.clone()),
                    _ => Some(repo.keys.clusters[&cluster].clone()),
                };
                let branch = pick(&mut rng, &BRANCHES);
                let legacy = rng.random_bool(0.15);
                repo.report(
                    branch,
                    legacy,
                    &cluster,
                    version,
                    state,
                    since,
                    key.as_ref(),
                );
            }
        }
        if next != world || rng.random_bool(0.05) {
            world = next;
            repo.main_commit(&world, None, now, signed);
        }
        let n = order.len();
        order.entry(repo.main).or_insert(n);
        if (op == OPS || rng.random_bool(0.35))
            && fleet.push(&mut repo, now)
            && rng.random_bool(0.6)
        {
            // Every agent refused by trust: the team rewrites main back to
            // the newest commit an agent applied (a force-push), as it must.
            let newest = fleet
                .agents
                .iter()
                .map(|a| a.last)
                .max_by_key(|c| order[c])
                .unwrap();
            repo.main = newest;
            world = repo.worlds[&newest].clone().unwrap();
        }
    }
    fleet.tally
}

#[test]
fn the_agent_admits_exactly_what_check_base_allows_over_random_pushes() {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    // One history replayed, or histories from a random seed until the floor.
    let (base, replay) = match std::env::var("DROVER_DIFF_SEED") {
        Ok(s) => (s.parse::<u64>().expect("DROVER_DIFF_SEED: a number"), true),
        Err(_) => (u64::from(rand::random::<u32>()), false),
    };
    let next = AtomicU64::new(0);
    let compared = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    let started = std::time::Instant::now();
    let tally = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Tally::default();
                    while compared.load(Ordering::Relaxed) < MIN_CASES {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if replay && i > 0 {
                            break;
                        }
                        let t = history(base + i);
                        compared.fetch_add(t.compared, Ordering::Relaxed);
                        mine = mine + t;
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold(Tally::default(), |a, b| a + b)
    });
    eprintln!(
        "admit_differential: {} admissions compared ({} applied, {} refused by the gate), \
         {} refused by trust, in histories from seed {base} on, {:.1}s",
        tally.compared,
        tally.applied,
        tally.gate_refused,
        tally.trust_refused,
        started.elapsed().as_secs_f64()
    );
    if replay {
        return;
    }
    assert!(tally.compared >= MIN_CASES, "{} cases", tally.compared);
    // Both verdicts occur often, or the property would say little.
    assert!(
        tally.applied * 6 >= tally.compared && tally.gate_refused * 6 >= tally.compared,
        "{} applied, {} refused of {}",
        tally.applied,
        tally.gate_refused,
        tally.compared
    );
}
