//! Where things go on the timeline and in what colour: the drawing's sizes,
//! the time scale (time to x), the version palette and its hatches, and the
//! few text helpers every part of the drawing shares.

use crate::fleet::model::Timeline;
use chrono::{DateTime, SecondsFormat, Utc};
use std::collections::BTreeMap;
use svg::node::element::{Pattern, Rectangle};

/// Width of the drawing in CSS pixels.
pub const WIDTH: f64 = 1200.0;

/// Left edge of the time axis (the cluster names are left of it).
pub const LABEL_W: f64 = 190.0;

pub(super) const RIGHT: f64 = 20.0;

pub(super) const AXIS_H: f64 = 64.0;

pub(super) const ENV_H: f64 = 26.0;

/// Height of one cluster's row.
pub const ROW_H: f64 = 34.0;

/// Where a row's bar starts below the row's top, and how tall it is: the
/// stacked versions share it in proportion to their nodes.
pub const BAR_TOP: f64 = 12.0;

/// Height of a row's bar.
pub const BAR_H: f64 = 18.0;

pub(super) const GAP: f64 = 14.0;

pub(super) const LEGEND_H: f64 = 52.0;

/// Colour of nodes whose version no report says.
pub const UNKNOWN: &str = "#bbbbbb";

/// Version colours, in version order (colour-blind-safe Okabe–Ito first).
pub(super) const PALETTE: [&str; 10] = [
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
pub(super) fn attr(s: &str) -> String {
    s.replace('"', "'")
}

pub(super) fn short(commit: &str) -> &str {
    commit.get(..10).unwrap_or(commit)
}

pub(super) fn ts(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

pub(super) fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Maps time to x.
pub(super) struct Scale {
    pub(super) from: DateTime<Utc>,
    pub(super) secs: f64,
}

impl Scale {
    pub(super) fn x(&self, t: DateTime<Utc>) -> f64 {
        let f = (t - self.from).num_seconds() as f64 / self.secs;
        LABEL_W + f.clamp(0.0, 1.0) * (WIDTH - LABEL_W - RIGHT)
    }
}

/// Every version shown, in version order, with its colour.
pub(super) fn colours(t: &Timeline) -> BTreeMap<semver::Version, &'static str> {
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

pub(super) type Colours = BTreeMap<semver::Version, &'static str>;

pub(super) fn colour_of(c: &Colours, v: Option<&str>) -> &'static str {
    v.and_then(|v| semver::Version::parse(v).ok())
        .and_then(|v| c.get(&v).copied())
        .unwrap_or(UNKNOWN)
}

/// The hatch pattern of a version's colour (waiting for it).
pub(super) fn hatch_id(c: &Colours, v: &str) -> String {
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

pub(super) fn hatch(id: &str, colour: &str) -> Pattern {
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
