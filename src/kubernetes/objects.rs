//! What drover's objects look like, and nothing that talks to the API
//! server: the labels and annotation keys drover reads and writes on its
//! driver Jobs, the part of a Job drover keeps ([`ObservedJob`]), how a
//! Job's status reads and whether it is the run a record links to
//! ([`linked`]), which pods a drain must evict and which
//! PodDisruptionBudgets cover them. A leaf: [`super::observe`],
//! [`super::drain`] and [`super::driver`] all read it, it reads none of them.

use crate::cluster::{LinkedRun, RunLink, UpgradeStatus};
use crate::record::legacy;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;
use semver::Version;
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Label on every drover-managed object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "drover";
/// Label naming the node an upgrade Job is for.
pub const NODE_LABEL: &str = "drover.dev/node";
/// Label holding the version an upgrade Job moves its node to.
pub const TARGET_VERSION_LABEL: &str = "drover.dev/target-version";
/// Label of a driver Job: the attempt of the record it was made for.
pub const ATTEMPT_LABEL: &str = "drover.dev/attempt";
/// Label of a driver Job: the id of the record it was made for
/// (`record::NodeRecord::id`); with the attempt, what makes it that
/// record's run.
pub const RECORD_LABEL: &str = "drover.dev/record";
/// Label of a driver Job's pods: the Job's name (a stopped run's pods are
/// found by it).
pub const RUN_LABEL: &str = "drover.dev/run";

/// Annotation the kubelet puts on mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

fn owned_by_daemonset(pod: &Pod) -> bool {
    pod.owner_references().iter().any(|o| o.kind == "DaemonSet")
}

pub(crate) fn pod_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn drover_pod(pod: &Pod) -> bool {
    pod.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_VALUE)
}

/// Whether a drain waits for `pod` to be gone: everything but DaemonSet pods
/// (the DaemonSet would put them back), mirror pods (the API cannot remove
/// them), finished pods and drover's own upgrade pods. Terminating pods count
/// until they are gone.
pub fn must_evict(pod: &Pod) -> bool {
    !owned_by_daemonset(pod)
        && !pod.annotations().contains_key(MIRROR_ANNOTATION)
        && !pod_finished(pod)
        && !drover_pod(pod)
}

/// The PDBs in the pod's namespace whose selector matches it.
pub(crate) fn pdbs_matching(pdbs: &[Arc<PodDisruptionBudget>], pod: &Pod) -> Vec<String> {
    let ns = pod.namespace().unwrap_or_default();
    pdbs.iter()
        .filter(|p: &&Arc<PodDisruptionBudget>| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| {
            let Some(sel) = p.spec.as_ref().and_then(|s| s.selector.clone()) else {
                return false;
            };
            Selector::try_from(sel).is_ok_and(|s| s.matches(pod.labels()))
        })
        .map(|p| p.name_any())
        .collect()
}

/// Whether every PodDisruptionBudget covering a pod of `pods` that a drain
/// must evict allows a disruption now (a blocked node's retry may then come
/// before its backoff).
pub(crate) fn budgets_allow(pdbs: &[Arc<PodDisruptionBudget>], pods: &[Arc<Pod>]) -> bool {
    pods.iter().filter(|p| must_evict(p)).all(|pod| {
        let ns = pod.namespace().unwrap_or_default();
        pdbs_matching(pdbs, pod).iter().all(|name| {
            pdbs.iter()
                .find(|b| b.namespace().as_deref() == Some(ns.as_str()) && b.name_any() == *name)
                .and_then(|b| b.status.as_ref())
                .is_some_and(|s| s.disruptions_allowed.unwrap_or(0) > 0)
        })
    })
}

/// A label value for a version (`+` is not allowed in label values).
pub fn label_version(v: &Version) -> String {
    v.to_string().replace('+', "_")
}

/// Annotation of a driver's Job: its `DROVER_ACTION` (`upgrade`,
/// `rollback`, `prepare`).
pub const ACTION_ANNOTATION: &str = "drover.dev/action";
/// Annotation of a driver's Job: the version it installs (unlike the
/// label, not rewritten for label syntax).
pub const RUN_VERSION_ANNOTATION: &str = "drover.dev/target";

/// A driver Job as drover keeps it: finished Jobs stay until their
/// `ttlSecondsAfterFinished` (two per node upgraded, for days), so the
/// observation holds each in this form, a few hundred bytes: the API's
/// `Job` holds its spec inline (the pod template's `PodSpec`, over 2 KiB
/// even when emptied), and its labels and annotations in maps of their own.
/// What is kept: name, namespace, uid, resourceVersion, deletionTimestamp;
/// the labels and annotations drover reads; the `Complete` or `Failed`
/// condition that is `True`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "JobWire")]
pub struct ObservedJob {
    /// Name, namespace, uid, resourceVersion and deletionTimestamp only.
    pub metadata: ObjectMeta,
    /// [`NODE_LABEL`].
    pub node: Option<String>,
    /// [`RECORD_LABEL`].
    pub record: Option<String>,
    /// [`ATTEMPT_LABEL`].
    pub attempt: Option<String>,
    /// [`RUN_VERSION_ANNOTATION`].
    pub version: Option<String>,
    /// [`ACTION_ANNOTATION`].
    pub action: Option<String>,
    /// The annotations only earlier releases' Jobs carry (their started-at
    /// and previous version), for the one migration; empty otherwise.
    pub legacy: Vec<(String, String)>,
    /// Its `Complete` or `Failed` condition, when one is `True`.
    pub conditions: Vec<RunCondition>,
}

/// A Job's condition that is `True`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RunCondition {
    /// `Complete` or `Failed`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Its reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// Its message.
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Deserialize)]
struct JobWire {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<StatusWire>,
}

#[derive(Default, Deserialize)]
struct StatusWire {
    #[serde(default)]
    conditions: Vec<RunCondition>,
}

impl ObservedJob {
    fn of(meta: ObjectMeta, conditions: Vec<RunCondition>) -> ObservedJob {
        let mut labels = meta.labels.unwrap_or_default();
        let mut annotations = meta.annotations.unwrap_or_default();
        let legacy = [legacy::JOB_STARTED_AT, legacy::ANN_PREVIOUS]
            .into_iter()
            .filter_map(|k| Some((k.to_string(), annotations.remove(k)?)))
            .collect();
        ObservedJob {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                deletion_timestamp: meta.deletion_timestamp,
                ..ObjectMeta::default()
            },
            node: labels.remove(NODE_LABEL),
            record: labels.remove(RECORD_LABEL),
            attempt: labels.remove(ATTEMPT_LABEL),
            version: annotations.remove(RUN_VERSION_ANNOTATION),
            action: annotations.remove(ACTION_ANNOTATION),
            legacy,
            conditions: conditions
                .into_iter()
                .filter(|c| c.status == "True" && matches!(c.type_.as_str(), "Complete" | "Failed"))
                .collect(),
        }
    }

    /// The annotations an earlier release's run is read from
    /// (`record::legacy::run`).
    pub fn legacy_annotations(&self) -> BTreeMap<String, String> {
        let mut a: BTreeMap<String, String> = self.legacy.iter().cloned().collect();
        for (k, v) in [
            (legacy::JOB_VERSION, &self.version),
            (legacy::JOB_ACTION, &self.action),
        ] {
            if let Some(v) = v {
                a.insert(k.to_string(), v.clone());
            }
        }
        a
    }
}

impl From<JobWire> for ObservedJob {
    fn from(w: JobWire) -> Self {
        ObservedJob::of(w.metadata, w.status.unwrap_or_default().conditions)
    }
}

impl From<Job> for ObservedJob {
    fn from(job: Job) -> Self {
        let conditions = job
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| RunCondition {
                type_: c.type_,
                status: c.status,
                reason: c.reason,
                message: c.message,
            })
            .collect();
        ObservedJob::of(job.metadata, conditions)
    }
}

impl kube::Resource for ObservedJob {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Job".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "batch".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "jobs".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Whether `job`, found under the name `link` gives (or `None`, no Job of
/// that name), is the run of record `record_id`: it carries the record's
/// id and the link's attempt, and (once the record saw it) the link's uid.
/// A link drover stopped is [`LinkedRun::Stopping`] while the Job is
/// there (its pods are looked at by the observation when it is gone).
pub fn linked(job: Option<&ObservedJob>, record_id: &str, link: &RunLink) -> LinkedRun {
    let Some(job) = job else {
        return match &link.uid {
            // Seen, and gone (deleted by someone, or by its TTL before its
            // end was read): never made again for this attempt.
            Some(uid) if !link.stopped => LinkedRun::Found {
                uid: uid.clone(),
                version: link.version.clone(),
                status: UpgradeStatus::Failed(format!("its Job {} is gone", link.name)),
            },
            _ if link.stopped => LinkedRun::Stopped,
            _ => LinkedRun::Missing,
        };
    };
    if link.stopped {
        return if job.metadata.deletion_timestamp.is_some() {
            LinkedRun::Stopping
        } else {
            LinkedRun::StopPending
        };
    }
    let carried = (job.record.as_deref(), job.attempt.as_deref());
    let uid = job.uid().unwrap_or_default();
    let ours = match &link.uid {
        Some(u) => *u == uid,
        None => carried == (Some(record_id), Some(link.attempt.to_string().as_str())),
    };
    if !ours {
        return LinkedRun::Foreign(format!(
            "it carries record {:?} attempt {:?}, uid {uid}",
            carried.0.unwrap_or(""),
            carried.1.unwrap_or("")
        ));
    }
    let version = job
        .version
        .as_deref()
        .and_then(|v| Version::parse(v).ok())
        .unwrap_or_else(|| link.version.clone());
    LinkedRun::Found {
        uid,
        version,
        status: job_status(job),
    }
}

fn condition<'a>(job: &'a ObservedJob, type_: &str) -> Option<&'a RunCondition> {
    job.conditions.iter().find(|c| c.type_ == type_)
}

/// The run's status from the Job's conditions.
pub fn job_status(job: &ObservedJob) -> UpgradeStatus {
    if condition(job, "Complete").is_some() {
        UpgradeStatus::Succeeded
    } else if let Some(c) = condition(job, "Failed") {
        let reason = c.reason.as_deref().unwrap_or("Failed");
        UpgradeStatus::Failed(match c.message.as_deref() {
            Some(m) if !m.is_empty() => format!("Job {}: {reason}: {m}", job.name_any()),
            _ => format!("Job {}: {reason}", job.name_any()),
        })
    } else {
        UpgradeStatus::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RunAction;

    fn link(uid: Option<&str>) -> RunLink {
        RunLink {
            name: "drover-a-upgrade-2-abcd".into(),
            uid: uid.map(String::from),
            action: RunAction::Upgrade,
            version: Version::new(1, 13, 0),
            attempt: 2,
            stopped: false,
        }
    }

    fn job(record: &str, attempt: &str, uid: &str, version: &str) -> ObservedJob {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "drover-a-upgrade-2-abcd", "uid": uid,
                "labels": { RECORD_LABEL: record, ATTEMPT_LABEL: attempt },
                "annotations": { RUN_VERSION_ANNOTATION: version },
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_job_is_the_records_run_only_when_it_carries_the_record_and_attempt() {
        let j = job("r1", "2", "u1", "1.13.1");
        match linked(Some(&j), "r1", &link(None)) {
            LinkedRun::Found { uid, version, .. } => {
                assert_eq!((uid.as_str(), version), ("u1", Version::new(1, 13, 1)));
            }
            other => panic!("{other:?}"),
        }
        for (record, attempt) in [("r0", "2"), ("r1", "1"), ("", "")] {
            let j = job(record, attempt, "u1", "1.13.1");
            assert!(matches!(
                linked(Some(&j), "r1", &link(None)),
                LinkedRun::Foreign(_)
            ));
        }
        // Once seen, by its uid.
        assert!(matches!(
            linked(Some(&j), "r1", &link(Some("u2"))),
            LinkedRun::Foreign(_)
        ));
        assert_eq!(linked(None, "r1", &link(None)), LinkedRun::Missing);
        // Seen and gone: never made again.
        assert!(matches!(
            linked(None, "r1", &link(Some("u1"))),
            LinkedRun::Found {
                status: UpgradeStatus::Failed(_),
                ..
            }
        ));
        let mut stopped = link(Some("u1"));
        stopped.stopped = true;
        assert_eq!(linked(Some(&j), "r1", &stopped), LinkedRun::StopPending);
        assert_eq!(linked(None, "r1", &stopped), LinkedRun::Stopped);
    }

    #[test]
    fn a_decoded_job_keeps_what_drover_reads_and_nothing_else() {
        let full = serde_json::json!({
            "metadata": {
                "name": "drover-a-upgrade-1-abcd", "namespace": "drover", "uid": "u1",
                "resourceVersion": "7",
                "labels": { NODE_LABEL: "a", RECORD_LABEL: "r1", ATTEMPT_LABEL: "1", "other": "x" },
                "annotations": {
                    RUN_VERSION_ANNOTATION: "1.13.1", ACTION_ANNOTATION: "upgrade",
                    legacy::JOB_STARTED_AT: "2026-01-01T00:00:00Z", "other": "x",
                },
                "managedFields": [{ "manager": "drover" }],
                "finalizers": ["batch.kubernetes.io/job-tracking"],
            },
            "spec": { "template": { "spec": { "containers": [{ "name": "d", "image": "i" }] } } },
            "status": { "conditions": [
                { "type": "SuccessCriteriaMet", "status": "True" },
                { "type": "Failed", "status": "False" },
                { "type": "Complete", "status": "True" },
            ] },
        });
        let a: ObservedJob = serde_json::from_value(full.clone()).unwrap();
        // The same from the API's type (a created Job's response).
        let b = ObservedJob::from(serde_json::from_value::<Job>(full).unwrap());
        assert_eq!(a, b);
        assert_eq!(
            (a.node.as_deref(), a.record.as_deref(), a.attempt.as_deref()),
            (Some("a"), Some("r1"), Some("1"))
        );
        assert_eq!(
            (a.version.as_deref(), a.action.as_deref()),
            (Some("1.13.1"), Some("upgrade"))
        );
        assert!(a.metadata.labels.is_none() && a.metadata.annotations.is_none());
        assert!(a.metadata.managed_fields.is_none() && a.metadata.finalizers.is_none());
        assert_eq!(a.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(job_status(&a), UpgradeStatus::Succeeded);
        assert_eq!(
            a.legacy_annotations()
                .get(legacy::JOB_STARTED_AT)
                .map(String::as_str),
            Some("2026-01-01T00:00:00Z")
        );
    }
}
