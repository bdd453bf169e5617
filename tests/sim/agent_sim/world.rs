//! One seed's world and its run: the real agent (`drover::agent::Agent`,
//! its passes, fetches, admission, engine, status writer, reporter) on a
//! single-threaded runtime whose time is paused, so timers fire in virtual
//! time; the in-memory cluster (`drover::sim::Sim`) as its cluster, through
//! the agent's `ClusterBackend` seam; the in-process API server (`api.rs`)
//! behind a real `kube::Client`; the forge (`forge.rs`) as its origin.
//!
//! Time moves in steps of [`STEP`]: the shared virtual clock first, then
//! the runtime's timers; after every step the plan's due changes and
//! faults are made and the checks run. A crash drops the runtime with
//! every task of the process on it (as SIGKILL would); the API server's
//! objects, the origin and the cluster outlive it.

use super::api::{ApiFault, ApiServer, Hits};
use super::checks::{Facts, Merge, Retry};
use super::forge::{self, EnvFile, Forge};
use super::plan::{v, Change, Fault, Plan, Step, RETRIES};
use chrono::{DateTime, Duration as D, Utc};
use drover::agent::{Agent, AgentConfig, ClusterBackend, Connected};
use drover::config::EnvConfig;
use drover::record::{ProgressState, RunAction};
use drover::rollout::{RolloutState, VirtualClock};
use drover::sim::{Failure, HealthFault, Pdb, Pod, Sim, SimNode};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How often the agent fetches (the checks' grace follows it).
pub const POLL: Duration = Duration::from_secs(180);

/// A lease: how long after a handoff the follower takes over.
const LEASE: Duration = Duration::from_secs(15);

/// One step of simulated time.
const STEP: Duration = Duration::from_secs(5);

fn start() -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse().unwrap()
}

/// The in-memory cluster, the same one for every process of the agent.
struct SimBackend(Arc<Sim>);

impl ClusterBackend for SimBackend {
    type Cluster = Arc<Sim>;
    type Error = std::convert::Infallible;
    type Settings = ();

    fn settings(&self, _: &str, _: &EnvConfig) {}

    async fn connect(&mut self, _: &()) -> Result<Connected<Arc<Sim>>, Self::Error> {
        // No change notifications: the agent's timers and tick wake it.
        Ok(Connected {
            cluster: self.0.clone(),
            changes: futures::stream::pending().boxed(),
        })
    }
}

/// What a run did, for the figures.
#[derive(Debug, Default, Clone, Copy)]
pub struct Ran {
    pub steps: usize,
    pub faults: usize,
    pub processes: usize,
    pub driver_runs: usize,
    /// API calls answered with an injected fault.
    pub api_faults: usize,
    /// Retries the person asked for.
    pub retries: usize,
    /// A digest of what happened to the cluster (every event the
    /// in-memory cluster logged, in order, with its time) and of the
    /// reports the agent pushed: two runs of one plan agree on it.
    pub digest: u64,
}

struct World {
    plan: Plan,
    tmp: tempfile::TempDir,
    clock: VirtualClock,
    sim: Arc<Sim>,
    api: ApiServer,
    forge: Forge,
    env: EnvFile,
    facts: Facts,
    initial: String,
    /// Which replica acts (0 or 1): each has its own cache.
    replica: usize,
    next_step: usize,
    /// Virtual time; the clock may be ahead of the runtime by clock jumps.
    now: DateTime<Utc>,
    git_down_until: Option<DateTime<Utc>>,
    git_stalled_until: Option<DateTime<Utc>>,
    /// The person who retries failed nodes: each record's failure (node,
    /// attempt) and when they first saw it, and their retries per node.
    failures_seen: BTreeMap<(String, u32), (DateTime<Utc>, bool)>,
    retried: BTreeMap<String, usize>,
    ran: Ran,
}

/// What ends a stretch of running.
enum Stop {
    Handoff,
    Crash { down: u64, takeover: bool },
}

impl World {
    fn new(plan: Plan) -> World {
        // In memory where the machine has it: git's many small files and
        // syncs cost disk round trips that dwarf the agent's work.
        let shm = std::path::Path::new("/dev/shm");
        let tmp = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("tempdir");
        let clock = VirtualClock::new(start());
        let sim = Arc::new(Sim::new(forge::CLUSTER, clock.clone()));
        let mut crashloops = Vec::new();
        for (i, n) in plan.nodes.iter().enumerate() {
            let name = format!("node-{i}");
            let mut node = SimNode::new(&name, Some(v(12)), Duration::from_secs(n.minutes * 60));
            node = node.with_pods(
                (0..n.pods)
                    .map(|p| Pod {
                        name: format!("{name}-web-{p}"),
                        pdb: Some("web".into()),
                    })
                    .collect(),
            );
            node.failure = match n.failure {
                Some(0) => Some(Failure::DriverFails("simulated driver failure".into())),
                Some(1) => Some(Failure::NeverReturns),
                Some(_) => Some(Failure::ReturnsAt(v(12))),
                None => None,
            };
            if let Some((action, times)) = n.runs_fail {
                node = node.failing_first(action, times);
            }
            if n.crashloops {
                node = node.with_health_fault(v(13), HealthFault::CrashLoop);
                crashloops.push(name.clone());
            }
            sim.add_node(node);
        }
        let pods: usize = plan.nodes.iter().map(|n| n.pods).sum();
        sim.add_pdb(
            "web",
            Pdb {
                min_available: pods.saturating_sub(1),
                blocked_until: plan.pdb_blocked.map(|m| start() + D::minutes(m as i64)),
            },
        );
        let api = ApiServer::new(clock.clone());
        let forge = Forge::create(tmp.path(), &plan.first, start());
        let initial = git2::Repository::open_bare(tmp.path().join("origin.git"))
            .and_then(|r| r.refname_to_id("refs/heads/main"))
            .expect("initial commit")
            .to_string();
        let facts = Facts {
            merges: vec![Merge {
                commit: initial.clone(),
                at: start(),
                env: plan.first.clone(),
                revoked: Vec::new(),
            }],
            crashloops,
            ..Facts::default()
        };
        World {
            env: plan.first.clone(),
            plan,
            tmp,
            clock,
            sim,
            api,
            forge,
            facts,
            initial,
            replica: 0,
            next_step: 0,
            now: start(),
            git_down_until: None,
            git_stalled_until: None,
            failures_seen: BTreeMap::new(),
            retried: BTreeMap::new(),
            ran: Ran::default(),
        }
    }

    fn config(&self, replica: usize) -> AgentConfig {
        let mut cfg = AgentConfig::new(
            forge::ENV,
            forge::CLUSTER,
            &self.forge.url(),
            self.tmp.path().join(format!("cache-{replica}")),
        );
        cfg.identity = format!("replica-{replica}");
        cfg.verify = drover::trust::Mode::Off;
        cfg.trust_commit = Some(self.initial.clone());
        cfg.publish.signing_key = Some(forge::key(1));
        cfg.leader_election = false;
        cfg.listen = ([127, 0, 0, 1], 0).into();
        cfg.watch_local = false;
        cfg.debounce = Duration::ZERO;
        cfg.poll = POLL;
        cfg.source.timeout = super::checks::FETCH_BOUND;
        cfg
    }

    fn end(&self) -> DateTime<Utc> {
        start() + D::minutes(self.plan.horizon as i64)
    }

    /// Make the plan's steps due by now; a crash ends the stretch.
    fn due(&mut self) -> Option<Stop> {
        self.origin_back();
        while let Some(&(at, step)) = self.plan.steps.get(self.next_step) {
            if start() + D::minutes(at as i64) > self.now {
                break;
            }
            self.next_step += 1;
            match step {
                Step::Change(c) => self.change(c),
                Step::Fault(f) => {
                    self.ran.faults += 1;
                    if let Some(stop) = self.fault(f) {
                        return Some(stop);
                    }
                    // A clock jump past the outage's end ends it now, not a
                    // step later, when a process starting in this instant
                    // would meet the origin down (seed 5377).
                    self.origin_back();
                }
            }
        }
        None
    }

    /// The origin answers again once its outage is over.
    fn origin_back(&mut self) {
        if self.git_down_until.is_some_and(|until| self.now >= until) {
            self.forge.set_down(false);
            self.git_down_until = None;
        }
    }

    fn change(&mut self, c: Change) {
        let at = self.now;
        let next = |e: &EnvFile| v(e.version.minor + 1);
        match c {
            Change::Bump => self.env.version = next(&self.env),
            Change::Revoke => self.forge.revoke(&self.env.version.clone()),
            Change::Pause(p) => self.env.paused = p,
            Change::Freeze(f) => self.env.frozen = f,
            Change::OnFailure(r) => {
                self.env.on_failure_rollback = r.is_some();
                self.env.max_rollbacks = r.unwrap_or(self.env.max_rollbacks);
            }
            Change::MaxUnavailable(n) => self.env.max_unavailable = n,
        }
        let env = self.env.clone();
        let commit = self.forge.merge(&env, &format!("{c:?}"), at).to_string();
        self.facts.merges.push(Merge {
            commit,
            at,
            env,
            revoked: self.forge.revoked().to_vec(),
        });
    }

    fn fault(&mut self, f: Fault) -> Option<Stop> {
        let at = self.now;
        let until = |m: u64| at + D::minutes(m as i64);
        match f {
            Fault::Crash { down, takeover } => return Some(Stop::Crash { down, takeover }),
            Fault::Handoff => return Some(Stop::Handoff),
            Fault::GitDown(m) | Fault::GitStall(m) => {
                // A stalled origin answers nothing: to the agent it is down,
                // each fetch and push waiting out its own bound to learn so.
                self.forge.set_down(true);
                let u = until(m).max(self.git_down_until.unwrap_or(at));
                self.git_down_until = Some(u);
                if matches!(f, Fault::GitStall(_)) {
                    let s = until(m).max(self.git_stalled_until.unwrap_or(at));
                    self.git_stalled_until = Some(s);
                }
                self.facts.blind.push((at, u));
                self.facts.git_out.push((at, u));
            }
            Fault::Api {
                target,
                code,
                minutes,
            } => {
                let hits = [Hits::StatusReads, Hits::StatusWrites, Hits::Events][target as usize];
                self.api.inject(ApiFault {
                    hits,
                    code,
                    from: at,
                    until: until(minutes),
                });
                if hits != Hits::Events {
                    self.facts.blind.push((at, until(minutes)));
                }
                match hits {
                    Hits::StatusReads => self.facts.unread.push((at, until(minutes))),
                    Hits::StatusWrites => self.facts.unwritten.push((at, until(minutes))),
                    Hits::Events => {}
                }
            }
            Fault::Node {
                node,
                fault,
                minutes,
            } => self
                .sim
                .inject(&format!("node-{node}"), fault, at, until(minutes)),
            Fault::NotReady { node, minutes } => {
                self.sim
                    .not_ready(&format!("node-{node}"), at, until(minutes))
            }
            Fault::PeerFailed | Fault::PeerConfirmed => {
                let state = if f == Fault::PeerFailed {
                    RolloutState::Failed
                } else {
                    RolloutState::Confirmed
                };
                let version = self.env.version.clone();
                if !self.forge.peer_reports(state, &version, at) {
                    return None;
                }
                let pushed = self.facts.peer_failed.len() + self.facts.peer_confirmed.len();
                let list = if state == RolloutState::Failed {
                    &mut self.facts.peer_failed
                } else {
                    &mut self.facts.peer_confirmed
                };
                list.push((at, version, pushed));
            }
            Fault::PeerRewritten => {
                if self.forge.peer_forged() {
                    self.facts.peer_forgery.push((at, false));
                }
                self.forge.rewrite_peer();
                self.facts.peer_rewritten.push(at);
            }
            Fault::PeerForged => {
                let version = self.env.version.clone();
                self.forge.forge_peer(&version, at);
                self.facts.peer_forgery.push((at, true));
            }
            Fault::PeerRepaired => {
                if self.forge.repair_peer() {
                    self.facts.peer_forgery.push((at, false));
                }
            }
            Fault::ClockJump(m) => {
                self.now = until(m);
                self.facts.jumps.push(at);
                self.facts.jumped.push((at, D::minutes(m as i64)));
            }
        }
        None
    }

    /// Move time by one step (the clock first, then the runtime's timers
    /// when a process runs) and check.
    async fn tick(&mut self, running: bool) -> Result<(), String> {
        self.now += D::from_std(STEP).unwrap_or_default();
        self.clock.set(self.now);
        if running {
            self.stall_remote();
            tokio::time::sleep(STEP).await;
        }
        self.ran.steps += 1;
        tracing::debug!(now = %self.now, step = self.ran.steps, "sim step");
        self.person();
        self.facts.check(&self.sim)?;
        if running {
            self.facts.looked(&self.sim, self.now)?;
        }
        self.facts.told(self.api.applied())
    }

    /// The person who reads `kubectl get drovernodes` and, `retry_after`
    /// minutes after a record says failed or blocked, asks drover to retry
    /// the node, as the record's message tells them to, up to
    /// [`RETRIES`] times a node.
    fn person(&mut self) {
        let Some(after) = self.plan.retry_after else {
            return;
        };
        for n in self.sim.nodes() {
            let Some(record) = self.sim.record(&n.name) else {
                continue;
            };
            let failed = record
                .progress
                .as_ref()
                .is_some_and(|p| matches!(p.state, ProgressState::Failed | ProgressState::Blocked));
            if !failed || self.retried.get(&n.name).copied().unwrap_or(0) >= RETRIES {
                continue;
            }
            let (seen, asked) = self
                .failures_seen
                .entry((n.name.clone(), record.attempt))
                .or_insert((self.now, false));
            if !*asked && self.now >= *seen + D::minutes(after as i64) {
                *asked = true;
                self.sim.request_retry(&n.name);
                *self.retried.entry(n.name.clone()).or_default() += 1;
                self.facts.retries.push(Retry {
                    at: self.now,
                    node: n.name.clone(),
                    attempt: record.attempt,
                    progress: record.progress.clone(),
                    rollback: record
                        .run
                        .as_ref()
                        .is_some_and(|r| r.action == RunAction::Rollback),
                });
                self.ran.retries += 1;
            }
        }
    }

    /// Tell the process's runtime how long the origin stays stalled
    /// (`drover::replay::stall_remote`), in its clock's time.
    fn stall_remote(&self) {
        let left = self
            .git_stalled_until
            .and_then(|u| (u - self.now).to_std().ok())
            .filter(|d| !d.is_zero());
        drover::replay::stall_remote(left.map(|d| tokio::time::Instant::now() + d));
    }

    /// The agent's two replicas (their processes on one machine, in one
    /// runtime), from now until a crash or the end: the leader acts, the
    /// follower warms its cache once and relays; a handoff takes the lease
    /// from the leader and gives it to the follower a lease later.
    fn process(&mut self) -> Result<Option<Stop>, String> {
        self.facts.processes += 1;
        self.ran.processes += 1;
        // The agent's blocking work runs on this runtime's one thread, in
        // the order asked for, and its draws are seeded by the process's
        // number, so a replay interleaves and draws the same way.
        let _exact = drover::replay::Exact::seeded(self.ran.processes as u64);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let out = rt.block_on(async {
            self.stall_remote();
            let clock: drover::agent::SharedClock = Arc::new(self.clock.clone());
            let (_stop, shutdown) = tokio::sync::watch::channel(false);
            let mut leading = Vec::new();
            let mut runs = Vec::new();
            for r in 0..2 {
                let (tx, rx) = tokio::sync::watch::channel(r == self.replica);
                let backend = SimBackend(self.sim.clone());
                let agent =
                    Agent::with_client(self.config(r), self.api.client(), backend, clock.clone())
                        .await
                        .map_err(|e| format!("the agent did not start: {e}"))?
                        .led_by(rx);
                leading.push(tx);
                runs.push(agent.run(shutdown.clone()));
            }
            let (Some(second), Some(first)) = (runs.pop(), runs.pop()) else {
                return Err("no replicas".to_string());
            };
            let wall = std::time::Instant::now();
            let world = async {
                let mut takes_over: Option<DateTime<Utc>> = None;
                let mut started = false;
                while self.now < self.end() {
                    let due = self.due();
                    // The process acts after what is due at its first instant
                    // (a clock jump, the origin going down: seed 4331).
                    if !std::mem::replace(&mut started, true) {
                        self.facts.acting(self.now, self.replica);
                    }
                    match due {
                        Some(Stop::Handoff) if takes_over.is_none() => {
                            leading[self.replica].send_replace(false);
                            self.replica = 1 - self.replica;
                            takes_over = Some(self.now + D::from_std(LEASE).unwrap_or_default());
                            self.facts.acting_since = self.now;
                        }
                        Some(Stop::Handoff) => {}
                        Some(stop) => return Ok(Some(stop)),
                        None => {}
                    }
                    if takes_over.is_some_and(|t| t <= self.now) {
                        leading[self.replica].send_replace(true);
                        takes_over = None;
                        self.facts.acting(self.now, self.replica);
                    }
                    self.tick(true).await?;
                    if self.ran.steps.is_multiple_of(100)
                        && std::env::var("DROVER_SIM_TRACE").is_ok()
                    {
                        eprintln!(
                            "{} step {} wall {:?} api {}",
                            self.now,
                            self.ran.steps,
                            wall.elapsed(),
                            self.api.calls()
                        );
                    }
                }
                Ok(None)
            };
            tokio::select! {
                biased;
                r = world => r,
                r = first => Err(format!("replica 0 stopped: {r:?}")),
                r = second => Err(format!("replica 1 stopped: {r:?}")),
            }
        });
        // The crash: every task of both processes goes with their runtime.
        drop(rt);
        out
    }

    fn run(&mut self) -> Result<(), String> {
        // Whether a process of the agent runs at the end (not one crashed
        // and down past it): only then is its status object current.
        let mut running = false;
        loop {
            match self.process()? {
                None | Some(Stop::Handoff) => {
                    running = true;
                    break;
                }
                Some(Stop::Crash { down, takeover }) => {
                    let back = self.now + D::minutes(down as i64);
                    while self.now < back && self.now < self.end() {
                        match self.due() {
                            Some(Stop::Crash { .. }) => continue,
                            Some(Stop::Handoff) => self.replica = 1 - self.replica,
                            None => {}
                        }
                        futures::executor::block_on(self.tick(false))?;
                    }
                    if takeover {
                        self.replica = 1 - self.replica;
                    }
                    if self.now >= self.end() {
                        break;
                    }
                }
            }
        }
        self.forge.set_down(false);
        let report = self.forge.own_report().unwrap_or_default();
        self.ran.driver_runs = self.sim.nodes().iter().map(|n| n.driver_runs()).sum();
        self.ran.api_faults = self.api.faulted();
        let held = self
            .api
            .status()
            .and_then(|s| s.get("evidenceHeld")?.as_str().map(str::to_owned));
        self.facts
            .end(&self.sim, &report, running.then_some(held), self.now)
    }
}

/// Run `plan`; `Err` names the first rule broken and when.
pub fn run(plan: Plan) -> (Ran, Result<(), String>) {
    let mut w = World::new(plan);
    let r = w.run();
    w.ran.digest = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for e in w.sim.log() {
            format!("{} {} {:?}", e.at, e.node, e.kind).hash(&mut h);
        }
        w.forge.own_reports().hash(&mut h);
        h.finish()
    };
    if std::env::var("DROVER_SIM_LOG").is_ok() {
        for e in w.sim.log() {
            eprintln!("    {} {} {:?}", e.at, e.node, e.kind);
        }
        for r in w.forge.own_reports() {
            eprintln!("  report:\n{r}");
        }
        if let Some(s) = w.api.status() {
            eprintln!("  the status object at the end:\n{s:#}");
        }
    }
    let r = r.map_err(|e| {
        let log = w.sim.log();
        let story: Vec<String> = log[log.len().saturating_sub(16)..]
            .iter()
            .map(|e| format!("    {} {} {:?}", e.at, e.node, e.kind))
            .collect();
        let told = w
            .api
            .status()
            .and_then(|s| s.get("message").cloned())
            .unwrap_or_default();
        format!(
            "{e}\n  the cluster's last events:\n{}\n  the status said: {told}",
            story.join("\n")
        )
    });
    (w.ran, r)
}
