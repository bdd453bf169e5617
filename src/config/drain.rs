//! Drain rules (`[[drain]]` in an environment file): which pods a drain
//! treats how. Each rule matches pods by namespace and label selector (the
//! first rule that matches a pod is its rule) and gives them a ladder of
//! rungs climbed as the drain goes on: `evict` (the Eviction API, what a
//! pod no rule matches gets until `drain_timeout`), `restart` (the
//! single-replica owner rolled, as `kubectl rollout restart` does), `wait`,
//! then `skip` (the node is given back, reported, not failed) or `delete`
//! (only with `allow_delete = true` on the rule). A rule may also ask for
//! the pre-drain taint ([`DRAIN_TAINT`]) some lead time before the cordon.
//!
//! The values and their grammar live here; what a rung does to a pod is the
//! Kubernetes backend's (`kubernetes/drain.rs`), when a node is tainted and
//! given back is the rollout decision's.

use super::keys::ENV_KEYS;
use super::selector::LabelSelector;
use super::spanned::{Ctx, Span};
use super::values::parse_duration;
use std::collections::BTreeMap;
use std::time::Duration;
use toml::de::{DeTable, DeValue};

/// The taint drover sets on a node `taint` before its cordon when a drain
/// rule asks for it, so an operator that moves its workload away from
/// nodes about to go (CloudNativePG's `drainTaints`, for one) sees the node
/// coming while it is still schedulable for nothing new. Effect
/// `NoSchedule`: nothing new lands on it meanwhile; removed when the node
/// is given back.
pub const DRAIN_TAINT: &str = "drover.dev/draining";
/// The effect of [`DRAIN_TAINT`].
pub const DRAIN_TAINT_EFFECT: &str = "NoSchedule";

/// The most `[[drain]]` tables one file may hold.
const MAX_RULES: usize = 64;
/// The most rungs one ladder may hold.
const MAX_RUNGS: usize = 16;
/// The most namespaces one rule may list.
const MAX_NAMESPACES: usize = 256;

/// What a rung does to the pods of its rule still on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RungKind {
    /// Evict through the Eviction API (PodDisruptionBudgets honoured).
    Evict,
    /// Restart the pod's Deployment or StatefulSet when it has one replica
    /// and no rollout of it is in flight (its pod template's
    /// `kubectl.kubernetes.io/restartedAt`), and wait for that rollout;
    /// a pod of any other owner is evicted.
    Restart,
    /// Leave the pods alone.
    Wait,
    /// Give the node back: reported as skipped, not failed.
    Skip,
    /// Delete the pods (no PodDisruptionBudget asked): only on a rule with
    /// `allow_delete = true`.
    Delete,
    /// The pre-drain taint before the cordon (a rule's `taint`, not a
    /// ladder's rung; recorded as one).
    Taint,
}

impl RungKind {
    const ALL: [RungKind; 5] = [
        RungKind::Evict,
        RungKind::Restart,
        RungKind::Wait,
        RungKind::Skip,
        RungKind::Delete,
    ];

    /// The rung's word in a ladder.
    pub fn as_str(self) -> &'static str {
        match self {
            RungKind::Evict => "evict",
            RungKind::Restart => "restart",
            RungKind::Wait => "wait",
            RungKind::Skip => "skip",
            RungKind::Delete => "delete",
            RungKind::Taint => "taint",
        }
    }

    /// The rung named `s`, as [`Self::as_str`] writes it.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([RungKind::Taint])
            .find(|k| k.as_str() == s)
    }

    /// `skip` and `delete` end a ladder.
    fn terminal(self) -> bool {
        matches!(self, RungKind::Skip | RungKind::Delete)
    }
}

/// One rung of a ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rung {
    /// What it does.
    pub kind: RungKind,
    /// How long it lasts before the next rung; `None`: until the drain
    /// ends (the last rung only).
    pub lasts: Option<Duration>,
}

/// One `[[drain]]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainRule {
    /// Its name, as the evidence names it (`drain[N]`, from 1, without one).
    pub name: String,
    /// The namespaces it matches; empty = every namespace.
    pub namespaces: Vec<String>,
    /// The pods' label selector; empty = every pod.
    pub selector: LabelSelector,
    /// Set [`DRAIN_TAINT`] this long before the node's cordon.
    pub taint: Option<Duration>,
    /// The rungs, climbed from the cordon on.
    pub ladder: Vec<Rung>,
    /// `delete` may be on the ladder.
    pub allow_delete: bool,
}

impl DrainRule {
    /// Whether a pod of `namespace` with `labels` is this rule's.
    pub fn matches(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && self.selector.matches(labels)
    }

    /// The rung in force `since_cordon` after the cordon: each rung lasts
    /// its duration, the last one until the drain ends.
    pub fn rung_at(&self, since_cordon: Duration) -> RungKind {
        let mut until = Duration::ZERO;
        for rung in &self.ladder {
            match rung.lasts {
                Some(d) => {
                    until = until.saturating_add(d);
                    if since_cordon < until {
                        return rung.kind;
                    }
                }
                None => return rung.kind,
            }
        }
        self.ladder.last().map_or(RungKind::Evict, |r| r.kind)
    }

    /// Whether a `kind` rung comes into force before `limit` after the
    /// cordon: a drain ends at `drain_timeout`, so a rung that would start
    /// later is never climbed.
    pub fn reaches(&self, kind: RungKind, limit: Duration) -> bool {
        let mut starts = Duration::ZERO;
        for rung in &self.ladder {
            if starts >= limit {
                return false;
            }
            if rung.kind == kind {
                return true;
            }
            starts = starts.saturating_add(rung.lasts.unwrap_or(Duration::MAX));
        }
        false
    }
}

/// The rule of a pod of `namespace` with `labels`: the first that matches.
pub fn rule_for<'r>(
    rules: &'r [DrainRule],
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<&'r DrainRule> {
    rules.iter().find(|r| r.matches(namespace, labels))
}

/// The longest pre-drain taint lead of `rules`: how long before its cordon
/// a node is tainted (zero: no taint).
pub fn taint_lead(rules: &[DrainRule]) -> Duration {
    rules
        .iter()
        .filter_map(|r| r.taint)
        .max()
        .unwrap_or(Duration::ZERO)
}

const LADDER_SYNTAX: &str = "an array of rungs such as [\"restart 10m\", \"evict 30m\", \
\"skip\"]: `evict` or `restart` (with a duration, or without one as the last rung), `wait \
DURATION`, and at the end `skip` or `delete` (with allow_delete = true)";

impl<'a> Ctx<'a> {
    /// `[[drain]]` tables (none when absent); `drain_timeout` bounds when a
    /// ladder's last rung may start.
    pub(super) fn drain_rules(
        &mut self,
        doc: &DeTable<'a>,
        drain_timeout: Duration,
    ) -> Vec<DrainRule> {
        let Some(tables) = self.tables_of(
            doc,
            "drain",
            false,
            "tables, written [[drain]]",
            ("drain rules", MAX_RULES),
        ) else {
            return Vec::new();
        };
        tables
            .into_iter()
            .take(MAX_RULES)
            .enumerate()
            .map(|(i, (t, span))| self.drain_rule(i, t, &span, drain_timeout))
            .collect()
    }

    fn drain_rule(
        &mut self,
        i: usize,
        t: &DeTable<'a>,
        span: &Span,
        drain_timeout: Duration,
    ) -> DrainRule {
        self.check_keys(t, "drain", ENV_KEYS);
        let header = {
            let before = self.text.get(..span.start).unwrap_or("");
            before.rfind("[[drain]]").unwrap_or(span.start)
        };
        let name = match t.get("name") {
            None => format!("drain[{}]", i + 1),
            Some(v) => match self.want_str("name", v, "a name for the rule such as \"singletons\"")
            {
                Some(s) if valid_name(s) => s.to_owned(),
                Some(s) => {
                    self.err(
                        &v.span(),
                        format!(
                            "`name` of a [[drain]] must be 1 to 63 lowercase letters, digits or \
                             `-`, such as \"singletons\"; found \"{s}\""
                        ),
                    );
                    format!("drain[{}]", i + 1)
                }
                None => format!("drain[{}]", i + 1),
            },
        };
        let mut namespaces = Vec::new();
        if let Some(v) = t.get("namespaces") {
            match v.get_ref() {
                DeValue::Array(items) => {
                    if items.len() > MAX_NAMESPACES {
                        self.err(
                            &v.span(),
                            format!("at most {MAX_NAMESPACES} namespaces per [[drain]] rule"),
                        );
                    }
                    for item in items.iter().take(MAX_NAMESPACES) {
                        let Some(ns) = self.want_str("namespaces", item, "a namespace name") else {
                            continue;
                        };
                        if valid_name(ns) {
                            namespaces.push(ns.to_owned());
                        } else {
                            self.err(
                                &item.span(),
                                format!(
                                    "\"{ns}\" is not a namespace name: 1 to 63 lowercase \
                                     letters, digits or `-`, such as \"databases\""
                                ),
                            );
                        }
                    }
                }
                other => self.type_err(
                    "namespaces",
                    &v.span(),
                    "an array of namespace names such as [\"databases\"]",
                    other,
                ),
            }
        }
        let selector = match t.get("selector") {
            None => LabelSelector::default(),
            Some(v) => match self.want_str(
                "selector",
                v,
                "a label selector string such as \"app.kubernetes.io/name=postgres\"",
            ) {
                Some(s) => LabelSelector::parse(s).unwrap_or_else(|e| {
                    self.err(&v.span(), format!("`selector` \"{s}\": {e}"));
                    LabelSelector::default()
                }),
                None => LabelSelector::default(),
            },
        };
        let taint = match self.duration(Some(t), "taint", Duration::ZERO, false) {
            (_, None) => None,
            (d, Some(_)) => Some(d),
        };
        let allow_delete = match t.get("allow_delete") {
            None => false,
            Some(v) => self.want_bool("allow_delete", v).unwrap_or(false),
        };
        let ladder = match t.get("ladder") {
            None => {
                self.err_at(
                    header,
                    format!("a [[drain]] needs `ladder`: {LADDER_SYNTAX}"),
                );
                Vec::new()
            }
            Some(v) => self.ladder(v, allow_delete, drain_timeout),
        };
        if allow_delete && !ladder.iter().any(|r| r.kind == RungKind::Delete) {
            let at = self.key_span(t, "allow_delete").map_or(header, |s| s.start);
            self.err_at(
                at,
                "`allow_delete = true` on a [[drain]] whose ladder has no `delete` rung: \
                 remove it, or end the ladder with \"delete\"",
            );
        }
        DrainRule {
            name,
            namespaces,
            selector,
            taint,
            ladder,
            allow_delete,
        }
    }

    fn ladder(
        &mut self,
        v: &super::spanned::Value<'a>,
        allow_delete: bool,
        drain_timeout: Duration,
    ) -> Vec<Rung> {
        let items = match v.get_ref() {
            DeValue::Array(items) if items.is_empty() => {
                self.err(
                    &v.span(),
                    format!("`ladder` is empty; it must be {LADDER_SYNTAX}"),
                );
                return Vec::new();
            }
            DeValue::Array(items) => items,
            other => {
                self.type_err("ladder", &v.span(), LADDER_SYNTAX, other);
                return Vec::new();
            }
        };
        if items.len() > MAX_RUNGS {
            self.err(&v.span(), format!("at most {MAX_RUNGS} rungs per ladder"));
        }
        let mut ladder = Vec::new();
        let mut starts = Duration::ZERO;
        let last = items.len().min(MAX_RUNGS).saturating_sub(1);
        for (i, item) in items.iter().take(MAX_RUNGS).enumerate() {
            let Some(s) = self.want_str("ladder", item, "a rung such as \"evict 30m\"") else {
                continue;
            };
            let Some(rung) = self.rung(s, &item.span()) else {
                continue;
            };
            let problem = match (rung.kind, rung.lasts) {
                (k, _) if k.terminal() && i != last => Some(format!(
                    "`{}` ends a ladder: it must be the last rung",
                    k.as_str()
                )),
                (RungKind::Delete, _) if !allow_delete => Some(
                    "`delete` deletes pods without asking their PodDisruptionBudgets: the rule \
                     must say allow_delete = true, or end with \"skip\" instead"
                        .to_owned(),
                ),
                (_, None) if i != last && !rung.kind.terminal() => Some(format!(
                    "only the last rung may go without a duration; write it as \"{} 10m\"",
                    rung.kind.as_str()
                )),
                _ if rung.kind.terminal() && starts >= drain_timeout => Some(format!(
                    "`{}` would start {} after the cordon, not before drain_timeout ({}): the \
                     node would be given back blocked first; shorten the rungs before it or \
                     raise drain_timeout",
                    rung.kind.as_str(),
                    humantime::format_duration(starts),
                    humantime::format_duration(drain_timeout)
                )),
                _ => None,
            };
            if let Some(p) = problem {
                self.err(&item.span(), p);
                continue;
            }
            starts = starts.saturating_add(rung.lasts.unwrap_or(Duration::ZERO));
            ladder.push(rung);
        }
        ladder
    }

    fn rung(&mut self, s: &str, span: &Span) -> Option<Rung> {
        let mut words = s.split_whitespace();
        let word = words.next().unwrap_or("");
        let rest: Vec<&str> = words.collect();
        let Some(kind) = RungKind::ALL.into_iter().find(|k| k.as_str() == word) else {
            let hint = super::values::nearest(word, RungKind::ALL.map(RungKind::as_str))
                .map(|n| format!("; did you mean \"{n}\"?"))
                .unwrap_or_default();
            self.err(
                span,
                format!(
                    "\"{s}\" is not a rung{hint} a rung is `evict`, `restart`, `wait`, `skip` \
                     or `delete`, the first three with a duration such as \"evict 30m\""
                ),
            );
            return None;
        };
        let lasts = match (kind.terminal(), rest.as_slice()) {
            (true, []) | (false, []) => None,
            (true, _) => {
                self.err(
                    span,
                    format!("`{word}` takes no duration: it ends the ladder; write \"{word}\""),
                );
                return None;
            }
            (false, [d]) => match parse_duration(d) {
                Ok(d) if !d.is_zero() => Some(d),
                Ok(_) => {
                    self.err(
                        span,
                        format!("\"{s}\": a rung's duration must be longer than zero"),
                    );
                    return None;
                }
                Err(e) => {
                    self.err(
                        span,
                        format!("\"{s}\": the duration must be such as \"10m\" or \"1h\" ({e})"),
                    );
                    return None;
                }
            },
            (false, _) => {
                self.err(
                    span,
                    format!("\"{s}\" is not a rung: write the rung and one duration, such as \"{word} 10m\""),
                );
                return None;
            }
        };
        if kind == RungKind::Wait && lasts.is_none() {
            self.err(
                span,
                "`wait` needs a duration, such as \"wait 30m\": a wait without one would \
                 only ever end at drain_timeout",
            );
            return None;
        }
        Some(Rung { kind, lasts })
    }
}

/// A Kubernetes name of one DNS label (namespaces, rule names).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
#[path = "drain_tests.rs"]
mod tests;
