//! Preparing a revocation (`drover revoke VERSION --reason TEXT`): the
//! fleet-wide stop for a bad OS release (docs/design.md §2, §4). It adds
//! `{ version, reason }` to `[promotion] revoked` in `drover.toml`, keeping
//! every comment and the rest of the layout, and commits that on a branch
//! for review exactly as `drover promote` does ([`promote::commit_on_branch`]).
//!
//! Deciding is pure ([`prepare`], [`add_entry`]); writing is the promotion's
//! git edge. Once the commit is merged, the gate refuses every environment
//! moving to the version, in `drover check --base`, `drover promote` and the
//! agent: the policy in force judges each change (docs/design.md §4).

use crate::config::{self, Files, RepoConfig, Revoked, ROOT_FILE};
use crate::promote;
use chrono::{DateTime, Utc};
use semver::Version;
use std::path::Path;
use toml::de::DeValue;

/// The longest reason accepted, in characters: it is one line of
/// `drover.toml`, of the commit message and of every refusal that cites it.
pub const MAX_REASON_CHARS: usize = 500;

/// Why a revocation cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// VERSION is not one exact version.
    #[error("cannot revoke {given:?}: {why}")]
    Version {
        /// What was given.
        given: String,
        /// What is wrong and what would be valid.
        why: String,
    },
    /// The reason is empty, too long or not one line.
    #[error("--reason {0}")]
    Reason(String),
    /// The version is already in `[promotion] revoked`.
    #[error("{version} is already revoked in [promotion] revoked of {ROOT_FILE} ({reason}); nothing to do")]
    AlreadyRevoked {
        /// The version.
        version: Version,
        /// The reason recorded then.
        reason: String,
    },
    /// `drover.toml` could not be edited in place.
    #[error("{ROOT_FILE}: {0}")]
    Edit(String),
    /// Writing the branch and commit failed.
    #[error(transparent)]
    Promote(#[from] promote::Error),
}

impl Error {
    /// Whether the input was rejected (exit 1) rather than the command
    /// unable to run (exit 2).
    pub fn is_rejection(&self) -> bool {
        !matches!(self, Error::Promote(_))
    }
}

/// A revocation ready to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// The entry added to `[promotion] revoked`.
    pub entry: Revoked,
    /// Environments pinned to the version at HEAD: they need a change of
    /// their own to move off it (a policy edit and a version move never
    /// share a change, docs/design.md §4).
    pub pinned: Vec<String>,
    /// Branch name for the pull request.
    pub branch: String,
}

impl Revocation {
    /// What a revocation does not do to the environments pinned to the
    /// version, and how to hold them now; `None` when none is pinned. The
    /// gate refuses moves *to* a revoked version; an environment already
    /// pinned to it keeps it (its nodes on it keep running it) until a
    /// change of its own moves it off, and a pause is the one change that
    /// stops every node start there at once.
    pub fn pinned_note(&self) -> Option<String> {
        if self.pinned.is_empty() {
            return None;
        }
        let version = &self.entry.version;
        let envs = self.pinned.join(", ");
        let pause: Vec<String> = self
            .pinned
            .iter()
            .map(|env| {
                format!(
                    "sed -i -e '/^paused *=/d' -e '/^\\[rollout\\]/a paused = true' {dir}/{env}.toml && \
                     git commit -am \"Pause {env}: {version} is revoked\"",
                    dir = config::ENV_DIR
                )
            })
            .collect();
        Some(format!(
            "Pinned to {version} now: {envs}. A revocation moves no node back: their nodes on \
             {version} keep running it until a change of their own moves them off it. To start \
             no further node there now, pause them in a change of its own, on a branch of its \
             own, merged first (a file without [rollout] needs `[rollout]` and `paused = true` \
             added by hand):\n    {}",
            pause.join("\n    ")
        ))
    }

    /// The commit message: a summary line, then what it changes.
    pub fn message(&self) -> String {
        let Revoked { version, reason } = &self.entry;
        let pinned = self
            .pinned_note()
            .unwrap_or_else(|| "No environment is pinned to it.".to_owned());
        format!(
            "Revoke {version}: {reason}\n\n\
             Adds {version} to [promotion] revoked in {ROOT_FILE}: from this commit on the \
             gate refuses every environment moving to it.\n{pinned}\n\n\
             Prepared by `drover revoke {version}`.\n"
        )
    }
}

/// Judge the command line against the valid config at HEAD: `version` must
/// be one exact version (the rule of a pin), `reason` one non-empty line of
/// at most [`MAX_REASON_CHARS`], and the version not revoked already.
pub fn prepare(cfg: &RepoConfig, version: &str, reason: &str) -> Result<Revocation, Error> {
    let version = config::parse_version(version).map_err(|why| Error::Version {
        given: version.to_owned(),
        why,
    })?;
    let reason = check_reason(reason)?;
    if let Some(r) = cfg.root.revoked.iter().find(|r| r.version == version) {
        return Err(Error::AlreadyRevoked {
            version,
            reason: r.reason.clone(),
        });
    }
    let pinned = cfg
        .root
        .chain
        .iter()
        .filter(|e| cfg.envs.get(*e).is_some_and(|c| c.version == version))
        .cloned()
        .collect();
    Ok(Revocation {
        branch: format!("drover/revoke-{version}"),
        entry: Revoked { version, reason },
        pinned,
    })
}

/// The reason, trimmed; refused when empty, longer than
/// [`MAX_REASON_CHARS`] or holding a control character (a line break would
/// split the one-line entry and the commit's summary line).
fn check_reason(reason: &str) -> Result<String, Error> {
    let r = reason.trim();
    if r.is_empty() {
        return Err(Error::Reason(
            "is empty: say why the version must never be rolled out again, \
             such as --reason \"kernel panic on m7i\""
                .into(),
        ));
    }
    let n = r.chars().count();
    if n > MAX_REASON_CHARS {
        return Err(Error::Reason(format!(
            "is {n} characters long; at most {MAX_REASON_CHARS}: one line, the details belong in the pull request"
        )));
    }
    if r.chars().any(char::is_control) {
        return Err(Error::Reason(
            "must be one line of text, without line breaks, tabs or other control characters"
                .into(),
        ));
    }
    Ok(r.to_owned())
}

/// `s` as a TOML basic string; control characters never reach here
/// ([`check_reason`]), so quotes and backslashes are all there is to escape.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `entry` as a TOML inline table, `{ version = "…", reason = "…" }`.
fn inline_entry(entry: &Revoked) -> String {
    format!(
        "{{ version = \"{}\", reason = {} }}",
        entry.version,
        quoted(&entry.reason)
    )
}

/// The leading blanks of the line holding byte `at`.
fn indent_at(text: &str, at: usize) -> &str {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = &text[start..at];
    &line[..line.len() - line.trim_start_matches([' ', '\t']).len()]
}

/// `rest` of a line after a one-line insertion: when it is `]`, padding
/// and a `# comment`, the padding gives up what the insertion took (one
/// blank always stays), so aligned comments stay aligned where they can.
fn keep_comment_column<'t>(rest: &'t str, insert: &str) -> std::borrow::Cow<'t, str> {
    let Some(after) = rest.strip_prefix(']') else {
        return rest.into();
    };
    let pad = after.len() - after.trim_start_matches(' ').len();
    if insert.contains('\n') || pad < 2 || !after[pad..].starts_with('#') {
        return rest.into();
    }
    let keep = pad - (pad - 1).min(insert.chars().count());
    format!("]{}{}", " ".repeat(keep), &after[pad..]).into()
}

/// Add `entry` to `[promotion] revoked` in the text of `drover.toml`,
/// keeping every comment and the rest of the layout as the reviewer knows
/// it: appended to an inline array (on a line of its own when the array
/// spans lines), as a `[[promotion.revoked]]` table when the file uses that
/// form, or as a new `revoked = [...]` line after the last key of
/// `[promotion]`. The result is parsed again and must equal the old
/// policy plus the entry, so a layout this cannot edit is an error, never
/// a wrong file.
pub fn add_entry(text: &str, entry: &Revoked) -> Result<String, Error> {
    let edited = insert_entry(text, entry).map_err(Error::Edit)?;
    let cannot = |why: String| {
        Error::Edit(format!(
            "cannot add the entry automatically ({why}); add {} to [promotion] revoked by hand",
            inline_entry(entry)
        ))
    };
    let before = config::parse_root(ROOT_FILE, text)
        .map_err(|d| cannot(d.first().map(ToString::to_string).unwrap_or_default()))?;
    let after = config::parse_root(ROOT_FILE, &edited)
        .map_err(|d| cannot(d.first().map(ToString::to_string).unwrap_or_default()))?;
    let mut expected = before;
    expected.revoked.push(entry.clone());
    if after != expected {
        return Err(cannot("the edited file says something else".into()));
    }
    Ok(edited)
}

/// The text edit of [`add_entry`], before it is checked.
fn insert_entry(text: &str, entry: &Revoked) -> Result<String, String> {
    let doc = toml::de::DeTable::parse(text).map_err(|e| e.to_string())?;
    let promotion = doc
        .get_ref()
        .iter()
        .find(|(k, _)| k.get_ref() == "promotion")
        .map(|(_, v)| v)
        .ok_or("no [promotion] table")?;
    let DeValue::Table(table) = promotion.get_ref() else {
        return Err("`promotion` is not a table".into());
    };
    let new = inline_entry(entry);
    let splice = |at: usize, insert: &str| {
        let mut out = String::with_capacity(text.len() + insert.len());
        out.push_str(&text[..at]);
        out.push_str(insert);
        out.push_str(&keep_comment_column(&text[at..], insert));
        out
    };
    let Some((_, revoked)) = table.iter().find(|(k, _)| k.get_ref() == "revoked") else {
        // No `revoked` key yet: a line of its own after the table's last key.
        let last = table
            .iter()
            .max_by_key(|(_, v)| v.span().end)
            .ok_or("[promotion] has no keys")?;
        let end = last.1.span().end;
        let indent = indent_at(text, last.0.span().start);
        let line_end = text[end..].find('\n').map_or(text.len(), |i| end + i + 1);
        let newline = if text[..line_end].ends_with('\n') {
            ""
        } else {
            "\n"
        };
        return Ok(splice(
            line_end,
            &format!("{newline}{indent}revoked = [{new}]\n"),
        ));
    };
    let DeValue::Array(items) = revoked.get_ref() else {
        return Err("`revoked` is not an array".into());
    };
    let span = revoked.span();
    let src = &text[span.clone()];
    let after_bracket = src.strip_prefix('[').ok_or("`revoked` is not an array")?;
    if after_bracket.trim_start().starts_with('[') {
        // `[[promotion.revoked]]` tables: one more at the end of the file.
        let sep = if text.ends_with('\n') { "\n" } else { "\n\n" };
        return Ok(format!(
            "{text}{sep}[[promotion.revoked]]\nversion = \"{}\"\nreason = {}\n",
            entry.version,
            quoted(&entry.reason)
        ));
    }
    match items.iter().last() {
        None => {
            // `[\n  # comment\n]`: a line of its own before the bracket that
            // closes the array, indented like the line above it inside.
            let close = span.end - 1;
            let line_start = text[..close].rfind('\n').map_or(0, |i| i + 1);
            if line_start > span.start && text[line_start..close].trim().is_empty() {
                let above = text[..line_start - 1].rfind('\n').map_or(0, |i| i + 1);
                let indent = if above > span.start {
                    indent_at(text, line_start - 1).to_owned()
                } else {
                    format!("{}    ", &text[line_start..close])
                };
                return Ok(splice(line_start, &format!("{indent}{new},\n")));
            }
            // `[]`, or `[ # none yet\n]`: right after the bracket.
            Ok(splice(span.start + 1, &new))
        }
        Some(last) => {
            let at = last.span().end;
            if text[span.start..last.span().start].contains('\n') {
                let indent = indent_at(text, last.span().start);
                Ok(splice(at, &format!(",\n{indent}{new}")))
            } else {
                Ok(splice(at, &format!(", {new}")))
            }
        }
    }
}

/// Create the revocation's branch at HEAD of the work tree `dir` and commit
/// the edited `drover.toml` on it (dated `date`, or now); returns the new
/// commit's id. `drover.toml` is read with the config's bounds.
pub fn write_branch(
    dir: &Path,
    revocation: &Revocation,
    date: Option<DateTime<Utc>>,
) -> Result<String, Error> {
    let bytes = config::DirFiles::new(dir)
        .read(ROOT_FILE)
        .map_err(Error::Edit)?
        .ok_or_else(|| Error::Edit("missing".into()))?;
    let text = String::from_utf8(bytes).map_err(|e| Error::Edit(format!("not UTF-8: {e}")))?;
    let edited = add_entry(&text, &revocation.entry)?;
    Ok(promote::commit_on_branch(
        dir,
        &revocation.branch,
        ROOT_FILE,
        &edited,
        &revocation.message(),
        date,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(v: &str, reason: &str) -> Revoked {
        Revoked {
            version: v.parse().unwrap(),
            reason: reason.into(),
        }
    }

    const HEAD: &str = "# fleet policy\n[promotion]\nchain = [\"test\", \"stage\"]  # lowest first\nevidence = \"history\"\n";

    fn add(text: &str, e: &Revoked) -> String {
        add_entry(text, e).unwrap()
    }

    #[test]
    fn an_empty_inline_array_gets_the_entry_and_keeps_its_comment() {
        let text = format!("{HEAD}revoked = []   # none yet\n\n[clusters]\ntest = [\"t-1\"]\n");
        assert_eq!(
            add(&text, &entry("1.13.1", "kernel panic on m7i")),
            format!("{HEAD}revoked = [{{ version = \"1.13.1\", reason = \"kernel panic on m7i\" }}] # none yet\n\n[clusters]\ntest = [\"t-1\"]\n")
        );
    }

    #[test]
    fn padding_before_a_comment_gives_way_so_the_comment_keeps_its_column() {
        let text = format!("{HEAD}revoked = []{}# aligned\n", " ".repeat(60));
        let out = add(&text, &entry("1.13.1", "x"));
        let line = out.lines().find(|l| l.starts_with("revoked")).unwrap();
        assert_eq!(line.find('#'), Some("revoked = []".len() + 60), "{line}");
    }

    #[test]
    fn a_one_line_array_grows_on_its_line() {
        let text =
            format!("{HEAD}revoked = [{{ version = \"1.0.0\", reason = \"old\" }}] # kept\n");
        assert_eq!(
            add(&text, &entry("1.13.1", "x")),
            format!("{HEAD}revoked = [{{ version = \"1.0.0\", reason = \"old\" }}, {{ version = \"1.13.1\", reason = \"x\" }}] # kept\n")
        );
    }

    #[test]
    fn a_multi_line_array_gets_a_line_of_its_own_with_the_same_indent() {
        for trailing in ["", ","] {
            let text = format!(
                "{HEAD}revoked = [\n    # the bad ones\n    {{ version = \"1.0.0\", reason = \"old\" }}{trailing}\n]\n"
            );
            assert_eq!(
                add(&text, &entry("1.13.1", "x")),
                format!("{HEAD}revoked = [\n    # the bad ones\n    {{ version = \"1.0.0\", reason = \"old\" }},\n    {{ version = \"1.13.1\", reason = \"x\" }}{trailing}\n]\n")
            );
        }
    }

    #[test]
    fn an_empty_multi_line_array_gets_a_line_before_its_closing_bracket() {
        let text = format!("{HEAD}revoked = [\n  # versions nothing may take again\n]\n");
        assert_eq!(
            add(&text, &entry("1.13.1", "x")),
            format!("{HEAD}revoked = [\n  # versions nothing may take again\n  {{ version = \"1.13.1\", reason = \"x\" }},\n]\n")
        );
        let text = format!("{HEAD}revoked = [\n]\n");
        assert_eq!(
            add(&text, &entry("1.13.1", "x")),
            format!("{HEAD}revoked = [\n    {{ version = \"1.13.1\", reason = \"x\" }},\n]\n")
        );
    }

    #[test]
    fn without_a_revoked_key_a_line_follows_the_last_key_of_promotion() {
        let text = format!("{HEAD}\n[clusters]  # who\ntest = [\"t-1\"]\n");
        assert_eq!(
            add(&text, &entry("1.13.1", "x")),
            format!("{HEAD}revoked = [{{ version = \"1.13.1\", reason = \"x\" }}]\n\n[clusters]  # who\ntest = [\"t-1\"]\n")
        );
        // A file without a final newline.
        let text = HEAD.trim_end();
        assert_eq!(
            add(text, &entry("1.13.1", "x")),
            format!("{HEAD}revoked = [{{ version = \"1.13.1\", reason = \"x\" }}]\n")
        );
    }

    #[test]
    fn the_array_of_tables_form_gets_one_more_table() {
        let text = format!(
            "{HEAD}\n[[promotion.revoked]]\nversion = \"1.0.0\"\nreason = \"old\"\n\n[clusters]\ntest = []\n"
        );
        let out = add(&text, &entry("1.13.1", "x"));
        assert_eq!(
            out,
            format!("{text}\n[[promotion.revoked]]\nversion = \"1.13.1\"\nreason = \"x\"\n")
        );
    }

    #[test]
    fn quotes_and_backslashes_in_the_reason_survive() {
        let e = entry("1.13.1", r#"says "ok" then panics in C:\boot"#);
        let out = add(&format!("{HEAD}revoked = []\n"), &e);
        let root = config::parse_root(ROOT_FILE, &out).unwrap();
        assert_eq!(root.revoked, [e]);
    }

    #[test]
    fn a_layout_it_cannot_edit_is_an_error_not_a_wrong_file() {
        // Dotted keys at the top level: the new line would land outside [promotion].
        let text = "promotion.chain = [\"test\"]\npromotion.evidence = \"history\"\n";
        let err = add_entry(text, &entry("1.13.1", "x")).unwrap_err();
        assert!(
            err.to_string().contains("add { version = \"1.13.1\""),
            "{err}"
        );
    }

    fn repo_config(text: &str) -> RepoConfig {
        RepoConfig {
            root: config::parse_root(ROOT_FILE, text).unwrap(),
            envs: Default::default(),
        }
    }

    #[test]
    fn bad_input_is_refused_with_what_would_be_valid() {
        let cfg = repo_config(&format!(
            "{HEAD}revoked = [{{ version = \"1.0.0\", reason = \"old\" }}]\n"
        ));
        for (v, r, want) in [
            ("1.13", "x", "exact version"),
            ("v1.13.1", "x", "drop the leading `v`"),
            ("latest", "x", "\"latest\" is not allowed"),
            ("1.13.1", "  ", "is empty"),
            ("1.13.1", "two\nlines", "one line"),
            ("1.0.0", "again", "already revoked"),
        ] {
            let err = prepare(&cfg, v, r).unwrap_err();
            assert!(err.is_rejection());
            assert!(err.to_string().contains(want), "{v} {r:?}: {err}");
        }
        let long = "x".repeat(MAX_REASON_CHARS + 1);
        assert!(prepare(&cfg, "1.13.1", &long)
            .unwrap_err()
            .to_string()
            .contains("at most 500"));
        // Control: a valid revocation, reason trimmed, at the limit.
        let ok = prepare(&cfg, "1.13.1", &format!(" {} ", &long[1..])).unwrap();
        assert_eq!(ok.entry.reason.len(), MAX_REASON_CHARS);
        assert_eq!(ok.branch, "drover/revoke-1.13.1");
    }
}
