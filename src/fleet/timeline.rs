//! The timeline page's values (`drover status --html`): what each
//! cluster's nodes ran over time, from its signed reports, with the pins,
//! promotions, revocations and refusals out of the config history, and
//! each environment's windows and freezes over the span shown.

use super::gather::{envs, report_signers, rewound, window_view, Error};
use super::history;
use super::model::*;
use super::reports::{self, Entry};
use crate::admit;
use crate::audit::{self, LogOptions};
use crate::config::{EnvConfig, RepoConfig};
use crate::status;
use crate::window::{self, Calendar};
use chrono::{DateTime, Duration as Span, Utc};
use git2::Repository;
use std::collections::BTreeMap;

/// How far back the timeline reaches at most, so one page stays small
/// however old the fleet is.
pub const MAX_TIMELINE_SPAN_DAYS: i64 = 400;

/// The timeline of the fleet: every report version, confirmation and
/// promotion from the status branch and the config history, with the
/// windows of each environment, over the span they cover (at most
/// [`MAX_TIMELINE_SPAN_DAYS`] back from its end). `at` is the config commit
/// in force at an instant the user named (`status --now T --html`): the
/// config history and the report signers are read from it and reports of
/// states entered after `now` are left out, as [`gather_at`] does; `None`
/// reads HEAD and every report.
pub fn timeline(
    repo: &Repository,
    cfg: &RepoConfig,
    now: DateTime<Utc>,
    only: Option<&str>,
    at: Option<git2::Oid>,
) -> Result<(Timeline, Vec<String>), Error> {
    let envs = envs(cfg, only);
    let mut warnings = Vec::new();
    let mut entries = Vec::new();
    let tip = match at {
        Some(c) => Some(c),
        None => repo
            .head()
            .and_then(|h| h.peel_to_commit())
            .ok()
            .map(|c| c.id()),
    };
    let snap = tip.and_then(|t| admit::snapshot(repo, t, now).ok()?.ok());
    let signers = report_signers(snap.as_ref(), &mut warnings);
    let mut store = status::find_store(
        repo,
        &cfg.root.status_branch,
        status::Scope::Listed(&cfg.root.clusters),
    )?;
    if at.is_some() {
        store = rewound(repo, cfg, &store, now)?.0;
    }
    if !store.is_empty() {
        let found = reports::walk(repo, cfg, &store, signers.as_ref(), now)?;
        warnings.extend(found.warnings);
        entries = found.entries;
        if at.is_some() {
            entries.retain(|e| e.report.since <= now);
        }
    }
    // Oldest first: each cluster's reports in the order they were written.
    entries.reverse();
    entries.sort_by_key(|e| e.committed);
    let history = match tip {
        Some(t) => audit::history(repo, t, &LogOptions::default())?,
        None => audit::History::default(),
    };
    let changes = &history.changes;
    let parse = |s: &str| {
        DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .ok()
    };

    // The span: from the first event shown to the end of the next window
    // after now (so the page shows what comes next).
    let mut first = now;
    for e in &entries {
        first = first.min(e.report.since);
    }
    for c in changes {
        if cfg.lower(&c.env).is_some() && c.previous.is_some() {
            if let Some(t) = parse(&c.date) {
                first = first.min(t);
            }
        }
    }
    // When each environment's next window opens and closes.
    let next: BTreeMap<&str, window::Window> = envs
        .iter()
        .filter_map(|env| {
            let w = Calendar::of(*env)
                .ok()?
                .opening(now, window::Change::Other)
                .next_start()?;
            Some((env.name.as_str(), w))
        })
        .collect();
    // A window that goes on past the horizon (overlapping windows) has
    // no end to show: the page would stretch a year ahead and put today
    // off its left edge. Its band runs to the page's edge instead.
    let last = next
        .values()
        .map(|w| if w.continues { now } else { w.end })
        .fold(now, DateTime::max);
    let to = last + Span::days(1);
    let from = (first - Span::days(1)).max(to - Span::days(MAX_TIMELINE_SPAN_DAYS));

    let mut events = Vec::new();
    let mut out_envs = Vec::new();
    for env in &envs {
        let cal = Calendar::of(*env);
        let freezes = cal
            .as_ref()
            .map(|c| {
                c.freezes()
                    .iter()
                    .filter(|f| f.end > from && f.start < to)
                    .map(|f| Band {
                        start: f.start,
                        end: f.end,
                        label: f.describe(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let bands = |env: &EnvConfig, cal: &Calendar| -> Vec<Band> {
            cal.windows(from)
                .take_while(|w| w.start < to)
                .take(64)
                .map(|w| {
                    let v = window_view(env, w, now);
                    Band {
                        start: w.start,
                        end: w.end,
                        label: format!(
                            "{} window {} – {} ({})",
                            env.name, v.start_local, v.end_local, v.zone
                        ),
                    }
                })
                .collect()
        };
        let windows = match &cal {
            Ok(c) => bands(env, c),
            Err(e) => {
                warnings.push(format!("environments/{}.toml: [window]: {e}", env.name));
                Vec::new()
            }
        };
        let rows = cfg
            .clusters(&env.name)
            .iter()
            .map(|cluster| {
                let mine: Vec<&Entry> = entries
                    .iter()
                    .filter(|e| e.report.env == env.name && e.report.cluster == *cluster)
                    .collect();
                // A wave with a window of its own: its bands, and its next
                // window as what a pending cluster waits for.
                let own = env
                    .wave_of(cluster)
                    .and_then(|i| env.waves[i].window.as_ref())
                    .map(|_| env.for_cluster(cluster))
                    .and_then(|e| Calendar::of(&e).ok().map(|c| (e, c)));
                let opens = match &own {
                    Some((_, c)) => c
                        .opening(now, window::Change::Other)
                        .next_start()
                        .map(|w| w.start),
                    None => next.get(env.name.as_str()).map(|w| w.start),
                };
                let (mut row, refused) = history::row(cluster, &env.name, &mine, from, now, opens);
                events.extend(refused.into_iter().filter(|e| e.at >= from));
                row.wave = (!env.waves.is_empty())
                    .then(|| env.wave_of(cluster).map(|i| i + 1))
                    .flatten();
                row.windows = own.map(|(e, c)| bands(&e, &c)).unwrap_or_default();
                row
            })
            .collect();
        out_envs.push(TimelineEnv {
            name: env.name.clone(),
            timezone: env.windows[0].timezone.name().to_owned(),
            windows,
            freezes,
            pins: pins(changes, &env.name, from, now, to),
            rows,
        });
    }
    for r in &history.revocations {
        let Some(at) = parse(&r.date).filter(|t| *t >= from && *t <= now) else {
            continue;
        };
        events.push(Event {
            at,
            kind: EventKind::Revoked,
            env: None,
            cluster: None,
            version: r.version.clone(),
            message: r.reason.clone(),
            commit: Some(r.commit.clone()),
        });
    }
    events.sort_by_key(|e| e.at);

    let mut promotions = Vec::new();
    for c in changes.iter().rev() {
        // A file's first version is where the environment starts, not a promotion.
        let (Some(lower), Some(at), Some(_)) = (cfg.lower(&c.env), parse(&c.date), &c.previous)
        else {
            continue;
        };
        if only.is_some_and(|o| o != c.env && o != lower) || at < from {
            continue;
        }
        // The lower environment's latest confirmation of the version before
        // the change: the evidence the gate read.
        let from_at = entries
            .iter()
            .filter(|e| {
                e.report.env == lower
                    && e.report.state == crate::rollout::RolloutState::Confirmed
                    && e.report.version.to_string() == c.version
                    && e.report.since <= at
            })
            .map(|e| e.report.since)
            .max();
        promotions.push(Promotion {
            from_env: lower.to_owned(),
            from_at,
            to_env: c.env.clone(),
            at,
            version: c.version.clone(),
            previous: c.previous.clone(),
            commit: c.commit.clone(),
            author: c.author.clone(),
            signer: c.signer.clone(),
            pr: c.pr,
        });
    }
    Ok((
        Timeline {
            from,
            to,
            now,
            envs: out_envs,
            promotions,
            events,
        },
        warnings,
    ))
}

/// The versions `env`'s file pinned over `[from, to]`, from the config's
/// history (newest first in `changes`).
fn pins(
    changes: &[audit::Change],
    env: &str,
    from: DateTime<Utc>,
    now: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Vec<Pin> {
    let mut mine: Vec<(DateTime<Utc>, &audit::Change)> = changes
        .iter()
        .filter(|c| c.env == env)
        .filter_map(|c| {
            let at = DateTime::parse_from_rfc3339(&c.date).ok()?;
            // A change made after `now` is not yet the pin (status --now).
            Some((at.with_timezone(&Utc), c)).filter(|(at, _)| *at <= now)
        })
        .collect();
    mine.reverse(); // oldest first
    let mut out = Vec::new();
    for (i, (start, c)) in mine.iter().enumerate() {
        let end = mine.get(i + 1).map_or(to, |n| n.0.max(*start)).min(to);
        if end <= from || end <= *start {
            continue;
        }
        out.push(Pin {
            start: (*start).max(from),
            end,
            version: c.version.clone(),
            commit: c.commit.clone(),
        });
    }
    out
}
