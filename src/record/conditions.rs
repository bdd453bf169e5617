//! kstatus conditions (`Ready`, `Reconciling`, `Stalled`) in the shape of
//! Kubernetes' `metav1.Condition`: the type both of drover's objects
//! carry, and a node record's, computed from its phase alone
//! ([`node_conditions`]), so `kubectl wait --for=condition=Ready
//! drovernode/NODE` and kstatus read a node the way they read the cluster's
//! `DroverStatus`.

use super::{NodeProgress, ProgressState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A condition in the shape of Kubernetes' `metav1.Condition`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's name, e.g. `ReportPushed`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The `metadata.generation` the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One word saying why, e.g. `Rejected`.
    pub reason: String,
    /// What happened, in a sentence.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: String,
}

/// The schema of `status.conditions`: metav1.Condition's, as Kubernetes'
/// own types publish it (a list keyed by `type`, the same bounds and
/// patterns), so what kubectl, Flux and Argo CD expect is what the API
/// server enforces.
pub fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "description": "Ready, Reconciling and Stalled, as kstatus reads them (docs/install.md), and the object's own (a DroverStatus's ReportPushed).",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                    "description": "The condition's name: Ready, Reconciling, Stalled, or the object's own."
                },
                "status": {
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "observedGeneration": {
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0,
                    "description": "The metadata.generation the condition was computed for."
                },
                "lastTransitionTime": {
                    "type": "string",
                    "format": "date-time",
                    "description": "When status last changed."
                },
                "reason": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                    "description": "One CamelCase word saying why."
                },
                "message": {
                    "type": "string",
                    "maxLength": 32768,
                    "description": "What happened, in a sentence."
                }
            }
        }
    })
}

/// A node record's conditions for `progress`, at `generation` (the one the
/// write makes), keeping each condition's `lastTransitionTime` from
/// `previous` while its status holds; `now` otherwise. `Ready`: nothing is
/// under way or wrong (idle, passed); `Reconciling`: drover is moving it
/// (preparing, draining, upgrading, watching, rolling back); `Stalled`: a
/// person should look (blocked, failed).
pub fn node_conditions(
    progress: Option<&NodeProgress>,
    generation: i64,
    previous: &[Condition],
    now: &str,
) -> Vec<Condition> {
    use ProgressState as P;
    let state = progress.map(|p| p.state);
    let (reason, message) = match progress {
        None => (
            "Idle".to_string(),
            "drover is not moving this node".to_string(),
        ),
        Some(p) => (camel(p.state), p.message.clone()),
    };
    let reconciling = matches!(
        state,
        Some(P::Preparing | P::Draining | P::Upgrading | P::Watching | P::RollingBack)
    );
    let stalled = matches!(state, Some(P::Blocked | P::Failed));
    let ready = !reconciling && !stalled;
    [
        ("Ready", ready),
        ("Reconciling", reconciling),
        ("Stalled", stalled),
    ]
    .into_iter()
    .map(|(kind, on)| {
        let status = if on { "True" } else { "False" };
        let since = previous
            .iter()
            .find(|c| c.kind == kind && c.status == status)
            .map_or_else(|| now.to_string(), |c| c.last_transition_time.clone());
        Condition {
            kind: kind.into(),
            status: status.into(),
            observed_generation: Some(generation),
            reason: reason.clone(),
            message: if on { message.clone() } else { String::new() },
            last_transition_time: since,
        }
    })
    .collect()
}

/// A state's name as a condition reason (`RollingBack`).
fn camel(s: ProgressState) -> String {
    s.as_str()
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use semver::Version;

    fn p(state: ProgressState) -> NodeProgress {
        NodeProgress {
            state,
            target: Version::new(1, 13, 0),
            started_at: "2026-12-08T02:00:00Z".parse().unwrap(),
            cordoned_by_drover: true,
            message: "why".into(),
            retries: 0,
            previous: None,
        }
    }

    fn said(c: &[Condition]) -> Vec<(&str, &str, &str)> {
        c.iter()
            .map(|c| (c.kind.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect()
    }

    #[test]
    fn a_node_is_ready_reconciling_or_stalled_by_its_phase() {
        let idle = node_conditions(None, 1, &[], "t0");
        assert_eq!(
            said(&idle),
            [
                ("Ready", "True", "Idle"),
                ("Reconciling", "False", "Idle"),
                ("Stalled", "False", "Idle")
            ]
        );
        let rb = node_conditions(Some(&p(ProgressState::RollingBack)), 2, &idle, "t1");
        assert_eq!(rb[1].status, "True");
        assert_eq!(rb[1].reason, "RollingBack");
        assert_eq!(rb[1].message, "why");
        assert_eq!(rb[1].last_transition_time, "t1");
        // Stalled stayed False: its transition time is kept.
        assert_eq!(rb[2].last_transition_time, "t0");
        let failed = node_conditions(Some(&p(ProgressState::Failed)), 3, &rb, "t2");
        assert_eq!(
            (failed[0].status.as_str(), failed[2].status.as_str()),
            ("False", "True")
        );
        assert!(failed.iter().all(|c| c.observed_generation == Some(3)));
    }
}
