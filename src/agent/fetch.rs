//! Stage 1, fetch: bring the config repository's head into the cache, off
//! the control loop, and record the outcome (CRD status `lastFetch`,
//! metrics, readiness).
//!
//! A trigger (poll, webhook, local change, a new term) starts a fetch on
//! the blocking pool with the fetch's own handle on the cache, and the loop
//! goes on: passes for cluster changes and timers (a health check that
//! fails, a drain that times out) run while a slow or stalled git server
//! holds the fetch. When it ends, a pass judges what it brought. One fetch
//! runs at a time; a trigger meanwhile asks for one more after it, since a
//! webhook may announce a commit pushed after the running fetch read the
//! refs. A fetch still running when a term ends is told to stop (its
//! transfer ends at the next progress report; a server that sends nothing
//! is cut by the socket timeout) and is not waited for.
//!
//! A fetch brings the status branches the agent's gate, waves and halt
//! read, by name: its own cluster's, and those of every
//! cluster its environment and the one below list in the applied config and
//! in the last fetched head's (`crate::admit::status_scope`). Nothing else
//! of the status namespace is fetched or stored, however many refs it holds.

use super::crd::FetchRecord;
use super::{lock, rfc3339, Acting, ClusterBackend};
use crate::source::trigger::Reason;
use crate::source::{FetchResult, Source};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Most commits whose status scope is kept (two are asked of each fetch).
const MAX_SCOPES: usize = 16;

/// The `(env, cluster)` pairs each commit's config asks to be fetched.
type Scopes = HashMap<git2::Oid, Vec<(String, String)>>;

/// How a fetch task ended: the fetch's handle on the cache back, and what it found.
pub(super) type Joined =
    Result<(Source, Result<FetchResult, crate::source::Error>), tokio::task::JoinError>;

/// Until the fetch in `fetching` ends (forever when none runs); it stays
/// in flight if this is dropped first. Then call [`Acting::finish_fetch`].
pub(super) async fn wait(fetching: &mut Option<InFlight>) -> Joined {
    match fetching.as_mut() {
        Some(f) => (&mut f.task).await,
        None => std::future::pending().await,
    }
}

/// The fetch: `fetch.rs` alone starts, finishes and records it; the
/// lifecycle only asks it to forget the last term (`new_term`), and the
/// pass reads whether this term fetched before judging a head.
pub(super) struct Fetching {
    /// The fetch's own handle on the cache, while no fetch runs.
    pub(super) source: Option<Source>,
    /// The fetch running off the loop, if any.
    pub(super) in_flight: Option<InFlight>,
    /// Another fetch to start when the running one ends, and why.
    pub(super) again: Option<Reason>,
    /// Whether a fetch ended in this term: a head fetched before it (by a
    /// follower, or in an older term) is not judged, the applied commit may
    /// have moved since.
    pub(super) ended_in_term: bool,
    /// Whether a fetch of this term succeeded: until one has, an applied
    /// commit missing from the cache may only be not fetched yet.
    pub(super) ok_in_term: bool,
    /// The status branches each commit's config asks for
    /// (`crate::admit::scope_at`), kept because every fetch asks it of the
    /// applied commit and the head, and a commit's config never changes; at
    /// most [`MAX_SCOPES`].
    pub(super) scopes: Arc<Mutex<Scopes>>,
    /// The status store's state as last read, with the status branch it
    /// was read for ([`Acting::store_state`]); forgotten when a fetch ends.
    pub(super) store: Option<(String, u64)>,
}

impl Fetching {
    /// No fetch has ended in the term that begins.
    pub(super) fn new_term(&mut self) {
        self.ended_in_term = false;
        self.ok_in_term = false;
        self.store = None;
    }
}

/// A fetch under way.
pub(super) struct InFlight {
    /// What asked for it.
    pub reason: Reason,
    /// The leadership term it was started in (`None`: by the follower).
    term: Option<u64>,
    /// Stops its transfer at the next progress report.
    abort: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Source, Result<FetchResult, crate::source::Error>)>,
}

impl<B: ClusterBackend> Acting<B> {
    /// Start a fetch for `reason` unless one runs; then one more follows it.
    pub(super) fn start_fetch(&mut self, reason: Reason) {
        if self.fetching.in_flight.is_some() {
            self.fetching.again = Some(reason);
            return;
        }
        let source = match self.fetching.source.take() {
            Some(s) => s,
            // The last fetch task was lost (a panic): open the cache again.
            None => match Source::open(self.cfg.source.clone()) {
                Ok(s) => s,
                Err(e) => {
                    self.record_fetch(Err(e.to_string()));
                    return;
                }
            },
        };
        let abort = source.abort_flag();
        abort.store(false, Ordering::Relaxed);
        let branch = lock(&self.source).config().status_branch.clone();
        let applied = self
            .told
            .status()
            .last_applied_commit
            .as_deref()
            .and_then(|c| git2::Oid::from_str(c).ok());
        let (env, cluster) = (self.cfg.env.clone(), self.cfg.cluster.clone());
        let scopes = self.fetching.scopes.clone();
        let task = crate::replay::remote(self.cfg.source.timeout, move || {
            let mut source = source;
            source.set_status_branch(&branch);
            let r = source.fetch_scoped(|repo, head| {
                let mut known = scopes.lock().unwrap_or_else(|e| e.into_inner());
                let heads = [applied, head].into_iter().flatten().map(|h| {
                    if let Some(s) = known.get(&h) {
                        return s.clone();
                    }
                    // What did not load (a commit not fetched yet) is asked again.
                    let Some(s) = crate::admit::scope_at(repo, h, &env) else {
                        return Vec::new();
                    };
                    if known.len() >= MAX_SCOPES {
                        known.clear();
                    }
                    known.insert(h, s.clone());
                    s
                });
                crate::admit::scope_of(&env, &cluster, heads.collect::<Vec<_>>())
            });
            (source, r)
        });
        self.fetching.in_flight = Some(InFlight {
            reason,
            term: self.term.tasks.as_ref().map(|_| self.term.count),
            abort,
            task,
        });
    }

    /// Record how the fetch that `wait` saw end went, start the one asked
    /// for meanwhile, and return what asked for the one that ended.
    pub(super) fn finish_fetch(&mut self, joined: Joined) -> Reason {
        let (reason, this_term) = self
            .fetching
            .in_flight
            .take()
            .map_or((Reason::Poll, None), |f| (f.reason, f.term));
        let this_term = self.term.tasks.is_some() && this_term == Some(self.term.count);
        let result = match joined {
            Ok((source, r)) => {
                self.fetching.source = Some(source);
                r.map(|_| ()).map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("the fetch task failed: {e}")),
        };
        let ok = result.is_ok();
        // The fetch may have moved other clusters' branches.
        self.fetching.store = None;
        self.record_fetch(result);
        // A head read before this term began may be older than what the
        // last leader applied since: it is not judged (the next fetch is).
        if this_term {
            self.fetching.ended_in_term = true;
            self.fetching.ok_in_term |= ok;
        }
        if let Some(again) = self.fetching.again.take() {
            self.start_fetch(again);
        }
        reason
    }

    /// Fetch and wait for it (a follower warming up), false when `cancel`
    /// came first (the fetch goes on, and the next wait picks it up).
    pub(super) async fn fetch(&mut self, cancel: &watch::Receiver<bool>) -> bool {
        if self.fetching.in_flight.is_none() {
            self.start_fetch(Reason::Poll);
        }
        let mut cancel = cancel.clone();
        let joined = tokio::select! {
            biased;
            Ok(_) = cancel.wait_for(|c| *c) => return false,
            j = wait(&mut self.fetching.in_flight) => j,
        };
        self.finish_fetch(joined);
        true
    }

    /// The term ends: the running fetch stops at its next progress report
    /// and is not waited for.
    pub(super) fn stop_fetch(&mut self) {
        if let Some(f) = &self.fetching.in_flight {
            f.abort.store(true, Ordering::Relaxed);
            tracing::info!("fetch abandoned: the agent stops acting");
        }
        self.fetching.again = None;
    }

    fn record_fetch(&mut self, result: Result<(), String>) {
        let now = self.clock.now();
        let ok = result.is_ok();
        let result_text = match result {
            Ok(()) => "ok".to_string(),
            Err(e) => e,
        };
        if !ok {
            if let Some(n) = self.pace.allow("fetch") {
                tracing::warn!(error = %result_text, suppressed = n, "fetch failed");
            }
        }
        self.edges
            .metrics
            .fetched(ok, now.timestamp_millis() as f64 / 1000.0);
        self.told.fetched(FetchRecord {
            time: rfc3339(now),
            result: result_text,
        });
        self.edges.ready.set_fetched();
    }
}
