//! The layout's words are the code's: the states the docs list are
//! `RolloutState::ALL` (in docs/cli.schema.json too), the states an alert
//! is advised for are those whose `RolloutState::attention` asks for one, the status branches they name are the per-cluster
//! branches `status::cluster_branch` makes (the single `drover/status` only
//! as the older layout), and the upgrade Jobs' namespace is the one
//! deploy/base sets.
//!
//! Lists between `<!-- generated: NAME -->` and `<!-- end generated -->`
//! are written by this test: `DROVER_BLESS=1 cargo test --test offline
//! docs_generated` rewrites them from the code; without it a list that
//! differs fails, saying so.

use drover::rollout::{Attention, RolloutState};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn states() -> Vec<&'static str> {
    RolloutState::ALL.iter().map(|s| s.as_str()).collect()
}

/// The states whose attention is `a`, as a PromQL alternation.
fn alternation(a: Attention) -> String {
    RolloutState::ALL
        .iter()
        .filter(|s| s.attention() == a)
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join("|")
}

/// The generated block `name`'s content, from the code.
fn generate(name: &str) -> String {
    match name {
        // docs/install.md's alerts: at once, when it lasts, never.
        "alert-now" => format!(
            "`drover_rollout_state{{state=~\"{}\"}} == 1`",
            alternation(Attention::Now)
        ),
        "alert-lasting" => format!(
            "`drover_rollout_state{{state=~\"{}\"}} == 1`",
            alternation(Attention::Lasting)
        ),
        "quiet-states" => RolloutState::ALL
            .iter()
            .filter(|s| s.attention() == Attention::None)
            .map(|s| format!("`{}`", s.as_str()))
            .collect::<Vec<_>>()
            .join(", "),
        // docs/install.md's metric: one series per state.
        "metric-states" => states()
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", "),
        // The per-cluster branch, as every doc spells it.
        "status-branch" => format!(
            "`{}`",
            drover::status::cluster_branch(
                drover::config::DEFAULT_STATUS_BRANCH,
                "<env>",
                "<cluster>"
            )
        ),
        other => panic!("no generated block {other:?}"),
    }
}

/// Every generated block of `rel` holds what the code says (rewritten under DROVER_BLESS=1).
fn check_generated(rel: &str) -> Vec<String> {
    let text = read(rel);
    let mut out = String::new();
    let mut rest = text.as_str();
    let mut drift = Vec::new();
    while let Some(i) = rest.find("<!-- generated: ") {
        let (before, tail) = rest.split_at(i);
        out.push_str(before);
        let close = tail.find("-->").expect("unclosed marker") + 3;
        let name = tail["<!-- generated: ".len()..close - 3].trim().to_owned();
        let end = tail.find("<!-- end generated -->").expect("no end marker");
        let body = &tail[close..end];
        let want = generate(&name);
        if body != want {
            drift.push(format!(
                "{rel}: block {name:?} says {body:?}, the code says {want:?}"
            ));
        }
        out.push_str(&tail[..close]);
        out.push_str(&want);
        rest = &tail[end..];
    }
    out.push_str(rest);
    if !drift.is_empty() && std::env::var_os("DROVER_BLESS").is_some() {
        std::fs::write(root().join(rel), out).unwrap();
        return Vec::new();
    }
    drift
}

#[test]
fn generated_lists_are_the_code_s() {
    let mut drift = Vec::new();
    for rel in [
        "docs/install.md",
        "docs/config.md",
        "docs/status.md",
        "README.md",
    ] {
        drift.extend(check_generated(rel));
    }
    assert!(
        drift.is_empty(),
        "{}\nrun DROVER_BLESS=1 cargo test --test offline docs_generated",
        drift.join("\n")
    );
}

/// The rows of the first table after `heading` whose first cell is a `word`.
fn table_states(rel: &str, heading: &str) -> Vec<String> {
    let text = read(rel);
    let at = text
        .find(heading)
        .unwrap_or_else(|| panic!("{rel}: no {heading:?}"));
    text[at..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cell = l.split('|').nth(1)?.trim();
            cell.strip_prefix('`')?.strip_suffix('`').map(str::to_owned)
        })
        .collect()
}

#[test]
fn state_tables_name_every_state() {
    let mut want: Vec<String> = states().iter().map(|s| s.to_string()).collect();
    want.sort();
    for (rel, heading) in [
        ("docs/config.md", "### States"),
        ("docs/design.md", "| state | meaning |"),
    ] {
        let mut got = table_states(rel, heading);
        got.sort();
        assert_eq!(
            got, want,
            "{rel}: the states table and RolloutState::ALL differ"
        );
    }
}

#[test]
fn the_blocker_table_and_the_schema_name_every_blocker() {
    let mut want: Vec<String> = drover::rollout::Blocker::ALL
        .iter()
        .map(|b| b.as_str().to_string())
        .collect();
    want.sort();
    let mut got = table_states("docs/status.md", "| blocker | what holds it |");
    got.sort();
    assert_eq!(
        got, want,
        "docs/status.md's Blockers table and Blocker::ALL differ"
    );
    let schema: serde_json::Value = serde_json::from_str(&read("docs/cli.schema.json")).unwrap();
    let mut enumerated: Vec<String> = schema["$defs"]["blocker"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    enumerated.sort();
    assert_eq!(
        enumerated, want,
        "docs/cli.schema.json $defs.blocker.enum and Blocker::ALL differ"
    );
}

#[test]
fn the_schema_s_states_are_the_code_s() {
    let schema: serde_json::Value =
        serde_json::from_str(&read("docs/cli.schema.json")).expect("docs/cli.schema.json");
    let listed: Vec<&str> = schema["$defs"]["state"]["enum"]
        .as_array()
        .expect("$defs.state.enum")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        listed,
        states(),
        "docs/cli.schema.json $defs.state.enum and RolloutState::ALL differ"
    );
}

/// Files a person reads to learn the layout.
fn prose() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.ends_with(".md").then(|| format!("docs/{name}"))
        })
        .collect();
    files.extend(
        [
            "README.md",
            "CONTRIBUTING.md",
            "example-repo/README.md",
            "example-repo/drover.toml",
            "example-repo/agents.allowed_signers",
        ]
        .map(String::from),
    );
    files.sort();
    files
}

#[test]
fn the_single_status_branch_is_named_only_as_the_older_layout() {
    let old = drover::config::DEFAULT_STATUS_BRANCH;
    let per_cluster = drover::status::cluster_namespace(old);
    // Where the bare name is right: the config key and its value, the older
    // layout, and git's ref names that explain why `.d`.
    let fine = [
        "older",
        "status_branch",
        "refs/heads/",
        "ls-remote",
        "\"name\"",
        "at once",
    ];
    let mut stale = Vec::new();
    for rel in prose() {
        for (n, line) in read(&rel).lines().enumerate() {
            let mut rest = line;
            while let Some(i) = rest.find(old) {
                let after = &rest[i + old.len()..];
                let bare = !after.starts_with(&per_cluster[old.len()..])
                    && !after.starts_with('/')
                    && !after.starts_with('-');
                if bare && !fine.iter().any(|f| line.contains(f)) {
                    stale.push(format!("{rel}:{}: {line}", n + 1));
                    break;
                }
                rest = after;
            }
        }
    }
    assert!(
        stale.is_empty(),
        "these lines name the single `{old}` branch of the older layout as where reports \
         are; each cluster reports to {per_cluster}<env>/<cluster>:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_upgrade_jobs_namespace_is_the_deployment_s() {
    let deployment = read("deploy/base/deployment.yaml");
    let ns = deployment
        .lines()
        .skip_while(|l| !l.contains("DROVER_JOB_NAMESPACE"))
        .find_map(|l| l.trim().strip_prefix("value: "))
        .expect("deploy/base sets DROVER_JOB_NAMESPACE")
        .trim_matches('"')
        .to_owned();
    for rel in ["docs/drivers.md", "docs/install.md"] {
        let text = read(rel);
        assert!(
            text.contains(&format!("`{ns}`")),
            "{rel} does not name the Jobs' namespace `{ns}`"
        );
    }
    let drivers = read("docs/drivers.md").replace('\n', " ");
    for wrong in [
        "in the agent's namespace once",
        "`privileged` for the agent's namespace",
    ] {
        assert!(
            !drivers.contains(wrong),
            "docs/drivers.md: {wrong:?}, but the Jobs run in `{ns}`"
        );
    }
}
