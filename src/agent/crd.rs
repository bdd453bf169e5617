//! The `DroverStatus` custom resource: the agent's state readable with
//! `kubectl get dst`, and the durable home of the last applied commit (the
//! git cache is an emptyDir and memory does not survive a restart).

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Field manager of every write the agent makes to its status object.
pub const FIELD_MANAGER: &str = "drover-agent";

/// Annotation a follower sets on the status object when a webhook reached
/// it, so that the leader (which watches the object) fetches at once.
pub const ANN_FETCH_REQUESTED: &str = "drover.dev/fetch-requested";

/// The last fetch request a follower stamped on the status object, if any.
pub fn fetch_request_stamp(o: &DroverStatus) -> Option<String> {
    o.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_FETCH_REQUESTED).cloned())
}

// Printer columns are raw JSON: the list form trips clippy::duplicated_attributes
// on the repeated `type_ = "string"`.
/// Desired identity of a status object: which environment and cluster it describes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "drover.dev",
    version = "v1alpha1",
    kind = "DroverStatus",
    namespaced,
    shortname = "dst",
    status = "DroverStatusStatus",
    doc = "The drover agent's view of one cluster of one environment: target, rollout state, window, applied commit.",
    printcolumn = r#"{"name":"Environment","type":"string","jsonPath":".spec.environment"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".status.target"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"At Version","type":"string","jsonPath":".status.atVersion"}"#,
    printcolumn = r#"{"name":"Next Window","type":"string","jsonPath":".status.nextWindow"}"#,
    printcolumn = r#"{"name":"Commit","type":"string","jsonPath":".status.commit"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DroverStatusSpec {
    /// Environment the agent serves (`--env`).
    pub environment: String,
    /// Cluster name the agent reports as (`--cluster`).
    pub cluster: String,
}

/// What the agent last observed and did; written only through the status subresource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DroverStatusStatus {
    /// The pinned version being applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Rollout state: pending, paused, rolling, confirmed, blocked or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// When `state` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Selected nodes Ready at the target over selected nodes, e.g. "4/6".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_version: Option<String>,
    /// Selected nodes.
    #[serde(default)]
    pub nodes: u32,
    /// Selected nodes Ready at the target.
    #[serde(default)]
    pub nodes_at_version: u32,
    /// "open until <time>" while a window is open, else the next opening (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<String>,
    /// Whether a maintenance window is open.
    #[serde(default)]
    pub window_open: bool,
    /// Short id of the last applied commit, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Full id of the last applied (trusted, valid, gate-passed) config commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_commit: Option<String>,
    /// The version the last applied commit pins: the gate's `previous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_version: Option<String>,
    /// The newest fetched head of the config branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_commit: Option<String>,
    /// Why the newest head is not applied, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refused>,
    /// Why the state is what it is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the last fetch finished (RFC 3339) and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fetch: Option<FetchRecord>,
    /// Pod name of the replica that wrote this status (the leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporter: Option<String>,
}

/// A config head the agent refused to apply.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    /// The refused commit.
    pub commit: String,
    /// Which check refused it: trust, config or gate.
    pub stage: String,
    /// Machine-readable reason (`unsigned`, `invalid`, `not_confirmed`, ...).
    pub reason: String,
    /// Human-readable explanation.
    pub message: String,
}

/// The outcome of one fetch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FetchRecord {
    /// When it finished (RFC 3339).
    pub time: String,
    /// `ok` or the error.
    pub result: String,
}

/// The CRD as the API server takes it.
pub fn crd(
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    DroverStatus::crd()
}

/// The CRD rendered as `deploy/base/crd.yaml` holds it: pretty JSON (valid YAML), newline-terminated.
pub fn crd_manifest() -> String {
    // Serialising a typed CRD cannot fail; fall back to an empty document rather than panic.
    let mut s = serde_json::to_string_pretty(&crd()).unwrap_or_default();
    s.push('\n');
    s
}

/// Errors reading or writing the status object.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or could not be reached.
    #[error("status object {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// The agent's status object: `<namespace>/<name>`, one per agent.
#[derive(Clone)]
pub struct StatusObject {
    api: Api<DroverStatus>,
    name: String,
    namespace: String,
    spec: DroverStatusSpec,
}

impl std::fmt::Debug for StatusObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StatusObject({}/{})", self.namespace, self.name)
    }
}

impl StatusObject {
    /// The store for the object `name` in `namespace` describing `spec`.
    pub fn new(client: Client, namespace: &str, name: &str, spec: DroverStatusSpec) -> Self {
        StatusObject {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            namespace: namespace.to_string(),
            spec,
        }
    }

    /// Object name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn err(&self, source: kube::Error) -> Error {
        Error::Api {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// Read the object, creating it (empty status) when absent.
    pub async fn load_or_create(&self) -> Result<DroverStatus, Error> {
        if let Some(obj) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.err(e))?
        {
            return Ok(obj);
        }
        let obj = DroverStatus::new(&self.name, self.spec.clone());
        match self.api.create(&PostParams::default(), &obj).await {
            Ok(o) => Ok(o),
            // Another replica created it between our get and create.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.api.get(&self.name).await.map_err(|e| self.err(e))
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// Ask the leader to fetch now (a follower received a webhook).
    pub async fn request_fetch(&self) -> Result<(), Error> {
        let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let patch =
            serde_json::json!({ "metadata": { "annotations": { ANN_FETCH_REQUESTED: stamp } } });
        self.api
            .patch(
                &self.name,
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Yields whenever a follower asks for a fetch ([`Self::request_fetch`]):
    /// whenever the request stamp differs from the last one seen, starting
    /// from `seen`, the stamp on the object when the caller last read it.
    ///
    /// The watch starts when the stream is first polled, after the leader's
    /// first pass; a request made in between shows up in the initial list,
    /// which is why the initial list is compared too, not taken as the base.
    /// A relist after a watch error is compared the same way. An extra fetch
    /// is harmless; a lost request would wait for the next poll.
    ///
    /// Errors (API server unreachable, 403) are retried with kube's default
    /// backoff (jittered, up to 30 s) and logged at most once a minute.
    pub fn fetch_requests(&self, seen: Option<String>) -> futures::stream::BoxStream<'static, ()> {
        use futures::StreamExt;
        use kube::runtime::{watcher, WatchStreamExt};
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut seen = seen;
        let mut quiet = crate::retry::Quiet::new(std::time::Duration::from_secs(60));
        let what = format!("{}/{}", self.namespace, self.name);
        watcher::watcher(self.api.clone(), cfg)
            .default_backoff()
            .filter_map(move |ev| {
                if let Err(e) = &ev {
                    if let Some(n) = quiet.allow() {
                        tracing::warn!(object = %what, error = %e, suppressed = n, "watch of the status object failed; retrying with backoff");
                    }
                }
                let fire = match ev {
                    Ok(watcher::Event::InitApply(o) | watcher::Event::Apply(o)) => {
                        let stamp = fetch_request_stamp(&o);
                        let new = stamp.is_some() && stamp != seen;
                        seen = stamp;
                        new
                    }
                    Ok(
                        watcher::Event::InitDone | watcher::Event::Init | watcher::Event::Delete(_),
                    )
                    | Err(_) => false,
                };
                futures::future::ready(fire.then_some(()))
            })
            .boxed()
    }

    /// Replace the status (merge patch of the whole status subresource).
    pub async fn write(&self, status: &DroverStatusStatus) -> Result<(), Error> {
        // A merge patch with explicit nulls for absent fields, so a cleared
        // field (e.g. `refused`) is removed rather than kept from before.
        let mut value = serde_json::to_value(status).unwrap_or_default();
        if let serde_json::Value::Object(map) = &mut value {
            for key in [
                "target",
                "state",
                "since",
                "atVersion",
                "nextWindow",
                "commit",
                "lastAppliedCommit",
                "appliedVersion",
                "headCommit",
                "refused",
                "message",
                "lastFetch",
                "reporter",
            ] {
                map.entry(key).or_insert(serde_json::Value::Null);
            }
        }
        let patch = serde_json::json!({ "status": value });
        self.api
            .patch_status(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_has_the_columns_kubectl_shows() {
        let crd = crd();
        assert_eq!(crd.spec.group, "drover.dev");
        assert_eq!(crd.spec.names.short_names, Some(vec!["dst".to_string()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some());
        let cols: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            [
                "Environment",
                "Target",
                "State",
                "At Version",
                "Next Window",
                "Commit",
                "Message",
                "Age"
            ]
        );
    }
}
