//! What a driver said when it ended: its pod's termination message
//! (`/dev/termination-log`), read from the pods of a driver run that has
//! just ended. A failed run's is put on the node's record ahead of the Job
//! controller's own message, which says only which `podFailurePolicy` rule
//! the exit code matched; every ended run's retries go into the record
//! (`driverRuns`, `driverRetries`) and from there into the report. The
//! Bottlerocket driver writes one line of JSON (outcome, retries by kind,
//! reason; deploy/updater/bottlerocket-update.sh); any other driver's text
//! is taken as it is.
//!
//! Cheap by construction: a run is read once, when it has ended and its
//! record does not hold what it said yet (the next record write carries
//! it), remembered by UID (bounded) until then, and the runs of one pass
//! are read together, in one labelled pod list per [`RUNS_PER_LIST`]
//! runs. Nothing holds up a give-back: without an answer the Job's message
//! stands and the record says no retries.

use crate::cluster::{NodeView, UpgradeStatus};
use crate::record::DriverRun;
use crate::rollout::health::bounded;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::Client;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

/// Container name of the driver in the Job's pod.
pub const CONTAINER: &str = "update";
/// The label the Job controller puts on a Job's pods (Kubernetes 1.27+).
pub const JOB_NAME_POD_LABEL: &str = "batch.kubernetes.io/job-name";
/// Most bytes of a termination message read (the kubelet keeps at most
/// 4096 per container).
const MAX_REPORT: usize = 4096;
/// Most pods of one run listed (one per run, a few more when the kubelet
/// rejected some during a shutdown, one more after a reboot).
const MAX_PODS: u32 = 20;
/// Most runs read in one pod list (a label selector naming each).
pub const RUNS_PER_LIST: usize = 16;
/// Most runs whose reports are remembered: a run is read once, and its
/// report kept until a record write carries it (a prepared node may wait
/// its turn for a while).
const MAX_REMEMBERED: usize = 1024;

/// What a run's driver said, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Said {
    /// Its reason and its retries in words, or its text as it is; `None`
    /// when it said nothing worth showing.
    pub text: Option<String>,
    /// Its retries by kind.
    pub retries: BTreeMap<String, u32>,
}

/// Runs whose pods were read, by UID, with what their driver said (`None`:
/// nothing, or the pods could not be listed).
static REPORTS: Mutex<VecDeque<(String, Option<Said>)>> = Mutex::new(VecDeque::new());

/// What the driver's container said in its termination message: for the
/// Bottlerocket driver its reason and the retries it made ("...; the driver
/// retried prepare 3 times"), any other text as it is; cut to
/// [`crate::rollout::health::MAX_FAILURE_MESSAGE`]. None when the
/// container has not terminated or said nothing.
pub fn driver_report(pod: &Pod) -> Option<String> {
    said_by(pod)?.text
}

/// What `pod`'s driver container said when it terminated.
fn said_by(pod: &Pod) -> Option<Said> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let c = statuses.iter().find(|c| c.name == CONTAINER)?;
    let terminated = c.state.as_ref()?.terminated.as_ref()?;
    let text = terminated.message.as_deref()?.trim();
    if text.is_empty() || text.len() > MAX_REPORT {
        return None;
    }
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Some(Said {
            text: Some(bounded(text.to_string())),
            retries: BTreeMap::new(),
        });
    };
    let reason = m.get("reason").and_then(|r| r.as_str()).unwrap_or("");
    let retries = DriverRun::new(
        "",
        m.get("retries")
            .and_then(|r| r.as_object())
            .into_iter()
            .flatten()
            .filter_map(|(k, n)| Some((k.clone(), u32::try_from(n.as_u64()?).ok()?))),
    )
    .retries;
    let words = DriverRun {
        run: String::new(),
        retries: retries.clone(),
    }
    .describe();
    let text = match (reason.is_empty(), words.is_empty()) {
        (true, true) => None,
        (false, true) => Some(reason.to_string()),
        (true, false) => Some(format!("the driver retried {words}")),
        (false, false) => Some(format!("{reason}; the driver retried {words}")),
    };
    Some(Said {
        text: text.map(bounded),
        retries,
    })
}

/// A run `view`'s record links that has ended and whose report the record
/// lacks: its name and UID. A failed run's report goes into the message of
/// the give-back; a succeeded one's only while its record is in flight
/// (the next write, a give-back or a staged node's drain, carries it).
fn ended_run(view: &NodeView) -> Option<(String, String)> {
    let uid = view.run_uid.clone()?;
    let stored = &view.record.as_ref()?.record;
    let run = stored.run.as_ref()?;
    let wanted = match &view.upgrade {
        UpgradeStatus::Failed(_) => true,
        UpgradeStatus::Succeeded => stored.progress.is_some() && !stored.heard_from(&run.name),
        _ => false,
    };
    wanted.then(|| (run.name.clone(), uid))
}

/// What the drivers of the runs `views` link to said, for the runs that
/// have just ended: on each view, a failed run's report ahead of the Job's
/// message, and every ended run's retries for the next record write
/// ([`NodeView::driver_said`]). The runs not read before are read in one
/// pod list per [`RUNS_PER_LIST`].
pub(crate) async fn hear_drivers(client: &Client, namespace: &str, views: &mut [NodeView]) {
    let ended: Vec<(usize, String, String)> = views
        .iter()
        .enumerate()
        .filter_map(|(i, v)| ended_run(v).map(|(name, uid)| (i, name, uid)))
        .collect();
    if ended.is_empty() {
        return;
    }
    let mut known: HashMap<String, Option<Said>> = {
        let reports = lock();
        ended
            .iter()
            .filter_map(|(_, _, uid)| {
                let (_, said) = reports.iter().find(|(u, _)| u == uid)?;
                Some((uid.clone(), said.clone()))
            })
            .collect()
    };
    let unread: Vec<(&str, &str)> = ended
        .iter()
        .filter(|(_, _, uid)| !known.contains_key(uid))
        .map(|(_, name, uid)| (name.as_str(), uid.as_str()))
        .collect();
    for chunk in unread.chunks(RUNS_PER_LIST) {
        let names: Vec<&str> = chunk.iter().map(|(n, _)| *n).collect();
        let mut said = newest_reports(client, namespace, &names).await;
        let mut reports = lock();
        for (name, uid) in chunk {
            let s = said.as_mut().and_then(|m| m.remove(*name));
            if reports.len() >= MAX_REMEMBERED {
                reports.pop_front();
            }
            reports.push_back((uid.to_string(), s.clone()));
            known.insert(uid.to_string(), s);
        }
    }
    for (i, name, uid) in ended {
        let said = known.remove(&uid).flatten();
        let view = &mut views[i];
        if let (UpgradeStatus::Failed(message), Some(text)) =
            (&view.upgrade, said.as_ref().and_then(|s| s.text.as_ref()))
        {
            view.upgrade = UpgradeStatus::Failed(bounded(format!("{text} ({message})")));
        }
        let retries = said.map(|s| s.retries).unwrap_or_default();
        view.driver_said = Some(DriverRun::new(name, retries));
    }
}

fn lock() -> std::sync::MutexGuard<'static, VecDeque<(String, Option<Said>)>> {
    REPORTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the newest pod of each run of `names` that says anything said,
/// by run; `None` when the pods cannot be listed.
async fn newest_reports(
    client: &Client,
    namespace: &str,
    names: &[&str],
) -> Option<HashMap<String, Said>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default()
        .labels(&format!("{JOB_NAME_POD_LABEL} in ({})", names.join(",")))
        .limit(MAX_PODS.saturating_mul(names.len() as u32));
    let pods = match api.list(&params).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::debug!(runs = ?names, error = %e, "the driver runs' pods cannot be listed");
            return None;
        }
    };
    let mut newest = HashMap::new();
    for p in &pods {
        let Some(run) = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(JOB_NAME_POD_LABEL))
        else {
            continue;
        };
        let Some(said) = said_by(p) else {
            continue;
        };
        let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        match newest.get(run) {
            Some((at, _)) if at >= &created => {}
            _ => {
                newest.insert(run.clone(), (created, said));
            }
        }
    }
    Some(newest.into_iter().map(|(k, (_, s))| (k, s)).collect())
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
