//! The upgrade Jobs' namespace with the Bottlerocket component: the agent's
//! ServiceAccount can create the Job the driver builds, and nothing that
//! would give it the host (a hostPath outside the driver's two, privileged
//! mode, the host's PID namespace). Against the real API server, with the
//! manifests of deploy/ applied as they ship.

use std::time::{Duration, Instant};

use crate::support::agent::client_as;
use crate::support::backend::{kube_options, pool_options, start_sim};
use crate::support::kube::{apply_deploy_file, ControlPlane, TestNamespace, WAIT};
use chrono::Utc;
use drover::cluster::{NodeProgress, ProgressState};
use drover::kubernetes::driver::upgrade_job;
use drover::kubernetes::node::ObservedNode;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};

const SERVICE_ACCOUNT: &str = "system:serviceaccount:drover-system:drover";

fn with(job: &Job, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Job {
    let mut v = serde_json::to_value(job).unwrap();
    v["metadata"]["name"] = name.into();
    edit(&mut v["spec"]["template"]["spec"]);
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn the_agent_can_create_the_driver_job_and_nothing_that_takes_the_host() {
    let cp = ControlPlane::get();
    let admin = cp.admin_client().await;
    for f in [
        "base/namespace.yaml",
        "base/serviceaccount.yaml",
        "base/rbac.yaml",
        "components/bottlerocket-host-access/admission-policy.yaml",
    ] {
        apply_deploy_file(&admin, f, "default").await;
    }
    // The component's namespace patch.
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    ns.patch(
        "drover-upgrades",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "metadata": { "labels": {
            "pod-security.kubernetes.io/enforce": "privileged" } } })),
    )
    .await
    .unwrap();

    let pool = TestNamespace::create(&admin, "jobs-policy").await;
    let sim = start_sim(&admin, pool_options(pool.name(), 1)).await;
    let node_name = sim.node_names()[0].clone();
    let node: ObservedNode = Api::all(admin.clone()).get(&node_name).await.unwrap();
    let mut opts = kube_options(pool.name());
    opts.namespace = "drover-upgrades".into();
    let progress = NodeProgress {
        state: ProgressState::Upgrading,
        target: semver::Version::new(1, 13, 0),
        started_at: Utc::now(),
        cordoned_by_drover: true,
        message: String::new(),
        attempts: 0,
    };
    let driver_job = upgrade_job(&opts, &node, &progress).unwrap();

    let agent = client_as(Some(SERVICE_ACCOUNT)).await;
    let jobs: Api<Job> = Api::namespaced(agent, "drover-upgrades");
    let forged = [
        with(&driver_job, "host-root", |p| {
            p["volumes"][0]["hostPath"]["path"] = "/".into();
        }),
        with(&driver_job, "privileged", |p| {
            p["containers"][0]["securityContext"]["privileged"] = true.into();
        }),
        with(&driver_job, "host-pid", |p| {
            p["hostPID"] = true.into();
        }),
        with(&driver_job, "with-token", |p| {
            p["automountServiceAccountToken"] = true.into();
        }),
    ];
    // The policy takes effect shortly after it is created: wait until the
    // first forged Job is refused, then every other must be refused too.
    // Server-side dry runs: admission runs in full, nothing is stored.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + WAIT;
    loop {
        match jobs.create(&dry, &forged[0]).await {
            Err(kube::Error::Api(s)) if s.message.contains("drover's upgrade Jobs") => break,
            Ok(_) => {}
            Err(e) => panic!("unexpected refusal: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the admission policy never took effect"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for job in &forged {
        let name = job.metadata.name.clone().unwrap();
        match jobs.create(&dry, job).await {
            Err(kube::Error::Api(s)) => {
                assert!(
                    s.message.contains("drover's upgrade Jobs"),
                    "{name}: {}",
                    s.message
                )
            }
            other => panic!("{name} was admitted: {other:?}"),
        }
    }
    // Control: the Job the driver builds is admitted, under the same policy.
    jobs.create(&PostParams::default(), &driver_job)
        .await
        .unwrap_or_else(|e| panic!("the driver's own Job was refused: {e}"));
    // And the agent cannot create Jobs anywhere else.
    let elsewhere: Api<Job> = Api::namespaced(client_as(Some(SERVICE_ACCOUNT)).await, pool.name());
    let err = elsewhere
        .create(
            &PostParams::default(),
            &with(&driver_job, "elsewhere", |_| {}),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err}"
    );
    sim.shutdown().await;
}
