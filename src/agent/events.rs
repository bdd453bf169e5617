//! Kubernetes Events (events.k8s.io/v1) for every transition and refusal:
//! on the nodes for what drover did to them, and on the status object for
//! the rollout and the config. Publishing is best effort: a refused Event
//! is logged and never stops the agent.

use crate::rollout::Action;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;

/// Publishes the agent's Events; without a client (simulations) it only logs.
#[derive(Clone)]
pub struct Events {
    recorder: Option<Recorder>,
    status_ref: ObjectReference,
    /// Failed publications are logged once a minute (an API outage fails them all).
    failures: std::sync::Arc<super::retry::Paced>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("status_ref", &self.status_ref)
            .finish()
    }
}

/// Severity of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl Events {
    /// Events reported by `instance` (the pod name) about the status object `namespace/name`.
    pub fn new(client: Option<Client>, instance: &str, namespace: &str, name: &str) -> Self {
        let reporter = Reporter {
            controller: "drover.dev/agent".into(),
            instance: Some(instance.to_string()),
        };
        Events {
            recorder: client.map(|c| Recorder::new(c, reporter)),
            status_ref: ObjectReference {
                api_version: Some("drover.dev/v1alpha1".into()),
                kind: Some("DroverStatus".into()),
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            failures: Default::default(),
        }
    }

    /// Set the status object's uid once known, so `kubectl describe` finds the Events.
    pub fn set_status_uid(&mut self, uid: Option<String>) {
        self.status_ref.uid = uid;
    }

    async fn publish(
        &self,
        reference: &ObjectReference,
        severity: Severity,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let what = reference.name.as_deref().unwrap_or("");
        match severity {
            Severity::Normal => tracing::info!(object = what, reason, note = %note, "event"),
            Severity::Warning => tracing::warn!(object = what, reason, note = %note, "event"),
        }
        let Some(rec) = &self.recorder else { return };
        // The API caps notes at 1 kB.
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let ev = Event {
            type_: match severity {
                Severity::Normal => EventType::Normal,
                Severity::Warning => EventType::Warning,
            },
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = rec.publish(&ev, reference).await {
            if let Some(n) = self.failures.allow("event") {
                tracing::warn!(error = %e, reason, suppressed = n, "could not publish an Event");
            }
        }
    }

    /// An Event on the status object.
    pub async fn on_status(&self, severity: Severity, reason: &str, action: &str, note: String) {
        self.publish(&self.status_ref.clone(), severity, reason, action, note)
            .await;
    }

    /// An Event on a node.
    pub async fn on_node(
        &self,
        node: &str,
        severity: Severity,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..Default::default()
        };
        self.publish(&reference, severity, reason, action, note)
            .await;
    }

    /// The Event for an engine action on a node; `None` for actions too frequent to record (eviction passes).
    pub async fn on_action(&self, action: &Action) {
        let (sev, reason, note) = match action {
            Action::Cordon { progress, .. } => (
                Severity::Normal,
                "Draining",
                format!("cordoned and draining to move to {}", progress.target),
            ),
            Action::Evict { .. } => return,
            Action::StartUpgrade { progress, .. } => (
                Severity::Normal,
                "UpgradeStarted",
                format!("drained; OS upgrade to {} started", progress.target),
            ),
            Action::Block { progress, .. } => (
                Severity::Warning,
                "DrainBlocked",
                format!("node given back: {}", progress.message),
            ),
            Action::Fail { progress, .. } => (
                Severity::Warning,
                "UpgradeFailed",
                format!("node given back: {}", progress.message),
            ),
            Action::Complete { .. } => (
                Severity::Normal,
                "Upgraded",
                "Ready at the target version; uncordoned".to_string(),
            ),
            Action::Watch { progress, .. } => (
                Severity::Normal,
                "HealthWatch",
                format!(
                    "Ready at {}; uncordoned, its health is watched",
                    progress.target
                ),
            ),
            Action::Pass { progress, .. } => (
                Severity::Normal,
                "HealthPassed",
                format!("every health check held at {}", progress.target),
            ),
            Action::Unhealthy { progress, .. } => (
                Severity::Warning,
                "HealthCheckFailed",
                format!("{}; rollout stopped", progress.message),
            ),
            Action::Clear { .. } => (
                Severity::Normal,
                "Cleared",
                "drover's record on the node was cleared".to_string(),
            ),
        };
        self.on_node(action.node(), sev, reason, action.kind(), note)
            .await;
    }
}
