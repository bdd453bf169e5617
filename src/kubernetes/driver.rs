//! OS upgrade drivers, as Jobs pinned to the node being upgraded.
//!
//! Every upgrade Job carries `app.kubernetes.io/managed-by=drover`,
//! `drover.dev/node=<node>`, `drover.dev/target-version=<version>` and
//! `drover.dev/attempt=<unix seconds of started-at>`, and is named
//! deterministically from node, version and attempt ([`super::objects`])
//! (`drover-<node>-<version>-<hash>`, at most 63 characters), so that a
//! repeated start after a crash finds the existing Job (409 AlreadyExists is
//! success) and a node is never upgraded twice for one attempt. See
//! `docs/drivers.md` for what the two drivers run and need.

use super::node::ObservedNode;
use super::objects::{
    attempt_label, job_finished, label_version, run_job_name, ACTION_ANNOTATION, ATTEMPT_LABEL,
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, NODE_LABEL, RUN_VERSION_ANNOTATION, STARTED_AT_ANNOTATION,
    TARGET_VERSION_LABEL,
};
use super::observe::Observer;
use super::{is_status, Error, KubeOptions};
use crate::cluster::{NodeProgress, ANN_ATTEMPTS, ANN_PREVIOUS};
use crate::config::DriverSpec;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

/// Container name of the driver in the Job's pod (its termination message
/// is read by [`super::termination`]).
pub use super::termination::CONTAINER;
/// Where the Bottlerocket API socket is on the host, and in the driver's container.
pub const API_SOCKET: &str = "/run/api.sock";
/// Host directory where the Bottlerocket driver remembers the attempt it rebooted for.
pub const STATE_DIR: &str = "/var/lib/drover";

/// Where the host's own `apiclient` is (mounted into the driver's container).
pub const HOST_APICLIENT: &str = "/bin/apiclient";
/// Where the driver's container sees the host's `apiclient` (first on `PATH`).
pub const APICLIENT: &str = "/usr/local/bin/apiclient";
/// Where the driver's container sees [`STATE_DIR`].
pub const STATE_MOUNT: &str = "/drover-state";
/// How long the driver's pod has after SIGTERM: the script needs up to 20 s
/// to cancel an activated update when its Job is deleted.
pub const GRACE_SECONDS: i64 = 30;

/// The Bottlerocket driver's command: its script
/// (`deploy/updater/bottlerocket-update.sh`), baked into the updater image at
/// this path. It follows the update API's state machine with the host's own
/// `apiclient` and is idempotent, so the pod that the Job starts again after
/// the reboot finishes the attempt instead of updating a second time. The
/// command is fixed, not text in the Job, so that the admission policy of
/// `deploy/components/bottlerocket-host-access` can pin it with the image's
/// digest: a Job from the agent's token runs this script or nothing.
pub const BOTTLEROCKET_COMMAND: &str = "/usr/local/bin/drover-bottlerocket-update";

/// Pod failures, other than the driver's own exit, that an upgrade Job
/// survives. A pod the kubelet refuses to admit (`status.reason:
/// NodeShutdown` while the node shuts down for the reboot) carries neither an
/// exit code nor a condition, so no `podFailurePolicy` rule can match it and
/// the Job controller counts it. Its replacements come 10 s, 20 s, 40 s, ...
/// after the last failure (kube-controller-manager's pod failure backoff):
/// six cover a shutdown of about 20 minutes, far beyond any
/// `shutdown-grace-period`, and the kubelet's rejections of a pod it cannot
/// admit right after it starts again.
pub const BACKOFF_LIMIT: i32 = 6;

/// The Job moving `node` to [`NodeProgress::run_version`] for attempt
/// `p.started_at`: the target, or while rolling back the version the node
/// ran before, with `DROVER_ACTION=rollback`; or, while `preparing`, the
/// Job that only checks the target is available and downloads it, with
/// `DROVER_ACTION=prepare`, on a node still in service (docs/drivers.md).
pub fn upgrade_job(
    opts: &KubeOptions,
    node: &ObservedNode,
    p: &NodeProgress,
) -> Result<Job, Error> {
    let name = node.name_any();
    let version = p.run_version();
    let job_name = run_job_name(&name, p);
    let target = version.to_string();
    let labels = json!({
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        NODE_LABEL: name,
        TARGET_VERSION_LABEL: label_version(version),
        ATTEMPT_LABEL: attempt_label(p.started_at),
    });
    let mut env = vec![
        json!({ "name": "DROVER_TARGET_VERSION", "value": target }),
        json!({ "name": "DROVER_NODE_NAME", "value": name }),
        json!({ "name": "DROVER_ATTEMPT", "value": attempt_label(p.started_at) }),
        json!({ "name": "DROVER_ACTION", "value": p.run_action() }),
    ];
    if p.state == crate::cluster::ProgressState::RollingBack {
        // The version that failed, for a driver that wants to log or undo it.
        env.push(json!({ "name": "DROVER_FAILED_VERSION", "value": p.target.to_string() }));
    }
    let env = Value::Array(env);
    let image = opts.driver.updater_image().map_err(|why| Error::BuildJob {
        node: name.clone(),
        why,
    })?;
    let (container, volumes) = match &opts.driver {
        DriverSpec::Bottlerocket { .. } => (
            json!({
                "name": CONTAINER,
                "image": image,
                "command": [BOTTLEROCKET_COMMAND],
                "env": env,
                "volumeMounts": [
                    { "name": "api-socket", "mountPath": API_SOCKET },
                    // The node's own apiclient always speaks its API server's
                    // version (as the Bottlerocket update operator's agent).
                    { "name": "apiclient", "mountPath": APICLIENT, "readOnly": true },
                    { "name": "state", "mountPath": STATE_MOUNT },
                ],
                // The label Bottlerocket's SELinux policy lets talk to the API
                // socket; the same options as the update operator's agent.
                "securityContext": { "seLinuxOptions": {
                    "user": "system_u", "role": "system_r", "type": "super_t", "level": "s0",
                } },
            }),
            json!([
                { "name": "api-socket", "hostPath": { "path": API_SOCKET, "type": "Socket" } },
                { "name": "apiclient", "hostPath": { "path": HOST_APICLIENT, "type": "File" } },
                { "name": "state", "hostPath": { "path": STATE_DIR, "type": "DirectoryOrCreate" } },
            ]),
        ),
        DriverSpec::Job { command, .. } => (
            json!({ "name": CONTAINER, "image": image, "command": command, "env": env }),
            json!([]),
        ),
    };
    let owner = node.uid().map(|uid| {
        // A Job for a deleted node is garbage-collected with it.
        json!([{ "apiVersion": "v1", "kind": "Node", "name": name, "uid": uid }])
    });
    let mut spec = json!({
        "backoffLimit": BACKOFF_LIMIT,
        "ttlSecondsAfterFinished": opts.job_ttl.as_secs(),
        "podFailurePolicy": pod_failure_policy(),
        "template": {
            "metadata": { "labels": { MANAGED_BY_LABEL: MANAGED_BY_VALUE, NODE_LABEL: name } },
            "spec": {
                "nodeName": name,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                // Runs on the cordoned, possibly tainted node: tolerate every taint.
                "tolerations": [{ "operator": "Exists" }],
                "automountServiceAccountToken": false,
                "containers": [container],
                "volumes": volumes,
            },
        },
    });
    if let Some(d) = opts.job_deadline {
        spec["activeDeadlineSeconds"] = json!(d.as_secs().max(1));
    }
    let mut metadata: Value = json!({
        "name": job_name,
        "namespace": opts.namespace,
        "labels": labels,
        "annotations": {
            RUN_VERSION_ANNOTATION: target,
            STARTED_AT_ANNOTATION: p.started_at.to_rfc3339(),
            ACTION_ANNOTATION: p.run_action(),
        },
    });
    // The rest of the record it was started for: a prepare's record is
    // its Job only (`objects::run_seen`, `cluster::effective`).
    if p.attempts > 0 {
        metadata["annotations"][ANN_ATTEMPTS] = json!(p.attempts.to_string());
    }
    if let Some(v) = &p.previous {
        metadata["annotations"][ANN_PREVIOUS] = json!(v.to_string());
    }
    if let Some(o) = owner {
        metadata["ownerReferences"] = o;
    }
    serde_json::from_value(
        json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec }),
    )
    .map_err(|e| Error::BuildJob {
        node: name,
        why: e.to_string(),
    })
}

/// How an upgrade Job judges a failed pod; the rules are tried in order and
/// the first that matches decides (the Job controller's
/// `matchPodFailurePolicy`).
///
/// 1. A pod the reboot killed is no failure: the kubelet's graceful node
///    shutdown marks it `DisruptionTarget` (reason `TerminationByKubelet`),
///    as do evictions and preemptions. The Job starts it again and the
///    idempotent driver finishes.
/// 2. So is a container ended by SIGTERM or SIGKILL (exit 143 or 137): a
///    reboot without graceful shutdown, or the kubelet finding the
///    container gone after it.
/// 3. Any other exit of the driver fails the Job at once, with the exit code
///    in its message: the driver said the update failed.
/// 4. What matches no rule counts against [`BACKOFF_LIMIT`]: a pod the kubelet
///    rejected before starting it (`NodeShutdown` during the reboot), which
///    has no exit code and no condition to match.
fn pod_failure_policy() -> Value {
    let killed = json!([137, 143]);
    json!({ "rules": [
        { "action": "Ignore", "onPodConditions": [{ "type": "DisruptionTarget", "status": "True" }] },
        { "action": "Ignore", "onExitCodes": { "containerName": CONTAINER, "operator": "In", "values": killed } },
        { "action": "FailJob", "onExitCodes": { "containerName": CONTAINER, "operator": "NotIn", "values": killed } },
    ]})
}

/// Start the driver for `node`'s attempt, unless its Job exists.
pub async fn start(obs: &Observer, node: &str, p: &NodeProgress) -> Result<(), Error> {
    let name = run_job_name(node, p);
    if obs.job(&name).is_some() {
        tracing::debug!(node, job = %name, "upgrade Job exists; nothing to start");
        return Ok(());
    }
    let n = match obs.node(node) {
        Some(n) => n,
        None => obs.get_node(node, "start_upgrade").await?,
    };
    let job = upgrade_job(&obs.opts, &n, p)?;
    let api: Api<Job> = Api::namespaced(obs.client.clone(), &obs.opts.namespace);
    match api.create(&PostParams::default(), &job).await {
        Ok(created) => {
            tracing::info!(node, job = %name, "upgrade Job created");
            obs.wrote_job(created);
            Ok(())
        }
        Err(e) if is_status(&e, 409) => {
            tracing::info!(node, job = %name, "upgrade Job already exists");
            Ok(())
        }
        Err(source) => Err(Error::Node {
            node: node.to_string(),
            call: format!("create job {}/{name}", obs.opts.namespace),
            source,
        }),
    }
}

/// Delete `node`'s upgrade Jobs: all of them, or (`all` false) those still running.
pub async fn cleanup(obs: &Observer, node: &str, all: bool) -> Result<(), Error> {
    if all {
        return cleanup_all(obs, node).await;
    }
    let api: Api<Job> = Api::namespaced(obs.client.clone(), &obs.opts.namespace);
    for job in obs.jobs_of(node) {
        if job_finished(&job) || job.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = job.name_any();
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => tracing::info!(node, job = %name, "upgrade Job deleted"),
            Err(e) if is_status(&e, 404) => {}
            Err(source) => {
                return Err(Error::Node {
                    node: node.to_string(),
                    call: format!("delete job {}/{name}", obs.opts.namespace),
                    source,
                })
            }
        }
        obs.deleted_job(&job);
    }
    Ok(())
}

/// Delete every drover Job of `node` in one `deletecollection` (its
/// prepare and upgrade Jobs, any attempt): the run is over. One request
/// where a DELETE per Job made two per node upgraded with `prepare`
/// (BENCHMARKS.md, "Agent under load"). The selector is the node's label
/// and drover's managed-by label, so nothing but drover's Jobs of this
/// node can match; none is sent when the stores know of no Job of the node
/// still to delete (no request for a node that never had one).
async fn cleanup_all(obs: &Observer, node: &str) -> Result<(), Error> {
    let known: Vec<std::sync::Arc<Job>> = obs
        .jobs_of(node)
        .into_iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .collect();
    if known.is_empty() {
        return Ok(());
    }
    let api: Api<Job> = Api::namespaced(obs.client.clone(), &obs.opts.namespace);
    let selector = format!("{NODE_LABEL}={node},{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
    let deleted = api
        .delete_collection(
            &DeleteParams::background(),
            &ListParams::default().labels(&selector),
        )
        .await
        .map_err(|source| Error::Node {
            node: node.to_string(),
            call: format!("delete jobs {selector} in {}", obs.opts.namespace),
            source,
        })?;
    // The answer lists what the server deleted; the overlay may also hold a
    // Job of ours the server already had gone: forget both.
    let deleted: Vec<Job> = deleted.left().map(|list| list.items).unwrap_or_default();
    let names: Vec<String> = deleted.iter().map(|j| j.name_any()).collect();
    tracing::info!(node, jobs = ?names, "upgrade Jobs deleted");
    for job in deleted.iter().chain(known.iter().map(|j| j.as_ref())) {
        obs.deleted_job(job);
    }
    Ok(())
}
