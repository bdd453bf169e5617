//! `drover check` on the example repository and on malformed variants of
//! it: each variant must be rejected (exit 1) at the right file and line,
//! with a message that says what would be valid.

use std::path::{Path, PathBuf};

fn example_repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("example-repo")
}

/// The config files of the example repository, relative paths and text.
fn example_files() -> Vec<(String, String)> {
    let root = example_repo();
    let mut files = vec![(
        "drover.toml".to_owned(),
        std::fs::read_to_string(root.join("drover.toml")).expect("example drover.toml"),
    )];
    for env in ["test", "stage", "production"] {
        let rel = format!("environments/{env}.toml");
        let text = std::fs::read_to_string(root.join(&rel)).expect("example env file");
        files.push((rel, text));
    }
    files
}

/// One change to the example repository.
enum Edit {
    /// Replace the first occurrence of a text in a file (which must exist).
    Replace(&'static str, &'static str, &'static str),
    /// Delete a file.
    Remove(&'static str),
    /// Add a file with the given text.
    Add(&'static str, &'static str),
}

/// Where an error is expected: a file, and the first line of it containing
/// `needle` (after the edits), and a fragment of the message.
struct Expect {
    file: &'static str,
    needle: &'static str,
    fragment: &'static str,
}

struct Case {
    name: &'static str,
    edits: Vec<Edit>,
    expect: Vec<Expect>,
}

fn case(
    name: &'static str,
    edits: Vec<Edit>,
    file: &'static str,
    needle: &'static str,
    fragment: &'static str,
) -> Case {
    Case {
        name,
        edits,
        expect: vec![Expect {
            file,
            needle,
            fragment,
        }],
    }
}

const TEST: &str = "environments/test.toml";
const STAGE: &str = "environments/stage.toml";
const PROD: &str = "environments/production.toml";
const ROOT: &str = "drover.toml";
/// The example's production waves, which the wave cases replace with their own.
const EXAMPLE_WAVES: &str = "# Waves: the order production's clusters take a version; default: one wave of every cluster.\n\
[[wave]]                         # wave 1, gated by stage's confirmation ([promotion] soak)\n\
clusters = [\"prod-eu-1\"]         # names from [clusters] of drover.toml, or patterns such as \"prod-eu-*\"; required\n\
soak = \"24h\"                     # wave 2 starts once every cluster here confirmed this long ago; default \"24h\"\n\
# max_concurrency = 1            # clusters of the wave rolling at once, in drover.toml's order; default all\n\
# schedule, duration, timezone:  # a window of the wave's own; default the environment's [window] (here 02:00 on the 20th, Madrid)\n\
\n\
[[wave]]                         # wave 2, gated by wave 1's signed confirmations and its soak\n\
clusters = [\"prod-us-1\"]\n\
schedule = \"0 2 21 * *\"          # its own window: 02:00 on the 21st, the night after prod-eu-1's, in New York\n\
duration = \"6h\"                  # default: the environment's\n\
timezone = \"America/New_York\"    # default: the environment's\n\
\n\
";

use crate::support::cli::drover;
use Edit::{Add, Remove, Replace};

fn cases() -> Vec<Case> {
    vec![
        case("partial version", vec![Replace(TEST, "version = \"1.12.0\"", "version = \"1.13\"")], TEST, "version =",
            "version must be an exact version such as \"1.13.2\"; found \"1.13\""),
        case("range", vec![Replace(TEST, "version = \"1.12.0\"", "version = \"^1.12.0\"")], TEST, "version =",
            "a range is not allowed"),
        case("comparison range", vec![Replace(STAGE, "version = \"1.12.0\"", "version = \">=1.12.0\"")], STAGE, "version =",
            "a range is not allowed"),
        case("latest", vec![Replace(TEST, "version = \"1.12.0\"", "version = \"latest\"")], TEST, "version =",
            "\"latest\" is not allowed"),
        case("leading zero", vec![Replace(TEST, "version = \"1.12.0\"", "version = \"1.012.0\"")], TEST, "version =",
            "leading zero"),
        case("missing version", vec![Replace(PROD, "version = \"1.12.0\"", "")], PROD, "# environments",
            "missing required key `version`"),
        case("version of the wrong type", vec![Replace(TEST, "version = \"1.12.0\"", "version = 1.12")], TEST, "version =",
            "`version` must be an exact version string such as \"1.13.2\"; found a float"),
        case("unknown key with suggestion", vec![Replace(STAGE, "max_unavailable = 1", "max_unavailabel = 1")], STAGE, "max_unavailabel",
            "unknown key `max_unavailabel` in [rollout]; did you mean `max_unavailable`? valid keys: max_unavailable, drain_timeout"),
        case("key in the wrong section", vec![Replace(STAGE, "on_drain_timeout = \"skip\"", "soak = \"2h\"")], STAGE, "soak = \"2h\"",
            "`soak` belongs in [promotion]"),
        case("unknown section", vec![Replace(TEST, "[window]", "[windw]")], TEST, "[windw]",
            "did you mean `window`?"),
        case("wrong type", vec![Replace(STAGE, "max_unavailable = 1", "max_unavailable = true")], STAGE, "max_unavailable",
            "`max_unavailable` must be an integer or a percentage string such as \"10%\"; found a boolean"),
        case("section of the wrong type", vec![
                Replace(TEST, "allow_downgrade = false", "allow_downgrade = false\nnodes = 3"),
                Replace(TEST, "[nodes]", "[extra]"),
            ], TEST, "nodes = 3",
            "`nodes` must be a table, written [nodes]; found an integer"),
        case("bad duration", vec![Replace(STAGE, "drain_timeout = \"20m\"", "drain_timeout = \"twenty minutes\"")], STAGE, "drain_timeout",
            "`drain_timeout` must be a duration string such as \"20m\", \"6h\" or \"1h30m\"; found \"twenty minutes\""),
        case("duration of the wrong type", vec![Replace(STAGE, "soak = \"24h\"", "soak = 24")], STAGE, "soak =",
            "`soak` must be a duration string such as \"20m\""),
        case("zero window", vec![Replace(TEST, "duration = \"6h\"", "duration = \"0s\"")], TEST, "duration =",
            "`duration` must be longer than zero"),
        // Drain rules (docs/config.md, [[drain]]): `delete` only where the rule allows it.
        case("drain delete without allow", vec![Replace(STAGE, "[promotion]", "[[drain]]\nname = \"db\"\nladder = [\"evict 5m\", \"delete\"]\n\n[promotion]")], STAGE, "\"delete\"]",
            "`delete` deletes pods without asking their PodDisruptionBudgets: the rule must say allow_delete = true"),
        case("drain rung past drain_timeout", vec![Replace(STAGE, "[promotion]", "[[drain]]\nladder = [\"restart 30m\", \"skip\"]\n\n[promotion]")], STAGE, "restart 30m",
            "`skip` would start 30m after the cordon, not before drain_timeout (20m)"),
        // Waves (docs/config.md, [[wave]]): checked against drover.toml's clusters.
        case("wave naming no cluster", vec![Replace(PROD, EXAMPLE_WAVES, "[[wave]]\nclusters = [\"prod-eu-2\"]\n[[wave]]\nclusters = [\"prod-us-*\"]\n")], PROD, "prod-eu-2",
            "\"prod-eu-2\" matches no cluster of `production`; did you mean \"prod-eu-1\"? (its clusters under [clusters] in drover.toml: `prod-eu-1`, `prod-us-1`)"),
        case("cluster in two waves", vec![Replace(PROD, EXAMPLE_WAVES, "[[wave]]\nclusters = [\"prod-*\"]\n[[wave]]\nclusters = [\"prod-us-1\"]\n")], PROD, "\"prod-us-1\"",
            "cluster `prod-us-1` (matched by \"prod-us-1\") is already in wave 1; a cluster belongs to one wave"),
        case("cluster in no wave", vec![Replace(PROD, EXAMPLE_WAVES, "[[wave]]\nclusters = [\"prod-eu-1\"]\n")], PROD, "[[wave]]",
            "every cluster of `production` must be in a wave; in none: `prod-us-1`"),
        case("wave window in no time zone", vec![Replace(PROD, EXAMPLE_WAVES, "[[wave]]\nclusters = [\"prod-*\"]\nschedule = \"0 2 21 * *\"\ntimezone = \"America/NewYork\"\n")], PROD, "America/NewYork",
            "did you mean \"America/New_York\"?"),
        case("wave window without a schedule", vec![Replace(PROD, EXAMPLE_WAVES, "[[wave]]\nclusters = [\"prod-*\"]\nduration = \"4h\"\n")], PROD, "duration = \"4h\"",
            "`duration` of a [[wave]] belongs to its own window, which needs a `schedule` too"),
        case("wave of no cluster", vec![Replace(PROD, EXAMPLE_WAVES, "[[wave]]\nclusters = []\n")], PROD, "clusters = []",
            "`clusters` of a [[wave]] is empty"),
        case("zero max_concurrency", vec![Replace(PROD, EXAMPLE_WAVES, "[[wave]]\nclusters = [\"prod-*\"]\nmax_concurrency = 0\n")], PROD, "max_concurrency",
            "`max_concurrency` must be an integer of at least 1"),
        case("unknown wave key", vec![Replace(PROD, EXAMPLE_WAVES, "[[wave]]\nclusterz = [\"prod-*\"]\n")], PROD, "clusterz",
            "unknown key `clusterz` in [wave]; did you mean `clusters`?"),
        case("negative failure budget", vec![Replace(PROD, "failure_budget = 0 ", "failure_budget = -1 ")], PROD, "failure_budget",
            "`failure_budget` must be an integer of at least 0"),
        case("node timeout shorter than drain timeout", vec![Replace(PROD, "node_timeout = \"45m\"", "node_timeout = \"10m\"")], PROD, "node_timeout",
            "`node_timeout` (10m) is shorter than `drain_timeout` (20m)"),
        case("0% max_unavailable", vec![Replace(PROD, "max_unavailable = 1", "max_unavailable = \"0%\"")], PROD, "max_unavailable",
            "percentage string from \"1%\" to \"100%\""),
        case("150% max_unavailable", vec![Replace(PROD, "max_unavailable = 1", "max_unavailable = \"150%\"")], PROD, "max_unavailable",
            "found \"150%\""),
        case("max_unavailable = 0", vec![Replace(PROD, "max_unavailable = 1", "max_unavailable = 0")], PROD, "max_unavailable",
            "an integer of at least 1"),
        case("bad selector", vec![Replace(PROD, "node_selector = \"\"", "node_selector = \"pool in (a, b\"")], PROD, "node_selector",
            "comma-separated list of `key`, `!key`, `key=value`"),
        case("bad selector key", vec![Replace(PROD, "node_selector = \"\"", "node_selector = \"Node-Role.io/worker\"")], PROD, "node_selector",
            "prefix `Node-Role.io` is not a DNS subdomain"),
        case("bad on_drain_timeout", vec![Replace(PROD, "on_drain_timeout = \"skip\"", "on_drain_timeout = \"skp\"")], PROD, "on_drain_timeout",
            "`on_drain_timeout` must be \"skip\" or \"stop\"; found \"skp\"; did you mean \"skip\"?"),
        case("regex without group", vec![Replace(STAGE, r"version_regex = '(\d+\.\d+\.\d+)'", r"version_regex = '\d+\.\d+\.\d+'")], STAGE, "version_regex",
            "has no capture group; wrap the version part in parentheses"),
        case("bad regex", vec![Replace(STAGE, r"version_regex = '(\d+\.\d+\.\d+)'", r"version_regex = '(\d+'")], STAGE, "version_regex",
            "`version_regex` must be a valid regular expression with a capture group"),
        case("bad os_image_regex", vec![Replace(STAGE, "os_image_regex = '^Bottlerocket OS '", "os_image_regex = '^Bottlerocket (OS '")], STAGE, "os_image_regex",
            "`os_image_regex` must be a valid regular expression matched against a node's status.nodeInfo.osImage"),
        case("bottlerocket image by tag", vec![Replace(PROD, "# image = \"REPOSITORY@sha256:<digest>\"", "image = \"ghcr.io/drover-dev/bottlerocket-updater:v0.1.0\"")], PROD, "image =",
            "`image` of kind = \"bottlerocket\" must be pinned by digest"),
        case("bottlerocket image by the placeholder digest", vec![Replace(PROD, "# image = \"REPOSITORY@sha256:<digest>\"", "image = \"ghcr.io/drover-dev/bottlerocket-updater@sha256:0000000000000000000000000000000000000000000000000000000000000000\"")], PROD, "image =",
            "names the all-zero placeholder digest, no image"),
        case("unknown driver kind", vec![Replace(TEST, "kind = \"bottlerocket\"", "kind = \"ansible\"")], TEST, "kind =",
            "`kind` must be \"bottlerocket\" or \"job\"; found \"ansible\""),
        case("job driver without image", vec![
                Replace(TEST, "kind = \"bottlerocket\"", "kind = \"job\""),
                Replace(TEST, "command = []", "command = [\"/bin/update\"]"),
            ], TEST, "kind =", "kind = \"job\" requires `image`"),
        case("job driver with empty command", vec![
                Replace(TEST, "kind = \"bottlerocket\"", "kind = \"job\""),
            ], TEST, "command =", "`command` must be a non-empty array of strings"),
        case("command with the bottlerocket driver", vec![
                Replace(TEST, "command = []", "command = [\"/bin/update\"]"),
            ], TEST, "command =", "`command` applies only to kind = \"job\""),
        case("bad timezone with suggestion", vec![Replace(STAGE, "Europe/Madrid", "Europe/Madird")], STAGE, "timezone",
            "`timezone` must be an IANA time zone name such as \"Europe/Madrid\" or \"UTC\"; found \"Europe/Madird\"; did you mean \"Europe/Madrid\"?"),
        case("6-field cron", vec![Replace(STAGE, "schedule = \"0 2 8 * *\"", "schedule = \"0 0 2 8 * *\"")], STAGE, "schedule",
            "found 6 fields in \"0 0 2 8 * *\": a seconds (or year) field is not supported"),
        case("bad cron", vec![Replace(STAGE, "schedule = \"0 2 8 * *\"", "schedule = \"0 25 8 * *\"")], STAGE, "schedule",
            "`schedule` must be a cron line of exactly 5 fields (minute hour day-of-month month day-of-week), such as \"0 2 8 * *\""),
        case("cron that never fires", vec![Replace(STAGE, "schedule = \"0 2 8 * *\"", "schedule = \"0 2 30 2 *\"")], STAGE, "schedule",
            "never fires"),
        case("freeze that ends before it starts", vec![Replace(STAGE, "[rollout]                        # how nodes",
                "[[freeze]]\nstart = 2026-12-18T00:00:00\nend = 2026-12-01T00:00:00\n\n[rollout]                        # how nodes")],
            STAGE, "end =", "`end` (Tue 2026-12-01 00:00 CET (2026-11-30T23:00:00Z)) must be after `start`"),
        case("freeze with an unknown scope", vec![Replace(STAGE, "[rollout]                        # how nodes",
                "[[freeze]]\nstart = 2026-12-18\nend = 2027-01-04\nscope = \"patch\"\n\n[rollout]                        # how nodes")],
            STAGE, "scope =", "`scope` must be \"all\" or \"minor\"; found \"patch\""),
        case("duplicate chain entry", vec![Replace(ROOT, "chain = [\"test\", \"stage\", \"production\"]", "chain = [\"test\", \"stage\", \"stage\", \"production\"]")], ROOT, "chain =",
            "environment `stage` appears twice in the chain"),
        case("empty chain", vec![Replace(ROOT, "chain = [\"test\", \"stage\", \"production\"]", "chain = []")], ROOT, "chain =",
            "`chain` must list at least one environment"),
        case("invalid environment name", vec![Replace(ROOT, "\"production\"]", "\"Production\"]")], ROOT, "chain =",
            "environment name \"Production\" is not valid"),
        case("env in chain without file", vec![Remove(STAGE)], ROOT, "chain =",
            "environment `stage` has no file `environments/stage.toml`"),
        case("stray env file", vec![Add("environments/qa.toml", "version = \"1.12.0\"\n")], "environments/qa.toml", "version",
            "environment `qa` is not in [promotion] chain of drover.toml"),
        case("cluster in two envs", vec![Replace(ROOT, "stage = [\"stage-1\"]", "stage = [\"stage-1\", \"test-1\"]")], ROOT, "stage = [",
            "cluster `test-1` is already listed for `test`; a cluster belongs to one environment"),
        case("clusters of an env not in the chain", vec![Replace(ROOT, "production = [", "prod = [")], ROOT, "prod = [",
            "[clusters] lists `prod`, which is not in the chain; did you mean `production`?"),
        case("status evidence with an env lacking clusters", vec![Replace(ROOT, "stage = [\"stage-1\"]", "")], ROOT, "chain =",
            "environment `stage` lists no clusters, but with evidence = \"status\""),
        case("bad evidence value", vec![Replace(ROOT, "evidence = \"status\"", "evidence = \"logs\"")], ROOT, "evidence",
            "`evidence` must be \"status\" or \"history\"; found \"logs\""),
        case("bad status branch", vec![Replace(ROOT, "status_branch = \"drover/status\"", "status_branch = \"drover..status\"")], ROOT, "status_branch",
            "`status_branch` must be a valid git branch name"),
        case("TOML syntax error", vec![Replace(TEST, "version = \"1.12.0\"", "version = \"1.12.0")], TEST, "version =",
            "invalid TOML"),
        case("TOML syntax error in drover.toml", vec![Replace(ROOT, "[clusters]", "[clusters")], ROOT, "[clusters",
            "invalid TOML"),
        case("duplicate key", vec![Replace(STAGE, "duration = \"6h\"", "duration = \"6h\"\nduration = \"5h\"")], STAGE, "duration = \"5h\"",
            "duplicate key `duration`: each key may appear once per table"),
        Case {
            name: "multiple errors in one run",
            edits: vec![
                Replace(TEST, "version = \"1.12.0\"", "version = \"1.13\""),
                Replace(TEST, "timezone = \"Europe/Madrid\"", "timezone = \"Mars/Olympus\""),
                Replace(STAGE, "max_unavailable = 1", "max_unavailabel = 1"),
                Replace(PROD, "version = \"1.12.0\"", "version = \"1.12.0"),
                Replace(ROOT, "evidence = \"status\"", "evidence = \"logs\""),
            ],
            expect: vec![
                Expect { file: TEST, needle: "version =", fragment: "found \"1.13\"" },
                Expect { file: TEST, needle: "timezone =", fragment: "found \"Mars/Olympus\"" },
                Expect { file: STAGE, needle: "max_unavailabel", fragment: "did you mean `max_unavailable`?" },
                Expect { file: PROD, needle: "version =", fragment: "invalid TOML" },
                Expect { file: ROOT, needle: "evidence =", fragment: "found \"logs\"" },
            ],
        },
    ]
}

/// Write the example repository with `edits` applied into `dir`; returns
/// the final text of every file.
fn build(dir: &Path, edits: &[Edit]) -> Vec<(String, String)> {
    let mut files = example_files();
    for edit in edits {
        match edit {
            Replace(file, from, to) => {
                let entry = files
                    .iter_mut()
                    .find(|(f, _)| f == file)
                    .unwrap_or_else(|| panic!("no file {file}"));
                assert!(entry.1.contains(from), "{file} lacks {from:?}");
                entry.1 = entry.1.replacen(from, to, 1);
            }
            Remove(file) => files.retain(|(f, _)| f != file),
            Add(file, text) => files.push(((*file).to_owned(), (*text).to_owned())),
        }
    }
    std::fs::create_dir_all(dir.join("environments")).expect("mkdir");
    for (rel, text) in &files {
        std::fs::write(dir.join(rel), text).expect("write");
    }
    files
}

#[test]
fn the_example_repo_passes() {
    let repo = example_repo();
    let (code, stdout, stderr) = drover(&["check", "--repo", repo.to_str().expect("utf-8 path")]);
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(
        stdout.trim(),
        "ok: 3 environments (test 1.12.0, stage 1.12.0, production 1.12.0)"
    );
}

#[test]
fn every_malformed_repo_is_rejected_at_the_fault() {
    let cases = cases();
    assert!(cases.len() >= 25);
    let mut failures = Vec::new();
    for c in &cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = build(dir.path(), &c.edits);
        let (code, stdout, stderr) = drover(&[
            "check",
            "--format",
            "json",
            "--repo",
            dir.path().to_str().expect("utf-8 path"),
        ]);
        if code != 1 {
            failures.push(format!("{}: exit {code}\n{stdout}{stderr}", c.name));
            continue;
        }
        let report: serde_json::Value = serde_json::from_str(&stdout).expect("json output");
        let errors = report["errors"].as_array().cloned().unwrap_or_default();
        for e in &c.expect {
            let text = &files
                .iter()
                .find(|(f, _)| f == e.file)
                .unwrap_or_else(|| panic!("{}: no file {}", c.name, e.file))
                .1;
            let line = text
                .lines()
                .position(|l| l.contains(e.needle))
                .unwrap_or_else(|| panic!("{}: {} lacks {:?}", c.name, e.file, e.needle))
                + 1;
            let found = errors.iter().any(|d| {
                d["file"] == e.file
                    && d["line"] == line
                    && d["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(e.fragment))
            });
            if !found {
                failures.push(format!(
                    "{}: expected {}:{line} containing {:?}; got {}",
                    c.name,
                    e.file,
                    e.fragment,
                    serde_json::to_string_pretty(&errors).unwrap_or_default()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn text_output_names_file_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    build(
        dir.path(),
        &[Replace(STAGE, "max_unavailable = 1", "max_unavailabel = 1")],
    );
    let (code, stdout, stderr) = drover(&["check", "--repo", dir.path().to_str().expect("path")]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let line = stdout.lines().next().unwrap_or_default();
    assert!(
        line.starts_with("environments/stage.toml:13:1: error: unknown key `max_unavailabel`"),
        "{line}"
    );
    assert!(stderr.contains("1 error"), "{stderr}");
}

#[test]
fn an_unreadable_repo_is_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nowhere");
    let (code, stdout, stderr) = drover(&["check", "--repo", missing.to_str().expect("path")]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("cannot read the config repository"),
        "{stderr}"
    );
}

#[test]
fn an_empty_directory_is_rejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, stdout, _) = drover(&[
        "check",
        "--format",
        "json",
        "--repo",
        dir.path().to_str().expect("path"),
    ]);
    assert_eq!(code, 1);
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(report["ok"], false);
    assert_eq!(report["errors"][0]["file"], "drover.toml");
    assert!(report["errors"][0]["message"]
        .as_str()
        .is_some_and(|m| m.contains("missing file `drover.toml`")));
}
