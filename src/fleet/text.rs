//! `drover status` as text: one block per environment, aligned columns,
//! lines kept within 80 columns (long messages wrap; only a very long
//! cluster name widens its table).

use super::model::{EnvView, Fleet, WindowView};
use chrono::{DateTime, Utc};
use std::fmt::Write as _;

/// Terminal width the text is laid out for.
pub const WIDTH: usize = 80;

fn utc_min(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

/// The local wall time of an RFC 3339 string with offset: (`Mon 2027-02-01`, `02:00`).
fn local_parts(rfc3339: &str) -> (String, String) {
    match DateTime::parse_from_rfc3339(rfc3339) {
        Ok(t) => (
            t.format("%a %Y-%m-%d").to_string(),
            t.format("%H:%M").to_string(),
        ),
        Err(_) => (rfc3339.to_owned(), String::new()),
    }
}

/// A window in the environment's zone beside UTC, e.g.
/// `Tue 2026-12-08 02:00–08:00 CET (2026-12-08 01:00–07:00 UTC)`.
pub fn window_line(w: &WindowView) -> String {
    let (sd, st) = local_parts(&w.start_local);
    let (ed, et) = local_parts(&w.end_local);
    let local_end = if ed == sd { et } else { format!("{ed} {et}") };
    let utc = if w.start.date_naive() == w.end.date_naive() {
        format!("{}–{} UTC", utc_min(&w.start), w.end.format("%H:%M"))
    } else {
        format!("{} – {} UTC", utc_min(&w.start), utc_min(&w.end))
    };
    format!("{sd} {st}–{local_end} {} ({utc})", w.zone)
}

/// Wrap `text` to [`WIDTH`]: the first line starts with `first`, the
/// others with as many spaces.
fn wrap(out: &mut String, first: &str, text: &str) {
    let indent = " ".repeat(first.chars().count());
    let mut line = String::from(first);
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            let _ = writeln!(out, "{line}");
            line.clone_from(&indent);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    if !empty {
        let _ = writeln!(out, "{line}");
    }
}

/// One environment's block.
pub fn env_block(out: &mut String, e: &EnvView) {
    let _ = writeln!(out, "{} · pins {} · {}", e.name, e.version, e.timezone);
    match &e.next_window {
        Some(w) => {
            let label = if w.open { "open window" } else { "next window" };
            let _ = writeln!(out, "  {label}  {}", window_line(w));
        }
        None => {
            let _ = writeln!(out, "  next window  (none: see warnings)");
        }
    }
    wrap(out, "  gate         ", &e.gate.message);
    let w = e
        .clusters
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(0)
        .max("CLUSTER".len());
    let _ = writeln!(
        out,
        "  {:<w$}  {:<9} {:<10} {:<17} {:<6} REPORT",
        "CLUSTER", "VERSION", "STATE", "SINCE (UTC)", "NODES"
    );
    if e.clusters.is_empty() {
        let _ = writeln!(out, "  (no clusters listed under [clusters] in drover.toml)");
    }
    for c in &e.clusters {
        match &c.report {
            Some(r) => {
                let _ = writeln!(
                    out,
                    "  {:<w$}  {:<9} {:<10} {:<17} {:<6} {}",
                    c.name,
                    r.version,
                    r.state,
                    utc_min(&r.since),
                    format!("{}/{}", r.nodes_at_version, r.nodes),
                    match &c.signer {
                        Some(s) => format!("{} ({s})", c.trust.as_str()),
                        None => c.trust.as_str().to_owned(),
                    }
                );
                if !r.message.is_empty() {
                    wrap(out, "      ↳ ", &r.message);
                }
            }
            None => {
                let _ = writeln!(
                    out,
                    "  {:<w$}  {:<9} {:<10} {:<17} {:<6} {}",
                    c.name, "-", "no report", "-", "-", "-"
                );
            }
        }
    }
}

/// The whole fleet as text.
pub fn render(f: &Fleet) -> String {
    let mut out = String::new();
    let branch = match (&f.status_branch.refname, &f.status_branch.tip) {
        (Some(r), Some(t)) => format!(
            "{} at {:.10}",
            r.strip_prefix("refs/heads/").unwrap_or(r),
            t
        ),
        _ => format!("{} (not found: no reports yet)", f.status_branch.name),
    };
    let _ = writeln!(out, "drover status at {}Z", utc_min(&f.now).replace(' ', "T"));
    let _ = writeln!(out, "status branch {branch}");
    for e in &f.environments {
        let _ = writeln!(out);
        env_block(&mut out, e);
    }
    if !f.warnings.is_empty() {
        let _ = writeln!(out, "\nwarnings:");
        for w in &f.warnings {
            wrap(&mut out, "  - ", w);
        }
    }
    out
}
