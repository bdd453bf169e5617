//! The thin edge that fills the view model: config, windows, the gate and
//! the status branch, each through its existing reader.

use super::model::*;
use super::reports;
use crate::admit::{self, Change, GitEvidence};
use crate::audit;
use crate::config::{EnvConfig, RepoConfig};
use crate::gate::{self, wave, Decision, Reason};
use crate::status;
use crate::trust::AllowedSigners;
use crate::window::{self, Calendar};
use chrono::{DateTime, SecondsFormat, Utc};
use git2::Repository;
use std::collections::BTreeMap;

/// Errors that stop the fleet view from being built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The status branch could not be read.
    #[error(transparent)]
    Reports(#[from] reports::Error),
    /// The status branch could not be found.
    #[error(transparent)]
    Status(#[from] status::Error),
    /// The config history could not be read.
    #[error("reading the config history: {0}")]
    Audit(#[from] audit::Error),
    /// A git operation failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
}

/// Environments of `cfg` in chain order, only `only` when given.
pub(super) fn envs<'c>(cfg: &'c RepoConfig, only: Option<&str>) -> Vec<&'c EnvConfig> {
    cfg.root
        .chain
        .iter()
        .filter(|e| only.is_none_or(|o| o == e.as_str()))
        .filter_map(|e| cfg.envs.get(e))
        .collect()
}

/// The fleet at `now`: every environment (or only `only`) with its clusters'
/// latest reports, next window and the gate's answer.
pub fn gather(
    repo: &Repository,
    cfg: &RepoConfig,
    now: DateTime<Utc>,
    only: Option<&str>,
) -> Result<Fleet, Error> {
    collect(repo, cfg, now, only, None)
}

/// [`gather`] for an instant the user named (`status --now T`): `cfg` and
/// the gate's policy are those of `commit`, the config commit in force at
/// `now`, and the status store is read as it was at `now`, leaving out
/// reports of states entered after it. Only for a named instant: at the
/// wall clock's now, a report from an agent whose clock runs ahead is
/// still the newest word.
pub fn gather_at(
    repo: &Repository,
    cfg: &RepoConfig,
    commit: git2::Oid,
    now: DateTime<Utc>,
    only: Option<&str>,
) -> Result<Fleet, Error> {
    collect(repo, cfg, now, only, Some(commit))
}

fn collect(
    repo: &Repository,
    cfg: &RepoConfig,
    now: DateTime<Utc>,
    only: Option<&str>,
    at: Option<git2::Oid>,
) -> Result<Fleet, Error> {
    let as_of = at.is_some();
    let envs = envs(cfg, only);
    let mut store = status::find_store(
        repo,
        &cfg.root.status_branch,
        status::Scope::Listed(&cfg.root.clusters),
    )?;
    // Asked about a past instant: the store as it was then.
    let mut written_later = 0;
    if as_of {
        (store, written_later) = rewound(repo, cfg, &store, now)?;
    }
    let mut warnings = Vec::new();
    let head = match at {
        Some(c) => repo.find_commit(c).ok(),
        None => repo.head().and_then(|h| h.peel_to_commit()).ok(),
    };
    let snap = head
        .as_ref()
        .and_then(|h| match admit::snapshot(repo, h.id(), now) {
            Ok(Ok(s)) => Some(s),
            Ok(Err(_)) | Err(_) => None,
        });
    // Unreadable report signers are named here; the read below then verifies nothing.
    let signers = report_signers(snap.as_ref(), &mut warnings);
    // One read of the store for every environment's gate and every
    // cluster's latest report: the status store is read once per invocation.
    let mut evidence = snap.as_ref().map(|s| {
        let e = GitEvidence::new(repo, s.commit, now);
        if as_of {
            e.as_of()
        } else {
            e
        }
    });
    let unsigned = |e| status::confirmations_in(repo, &store, None, now).map_err(|_| e);
    let conf = match (&snap, evidence.as_mut()) {
        (Some(s), Some(ev)) => match ev.confirmations(&s.policy) {
            Ok(c) => Ok(c.clone()),
            // Unreadable report signers (warned above): shown unverified.
            Err(e) => unsigned(e.to_string()),
        },
        _ => unsigned(String::new()),
    };
    let mut latest: BTreeMap<(String, String), Shown> = BTreeMap::new();
    // The wave gate's evidence is the verified read only.
    let verified = conf.as_ref().ok().filter(|_| signers.is_some()).cloned();
    match conf {
        Ok(c) => {
            for i in c.ignored.iter().filter(|i| !i.commit.is_empty()) {
                // A whole branch is named as such; a report, as skipped.
                if c.untrusted.iter().any(|u| u.to_string() == i.why) {
                    warnings.push(i.to_string());
                } else {
                    warnings.push(format!("{i}; skipped"));
                }
            }
            latest = c
                .newest
                .iter()
                .map(|(k, n)| (k.clone(), Shown::newest(n)))
                .collect();
        }
        Err(e) => warnings.push(format!("status store: {e}")),
    }
    if as_of {
        as_it_was(
            repo,
            cfg,
            &store,
            signers.as_ref(),
            now,
            written_later,
            &mut latest,
            &mut warnings,
        )?;
    }
    let mut environments = Vec::new();
    for env in envs {
        let (next_window, hold, freezes) = match Calendar::of(env) {
            Ok(cal) => when(env, &cal, now),
            Err(e) => {
                warnings.push(format!("environments/{}.toml: [window]: {e}", env.name));
                (None, None, Vec::new())
            }
        };
        let gate = match (&snap, evidence.as_mut(), cfg.lower(&env.name)) {
            (_, _, None) => gate_view(&env.name, None, None, None),
            (Some(snap), Some(evidence), Some(lower)) => {
                let candidate = cfg.envs.get(lower).map(|l| l.version.clone());
                let decision = candidate.as_ref().map(|v| {
                    // The gate judges the environment as if its file pinned the
                    // lower environment's version: the next promotion.
                    let mut trial = snap.config.clone();
                    if let Some(t) = trial.envs.get_mut(&env.name) {
                        t.version = v.clone();
                    }
                    let change = Change {
                        before: Some((&snap.config, &snap.policy)),
                        after: (&trial, &snap.policy),
                    };
                    admit::judge_env(change, &env.name, evidence, now).map_err(|e| e.to_string())
                });
                gate_view(
                    &env.name,
                    Some(lower),
                    candidate.as_ref().map(ToString::to_string),
                    decision,
                )
            }
            (_, _, Some(lower)) => GateView {
                lower: Some(lower.to_owned()),
                version: None,
                answer: GateAnswer::Unknown,
                after: None,
                message: "the repository has no HEAD commit to judge from".into(),
            },
        };
        let waves = wave::waves(cfg, &env.name);
        let evidence_env = verified
            .as_ref()
            .map(|c| admit::evidence_of(c, cfg.clusters(&env.name), &env.name, None, &env.version));
        let empty = wave::EnvEvidence::default();
        // Each cluster as its agent reads it: its own branch holds nothing.
        let gate_of = |c: &str| {
            let own = verified.as_ref().map(|conf| {
                admit::evidence_of(
                    conf,
                    cfg.clusters(&env.name),
                    &env.name,
                    Some(c),
                    &env.version,
                )
            });
            wave::judge(&wave::WaveRequest {
                env: &env.name,
                cluster: c,
                version: &env.version,
                waves: &waves,
                failure_budget: env.rollout.failure_budget,
                evidence: own.as_ref().unwrap_or(&empty),
                now,
            })
        };
        let all: Vec<String> = cfg.clusters(&env.name).to_vec();
        let halt = evidence_env.as_ref().and_then(|ev| {
            wave::halt(
                &env.name,
                &env.version,
                env.rollout.failure_budget,
                ev,
                &all,
            )
        });
        let clusters: Vec<ClusterView> = cfg
            .clusters(&env.name)
            .iter()
            .map(|c| {
                let entry = latest.get(&(env.name.clone(), c.clone()));
                let gate = gate_of(c);
                ClusterView {
                    name: c.clone(),
                    report: entry.map(|e| e.report.clone()),
                    trust: entry.map_or(Trust::None, |e| e.trust),
                    signer: entry.and_then(|e| e.signer.clone()),
                    untrusted_reason: entry.and_then(|e| e.why.clone()),
                    wave: (!env.waves.is_empty())
                        .then(|| env.wave_of(c).map(|i| i + 1))
                        .flatten(),
                    waits_on: match &gate {
                        wave::WaveGate::Open { .. } => None,
                        wave::WaveGate::Halted(_) => Some("halted".into()),
                        g => Some(g.to_string()),
                    },
                    waits_until: gate.changes_at(),
                }
            })
            .collect();
        let halt = halt.map(|h| HaltView {
            version: h.version.to_string(),
            failure_budget: h.budget,
            revoke: format!(
                "drover revoke {} --reason \"{} failed it\"",
                h.version,
                h.failed
                    .iter()
                    .map(|(c, _)| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            failed: h
                .failed
                .into_iter()
                .map(|(cluster, f)| HaltFailure {
                    cluster,
                    at: f.at,
                    message: f.message,
                })
                .collect(),
        });
        let blocker = env_blocker(halt.is_some(), hold.as_ref(), &clusters);
        environments.push(EnvView {
            blocker,
            name: env.name.clone(),
            version: env.version.to_string(),
            timezone: env.windows[0].timezone.name().to_owned(),
            next_window,
            paused: env.rollout.paused,
            hold,
            freezes,
            gate,
            halt,
            clusters,
        });
    }
    Ok(Fleet {
        now,
        config_commit: at.map(|c| c.to_string()),
        status_branch: StatusBranch {
            name: cfg.root.status_branch.clone(),
            refname: store.legacy.as_ref().map(|b| b.refname.clone()),
            tip: store.legacy.as_ref().map(|b| b.tip.to_string()),
            cluster_branches: store.clusters.len(),
        },
        environments,
        warnings,
    })
}

/// When a node of `env` may next start, what holds it now, and the freezes
/// ahead: all from the calendar's one answer ([`Calendar::opening`]). The
/// change is taken as a minor one (`status` does not know what every node
/// runs), so a `minor` freeze holds it, as `drover plan` forecasts.
fn when(
    env: &EnvConfig,
    cal: &Calendar,
    now: DateTime<Utc>,
) -> (Option<WindowView>, Option<HoldView>, Vec<FreezeView>) {
    let opening = cal.opening(now, window::Change::Other);
    let next = opening.next_start().map(|w| window_view(env, w, now));
    let hold = opening.hold.as_ref().map(|h| {
        let file = format!("{}/{}.toml", crate::config::ENV_DIR, env.name);
        let (kind, reason, message) = match h {
            window::Hold::Paused => (
                HoldKind::Paused,
                format!("[rollout] paused = true in {file}"),
                format!(
                    "paused by [rollout] paused = true in {file}: no node starts \
                     until a reviewed change sets it back to false"
                ),
            ),
            window::Hold::Freeze(f) => (HoldKind::Freeze, f.reason.clone(), h.describe()),
        };
        HoldView {
            kind,
            reason,
            until: h.until(),
            message,
        }
    });
    let freezes = cal
        .freezes()
        .iter()
        .filter(|f| f.end > now)
        .take(MAX_FREEZES_SHOWN)
        .map(|f| {
            let local = |t: DateTime<Utc>| {
                t.with_timezone(&f.timezone)
                    .to_rfc3339_opts(SecondsFormat::Secs, false)
            };
            FreezeView {
                start: f.start,
                end: f.end,
                start_local: local(f.start),
                end_local: local(f.end),
                zone: f.start.with_timezone(&f.timezone).format("%Z").to_string(),
                scope: f.scope.as_str().to_owned(),
                reason: f.reason.clone(),
                active: f.start <= now,
            }
        })
        .collect();
    (next, hold, freezes)
}

/// A cluster's report as `status` shows it, with its trust.
struct Shown {
    report: ReportView,
    trust: Trust,
    signer: Option<String>,
    why: Option<String>,
}

impl Shown {
    fn newest(n: &status::Newest) -> Self {
        let principal = format!("{}/{}", n.report.env, n.report.cluster);
        let (trust, signer, why) = match &n.trust {
            status::Trust::Trusted => (Trust::Trusted, Some(principal), None),
            status::Trust::Untrusted(why) => (Trust::Untrusted, None, Some(why.clone())),
            status::Trust::Unverified => (Trust::Unverified, None, None),
        };
        Shown {
            report: report_view(&n.report, n.commit),
            trust,
            signer,
            why,
        }
    }
}

/// The status store as it was at `now` ([`status::Store::as_of`]), and how
/// many reports were written after `now`.
pub(super) fn rewound(
    repo: &Repository,
    cfg: &RepoConfig,
    store: &status::Store,
    now: DateTime<Utc>,
) -> Result<(status::Store, usize), Error> {
    store.as_of(repo, now).map_err(|source| {
        Error::Reports(reports::Error::Git {
            branch: cfg.root.status_branch.clone(),
            source,
        })
    })
}

/// The store as it was at `now` (`status --now T`), already rewound to the
/// commits of then ([`rewound`], `written_later` of them passed over): a
/// cluster whose newest report of then is of a state entered after `now`
/// (its agent's clock ahead of its commit's) shows the report in force
/// then, read from its history, and the warnings say how many were left
/// out. (`since`, not the commit's time: a report is written at or after
/// its `since`, and a commit's time is the writer's clock, not the cluster's.)
#[allow(clippy::too_many_arguments)]
fn as_it_was(
    repo: &Repository,
    cfg: &RepoConfig,
    store: &status::Store,
    signers: Option<&AllowedSigners>,
    now: DateTime<Utc>,
    written_later: usize,
    latest: &mut BTreeMap<(String, String), Shown>,
    warnings: &mut Vec<String>,
) -> Result<(), Error> {
    let later: Vec<(String, String)> = latest
        .iter()
        .filter(|(_, s)| s.report.since > now)
        .map(|(k, _)| k.clone())
        .collect();
    let mut left_out = written_later;
    if later.is_empty() {
        if left_out > 0 {
            warnings.push(left_out_warning(left_out, now));
        }
        return Ok(());
    }
    for k in &later {
        latest.remove(k);
    }
    let found = reports::walk(repo, cfg, store, signers, now)?;
    for e in found.entries {
        let key = (e.report.env.clone(), e.report.cluster.clone());
        if !later.contains(&key) {
            continue;
        }
        if e.report.since > now {
            left_out += 1;
            continue;
        }
        latest.entry(key).or_insert_with(|| Shown {
            report: report_view(&e.report, e.commit),
            trust: e.trust,
            signer: e.signer.clone(),
            why: e.untrusted.clone(),
        });
    }
    warnings.push(left_out_warning(left_out, now));
    Ok(())
}

fn left_out_warning(n: usize, now: DateTime<Utc>) -> String {
    format!(
        "{} from after {} left out: the status store, the config and the gate are read as they were then",
        crate::terminal::count(n as u64, "report", "reports"),
        now.to_rfc3339_opts(SecondsFormat::Secs, true)
    )
}

/// The environment's blocker ([`EnvView::blocker`]).
fn env_blocker(
    halted: bool,
    hold: Option<&super::model::HoldView>,
    clusters: &[ClusterView],
) -> Option<String> {
    use crate::rollout::Blocker;
    let own = match hold.map(|h| h.kind) {
        _ if halted => Some(Blocker::Halted),
        Some(HoldKind::Paused) => Some(Blocker::Paused),
        Some(HoldKind::Freeze) => Some(Blocker::Freeze),
        None => None,
    };
    own.map(|b| b.as_str().to_string()).or_else(|| {
        clusters
            .iter()
            .find_map(|c| c.report.as_ref().and_then(|r| r.blocker.clone()))
    })
}

/// A report as `drover status` shows it.
pub fn report_view(r: &status::StatusReport, commit: git2::Oid) -> ReportView {
    ReportView {
        version: r.version.to_string(),
        state: r.state.as_str().to_owned(),
        since: r.since,
        nodes: r.nodes,
        nodes_at_version: r.nodes_at_version,
        phases: r.detail.phases.clone(),
        message: r.message.clone(),
        blocker: r.detail.blocker.clone(),
        blockers: r.detail.blockers.clone(),
        config_commit: r.config_commit.clone(),
        status_commit: commit.to_string(),
    }
}

/// The report signers of the config in force at HEAD (`None` when it names
/// none, or they cannot be read: then nothing is verified, and a warning says
/// why when it is the latter).
pub(super) fn report_signers(
    snap: Option<&admit::Snapshot>,
    warnings: &mut Vec<String>,
) -> Option<AllowedSigners> {
    let text = snap?.policy.signers_text.as_ref()?;
    match AllowedSigners::parse(text) {
        Ok(s) => Some(s),
        Err(e) => {
            warnings.push(format!("report signers: {e}; no report is verified"));
            None
        }
    }
}

/// A window in UTC and in the environment's zone.
pub fn window_view(env: &EnvConfig, w: window::Window, now: DateTime<Utc>) -> WindowView {
    let (start, end) = (w.start, w.end);
    let tz = env.windows[0].timezone;
    let local = |t: DateTime<Utc>| {
        t.with_timezone(&tz)
            .to_rfc3339_opts(SecondsFormat::Secs, false)
    };
    WindowView {
        start,
        end,
        start_local: local(start),
        end_local: local(end),
        zone: start.with_timezone(&tz).format("%Z").to_string(),
        open: start <= now && now < end,
        opened_earlier: w.opened_earlier,
        continues: w.continues,
    }
}

fn minutes(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%MZ").to_string()
}

/// The gate's verdict on promoting `version` from `lower` into `env`, in
/// one word and one line. Pure: the decision is made by the caller.
pub fn gate_view(
    env: &str,
    lower: Option<&str>,
    version: Option<String>,
    decision: Option<Result<Decision, String>>,
) -> GateView {
    let Some(lower) = lower else {
        return GateView {
            lower: None,
            version: None,
            answer: GateAnswer::NoGate,
            after: None,
            message: format!("{env} is the first environment of the chain: no gate"),
        };
    };
    let v = version.clone().unwrap_or_else(|| "?".into());
    let view = |answer, after, message| GateView {
        lower: Some(lower.to_owned()),
        version: version.clone(),
        answer,
        after,
        message,
    };
    match decision {
        None => view(
            GateAnswer::Unknown,
            None,
            format!("{lower} has no readable version to promote"),
        ),
        Some(Err(e)) => view(GateAnswer::Unknown, None, format!("cannot judge: {e}")),
        Some(Ok(Decision::Unchanged)) => view(
            GateAnswer::Current,
            None,
            format!("{env} already pins {v}, {lower}'s version"),
        ),
        Some(Ok(Decision::Allowed(a))) => {
            let soaked = match &a.basis {
                gate::Basis::Confirmed { soaked_at, .. }
                | gate::Basis::History { soaked_at, .. } => Some(*soaked_at),
                gate::Basis::FirstInChain => None,
            };
            view(
                GateAnswer::Allowed,
                soaked,
                format!("{env} may take {v} now (`drover promote {env}`)"),
            )
        }
        Some(Ok(Decision::Refused(r))) => match &r.reason {
            Reason::Soaking { passes_at, .. } | Reason::HistorySoaking { passes_at, .. } => view(
                GateAnswer::Waiting,
                Some(*passes_at),
                format!("{env} may take {v} after {}", minutes(passes_at)),
            ),
            Reason::NotConfirmed { missing, .. } => view(
                GateAnswer::Refused,
                None,
                format!(
                    "{env} may not take {v} yet: not confirmed by {}",
                    missing
                        .iter()
                        .map(|(c, _)| c.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            _ => view(GateAnswer::Refused, None, r.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{Allowed, Basis, Refusal};
    use semver::Version;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn refused(reason: Reason) -> Option<Result<Decision, String>> {
        Some(Ok(Decision::Refused(Refusal {
            env: "production".into(),
            version: Version::new(1, 13, 2),
            reason,
        })))
    }

    #[test]
    fn gate_answers_in_one_word_and_one_line() {
        let v = Some("1.13.2".to_owned());
        let first = gate_view("test", None, None, None);
        assert_eq!(first.answer, GateAnswer::NoGate);

        let soaking = gate_view(
            "production",
            Some("stage"),
            v.clone(),
            refused(Reason::Soaking {
                lower: "stage".into(),
                confirmed: vec![("stage-1".into(), t("2026-12-20T02:40:00Z"))],
                soak: std::time::Duration::from_secs(86400),
                passes_at: t("2026-12-21T02:40:00Z"),
            }),
        );
        assert_eq!(soaking.answer, GateAnswer::Waiting);
        assert_eq!(soaking.after, Some(t("2026-12-21T02:40:00Z")));
        assert_eq!(
            soaking.message,
            "production may take 1.13.2 after 2026-12-21T02:40Z"
        );

        let missing = gate_view(
            "production",
            Some("stage"),
            v.clone(),
            refused(Reason::NotConfirmed {
                lower: "stage".into(),
                branch: "drover/status".into(),
                confirmed: vec![],
                missing: vec![("stage-1".into(), None)],
            }),
        );
        assert_eq!(missing.answer, GateAnswer::Refused);
        assert!(missing.message.contains("not confirmed by stage-1"));

        let down = gate_view(
            "production",
            Some("stage"),
            v.clone(),
            refused(Reason::Downgrade {
                previous: Version::new(1, 14, 0),
            }),
        );
        assert_eq!(down.answer, GateAnswer::Refused);
        assert!(down.message.contains("allow_downgrade"), "{}", down.message);

        let allowed = gate_view(
            "production",
            Some("stage"),
            v.clone(),
            Some(Ok(Decision::Allowed(Allowed {
                env: "production".into(),
                version: Version::new(1, 13, 2),
                basis: Basis::Confirmed {
                    lower: "stage".into(),
                    confirmed: vec![],
                    soaked_at: t("2026-12-21T02:40:00Z"),
                },
                downgrade: false,
            }))),
        );
        assert_eq!(allowed.answer, GateAnswer::Allowed);
        assert_eq!(allowed.after, Some(t("2026-12-21T02:40:00Z")));

        let same = gate_view(
            "production",
            Some("stage"),
            v.clone(),
            Some(Ok(Decision::Unchanged)),
        );
        assert_eq!(same.answer, GateAnswer::Current);
        let broken = gate_view(
            "production",
            Some("stage"),
            v,
            Some(Err("git: boom".into())),
        );
        assert_eq!(broken.answer, GateAnswer::Unknown);
        assert!(broken.message.contains("boom"));
    }
}
