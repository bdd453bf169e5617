//! What a release and CI run on GitHub, checked here: the workflows and the
//! action pass actionlint (with shellcheck over their `run:` scripts), the
//! scripts they call pass shellcheck, the Dockerfiles pass hadolint, and
//! every artefact the docs, the example workflow, the manifests and the
//! default config name is one .github/workflows/release.yml produces, at
//! this version.
//!
//! actionlint and hadolint come from tests/tools/build (built once into
//! ~/.cache/drover/tools, as scripts/test does); shellcheck is Debian's.

use regex::Regex;
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tools() -> &'static Path {
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

fn run_clean(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} found problems:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn workflows() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [".github/workflows", "example-repo/.github/workflows"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yml" || x == "yaml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn yaml(path: &Path) -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn actionlint_accepts_every_workflow_and_the_action() {
    let files = workflows();
    assert!(files.len() >= 2, "{files:?}");
    // The action's metadata through a workflow that uses it as `./`, with
    // the inputs the example workflow gives it: actionlint reads action.yml
    // and checks both.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(root().join("action.yml"), dir.path().join("action.yml")).unwrap();
    std::fs::create_dir_all(dir.path().join(".github/workflows")).unwrap();
    let uses = |with: &str| {
        format!("on: pull_request\njobs:\n  check:\n    runs-on: ubuntu-24.04\n    steps:\n      - uses: ./\n        with:\n{with}")
    };
    let workflow = dir.path().join(".github/workflows/uses-action.yml");
    assert!(Command::new("git")
        .args(["init", "-q"])
        .current_dir(dir.path())
        .status()
        .unwrap()
        .success());
    // The control: an input action.yml does not have is refused.
    std::fs::write(&workflow, uses("          bsae: main\n")).unwrap();
    let out = Command::new(tools().join("actionlint"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stdout).contains("bsae"),
        "actionlint did not read action.yml: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    std::fs::write(
        &workflow,
        uses("          base: main\n          path: .\n          status-branch: drover/status\n"),
    )
    .unwrap();
    let mut cmd = Command::new(tools().join("actionlint"));
    cmd.arg("-shellcheck")
        .arg(which("shellcheck"))
        .args(&files)
        .current_dir(root());
    run_clean(&mut cmd, "actionlint");
    let mut cmd = Command::new(tools().join("actionlint"));
    cmd.arg("-shellcheck")
        .arg(which("shellcheck"))
        .current_dir(dir.path());
    run_clean(&mut cmd, "actionlint (action.yml)");
}

fn which(bin: &str) -> String {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(bin);
        if p.is_file() {
            return p.to_string_lossy().into_owned();
        }
    }
    panic!("{bin} not found on PATH (scripts/test installs it)");
}

#[test]
fn shellcheck_accepts_the_scripts_the_workflows_run() {
    let mut files = vec![root().join("action/check")];
    for e in std::fs::read_dir(root().join(".github/release")).unwrap() {
        files.push(e.unwrap().path());
    }
    for f in [
        "tests/tools/build",
        "tests/release/build",
        "deploy/updater/build",
        "deploy/updater/fetch",
        "deploy/updater/pin",
        "deploy/updater/bottlerocket-update.sh",
    ] {
        files.push(root().join(f));
    }
    run_clean(Command::new(which("shellcheck")).args(&files), "shellcheck");
}

#[test]
fn hadolint_accepts_the_dockerfiles() {
    run_clean(
        Command::new(tools().join("hadolint"))
            .args(["deploy/Dockerfile"])
            .current_dir(root()),
        "hadolint",
    );
}

/// Third-party images named by tag only, each with why: no digest of the
/// tag's multi-platform index could be confirmed from a trusted record.
/// Anything else that names a tag without a digest fails the test below.
const TAG_ONLY: &[(&str, &str)] = &[
    (
        "gcr.io/distroless/cc-debian12:nonroot",
        "no confirmed digest of its multi-platform index",
    ),
    (
        "docker/dockerfile:1",
        "the BuildKit frontend of `# syntax=`: no confirmed digest",
    ),
];

/// Our own images: the release pushes them by digest and pins the updater
/// (deploy/updater/pin); the Deployment's tag is pinned by the overlay
/// (docs/install.md).
const OURS: &str = "ghcr.io/drover-dev/";

/// Why `reference` is not acceptable as a third-party image, if it is not:
/// it must carry `@sha256:` and 64 hex digits (a build stage, `scratch` and
/// our own images aside).
fn unpinned(reference: &str, stages: &[String]) -> Option<String> {
    let digest = Regex::new(r"@sha256:[0-9a-f]{64}$").unwrap();
    if reference == "scratch"
        || stages.iter().any(|s| s == reference)
        || reference.starts_with(OURS)
        || digest.is_match(reference)
        || TAG_ONLY.iter().any(|(r, _)| *r == reference)
    {
        return None;
    }
    Some(format!(
        "{reference} is named by tag only; pin it by digest (REPOSITORY:TAG@sha256:<64 hex>)"
    ))
}

/// Every image a Dockerfile names: `# syntax=` and each `FROM` (an
/// `${ARG}` replaced by its default), with its line number; and the stages
/// it defines.
fn dockerfile_images(text: &str) -> (Vec<(usize, String)>, Vec<String>) {
    let mut args = std::collections::BTreeMap::new();
    let mut images = Vec::new();
    let mut stages = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(s) = line.strip_prefix("# syntax=") {
            images.push((i + 1, s.trim().to_string()));
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().map(|w| w.to_ascii_uppercase()).as_deref() {
            Some("ARG") if words.len() > 1 => {
                if let Some((k, v)) = words[1].split_once('=') {
                    args.insert(k.to_string(), v.to_string());
                }
            }
            Some("FROM") => {
                let mut image = words
                    .iter()
                    .skip(1)
                    .find(|w| !w.starts_with("--"))
                    .unwrap_or(&"")
                    .to_string();
                for (k, v) in &args {
                    image = image.replace(&format!("${{{k}}}"), v);
                    image = image.replace(&format!("${k}"), v);
                }
                images.push((i + 1, image));
                if let Some(p) = words.iter().position(|w| w.eq_ignore_ascii_case("AS")) {
                    if let Some(name) = words.get(p + 1) {
                        stages.push(name.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    (images, stages)
}

/// Every `image:` value of a YAML document, and the `image=` lines of the
/// kustomize env files.
fn manifest_images(path: &Path, text: &str, out: &mut Vec<(usize, String)>) {
    for (i, line) in text.lines().enumerate() {
        let l = line.trim().trim_start_matches("- ");
        let value = if path.extension().is_some_and(|e| e == "env") {
            l.strip_prefix("image=")
        } else {
            l.strip_prefix("image:")
                .or_else(|| l.strip_prefix("newName:"))
        };
        if let Some(v) = value {
            let v = v.trim().trim_matches('"').trim_matches('\'');
            if !v.is_empty() {
                out.push((i + 1, v.to_string()));
            }
        }
    }
}

#[test]
fn third_party_images_are_pinned_by_digest() {
    // The check itself: a tag-only reference is refused, a digest (with
    // or without its tag), a stage, scratch and our own images pass.
    let (images, stages) = dockerfile_images(
        "# syntax=docker/dockerfile:1.9\nARG BASE=alpine:3.20\nFROM ${BASE} AS root\n\
         FROM --platform=$BUILDPLATFORM rust:1.95-bookworm@sha256:adad87df11151c18ba1689c3e1ea8d4810540a29c0adf4a3d69aec35d8ed8968 AS build\n\
         FROM root\nFROM scratch\nFROM debian@sha256:0123\n",
    );
    let refused: Vec<usize> = images
        .iter()
        .filter(|(_, r)| unpinned(r, &stages).is_some())
        .map(|(line, _)| *line)
        .collect();
    assert_eq!(refused, [1, 3, 7], "{images:?}");
    assert!(unpinned("ghcr.io/drover-dev/drover:v0.1.0", &[]).is_none());

    let mut problems = Vec::new();
    let mut seen = 0;
    let mut files = Vec::new();
    collect(&root().join("deploy"), &mut files);
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let rel = path.strip_prefix(root()).unwrap().display().to_string();
        let (images, stages) = if name == "Dockerfile" {
            dockerfile_images(&text)
        } else if name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".env") {
            let mut out = Vec::new();
            manifest_images(&path, &text, &mut out);
            (out, Vec::new())
        } else {
            continue;
        };
        for (line, reference) in images {
            seen += 1;
            if let Some(why) = unpinned(&reference, &stages) {
                problems.push(format!("{rel}:{line}: {why}"));
            }
        }
    }
    // The agent's Dockerfile's bases and syntax line and the Deployment's
    // image were read (the updater image has no Dockerfile: its inputs are
    // pinned by SHA-256 in deploy/updater/packages.lock, and updater.env
    // names no image until a release pins the one it built).
    assert!(
        seen >= 4,
        "only {seen} image references found under deploy/"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The example workflow gives the action only inputs it has, names the
/// action at this release, and pins every other action by commit.
#[test]
fn the_example_workflow_uses_the_action_as_it_is() {
    let action = yaml(&root().join("action.yml"));
    let inputs: BTreeSet<&str> = action["inputs"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    let mut used = false;
    let sha = Regex::new(r"^[a-z0-9-]+/[a-z0-9-]+@[0-9a-f]{40}$").unwrap();
    for wf in workflows() {
        let w = yaml(&wf);
        for (_, job) in w["jobs"].as_mapping().unwrap() {
            for step in job["steps"].as_sequence().into_iter().flatten() {
                let Some(uses) = step["uses"].as_str() else {
                    continue;
                };
                if let Some(reference) = uses.strip_prefix("drover-dev/drover@") {
                    // Pinned by commit like every other action, the version in the comment.
                    assert!(
                        sha.is_match(uses),
                        "{}: {uses} is not pinned by commit",
                        wf.display()
                    );
                    let text = std::fs::read_to_string(&wf).unwrap();
                    assert!(
                        text.contains(&format!("{uses} # v{VERSION}")),
                        "{}: {uses} does not say `# v{VERSION}`",
                        wf.display()
                    );
                    action_at_commit(reference);
                    for k in step["with"]
                        .as_mapping()
                        .into_iter()
                        .flatten()
                        .map(|(k, _)| k)
                    {
                        assert!(
                            inputs.contains(k.as_str().unwrap()),
                            "{k:?} is no input of action.yml"
                        );
                    }
                    used = true;
                } else {
                    assert!(
                        sha.is_match(uses),
                        "{}: {uses} is not pinned by commit",
                        wf.display()
                    );
                }
            }
        }
    }
    assert!(used, "the example workflow does not use the action");
    // On a schedule too, so a soak refusal is judged again without a push.
    let example = yaml(&root().join("example-repo/.github/workflows/drover-check.yml"));
    assert!(example["on"]["schedule"].is_sequence(), "no schedule");
    assert!(
        example["on"]["pull_request"].is_mapping(),
        "no pull_request"
    );
}

/// The commit the example workflow pins the action to, when this checkout's
/// history holds it (a shallow clone may not): a commit of this repository
/// with the action, at this version.
fn action_at_commit(commit: &str) {
    let show = |path: &str| {
        Command::new("git")
            .current_dir(root())
            .args(["show", &format!("{commit}:{path}")])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let known = Command::new("git")
        .current_dir(root())
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .status()
        .is_ok_and(|s| s.success());
    if !known {
        eprintln!("note: {commit} is not in this checkout's history; its content is not checked");
        return;
    }
    assert!(show("action.yml").is_some(), "{commit} has no action.yml");
    let cargo = show("Cargo.toml").unwrap_or_default();
    assert!(
        cargo.contains(&format!("\nversion = \"{VERSION}\"")),
        "{commit} is not drover {VERSION}"
    );
}

/// What release.yml publishes: (images, release assets).
fn published() -> (BTreeSet<String>, BTreeSet<String>) {
    let w = yaml(&root().join(".github/workflows/release.yml"));
    let images: BTreeSet<String> = ["UPDATER_IMAGE", "AGENT_IMAGE"]
        .iter()
        .map(|k| w["env"][k].as_str().unwrap().to_owned())
        .collect();
    let binaries = &w["jobs"]["binaries"];
    let mut assets = BTreeSet::from([
        "SHA256SUMS".to_owned(),
        "SHA256SUMS.sigstore.json".to_owned(),
    ]);
    for m in binaries["strategy"]["matrix"]["include"]
        .as_sequence()
        .unwrap()
    {
        let t = m["target"].as_str().unwrap();
        assets.insert(format!("drover-{t}"));
        assets.insert(format!("drover-{t}.cdx.json"));
    }
    (images, assets)
}

/// The names of a job's steps, in order (`uses:` for the unnamed ones).
fn step_names(w: &Value, job: &str) -> Vec<String> {
    w["jobs"][job]["steps"]
        .as_sequence()
        .unwrap_or_else(|| panic!("job {job}"))
        .iter()
        .map(|s| {
            s["name"]
                .as_str()
                .or(s["uses"].as_str())
                .or(s["run"].as_str())
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

fn position(steps: &[String], what: &str) -> usize {
    steps
        .iter()
        .position(|s| s.contains(what))
        .unwrap_or_else(|| panic!("no step {what:?} in {steps:#?}"))
}

#[test]
fn release_computes_the_updater_digest_first_and_tags_last() {
    let w = yaml(&root().join(".github/workflows/release.yml"));
    let text = std::fs::read_to_string(root().join(".github/workflows/release.yml")).unwrap();
    let (_, assets) = published();
    for a in [
        "drover-x86_64-unknown-linux-musl",
        "drover-aarch64-unknown-linux-musl",
    ] {
        assert!(assets.contains(a), "{assets:?}");
    }
    // Started by hand, never by a tag: the tag is the release's last write.
    let on = w["on"].as_mapping().unwrap();
    assert_eq!(on.len(), 1, "{on:?}");
    assert!(on.contains_key("workflow_dispatch"), "{on:?}");
    // The agent for both platforms; the updater image (both platforms in one
    // layout) computed by prepare, before anything is pushed.
    let platforms: BTreeSet<&str> = w["jobs"]["agent"]["strategy"]["matrix"]["include"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| m["platform"].as_str().unwrap())
        .collect();
    assert_eq!(platforms, BTreeSet::from(["linux/amd64", "linux/arm64"]));
    let prepare = serde_yaml::to_string(&w["jobs"]["prepare"]["steps"]).unwrap();
    assert!(prepare.contains(".github/release/prepare"), "{prepare}");
    let build = std::fs::read_to_string(root().join(".github/release/prepare")).unwrap();
    assert!(build.contains("deploy/updater/build") && build.contains("deploy/updater/pin"));
    for job in ["updater", "agent", "agent-index", "binaries", "publish"] {
        let needs = serde_yaml::to_string(&w["jobs"][job]["needs"]).unwrap();
        assert!(
            needs.contains("prepare") || needs.contains("agent"),
            "{job} runs before prepare: {needs}"
        );
    }
    // Pushed by digest only: the layout as built (the digest read back), the
    // agent by digest under a staging tag.
    let updater = serde_yaml::to_string(&w["jobs"]["updater"]["steps"]).unwrap();
    assert!(
        updater.contains("push release/updater \"$UPDATER\""),
        "{updater}"
    );
    let agent = serde_yaml::to_string(&w["jobs"]["agent"]["steps"]).unwrap();
    assert!(agent.contains("push-by-digest=true"), "{agent}");
    assert!(agent.contains("sbom: true"), "{agent}");
    // The digest prepare computed is built into the binaries and the agent.
    for (job, key) in [
        (
            "binaries",
            "DROVER_UPDATER_IMAGE: ${{ needs.prepare.outputs.updater }}",
        ),
        (
            "agent",
            "DROVER_UPDATER_IMAGE=${{ needs.prepare.outputs.updater }}",
        ),
    ] {
        let steps = serde_yaml::to_string(&w["jobs"][job]["steps"]).unwrap();
        assert!(
            steps.contains(key),
            "{job} does not build the digest in: {steps}"
        );
    }
    let dockerfile = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    assert!(dockerfile.contains("ARG DROVER_UPDATER_IMAGE"));
    // publish: every check, then the signatures, then the tags, the git tag
    // after the images', the GitHub release last.
    let steps = step_names(&w, "publish");
    let check = position(&steps, "Check what was pushed and built");
    let sign = position(&steps, "Sign the images");
    let tag_images = position(&steps, "Tag the images");
    let tag = position(&steps, "Push the tag");
    let release = position(&steps, "Publish");
    assert!(
        check < sign && sign < tag_images && tag_images < tag && tag < release,
        "{steps:#?}"
    );
    let publish = serde_yaml::to_string(&w["jobs"]["publish"]["steps"]).unwrap();
    assert!(
        publish.contains("cosign sign --yes \"$UPDATER\""),
        "{publish}"
    );
    assert_eq!(
        text.matches("attest-build-provenance").count(),
        3,
        "binaries, updater, agent"
    );
    // Nothing else writes a tag: no tag pushed by docker, no `git push` elsewhere.
    for job in ["prepare", "updater", "agent", "agent-index", "binaries"] {
        let steps = serde_yaml::to_string(&w["jobs"][job]).unwrap();
        assert!(
            !steps.contains("git push") && !steps.contains("crane tag"),
            "{job}"
        );
    }
    // `drover --version` says which updater image this build defaults to
    // (the tests' build: their stand-in digest).
    let out = Command::new(env!("CARGO_BIN_EXE_drover"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    let default = drover::config::DEFAULT_BOTTLEROCKET_IMAGE.expect("a test-hooks build has one");
    assert!(
        version.contains(&format!("updater image: {default}")),
        "{version}"
    );
    assert!(
        default.starts_with(&format!(
            "{}@sha256:",
            w["env"]["UPDATER_IMAGE"].as_str().unwrap()
        )),
        "{default}"
    );
}

/// Every image and release asset named in the docs, the manifests, the
/// example repository and the action is one the release workflow
/// publishes, at this version.
#[test]
fn everything_the_docs_reference_is_what_the_release_produces() {
    let (images, assets) = published();
    let image_re = Regex::new(r"ghcr\.io/drover-dev/[a-z0-9-]+(?::[A-Za-z0-9._<>-]+)?").unwrap();
    let asset_re =
        Regex::new(r"github\.com/drover-dev/drover/releases/download/([^/\s]+)/([A-Za-z0-9._$-]+)")
            .unwrap();
    let mut files = vec![
        root().join("README.md"),
        root().join("action.yml"),
        root().join("action/check"),
    ];
    for dir in ["docs", "deploy", "example-repo"] {
        collect(&root().join(dir), &mut files);
    }
    let mut seen = 0;
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let name = f.strip_prefix(root()).unwrap().display().to_string();
        for m in image_re.find_iter(&text) {
            let (image, tag) = m.as_str().split_once(':').unwrap_or((m.as_str(), ""));
            assert!(
                images.contains(image),
                "{name} names {image}, which no release publishes"
            );
            if !tag.is_empty() {
                assert!(
                    tag == format!("v{VERSION}") || tag.starts_with("v<") || tag == "v",
                    "{name} names {image}:{tag}, not this release's v{VERSION}"
                );
            }
            seen += 1;
        }
        for c in asset_re.captures_iter(&text) {
            assert_eq!(&c[1], format!("v{VERSION}"), "{name}");
            assert!(
                assets.contains(&c[2]),
                "{name} downloads {}, which no release publishes",
                &c[2]
            );
            seen += 1;
        }
    }
    assert!(seen >= 5, "found only {seen} references");
    // action/check builds its download URL from pieces: the asset names it
    // can form are published ones.
    let script = std::fs::read_to_string(root().join("action/check")).unwrap();
    assert!(script.contains(r#"asset="drover-$arch-unknown-linux-musl""#));
    for arch in ["x86_64", "aarch64"] {
        assert!(script.contains(&format!(") arch={arch} ;;")), "{arch}");
        assert!(assets.contains(&format!("drover-{arch}-unknown-linux-musl")));
    }
    assert!(script.contains("SHA256SUMS") && assets.contains("SHA256SUMS"));
    assert!(script.contains(".github/workflows/release.yml"));
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            collect(&p, out);
        } else {
            out.push(p);
        }
    }
}
