//! `drover status` as text: one block per environment, aligned columns,
//! lines kept within 80 columns (long messages wrap; only a very long
//! cluster name widens its table).

use super::model::{EnvView, Fleet, FreezeView, WindowView};
use crate::terminal::escape;
use chrono::{DateTime, Utc};

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

/// A window in the environment's zone and in UTC, e.g.
/// (`Tue 2026-12-08 02:00–08:00 CET`, `(2026-12-08 01:00–07:00 UTC)`).
pub fn window_parts(w: &WindowView) -> (String, String) {
    let (sd, st) = local_parts(&w.start_local);
    let (ed, et) = local_parts(&w.end_local);
    let local_end = if ed == sd { et } else { format!("{ed} {et}") };
    let utc = if w.start.date_naive() == w.end.date_naive() {
        format!("{}–{} UTC", utc_min(&w.start), w.end.format("%H:%M"))
    } else {
        format!("{} – {} UTC", utc_min(&w.start), utc_min(&w.end))
    };
    (
        format!("{sd} {st}–{local_end} {}", w.zone),
        format!("({utc})"),
    )
}

/// A freeze ahead: its reason, scope and interval in its own zone.
fn freeze_line(f: &FreezeView) -> String {
    let (sd, st) = local_parts(&f.start_local);
    let (ed, et) = local_parts(&f.end_local);
    let reason = if f.reason.is_empty() {
        String::new()
    } else {
        format!("\"{}\" ", f.reason)
    };
    format!(
        "{reason}(scope {}) from {sd} {st} to {ed} {et} {} ({} – {} UTC)",
        f.scope,
        f.zone,
        utc_min(&f.start),
        utc_min(&f.end)
    )
}

/// A window in the environment's zone beside UTC, on one line.
pub fn window_line(w: &WindowView) -> String {
    let (local, utc) = window_parts(w);
    format!("{local} {utc}")
}

/// One line of output, its control characters escaped: names, messages
/// and warnings come from reports and configs others wrote.
fn put(out: &mut String, line: &str) {
    out.push_str(&escape(line));
    out.push('\n');
}

/// Wrap `text` to [`WIDTH`]: the first line starts with `first`, the
/// others with as many spaces.
fn wrap(out: &mut String, first: &str, text: &str) {
    let indent = " ".repeat(first.chars().count());
    let mut line = String::from(first);
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            put(out, &line);
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
        put(out, &line);
    }
}

/// One environment's block.
pub fn env_block(out: &mut String, e: &EnvView) {
    put(
        out,
        &format!("{} · pins {} · {}", e.name, e.version, e.timezone),
    );
    if let Some(h) = &e.hold {
        wrap(out, "  held         ", &h.message);
    }
    for f in e.freezes.iter().filter(|f| !f.active) {
        wrap(out, "  freeze       ", &freeze_line(f));
    }
    match &e.next_window {
        None if e.paused => {
            put(out, "  next window  none while paused");
        }
        Some(w) => {
            let label = if w.open { "open window" } else { "next window" };
            let (local, utc) = window_parts(w);
            let line = format!("  {label}  {local} {utc}");
            if line.chars().count() <= WIDTH {
                put(out, &line);
            } else {
                // A window crossing midnight UTC names both dates: UTC goes below.
                put(out, &format!("  {label}  {local}"));
                put(out, &format!("               {utc}"));
            }
            let note = w.overlap_note();
            if !note.is_empty() {
                wrap(out, "               ", &format!("({note})"));
            }
        }
        None => {
            put(out, "  next window  (none: see warnings)");
        }
    }
    wrap(out, "  gate         ", &e.gate.message);
    if let Some(h) = &e.halt {
        let failed: Vec<String> = h
            .failed
            .iter()
            .map(|f| format!("{} at {}: {}", f.cluster, utc_min(&f.at), f.message))
            .collect();
        wrap(
            out,
            "  HALTED       ",
            &format!(
                "{} failed on {} cluster(s), more than failure_budget = {}: {}; no node \
                 starts for it until a new version or a reviewed change",
                h.version,
                h.failed.len(),
                h.failure_budget,
                failed.join("; ")
            ),
        );
        wrap(out, "  stop it      ", &h.revoke);
    }
    let w = e
        .clusters
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(0)
        .max("CLUSTER".len());
    let n = e
        .clusters
        .iter()
        .filter_map(|c| c.report.as_ref())
        .map(|r| format!("{}/{}", r.nodes_at_version, r.nodes).len())
        .max()
        .unwrap_or(0)
        .max("NODES".len());
    put(
        out,
        &format!(
            "  {:<w$}  {:<9} {:<10} {:<9} {:<17} {:<n$}  REPORT",
            "CLUSTER", "VERSION", "STATE", "BLOCKER", "SINCE (UTC)", "NODES"
        ),
    );
    if e.clusters.is_empty() {
        put(
            out,
            "  (no clusters listed under [clusters] in drover.toml)",
        );
    }
    for c in &e.clusters {
        match &c.report {
            Some(r) => {
                put(
                    out,
                    &format!(
                        "  {:<w$}  {:<9} {:<10} {:<9} {:<17} {:<n$}  {}",
                        c.name,
                        r.version,
                        r.state,
                        r.blocker.as_deref().unwrap_or("-"),
                        utc_min(&r.since),
                        format!("{}/{}", r.nodes_at_version, r.nodes),
                        // The signer's principal is `<env>/<cluster>` by
                        // definition, so the text shows only the verdict (JSON
                        // carries the principal).
                        c.trust.as_str()
                    ),
                );
                if !r.message.is_empty() {
                    wrap(out, "      ↳ ", &r.message);
                }
                if !r.phases.is_empty() {
                    let phases: Vec<String> =
                        r.phases.iter().map(|(p, n)| format!("{n} {p}")).collect();
                    wrap(out, "      ↳ ", &format!("nodes: {}", phases.join(", ")));
                }
                if let Some(why) = &c.untrusted_reason {
                    wrap(out, "      ↳ ", &format!("untrusted: {why}"));
                }
                wave_line(out, c);
            }
            None => {
                put(
                    out,
                    &format!(
                        "  {:<w$}  {:<9} {:<10} {:<9} {:<17} {:<n$}  -",
                        c.name, "-", "no report", "-", "-", "-"
                    ),
                );
                wave_line(out, c);
            }
        }
    }
}

/// A cluster's wave and what the wave gate holds it on, when it has waves
/// (the gate's words name the wave when it waits).
fn wave_line(out: &mut String, c: &super::model::ClusterView) {
    match (c.wave, &c.waits_on) {
        (Some(_), Some(on)) if on != "halted" => wrap(out, "      ↳ ", on),
        (Some(w), Some(_)) => wrap(out, "      ↳ ", &format!("wave {w}: halted")),
        (Some(w), None) => wrap(out, "      ↳ ", &format!("wave {w}: may start")),
        (None, _) => {}
    }
}

/// The whole fleet as text.
pub fn render(f: &Fleet) -> String {
    let mut out = String::new();
    let branch = super::branch_line(&f.status_branch, "none yet: no reports");
    put(
        &mut out,
        &format!("drover status at {}Z", utc_min(&f.now).replace(' ', "T")),
    );
    put(&mut out, &format!("status branch {branch}"));
    if let Some(c) = &f.config_commit {
        put(
            &mut out,
            &format!("config at commit {c:.12} (in force then)"),
        );
    }
    for e in &f.environments {
        put(&mut out, "");
        env_block(&mut out, e);
    }
    if !f.warnings.is_empty() {
        put(&mut out, "");
        put(&mut out, "warnings:");
        for w in &f.warnings {
            wrap(&mut out, "  - ", w);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::model::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn fleet(message: &str, open: bool) -> Fleet {
        Fleet {
            now: t("2026-12-08T03:00:00Z"),
            config_commit: None,
            status_branch: StatusBranch {
                name: "drover/status".into(),
                refname: Some("refs/heads/drover/status".into()),
                tip: Some("a".repeat(40)),
                cluster_branches: 0,
            },
            environments: vec![EnvView {
                name: "production".into(),
                version: "1.13.2".into(),
                timezone: "America/New_York".into(),
                next_window: Some(WindowView {
                    start: t("2026-12-20T07:00:00Z"),
                    end: t("2026-12-21T01:00:00Z"),
                    start_local: "2026-12-20T02:00:00-05:00".into(),
                    end_local: "2026-12-20T20:00:00-05:00".into(),
                    zone: "EST".into(),
                    open,
                    opened_earlier: false,
                    continues: false,
                }),
                paused: false,
                hold: None,
                freezes: vec![],
                gate: GateView {
                    lower: Some("stage".into()),
                    version: Some("1.13.2".into()),
                    answer: GateAnswer::Refused,
                    after: None,
                    message: "production may not take 1.13.2: stage lists no clusters under [clusters] in drover.toml, so nothing can confirm 1.13.2 there".into(),
                },
                halt: None,
                blocker: Some("pdb".into()),
                clusters: vec![ClusterView {
                    name: "prod-eu-1".into(),
                    report: Some(ReportView {
                        version: "1.13.2".into(),
                        state: "blocked".into(),
                        since: t("2026-12-20T08:00:00Z"),
                        nodes: 120,
                        nodes_at_version: 37,
                        phases: [("draining".to_string(), 2), ("blocked".to_string(), 1)].into(),
                        message: message.into(),
                        blocker: Some("pdb".into()),
                        blockers: Default::default(),
                        config_commit: "b".repeat(40),
                        status_commit: "c".repeat(40),
                    }),
                    trust: Trust::Trusted,
                    signer: Some("production/prod-eu-1".into()),
                    untrusted_reason: None,
                    wave: None,
                    waits_on: None,
                    waits_until: None,
                }],
            }],
            warnings: vec![format!("status/production/prod-eu-1.toml in cccccccccc: {}", "long ".repeat(30))],
        }
    }

    #[test]
    fn fits_80_columns_with_long_messages() {
        let msg = "drain of node ip-10-0-3-17.eu-west-1.compute.internal timed out after 20m: PodDisruptionBudget payments/payments-api allows 0 disruptions (3 of 3 pods required)";
        let text = render(&fleet(msg, false));
        for l in text.lines() {
            assert!(l.chars().count() <= WIDTH, "{l:?}");
        }
        // Wrapped, not cut: every word of the message is there.
        let joined: Vec<&str> = text.split_whitespace().collect();
        for w in msg.split_whitespace() {
            assert!(joined.contains(&w), "{w} missing from\n{text}");
        }
        assert!(
            text.contains(
                "  next window  Sun 2026-12-20 02:00–20:00 EST\n               (2026-12-20 07:00 – 2026-12-21 01:00 UTC)"
            ),
            "{text}"
        );
        assert!(text.contains("37/120  trusted"), "{text}");
        // The nodes' phases, from the report's records, one line.
        assert!(
            text.contains("      ↳ nodes: 1 blocked, 2 draining\n"),
            "{text}"
        );
        assert!(render(&fleet("", true)).contains("  open window  "));
    }
}
