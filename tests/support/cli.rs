//! The drover binary as the tests run it: the one runner, with or without
//! `--repo`.

use std::path::Path;
use std::process::{Command, Output};

/// The drover binary Cargo built for this test run.
pub fn drover_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_drover"))
}

/// Run drover with `args`; returns (exit code, stdout, stderr).
pub fn drover(args: &[&str]) -> (i32, String, String) {
    let out = drover_command().args(args).output().expect("run drover");
    split(out)
}

/// Run `drover --repo REPO args`; returns (exit code, stdout, stderr).
pub fn drover_at(repo: &Path, args: &[&str]) -> (i32, String, String) {
    split(drover_output_at(repo, args))
}

/// Run `drover --repo REPO args`; returns the whole output.
pub fn drover_output_at(repo: &Path, args: &[&str]) -> Output {
    drover_command()
        .arg("--repo")
        .arg(repo)
        .args(args)
        .output()
        .expect("run drover")
}

fn split(out: Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
