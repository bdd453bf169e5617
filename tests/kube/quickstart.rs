//! docs/quickstart.md as a newcomer walks it: every `sh` block, in order,
//! as one shell session from this repository's root, with the real
//! `tests/controlplane` API server the page starts, the real
//! `kubelet-sim` it runs (`cargo run --example`), the real kubectl
//! (tests/tools), git, ssh-keygen and the `drover` binary: `init`, signed
//! commits pushed to a bare remote, the agent adopting the pinned version,
//! a bump that `check` accepts, the rollout to a signed confirmation read
//! by `drover status` and `kubectl`, and the clean-up. Two lines are replaced, as the page says: the `cargo
//! install` (the `drover` this build made is first on `PATH`) and `QS`'s
//! value (a directory of the test's own).

use std::path::Path;
use std::process::Command;

const DOC: &str = "docs/quickstart.md";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The page's `sh` blocks, in order.
fn sh_blocks() -> Vec<String> {
    let text = std::fs::read_to_string(root().join(DOC)).unwrap();
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in text.lines() {
        match &mut open {
            None if line.trim_start().starts_with("```sh") => open = Some(String::new()),
            None => {}
            Some(b) if line.trim_start().starts_with("```") => {
                blocks.push(std::mem::take(b));
                open = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
        }
    }
    assert!(open.is_none(), "{DOC}: a code block is not closed");
    blocks
}

/// Kills what the page started in the background and stops its control
/// plane, whether or not the walk got to its clean-up.
struct CleanUp<'a>(&'a Path);

impl Drop for CleanUp<'_> {
    fn drop(&mut self) {
        for pid in ["agent.pid", "nodes.pid"] {
            if let Ok(p) = std::fs::read_to_string(self.0.join(pid)) {
                let _ = Command::new("kill").arg(p.trim()).status();
            }
        }
        if self.0.join("cluster/pid").exists() {
            let _ = Command::new(root().join("tests/controlplane/stop"))
                .arg(self.0.join("cluster"))
                .status();
        }
    }
}

#[test]
fn the_quickstart_walks_from_nothing_to_a_confirmed_rollout() {
    let blocks = sh_blocks();
    let qs = tempfile::tempdir().unwrap();
    let _clean = CleanUp(qs.path());
    let mut script = String::new();
    let mut replaced = (0, 0);
    for (i, block) in blocks.iter().enumerate() {
        script.push_str(&format!("echo '### step {i}'\n"));
        for line in block.lines() {
            if line.starts_with("cargo install ") {
                replaced.0 += 1;
                continue;
            }
            if line.starts_with("export QS=") {
                replaced.1 += 1;
                script.push_str(&format!("export QS={}\n", qs.path().display()));
                continue;
            }
            script.push_str(line);
            script.push('\n');
        }
    }
    assert_eq!(replaced, (1, 1), "{DOC}: the two lines the walk replaces");
    script.push_str("echo '### done'\n");

    let drover = Path::new(env!("CARGO_BIN_EXE_drover")).parent().unwrap();
    let path = format!(
        "{}:{}:/usr/local/go/bin:{}",
        drover.display(),
        crate::install_docs::tools().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut walk = Command::new("timeout");
    // The page runs in a user's shell, not under `cargo test`: the
    // variables cargo sets for a test would reach the page's own `cargo
    // run`, whose build scripts track some of them (ring's
    // CARGO_MANIFEST_DIR), so it and the next plain build each rebuilt
    // ring and everything above it (about a minute of CI each).
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        let set_by_cargo = (k.starts_with("CARGO_")
            && !matches!(&*k, "CARGO_HOME" | "CARGO_TARGET_DIR" | "CARGO_INCREMENTAL"))
            || k == "OUT_DIR";
        if set_by_cargo {
            walk.env_remove(&*k);
        }
    }
    let out = walk
        .args(["900", "bash", "-euo", "pipefail", "-c", &script])
        .current_dir(root())
        .env("PATH", path)
        .env_remove("KUBECONFIG")
        // A killed test leaves no control plane behind.
        .env("CONTROLPLANE_WATCH_PID", std::process::id().to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs = |f: &str| std::fs::read_to_string(qs.path().join(f)).unwrap_or_default();
    let reached = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("### step "))
        .next_back()
        .and_then(|n| n.parse::<usize>().ok());
    assert!(
        out.status.success() && stdout.contains("### done"),
        "{DOC}: the walk stopped in step {reached:?} ({}):\n{}\nstdout:\n{stdout}\nstderr:\n{stderr}\n\
         agent log (tail):\n{}\nnodes log (tail):\n{}",
        out.status,
        reached.map_or("", |n| blocks[n].as_str()),
        tail(&logs("agent.log")),
        tail(&logs("nodes.log")),
    );

    // What each step printed.
    let step = |n: usize| -> &str {
        let from = stdout.find(&format!("### step {n}\n")).unwrap();
        let rest = &stdout[from..];
        let to = rest[1..].find("### ").map_or(rest.len(), |i| i + 1);
        &rest[..to]
    };
    let find = |what: &str| -> usize {
        (0..blocks.len())
            .find(|&i| blocks[i].contains(what))
            .unwrap_or_else(|| panic!("{DOC}: no step runs {what}"))
    };
    // `init` prints the steps this page walks.
    let init = step(find("drover init"));
    for next in [
        "git config gpg.format ssh",
        "docs/quickstart.md",
        "drover check --base",
    ] {
        assert!(
            init.contains(next),
            "init's next steps lack {next:?}:\n{init}"
        );
    }
    // The simulated nodes start at 1.12.0.
    let nodes = step(find("kubelet-sim"));
    assert_eq!(
        nodes.matches("Bottlerocket OS 1.12.0").count(),
        3,
        "{nodes}"
    );
    // After the rollout: confirmed at 1.13.0, every node at it, in service.
    let after = step(find("--for version=1.13.0"));
    let status_line = after
        .lines()
        .find(|l| l.contains("test-1"))
        .unwrap_or_else(|| panic!("drover status names test-1:\n{after}"));
    assert!(
        status_line.contains("confirmed") && status_line.contains("1.13.0"),
        "{after}"
    );
    let node_rows: Vec<&str> = after
        .lines()
        .filter(|l| l.contains("Bottlerocket OS"))
        .collect();
    assert_eq!(node_rows.len(), 3, "{after}");
    assert!(
        node_rows
            .iter()
            .all(|r| r.contains("Bottlerocket OS 1.13.0") && !r.contains("true")),
        "every node at 1.13.0 and schedulable:\n{after}"
    );
    assert_eq!(
        after.matches(" idle ").count(),
        3,
        "three idle records:\n{after}"
    );
}

fn tail(s: &str) -> &str {
    let start = s.len().saturating_sub(4000);
    let mut i = start;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}
