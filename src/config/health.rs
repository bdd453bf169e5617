//! The `[health]` section of an environment file: what "confirmed" means
//! beyond "Ready at the version" (docs/design.md §5a). Owns the section's
//! grammar, defaults and validation; the verdict itself lives in
//! [`crate::health`].

use super::values::{a_type as kind, nearest, parse_duration};
use crate::diag::Diagnostic;
use serde_spanned::Spanned;
use std::time::Duration;
use toml::de::{DeTable, DeValue};

/// Default `settle`: how long every check must hold after the last node.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30 * 60);
/// Default `pod_ready_timeout`: how long each returned node is watched.
pub const DEFAULT_POD_READY_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Default `node_conditions`: the kubelet's own pressure and network conditions.
pub const DEFAULT_NODE_CONDITIONS: &[&str] = &[
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
];
/// Default per-query `timeout`.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest per-query `timeout` accepted: a health check that takes
/// longer than this would hold every rollout step behind it.
pub const MAX_QUERY_TIMEOUT: Duration = Duration::from_secs(120);
/// At most this many `[[health.prometheus]]` entries per environment.
pub const MAX_PROMETHEUS_CHECKS: usize = 32;
/// At most this many `node_conditions`.
pub const MAX_NODE_CONDITIONS: usize = 64;
/// The longest `query` accepted, in bytes (it travels in a URL).
pub const MAX_QUERY_LEN: usize = 4096;

const SECTION_KEYS: &[&str] = &[
    "settle",
    "pod_ready_timeout",
    "node_conditions",
    "prometheus",
];
const PROMETHEUS_KEYS: &[&str] = &["url", "query", "timeout", "on_unreachable"];
const DURATION_SYNTAX: &str = "a duration string such as \"10m\", \"30m\" or \"1h\"";

/// `[health]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    /// The environment file has a `[health]` section: the rollout watches
    /// each node and settles before `confirmed`. Without the section a node
    /// counts as done once Ready at the version, as before health gating.
    pub enabled: bool,
    /// After the last node, how long every check must hold before the
    /// cluster reports `confirmed`. Default 30m; `"0s"` confirms at once.
    pub settle: Duration,
    /// How long each node is watched after it returns Ready at the version,
    /// and how long a pod landing on it has to become Ready. Default 10m.
    pub pod_ready_timeout: Duration,
    /// Node condition types that fail the node while their status is True.
    pub node_conditions: Vec<String>,
    /// `[[health.prometheus]]`: unhealthy while a query returns a sample.
    pub prometheus: Vec<PrometheusCheck>,
}

impl Default for HealthSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            settle: DEFAULT_SETTLE,
            pod_ready_timeout: DEFAULT_POD_READY_TIMEOUT,
            node_conditions: DEFAULT_NODE_CONDITIONS
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
            prometheus: Vec::new(),
        }
    }
}

/// One `[[health.prometheus]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusCheck {
    /// Base URL of the Prometheus server (http or https, no query string);
    /// the client appends `/api/v1/query`.
    pub url: String,
    /// PromQL; the check is unhealthy while it returns any sample.
    pub query: String,
    /// Bound on the whole request, connect to last byte. Default 10s.
    pub timeout: Duration,
    /// What an unreachable Prometheus means. Default [`OnUnreachable::Hold`].
    pub on_unreachable: OnUnreachable,
}

/// `on_unreachable` of a `[[health.prometheus]]` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnUnreachable {
    /// Unhealthy: no new node starts and nothing is confirmed until the
    /// query answers again; the state says Prometheus is unreachable. The
    /// rollout resumes by itself once it answers (an outage of the
    /// monitoring is not evidence against the OS version, so not `failed`).
    #[default]
    Hold,
    /// The check is skipped while Prometheus cannot be reached (the state
    /// message still says so).
    Ignore,
}

/// Parses `[health]` of `doc` (an environment file named `file` with text
/// `text`), pushing every problem to `diags`; defaults where absent or wrong.
pub(crate) fn parse_health(
    file: &str,
    text: &str,
    doc: &DeTable<'_>,
    diags: &mut Vec<Diagnostic>,
) -> HealthSpec {
    let mut cx = Cx { file, text, diags };
    let mut spec = HealthSpec::default();
    let Some((key, value)) = doc.get_key_value("health") else {
        return spec;
    };
    spec.enabled = true;
    let table = match value.get_ref() {
        DeValue::Table(t) => t,
        other => {
            cx.err(
                key.span().start,
                format!(
                    "`health` must be a table, written [health]; found {}",
                    kind(other)
                ),
            );
            return spec;
        }
    };
    cx.unknown_keys(table, "[health]", SECTION_KEYS);

    if let Some(v) = table.get("settle") {
        spec.settle = cx.duration("settle", v, true).unwrap_or(DEFAULT_SETTLE);
    }
    if let Some(v) = table.get("pod_ready_timeout") {
        spec.pod_ready_timeout = cx
            .duration("pod_ready_timeout", v, false)
            .unwrap_or(DEFAULT_POD_READY_TIMEOUT);
    }
    if let Some(v) = table.get("node_conditions") {
        if let Some(list) = cx.node_conditions(v) {
            spec.node_conditions = list;
        }
    }
    if let Some((key, v)) = table.get_key_value("prometheus") {
        spec.prometheus = cx.prometheus_checks(key.span().start, v);
    }
    spec
}

struct Cx<'a, 'd> {
    file: &'a str,
    text: &'a str,
    diags: &'d mut Vec<Diagnostic>,
}

type Value<'i> = Spanned<DeValue<'i>>;

impl Cx<'_, '_> {
    fn err(&mut self, offset: usize, msg: impl Into<String>) {
        self.diags
            .push(Diagnostic::at(self.file, self.text, offset, msg));
    }

    fn unknown_keys(&mut self, table: &DeTable<'_>, place: &str, valid: &[&str]) {
        for (k, _) in table.iter() {
            let key = k.get_ref().as_ref();
            if valid.contains(&key) {
                continue;
            }
            let hint = nearest(key, valid.iter().copied())
                .map(|n| format!(" did you mean `{n}`?"))
                .unwrap_or_default();
            self.err(
                k.span().start,
                format!(
                    "unknown key `{key}` in {place};{hint} valid keys: {}",
                    valid.join(", ")
                ),
            );
        }
    }

    fn string<'v>(&mut self, key: &str, v: &'v Value<'_>, expected: &str) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.err(
                    v.span().start,
                    format!("`{key}` must be {expected}; found {}", kind(other)),
                );
                None
            }
        }
    }

    fn duration(&mut self, key: &str, v: &Value<'_>, allow_zero: bool) -> Option<Duration> {
        let s = self.string(key, v, DURATION_SYNTAX)?;
        match parse_duration(s) {
            Ok(d) if d.is_zero() && !allow_zero => {
                self.err(
                    v.span().start,
                    format!("`{key}` must be longer than zero, such as \"10m\""),
                );
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                self.err(
                    v.span().start,
                    format!("`{key}` must be {DURATION_SYNTAX}; found \"{s}\" ({e})"),
                );
                None
            }
        }
    }

    fn node_conditions(&mut self, v: &Value<'_>) -> Option<Vec<String>> {
        const EXPECTED: &str =
            "a list of node condition types such as [\"MemoryPressure\", \"DiskPressure\"]";
        let DeValue::Array(items) = v.get_ref() else {
            self.err(
                v.span().start,
                format!(
                    "`node_conditions` must be {EXPECTED}; found {}",
                    kind(v.get_ref())
                ),
            );
            return None;
        };
        if items.len() > MAX_NODE_CONDITIONS {
            self.err(
                v.span().start,
                format!(
                    "`node_conditions` lists {} conditions; at most {MAX_NODE_CONDITIONS} are allowed",
                    items.len()
                ),
            );
            return None;
        }
        let mut out: Vec<String> = Vec::new();
        let mut ok = true;
        for item in items.iter() {
            let Some(s) = self.string("node_conditions", item, EXPECTED) else {
                ok = false;
                continue;
            };
            if s == "Ready" {
                self.err(
                    item.span().start,
                    "`node_conditions` cannot list \"Ready\": drover already requires every node \
                     to be Ready; list conditions that are bad while True, such as \"MemoryPressure\"",
                );
                ok = false;
            } else if !is_condition_type(s) {
                self.err(
                    item.span().start,
                    format!(
                        "`node_conditions` entry \"{s}\" is not a condition type: use the type \
                         as the node reports it, letters, digits, '.', '-', '_' or '/', such as \
                         \"MemoryPressure\" or \"example.com/KernelDeadlock\""
                    ),
                );
                ok = false;
            } else if out.iter().any(|c| c == s) {
                self.err(
                    item.span().start,
                    format!("`node_conditions` lists \"{s}\" twice; list each condition once"),
                );
                ok = false;
            } else {
                out.push(s.to_owned());
            }
        }
        ok.then_some(out)
    }

    fn prometheus_checks(&mut self, key_at: usize, v: &Value<'_>) -> Vec<PrometheusCheck> {
        const EXPECTED: &str =
            "an array of tables, written [[health.prometheus]] with `url` and `query`";
        let DeValue::Array(items) = v.get_ref() else {
            self.err(
                key_at,
                format!(
                    "`prometheus` must be {EXPECTED}; found {}",
                    kind(v.get_ref())
                ),
            );
            return Vec::new();
        };
        if items.len() > MAX_PROMETHEUS_CHECKS {
            self.err(
                key_at,
                format!(
                    "[[health.prometheus]] appears {} times; at most {MAX_PROMETHEUS_CHECKS} are allowed",
                    items.len()
                ),
            );
            return Vec::new();
        }
        let mut out = Vec::new();
        for item in items.iter() {
            let DeValue::Table(t) = item.get_ref() else {
                self.err(
                    item.span().start,
                    format!(
                        "`prometheus` must be {EXPECTED}; found {}",
                        kind(item.get_ref())
                    ),
                );
                continue;
            };
            if let Some(check) = self.prometheus_check(item.span().start, t) {
                out.push(check);
            }
        }
        out
    }

    fn prometheus_check(&mut self, at: usize, t: &DeTable<'_>) -> Option<PrometheusCheck> {
        let before = self.diags.len();
        self.unknown_keys(t, "[[health.prometheus]]", PROMETHEUS_KEYS);
        let url = match t.get("url") {
            None => {
                self.err(
                    at,
                    "[[health.prometheus]] is missing `url`: the Prometheus server's base URL, \
                     such as url = \"http://prometheus.monitoring:9090\"",
                );
                None
            }
            Some(v) => self
                .string(
                    "url",
                    v,
                    "a URL string such as \"http://prometheus.monitoring:9090\"",
                )
                .and_then(|s| match check_url(s) {
                    Ok(u) => Some(u),
                    Err(e) => {
                        self.err(v.span().start, format!("`url` \"{s}\": {e}"));
                        None
                    }
                }),
        };
        let query = match t.get("query") {
            None => {
                self.err(
                    at,
                    "[[health.prometheus]] is missing `query`: PromQL that returns a sample while \
                     something is wrong, such as query = 'ALERTS{severity=\"critical\"}'",
                );
                None
            }
            Some(v) => self
                .string("query", v, "a PromQL string such as 'up == 0'")
                .and_then(|s| {
                    if s.trim().is_empty() {
                        self.err(
                            v.span().start,
                            "`query` is empty; give PromQL that returns a sample while something \
                             is wrong, such as 'up == 0'",
                        );
                        None
                    } else if s.len() > MAX_QUERY_LEN {
                        self.err(
                            v.span().start,
                            format!(
                                "`query` is {} bytes long; at most {MAX_QUERY_LEN} are allowed",
                                s.len()
                            ),
                        );
                        None
                    } else {
                        Some(s.trim().to_owned())
                    }
                }),
        };
        let timeout = match t.get("timeout") {
            None => Some(DEFAULT_QUERY_TIMEOUT),
            Some(v) => self.duration("timeout", v, false).and_then(|d| {
                if d > MAX_QUERY_TIMEOUT {
                    self.err(
                        v.span().start,
                        format!(
                            "`timeout` {} is longer than the {} allowed; a slow check holds \
                             every rollout step",
                            humantime::format_duration(d),
                            humantime::format_duration(MAX_QUERY_TIMEOUT)
                        ),
                    );
                    None
                } else {
                    Some(d)
                }
            }),
        };
        let on_unreachable = match t.get("on_unreachable") {
            None => Some(OnUnreachable::Hold),
            Some(v) => {
                let expected = "\"hold\" or \"ignore\"";
                match self.string("on_unreachable", v, expected) {
                    Some("hold") => Some(OnUnreachable::Hold),
                    Some("ignore") => Some(OnUnreachable::Ignore),
                    Some(other) => {
                        let hint = nearest(other, ["hold", "ignore"])
                            .map(|n| format!("; did you mean \"{n}\"?"))
                            .unwrap_or_default();
                        self.err(
                            v.span().start,
                            format!("`on_unreachable` must be {expected}; found \"{other}\"{hint}"),
                        );
                        None
                    }
                    None => None,
                }
            }
        };
        if self.diags.len() != before {
            return None;
        }
        Some(PrometheusCheck {
            url: url?,
            query: query?,
            timeout: timeout?,
            on_unreachable: on_unreachable?,
        })
    }
}

/// A Prometheus base URL: http or https, a host, no query or fragment.
/// Returned without a trailing slash.
fn check_url(s: &str) -> Result<String, String> {
    let uri: http::Uri = s
        .parse()
        .map_err(|e| format!("not a URL ({e}); such as \"http://prometheus.monitoring:9090\""))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(
            "must start with http:// or https://, such as \"http://prometheus.monitoring:9090\""
                .to_owned(),
        ),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("has no host; such as \"http://prometheus.monitoring:9090\"".to_owned());
    }
    if uri.query().is_some() || s.contains('#') {
        return Err(
            "must not carry a query string or fragment; give the server's base URL, drover \
             appends /api/v1/query"
                .to_owned(),
        );
    }
    if s.contains('@') {
        return Err("must not carry credentials".to_owned());
    }
    Ok(s.trim_end_matches('/').to_owned())
}

/// A Kubernetes condition type: a name, optionally DNS-prefixed.
fn is_condition_type(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 316
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_env;

    fn env(body: &str) -> Result<HealthSpec, Vec<String>> {
        let text = format!("version = \"1.0.0\"\n{body}");
        parse_env("environments/stage.toml", "stage", &text)
            .map(|e| e.health)
            .map_err(|d| {
                d.iter()
                    .map(|d| d.to_string().replacen(" error: ", " ", 1))
                    .collect()
            })
    }

    #[test]
    fn defaults_when_absent() {
        let h = env("").unwrap();
        assert_eq!(h, HealthSpec::default());
        assert_eq!(h.settle, Duration::from_secs(1800));
        assert_eq!(h.pod_ready_timeout, Duration::from_secs(600));
        assert_eq!(h.node_conditions.len(), 4);
    }

    #[test]
    fn every_key_parses() {
        let h = env(
            "[health]\nsettle = \"0s\"\npod_ready_timeout = \"2m\"\nnode_conditions = [\"example.com/KernelDeadlock\"]\n\
             [[health.prometheus]]\nurl = \"http://prom.monitoring:9090/\"\nquery = 'up == 0'\n\
             [[health.prometheus]]\nurl = \"https://thanos:443/prefix\"\nquery = 'ALERTS'\ntimeout = \"30s\"\non_unreachable = \"ignore\"\n",
        )
        .unwrap();
        assert_eq!(h.settle, Duration::ZERO);
        assert_eq!(h.pod_ready_timeout, Duration::from_secs(120));
        assert_eq!(
            h.node_conditions,
            vec!["example.com/KernelDeadlock".to_string()]
        );
        assert_eq!(h.prometheus[0].url, "http://prom.monitoring:9090");
        assert_eq!(h.prometheus[0].timeout, DEFAULT_QUERY_TIMEOUT);
        assert_eq!(h.prometheus[0].on_unreachable, OnUnreachable::Hold);
        assert_eq!(h.prometheus[1].url, "https://thanos:443/prefix");
        assert_eq!(h.prometheus[1].on_unreachable, OnUnreachable::Ignore);
    }

    #[test]
    fn errors_name_file_line_column_and_what_is_valid() {
        let errs = env(
            "[health]\nsetle = \"5m\"\npod_ready_timeout = \"0s\"\nnode_conditions = [\"Ready\", \"Mem Pressure\"]\n\
             [[health.prometheus]]\nurl = \"ftp://x\"\n\
             [[health.prometheus]]\nurl = \"http://p:9090?x=1\"\nquery = 'up'\ntimeout = \"10m\"\non_unreachable = \"hld\"\n",
        )
        .unwrap_err();
        let want = [
            "environments/stage.toml:3:1: unknown key `setle` in [health]; did you mean `settle`?",
            "environments/stage.toml:4:21: `pod_ready_timeout` must be longer than zero",
            "environments/stage.toml:5:20: `node_conditions` cannot list \"Ready\"",
            "environments/stage.toml:5:29: `node_conditions` entry \"Mem Pressure\" is not a condition type",
            "environments/stage.toml:7:7: `url` \"ftp://x\": must start with http:// or https://",
            "environments/stage.toml:6:1: [[health.prometheus]] is missing `query`",
            "environments/stage.toml:9:7: `url` \"http://p:9090?x=1\": must not carry a query string",
            "environments/stage.toml:11:11: `timeout` 10m is longer than the 2m allowed",
            "environments/stage.toml:12:18: `on_unreachable` must be \"hold\" or \"ignore\"; found \"hld\"; did you mean \"hold\"?",
        ];
        for w in want {
            assert!(
                errs.iter().any(|e| e.starts_with(w)),
                "missing {w:?} in {errs:#?}"
            );
        }
        assert_eq!(errs.len(), want.len(), "{errs:#?}");
    }

    #[test]
    fn wrong_types_are_named() {
        let errs = env("health = 3\n").unwrap_err();
        assert!(errs[0].contains("`health` must be a table"), "{errs:?}");
        let errs = env("[health]\nsettle = 30\nprometheus = \"x\"\n").unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.contains("`settle` must be a duration string")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("`prometheus` must be an array of tables")),
            "{errs:?}"
        );
    }
}
