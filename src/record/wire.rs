//! A node record as it is stored: the `spec` and `status` of a
//! `DroverNode` object ([`DroverNode`], its CRD generated from these
//! types: `deploy/base/crd-drovernode.yaml`), and the one encoding
//! ([`encode`]) and decoding ([`decode`]) both backends use, so the
//! simulation stores exactly what the API server would. The calls that
//! read and write the objects are the Kubernetes backend's
//! (`kubernetes::record`).

use super::{
    node_conditions, Condition, DriverRun, NodeProgress, NodeRecord, ProgressState, RecordError,
    Requests, Rollbacks, RunAction, RunLink, ANN_CLEAR_ROLLED_BACK, ANN_RETRY, MAX_DRIVER_RUNS,
};
use chrono::{DateTime, SecondsFormat, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use semver::Version;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

// Printer columns are raw JSON, as for DroverStatus (agent/crd.rs).
/// What a record is about: which node, of which environment and cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "drover.dev",
    version = "v1alpha1",
    kind = "DroverNode",
    namespaced,
    shortname = "drn",
    status = "DroverNodeStatus",
    doc = "drover's record of one node: only the drover agent writes it (a person may annotate drover.dev/retry and drover.dev/clear-rolled-back).",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.node"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".status.target"}"#,
    printcolumn = r#"{"name":"Since","type":"date","jsonPath":".status.since"}"#,
    printcolumn = r#"{"name":"Attempt","type":"integer","jsonPath":".status.attempt"}"#,
    printcolumn = r#"{"name":"Driver-Retries","type":"integer","jsonPath":".status.driverRetries"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Run","type":"string","priority":1,"jsonPath":".status.run.name"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DroverNodeSpec {
    /// The node (also the object's name).
    pub node: String,
    /// Chosen by drover when it created the record; the driver runs' names
    /// derive from it.
    pub record_id: String,
    /// The environment of the agent that writes it.
    pub environment: String,
    /// The cluster name that agent reports as.
    pub cluster: String,
}

/// drover's record of the node: written by the agent alone, in one request
/// per transition (no status subresource).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DroverNodeStatus {
    /// idle, preparing, draining, watching, passed, blocked, failed or
    /// rolling-back (a draining node whose run exists is upgrading).
    pub phase: String,
    /// The version the node is being (or was being) moved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// When the phase's episode began (RFC 3339): the drain for draining,
    /// the give-back for blocked and failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Starts drover made on the node (a prepare, a cordon, a rollback, a
    /// retry each begin one).
    #[serde(default)]
    pub attempt: u32,
    /// Drain retries after a drain timeout.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
    /// drover cordoned the node, so drover (and only drover) uncordons it.
    #[serde(default)]
    pub cordoned_by_drover: bool,
    /// The version the node ran when drover started it: where a rollback
    /// takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_version: Option<String>,
    /// Why (blocked, failed, held, refused evictions), in a line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The driver run drover started (or planned) for the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunStatus>,
    /// Versions the node was rolled back from: never moved to again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled_back: Vec<String>,
    /// Rollbacks started on the node, per version rolled back from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollbacks_started: Vec<RollbacksStatus>,
    /// The drain rungs beyond `evict` used on the node (restart, wait,
    /// skip, delete), per version and attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_rungs: Vec<RungStatus>,
    /// The retries the driver runs of the current attempt made, all kinds
    /// (the sum of `driverRuns`); kept once the node is given back, until
    /// a new attempt begins.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub driver_retries: u32,
    /// What each driver run of the current attempt said when it ended: its
    /// retries by kind (`refresh`, `prepare`, `commit`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub driver_runs: Vec<DriverRunStatus>,
    /// When drover first saw workload consent (`drover.dev/upgrade=paused`
    /// on the Node) keep the node from starting (RFC 3339); absent when
    /// none holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consent_held_since: Option<String>,
    /// The consent hold went past the environment's `consent_limit` and
    /// was reported (the node is not forced).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consent_overdue: bool,
    /// The `metadata.generation` this record was written as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Reconciling` and `Stalled`, from the phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Vec<Condition>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The driver run a record links to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    /// Its Job's name.
    pub name: String,
    /// Its Job's uid, once seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// prepare, upgrade or rollback.
    pub action: String,
    /// The version it installs.
    pub version: String,
    /// The attempt it belongs to.
    pub attempt: u32,
    /// drover deleted it: never started again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// What one driver run said when it ended.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverRunStatus {
    /// Its Job's name.
    pub run: String,
    /// Its retries by kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retries: BTreeMap<String, u32>,
}

/// Rollbacks started from one version.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollbacksStatus {
    /// The version rolled back from.
    pub version: String,
    /// How many.
    pub started: u32,
}

/// A drain rung used on the node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RungStatus {
    /// restart, wait, skip or delete.
    pub rung: String,
    /// The drain rule that called for it.
    pub rule: String,
    /// The version the node was drained for.
    pub version: String,
    /// The attempt it was used in.
    pub attempt: u32,
    /// What it did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The phase of an idle record.
pub const IDLE: &str = "idle";

/// The `DroverNode` CRD as the API server takes it: no status
/// subresource, so a record is written whole in one request (its `status`
/// is the record, not an observation of a `spec`).
pub fn crd(
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    let mut crd = DroverNode::crd();
    for v in &mut crd.spec.versions {
        v.subresources = None;
    }
    crd
}

/// The CRD rendered as `deploy/base/crd-drovernode.yaml` holds it: pretty
/// JSON (valid YAML), newline-terminated.
pub fn crd_manifest() -> String {
    let mut s = serde_json::to_string_pretty(&crd()).unwrap_or_default();
    s.push('\n');
    s
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The spec of `record` for an agent of `environment` and `cluster`.
pub fn spec(record: &NodeRecord, environment: &str, cluster: &str) -> DroverNodeSpec {
    DroverNodeSpec {
        node: record.node.clone(),
        record_id: record.id.clone(),
        environment: environment.into(),
        cluster: cluster.into(),
    }
}

/// The status recording `record`, written as `generation`, its conditions
/// keeping their transition times from `previous` (the stored ones) and
/// changed at `now`.
pub fn encode(
    record: &NodeRecord,
    generation: i64,
    previous: &[Condition],
    now: DateTime<Utc>,
) -> DroverNodeStatus {
    let p = record.progress.as_ref();
    DroverNodeStatus {
        phase: p.map_or(IDLE, |p| p.state.as_str()).to_string(),
        target: p.map(|p| p.target.to_string()),
        since: p.map(|p| rfc3339(p.started_at)),
        attempt: record.attempt,
        retries: p.map_or(0, |p| p.retries),
        cordoned_by_drover: p.is_some_and(|p| p.cordoned_by_drover),
        previous_version: p.and_then(|p| p.previous.as_ref()).map(Version::to_string),
        message: p.map(|p| p.message.clone()).unwrap_or_default(),
        run: record.run.as_ref().map(|r| RunStatus {
            name: r.name.clone(),
            uid: r.uid.clone(),
            action: r.action.as_str().into(),
            version: r.version.to_string(),
            attempt: r.attempt,
            stopped: r.stopped,
        }),
        rolled_back: record.rolled_back.iter().map(Version::to_string).collect(),
        rollbacks_started: record
            .rollbacks
            .iter()
            .map(|r| RollbacksStatus {
                version: r.version.to_string(),
                started: r.started,
            })
            .collect(),
        drain_rungs: record
            .drain_rungs
            .iter()
            .map(|u| RungStatus {
                rung: u.rung.as_str().into(),
                rule: u.rule.clone(),
                version: u.version.to_string(),
                attempt: u.attempt,
                detail: u.detail.clone(),
            })
            .collect(),
        driver_retries: record.driver_retries(),
        driver_runs: record
            .driver_runs
            .iter()
            .map(|d| DriverRunStatus {
                run: d.run.clone(),
                retries: d.retries.clone(),
            })
            .collect(),
        consent_held_since: record.consent.map(|c| rfc3339(c.since)),
        consent_overdue: record.consent.is_some_and(|c| c.overdue),
        observed_generation: Some(generation),
        conditions: node_conditions(p, generation, previous, &rfc3339(now)),
    }
}

fn version(field: &'static str, s: &str) -> Result<Version, RecordError> {
    Version::parse(s).map_err(|e| RecordError::Invalid {
        field,
        value: s.into(),
        why: e.to_string(),
    })
}

/// The record `spec` and `status` hold; an unreadable field is an error,
/// never a guess (the node is then left alone and named).
pub fn decode(
    spec: &DroverNodeSpec,
    status: Option<&DroverNodeStatus>,
) -> Result<NodeRecord, RecordError> {
    let mut record = NodeRecord::new(&spec.node, &spec.record_id);
    let Some(s) = status else {
        return Ok(record);
    };
    record.attempt = s.attempt;
    record.progress = match s.phase.as_str() {
        IDLE | "" => None,
        phase => Some(progress(phase, s)?),
    };
    record.run = s
        .run
        .as_ref()
        .map(|r| {
            Ok::<_, RecordError>(RunLink {
                name: r.name.clone(),
                uid: r.uid.clone(),
                action: RunAction::parse(&r.action).ok_or_else(|| RecordError::Invalid {
                    field: "run.action",
                    value: r.action.clone(),
                    why: "expected prepare, upgrade or rollback".into(),
                })?,
                version: version("run.version", &r.version)?,
                attempt: r.attempt,
                stopped: r.stopped,
            })
        })
        .transpose()?;
    record.rolled_back = s
        .rolled_back
        .iter()
        .map(|v| version("rolledBack", v))
        .collect::<Result<_, _>>()?;
    record.rollbacks = s
        .rollbacks_started
        .iter()
        .map(|r| {
            Ok(Rollbacks {
                version: version("rollbacksStarted.version", &r.version)?,
                started: r.started,
            })
        })
        .collect::<Result<_, RecordError>>()?;
    record.drain_rungs = s
        .drain_rungs
        .iter()
        .map(|u| {
            Ok(super::RungUse {
                rung: super::RungKind::parse(&u.rung).ok_or_else(|| RecordError::Invalid {
                    field: "drainRungs.rung",
                    value: u.rung.clone(),
                    why: "expected evict, restart, wait, skip or delete".into(),
                })?,
                rule: u.rule.clone(),
                version: version("drainRungs.version", &u.version)?,
                attempt: u.attempt,
                detail: u.detail.clone(),
            })
        })
        .collect::<Result<_, RecordError>>()?;
    record.consent = s
        .consent_held_since
        .as_deref()
        .map(|since| {
            Ok::<_, RecordError>(super::ConsentHold {
                since: time("consentHeldSince", since)?,
                overdue: s.consent_overdue,
            })
        })
        .transpose()?;
    // Bounded as the agent writes them; a longer list was not its.
    record.driver_runs = s
        .driver_runs
        .iter()
        .take(MAX_DRIVER_RUNS)
        .map(|d| DriverRun::new(d.run.clone(), d.retries.clone()))
        .collect();
    Ok(record)
}

fn time(field: &'static str, s: &str) -> Result<DateTime<Utc>, RecordError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| RecordError::Invalid {
            field,
            value: s.into(),
            why: e.to_string(),
        })
}

fn progress(phase: &str, s: &DroverNodeStatus) -> Result<NodeProgress, RecordError> {
    let state = match ProgressState::parse(phase) {
        // `upgrading` is read from a draining record and its run, never written.
        Some(st) if st != ProgressState::Upgrading => st,
        _ => {
            return Err(RecordError::Invalid {
                field: "phase",
                value: phase.into(),
                why: "expected idle, preparing, draining, watching, passed, blocked, failed or \
                      rolling-back"
                    .into(),
            })
        }
    };
    let target = version(
        "target",
        s.target.as_deref().ok_or(RecordError::Missing("target"))?,
    )?;
    let since = s.since.as_deref().ok_or(RecordError::Missing("since"))?;
    let started_at = time("since", since)?;
    let previous = s
        .previous_version
        .as_deref()
        .map(|v| version("previousVersion", v))
        .transpose()?;
    if state == ProgressState::RollingBack && previous.is_none() {
        return Err(RecordError::Missing("previousVersion"));
    }
    Ok(NodeProgress {
        state,
        target,
        started_at,
        cordoned_by_drover: s.cordoned_by_drover,
        message: s.message.clone(),
        retries: s.retries,
        previous,
    })
}

/// What a person asked of a record, from its annotations.
pub fn requests(annotations: &BTreeMap<String, String>) -> Requests {
    Requests {
        retry: annotations.contains_key(ANN_RETRY),
        clear_rolled_back: annotations.contains_key(ANN_CLEAR_ROLLED_BACK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> NodeRecord {
        let p = NodeProgress {
            state: ProgressState::RollingBack,
            target: Version::new(1, 13, 2),
            started_at: "2026-12-08T02:00:00Z".parse().unwrap(),
            cordoned_by_drover: true,
            message: "crash loop".into(),
            retries: 2,
            previous: Some(Version::new(1, 12, 0)),
        };
        let r = NodeRecord::new("a-1", "0011").start(p);
        let said = DriverRun::new(
            r.run.as_ref().unwrap().name.clone(),
            [("refresh".to_string(), 2)],
        );
        r.run_seen(Some("uid-1"))
            .with_rolled_back(&[Version::new(1, 11, 0)])
            .driver_said(&said)
            .with_consent(Some(super::super::ConsentHold {
                since: "2026-12-07T23:00:00Z".parse().unwrap(),
                overdue: true,
            }))
    }

    #[test]
    fn a_record_round_trips_through_its_stored_form() {
        let r = record();
        let at = "2026-12-08T02:01:00Z".parse().unwrap();
        let status = encode(&r, 4, &[], at);
        assert_eq!(status.phase, "rolling-back");
        assert_eq!(status.since.as_deref(), Some("2026-12-08T02:00:00Z"));
        assert_eq!(status.observed_generation, Some(4));
        assert_eq!(status.conditions[1].reason, "RollingBack");
        assert_eq!(status.driver_retries, 2);
        let spec = spec(&r, "stage", "stage-1");
        // Through JSON, as the API server stores it.
        let json = serde_json::to_value(&status).unwrap();
        let back: DroverNodeStatus = serde_json::from_value(json).unwrap();
        assert_eq!(decode(&spec, Some(&back)), Ok(r.clone()));
        let idle = r.with_progress(None);
        let s = encode(&idle, 5, &status.conditions, at);
        assert_eq!((s.phase.as_str(), s.target.as_deref()), ("idle", None));
        assert_eq!(decode(&spec, Some(&s)), Ok(idle));
        assert_eq!(decode(&spec, None), Ok(NodeRecord::new("a-1", "0011")));
    }

    #[test]
    fn an_unreadable_record_is_an_error_not_a_guess() {
        let r = record();
        let spec = spec(&r, "e", "c");
        let at = "2026-12-08T02:01:00Z".parse().unwrap();
        let good = encode(&r, 1, &[], at);
        let bad = |f: &dyn Fn(&mut DroverNodeStatus)| {
            let mut s = good.clone();
            f(&mut s);
            decode(&spec, Some(&s)).unwrap_err()
        };
        assert!(matches!(
            bad(&|s| s.target = Some("latest".into())),
            RecordError::Invalid {
                field: "target",
                ..
            }
        ));
        assert_eq!(
            bad(&|s| s.previous_version = None),
            RecordError::Missing("previousVersion")
        );
        assert!(matches!(
            bad(&|s| s.phase = "upgrading".into()),
            RecordError::Invalid { field: "phase", .. }
        ));
        assert!(matches!(
            bad(&|s| s.run.as_mut().unwrap().action = "reboot".into()),
            RecordError::Invalid {
                field: "run.action",
                ..
            }
        ));
        assert_eq!(bad(&|s| s.since = None), RecordError::Missing("since"));
        assert!(matches!(
            bad(&|s| s.consent_held_since = Some("yesterday".into())),
            RecordError::Invalid {
                field: "consentHeldSince",
                ..
            }
        ));
    }

    #[test]
    fn requests_are_read_from_the_annotations() {
        let a = BTreeMap::from([(ANN_RETRY.to_string(), "now".to_string())]);
        assert_eq!(
            requests(&a),
            Requests {
                retry: true,
                clear_rolled_back: false
            }
        );
        assert_eq!(requests(&BTreeMap::new()), Requests::default());
    }
}
