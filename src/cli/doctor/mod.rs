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

mod install;
mod repo;

use super::output::{print_document, Problem};
use super::{Global, Outcome};
use crate::agent::rbac::{
    Permission, CLUSTER_PERMISSIONS, JOB_NAMESPACE_PERMISSIONS, NAMESPACE_PERMISSIONS,
};
use crate::agent::AgentConfig;
use install::{read_install, Install};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::Client;
use repo::{check_git, GIT_CHECKS};
use serde::Serialize;
use std::path::PathBuf;
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
    let mut config = super::kube_config(args.kubeconfig.as_deref()).await?;
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
}
