//! Errors said for people: what the user did and what to do, never a
//! library's internals (`class=Reference (4); code=UnbornBranch (-9)`).
//!
//! The command line is the boundary where libgit2's errors meet the user:
//! [`repository`] and [`head`] translate the two every command can hit
//! (not a repository, no commit yet) where the repository is opened, and
//! [`explain`] renders any error that reaches `main`, each cause said once,
//! replacing a libgit2 error it recognizes by what it means.

use std::path::Path;

/// Opening `path` as a git repository failed.
pub fn repository(path: &Path, e: git2::Error) -> anyhow::Error {
    if e.code() == git2::ErrorCode::NotFound {
        anyhow::anyhow!(
            "{} is not a git repository: drover reads the config repository's \
             history and status branches from git; run it inside a clone of the \
             config repository, pass --repo DIR, or start one with `git init` and \
             `drover init`",
            shown(path)
        )
    } else {
        anyhow::Error::new(e).context(format!("cannot open the git repository {}", shown(path)))
    }
}

/// Reading HEAD of the repository at `path` failed.
pub fn head(path: &Path, e: git2::Error) -> anyhow::Error {
    match e.code() {
        git2::ErrorCode::UnbornBranch | git2::ErrorCode::NotFound => anyhow::anyhow!(
            "the repository {} has no commits yet: commit the config first \
             (git add -A && git commit -m \"Start the config repository\")",
            if path == Path::new(".") {
                "here".to_owned()
            } else {
                format!("at {}", path.display())
            }
        ),
        _ => anyhow::Error::new(e).context(format!("cannot read HEAD of {}", shown(path))),
    }
}

fn shown(path: &Path) -> String {
    if path == Path::new(".") {
        "the current directory".to_owned()
    } else {
        path.display().to_string()
    }
}

/// The error and its causes, each said once (many errors already include
/// their source's text, `git: {0}`), with a libgit2 error it recognizes
/// replaced by what it means for the user, an operating system's error by
/// its words without the error number (`no such file or directory`), and
/// each cause on one line (a YAML parser's error draws the offending line
/// under it).
pub fn explain(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        if let Some(g) = cause.downcast_ref::<git2::Error>() {
            if let Some(hint) = git_hint(g) {
                // Drop the causes that only repeat libgit2's text.
                parts.retain(|p| !p.contains(g.message()));
                parts.push(hint);
                break;
            }
        }
        if let Some(io) = cause
            .downcast_ref::<std::io::Error>()
            .filter(|e| e.raw_os_error().is_some())
        {
            // A library's wrapping of it (`failed to read kubeconfig from
            // '"/x"': No such file ...`) says nothing the context does not.
            let raw = io.to_string();
            parts.retain(|p| !p.contains(&raw));
            parts.push(crate::diag::io_words(io));
            break;
        }
        let text = cause.to_string();
        let text = text.lines().next().unwrap_or("").trim_end().to_owned();
        if text.is_empty() || parts.iter().any(|p| p.contains(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

/// What a libgit2 error means for someone running drover, when known.
fn git_hint(e: &git2::Error) -> Option<String> {
    use git2::{ErrorClass, ErrorCode};
    let msg = e.message();
    match (e.class(), e.code()) {
        (_, ErrorCode::UnbornBranch) => Some(
            "the repository has no commits yet: commit the config first \
             (git add -A && git commit -m \"Start the config repository\")"
                .into(),
        ),
        (ErrorClass::Repository, ErrorCode::NotFound) => Some(
            "not a git repository: run drover inside a clone of the config \
             repository or pass --repo DIR"
                .into(),
        ),
        (_, ErrorCode::NotFound) if msg.starts_with("revspec") => {
            let rev = msg.split('\'').nth(1).unwrap_or("the revision");
            Some(format!(
                "{rev} names no commit in this repository: fetch it first \
                 (git fetch origin) or name a branch, tag or commit that exists"
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libgit2_error_is_replaced_by_what_it_means() {
        let raw = git2::Error::new(
            git2::ErrorCode::UnbornBranch,
            git2::ErrorClass::Reference,
            "reference 'refs/heads/master' not found",
        );
        let err = anyhow::Error::new(raw).context("cannot judge the changes since main");
        let text = explain(&err);
        assert_eq!(
            text,
            "cannot judge the changes since main: the repository has no commits yet: \
             commit the config first (git add -A && git commit -m \"Start the config repository\")"
        );
        assert!(!text.contains("class="), "{text}");
    }

    #[test]
    fn an_os_error_is_said_in_words_and_a_librarys_wrapping_of_it_dropped() {
        // As kube's kubeconfig reader wraps a missing file.
        #[derive(Debug, thiserror::Error)]
        #[error("failed to read kubeconfig from '{1:?}': {0}")]
        struct Wrapped(#[source] std::io::Error, String);
        let io = std::fs::read("/nonexistent/kubeconfig").unwrap_err();
        let err = anyhow::Error::new(Wrapped(io, "/nonexistent/kubeconfig".into()))
            .context("reading /nonexistent/kubeconfig");
        assert_eq!(
            explain(&err),
            "reading /nonexistent/kubeconfig: no such file or directory"
        );
        // A many-line cause is said by its first line.
        let err = anyhow::anyhow!("line 1 column 1: expected mapping start\n --> <input>:1:1\n  |")
            .context("using kubeconfig");
        assert_eq!(
            explain(&err),
            "using kubeconfig: line 1 column 1: expected mapping start"
        );
    }

    #[test]
    fn other_errors_are_said_once_each() {
        let err = anyhow::anyhow!("inner")
            .context("outer: inner")
            .context("top");
        assert_eq!(explain(&err), "top: outer: inner");
    }
}
