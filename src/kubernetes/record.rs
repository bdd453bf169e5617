//! drover's node records on the API server: one `DroverNode` per node in
//! the agent's namespace (`record::wire::DroverNode`), labelled with the
//! agent's environment and cluster, written by the agent alone (its Role,
//! and the admission policy of `deploy/base`) in one request per
//! transition: created the first time, then a merge patch of the whole
//! record conditional on the `resourceVersion` the decision read. A write
//! that meets a change of the annotations only (a person asking for a
//! retry) is made again on the new version; one that meets a record it did
//! not read fails, and the node waits for the next step.

use super::objects::{linked, pod_finished, RUN_LABEL};
use super::observe::{lock, newer, trim_record, Observer};
use super::{is_status, Error, FIELD_MANAGER};
use crate::cluster::{LinkedRun, NodeRecord, RecordError, RecordWrite, Stored};
use crate::record::legacy::{self, LegacyNode};
use crate::record::wire::{self, DroverNode, DroverNodeStatus};
use crate::record::{CLUSTER_LABEL, ENVIRONMENT_LABEL, PERSON_ANNOTATIONS};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::sync::LazyLock;

/// The record `obj` stores, with what a write to it builds on.
pub(crate) fn stored(obj: &DroverNode) -> Result<Stored, RecordError> {
    let record = wire::decode(&obj.spec, obj.status.as_ref())?;
    Ok(Stored {
        record,
        resource_version: obj.resource_version().unwrap_or_default(),
        generation: obj.metadata.generation.unwrap_or(0),
        conditions: obj
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
        requests: wire::requests(obj.annotations()),
    })
}

/// The status with an explicit null for every field of the type it leaves
/// out, and of its run, so that a merge patch of the whole record removes
/// what the new record no longer holds (a cleared target, a message gone,
/// a consent hold released, a new attempt's empty driver runs; a merge
/// patch merges the run object key by key, so a new run must remove the
/// last one's uid). The fields are read from the types' schemas, so none
/// is missed.
fn whole(status: &DroverNodeStatus) -> Value {
    /// A type's fields as its schema names them, read once per process,
    /// not once per write.
    fn keys<T: schemars::JsonSchema>() -> Vec<String> {
        let schema = schemars::schema_for!(T);
        let props = schema.get("properties").and_then(|p| p.as_object());
        props.into_iter().flat_map(|p| p.keys().cloned()).collect()
    }
    static STATUS: LazyLock<Vec<String>> = LazyLock::new(keys::<DroverNodeStatus>);
    static RUN: LazyLock<Vec<String>> = LazyLock::new(keys::<wire::RunStatus>);
    let fill = |map: &mut serde_json::Map<String, Value>, keys: &[String]| {
        for key in keys {
            map.entry(key.clone()).or_insert(Value::Null);
        }
    };
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Value::Object(map) = &mut value {
        fill(map, &STATUS);
        if let Some(Value::Object(run)) = map.get_mut("run") {
            fill(run, &RUN);
        }
    }
    value
}

/// Write `w` (see the module docs); returns the record as stored.
pub async fn write(obs: &Observer, w: &RecordWrite) -> Result<Stored, Error> {
    let node = w.record.node.clone();
    let api: Api<DroverNode> = Api::namespaced(obs.client.clone(), &obs.opts.records_namespace);
    let err = |call: &str, source| Error::Node {
        node: node.clone(),
        call: format!("{call} drovernode {}/{node}", obs.opts.records_namespace),
        source,
    };
    let conflict = || Error::RecordChanged { node: node.clone() };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let status = w.status();
    let written = match &w.base {
        None => {
            let mut obj = DroverNode::new(
                &node,
                wire::spec(&w.record, &obs.opts.environment, &obs.opts.cluster_name),
            );
            obj.metadata.namespace = Some(obs.opts.records_namespace.clone());
            obj.metadata.labels = Some(
                [
                    (ENVIRONMENT_LABEL.to_string(), obs.opts.environment.clone()),
                    (CLUSTER_LABEL.to_string(), obs.opts.cluster_name.clone()),
                ]
                .into(),
            );
            obj.status = Some(status);
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            match api.create(&pp, &obj).await {
                Ok(o) => o,
                Err(e) if is_status(&e, 409) => return Err(conflict()),
                Err(e) => return Err(err("create", e)),
            }
        }
        Some(base) => {
            let consumed: serde_json::Map<String, Value> = PERSON_ANNOTATIONS
                .iter()
                .zip([w.consume.retry, w.consume.clear_rolled_back])
                .filter(|(_, on)| *on)
                .map(|(k, _)| (k.to_string(), Value::Null))
                .collect();
            let mut rv = base.resource_version.clone();
            let mut written = None;
            for _ in 0..2 {
                let patch = json!({
                    "metadata": { "resourceVersion": rv, "annotations": consumed },
                    "status": whole(&status),
                });
                match api.patch(&node, &params, &Patch::Merge(&patch)).await {
                    Ok(o) => {
                        written = Some(o);
                        break;
                    }
                    Err(e) if is_status(&e, 409) => {
                        // A person's annotation changes the version, not
                        // the record: made again on the new one.
                        let fresh = api.get(&node).await.map_err(|e| err("get", e))?;
                        match stored(&fresh) {
                            Ok(s) if s.record == base.record => {
                                rv = fresh.resource_version().unwrap_or_default();
                            }
                            _ => return Err(conflict()),
                        }
                    }
                    Err(e) if is_status(&e, 404) => return Err(conflict()),
                    Err(e) => return Err(err("patch", e)),
                }
            }
            written.ok_or_else(conflict)?
        }
    };
    let mut written = written;
    trim_record(&mut written);
    let s = stored(&written).map_err(|e| Error::BadRecord {
        node: node.clone(),
        why: e.to_string(),
    })?;
    tracing::info!(node = %node, phase = %written.status.as_ref().map_or("", |s| s.phase.as_str()), "record written");
    obs.wrote_record(written);
    Ok(s)
}

/// The records as the observation reads them: the store's copy, or the
/// agent's own newer write until the watch shows it; the run a record
/// links to; and, for the one migration, what earlier releases left.
impl Observer {
    /// Record a node's record as written by us.
    pub(crate) fn wrote_record(&self, record: DroverNode) {
        lock(&self.record_overlay).insert(record.name_any(), Arc::new(record));
    }

    /// The newest copy of `node`'s record we know of: the store's or our own write's.
    pub(super) fn record_object(&self, node: &str) -> Option<Arc<DroverNode>> {
        let stored = self
            .records
            .get(&ObjectRef::new(node).within(&self.opts.records_namespace));
        let mut overlay = lock(&self.record_overlay);
        match (stored, overlay.get(node)) {
            (Some(s), Some(o)) if newer(o.as_ref(), s.as_ref()) => Some(o.clone()),
            (Some(s), Some(_)) => {
                overlay.remove(node);
                Some(s)
            }
            (None, Some(o)) => Some(o.clone()),
            (s, None) => s,
        }
    }

    /// `node`'s record, as stored.
    pub(crate) fn stored_record(&self, node: &str) -> Option<Result<Stored, RecordError>> {
        self.record_object(node).map(|o| super::record::stored(&o))
    }

    /// `node`'s record, if readable.
    pub(crate) fn record(&self, node: &str) -> Option<NodeRecord> {
        self.stored_record(node)?.ok().map(|s| s.record)
    }

    /// The run `record` links to, as the Jobs (and, for a run drover
    /// stopped, its pods) show it; `Err` when the pods of a stopped run
    /// cannot be listed.
    pub(super) async fn linked(&self, record: &NodeRecord) -> Result<LinkedRun, Error> {
        let Some(link) = &record.run else {
            return Ok(LinkedRun::None);
        };
        let job = self.job(&link.name).filter(|j| !self.is_deleted(j));
        let found = linked(job.as_deref(), &record.id, link);
        if found != LinkedRun::Stopped {
            return Ok(found);
        }
        // The Job is gone; its pods may not be yet.
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.opts.namespace);
        let pods = api
            .list(&ListParams::default().labels(&format!("{RUN_LABEL}={}", link.name)))
            .await
            .map_err(|source| Error::Node {
                node: record.node.clone(),
                call: format!("list pods of stopped run {}", link.name),
                source,
            })?;
        Ok(if pods.items.iter().all(pod_finished) {
            LinkedRun::Stopped
        } else {
            LinkedRun::Stopping
        })
    }

    /// What earlier releases left on the selected nodes (their annotation
    /// records, and the node's drover Jobs with what they say), for the
    /// one migration.
    pub fn legacy(&self) -> Vec<LegacyNode> {
        self.current_nodes()
            .into_iter()
            .filter(|n| !n.annotations().is_empty())
            .map(|n| {
                let name = n.name_any();
                let runs = self
                    .jobs_of(&name)
                    .iter()
                    .filter_map(|j| {
                        legacy::run(
                            &j.name_any(),
                            &j.uid().unwrap_or_default(),
                            &j.legacy_annotations(),
                        )
                    })
                    .collect();
                LegacyNode {
                    node: name,
                    annotations: n.annotations().clone(),
                    unschedulable: n.unschedulable,
                    version: self.opts.nodes.version_of(&n.os_image),
                    runs,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{NodeProgress, NodeRecord, ProgressState};

    #[test]
    fn a_whole_record_patch_names_every_status_field() {
        // Every field set: what the merge patch must be able to remove.
        let p = NodeProgress {
            state: ProgressState::RollingBack,
            target: semver::Version::new(1, 13, 0),
            started_at: "2026-12-08T02:00:00Z".parse().unwrap(),
            cordoned_by_drover: true,
            message: "m".into(),
            retries: 1,
            previous: Some(semver::Version::new(1, 12, 0)),
        };
        let started = NodeRecord::new("a", "i").start(p);
        let run = started.run.clone().unwrap().name;
        let r = started
            .with_rolled_back(&[semver::Version::new(1, 11, 0)])
            .driver_said(&crate::record::DriverRun::new(run, [("refresh".into(), 1)]))
            .with_rungs(&[crate::record::RungUse {
                rung: crate::record::RungKind::Wait,
                rule: "r".into(),
                version: semver::Version::new(1, 13, 0),
                attempt: 1,
                detail: "d".into(),
            }])
            .unwrap()
            .with_consent(Some(crate::record::ConsentHold {
                since: "2026-12-08T01:00:00Z".parse().unwrap(),
                overdue: true,
            }));
        let at = "2026-12-08T02:00:00Z".parse().unwrap();
        let full = wire::encode(&r, 1, &[], at);
        let keys: Vec<String> = match serde_json::to_value(&full).unwrap() {
            Value::Object(m) => m.keys().cloned().collect(),
            _ => unreachable!(),
        };
        // A fresh idle record written over it removes every one of them.
        let blank = whole(&wire::encode(&NodeRecord::new("a", "i2"), 2, &[], at));
        for k in &keys {
            assert!(
                blank.get(k).is_some(),
                "{k} is left out of the whole-record patch: the stored one would be kept"
            );
        }
        assert_eq!(blank["target"], Value::Null);
        assert_eq!(blank["consentHeldSince"], Value::Null);
        assert_eq!(blank["driverRuns"], Value::Null);
        assert_eq!(blank["phase"], json!("idle"));
    }
}
