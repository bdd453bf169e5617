//! One cluster's row of the timeline: its pinned version, what it waited
//! for (hatched), what its nodes ran (a bar stacked by version), and its
//! alarms (`failed`, `blocked`) and confirmations.

use super::layout::*;
use crate::fleet::model::{Alarm, Run, Timeline, TimelineEnv, TimelineRow, Trust};
use chrono::{DateTime, Utc};
use std::fmt::Write as _;
use svg::node::element::{Group, Line, Polygon, Rectangle, Text, Title};

/// One cluster's row: its pin, what it waited for, what its nodes ran, its
/// alarms and confirmations.
pub(super) fn cluster_row(
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
pub(super) fn pin(
    p: &crate::fleet::model::Pin,
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

pub(super) fn trust_word(t: Trust) -> &'static str {
    match t {
        Trust::Trusted => "trusted",
        Trust::Untrusted => "untrusted (ignored by the gate)",
        Trust::Unverified => "not verified",
        Trust::None => "none",
    }
}

/// One report's stretch: a bar stacked by version, oldest at the bottom,
/// each version's height in proportion to its nodes.
pub(super) fn run_bar(run: &Run, cluster: &str, scale: &Scale, y: f64, colours: &Colours) -> Group {
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
pub(super) fn alarm(a: &Alarm, run: &Run, cluster: &str, scale: &Scale, y: f64) -> Group {
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
