//! The status object as the tools around the cluster read it, with the
//! agent against the real kube-apiserver: the real `kubectl wait
//! --for=condition=...` and `kubectl get dst` (tests/tools), kstatus's own
//! `Compute` as Flux's health checks call it, and the Argo CD health script
//! docs/install.md shows, run as Argo CD runs it (tests/health). A confirmed
//! rollout is Ready, Current and Healthy; a failed one is Stalled, Failed
//! and Degraded, and `kubectl wait --for=condition=Ready` gives up on it.
//! A rollout whose status report the git server refuses (a pre-receive
//! hook) is Stalled, Failed and Degraded until the hook is gone, then Ready
//! with its report on the branch.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, OnceLock};

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::kube::ControlPlane;
use crate::support::kubelet::Fault;
use drover::agent::crd::DroverStatus;
use drover::rollout::VirtualClock;
use kube::api::Api;

const NAME: &str = "test-test-1";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory a `build` script prints (built once per binary run).
fn built(script: &str) -> PathBuf {
    let out = Command::new(root().join(script))
        .env(
            "PATH",
            format!(
                "{}:/usr/local/go/bin",
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The real kubectl (tests/tools/build).
fn kubectl() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built("tests/tools/build").join("kubectl"))
}

/// The health judge (tests/health/build).
fn judge() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built("tests/health/build"))
}

pub(crate) fn kubectl_cmd(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new(kubectl());
    c.arg("--kubeconfig")
        .arg(ControlPlane::get().kubeconfig_path())
        .args(["-n", ns])
        .args(args);
    c
}

/// `kubectl wait --for=jsonpath='{<path>}'=<value> dst/NAME --timeout=<timeout>`,
/// as a hub or a pipeline gates on the counts, run to its end.
fn kubectl_wait_for(ns: &str, path: &str, value: &str, timeout: &str) -> Output {
    kubectl_cmd(
        ns,
        &[
            "wait",
            &format!("--for=jsonpath={{{path}}}={value}"),
            &format!("dst/{NAME}"),
            &format!("--timeout={timeout}"),
        ],
    )
    .output()
    .unwrap()
}

/// The Argo CD script's message for the object as the API server serves it.
fn argocd_message(ns: &str, lua: &Path) -> String {
    let got = kubectl_cmd(ns, &["get", "dst", NAME, "-o", "json"])
        .output()
        .unwrap();
    let mut child = Command::new(judge())
        .args([std::ffi::OsStr::new("argocd"), lua.as_os_str()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&got.stdout).unwrap();
    let out = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["message"].as_str().unwrap_or_default().to_owned()
}

/// `kubectl wait --for=condition=<condition> dst/NAME --timeout=<timeout>`,
/// run to its end.
fn kubectl_wait(ns: &str, condition: &str, timeout: &str) -> Output {
    kubectl_wait_started(ns, condition, timeout)
        .wait_with_output()
        .unwrap()
}

/// The same wait, started (to be awaited with [`finished`]).
fn kubectl_wait_started(ns: &str, condition: &str, timeout: &str) -> std::process::Child {
    kubectl_cmd(
        ns,
        &[
            "wait",
            &format!("--for=condition={condition}"),
            &format!("dst/{NAME}"),
            &format!("--timeout={timeout}"),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

/// A started wait's output, awaited off the runtime's thread.
async fn finished(child: std::process::Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The Argo CD health script of docs/install.md ("Health checks"), taken
/// from the `argocd-cm` YAML block as a user pastes it.
fn argocd_script(dir: &Path) -> PathBuf {
    const KEY: &str = "resource.customizations.health.drover.dev_DroverStatus";
    let doc = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    let block = doc
        .split("```yaml\n")
        .skip(1)
        .map(|b| &b[..b.find("```").unwrap()])
        .find(|b| b.contains(KEY))
        .expect("docs/install.md shows argocd-cm's health script");
    let cm: serde_json::Value = serde_yaml::from_str(block).unwrap();
    let script = cm["data"][KEY].as_str().expect("the script is a string");
    let path = dir.join("health.lua");
    std::fs::write(&path, script).unwrap();
    path
}

/// What kstatus and the Argo CD script make of the object as the API
/// server serves it: (kstatus status, Argo CD status).
fn judged(ns: &str, lua: &Path) -> (String, String) {
    let got = kubectl_cmd(ns, &["get", "dst", NAME, "-o", "json"])
        .output()
        .unwrap();
    assert!(got.status.success(), "{}", text(&got));
    let run = |args: &[&dyn AsRef<std::ffi::OsStr>]| {
        let mut c = Command::new(judge());
        for a in args {
            c.arg(a);
        }
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&got.stdout).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "health {}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["status"].as_str().unwrap().to_owned()
    };
    (run(&[&"kstatus"]), run(&[&"argocd", &lua]))
}

/// What the real kubectl shows of `name`'s blocker: the BLOCKER column of
/// `kubectl get dst` and the `Blocked` condition's status and reason
/// (`-o jsonpath`), as a person or a pipeline reads them.
pub(crate) fn blocker_shown(ns: &str, name: &str) -> (String, String, String) {
    let jsonpath = |field: &str| {
        let arg = format!("jsonpath={{.status.conditions[?(@.type==\"Blocked\")].{field}}}");
        let out = kubectl_cmd(ns, &["get", "dst", name, "-o", &arg])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    (
        column(ns, name, "BLOCKER"),
        jsonpath("status"),
        jsonpath("reason"),
    )
}

/// The column `header` of `kubectl get dst name` ("" when blank).
fn column(ns: &str, name: &str, header: &str) -> String {
    let out = kubectl_cmd(ns, &["get", "dst", name]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let s = String::from_utf8(out.stdout).unwrap();
    let mut lines = s.lines();
    let (head, row) = (lines.next().unwrap(), lines.next().unwrap());
    // kubectl aligns its columns and leaves an empty one blank: read by offset.
    let at = head
        .find(header)
        .unwrap_or_else(|| panic!("a {header} column"));
    let cell = row.get(at..).unwrap_or("").split(' ').next().unwrap_or("");
    cell.to_owned()
}

/// The READY column of `kubectl get dst`.
fn ready_column(ns: &str) -> String {
    column(ns, NAME, "READY")
}

#[tokio::test]
async fn kubectl_wait_flux_and_argo_cd_read_a_confirmed_and_a_failed_rollout() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = crate::support::kube::TestNamespace::create(&client, "conditions").await;
    let pool = ns.name().to_string();
    let sim = start_sim(&client, pool_options(&pool, 1)).await;
    let node = sim.node_names().remove(0);
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(&pool)]);
    let clock = VirtualClock::new(dec(1, 2, 30));
    let mut cfg = agent_config(&repo, "test", "test-1", &pool, "conditions-agent");
    // A refused report is tried again after five poll intervals.
    cfg.poll = std::time::Duration::from_secs(1);
    let agent = RunningAgent::start(cfg, Arc::new(clock.clone()), None);
    let scratch = tempfile::tempdir().unwrap();
    let lua = argocd_script(scratch.path());

    // Adopted at the pinned version: Ready, as kubectl waits for it (kubectl
    // wait gives up at once on an object that does not exist yet).
    let obj = await_status(&client, &pool, NAME, "confirmed", |s| {
        s.state.as_deref() == Some("confirmed")
    })
    .await;
    let wait = kubectl_wait(&pool, "Ready", "120s");
    assert!(wait.status.success(), "{}", text(&wait));
    assert!(text(&wait).contains("condition met"), "{}", text(&wait));
    let status = obj.status.as_ref().unwrap();
    assert_eq!(status.observed_generation, obj.metadata.generation);
    assert!(status.observed_generation.is_some());
    assert_eq!(ready_column(&pool), "True");
    assert_eq!(
        judged(&pool, &lua),
        ("Current".to_owned(), "Healthy".to_owned())
    );
    // The counts, as scalars the tools read without code: kubectl waits
    // on them, the Argo CD script says them.
    for (path, value) in [
        (".status.upToDateNodes", "1"),
        (".status.readyNodes", "1"),
        (".status.inFlightNodes", "0"),
        (".status.nodes", "1"),
        (".status.target", "1.12.0"),
    ] {
        let wait = kubectl_wait_for(&pool, path, value, "60s");
        assert!(wait.status.success(), "{path}={value}: {}", text(&wait));
    }
    // Control: a count the object does not have is not met.
    let wait = kubectl_wait_for(&pool, ".status.upToDateNodes", "2", "2s");
    assert!(!wait.status.success(), "{}", text(&wait));
    assert!(
        argocd_message(&pool, &lua).ends_with("(1/1 nodes up to date, 1 ready, 0 in flight)"),
        "{}",
        argocd_message(&pool, &lua)
    );

    // The git server refuses the status report for good (a pre-receive
    // hook, as a forge's branch protection answers): a rollout that would
    // be Reconciling, then Ready, is Stalled instead, naming the branch and
    // what to do, because later environments cannot read its evidence.
    // kubectl's wait for Stalled, started before the change, returns.
    await_status(&client, &pool, NAME, "the adoption's report pushed", |s| {
        s.conditions
            .iter()
            .any(|c| c.kind == "ReportPushed" && c.status == "True")
    })
    .await;
    repo.refuse_status_pushes("status reports are frozen by the change board");
    let stalled = kubectl_wait_started(&pool, "Stalled", "120s");
    repo.bump("test", "1.12.1", true);
    agent.handle.fetch();
    let stalled = finished(stalled).await;
    assert!(stalled.status.success(), "{}", text(&stalled));
    let obj = await_status(
        &client,
        &pool,
        NAME,
        "confirmed at 1.12.1 and still Stalled",
        |s| {
            s.state.as_deref() == Some("confirmed")
                && s.target.as_deref() == Some("1.12.1")
                && s.conditions
                    .iter()
                    .any(|c| c.kind == "Stalled" && c.status == "True")
        },
    )
    .await;
    let status = obj.status.unwrap();
    let cond = |kind: &str| status.conditions.iter().find(|c| c.kind == kind).unwrap();
    let st = cond("Stalled");
    assert_eq!(st.reason, "ReportRefused", "{st:?}");
    assert!(
        st.message.contains("on branch drover/status.d/test/test-1")
            && st.message.contains("frozen by the change board")
            && st.message.contains("let the agent's git credentials push")
            && st.message.contains("The rollout meanwhile: Confirmed"),
        "{}",
        st.message
    );
    assert_eq!(
        (
            cond("Ready").status.as_str(),
            cond("Reconciling").status.as_str()
        ),
        ("False", "False")
    );
    assert_eq!(ready_column(&pool), "False");
    assert_eq!(
        judged(&pool, &lua),
        ("Failed".to_owned(), "Degraded".to_owned())
    );
    // Control: the report never reached the branch.
    assert_eq!(
        repo.report("test", "test-1").map(|r| r.version.to_string()),
        Some("1.12.0".into())
    );
    // The forge fixed: the agent pushes again by itself (after five poll
    // intervals) and the cluster is Ready, with its evidence recorded.
    repo.accept_status_pushes();
    let ready = kubectl_wait(&pool, "Ready", "120s");
    assert!(ready.status.success(), "{}", text(&ready));
    let r = repo.report("test", "test-1").unwrap();
    assert_eq!(
        (r.version.to_string(), r.state.as_str()),
        ("1.12.1".into(), "confirmed")
    );
    // The digest of the last signed report: the status branch's tip, as
    // a hub compares it with what it fetched.
    let tip = repo.report_commit("test", "test-1").unwrap();
    let wait = kubectl_wait_for(&pool, ".status.lastReportCommit", &tip, "60s");
    assert!(wait.status.success(), "{}", text(&wait));
    assert_eq!(
        judged(&pool, &lua),
        ("Current".to_owned(), "Healthy".to_owned())
    );

    // A failed rollout: kubectl's wait for Stalled, started before the
    // change, returns; a wait for Ready gives up.
    let stalled = kubectl_wait_started(&pool, "Stalled", "180s");
    sim.set_fault(&node, Fault::JobFails);
    repo.bump("test", "1.13.0", true);
    agent.handle.fetch();
    let stalled = finished(stalled).await;
    assert!(stalled.status.success(), "{}", text(&stalled));
    let api: Api<DroverStatus> = Api::namespaced(client.clone(), &pool);
    let status = api.get_status(NAME).await.unwrap().status.unwrap();
    assert_eq!(status.state.as_deref(), Some("failed"), "{status:?}");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.kind == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Failed")
    );
    assert!(ready.message.contains("1.13.0"), "{}", ready.message);
    let wait = kubectl_wait(&pool, "Ready", "2s");
    assert!(!wait.status.success(), "{}", text(&wait));
    assert!(text(&wait).contains("timed out"), "{}", text(&wait));
    assert_eq!(ready_column(&pool), "False");
    assert_eq!(
        judged(&pool, &lua),
        ("Failed".to_owned(), "Degraded".to_owned())
    );

    agent.stop();
    sim.shutdown().await;
}
