//! The timeline page: one self-contained HTML file (inline CSS and SVG, no
//! script, nothing fetched) with a row per cluster grouped by environment,
//! windows and freezes as bands, each version a colour with its label,
//! confirmations as marks, promotions as arrows between environments,
//! `failed`/`blocked` highlighted, and hover text (SVG `<title>`) naming
//! commits and signers. Below it, the same status as a plain table.
//!
//! The SVG is built with the `svg` crate, which escapes text and attribute
//! content; the few HTML elements around it go through [`esc`].

use super::model::{Fleet, Segment, Timeline, TimelineEnv, Trust};
use super::text::window_line;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use svg::node::element::{
    Definitions, Group, Line, Marker, Path, Pattern, Polygon, Rectangle, Text, Title,
};
use svg::Document;

/// Width of the drawing in CSS pixels.
pub const WIDTH: f64 = 1200.0;
const LABEL_W: f64 = 190.0;
const RIGHT: f64 = 20.0;
const AXIS_H: f64 = 46.0;
const ENV_H: f64 = 26.0;
const ROW_H: f64 = 30.0;
const GAP: f64 = 14.0;
const LEGEND_H: f64 = 40.0;

/// Version colours, in version order (colour-blind-safe Okabe–Ito first).
const PALETTE: [&str; 10] = [
    "#56b4e9", "#e69f00", "#009e73", "#cc79a7", "#0072b2", "#d55e00", "#f0e442", "#999999",
    "#8c564b", "#17becf",
];

/// Escape text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// An attribute value the `svg` crate writes between double quotes: it
/// escapes `&`, `<` and `>` but not the quote itself.
fn attr(s: &str) -> String {
    s.replace('"', "'")
}

fn short(commit: &str) -> &str {
    commit.get(..10).unwrap_or(commit)
}

fn ts(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// Maps time to x.
struct Scale {
    from: DateTime<Utc>,
    secs: f64,
}

impl Scale {
    fn x(&self, t: DateTime<Utc>) -> f64 {
        let f = (t - self.from).num_seconds() as f64 / self.secs;
        LABEL_W + f.clamp(0.0, 1.0) * (WIDTH - LABEL_W - RIGHT)
    }
}

/// Every version shown, in version order, with its colour.
fn colours(t: &Timeline) -> BTreeMap<semver::Version, &'static str> {
    let mut versions: Vec<semver::Version> = Vec::new();
    for e in &t.envs {
        for r in &e.rows {
            for v in r
                .segments
                .iter()
                .map(|s| s.version.as_str())
                .chain(r.initial_version.as_deref())
            {
                if let Ok(v) = semver::Version::parse(v) {
                    versions.push(v);
                }
            }
        }
    }
    for p in &t.promotions {
        if let Ok(v) = semver::Version::parse(&p.version) {
            versions.push(v);
        }
    }
    versions.sort();
    versions.dedup();
    versions
        .into_iter()
        .enumerate()
        .map(|(i, v)| (v, PALETTE[i % PALETTE.len()]))
        .collect()
}

fn colour_of(c: &BTreeMap<semver::Version, &'static str>, v: &str) -> &'static str {
    semver::Version::parse(v)
        .ok()
        .and_then(|v| c.get(&v).copied())
        .unwrap_or("#bbbbbb")
}

/// Height of the drawing for a timeline.
pub fn height(t: &Timeline) -> f64 {
    let rows: usize = t.envs.iter().map(|e| e.rows.len().max(1)).sum();
    AXIS_H + t.envs.len() as f64 * (ENV_H + GAP) + rows as f64 * ROW_H + LEGEND_H
}

/// The timeline as an SVG document.
pub fn svg(t: &Timeline) -> Document {
    let h = height(t);
    let scale = Scale {
        from: t.from,
        secs: ((t.to - t.from).num_seconds().max(1)) as f64,
    };
    let colours = colours(t);
    let mut doc = Document::new()
        .set("viewBox", (0, 0, WIDTH, h))
        .set("width", WIDTH)
        .set("height", h)
        .set("class", "timeline")
        .set("role", "img")
        .set("font-family", "sans-serif")
        .set("font-size", 12);
    doc = doc.add(
        Definitions::new()
            .add(
                Marker::new()
                    .set("id", "arrow")
                    .set("viewBox", "0 0 10 10")
                    .set("refX", 9)
                    .set("refY", 5)
                    .set("markerWidth", 8)
                    .set("markerHeight", 8)
                    .set("orient", "auto-start-reverse")
                    .add(
                        Path::new()
                            .set("d", "M0,0 L10,5 L0,10 z")
                            .set("fill", "#333"),
                    ),
            )
            .add(
                Pattern::new()
                    .set("id", "freeze")
                    .set("width", 8)
                    .set("height", 8)
                    .set("patternUnits", "userSpaceOnUse")
                    .set("patternTransform", "rotate(45)")
                    .add(
                        Rectangle::new()
                            .set("width", 4)
                            .set("height", 8)
                            .set("fill", "#9aa5b1")
                            .set("fill-opacity", 0.45),
                    ),
            ),
    );
    doc = doc.add(axis(t, &scale, h));

    let mut y = AXIS_H;
    // Where each environment's rows are, for the arrows: (top, bottom).
    let mut env_y: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for env in &t.envs {
        let (g, bottom) = env_group(env, &scale, y, &colours, t);
        env_y.insert(env.name.as_str(), (y + ENV_H, bottom));
        doc = doc.add(g);
        y = bottom + GAP;
    }

    // Now.
    let xn = scale.x(t.now);
    doc = doc.add(
        Group::new()
            .set("class", "now")
            .add(Title::new(format!("now: {}", ts(&t.now))))
            .add(
                Line::new()
                    .set("x1", xn)
                    .set("x2", xn)
                    .set("y1", AXIS_H - 8.0)
                    .set("y2", y - GAP)
                    .set("stroke", "#c00")
                    .set("stroke-dasharray", "4 3"),
            )
            .add(
                Text::new("now")
                    .set("x", xn + 3.0)
                    .set("y", AXIS_H - 10.0)
                    .set("fill", "#c00"),
            ),
    );

    // Promotions: from the lower environment's evidence to the change.
    for p in &t.promotions {
        let (Some(&(_, lower_bottom)), Some(&(upper_top, _))) =
            (env_y.get(p.from_env.as_str()), env_y.get(p.to_env.as_str()))
        else {
            continue;
        };
        let x2 = scale.x(p.at);
        let x1 = p.from_at.map_or(x2, |t0| scale.x(t0));
        // Environments are drawn lowest first, so the arrow runs downwards
        // from the bottom of the lower environment to the top of the upper.
        let (y1, y2) = (lower_bottom - 4.0, upper_top + 2.0);
        let signer = p.signer.as_deref().unwrap_or("not verified");
        let pr = p.pr.map(|n| format!(" (PR #{n})")).unwrap_or_default();
        let evidence = match p.from_at {
            Some(t0) => format!("{} confirmed {} at {}", p.from_env, p.version, ts(&t0)),
            None => format!("no confirmation by {} before the change", p.from_env),
        };
        let title = format!(
            "{} → {}: {} {} → {}{pr}\ncommit {} by {}, signer {signer}\n{evidence}",
            p.from_env,
            p.to_env,
            p.to_env,
            p.previous.as_deref().unwrap_or("(new)"),
            p.version,
            short(&p.commit),
            p.author,
        );
        doc = doc.add(
            Group::new()
                .set("class", "promotion")
                .set("data-version", attr(&p.version))
                .add(Title::new(title))
                .add(
                    Path::new()
                        .set(
                            "d",
                            format!(
                                "M{x1:.1},{y1:.1} C{x1:.1},{:.1} {x2:.1},{:.1} {x2:.1},{y2:.1}",
                                (y1 + y2) / 2.0,
                                (y1 + y2) / 2.0
                            ),
                        )
                        .set("fill", "none")
                        .set("stroke", "#333")
                        .set("stroke-width", 1.6)
                        .set("marker-end", "url(#arrow)"),
                )
                .add(
                    Text::new(p.version.clone())
                        .set("x", x2 + 4.0)
                        .set("y", y2 - 6.0)
                        .set("font-size", 11)
                        .set("fill", "#333"),
                ),
        );
    }

    doc.add(legend(&colours, h))
}

/// Day ticks and date labels along the top.
fn axis(t: &Timeline, scale: &Scale, h: f64) -> Group {
    let mut g = Group::new().set("class", "axis");
    let days = (t.to - t.from).num_days().max(1);
    let step = match days {
        0..=20 => 1,
        21..=60 => 2,
        61..=120 => 7,
        _ => 30,
    };
    let mut day = t.from.date_naive();
    let end = t.to.date_naive();
    let mut i = 0;
    while day <= end {
        let Some(at) = day.and_hms_opt(0, 0, 0).map(|d| d.and_utc()) else {
            break;
        };
        if at >= t.from {
            let x = scale.x(at);
            let major = i % step == 0;
            g = g.add(
                Line::new()
                    .set("x1", x)
                    .set("x2", x)
                    .set("y1", AXIS_H - if major { 12.0 } else { 6.0 })
                    .set("y2", h - LEGEND_H)
                    .set("stroke", if major { "#ddd" } else { "#f2f2f2" }),
            );
            if major {
                g = g.add(
                    Text::new(day.format("%b %-d").to_string())
                        .set("x", x + 2.0)
                        .set("y", AXIS_H - 16.0)
                        .set("fill", "#555")
                        .set("font-size", 11),
                );
            }
            i += 1;
        }
        let Some(next) = day.succ_opt() else { break };
        day = next;
    }
    g.add(
        Text::new(format!("{} – {}", ts(&t.from), ts(&t.to)))
            .set("x", 8)
            .set("y", 16)
            .set("fill", "#333")
            .set("font-weight", "bold"),
    )
}

/// One environment: its header, its bands and its cluster rows. Returns the group and its bottom.
fn env_group(
    env: &TimelineEnv,
    scale: &Scale,
    top: f64,
    colours: &BTreeMap<semver::Version, &'static str>,
    t: &Timeline,
) -> (Group, f64) {
    let rows = env.rows.len().max(1) as f64;
    let bottom = top + ENV_H + rows * ROW_H;
    let mut g = Group::new()
        .set("class", "env")
        .set("data-env", attr(&env.name));
    g = g.add(
        Rectangle::new()
            .set("x", 0)
            .set("y", top)
            .set("width", WIDTH)
            .set("height", bottom - top)
            .set("fill", "#fafafa")
            .set("stroke", "#e3e3e3"),
    );
    g = g.add(
        Text::new(format!("{}  ({})", env.name, env.timezone))
            .set("x", 8)
            .set("y", top + 17.0)
            .set("font-weight", "bold")
            .set("font-size", 13),
    );
    for w in &env.windows {
        let (x1, x2) = (scale.x(w.start), scale.x(w.end));
        g = g.add(
            Group::new()
                .set("class", "window")
                .add(Title::new(w.label.clone()))
                .add(
                    Rectangle::new()
                        .set("x", x1)
                        .set("y", top + 2.0)
                        .set("width", (x2 - x1).max(2.0))
                        .set("height", bottom - top - 4.0)
                        .set("fill", "#2b8a3e")
                        .set("fill-opacity", 0.16)
                        .set("stroke", "#2b8a3e")
                        .set("stroke-opacity", 0.5),
                ),
        );
    }
    for f in &env.freezes {
        let (x1, x2) = (scale.x(f.start), scale.x(f.end));
        g = g.add(
            Group::new()
                .set("class", "freeze")
                .add(Title::new(f.label.clone()))
                .add(
                    Rectangle::new()
                        .set("x", x1)
                        .set("y", top + 2.0)
                        .set("width", (x2 - x1).max(2.0))
                        .set("height", bottom - top - 4.0)
                        .set("fill", "url(#freeze)"),
                ),
        );
    }
    if env.rows.is_empty() {
        g = g.add(
            Text::new("no clusters listed")
                .set("x", LABEL_W)
                .set("y", top + ENV_H + 19.0)
                .set("fill", "#777"),
        );
    }
    for (i, r) in env.rows.iter().enumerate() {
        let y = top + ENV_H + i as f64 * ROW_H;
        let mut row = Group::new()
            .set("class", "cluster-row")
            .set("data-env", attr(&env.name))
            .set("data-cluster", attr(&r.cluster));
        row = row.add(
            Text::new(r.cluster.clone())
                .set("x", 20)
                .set("y", y + 19.0)
                .set("class", "cluster-name"),
        );
        if let (Some(v), Some(first)) = (&r.initial_version, r.segments.first()) {
            row = row.add(bar(
                scale.x(t.from),
                scale.x(first.start),
                y,
                colour_of(colours, v),
                &format!("{}: {v} before the first report shown", r.cluster),
                "",
                false,
            ));
        }
        for s in &r.segments {
            row = row.add(segment(s, &r.cluster, scale, y, colours));
        }
        for m in &r.confirmations {
            let x = scale.x(m.at);
            let cy = y + ROW_H / 2.0;
            let signer = m.signer.as_deref().unwrap_or(trust_word(m.trust));
            row = row.add(
                Group::new()
                    .set("class", "confirmation")
                    .add(Title::new(format!(
                        "{} confirmed {} at {}\nstatus commit {}, signer {signer}",
                        r.cluster,
                        m.version,
                        ts(&m.at),
                        short(&m.status_commit)
                    )))
                    .add(
                        Polygon::new()
                            .set(
                                "points",
                                format!(
                                    "{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
                                    x,
                                    cy - 8.0,
                                    x + 6.0,
                                    cy,
                                    x,
                                    cy + 8.0,
                                    x - 6.0,
                                    cy
                                ),
                            )
                            .set("fill", "#fff")
                            .set("stroke", "#111")
                            .set("stroke-width", 1.5),
                    ),
            );
        }
        g = g.add(row);
    }
    (g, bottom)
}

fn trust_word(t: Trust) -> &'static str {
    match t {
        Trust::Trusted => "trusted",
        Trust::Untrusted => "untrusted (ignored by the gate)",
        Trust::Unverified => "not verified",
        Trust::None => "none",
    }
}

fn bar(x1: f64, x2: f64, y: f64, fill: &str, title: &str, label: &str, alarm: bool) -> Group {
    let w = (x2 - x1).max(1.0);
    let mut g = Group::new()
        .set("class", if alarm { "segment alarm" } else { "segment" })
        .add(Title::new(title.to_owned()))
        .add(
            Rectangle::new()
                .set("x", x1)
                .set("y", y + 6.0)
                .set("width", w)
                .set("height", ROW_H - 12.0)
                .set("rx", 3)
                .set("fill", fill.to_owned())
                .set("stroke", if alarm { "#c00" } else { "#ffffff" })
                .set("stroke-width", if alarm { 3 } else { 1 }),
        );
    // A label only where it fits (about 7 px per character).
    if !label.is_empty() && w > label.chars().count() as f64 * 7.0 + 10.0 {
        g = g.add(
            Text::new(label.to_owned())
                .set("x", x1 + 8.0)
                .set("y", y + 19.0)
                .set("fill", "#111")
                .set("font-size", 11),
        );
    }
    g
}

fn segment(
    s: &Segment,
    cluster: &str,
    scale: &Scale,
    y: f64,
    colours: &BTreeMap<semver::Version, &'static str>,
) -> Group {
    let alarm = matches!(s.state.as_str(), "failed" | "blocked");
    let signer = s.signer.as_deref().unwrap_or(trust_word(s.trust));
    let mut title = format!(
        "{cluster}: {} {} ({}/{} nodes at version) from {}\nstatus commit {}, signer {signer}",
        s.state,
        s.version,
        s.nodes_at_version,
        s.nodes,
        ts(&s.start),
        short(&s.status_commit),
    );
    if !s.message.is_empty() {
        let _ = write!(title, "\n{}", s.message);
    }
    let label = if alarm {
        format!("{} {}", s.state.to_uppercase(), s.version)
    } else {
        s.version.clone()
    };
    bar(
        scale.x(s.start),
        scale.x(s.end),
        y,
        colour_of(colours, &s.version),
        &title,
        &label,
        alarm,
    )
}

fn legend(colours: &BTreeMap<semver::Version, &'static str>, h: f64) -> Group {
    let y = h - LEGEND_H + 14.0;
    let mut g = Group::new().set("class", "legend");
    let mut x = 8.0;
    for (v, c) in colours {
        g = g
            .add(
                Rectangle::new()
                    .set("x", x)
                    .set("y", y)
                    .set("width", 14)
                    .set("height", 14)
                    .set("fill", *c),
            )
            .add(
                Text::new(v.to_string())
                    .set("x", x + 18.0)
                    .set("y", y + 11.0),
            );
        x += 80.0;
    }
    let items: [(&str, &str); 4] = [
        ("window", "#2b8a3ea0"),
        ("freeze", "url(#freeze)"),
        ("failed / blocked", "#ffffff"),
        ("◇ confirmed, → promotion", ""),
    ];
    for (label, fill) in items {
        if !fill.is_empty() {
            g = g.add(
                Rectangle::new()
                    .set("x", x)
                    .set("y", y)
                    .set("width", 14)
                    .set("height", 14)
                    .set("fill", fill)
                    .set(
                        "stroke",
                        if label.starts_with("failed") {
                            "#c00"
                        } else {
                            "#999"
                        },
                    )
                    .set(
                        "stroke-width",
                        if label.starts_with("failed") { 3 } else { 1 },
                    ),
            );
        }
        g = g.add(Text::new(label).set("x", x + 18.0).set("y", y + 11.0));
        x += 40.0 + label.chars().count() as f64 * 7.0;
    }
    g
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
svg .segment:hover rect, svg .confirmation:hover polygon {{ stroke: #000; stroke-width: 2; }}
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
        branch = esc(&super::branch_line(&fleet.status_branch, "not found")),
        now = esc(&ts(&fleet.now)),
    );
    let _ = writeln!(out, "{}", svg(t));
    out.push_str(
        "<table class=\"status\">\n<tr><th>environment</th><th>pins</th><th>cluster</th><th>state</th><th>since</th><th>nodes</th><th>report</th><th>next window</th><th>gate</th></tr>\n",
    );
    for e in &fleet.environments {
        let window = e
            .next_window
            .as_ref()
            .map_or_else(|| "-".to_owned(), window_line);
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
                    format!("{} {}", r.state, r.version),
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

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn report_text_cannot_inject_markup() {
        let evil = "\"><script>alert(1)</script><x a=\"";
        let seg = Segment {
            start: t("2026-12-01T00:00:00Z"),
            end: t("2026-12-02T00:00:00Z"),
            version: "1.13.2".into(),
            state: "failed".into(),
            nodes_at_version: 1,
            nodes: 2,
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
                rows: vec![TimelineRow {
                    cluster: "test-1".into(),
                    initial_version: None,
                    segments: vec![seg],
                    confirmations: vec![],
                }],
            }],
            promotions: vec![],
        };
        let fleet = Fleet {
            now: timeline.now,
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
    }
}
