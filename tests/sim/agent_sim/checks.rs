//! What must hold after every step, judged on what happened in the
//! simulated cluster (its log of cordons, uncordons and driver starts, its
//! own violations) against what the world did (merges, reports, outages),
//! never on what the agent says or counts.
//!
//! Some rules allow the agent time to learn a change: a change made at `T`
//! is known by `T + GRACE` unless the origin or the status object's API was
//! down meanwhile (then from the end of the outage), or no agent ran.

use super::forge::{EnvFile, PEER};
use chrono::{DateTime, Duration, Utc};
use drover::record::{NodeProgress, RunAction};
use drover::sim::{CordonedBy, EventKind, Sim, SimNode};
use semver::Version;
use std::collections::BTreeMap;

/// How long the agent may take to act on a change it can fetch: a poll
/// (`world::POLL`), a pass, a tick.
const GRACE: i64 = 5;

/// How long the acting replica may go without listing the nodes while
/// drover holds one out of service. Its passes then come every 5-30 s (the
/// eviction's retry, the run's and the health check's timers): 120 seeds
/// before stalls were drawn never went past 30 s, and 300 with them passed
/// a 35 s limit once the waits of [`Facts::may_not_look`] were set aside. A
/// loop that waits on its fetch while it acts (the term's first-fetch rule
/// applied to every pass) went 50 s in 14 seeds of 200.
const LOOK: i64 = 45;

/// How long a fetch waits on an origin that answers nothing (the
/// simulated agent's `SourceConfig::timeout`).
pub const FETCH_BOUND: std::time::Duration = std::time::Duration::from_secs(60);

/// A merge to main and the policy it carries.
#[derive(Debug, Clone)]
pub struct Merge {
    pub commit: String,
    pub at: DateTime<Utc>,
    pub env: EnvFile,
    pub revoked: Vec<Version>,
}

impl Merge {
    /// Every merge the world makes is admitted: a reviewed change of the
    /// pin alone or of the policy alone (a revocation keeps the pin,
    /// applied with its version revoked).
    fn admitted(&self) -> bool {
        true
    }
}

/// A person's retry of a node (`drover.dev/retry` on its record).
#[derive(Debug, Clone)]
pub struct Retry {
    pub at: DateTime<Utc>,
    pub node: String,
    /// The record's attempt and progress when they asked.
    pub attempt: u32,
    pub progress: Option<NodeProgress>,
    /// The record named a rollback run (`-o wide`'s RUN): a failed
    /// rollback was retried, whose run may never have started (a window
    /// it waited for, seed 821).
    pub rollback: bool,
}

/// How long a retry may go unanswered at the end: the longest outage drawn
/// (20 min) and the grace.
const ANSWER: i64 = 30;

/// What the world did, as the checks need it.
#[derive(Debug, Default)]
pub struct Facts {
    pub merges: Vec<Merge>,
    /// Signed `failed` and `confirmed` reports of the other cluster: (when,
    /// version, the order of its reports it was pushed in).
    pub peer_failed: Vec<(DateTime<Utc>, Version, usize)>,
    pub peer_confirmed: Vec<(DateTime<Utc>, Version, usize)>,
    /// When the other cluster's branch was rewritten away.
    pub peer_rewritten: Vec<DateTime<Utc>>,
    /// The other cluster's branch forged (`true`) or repaired (`false`, a
    /// reset or a deletion that took the forgery away), in order.
    pub peer_forgery: Vec<(DateTime<Utc>, bool)>,
    /// Outages that keep a change from the agent: [from, until).
    pub blind: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// Clock jumps: when.
    pub jumps: Vec<DateTime<Utc>>,
    /// Clock jumps: when, and how far the clock moved.
    pub jumped: Vec<(DateTime<Utc>, Duration)>,
    /// Outages of the status object's reads: [from, until). Without the
    /// status the agent may not decide, so it may not look either.
    pub unread: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// Outages of the status object's writes: [from, until).
    pub unwritten: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// The origin down or stalled: [from, until).
    pub git_out: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// When the replica acting now started to (or the lease changed hands).
    pub acting_since: DateTime<Utc>,
    /// The replica acting last, and when the other one took over from it.
    pub replica: Option<usize>,
    pub taken_over: Vec<DateTime<Utc>>,
    /// Processes started (the first and each restart).
    pub processes: usize,
    /// Nodes with a health fault at the first bumped version.
    pub crashloops: Vec<String>,
    /// A person's retries, each with the node's record as they read it.
    pub retries: Vec<Retry>,
    /// The version each node's newest cordon drained for, read from its
    /// record at the step of the cordon.
    pub cordon_for: BTreeMap<String, Option<Version>>,
    /// Log entries already judged.
    pub seen: usize,
    pub violations: Vec<String>,
}

/// Spans of time joined where they overlap or touch: [from, until).
fn joined(spans: &[(DateTime<Utc>, DateTime<Utc>)]) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let mut sorted = spans.to_vec();
    sorted.sort();
    let mut out: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    for (from, until) in sorted {
        match out.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(until),
            _ => out.push((from, until)),
        }
    }
    out
}

impl Facts {
    /// When a change made at `t` is known to the agent.
    fn known(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        let mut k = t + Duration::minutes(GRACE);
        let mut counted = vec![false; self.jumped.len()];
        loop {
            // The agent polls on its timers, not the wall clock: a jump of
            // the clock before a change is known moves "known" by as much
            // (seeds 803, 999), and so does one inside the grace after an
            // outage that kept it from fetching (seed 13572).
            let mut moved = false;
            for (i, (at, by)) in self.jumped.iter().enumerate() {
                if !counted[i] && *at >= t && *at < k {
                    counted[i] = true;
                    k += *by;
                    moved = true;
                }
            }
            let later = self
                .blind
                .iter()
                .filter(|(from, until)| {
                    *from < k && *until > t && *until + Duration::minutes(GRACE) > k
                })
                .map(|(_, until)| *until + Duration::minutes(GRACE))
                .max();
            if let Some(l) = later {
                k = l;
                moved = true;
            }
            if !moved {
                return k;
            }
        }
    }

    fn revoked_by(&self, s: DateTime<Utc>, v: &Version) -> bool {
        self.merges
            .iter()
            .any(|m| self.known(m.at) < s && m.revoked.contains(v))
    }

    /// Whether something the agent must answer by giving a drain back (a
    /// merge, a halt, held evidence, time jumping past a timeout) happened
    /// in `(from, to]`.
    fn excuse(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> bool {
        self.merges.iter().any(|m| m.at > from && m.at <= to)
            || self
                .peer_failed
                .iter()
                .any(|(t, _, _)| *t > from && *t <= to)
            || self.jumps.iter().any(|t| *t > from && *t <= to)
            // The evidence held: a drain is given back as under a halt.
            || self
                .peer_forgery
                .iter()
                .any(|(t, forged)| *forged && *t > from && *t <= to)
    }

    /// The budget: the largest `max_unavailable` ever merged.
    fn budget(&self) -> usize {
        self.merges
            .iter()
            .map(|m| m.env.max_unavailable as usize)
            .max()
            .unwrap_or(1)
    }

    fn max_rollbacks(&self) -> usize {
        self.merges
            .iter()
            .filter(|m| m.env.on_failure_rollback)
            .map(|m| m.env.max_rollbacks as usize)
            .max()
            .unwrap_or(0)
    }

    fn fail(&mut self, what: String) {
        self.violations.push(what);
    }

    /// `replica`'s process starts acting (a start, a restart, a takeover).
    pub fn acting(&mut self, now: DateTime<Utc>, replica: usize) {
        self.acting_since = now;
        if self.replica.is_some_and(|r| r != replica) {
            self.taken_over.push(now);
        }
        self.replica = Some(replica);
    }

    /// Whether the agent may rightly not look at the nodes in `(last, now]`:
    /// it may not decide without what it waits for then.
    ///
    /// - the status object unreadable: what the last leader applied is the
    ///   ground of every decision (`status_known`);
    /// - its writes failing while a merge may be waiting to be recorded: a
    ///   head accepted must be durable before anything acts, and acting on
    ///   the older config meanwhile is seed 5754's defect;
    /// - the other replica taking over while the origin is out: its cache
    ///   may lack the applied commit, and it holds until a fetch brings it
    ///   (the outage as the origin had it: overlapping stalls and
    ///   outages are one, seed 22918).
    ///
    /// Each until a fetch or a pass after the outage ([`GRACE`]).
    fn may_not_look(&self, last: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        let grace = Duration::minutes(GRACE);
        let spans =
            |(from, until): &(DateTime<Utc>, DateTime<Utc>)| *from <= now && *until + grace >= last;
        self.jumps.iter().any(|j| *j >= last)
            || self.unread.iter().any(spans)
            || self
                .unwritten
                .iter()
                .filter(|o| spans(o))
                .any(|(from, until)| {
                    // A merge the agent may first fetch in the outage (a
                    // stalled origin may hold it back till then: seed 5123).
                    self.merges
                        .iter()
                        .any(|m| m.at <= *until && self.known(m.at) >= *from - grace)
                })
            || joined(&self.git_out)
                .iter()
                .filter(|o| spans(o))
                .any(|(from, until)| self.taken_over.iter().any(|t| *t >= *from && *t <= *until))
    }

    /// The control loop never waits on what it does not need to decide
    /// (docs/design.md §8, "The loop never waits"): while drover holds a node out of service, the
    /// acting replica lists the nodes at least every [`LOOK`] seconds,
    /// whatever stalls or fails at the edges (the origin, Events, the
    /// status object's writes). Judged on the cluster's own record of the
    /// list calls.
    pub fn looked(&self, sim: &Sim, now: DateTime<Utc>) -> Result<(), String> {
        let held: Vec<String> = sim
            .nodes()
            .into_iter()
            .filter(|n| n.cordoned_by == Some(CordonedBy::Drover))
            .map(|n| n.name)
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        // A term acts once its first fetch has ended (src/agent/act.rs,
        // seed 514's fix); with the origin out, that is the fetch's bound.
        let origin_out = |t: DateTime<Utc>| self.git_out.iter().any(|(f, u)| *f <= t && t < *u);
        let since = if origin_out(self.acting_since) {
            self.acting_since + Duration::from_std(FETCH_BOUND).unwrap_or_default()
        } else {
            self.acting_since
        };
        let last = sim.last_observed().map_or(since, |o| o.max(since));
        if (now - last).num_seconds() <= LOOK || self.may_not_look(last, now) {
            return Ok(());
        }
        Err(format!(
            "the agent has not listed the nodes since {last} ({}s) while drover holds {} out of service",
            (now - last).num_seconds(),
            held.join(", ")
        ))
    }

    /// Judge the new part of the sim's log and its state now.
    pub fn check(&mut self, sim: &Sim) -> Result<(), String> {
        let log = sim.log();
        let nodes: BTreeMap<String, SimNode> = sim
            .nodes()
            .into_iter()
            .map(|n| (n.name.clone(), n))
            .collect();
        for v in sim.violations() {
            self.fail(format!("the simulated cluster saw: {v}"));
        }
        let unavailable = nodes
            .values()
            .filter(|n| {
                (n.unschedulable && n.cordoned_by == Some(CordonedBy::Drover))
                    || (!n.ready && n.down_by_drover)
            })
            .count();
        if unavailable > self.budget() {
            self.fail(format!(
                "{unavailable} nodes out of service because of drover, budget {}",
                self.budget()
            ));
        }
        for i in self.seen..log.len() {
            let e = &log[i];
            let s = e.at;
            match &e.kind {
                EventKind::DriverStart(v) => {
                    if !self.merges.iter().any(|m| m.at <= s && &m.env.version == v) {
                        self.fail(format!("{s}: {} moved to {v}, never pinned", e.node));
                    }
                    if self.revoked_by(s, v) {
                        self.fail(format!("{s}: {} moved to {v}, revoked", e.node));
                    }
                    let may: Vec<Version> = self
                        .candidates(s)
                        .iter()
                        .map(|m| m.env.version.clone())
                        .collect();
                    if !may.is_empty() && !may.contains(v) {
                        self.fail(format!(
                            "{s}: {} moved to {v}, while the config in force pins {may:?}",
                            e.node
                        ));
                    }
                    self.halted(s, v, &e.node, "its driver started");
                    if let Some(why) = self.held_at(s) {
                        self.fail(format!("{s}: {} moved to {v} while {why}", e.node));
                    }
                }
                EventKind::Cordon
                    if {
                        let target = sim
                            .record(&e.node)
                            .and_then(|r| r.progress)
                            .map(|p| p.target);
                        self.cordon_for.insert(e.node.clone(), target);
                        !self.crashloops.contains(&e.node)
                    } =>
                {
                    // Judged against every config the agent may be acting
                    // on at `s`: a rule holds when every one of them says so.
                    let may: Vec<Merge> = self.candidates(s).into_iter().cloned().collect();
                    let node = &e.node;
                    if !may.is_empty() && may.iter().all(|m| m.env.paused) {
                        self.fail(format!("{s}: {node} cordoned while paused"));
                    }
                    if !may.is_empty() && may.iter().all(|m| m.env.frozen) {
                        self.fail(format!("{s}: {node} cordoned in a freeze"));
                    }
                    let unconfirmed = |m: &Merge| {
                        m.env.waves
                            && !self
                                .peer_confirmed
                                .iter()
                                .any(|(t, pv, _)| *t < s && *pv == m.env.version)
                    };
                    if !may.is_empty() && may.iter().all(unconfirmed) {
                        let v = &may[0].env.version;
                        self.fail(format!(
                            "{s}: {node} cordoned for {v} before wave 1 confirmed it"
                        ));
                    }
                    // A start, not a rollback (which cordons a node at the
                    // version it drains for). A halt stops starts for the
                    // version, not a failed node's way back from it
                    // (docs/design.md §4a, §5b; seeds 10900 and 11423).
                    let rollback = self.cordon_for.get(node).is_some_and(|t| {
                        t.is_some()
                            && nodes.get(node).and_then(|n| n.version.as_ref()) == t.as_ref()
                    });
                    if !rollback && !may.is_empty() {
                        let halted: Vec<String> = may
                            .iter()
                            .filter_map(|m| self.halted_at(s, &m.env.version))
                            .collect();
                        if halted.len() == may.len() {
                            self.fail(format!("{s}: {node} cordoned: {}", halted.join("; ")));
                        }
                        if let Some(why) = self.failure_stands(s, &may, &nodes) {
                            self.fail(format!("{s}: {node} cordoned while {why}"));
                        }
                    }
                    if !rollback {
                        if let Some(why) = self.held_at(s) {
                            self.fail(format!("{s}: {node} cordoned while {why}"));
                        }
                    }
                }
                EventKind::Uncordon => {
                    // A drain abandoned: cordoned, no driver started, given
                    // back before drain_timeout with nothing in the world
                    // to explain it.
                    let cordon = log[..i]
                        .iter()
                        .rposition(|c| c.node == e.node && c.kind == EventKind::Cordon);
                    if let Some(c) = cordon {
                        let ran = log[c..i].iter().any(|x| {
                            x.node == e.node
                                && matches!(
                                    x.kind,
                                    EventKind::DriverStart(_) | EventKind::RollbackStart(_)
                                )
                        });
                        let c_at = log[c].at;
                        // Changes since the config the drain was for.
                        let since = match self.cordon_for.get(&e.node) {
                            Some(Some(v)) => self.last_pin_of(v).max(c_at - Duration::minutes(60)),
                            _ => c_at - Duration::minutes(GRACE + 1),
                        };
                        if !ran && s - c_at < Duration::minutes(9) && !self.excuse(since, s) {
                            self.fail(format!(
                                "{s}: {} given back {}s after its drain began at {c_at}, nothing changed",
                                e.node,
                                (s - c_at).num_seconds()
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        self.seen = log.len();
        self.rollbacks(&log);
        match self.violations.first() {
            Some(v) => Err(v.clone()),
            None => Ok(()),
        }
    }

    /// A driver run that failed (a prepare or an upgrade) stops new node
    /// starts until a person retries its node or the pin moves
    /// (docs/design.md §5a): the failure, known to the agent by `s`, of a
    /// run for the version every config in force at `s` pins and no retry
    /// of its node since.
    fn failure_stands(
        &self,
        s: DateTime<Utc>,
        may: &[Merge],
        nodes: &BTreeMap<String, SimNode>,
    ) -> Option<String> {
        nodes.values().find_map(|n| {
            n.failed_runs().into_iter().find_map(|(action, v, t)| {
                let holds = action != RunAction::Rollback
                    && t + Duration::minutes(GRACE) < s
                    && may.iter().all(|m| m.env.version == v)
                    && !self
                        .retries
                        .iter()
                        .any(|r| r.node == n.name && r.at >= t && r.at < s);
                holds.then(|| {
                    format!(
                        "{}'s {} run for {v} failed at {t}, with no retry of it since",
                        n.name,
                        action.as_str()
                    )
                })
            })
        })
    }

    /// A person's retry is acted on: a record that still holds the attempt
    /// and progress they read, `ANSWER` minutes after they asked, ignored
    /// it. Set aside: a retry of a failed rollback, which max_rollbacks,
    /// a revoked older version or a closed window may refuse and name
    /// (docs/design.md §5b), and which waits for a reviewed change.
    fn retries_answered(&mut self, sim: &Sim, now: DateTime<Utc>) {
        let mut ignored = Vec::new();
        for r in &self.retries {
            if self.later_by(r.at, ANSWER) > now || r.rollback {
                continue;
            }
            let record = sim.record(&r.node);
            let same = record
                .as_ref()
                .is_some_and(|x| x.attempt == r.attempt && x.progress == r.progress);
            if same {
                let said = r.progress.as_ref().map(|p| p.message.clone());
                ignored.push(format!(
                    "{}: the retry of {} was never acted on: its record still says {said:?}",
                    r.at, r.node
                ));
            }
        }
        for what in ignored {
            self.fail(what);
        }
    }

    /// Whether a node cordoned at `since` is past what a report may wait
    /// to name it by `now` (`progress_interval`, 10 min, and the grace), in
    /// the agent's time: its report cadence runs on its timers (seed
    /// 24036: cordoned 2 min before a 27-min jump that ended the run).
    fn unreported(&self, since: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        self.later_by(since, 10 + GRACE) < now
    }

    /// `minutes` of the agent's time after `from`, on the wall clock: a
    /// jump of the clock meanwhile moves the wall clock, not the agent's
    /// timers (seed 16086: a retry asked 6 min before a 38-min jump was
    /// judged unanswered at the jump).
    fn later_by(&self, from: DateTime<Utc>, minutes: i64) -> DateTime<Utc> {
        let mut k = from + Duration::minutes(minutes);
        for (at, by) in &self.jumped {
            if *at >= from && *at < k {
                k += *by;
            }
        }
        k
    }

    /// When `v` was last made the pin (the epoch if never).
    fn last_pin_of(&self, v: &Version) -> DateTime<Utc> {
        // When the pin last became `v`: a later merge that keeps it (a
        // revocation, a freeze) is a change since, not the pin's time.
        let mut at = DateTime::<Utc>::MIN_UTC;
        let mut before: Option<&Version> = None;
        for m in &self.merges {
            if &m.env.version == v && before != Some(v) {
                at = m.at;
            }
            before = Some(&m.env.version);
        }
        at
    }

    /// Whether the agent, with `applied` applied, may have fetched every
    /// merge from `first` (the one after it) to `head` in one fetch, and
    /// that span moves both the pin and the policy. The agent judges a head
    /// against the commit it applied, whatever lies between
    /// (`admit::judge_env`; seed 12787: a bump, a freeze and a revocation
    /// fetched together, the freeze between the other two). The
    /// simulation's pins only go up and its revocations only grow, so the
    /// span's two ends say whether it holds both.
    fn together(&self, applied: &Merge, first: &Merge, head: &Merge) -> bool {
        applied.env.version != head.env.version
            && applied.revoked != head.revoked
            && self.known(first.at) >= head.at
    }

    /// Why `v` is halted at `s` by the other cluster's failed report, if it is.
    fn halted_at(&self, s: DateTime<Utc>, v: &Version) -> Option<String> {
        let since = self.last_pin_of(v);
        self.peer_failed
            .iter()
            .find(|(t, pv, nt)| {
                pv == v
                    && *t >= since
                    && self.known(*t) < s
                    // A report rewritten away before the agent must have
                    // fetched it may never have reached it (seed 221); one
                    // it saw holds even once it is gone (issue 37).
                    && !self
                        .peer_rewritten
                        .iter()
                        .any(|r| r >= t && *r < self.known(*t))
                    // Its own later report of the version ends a failure;
                    // two pushed in one step are ordered by when they were
                    // pushed, as the peer's branch orders them (seed 1219).
                    && !self
                        .peer_confirmed
                        .iter()
                        .any(|(c, cv, nc)| cv == v && (c, nc) > (t, nt) && *c < s)
            })
            .map(|(t, _, _)| format!("{v} halted by the other cluster's failed report at {t}"))
    }

    /// Why the environment's evidence must be held at `s`, if it must: the
    /// other cluster's branch forged before the agent must have fetched the
    /// forgery, and not repaired by `s` (docs/design.md, "Missing evidence
    /// holds; it never opens"). A repair the agent has not fetched yet may
    /// hold it longer, which no rule here judges.
    fn held_at(&self, s: DateTime<Utc>) -> Option<String> {
        let f = &self.peer_forgery;
        f.iter()
            .enumerate()
            .find(|(i, (b, forged))| {
                *forged
                    && self.known(*b) < s
                    && !f[i + 1..].iter().any(|(r, forged)| !forged && *r <= s)
            })
            .map(|(_, (b, _))| {
                format!("the evidence is held: the other cluster's branch was forged at {b}")
            })
    }

    fn halted(&mut self, s: DateTime<Utc>, v: &Version, node: &str, what: &str) {
        if let Some(why) = self.halted_at(s, v) {
            self.fail(format!("{s}: {node} {what}: {why}"));
        }
    }

    /// The admitted configs the agent may be acting on at `s`: the newest
    /// it must know by then, and every one merged after it.
    fn candidates(&self, s: DateTime<Utc>) -> Vec<&Merge> {
        let admitted: Vec<&Merge> = self
            .merges
            .iter()
            .filter(|m| m.admitted() && m.at <= s)
            .collect();
        let mut from = admitted
            .iter()
            .rposition(|m| self.known(m.at) < s)
            .unwrap_or(0);
        // A pin change and a policy change the agent may have fetched
        // together are refused together, and so is every later head: its
        // span from the same applied commit holds both (docs/design.md, "A
        // legitimate policy change and a bump in one fetch"; seeds 287,
        // 398), with other merges between them or not (seed 12787). The
        // config applied before the span may stay in force from then on,
        // whether the span is before the newest known merge or ends after
        // it. That is the newest merge known before the span's first
        // merge, not the merge just before it: merges of one minute may
        // all have been fetched with the span (seed 6440).
        // The span's head is any merge made by `s`, however far past the
        // newest known one: the agent may have fetched them all at once
        // (seed 20784: a bump, a pause and a revocation merged at 00:19,
        // 00:20 and 00:21, judged at 00:24 when only the bump was known).
        let last = admitted.len().saturating_sub(1);
        let spans = (2..=last).flat_map(|i| (0..i - 1).map(move |j| (j, i)));
        let applied = spans
            .filter(|&(j, i)| self.together(admitted[j], admitted[j + 1], admitted[i]))
            .map(|(j, _)| {
                let a = admitted[j + 1].at;
                admitted[..=j]
                    .iter()
                    .rposition(|m| self.known(m.at) < a)
                    .unwrap_or(0)
            })
            .min();
        if let Some(applied) = applied {
            from = from.min(applied);
        }
        admitted[from..].to_vec()
    }

    fn rollbacks(&mut self, log: &[drover::sim::Event]) {
        let mut from: BTreeMap<Version, usize> = BTreeMap::new();
        let mut last: BTreeMap<&str, Version> = BTreeMap::new();
        for e in log {
            match &e.kind {
                EventKind::DriverStart(v) => {
                    last.insert(&e.node, v.clone());
                }
                EventKind::RollbackStart(_) => {
                    if let Some(v) = last.get(e.node.as_str()) {
                        *from.entry(v.clone()).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        let max = self.max_rollbacks();
        if let Some((v, n)) = from.iter().find(|(_, n)| **n > max) {
            let what = format!("{n} rollbacks started from {v}, max_rollbacks {max}");
            self.fail(what);
        }
    }

    /// What the status object says agrees with itself and the forge: the
    /// applied version is the one the applied commit pins.
    pub fn told(&mut self, applied: Option<(String, String)>) -> Result<(), String> {
        if let Some((c, v)) = applied {
            if let Some(m) = self.merges.iter().find(|m| m.commit == c) {
                if m.env.version.to_string() != v {
                    let pin = m.env.version.clone();
                    self.fail(format!(
                        "the status says applied version {v} at commit {c}, which pins {pin}"
                    ));
                }
            }
        }
        match self.violations.first() {
            Some(v) => Err(v.clone()),
            None => Ok(()),
        }
    }

    /// At the end: every node drover left cordoned longer than a report
    /// may wait (`progress_interval`, 10 min, and the grace) is named by
    /// the cluster's newest report on the origin; and a forged branch a
    /// person repaired long enough ago no longer holds the evidence in the
    /// status object (`held`: its `evidenceHeld` when a process of the
    /// agent runs at the end) — held evidence fails closed, not forever.
    pub fn end(
        &mut self,
        sim: &Sim,
        report: &str,
        held: Option<Option<String>>,
        now: DateTime<Utc>,
    ) -> Result<(), String> {
        let wait = Duration::minutes(10 + GRACE);
        let log = sim.log();
        self.retries_answered(sim, now);
        let blind = self.blind.iter().any(|(_, until)| *until + wait > now);
        if let (Some(Some(why)), Some((r, false))) = (&held, self.peer_forgery.last()) {
            if self.known(*r) + Duration::minutes(GRACE) < now && why.contains(PEER) {
                self.fail(format!(
                    "the other cluster's branch was repaired at {r}, the status still says \
                     the evidence is held: {why}"
                ));
            }
        }
        for n in sim.nodes() {
            let since = log
                .iter()
                .rev()
                .find(|e| e.node == n.name && e.kind == EventKind::Cordon)
                .map(|e| e.at);
            let long = since.is_some_and(|t| self.unreported(t, now));
            if n.unschedulable
                && n.cordoned_by == Some(CordonedBy::Drover)
                && long
                && !blind
                && !report.contains(&n.name)
            {
                self.fail(format!(
                    "{} left cordoned since {since:?}, the newest report does not name it",
                    n.name
                ));
            }
        }
        match self.violations.first() {
            Some(v) => Err(v.clone()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_sim::plan::v;

    fn at(hh_mm: &str) -> DateTime<Utc> {
        format!("2026-12-01T{hh_mm}:00Z").parse().unwrap()
    }

    /// The minors of the versions every config in force at `s` pins.
    fn pins_at(f: &Facts, s: DateTime<Utc>) -> Vec<u64> {
        f.candidates(s)
            .iter()
            .map(|m| m.env.version.minor)
            .collect()
    }

    fn merge(minute: &str, version: u64, frozen: bool, revoked: &[u64]) -> Merge {
        Merge {
            commit: minute.into(),
            at: at(minute),
            env: EnvFile {
                version: v(version),
                max_unavailable: 2,
                on_failure_rollback: false,
                max_rollbacks: 0,
                paused: false,
                frozen,
                waves: false,
                prepare: false,
                allow_downgrade: false,
            },
            revoked: revoked.iter().map(|m| v(*m)).collect(),
        }
    }

    /// The other cluster's branch forged at 00:10 and repaired at 00:30,
    /// forged again at 00:40 and deleted in the same minute (a rewrite
    /// takes the forgery with it).
    #[test]
    fn a_forged_branch_holds_the_evidence_from_when_it_is_known_until_its_repair() {
        let f = Facts {
            peer_forgery: vec![
                (at("00:10"), true),
                (at("00:30"), false),
                (at("00:40"), true),
                (at("00:40"), false),
            ],
            ..Facts::default()
        };
        let held = |t: &str| f.held_at(at(t)).is_some();
        // Not before the agent must have fetched it (a poll's grace).
        assert!(!held("00:14"));
        assert!(held("00:16") && held("00:29"));
        assert!(!held("00:31"));
        // The repair pushed after the forgery in one minute ends it.
        assert!(!held("00:46"));
        // Control: the second forgery left standing holds.
        let mut g = Facts {
            peer_forgery: f.peer_forgery[..3].to_vec(),
            ..Facts::default()
        };
        assert!(g.held_at(at("00:46")).is_some());
        // A forgery excuses a drain given back; a repair does not.
        assert!(g.excuse(at("00:05"), at("00:12")));
        assert!(!g.excuse(at("00:11"), at("00:35")));
        g.peer_forgery.clear();
        assert!(g.held_at(at("00:46")).is_none());
    }

    /// Seed 24036: node-0 cordoned at 01:08:10, the clock 27 min ahead at
    /// 01:10, the run over a step later: 2 min of the agent's time, not
    /// the 10 its report may wait to name the node.
    #[test]
    fn a_clock_jump_gives_a_report_its_whole_time_to_name_a_cordoned_node() {
        let since = at("01:08") + Duration::seconds(10);
        let now = at("01:37") + Duration::seconds(5);
        let mut f = Facts {
            jumped: vec![(at("01:10"), Duration::minutes(27))],
            ..Facts::default()
        };
        assert!(!f.unreported(since, now));
        // Controls: without the jump, or with it before the cordon.
        f.jumped.clear();
        assert!(f.unreported(since, now));
        f.jumped = vec![(at("01:00"), Duration::minutes(27))];
        assert!(f.unreported(since, now));
    }

    /// Seed 22918: the origin stalled from 00:31 to 00:40 and again from
    /// 00:36 to 00:56; the follower took the lease at 00:35:15 with a cache
    /// older than the applied commit, and its process restarted at 00:49
    /// still without it: it holds, not listing the nodes, until a fetch
    /// brings the commit.
    #[test]
    fn a_takeover_in_overlapping_outages_may_hold_until_the_origin_is_back() {
        let secs = |t: &str, s: i64| at(t) + Duration::seconds(s);
        let mut f = Facts {
            git_out: vec![(at("00:31"), at("00:40")), (at("00:36"), at("00:56"))],
            taken_over: vec![secs("00:35", 15)],
            ..Facts::default()
        };
        assert!(f.may_not_look(secs("00:50", 5), secs("00:50", 55)));
        // Control: a takeover before the origin went out.
        f.taken_over = vec![at("00:30")];
        assert!(!f.may_not_look(secs("00:50", 5), secs("00:50", 55)));
    }

    /// A repair at 00:30: by 00:40 the agent must have fetched it and
    /// passed, so its status must no longer say the evidence is held.
    #[test]
    fn a_repaired_branch_no_longer_holds_the_evidence_at_the_end() {
        let sim = Sim::new("c", drover::rollout::VirtualClock::new(at("00:00")));
        let forgery = vec![(at("00:10"), true), (at("00:30"), false)];
        let held = "status branch drover/status.d/sim/peer-1 does not count as a whole";
        let end = |held: Option<Option<String>>, now: &str| {
            let mut f = Facts {
                peer_forgery: forgery.clone(),
                ..Facts::default()
            };
            f.end(&sim, "", held, at(now)).is_ok()
        };
        assert!(!end(Some(Some(held.into())), "00:41"));
        // Controls: within its grace; nothing held; no process running at
        // the end, whose status is as it left it.
        assert!(end(Some(Some(held.into())), "00:39"));
        assert!(end(Some(None), "00:41"));
        assert!(end(None, "00:41"));
    }

    /// Seed 13572: a change merged at 00:37 while the origin stalled, the
    /// origin then down until 00:51, the clock 28 min ahead at 00:53,
    /// inside the grace after the outage.
    #[test]
    fn a_clock_jump_inside_the_grace_after_an_outage_moves_known() {
        let mut f = Facts {
            blind: vec![(at("00:27"), at("00:44")), (at("00:43"), at("00:51"))],
            jumped: vec![(at("00:53"), Duration::minutes(28))],
            ..Facts::default()
        };
        assert_eq!(f.known(at("00:37")), at("01:24"));
        // Control: a jump after the grace moves nothing.
        f.jumped = vec![(at("00:57"), Duration::minutes(28))];
        assert_eq!(f.known(at("00:37")), at("00:56"));
    }

    /// Seed 16086: a retry asked at 01:07, the clock 38 min ahead at
    /// 01:13: the agent's 30 min to answer end at 02:15 on the wall clock.
    #[test]
    fn a_clock_jump_gives_a_retry_its_whole_time_to_be_answered() {
        let mut f = Facts {
            jumped: vec![(at("01:13"), Duration::minutes(38))],
            ..Facts::default()
        };
        assert_eq!(f.later_by(at("01:07"), ANSWER), at("02:15"));
        // Control: a jump after the answer was due moves nothing.
        f.jumped = vec![(at("01:40"), Duration::minutes(38))];
        assert_eq!(f.later_by(at("01:07"), ANSWER), at("01:37"));
    }

    /// Seed 12787: a bump, a freeze and a revocation the agent may have
    /// fetched at once leave the config applied before them in force.
    #[test]
    fn a_pin_and_a_policy_change_fetched_with_a_merge_between_keep_the_applied_config() {
        let mut f = Facts {
            merges: vec![
                merge("00:01", 13, false, &[]),
                merge("00:15", 14, false, &[]),
                merge("00:49", 15, false, &[]),
                merge("00:54", 15, true, &[]),
                merge("00:56", 15, true, &[15]),
            ],
            blind: vec![(at("00:49"), at("00:53"))],
            ..Facts::default()
        };
        let pins = |f: &Facts| pins_at(f, at("01:19"));
        assert_eq!(pins(&f), [14, 15, 15, 15]);
        // Control: the bump known before the revocation landed was applied
        // alone; only the newest config is in force.
        f.blind.clear();
        f.merges[4].at = at("00:58");
        assert_eq!(pins(&f), [15]);
    }

    /// Seed 20784: a bump, a pause and a revocation of the bumped version
    /// merged at 00:19, 00:20 and 00:21, judged at 00:24:15, when only the
    /// bump must be known: the agent may have fetched all three at once
    /// and refused the head with the pin (`policy_and_version`), so 1.13.0,
    /// applied before them, may stay in force.
    #[test]
    fn a_refused_span_whose_head_is_not_known_yet_keeps_the_applied_config() {
        let mut f = Facts {
            merges: vec![
                merge("00:00", 12, false, &[]),
                merge("00:01", 13, false, &[]),
                merge("00:19", 14, false, &[]),
                merge("00:20", 14, true, &[]),
                merge("00:21", 14, true, &[14]),
            ],
            ..Facts::default()
        };
        let pins = |f: &Facts| pins_at(f, at("00:24") + Duration::seconds(15));
        assert_eq!(pins(&f), [13, 14, 14, 14]);
        // Control: the revocation merged after the judgement leaves the
        // bump and the freeze, which the agent applies as they come.
        f.merges[4].at = at("00:25");
        assert_eq!(pins(&f), [14, 14]);
    }
}
