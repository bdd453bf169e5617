//! The release's steps on this machine: `.github/release/dry-run` in a clone
//! of this repository's HEAD (so the tags it reads and writes are the
//! test's own), everything but the pushes to ghcr.io and GitHub (a
//! registry on loopback instead). It builds the updater image twice, from
//! two clean clones, and the two digests, and layouts, must be identical;
//! the release commit pins exactly that digest; a rerun after the tag was
//! pushed makes the same commit; a tag naming anything else stops the
//! release before it builds. Then the image itself: the driver script
//! byte for byte, the tools it runs, nothing else, no time but the lock's.
//!
//! Its inputs come from `tests/release/build` (crane, and the Debian
//! packages `deploy/updater/fetch` downloads once into
//! ~/.cache/drover/updater-debs), which scripts/test runs; the test itself
//! reaches nothing but loopback.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// crane's directory (tests/release/build, which also fills the deb cache).
fn release_tools() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(root().join("tests/release/build"))
            .output()
            .expect("running tests/release/build");
        assert!(
            out.status.success(),
            "tests/release/build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A clean clone of this repository's HEAD at `dir`.
fn clone_head(dir: &Path) {
    let head = git(root(), &["rev-parse", "HEAD"]);
    let out = Command::new("git")
        .args(["clone", "-q", "--no-local"])
        .arg(root())
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    git(dir, &["checkout", "-q", "--detach", &head]);
    // Tags come from the clone's origin: this test's own, none yet.
    for tag in git(dir, &["tag"]).lines() {
        git(dir, &["tag", "-d", tag]);
    }
}

fn release_env(path: &Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every file under `dir`, relative, with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_release_dry_run_converges_from_a_clean_clone() {
    let tools = release_tools();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    clone_head(&repo);
    let out = tmp.path().join("out");
    let started = Instant::now();
    let run = Command::new(repo.join(".github/release/dry-run"))
        .arg(&out)
        .env("RELEASE_BIN_DIR", tools)
        .output()
        .unwrap();
    let took = started.elapsed();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{log}");
    eprintln!("the release's dry run (two updater builds, a push and read-back): {took:?}");

    // Two clean clones, one image: the same digest and the same bytes.
    let a = release_env(&out.join("a-release/release.env"));
    let b = release_env(&out.join("b-release/release.env"));
    let updater = &a["updater"];
    assert!(
        updater.starts_with("ghcr.io/drover-dev/bottlerocket-updater@sha256:"),
        "{updater}"
    );
    assert_eq!(a["updater"], b["updater"]);
    assert_eq!(
        a["release_commit"], b["release_commit"],
        "a rerun makes the same commit"
    );
    assert_eq!(b["tag_exists"], "true", "{log}");
    let (la, lb) = (
        files(&out.join("a-release/updater")),
        files(&out.join("b-release/updater")),
    );
    assert_eq!(
        la.len(),
        9,
        "oci-layout, index.json, the index, 2 x (manifest, config, layer)"
    );
    assert!(la == lb, "the two layouts differ");
    assert!(log.contains("pushed and read back 127.0.0.1:"), "{log}");

    // The release commit pins exactly that image, and changes nothing else.
    let clone = out.join("a");
    let changed = git(
        &clone,
        &[
            "diff",
            "--name-only",
            &a["source_commit"],
            &a["release_commit"],
        ],
    );
    assert_eq!(
        changed,
        "deploy/components/bottlerocket-host-access/updater.env"
    );
    let env = git(
        &clone,
        &[
            "show",
            &format!(
                "{}:deploy/components/bottlerocket-host-access/updater.env",
                a["release_commit"]
            ),
        ],
    );
    assert!(
        env.lines().any(|l| l == format!("image={updater}")),
        "{env}"
    );
    assert_eq!(a["tag"], format!("v{}", env!("CARGO_PKG_VERSION")));

    the_image_holds_the_driver_its_tools_and_nothing_else(&out.join("a-release/updater"));

    // A tag naming anything else stops the release before it builds.
    git(&repo, &["tag", &a["tag"], &a["source_commit"]]);
    let moved = tmp.path().join("moved");
    let o = Command::new("git")
        .args(["clone", "-q", "--no-local"])
        .arg(&repo)
        .arg(&moved)
        .output()
        .unwrap();
    assert!(o.status.success());
    git(&moved, &["checkout", "-q", "--detach", &a["source_commit"]]);
    let started = Instant::now();
    let refused = Command::new(moved.join(".github/release/prepare"))
        .arg(tmp.path().join("moved-out"))
        .env("RELEASE_BIN_DIR", tools)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(err.contains("a release never moves a tag"), "{err}");
    assert!(
        !tmp.path().join("moved-out/updater").exists(),
        "nothing built"
    );
    eprintln!("a moved tag refused in {:?}", started.elapsed());
}

/// The layout's image: both platforms, one layer each, the driver script
/// byte for byte at the Job's command (0555), bash, jq and coreutils with
/// every library they load, no apiclient, no documentation, every file at
/// the lock's time, owned by root; on x86_64 the tools run from the layer.
fn the_image_holds_the_driver_its_tools_and_nothing_else(layout: &Path) {
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let json = |digest: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(blob(digest)).unwrap()).unwrap()
    };
    let top: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let index = json(top["manifests"][0]["digest"].as_str().unwrap());
    let platforms: Vec<String> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let p = &m["platform"];
            format!(
                "{}/{}",
                p["os"].as_str().unwrap(),
                p["architecture"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        platforms,
        ["linux/amd64", "linux/arm64"],
        "no attestation manifests"
    );
    let lock = std::fs::read_to_string(root().join("deploy/updater/packages.lock")).unwrap();
    let epoch: i64 = lock
        .lines()
        .find_map(|l| l.strip_prefix("epoch "))
        .unwrap()
        .parse()
        .unwrap();
    let script = std::fs::read(root().join("deploy/updater/bottlerocket-update.sh")).unwrap();
    let command = drover::kubernetes::driver::BOTTLEROCKET_COMMAND;
    for m in index["manifests"].as_array().unwrap() {
        let manifest = json(m["digest"].as_str().unwrap());
        let config = json(manifest["config"]["digest"].as_str().unwrap());
        assert_eq!(config["config"]["Entrypoint"], serde_json::json!([command]));
        let created =
            chrono::DateTime::parse_from_rfc3339(config["created"].as_str().unwrap()).unwrap();
        assert_eq!(created.timestamp(), epoch);
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1);
        let layer = blob(layers[0]["digest"].as_str().unwrap());
        let listing = Command::new("tar")
            .args([
                "--list",
                "--verbose",
                "--numeric-owner",
                "--full-time",
                "-z",
                "-f",
            ])
            .arg(&layer)
            .output()
            .unwrap();
        let listing = String::from_utf8(listing.stdout).unwrap();
        let stamp = chrono::DateTime::from_timestamp(epoch, 0)
            .unwrap()
            .format("%Y-%m-%d %H:%M:%S")
            .to_string();
        for line in listing.lines() {
            assert!(line.contains(" 0/0 ") && line.contains(&stamp), "{line}");
            assert!(
                !line.contains("apiclient") && !line.contains("usr/share/doc/"),
                "{line}"
            );
        }
        let entry = listing
            .lines()
            .find(|l| l.ends_with(&format!(" {}", command.trim_start_matches('/'))))
            .expect("the driver in the image");
        assert!(entry.starts_with("-r-xr-xr-x "), "{entry}");
        let inside = Command::new("tar")
            .args(["-x", "-z", "-O", "-f"])
            .arg(&layer)
            .arg(command.trim_start_matches('/'))
            .output()
            .unwrap();
        assert!(
            inside.stdout == script,
            "the image's driver is the repository's script"
        );
        for tool in [
            "bash", "jq", "date", "sleep", "mktemp", "seq", "cp", "mv", "rm", "cat", "touch",
        ] {
            assert!(listing.contains(&format!(" usr/bin/{tool}\n")), "{tool}");
        }
        if m["platform"]["architecture"] == "amd64" && cfg!(target_arch = "x86_64") {
            runs_from_the_layer(&layer);
        }
    }
}

/// The amd64 layer's tools start with the layer's own loader and libraries.
fn runs_from_the_layer(layer: &Path) {
    let root = tempfile::tempdir().unwrap();
    let ok = Command::new("tar")
        .args(["-x", "-z", "-f"])
        .arg(layer)
        .arg("-C")
        .arg(root.path())
        .status()
        .unwrap();
    assert!(ok.success());
    let libs = root.path().join("usr/lib/x86_64-linux-gnu");
    for (tool, says) in [
        ("bash", "GNU bash, version 5"),
        ("jq", "jq-1."),
        ("date", "(GNU coreutils)"),
        ("seq", "(GNU coreutils)"),
    ] {
        let out = Command::new(libs.join("ld-linux-x86-64.so.2"))
            .arg("--library-path")
            .arg(&libs)
            .arg(root.path().join("usr/bin").join(tool))
            .arg("--version")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(says),
            "{tool}: {text}"
        );
    }
}
