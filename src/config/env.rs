//! The grammar of an environment file: target version, `[rollout]`,
//! `[nodes]` and `[driver]`. Windows, freezes and `[health]` have files of
//! their own (windows.rs, health.rs).

use super::keys::ENV_KEYS;
use super::selector::LabelSelector;
use super::spanned::{Ctx, Value};
use super::values::parse_version;
use super::waves::WaveSites;
use super::{
    DriverSpec, EnvConfig, MaxUnavailable, NodesSpec, OnDrainTimeout, OnFailure, PrepareSpec,
    PromotionSpec, RolloutSpec, DEFAULT_BOTTLEROCKET_IMAGE, DEFAULT_BOTTLEROCKET_OS_IMAGE_REGEX,
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_MAX_ROLLBACKS, DEFAULT_MAX_UNAVAILABLE, DEFAULT_NODE_SELECTOR,
    DEFAULT_NODE_TIMEOUT, DEFAULT_ON_DRAIN_TIMEOUT, DEFAULT_ON_FAILURE, DEFAULT_SOAK,
};
use crate::diag::Diagnostic;
use std::time::Duration;
use toml::de::{DeTable, DeValue};

pub(super) fn env_inner(file: &str, name: &str, text: &str) -> Result<EnvConfig, Vec<Diagnostic>> {
    env_with_sites(file, name, text).map(|(env, _)| env)
}

/// [`env_inner`], with where the file wrote its waves (for the check
/// against `drover.toml`'s clusters, `super::waves::check_clusters`).
pub(super) fn env_with_sites(
    file: &str,
    name: &str,
    text: &str,
) -> Result<(EnvConfig, WaveSites), Vec<Diagnostic>> {
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

    let on_failure = match rollout.and_then(|t| t.get("on_failure")) {
        None => DEFAULT_ON_FAILURE,
        Some(v) => match cx.one_of("on_failure", v, &["halt", "rollback"]) {
            Some("rollback") => OnFailure::Rollback,
            _ => OnFailure::Halt,
        },
    };
    let max_rollbacks = match rollout.and_then(|t| t.get("max_rollbacks")) {
        None => DEFAULT_MAX_ROLLBACKS,
        Some(v) => cx.max_rollbacks(v).unwrap_or(DEFAULT_MAX_ROLLBACKS),
    };
    let rollback_key = rollout.and_then(|t| t.get("on_failure"));
    if on_failure == OnFailure::Rollback && !has_health(doc) {
        if let Some(v) = rollback_key {
            // Without health checks no node fails after its upgrade: the
            // key would silently do nothing.
            cx.err(
                &v.span(),
                "`on_failure = \"rollback\"` needs a [health] section: a node is rolled back \
                 when it fails its health checks after the upgrade, and without [health] there \
                 are none; add [health] or use on_failure = \"halt\"",
            );
        }
    }

    // Reported, never forced: a limit of zero would report every hold at
    // once, so it must be longer than zero (absent: no limit).
    let consent_limit = rollout
        .and_then(|t| t.get("consent_limit"))
        .map(|_| {
            cx.duration(rollout, "consent_limit", Duration::ZERO, false)
                .0
        })
        .filter(|d| !d.is_zero());

    let paused = match rollout.and_then(|t| t.get("paused")) {
        None => false,
        Some(v) => cx.want_bool("paused", v).unwrap_or(false),
    };

    let promotion = cx.section(doc, "promotion", ENV_KEYS);
    let soak = cx.duration(promotion, "soak", DEFAULT_SOAK, true).0;

    let driver_table = cx.section(doc, "driver", ENV_KEYS);
    let driver = cx.driver(doc, driver_table);
    let prepare = PrepareSpec {
        // The Bottlerocket script knows `prepare`; a Job driver written
        // before the action existed would ignore DROVER_ACTION and upgrade
        // a node still in service, so a Job driver opts in.
        enabled: match driver_table.and_then(|t| t.get("prepare")) {
            None => matches!(driver, DriverSpec::Bottlerocket { .. }),
            Some(v) => cx.want_bool("prepare", v).unwrap_or(false),
        },
        prestage: cx
            .duration(driver_table, "prestage", std::time::Duration::ZERO, true)
            .0,
    };

    let nodes = cx.section(doc, "nodes", ENV_KEYS);
    let version_regex = match nodes.and_then(|t| t.get("version_regex")) {
        None => Some(super::model::default_version_regex()),
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

    let os_image_regex = match nodes.and_then(|t| t.get("os_image_regex")) {
        None => match driver {
            DriverSpec::Bottlerocket { .. } => {
                regex::Regex::new(DEFAULT_BOTTLEROCKET_OS_IMAGE_REGEX).ok()
            }
            DriverSpec::Job { .. } => None,
        },
        Some(v) => cx
            .want_str(
                "os_image_regex",
                v,
                "a regular expression string such as '^Bottlerocket OS ', or \"\" for every node",
            )
            .filter(|s| !s.is_empty())
            .and_then(|s| match regex::Regex::new(s) {
                Ok(re) => Some(re),
                Err(e) => {
                    let detail = e.to_string().replace('\n', " ");
                    cx.err(
                        &v.span(),
                        format!(
                            "`os_image_regex` must be a valid regular expression matched against \
                             a node's status.nodeInfo.osImage, such as '^Bottlerocket OS ', or \"\" \
                             for every node; found '{s}': {detail}"
                        ),
                    );
                    None
                }
            }),
    };

    let skip_brupop = match nodes.and_then(|t| t.get("brupop")) {
        None => true,
        Some(v) => match cx.want_str("brupop", v, "\"skip\" or \"take\"") {
            Some("skip") => true,
            Some("take") => false,
            Some(other) => {
                cx.err(
                    &v.span(),
                    format!(
                        "`brupop` must be \"skip\" (leave nodes the Bottlerocket update operator \
                         manages alone, the default) or \"take\" (drive them anyway); found \"{other}\""
                    ),
                );
                true
            }
            None => true,
        },
    };

    let failure_budget = match rollout.and_then(|t| t.get("failure_budget")) {
        None => 0,
        Some(v) => match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix())
                .ok()
                .and_then(|n| u32::try_from(n).ok())
            {
                Some(n) => n,
                None => {
                    cx.err(
                        &v.span(),
                        "`failure_budget` must be an integer of at least 0: how many clusters \
                         of the environment may report `failed` for a version before every \
                         cluster of it halts",
                    );
                    0
                }
            },
            other => {
                cx.type_err("failure_budget", &v.span(), "an integer such as 0", other);
                0
            }
        },
    };

    let (waves, sites) = cx.waves(doc);
    let drain_rules = cx.drain_rules(doc, drain.0);

    let health = super::health::parse_health(file, text, doc, &mut cx.diags);

    match (version, version_regex) {
        (Some(version), Some(version_regex)) if cx.diags.is_empty() => Ok((
            EnvConfig {
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
                    on_failure,
                    max_rollbacks,
                    paused,
                    failure_budget,
                    consent_limit,
                },
                promotion: PromotionSpec { soak },
                driver,
                prepare,
                nodes: NodesSpec {
                    version_regex,
                    os_image_regex,
                    skip_brupop,
                },
                health,
                waves,
                drain: drain_rules,
            },
            sites,
        )),
        _ if cx.diags.is_empty() => Err(vec![Diagnostic::file(file, "invalid environment file")]),
        _ => Err(cx.diags),
    }
}

/// Whether the file has a `[health]` table (its own validation is health.rs's).
fn has_health(doc: &DeTable<'_>) -> bool {
    matches!(
        doc.get("health").map(|v| v.get_ref()),
        Some(DeValue::Table(_))
    )
}

impl<'a> Ctx<'a> {
    /// `max_rollbacks`: a whole number from 0 (never roll back: halt at the
    /// first failure) to 1000.
    pub(super) fn max_rollbacks(&mut self, v: &Value<'a>) -> Option<u32> {
        const WHAT: &str = "a whole number from 0 to 1000: how many nodes of one cluster may be \
                            rolled back from one version before the cluster halts, such as 1";
        match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) if (0..=1000).contains(&n) => u32::try_from(n).ok(),
                Ok(n) => {
                    self.err(
                        &v.span(),
                        format!("`max_rollbacks` must be {WHAT}; found {n}"),
                    );
                    None
                }
                Err(_) => {
                    self.err(&v.span(), format!("`max_rollbacks` must be {WHAT}"));
                    None
                }
            },
            other => {
                self.type_err("max_rollbacks", &v.span(), WHAT, other);
                None
            }
        }
    }

    pub(super) fn max_unavailable(&mut self, v: &Value<'a>) -> Option<MaxUnavailable> {
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

    pub(super) fn driver(&mut self, doc: &DeTable<'a>, table: Option<&DeTable<'a>>) -> DriverSpec {
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
                if let (Some(v), Some(s)) = (get("image"), image.as_deref()) {
                    if pinned_by_digest(s) && s.ends_with(&"0".repeat(64)) {
                        self.err(
                            &v.span(),
                            format!(
                                "`image` \"{s}\" names the all-zero placeholder digest, no image: \
                                 set the digest of a pushed updater image, or leave `image` out to \
                                 use the one of this release (`drover --version` names it)"
                            ),
                        );
                    } else if !pinned_by_digest(s) {
                        self.err(
                            &v.span(),
                            format!(
                                "`image` of kind = \"bottlerocket\" must be pinned by digest, such as \
                                 \"registry.example.com/bottlerocket-updater@sha256:<64 hex digits>\": \
                                 the bottlerocket-host-access admission policy admits only the \
                                 updater image's digest (docs/drivers.md); found \"{s}\""
                            ),
                        );
                    }
                }
                DriverSpec::Bottlerocket {
                    image: image.or_else(|| DEFAULT_BOTTLEROCKET_IMAGE.map(str::to_owned)),
                }
            }
        }
    }
}

/// `REPOSITORY@sha256:<64 lowercase hex digits>`: what the admission policy
/// of `deploy/components/bottlerocket-host-access` compares.
pub(super) fn pinned_by_digest(image: &str) -> bool {
    image.rsplit_once("@sha256:").is_some_and(|(repo, hex)| {
        !repo.is_empty()
            && hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}
