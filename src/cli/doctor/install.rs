//! The install as the cluster holds it: the agent's Deployment, the
//! ConfigMap and Secrets it reads, and its settings read back as `drover
//! agent` reads its environment. The Secrets' files are copied into a
//! private directory so the checks after run with what the agent would.

use super::{Args, Checks};
use crate::agent::AgentConfig;
use crate::cli::agent::Args as AgentArgs;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret};
use kube::api::Api;
use kube::Client;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The install as the cluster holds it: the agent's settings (its
/// environment, with the ConfigMaps it reads) and a copy of each Secret
/// file it is told to read, in a directory of its own.
pub(super) struct Install {
    /// Every Secret file the agent reads is there (and copied).
    pub(super) secrets_ok: bool,
    pub(super) settings: BTreeMap<String, String>,
    pub(super) service_account: String,
    pub(super) namespace: String,
    _files: tempfile::TempDir,
}

/// The largest Secret value copied (the agent's own bound is larger; no
/// credential file is near it).
pub(super) const MAX_SECRET_VALUE: usize = 1 << 20;

pub(super) async fn read_install(client: &Client, args: &Args, c: &mut Checks) -> Option<Install> {
    let ns = &args.namespace;
    let what = format!("deployment {ns}/{}", args.deployment);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let dep = match deps.get_opt(&args.deployment).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            c.fail(
                "deployment",
                format!("{what} not found"),
                "apply the overlay (docs/install.md, step 4), or name it with --namespace and --deployment",
            );
            return None;
        }
        Err(e) => {
            c.fail(
                "deployment",
                format!("cannot read {what}: {e}"),
                "run drover doctor with the credentials that installed the agent",
            );
            return None;
        }
    };
    let pod = dep.spec.as_ref()?.template.spec.clone().unwrap_or_default();
    let Some(container) = pod
        .containers
        .iter()
        .find(|x| x.name == "agent")
        .or(pod.containers.first())
        .cloned()
    else {
        c.fail(
            "deployment",
            format!("{what} has no container"),
            "apply the overlay again",
        );
        return None;
    };
    let mut settings = BTreeMap::new();
    let mut problems = Vec::new();
    for from in container.env_from.iter().flatten() {
        let Some(r) = &from.config_map_ref else {
            continue;
        };
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        match cms.get_opt(&r.name).await {
            Ok(Some(cm)) => settings.extend(cm.data.unwrap_or_default()),
            Ok(None) if r.optional == Some(true) => {}
            Ok(None) => problems.push(format!("ConfigMap {} does not exist", r.name)),
            Err(e) => problems.push(format!("cannot read ConfigMap {}: {e}", r.name)),
        }
    }
    for e in container.env.iter().flatten() {
        if let Some(v) = &e.value {
            settings.insert(e.name.clone(), v.clone());
        }
    }
    settings.insert("POD_NAMESPACE".into(), ns.clone());
    if !problems.is_empty() {
        c.fail(
            "deployment",
            problems.join("; "),
            "apply the overlay again (its configMapGenerator makes the ConfigMap)",
        );
        return None;
    }
    let missing: Vec<&str> = ["DROVER_ENV", "DROVER_CLUSTER", "DROVER_REPO"]
        .into_iter()
        .filter(|k| settings.get(*k).is_none_or(|v| v.is_empty()))
        .collect();
    if !missing.is_empty() {
        c.fail(
            "deployment",
            format!("{what} sets no {}", missing.join(", ")),
            "set them in the overlay's drover-agent ConfigMap (docs/install.md, step 1)",
        );
        return None;
    }
    c.pass(
        "deployment",
        format!(
            "{what}: environment {}, cluster {}, repository {}",
            settings["DROVER_ENV"],
            settings["DROVER_CLUSTER"],
            crate::source::redact(&settings["DROVER_REPO"])
        ),
    );
    let files = tempfile::tempdir().ok()?;
    let secrets_ok =
        copy_secret_files(client, ns, &pod, &container, files.path(), &mut settings, c).await;
    Some(Install {
        secrets_ok,
        settings,
        service_account: pod
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into()),
        namespace: ns.clone(),
        _files: files,
    })
}

/// Copy each Secret file the agent's settings name into `dir` and point the
/// setting at the copy; a missing Secret or key (unless optional) fails
/// the `secrets` check.
async fn copy_secret_files(
    client: &Client,
    ns: &str,
    pod: &k8s_openapi::api::core::v1::PodSpec,
    container: &Container,
    dir: &Path,
    settings: &mut BTreeMap<String, String>,
    c: &mut Checks,
) -> bool {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut problems = Vec::new();
    let mut read = Vec::new();
    let names: Vec<String> = settings.keys().cloned().collect();
    for (i, var) in names.iter().enumerate() {
        let value = settings[var].clone();
        let Some((mount, volume)) = container.volume_mounts.iter().flatten().find_map(|m| {
            let inside = value == m.mount_path || value.starts_with(&format!("{}/", m.mount_path));
            let v = pod.volumes.iter().flatten().find(|v| v.name == m.name)?;
            (inside && v.secret.is_some()).then_some((m, v))
        }) else {
            continue;
        };
        let source = volume.secret.as_ref().unwrap();
        let name = source.secret_name.clone().unwrap_or_default();
        let optional = source.optional == Some(true);
        let key = value[mount.mount_path.len()..].trim_start_matches('/');
        let data = match secrets.get_opt(&name).await {
            Ok(Some(s)) => s.data.unwrap_or_default(),
            Ok(None) if optional => {
                settings.remove(var);
                continue;
            }
            Ok(None) => {
                problems.push(format!("{var} reads Secret {name}, which does not exist"));
                continue;
            }
            Err(e) => {
                problems.push(format!("cannot read Secret {name}: {e}"));
                continue;
            }
        };
        let copy = dir.join(format!("{i}"));
        if key.is_empty() {
            // A whole mount (a directory of keys, e.g. DROVER_OPENPGP_KEYS).
            if std::fs::create_dir_all(&copy).is_err() {
                return false;
            }
            for (k, v) in data.iter().filter(|(_, v)| v.0.len() <= MAX_SECRET_VALUE) {
                if !k.contains('/') && std::fs::write(copy.join(k), &v.0).is_err() {
                    return false;
                }
            }
        } else {
            match data.get(key) {
                Some(v) if !v.0.is_empty() && v.0.len() <= MAX_SECRET_VALUE => {
                    if std::fs::write(&copy, &v.0).is_err() {
                        return false;
                    }
                }
                Some(_) => {
                    problems.push(format!(
                        "{var} reads key {key} of Secret {name}, which is empty or too large"
                    ));
                    continue;
                }
                None => {
                    let has: Vec<&String> = data.keys().collect();
                    problems.push(format!(
                        "{var} reads key {key} of Secret {name}, which has {has:?}"
                    ));
                    continue;
                }
            }
        }
        read.push(format!("{name}/{}", if key.is_empty() { "*" } else { key }));
        settings.insert(var.clone(), copy.display().to_string());
    }
    if problems.is_empty() {
        c.pass("secrets", format!("present: {}", read.join(", ")));
        true
    } else {
        c.fail(
            "secrets",
            problems.join("; "),
            "create them from the files of docs/install.md, step 2 (the overlay's secretGenerator), and apply again",
        );
        false
    }
}

impl Install {
    /// The agent's settings read as `drover agent` reads them.
    pub(super) fn agent_config(&self, c: &mut Checks) -> Option<AgentConfig> {
        let args = agent_args(&self.settings);
        match args.to_config(None) {
            Ok(cfg) => Some(cfg),
            Err(e) => {
                c.fail(
                    "settings",
                    format!("the agent would not start: {e:#}"),
                    "fix the setting in the overlay's drover-agent ConfigMap (docs/install.md, \"Settings\")",
                );
                None
            }
        }
    }
}

/// `drover agent`'s arguments from its environment, as clap reads them
/// (every flag's `env`): the settings that bear on what doctor checks.
pub(super) fn agent_args(env: &BTreeMap<String, String>) -> AgentArgs {
    let s = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
    let p = |k: &str| s(k).map(PathBuf::from);
    AgentArgs {
        env: s("DROVER_ENV"),
        cluster: s("DROVER_CLUSTER"),
        repo_url: s("DROVER_REPO"),
        branch: s("DROVER_BRANCH"),
        status_branch: s("DROVER_STATUS_BRANCH"),
        verify: s("DROVER_VERIFY"),
        trust_commit: s("DROVER_TRUST_COMMIT"),
        allowed_signers: p("DROVER_ALLOWED_SIGNERS"),
        openpgp_keys: p("DROVER_OPENPGP_KEYS"),
        git_token_file: p("DROVER_GIT_TOKEN_FILE"),
        git_username: s("DROVER_GIT_USERNAME"),
        git_password_file: p("DROVER_GIT_PASSWORD_FILE"),
        ssh_key: p("DROVER_SSH_KEY"),
        known_hosts: p("DROVER_KNOWN_HOSTS"),
        status_signing_key: p("DROVER_STATUS_SIGNING_KEY"),
        namespace: s("POD_NAMESPACE"),
        status_name: s("DROVER_STATUS_NAME"),
        job_namespace: s("DROVER_JOB_NAMESPACE"),
        ..AgentArgs::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_read_as_the_agent_reads_its_environment() {
        let env: BTreeMap<String, String> = [
            ("DROVER_ENV", "production"),
            ("DROVER_CLUSTER", "prod-eu-1"),
            ("DROVER_REPO", "https://git.example.com/x.git"),
            ("DROVER_GIT_TOKEN_FILE", "/tmp/t"),
            ("DROVER_VERIFY", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let a = agent_args(&env);
        assert_eq!(a.env.as_deref(), Some("production"));
        assert_eq!(a.git_token_file, Some(PathBuf::from("/tmp/t")));
        assert_eq!(a.verify, None, "an empty value is unset, as for clap");
    }
}
