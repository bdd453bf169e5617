//! Walking TOML as spanned tables: the files are walked by hand rather than
//! deserialized, so that every problem of a file is collected (not just the
//! first) and each points at the key or value at fault (file:line:column).

use super::values::{a_type, nearest, parse_duration, DURATION_SYNTAX};
use crate::diag::Diagnostic;
use serde_spanned::Spanned;
use std::ops::Range;
use std::time::Duration;
use toml::de::{DeTable, DeValue};

/// A byte range in a file.
pub(super) type Span = Range<usize>;
/// A TOML value with its span.
pub(super) type Value<'i> = Spanned<DeValue<'i>>;

/// One file being validated: its text and the problems found so far.
pub(super) struct Ctx<'a> {
    pub(super) file: &'a str,
    pub(super) text: &'a str,
    pub(super) diags: Vec<Diagnostic>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(file: &'a str, text: &'a str) -> Self {
        Self {
            file,
            text,
            diags: Vec::new(),
        }
    }

    pub(super) fn err(&mut self, span: &Span, msg: impl Into<String>) {
        self.err_at(span.start, msg);
    }

    pub(super) fn err_at(&mut self, offset: usize, msg: impl Into<String>) {
        self.diags
            .push(Diagnostic::at(self.file, self.text, offset, msg));
    }

    pub(super) fn type_err(&mut self, key: &str, span: &Span, expected: &str, found: &DeValue<'_>) {
        self.err(
            span,
            format!("`{key}` must be {expected}; found {}", a_type(found)),
        );
    }

    /// The document, or `None` after recording its syntax errors.
    pub(super) fn parse(&mut self) -> Option<Spanned<DeTable<'a>>> {
        let (doc, errors) = DeTable::parse_recoverable(self.text);
        if errors.is_empty() {
            return Some(doc);
        }
        for e in errors {
            let mut msg = format!("invalid TOML: {}", e.message().trim());
            let snippet = e.span().and_then(|r| self.text.get(r));
            if let Some(key) = snippet.filter(|_| e.message().contains("duplicate key")) {
                msg = format!("{msg} `{key}`: each key may appear once per table");
            }
            if let Some(hint) = e.span().and_then(|r| unquoted_hint(self.text, r.start)) {
                // TOML's own words ("invalid float") describe its grammar, not the mistake.
                msg = format!("invalid TOML: {hint}");
            }
            match e.span() {
                Some(span) => self.err(&span, msg),
                None => self.err_at(0, msg),
            }
        }
        None
    }

    /// The tables under `key` with their spans: `[[key]]` items, or one
    /// `[key]` table when `single`. An item that is not a table is reported
    /// and skipped, and more than `max` tables are reported (`plural` names
    /// them). `None` when `key` is absent, or after reporting that it holds
    /// neither (`expected` says what would be valid).
    pub(super) fn tables_of<'d>(
        &mut self,
        doc: &'d DeTable<'a>,
        key: &str,
        single: bool,
        expected: &str,
        (plural, max): (&str, usize),
    ) -> Option<Vec<(&'d DeTable<'a>, Span)>> {
        let v = doc.get(key)?;
        let header = self.key_span(doc, key).unwrap_or(v.span());
        let tables: Vec<(&DeTable<'a>, Span)> = match v.get_ref() {
            DeValue::Array(items) => items
                .iter()
                .filter_map(|item| match item.get_ref() {
                    DeValue::Table(t) => Some((t, item.span())),
                    other => {
                        let what = format!("a table, written [[{key}]]");
                        self.type_err(key, &item.span(), &what, other);
                        None
                    }
                })
                .collect(),
            DeValue::Table(t) if single => vec![(t, header.clone())],
            other => {
                self.type_err(key, &header, expected, other);
                return None;
            }
        };
        if tables.len() > max {
            self.err(
                &header,
                format!(
                    "{} {plural}; at most {max} [[{key}]] tables are allowed",
                    tables.len()
                ),
            );
        }
        Some(tables)
    }

    pub(super) fn key_span(&self, table: &DeTable<'_>, key: &str) -> Option<Span> {
        table.get_key_value(key).map(|(k, _)| k.span())
    }

    /// Report keys of `table` (section `section` of a file with `schema`)
    /// that are not valid there, suggesting the nearest valid one.
    pub(super) fn check_keys(
        &mut self,
        table: &DeTable<'_>,
        section: &str,
        schema: &[(&str, &[&str])],
    ) {
        let valid: &[&str] = schema
            .iter()
            .find(|(s, _)| *s == section)
            .map_or(&[], |(_, k)| k);
        let place = if section.is_empty() {
            "at the top level".to_owned()
        } else {
            format!("in [{section}]")
        };
        for (k, _) in table.iter() {
            let key = k.get_ref().as_ref();
            if valid.contains(&key) {
                continue;
            }
            let elsewhere: Vec<String> = schema
                .iter()
                .filter(|(s, keys)| *s != section && !s.is_empty() && keys.contains(&key))
                .map(|(s, _)| format!("[{s}]"))
                .collect();
            let elsewhere = (!elsewhere.is_empty()).then(|| elsewhere.join(" or "));
            let hint = match (elsewhere, nearest(key, valid.iter().copied())) {
                (Some(s), _) => format!("; `{key}` belongs in {s};"),
                (None, Some(n)) => format!("; did you mean `{n}`?"),
                (None, None) => ";".to_owned(),
            };
            self.err(
                &k.span(),
                format!(
                    "unknown key `{key}` {place}{hint} valid keys: {}",
                    valid.join(", ")
                ),
            );
        }
    }

    /// Section `name` of `doc`: `None` when absent or not a table (the
    /// latter reported); its keys are checked against `schema`.
    pub(super) fn section<'t>(
        &mut self,
        doc: &'t DeTable<'a>,
        name: &str,
        schema: &[(&str, &[&str])],
    ) -> Option<&'t DeTable<'a>> {
        let v = doc.get(name)?;
        match v.get_ref() {
            DeValue::Table(t) => {
                self.check_keys(t, name, schema);
                Some(t)
            }
            other => {
                let span = self.key_span(doc, name).unwrap_or(v.span());
                self.type_err(name, &span, &format!("a table, written [{name}]"), other);
                None
            }
        }
    }

    pub(super) fn want_str<'v>(
        &mut self,
        key: &str,
        v: &'v Value<'a>,
        expected: &str,
    ) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.type_err(key, &v.span(), expected, other);
                None
            }
        }
    }

    pub(super) fn want_bool(&mut self, key: &str, v: &Value<'a>) -> Option<bool> {
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                self.type_err(key, &v.span(), "a boolean (true or false)", other);
                None
            }
        }
    }

    /// A string that must be one of `options`.
    pub(super) fn one_of<'o>(
        &mut self,
        key: &str,
        v: &Value<'a>,
        options: &[&'o str],
    ) -> Option<&'o str> {
        let list = options
            .iter()
            .map(|o| format!("\"{o}\""))
            .collect::<Vec<_>>()
            .join(" or ");
        let s = self.want_str(key, v, &list)?;
        if let Some(o) = options.iter().find(|o| **o == s) {
            return Some(o);
        }
        let hint = nearest(s, options.iter().copied())
            .map(|n| format!("; did you mean \"{n}\"?"))
            .unwrap_or_default();
        self.err(
            &v.span(),
            format!("`{key}` must be {list}; found \"{s}\"{hint}"),
        );
        None
    }

    /// A duration key of `table` (default when absent) and its value's span.
    pub(super) fn duration(
        &mut self,
        table: Option<&DeTable<'a>>,
        key: &str,
        default: Duration,
        allow_zero: bool,
    ) -> (Duration, Option<Span>) {
        let Some(v) = table.and_then(|t| t.get(key)) else {
            return (default, None);
        };
        let Some(s) = self.want_str(key, v, DURATION_SYNTAX) else {
            return (default, Some(v.span()));
        };
        match parse_duration(s) {
            Ok(d) if d.is_zero() && !allow_zero => {
                self.err(
                    &v.span(),
                    format!("`{key}` must be longer than zero, such as \"20m\" or \"6h\""),
                );
                (default, Some(v.span()))
            }
            Ok(d) => (d, Some(v.span())),
            Err(e) => {
                self.err(
                    &v.span(),
                    format!("`{key}` must be {DURATION_SYNTAX}; found \"{s}\" ({e})"),
                );
                (default, Some(v.span()))
            }
        }
    }
}

/// For a syntax error on a line `key = value` whose value is text written
/// without quotes (`version = 1.13.2`, TOML's "invalid float"): say so, and
/// show the line as it should be.
fn unquoted_hint(text: &str, offset: usize) -> Option<String> {
    let start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?;
    let (key, value) = line.split_once('=')?;
    let key = key.trim();
    // The value up to a comment, if any.
    let value = value.split(" #").next()?.trim();
    let plain = |c: char| c.is_ascii_alphanumeric() || "._-+:/".contains(c);
    if key.is_empty() || value.is_empty() || !value.chars().all(plain) {
        return None;
    }
    // A value TOML accepts unquoted (a number, a boolean, a date) is not the problem.
    if format!("v = {value}").parse::<toml::Table>().is_ok() {
        return None;
    }
    Some(format!(
        "`{key} = {value}`: text must be quoted, as in {key} = \"{value}\""
    ))
}
