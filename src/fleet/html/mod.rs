//! The timeline page: one self-contained HTML file (inline CSS and SVG, no
//! script, nothing fetched) with a row per cluster grouped by environment:
//! what its nodes ran over time (a bar stacked by version, so a mixed
//! cluster shows the mix), the pinned version as a thin mark above it,
//! waiting (`pending`, `paused`) hatched in the target's colour, `failed` and
//! `blocked` outlined on the nodes they concern, confirmations as marks,
//! promotions as arrows between environments, revocations and refusals as
//! events, windows and freezes as bands, and hover text (SVG `<title>`)
//! naming commits and signers. Nothing is drawn solid past "now". Below
//! it, the same status as a plain table.
//!
//! The drawing can be read back: the `<svg>` carries its time scale
//! (`data-from`, `data-to`, `data-x0`, `data-x1`), each bar's stack is one
//! `rect.nodes` per version, and the legend maps each colour to its version
//! (`rect.legend-version`), so a test recovers from the geometry alone what
//! the page says the nodes ran.
//!
//! The SVG is built with the `svg` crate, which escapes text and attribute
//! content; the few HTML elements around it go through [`esc`].

//!
//! [`layout`] holds the sizes, the time scale and the palette; [`drawing`]
//! draws the timeline, a cluster's row in it by [`row`]; this file makes
//! the page around it.

mod drawing;
mod layout;
mod row;

pub use drawing::svg;
pub use layout::{esc, height, BAR_H, BAR_TOP, LABEL_W, ROW_H, UNKNOWN, WIDTH};

use super::model::{Fleet, Timeline};
use super::text::window_line;
use layout::ts;
use std::fmt::Write as _;

/// `t` with each cluster's row told what its wave waits on, as the fleet
/// view (the wave gate over the verified reports) says.
fn with_waits(t: &Timeline, fleet: &Fleet) -> Timeline {
    let mut t = t.clone();
    for env in &mut t.envs {
        let view = fleet.environments.iter().find(|e| e.name == env.name);
        for row in &mut env.rows {
            row.waits_on = view
                .and_then(|v| v.clusters.iter().find(|c| c.name == row.cluster))
                .and_then(|c| c.waits_on.clone());
        }
    }
    t
}

/// The whole page: title, the timeline and the status table.
pub fn page(title: &str, fleet: &Fleet, t: &Timeline) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #111; background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }}
p.sub {{ margin: 0 0 12px; color: #555; }}
svg.timeline {{ display: block; border: 1px solid #ddd; }}
svg .run:hover rect, svg .confirmation:hover polygon {{ stroke: #000; stroke-width: 2; }}
table {{ border-collapse: collapse; margin-top: 16px; font-size: 13px; }}
th, td {{ border-bottom: 1px solid #e3e3e3; padding: 4px 10px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
td.failed, td.blocked {{ color: #c00; font-weight: bold; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p class="sub">status branch {branch} · generated for {now}</p>
"#,
        title = esc(title),
        branch = esc(&super::branch_line(&fleet.status_branch, "none yet")),
        now = esc(&ts(&fleet.now)),
    );
    let _ = writeln!(out, "{}", svg(&with_waits(t, fleet)));
    out.push_str(
        "<table class=\"status\">\n<tr><th>environment</th><th>pins</th><th>cluster</th><th>state</th><th>since</th><th>nodes</th><th>report</th><th>next window</th><th>gate</th></tr>\n",
    );
    for e in &fleet.environments {
        let window = match (&e.hold, &e.next_window) {
            (Some(h), Some(w)) => format!("{}; next {}", h.message, window_line(w)),
            (Some(h), None) => h.message.clone(),
            (None, Some(w)) => window_line(w),
            (None, None) => "-".to_owned(),
        };
        let n = e.clusters.len().max(1);
        let head = format!(
            "<td rowspan=\"{n}\">{}</td><td rowspan=\"{n}\">{}</td>",
            esc(&e.name),
            esc(&e.version)
        );
        let tail = format!(
            "<td rowspan=\"{n}\">{}</td><td rowspan=\"{n}\">{}</td>",
            esc(&window),
            esc(&e.gate.message)
        );
        if e.clusters.is_empty() {
            let _ = writeln!(
                out,
                "<tr>{head}<td colspan=\"5\">no clusters</td>{tail}</tr>"
            );
        }
        for (i, c) in e.clusters.iter().enumerate() {
            let (state, since, nodes) = match &c.report {
                Some(r) => (
                    match &r.blocker {
                        Some(b) => format!("{} {} · blocker: {b}", r.state, r.version),
                        None => format!("{} {}", r.state, r.version),
                    },
                    ts(&r.since),
                    format!("{}/{}", r.nodes_at_version, r.nodes),
                ),
                None => ("no report".into(), "-".into(), "-".into()),
            };
            let class = c.report.as_ref().map_or("", |r| r.state.as_str());
            let _ = writeln!(
                out,
                "<tr>{}<td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td>{}</tr>",
                if i == 0 { head.as_str() } else { "" },
                esc(&c.name),
                esc(class),
                esc(&state),
                esc(&since),
                esc(&nodes),
                esc(c.signer.as_deref().unwrap_or(c.trust.as_str())),
                if i == 0 { tail.as_str() } else { "" },
            );
        }
    }
    out.push_str("</table>\n</body>\n</html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::model::*;
    use chrono::{DateTime, Utc};

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn report_text_cannot_inject_markup() {
        let evil = "\"><script>alert(1)</script><x a=\"";
        let run = Run {
            start: t("2026-12-01T00:00:00Z"),
            end: t("2026-12-02T00:00:00Z"),
            versions: vec![VersionCount {
                version: Some("1.13.2".into()),
                nodes: 2,
            }],
            state: "failed".into(),
            target: "1.13.2".into(),
            message: evil.into(),
            status_commit: "c".repeat(40),
            trust: Trust::Unverified,
            signer: None,
        };
        let timeline = Timeline {
            from: t("2026-11-30T00:00:00Z"),
            to: t("2026-12-03T00:00:00Z"),
            now: t("2026-12-02T00:00:00Z"),
            envs: vec![TimelineEnv {
                name: "test".into(),
                timezone: "UTC".into(),
                windows: vec![],
                freezes: vec![Band {
                    start: t("2026-12-01T00:00:00Z"),
                    end: t("2026-12-01T06:00:00Z"),
                    label: evil.into(),
                }],
                pins: vec![],
                rows: vec![TimelineRow {
                    cluster: "test-1".into(),
                    reported: true,
                    alarms: vec![Alarm {
                        start: run.start,
                        end: run.end,
                        state: "failed".into(),
                        version: "1.13.2".into(),
                        runs: Some("1.13.2".into()),
                        nodes: vec![evil.into()],
                        count: 1,
                        message: evil.into(),
                    }],
                    runs: vec![run],
                    pending: vec![],
                    confirmations: vec![],
                    wave: Some(2),
                    windows: vec![],
                    waits_on: Some(evil.into()),
                }],
            }],
            promotions: vec![],
            events: vec![Event {
                at: t("2026-12-01T12:00:00Z"),
                kind: EventKind::Revoked,
                env: None,
                cluster: None,
                version: "1.13.2".into(),
                message: evil.into(),
                commit: None,
            }],
        };
        let fleet = Fleet {
            now: timeline.now,
            config_commit: None,
            status_branch: StatusBranch {
                name: evil.into(),
                refname: None,
                tip: None,
                cluster_branches: 0,
            },
            environments: vec![],
            warnings: vec![],
        };
        let page = page(evil, &fleet, &timeline);
        assert!(!page.contains("<script"), "{page}");
        assert!(!page.contains("<x "), "{page}");
        // Control: the text is there, escaped.
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert_eq!(page.matches("class=\"cluster-row\"").count(), 1);
        assert_eq!(page.matches("class=\"freeze\"").count(), 1);
        assert_eq!(page.matches("class=\"alarm\"").count(), 1);
        assert_eq!(page.matches("class=\"event revoked\"").count(), 1);
        // What a wave waits on is drawn escaped too.
        let drawn = svg(&timeline).to_string();
        assert_eq!(drawn.matches("class=\"waits-on\"").count(), 1, "{drawn}");
        assert!(drawn.contains("data-wave=\"2\""), "{drawn}");
        assert!(!drawn.contains("<script"), "{drawn}");
    }
}
