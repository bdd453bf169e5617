//! Reading the timeline page back: from the drawing's geometry alone (the
//! scale on the `<svg>`, the bars' rectangles, the legend's colours), what
//! the page says each cluster's nodes ran at an instant. Works on the page
//! drover writes and on the DOM Chromium built from it (`--dump-dom`).

use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use svg::node::element::tag::Type;
use svg::parser::Event;

/// A rectangle as drawn.
#[derive(Debug, Clone)]
pub struct Rect {
    /// Its `class` (`nodes`, `pending`, `alarm` rectangles are under a group of that class).
    pub class: String,
    /// The class of the group it is in (`run`, `pending`, `alarm`, `pin`...).
    pub group: String,
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
    pub fill: String,
}

/// One cluster's row.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub env: String,
    pub cluster: String,
    pub rects: Vec<Rect>,
    /// Classes of the texts in the row (`cluster-name`, `no-report`).
    pub texts: Vec<String>,
}

/// The drawing, read back.
#[derive(Debug, Clone)]
pub struct Drawing {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub now: DateTime<Utc>,
    pub x0: f64,
    pub x1: f64,
    pub rows: Vec<Row>,
    /// Legend: fill colour → version (`unknown` for nodes no report names).
    pub legend: BTreeMap<String, String>,
    /// The `class` of every group, in order (events, promotions, ...).
    pub groups: Vec<String>,
}

fn num(a: &svg::node::Attributes, k: &str) -> f64 {
    a.get(k)
        .and_then(|v| v.to_string().parse().ok())
        .unwrap_or(f64::NAN)
}

fn text(a: &svg::node::Attributes, k: &str) -> String {
    a.get(k).map(|v| v.to_string()).unwrap_or_default()
}

/// Read the `<svg class="timeline">` out of an HTML page (drover's, or
/// Chromium's dump of it).
pub fn read(html: &str) -> Drawing {
    let start = html.find("<svg").expect("the page holds an <svg>");
    let end = html[start..].find("</svg>").expect("the <svg> ends") + start + 6;
    let mut d = Drawing {
        from: DateTime::<Utc>::MIN_UTC,
        to: DateTime::<Utc>::MIN_UTC,
        now: DateTime::<Utc>::MIN_UTC,
        x0: 0.0,
        x1: 0.0,
        rows: Vec::new(),
        legend: BTreeMap::new(),
        groups: Vec::new(),
    };
    // The classes of the open groups, innermost last; the row being read.
    let mut stack: Vec<String> = Vec::new();
    let mut row: Option<(usize, Row)> = None;
    for ev in svg::read(&html[start..end]).expect("the <svg> parses") {
        let Event::Tag(name, kind, a) = ev else {
            continue;
        };
        match (name, kind) {
            ("svg", Type::Start) => {
                let t = |k| {
                    DateTime::parse_from_rfc3339(&text(&a, k))
                        .unwrap_or_else(|e| panic!("svg {k}: {e}"))
                        .with_timezone(&Utc)
                };
                (d.from, d.to, d.now) = (t("data-from"), t("data-to"), t("data-now"));
                (d.x0, d.x1) = (num(&a, "data-x0"), num(&a, "data-x1"));
            }
            ("g", Type::Start) => {
                let class = text(&a, "class");
                d.groups.push(class.clone());
                if class == "cluster-row" {
                    row = Some((
                        stack.len(),
                        Row {
                            env: text(&a, "data-env"),
                            cluster: text(&a, "data-cluster"),
                            ..Row::default()
                        },
                    ));
                }
                stack.push(class);
            }
            ("g", Type::End) => {
                stack.pop();
                if row.as_ref().is_some_and(|(depth, _)| *depth == stack.len()) {
                    d.rows.push(row.take().unwrap().1);
                }
            }
            ("rect", Type::Start | Type::Empty) => {
                let class = text(&a, "class");
                if class == "legend-version" {
                    d.legend.insert(text(&a, "fill"), text(&a, "data-version"));
                }
                if let Some((_, r)) = row.as_mut() {
                    r.rects.push(Rect {
                        class,
                        group: stack.last().cloned().unwrap_or_default(),
                        x: num(&a, "x"),
                        y: num(&a, "y"),
                        width: num(&a, "width"),
                        height: num(&a, "height"),
                        fill: text(&a, "fill"),
                    });
                }
            }
            ("text", Type::Start) => {
                if let Some((_, r)) = row.as_mut() {
                    r.texts.push(text(&a, "class"));
                }
            }
            _ => {}
        }
    }
    d
}

impl Drawing {
    /// The x of an instant.
    pub fn x(&self, t: DateTime<Utc>) -> f64 {
        let f = (t - self.from).num_seconds() as f64 / (self.to - self.from).num_seconds() as f64;
        self.x0 + f.clamp(0.0, 1.0) * (self.x1 - self.x0)
    }

    /// The instant of an x.
    pub fn t(&self, x: f64) -> DateTime<Utc> {
        let f = (x - self.x0) / (self.x1 - self.x0);
        self.from
            + chrono::Duration::seconds(((self.to - self.from).num_seconds() as f64 * f) as i64)
    }

    pub fn row(&self, cluster: &str) -> &Row {
        self.rows
            .iter()
            .find(|r| r.cluster == cluster)
            .unwrap_or_else(|| panic!("no row for {cluster}"))
    }

    /// What the bar of `cluster` says its `nodes` nodes ran at `t`: version
    /// → nodes, from the heights of the stacked rectangles under `t`'s x.
    /// Where bars overlap (a stretch narrower than a pixel is drawn one
    /// pixel wide), the one painted last is the one seen: the latest.
    pub fn mix_at(&self, cluster: &str, t: DateTime<Utc>, nodes: u32) -> BTreeMap<String, u32> {
        let x = self.x(t);
        let covering = |r: &&Rect| r.class == "nodes" && r.x <= x && x < r.x + r.width;
        let rects = &self.row(cluster).rects;
        let seen = rects
            .iter()
            .filter(covering)
            .map(|r| r.x)
            .fold(f64::MIN, f64::max);
        let under: Vec<&Rect> = rects
            .iter()
            .filter(covering)
            .filter(|r| r.x == seen)
            .collect();
        let total: f64 = under.iter().map(|r| r.height).sum();
        let mut out = BTreeMap::new();
        for r in under {
            let version = self
                .legend
                .get(&r.fill)
                .unwrap_or_else(|| panic!("colour {} is not in the legend", r.fill))
                .clone();
            let n = (r.height / total * f64::from(nodes)).round() as u32;
            *out.entry(version).or_default() += n;
        }
        out.retain(|_, n| *n > 0);
        out
    }
}
