//! Leadership lifecycle: serve HTTP, follow the election, keep a follower's
//! cache warm, and run one leadership term (pass after pass) while this
//! replica holds the lease; on stop, give back and release the lease.
//!
//! A term ends the moment leadership is lost (or shutdown begins): every
//! call it has in flight is given up rather than awaited (the guard, the
//! status writer, the Event publisher and the reporter all race the term's
//! cancel, and each of the engine's writes is also bound by the backend
//! client's write timeout, below the time between giving up the lease and
//! another replica taking it), and nothing of the term writes after that.
//! See docs/design.md §9a.

use super::events::Severity;
use super::fetch;
use super::hooks::Wake;
use super::reporter::{Reporter, ReporterConfig};
use super::{blocking, lock};
use super::{crd, recover, Acting, Agent, ClusterBackend, Error, TermTasks};
use crate::cluster::Cluster;
use crate::config;
use crate::source::trigger::{Reason, Trigger};
use futures::StreamExt;
use std::time::Duration;
use tokio::sync::watch;

impl<B: ClusterBackend> Agent<B> {
    /// Run until `shutdown` becomes true: serve HTTP, take part in the
    /// election, act while leader. On shutdown the current API call is
    /// finished, no further one starts, and the lease is released.
    pub async fn run(mut self, shutdown: watch::Receiver<bool>) -> Result<(), Error> {
        // Notifications are delivered by tasks of their own, never awaited
        // by the loop; they end with the agent.
        let _notifiers = self.state.edges.notifier.start(shutdown.clone());
        let server_tasks: Vec<_> = std::mem::take(&mut self.servers)
            .into_iter()
            .map(|(srv, app)| tokio::spawn(srv.serve(app, shutdown.clone())))
            .collect();
        let (leader_tx, own_rx) = watch::channel(self.elector.is_none());
        let mut leader_rx = self.led_by.take().unwrap_or(own_rx);
        let mut elector_task = self.elector.take().map(|mut el| {
            let sd = shutdown.clone();
            tokio::spawn(async move {
                el.run(leader_tx, sd).await;
                el
            })
        });
        let mut shutdown_rx = shutdown.clone();
        let mut state = self.state;
        let mut trigger = self.trigger;
        let mut manual_rx = self.manual_rx;
        loop {
            // Follower: keep the cache warm and become ready, but touch
            // nothing; leadership arriving meanwhile is not kept waiting.
            if !*leader_rx.borrow() && !state.edges.ready.is_ready() {
                let mut leading = leader_rx.clone();
                // Biased, here and below: a fixed order of the branches
                // when several are ready, so that a run replays (crate::replay).
                tokio::select! {
                    biased;
                    _ = state.warm_up(&shutdown_rx) => {}
                    _ = leading.wait_for(|l| *l) => {}
                }
            }
            state.edges.metrics.leader.set(0);
            tokio::select! {
                biased;
                _ = shutdown_rx.wait_for(|s| *s) => break,
                r = leader_rx.wait_for(|l| *l) => if r.is_err() { break },
                // A webhook that reached the follower: relay it to the leader.
                r = trigger.next() => {
                    if r == Reason::Webhook {
                        if let Err(e) = state.status_object.request_fetch().await {
                            if let Some(n) = state.pace.allow("relay") {
                                tracing::warn!(error = %e, suppressed = n, "could not relay the webhook to the leader");
                            }
                        }
                    }
                    continue;
                }
            }
            if *shutdown_rx.borrow() {
                break;
            }
            state.edges.metrics.leader.set(1);
            let (cancel_tx, cancel_rx) = watch::channel(false);
            let term = tokio::spawn(async move {
                state.term(&mut trigger, &mut manual_rx, cancel_rx).await;
                (state, trigger, manual_rx)
            });
            let mut leader_watch = leader_rx.clone();
            let lost = async {
                // A closed channel (no election: always leader) never reports a loss.
                if leader_watch.wait_for(|l| !*l).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                _ = lost => {
                    tracing::warn!("leadership lost: stopping at once");
                }
                _ = shutdown_rx.wait_for(|s| *s) => {}
            }
            // No call starts after this, and the ones in flight are given up.
            let _ = cancel_tx.send(true);
            match term.await {
                Ok((s, t, m)) => {
                    state = s;
                    trigger = t;
                    manual_rx = m;
                }
                Err(e) => {
                    tracing::error!(error = %e, "the acting task panicked");
                    break;
                }
            }
            state.term.acting.send_replace(false);
            if *shutdown_rx.borrow() {
                // Still the lease holder (released below): hand back nodes
                // that are only cordoned, so that no node stays out of
                // service if no replica takes over. Not after losing the
                // lease: the nodes are another replica's to act on then.
                if *leader_rx.borrow() {
                    // Its Events go out through a publisher of its own.
                    let (stop_tx, stop_rx) = watch::channel(false);
                    let publisher = state.edges.events.start(stop_rx, super::API_CALL_TIMEOUT);
                    state.give_back_on_stop().await;
                    let _ =
                        tokio::time::timeout(Duration::from_secs(2), state.edges.events.flushed())
                            .await;
                    let _ = stop_tx.send(true);
                    state.edges.events.stop();
                    if let Some(p) = publisher {
                        let _ = p.await;
                    }
                }
                break;
            }
        }
        if let Some(task) = elector_task.take() {
            if let Ok(mut el) = task.await {
                if let Err(e) = el.release().await {
                    tracing::warn!(error = %e, "could not release the lease");
                } else {
                    tracing::info!("released the lease");
                }
            }
        }
        for t in server_tasks {
            match t.await {
                Ok(r) => r?,
                Err(e) => tracing::warn!(error = %e, "http server task"),
            }
        }
        Ok(())
    }
}

impl<B: ClusterBackend> Acting<B> {
    /// A follower's preparation: fetch once and observe the cluster once, so
    /// that `/readyz` turns ready and a takeover starts from a warm cache.
    pub(super) async fn warm_up(&mut self, shutdown: &watch::Receiver<bool>) {
        if !self.fetch(shutdown).await {
            return;
        }
        let head = { lock(&self.source).fetched() };
        let Some(head) = head else { return };
        let env_name = self.cfg.env.clone();
        let src = self.source.clone();
        let env = blocking(move || {
            let s = lock(&src);
            let files = config::GitTreeFiles::at_rev(s.repo(), &head.to_string()).ok()?;
            config::load(&files).ok()?.envs.get(&env_name).cloned()
        })
        .await
        .flatten();
        if let Some(env) = env {
            if self.ensure_cluster(&env).await {
                if let Some((_, c)) = &self.cluster.connected {
                    if c.cluster.observe().await.is_ok() {
                        self.edges.ready.set_synced();
                    }
                }
            }
        }
    }

    /// One leadership term: pass after pass until `cancel`.
    pub(super) async fn term(
        &mut self,
        trigger: &mut Trigger,
        manual: &mut tokio::sync::mpsc::Receiver<()>,
        cancel: watch::Receiver<bool>,
    ) {
        // A takeover: another replica may have applied newer commits meanwhile.
        let loaded = self.reload_crd_status(&cancel).await;
        if *cancel.borrow() {
            return;
        }
        self.start_term(loaded.as_ref(), &cancel);
        self.term.status_read = loaded.is_some();
        let seen = loaded.as_ref().and_then(crd::fetch_request_stamp);
        self.run_term(trigger, manual, cancel, seen).await;
        self.end_term().await;
    }

    /// Start the term's writers: the status object's, the status report's
    /// and the Events'; each stops when `cancel` reads true.
    fn start_term(&mut self, loaded: Option<&crd::DroverStatus>, cancel: &watch::Receiver<bool>) {
        let limit = super::API_CALL_TIMEOUT;
        let mut tasks = Vec::new();
        tasks.extend(self.edges.events.start(cancel.clone(), limit));
        let (writer, w) =
            crd::StatusWriter::start(self.status_object.clone(), loaded, cancel.clone(), limit);
        tasks.push(w);
        let (reporter, r) = Reporter::start(
            ReporterConfig {
                source: self.cfg.source.clone(),
                publish: self.cfg.publish.clone(),
                poll: self.cfg.poll,
                clock: self.clock.clone(),
                events: self.edges.events.clone(),
                metrics: self.edges.metrics.clone(),
            },
            cancel.clone(),
        );
        tasks.push(r);
        self.term.tasks = Some(TermTasks {
            writer,
            reporter,
            tasks,
        });
        self.term.count += 1;
        // Everything is told afresh to this term's writers.
        self.told.new_term();
        self.cluster.new_term();
        self.fetching.new_term();
        self.term.acting.send_replace(true);
    }

    /// The term ended (its cancel was sent): its writers are stopping at
    /// their next step; wait for that, briefly, and drop them.
    async fn end_term(&mut self) {
        self.stop_fetch();
        self.edges.events.stop();
        if let Some(t) = self.term.tasks.take() {
            let all = futures::future::join_all(t.tasks);
            if tokio::time::timeout(Duration::from_secs(1), all)
                .await
                .is_err()
            {
                tracing::warn!("a writer of the ended term did not stop within 1s");
            }
        }
    }

    async fn run_term(
        &mut self,
        trigger: &mut Trigger,
        manual: &mut tokio::sync::mpsc::Receiver<()>,
        mut cancel: watch::Receiver<bool>,
        seen: Option<String>,
    ) {
        self.edges
            .events
            .on_status(
                Severity::Normal,
                "LeaderElected",
                "Lead",
                format!("{} holds the lease and acts", self.cfg.identity),
            )
            .await;
        let mut relayed = self.status_object.fetch_requests(seen);
        // The term's first fetch (always made) runs while its first pass
        // acts on the applied commit.
        self.start_fetch(Reason::Poll);
        let mut wake = Wake::Start;
        loop {
            if *cancel.borrow() {
                return;
            }
            // A pass in the middle of anything (a slow Prometheus query, a
            // call on a stalled connection) is dropped when the term ends:
            // everything it writes goes through cancel-aware writers, and
            // the next term starts from the status object, not from it.
            let mut ended = cancel.clone();
            let next = tokio::select! {
                biased;
                _ = ended.wait_for(|c| *c) => return,
                n = self.pass(wake, &cancel) => n,
            };
            let sleep = tokio::time::sleep(next.after.min(self.cfg.tick));
            tokio::pin!(sleep);
            wake = loop {
                let connected = &mut self.cluster.connected;
                let changes = async {
                    match connected.as_mut() {
                        Some((_, c)) => {
                            if c.changes.next().await.is_none() {
                                // The stream ended; the tick still covers us.
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                // In order: the term's end, then git (a fetch that ended, a
                // trigger), then the cluster, a manual request, the tick.
                // A busy cluster cannot starve git; what it starves, the
                // manual pass and the tick, its own pass stands for.
                tokio::select! {
                    biased;
                    _ = cancel.wait_for(|c| *c) => return,
                    joined = fetch::wait(&mut self.fetching.in_flight) => {
                        break Wake::Source(self.finish_fetch(joined));
                    }
                    // A trigger starts a fetch; its pass comes when it ends.
                    r = trigger.next() => self.start_fetch(r),
                    Some(()) = relayed.next() => self.start_fetch(Reason::Webhook),
                    _ = changes => break Wake::Cluster,
                    Some(()) = manual.recv() => break Wake::Manual,
                    _ = &mut sleep => break Wake::Timer,
                }
            };
            if wake == Wake::Cluster && !self.cfg.debounce.is_zero() {
                // Let a burst of changes settle, draining what piles up meanwhile.
                let until = tokio::time::Instant::now() + self.cfg.debounce;
                if let Some((_, c)) = self.cluster.connected.as_mut() {
                    while let Ok(Some(())) = tokio::time::timeout_at(until, c.changes.next()).await
                    {
                    }
                }
            }
        }
    }

    /// Read the status object back (bounded, given up on `cancel`) and take
    /// it as this term's starting point; `None` when it could not be read.
    pub(super) async fn reload_crd_status(
        &mut self,
        cancel: &watch::Receiver<bool>,
    ) -> Option<crd::DroverStatus> {
        let mut cancel = cancel.clone();
        let read = tokio::select! {
            biased;
            _ = cancel.wait_for(|c| *c) => return None,
            r = self.status_object.load_or_create() => r,
        };
        match read {
            Ok(obj) => {
                self.adopt_status(&obj);
                self.term.status_read = true;
                Some(obj)
            }
            Err(e) => {
                if let Some(n) = self.pace.allow("status-read") {
                    tracing::warn!(error = %e, suppressed = n, "cannot read the status object");
                }
                None
            }
        }
    }

    /// Whether this term knows the status object: read when the term
    /// began, or now. Until it is read, what the last leader applied is
    /// unknown, which is neither "no config" nor what this replica
    /// admitted in a term of its own before: acting on that moved a node
    /// draining for a newer pin back to the old one (simulation seed
    /// 3170), and a head judged against it could be recorded over what
    /// another leader applied since. The pass then neither admits nor
    /// acts: the nodes are held as they are.
    pub(super) async fn status_known(&mut self, cancel: &watch::Receiver<bool>) -> bool {
        if self.term.status_read {
            return true;
        }
        if self.reload_crd_status(cancel).await.is_some() {
            return true;
        }
        if let Some(n) = self.pace.allow("status-unknown") {
            tracing::warn!(
                suppressed = n,
                "the status object cannot be read: holding the nodes as they are"
            );
        }
        false
    }

    /// Take `obj` (the status object as read) as the state to go on from.
    pub(super) fn adopt_status(&mut self, obj: &crd::DroverStatus) {
        let annotation = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(recover::TRUST_ANNOTATION))
            .cloned();
        self.edges.events.set_status_uid(obj.metadata.uid.clone());
        let st = obj.status.clone().unwrap_or_default();
        let moved = self.told.adopt(st);
        self.admitted.adopt(annotation, moved);
    }
}
