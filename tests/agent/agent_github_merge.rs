//! From a GitHub merge to a running agent: a pull request's commit (signed
//! by its author's SSH key) merged through the merge button, which makes a
//! two-parent merge commit signed by GitHub's web-flow OpenPGP key (here an
//! RSA key made by gpg stands in for it). `drover check --base` and
//! `drover verify` in CI accept the merge, and the agent, with the key file
//! beside its allowed signers and `verify = all`, applies it against the
//! real API server. The same merge made by another key, one claiming the
//! same name, is refused by `drover verify` and by the agent, which stays
//! on the merge it trusted.

use std::sync::Arc;

use crate::support::agent::*;
use crate::support::backend::{pool_options, start_sim};
use crate::support::cli::drover_at;
use crate::support::git::{commit_all, git};
use crate::support::gpg::Gpg;
use crate::support::kube::{ControlPlane, TestNamespace};
use drover::rollout::VirtualClock;

/// A pull request on branch `branch`: `test` pinned to `version` in one
/// commit signed by its author's SSH key (listed in the allowed signers).
fn pull_request(repo: &ConfigRepo, branch: &str, version: &str) {
    git(&repo.work, &["checkout", "-q", "-b", branch, "main"]);
    let path = repo.work.join("environments/test.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("version = \"").unwrap() + "version = \"".len();
    let end = start + text[start..].find('"').unwrap();
    std::fs::write(
        &path,
        format!("{}{version}{}", &text[..start], &text[end..]),
    )
    .unwrap();
    commit_all(
        &repo.work,
        &format!("test: move to {version}"),
        Some(&repo.key),
        None,
    );
    git(&repo.work, &["checkout", "-q", "main"]);
}

/// `drover verify` as CI runs it on the merged main: both signer files, from `since`.
fn verify(repo: &ConfigRepo, keys: &std::path::Path, since: &str) -> (i32, serde_json::Value) {
    let (code, out, err) = drover_at(
        &repo.work,
        &[
            "--format",
            "json",
            "verify",
            "--allowed-signers",
            repo.signers.to_str().unwrap(),
            "--openpgp-keys",
            keys.to_str().unwrap(),
            "--since",
            since,
        ],
    );
    (
        code,
        serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out} {err}")),
    )
}

#[tokio::test]
async fn a_merge_button_merge_signed_by_web_flow_is_applied_and_an_impostors_refused() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "webflow").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let repo = ConfigRepo::new(&[EnvSpec::test_pool(ns.name())]);
    let gpg = Gpg::new();
    let web_flow = gpg.key(
        "GitHub (web-flow commit signing) <noreply@github.com>",
        "rsa2048",
        "sign",
        "never",
        None,
    );
    let impostor = gpg.key(
        "GitHub (web-flow commit signing) <noreply@github.com>",
        "rsa2048",
        "sign",
        "never",
        None,
    );
    // What the operator puts into the Secret: https://github.com/web-flow.gpg.
    let keys = repo.dir.path().join("web-flow.gpg");
    gpg.export(&[&web_flow], &keys);

    // Outside the window (the 10th), so the agent applies and waits.
    let clock: drover::agent::SharedClock = Arc::new(VirtualClock::new(dec(10, 12, 0)));
    let mut cfg = agent_config(&repo, "test", "test-1", ns.name(), "agent-a");
    cfg.openpgp_keys = Some(keys.clone());
    let agent = RunningAgent::start(cfg, clock, None);
    let first = git(&repo.work, &["rev-parse", "HEAD"]);
    await_status(&client, ns.name(), "test-test-1", "initial apply", |s| {
        s.last_applied_commit.as_deref() == Some(first.as_str())
    })
    .await;

    // Pull request #1, merged through the button.
    pull_request(&repo, "bump-1.13.0", "1.13.0");
    let merge = gpg.merge_button(
        &repo.work,
        "bump-1.13.0",
        1,
        "test: move to 1.13.0",
        &web_flow,
    );
    // CI on main: the gate and the signatures accept it.
    let (code, out, err) = drover_at(&repo.work, &["check", "--base", &first]);
    assert_eq!(code, 0, "check --base: {out} {err}");
    let (code, json) = verify(&repo, &keys, &first);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["checked"], 2, "the PR's commit and the merge: {json}");
    assert_eq!(
        json["signer"],
        "GitHub (web-flow commit signing) <noreply@github.com>"
    );
    repo.push();
    agent.webhook().await;
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "the merge applied",
        |s| s.last_applied_commit.as_deref() == Some(merge.as_str()),
    )
    .await
    .status
    .unwrap();
    assert_eq!(st.refused, None);
    assert_eq!(st.target.as_deref(), Some("1.13.0"));

    // Pull request #2, "merged" by a key that is not web-flow's.
    pull_request(&repo, "bump-1.13.1", "1.13.1");
    let forged = gpg.merge_button(
        &repo.work,
        "bump-1.13.1",
        2,
        "test: move to 1.13.1",
        &impostor,
    );
    let (code, json) = verify(&repo, &keys, &merge);
    assert_eq!(code, 1, "{json}");
    assert_eq!(json["error"]["commit"], forged);
    assert_eq!(json["error"]["reason"], "unknown_key");
    repo.push();
    agent.webhook().await;
    let st = await_status(
        &client,
        ns.name(),
        "test-test-1",
        "the forged merge refused",
        |s| s.refused.as_ref().is_some_and(|r| r.commit == forged),
    )
    .await
    .status
    .unwrap();
    let r = st.refused.unwrap();
    assert_eq!(
        (r.stage.as_str(), r.reason.as_str()),
        ("trust", "unknown_key")
    );
    assert!(r.message.contains(&impostor), "{}", r.message);
    assert_eq!(st.last_applied_commit.as_deref(), Some(merge.as_str()));
    agent.stop();
    sim.shutdown().await;
}
