//! What drover's objects look like, and nothing that talks to the API
//! server: the labels and annotation keys drover reads and writes on its
//! driver Jobs, how a Job's status reads and whether it is the run a record
//! links to ([`linked`]), which pods a drain must evict and which
//! PodDisruptionBudgets cover them. A leaf: [`super::observe`],
//! [`super::drain`] and [`super::driver`] all read it, it reads none of them.

use crate::cluster::{LinkedRun, RunLink, UpgradeStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;
use semver::Version;
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

/// Whether `job`, found under the name `link` gives (or `None`, no Job of
/// that name), is the run of record `record_id`: it carries the record's
/// id and the link's attempt, and (once the record saw it) the link's uid.
/// A link drover stopped is [`LinkedRun::Stopping`] while the Job is
/// there (its pods are looked at by the observation when it is gone).
pub fn linked(job: Option<&Job>, record_id: &str, link: &RunLink) -> LinkedRun {
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
    let labels = job.labels();
    let carried = (
        labels.get(RECORD_LABEL).map(String::as_str),
        labels.get(ATTEMPT_LABEL).map(String::as_str),
    );
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
        .annotations()
        .get(RUN_VERSION_ANNOTATION)
        .and_then(|v| Version::parse(v).ok())
        .unwrap_or_else(|| link.version.clone());
    LinkedRun::Found {
        uid,
        version,
        status: job_status(job),
    }
}

fn condition<'a>(
    job: &'a Job,
    type_: &str,
) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// The run's status from the Job's conditions.
pub fn job_status(job: &Job) -> UpgradeStatus {
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

    fn job(record: &str, attempt: &str, uid: &str, version: &str) -> Job {
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
}
