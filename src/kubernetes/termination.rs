//! What a driver said when it ended: its pod's termination message
//! (`/dev/termination-log`), read from the pod of a failed Job and put on
//! the node's record ahead of the Job controller's own message, which says
//! only which `podFailurePolicy` rule the exit code matched. The
//! Bottlerocket driver writes one line of JSON (outcome, retries by kind,
//! reason; deploy/updater/bottlerocket-update.sh); any other driver's text
//! is taken as it is. Reads only the pods of a Job it is given, once per
//! Job (a bounded cache by UID), and never holds up a give-back: without an
//! answer the Job's message stands.

use super::objects::ObservedJob;
use crate::cluster::{NodeView, UpgradeStatus};
use crate::rollout::health::bounded;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Container name of the driver in the Job's pod.
pub const CONTAINER: &str = "update";
/// The label the Job controller puts on a Job's pods (Kubernetes 1.27+).
pub const JOB_NAME_POD_LABEL: &str = "batch.kubernetes.io/job-name";
/// Most bytes of a termination message read (the kubelet keeps at most
/// 4096 per container).
const MAX_REPORT: usize = 4096;
/// Most pods of one Job listed (one per run, a few more when the kubelet
/// rejected some during a shutdown).
const MAX_PODS: u32 = 20;
/// Most Jobs whose reports are remembered.
const MAX_REMEMBERED: usize = 64;

/// Failed Jobs whose pods were read, by UID, with what their driver said: a
/// node held on its give-back is observed again every pass, its pods are
/// listed once.
static REPORTS: Mutex<VecDeque<(String, Option<String>)>> = Mutex::new(VecDeque::new());

/// What the driver's container said in its termination message: for the
/// Bottlerocket driver its reason and the retries it made ("...; the driver
/// retried prepare 3 times"), any other text as it is; cut to
/// [`crate::rollout::health::MAX_FAILURE_MESSAGE`]. None when the
/// container has not terminated or said nothing.
pub fn driver_report(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let c = statuses.iter().find(|c| c.name == CONTAINER)?;
    let terminated = c.state.as_ref()?.terminated.as_ref()?;
    let text = terminated.message.as_deref()?.trim();
    if text.is_empty() || text.len() > MAX_REPORT {
        return None;
    }
    let rendered = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(m)) => {
            let reason = m.get("reason").and_then(|r| r.as_str()).unwrap_or("");
            let retries: Vec<String> = m
                .get("retries")
                .and_then(|r| r.as_object())
                .map(|r| {
                    r.iter()
                        .filter_map(|(k, n)| Some((k, n.as_u64()?)))
                        .filter(|(_, n)| *n > 0)
                        .map(|(k, n)| match n {
                            1 => format!("{k} once"),
                            n => format!("{k} {n} times"),
                        })
                        .collect()
                })
                .unwrap_or_default();
            match (reason.is_empty(), retries.is_empty()) {
                (true, true) => return None,
                (false, true) => reason.to_string(),
                (true, false) => format!("the driver retried {}", retries.join(", ")),
                (false, false) => {
                    format!("{reason}; the driver retried {}", retries.join(", "))
                }
            }
        }
        _ => text.to_string(),
    };
    Some(bounded(rendered))
}

/// `view`'s failed driver run (one of `jobs`, the node's) with what the
/// driver said ahead of the Job's message. Nothing changes when the pods
/// say nothing or cannot be listed.
pub(crate) async fn explain_failure(
    client: &Client,
    namespace: &str,
    jobs: &[Arc<ObservedJob>],
    view: &mut NodeView,
) {
    let UpgradeStatus::Failed(message) = &view.upgrade else {
        return;
    };
    let Some(job) = jobs
        .iter()
        .find(|j| super::objects::job_status(j) == view.upgrade)
    else {
        return;
    };
    let Some(uid) = job.metadata.uid.clone() else {
        return;
    };
    let known = lock()
        .iter()
        .find(|(u, _)| *u == uid)
        .map(|(_, r)| r.clone());
    let report = match known {
        Some(r) => r,
        None => {
            let r = newest_report(client, namespace, &job.name_any()).await;
            let mut reports = lock();
            if reports.len() >= MAX_REMEMBERED {
                reports.pop_front();
            }
            reports.push_back((uid, r.clone()));
            r
        }
    };
    if let Some(report) = report {
        view.upgrade = UpgradeStatus::Failed(bounded(format!("{report} ({message})")));
    }
}

fn lock() -> std::sync::MutexGuard<'static, VecDeque<(String, Option<String>)>> {
    REPORTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the newest pod of Job `name` that says anything said.
async fn newest_report(client: &Client, namespace: &str, name: &str) -> Option<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default()
        .labels(&format!("{JOB_NAME_POD_LABEL}={name}"))
        .limit(MAX_PODS);
    let pods = match api.list(&params).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::debug!(job = %name, error = %e, "the driver's pods cannot be listed");
            return None;
        }
    };
    let mut said: Vec<_> = pods
        .iter()
        .filter_map(|p| {
            let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            Some((created, driver_report(p)?))
        })
        .collect();
    said.sort();
    said.pop().map(|(_, r)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_saying(message: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "status": { "containerStatuses": [{
                "name": "update", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "terminated": { "exitCode": 1, "message": message } },
            }] },
        }))
        .unwrap()
    }

    #[test]
    fn a_driver_report_says_why_and_what_was_retried() {
        let pod = pod_saying(
            r#"{"outcome":"failed","action":"rollback","target":"1.13.2","retries":{"prepare":3,"refresh":1,"commit":0},"reason":"prepare failed 4 times; the last: x"}"#,
        );
        assert_eq!(
            driver_report(&pod).as_deref(),
            Some("prepare failed 4 times; the last: x; the driver retried prepare 3 times, refresh once")
        );
        let quiet = pod_saying(r#"{"outcome":"done","retries":{},"reason":""}"#);
        assert_eq!(driver_report(&quiet), None);
        let text = pod_saying("disk full\n");
        assert_eq!(driver_report(&text).as_deref(), Some("disk full"));
        let long = pod_saying(&"x".repeat(3000));
        assert!(driver_report(&long).unwrap().len() <= 1024);
        let running: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "status": { "containerStatuses": [{
                "name": "update", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": { "running": {} },
            }] },
        }))
        .unwrap();
        assert_eq!(driver_report(&running), None);
    }
}
