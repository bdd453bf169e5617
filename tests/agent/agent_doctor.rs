//! `drover doctor` on an install whose repository is reachable: a signed
//! config repository served by `git daemon`, the agent's Deployment,
//! ConfigMap and Secrets in a namespace of the real API server. Every git
//! check passes as the agent's first pass would; what is wrong is named
//! with what to do: a ServiceAccount without grants, this build's
//! placeholder updater digest, (the control) a report key that
//! `report_signers` does not list, and a git server whose pre-receive hook
//! refuses the status branches (the push check, which passes first).

use crate::support::agent::*;
use crate::support::kube::{apply_yaml, ControlPlane, TestNamespace};
use serde_json::{json, Value};

fn doctor(ns: &str) -> (i32, Value) {
    let out = crate::support::cli::drover_command()
        .args(["doctor", "-o", "json", "--namespace", ns, "--kubeconfig"])
        .arg(ControlPlane::get().kubeconfig_path())
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), doc)
}

/// (result, message, fix) of the check `name`.
fn check(doc: &Value, name: &str) -> (String, String, String) {
    let c = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {doc:#}"));
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (s("result"), s("message"), s("fix"))
}

fn secret(name: &str, key: &str, value: &[u8]) -> String {
    let data = serde_json::to_value(k8s_openapi::ByteString(value.to_vec())).unwrap();
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name },
        "data": { key: data },
    }))
    .unwrap()
}

#[tokio::test]
async fn doctor_passes_what_the_agent_s_first_pass_needs_and_names_what_is_missing() {
    let client = ControlPlane::get().admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "doctor").await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let objects = [
        secret(
            "signers",
            "allowed_signers",
            &std::fs::read(&repo.signers).unwrap(),
        ),
        secret(
            "report",
            "key",
            &std::fs::read(&repo.report_keys["test-1"]).unwrap(),
        ),
        serde_json::to_string(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "drover-agent" },
            "data": { "DROVER_ENV": "test", "DROVER_CLUSTER": "test-1", "DROVER_REPO": repo.url() },
        }))
        .unwrap(),
        serde_json::to_string(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "drover" },
            "spec": {
                "selector": { "matchLabels": { "app": "drover" } },
                "template": {
                    "metadata": { "labels": { "app": "drover" } },
                    "spec": {
                        "serviceAccountName": "drover",
                        "containers": [{
                            "name": "agent", "image": "drover:test",
                            "envFrom": [{ "configMapRef": { "name": "drover-agent" } }],
                            "env": [
                                { "name": "DROVER_ALLOWED_SIGNERS", "value": "/etc/drover/signers/allowed_signers" },
                                { "name": "DROVER_STATUS_SIGNING_KEY", "value": "/etc/drover/report/key" },
                            ],
                            "volumeMounts": [
                                { "name": "signers", "mountPath": "/etc/drover/signers" },
                                { "name": "report", "mountPath": "/etc/drover/report" },
                            ],
                        }],
                        "volumes": [
                            { "name": "signers", "secret": { "secretName": "signers" } },
                            { "name": "report", "secret": { "secretName": "report" } },
                        ],
                    },
                },
            },
        }))
        .unwrap(),
    ];
    apply_yaml(&client, &objects.join("\n---\n"), ns.name(), false)
        .await
        .unwrap();

    let (code, doc) = doctor(ns.name());
    assert_eq!(code, 1, "{doc:#}");
    for name in [
        "crd",
        "deployment",
        "secrets",
        "repository",
        "signature",
        "config",
        "report-signer",
        "status-branches",
        "status-push",
        "next-window",
    ] {
        assert_eq!(check(&doc, name).0, "pass", "{name}: {doc:#}");
    }
    assert!(
        check(&doc, "signature").1.contains("reviewer@example.com"),
        "{doc:#}"
    );
    // Nothing binds the ServiceAccount: every grant is missing, and said so.
    let (result, message, fix) = check(&doc, "rbac");
    assert_eq!(result, "fail");
    assert!(
        message.contains(&format!("system:serviceaccount:{}:drover", ns.name()))
            && message.contains("patch nodes")
            && message.contains(&format!("create leases in {}", ns.name())),
        "{message}"
    );
    assert!(fix.contains("rbac.yaml"), "{fix}");
    // A test build's updater image is the tests' stand-in digest.
    let (result, _, fix) = check(&doc, "updater-image");
    assert_eq!(result, "fail");
    assert!(fix.contains("release build"), "{fix}");

    // The control: a report key report_signers does not list.
    let other = std::fs::read(&repo.key).unwrap();
    apply_yaml(&client, &secret("report", "key", &other), ns.name(), false)
        .await
        .unwrap();
    let (_, doc) = doctor(ns.name());
    let (result, message, fix) = check(&doc, "report-signer");
    assert_eq!(result, "fail", "{doc:#}");
    assert!(message.contains("does not list"), "{message}");
    assert!(
        fix.contains("test/test-1 namespaces=\"git\" ssh-ed25519 "),
        "{fix}"
    );

    // The forge refuses the status branches (a pre-receive hook, as a
    // branch rule answers): doctor says so with the server's words and what
    // to change, and leaves no branch behind.
    let (_, message, _) = check(&doc, "status-push");
    assert!(
        message.contains("drover/status.d/test/test-1.doctor-"),
        "{message}"
    );
    repo.refuse_status_pushes("status branches are protected");
    let (code, doc) = doctor(ns.name());
    assert_eq!(code, 1);
    let (result, message, fix) = check(&doc, "status-push");
    assert_eq!(result, "fail", "{doc:#}");
    assert!(
        message.contains("status branches are protected"),
        "{message}"
    );
    assert!(
        fix.contains("let the agent's credentials push to drover/status.d/test/test-1"),
        "{fix}"
    );
    assert_eq!(check(&doc, "repository").0, "pass");
    let heads = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&repo.bare)
        .args(["for-each-ref", "--format=%(refname)", "refs/heads/drover/"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&heads.stdout).contains(".doctor-"),
        "{}",
        String::from_utf8_lossy(&heads.stdout)
    );
}
