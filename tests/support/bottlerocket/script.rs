//! Running drover's Bottlerocket driver script as its pod runs it, against
//! the simulated node API ([`super::BottlerocketApi`]) through the stand-in
//! `apiclient` beside this file: one run, or a pod's life (the script asks
//! for the reboot, the shutdown stops it with SIGTERM, the node reboots, the
//! Job starts it again), and earlier versions of the script for the tests
//! that show the failure each had.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{v, BottlerocketApi, Scenario};
use serde_json::Value;

const OLD_SCRIPT: &str = include_str!("old_driver.sh");
const PREVIOUS_SCRIPT: &str = include_str!("previous_driver.sh");
/// The script before issue 39: it trusted thar-be-updates' bookkeeping for
/// "staged already".
const STAGED_BOOKKEEPING_SCRIPT: &str = include_str!("staged_bookkeeping_driver.sh");

/// The driver script as the updater image holds it.
pub fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/updater/bottlerocket-update.sh")
}

pub fn script_text() -> String {
    fs::read_to_string(script_path()).expect("the driver script")
}
/// Bound for one run of a script (the slowest fault takes ~12 s).
pub const RUN_LIMIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Script {
    /// The first script (`/bin/sh -c`).
    Old,
    /// The script before it refused to activate what updog did not say it
    /// wrote (`/bin/bash -c`, as the Job ran it then).
    Previous,
    /// The script before it checked updog's report for "staged already".
    StagedBookkeeping,
    /// `deploy/updater/bottlerocket-update.sh`, executed as the Job's command.
    New,
    /// This program, standing for the Job's command (the script as the
    /// updater image runs it, with the image's own tools).
    Exec(&'static Path),
}

/// What happened over a pod's life.
#[derive(Debug)]
pub struct Outcome {
    /// The exit code of the last run (143 for SIGTERM).
    pub exit: i32,
    /// Whether the node rebooted.
    pub rebooted: bool,
    /// Everything the runs wrote.
    pub output: String,
    /// The last run's termination message (`DROVER_TERMINATION_LOG`), parsed.
    pub report: Option<Value>,
}

pub fn stand_in_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/bottlerocket")
}

/// Start one run of `script` moving `api`'s node to `target`.
pub fn spawn(script: Script, api: &BottlerocketApi, dir: &Path, target: &str, n: usize) -> Child {
    spawn_env(script, api, dir, target, n, UNIT, &[])
}

/// The tests' `DROVER_TIME_UNIT`: every wait of the script 50 times shorter.
pub const UNIT: &str = "0.02";

/// [`spawn`] with the script's time unit and more variables in its environment.
pub fn spawn_env(
    script: Script,
    api: &BottlerocketApi,
    dir: &Path,
    target: &str,
    n: usize,
    unit: &str,
    env: &[(&str, &str)],
) -> Child {
    let state = dir.join("state");
    fs::create_dir_all(&state).unwrap();
    let path = format!(
        "{}:{}",
        stand_in_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = match script {
        Script::New => Command::new(script_path()),
        Script::Exec(program) => Command::new(program),
        Script::Previous => {
            let mut c = Command::new("bash");
            c.arg("-c").arg(PREVIOUS_SCRIPT);
            c
        }
        Script::StagedBookkeeping => {
            let mut c = Command::new("bash");
            c.arg("-c").arg(STAGED_BOOKKEEPING_SCRIPT);
            c
        }
        // The old script names the container's mount point itself.
        Script::Old => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(OLD_SCRIPT.replace("/drover-state", &state.display().to_string()));
            c
        }
    };
    let out = fs::File::create(dir.join(format!("run-{n}.log"))).unwrap();
    command
        .env("PATH", path)
        .env("APICLIENT_SOCKET", api.socket())
        .env("DROVER_TARGET_VERSION", target)
        .env("DROVER_NODE_NAME", "node-1")
        .env("DROVER_ATTEMPT", "1764460800")
        .env("DROVER_STATE_DIR", &state)
        .env("DROVER_TIME_UNIT", unit)
        .env("DROVER_TERMINATION_LOG", termination_log(dir, n))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start the driver script")
}

/// A running script whose exit is reported on a channel.
pub struct Run {
    pub pid: u32,
    exited: mpsc::Receiver<i32>,
}

pub fn watch(mut child: Child) -> Run {
    let pid = child.id();
    let (tx, exited) = mpsc::channel();
    thread::spawn(move || {
        let status = child.wait().expect("wait for the script");
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        let _ = tx.send(code);
    });
    Run { pid, exited }
}

pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill {sig} {pid}");
}

impl Run {
    /// The exit code, or the reboot request if that comes first.
    pub fn until_exit_or_reboot(&self, api: &BottlerocketApi, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(code) = self.exited.recv_timeout(Duration::from_millis(20)) {
                return Some(code);
            }
            if api.reboot_requests() > 0 && api.boots().is_empty() {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "the script neither exited nor rebooted within {limit:?}"
            );
        }
    }

    pub fn exit(&self, limit: Duration) -> i32 {
        self.exited
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("the script did not exit within {limit:?}"))
    }
}

/// Run `script` for `target` over the pod's life (see the module doc).
pub fn run(script: Script, api: &BottlerocketApi, dir: &Path, target: &str, unit: &str) -> Outcome {
    run_env(script, api, dir, target, unit, &[])
}

/// [`run`] with more variables in the script's environment.
pub fn run_env(
    script: Script,
    api: &BottlerocketApi,
    dir: &Path,
    target: &str,
    unit: &str,
    env: &[(&str, &str)],
) -> Outcome {
    let first = watch(spawn_env(script, api, dir, target, 1, unit, env));
    let (exit, rebooted) = match first.until_exit_or_reboot(api, RUN_LIMIT) {
        Some(code) => (code, false),
        None => {
            // The graceful shutdown stops the pod, then the node reboots.
            signal(first.pid, "-TERM");
            let code = first.exit(Duration::from_secs(30));
            assert!(
                code == 143 || script == Script::Old,
                "the script exits 143 on the shutdown's SIGTERM, got {code}"
            );
            api.reboot_now();
            let second = watch(spawn_env(script, api, dir, target, 2, unit, env));
            (second.exit(RUN_LIMIT), true)
        }
    };
    let mut output = String::new();
    for n in 1..=2 {
        if let Ok(s) = fs::read_to_string(dir.join(format!("run-{n}.log"))) {
            output.push_str(&format!("--- run {n}\n{s}"));
        }
    }
    let last = if rebooted { 2 } else { 1 };
    Outcome {
        exit,
        rebooted,
        output,
        report: report(dir, last),
    }
}

/// Run the old and the new script, each against its own node from `scenario`.
pub fn both(
    scenario: Scenario,
    target: &str,
) -> (
    (Outcome, BottlerocketApi, tempfile::TempDir),
    (Outcome, BottlerocketApi, tempfile::TempDir),
) {
    both_with_unit(scenario, target, UNIT)
}

/// [`both`], with the new script's waits in units of `unit` seconds.
pub fn both_with_unit(
    scenario: Scenario,
    target: &str,
    unit: &str,
) -> (
    (Outcome, BottlerocketApi, tempfile::TempDir),
    (Outcome, BottlerocketApi, tempfile::TempDir),
) {
    pair(Script::Old, scenario, target, unit)
}

/// Run `earlier` and the new script, each against its own node from `scenario`.
pub fn pair(
    earlier: Script,
    scenario: Scenario,
    target: &str,
    unit: &str,
) -> (
    (Outcome, BottlerocketApi, tempfile::TempDir),
    (Outcome, BottlerocketApi, tempfile::TempDir),
) {
    let go = |script| {
        let dir = tempfile::tempdir().unwrap();
        let api = BottlerocketApi::start(dir.path(), scenario.clone());
        let outcome = run(script, &api, dir.path(), target, unit);
        (outcome, api, dir)
    };
    thread::scope(|s| {
        let old = s.spawn(|| go(earlier));
        let new = s.spawn(|| go(Script::New));
        (old.join().unwrap(), new.join().unwrap())
    })
}

/// The new script's success: only the target written and booted, once.
pub fn assert_upgraded(o: &Outcome, api: &BottlerocketApi, target: &str, staged_before: usize) {
    assert_eq!(o.exit, 0, "{}\n{:#?}", o.output, api.requests());
    assert!(o.rebooted, "{}", o.output);
    assert_eq!(api.running(), v(target));
    assert_eq!(api.boots(), vec![v(target)], "booted once, into the target");
    assert_eq!(
        api.staged()[staged_before..],
        [v(target)],
        "only the target was written to the staging partition"
    );
}

/// The host marker of the tests' attempt.
pub fn marker(dir: &Path) -> PathBuf {
    dir.join("state/attempt-1764460800")
}

/// One run of the new script with `DROVER_ACTION=prepare`: its exit code
/// and what it wrote. It must neither activate nor reboot.
pub fn prepare(api: &BottlerocketApi, dir: &Path, target: &str) -> (i32, String) {
    let run = watch(spawn_env(
        Script::New,
        api,
        dir,
        target,
        0,
        UNIT,
        &[
            ("DROVER_ACTION", "prepare"),
            ("DROVER_ATTEMPT", "1764460000"),
        ],
    ));
    let code = run.exit(RUN_LIMIT);
    let output = fs::read_to_string(dir.join("run-0.log")).unwrap_or_default();
    (code, output)
}

/// Where run `n` writes its termination message.
pub fn termination_log(dir: &Path, n: usize) -> PathBuf {
    dir.join(format!("termination-{n}.log"))
}

/// Run `n`'s termination message, parsed (None if it wrote none).
pub fn report(dir: &Path, n: usize) -> Option<Value> {
    let text = fs::read_to_string(termination_log(dir, n)).ok()?;
    assert!(text.len() < 4096, "the kubelet keeps 4096 bytes: {text}");
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}
