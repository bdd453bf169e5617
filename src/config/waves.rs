//! The grammar of `[[wave]]` in an environment file, and the check that
//! needs `drover.toml` too: every pattern names clusters of the
//! environment, no cluster is in two waves, every cluster is in one. What
//! waves mean at run time (the wave gate) is owned by [`crate::gate::wave`].

use super::keys::ENV_KEYS;
use super::spanned::{Ctx, Span};
use super::values::{nearest, quoted_list};
use super::{WaveSpec, DEFAULT_WAVE_SOAK};
use crate::diag::Diagnostic;
use toml::de::{DeTable, DeValue};

/// The most `[[wave]]` tables one file may hold.
const MAX_WAVES: usize = 64;
/// The most cluster names or patterns one wave may list.
const MAX_PATTERNS: usize = 1024;

/// Where a file wrote its waves, for the errors [`check_clusters`] finds.
#[derive(Debug, Clone, Default)]
pub(super) struct WaveSites {
    /// Per wave: the `[[wave]]` table's offset, and each pattern's.
    pub waves: Vec<(usize, Vec<usize>)>,
}

impl<'a> Ctx<'a> {
    /// `[[wave]]` tables (none when absent) and where each was written.
    pub(super) fn waves(&mut self, doc: &DeTable<'a>) -> (Vec<WaveSpec>, WaveSites) {
        let mut sites = WaveSites::default();
        let Some(tables) = self.tables_of(
            doc,
            "wave",
            false,
            "tables, written [[wave]]",
            ("waves", MAX_WAVES),
        ) else {
            return (Vec::new(), sites);
        };
        let mut waves = Vec::new();
        for (t, span) in tables.into_iter().take(MAX_WAVES) {
            let (wave, at) = self.wave(t, &span);
            waves.push(wave);
            sites.waves.push((self.table_start(span.start), at));
        }
        (waves, sites)
    }

    /// The start of the line holding `offset`: a `[[wave]]` table's span
    /// starts at its first key, but the person wrote the header above it.
    fn table_start(&self, offset: usize) -> usize {
        let before = self.text.get(..offset).unwrap_or("");
        before.rfind("[[wave]]").unwrap_or(offset)
    }

    fn wave(&mut self, t: &DeTable<'a>, span: &Span) -> (WaveSpec, Vec<usize>) {
        self.check_keys(t, "wave", ENV_KEYS);
        let mut clusters = Vec::new();
        let mut at = Vec::new();
        match t.get("clusters") {
            None => self.err(
                &(self.table_start(span.start)..span.end),
                "a [[wave]] needs `clusters`: names or patterns of the environment's clusters \
                 in drover.toml, such as clusters = [\"prod-eu-*\"]",
            ),
            Some(v) => match v.get_ref() {
                DeValue::Array(items) if items.is_empty() => self.err(
                    &v.span(),
                    "`clusters` of a [[wave]] is empty; list at least one cluster name or \
                     pattern, such as [\"prod-eu-*\"]",
                ),
                DeValue::Array(items) => {
                    if items.len() > MAX_PATTERNS {
                        self.err(
                            &v.span(),
                            format!("at most {MAX_PATTERNS} clusters or patterns per wave"),
                        );
                    }
                    for item in items.iter().take(MAX_PATTERNS) {
                        let Some(p) =
                            self.want_str("clusters", item, "a cluster name or a pattern")
                        else {
                            continue;
                        };
                        let ok = !p.is_empty()
                            && p.chars().all(|c| {
                                c.is_ascii_lowercase() || c.is_ascii_digit() || "-*?".contains(c)
                            });
                        if !ok {
                            self.err(
                                &item.span(),
                                format!(
                                    "\"{p}\" is not a cluster name or pattern: use a name from \
                                     [clusters] of drover.toml (lowercase letters, digits, `-`), \
                                     with `*` for any run of characters and `?` for one"
                                ),
                            );
                            continue;
                        }
                        clusters.push(p.to_owned());
                        at.push(item.span().start);
                    }
                }
                other => self.type_err(
                    "clusters",
                    &v.span(),
                    "an array of cluster names or patterns such as [\"prod-eu-*\"]",
                    other,
                ),
            },
        }
        let window = if t.contains_key("schedule") {
            Some(self.window_keys(t))
        } else {
            for key in ["duration", "timezone"] {
                if let Some(span) = self.key_span(t, key) {
                    self.err(
                        &span,
                        format!(
                            "`{key}` of a [[wave]] belongs to its own window, which needs a \
                             `schedule` too, such as schedule = \"0 2 21 * *\"; without one \
                             the wave uses the environment's [window]"
                        ),
                    );
                }
            }
            None
        };
        let soak = self.duration(Some(t), "soak", DEFAULT_WAVE_SOAK, true).0;
        let max_concurrency = t.get("max_concurrency").and_then(|v| match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) if n >= 1 => u32::try_from(n).ok(),
                _ => {
                    self.err(
                        &v.span(),
                        "`max_concurrency` must be an integer of at least 1: how many of the \
                         wave's clusters may roll at once (leave it out for all of them)",
                    );
                    None
                }
            },
            other => {
                self.type_err("max_concurrency", &v.span(), "an integer such as 1", other);
                None
            }
        });
        let wave = WaveSpec {
            clusters,
            window,
            soak,
            max_concurrency,
        };
        (wave, at)
    }
}

/// The errors of `env`'s waves against its clusters in `drover.toml`
/// (`clusters`, in the order listed there): a pattern matching none of
/// them, a cluster in two waves, a cluster in no wave.
pub(super) fn check_clusters(
    file: &str,
    text: &str,
    env: &str,
    waves: &[WaveSpec],
    sites: &WaveSites,
    clusters: &[String],
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if waves.is_empty() {
        return out;
    }
    let listed = if clusters.is_empty() {
        "none".to_owned()
    } else {
        quoted_list(clusters.iter().map(String::as_str))
    };
    // cluster -> (wave number, from 1) of the first wave holding it.
    let mut owner: std::collections::BTreeMap<&str, usize> = Default::default();
    for (i, (wave, (_, at))) in waves.iter().zip(&sites.waves).enumerate() {
        for (p, offset) in wave.clusters.iter().zip(at) {
            let matched: Vec<&String> = clusters
                .iter()
                .filter(|c| super::pattern_matches(p, c))
                .collect();
            if matched.is_empty() {
                let hint = nearest(p, clusters.iter().map(String::as_str))
                    .map(|n| format!("; did you mean \"{n}\"?"))
                    .unwrap_or_default();
                out.push(Diagnostic::at(
                    file,
                    text,
                    *offset,
                    format!(
                        "\"{p}\" matches no cluster of `{env}`{hint} (its clusters under \
                         [clusters] in drover.toml: {listed})"
                    ),
                ));
            }
            for c in matched {
                match owner.get(c.as_str()) {
                    Some(&first) if first != i + 1 => out.push(Diagnostic::at(
                        file,
                        text,
                        *offset,
                        format!(
                            "cluster `{c}` (matched by \"{p}\") is already in wave {first}; a \
                             cluster belongs to one wave: narrow the pattern or remove it from \
                             one of them"
                        ),
                    )),
                    Some(_) => {}
                    None => {
                        owner.insert(c, i + 1);
                    }
                }
            }
        }
    }
    let unlisted: Vec<&str> = clusters
        .iter()
        .map(String::as_str)
        .filter(|c| !owner.contains_key(c))
        .collect();
    if !unlisted.is_empty() {
        let first = sites.waves.first().map_or(0, |(o, _)| *o);
        out.push(Diagnostic::at(
            file,
            text,
            first,
            format!(
                "with [[wave]], every cluster of `{env}` must be in a wave; in none: {}; add \
                 each to a wave's `clusters`, or add a last [[wave]] for them",
                quoted_list(unlisted.iter().copied()),
            ),
        ));
    }
    out
}
