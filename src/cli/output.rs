//! What every command prints: the output formats (`-o text|wide|json|yaml`,
//! and `-o jsonpath=TEMPLATE` over the JSON document, as kubectl's) and the
//! one document every command gives in JSON and YAML, whatever its exit
//! code (docs/cli.md, docs/cli.schema.json):
//!
//! ```json
//! {"ok": true, "errors": [], ...the command's own fields}
//! {"ok": false, "errors": [{"message": "...", "file": "...", "line": 3, "column": 12}]}
//! ```

use serde::Serialize;

/// Output format of a command (`--format`, `-o`, `--output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Human-readable text.
    Text,
    /// Text with every column unabridged (full commit ids), as `kubectl -o wide`.
    Wide,
    /// One JSON document on stdout.
    Json,
    /// The same document as YAML.
    Yaml,
    /// `jsonpath=TEMPLATE`: the JSON document through kubectl's template
    /// (the template is kept in [`TEMPLATE`]; a failure's errors go to
    /// stderr as text).
    #[value(skip)]
    JsonPath,
}

/// The `-o jsonpath=` template of this process's command line.
static TEMPLATE: std::sync::OnceLock<super::jsonpath::Template> = std::sync::OnceLock::new();

/// `-o`'s value: a format's name, or `jsonpath=TEMPLATE` (quotes around the
/// template, as a shell may leave them, are taken off).
pub fn parse_format(s: &str) -> Result<Format, String> {
    if let Some(t) = s.strip_prefix("jsonpath=") {
        let t = t
            .strip_prefix('\'')
            .and_then(|t| t.strip_suffix('\''))
            .unwrap_or(t);
        let template = super::jsonpath::Template::parse(t)?;
        let _ = TEMPLATE.set(template);
        return Ok(Format::JsonPath);
    }
    <Format as clap::ValueEnum>::from_str(s, true).map_err(|_| {
        format!("expected text, wide, json, yaml or jsonpath=TEMPLATE (such as jsonpath='{{.environments[*].name}}'), got {s:?}")
    })
}

impl Format {
    /// JSON, YAML or a JSONPath template over JSON: one document on
    /// stdout, for programs.
    pub fn is_document(self) -> bool {
        matches!(self, Format::Json | Format::Yaml | Format::JsonPath)
    }

    /// The format named on a command line clap could not parse (`-o json`,
    /// `--format=yaml`, `-ojson`), so a usage error is a document too.
    pub fn sniff(args: &[std::ffi::OsString]) -> Format {
        let mut found = Format::Text;
        let mut it = args.iter().filter_map(|a| a.to_str());
        while let Some(a) = it.next() {
            let value = match a {
                "-o" | "--format" | "--output" => it.next(),
                _ => ["--format=", "--output=", "-o=", "-o"]
                    .iter()
                    .find_map(|p| a.strip_prefix(p).filter(|v| !v.is_empty())),
            };
            match value {
                Some("json") => found = Format::Json,
                Some("yaml") => found = Format::Yaml,
                Some("text") => found = Format::Text,
                Some("wide") => found = Format::Wide,
                _ => {}
            }
        }
        found
    }
}

/// One reason a command failed: a problem in a config file (file, line,
/// column, message), a refused commit (`verify`), or a message alone.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Problem {
    /// A problem at a place in the config repository.
    File(crate::diag::Diagnostic),
    /// A commit the trust check refused.
    Commit {
        /// What is wrong.
        message: String,
        /// The commit.
        commit: String,
        /// The refusal's code (`unsigned`, `unknown_key`, ...).
        reason: String,
    },
    /// A problem with the command line, the repository as a whole, or a
    /// command that could not run.
    Message {
        /// What is wrong and what to do.
        message: String,
    },
}

impl Problem {
    /// The problem as one line of text.
    pub fn text(&self) -> String {
        match self {
            Problem::File(d) => d.to_string(),
            Problem::Commit { message, .. } | Problem::Message { message } => {
                format!("drover: error: {message}")
            }
        }
    }
}

impl From<crate::diag::Diagnostic> for Problem {
    fn from(d: crate::diag::Diagnostic) -> Self {
        Problem::File(d)
    }
}

impl From<String> for Problem {
    fn from(message: String) -> Self {
        Problem::Message { message }
    }
}

/// The document: `ok`, `errors`, then the command's own fields (flattened,
/// so a body must serialize as a map).
#[derive(Serialize)]
struct Envelope<'a, T: Serialize> {
    ok: bool,
    errors: &'a [Problem],
    #[serde(flatten)]
    body: &'a T,
}

/// No fields of a command's own: the document of a failure.
#[derive(Serialize)]
struct Nothing {}

/// Print `body` as the document of a command that succeeded.
pub fn print_ok<T: Serialize>(format: Format, body: &T) -> anyhow::Result<()> {
    print_document(format, true, &[], body)
}

/// Print the document of a failure: `{"ok": false, "errors": [...]}`.
pub fn print_failure(format: Format, errors: &[Problem]) -> anyhow::Result<()> {
    print_document(format, false, errors, &Nothing {})
}

/// Print the whole document in `format` (JSON or YAML; nothing in text).
pub fn print_document<T: Serialize>(
    format: Format,
    ok: bool,
    errors: &[Problem],
    body: &T,
) -> anyhow::Result<()> {
    let doc = Envelope { ok, errors, body };
    match format {
        Format::Json => print_json(&doc),
        Format::Yaml => {
            write_stdout(|out| yaml_serde::to_writer(out, &doc).map_err(std::io::Error::other))
        }
        Format::JsonPath if !ok => {
            for e in errors {
                eprintln!("{}", e.text());
            }
            Ok(())
        }
        Format::JsonPath => {
            let value = serde_json::to_value(&doc)?;
            let text = match TEMPLATE.get() {
                Some(t) => t.render(&value).map_err(anyhow::Error::msg)?,
                None => String::new(),
            };
            write_stdout(|out| std::io::Write::write_all(out, text.as_bytes()))
        }
        Format::Text | Format::Wide => Ok(()),
    }
}

/// Print `body` as the document of a success on one line of JSON (a
/// stream of documents: `drover status --watch -o json`).
pub fn print_line<T: Serialize>(body: &T) -> anyhow::Result<()> {
    let doc = Envelope {
        ok: true,
        errors: &[],
        body,
    };
    write_stdout(|out| {
        serde_json::to_writer(&mut *out, &doc).map_err(std::io::Error::from)?;
        std::io::Write::write_all(out, b"\n")
    })
}

/// Print `value` as pretty JSON on stdout. A reader that went away
/// (`drover log --format json | head`) is not an error.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    write_stdout(|out| {
        serde_json::to_writer_pretty(&mut *out, value).map_err(std::io::Error::from)?;
        std::io::Write::write_all(out, b"\n")
    })
}

/// Write to stdout through a buffer (a long `drover log` is megabytes),
/// treating a closed pipe as the reader having had enough.
fn write_stdout(
    write: impl FnOnce(&mut std::io::BufWriter<std::io::StdoutLock<'static>>) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    match write(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<std::ffi::OsString> {
        a.iter().map(Into::into).collect()
    }

    #[test]
    fn the_format_of_an_unparsable_command_line_is_found() {
        for (a, f) in [
            (&["check", "-o", "json", "--bogus"][..], Format::Json),
            (&["--format=yaml", "log"], Format::Yaml),
            (&["-ojson", "windows"], Format::Json),
            (&["--output", "json"], Format::Json),
            (&["windows", "--env"], Format::Text),
            (&["-o"], Format::Text),
        ] {
            assert_eq!(Format::sniff(&args(a)), f, "{a:?}");
        }
    }

    #[test]
    fn the_envelope_comes_first_and_a_failure_has_no_other_field() {
        #[derive(Serialize)]
        struct Body {
            env: &'static str,
        }
        let doc = serde_json::to_string(&Envelope {
            ok: true,
            errors: &[],
            body: &Body { env: "test" },
        })
        .unwrap();
        assert_eq!(doc, r#"{"ok":true,"errors":[],"env":"test"}"#);
        let doc = serde_json::to_string(&Envelope {
            ok: false,
            errors: &[Problem::from("x".to_owned())],
            body: &Nothing {},
        })
        .unwrap();
        assert_eq!(doc, r#"{"ok":false,"errors":[{"message":"x"}]}"#);
    }
}
