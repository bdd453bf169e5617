//! Status reports (docs/design.md §5): `status/<env>/<cluster>.toml`, one
//! file per cluster on that cluster's own status branch
//! (`<status_branch>.d/<env>/<cluster>`, see [`find_store`]), rewritten by its
//! agent when its state changes. The branches' history is the record, and
//! confirmations in it are the evidence the next environment's gate reads.

mod branch;
pub mod cadence;
mod evidence;
mod read;
mod store;
mod tree;

pub use crate::status_refs::{
    cluster_branch, cluster_namespace, short_ref, Listed, MAX_STATUS_BRANCHES,
};
pub use branch::{
    Judge, Layout, ReportSigners, Untrusted, MAX_BRANCH_COMMITS, MAX_CLOCK_SKEW_SECS,
    MAX_LEGACY_COMMITS,
};
pub use evidence::confirmations_in;
pub use read::{
    find_status_branch, read_confirmations, read_confirmations_of, BranchRef, Confirmations, Error,
    Failure, Ignored, Latest, Newest, ReportVersion, Standing, Trust, MAX_REPORT_BYTES,
    MAX_SHOWN_MESSAGE,
};
pub use store::{
    find_store, judge_branch, trusted_reports, walk_store, walk_store_threads, BranchRead,
    ClusterBranch, Scope, Store, Visitor, MAX_IGNORED_REFS, MAX_READ_THREADS,
};
mod push;
pub use push::{
    build_commit, classify, probe_push, publish, publish_until, Probe, PublishOptions, Published,
    PushError, Rejection,
};

/// Turn libgit2's object cache off for the rest of the process (it is
/// process-wide), and bound how much of the pack files is mapped at once,
/// which counts in the process's resident memory once read. Every history
/// walk of drover calls this (the status reader, `drover log`, the agent's
/// source). Why off: by default the cache grows to 256 MiB, and reading a
/// fleet's status store meets every commit once, so it held the whole
/// store; bounded (4 MiB), it still held about 17 MiB of parsed trees and
/// commits on a 40,000-report store, and its eviction cost a fifth of the
/// read's time (libgit2 evicts from the front of its hash table, whose
/// probes then grow). Nothing drover reads twice needs it: a status branch
/// is read once, newest first, and delta bases have their own cache.
///
/// Also, like git itself (and `drover log`), trust the local object store
/// instead of hashing every object again on every read: each object was
/// hashed when it arrived (a fetch indexes every object of its pack by its
/// hash; drover hashes what it writes), and what a status commit signs is
/// checked against the bytes read. Re-hashing was a tenth of a store read.
pub fn bound_object_cache() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        git2::opts::enable_caching(false);
        git2::opts::strict_hash_verification(false);
        // SAFETY: these store integers in libgit2's global settings, before
        // or between reads; libgit2 applies them to caches as they fill.
        unsafe {
            let _ = git2::opts::set_mwindow_size(GIT_MAPPED_BYTES / 4);
            let _ = git2::opts::set_mwindow_mapped_limit(GIT_MAPPED_BYTES);
        }
    });
}

/// Most bytes of pack files mapped at once ([`bound_object_cache`]).
pub const GIT_MAPPED_BYTES: usize = 16 * 1024 * 1024;

use crate::rollout::RolloutState;
pub use cadence::NodeDetail;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One `status/<env>/<cluster>.toml` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusReport {
    /// Environment name.
    pub env: String,
    /// Cluster name.
    pub cluster: String,
    /// Config commit being applied.
    pub config_commit: String,
    /// Target version.
    pub version: semver::Version,
    /// Rollout state.
    pub state: RolloutState,
    /// When the cluster entered `state` (a TOML datetime, not a string).
    #[serde(with = "toml_time")]
    pub since: DateTime<Utc>,
    /// Selected nodes.
    pub nodes: u32,
    /// Selected nodes Ready at `version`.
    pub nodes_at_version: u32,
    /// Human-readable detail (why blocked or failed).
    #[serde(default)]
    pub message: String,
    /// Which nodes are at the version and which are in progress (`[detail]`);
    /// empty in reports of older agents.
    #[serde(default, skip_serializing_if = "NodeDetail::is_empty")]
    pub detail: NodeDetail,
}

impl StatusReport {
    /// Path of this report on the status branch.
    pub fn path(&self) -> String {
        report_path(&self.env, &self.cluster)
    }

    /// Serialize as the TOML file content.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Parse a report file.
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }
}

/// `status/<env>/<cluster>.toml`.
pub fn report_path(env: &str, cluster: &str) -> String {
    format!("status/{env}/{cluster}.toml")
}

/// Serde adapter writing a UTC time as a native TOML datetime, as docs/design.md §5 shows.
mod toml_time {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{
        de::Error as _, ser::Error as _, Deserialize, Deserializer, Serialize, Serializer,
    };

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        let text = t.to_rfc3339_opts(SecondsFormat::AutoSi, true);
        let dt: toml::value::Datetime = text.parse().map_err(S::Error::custom)?;
        dt.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let dt = toml::value::Datetime::deserialize(d)?;
        DateTime::parse_from_rfc3339(&dt.to_string())
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                D::Error::custom(format!(
                    "`since` must be an offset date-time such as 2026-12-01T04:12:00Z: {e}"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_round_trips_through_toml() {
        let r = StatusReport {
            env: "test".into(),
            cluster: "test-1".into(),
            config_commit: "abc".into(),
            version: "1.13.2".parse().unwrap(),
            state: RolloutState::Confirmed,
            since: "2026-12-01T04:12:00Z".parse().unwrap(),
            nodes: 12,
            nodes_at_version: 12,
            message: String::new(),
            detail: NodeDetail::default(),
        };
        let text = r.to_toml();
        assert!(text.contains("state = \"confirmed\""), "{text}");
        assert!(text.contains("since = 2026-12-01T04:12:00Z"), "{text}");
        assert_eq!(StatusReport::from_toml(&text).unwrap(), r);
    }
}
