//! Parsing and validation of the config files.
//!
//! The files are parsed into toml's spanned tables and walked by hand rather
//! than deserialized: that way every problem of every file is collected (not
//! just the first), and each one points at the key or value at fault.

use super::files::EntryKind;
use super::selector::LabelSelector;
use super::{
    DriverSpec, EnvConfig, Evidence, Files, MaxUnavailable, NodesSpec, OnDrainTimeout,
    PromotionSpec, RepoConfig, RolloutSpec, RootConfig, DEFAULT_BOTTLEROCKET_IMAGE,
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_EVIDENCE, DEFAULT_MAX_UNAVAILABLE, DEFAULT_NODE_SELECTOR,
    DEFAULT_NODE_TIMEOUT, DEFAULT_ON_DRAIN_TIMEOUT, DEFAULT_SOAK, DEFAULT_STATUS_BRANCH,
    DEFAULT_VERSION_REGEX, ENV_DIR, ROOT_FILE,
};
use crate::diag::Diagnostic;
use chrono::{DateTime, Utc};
use serde_spanned::Spanned;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Duration;
use toml::de::{DeTable, DeValue};

/// Keys of `drover.toml`, per section (`""` is the top level).
const ROOT_KEYS: &[(&str, &[&str])] = &[
    ("", &["promotion", "clusters"]),
    (
        "promotion",
        &[
            "chain",
            "evidence",
            "status_branch",
            "report_signers",
            "revoked",
        ],
    ),
];

/// Keys of an environment file, per section (`""` is the top level).
const ENV_KEYS: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "version",
            "allow_downgrade",
            "window",
            "rollout",
            "promotion",
            "driver",
            "nodes",
            "freeze",
            "health",
        ],
    ),
    ("window", &["schedule", "duration", "timezone"]),
    ("freeze", &["start", "end", "timezone", "scope", "reason"]),
    (
        "rollout",
        &[
            "max_unavailable",
            "drain_timeout",
            "node_timeout",
            "node_selector",
            "on_drain_timeout",
            "paused",
        ],
    ),
    ("promotion", &["soak"]),
    ("driver", &["kind", "image", "command"]),
    ("nodes", &["version_regex"]),
];

const DURATION_SYNTAX: &str = "a duration string such as \"20m\", \"6h\" or \"1h30m\"";

type Span = Range<usize>;
type Value<'i> = Spanned<DeValue<'i>>;

/// Load and validate the whole repository; all problems are returned together.
pub fn load(files: &dyn Files) -> Result<RepoConfig, Vec<Diagnostic>> {
    load_at(files, Utc::now())
}

/// [`load`] as of `now`. Validation no longer depends on the time (windows
/// may overlap, so nothing is measured from `now`); kept for `check --now`.
pub fn load_at(files: &dyn Files, _now: DateTime<Utc>) -> Result<RepoConfig, Vec<Diagnostic>> {
    let mut diags = Vec::new();

    let root = match read_text(files, ROOT_FILE) {
        Ok(text) => {
            let parsed = root_inner(ROOT_FILE, &text);
            diags.extend(parsed.diags.iter().cloned());
            Some((text, parsed))
        }
        Err(d) => {
            diags.push(d);
            None
        }
    };

    // Anything in environments/ but `<env>.toml` regular files is reported,
    // never silently skipped (a stray entry is usually a mistake).
    let mut on_disk: Vec<String> = Vec::new();
    for entry in files.list(ENV_DIR) {
        match (entry.kind, entry.name.strip_suffix(".toml")) {
            (EntryKind::File, Some(name)) => on_disk.push(name.to_owned()),
            (kind, _) => diags.push(super::files::stray_entry(&entry.name, kind)),
        }
    }

    // Environments to parse: the chain's (valid names only, so a name like
    // `../x` never becomes a path) and every file on disk.
    let mut names: BTreeSet<String> = on_disk.iter().cloned().collect();
    if let Some((_, r)) = &root {
        names.extend(r.chain.iter().map(|(n, _)| n.clone()));
    }

    let mut envs = BTreeMap::new();
    for name in &names {
        if !on_disk.contains(name) {
            continue;
        }
        let path = env_path(name);
        match read_text(files, &path) {
            Ok(text) => match env_inner(&path, name, &text) {
                Ok(env) => {
                    envs.insert(name.clone(), env);
                }
                Err(d) => diags.extend(d),
            },
            Err(d) => diags.push(d),
        }
    }

    if let Some((text, r)) = &root {
        for (name, span) in &r.chain {
            if !on_disk.contains(name) {
                diags.push(Diagnostic::at(
                    ROOT_FILE,
                    text,
                    span.start,
                    format!(
                        "environment `{name}` has no file `{}`; create it or remove `{name}` \
                         from the chain",
                        env_path(name)
                    ),
                ));
            }
        }
        if r.chain_known {
            for name in &on_disk {
                if !r.chain.iter().any(|(n, _)| n == name) {
                    let path = env_path(name);
                    let text = read_text(files, &path).unwrap_or_default();
                    diags.push(Diagnostic::at(
                        path,
                        &text,
                        0,
                        format!(
                            "environment `{name}` is not in [promotion] chain of {ROOT_FILE} \
                             ({}); add it to the chain or delete this file",
                            quoted_list(r.chain.iter().map(|(n, _)| n.as_str()))
                        ),
                    ));
                }
            }
        }
    }

    diags.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
    diags.dedup();
    match root {
        Some((
            _,
            RootParsed {
                config: Some(root), ..
            },
        )) if diags.is_empty() => Ok(RepoConfig { root, envs }),
        _ if diags.is_empty() => Err(vec![Diagnostic::file(
            ROOT_FILE,
            "the configuration could not be read",
        )]),
        _ => Err(diags),
    }
}

/// Parse and validate `drover.toml` from its text.
pub fn parse_root(file: &str, text: &str) -> Result<RootConfig, Vec<Diagnostic>> {
    let parsed = root_inner(file, text);
    match parsed.config {
        Some(c) if parsed.diags.is_empty() => Ok(c),
        _ => Err(parsed.diags),
    }
}

/// Parse and validate an environment file from its text.
pub fn parse_env(file: &str, name: &str, text: &str) -> Result<EnvConfig, Vec<Diagnostic>> {
    env_inner(file, name, text)
}

/// Path of the file of environment `name`.
fn env_path(name: &str) -> String {
    format!("{ENV_DIR}/{name}.toml")
}

fn read_text(files: &dyn Files, path: &str) -> Result<String, Diagnostic> {
    let bytes = files
        .read(path)
        .map_err(|why| Diagnostic::file(path, why))?
        .ok_or_else(|| {
            let why = if path == ROOT_FILE {
                format!("missing file `{path}`: a config repository needs {ROOT_FILE} at its root")
            } else {
                format!("cannot read `{path}`")
            };
            Diagnostic::file(path, why)
        })?;
    String::from_utf8(bytes).map_err(|e| {
        let (valid, _) = e.as_bytes().split_at(e.utf8_error().valid_up_to());
        let text = String::from_utf8_lossy(valid);
        Diagnostic::at(
            path,
            &text,
            text.len(),
            "the file is not UTF-8 text; TOML files must be UTF-8",
        )
    })
}

/// What `drover.toml` yielded, with the positions `load` needs for
/// problems that involve other files.
struct RootParsed {
    config: Option<RootConfig>,
    /// Valid, distinct environment names of the chain and their spans.
    chain: Vec<(String, Span)>,
    /// Whether the chain was read at all (no stray-file errors otherwise).
    chain_known: bool,
    diags: Vec<Diagnostic>,
}

fn root_inner(file: &str, text: &str) -> RootParsed {
    let mut cx = Ctx::new(file, text);
    let Some(doc) = cx.parse() else {
        return RootParsed {
            config: None,
            chain: Vec::new(),
            chain_known: false,
            diags: cx.diags,
        };
    };
    let doc = doc.get_ref();
    cx.check_keys(doc, "", ROOT_KEYS);
    let promotion = cx.section(doc, "promotion", ROOT_KEYS);

    let mut chain: Vec<(String, Span)> = Vec::new();
    let mut chain_known = false;
    match promotion.and_then(|p| p.get("chain")) {
        None => {
            let at = cx.key_span(doc, "promotion").map_or(0, |s| s.start);
            cx.err_at(
                at,
                "missing required key `chain` in [promotion]: the environments, lowest first, \
                 such as chain = [\"test\", \"stage\", \"production\"]",
            );
        }
        Some(v) => match v.get_ref() {
            DeValue::Array(items) => {
                chain_known = true;
                if items.is_empty() {
                    cx.err(
                        &v.span(),
                        "`chain` must list at least one environment, lowest first, such as \
                         [\"test\", \"stage\", \"production\"]",
                    );
                }
                for item in items.iter() {
                    let Some(name) = cx.want_str("chain", item, "an environment name") else {
                        continue;
                    };
                    if let Err(why) = check_dns_label(name) {
                        cx.err(
                            &item.span(),
                            format!("environment name \"{name}\" is not valid: {why}"),
                        );
                    } else if chain.iter().any(|(n, _)| n == name) {
                        cx.err(
                            &item.span(),
                            format!(
                                "environment `{name}` appears twice in the chain; each \
                                 environment has one place in the promotion order"
                            ),
                        );
                    } else {
                        chain.push((name.to_owned(), item.span()));
                    }
                }
            }
            other => cx.type_err(
                "chain",
                &v.span(),
                "an array of environment names such as [\"test\", \"stage\", \"production\"]",
                other,
            ),
        },
    }

    let evidence = match promotion.and_then(|p| p.get("evidence")) {
        None => DEFAULT_EVIDENCE,
        Some(v) => match cx.one_of("evidence", v, &["status", "history"]) {
            Some("history") => Evidence::History,
            _ => Evidence::Status,
        },
    };

    let status_branch = match promotion.and_then(|p| p.get("status_branch")) {
        None => DEFAULT_STATUS_BRANCH.to_owned(),
        Some(v) => match cx.want_str(
            "status_branch",
            v,
            "a branch name such as \"drover/status\"",
        ) {
            Some(b) if git2::Reference::is_valid_name(&format!("refs/heads/{b}")) => b.to_owned(),
            Some(b) => {
                cx.err(
                    &v.span(),
                    format!(
                        "`status_branch` must be a valid git branch name such as \
                         \"drover/status\"; found \"{b}\""
                    ),
                );
                String::new()
            }
            None => String::new(),
        },
    };

    // Which file is checked is the admission's concern (src/admit/): here
    // only that it is a relative path inside the repository.
    let report_signers = promotion
        .and_then(|p| p.get("report_signers"))
        .and_then(|v| {
            let s = cx.want_str(
                "report_signers",
                v,
                "a path such as \"agents.allowed_signers\"",
            )?;
            if s.is_empty() || s.starts_with('/') || s.split('/').any(|c| c == ".." || c.is_empty())
            {
                cx.err(
                    &v.span(),
                    format!(
                        "`report_signers` must be a relative path inside the repository such as \
                     \"agents.allowed_signers\"; found \"{s}\""
                    ),
                );
                return None;
            }
            Some(s.to_owned())
        });

    let revoked = match promotion.and_then(|p| p.get("revoked")) {
        None => Vec::new(),
        Some(v) => parse_revoked(&mut cx, v),
    };

    let mut clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    match doc.get("clusters") {
        None => {}
        Some(v) => match v.get_ref() {
            DeValue::Table(t) => {
                // Source order, so "already listed" points at the later line.
                let mut entries: Vec<_> = t.iter().collect();
                entries.sort_by_key(|(k, _)| k.span().start);
                for (k, v) in entries {
                    let env = k.get_ref().as_ref();
                    if chain_known && !chain.iter().any(|(n, _)| n == env) {
                        let names: Vec<&str> = chain.iter().map(|(n, _)| n.as_str()).collect();
                        let hint = nearest(env, names.iter().copied())
                            .map(|s| format!("; did you mean `{s}`?"))
                            .unwrap_or_default();
                        cx.err(
                            &k.span(),
                            format!(
                                "[clusters] lists `{env}`, which is not in the chain{hint} \
                                 (chain: {})",
                                quoted_list(names.iter().copied())
                            ),
                        );
                    }
                    let DeValue::Array(items) = v.get_ref() else {
                        cx.type_err(
                            env,
                            &v.span(),
                            "an array of cluster names such as [\"prod-eu-1\"]",
                            v.get_ref(),
                        );
                        continue;
                    };
                    let mut list = Vec::new();
                    for item in items.iter() {
                        let Some(c) = cx.want_str(env, item, "a cluster name") else {
                            continue;
                        };
                        if let Err(why) = check_dns_label(c) {
                            cx.err(
                                &item.span(),
                                format!("cluster name \"{c}\" is not valid: {why}"),
                            );
                        } else if let Some(first) = owner.get(c) {
                            let msg = if first == env {
                                format!("cluster `{c}` is listed twice for `{env}`")
                            } else {
                                format!(
                                    "cluster `{c}` is already listed for `{first}`; a cluster \
                                     belongs to one environment"
                                )
                            };
                            cx.err(&item.span(), msg);
                        } else {
                            owner.insert(c.to_owned(), env.to_owned());
                            list.push(c.to_owned());
                        }
                    }
                    clusters.insert(env.to_owned(), list);
                }
            }
            other => cx.type_err(
                "clusters",
                &v.span(),
                "a table of environment = [cluster names]",
                other,
            ),
        },
    }

    if evidence == Evidence::Status && chain.len() > 1 {
        let below_top = chain.len() - 1;
        for (i, (env, span)) in chain.iter().enumerate().take(below_top) {
            if clusters.get(env).is_some_and(|c| !c.is_empty()) {
                continue;
            }
            let upper = chain.get(i + 1).map_or("", |(n, _)| n.as_str());
            let at = doc
                .get("clusters")
                .and_then(|c| c.get_ref().as_table())
                .and_then(|t| t.get_key_value(env.as_str()))
                .map_or(span.start, |(k, _)| k.span().start);
            cx.err_at(
                at,
                format!(
                    "environment `{env}` lists no clusters, but with evidence = \"status\" \
                     promoting to `{upper}` needs confirmations from `{env}`'s clusters; add \
                     `{env} = [\"<cluster>\"]` under [clusters] or set evidence = \"history\""
                ),
            );
        }
    }

    let config = RootConfig {
        chain: chain.iter().map(|(n, _)| n.clone()).collect(),
        evidence,
        status_branch,
        report_signers,
        revoked,
        clusters,
    };
    RootParsed {
        config: Some(config),
        chain,
        chain_known,
        diags: cx.diags,
    }
}

fn env_inner(file: &str, name: &str, text: &str) -> Result<EnvConfig, Vec<Diagnostic>> {
    let mut cx = Ctx::new(file, text);
    let Some(doc) = cx.parse() else {
        return Err(cx.diags);
    };
    let doc = doc.get_ref();
    cx.check_keys(doc, "", ENV_KEYS);

    let version = match doc.get("version") {
        None => {
            cx.err_at(
                0,
                "missing required key `version`: the exact OS version this environment runs, \
                 such as version = \"1.13.2\"",
            );
            None
        }
        Some(v) => {
            let s = cx.want_str("version", v, "an exact version string such as \"1.13.2\"");
            s.and_then(|s| match parse_version(s) {
                Ok(ver) => Some(ver),
                Err(msg) => {
                    cx.err(&v.span(), msg);
                    None
                }
            })
        }
    };

    let allow_downgrade = match doc.get("allow_downgrade") {
        None => false,
        Some(v) => cx.want_bool("allow_downgrade", v).unwrap_or(false),
    };

    let windows = cx.windows(doc);
    let freezes = cx.freezes(doc, windows[0].timezone);

    let rollout = cx.section(doc, "rollout", ENV_KEYS);
    let max_unavailable = match rollout.and_then(|t| t.get("max_unavailable")) {
        None => DEFAULT_MAX_UNAVAILABLE,
        Some(v) => cx.max_unavailable(v).unwrap_or(DEFAULT_MAX_UNAVAILABLE),
    };
    let drain = cx.duration(rollout, "drain_timeout", DEFAULT_DRAIN_TIMEOUT, false);
    let node = cx.duration(rollout, "node_timeout", DEFAULT_NODE_TIMEOUT, false);
    if node.0 < drain.0 {
        let at = node.1.clone().or(drain.1.clone()).unwrap_or(0..0);
        cx.err(
            &at,
            format!(
                "`node_timeout` ({}) is shorter than `drain_timeout` ({}); it counts from the \
                 start of the drain, so it must be at least as long",
                humantime::format_duration(node.0),
                humantime::format_duration(drain.0)
            ),
        );
    }
    let node_selector = match rollout.and_then(|t| t.get("node_selector")) {
        None => DEFAULT_NODE_SELECTOR.to_owned(),
        Some(v) => match cx.want_str(
            "node_selector",
            v,
            "a label selector string such as \"node-role.kubernetes.io/worker\"",
        ) {
            Some(s) => match LabelSelector::parse(s) {
                Ok(_) => s.trim().to_owned(),
                Err(e) => {
                    cx.err(&v.span(), format!("`node_selector` \"{s}\": {e}"));
                    String::new()
                }
            },
            None => String::new(),
        },
    };
    let on_drain_timeout = match rollout.and_then(|t| t.get("on_drain_timeout")) {
        None => DEFAULT_ON_DRAIN_TIMEOUT,
        Some(v) => match cx.one_of("on_drain_timeout", v, &["skip", "stop"]) {
            Some("stop") => OnDrainTimeout::Stop,
            _ => OnDrainTimeout::Skip,
        },
    };

    let paused = match rollout.and_then(|t| t.get("paused")) {
        None => false,
        Some(v) => cx.want_bool("paused", v).unwrap_or(false),
    };

    let promotion = cx.section(doc, "promotion", ENV_KEYS);
    let soak = cx.duration(promotion, "soak", DEFAULT_SOAK, true).0;

    let driver_table = cx.section(doc, "driver", ENV_KEYS);
    let driver = cx.driver(doc, driver_table);

    let nodes = cx.section(doc, "nodes", ENV_KEYS);
    let version_regex = match nodes.and_then(|t| t.get("version_regex")) {
        None => regex::Regex::new(DEFAULT_VERSION_REGEX).ok(),
        Some(v) => cx
            .want_str(
                "version_regex",
                v,
                "a regular expression string such as '(\\d+\\.\\d+\\.\\d+)'",
            )
            .and_then(|s| match regex::Regex::new(s) {
                Ok(re) if re.captures_len() >= 2 => Some(re),
                Ok(_) => {
                    cx.err(
                        &v.span(),
                        format!(
                            "`version_regex` '{s}' has no capture group; wrap the version part \
                             in parentheses, such as '(\\d+\\.\\d+\\.\\d+)'"
                        ),
                    );
                    None
                }
                Err(e) => {
                    let detail = e.to_string().replace('\n', " ");
                    cx.err(
                        &v.span(),
                        format!(
                            "`version_regex` must be a valid regular expression with a capture \
                             group, such as '(\\d+\\.\\d+\\.\\d+)'; found '{s}': {detail}"
                        ),
                    );
                    None
                }
            }),
    };

    let health = super::health::parse_health(file, text, doc, &mut cx.diags);

    match (version, version_regex) {
        (Some(version), Some(version_regex)) if cx.diags.is_empty() => Ok(EnvConfig {
            name: name.to_owned(),
            version,
            allow_downgrade,
            windows,
            freezes,
            rollout: RolloutSpec {
                max_unavailable,
                drain_timeout: drain.0,
                node_timeout: node.0,
                node_selector,
                on_drain_timeout,
                paused,
            },
            promotion: PromotionSpec { soak },
            driver,
            nodes: NodesSpec { version_regex },
            health,
        }),
        _ if cx.diags.is_empty() => Err(vec![Diagnostic::file(file, "invalid environment file")]),
        _ => Err(cx.diags),
    }
}

/// A version pin: an exact semver version, nothing that could float.
/// `revoked = [{ version = "1.13.1", reason = "..." }]`: versions never rolled out again.
fn parse_revoked<'a>(cx: &mut Ctx<'a>, v: &Value<'a>) -> Vec<super::Revoked> {
    const EXPECTED: &str =
        "an array of tables such as [{ version = \"1.13.1\", reason = \"kernel panic on m7i\" }]";
    let DeValue::Array(items) = v.get_ref() else {
        cx.type_err("revoked", &v.span(), EXPECTED, v.get_ref());
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in items.iter() {
        let DeValue::Table(t) = item.get_ref() else {
            cx.type_err("revoked", &item.span(), EXPECTED, item.get_ref());
            continue;
        };
        for (k, _) in t.iter() {
            if !matches!(k.get_ref().as_ref(), "version" | "reason") {
                cx.err(
                    &k.span(),
                    format!(
                        "unknown key `{}` in a `revoked` entry; valid keys: version, reason",
                        k.get_ref()
                    ),
                );
            }
        }
        let version = match t.get("version") {
            None => {
                cx.err(
                    &item.span(),
                    "a `revoked` entry needs `version`, such as \"1.13.1\"",
                );
                continue;
            }
            Some(v) => match cx.want_str("version", v, "an exact version such as \"1.13.1\"") {
                None => continue,
                Some(s) => match parse_version(s) {
                    Ok(ver) => ver,
                    Err(why) => {
                        cx.err(
                            &v.span(),
                            format!("revoked version {s:?} is not valid: {why}"),
                        );
                        continue;
                    }
                },
            },
        };
        let reason = match t.get("reason") {
            None => {
                cx.err(
                    &item.span(),
                    "a `revoked` entry needs `reason`: why the version must never be rolled out",
                );
                continue;
            }
            Some(r) => match cx.want_str("reason", r, "a string saying why") {
                Some(r) => r.to_owned(),
                None => continue,
            },
        };
        out.push(super::Revoked { version, reason });
    }
    out
}

pub(crate) fn parse_version(s: &str) -> Result<semver::Version, String> {
    let err = |why: &str| {
        format!("version must be an exact version such as \"1.13.2\"; found \"{s}\" ({why})")
    };
    let t = s.trim();
    if t.eq_ignore_ascii_case("latest") {
        return Err(err(
            "\"latest\" is not allowed: an environment pins the version confirmed below it",
        ));
    }
    if t.starts_with(['^', '~', '=', '<', '>', '*'])
        || t.contains(['*', ',', '|', ' '])
        || t.split('.').any(|p| p.eq_ignore_ascii_case("x"))
    {
        return Err(err(
            "a range is not allowed: an environment runs one version",
        ));
    }
    match semver::Version::parse(t) {
        Ok(v) if t == s => Ok(v),
        Ok(_) => Err(err("remove the surrounding spaces")),
        Err(e) => {
            let core = t.split(['-', '+']).next().unwrap_or(t);
            if let Some(rest) = t.strip_prefix(['v', 'V']) {
                if semver::Version::parse(rest).is_ok() {
                    return Err(err("drop the leading `v`"));
                }
            }
            if core.split('.').count() < 3 && core.split('.').all(|p| p.parse::<u64>().is_ok()) {
                return Err(err(
                    "a partial version is not allowed: give major, minor and patch",
                ));
            }
            Err(err(&e.to_string()))
        }
    }
}

/// Check a name used as a path component and a Kubernetes-style name.
fn check_dns_label(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let ok_end = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if b.is_empty() || b.len() > 63 {
        return Err("it must have 1 to 63 characters".to_owned());
    }
    if !ok_end(b.first())
        || !ok_end(b.last())
        || !b
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    {
        return Err(
            "use lowercase letters, digits and `-`, starting and ending with a letter or digit"
                .to_owned(),
        );
    }
    Ok(())
}

/// Parse a human duration: "6h", "20m", "1h30m".
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}"))
        .and_then(|d| {
            if s.trim() == s {
                Ok(d)
            } else {
                Err("remove the surrounding spaces".to_owned())
            }
        })
}

/// The candidate closest to `word`, if it is close enough to be a typo.
pub(crate) fn nearest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let w = word.to_lowercase();
    let limit = (w.chars().count() / 3).max(2);
    // An abbreviation (`prod` for `production`) is as likely as a typo.
    let abbreviates = |c: &str| w.chars().count() >= 3 && c.to_lowercase().starts_with(&w);
    candidates
        .into_iter()
        .map(|c| {
            let d = if abbreviates(c) {
                0
            } else {
                strsim::damerau_levenshtein(&w, &c.to_lowercase())
            };
            (d, c)
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn quoted_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items
        .into_iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn a_type(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// One file being validated: its text and the problems found so far.
struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    diags: Vec<Diagnostic>,
}

impl<'a> Ctx<'a> {
    fn new(file: &'a str, text: &'a str) -> Self {
        Self {
            file,
            text,
            diags: Vec::new(),
        }
    }

    fn err(&mut self, span: &Span, msg: impl Into<String>) {
        self.err_at(span.start, msg);
    }

    fn err_at(&mut self, offset: usize, msg: impl Into<String>) {
        self.diags
            .push(Diagnostic::at(self.file, self.text, offset, msg));
    }

    fn type_err(&mut self, key: &str, span: &Span, expected: &str, found: &DeValue<'_>) {
        self.err(
            span,
            format!("`{key}` must be {expected}; found {}", a_type(found)),
        );
    }

    /// The document, or `None` after recording its syntax errors.
    fn parse(&mut self) -> Option<Spanned<DeTable<'a>>> {
        let (doc, errors) = DeTable::parse_recoverable(self.text);
        if errors.is_empty() {
            return Some(doc);
        }
        for e in errors {
            let mut msg = format!("invalid TOML: {}", e.message().trim());
            let snippet = e.span().and_then(|r| self.text.get(r));
            if let Some(key) = snippet.filter(|_| e.message().contains("duplicate key")) {
                msg = format!("{msg} `{key}`: each key may appear once per table");
            }
            match e.span() {
                Some(span) => self.err(&span, msg),
                None => self.err_at(0, msg),
            }
        }
        None
    }

    fn key_span(&self, table: &DeTable<'_>, key: &str) -> Option<Span> {
        table.get_key_value(key).map(|(k, _)| k.span())
    }

    /// Report keys of `table` (section `section` of a file with `schema`)
    /// that are not valid there, suggesting the nearest valid one.
    fn check_keys(&mut self, table: &DeTable<'_>, section: &str, schema: &[(&str, &[&str])]) {
        let valid: &[&str] = schema
            .iter()
            .find(|(s, _)| *s == section)
            .map_or(&[], |(_, k)| k);
        let place = if section.is_empty() {
            "at the top level".to_owned()
        } else {
            format!("in [{section}]")
        };
        for (k, _) in table.iter() {
            let key = k.get_ref().as_ref();
            if valid.contains(&key) {
                continue;
            }
            let elsewhere = schema
                .iter()
                .find(|(s, keys)| *s != section && !s.is_empty() && keys.contains(&key))
                .map(|(s, _)| *s);
            let hint = match (elsewhere, nearest(key, valid.iter().copied())) {
                (Some(s), _) => format!("; `{key}` belongs in [{s}];"),
                (None, Some(n)) => format!("; did you mean `{n}`?"),
                (None, None) => ";".to_owned(),
            };
            self.err(
                &k.span(),
                format!(
                    "unknown key `{key}` {place}{hint} valid keys: {}",
                    valid.join(", ")
                ),
            );
        }
    }

    /// Section `name` of `doc`: `None` when absent or not a table (the
    /// latter reported); its keys are checked against `schema`.
    fn section<'t>(
        &mut self,
        doc: &'t DeTable<'a>,
        name: &str,
        schema: &[(&str, &[&str])],
    ) -> Option<&'t DeTable<'a>> {
        let v = doc.get(name)?;
        match v.get_ref() {
            DeValue::Table(t) => {
                self.check_keys(t, name, schema);
                Some(t)
            }
            other => {
                let span = self.key_span(doc, name).unwrap_or(v.span());
                self.type_err(name, &span, &format!("a table, written [{name}]"), other);
                None
            }
        }
    }

    fn want_str<'v>(&mut self, key: &str, v: &'v Value<'a>, expected: &str) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.type_err(key, &v.span(), expected, other);
                None
            }
        }
    }

    fn want_bool(&mut self, key: &str, v: &Value<'a>) -> Option<bool> {
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                self.type_err(key, &v.span(), "a boolean (true or false)", other);
                None
            }
        }
    }

    /// A string that must be one of `options`.
    fn one_of<'o>(&mut self, key: &str, v: &Value<'a>, options: &[&'o str]) -> Option<&'o str> {
        let list = options
            .iter()
            .map(|o| format!("\"{o}\""))
            .collect::<Vec<_>>()
            .join(" or ");
        let s = self.want_str(key, v, &list)?;
        if let Some(o) = options.iter().find(|o| **o == s) {
            return Some(o);
        }
        let hint = nearest(s, options.iter().copied())
            .map(|n| format!("; did you mean \"{n}\"?"))
            .unwrap_or_default();
        self.err(
            &v.span(),
            format!("`{key}` must be {list}; found \"{s}\"{hint}"),
        );
        None
    }

    /// A duration key of `table` (default when absent) and its value's span.
    fn duration(
        &mut self,
        table: Option<&DeTable<'a>>,
        key: &str,
        default: Duration,
        allow_zero: bool,
    ) -> (Duration, Option<Span>) {
        let Some(v) = table.and_then(|t| t.get(key)) else {
            return (default, None);
        };
        let Some(s) = self.want_str(key, v, DURATION_SYNTAX) else {
            return (default, Some(v.span()));
        };
        match parse_duration(s) {
            Ok(d) if d.is_zero() && !allow_zero => {
                self.err(
                    &v.span(),
                    format!("`{key}` must be longer than zero, such as \"20m\" or \"6h\""),
                );
                (default, Some(v.span()))
            }
            Ok(d) => (d, Some(v.span())),
            Err(e) => {
                self.err(
                    &v.span(),
                    format!("`{key}` must be {DURATION_SYNTAX}; found \"{s}\" ({e})"),
                );
                (default, Some(v.span()))
            }
        }
    }

    fn max_unavailable(&mut self, v: &Value<'a>) -> Option<MaxUnavailable> {
        const WHAT: &str = "an integer of at least 1 or a percentage string from \"1%\" to \
                            \"100%\", such as 1 or \"10%\"";
        match v.get_ref() {
            DeValue::Integer(i) => {
                match i64::from_str_radix(i.as_str(), i.radix()) {
                    Ok(n) if n >= 1 => match u32::try_from(n) {
                        Ok(n) => Some(MaxUnavailable::Count(n)),
                        Err(_) => {
                            self.err(&v.span(), format!("`max_unavailable` must be {WHAT}; found {n}, which is too large"));
                            None
                        }
                    },
                    Ok(n) => {
                        self.err(
                        &v.span(),
                        format!("`max_unavailable` must be {WHAT}; found {n}, which would never let a node upgrade"),
                    );
                        None
                    }
                    Err(_) => {
                        self.err(&v.span(), format!("`max_unavailable` must be {WHAT}"));
                        None
                    }
                }
            }
            DeValue::String(s) => {
                let pct = s
                    .strip_suffix('%')
                    .and_then(|n| n.parse::<u32>().ok())
                    .filter(|p| (1..=100).contains(p));
                match pct {
                    Some(p) => Some(MaxUnavailable::Percent(p)),
                    None => {
                        self.err(
                            &v.span(),
                            format!("`max_unavailable` must be {WHAT}; found \"{s}\""),
                        );
                        None
                    }
                }
            }
            other => {
                self.type_err(
                    "max_unavailable",
                    &v.span(),
                    "an integer or a percentage string such as \"10%\"",
                    other,
                );
                None
            }
        }
    }

    fn driver(&mut self, doc: &DeTable<'a>, table: Option<&DeTable<'a>>) -> DriverSpec {
        let get = |k: &str| table.and_then(|t| t.get(k));
        let kind = match get("kind") {
            None => Some("bottlerocket"),
            Some(v) => self.one_of("kind", v, &["bottlerocket", "job"]),
        };
        let image = get("image").and_then(|v| {
            let s = self.want_str("image", v, "a container image reference")?;
            if s.is_empty() || s.contains(char::is_whitespace) {
                self.err(
                    &v.span(),
                    format!(
                        "`image` must be a container image reference such as \
                         \"registry.example.com/updater:v1\"; found \"{s}\""
                    ),
                );
                return None;
            }
            Some(s.to_owned())
        });
        let command = get("command").map(|v| {
            let mut out = Vec::new();
            match v.get_ref() {
                DeValue::Array(items) => {
                    for item in items.iter() {
                        if let Some(s) = self.want_str("command", item, "a string") {
                            out.push(s.to_owned());
                        }
                    }
                }
                other => self.type_err(
                    "command",
                    &v.span(),
                    "an array of strings such as [\"/bin/update\"]",
                    other,
                ),
            }
            (out, v.span())
        });
        let header = self.key_span(doc, "driver").map_or(0, |s| s.start);
        match kind {
            Some("job") => {
                if get("image").is_none() {
                    self.err_at(
                        get("kind").map_or(header, |v| v.span().start),
                        "kind = \"job\" requires `image`, the container image of the update \
                         Job, such as image = \"registry.example.com/updater:v1\"",
                    );
                }
                if let Some((c, span)) = &command {
                    if c.first().is_none_or(|p| p.trim().is_empty()) {
                        self.err(
                            span,
                            "`command` must be a non-empty array of strings whose first element \
                             is the program, such as [\"/bin/update\", \"--to\"]",
                        );
                    }
                } else {
                    self.err_at(
                        get("kind").map_or(header, |v| v.span().start),
                        "kind = \"job\" requires `command`, a non-empty array such as \
                         command = [\"/bin/update\"]; the Job gets DROVER_TARGET_VERSION",
                    );
                }
                DriverSpec::Job {
                    image: image.unwrap_or_default(),
                    command: command.map(|(c, _)| c).unwrap_or_default(),
                }
            }
            _ => {
                if let Some((_, span)) = command.filter(|(c, _)| !c.is_empty()) {
                    self.err(
                        &span,
                        "`command` applies only to kind = \"job\"; leave it empty ([]) or set kind = \"job\"",
                    );
                }
                DriverSpec::Bottlerocket {
                    image: image.unwrap_or_else(|| DEFAULT_BOTTLEROCKET_IMAGE.to_owned()),
                }
            }
        }
    }
}

#[path = "windows.rs"]
mod windows;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WindowSpec;
    use chrono_tz::Tz;

    #[test]
    fn durations_parse_like_people_write_them() {
        assert_eq!(parse_duration("6h"), Ok(Duration::from_secs(6 * 3600)));
        assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "6", "six hours", "6 h x", "-1h", " 6h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn versions_must_be_exact() {
        assert!(parse_version("1.13.2").is_ok());
        assert!(parse_version("1.13.2-rc.1").is_ok());
        for (bad, why) in [
            ("1.13", "partial"),
            ("^1.2.3", "range"),
            (">=1.2.3", "range"),
            ("1.x", "range"),
            ("latest", "latest"),
            ("01.13.2", "leading zero"),
            ("v1.13.2", "leading `v`"),
            ("", "1.13.2"),
        ] {
            let e = parse_version(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.contains("such as \"1.13.2\""), "{bad}: {e}");
        }
    }

    #[test]
    fn max_unavailable_resolves_against_the_selected_nodes() {
        assert_eq!(MaxUnavailable::Count(2).resolve(10), 2);
        assert_eq!(MaxUnavailable::Count(5).resolve(3), 5);
        assert_eq!(MaxUnavailable::Percent(10).resolve(100), 10);
        assert_eq!(MaxUnavailable::Percent(10).resolve(15), 1);
        assert_eq!(MaxUnavailable::Percent(10).resolve(5), 1);
        assert_eq!(MaxUnavailable::Percent(100).resolve(7), 7);
        assert_eq!(MaxUnavailable::Percent(50).resolve(0), 1);
    }

    #[test]
    fn an_env_file_with_only_a_version_gets_every_default() {
        let env = parse_env("environments/test.toml", "test", "version = \"1.12.0\"\n")
            .expect("minimal file is valid");
        assert_eq!(env.version, semver::Version::new(1, 12, 0));
        assert!(!env.allow_downgrade);
        assert_eq!(env.windows, vec![WindowSpec::default()]);
        assert_eq!(env.windows[0].schedule, "0 2 1 * *");
        assert_eq!(env.windows[0].duration, Duration::from_secs(6 * 3600));
        assert_eq!(env.windows[0].timezone, Tz::UTC);
        assert!(env.freezes.is_empty());
        assert!(!env.rollout.paused);
        assert_eq!(env.rollout, RolloutSpec::default());
        assert_eq!(env.rollout.max_unavailable, MaxUnavailable::Count(1));
        assert_eq!(env.rollout.drain_timeout, Duration::from_secs(20 * 60));
        assert_eq!(env.rollout.node_timeout, Duration::from_secs(45 * 60));
        assert_eq!(env.rollout.node_selector, "");
        assert_eq!(env.rollout.on_drain_timeout, OnDrainTimeout::Skip);
        assert_eq!(env.promotion.soak, Duration::from_secs(24 * 3600));
        assert_eq!(env.driver, DriverSpec::default());
        assert_eq!(env.nodes, NodesSpec::default());
        assert_eq!(
            env.nodes
                .version_of("Bottlerocket OS 1.13.2 (aws-k8s-1.31)"),
            Some(semver::Version::new(1, 13, 2))
        );
    }

    #[test]
    fn a_root_file_with_only_a_chain_gets_every_default() {
        let root = parse_root("drover.toml", "[promotion]\nchain = [\"prod\"]\n")
            .expect("minimal root is valid");
        assert_eq!(root.chain, vec!["prod".to_owned()]);
        assert_eq!(root.evidence, Evidence::Status);
        assert_eq!(root.status_branch, "drover/status");
        assert!(root.clusters.is_empty());
    }

    #[test]
    fn several_windows_freezes_and_pause_parse() {
        let env = parse_env(
            "environments/x.toml",
            "x",
            "version = \"2.0.0\"\n\
             [[window]]\nschedule = \"0 2 * * 6\"\nduration = \"30h\"\ntimezone = \"Europe/Madrid\"\n\
             [[window]]\nschedule = \"0 1 * * 0\"\n\
             [[freeze]]\nstart = 2026-12-18T00:00:00\nend = 2027-01-04\nreason = \"holidays\"\n\
             [[freeze]]\nstart = 2026-11-01T00:00:00Z\nend = 2026-11-02T00:00:00+01:00\nscope = \"minor\"\n\
             [rollout]\npaused = true\n",
        )
        .expect("valid");
        assert_eq!(env.windows.len(), 2);
        assert_eq!(env.windows[0].duration, Duration::from_secs(30 * 3600));
        assert_eq!(env.windows[1].timezone, Tz::UTC);
        assert!(env.rollout.paused);
        assert_eq!(env.freezes.len(), 2);
        // Local times read in the first window's zone (CET, +01:00).
        assert_eq!(
            env.freezes[0].start.to_rfc3339(),
            "2026-12-17T23:00:00+00:00"
        );
        assert_eq!(env.freezes[0].end.to_rfc3339(), "2027-01-03T23:00:00+00:00");
        assert_eq!(env.freezes[0].scope, crate::config::FreezeScope::All);
        assert_eq!(env.freezes[1].scope, crate::config::FreezeScope::Minor);
        assert_eq!(env.freezes[1].end.to_rfc3339(), "2026-11-01T23:00:00+00:00");
    }

    #[test]
    fn bad_freezes_name_the_line_and_what_is_valid() {
        let errs = parse_env(
            "environments/x.toml",
            "x",
            "version = \"2.0.0\"\n[[freeze]]\nstart = 2026-12-18\nend = 2026-12-01\nscope = \"patch\"\n",
        )
        .expect_err("invalid");
        let text: Vec<String> = errs
            .iter()
            .map(|d| format!("{}: {}", d.line, d.message))
            .collect();
        assert!(
            text.iter()
                .any(|m| m.starts_with("5: ") && m.contains("\"all\" or \"minor\"")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|m| m.starts_with("4: ") && m.contains("must be after `start`")),
            "{text:?}"
        );
        let errs = parse_env(
            "environments/x.toml",
            "x",
            "version = \"2.0.0\"\n[[freeze]]\nstart = \"tomorrow\"\n",
        )
        .expect_err("invalid");
        assert!(
            errs.iter().any(|d| d.message.contains("requires `end`")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|d| d.line == 3 && d.message.contains("TOML date-time")),
            "{errs:?}"
        );
    }

    #[test]
    fn history_evidence_needs_no_clusters() {
        let root = parse_root(
            "drover.toml",
            "[promotion]\nchain = [\"a\", \"b\"]\nevidence = \"history\"\n",
        )
        .expect("valid");
        assert_eq!(root.evidence, Evidence::History);
        let errs = parse_root("drover.toml", "[promotion]\nchain = [\"a\", \"b\"]\n")
            .expect_err("status evidence needs clusters for `a`");
        assert_eq!(errs.len(), 1);
        assert_eq!((errs[0].line, errs[0].column), (2, 10));
    }

    #[test]
    fn percentages_and_job_drivers_parse() {
        let env = parse_env(
            "environments/x.toml",
            "x",
            "version = \"2.0.0\"\n[rollout]\nmax_unavailable = \"25%\"\n\
             on_drain_timeout = \"stop\"\n[driver]\nkind = \"job\"\n\
             image = \"example.com/up:1\"\ncommand = [\"/up\", \"--now\"]\n",
        )
        .expect("valid");
        assert_eq!(env.rollout.max_unavailable, MaxUnavailable::Percent(25));
        assert_eq!(env.rollout.on_drain_timeout, OnDrainTimeout::Stop);
        assert_eq!(
            env.driver,
            DriverSpec::Job {
                image: "example.com/up:1".into(),
                command: vec!["/up".into(), "--now".into()],
            }
        );
    }

    #[test]
    fn suggestions_catch_typos_only() {
        assert_eq!(
            nearest("max_unavailabel", ["max_unavailable", "drain_timeout"]),
            Some("max_unavailable")
        );
        assert_eq!(nearest("zzz", ["max_unavailable", "drain_timeout"]), None);
    }
}
