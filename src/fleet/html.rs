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

use super::model::{
    Alarm, Event, EventKind, Fleet, Run, Timeline, TimelineEnv, TimelineRow, Trust,
};
use super::text::window_line;
use chrono::{DateTime, SecondsFormat, Utc};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use svg::node::element::{
    Definitions, Group, Line, Marker, Path, Pattern, Polygon, Rectangle, Text, Title,
};
use svg::Document;

/// Width of the drawing in CSS pixels.
pub const WIDTH: f64 = 1200.0;
/// Left edge of the time axis (the cluster names are left of it).
pub const LABEL_W: f64 = 190.0;
const RIGHT: f64 = 20.0;
const AXIS_H: f64 = 64.0;
const ENV_H: f64 = 26.0;
/// Height of one cluster's row.
pub const ROW_H: f64 = 34.0;
/// Where a row's bar starts below the row's top, and how tall it is: the
/// stacked versions share it in proportion to their nodes.
pub const BAR_TOP: f64 = 12.0;
/// Height of a row's bar.
pub const BAR_H: f64 = 18.0;
const GAP: f64 = 14.0;
const LEGEND_H: f64 = 52.0;
/// Colour of nodes whose version no report says.
pub const UNKNOWN: &str = "#bbbbbb";

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

fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
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
    let mut add = |v: &str| {
        if let Ok(v) = semver::Version::parse(v) {
            versions.push(v);
        }
    };
    for e in &t.envs {
        e.pins.iter().for_each(|p| add(&p.version));
        for r in &e.rows {
            for run in &r.runs {
                run.versions
                    .iter()
                    .filter_map(|c| c.version.as_deref())
                    .for_each(&mut add);
            }
            r.pending.iter().for_each(|p| add(&p.version));
        }
    }
    t.promotions.iter().for_each(|p| add(&p.version));
    t.events.iter().for_each(|e| add(&e.version));
    versions.sort();
    versions.dedup();
    versions
        .into_iter()
        .enumerate()
        .map(|(i, v)| (v, PALETTE[i % PALETTE.len()]))
        .collect()
}

type Colours = BTreeMap<semver::Version, &'static str>;

fn colour_of(c: &Colours, v: Option<&str>) -> &'static str {
    v.and_then(|v| semver::Version::parse(v).ok())
        .and_then(|v| c.get(&v).copied())
        .unwrap_or(UNKNOWN)
}

/// The hatch pattern of a version's colour (waiting for it).
fn hatch_id(c: &Colours, v: &str) -> String {
    let i = semver::Version::parse(v)
        .ok()
        .and_then(|v| c.keys().position(|k| *k == v))
        .map_or_else(|| "unknown".to_owned(), |i| i.to_string());
    format!("hatch-{i}")
}

/// Height of the drawing for a timeline.
pub fn height(t: &Timeline) -> f64 {
    let rows: usize = t.envs.iter().map(|e| e.rows.len().max(1)).sum();
    AXIS_H + t.envs.len() as f64 * (ENV_H + GAP) + rows as f64 * ROW_H + LEGEND_H
}

fn hatch(id: &str, colour: &str) -> Pattern {
    Pattern::new()
        .set("id", id.to_owned())
        .set("width", 6)
        .set("height", 6)
        .set("patternUnits", "userSpaceOnUse")
        .set("patternTransform", "rotate(45)")
        .add(
            Rectangle::new()
                .set("width", 3)
                .set("height", 6)
                .set("fill", colour.to_owned()),
        )
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
fn event(
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
fn window_band(w: &super::model::Band, scale: &Scale, y: f64, height: f64) -> Group {
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

/// One cluster's row: its pin, what it waited for, what its nodes ran, its
/// alarms and confirmations.
fn cluster_row(
    env: &TimelineEnv,
    r: &TimelineRow,
    scale: &Scale,
    y: f64,
    colours: &Colours,
    t: &Timeline,
) -> Group {
    let mut row = Group::new()
        .set("class", "cluster-row")
        .set("data-env", attr(&env.name))
        .set("data-cluster", attr(&r.cluster))
        .set("data-y", y);
    let label = match r.wave {
        Some(w) => format!("{}  · wave {w}", r.cluster),
        None => r.cluster.clone(),
    };
    row = row.add(
        Text::new(label)
            .set("x", 20)
            .set("y", y + BAR_TOP + 13.0)
            .set("class", "cluster-name"),
    );
    if let Some(w) = r.wave {
        row = row.set("data-wave", w);
    }
    // What the wave waits on, right of "now" where the wait is.
    if let Some(why) = &r.waits_on {
        let x = scale.x(t.now) + 4.0;
        let room = ((WIDTH - RIGHT - x) / 6.0).max(0.0) as usize;
        let shown: String = if why.chars().count() > room {
            let mut s: String = why.chars().take(room.saturating_sub(1)).collect();
            s.push('…');
            s
        } else {
            why.clone()
        };
        row = row.add(
            Group::new()
                .set("class", "waits-on")
                .add(Title::new(format!("{}: {why}", r.cluster)))
                .add(
                    Text::new(shown)
                        .set("x", x)
                        .set("y", y + BAR_TOP + 13.0)
                        .set("font-size", 11)
                        .set("fill", "#555"),
                ),
        );
    }
    for p in &env.pins {
        row = row.add(pin(p, &env.name, scale, y, colours, t.now));
    }
    if !r.reported {
        row = row.add(
            Text::new(format!(
                "no report yet: the agent of {} has never reported",
                r.cluster
            ))
            .set("class", "no-report")
            .set("x", LABEL_W + 8.0)
            .set("y", y + BAR_TOP + 13.0)
            .set("fill", "#777")
            .set("font-style", "italic"),
        );
    }
    for w in &r.pending {
        let (x1, x2) = (scale.x(w.start), scale.x(w.end));
        let mut title = format!(
            "{}: {} {} from {} (waiting; nodes not yet moving)",
            r.cluster,
            w.state,
            w.version,
            ts(&w.start)
        );
        if !w.message.is_empty() {
            let _ = write!(title, "\n{}", w.message);
        }
        row = row.add(
            Group::new()
                .set("class", "pending")
                .set("data-version", attr(&w.version))
                .add(Title::new(title))
                .add(
                    Rectangle::new()
                        .set("x", x1)
                        .set("y", y + 1.0)
                        .set("width", (x2 - x1).max(1.0))
                        .set("height", BAR_TOP - 3.0)
                        .set("fill", format!("url(#{})", hatch_id(colours, &w.version)))
                        .set("stroke", colour_of(colours, Some(&w.version)))
                        .set("stroke-width", 0.6),
                ),
        );
    }
    for run in &r.runs {
        row = row.add(run_bar(run, &r.cluster, scale, y, colours));
    }
    for a in &r.alarms {
        if let Some(run) = r.runs.iter().find(|run| run.start == a.start) {
            row = row.add(alarm(a, run, &r.cluster, scale, y));
        }
    }
    for m in &r.confirmations {
        let x = scale.x(m.at);
        let cy = y + BAR_TOP + BAR_H / 2.0;
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
    row
}

/// The pinned version over a stretch: solid up to now, dashed after (it
/// is configuration, not what runs).
fn pin(
    p: &super::model::Pin,
    env: &str,
    scale: &Scale,
    y: f64,
    colours: &Colours,
    now: DateTime<Utc>,
) -> Group {
    let colour = colour_of(colours, Some(&p.version));
    let ly = y + 4.5;
    let mut g = Group::new()
        .set("class", "pin")
        .set("data-version", attr(&p.version))
        .add(Title::new(format!(
            "{env} pins {} from {} (commit {})",
            p.version,
            ts(&p.start),
            short(&p.commit)
        )));
    let mid = now.max(p.start).min(p.end.max(p.start));
    if p.start < mid {
        g = g.add(
            Line::new()
                .set("x1", scale.x(p.start))
                .set("x2", scale.x(mid))
                .set("y1", ly)
                .set("y2", ly)
                .set("stroke", colour)
                .set("stroke-width", 3),
        );
    }
    if mid < p.end {
        g = g.add(
            Line::new()
                .set("x1", scale.x(mid))
                .set("x2", scale.x(p.end))
                .set("y1", ly)
                .set("y2", ly)
                .set("stroke", colour)
                .set("stroke-width", 3)
                .set("stroke-dasharray", "3 4"),
        );
    }
    // The pin's version at its start, where it fits.
    if scale.x(p.end) - scale.x(p.start) < 40.0 {
        return g;
    }
    g.add(
        Text::new(p.version.clone())
            .set("x", scale.x(p.start) + 2.0)
            .set("y", y + 10.5)
            .set("font-size", 8)
            .set("fill", "#444"),
    )
}

fn trust_word(t: Trust) -> &'static str {
    match t {
        Trust::Trusted => "trusted",
        Trust::Untrusted => "untrusted (ignored by the gate)",
        Trust::Unverified => "not verified",
        Trust::None => "none",
    }
}

/// One report's stretch: a bar stacked by version, oldest at the bottom,
/// each version's height in proportion to its nodes.
fn run_bar(run: &Run, cluster: &str, scale: &Scale, y: f64, colours: &Colours) -> Group {
    let (x1, x2) = (scale.x(run.start), scale.x(run.end));
    let w = (x2 - x1).max(1.0);
    let total: u32 = run.versions.iter().map(|c| c.nodes).sum();
    let signer = run.signer.as_deref().unwrap_or(trust_word(run.trust));
    let mix = run
        .versions
        .iter()
        .map(|c| format!("{} {}", c.nodes, c.version.as_deref().unwrap_or("unknown")))
        .collect::<Vec<_>>()
        .join(", ");
    let mut title = format!(
        "{cluster}: {} {} from {}\nnodes run {mix}\nstatus commit {}, signer {signer}",
        run.state,
        run.target,
        ts(&run.start),
        short(&run.status_commit),
    );
    if !run.message.is_empty() {
        let _ = write!(title, "\n{}", run.message);
    }
    let mut g = Group::new()
        .set("class", "run")
        .set("data-state", attr(&run.state))
        .add(Title::new(title));
    let mut bottom = y + BAR_TOP + BAR_H;
    let mut widest: Option<(f64, f64, &str)> = None;
    for c in &run.versions {
        let h = BAR_H * f64::from(c.nodes) / f64::from(total.max(1));
        bottom -= h;
        g = g.add(
            Rectangle::new()
                .set("class", "nodes")
                .set(
                    "data-version",
                    attr(c.version.as_deref().unwrap_or("unknown")),
                )
                .set("data-nodes", c.nodes)
                .set("x", x1)
                .set("y", bottom)
                .set("width", w)
                .set("height", h)
                .set("fill", colour_of(colours, c.version.as_deref())),
        );
        if widest.is_none_or(|(wh, _, _)| h > wh) {
            widest = Some((h, bottom, c.version.as_deref().unwrap_or("unknown")));
        }
    }
    // The main version's label where it fits (about 7 px per character).
    if let Some((h, top, v)) = widest {
        let label = if run.versions.len() > 1 {
            format!("{v} (mixed)")
        } else {
            v.to_owned()
        };
        if h >= 10.0 && w > label.chars().count() as f64 * 6.5 + 10.0 {
            g = g.add(
                Text::new(label)
                    .set("x", x1 + 6.0)
                    .set("y", top + h / 2.0 + 4.0)
                    .set("fill", "#111")
                    .set("font-size", 10),
            );
        }
    }
    g
}

/// A red outline on the nodes a `failed` or `blocked` report concerns: in
/// the stack of the version they run, as many node heights as it names.
fn alarm(a: &Alarm, run: &Run, cluster: &str, scale: &Scale, y: f64) -> Group {
    let (x1, x2) = (scale.x(a.start), scale.x(a.end));
    let total: u32 = run.versions.iter().map(|c| c.nodes).sum::<u32>().max(1);
    let node_h = BAR_H / f64::from(total);
    // The stack is oldest at the bottom: find the top of `a.runs`' slice.
    let mut bottom = y + BAR_TOP + BAR_H;
    let mut slice = (bottom - node_h, node_h);
    for c in &run.versions {
        let h = node_h * f64::from(c.nodes);
        bottom -= h;
        if c.version == a.runs {
            let k = a.count.min(c.nodes).max(1);
            slice = (bottom, node_h * f64::from(k));
        }
    }
    let nodes = if a.nodes.is_empty() {
        format!("{} node(s)", a.count)
    } else {
        a.nodes.join(", ")
    };
    let label = format!("{} {}", a.state.to_uppercase(), a.version);
    let mut g = Group::new()
        .set("class", "alarm")
        .set("data-state", attr(&a.state))
        .set("data-nodes", a.count)
        .add(Title::new(format!(
            "{cluster}: {} {} on {nodes} from {}\n{}",
            a.state,
            a.version,
            ts(&a.start),
            a.message
        )))
        .add(
            Rectangle::new()
                .set("x", x1)
                .set("y", slice.0)
                .set("width", (x2 - x1).max(2.0))
                .set("height", slice.1.max(2.0))
                .set("fill", "none")
                .set("stroke", "#c00")
                .set("stroke-width", 2.5),
        );
    if x2 - x1 > label.chars().count() as f64 * 6.5 + 10.0 {
        g = g.add(
            Text::new(label)
                .set("x", x1 + 6.0)
                .set("y", y + BAR_TOP - 3.0)
                .set("fill", "#c00")
                .set("font-size", 9)
                .set("font-weight", "bold"),
        );
    }
    g
}

fn legend(colours: &Colours, t: &Timeline, h: f64) -> Group {
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
