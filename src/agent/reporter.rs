//! The status report's way to the git server, off the control loop: the
//! pass hands each new report to the term's [`Reporter`] and goes on; the
//! reporter's task pushes them in order, one attempt at a time, each on a
//! thread of its own, and says how it goes (the `ReportPushed` condition of
//! the CRD status, metrics, Events).
//!
//! Choices (docs/design.md §5, "Pushing without waiting"):
//! - **Coalescing.** At most [`MAX_WAITING`] reports wait ([`Outbox`]). A
//!   new report replaces the waiting report before it when both are the
//!   same state of the same version and config (progress, or a `blocked`
//!   message naming other pods): the newest says everything that one said.
//!   A change of state is never coalesced away: every state the cluster
//!   passed through reaches the branch, in order, and the newest report is
//!   always last, so the branch ends on the cluster's latest state. Past
//!   the bound the oldest waiting report that is not evidence (`confirmed`,
//!   `failed`: what the gate reads) is dropped first.
//! - **One push for what waits.** Each attempt carries every waiting report
//!   of the branch, a commit each, oldest first: on a starved server a
//!   cluster is one push from its latest state, not one per change of state
//!   (200 agents on a git server held to 15% of a CPU, pushing a report
//!   at a time, lost 175 of their 200 final states: BENCHMARKS.md).
//! - **Cadence.** Rolling progress goes out at most once per `[status]
//!   progress_interval` of the applied config ([`crate::status::cadence`]);
//!   everything else at once. Held progress with a newer report waiting
//!   behind it is dropped: the newer one carries it.
//! - **Each attempt** may take [`attempt_budget`] (the poll interval, 5 s
//!   to 60 s: a tenth of the default progress interval, after which its
//!   progress would be superseded); a server that says nothing is cut by
//!   the transport's socket timeout. Not less: a starved server that takes
//!   tens of seconds per push would do the work of every attempt given up
//!   and then again for its retry (with a third of the poll interval,
//!   1,000 agents on 15% of a CPU gave up 4,626 attempts and landed 1,289). It runs on its own thread, not the
//!   blocking pool the control loop's git work uses.
//! - **Failures.** Unreachable, timed out or stale: retried with a backoff
//!   from 1 s up to the poll interval. Refused (a pre-receive hook, a
//!   protected branch, credentials or a signing key that do not work):
//!   pushing the same report again cannot help, so the reporter stops,
//!   says so (condition `ReportPushed=False` reason `Refused`, which makes
//!   the status `Stalled`: [`super::conditions`]; the
//!   `drover_status_push_refused` gauge, a Warning Event), and tries again
//!   only with the next new report or after five poll intervals, so that
//!   it resumes by itself once the forge is fixed.
//! - **Terms.** The reporter belongs to a leadership term: it stops when
//!   the term ends (a push already on the wire may still land; none starts
//!   after) and what was waiting is dropped: the next leader reports its
//!   own view.

use super::events::{Events, Severity};
use super::hooks::SharedClock;
use super::metrics::Metrics;
use crate::retry::Backoff;
use crate::rollout::RolloutState;
use crate::source::{Source, SourceConfig};
use crate::status::cadence::{self, Push};
use crate::status::{PublishOptions, PushError, StatusReport};
use chrono::{DateTime, Utc};
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch, Notify};

/// Most reports waiting to be pushed (evidence of distinct versions; in
/// practice one or two wait).
pub const MAX_WAITING: usize = 16;

/// A report and the status branch it goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub report: StatusReport,
    /// The status branch of the policy in force (`[promotion] status_branch`).
    pub branch: String,
    /// `[status] progress_interval` of the applied config.
    pub progress_interval: Duration,
}

/// A waiting report, numbered in order of arrival.
#[derive(Debug, Clone)]
struct Waiting {
    seq: u64,
    out: Outgoing,
}

/// Reports waiting to be pushed, oldest first; pure (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Outbox {
    queue: VecDeque<Waiting>,
    next_seq: u64,
    /// Reports dropped because evidence of more than [`MAX_WAITING`]
    /// versions waited (never the newest).
    pub dropped: u64,
}

/// Evidence the gate reads; dropped last when the outbox is full.
fn is_evidence(r: &StatusReport) -> bool {
    matches!(r.state, RolloutState::Confirmed | RolloutState::Failed)
}

/// Whether `newer` says everything `older` said: the same state of the same
/// version, config and cluster on the same branch (progress within a state).
fn same_run(older: &Outgoing, newer: &Outgoing) -> bool {
    let (a, b) = (&older.report, &newer.report);
    older.branch == newer.branch
        && a.state == b.state
        && a.version == b.version
        && a.config_commit == b.config_commit
        && a.env == b.env
        && a.cluster == b.cluster
}

/// What the reporter does next ([`Outbox::next`]).
#[derive(Debug, Clone)]
enum Next {
    /// Push these reports now, oldest first, in one push (a commit each).
    Push(Vec<Waiting>),
    /// Held progress: nothing before this time unless a newer report comes.
    Until(DateTime<Utc>),
    /// Nothing waits.
    Idle,
}

impl Outbox {
    /// Add `out` as the newest report, replacing the waiting one it carries.
    pub fn offer(&mut self, out: Outgoing) {
        if self.queue.back().is_some_and(|w| same_run(&w.out, &out)) {
            self.queue.pop_back();
        }
        self.next_seq += 1;
        self.queue.push_back(Waiting {
            seq: self.next_seq,
            out,
        });
        while self.queue.len() > MAX_WAITING {
            // Never the newest; evidence last.
            let older = self.queue.len() - 1;
            let at = (0..older)
                .find(|&i| !is_evidence(&self.queue[i].out.report))
                .unwrap_or(0);
            self.queue.remove(at);
            self.dropped += 1;
        }
    }

    /// The reports to push next, given the last one that reached the remote
    /// and when (`None`: nothing pushed yet), at `now`: every report waiting
    /// for the same branch, oldest first, so that an agent behind a slow
    /// server catches up in one push, each report still its own commit.
    /// Reports the remote already holds are dropped; so is held progress
    /// with a newer report behind it.
    fn next(&mut self, last: Option<(&StatusReport, DateTime<Utc>)>, now: DateTime<Utc>) -> Next {
        while let Some(head) = self.queue.front() {
            let out = &head.out;
            match cadence::decide(last, &out.report, now, out.progress_interval) {
                Push::Now => {
                    // What waits behind the head is newer by construction
                    // (`offer` keeps no two of one run side by side): a
                    // change of state, or progress after one; it all goes.
                    let branch = &out.branch;
                    let chain = self
                        .queue
                        .iter()
                        .take_while(|w| w.out.branch == *branch)
                        .cloned()
                        .collect();
                    return Next::Push(chain);
                }
                Push::At(due) if self.queue.len() == 1 => return Next::Until(due),
                Push::At(_) | Push::Nothing => {
                    self.queue.pop_front();
                }
            }
        }
        Next::Idle
    }

    #[cfg(test)]
    fn front(&self) -> Option<Waiting> {
        self.queue.front().cloned()
    }

    /// Remove the reports up to the one numbered `seq`, which landed (a
    /// newer report that replaced one of them while it was pushed stays).
    fn done(&mut self, seq: u64) {
        while self.queue.front().is_some_and(|w| w.seq <= seq) {
            self.queue.pop_front();
        }
    }

    /// Reports waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// The waiting reports, oldest first.
    #[cfg(test)]
    fn reports(&self) -> Vec<&StatusReport> {
        self.queue.iter().map(|w| &w.out.report).collect()
    }
}

/// How pushing goes, for the CRD status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushHealth {
    /// Reports waiting.
    pub waiting: usize,
    /// `None` until the first attempt; then whether the last one landed.
    pub last: Option<Verdict>,
    /// The status-branch commit of the newest signed report pushed this
    /// term (`None` until one lands).
    pub commit: Option<String>,
}

/// The outcome of the last push attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It landed (or the remote already held the report).
    Pushed,
    /// It failed in a way a retry may cure (unreachable, timed out, stale).
    Failing(String),
    /// The remote refused it, or the agent's credentials or key do not work.
    Refused {
        /// The cluster's status branch the report was for.
        branch: String,
        /// Why, in the remote's (or the credential's) words.
        message: String,
    },
}

/// The time one push attempt may take with `poll` as the poll interval.
pub fn attempt_budget(poll: Duration) -> Duration {
    poll.clamp(Duration::from_secs(5), Duration::from_secs(60))
}

/// What the reporter needs.
pub struct ReporterConfig {
    pub source: SourceConfig,
    pub publish: PublishOptions,
    pub poll: Duration,
    pub clock: SharedClock,
    pub events: Events,
    pub metrics: Arc<Metrics>,
}

/// The term's handle on its reporter.
pub struct Reporter {
    outbox: Arc<Mutex<Outbox>>,
    wake: Arc<Notify>,
    health: watch::Receiver<PushHealth>,
    landed: watch::Receiver<Option<StatusReport>>,
}

impl Reporter {
    /// Start the reporter; it stops when `stop` reads true.
    pub fn start(
        cfg: ReporterConfig,
        stop: watch::Receiver<bool>,
    ) -> (Reporter, tokio::task::JoinHandle<()>) {
        let outbox = Arc::new(Mutex::new(Outbox::default()));
        let wake = Arc::new(Notify::new());
        let (health_tx, health) = watch::channel(PushHealth::default());
        let (landed_tx, landed) = watch::channel(None);
        let task = Task {
            cfg,
            outbox: outbox.clone(),
            wake: wake.clone(),
            health: health_tx,
            landed: landed_tx,
            pushed: None,
            source: None,
        };
        let handle = tokio::spawn(task.run(stop));
        (
            Reporter {
                outbox,
                wake,
                health,
                landed,
            },
            handle,
        )
    }

    /// Queue `out` to be pushed; returns at once.
    pub fn offer(&self, out: Outgoing) {
        lock(&self.outbox).offer(out);
        self.wake.notify_one();
    }

    /// How pushing goes.
    pub fn health(&self) -> PushHealth {
        self.health.borrow().clone()
    }

    /// The last report that reached the remote (or that the remote already
    /// held), as it changes: what a bench waits on to time "ready → on the
    /// remote"; the agent itself reads [`Reporter::health`].
    pub fn landed(&self) -> watch::Receiver<Option<StatusReport>> {
        self.landed.clone()
    }
}

/// Whether a failed attempt was abandoned for taking too long (it spent
/// its `budget`, or the transport timed out on a server that said nothing)
/// rather than refused a connection or answered with an error: a starved
/// forge shows as timeouts, a down one as failures.
fn timed_out(e: &PushError, took: Duration, budget: Duration) -> bool {
    took >= budget
        || match e {
            PushError::Source(crate::source::Error::Timeout { .. }) => true,
            PushError::Source(crate::source::Error::Git(g)) => g.code() == git2::ErrorCode::Timeout,
            _ => false,
        }
}

fn lock(o: &Mutex<Outbox>) -> std::sync::MutexGuard<'_, Outbox> {
    o.lock().unwrap_or_else(|e| e.into_inner())
}

/// The reporter's task.
struct Task {
    cfg: ReporterConfig,
    outbox: Arc<Mutex<Outbox>>,
    wake: Arc<Notify>,
    health: watch::Sender<PushHealth>,
    landed: watch::Sender<Option<StatusReport>>,
    /// The last report that reached the remote, and when (for the cadence).
    pushed: Option<(StatusReport, DateTime<Utc>)>,
    /// The reporter's own handle on the git cache (not the control loop's).
    source: Option<Source>,
}

/// What to do after an attempt.
enum After {
    /// Next report now.
    Next,
    /// Wait this long (or for a new report when `or_new` is set).
    Wait { delay: Duration, or_new: bool },
}

impl Task {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let poll = self.cfg.poll;
        let mut backoff = Backoff::new(
            Duration::from_secs(1),
            poll.clamp(Duration::from_secs(1), Duration::from_secs(300)),
        );
        let refused_retry = (poll * 5).clamp(Duration::from_secs(5), Duration::from_secs(1800));
        let mut after = After::Next;
        let mut last_refusal: Option<String> = None;
        let mut quiet = crate::retry::Quiet::new(crate::retry::LOG_EVERY);
        loop {
            if let After::Wait { delay, or_new } = after {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(delay) => {}
                    _ = self.wake.notified(), if or_new => {}
                }
            }
            after = After::Next;
            let now = self.cfg.clock.now();
            let last = self.pushed.as_ref().map(|(r, t)| (r, *t));
            let next = lock(&self.outbox).next(last, now);
            let waiting = lock(&self.outbox).len();
            self.health.send_modify(|h| h.waiting = waiting);
            self.cfg.metrics.status_reports_waiting.set(waiting as i64);
            let (chain, head) = match next {
                Next::Push(chain) => match chain.last().cloned() {
                    Some(head) => (chain, head),
                    None => continue,
                },
                Next::Until(due) => {
                    // Held progress: push when due, or sooner with a newer report.
                    let delay = (due - now).to_std().unwrap_or_default().min(poll);
                    after = After::Wait {
                        delay,
                        or_new: true,
                    };
                    continue;
                }
                Next::Idle => {
                    tokio::select! {
                        biased;
                        _ = stop.wait_for(|s| *s) => return,
                        _ = self.wake.notified() => {}
                    }
                    continue;
                }
            };
            let flag = Arc::new(AtomicBool::new(false));
            let budget = attempt_budget(self.cfg.poll);
            let began = std::time::Instant::now();
            let attempt = self.attempt(&chain, budget, flag.clone());
            let result = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => {
                    // Nothing more is sent: the attempt stops at its next step.
                    flag.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                r = attempt => r,
            };
            let took = began.elapsed();
            let verdict = match result {
                Ok(published) => {
                    lock(&self.outbox).done(head.seq);
                    self.pushed = Some((head.out.report.clone(), now));
                    self.landed.send_replace(Some(head.out.report.clone()));
                    backoff.reset();
                    quiet.reset();
                    last_refusal = None;
                    self.cfg.metrics.status_pushed(if published.is_some() {
                        "ok"
                    } else {
                        "unchanged"
                    });
                    if let Some(commit) = published {
                        let id = commit.to_string();
                        self.health.send_modify(|h| h.commit = Some(id));
                        tracing::info!(%commit, state = ?head.out.report.state, reports = chain.len(), "status report pushed");
                        if chain
                            .iter()
                            .any(|w| w.out.report.state == RolloutState::Confirmed)
                        {
                            self.cfg
                                .events
                                .on_status(
                                    Severity::Normal,
                                    "Confirmed",
                                    "Report",
                                    format!(
                                        "confirmed {} on {}; recorded on the status branch",
                                        head.out.report.version, head.out.branch
                                    ),
                                )
                                .await;
                        }
                    }
                    Verdict::Pushed
                }
                Err(e) if e.needs_a_person() => {
                    let message = e.to_string();
                    self.cfg.metrics.status_pushed("refused");
                    if last_refusal.as_deref() != Some(message.as_str()) {
                        tracing::warn!(error = %message, "the status report was refused; not retried until the next report or {refused_retry:?}");
                        self.cfg
                            .events
                            .on_status(
                                Severity::Warning,
                                // Not the remote's refusal: the agent's own
                                // branch does not count, and it does not build on it.
                                if matches!(e, PushError::Untrusted(_)) {
                                    "StatusBranchUntrusted"
                                } else {
                                    "ReportRefused"
                                },
                                "Report",
                                format!("the status report was not pushed: {message}"),
                            )
                            .await;
                        last_refusal = Some(message.clone());
                    }
                    after = After::Wait {
                        delay: refused_retry,
                        or_new: true,
                    };
                    Verdict::Refused {
                        branch: crate::status::cluster_branch(
                            &head.out.branch,
                            &head.out.report.env,
                            &head.out.report.cluster,
                        ),
                        message,
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    self.cfg
                        .metrics
                        .status_pushed(if timed_out(&e, took, budget) {
                            "timeout"
                        } else {
                            "failed"
                        });
                    let delay = backoff.next_delay();
                    if let Some(n) = quiet.allow() {
                        tracing::warn!(error = %message, suppressed = n, retry_in = ?delay, "status push failed; will retry");
                    }
                    after = After::Wait {
                        delay,
                        or_new: false,
                    };
                    Verdict::Failing(message)
                }
            };
            self.cfg
                .metrics
                .status_push_refused
                .set(i64::from(matches!(verdict, Verdict::Refused { .. })));
            self.health.send_modify(|h| {
                h.last = Some(verdict);
                h.waiting = lock(&self.outbox).len();
            });
        }
    }

    /// One push of `chain` (one branch's reports, oldest first) on a thread
    /// of its own; `Ok(Some(commit))` when commits landed (the newest's),
    /// `Ok(None)` when the remote already held the newest report.
    async fn attempt(
        &mut self,
        chain: &[Waiting],
        budget: Duration,
        stop: Arc<AtomicBool>,
    ) -> Result<Option<git2::Oid>, PushError> {
        let mut opts = self.cfg.publish.clone();
        opts.budget = budget;
        // A report's evidence counts from its commit's time, and readers
        // refuse commits dated ahead of their clock: the commit is dated by
        // the clock the agent decided by (the wall clock, but for a test hook).
        let decided = self.cfg.clock.now();
        opts.commit_time = Some(decided);
        let source = self.source.take();
        let mut cfg = self.cfg.source.clone();
        let reports: Vec<StatusReport> = chain.iter().map(|w| w.out.report.clone()).collect();
        let (Some(newest), Some(branch)) = (reports.last(), chain.first().map(|w| &w.out.branch))
        else {
            return Ok(None);
        };
        cfg.status_branch = branch.clone();
        let config_commit = newest.config_commit.clone();
        let (tx, rx) = oneshot::channel();
        let spawned = crate::replay::thread("drover-report", budget, move || {
            let result = (|| {
                let mut src = match source {
                    Some(s) => s,
                    None => Source::open(cfg.clone())?,
                };
                src.set_status_branch(&cfg.status_branch);
                // The own branch is judged by the report signers of the
                // policy the report was made under, as every reader judges it.
                opts.report_signers = git2::Oid::from_str(&config_commit)
                    .ok()
                    .and_then(|c| policy_report_signers(src.repo(), c, decided));
                let r = crate::status::publish_until(&src, &reports, &opts, &stop);
                Ok::<_, PushError>((src, r))
            })();
            let _ = tx.send(result);
        });
        if let Err(e) = spawned {
            return Err(PushError::Stopped {
                url: crate::source::redact(&self.cfg.source.url),
                why: format!("cannot start the push thread: {e}"),
            });
        }
        match rx.await {
            Ok(Ok((src, r))) => {
                self.source = Some(src);
                r.map(|p| p.commit)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(PushError::Stopped {
                url: crate::source::redact(&self.cfg.source.url),
                why: "the push thread ended without an answer".into(),
            }),
        }
    }
}

/// The parsed report signers of the policy at `commit`, when it names any.
fn policy_report_signers(
    repo: &git2::Repository,
    commit: git2::Oid,
    now: DateTime<Utc>,
) -> Option<crate::trust::AllowedSigners> {
    let snap = crate::admit::snapshot(repo, commit, now).ok()?.ok()?;
    crate::trust::AllowedSigners::parse(snap.policy.signers_text.as_deref()?).ok()
}

#[cfg(test)]
#[path = "reporter_tests.rs"]
mod tests;
