//! The records of earlier agents, kept only to migrate them once
//! (docs/design.md, "The node record"): their progress lived in the Node's
//! own annotations (`drover.dev/state`, `target`, `started-at`, ...) and in
//! the labels and annotations of their driver Jobs. A Node's annotations
//! are written by its kubelet and by anyone with `patch nodes`, so what
//! they say is migrated only as far as something drover wrote corroborates
//! it (a drover Job of the node: only drover creates Jobs in its
//! namespace) or the result cannot choose a version ([`migrate`]). After
//! the migration these annotations are never read as records again: the
//! agent names any it finds and ignores them.

use super::{NodeProgress, NodeRecord, ProgressState, RecordError, RunAction, RunLink};
use chrono::{DateTime, SecondsFormat, Utc};
use semver::Version;
use std::collections::BTreeMap;

/// Annotation: the state (`draining`, `upgrading`, `watching`, `passed`,
/// `blocked`, `failed`, `rolling-back`, `preparing`).
pub const ANN_STATE: &str = "drover.dev/state";
/// Annotation: the version the node was being moved to.
pub const ANN_TARGET: &str = "drover.dev/target";
/// Annotation: RFC 3339 time the state's episode began.
pub const ANN_STARTED_AT: &str = "drover.dev/started-at";
/// Annotation: `"true"` when drover cordoned the node.
pub const ANN_CORDONED: &str = "drover.dev/cordoned";
/// Annotation: why blocked or failed.
pub const ANN_MESSAGE: &str = "drover.dev/message";
/// Annotation: a person's retry request (now on the record).
pub const ANN_RETRY: &str = "drover.dev/retry";
/// Annotation: drain retries.
pub const ANN_ATTEMPTS: &str = "drover.dev/attempts";
/// Annotation: the version the node ran before.
pub const ANN_PREVIOUS: &str = "drover.dev/previous-version";
/// Annotation: versions the node was rolled back from, comma-separated.
pub const ANN_ROLLED_BACK: &str = "drover.dev/rolled-back";

/// Every annotation of the earlier records, in a stable order: what the
/// migration removes from a node, and what the agent names and ignores
/// when it finds one afterwards.
pub const ALL_ANNOTATIONS: [&str; 9] = [
    ANN_STATE,
    ANN_TARGET,
    ANN_STARTED_AT,
    ANN_CORDONED,
    ANN_MESSAGE,
    ANN_RETRY,
    ANN_ATTEMPTS,
    ANN_PREVIOUS,
    ANN_ROLLED_BACK,
];

/// Job annotation of earlier agents: the run's `DROVER_ACTION`.
pub const JOB_ACTION: &str = "drover.dev/action";
/// Job annotation of earlier agents: the version the run installs.
pub const JOB_VERSION: &str = "drover.dev/target";
/// Job annotation of earlier agents: the started-at of its record.
pub const JOB_STARTED_AT: &str = "drover.dev/started-at";

fn invalid(field: &'static str, value: &str, why: impl Into<String>) -> RecordError {
    RecordError::Invalid {
        field,
        value: value.into(),
        why: why.into(),
    }
}

/// The progress an earlier agent recorded in `annotations`: `Ok(None)`
/// without `drover.dev/state`.
pub fn decode(annotations: &BTreeMap<String, String>) -> Result<Option<NodeProgress>, RecordError> {
    let Some(state) = annotations.get(ANN_STATE) else {
        return Ok(None);
    };
    let state = ProgressState::parse(state).ok_or_else(|| {
        invalid(
            ANN_STATE,
            state,
            "expected preparing, draining, upgrading, watching, passed, blocked, failed or \
             rolling-back",
        )
    })?;
    let get = |key: &'static str| annotations.get(key).ok_or(RecordError::Missing(key));
    let target_s = get(ANN_TARGET)?;
    let target =
        Version::parse(target_s).map_err(|e| invalid(ANN_TARGET, target_s, e.to_string()))?;
    let started_s = get(ANN_STARTED_AT)?;
    let started_at = DateTime::parse_from_rfc3339(started_s)
        .map_err(|e| invalid(ANN_STARTED_AT, started_s, e.to_string()))?
        .with_timezone(&Utc);
    let cordoned_by_drover = match annotations.get(ANN_CORDONED).map(String::as_str) {
        Some("true") => true,
        Some("false") | None => false,
        Some(other) => return Err(invalid(ANN_CORDONED, other, "expected true or false")),
    };
    let retries = match annotations.get(ANN_ATTEMPTS) {
        None => 0,
        Some(a) => a
            .parse::<u32>()
            .map_err(|_| invalid(ANN_ATTEMPTS, a, "expected a whole number"))?,
    };
    let previous = annotations
        .get(ANN_PREVIOUS)
        .map(|s| Version::parse(s).map_err(|e| invalid(ANN_PREVIOUS, s, e.to_string())))
        .transpose()?;
    if state == ProgressState::RollingBack && previous.is_none() {
        return Err(RecordError::Missing(ANN_PREVIOUS));
    }
    Ok(Some(NodeProgress {
        state,
        target,
        started_at,
        cordoned_by_drover,
        message: annotations.get(ANN_MESSAGE).cloned().unwrap_or_default(),
        retries,
        previous,
    }))
}

/// The rolled-back marks an earlier agent recorded in `annotations`.
pub fn decode_rolled_back(
    annotations: &BTreeMap<String, String>,
) -> Result<Vec<Version>, RecordError> {
    let Some(list) = annotations.get(ANN_ROLLED_BACK) else {
        return Ok(Vec::new());
    };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| Version::parse(s).map_err(|e| invalid(ANN_ROLLED_BACK, list, e.to_string())))
        .collect()
}

/// The annotations an earlier agent wrote for `progress` and `rolled_back`
/// (for tests that set up a cluster as that release left it).
pub fn encode(progress: &NodeProgress, rolled_back: &[Version]) -> BTreeMap<String, String> {
    let p = progress;
    let mut a = BTreeMap::from([
        (ANN_STATE.to_string(), p.state.as_str().to_string()),
        (ANN_TARGET.to_string(), p.target.to_string()),
        (
            ANN_STARTED_AT.to_string(),
            p.started_at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        ),
        (ANN_CORDONED.to_string(), p.cordoned_by_drover.to_string()),
    ]);
    if !p.message.is_empty() {
        a.insert(ANN_MESSAGE.into(), p.message.clone());
    }
    if p.retries > 0 {
        a.insert(ANN_ATTEMPTS.into(), p.retries.to_string());
    }
    if let Some(v) = &p.previous {
        a.insert(ANN_PREVIOUS.into(), v.to_string());
    }
    if !rolled_back.is_empty() {
        let list: Vec<String> = rolled_back.iter().map(Version::to_string).collect();
        a.insert(ANN_ROLLED_BACK.into(), list.join(","));
    }
    a
}

/// A driver Job an earlier agent made for a node, as its labels and
/// annotations say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyRun {
    /// The Job's name.
    pub name: String,
    /// The Job's uid.
    pub uid: String,
    /// What it does.
    pub action: RunAction,
    /// The version it installs.
    pub version: Version,
    /// The started-at of the record it was made for.
    pub started_at: DateTime<Utc>,
    /// The previous version that record carried.
    pub previous: Option<Version>,
}

/// The run an earlier agent's Job `annotations` describe; `None` when they
/// say too little to be anyone's run.
pub fn run(name: &str, uid: &str, annotations: &BTreeMap<String, String>) -> Option<LegacyRun> {
    let version = Version::parse(annotations.get(JOB_VERSION)?).ok()?;
    let started_at = DateTime::parse_from_rfc3339(annotations.get(JOB_STARTED_AT)?)
        .ok()?
        .with_timezone(&Utc);
    let action = match annotations.get(JOB_ACTION) {
        Some(a) => RunAction::parse(a)?,
        None => RunAction::Upgrade,
    };
    let previous = match annotations.get(ANN_PREVIOUS) {
        Some(v) => Some(Version::parse(v).ok()?),
        None => None,
    };
    Some(LegacyRun {
        name: name.into(),
        uid: uid.into(),
        action,
        version,
        started_at,
        previous,
    })
}

/// What an earlier agent left on one node, and what the cluster shows of it.
#[derive(Debug, Clone)]
pub struct LegacyNode {
    /// The node.
    pub node: String,
    /// Its annotations of [`ALL_ANNOTATIONS`].
    pub annotations: BTreeMap<String, String>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// The version it runs now, when readable.
    pub version: Option<Version>,
    /// The drover Jobs of the node (in the Jobs' namespace).
    pub runs: Vec<LegacyRun>,
}

/// What the migration makes of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The record to write, if any.
    pub record: Option<NodeRecord>,
    /// What was not migrated, and why (named in an Event and the log).
    pub left: Option<String>,
}

/// Migrate `n`'s record to a [`NodeRecord`] with id `id`, the admitted
/// pin being `pin`, at `now`:
/// - rolled-back marks are kept (they only forbid);
/// - `draining` or `upgrading` with the node's upgrade Job of that drain
///   (the Job's version and started-at) continue on that Job, the version
///   it installs, its record's previous version; without one, a cordoned
///   node continues its drain toward `pin` (never the annotation's
///   target) from `now`, its previous version what it runs now;
/// - `rolling-back` continues only with its rollback Job, to the version
///   that Job installs; without one it is not migrated (left as it is, named);
/// - `blocked`, `failed`, `watching` and `passed` are migrated as they are:
///   a forged one can at most hold or fail the rollout (the fail-safe
///   direction);
/// - `preparing` (older agents) and a node whose only record is a prepare
///   Job start again from idle: a prepare moves nothing.
pub fn migrate(n: &LegacyNode, id: &str, pin: &Version, now: DateTime<Utc>) -> Migration {
    let mut record = NodeRecord::new(&n.node, id);
    let mut left = None;
    match decode_rolled_back(&n.annotations) {
        Ok(marks) => record = record.with_rolled_back(&marks),
        Err(e) => left = Some(format!("rolled-back marks not migrated: {e}")),
    }
    let progress = match decode(&n.annotations) {
        Ok(p) => p,
        Err(e) => {
            return Migration {
                record: (!record.rolled_back.is_empty()).then_some(record),
                left: Some(format!("record not migrated, unreadable: {e}")),
            }
        }
    };
    let of = |p: &NodeProgress, action: RunAction, version: &Version| {
        n.runs
            .iter()
            .find(|r| r.action == action && r.version == *version && r.started_at == p.started_at)
    };
    let link = |r: &LegacyRun| RunLink {
        name: r.name.clone(),
        uid: Some(r.uid.clone()),
        action: r.action,
        version: r.version.clone(),
        attempt: 1,
        stopped: false,
    };
    let cordoned = |p: &NodeProgress| p.cordoned_by_drover && n.unschedulable;
    let progress = match progress {
        None => None,
        Some(p) if p.state == ProgressState::Preparing => None,
        Some(p) if matches!(p.state, ProgressState::Draining | ProgressState::Upgrading) => {
            match of(&p, RunAction::Upgrade, &p.target) {
                Some(r) => {
                    record.attempt = 1;
                    record.run = Some(link(r));
                    Some(NodeProgress {
                        state: ProgressState::Draining,
                        target: r.version.clone(),
                        cordoned_by_drover: cordoned(&p),
                        previous: r.previous.clone(),
                        ..p
                    })
                }
                None if n.unschedulable => {
                    let draining = NodeProgress {
                        state: ProgressState::Draining,
                        target: pin.clone(),
                        started_at: now,
                        cordoned_by_drover: cordoned(&p),
                        message: String::new(),
                        retries: p.retries,
                        previous: n.version.clone(),
                    };
                    return Migration {
                        record: Some(record.start(draining)),
                        left,
                    };
                }
                None => {
                    left = Some(format!(
                        "a {} record on a node that is not cordoned, without its upgrade Job: \
                         not migrated",
                        p.state.as_str()
                    ));
                    None
                }
            }
        }
        Some(p) if p.state == ProgressState::RollingBack => {
            let back = p.previous.clone().unwrap_or_else(|| p.target.clone());
            match of(&p, RunAction::Rollback, &back) {
                Some(r) => {
                    record.attempt = 1;
                    record.run = Some(link(r));
                    record.rollbacks = vec![super::Rollbacks {
                        version: p.target.clone(),
                        started: 1,
                    }];
                    Some(NodeProgress {
                        cordoned_by_drover: cordoned(&p),
                        previous: Some(r.version.clone()),
                        ..p
                    })
                }
                None => {
                    left = Some(
                        "a rolling-back record without its rollback Job: not migrated, the node \
                         is left as it is"
                            .into(),
                    );
                    None
                }
            }
        }
        Some(p) => Some(NodeProgress {
            cordoned_by_drover: cordoned(&p),
            ..p
        }),
    };
    let record = record.with_progress(progress);
    let keep = record.progress.is_some() || !record.rolled_back.is_empty();
    Migration {
        record: keep.then_some(record),
        left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        format!("2026-12-08T02:{s}Z").parse().unwrap()
    }

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    fn progress(state: ProgressState) -> NodeProgress {
        NodeProgress {
            state,
            target: v("1.13.0"),
            started_at: t("00:00"),
            cordoned_by_drover: state.in_flight(),
            message: String::new(),
            retries: 0,
            previous: Some(v("1.12.0")),
        }
    }

    fn node(p: Option<NodeProgress>, runs: Vec<LegacyRun>) -> LegacyNode {
        LegacyNode {
            node: "a-2".into(),
            annotations: p.map(|p| encode(&p, &[v("1.11.0")])).unwrap_or_default(),
            unschedulable: true,
            version: Some(v("1.12.0")),
            runs,
        }
    }

    fn job(action: RunAction, version: &str) -> LegacyRun {
        LegacyRun {
            name: "drover-a-2-1-13-0-abc".into(),
            uid: "u-1".into(),
            action,
            version: v(version),
            started_at: t("00:00"),
            previous: Some(v("1.12.0")),
        }
    }

    #[test]
    fn annotations_round_trip_as_an_earlier_agent_wrote_them() {
        let p = progress(ProgressState::Failed);
        let a = encode(&p, &[v("1.11.0")]);
        assert_eq!(decode(&a), Ok(Some(p)));
        assert_eq!(decode_rolled_back(&a), Ok(vec![v("1.11.0")]));
        assert_eq!(decode(&BTreeMap::new()), Ok(None));
    }

    #[test]
    fn an_upgrade_under_way_continues_on_its_job_and_its_version() {
        let n = node(
            Some(progress(ProgressState::Draining)),
            vec![job(RunAction::Upgrade, "1.13.0")],
        );
        let m = migrate(&n, "id", &v("1.14.0"), t("30:00"));
        let r = m.record.unwrap();
        let p = r.progress.as_ref().unwrap();
        assert_eq!(
            (p.state, &p.target),
            (ProgressState::Draining, &v("1.13.0"))
        );
        let run = r.run.unwrap();
        assert_eq!(run.uid.as_deref(), Some("u-1"));
        assert_eq!(r.rolled_back, vec![v("1.11.0")]);
        assert_eq!(m.left, None);
    }

    #[test]
    fn a_drain_without_its_job_continues_toward_the_pin_never_the_annotations_target() {
        let mut forged = progress(ProgressState::Draining);
        forged.target = v("1.0.0");
        forged.previous = Some(v("0.9.0"));
        let n = node(Some(forged), vec![]);
        let r = migrate(&n, "id", &v("1.13.0"), t("30:00")).record.unwrap();
        let p = r.progress.as_ref().unwrap();
        assert_eq!(p.target, v("1.13.0"));
        assert_eq!(
            p.previous,
            Some(v("1.12.0")),
            "what it runs, not what it says"
        );
        assert_eq!(p.started_at, t("30:00"));
        assert_eq!(r.run.unwrap().version, v("1.13.0"));
        // On a node that is not cordoned it is not migrated at all.
        let mut n = node(Some(progress(ProgressState::Draining)), vec![]);
        n.unschedulable = false;
        let m = migrate(&n, "id", &v("1.13.0"), t("30:00"));
        assert!(m.record.unwrap().progress.is_none());
        assert!(m.left.unwrap().contains("not cordoned"));
    }

    #[test]
    fn a_rollback_is_migrated_only_with_its_rollback_job() {
        let forged = node(Some(progress(ProgressState::RollingBack)), vec![]);
        let m = migrate(&forged, "id", &v("1.13.0"), t("30:00"));
        assert!(m.record.unwrap().progress.is_none(), "marks only");
        assert!(m.left.unwrap().contains("rolling-back"));
        let real = node(
            Some(progress(ProgressState::RollingBack)),
            vec![job(RunAction::Rollback, "1.12.0")],
        );
        let r = migrate(&real, "id", &v("1.13.0"), t("30:00"))
            .record
            .unwrap();
        assert_eq!(
            r.progress.as_ref().unwrap().state,
            ProgressState::RollingBack
        );
        assert_eq!(r.rollbacks_from(&v("1.13.0")), 1);
    }

    #[test]
    fn given_back_records_migrate_as_they_are_and_preparing_starts_again() {
        for s in [
            ProgressState::Blocked,
            ProgressState::Failed,
            ProgressState::Watching,
            ProgressState::Passed,
        ] {
            let r = migrate(
                &node(Some(progress(s)), vec![]),
                "id",
                &v("1.13.0"),
                t("30:00"),
            );
            assert_eq!(r.record.unwrap().progress.unwrap().state, s);
        }
        let r = migrate(
            &node(Some(progress(ProgressState::Preparing)), vec![]),
            "id",
            &v("1.13.0"),
            t("30:00"),
        );
        assert!(r.record.unwrap().progress.is_none());
        let none = LegacyNode {
            annotations: BTreeMap::new(),
            ..node(None, vec![job(RunAction::Prepare, "1.13.0")])
        };
        assert_eq!(migrate(&none, "id", &v("1.13.0"), t("30:00")).record, None);
    }
}
