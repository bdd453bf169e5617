//! What one seed draws: a fleet, a config history and faults, each at a
//! minute of simulated time, from a seeded RNG (the same seed draws the
//! same plan on every machine), and the shrinking of a failing plan to a
//! shorter one that still fails.

use super::forge::EnvFile;
use drover::record::RunAction;
use drover::sim::CallFault;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use semver::Version;

/// One node of the fleet.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub minutes: u64,
    /// `None`, or 0: the driver fails, 1: never returns, 2: returns at the old version.
    pub failure: Option<u8>,
    /// Crash-loops once at the first bumped version (a health failure).
    pub crashloops: bool,
    /// Pods under the budget that allows one disruption.
    pub pods: usize,
    /// The driver fails its first `n` runs of this action on the node
    /// (`u32::MAX`: every one).
    pub runs_fail: Option<(RunAction, u32)>,
}

/// A reviewed change of the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The pin moves to the next version.
    Bump,
    /// The pinned version is revoked (the pin stays: the head is refused).
    Revoke,
    Pause(bool),
    Freeze(bool),
    /// `on_failure = "rollback"` with this `max_rollbacks`, or `halt`.
    OnFailure(Option<u32>),
    MaxUnavailable(u32),
}

/// A fault of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The acting process dies; a replica starts after `down` minutes,
    /// the other replica (whose cache was warmed earlier) when `takeover`.
    Crash { down: u64, takeover: bool },
    /// The leader loses the lease; the follower (whose cache is as it
    /// warmed it when its process started) takes it a lease later.
    Handoff,
    /// The origin is unreachable for this many minutes.
    GitDown(u64),
    /// The API server answers `code` to the status object's reads
    /// (`reads`) or writes, or to Events, for `minutes`; code 0: it answers
    /// nothing until then (a hung server: what a call asked is done, its
    /// answer comes when the fault ends, long after the caller gave up).
    Api { target: u8, code: u16, minutes: u64 },
    /// The origin answers nothing for this many minutes: each fetch and
    /// push asked meanwhile runs when it ends.
    GitStall(u64),
    /// A node goes NotReady by no act of drover's for this many minutes.
    NotReady { node: usize, minutes: u64 },
    /// One node's API calls fail for a while.
    Node {
        node: usize,
        fault: CallFault,
        minutes: u64,
    },
    /// The other cluster reports `failed` for the pinned version (signed).
    PeerFailed,
    /// The other cluster confirms the pinned version (signed).
    PeerConfirmed,
    /// The clock jumps forward.
    ClockJump(u64),
    /// The other cluster's status branch is deleted on the origin (a
    /// rewrite): the failures it held must not be forgotten.
    PeerRewritten,
    /// Someone with push access fast-forwards the other cluster's branch
    /// with an unsigned commit whose report confirms the pinned version:
    /// the branch no longer counts as a whole, so the environment's
    /// evidence is held and no node starts (docs/design.md, "Missing
    /// evidence holds; it never opens").
    PeerForged,
    /// A person resets the forged branch to its last signed commit (or
    /// deletes it when the forgery created it).
    PeerRepaired,
}

/// The rounds of what plans draw, in the order they were added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Round {
    /// The fleet, the config history and the first faults.
    First,
    /// And the origin stalled, the API server hung or answering 403.
    Stalls,
    /// And a node NotReady by no act of drover's.
    NotReady,
    /// And the driver's prepare, upgrade or rollback runs failing once,
    /// twice or always on a node, and a person retrying failed nodes.
    Driver,
    /// And the other cluster's branch forged (an unsigned fast-forward),
    /// then repaired or left so.
    Evidence,
}

/// Something at a minute of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Change(Change),
    Fault(Fault),
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub nodes: Vec<NodeSpec>,
    pub first: EnvFile,
    pub steps: Vec<(u64, Step)>,
    pub horizon: u64,
    /// The budget refuses every eviction until this minute.
    pub pdb_blocked: Option<u64>,
    /// A person asks drover to retry each failed or blocked node (its
    /// record's `drover.dev/retry`) this many minutes after the record
    /// said so, at most [`RETRIES`] times a node.
    pub retry_after: Option<u64>,
}

/// How many times the person retries one node before giving up on it.
pub const RETRIES: usize = 3;

pub fn v(minor: u64) -> Version {
    Version::new(1, minor, 0)
}

impl Plan {
    pub fn draw(seed: u64) -> Plan {
        Plan::draw_as(seed, Round::Evidence)
    }

    /// The plan as a round of the draws made it (each round draws from a
    /// stream of its own, so every earlier draw stays as it was): each
    /// regression seed runs the plan it was found on.
    pub fn draw_as(seed: u64, round: Round) -> Plan {
        let mut r = StdRng::seed_from_u64(seed);
        let n = r.random_range(1..=5usize);
        let nodes: Vec<NodeSpec> = (0..n)
            .map(|_| NodeSpec {
                minutes: r.random_range(2..=8),
                failure: r.random_bool(0.12).then(|| r.random_range(0..3u8)),
                crashloops: r.random_bool(0.15),
                pods: r.random_range(0..=2),
                runs_fail: None,
            })
            .collect();
        let rollback = r.random_bool(0.4);
        let mut first = EnvFile {
            version: v(12),
            max_unavailable: r.random_range(1..=2),
            on_failure_rollback: rollback,
            max_rollbacks: r.random_range(0..=2),
            paused: false,
            frozen: false,
            waves: r.random_bool(0.25),
            prepare: r.random_bool(0.3),
            allow_downgrade: false,
        };
        let horizon = 90;
        let mut steps = vec![(r.random_range(1..5), Step::Change(Change::Bump))];
        for _ in 0..r.random_range(0..=4) {
            let c = match r.random_range(0..10) {
                0..=2 => Change::Bump,
                3 | 4 => Change::Revoke,
                5 => Change::Pause(r.random_bool(0.6)),
                6 => Change::Freeze(r.random_bool(0.5)),
                7 => Change::OnFailure(r.random_bool(0.7).then(|| r.random_range(0..=2))),
                _ => Change::MaxUnavailable(r.random_range(1..=3)),
            };
            steps.push((r.random_range(2..60), Step::Change(c)));
        }
        for _ in 0..r.random_range(0..=6) {
            let f = match r.random_range(0..14) {
                0..=2 => Fault::Crash {
                    down: r.random_range(0..=5),
                    takeover: r.random_bool(0.5),
                },
                3 | 11 => Fault::Handoff,
                4 => Fault::GitDown(r.random_range(1..=30)),
                5 => Fault::Api {
                    target: r.random_range(0..3),
                    code: [409, 429, 500, 503][r.random_range(0..4)],
                    minutes: r.random_range(1..=20),
                },
                6 | 7 => Fault::Node {
                    node: r.random_range(0..n),
                    fault: [
                        CallFault::Observe,
                        CallFault::Evict,
                        CallFault::Write,
                        CallFault::Start,
                        CallFault::Health,
                    ][r.random_range(0..5)],
                    minutes: r.random_range(1..=20),
                },
                8 => Fault::PeerFailed,
                9 => Fault::PeerConfirmed,
                10 => Fault::ClockJump(r.random_range(1..=40)),
                12 => Fault::PeerRewritten,
                _ => Fault::Crash {
                    down: 0,
                    takeover: true,
                },
            };
            steps.push((r.random_range(1..75), Step::Fault(f)));
        }
        if first.waves {
            steps.push((r.random_range(5..40), Step::Fault(Fault::PeerConfirmed)));
        }
        let mut pdb_blocked = r.random_bool(0.3).then(|| r.random_range(5..40));
        // A quarter of the seeds hold a drain behind the budget and do
        // something in the middle of it: hand the lease to the follower,
        // whose cache is older than the applied commit, or move the pin.
        let mut nodes: Vec<NodeSpec> = nodes;
        match r.random_range(0..8) {
            0 => {
                nodes[0].pods = nodes[0].pods.max(1);
                pdb_blocked = Some(r.random_range(15..40));
                steps.push((r.random_range(5..14), Step::Fault(Fault::Handoff)));
            }
            1 => {
                nodes[0].pods = nodes[0].pods.max(1);
                pdb_blocked = Some(r.random_range(15..40));
                steps.push((r.random_range(5..14), Step::Change(Change::Bump)));
            }
            _ => {}
        }
        if round >= Round::Stalls {
            let mut x = StdRng::seed_from_u64(seed ^ 0x5157_a115_0000_0403);
            for _ in 0..x.random_range(0..=2) {
                let f = match x.random_range(0..3) {
                    0 => Fault::GitStall(x.random_range(1..=20)),
                    c => Fault::Api {
                        target: x.random_range(0..3),
                        code: if c == 1 { 0 } else { 403 },
                        minutes: x.random_range(1..=20),
                    },
                };
                steps.push((x.random_range(1..75), Step::Fault(f)));
            }
        }
        if round >= Round::NotReady {
            let mut x = StdRng::seed_from_u64(seed ^ 0x0000_4e07_4ead_0000);
            if x.random_bool(0.3) {
                let f = Fault::NotReady {
                    node: x.random_range(0..n),
                    minutes: x.random_range(1..=15),
                };
                steps.push((x.random_range(1..75), Step::Fault(f)));
            }
        }
        let mut retry_after = None;
        if round >= Round::Driver {
            let mut x = StdRng::seed_from_u64(seed ^ 0x0d21_7e20_0000_0f1a);
            for node in &mut nodes {
                if x.random_bool(0.2) {
                    let action = [RunAction::Prepare, RunAction::Upgrade, RunAction::Rollback]
                        [x.random_range(0..3)];
                    node.runs_fail = Some((action, [1, 1, 2, u32::MAX][x.random_range(0..4)]));
                    // Where the failing run is asked for at all: a prepare
                    // with `[driver] prepare`, a rollback of a node whose
                    // health fails at the new version.
                    match action {
                        RunAction::Prepare => first.prepare = true,
                        RunAction::Rollback => node.crashloops = true,
                        RunAction::Upgrade => {}
                    }
                }
            }
            retry_after = x.random_bool(0.5).then(|| x.random_range(1..=20));
        }
        if round >= Round::Evidence {
            let mut x = StdRng::seed_from_u64(seed ^ 0x00e7_1de0_ce00_0000);
            if x.random_bool(0.3) {
                let at = x.random_range(1..75);
                steps.push((at, Step::Fault(Fault::PeerForged)));
                if x.random_bool(0.7) {
                    let repaired = at + x.random_range(1..=30);
                    steps.push((repaired, Step::Fault(Fault::PeerRepaired)));
                }
            }
        }
        steps.sort_by_key(|(at, _)| *at);
        Plan {
            nodes,
            first,
            steps,
            horizon,
            pdb_blocked,
            retry_after,
        }
    }

    /// Shorter plans to try when this one fails: each step left out in
    /// turn, the person who retries, each node's failing runs, then each
    /// node but the first.
    pub fn shrinks(&self) -> Vec<Plan> {
        let mut out = Vec::new();
        if self.retry_after.is_some() {
            out.push(Plan {
                retry_after: None,
                ..self.clone()
            });
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].runs_fail.is_some() {
                let mut p = self.clone();
                p.nodes[i].runs_fail = None;
                out.push(p);
            }
        }
        for i in 0..self.steps.len() {
            let mut p = self.clone();
            p.steps.remove(i);
            out.push(p);
        }
        for i in 1..self.nodes.len() {
            let mut p = self.clone();
            p.nodes.remove(i);
            p.steps.retain(|(_, s)| match s {
                Step::Fault(Fault::Node { node, .. } | Fault::NotReady { node, .. }) => *node != i,
                _ => true,
            });
            for (_, s) in &mut p.steps {
                if let Step::Fault(Fault::Node { node, .. } | Fault::NotReady { node, .. }) = s {
                    if *node > i {
                        *node -= 1;
                    }
                }
            }
            out.push(p);
        }
        out
    }
}
