//! Stage 3, act: the engine on the applied config, through the guard, with
//! the window and health inputs of this moment; says when to pass again.

use super::events::Severity;
use super::guard::Guarded;
use super::health;
use super::hooks::ClockRef;
use super::{lock, Acting, Active, ClusterBackend, Connected, Next};
use crate::config::EnvConfig;
use crate::rollout::{Engine, Held, Inputs, Labels, Policy, WindowState};
use chrono::{DateTime, Utc};
use std::time::Duration;
use tokio::sync::watch;

/// What acting on the cluster carries from pass to pass: `act.rs` alone
/// writes it (the wave gate's read is `waves.rs`'s, the one field of
/// another writer); the lifecycle only asks it to forget the last term's
/// decision and takes the cluster view's change stream as its wake-up, and
/// admission, migration and the give-back borrow the cluster view.
pub(super) struct OnCluster<B: ClusterBackend> {
    /// The cluster view and the settings it was built for.
    pub(super) connected: Option<(B::Settings, Connected<B::Cluster>)>,
    /// Nodes held by a fault of their own after the last reconcile
    /// (`rollout::Outcome::held`), carried into the next one.
    pub(super) held: Vec<Held>,
    /// The engine's last decision in this term, as the health queries need it.
    pub(super) decided: Option<health::Decided>,
    /// The wave gate's evidence as last read, with the status store and
    /// applied commit it was read at (read again only when either moves).
    pub(super) waves_read: Option<super::waves::Read>,
    /// Spaces reconcile attempts while the cluster keeps failing them.
    pub(super) backoff: crate::retry::Backoff,
}

impl<B: ClusterBackend> OnCluster<B> {
    /// Nothing connected, held, decided or read yet.
    pub(super) fn new() -> Self {
        OnCluster {
            connected: None,
            held: Vec::new(),
            decided: None,
            waves_read: None,
            backoff: crate::retry::Backoff::new(Duration::from_secs(2), Duration::from_secs(60)),
        }
    }

    /// A new term: its first decision is its own.
    pub(super) fn new_term(&mut self) {
        self.decided = None;
    }
}

impl<B: ClusterBackend> Acting<B> {
    /// (Re)build the cluster view when any setting that reaches it changes
    /// (the backend says which: [`ClusterBackend::Settings`]); false when
    /// unavailable.
    pub(super) async fn ensure_cluster(&mut self, env: &EnvConfig) -> bool {
        let settings = self.backend.settings(&self.cfg.cluster, env);
        if matches!(&self.cluster.connected, Some((s, _)) if *s == settings) {
            return true;
        }
        match self.backend.connect(&settings).await {
            Ok(c) => {
                self.cluster.connected = Some((settings, c));
                true
            }
            Err(e) => {
                if let Some(n) = self.pace.allow("connect") {
                    tracing::warn!(error = %e, suppressed = n, "cannot connect to the cluster");
                }
                false
            }
        }
    }

    /// The window at `now` for `active`'s env, for any change and for a patch update
    /// (they differ only under a `minor` freeze); asked of [`crate::window`].
    fn window(active: &Active, now: DateTime<Utc>) -> (WindowState, Option<WindowState>) {
        match &active.calendar {
            Some(cal) => cal.inputs_at(now),
            None => (WindowState::default(), None),
        }
    }

    /// The applied commit, when it is recorded but not in the cache and no
    /// fetch of this term has succeeded: it may only not be fetched yet (a
    /// follower fetched once when it warmed up), so its absence says
    /// nothing about whether a config applies.
    fn applied_not_yet_here(&self) -> Option<git2::Oid> {
        let commit =
            git2::Oid::from_str(self.told.status().last_applied_commit.as_deref()?).ok()?;
        if self.fetching.ok_in_term {
            return None;
        }
        let here = lock(&self.source).repo().find_commit(commit).is_ok();
        (!here).then_some(commit)
    }

    /// Run the engine for the applied config, have the outcome reported, say when to run again.
    pub(super) async fn reconcile(&mut self, cancel: &watch::Receiver<bool>) -> Next {
        let tick = Next {
            after: self.cfg.tick,
        };
        if !self.fetching.ended_in_term && self.fetching.in_flight.is_some() {
            // A term acts once its first fetch has ended (bounded by the
            // fetch's timeout) and the newest head is judged: that head may
            // revoke the applied version, and acting on the applied config
            // meanwhile started a node the next pass gave back (simulation
            // seed 514, after a restart). Nothing is told until then.
            return Next {
                after: Duration::from_secs(1).min(self.cfg.tick),
            };
        }
        let Some(active) = self.admitted.in_force() else {
            if let Some(commit) = self.applied_not_yet_here() {
                // Not knowing the applied config is not "no config": a
                // follower taking over, or a fetch failing, holds the
                // nodes as they are until the commit is here to judge by.
                if let Some(n) = self.pace.allow("applied-not-here") {
                    tracing::warn!(
                        %commit,
                        suppressed = n,
                        "the applied commit is not in the cache yet: holding until a fetch brings it"
                    );
                }
                return Next {
                    after: Duration::from_secs(1).min(self.cfg.tick),
                };
            }
            // Nothing to act on: nodes drover cordoned are not left cordoned meanwhile.
            self.give_back_unconfigured(cancel).await;
            self.report_unconfigured().await;
            return tick;
        };
        if !self.ensure_cluster(&active.env).await || !self.records_ready(&active, cancel).await {
            return Next {
                after: Duration::from_secs(5),
            };
        }
        let now = self.clock.now();
        let (mut window, mut patch_window) = Self::window(&active, now);
        if let Some(why) = &active.revoked {
            // A version revoked after it was pinned: nodes already moving
            // finish, no further node starts, until a new version is pinned.
            let held = format!("{} is revoked: {why}", active.env.version);
            window.held = Some(held.clone());
            if let Some(p) = patch_window.as_mut() {
                p.held = Some(held);
            }
        }
        self.edges
            .metrics
            .window_open
            .set(i64::from(window.opened_at.is_some()));
        let gate = self.wave_gate(&active, now).await;
        let (halted, waiting) = gate.holds();
        let no_start = halted.is_some() || waiting.is_some() || active.revoked.is_some();
        let wanted =
            health::queries_wanted(&active.env.version, self.cluster.decided.as_ref(), no_start);
        let inputs = Inputs {
            may_start: true,
            hold_reason: String::new(),
            halted,
            waiting,
            wave_blocker: gate.blocker(),
            window: window.clone(),
            patch_window,
            queries: health::evaluate_queries(&active.env, wanted).await,
            held: self.cluster.held.clone(),
            ..Default::default()
        };
        let engine = Engine::new(
            Policy::from_env(&active.env).with_revoked(active.revoked_versions.clone()),
            Labels {
                env: self.cfg.env.clone(),
                commit: active.commit.to_string(),
            },
            ClockRef(self.clock.clone()),
        );
        let Some((_, conn)) = self.cluster.connected.as_ref() else {
            return tick;
        };
        let guarded = Guarded::new(&conn.cluster, cancel);
        let result = engine.reconcile(&guarded, &inputs).await;
        let observed = guarded.into_observed();
        if !observed.is_empty() || result.is_ok() {
            self.edges.ready.set_synced();
        }
        self.node_metrics(&observed);
        self.report_ignored(&observed).await;
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                self.edges.metrics.reconciled("error");
                if !*cancel.borrow() {
                    if let Some(n) = self.pace.allow("reconcile") {
                        tracing::warn!(error = %e, suppressed = n, "reconcile failed");
                    }
                }
                return Next {
                    after: self.cluster.backoff.next_delay(),
                };
            }
        };
        if *cancel.borrow() {
            // The term ended mid-step: what it did not do is no news, and
            // nothing more is written for it.
            return tick;
        }
        self.edges.metrics.reconciled("ok");
        self.cluster.decided = Some(health::Decided::of(&active.env.version, &outcome.decision));
        self.report_holds(&outcome.held).await;
        self.report(&active, &outcome, &window, &observed, now)
            .await;
        let d = &outcome.decision;
        // A call that failed is tried again at the reconcile backoff's pace
        // (its node is held meanwhile; the others went on).
        let retry_failed = outcome
            .held
            .iter()
            .any(|h| h.last >= now)
            .then(|| self.cluster.backoff.next_delay());
        if retry_failed.is_none() {
            self.cluster.backoff.reset();
        }
        if outcome.again {
            return Next {
                after: Duration::ZERO,
            };
        }
        let mut after = retry_failed.map_or(self.cfg.tick, |d| d.min(self.cfg.tick));
        if outcome.retry_evictions {
            after = after.min(self.cfg.evict_retry);
        }
        if let Some(w) = d.wake_at.into_iter().chain(gate.changes_at()).min() {
            after = after.min((w - now).to_std().unwrap_or(Duration::ZERO));
        }
        if d.poll_health {
            after = after.min(crate::rollout::health::HEALTH_RECHECK);
        }
        Next { after }
    }

    /// A Warning Event on each node newly held (or held for another reason),
    /// then carry the holds into the next reconcile.
    async fn report_holds(&mut self, held: &[Held]) {
        for h in held {
            let known = self
                .cluster
                .held
                .iter()
                .any(|p| p.node == h.node && p.why == h.why);
            if !known {
                self.edges
                    .events
                    .on_node(
                        &h.node,
                        Severity::Warning,
                        "NodeHeld",
                        "Hold",
                        format!(
                            "held: {}; the other nodes go on, its timeouts still apply",
                            h.why
                        ),
                    )
                    .await;
            }
        }
        self.cluster.held = held.to_vec();
    }
}
