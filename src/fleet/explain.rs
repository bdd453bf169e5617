//! `drover status --explain CLUSTER|NODE`: why a cluster or a node is not
//! moving, as a chain of reasons, and the next time it can ([`next_start`]:
//! the next window the calendar, the gate's and the waves' soaks and the
//! freezes allow, or what it waits for, or "needs a person"). Pure: the
//! fleet as `drover status` gathered it and the calendar in, the
//! explanation out. The blocker is the one its cluster's signed report
//! names (`agent::told`); nothing here judges it a second time.

use super::model::{ClusterView, EnvView, Fleet, GateAnswer};
use crate::rollout::{Blocker, Mover};
use crate::window::{Calendar, Change};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

/// When a blocked cluster or node can next move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Next {
    /// Nothing holds it: it moves now, or is done.
    Now,
    /// At this instant: the next one the windows, freezes and soaks allow.
    At {
        /// The instant.
        at: DateTime<Utc>,
    },
    /// When something without a known time happens; drover goes on by itself.
    Waits {
        /// What it waits for.
        r#for: String,
    },
    /// Only a person can move it.
    NeedsPerson {
        /// What they do.
        what: String,
    },
    /// No window ever comes (the calendar has none ahead).
    Never,
}

/// The next time something held by `blocker` at `now` can move. `change`
/// is the change the nodes would make (a `minor` freeze holds only
/// `Other`), `not_before` when the gate's or a wave's soak passes (`None`:
/// it passed, or the blocker is not a soak). The calendar's one answer
/// ([`Calendar::opening`]) says which window: the agent's own.
pub fn next_start(
    blocker: Option<Blocker>,
    cal: &Calendar,
    change: Change,
    not_before: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Next {
    let Some(blocker) = blocker else {
        return Next::Now;
    };
    let timed = matches!(
        blocker,
        Blocker::Window | Blocker::Freeze | Blocker::Soak | Blocker::Gate | Blocker::Wave
    );
    match blocker.mover() {
        Mover::Person => {
            return Next::NeedsPerson {
                what: blocker.remedy().to_string(),
            }
        }
        Mover::Retry => {
            return Next::Waits {
                r#for: blocker.remedy().to_string(),
            }
        }
        Mover::Time if !timed => {
            return Next::Waits {
                r#for: blocker.remedy().to_string(),
            }
        }
        Mover::Time => {}
    }
    // The gate and a wave wait on other clusters' confirmations: a time is
    // known only once what remains is a soak.
    let from = match (blocker, not_before) {
        (Blocker::Gate | Blocker::Wave, None) => {
            return Next::Waits {
                r#for: blocker.remedy().to_string(),
            }
        }
        (_, Some(t)) => t.max(now),
        (_, None) => now,
    };
    let opening = cal.opening(from, change);
    match (opening.next_start(), &opening.hold) {
        (Some(w), _) => Next::At {
            at: w.start.max(from),
        },
        (None, Some(crate::window::Hold::Paused)) => Next::NeedsPerson {
            what: Blocker::Paused.remedy().to_string(),
        },
        (None, _) => Next::Never,
    }
}

/// What `--explain` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// The cluster or node named.
    pub subject: String,
    /// Its environment.
    pub env: String,
    /// Its cluster.
    pub cluster: String,
    /// The node, when a node was named.
    pub node: Option<String>,
    /// The cluster's state as its report tells it (`None`: no report).
    pub state: Option<String>,
    /// The one blocker (`None`: progressing, or no report says).
    pub blocker: Option<Blocker>,
    /// The chain of reasons, outermost first.
    pub reasons: Vec<String>,
    /// When it can next move.
    pub next: Next,
}

/// Why `subject` (a cluster of the fleet, else a node a report names)
/// is where it is; `Err` says what was not found. `calendar(env, cluster)`
/// is the calendar the cluster's agent acts on (its wave's own window,
/// `EnvConfig::for_cluster`).
pub fn explain(
    fleet: &Fleet,
    calendar: impl Fn(&str, &str) -> Option<Calendar>,
    subject: &str,
) -> Result<Explanation, String> {
    let clusters = || {
        fleet
            .environments
            .iter()
            .flat_map(|e| e.clusters.iter().map(move |c| (e, c)))
    };
    let found = clusters()
        .find(|(_, c)| c.name == subject)
        .map(|(e, c)| (e, c, None))
        .or_else(|| {
            clusters().find_map(|(e, c)| {
                let r = c.report.as_ref()?;
                let b = r.blockers.get(subject)?;
                Some((e, c, Some(Blocker::parse(b))))
            })
        });
    let Some((env, c, node)) = found else {
        let known: Vec<&str> = clusters().map(|(_, c)| c.name.as_str()).collect();
        return Err(format!(
            "no cluster and no blocked node named {subject:?}: the clusters are {}; a node \
             is found only while its cluster's report names it as not progressing",
            known.join(", ")
        ));
    };
    let mut reasons = Vec::new();
    let state = c.report.as_ref().map(|r| r.state.clone());
    let cluster_blocker = c
        .report
        .as_ref()
        .and_then(|r| r.blocker.as_deref())
        .and_then(Blocker::parse);
    let blocker = match node {
        Some(b) => {
            let b = b.unwrap_or(Blocker::Evidence);
            reasons.push(format!(
                "node {subject} of {} is not progressing: {}",
                c.name,
                b.as_str()
            ));
            Some(b)
        }
        None => cluster_blocker,
    };
    let cal = calendar(&env.name, &c.name);
    cluster_reasons(env, c, cluster_blocker, &mut reasons);
    // The window of the cluster's own calendar (its wave's, when it has one).
    match cal
        .as_ref()
        .and_then(|cal| cal.opening(fleet.now, Change::Other).next_start())
    {
        Some(w) if w.start <= fleet.now => {
            reasons.push(format!("a window is open until {}", rfc3339(w.end)))
        }
        Some(w) => reasons.push(format!("the next window opens {}", rfc3339(w.start))),
        None => {}
    }
    let not_before = match blocker {
        Some(Blocker::Soak | Blocker::Gate) => env
            .gate
            .after
            .filter(|_| env.gate.answer == GateAnswer::Waiting)
            .or(c.waits_until),
        Some(Blocker::Wave) => c.waits_until,
        _ => None,
    };
    let next = match cal {
        Some(cal) => next_start(blocker, &cal, Change::Other, not_before, fleet.now),
        None => Next::Waits {
            r#for: format!("environments/{}.toml's windows to load", env.name),
        },
    };
    Ok(Explanation {
        subject: subject.to_string(),
        env: env.name.clone(),
        cluster: c.name.clone(),
        node: node.map(|_| subject.to_string()),
        state,
        blocker,
        reasons,
        next,
    })
}

fn cluster_reasons(
    env: &EnvView,
    c: &ClusterView,
    blocker: Option<Blocker>,
    out: &mut Vec<String>,
) {
    match &c.report {
        None => out.push(format!(
            "cluster {} of {} has no report: its agent has not reported yet",
            c.name, env.name
        )),
        Some(r) => {
            let mut line = format!(
                "cluster {} of {} is {} with {}/{} nodes at {}",
                c.name, env.name, r.state, r.nodes_at_version, r.nodes, r.version
            );
            if !r.message.is_empty() {
                line.push_str(": ");
                line.push_str(&r.message);
            }
            out.push(line);
            if let Some(b) = blocker {
                out.push(format!("blocker: {} ({})", b.as_str(), b.remedy()));
            }
        }
    }
    if let Some(h) = &env.halt {
        out.push(format!(
            "{} is halted for {}: more clusters failed it than failure_budget = {} allows",
            env.name, h.version, h.failure_budget
        ));
    }
    if let Some(h) = &env.hold {
        out.push(h.message.clone());
    }
    if !matches!(
        env.gate.answer,
        GateAnswer::NoGate | GateAnswer::Current | GateAnswer::Allowed
    ) {
        out.push(format!("gate: {}", env.gate.message));
    }
    if let Some(w) = &c.waits_on {
        out.push(format!("wave: {w}"));
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The explanation as text: the chain, then when it can move.
pub fn render(e: &Explanation) -> String {
    let mut out = String::new();
    for (i, r) in e.reasons.iter().enumerate() {
        let lead = if i == 0 { "" } else { "  ↳ " };
        out.push_str(&format!("{lead}{}\n", crate::terminal::escape(r)));
    }
    let next = match &e.next {
        Next::Now => "next: nothing holds it".to_string(),
        Next::At { at } => format!("next: can move at {}", rfc3339(*at)),
        Next::Waits { r#for } => format!("next: waits for {for}"),
        Next::NeedsPerson { what } => format!("next: needs a person: {what}"),
        Next::Never => "next: never: no window comes".to_string(),
    };
    out.push_str(&crate::terminal::escape(&next));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Calendar;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn cal(freeze: Option<(&str, &str)>, paused: bool) -> Calendar {
        use crate::window::{Freeze, FreezeScope, WindowSpec};
        let w = WindowSpec {
            schedule: "0 2 * * *".into(),
            duration: std::time::Duration::from_secs(3 * 3600),
            timezone: chrono_tz::UTC,
        };
        let freezes: Vec<Freeze> = freeze
            .map(|(s, e)| Freeze {
                start: t(s),
                end: t(e),
                timezone: chrono_tz::UTC,
                scope: FreezeScope::All,
                reason: "holidays".into(),
            })
            .into_iter()
            .collect();
        Calendar::new(&[w], &freezes, paused).unwrap()
    }

    #[test]
    fn the_next_start_is_the_first_window_after_the_soak_and_the_freeze() {
        let now = t("2026-12-20T10:00:00Z");
        let c = cal(None, false);
        let next = |b, nb| next_start(Some(b), &c, Change::Other, nb, now);
        assert_eq!(
            next(Blocker::Window, None),
            Next::At {
                at: t("2026-12-21T02:00:00Z")
            }
        );
        // The soak passes inside the next window: then, not the window's start.
        assert_eq!(
            next(Blocker::Soak, Some(t("2026-12-21T03:30:00Z"))),
            Next::At {
                at: t("2026-12-21T03:30:00Z")
            }
        );
        // After the window closes: the one after.
        assert_eq!(
            next(Blocker::Soak, Some(t("2026-12-21T05:30:00Z"))),
            Next::At {
                at: t("2026-12-22T02:00:00Z")
            }
        );
        assert!(matches!(next(Blocker::Wave, None), Next::Waits { .. }));
        assert!(matches!(
            next(Blocker::Consent, None),
            Next::NeedsPerson { .. }
        ));
        let frozen = cal(
            Some(("2026-12-20T00:00:00Z", "2026-12-24T00:00:00Z")),
            false,
        );
        assert_eq!(
            next_start(Some(Blocker::Freeze), &frozen, Change::Other, None, now),
            Next::At {
                at: t("2026-12-24T02:00:00Z")
            }
        );
        let paused = cal(None, true);
        assert!(matches!(
            next_start(Some(Blocker::Window), &paused, Change::Other, None, now),
            Next::NeedsPerson { .. }
        ));
        assert_eq!(next_start(None, &c, Change::Other, None, now), Next::Now);
    }
}
