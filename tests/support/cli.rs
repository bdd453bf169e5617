//! The drover binary as the tests run it: the one runner, with or without
//! `--repo`.

use serde_json::Value;
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

/// The schema for the documents of `command` (`#/$defs/<command>`).
fn validator(command: &str) -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        schema["$defs"].get(command).is_some(),
        "docs/cli.schema.json documents no command {command:?}"
    );
    let root = serde_json::json!({
        "$schema": schema["$schema"],
        "$defs": schema["$defs"],
        "$ref": format!("#/$defs/{command}"),
    });
    jsonschema::draft202012::new(&root).expect("docs/cli.schema.json is a valid JSON Schema")
}

/// Panic, naming every mismatch, unless `doc` is a document `command` may print.
pub fn assert_valid(command: &str, doc: &Value) {
    let v = validator(command);
    let errors: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("at {}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "`drover {command} -o json` printed a document docs/cli.schema.json does not describe \
         (document the field there):\n{}\n{doc:#}",
        errors.join("\n")
    );
}
