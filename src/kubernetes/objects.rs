//! What drover's objects look like, and nothing that talks to the API
//! server: the labels and annotation keys drover reads and writes, the
//! upgrade Jobs' names and attempt labels, how a Job's status reads and
//! which run (and so which record, `cluster::effective`) it stands for, which
//! pods a drain must evict and which PodDisruptionBudgets cover them.
//! A leaf: [`super::observe`], [`super::drain`] and [`super::driver`] all
//! read it, it reads none of them.

use crate::cluster::{NodeProgress, RunSeen, UpgradeStatus, ANN_ATTEMPTS, ANN_PREVIOUS};
use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;
use semver::Version;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Label on every drover-managed object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "drover";
/// Label naming the node an upgrade Job is for.
pub const NODE_LABEL: &str = "drover.dev/node";
/// Label holding the version an upgrade Job moves its node to.
pub const TARGET_VERSION_LABEL: &str = "drover.dev/target-version";
/// Label identifying the attempt (unix seconds of the progress's started-at).
pub const ATTEMPT_LABEL: &str = "drover.dev/attempt";

/// Annotation the kubelet puts on mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

fn owned_by_daemonset(pod: &Pod) -> bool {
    pod.owner_references().iter().any(|o| o.kind == "DaemonSet")
}

fn pod_finished(pod: &Pod) -> bool {
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

/// The attempt label's value: unix seconds of the progress's started-at.
pub(crate) fn attempt_label(started_at: DateTime<Utc>) -> String {
    started_at.timestamp().to_string()
}

fn dns_part(s: &str, max: usize) -> String {
    let mut out: String = s
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    out.truncate(max);
    out.trim_matches('-').to_string()
}

/// The Job name for `node`'s attempt `started_at` at `target`: DNS-safe, at most 63 characters.
pub fn job_name(node: &str, target: &Version, started_at: DateTime<Utc>) -> String {
    named(node, target, started_at, None)
}

/// The Job name of the driver's run for `p` ([`NodeProgress::run_action`]):
/// [`job_name`] for an upgrade or rollback (the names Jobs of earlier agents
/// carry), a name of its own for a prepare, whose attempt may share a
/// second with the drain's that follows it.
pub fn run_job_name(node: &str, p: &NodeProgress) -> String {
    let tag = (p.run_action() == "prepare").then_some("prepare");
    named(node, p.run_version(), p.started_at, tag)
}

fn named(node: &str, target: &Version, started_at: DateTime<Utc>, tag: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(node.as_bytes());
    h.update([0]);
    h.update(target.to_string().as_bytes());
    h.update([0]);
    h.update(started_at.timestamp().to_be_bytes());
    h.update(started_at.timestamp_subsec_nanos().to_be_bytes());
    if let Some(tag) = tag {
        h.update([0]);
        h.update(tag.as_bytes());
    }
    let hash = &hex::encode(h.finalize())[..10];
    let version = dns_part(&target.to_string(), 20);
    // "drover-" + node + "-" + version + "-" + hash <= 63
    let node_max = 63 - "drover-".len() - 1 - version.len() - 1 - hash.len();
    format!("drover-{}-{version}-{hash}", dns_part(node, node_max))
}

/// Annotation of a driver's Job: its `DROVER_ACTION` (`upgrade`,
/// `rollback`, `prepare`).
pub const ACTION_ANNOTATION: &str = "drover.dev/action";
/// Annotation of a driver's Job: the version it moves its node to
/// ([`NodeProgress::run_version`], unlike the label not rewritten for label syntax).
pub const RUN_VERSION_ANNOTATION: &str = "drover.dev/target";
/// Annotation of a driver's Job: the started-at of the record it was
/// started for, to the nanosecond (the attempt label has seconds).
pub const STARTED_AT_ANNOTATION: &str = "drover.dev/started-at";

/// The node and the run a drover Job stands for: what its labels and
/// annotations say of the record it was started for, and its status
/// (`cluster::effective` reads a node's state from it). `None` for a Job
/// that says too little to be anyone's record (no node, version or
/// started-at it can be read from).
pub fn run_seen(job: &Job) -> Option<(String, RunSeen)> {
    let node = job.labels().get(NODE_LABEL)?.clone();
    let a = job.annotations();
    let version = Version::parse(a.get(RUN_VERSION_ANNOTATION)?).ok()?;
    let started_at = DateTime::parse_from_rfc3339(a.get(STARTED_AT_ANNOTATION)?)
        .ok()?
        .with_timezone(&Utc);
    let attempts = match a.get(ANN_ATTEMPTS) {
        Some(n) => n.parse().ok()?,
        None => 0,
    };
    let previous = match a.get(ANN_PREVIOUS) {
        Some(v) => Some(Version::parse(v).ok()?),
        None => None,
    };
    Some((
        node,
        RunSeen {
            action: a
                .get(ACTION_ANNOTATION)
                .cloned()
                .unwrap_or_else(|| "upgrade".into()),
            version,
            started_at,
            attempts,
            previous,
            status: job_status(job),
        },
    ))
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

/// Whether the Job ended (Complete or Failed).
pub(crate) fn job_finished(job: &Job) -> bool {
    condition(job, "Complete").is_some() || condition(job, "Failed").is_some()
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

    #[test]
    fn job_names_are_dns_labels_and_differ_per_attempt() {
        let t0: DateTime<Utc> = "2026-12-08T02:00:00Z".parse().unwrap();
        let long = "ip-10-0-0-1.eu-west-1.compute.internal.with-a-very-long-suffix-indeed";
        let v = Version::parse("1.13.2-rc.1+build.7").unwrap();
        let a = job_name(long, &v, t0);
        assert!(a.len() <= 63, "{a} is {} long", a.len());
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a}"
        );
        assert!(a.starts_with("drover-ip-10-0-0-1"), "{a}");
        assert_eq!(a, job_name(long, &v, t0), "deterministic");
        assert_ne!(a, job_name(long, &v, t0 + chrono::Duration::seconds(1)));
        assert_ne!(a, job_name(long, &Version::new(1, 13, 3), t0));
        assert_eq!(label_version(&v), "1.13.2-rc.1_build.7");
    }
}
