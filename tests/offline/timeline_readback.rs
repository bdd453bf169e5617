//! The timeline page read back against what the nodes ran: a scripted
//! history of one cluster's five nodes (which version each ran, when) is
//! turned into the status reports an agent writes (counts and `[detail]`),
//! `drover status --html` draws the page, and the drawing alone (the bars'
//! geometry and the legend's colours, `tests/support/timeline.rs`) must
//! give back the same mix of versions at every stretch, nothing solid past
//! now, and a row that says so for a cluster that never reported.

use crate::support::cli::drover_at as drover;
use crate::support::git::{commit_configured, commit_file_on, example_checkout, git};
use crate::support::timeline::{self, Drawing};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

/// stage-1's five nodes: (from, node, version), in time order.
const NODES: &[(&str, &str, &str)] = &[
    ("2026-12-01T00:00:00Z", "n1", "1.12.0"),
    ("2026-12-01T00:00:00Z", "n2", "1.12.0"),
    ("2026-12-01T00:00:00Z", "n3", "1.12.0"),
    ("2026-12-01T00:00:00Z", "n4", "1.12.0"),
    ("2026-12-01T00:00:00Z", "n5", "1.12.0"),
    ("2027-01-08T01:20:00Z", "n1", "1.13.2"),
    ("2027-01-08T01:40:00Z", "n2", "1.13.2"),
    ("2027-01-08T02:00:00Z", "n3", "1.13.2"),
];

/// What each node ran at `at`.
fn nodes_at(at: DateTime<Utc>) -> BTreeMap<&'static str, &'static str> {
    let mut out = BTreeMap::new();
    for (from, node, version) in NODES {
        if t(from) <= at {
            out.insert(*node, *version);
        }
    }
    out
}

/// Versions → node count at `at`, from the nodes' history.
fn mix_at(at: DateTime<Utc>) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for v in nodes_at(at).values() {
        *out.entry((*v).to_owned()).or_default() += 1;
    }
    out
}

/// The report an agent writes at `since` for `target` in `state`, its
/// counts and `[detail]` read off the nodes.
fn report(target: &str, state: &str, since: &str, failed: &[&str]) -> String {
    let nodes = nodes_at(t(since));
    let at: Vec<&str> = nodes
        .iter()
        .filter(|(_, v)| **v == target)
        .map(|(n, _)| *n)
        .collect();
    let list = |v: &[&str]| {
        v.iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "env = \"stage\"\ncluster = \"stage-1\"\nconfig_commit = \"{c}\"\nversion = \"{target}\"\nstate = \"{state}\"\nsince = {since}\nnodes = {n}\nnodes_at_version = {a}\nmessage = \"\"\n\n[detail]\nat_version = [{at}]\nfailed = [{failed}]\n",
        c = "0".repeat(40),
        n = nodes.len(),
        a = at.len(),
        at = list(&at),
        failed = list(failed),
    )
}

#[test]
fn drawn_bars_read_back_as_the_nodes_history() {
    let dir = example_checkout();
    let dir = dir.path();
    git(dir, &["add", "-A"]);
    commit_configured(dir, &["-q", "-m", "initial"]);
    let reports = [
        report("1.12.0", "confirmed", "2026-12-01T00:00:00Z", &[]),
        report("1.13.2", "pending", "2026-12-10T00:00:00Z", &[]),
        report("1.13.2", "rolling", "2027-01-08T01:20:00Z", &[]),
        report("1.13.2", "rolling", "2027-01-08T01:40:00Z", &[]),
        // n3 reached 1.13.2 and failed its health check: the rollout stops.
        report("1.13.2", "failed", "2027-01-08T02:00:00Z", &["n3"]),
        // Written after `now`: a report from the future is not drawn.
        report("1.13.2", "rolling", "2027-02-08T01:00:00Z", &[]),
    ];
    for r in &reports {
        let since = r.lines().find_map(|l| l.strip_prefix("since = ")).unwrap();
        commit_file_on(
            dir,
            "drover/status",
            "status/stage/stage-1.toml",
            Some(r.as_bytes()),
            None,
            "status",
            Some(since),
        );
    }
    let now = t("2027-01-20T00:00:00Z");
    let page = dir.join("timeline.html");
    let (code, _, err) = drover(
        dir,
        &[
            "status",
            "--now",
            "2027-01-20T00:00:00Z",
            "--html",
            page.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let d: Drawing = timeline::read(&std::fs::read_to_string(&page).unwrap());
    assert_eq!(d.now, now);

    // At the middle of every stretch between two node changes (and between
    // the last and now), the bar's stacks are the nodes' versions.
    let mut edges: Vec<DateTime<Utc>> = NODES.iter().map(|(f, _, _)| t(f)).collect();
    edges.push(t("2026-12-10T00:00:00Z"));
    edges.push(now);
    edges.sort();
    edges.dedup();
    for w in edges.windows(2) {
        let mid = w[0] + (w[1] - w[0]) / 2;
        if mid < d.from {
            continue;
        }
        assert_eq!(d.mix_at("stage-1", mid, 5), mix_at(mid), "stage-1 at {mid}");
    }
    // Nothing solid past now: every node bar ends by the now line.
    let xn = d.x(now);
    for r in &d.rows {
        for rect in r.rects.iter().filter(|r| r.class == "nodes") {
            assert!(
                rect.x + rect.width <= xn + 0.5,
                "{} draws nodes past now: {rect:?}",
                r.cluster
            );
        }
    }
    // The wait for 1.13.2 is hatched, and the failure is marked on the
    // one node at 1.13.2 it names.
    let stage = d.row("stage-1");
    assert!(
        stage.rects.iter().any(|r| r.group == "pending"),
        "{stage:?}"
    );
    let alarms: Vec<_> = stage.rects.iter().filter(|r| r.group == "alarm").collect();
    assert_eq!(alarms.len(), 1, "{stage:?}");
    assert!((alarms[0].height - timeline_node_height(&d, 5)).abs() < 0.5);
    // The clusters that never reported say so.
    for cluster in ["test-1", "prod-eu-1", "prod-us-1"] {
        let row = d.row(cluster);
        assert!(row.texts.iter().any(|c| c == "no-report"), "{row:?}");
        assert!(!row.rects.iter().any(|r| r.class == "nodes"));
    }
}

/// The height one node's slice takes in a bar of `nodes` nodes.
fn timeline_node_height(d: &Drawing, nodes: u32) -> f64 {
    let bar: f64 = d
        .row("stage-1")
        .rects
        .iter()
        .filter(|r| r.class == "nodes")
        .map(|r| r.y + r.height)
        .fold(f64::MIN, f64::max)
        - d.row("stage-1")
            .rects
            .iter()
            .filter(|r| r.class == "nodes")
            .map(|r| r.y)
            .fold(f64::MAX, f64::min);
    bar / f64::from(nodes)
}
