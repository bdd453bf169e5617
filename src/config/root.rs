//! The grammar of `drover.toml`: `[promotion]` (chain, evidence, soak,
//! signers, revoked), `[clusters]` and `[status]` (how often progress is
//! reported).

use super::keys::ROOT_KEYS;
use super::spanned::{Ctx, Span, Value};
use super::values::{check_dns_label, nearest, parse_version, quoted_list};
use super::{
    Evidence, RootConfig, DEFAULT_EVIDENCE, DEFAULT_PROGRESS_INTERVAL, DEFAULT_STATUS_BRANCH,
    MAX_PROGRESS_INTERVAL,
};
use crate::diag::Diagnostic;
use std::collections::BTreeMap;
use toml::de::DeValue;

/// What `drover.toml` yielded, with the positions `load` needs for
/// problems that involve other files.
pub(super) struct RootParsed {
    pub(super) config: Option<RootConfig>,
    /// Valid, distinct environment names of the chain and their spans.
    pub(super) chain: Vec<(String, Span)>,
    /// Whether the chain was read at all (no stray-file errors otherwise).
    pub(super) chain_known: bool,
    pub(super) diags: Vec<Diagnostic>,
}

/// Parse `drover.toml`. `on_disk` are the environment files present
/// (`None`: not known): a name in `[clusters]` that is not in the chain is
/// then judged against them, so the suggestion points at the typo, not at
/// the name that matches a file.
pub(super) fn root_inner(file: &str, text: &str, on_disk: Option<&[String]>) -> RootParsed {
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
                        let has_file = |n: &str| on_disk.is_some_and(|d| d.iter().any(|f| f == n));
                        let hint = match nearest(env, names.iter().copied()) {
                            // The chain's name has no file and this one has:
                            // the chain holds the typo.
                            Some(s) if has_file(env) && !has_file(s) => format!(
                                "; the chain's `{s}` has no environment file and \
                                 environments/{env}.toml exists: did you mean `{env}` in the chain?"
                            ),
                            Some(s) => format!("; did you mean `{s}`?"),
                            None => String::new(),
                        };
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

    let status = cx.section(doc, "status", ROOT_KEYS);
    let (progress_interval, at) =
        cx.duration(status, "progress_interval", DEFAULT_PROGRESS_INTERVAL, true);
    let progress_interval = match at {
        Some(span) if progress_interval > MAX_PROGRESS_INTERVAL => {
            cx.err(
                &span,
                "`progress_interval` must be at most \"24h\": a report older than a day \
                 tells nothing about a rollout in progress"
                    .to_string(),
            );
            DEFAULT_PROGRESS_INTERVAL
        }
        _ => progress_interval,
    };

    let config = RootConfig {
        chain: chain.iter().map(|(n, _)| n.clone()).collect(),
        evidence,
        status_branch,
        report_signers,
        revoked,
        clusters,
        progress_interval,
    };
    RootParsed {
        config: Some(config),
        chain,
        chain_known,
        diags: cx.diags,
    }
}

/// `revoked = [{ version = "1.13.1", reason = "..." }]`: versions never rolled out again.
pub(super) fn parse_revoked<'a>(cx: &mut Ctx<'a>, v: &Value<'a>) -> Vec<super::Revoked> {
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
