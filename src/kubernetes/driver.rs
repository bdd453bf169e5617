//! OS upgrade drivers, as Jobs pinned to the node being upgraded.
//!
//! Every driver Job carries `app.kubernetes.io/managed-by=drover`,
//! `drover.dev/node=<node>`, `drover.dev/target-version=<version>`,
//! `drover.dev/record=<record id>` and `drover.dev/attempt=<attempt>`, and
//! is named by the record that starts it (`record::run_name`, planned in
//! the record write before the Job is made), so that a repeated start
//! after a crash meets the Job it made (a 409, accepted only when that Job
//! carries the record's id and attempt) and a node is never moved twice
//! for one attempt. See `docs/drivers.md` for what the two drivers run and
//! need.

use super::node::ObservedNode;
use super::objects::{
    label_version, linked, ACTION_ANNOTATION, ATTEMPT_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    NODE_LABEL, RECORD_LABEL, RUN_LABEL, RUN_VERSION_ANNOTATION, TARGET_VERSION_LABEL,
};
use super::observe::Observer;
use super::{is_status, Error, KubeOptions};
use crate::cluster::{LinkedRun, RunLink, RunStart};
use crate::config::DriverSpec;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
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

/// The driver Job `start` names for `node`: moving it to the run's
/// version (an upgrade, or with `DROVER_ACTION=rollback` back to the
/// version it ran before), or with `DROVER_ACTION=prepare` only checking
/// the target is available and downloading it, the node still in service
/// (docs/drivers.md).
pub fn upgrade_job(
    opts: &KubeOptions,
    node: &ObservedNode,
    start: &RunStart,
) -> Result<Job, Error> {
    let name = node.name_any();
    let run = &start.run;
    let version = &run.version;
    let job_name = run.name.clone();
    let target = version.to_string();
    let attempt = run.attempt.to_string();
    let labels = json!({
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        NODE_LABEL: name,
        TARGET_VERSION_LABEL: label_version(version),
        RECORD_LABEL: start.record_id,
        ATTEMPT_LABEL: attempt,
    });
    // Unique per record and attempt: the Bottlerocket driver remembers on
    // the host the attempt it rebooted for.
    let driver_attempt = crate::record::driver_attempt(&start.record_id, run.attempt);
    let mut env = vec![
        json!({ "name": "DROVER_TARGET_VERSION", "value": target }),
        json!({ "name": "DROVER_NODE_NAME", "value": name }),
        json!({ "name": "DROVER_ATTEMPT", "value": driver_attempt }),
        json!({ "name": "DROVER_ACTION", "value": run.action.as_str() }),
    ];
    if let Some(failed) = &start.failed_version {
        // The version that failed, for a driver that wants to log or undo it.
        env.push(json!({ "name": "DROVER_FAILED_VERSION", "value": failed.to_string() }));
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
            "metadata": { "labels": {
                MANAGED_BY_LABEL: MANAGED_BY_VALUE, NODE_LABEL: name, RUN_LABEL: job_name,
            } },
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
            ACTION_ANNOTATION: run.action.as_str(),
        },
    });
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

/// Make the Job `start` names for `node`, unless it exists: a 409 is
/// success only for a Job that carries the record's id and attempt.
pub async fn start(obs: &Observer, node: &str, start: &RunStart) -> Result<(), Error> {
    let name = &start.run.name;
    let foreign = |what: String| Error::ForeignRun {
        node: node.to_string(),
        job: name.clone(),
        what,
    };
    if let Some(job) = obs.job(name) {
        return match linked(Some(&job), &start.record_id, &start.run) {
            LinkedRun::Foreign(what) => Err(foreign(what)),
            _ => {
                tracing::debug!(node, job = %name, "driver Job exists; nothing to start");
                Ok(())
            }
        };
    }
    let n = match obs.node(node) {
        Some(n) => n,
        None => obs.get_node(node, "start_run").await?,
    };
    let job = upgrade_job(&obs.opts, &n, start)?;
    let api: Api<Job> = Api::namespaced(obs.client.clone(), &obs.opts.namespace);
    let call = || format!("create job {}/{name}", obs.opts.namespace);
    match api.create(&PostParams::default(), &job).await {
        Ok(created) => {
            tracing::info!(node, job = %name, "driver Job created");
            obs.wrote_job(created);
            Ok(())
        }
        Err(e) if is_status(&e, 409) => {
            // Made before (the store has not shown it): ours only if it
            // carries this record and attempt.
            let existing = api.get_opt(name).await.map_err(|source| Error::Node {
                node: node.to_string(),
                call: format!("get job {}/{name}", obs.opts.namespace),
                source,
            })?;
            let existing = existing.map(super::objects::ObservedJob::from);
            match linked(existing.as_ref(), &start.record_id, &start.run) {
                LinkedRun::Foreign(what) => Err(foreign(what)),
                _ => {
                    tracing::info!(node, job = %name, "driver Job already exists");
                    if let Some(j) = existing {
                        obs.wrote_job(j);
                    }
                    Ok(())
                }
            }
        }
        Err(source) => Err(Error::Node {
            node: node.to_string(),
            call: call(),
            source,
        }),
    }
}

/// Delete the Job `run` names (its uid as a precondition once recorded);
/// its pods are stopped by the garbage collector, and the node is not
/// uncordoned before they are gone (`observe.rs`).
pub async fn stop(obs: &Observer, node: &str, run: &RunLink) -> Result<(), Error> {
    let api: Api<Job> = Api::namespaced(obs.client.clone(), &obs.opts.namespace);
    let mut params = DeleteParams::background();
    if let Some(uid) = &run.uid {
        params = params.preconditions(Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        });
    }
    match api.delete(&run.name, &params).await {
        Ok(_) => tracing::info!(node, job = %run.name, "driver Job deleted"),
        Err(e) if is_status(&e, 404) => {}
        Err(source) => {
            return Err(Error::Node {
                node: node.to_string(),
                call: format!("delete job {}/{}", obs.opts.namespace, run.name),
                source,
            })
        }
    }
    if let Some(job) = obs.job(&run.name) {
        obs.deleted_job(&job);
    }
    Ok(())
}
