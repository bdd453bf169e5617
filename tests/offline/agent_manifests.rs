//! The kustomize base in deploy/ against the code: the CRD is generated from
//! the Rust type, the RBAC grants exactly what the agent calls, and the
//! Deployment carries the security settings the install guide promises.
//!
//! Regenerate `deploy/base/crd.yaml` and `deploy/base/crd-drovernode.yaml`
//! with `DROVER_BLESS=1 cargo test --test offline agent_manifests`.

use drover::agent::{
    crd, Permission, CLUSTER_PERMISSIONS, DRAIN_DELETE_PERMISSIONS, JOB_NAMESPACE_PERMISSIONS,
    NAMESPACE_PERMISSIONS,
};
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn base() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base")
}

fn docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(base().join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

#[test]
fn crd_yaml_is_generated_from_the_rust_type() {
    let path = base().join("crd.yaml");
    let want = crd::crd_manifest();
    if std::env::var("DROVER_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "deploy/base/crd.yaml is stale; regenerate with DROVER_BLESS=1 cargo test --test offline agent_manifests"
    );
    // And it is what YAML tools read: one CRD for droverstatuses.drover.dev.
    let d = docs("crd.yaml");
    assert_eq!(d.len(), 1);
    assert_eq!(
        d[0]["metadata"]["name"].as_str(),
        Some("droverstatuses.drover.dev")
    );
}

#[test]
fn the_node_record_crd_is_generated_from_the_rust_type() {
    let path = base().join("crd-drovernode.yaml");
    let want = drover::record::wire::crd_manifest();
    if std::env::var("DROVER_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "deploy/base/crd-drovernode.yaml is stale; regenerate with DROVER_BLESS=1 cargo test --test offline agent_manifests"
    );
    let d = docs("crd-drovernode.yaml");
    assert_eq!(d.len(), 1);
    assert_eq!(
        d[0]["metadata"]["name"].as_str(),
        Some("drovernodes.drover.dev")
    );
    // What `kubectl get drovernodes` shows, and no status subresource: the
    // record is written whole, in one request.
    let v = &d[0]["spec"]["versions"][0];
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cols,
        [
            "Node",
            "Phase",
            "Target",
            "Since",
            "Attempt",
            "Driver-Retries",
            "Message",
            "Run"
        ]
    );
    assert!(v["subresources"].is_null(), "{:?}", v["subresources"]);
    let kz = std::fs::read_to_string(base().join("kustomization.yaml")).unwrap();
    assert!(
        kz.contains("  - crd-drovernode.yaml"),
        "the base installs it"
    );
}

type Rules = BTreeSet<(String, String, BTreeSet<String>)>;

fn rules_of(doc: &Value) -> Rules {
    let mut out = Rules::new();
    for rule in doc["rules"].as_sequence().unwrap() {
        let verbs: BTreeSet<String> = rule["verbs"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        for g in rule["apiGroups"].as_sequence().unwrap() {
            for r in rule["resources"].as_sequence().unwrap() {
                out.insert((
                    g.as_str().unwrap().to_string(),
                    r.as_str().unwrap().to_string(),
                    verbs.clone(),
                ));
            }
        }
    }
    out
}

fn rules_from(perms: &[Permission]) -> Rules {
    perms
        .iter()
        .map(|(g, r, v)| {
            (
                g.to_string(),
                r.to_string(),
                v.iter().map(|s| s.to_string()).collect(),
            )
        })
        .collect()
}

#[test]
fn rbac_grants_exactly_what_the_agent_calls() {
    let d = docs("rbac.yaml");
    let find = |kind: &str| {
        d.iter()
            .find(|x| x["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("rbac.yaml has no {kind}"))
    };
    assert_eq!(
        rules_of(find("ClusterRole")),
        rules_from(CLUSTER_PERMISSIONS)
    );
    let role_in = |ns: &str| {
        d.iter()
            .find(|x| {
                x["kind"].as_str() == Some("Role")
                    && x["metadata"]["namespace"].as_str() == Some(ns)
            })
            .unwrap_or_else(|| panic!("rbac.yaml has no Role in {ns}"))
    };
    assert_eq!(
        rules_of(role_in("drover-system")),
        rules_from(NAMESPACE_PERMISSIONS)
    );
    assert_eq!(
        rules_of(role_in("drover-upgrades")),
        rules_from(JOB_NAMESPACE_PERMISSIONS)
    );
    let bindings = d.iter().filter(|x| {
        matches!(
            x["kind"].as_str(),
            Some("ClusterRoleBinding" | "RoleBinding")
        )
    });
    assert_eq!(bindings.clone().count(), 3, "one binding per role");
    for b in bindings {
        assert_eq!(b["subjects"][0]["kind"].as_str(), Some("ServiceAccount"));
        assert_eq!(b["subjects"][0]["name"].as_str(), Some("drover"));
        assert_eq!(
            b["subjects"][0]["namespace"].as_str(),
            Some("drover-system")
        );
    }
}

#[test]
fn only_the_drain_delete_component_lets_the_agent_delete_pods() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/components/drain-delete/rbac.yaml"),
    )
    .unwrap();
    let d: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect();
    let kind = |k: &str| d.iter().find(|x| x["kind"].as_str() == Some(k)).unwrap();
    assert_eq!(
        rules_of(kind("ClusterRole")),
        rules_from(DRAIN_DELETE_PERMISSIONS)
    );
    let subject = &kind("ClusterRoleBinding")["subjects"][0];
    assert_eq!(
        (subject["name"].as_str(), subject["namespace"].as_str()),
        (Some("drover"), Some("drover-system"))
    );
    // The base lets the agent remove a pod through the Eviction API only.
    assert!(!CLUSTER_PERMISSIONS
        .iter()
        .any(|(_, r, v)| r.starts_with("pods") && v.contains(&"delete")));
}

#[test]
fn deployment_is_locked_down_and_wired() {
    let d = docs("deployment.yaml");
    let dep = &d[0];
    assert_eq!(dep["kind"].as_str(), Some("Deployment"));
    assert_eq!(dep["spec"]["replicas"].as_i64(), Some(2));
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"].as_str(), Some("drover"));
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"));
    assert_eq!(c["resources"]["requests"]["cpu"].as_str(), Some("10m"));
    assert_eq!(c["resources"]["requests"]["memory"].as_str(), Some("48Mi"));
    assert_eq!(c["ports"][0]["name"].as_str(), Some("http"));
    assert_eq!(c["ports"][0]["containerPort"].as_i64(), Some(8080));
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    let env: BTreeSet<&str> = c["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(env.contains("POD_NAME"), "missing env POD_NAME");
    // The overlay's ConfigMap sets these; an `env` entry would override it.
    for overlay in ["DROVER_ENV", "DROVER_CLUSTER", "DROVER_REPO"] {
        assert!(
            !env.contains(overlay),
            "{overlay} is the overlay's, not the base's"
        );
    }
    assert_eq!(
        c["envFrom"][0]["configMapRef"]["name"].as_str(),
        Some("drover-agent")
    );
    let pod_name = c["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some("POD_NAME"))
        .unwrap();
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name")
    );
    let vols = pod["volumes"].as_sequence().unwrap();
    assert!(vols.iter().any(|v| v["emptyDir"].is_mapping()));
    let secrets: BTreeSet<&str> = vols
        .iter()
        .filter_map(|v| v["secret"]["secretName"].as_str())
        .collect();
    assert!(secrets.contains("drover-git-credentials"));
    assert!(secrets.contains("drover-allowed-signers"));
}

#[test]
fn kustomization_lists_files_that_exist() {
    let k = &docs("kustomization.yaml")[0];
    for r in k["resources"].as_sequence().unwrap() {
        let f = r.as_str().unwrap();
        assert!(base().join(f).is_file(), "{f} is listed but missing");
    }
}

/// The image's runtime stage must carry every shared library the binary
/// links: distroless/cc has glibc and libgcc only, the Dockerfile copies the
/// rest. A new native dependency fails here instead of at the pod's start.
#[test]
fn dockerfile_ships_the_dist_binary_with_every_library_it_links() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("deploy/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("cargo build --profile dist --locked --bin drover")
            && dockerfile.contains("/src/target/dist/drover /usr/local/bin/drover"),
        "the image must ship the dist build BENCHMARKS.md measures:\n{dockerfile}"
    );
    // One Dockerfile for amd64 and arm64: no architecture is named in it.
    for arch in ["x86_64", "amd64", "aarch64", "arm64"] {
        let named = dockerfile
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .any(|l| l.contains(arch));
        assert!(!named, "deploy/Dockerfile hard-codes {arch}");
    }
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim() == "target/"), "{ignore}");
    // The build stage copies what the manifest refers to.
    for dir in ["src", "benches", "examples", "example-repo"] {
        assert!(root.join(dir).is_dir());
        assert!(
            dockerfile.contains(&format!("COPY {dir} ./{dir}")),
            "{dir}/ not copied into the build stage"
        );
    }
    // The build script (`drover version`'s commit and date) too.
    assert!(
        dockerfile.contains("COPY Cargo.toml Cargo.lock build.rs ./"),
        "build.rs not copied into the build stage"
    );
    let out = std::process::Command::new("readelf")
        .args(["-d", env!("CARGO_BIN_EXE_drover")])
        .output()
        .expect("readelf (binutils) reads the binary's dynamic section");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(needed.contains(&"libc.so.6"), "{text}");
    // What gcr.io/distroless/cc-debian12 provides.
    let in_base = [
        "libc.so.6",
        "libm.so.6",
        "libgcc_s.so.1",
        "libpthread.so.0",
        "libdl.so.2",
        "librt.so.1",
        "libstdc++.so.6",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
    ];
    // The build stage collects them from its own platform's multiarch
    // directory; the runtime stage copies what it collected.
    let collected = dockerfile
        .lines()
        .find(|l| l.contains("for lib in "))
        .unwrap_or("");
    assert!(
        dockerfile.contains("COPY --from=build /out/ /"),
        "{dockerfile}"
    );
    for lib in needed {
        assert!(
            in_base.contains(&lib) || collected.contains(&format!(" {lib} ")),
            "the binary links {lib}, which neither distroless/cc nor the Dockerfile provides"
        );
    }
}

/// Who may reach the agent, and that a drain never takes both replicas.
#[test]
fn network_policy_pdb_anti_affinity_and_job_namespace() {
    let d = docs("networkpolicy.yaml");
    let by_port = |port: i64| {
        d.iter()
            .find(|p| p["spec"]["ingress"][0]["ports"][0]["port"].as_i64() == Some(port))
            .unwrap_or_else(|| panic!("no NetworkPolicy for port {port}"))
    };
    let metrics = by_port(8080);
    assert_eq!(
        metrics["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]
            ["kubernetes.io/metadata.name"]
            .as_str(),
        Some("monitoring")
    );
    let webhook = by_port(8081);
    assert!(
        webhook["spec"]["ingress"][0]["from"]
            .as_sequence()
            .is_some_and(|f| !f.is_empty()),
        "the webhook policy must name its sources (an empty `from` admits everyone)"
    );
    for p in &d {
        assert_eq!(p["spec"]["policyTypes"][0].as_str(), Some("Ingress"));
        assert_eq!(
            p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"].as_str(),
            Some("agent")
        );
        assert_eq!(p["spec"]["ingress"].as_sequence().unwrap().len(), 1);
    }

    let pdb = &docs("pdb.yaml")[0];
    assert_eq!(pdb["spec"]["minAvailable"].as_i64(), Some(1));

    let dep = &docs("deployment.yaml")[0];
    let pod = &dep["spec"]["template"]["spec"];
    let term = &pod["affinity"]["podAntiAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"].as_str(), Some("kubernetes.io/hostname"));
    let c = &pod["containers"][0];
    let env = |name: &str| {
        c["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["value"].as_str())
            .map(String::from)
    };
    assert_eq!(
        env("DROVER_JOB_NAMESPACE").as_deref(),
        Some("drover-upgrades")
    );
    assert_eq!(
        env("DROVER_WEBHOOK_LISTEN").as_deref(),
        Some("0.0.0.0:8081")
    );
    assert_eq!(c["ports"][1]["containerPort"].as_i64(), Some(8081));

    // The agent's namespace is restricted; the Jobs' namespace refuses host access.
    let ns = docs("namespace.yaml");
    let level = |name: &str| {
        ns.iter()
            .find(|n| n["metadata"]["name"].as_str() == Some(name))
            .and_then(|n| n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].as_str())
            .map(String::from)
    };
    assert_eq!(level("drover-system").as_deref(), Some("restricted"));
    assert_eq!(level("drover-upgrades").as_deref(), Some("baseline"));
}

/// The token user the install guide documents is the one the code sends.
#[test]
fn the_install_guide_names_the_token_user_the_code_sends() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/install.md")).unwrap();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let src = std::fs::read_to_string(root.join("src/source/wire/mod.rs")).unwrap();
    assert!(
        src.contains(r#"Auth::Token(token) => Some(("x-access-token".to_owned(), token.read()?))"#)
    );
    assert!(text.contains("user `x-access-token`"), "docs/install.md");
}

/// No Secret ships in the base: an apply of the overlay must never empty
/// the real ones (docs/install.md generates them or takes them from a store).
#[test]
fn the_base_ships_no_secret() {
    let k = &docs("kustomization.yaml")[0];
    for r in k["resources"].as_sequence().unwrap() {
        for d in docs(r.as_str().unwrap()) {
            assert_ne!(d["kind"].as_str(), Some("Secret"), "{r:?} ships a Secret");
        }
    }
    assert!(
        k.get("namespace").is_none(),
        "a namespace transformer renames drover-upgrades"
    );
}
