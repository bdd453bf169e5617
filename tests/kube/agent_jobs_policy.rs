//! The upgrade Jobs' namespace with the Bottlerocket component, against the
//! real API server with the manifests of deploy/ applied as they ship: the
//! agent's ServiceAccount can create the Job the driver builds and nothing
//! else. Every refusal docs/install.md lists ("Refused by the admission
//! policy": the field of drover's Job and the value tried) is tried here, so
//! the document's security claims are what the policy enforces; and the
//! component's ResourceQuota bounds the upgrade pods running at once.

use std::time::{Duration, Instant};

use crate::support::agent::client_as;
use crate::support::backend::{kube_options, pool_options, run_start, start_sim};
use crate::support::kube::{apply_deploy_file, ControlPlane, TestNamespace, WAIT};
use chrono::Utc;
use drover::cluster::{NodeProgress, ProgressState};
use drover::config::{DriverSpec, TEST_UPDATER_IMAGE};
use drover::kubernetes::driver::upgrade_job;
use drover::kubernetes::node::ObservedNode;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

const SERVICE_ACCOUNT: &str = "system:serviceaccount:drover-system:drover";
const COMPONENT: &str = "deploy/components/bottlerocket-host-access";
/// Every refusal of the policy says this (or names the ConfigMap).
const REFUSED: &str = "drover's upgrade Jobs";

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `updater.env` read as kustomize's configMapGenerator reads `envs`:
/// KEY=VALUE lines, blank lines and `#` comments skipped.
fn updater_env() -> Vec<(String, String)> {
    repo_file(&format!("{COMPONENT}/updater.env"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// The ConfigMap the component generates from `updater.env`, with
/// `image` as a release writes it (deploy/updater/pin) and `min_version`.
fn updater_config_map(image: &str, min_version: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "drover-updater", "namespace": "drover-upgrades" },
        "data": { "image": image, "min_version": min_version },
    }))
    .unwrap()
}

/// One row of docs/install.md's "Refused by the admission policy" tables.
struct Refusal {
    what: String,
    /// JSON pointer into the pod template's spec (or, `job`, the Job's spec).
    pointer: String,
    job: bool,
    value: Value,
    /// What the refusal's message says after "drover's upgrade Jobs ".
    says: String,
}

fn documented_refusals() -> Vec<Refusal> {
    let mut rows = refusals_after("**Refused by the admission policy**", false);
    rows.extend(refusals_after("**Refused for the Job itself**", true));
    assert!(rows.len() >= 24, "only {} documented refusals", rows.len());
    rows
}

fn refusals_after(heading: &str, job: bool) -> Vec<Refusal> {
    let docs = repo_file("docs/install.md");
    let start = docs
        .find(heading)
        .unwrap_or_else(|| panic!("docs/install.md has {heading}"));
    docs[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 4, "{l}");
            let unquote = |c: &str| c.trim_matches('`').to_string();
            let value = serde_json::from_str(&unquote(cells[2]))
                .unwrap_or_else(|e| panic!("{l}: the value is not JSON: {e}"));
            Refusal {
                what: cells[0].to_string(),
                pointer: unquote(cells[1]),
                job,
                value,
                says: format!("{REFUSED} {}", cells[3]),
            }
        })
        .collect()
}

/// Set `pointer` (RFC 6901, `-` appends to an array) in `doc` to `value`,
/// creating missing objects on the way.
fn set_pointer(doc: &mut Value, pointer: &str, value: Value) {
    let mut parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    let last = parts.pop().expect("a non-empty pointer");
    let mut at = doc;
    for p in parts {
        at = match at {
            Value::Array(a) => &mut a[p.parse::<usize>().expect("an index")],
            other => {
                if other.get(p).is_none() {
                    other[p] = json!({});
                }
                &mut other[p]
            }
        };
    }
    match at {
        Value::Array(a) if last == "-" => a.push(value),
        Value::Array(a) => a[last.parse::<usize>().expect("an index")] = value,
        other => other[last] = value,
    }
}

fn forged(job: &Job, name: &str, edit: impl FnOnce(&mut Value)) -> Job {
    let mut v = serde_json::to_value(job).unwrap();
    v["metadata"]["name"] = name.into();
    edit(&mut v["spec"]["template"]["spec"]);
    serde_json::from_value(v).unwrap()
}

/// `r` applied to drover's own Job.
fn forged_by(job: &Job, name: &str, r: &Refusal) -> Job {
    let mut v = serde_json::to_value(job).unwrap();
    v["metadata"]["name"] = name.into();
    let at = if r.job {
        &mut v["spec"]
    } else {
        &mut v["spec"]["template"]["spec"]
    };
    set_pointer(at, &r.pointer, r.value.clone());
    serde_json::from_value(v).unwrap()
}

/// The refusal's message, or None if the Job was admitted.
async fn refusal(jobs: &Api<Job>, job: &Job) -> Option<String> {
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match jobs.create(&dry, job).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.message),
        Err(e) => panic!("{e}"),
    }
}

/// Poll (the policy's state shows in no watch) until `job`'s admission is
/// `refused`: the API server applies a new policy or parameter shortly after
/// it is written.
async fn until_admission(jobs: &Api<Job>, job: &Job, refused: bool, what: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        if refusal(jobs, job).await.is_some() == refused {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: never took effect");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
    // The component's namespace patch and its generated ConfigMap.
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    ns.patch(
        "drover-upgrades",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "metadata": { "labels": {
            "pod-security.kubernetes.io/enforce": "privileged" } } })),
    )
    .await
    .unwrap();
    // As a release's tree has it: the image it built, pinned by
    // deploy/updater/pin, and the floor as shipped.
    let env = updater_env();
    let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["image", "min_version"], "{env:?}");
    let floor = env[1].1.clone();
    let pinned = TEST_UPDATER_IMAGE.to_string();
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "drover-upgrades");
    let apply = PatchParams::apply("drover-install").force();
    config_maps
        .patch(
            "drover-updater",
            &apply,
            &Patch::Apply(&updater_config_map(&pinned, &floor)),
        )
        .await
        .unwrap();

    let pool = TestNamespace::create(&admin, "jobs-policy").await;
    let sim = start_sim(&admin, pool_options(pool.name(), 1)).await;
    let node_name = sim.node_names()[0].clone();
    let node: ObservedNode = Api::all(admin.clone()).get(&node_name).await.unwrap();
    let mut opts = kube_options(pool.name());
    opts.namespace = "drover-upgrades".into();
    opts.driver = DriverSpec::Bottlerocket {
        image: Some(pinned.clone()),
    };
    let progress = NodeProgress {
        state: ProgressState::Upgrading,
        target: semver::Version::new(1, 13, 0),
        started_at: Utc::now(),
        cordoned_by_drover: true,
        message: String::new(),
        retries: 0,
        previous: None,
    };
    let driver_job = upgrade_job(&opts, &node, &run_start(&node_name, &progress)).unwrap();

    let agent = client_as(Some(SERVICE_ACCOUNT)).await;
    let jobs: Api<Job> = Api::namespaced(agent.clone(), "drover-upgrades");
    let documented = documented_refusals();
    let first = forged_by(&driver_job, "first", &documented[0]);
    until_admission(&jobs, &first, true, "the admission policy").await;

    let mut wrong = Vec::new();
    for (i, r) in documented.iter().enumerate() {
        let job = forged_by(&driver_job, &format!("forged-{i}"), r);
        match refusal(&jobs, &job).await {
            Some(m) if m.contains(&r.says) => {}
            other => wrong.push(format!(
                "{} ({} = {}): expected a refusal saying {:?}, got {other:?}",
                r.what, r.pointer, r.value, r.says
            )),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");

    // Controls, under the same policy: the same image by its digest from a
    // mirror, and drover's own Job, created for real.
    let digest = pinned.rsplit_once('@').unwrap().1;
    let mirrored = forged(&driver_job, "mirrored", |p| {
        p["containers"][0]["image"] = format!("mirror.example.com/updater@{digest}").into();
    });
    assert_eq!(refusal(&jobs, &mirrored).await, None, "the mirrored image");
    jobs.create(&PostParams::default(), &driver_job)
        .await
        .unwrap_or_else(|e| panic!("the driver's own Job was refused: {e}"));
    // Its download before the drain (DROVER_ACTION=prepare), on the node in service.
    let prepare = NodeProgress {
        state: ProgressState::Preparing,
        cordoned_by_drover: false,
        ..progress.clone()
    };
    let prepare_job = upgrade_job(&opts, &node, &run_start(&node_name, &prepare)).unwrap();
    jobs.create(&PostParams::default(), &prepare_job)
        .await
        .unwrap_or_else(|e| panic!("the driver's own prepare Job was refused: {e}"));

    // The agent can change none of this, nor create anything elsewhere.
    let as_agent: Api<ConfigMap> = Api::namespaced(agent.clone(), "drover-upgrades");
    let err = as_agent
        .patch(
            "drover-updater",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "data": { "image": "evil.example.com/x:1" } })),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err}"
    );
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "direct" },
        "spec": driver_job.spec.as_ref().unwrap().template.spec.clone(),
    }))
    .unwrap();
    let err = Api::<Pod>::namespaced(agent.clone(), "drover-upgrades")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err}"
    );
    let elsewhere: Api<Job> = Api::namespaced(agent, pool.name());
    let err = elsewhere
        .create(
            &PostParams::default(),
            &forged(&driver_job, "elsewhere", |_| {}),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err}"
    );

    // A parameter naming a tag pins nothing: every Job is refused, drover's
    // own included, until a digest is back.
    config_maps
        .patch(
            "drover-updater",
            &apply,
            &Patch::Apply(&updater_config_map(
                "ghcr.io/drover-dev/bottlerocket-updater:v0.1.0",
                &floor,
            )),
        )
        .await
        .unwrap();
    let again = forged(&driver_job, "again", |_| {});
    until_admission(&jobs, &again, true, "the tag in the parameter").await;
    let m = refusal(&jobs, &again).await.unwrap();
    assert!(m.contains("must pin the updater image by digest"), "{m}");
    // The floor raised above drover's own target: refused, naming it; a
    // ConfigMap without a floor refuses everything.
    for (floor_now, says) in [
        ("1.13.1", "may not move a node below min_version 1.13.1"),
        ("", "must set min_version"),
    ] {
        config_maps
            .patch(
                "drover-updater",
                &apply,
                &Patch::Apply(&updater_config_map(&pinned, floor_now)),
            )
            .await
            .unwrap();
        until_admission(&jobs, &again, true, "the raised floor").await;
        let m = refusal(&jobs, &again).await.unwrap();
        assert!(m.contains(says), "{m}");
    }
    config_maps
        .patch(
            "drover-updater",
            &apply,
            &Patch::Apply(&updater_config_map(&pinned, "1.13.0")),
        )
        .await
        .unwrap();
    until_admission(&jobs, &again, false, "the digest and the floor back").await;
    sim.shutdown().await;
}

/// The component's ResourceQuota, applied as it ships (in a namespace of
/// the test's own, so no other test's pods count): pods beyond its bound
/// are refused, whoever creates them. The quota's `status.used` is kept by
/// kube-controller-manager, which this control plane does not run: the
/// test writes the status the controller would (nothing used yet), and
/// the API server's quota admission counts each pod admitted.
#[tokio::test]
async fn the_quota_bounds_the_upgrade_pods_running_at_once() {
    let cp = ControlPlane::get();
    let admin = cp.admin_client().await;
    let ns = TestNamespace::create(&admin, "jobs-quota").await;
    let text = repo_file(&format!("{COMPONENT}/resource-quota.yaml"));
    let mut quota: Value = serde_yaml::from_str(&text).unwrap();
    quota["metadata"]["namespace"] = ns.name().into();
    let hard: u32 = quota["spec"]["hard"]["pods"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        hard >= 2,
        "room for one node's prepare and upgrade at least"
    );
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(admin.clone(), ns.name());
    let name = quota["metadata"]["name"].as_str().unwrap().to_string();
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(quota).unwrap(),
        )
        .await
        .unwrap();
    quotas
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": {
                "hard": { "pods": hard.to_string() }, "used": { "pods": "0" } } })),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns.name());
    let pod = |i: u32| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": format!("upgrade-{i}") },
            "spec": { "containers": [{ "name": "update", "image": TEST_UPDATER_IMAGE }] },
        }))
        .unwrap()
    };
    for i in 0..hard {
        pods.create(&PostParams::default(), &pod(i))
            .await
            .unwrap_or_else(|e| panic!("pod {i} of {hard}: {e}"));
    }
    let err = pods
        .create(&PostParams::default(), &pod(hard))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403 && s.message.contains(&format!("exceeded quota: {name}"))),
        "{err}"
    );
}

#[test]
fn the_component_ships_no_placeholder_and_the_pin_writes_the_image() {
    // The tree holds no image: a release pins the one it built
    // (deploy/updater/pin, run by .github/release/prepare) in the tree it
    // tags; until then the policy refuses every Job (tested above).
    let env = updater_env();
    assert_eq!(env[0], ("image".to_string(), String::new()));
    for file in ["src/config/model.rs", "example-repo/environments/test.toml"] {
        assert!(
            !repo_file(file).contains(&"0".repeat(64)),
            "{file} has a placeholder digest"
        );
    }
    // deploy/updater/pin, on a copy of the tree, writes the reference and
    // refuses a tag or the all-zero digest.
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(dir.path().join(COMPONENT)).unwrap();
    std::fs::copy(
        root.join(COMPONENT).join("updater.env"),
        dir.path().join(COMPONENT).join("updater.env"),
    )
    .unwrap();
    let pin = |reference: &str| {
        std::process::Command::new(root.join("deploy/updater/pin"))
            .arg(reference)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    for bad in [
        "ghcr.io/drover-dev/bottlerocket-updater:v0.1.0".to_string(),
        format!(
            "ghcr.io/drover-dev/bottlerocket-updater@sha256:{}",
            "0".repeat(64)
        ),
    ] {
        let out = pin(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
    let out = pin(TEST_UPDATER_IMAGE);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(dir.path().join(COMPONENT).join("updater.env")).unwrap();
    assert!(
        written.contains(&format!("\nimage={TEST_UPDATER_IMAGE}\n")),
        "{written}"
    );
    assert!(written.contains("\nmin_version=1.0.0\n"), "{written}");

    let kustomization = repo_file(&format!("{COMPONENT}/kustomization.yaml"));
    assert!(kustomization.contains("- updater.env"), "{kustomization}");
    assert!(
        kustomization.contains("- resource-quota.yaml"),
        "{kustomization}"
    );
    let policy = repo_file(&format!("{COMPONENT}/admission-policy.yaml"));
    assert!(
        policy.contains(&format!(
            "['{}']",
            drover::kubernetes::driver::BOTTLEROCKET_COMMAND
        )),
        "the policy requires the driver's command"
    );
}
