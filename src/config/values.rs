//! Parsers for single values shared by every grammar: versions, durations,
//! DNS labels, and the did-you-mean suggestion for a misspelt key.

use std::time::Duration;
use toml::de::DeValue;

pub(super) const DURATION_SYNTAX: &str = "a duration string such as \"20m\", \"6h\" or \"1h30m\"";

/// A version pin: an exact semver version, nothing that could float.
pub fn parse_version(s: &str) -> Result<semver::Version, String> {
    let err = |why: &str| {
        format!("version must be an exact version such as \"1.13.2\"; found \"{s}\" ({why})")
    };
    let t = s.trim();
    if t.eq_ignore_ascii_case("latest") {
        return Err(err(
            "\"latest\" is not allowed: an environment pins the version confirmed below it",
        ));
    }
    if t.starts_with(['^', '~', '=', '<', '>', '*'])
        || t.contains(['*', ',', '|', ' '])
        || t.split('.').any(|p| p.eq_ignore_ascii_case("x"))
    {
        return Err(err(
            "a range is not allowed: an environment runs one version",
        ));
    }
    match semver::Version::parse(t) {
        Ok(v) if t == s => Ok(v),
        Ok(_) => Err(err("remove the surrounding spaces")),
        Err(e) => {
            let core = t.split(['-', '+']).next().unwrap_or(t);
            if let Some(rest) = t.strip_prefix(['v', 'V']) {
                if semver::Version::parse(rest).is_ok() {
                    return Err(err("drop the leading `v`"));
                }
            }
            if core.split('.').count() < 3 && core.split('.').all(|p| p.parse::<u64>().is_ok()) {
                return Err(err(
                    "a partial version is not allowed: give major, minor and patch",
                ));
            }
            Err(err(&e.to_string()))
        }
    }
}

/// Check a name used as a path component and a Kubernetes-style name.
pub(super) fn check_dns_label(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let ok_end = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if b.is_empty() || b.len() > 63 {
        return Err("it must have 1 to 63 characters".to_owned());
    }
    if !ok_end(b.first())
        || !ok_end(b.last())
        || !b
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    {
        return Err(
            "use lowercase letters, digits and `-`, starting and ending with a letter or digit"
                .to_owned(),
        );
    }
    Ok(())
}

/// Parse a human duration: "6h", "20m", "1h30m".
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}"))
        .and_then(|d| {
            if s.trim() == s {
                Ok(d)
            } else {
                Err("remove the surrounding spaces".to_owned())
            }
        })
}

/// The candidate closest to `word`, if it is close enough to be a typo.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let w = word.to_lowercase();
    let limit = (w.chars().count() / 3).max(2);
    // An abbreviation (`prod` for `production`) is as likely as a typo.
    let abbreviates = |c: &str| w.chars().count() >= 3 && c.to_lowercase().starts_with(&w);
    candidates
        .into_iter()
        .map(|c| {
            let d = if abbreviates(c) {
                0
            } else {
                strsim::damerau_levenshtein(&w, &c.to_lowercase())
            };
            (d, c)
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

pub(super) fn quoted_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items
        .into_iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn a_type(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}
