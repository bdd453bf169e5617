//! `drover doctor`: after an install, every step that can be checked,
//! checked, each with pass or fail and what to do. It reads the install as
//! the cluster holds it (the agent's Deployment, its ConfigMap and Secrets,
//! the CRD) with the caller's credentials, asks the API server what the
//! agent's ServiceAccount may do (SelfSubjectAccessReview, impersonating
//! it), then does what the agent's first pass would do with the same
//! settings: fetch the config repository and its status branches, verify
//! the head's signature, load the config, find this cluster's report key in
//! `report_signers`, and push a scratch branch beside this cluster's
//! status branch and delete it ([`crate::status::probe_push`]), since only a
//! push meets the forge's hooks and branch rules. Apart from that branch it
//! writes nothing, neither to the cluster nor to git.
//! Exit 0 when every check passes, 1 otherwise, like `check`.

use super::agent::Args as AgentArgs;
use super::output::{print_document, Problem};
use super::{Global, Outcome};
use crate::agent::rbac::{
    Permission, CLUSTER_PERMISSIONS, JOB_NAMESPACE_PERMISSIONS, NAMESPACE_PERMISSIONS,
};
use crate::agent::AgentConfig;
use crate::config::RepoConfig;
use crate::source::{Source, SourceConfig};
use crate::trust::{AllowedSigners, OpenPgpKeys, Signers};
use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::Client;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `drover doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the agent's Deployment.
    #[arg(long, default_value = "drover-system")]
    pub namespace: String,
    /// The agent's Deployment.
    #[arg(long, default_value = "drover")]
    pub deployment: String,
    /// Longest wait for the git server, per fetch.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub git_timeout: Duration,
}

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// It holds.
    Pass,
    /// It does not; `fix` says what to do.
    Fail,
    /// Not checked: a check it depends on failed.
    Skip,
}

/// One check and its outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Short name: `cluster`, `crd`, `deployment`, `secrets`, `rbac`,
    /// `repository`, `signature`, `config`, `report-signer`,
    /// `status-branches`, `status-push`, `updater-image`, `next-window`.
    pub name: &'static str,
    /// Pass, fail or skip.
    pub result: Verdict,
    /// What was found.
    pub message: String,
    /// What to do, when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The document of `drover doctor -o json`: every check, in the order a new
/// install passes them.
#[derive(Debug, Serialize)]
struct Report {
    checks: Vec<Check>,
}

#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn pass(&mut self, name: &'static str, message: impl Into<String>) {
        self.push(name, Verdict::Pass, message.into(), None);
    }
    fn fail(&mut self, name: &'static str, message: impl Into<String>, fix: impl Into<String>) {
        self.push(name, Verdict::Fail, message.into(), Some(fix.into()));
    }
    fn skip(&mut self, name: &'static str, why: impl Into<String>) {
        self.push(name, Verdict::Skip, why.into(), None);
    }
    fn push(&mut self, name: &'static str, result: Verdict, message: String, fix: Option<String>) {
        self.0.push(Check {
            name,
            result,
            message,
            fix,
        });
    }
}

/// Run `drover doctor`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let checks = rt.block_on(diagnose(&args));
    let failed: Vec<Problem> = checks
        .iter()
        .filter(|c| c.result == Verdict::Fail)
        .map(|c| Problem::Message {
            message: format!(
                "{}: {} ({})",
                c.name,
                c.message,
                c.fix.as_deref().unwrap_or_default()
            ),
        })
        .collect();
    let ok = failed.is_empty();
    if !ok {
        super::mark_rejected();
    }
    if g.format.is_document() {
        print_document(g.format, ok, &failed, &Report { checks })?;
    } else {
        print!("{}", render(&checks));
    }
    Ok(if ok { Outcome::Ok } else { Outcome::Rejected })
}

/// The checks as text: one line each, and what to do under a failure.
fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let mark = match c.result {
            Verdict::Pass => "ok  ",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "skip",
        };
        out.push_str(&format!("{mark} {:<16} {}\n", c.name, c.message));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("     {:<16} fix: {fix}\n", ""));
        }
    }
    let failed = checks.iter().filter(|c| c.result == Verdict::Fail).count();
    if failed == 0 {
        out.push_str("drover doctor: every check passed\n");
    } else {
        out.push_str(&format!(
            "drover doctor: {} failed\n",
            crate::terminal::count(failed as u64, "check", "checks")
        ));
    }
    out
}

async fn client(args: &Args, impersonate: Option<&str>) -> anyhow::Result<Client> {
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("using {}", path.display()))?
        }
        // KUBECONFIG set: its own error, not kube's summary of every
        // place it looked (in-cluster variables included).
        None => match std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
            Some(p) => {
                let shown = p.to_string_lossy().into_owned();
                let kc = kube::config::Kubeconfig::read()
                    .with_context(|| format!("reading KUBECONFIG {shown}"))?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .with_context(|| format!("using KUBECONFIG {shown}"))?
            }
            None => kube::Config::infer()
                .await
                .context("no kubeconfig and not in a cluster")?,
        },
    };
    if let Some(user) = impersonate {
        config.auth_info.impersonate = Some(user.to_owned());
        let ns = user.rsplit(':').nth(1).unwrap_or_default();
        config.auth_info.impersonate_groups = Some(vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ]);
    }
    Ok(Client::try_from(config)?)
}

async fn diagnose(args: &Args) -> Vec<Check> {
    let mut c = Checks::default();
    let client = match client(args, None).await {
        Ok(cl) => cl,
        Err(e) => {
            c.fail(
                "cluster",
                super::explain::explain(&e),
                "point --kubeconfig (or KUBECONFIG) at the cluster the agent is installed in",
            );
            return c.0;
        }
    };
    check_crd(&client, &mut c).await;
    let Some(install) = read_install(&client, args, &mut c).await else {
        return c.0;
    };
    check_rbac(args, &install, &mut c).await;
    if !install.secrets_ok {
        for name in GIT_CHECKS {
            c.skip(name, "needs the Secrets");
        }
        return c.0;
    }
    let Some(cfg) = install.agent_config(&mut c) else {
        return c.0;
    };
    let state = agent_state(&client, &cfg).await;
    let git = {
        let cfg = cfg.clone();
        let timeout = args.git_timeout;
        tokio::task::spawn_blocking(move || check_git(&cfg, &state, timeout))
            .await
            .unwrap_or_else(|e| {
                let mut c = Checks::default();
                c.fail(
                    "repository",
                    format!("the check panicked: {e}"),
                    "report a bug",
                );
                c
            })
    };
    c.0.extend(git.0);
    c.0
}

async fn agent_state(client: &Client, cfg: &AgentConfig) -> crate::agent::recover::AgentState {
    let api: Api<crate::agent::crd::DroverStatus> = Api::namespaced(client.clone(), &cfg.namespace);
    match api.get_opt(&cfg.status_name).await {
        Ok(Some(o)) => crate::agent::recover::AgentState {
            applied: o.status.and_then(|s| s.last_applied_commit),
            annotation: o
                .metadata
                .annotations
                .and_then(|a| a.get(crate::admit::TRUST_ANNOTATION).cloned()),
        },
        _ => Default::default(),
    }
}

/// The CRD: installed, established, and the release's (with conditions).
async fn check_crd(client: &Client, c: &mut Checks) {
    const NAME: &str = "droverstatuses.drover.dev";
    let fix =
        "kubectl apply --server-side -k clusters/<cluster> (deploy/base/crd.yaml of this release)";
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.get_opt(NAME).await {
        Ok(Some(crd)) => {
            let established = crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|x| x.type_ == "Established" && x.status == "True")
                });
            let current = serde_json::to_value(&crd.spec).is_ok_and(|v| {
                v.to_string().contains("\"observedGeneration\"")
                    && v.to_string().contains("\"conditions\"")
            });
            if !established {
                c.fail("crd", format!("{NAME} is not Established"), fix);
            } else if !current {
                c.fail(
                    "crd",
                    format!("{NAME} is an older release's: its status has no conditions"),
                    fix,
                );
            } else {
                c.pass("crd", format!("{NAME} installed"));
            }
        }
        Ok(None) => c.fail("crd", format!("{NAME} is not installed"), fix),
        Err(e) => c.fail(
            "crd",
            format!("cannot read {NAME}: {e}"),
            "run drover doctor with the credentials that installed the agent",
        ),
    }
}

/// The install as the cluster holds it: the agent's settings (its
/// environment, with the ConfigMaps it reads) and a copy of each Secret
/// file it is told to read, in a directory of its own.
struct Install {
    /// Every Secret file the agent reads is there (and copied).
    secrets_ok: bool,
    settings: BTreeMap<String, String>,
    service_account: String,
    namespace: String,
    _files: tempfile::TempDir,
}

/// The largest Secret value copied (the agent's own bound is larger; no
/// credential file is near it).
const MAX_SECRET_VALUE: usize = 1 << 20;

async fn read_install(client: &Client, args: &Args, c: &mut Checks) -> Option<Install> {
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
    fn agent_config(&self, c: &mut Checks) -> Option<AgentConfig> {
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
fn agent_args(env: &BTreeMap<String, String>) -> AgentArgs {
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

/// Every permission of `deploy/base/rbac.yaml`, asked of the API server as
/// the agent's ServiceAccount.
async fn check_rbac(args: &Args, install: &Install, c: &mut Checks) {
    let sa = format!(
        "system:serviceaccount:{}:{}",
        install.namespace, install.service_account
    );
    let client = match client(args, Some(&sa)).await {
        Ok(cl) => cl,
        Err(e) => {
            c.fail("rbac", super::explain::explain(&e), "check --kubeconfig");
            return;
        }
    };
    let jobs_ns = install
        .settings
        .get("DROVER_JOB_NAMESPACE")
        .cloned()
        .unwrap_or_else(|| install.namespace.clone());
    let scopes: [(Option<&str>, &[Permission]); 3] = [
        (None, CLUSTER_PERMISSIONS),
        (Some(&jobs_ns), JOB_NAMESPACE_PERMISSIONS),
        (Some(&install.namespace), NAMESPACE_PERMISSIONS),
    ];
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client);
    let mut denied = Vec::new();
    let mut asked = 0;
    for (ns, perms) in scopes {
        for (group, resource, verbs) in perms {
            let (resource, sub) = match resource.split_once('/') {
                Some((r, s)) => (r, Some(s.to_owned())),
                None => (*resource, None),
            };
            for verb in *verbs {
                asked += 1;
                let review = SelfSubjectAccessReview {
                    spec: SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(ResourceAttributes {
                            group: Some((*group).to_owned()),
                            resource: Some(resource.to_owned()),
                            subresource: sub.clone(),
                            verb: Some((*verb).to_owned()),
                            namespace: ns.map(str::to_owned),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                match reviews.create(&PostParams::default(), &review).await {
                    Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
                    Ok(_) => denied.push(format!(
                        "{verb} {resource}{}{}",
                        sub.as_deref().map(|s| format!("/{s}")).unwrap_or_default(),
                        ns.map(|n| format!(" in {n}")).unwrap_or_default()
                    )),
                    Err(e) => {
                        c.fail(
                            "rbac",
                            format!("cannot ask as {sa}: {e}"),
                            "run drover doctor as a user who may impersonate the agent's ServiceAccount (a cluster admin)",
                        );
                        return;
                    }
                }
            }
        }
    }
    if denied.is_empty() {
        c.pass(
            "rbac",
            format!("{sa} may do all {asked} things the agent does"),
        );
    } else {
        c.fail(
            "rbac",
            format!("{sa} may not: {}", denied.join(", ")),
            "apply deploy/base/rbac.yaml of this release (with the overlay); its RoleBindings name this ServiceAccount",
        );
    }
}

/// The checks [`check_git`] makes, in order.
const GIT_CHECKS: [&str; 8] = [
    "repository",
    "signature",
    "config",
    "report-signer",
    "status-branches",
    "status-push",
    "updater-image",
    "next-window",
];

/// What the agent's first pass does with git, with the same settings:
/// fetch (the branch and every status branch), verify the head, load the
/// config, find this cluster's report key, the updater image, the window.
fn check_git(
    cfg: &AgentConfig,
    state: &crate::agent::recover::AgentState,
    timeout: Duration,
) -> Checks {
    let mut c = Checks::default();
    let url = crate::source::redact(&cfg.source.url);
    let Ok(cache) = tempfile::tempdir() else {
        c.fail(
            "repository",
            "cannot make a temporary directory",
            "free disk space",
        );
        return c;
    };
    let mut source_cfg: SourceConfig = cfg.source.clone();
    source_cfg.cache_dir = cache.path().join("cache");
    source_cfg.timeout = timeout;
    // The agent's fetch: its status branches by name, as its scope says.
    let applied = state
        .applied
        .as_deref()
        .and_then(|c| git2::Oid::from_str(c).ok());
    let fetched = Source::open(source_cfg).and_then(|mut s| {
        s.fetch_scoped(|repo, head| {
            crate::admit::status_scope(repo, &[applied, head], &cfg.env, &cfg.cluster)
        })
        .map(|f| (s, f))
    });
    let (source, fetched) = match fetched {
        Ok(x) => x,
        Err(e) => {
            let fix = match &e {
                crate::source::Error::BranchMissing { .. } => format!(
                    "push the branch, or name the one you use in DROVER_BRANCH (now {})",
                    cfg.source.branch
                ),
                _ => "check DROVER_REPO and the credentials Secret (a token with read access to the repository and write access to this cluster's status branch)".to_owned(),
            };
            c.fail("repository", format!("cannot fetch {url}: {e}"), fix);
            for name in &GIT_CHECKS[1..] {
                c.skip(name, "needs the repository");
            }
            return c;
        }
    };
    c.pass(
        "repository",
        format!(
            "{url} reachable with the configured credentials; {} at {}",
            cfg.source.branch,
            &fetched.head.to_string()[..12]
        ),
    );
    let repo = source.repo();

    // The head's signature, against the keys the agent is configured with.
    if cfg.verify == crate::trust::Mode::Off {
        c.fail(
            "signature",
            "DROVER_VERIFY=off: any commit pushed to the branch is applied",
            "remove DROVER_VERIFY (the default, all, verifies every commit)",
        );
    } else {
        let ssh = cfg
            .allowed_signers
            .as_deref()
            .map(AllowedSigners::load)
            .transpose();
        let pgp = cfg
            .openpgp_keys
            .as_deref()
            .map(OpenPgpKeys::load)
            .transpose();
        match (ssh, pgp) {
            (Ok(None), Ok(None)) => c.fail(
                "signature",
                "no allowed-signers file and no OpenPGP keys configured",
                "mount the drover-allowed-signers Secret (docs/install.md, step 2)",
            ),
            (Err(e), _) | (_, Err(e)) => c.fail(
                "signature",
                e.to_string(),
                "fix the allowed_signers file (or the OpenPGP keys) of the overlay",
            ),
            (Ok(ssh), Ok(pgp)) => {
                let (ssh, pgp) = (ssh.unwrap_or_default(), pgp.unwrap_or_default());
                let signers = Signers {
                    ssh: &ssh,
                    openpgp: &pgp,
                };
                match crate::agent::recover::trust_verdict(cfg, state, repo, fetched.head, signers)
                {
                    Ok(message) => c.pass("signature", message),
                    Err(r) => c.fail("signature", r.message, r.fix),
                }
            }
        }
    }

    // The config at the head, and this cluster in it.
    let config = crate::config::GitTreeFiles::at_rev(repo, &fetched.head.to_string())
        .map_err(|e| e.to_string())
        .and_then(|files| {
            crate::config::load(&files).map_err(|d| {
                d.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
        });
    let config = match config {
        Ok(cfg) => cfg,
        Err(e) => {
            c.fail(
                "config",
                format!("the head's config is invalid: {e}"),
                "drover check in the config repository shows every problem",
            );
            for name in [
                "report-signer",
                "status-branches",
                "status-push",
                "updater-image",
                "next-window",
            ] {
                c.skip(name, "needs a valid config");
            }
            return c;
        }
    };
    let Some(env) = config.envs.get(&cfg.env) else {
        c.fail(
            "config",
            format!("the config has no environment {:?}", cfg.env),
            format!("set DROVER_ENV to one of {}", config.root.chain.join(", ")),
        );
        return c;
    };
    let listed = config
        .root
        .clusters
        .get(&cfg.env)
        .is_some_and(|cs| cs.contains(&cfg.cluster));
    if listed || !config.root.clusters.contains_key(&cfg.env) {
        c.pass(
            "config",
            format!("environment {} pins {}", cfg.env, env.version),
        );
    } else {
        c.fail(
            "config",
            format!(
                "cluster {} is not listed for {} under [clusters]",
                cfg.cluster, cfg.env
            ),
            "add it to [clusters] in drover.toml, or set DROVER_CLUSTER to the listed name",
        );
    }

    check_report_signer(cfg, repo, fetched.head, &config, &mut c);
    check_status_branches(cfg, repo, &config, &mut c);
    check_status_push(cfg, &source, fetched.head, &config, &mut c);
    check_updater_image(env, &mut c);
    let now = chrono::Utc::now();
    match crate::window::Calendar::of(env)
        .ok()
        .and_then(|cal| cal.periods(now).find(|p| p.patch_only.is_none()))
    {
        Some(w) => c.pass(
            "next-window",
            format!("{} to {}", w.start.to_rfc3339(), w.end.to_rfc3339()),
        ),
        None => c.fail(
            "next-window",
            "no window ahead",
            "check [window] and the freezes of the environment file",
        ),
    }
    c
}

/// The agent's report key is present, and `report_signers` lists it for
/// `<env>/<cluster>`, so the next environment's gate counts its reports.
fn check_report_signer(
    cfg: &AgentConfig,
    repo: &git2::Repository,
    head: git2::Oid,
    config: &RepoConfig,
    c: &mut Checks,
) {
    let who = format!("{}/{}", cfg.env, cfg.cluster);
    let Some(key) = &cfg.publish.signing_key else {
        c.fail(
            "report-signer",
            "no status signing key: the agent's reports are unsigned and count for nothing",
            "mount the drover-report-signing-key Secret (docs/install.md, step 2)",
        );
        return;
    };
    let Some(path) = &config.root.report_signers else {
        c.fail(
            "report-signer",
            "drover.toml has no [promotion] report_signers",
            format!(
                "add an allowed-signers file listing {who}'s key and name it in report_signers"
            ),
        );
        return;
    };
    let public = key.public_key();
    let text = crate::config::GitTreeFiles::at_rev(repo, &head.to_string())
        .ok()
        .and_then(|f| crate::config::Files::read(&f, path).ok().flatten())
        .and_then(|b| String::from_utf8(b).ok());
    let line = format!(
        "{who} namespaces=\"git\" {}",
        public.to_openssh().unwrap_or_default()
    );
    let signers = text.as_deref().map(AllowedSigners::parse);
    match signers {
        Some(Ok(s)) => {
            let found = s.entries().iter().any(|e| {
                e.key.key_data() == public.key_data()
                    && e.principals.contains(&who)
                    && e.allows_namespace("git")
            });
            if found {
                c.pass(
                    "report-signer",
                    format!("{path} lists this cluster's key as {who}"),
                );
            } else {
                c.fail(
                    "report-signer",
                    format!("{path} does not list this cluster's key as {who}"),
                    format!("add this line to {path} in a reviewed change: {line}"),
                );
            }
        }
        Some(Err(e)) => c.fail(
            "report-signer",
            format!("{path}: {e}"),
            "fix the file (git's allowed-signers format)",
        ),
        None => c.fail(
            "report-signer",
            format!("{path} is missing at the head"),
            format!("add it with this line: {line}"),
        ),
    }
}

/// The status branches came with the fetch: how many, and this cluster's.
fn check_status_branches(
    cfg: &AgentConfig,
    repo: &git2::Repository,
    config: &RepoConfig,
    c: &mut Checks,
) {
    let branch = &config.root.status_branch;
    let ns = crate::status::cluster_namespace(branch);
    let own = format!("{ns}{}/{}", cfg.env, cfg.cluster);
    let mut count = 0;
    let mut has_own = false;
    if let Ok(refs) = repo.references_glob(&format!("refs/remotes/origin/{ns}*")) {
        for r in refs.flatten() {
            count += 1;
            has_own |= r.name().ok() == Some(format!("refs/remotes/origin/{own}").as_str());
        }
    }
    if branch != &cfg.source.status_branch && cfg.status_branch.is_some() {
        c.fail(
            "status-branches",
            format!(
                "DROVER_STATUS_BRANCH is {}, the config's status_branch is {branch}",
                cfg.source.status_branch
            ),
            "remove DROVER_STATUS_BRANCH, or make them agree",
        );
        return;
    }
    c.pass(
        "status-branches",
        format!(
            "{count} fetched under {ns}; {own} {}",
            if has_own {
                "exists"
            } else {
                "not pushed yet (the agent pushes it after its first pass)"
            }
        ),
    );
}

/// The agent's credentials may push to this cluster's status branch: a
/// scratch branch beside it is pushed and deleted ([`crate::status::probe_push`]).
fn check_status_push(
    cfg: &AgentConfig,
    source: &Source,
    head: git2::Oid,
    config: &RepoConfig,
    c: &mut Checks,
) {
    let own = crate::status::cluster_branch(&config.root.status_branch, &cfg.env, &cfg.cluster);
    let nonce = format!("{:08x}", rand::random::<u32>());
    let mut probe_cfg = source.config().clone();
    probe_cfg
        .status_branch
        .clone_from(&config.root.status_branch);
    let probed = Source::open(probe_cfg)
        .map_err(crate::status::PushError::from)
        .and_then(|s| crate::status::probe_push(&s, &cfg.env, &cfg.cluster, head, &nonce));
    let allow = format!(
        "let the agent's credentials push to {own}: the forge's branch protection or ruleset, \
         its pre-receive hooks, the deploy key's or token's write access (docs/status.md, \
         \"Per-agent write access\")"
    );
    match probed {
        Ok(crate::status::Probe::Allowed { scratch }) => c.pass(
            "status-push",
            format!("the git server takes a push beside {own} ({scratch} created and deleted)"),
        ),
        Ok(crate::status::Probe::LeftBehind { scratch, message }) => c.fail(
            "status-push",
            format!(
                "pushing works, but deleting the scratch branch {scratch} was refused: {message}"
            ),
            format!("delete the branch {scratch} on the forge"),
        ),
        Err(e) => c.fail(
            "status-push",
            format!("the agent's reports would be refused: {e}"),
            allow,
        ),
    }
}

/// The updater image the driver runs is pinned by a real digest.
fn check_updater_image(env: &crate::config::EnvConfig, c: &mut Checks) {
    let image = match env.driver.updater_image() {
        Ok(image) => image,
        Err(why) => return c.fail("updater-image", why, "set [driver] image"),
    };
    if image == crate::config::TEST_UPDATER_IMAGE {
        return c.fail(
            "updater-image",
            format!("{image} is the tests' stand-in digest of a build with test hooks"),
            "run a release build of drover (drover --version names its updater image), or set [driver] image to a pushed image by digest",
        );
    }
    let digest = image.split_once("@sha256:").map(|(_, d)| d);
    match digest {
        Some(d) if d.len() == 64 && d.bytes().all(|b| b == b'0') => c.fail(
            "updater-image",
            format!("{image} is the all-zero placeholder digest, no image"),
            "run a release build of drover (drover --version names its updater image), or set [driver] image to a pushed image by digest",
        ),
        Some(_) => c.pass("updater-image", format!("{image} (pinned by digest)")),
        None => c.fail(
            "updater-image",
            format!("{image} is not pinned by digest: a tag can move or never be pushed"),
            "set [driver] image to name@sha256:<digest>",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_says_what_to_do_under_each_failure() {
        let mut c = Checks::default();
        c.pass("crd", "installed");
        c.fail("rbac", "may not: patch nodes", "apply rbac.yaml");
        c.skip("signature", "needs the repository");
        let text = render(&c.0);
        assert!(text.contains("ok   crd"), "{text}");
        assert!(
            text.contains("FAIL rbac             may not: patch nodes"),
            "{text}"
        );
        assert!(text.contains("fix: apply rbac.yaml"), "{text}");
        assert!(text.ends_with("drover doctor: 1 check failed\n"), "{text}");
    }

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
