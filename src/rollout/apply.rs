//! What each action is on a cluster: the node's record written first
//! (one request, conditional on the record the decision read), then the
//! call it records: the cordon, the run the record names, the deletion of
//! a run. A give-back uncordons first and records after (a crash between
//! the two leaves the record saying the node is drover's cordon, and the
//! give-back is repeated), except where the node's run may still act on
//! it: then the record says the run is stopped, the run is deleted, and
//! the uncordon waits for a later step ([`Action::Release`]).
//!
//! A node's actions of one step are applied in order, each write built on
//! the record the previous one stored ([`NodeCalls`]); an action that
//! failed is an [`EngineError::Apply`], the step's error it returns.

use super::decision::Action;
use crate::cluster::{
    Cluster, Cordoned, DrainOrder, EvictionPass, NodeProgress, NodeRecord, NodeView, RecordWrite,
    Requests, RunStart, RungTaken, Stored,
};
use crate::config::DrainRule;
use crate::record::RungUse;
use chrono::{DateTime, Utc};

/// A reconcile step that could not complete.
#[derive(Debug, thiserror::Error)]
pub enum EngineError<E: std::error::Error + 'static> {
    /// The nodes could not be observed; nothing was done.
    #[error("cannot observe the nodes: {0}")]
    Observe(#[source] E),
    /// An action failed (from [`apply`]; a reconcile step holds the node
    /// instead and goes on with the others).
    #[error("{action} on node {node} failed: {source}")]
    Apply {
        /// The action's kind.
        action: &'static str,
        /// The node.
        node: String,
        /// The backend's error.
        #[source]
        source: E,
    },
}

/// One node's calls in a step: its view, and its record as the last write
/// stored it.
pub(super) struct NodeCalls<'a> {
    view: Option<&'a NodeView>,
    name: &'a str,
    stored: Option<Stored>,
    now: DateTime<Utc>,
    /// The environment's drain rules, for an eviction pass.
    rules: &'a [DrainRule],
}

impl<'a> NodeCalls<'a> {
    /// The calls about `name`, whose observation is `view` (if observed).
    pub(super) fn new(name: &'a str, view: Option<&'a NodeView>, now: DateTime<Utc>) -> Self {
        NodeCalls {
            view,
            name,
            stored: view.and_then(|v| v.record.clone()),
            now,
            rules: &[],
        }
    }

    /// The calls, an eviction pass following `rules`.
    pub(super) fn with_rules(mut self, rules: &'a [DrainRule]) -> Self {
        self.rules = rules;
        self
    }

    /// The pre-drain taint a cordon's record write just recorded, if any.
    pub(super) fn taint_taken(&self) -> Option<RungTaken> {
        let r = &self.stored.as_ref()?.record;
        let p = r.progress.as_ref()?;
        let u = r.used_rung(crate::config::RungKind::Taint, p.run_version())?;
        Some(RungTaken {
            rung: u.rung,
            rule: u.rule.clone(),
            detail: u.detail.clone(),
        })
    }

    /// Record the drain rungs beyond `evict` a pass used, unless the
    /// record holds them already (one write per rung, version and attempt).
    pub(super) async fn note_rungs<C: Cluster>(
        &mut self,
        cluster: &C,
        taken: &[RungTaken],
    ) -> Result<Vec<RungTaken>, C::Error> {
        let record = self.record();
        let Some(p) = record.progress.as_ref() else {
            return Ok(Vec::new());
        };
        let uses: Vec<RungUse> = taken
            .iter()
            .map(|t| RungUse {
                rung: t.rung,
                rule: t.rule.clone(),
                version: p.run_version().clone(),
                attempt: record.attempt,
                detail: t.detail.clone(),
            })
            .collect();
        let new: Vec<RungTaken> = taken
            .iter()
            .filter(|t| record.used_rung(t.rung, p.run_version()).is_none())
            .cloned()
            .collect();
        match record.with_rungs(&uses) {
            Some(r) => self.write(cluster, r).await.map(|()| new),
            None => Ok(Vec::new()),
        }
    }

    /// The record the next write builds on (a new one, with a fresh id,
    /// before drover's first write about the node).
    fn record(&self) -> NodeRecord {
        match &self.stored {
            Some(s) => s.record.clone(),
            None => NodeRecord::new(self.name, format!("{:016x}", crate::replay::random_u64())),
        }
    }

    /// The current progress in the record, if any.
    pub(super) fn progress(&self) -> Option<NodeProgress> {
        self.stored
            .as_ref()
            .and_then(|s| s.record.progress.clone())
            .or_else(|| {
                self.view
                    .and_then(|v| v.progress.as_ref().ok().cloned().flatten())
            })
    }

    /// Write `record`, conditional on the stored one; every write consumes
    /// the person's requests the decision saw (it acts on them), and
    /// records its run's uid once seen.
    async fn write<C: Cluster>(&mut self, cluster: &C, record: NodeRecord) -> Result<(), C::Error> {
        let write = RecordWrite {
            record: as_written(self.view, record),
            consume: self
                .stored
                .as_ref()
                .map_or(Requests::default(), |s| s.requests),
            base: self.stored.take(),
            at: self.now,
        };
        match cluster.write_record(&write).await {
            Ok(stored) => {
                self.stored = Some(stored);
                Ok(())
            }
            Err(e) => {
                self.stored = write.base;
                Err(e)
            }
        }
    }

    /// Record `progress` on the node (no other call).
    pub(super) async fn note<C: Cluster>(
        &mut self,
        cluster: &C,
        progress: &NodeProgress,
    ) -> Result<(), C::Error> {
        let r = self.record().with_progress(Some(progress.clone()));
        self.write(cluster, r).await
    }

    async fn cordon<C: Cluster>(
        &mut self,
        cluster: &C,
        record: NodeRecord,
    ) -> Result<(), C::Error> {
        let claimed = record
            .progress
            .as_ref()
            .is_some_and(|p| p.cordoned_by_drover);
        if self.stored.as_ref().is_none_or(|s| s.record != record) {
            self.write(cluster, record.clone()).await?;
        }
        if cluster.cordon(self.name).await? == Cordoned::Already && claimed {
            // Someone cordoned it between the observation and the cordon:
            // not drover's, so drover never uncordons it.
            let mut r = record;
            if let Some(p) = r.progress.as_mut() {
                p.cordoned_by_drover = false;
            }
            tracing::warn!(
                node = self.name,
                "node already cordoned; recording that drover did not"
            );
            self.write(cluster, r).await?;
        }
        Ok(())
    }

    async fn start<C: Cluster>(
        &mut self,
        cluster: &C,
        progress: &NodeProgress,
    ) -> Result<(), C::Error> {
        let mut r = self.record();
        if !r.links_run_of(progress) {
            // A record that does not name this run: named first. No record
            // drover writes reaches here today (every write that starts a
            // state with a run plans that run: `NodeRecord::start`,
            // `retarget`, the migration), so this only guards the rule that
            // nothing runs that the record does not name.
            r = r.planned_for(progress);
            self.write(cluster, r.clone()).await?;
        }
        match RunStart::of(&r, progress) {
            Some(start) => cluster.start_run(self.name, &start).await,
            None => Ok(()),
        }
    }

    async fn stop<C: Cluster>(&mut self, cluster: &C, record: NodeRecord) -> Result<(), C::Error> {
        let r = record.stopping();
        self.write(cluster, r.clone()).await?;
        match &r.run {
            Some(run) => cluster.stop_run(self.name, run).await,
            None => Ok(()),
        }
    }

    async fn give_back<C: Cluster>(
        &mut self,
        cluster: &C,
        uncordon: bool,
        record: NodeRecord,
    ) -> Result<(), C::Error> {
        if uncordon {
            cluster.uncordon(self.name).await?;
        }
        self.write(cluster, record).await
    }
}

/// `started` (a drain's first record) with the pre-drain taint recorded as
/// used, when a rule asks for one and the node is schedulable; `None` when
/// the node is cordoned at once.
pub(super) fn taint_rung(
    rules: &[DrainRule],
    started: &NodeRecord,
    view: Option<&NodeView>,
) -> Option<NodeRecord> {
    let lead = crate::config::taint_lead(rules);
    let rule = rules.iter().find(|r| r.taint == Some(lead))?;
    let p = started.progress.as_ref()?;
    if lead.is_zero() || view.is_some_and(|v| v.unschedulable) {
        return None;
    }
    let detail = format!(
        "tainted {}:{} {} before the cordon",
        crate::config::DRAIN_TAINT,
        crate::config::DRAIN_TAINT_EFFECT,
        humantime::format_duration(lead)
    );
    let used = RungUse {
        rung: crate::config::RungKind::Taint,
        rule: rule.name.clone(),
        version: p.run_version().clone(),
        attempt: started.attempt,
        detail,
    };
    Some(
        started
            .with_rungs(&[used])
            .unwrap_or_else(|| started.clone()),
    )
}

/// Whether the run named `observed` belongs to `record`'s attempt (its
/// run, or the prepare of the attempt its drain continues).
fn same_attempt(record: &NodeRecord, observed: Option<&str>) -> bool {
    let Some(observed) = observed else {
        return false;
    };
    let attempt = record.attempt;
    record.run.as_ref().is_some_and(|r| r.name == observed)
        || [
            crate::record::RunAction::Prepare,
            crate::record::RunAction::Upgrade,
            crate::record::RunAction::Rollback,
        ]
        .into_iter()
        .any(|a| crate::record::run_name(&record.node, &record.id, attempt, a) == observed)
}

/// Apply one action about the node of `calls`; returns the eviction pass
/// for `Evict`.
pub(super) async fn apply_on<C: Cluster>(
    cluster: &C,
    action: &Action,
    calls: &mut NodeCalls<'_>,
) -> Result<Option<EvictionPass>, EngineError<C::Error>> {
    let err = |source| EngineError::Apply {
        action: action.kind(),
        node: action.node().to_string(),
        source,
    };
    tracing::info!(action = action.kind(), node = action.node(), "apply");
    let record = calls.record();
    let with = |p: Option<&NodeProgress>| record.with_progress(p.cloned());
    match action {
        Action::Cordon { progress, .. } => {
            let r = record.start(progress.clone());
            match taint_rung(calls.rules, &r, calls.view) {
                // The pre-drain taint first: recorded with the drain's
                // start, the cordon a later step's once its lead is over.
                Some(r) => {
                    calls.write(cluster, r).await.map_err(err)?;
                    cluster.taint(action.node()).await
                }
                None => calls.cordon(cluster, r).await,
            }
        }
        Action::Taint { node } => cluster.taint(node).await,
        Action::Prepare { progress, .. } => {
            let r = record.start(progress.clone());
            calls.write(cluster, r).await.map_err(err)?;
            calls.start(cluster, progress).await
        }
        Action::Evict { node, cordoned_at } => {
            let since_cordon = (calls.now - *cordoned_at).to_std().unwrap_or_default();
            // One mark per drain: the cordon's time, the node and the
            // attempt (two nodes may be cordoned in the same second).
            let mark = format!(
                "{} drover {node} attempt {}",
                cordoned_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                calls.record().attempt
            );
            let order = DrainOrder {
                rules: calls.rules,
                since_cordon,
                mark: &mark,
            };
            return cluster.evict(node, &order).await.map(Some).map_err(err);
        }
        Action::StartUpgrade { progress, .. } => calls.start(cluster, progress).await,
        Action::Block {
            progress, uncordon, ..
        }
        | Action::Watch {
            progress, uncordon, ..
        } => {
            calls
                .give_back(cluster, *uncordon, with(Some(progress)))
                .await
        }
        Action::Fail {
            progress,
            uncordon,
            stop_run,
            ..
        } => {
            if *stop_run {
                calls.stop(cluster, with(Some(progress))).await
            } else {
                calls
                    .give_back(cluster, *uncordon, with(Some(progress)))
                    .await
            }
        }
        Action::Complete { uncordon, .. } | Action::GiveBack { uncordon, .. } => {
            calls.give_back(cluster, *uncordon, with(None)).await
        }
        Action::Release { progress, .. } => {
            calls.give_back(cluster, true, with(Some(progress))).await
        }
        Action::Retarget { progress, .. } => {
            let r = with(Some(progress)).retarget(&progress.target);
            calls.write(cluster, r).await
        }
        Action::ClearRolledBack { .. } => calls.write(cluster, record.with_rolled_back(&[])).await,
        Action::Consent { hold, .. } => calls.write(cluster, record.with_consent(*hold)).await,
        Action::CordonAgain { .. } => {
            let mut r = record;
            if let Some(p) = r.progress.as_mut() {
                p.cordoned_by_drover = true;
            }
            calls.cordon(cluster, r).await
        }
        Action::StopRun { node } => match &record.run {
            Some(run) => cluster.stop_run(node, run).await,
            None => Ok(()),
        },
        Action::Pass { progress, .. }
        | Action::Unhealthy { progress, .. }
        | Action::Note { progress, .. } => calls.write(cluster, with(Some(progress))).await,
        Action::RollBack { progress, .. } => {
            let r = record.start(progress.clone());
            if calls.view.is_some_and(|v| v.unschedulable) {
                calls.write(cluster, r).await
            } else {
                calls.cordon(cluster, r).await
            }
        }
        Action::RolledBack {
            progress,
            rolled_back,
            uncordon,
            ..
        } => {
            let r = with(Some(progress)).with_rolled_back(rolled_back);
            calls.give_back(cluster, *uncordon, r).await
        }
        Action::RollbackFailed {
            progress, stop_run, ..
        } => {
            if *stop_run {
                calls.stop(cluster, with(Some(progress))).await
            } else {
                calls.write(cluster, with(Some(progress))).await
            }
        }
        Action::Clear { stop_run, .. } => {
            if *stop_run {
                calls.stop(cluster, with(None)).await
            } else {
                calls.write(cluster, with(None)).await
            }
        }
    }
    .map_err(err)?;
    Ok(None)
}

/// Apply one action on `cluster` as a step would, from the node's view in
/// `nodes` (what the decision read).
pub async fn apply<C: Cluster>(
    cluster: &C,
    action: &Action,
    nodes: &[NodeView],
    now: DateTime<Utc>,
) -> Result<Option<EvictionPass>, EngineError<C::Error>> {
    let view = nodes.iter().find(|n| n.name == action.node());
    let mut calls = NodeCalls::new(action.node(), view, now);
    apply_on(cluster, action, &mut calls).await
}

/// `record` as a write to a node observed as `view` carries it: the uid of
/// its run once seen, and what the stored record's run said when it ended
/// when `record` is of that run's attempt (the next write after the run
/// ended: a give-back, or a staged node's drain). Pure, so what a write
/// carries is tested without a cluster.
fn as_written(view: Option<&NodeView>, record: NodeRecord) -> NodeRecord {
    // The uid observed is the one of the run the stored record links.
    let observed_run = view
        .and_then(|v| v.record.as_ref())
        .and_then(|s| s.record.run.as_ref())
        .map(|r| r.name.as_str());
    let uid = view
        .and_then(|v| v.run_uid.as_deref())
        .filter(|_| record.run.as_ref().map(|r| r.name.as_str()) == observed_run);
    // What the stored record's run said when it ended, once read: a
    // write of the same attempt carries it (the next one after the run
    // ended: a give-back, or a staged node's drain).
    let said = view
        .and_then(|v| v.driver_said.as_ref())
        .filter(|d| Some(d.run.as_str()) == observed_run);
    let record = match said {
        Some(d) if !record.heard_from(&d.run) && same_attempt(&record, observed_run) => {
            record.driver_said(d)
        }
        _ => record,
    };
    record.run_seen(uid)
}

#[cfg(test)]
mod tests {
    use super::{as_written, same_attempt};
    use crate::record::{run_name, DriverRun, NodeRecord, RunAction};
    use crate::rollout::drain_tests::draining;

    #[test]
    fn a_run_belongs_to_the_attempt_it_was_named_for_and_no_other() {
        // What a run said when it ended goes into a write of its own
        // attempt only: a new attempt's record starts without the last
        // one's words (its retries, its failure).
        let view = draining(true, &[]);
        let first = view.record.expect("a record").record;
        let progress = first.progress.clone().expect("draining");
        let second = first.start(progress);
        assert_eq!(second.attempt, first.attempt + 1);
        let named = |r: &NodeRecord, a| run_name("a", "id", r.attempt, a);
        let own = first.run.as_ref().map(|r| r.name.clone());
        assert!(same_attempt(&first, own.as_deref()));
        assert!(same_attempt(
            &first,
            Some(&named(&first, RunAction::Upgrade))
        ));
        assert!(same_attempt(
            &second,
            Some(&named(&second, RunAction::Prepare))
        ));
        assert!(!same_attempt(
            &second,
            Some(&named(&first, RunAction::Upgrade))
        ));
        assert!(!same_attempt(&second, own.as_deref()));
        assert!(!same_attempt(&second, None));
    }

    #[test]
    fn a_write_carries_what_the_stored_records_own_run_said_and_its_uid() {
        // `a`'s record links its run; the run ended saying it retried once,
        // and its uid was seen. A write of that attempt carries both.
        let mut view = draining(true, &[]);
        let first = view.record.clone().expect("a record").record;
        let own = first.run.as_ref().expect("a run").name.clone();
        view.driver_said = Some(DriverRun::new(own.clone(), [("refresh".into(), 1)]));
        view.run_uid = Some("uid-1".into());
        let written = as_written(Some(&view), first.clone());
        assert!(written.heard_from(&own), "{:?}", written.driver_runs);
        assert_eq!(
            written.run.as_ref().and_then(|r| r.uid.as_deref()),
            Some("uid-1")
        );
        // Control: what another run said (its name is not the stored
        // record's run) is not carried into the attempt.
        let other = run_name("a", "id", first.attempt, RunAction::Prepare);
        view.driver_said = Some(DriverRun::new(other.clone(), [("refresh".into(), 1)]));
        let written = as_written(Some(&view), first.clone());
        assert!(!written.heard_from(&other), "{:?}", written.driver_runs);
        // Nor into a new attempt's record.
        view.driver_said = Some(DriverRun::new(own.clone(), [("refresh".into(), 1)]));
        let second = first.start(first.progress.clone().expect("draining"));
        assert!(!as_written(Some(&view), second).heard_from(&own));
    }
}
