//! The simulated cluster as the engine drives it ([`Cluster`]): Nodes
//! (their cordon), drover's records (written only here, with the
//! Kubernetes backend's encoding), driver runs named by the records and
//! accepted by the record id and attempt they carry, evictions through the
//! budgets, and health read from the injected faults.

use super::{
    CallFault, CordonedBy, Event, EventKind, Failure, HealthFault, Run, Sim, SimError, SimRecord,
    State, STOP_GRACE,
};
use crate::cluster::{
    Cluster, Cordoned, EvictionPass, LinkedRun, NodeSeen, NodeView, PodSeen, RecordWrite,
    RunAction, RunLink, RunStart, Stored, UpgradeStatus,
};
use crate::record::legacy::{self, LegacyNode};
use crate::record::wire;
use crate::rollout::Clock;
use chrono::{DateTime, Utc};

impl State {
    /// The record of `node` as stored, for a view.
    fn stored(&self, node: &str) -> Option<Result<Stored, crate::cluster::RecordError>> {
        let r = self.records.get(node)?;
        Some(wire::decode(&r.spec, Some(&r.status)).map(|record| Stored {
            record,
            resource_version: r.resource_version.to_string(),
            generation: r.generation,
            conditions: r.status.conditions.clone(),
            requests: wire::requests(&r.annotations),
        }))
    }

    /// What the sim has of the run `link` names on `node`.
    fn linked(
        &self,
        node: &str,
        record_id: &str,
        link: Option<&RunLink>,
        now: DateTime<Utc>,
    ) -> LinkedRun {
        let Some(link) = link else {
            return LinkedRun::None;
        };
        let Some(n) = self.nodes.get(node) else {
            return LinkedRun::Missing;
        };
        let named: Vec<&Run> = n.runs.iter().filter(|r| r.name == link.name).collect();
        if link.stopped {
            return if named.iter().any(|r| !r.deleted) {
                LinkedRun::StopPending
            } else if named.iter().any(|r| r.may_act(now)) {
                LinkedRun::Stopping
            } else {
                LinkedRun::Stopped
            };
        }
        let Some(r) = named.into_iter().find(|r| !r.deleted) else {
            return LinkedRun::Missing;
        };
        if r.record_id != record_id || r.attempt != link.attempt {
            return LinkedRun::Foreign(format!(
                "it carries record {} attempt {}",
                r.record_id, r.attempt
            ));
        }
        if link.uid.as_ref().is_some_and(|u| *u != r.uid) {
            return LinkedRun::Foreign(format!("its uid is {}", r.uid));
        }
        LinkedRun::Found {
            uid: r.uid.clone(),
            version: r.target.clone(),
            status: r.status.clone(),
        }
    }

    fn count_and_check(
        &mut self,
        call: &str,
        node: &str,
        fault: CallFault,
        now: DateTime<Utc>,
    ) -> Result<(), SimError> {
        if let Some(left) = self.calls_before_crash.as_mut() {
            if *left == 0 {
                return Err(SimError::Crashed(call.to_string()));
            }
            *left -= 1;
        }
        self.settle(now);
        self.count(call, node);
        self.node(node)?;
        self.check(node, fault, now)
    }
}

impl Cluster for Sim {
    type Error = SimError;

    fn name(&self) -> &str {
        &self.name
    }

    async fn observe(&self) -> Result<Vec<NodeView>, SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        s.observed = Some(now);
        let s = &*s;
        Ok(s.nodes
            .values()
            .map(|n| {
                let stored = s.stored(&n.name);
                let linked = match &stored {
                    Some(Ok(st)) => s.linked(&n.name, &st.record.id, st.record.run.as_ref(), now),
                    _ => LinkedRun::None,
                };
                let mut view = NodeView::of_record(
                    n.name.clone(),
                    n.version.clone(),
                    n.ready,
                    n.unschedulable,
                    stored,
                    &linked,
                );
                let unlisted = s.in_flight(&n.name) && s.faulty(&n.name, CallFault::Observe, now);
                // What a backend reports when the list failed: no count.
                view.pods_to_evict = if unlisted { 0 } else { n.pods.len() };
                view.drain_tainted = n.drain_tainted;
                view.consent_paused = n.consent_paused;
                if unlisted {
                    view.fault = Some("injected: its pods cannot be listed".to_string());
                }
                // The same test as an eviction's, for every pod left.
                view.budgets_allow_drain = !unlisted
                    && n.pods.iter().all(|pod| {
                        pod.pdb
                            .as_ref()
                            .and_then(|name| s.pdbs.get(name).map(|b| (name, b)))
                            .is_none_or(|(name, b)| {
                                b.blocked_until.is_none_or(|t| now >= t)
                                    && s.healthy(name) > b.min_available
                            })
                    });
                view.ignored = n
                    .annotations
                    .iter()
                    .filter(|(k, _)| legacy::ALL_ANNOTATIONS.contains(&k.as_str()))
                    .take(crate::cluster::MAX_IGNORED)
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                view
            })
            .collect())
    }

    async fn write_record(&self, write: &RecordWrite) -> Result<Stored, SimError> {
        let now = self.clock.now();
        let node = write.record.node.clone();
        let mut s = self.lock();
        s.count_and_check("write_record", &node, CallFault::Write, now)?;
        let current = s.records.get(&node).map(|r| r.resource_version.to_string());
        let expected = write.base.as_ref().map(|b| b.resource_version.clone());
        if current != expected {
            return Err(SimError::Conflict(node));
        }
        s.revision += 1;
        let rv = s.revision;
        let mut annotations = s
            .records
            .get(&node)
            .map(|r| r.annotations.clone())
            .unwrap_or_default();
        if write.consume.retry {
            annotations.remove(crate::record::ANN_RETRY);
        }
        if write.consume.clear_rolled_back {
            annotations.remove(crate::record::ANN_CLEAR_ROLLED_BACK);
        }
        let stored = SimRecord {
            spec: wire::spec(&write.record, "", &self.name),
            status: write.status(),
            annotations,
            resource_version: rv,
            generation: write.generation(),
        };
        s.records.insert(node.clone(), stored);
        s.measure();
        s.stored(&node)
            .and_then(Result::ok)
            .ok_or(SimError::NoSuchNode(node))
    }

    async fn cordon(&self, node: &str) -> Result<Cordoned, SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.count_and_check("cordon", node, CallFault::Write, now)?;
        let n = s.node(node)?;
        let (kind, was) = if n.unschedulable {
            (EventKind::Adopt, Cordoned::Already)
        } else {
            n.unschedulable = true;
            n.cordoned_by = Some(CordonedBy::Drover);
            (EventKind::Cordon, Cordoned::ByDrover)
        };
        s.log.push(Event {
            at: now,
            node: node.into(),
            kind,
        });
        s.measure();
        Ok(was)
    }

    async fn taint(&self, node: &str) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.count_and_check("taint", node, CallFault::Write, now)?;
        s.node(node)?.drain_tainted = true;
        Ok(())
    }

    async fn uncordon(&self, node: &str) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.count_and_check("uncordon", node, CallFault::Write, now)?;
        let n = s.node(node)?;
        n.drain_tainted = false;
        let by = n.cordoned_by;
        let acting = n.runs.iter().any(|r| r.may_act(now));
        n.unschedulable = false;
        n.cordoned_by = None;
        if by == Some(CordonedBy::Other) {
            s.violations.push(format!(
                "{now}: uncordoned {node}, which someone else cordoned"
            ));
        }
        if acting {
            s.violations.push(format!(
                "{now}: uncordoned {node} while a driver run may still act on it"
            ));
        }
        s.log.push(Event {
            at: now,
            node: node.into(),
            kind: EventKind::Uncordon,
        });
        s.place_pending();
        s.measure();
        Ok(())
    }

    /// The simulation's pods carry no namespace nor labels: every pod is
    /// evicted, whatever `order`'s rules say (the rungs are the Kubernetes
    /// backend's, tested against the real API server).
    async fn evict(
        &self,
        node: &str,
        _order: &crate::cluster::DrainOrder<'_>,
    ) -> Result<EvictionPass, SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.count_and_check("evict", node, CallFault::Evict, now)?;
        let mut blocked_by = Vec::new();
        let mut refused_pods = Vec::new();
        let mut i = 0;
        while i < s.node(node)?.pods.len() {
            let pod = s.nodes[node].pods[i].clone();
            let allowed = match pod
                .pdb
                .as_ref()
                .and_then(|name| s.pdbs.get(name).map(|p| (name, p)))
            {
                None => true,
                Some((name, pdb)) => {
                    pdb.blocked_until.is_none_or(|t| now >= t)
                        && s.healthy(name) > pdb.min_available
                }
            };
            if !allowed {
                refused_pods.push(pod.name.clone());
                if let Some(p) = pod.pdb {
                    if !blocked_by.contains(&p) {
                        blocked_by.push(p);
                    }
                }
                i += 1;
                continue;
            }
            s.node(node)?.pods.remove(i);
            s.log.push(Event {
                at: now,
                node: node.into(),
                kind: EventKind::Evicted(pod.name.clone()),
            });
            s.place(pod, node);
        }
        let remaining = s.node(node)?.pods.len();
        Ok(EvictionPass {
            remaining,
            blocked_by,
            refused_pods,
            rungs: Vec::new(),
        })
    }

    async fn start_run(&self, node: &str, start: &RunStart) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.count_and_check("start_run", node, CallFault::Start, now)?;
        let run = &start.run;
        let n = s.node(node)?;
        if let Some(r) = n.runs.iter().find(|r| r.name == run.name && !r.deleted) {
            // 409: accepted only when it carries this record and attempt.
            return if r.record_id == start.record_id && r.attempt == run.attempt {
                Ok(())
            } else {
                Err(SimError::Foreign(run.name.clone()))
            };
        }
        if n.runs.iter().any(|r| {
            r.record_id == start.record_id && r.attempt == run.attempt && r.action == run.action
        }) {
            s.violations.push(format!(
                "{now}: a second {} run on {node} for attempt {}",
                run.action.as_str(),
                run.attempt
            ));
        }
        let n = s.node(node)?;
        let uid = format!("{}-{}", run.name, n.runs.len());
        let base = Run {
            name: run.name.clone(),
            uid,
            record_id: start.record_id.clone(),
            attempt: run.attempt,
            action: run.action,
            target: run.version.clone(),
            done_at: Some(now),
            status: UpgradeStatus::Succeeded,
            deleted: false,
            stopping_until: None,
            failure: n.next_failure(run.action),
            failed_at: None,
        };
        if run.action == RunAction::Prepare {
            // The download: no reboot, no drain needed, done at once, or
            // failed at once where the test says its repository lacks the
            // target.
            let status = match &base.failure {
                Some(Failure::DriverFails(m)) => UpgradeStatus::Failed(m.clone()),
                _ => UpgradeStatus::Succeeded,
            };
            let failed_at = base.failure.is_some().then_some(now);
            n.runs.push(Run {
                status,
                failed_at,
                ..base
            });
            return Ok(());
        }
        if !n.pods.is_empty() {
            let pods = n.pods.len();
            s.violations.push(format!(
                "{now}: driver started on {node}, which still runs {pods} pods"
            ));
        }
        let n = s.node(node)?;
        let done = chrono::Duration::from_std(n.node_time)
            .ok()
            .and_then(|d| now.checked_add_signed(d));
        let (done_at, reboots) = match base.failure {
            Some(Failure::NeverReturns) => (None, true),
            Some(Failure::DriverFails(_)) => (done, false),
            _ => (done, true),
        };
        if reboots {
            n.ready = false;
            n.down_by_drover = true;
        }
        n.runs.push(Run {
            done_at,
            status: UpgradeStatus::Running,
            ..base
        });
        s.log.push(Event {
            at: now,
            node: node.into(),
            kind: if run.action == RunAction::Rollback {
                EventKind::RollbackStart(run.version.clone())
            } else {
                EventKind::DriverStart(run.version.clone())
            },
        });
        s.measure();
        Ok(())
    }

    async fn stop_run(&self, node: &str, run: &RunLink) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.count_and_check("stop_run", node, CallFault::Write, now)?;
        let stop = chrono::Duration::from_std(STOP_GRACE).unwrap_or_default();
        for r in s.node(node)?.runs.iter_mut().filter(|r| r.name == run.name) {
            if !r.deleted && r.status == UpgradeStatus::Running {
                r.stopping_until = Some(now + stop);
            }
            r.deleted = true;
        }
        Ok(())
    }

    async fn health(&self, nodes: &[String]) -> Result<Vec<NodeSeen>, SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.settle(now);
        Ok(nodes
            .iter()
            .filter_map(|name| s.nodes.get(name))
            .map(|n| {
                if s.faulty(&n.name, CallFault::Health, now) {
                    return NodeSeen::unread(n.name.clone(), "injected: cannot read its health");
                }
                // When its last upgrade brought it back: the fault shows from then.
                let returned = n
                    .runs
                    .iter()
                    .filter(|r| r.status == UpgradeStatus::Succeeded && r.action.moves_node())
                    .filter_map(|r| r.done_at)
                    .max();
                let fault = match (&n.health_fault, returned) {
                    (Some((v, f)), Some(_)) if n.version.as_ref() == Some(v) => Some(f),
                    _ => None,
                };
                let returned = returned.unwrap_or(DateTime::<Utc>::MIN_UTC);
                let mut pods: Vec<PodSeen> = n
                    .pods
                    .iter()
                    .map(|p| PodSeen {
                        name: format!("default/{}", p.name),
                        created: DateTime::<Utc>::MIN_UTC,
                        ready: true,
                        restarts: 0,
                        waiting_reason: None,
                    })
                    .collect();
                let mut conditions = Vec::new();
                match fault {
                    Some(HealthFault::CrashLoop) => pods.push(PodSeen {
                        name: format!("default/{}-app", n.name),
                        created: returned,
                        ready: false,
                        restarts: 3,
                        waiting_reason: Some(crate::health::verdict::CRASHLOOP_REASON.into()),
                    }),
                    Some(HealthFault::Condition(t)) => conditions.push((t.clone(), "True".into())),
                    None => {}
                }
                NodeSeen {
                    name: n.name.clone(),
                    conditions,
                    pods,
                    unread: None,
                }
            })
            .collect())
    }

    async fn legacy(&self) -> Result<Vec<LegacyNode>, SimError> {
        let s = self.lock();
        Ok(s.nodes
            .values()
            .filter(|n| {
                n.annotations
                    .keys()
                    .any(|k| legacy::ALL_ANNOTATIONS.contains(&k.as_str()))
            })
            .map(|n| LegacyNode {
                node: n.name.clone(),
                annotations: n
                    .annotations
                    .iter()
                    .filter(|(k, _)| legacy::ALL_ANNOTATIONS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                unschedulable: n.unschedulable,
                version: n.version.clone(),
                runs: n.legacy_runs.clone(),
            })
            .collect())
    }

    async fn clear_legacy(&self, node: &str) -> Result<(), SimError> {
        let now = self.clock.now();
        let mut s = self.lock();
        s.count_and_check("clear_legacy", node, CallFault::Write, now)?;
        s.node(node)?
            .annotations
            .retain(|k, _| !legacy::ALL_ANNOTATIONS.contains(&k.as_str()));
        Ok(())
    }
}
