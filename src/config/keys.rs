//! Every key `drover.toml` and an environment file may hold, per section:
//! the vocabulary the grammars check a file's keys against (an unknown key
//! is named with the nearest valid one, or the section it belongs in).
//! `[health]` checks its own keys (health.rs). A leaf: the grammars of the
//! environment file, its windows and its waves all read it.

/// Keys of `drover.toml`, per section (`""` is the top level).
pub(super) const ROOT_KEYS: &[(&str, &[&str])] = &[
    ("", &["promotion", "clusters", "status"]),
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
    ("status", &["progress_interval"]),
];

/// Keys of an environment file, per section (`""` is the top level).
pub(super) const ENV_KEYS: &[(&str, &[&str])] = &[
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
            "wave",
            "drain",
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
            "on_failure",
            "max_rollbacks",
            "paused",
            "failure_budget",
            "consent_limit",
        ],
    ),
    ("promotion", &["soak"]),
    (
        "driver",
        &["kind", "image", "command", "prepare", "prestage"],
    ),
    ("nodes", &["version_regex", "os_image_regex", "brupop"]),
    (
        "drain",
        &[
            "name",
            "namespaces",
            "selector",
            "taint",
            "ladder",
            "allow_delete",
        ],
    ),
    (
        "wave",
        &[
            "clusters",
            "schedule",
            "duration",
            "timezone",
            "soak",
            "max_concurrency",
        ],
    ),
];
