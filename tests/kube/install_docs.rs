//! The install path as a platform team walks it: docs/install.md's steps run
//! in their order with the real kubectl and kustomize (tests/tools) against a
//! real API server that starts empty, and every kustomization of deploy/ —
//! the base, each component, each overlay the document shows — rendered by
//! the real kustomize and accepted by the API server.
//!
//! The document is the script: its `sh` blocks under "## Install" run in
//! order, and its `yaml` blocks whose first line is `# clusters/...` are the
//! files they name. Two things are substituted, since nothing leaves this
//! machine: the overlay's `https://github.com/drover-dev/drover//deploy/...`
//! bases become a copy of this repository's deploy/, and `cosign` is a
//! stand-in that checks the identity the document verifies (the release
//! workflow's) and answers a fixed digest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::support::kube::{apply_yaml, client_from, ControlPlane};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// What the stand-in cosign answers as the signed digest of the agent image.
const DIGEST: &str = "sha256:4e1a5c0ffee0ddba11cafe0b5e55ed0d1ab1e5ca1ab1ede0a1f00d5eedbed0c5";
const GIT_TOKEN: &str = "ghp_install-docs-test-token";
/// The config repository the document names, and what the test puts in its
/// place: nothing leaves this machine, and nothing listens on port 1, so
/// `drover doctor` finds it unreachable at once.
const DOC_REPO: &str = "https://git.example.com/platform/drover-config.git";
const UNREACHABLE_REPO: &str = "http://127.0.0.1:1/platform/drover-config.git";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// kustomize, kubectl (and the linters), built once by tests/tools/build.
pub(crate) fn tools() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(root().join("tests/tools/build"))
            .output()
            .expect("running tests/tools/build");
        assert!(
            out.status.success(),
            "tests/tools/build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// One fenced block of docs/install.md, with the `## ` section it is in.
#[derive(Debug, Clone)]
struct Block {
    section: String,
    info: String,
    text: String,
}

impl Block {
    /// `clusters/...` when the block is a file of an overlay (its first line names it).
    fn file(&self) -> Option<&str> {
        let first = self.text.lines().next()?;
        let path = first.strip_prefix("# ")?.trim();
        (self.info == "yaml" && path.starts_with("clusters/")).then_some(path)
    }
}

fn install_doc() -> Vec<Block> {
    let text = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    let mut out = Vec::new();
    let mut section = String::new();
    let mut open: Option<Block> = None;
    for line in text.lines() {
        match &mut open {
            Some(_) if line.trim_start().starts_with("```") => out.push(open.take().unwrap()),
            Some(b) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            None if line.starts_with("```") => {
                open = Some(Block {
                    section: section.clone(),
                    info: line.trim_start_matches('`').trim().to_owned(),
                    text: String::new(),
                });
            }
            None if line.starts_with("## ") => section = line[3..].trim().to_owned(),
            None => {}
        }
    }
    assert!(open.is_none(), "docs/install.md has an unclosed code block");
    out
}

/// The overlay text with its remote bases pointed at `../../drover/deploy/...`
/// (a copy of this repository's deploy/ beside `clusters/`), after checking
/// that each names this release's tag.
fn localize(text: &str) -> String {
    let re = regex::Regex::new(
        r"https://github\.com/drover-dev/drover//(deploy/[a-z0-9/-]+)\?ref=(\S+)",
    )
    .unwrap();
    for c in re.captures_iter(text) {
        assert_eq!(
            &c[2],
            format!("v{VERSION}"),
            "docs/install.md names {} at {}, not this release",
            &c[1],
            &c[2]
        );
    }
    re.replace_all(text, "../../drover/$1")
        .replace(DOC_REPO, UNREACHABLE_REPO)
}

/// A work directory: `drover/deploy` (a copy of deploy/), `bin/cosign`
/// (the stand-in), and `clusters/` for the overlays.
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("drover")).unwrap();
    let copy = Command::new("cp")
        .arg("-r")
        .arg(root().join("deploy"))
        .arg(dir.path().join("drover/deploy"))
        .status()
        .unwrap();
    assert!(copy.success(), "copying deploy/");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // Answers like `cosign verify` does for a verified image, and only for
    // the identity the release workflow signs with (it runs on main).
    let identity =
        "https://github.com/drover-dev/drover/.github/workflows/release.yml@refs/heads/main"
            .to_string();
    let cosign = format!(
        r#"#!/bin/bash
set -eu
want=(verify ghcr.io/drover-dev/drover:v{VERSION} --certificate-identity {identity} --certificate-oidc-issuer https://token.actions.githubusercontent.com)
if [ "$*" != "${{want[*]}}" ]; then
  echo "cosign stand-in: expected: cosign ${{want[*]}}" >&2
  echo "cosign stand-in: got:      cosign $*" >&2
  exit 1
fi
echo "Verification for ghcr.io/drover-dev/drover:v{VERSION} --" >&2
echo '[{{"critical":{{"identity":{{"docker-reference":"ghcr.io/drover-dev/drover"}},"image":{{"docker-manifest-digest":"{DIGEST}"}},"type":"cosign container image signature"}},"optional":{{}}}}]'
"#
    );
    let path = bin.join("cosign");
    std::fs::write(&path, cosign).unwrap();
    chmod_x(&path);
    dir
}

fn chmod_x(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn path_env(work: &Path) -> String {
    let drover = Path::new(env!("CARGO_BIN_EXE_drover")).parent().unwrap();
    format!(
        "{}:{}:{}:{}",
        work.join("bin").display(),
        drover.display(),
        tools().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Run one `sh` block of the document in `work`, as a user's shell would.
fn run_step(work: &Path, kubeconfig: &Path, script: &str) {
    let out = shell(work, kubeconfig, script);
    assert!(
        out.status.success(),
        "docs/install.md step failed ({}):\n{script}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn shell(work: &Path, kubeconfig: &Path, script: &str) -> std::process::Output {
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(work)
        .env("PATH", path_env(work))
        .env("KUBECONFIG", kubeconfig)
        .env("GIT_TOKEN", GIT_TOKEN)
        .env("HOME", work)
        .output()
        .unwrap()
}

fn write_file(work: &Path, rel: &str, text: &str) {
    let p = work.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn kustomize_build(dir: &Path) -> Vec<Value> {
    let out = Command::new(tools().join("kustomize"))
        .arg("build")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kustomize build {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn to_yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| serde_yaml::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// The agent container of a rendered (or read back) Deployment.
fn agent_container(dep: &Value) -> &Value {
    dep["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "agent")
        .expect("a container named agent")
}

/// Every `DROVER_*` file the agent is told to read: (variable, Secret, key).
/// Each must sit on a mounted Secret volume; a path outside every mount is
/// a broken install. A variable naming a whole mount (a directory of keys,
/// such as `DROVER_OPENPGP_KEYS`) must be on an optional Secret, whose
/// absence the agent reads as "none".
fn secret_files(dep: &Value) -> Vec<(String, String, String)> {
    let pod = &dep["spec"]["template"]["spec"];
    let c = agent_container(dep);
    let mut out = Vec::new();
    for e in c["env"].as_array().unwrap() {
        let (Some(name), Some(value)) = (e["name"].as_str(), e["value"].as_str()) else {
            continue;
        };
        if !value.starts_with("/etc/drover/") {
            continue;
        }
        let mounts = c["volumeMounts"].as_array().unwrap();
        let volume_of = |m: &Value| {
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap()
                .clone()
        };
        if let Some(dir) = mounts.iter().find(|m| m["mountPath"] == value) {
            assert_eq!(
                volume_of(dir)["secret"]["optional"],
                true,
                "{name}={value} is a whole mount: its Secret must be optional"
            );
            continue;
        }
        let mount = mounts
            .iter()
            .find(|m| value.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
            .unwrap_or_else(|| panic!("{name}={value} is on no volume mount"));
        let key = &value[mount["mountPath"].as_str().unwrap().len() + 1..];
        let volume = volume_of(mount);
        let secret = volume["secret"]["secretName"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}={value} is not on a Secret volume"));
        out.push((name.to_owned(), secret.to_owned(), key.to_owned()));
    }
    out
}

/// Every `DROVER_*` variable a rendered install sets is one `drover agent` reads.
fn assert_agent_reads(objects: &[Value], what: &str) {
    static HELP: OnceLock<String> = OnceLock::new();
    let help = HELP.get_or_init(|| {
        let out = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["agent", "--help"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    });
    let mut names = Vec::new();
    for o in objects {
        if o["kind"] == "Deployment" {
            for e in agent_container(o)["env"].as_array().unwrap() {
                names.push(e["name"].as_str().unwrap().to_owned());
            }
        }
        if o["kind"] == "ConfigMap" {
            if let Some(data) = o["data"].as_object() {
                names.extend(data.keys().cloned());
            }
        }
    }
    for n in names.iter().filter(|n| n.starts_with("DROVER_")) {
        assert!(
            help.contains(&format!("[env: {n}")),
            "{what} sets {n}, which `drover agent` does not read"
        );
    }
}

/// A rendered overlay is whole: its Secrets and ConfigMap are the ones the
/// Deployment names, each with the keys the agent's file variables read,
/// none empty; and nothing else writes a Secret.
fn assert_wired(objects: &[Value], what: &str) {
    let dep = find(objects, "Deployment", "drover").expect("the Deployment");
    let c = agent_container(dep);
    for from in c["envFrom"].as_array().into_iter().flatten() {
        let cm = from["configMapRef"]["name"].as_str().unwrap();
        let cm = find(objects, "ConfigMap", cm)
            .unwrap_or_else(|| panic!("{what}: the Deployment reads ConfigMap {cm}, not rendered"));
        for want in ["DROVER_ENV", "DROVER_CLUSTER", "DROVER_REPO"] {
            assert!(
                cm["data"][want].as_str().is_some_and(|v| !v.is_empty()),
                "{what}: {want} unset in the ConfigMap"
            );
        }
    }
    for (var, secret, key) in secret_files(dep) {
        let s = find(objects, "Secret", &secret).unwrap_or_else(|| {
            panic!("{what}: {var} reads Secret {secret}, which is not rendered")
        });
        let v = s["data"][&key].as_str().unwrap_or_else(|| {
            panic!(
                "{what}: {var} reads key {key} of {secret}, which has {:?}",
                s["data"]
            )
        });
        assert!(!v.is_empty(), "{what}: {secret}/{key} is empty");
    }
    assert_agent_reads(objects, what);
}

/// The real kustomize renders the base, each component over it, and each
/// overlay docs/install.md shows; the API server accepts every object of
/// each (server-side apply, dry run: validated, admitted, not stored).
#[tokio::test]
async fn every_kustomization_renders_and_the_api_server_accepts_it() {
    let work = workdir();
    let w = work.path();
    let deploy = w.join("drover/deploy");

    // The base: two namespaces kept apart, no Secret to wipe a real one.
    let base = kustomize_build(&deploy.join("base"));
    for o in &base {
        assert_ne!(o["kind"], "Secret", "the base ships a Secret: {o}");
    }
    let ns_of = |kind: &str, name: &str| {
        base.iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == name
                    && o["metadata"]["namespace"].is_string()
            })
            .map(|o| o["metadata"]["namespace"].as_str().unwrap().to_owned())
    };
    assert!(find(&base, "Namespace", "drover-system").is_some());
    assert!(find(&base, "Namespace", "drover-upgrades").is_some());
    let roles: BTreeMap<String, String> = base
        .iter()
        .filter(|o| o["kind"] == "Role")
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap().to_owned(),
                o["metadata"]["namespace"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(roles["drover-upgrades"], "drover-upgrades", "{roles:?}");
    assert_eq!(
        ns_of("Deployment", "drover").as_deref(),
        Some("drover-system")
    );
    assert_agent_reads(&base, "deploy/base");

    // Each component over the base, in an overlay of its own.
    let mut renders = vec![("deploy/base".to_owned(), base)];
    let mut components: Vec<String> = std::fs::read_dir(deploy.join("components"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    components.sort();
    assert!(components.len() >= 4, "{components:?}");
    for c in &components {
        let dir = w.join(format!("clusters/component-{c}"));
        write_file(
            w,
            &format!("clusters/component-{c}/kustomization.yaml"),
            &format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                 resources: [../../drover/deploy/base]\ncomponents: [../../drover/deploy/components/{c}]\n"
            ),
        );
        renders.push((format!("deploy/components/{c}"), kustomize_build(&dir)));
    }

    // Every overlay of the document, with stand-in files behind its Secrets.
    let mut overlays = 0;
    for b in install_doc() {
        let Some(path) = b.file() else { continue };
        write_file(w, path, &localize(&b.text));
        if !path.ends_with("/kustomization.yaml") {
            continue;
        }
        let dir = w.join(path).parent().unwrap().to_owned();
        let k: Value = serde_yaml::from_str(&b.text).unwrap();
        for g in k["secretGenerator"].as_array().into_iter().flatten() {
            for f in g["files"].as_array().unwrap() {
                let f = f.as_str().unwrap();
                let file = f.split_once('=').map_or(f, |(_, p)| p);
                write_file(&dir, file, &format!("stand-in for {file}\n"));
            }
        }
        let objects = kustomize_build(&dir);
        assert_wired(&objects, path);
        renders.push((path.to_owned(), objects));
        overlays += 1;
    }
    assert!(
        overlays >= 2,
        "docs/install.md shows the HTTPS and the SSH overlay"
    );
    let ssh = &renders.last().unwrap().1;
    let env: Vec<&str> = agent_container(find(ssh, "Deployment", "drover").unwrap())["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        env.contains(&"DROVER_SSH_KEY") && !env.contains(&"DROVER_GIT_TOKEN_FILE"),
        "{env:?}"
    );

    // The API server: validated and admitted, nothing stored but the two
    // namespaces (created bare if absent, so other tests' labels stand)
    // and the ServiceMonitor kind, which the Prometheus Operator would bring.
    let client = ControlPlane::get().admin_client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["drover-system", "drover-upgrades"] {
        let bare: Namespace =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": ns } })).unwrap();
        match namespaces.create(&PostParams::default(), &bare).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating {ns}: {e}"),
        }
    }
    install_servicemonitor_kind(&client).await;
    for (what, objects) in &renders {
        apply_yaml(&client, &to_yaml(objects), "default", true)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// The ServiceMonitor kind, as far as the API server needs it to admit one.
async fn install_servicemonitor_kind(client: &Client) {
    let crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "servicemonitors.monitoring.coreos.com" },
        "spec": {
            "group": "monitoring.coreos.com",
            "names": { "kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }
            }]
        }
    });
    apply_yaml(
        client,
        &serde_yaml::to_string(&crd).unwrap(),
        "default",
        false,
    )
    .await
    .unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crate::support::kube::await_object(
        &crds,
        "servicemonitors.monitoring.coreos.com",
        "established",
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
        },
    )
    .await;
}

/// docs/install.md's steps, in order, on a cluster that has nothing of
/// drover: the Namespaces come first, the Secrets hold what the steps put in
/// them, the Deployment runs the signed image by digest and reads every file
/// it is told to from a Secret that exists; applying again keeps the Secrets.
#[tokio::test]
async fn the_install_steps_of_docs_install_md_work_in_order() {
    let cp = tokio::task::spawn_blocking(ControlPlane::start_own)
        .await
        .unwrap()
        .expect("a control plane of its own");
    let kubeconfig = cp.kubeconfig_path();
    let client = client_from(&kubeconfig).await.unwrap();
    let work = workdir();
    let w = work.path();

    let steps: Vec<Block> = install_doc()
        .into_iter()
        .filter(|b| b.section == "Install")
        .collect();
    let mut apply_step = None;
    let mut doctor_step = None;
    let mut ran = 0;
    for b in &steps {
        if let Some(path) = b.file() {
            write_file(w, path, &localize(&b.text));
        } else if b.info == "sh" && b.text.trim_start().starts_with("drover doctor") {
            // The last step, and the one expected to fail here (below).
            doctor_step = Some(shell(w, &kubeconfig, &b.text));
            ran += 1;
        } else if b.info == "sh" {
            assert!(
                doctor_step.is_none(),
                "docs/install.md's steps end with drover doctor"
            );
            run_step(w, &kubeconfig, &b.text);
            if b.text.contains("kubectl apply") {
                apply_step = Some(b.text.clone());
            }
            ran += 1;
        }
    }
    assert!(
        ran >= 4,
        "docs/install.md's Install section has {ran} sh steps"
    );
    let apply_step = apply_step.expect("a step that runs kubectl apply");

    // The Namespaces, at the Pod Security levels the document promises.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for (ns, level) in [
        ("drover-system", "restricted"),
        ("drover-upgrades", "privileged"),
    ] {
        let n = namespaces.get(ns).await.unwrap();
        assert_eq!(
            n.metadata.labels.unwrap_or_default()["pod-security.kubernetes.io/enforce"],
            level,
            "{ns}"
        );
    }

    // The Deployment: the verified digest, its settings, every file on a Secret that holds it.
    let dep: Deployment = Api::namespaced(client.clone(), "drover-system")
        .get("drover")
        .await
        .unwrap();
    let dep = serde_json::to_value(&dep).unwrap();
    let c = agent_container(&dep);
    assert_eq!(c["image"], format!("ghcr.io/drover-dev/drover@{DIGEST}"));
    let cm = c["envFrom"][0]["configMapRef"]["name"].as_str().unwrap();
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "drover-system")
        .get(cm)
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(cm["DROVER_ENV"], "production");
    assert_eq!(cm["DROVER_CLUSTER"], "prod-eu-1");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "drover-system");
    let mut before = BTreeMap::new();
    for (var, name, key) in secret_files(&dep) {
        let s = secrets
            .get(&name)
            .await
            .unwrap_or_else(|e| panic!("{var} reads Secret {name}: {e}"));
        let value = s
            .data
            .as_ref()
            .and_then(|d| d.get(&key))
            .unwrap_or_else(|| panic!("{var} reads key {key} of {name}, which it lacks"))
            .0
            .clone();
        assert!(!value.is_empty(), "{name}/{key} is empty");
        match var.as_str() {
            "DROVER_GIT_TOKEN_FILE" => assert_eq!(value, GIT_TOKEN.as_bytes()),
            "DROVER_ALLOWED_SIGNERS" => {
                drover::trust::AllowedSigners::parse(std::str::from_utf8(&value).unwrap())
                    .expect("the document's allowed_signers line is valid");
            }
            "DROVER_STATUS_SIGNING_KEY" => assert!(
                value.starts_with(b"-----BEGIN OPENSSH PRIVATE KEY-----"),
                "the report key is an OpenSSH private key"
            ),
            _ => {}
        }
        before.insert(name.clone(), (s.metadata.resource_version, value));
    }
    for want in [
        "DROVER_GIT_TOKEN_FILE",
        "DROVER_ALLOWED_SIGNERS",
        "DROVER_STATUS_SIGNING_KEY",
        "DROVER_WEBHOOK_SECRET_FILE",
    ] {
        assert!(
            secret_files(&dep).iter().any(|(v, _, _)| v == want),
            "the installed agent has no {want}"
        );
    }

    // drover doctor, the last step: everything in the cluster passes; the
    // repository (the test's stand-in, unreachable) fails, saying what to
    // do, and what needs it is skipped; exit 1.
    let doctor = doctor_step.expect("docs/install.md ends with drover doctor");
    let text = String::from_utf8_lossy(&doctor.stdout).into_owned();
    assert_eq!(doctor.status.code(), Some(1), "{text}");
    for line in [
        "ok   crd ",
        "ok   deployment ",
        "ok   secrets ",
        "ok   rbac ",
        "FAIL repository ",
        "skip signature ",
    ] {
        assert!(
            text.contains(line),
            "drover doctor printed no {line:?}:\n{text}"
        );
    }
    assert!(text.contains("fix: check DROVER_REPO"), "{text}");
    let out = shell(w, &kubeconfig, "drover doctor -o json");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false, "{doc:#}");
    let result = |name: &str| {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["result"].as_str().unwrap().to_owned())
    };
    assert_eq!(result("rbac").as_deref(), Some("pass"), "{doc:#}");
    assert_eq!(result("repository").as_deref(), Some("fail"), "{doc:#}");
    assert_eq!(doc["errors"].as_array().unwrap().len(), 1, "{doc:#}");

    node_records_steps(w, &kubeconfig);

    // Applying the overlay again leaves every Secret as it was.
    run_step(w, &kubeconfig, &apply_step);
    for (name, (version, value)) in before {
        let s = secrets.get(&name).await.unwrap();
        assert_eq!(s.metadata.resource_version, version, "{name} was rewritten");
        let data = s.data.unwrap();
        assert!(data.values().any(|v| v.0 == value), "{name} changed");
    }

    // What doctor is for: a lost ClusterRoleBinding and a missing Secret
    // are each named, with what to do.
    let crbs: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    crbs.delete("drover", &Default::default()).await.unwrap();
    let token_secret = secret_files(&dep)
        .into_iter()
        .find(|(v, _, _)| v == "DROVER_GIT_TOKEN_FILE")
        .unwrap()
        .1;
    secrets
        .delete(&token_secret, &Default::default())
        .await
        .unwrap();
    let out = shell(w, &kubeconfig, "drover doctor");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL rbac ") && text.contains("patch nodes") && text.contains("rbac.yaml"),
        "{text}"
    );
    assert!(
        text.contains("FAIL secrets ")
            && text.contains(&format!("Secret {token_secret}, which does not exist")),
        "{text}"
    );
    drop(cp);
}

/// docs/install.md's "Node records": on the installed base, a record the
/// agent's ServiceAccount made takes the person's two requests the
/// section's commands set, as a cluster admin; the admission policy
/// refuses that admin anything else; `kubectl get drovernodes` prints the
/// columns the section shows.
fn node_records_steps(w: &Path, kubeconfig: &Path) {
    let record = "apiVersion: drover.dev/v1alpha1\nkind: DroverNode\nmetadata:\n  name: a-2\n  \
                  namespace: drover-system\nspec:\n  node: a-2\n  recordId: r1\n  \
                  environment: production\n  cluster: prod-eu-1\n";
    std::fs::write(w.join("a-2.yaml"), record).unwrap();
    let agent = "--as=system:serviceaccount:drover-system:drover";
    run_step(
        w,
        kubeconfig,
        &format!("kubectl create {agent} -f a-2.yaml"),
    );
    let steps: Vec<Block> = install_doc()
        .into_iter()
        .filter(|b| b.section == "Node records" && b.info == "sh")
        .collect();
    assert_eq!(
        steps.len(),
        1,
        "docs/install.md's Node records has one sh block"
    );
    run_step(w, kubeconfig, &steps[0].text);
    let out = shell(
        w,
        kubeconfig,
        "kubectl -n drover-system get drovernode a-2 -o jsonpath='{.metadata.annotations}'",
    );
    let annotations: Value = serde_json::from_slice(&out.stdout).unwrap();
    for request in ["drover.dev/retry", "drover.dev/clear-rolled-back"] {
        assert_eq!(annotations[request], "now", "{annotations}");
    }
    for refused in [
        "kubectl -n drover-system annotate drovernode a-2 drover.dev/state=draining",
        "kubectl -n drover-system label drovernode a-2 drover.dev/cluster=other",
        "kubectl -n drover-system delete drovernode a-2",
    ] {
        let out = shell(w, kubeconfig, refused);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("only the drover agent"),
            "{refused}: {err}"
        );
    }
    let out = shell(w, kubeconfig, "kubectl -n drover-system get drovernodes");
    let header = String::from_utf8_lossy(&out.stdout);
    let columns: Vec<&str> = header.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        columns,
        [
            "NAME",
            "NODE",
            "PHASE",
            "TARGET",
            "SINCE",
            "ATTEMPT",
            "DRIVER-RETRIES",
            "MESSAGE"
        ]
    );
}
