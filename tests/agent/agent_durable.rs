//! An applied commit is made durable (written to the status object) before
//! it is acted on. When that write fails, the agent goes on from what the
//! status object says, all of it: not the new commit with the old one's
//! counts, nor the old commit with the new one's version. The write is
//! refused by a ValidatingAdmissionPolicy, as a real admission webhook or
//! policy engine can refuse it, against the real API server.

use std::sync::Arc;
use std::time::Duration;

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::kube::{apply_yaml, retry_until, ControlPlane, TestNamespace};
use drover::agent::crd::DroverStatus;
use drover::rollout::VirtualClock;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::json;

/// A policy, bound to namespace `ns` alone, that refuses any change of a
/// DroverStatus's applied commit, and a status whose message is "probe"
/// (how the test learns the policy is in force, on an object of its own).
fn policy(ns: &str) -> String {
    format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: freeze-applied-{ns}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["drover.dev"]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: ["droverstatuses", "droverstatuses/status"]
  variables:
    - name: now
      expression: "has(object.status) && has(object.status.lastAppliedCommit) ? object.status.lastAppliedCommit : ''"
    - name: before
      expression: "has(oldObject.status) && has(oldObject.status.lastAppliedCommit) ? oldObject.status.lastAppliedCommit : ''"
  validations:
    - expression: "variables.now == variables.before"
      message: the applied commit is frozen by the test
    - expression: "!has(object.status) || !has(object.status.message) || object.status.message != 'probe'"
      message: probe refused
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: freeze-applied-{ns}
spec:
  policyName: freeze-applied-{ns}
  validationActions: ["Deny"]
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {ns}
"#
    )
}

/// `status` without the fields every pass writes whatever commit it applies.
fn applied_part(status: &drover::agent::crd::DroverStatusStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(status).unwrap();
    let fields = v.as_object_mut().unwrap();
    for every_pass in ["headCommit", "lastFetch", "lastReportCommit", "conditions"] {
        fields.remove(every_pass);
    }
    v
}

#[tokio::test]
async fn an_applied_commit_that_cannot_be_made_durable_changes_nothing_the_status_says() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "durable").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.poll = Duration::from_secs(600);
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(1, 3, 0)));
    let agent = RunningAgent::start(cfg, clock, None);
    let first = await_status(&client, ns.name(), "test-test-1", "confirmed", |s| {
        s.state.as_deref() == Some("confirmed")
    })
    .await
    .status
    .unwrap();

    apply_yaml(&client, &policy(ns.name()), ns.name(), false)
        .await
        .unwrap();
    // The probe goes to an object of its own: an admission policy comes
    // into force some time after it is created, and a probe that lands
    // before would be a foreign write the agent adopts (message and all),
    // after which the policy refuses every write the agent makes.
    let dst: Api<DroverStatus> = Api::namespaced(client.clone(), ns.name());
    dst.create(
        &Default::default(),
        &DroverStatus::new(
            "probe",
            drover::agent::crd::DroverStatusSpec {
                environment: "probe".into(),
                cluster: "probe".into(),
            },
        ),
    )
    .await
    .unwrap();
    retry_until("the policy refuses a probe", || {
        let dst = dst.clone();
        async move {
            match dst
                .patch_status(
                    "probe",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({ "status": { "message": "probe" } })),
                )
                .await
            {
                Err(kube::Error::Api(e)) if e.message.contains("probe refused") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    let bump = repo.bump("test", "1.13.0", true);
    assert_eq!(agent.webhook().await, 202);
    // The agent fetched the bump and judged it (the head is written on
    // every pass); the write that would apply it was refused.
    let held = await_status(&client, ns.name(), "test-test-1", "bump fetched", |s| {
        s.head_commit.as_deref() == Some(bump.as_str())
    })
    .await
    .status
    .unwrap();
    // Not one field of what the applied commit says is left changed (the
    // applied commit, its short id, the applied version, the target, the
    // state and counts): all but what every pass writes whatever it
    // applies (the head, the fetch, the report pushed and the conditions
    // that follow them).
    assert_eq!(
        applied_part(&held),
        applied_part(&first),
        "a failed durable write leaves the last good status whole"
    );
    assert_eq!(sim.upgrades_started(&sim.node_names()[0]), 0);

    // The policy lifted: the commit is applied and rolled out, once.
    let api = ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: "ValidatingAdmissionPolicyBinding".into(),
        plural: "validatingadmissionpolicybindings".into(),
    };
    let bindings: Api<DynamicObject> = Api::all_with(client.clone(), &api);
    bindings
        .delete(
            &format!("freeze-applied-{}", ns.name()),
            &Default::default(),
        )
        .await
        .unwrap();
    let done = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "applied once the write lands",
        |s| {
            s.state.as_deref() == Some("confirmed")
                && s.last_applied_commit.as_deref() == Some(bump.as_str())
                && s.applied_version.as_deref() == Some("1.13.0")
        },
    )
    .await
    .status
    .unwrap();
    assert_eq!(done.target.as_deref(), Some("1.13.0"));
    assert_eq!(sim.upgrades_started(&sim.node_names()[0]), 1);
    let policies = ApiResource {
        kind: "ValidatingAdmissionPolicy".into(),
        plural: "validatingadmissionpolicies".into(),
        ..api
    };
    Api::<DynamicObject>::all_with(client.clone(), &policies)
        .delete(
            &format!("freeze-applied-{}", ns.name()),
            &Default::default(),
        )
        .await
        .unwrap();
    agent.stop();
    sim.shutdown().await;
}
