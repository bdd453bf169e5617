//! The timeline as one SVG drawing: the axis, each environment's header,
//! window and freeze bands and rows (a row is `row.rs`), "now", the
//! revocations, refusals and promotions across it, and the legend.

use super::layout::*;
use super::row::cluster_row;
use crate::fleet::model::{Event, EventKind, Timeline, TimelineEnv};
use std::collections::BTreeMap;
use svg::node::element::{
    Definitions, Group, Line, Marker, Path, Pattern, Polygon, Rectangle, Text, Title,
};
use svg::Document;

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
        .set("font-size", 12)
        .set("data-from", rfc3339(&t.from))
        .set("data-to", rfc3339(&t.to))
        .set("data-now", rfc3339(&t.now))
        .set("data-x0", LABEL_W)
        .set("data-x1", WIDTH - RIGHT);
    let mut defs = Definitions::new()
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
        )
        .add(hatch("hatch-unknown", UNKNOWN));
    for (i, c) in colours.values().enumerate() {
        defs = defs.add(hatch(&format!("hatch-{i}"), c));
    }
    doc = doc.add(defs);
    doc = doc.add(axis(t, &scale, h));

    let mut y = AXIS_H;
    // Where each environment's rows are, for the arrows: (top, bottom).
    let mut env_y: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    // Where each cluster's row is, for its events.
    let mut row_y: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    for env in &t.envs {
        for (i, r) in env.rows.iter().enumerate() {
            row_y.insert(
                (env.name.as_str(), r.cluster.as_str()),
                y + ENV_H + i as f64 * ROW_H,
            );
        }
        let (g, bottom) = env_group(env, &scale, y, &colours, t);
        env_y.insert(env.name.as_str(), (y, bottom));
        doc = doc.add(g);
        y = bottom + GAP;
    }
    let bottom = y - GAP;

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
                    .set("y2", bottom)
                    .set("stroke", "#c00")
                    .set("stroke-dasharray", "4 3"),
            )
            .add(
                Text::new("now")
                    .set("x", xn + 3.0)
                    .set("y", AXIS_H - 2.0)
                    .set("font-size", 11)
                    .set("fill", "#c00"),
            ),
    );

    for e in &t.events {
        doc = doc.add(event(e, &scale, &env_y, &row_y, bottom, &colours));
    }

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
        let (y1, y2) = (lower_bottom - 4.0, upper_top + ENV_H + 2.0);
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
                        .set("stroke-width", 1.4)
                        .set("marker-end", "url(#arrow)"),
                ),
        );
    }

    doc.add(legend(&colours, t, h))
}

/// A revocation (across every environment, labelled above the axis), a
/// refused pull request (on its environment's header) or an agent's
/// refusal (on its cluster's row).
pub(super) fn event(
    e: &Event,
    scale: &Scale,
    env_y: &BTreeMap<&str, (f64, f64)>,
    row_y: &BTreeMap<(&str, &str), f64>,
    bottom: f64,
    colours: &Colours,
) -> Group {
    let x = scale.x(e.at);
    let (class, what) = match e.kind {
        EventKind::Revoked => ("event revoked", format!("{} revoked", e.version)),
        EventKind::RefusedPullRequest => (
            "event refused-pr",
            format!("pull request for {} refused", e.version),
        ),
        EventKind::Refused => ("event refused", format!("{} refused", e.version)),
    };
    let whom = match (&e.env, &e.cluster) {
        (Some(env), Some(c)) => format!("{env}/{c}: "),
        (Some(env), None) => format!("{env}: "),
        _ => String::new(),
    };
    let commit = e
        .commit
        .as_deref()
        .map(|c| format!("\ncommit {}", short(c)))
        .unwrap_or_default();
    let mut g = Group::new()
        .set("class", class)
        .set("data-version", attr(&e.version))
        .set("data-at", rfc3339(&e.at))
        .add(Title::new(format!(
            "{whom}{what} at {}: {}{commit}",
            ts(&e.at),
            e.message
        )));
    let cross = |cx: f64, cy: f64, r: f64, colour: &str| {
        Path::new()
            .set(
                "d",
                format!(
                    "M{:.1},{:.1} L{:.1},{:.1} M{:.1},{:.1} L{:.1},{:.1}",
                    cx - r,
                    cy - r,
                    cx + r,
                    cy + r,
                    cx - r,
                    cy + r,
                    cx + r,
                    cy - r
                ),
            )
            .set("stroke", colour.to_owned())
            .set("stroke-width", 2.5)
    };
    match e.kind {
        EventKind::Revoked => {
            g = g
                .add(
                    Line::new()
                        .set("x1", x)
                        .set("x2", x)
                        .set("y1", 26)
                        .set("y2", bottom)
                        .set("stroke", "#b00")
                        .set("stroke-width", 1.2)
                        .set("stroke-dasharray", "2 3"),
                )
                .add(cross(x, 30.0, 4.0, "#b00"))
                .add(
                    Text::new(what)
                        .set("x", x + 7.0)
                        .set("y", 34)
                        .set("font-size", 11)
                        .set("fill", "#b00"),
                );
        }
        EventKind::RefusedPullRequest => {
            let top = e
                .env
                .as_deref()
                .and_then(|env| env_y.get(env))
                .map_or(AXIS_H, |(top, _)| *top);
            g = g.add(
                Polygon::new()
                    .set(
                        "points",
                        format!(
                            "{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
                            x,
                            top + 20.0,
                            x - 6.0,
                            top + 8.0,
                            x + 6.0,
                            top + 8.0
                        ),
                    )
                    .set("fill", colour_of(colours, Some(&e.version)))
                    .set("stroke", "#b00")
                    .set("stroke-width", 1.5),
            );
        }
        EventKind::Refused => {
            let key = (
                e.env.as_deref().unwrap_or_default(),
                e.cluster.as_deref().unwrap_or_default(),
            );
            let y = row_y.get(&key).copied().unwrap_or(AXIS_H);
            g = g.add(cross(x, y + BAR_TOP + BAR_H / 2.0, 5.0, "#b00"));
        }
    }
    g
}

/// Day ticks and date labels along the top.
pub(super) fn axis(t: &Timeline, scale: &Scale, h: f64) -> Group {
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
pub(super) fn env_group(
    env: &TimelineEnv,
    scale: &Scale,
    top: f64,
    colours: &Colours,
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
    // A wave with a window of its own (prod-us at night in New York) has
    // its bands on its own row; the other rows keep the environment's.
    if env.rows.iter().all(|r| r.windows.is_empty()) {
        for w in &env.windows {
            g = g.add(window_band(w, scale, top + 2.0, bottom - top - 4.0));
        }
    } else {
        for (i, r) in env.rows.iter().enumerate() {
            let y = top + ENV_H + i as f64 * ROW_H;
            let own = if r.windows.is_empty() {
                &env.windows
            } else {
                &r.windows
            };
            for w in own {
                g = g.add(window_band(w, scale, y + 1.0, ROW_H - 2.0));
            }
        }
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
        g = g.add(cluster_row(env, r, scale, y, colours, t));
    }
    (g, bottom)
}

/// A window as a band from `y`, `height` high.
pub(super) fn window_band(
    w: &crate::fleet::model::Band,
    scale: &Scale,
    y: f64,
    height: f64,
) -> Group {
    let (x1, x2) = (scale.x(w.start), scale.x(w.end));
    Group::new()
        .set("class", "window")
        .add(Title::new(w.label.clone()))
        .add(
            Rectangle::new()
                .set("x", x1)
                .set("y", y)
                .set("width", (x2 - x1).max(2.0))
                .set("height", height)
                .set("fill", "#2b8a3e")
                .set("fill-opacity", 0.16)
                .set("stroke", "#2b8a3e")
                .set("stroke-opacity", 0.5),
        )
}

pub(super) fn legend(colours: &Colours, t: &Timeline, h: f64) -> Group {
    let y = h - LEGEND_H + 10.0;
    let mut g = Group::new().set("class", "legend");
    let mut x = 8.0;
    let unknown = t.envs.iter().any(|e| {
        e.rows.iter().any(|r| {
            r.runs
                .iter()
                .any(|run| run.versions.iter().any(|c| c.version.is_none()))
        })
    });
    let versions = colours
        .iter()
        .map(|(v, c)| (v.to_string(), *c))
        .chain(unknown.then(|| ("unknown".to_owned(), UNKNOWN)));
    for (v, c) in versions {
        g = g
            .add(
                Rectangle::new()
                    .set("class", "legend-version")
                    .set("data-version", attr(&v))
                    .set("x", x)
                    .set("y", y)
                    .set("width", 14)
                    .set("height", 14)
                    .set("fill", c),
            )
            .add(Text::new(v.clone()).set("x", x + 18.0).set("y", y + 11.0));
        x += 30.0 + v.chars().count() as f64 * 7.0;
    }
    let y = y + 22.0;
    let mut x = 8.0;
    let items: [(&str, &str, &str); 4] = [
        ("window", "#2b8a3ea0", "#999"),
        ("freeze", "url(#freeze)", "#999"),
        (
            "waiting for a version (pending, paused)",
            "url(#hatch-unknown)",
            "#999",
        ),
        ("failed / blocked nodes", "none", "#c00"),
    ];
    for (label, fill, stroke) in items {
        g = g
            .add(
                Rectangle::new()
                    .set("x", x)
                    .set("y", y)
                    .set("width", 14)
                    .set("height", 14)
                    .set("fill", fill)
                    .set("stroke", stroke)
                    .set("stroke-width", if stroke == "#c00" { 2.5 } else { 1.0 }),
            )
            .add(Text::new(label).set("x", x + 18.0).set("y", y + 11.0));
        x += 34.0 + label.chars().count() as f64 * 6.6;
    }
    g.add(
        Text::new("▬ pinned version (dashed: ahead of now)   ◇ confirmed   → promotion   ✕ revoked / refused")
            .set("x", x)
            .set("y", y + 11.0),
    )
}
