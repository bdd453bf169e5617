//! Leadership lifecycle: serve HTTP, follow the election, keep a follower's
//! cache warm, and run one leadership term (pass after pass) while this
//! replica holds the lease; on stop, give back and release the lease.

use super::events::Severity;
use super::hooks::Wake;
use super::{blocking, lock};
use super::{crd, recover, Acting, Agent, ClusterBackend, Error};
use crate::cluster::Cluster;
use crate::config;
use crate::source::trigger::{Reason, Trigger};
use futures::StreamExt;
use tokio::sync::watch;

impl<B: ClusterBackend> Agent<B> {
    /// Run until `shutdown` becomes true: serve HTTP, take part in the
    /// election, act while leader. On shutdown the current API call is
    /// finished, no further one starts, and the lease is released.
    pub async fn run(mut self, shutdown: watch::Receiver<bool>) -> Result<(), Error> {
        let server_tasks: Vec<_> = std::mem::take(&mut self.servers)
            .into_iter()
            .map(|(srv, app)| tokio::spawn(srv.serve(app, shutdown.clone())))
            .collect();
        let (leader_tx, mut leader_rx) = watch::channel(self.elector.is_none());
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
            // Follower: keep the cache warm and become ready, but touch nothing.
            if !*leader_rx.borrow() && !state.ready.is_ready() {
                state.warm_up(&shutdown_rx).await;
            }
            state.metrics.leader.set(0);
            tokio::select! {
                r = leader_rx.wait_for(|l| *l) => if r.is_err() { break },
                _ = shutdown_rx.wait_for(|s| *s) => break,
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
            state.metrics.leader.set(1);
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
                _ = lost => {
                    tracing::warn!("leadership lost: stopping at once");
                }
                _ = shutdown_rx.wait_for(|s| *s) => {}
            }
            // No engine call starts after this; the one in flight finishes.
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
            if *shutdown_rx.borrow() {
                // Still the lease holder (released below): hand back nodes
                // that are only cordoned, so that no node stays out of
                // service if no replica takes over. Not after losing the
                // lease: the nodes are another replica's to act on then.
                if *leader_rx.borrow() {
                    state.give_back_on_stop().await;
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
                if let Some((_, c)) = &self.connected {
                    if c.cluster.observe().await.is_ok() {
                        self.ready.set_synced();
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
        mut cancel: watch::Receiver<bool>,
    ) {
        // A takeover: another replica may have applied newer commits meanwhile.
        let seen = self.reload_crd_status().await;
        self.window_seen = None;
        self.events
            .on_status(
                Severity::Normal,
                "LeaderElected",
                "Lead",
                format!("{} holds the lease and acts", self.cfg.identity),
            )
            .await;
        let mut relayed = self.status_object.fetch_requests(seen);
        let mut wake = Wake::Start;
        loop {
            if *cancel.borrow() {
                return;
            }
            let next = self.pass(wake, &cancel).await;
            if *cancel.borrow() {
                return;
            }
            let sleep = tokio::time::sleep(next.after.min(self.cfg.tick));
            tokio::pin!(sleep);
            let changes = async {
                match self.connected.as_mut() {
                    Some((_, c)) => {
                        if c.changes.next().await.is_none() {
                            // The stream ended; the tick still covers us.
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            wake = tokio::select! {
                _ = cancel.wait_for(|c| *c) => return,
                r = trigger.next() => Wake::Source(r),
                Some(()) = relayed.next() => Wake::Source(Reason::Webhook),
                _ = changes => Wake::Cluster,
                Some(()) = manual.recv() => Wake::Manual,
                _ = &mut sleep => Wake::Timer,
            };
            if wake == Wake::Cluster && !self.cfg.debounce.is_zero() {
                // Let a burst of changes settle, draining what piles up meanwhile.
                let until = tokio::time::Instant::now() + self.cfg.debounce;
                if let Some((_, c)) = self.connected.as_mut() {
                    while let Ok(Some(())) = tokio::time::timeout_at(until, c.changes.next()).await
                    {
                    }
                }
            }
        }
    }

    /// Read the status object back; returns the fetch request stamped on it,
    /// which the term's first fetch (always made) answers.
    pub(super) async fn reload_crd_status(&mut self) -> Option<String> {
        match self.status_object.load_or_create().await {
            Ok(obj) => {
                let stamp = crd::fetch_request_stamp(&obj);
                self.trust_annotation = obj
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(recover::TRUST_ANNOTATION))
                    .cloned();
                self.events.set_status_uid(obj.metadata.uid.clone());
                let st = obj.status.unwrap_or_default();
                let changed = st.last_applied_commit != self.crd_status.last_applied_commit;
                self.crd_status = st.clone();
                self.crd_written = Some(st);
                if changed {
                    self.active = None;
                }
                stamp
            }
            Err(e) => {
                if let Some(n) = self.pace.allow("status-read") {
                    tracing::warn!(error = %e, suppressed = n, "cannot read the status object");
                }
                None
            }
        }
    }
}
