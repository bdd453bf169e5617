//! Maintenance windows, freezes and pause (docs/design.md §3): the one owner
//! of the question "may a node start at time `t` for this version change,
//! and if not, when next?". Config parses into this module's types; the
//! agent, the engine's callers, the sim, the demo and `drover windows` ask it.
//!
//! - A window is `[firing, firing + duration)`, a half-open interval in real
//!   (elapsed) time; its firings follow [`schedule`]'s reading of cron.
//! - The windows of every `[[window]]` table form one union: overlapping or
//!   back-to-back windows merge into one. Overlap is never an error, so a
//!   config valid today is valid for any `--now`.
//! - A freeze of scope `all` removes its interval from the union; a freeze of
//!   scope `minor` removes it for every change except a patch update (same
//!   major.minor as every selected node runs now). `paused` holds everything.
//! - Work is bounded: a merged window is followed for at most [`HORIZON`]
//!   and [`MAX_MERGED_FIRINGS`] firings, and its start looked for as far
//!   back. Where it is cut it says so (`continues`: open at its end too;
//!   `opened_earlier`: open before its start too), and the next window
//!   starts where it was cut, so every answer is exact minute by minute:
//!   hourly 2-hour windows are one window that never closes, shown as open
//!   past the horizon, not as closing at an end the cut made up.

mod merge;
pub mod schedule;

pub use schedule::{is_fixed_time, Schedule};

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use std::time::Duration;

/// The most firings merged into one window before it is cut (see the module doc).
pub const MAX_MERGED_FIRINGS: usize = 10_000;

/// How far a merged window is followed from where it is asked about (and
/// its start looked for back from there) before it is cut: any window
/// shorter than a year is shown whole, and windows that overlap without a
/// gap for longer (hourly windows of two hours) are shown as open past
/// this. The work stays below the firings the cut by count allows anyway
/// for schedules firing every hour or less often.
pub const HORIZON: chrono::Duration = chrono::Duration::days(366);

/// How many touching periods one open interval of [`Calendar::state_at`]
/// joins (periods touch where a `minor` freeze begins or ends; freezes are
/// few, this only bounds the work).
pub const MAX_JOINED_PERIODS: usize = 8;

/// Why a window specification cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The cron line does not parse.
    #[error("{reason}")]
    Schedule {
        /// The cron line as written.
        schedule: String,
        /// What would be valid, and what croner reported.
        reason: String,
    },
    /// A window of zero length would never let anything start.
    #[error("window duration must be longer than zero")]
    ZeroDuration,
    /// The duration does not fit in a time computation.
    #[error("window duration {0:?} is too large (at most 100 years)")]
    DurationTooLarge(Duration),
    /// The schedule has no firing from the point asked.
    #[error("schedule {schedule:?} never fires after {after}")]
    NeverFires {
        /// The cron line as written.
        schedule: String,
        /// Instant from which no firing was found.
        after: String,
    },
    /// There is no `[window]` at all.
    #[error("no window: at least one [window] is needed")]
    NoWindow,
}

/// `[window]` / `[[window]]`: one cron schedule and how long each firing stays open.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowSpec {
    /// Five-field cron line, evaluated in `timezone`. Default `0 2 1 * *`.
    pub schedule: String,
    /// How long a window stays open after each firing (elapsed time). Default 6h.
    pub duration: Duration,
    /// IANA time zone. Default UTC.
    pub timezone: Tz,
}

/// Which changes a freeze holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FreezeScope {
    /// No node starts.
    All,
    /// Only a patch update may start.
    Minor,
}

impl FreezeScope {
    /// The name used in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            FreezeScope::All => "all",
            FreezeScope::Minor => "minor",
        }
    }
}

/// `[[freeze]]`: an interval in which no node (or only a patch update) starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freeze {
    /// First frozen instant.
    pub start: DateTime<Utc>,
    /// First instant no longer frozen.
    pub end: DateTime<Utc>,
    /// Zone the freeze was written in (for display).
    pub timezone: Tz,
    /// Which changes it holds.
    pub scope: FreezeScope,
    /// Why, as written; shown in states and `drover windows`.
    pub reason: String,
}

impl Freeze {
    fn holds(&self, change: Change) -> bool {
        self.scope == FreezeScope::All || change == Change::Other
    }

    fn contains(&self, t: DateTime<Utc>) -> bool {
        self.start <= t && t < self.end
    }

    /// "freeze "reason" (scope all) until <local> (<UTC>)".
    pub fn describe(&self) -> String {
        let reason = if self.reason.is_empty() {
            "freeze".to_owned()
        } else {
            format!("freeze \"{}\"", self.reason)
        };
        format!(
            "{reason} (scope {}) until {}",
            self.scope.as_str(),
            local_and_utc(self.end, self.timezone)
        )
    }
}

/// What kind of version change a node start would make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Same major.minor as every selected node runs now.
    Patch,
    /// Anything else (minor, major, a downgrade across minors, unknown versions).
    Other,
}

impl Change {
    /// The change from what the selected nodes run now (`current`, one entry
    /// per node; `None` when a node's version cannot be read) to `target`.
    pub fn of<'a>(
        target: &semver::Version,
        current: impl IntoIterator<Item = Option<&'a semver::Version>>,
    ) -> Change {
        let mut any = false;
        for v in current {
            match v {
                Some(v) if v.major == target.major && v.minor == target.minor => any = true,
                _ => return Change::Other,
            }
        }
        if any {
            Change::Patch
        } else {
            Change::Other
        }
    }
}

/// One maintenance window, in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Window {
    /// First instant the window is open.
    pub start: DateTime<Utc>,
    /// First instant the window is closed again, unless `continues`.
    pub end: DateTime<Utc>,
    /// Open before `start` too: its start was looked for no further back.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub opened_earlier: bool,
    /// Open at `end` too: followed no further (see [`HORIZON`]); the next
    /// window starts at `end`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub continues: bool,
}

impl Window {
    /// A window that opens at `start` and closes at `end`.
    pub fn new(start: DateTime<Utc>, end: DateTime<Utc>) -> Self {
        Window {
            start,
            end,
            opened_earlier: false,
            continues: false,
        }
    }

    /// Whether `t` lies inside `[start, end)`.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        self.start <= t && t < self.end
    }
}

/// A stretch of a window in which nodes may really start: a merged window
/// clipped by `all` freezes, and split where a `minor` freeze begins or ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Period {
    /// First instant open.
    pub start: DateTime<Utc>,
    /// First instant closed, unless `continues`.
    pub end: DateTime<Utc>,
    /// `Some(reason)` when only a patch update may start here (a `minor` freeze).
    pub patch_only: Option<String>,
    /// Open before `start` too (its window's start was looked for no further back).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub opened_earlier: bool,
    /// Open at `end` too: its window was followed no further ([`HORIZON`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub continues: bool,
}

/// The window state at one instant for one kind of change: the input the
/// rollout decision takes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct WindowState {
    /// When the open period containing `now` opened; `None` when closed.
    pub opened_at: Option<DateTime<Utc>>,
    /// When the open period containing `now` closes (or, with
    /// `continues`, how far it was followed: it is open then too).
    pub closes_at: Option<DateTime<Utc>>,
    /// The open period goes on past `closes_at` ([`HORIZON`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub continues: bool,
    /// When the next open period (after the current one, if any) opens; `None` if never.
    pub next_opens_at: Option<DateTime<Utc>>,
    /// Held by `paused` or a freeze at `now`: why, in one line.
    pub held: Option<String>,
    /// `held` is the pause (`[rollout] paused = true`), not a freeze.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Zone of the first window, for messages that name a time.
    #[serde(skip)]
    pub timezone: Option<Tz>,
}

impl WindowState {
    /// Whether a node may start now.
    pub fn is_open(&self) -> bool {
        self.opened_at.is_some() && self.held.is_none()
    }

    /// The window state at `now` from plain `[start, end)` intervals sorted
    /// by start (for simulations that are given intervals, not a config).
    pub fn from_intervals(windows: &[(DateTime<Utc>, DateTime<Utc>)], now: DateTime<Utc>) -> Self {
        let open = windows.iter().find(|(s, e)| *s <= now && now < *e);
        let next = windows.iter().find(|(s, _)| *s > now).map(|(s, _)| *s);
        WindowState {
            opened_at: open.map(|w| w.0),
            closes_at: open.map(|w| w.1),
            next_opens_at: next,
            held: None,
            paused: false,
            timezone: None,
            continues: false,
        }
    }

    /// Why no node may start now, in one line ("" when one may).
    pub fn hold_message(&self) -> String {
        if let Some(h) = &self.held {
            return h.clone();
        }
        if self.opened_at.is_some() {
            return String::new();
        }
        match self.next_opens_at {
            Some(t) => format!(
                "waiting for the next window, opening {}",
                local_and_utc(t, self.timezone.unwrap_or(Tz::UTC))
            ),
            None => "no window ahead".into(),
        }
    }
}

/// A time as "Tue 2026-12-08 02:00 CET (2026-12-08T01:00:00Z)".
pub fn local_and_utc(t: DateTime<Utc>, tz: Tz) -> String {
    let utc = t.to_rfc3339_opts(SecondsFormat::AutoSi, true);
    if tz == Tz::UTC {
        return utc;
    }
    format!(
        "{} ({utc})",
        t.with_timezone(&tz).format("%a %Y-%m-%d %H:%M %Z")
    )
}

/// One `[[window]]` ready for computing: schedule plus duration.
#[derive(Debug, Clone)]
struct Part {
    schedule: Schedule,
    duration: chrono::Duration,
}

/// What configures a calendar: its windows, freezes and pause, as an
/// environment file holds them. The config implements it, so the window
/// never reads the config's types (config parses into this module's).
pub trait Configured {
    /// The `[[window]]` tables.
    fn windows(&self) -> &[WindowSpec];
    /// The `[[freeze]]` tables.
    fn freezes(&self) -> &[Freeze];
    /// `[rollout] paused`.
    fn paused(&self) -> bool;
}

/// Every window, freeze and the pause of one environment.
#[derive(Debug, Clone)]
pub struct Calendar {
    parts: Vec<Part>,
    longest: chrono::Duration,
    freezes: Vec<Freeze>,
    paused: bool,
    /// How far a merged window is followed ([`HORIZON`]).
    horizon: chrono::Duration,
}

impl Calendar {
    /// Build from specifications (at least one window).
    pub fn new(windows: &[WindowSpec], freezes: &[Freeze], paused: bool) -> Result<Self, Error> {
        let mut parts = Vec::with_capacity(windows.len());
        for w in windows {
            parts.push(Part {
                schedule: Schedule::new(&w.schedule, w.timezone)?,
                duration: checked_duration(w.duration)?,
            });
        }
        let longest = parts
            .iter()
            .map(|p| p.duration)
            .max()
            .ok_or(Error::NoWindow)?;
        let mut freezes = freezes.to_vec();
        freezes.retain(|f| f.start < f.end);
        freezes.sort_by_key(|f| (f.start, f.end));
        Ok(Calendar {
            parts,
            longest,
            freezes,
            paused,
            horizon: HORIZON,
        })
    }

    /// Follow a merged window at most `horizon` (instead of [`HORIZON`]),
    /// and look for its start as far back: the answers are as exact, cut
    /// sooner. Tests use a short one to meet cuts in a short walk.
    pub fn with_horizon(mut self, horizon: chrono::Duration) -> Self {
        self.horizon = horizon.max(chrono::Duration::minutes(1));
        self
    }

    /// The calendar an environment file configures.
    pub fn of(env: &impl Configured) -> Result<Self, Error> {
        Self::new(env.windows(), env.freezes(), env.paused())
    }

    /// Zone of the first window (freezes and messages default to it).
    pub fn timezone(&self) -> Tz {
        self.parts
            .first()
            .map_or(Tz::UTC, |p| p.schedule.timezone())
    }

    /// The freezes, sorted by start.
    pub fn freezes(&self) -> &[Freeze] {
        &self.freezes
    }

    /// Whether `[rollout] paused` is set.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Raw windows of every part starting strictly after `after`, by start.
    fn raw_after(
        &self,
        after: DateTime<Utc>,
    ) -> impl Iterator<Item = (DateTime<Utc>, DateTime<Utc>)> + '_ {
        let mut its: Vec<_> = self
            .parts
            .iter()
            .map(|p| p.schedule.firings_after(after).peekable())
            .collect();
        std::iter::from_fn(move || {
            let (i, _) = its
                .iter_mut()
                .enumerate()
                .filter_map(|(i, it)| it.peek().map(|t| (i, *t)))
                .min_by_key(|(_, t)| *t)?;
            let start = its[i].next()?;
            let end = start
                .checked_add_signed(self.parts[i].duration)
                .unwrap_or(DateTime::<Utc>::MAX_UTC);
            Some((start, end))
        })
    }

    /// The merged window open at `t`, or else the next one; `None` if none ever opens.
    pub fn window_at_or_after(&self, t: DateTime<Utc>) -> Option<Window> {
        self.windows(t).next()
    }

    /// Merged windows (ignoring freezes) that end after `from`, the one
    /// open at `from` first, with its start looked for back from `from`
    /// ([`Calendar::began`]). A window is followed at most [`HORIZON`] and
    /// [`MAX_MERGED_FIRINGS`] firings; where it is cut it is marked
    /// `continues` and the next one starts at its end.
    pub fn windows(&self, from: DateTime<Utc>) -> impl Iterator<Item = Window> + '_ {
        let mut sweep = self.sweep(from);
        let mut first = true;
        std::iter::from_fn(move || {
            let mut w = sweep.next()?;
            if std::mem::take(&mut first) && w.start == from {
                (w.start, w.opened_earlier) = self.began(from);
            }
            Some(w)
        })
    }

    /// The periods in which nodes may start, ending after `from`, in order:
    /// merged windows clipped by `all` freezes and split at `minor` freezes.
    /// Ignores `paused` (a pause has no end time).
    pub fn periods(&self, from: DateTime<Utc>) -> impl Iterator<Item = Period> + '_ {
        let mut windows: Box<dyn Iterator<Item = Window> + '_> = Box::new(self.windows(from));
        let mut queue: std::collections::VecDeque<Period> = Default::default();
        std::iter::from_fn(move || loop {
            if let Some(p) = queue.pop_front() {
                return Some(p);
            }
            let w = windows.next()?;
            // A window ending inside an `all` freeze that covers the rest
            // of it: go on from the freeze's end, not window by window
            // through a long freeze. A later sweep starts clipped at its
            // `from`, which the freeze held anyway.
            if let Some(f) = self.freezes.iter().find(|f| {
                f.scope == FreezeScope::All && f.start <= w.start.max(from) && w.end <= f.end
            }) {
                windows = Box::new(self.sweep(f.end));
                continue;
            }
            queue.extend(self.split(w).into_iter().filter(|p| p.end > from));
        })
    }

    /// One merged window cut by the freezes into periods.
    fn split(&self, w: Window) -> Vec<Period> {
        let mut cuts = vec![w.start, w.end];
        for f in &self.freezes {
            for x in [f.start, f.end] {
                if w.start < x && x < w.end {
                    cuts.push(x);
                }
            }
        }
        cuts.sort();
        cuts.dedup();
        let mut out: Vec<Period> = Vec::new();
        for pair in cuts.windows(2) {
            let (s, e) = (pair[0], pair[1]);
            if self
                .freezes
                .iter()
                .any(|f| f.scope == FreezeScope::All && f.contains(s))
            {
                continue;
            }
            let patch_only = self
                .freezes
                .iter()
                .find(|f| f.scope == FreezeScope::Minor && f.contains(s))
                .map(|f| f.reason.clone());
            match out.last_mut() {
                Some(last) if last.end == s && last.patch_only == patch_only => last.end = e,
                _ => out.push(Period {
                    start: s,
                    end: e,
                    patch_only,
                    opened_earlier: s == w.start && w.opened_earlier,
                    continues: false,
                }),
            }
        }
        if let Some(last) = out.last_mut().filter(|p| p.end == w.end) {
            last.continues = w.continues;
        }
        out
    }

    /// Open intervals for `change`, ending after `from`: periods that let it
    /// start, with touching ones joined (a cut window stays cut).
    fn open_for(&self, from: DateTime<Utc>, change: Change) -> impl Iterator<Item = Window> + '_ {
        let mut ps = self
            .periods(from)
            .filter(move |p| change == Change::Patch || p.patch_only.is_none())
            .peekable();
        std::iter::from_fn(move || {
            let first = ps.next()?;
            let mut w = Window {
                start: first.start,
                end: first.end,
                opened_earlier: first.opened_earlier,
                continues: first.continues,
            };
            let mut n = 0;
            while let Some(p) = ps.peek() {
                if w.continues || p.start > w.end || n >= MAX_JOINED_PERIODS {
                    break;
                }
                w.end = w.end.max(p.end);
                w.continues = p.continues;
                ps.next();
                n += 1;
            }
            Some(w)
        })
    }

    /// The engine's two window inputs at `now`: for any change, and for a
    /// patch update when it differs (only a `minor` freeze makes it differ).
    pub fn inputs_at(&self, now: DateTime<Utc>) -> (WindowState, Option<WindowState>) {
        let any = self.state_at(now, Change::Other);
        if !self.freezes.iter().any(|f| f.scope == FreezeScope::Minor) {
            return (any, None);
        }
        let patch = self.state_at(now, Change::Patch);
        let patch = (patch != any).then_some(patch);
        (any, patch)
    }

    /// The one answer to "may a node making `change` start at `at`, and if
    /// not, when next?": the windows, minus the freezes that hold the change,
    /// unless paused. Every caller asks this (the agent and the sim through
    /// [`Calendar::inputs_at`], `drover status`, `plan`, `windows` and the
    /// timeline page), so they cannot disagree.
    pub fn opening(&self, at: DateTime<Utc>, change: Change) -> Opening {
        let mut it = self.open_for(at, change);
        let first = it.next();
        let (open, next) = match first {
            Some(w) if w.contains(at) => (Some(w), it.next()),
            other => (None, other),
        };
        let hold = if self.paused {
            Some(Hold::Paused)
        } else {
            self.freezes
                .iter()
                .find(|f| f.contains(at) && f.holds(change))
                .map(|f| Hold::Freeze(f.clone()))
        };
        Opening {
            at,
            open,
            next,
            hold,
            timezone: self.timezone(),
        }
    }

    /// The state at `now` for a node start making `change`: [`Calendar::opening`]
    /// as the engine takes it.
    pub fn state_at(&self, now: DateTime<Utc>, change: Change) -> WindowState {
        self.opening(now, change).into()
    }
}

/// What holds every node start at an instant, whatever the windows say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// `[rollout] paused = true`: until a reviewed change sets it back.
    Paused,
    /// A freeze in force that holds the change.
    Freeze(Freeze),
}

impl Hold {
    /// The one line states and messages carry.
    pub fn describe(&self) -> String {
        match self {
            Hold::Paused => "paused: [rollout] paused = true".to_owned(),
            Hold::Freeze(f) => format!("held by {}", f.describe()),
        }
    }

    /// When the hold ends by itself (`None` for a pause: it has no end).
    pub fn until(&self) -> Option<DateTime<Utc>> {
        match self {
            Hold::Paused => None,
            Hold::Freeze(f) => Some(f.end),
        }
    }
}

/// [`Calendar::opening`]'s answer at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    /// The instant asked about.
    pub at: DateTime<Utc>,
    /// The stretch open at `at` for the change (windows minus the freezes
    /// that hold it); a pause does not close it, it holds it.
    pub open: Option<Window>,
    /// The next such stretch after `open` (or after `at` when none is open).
    pub next: Option<Window>,
    /// The pause, else a freeze in force at `at` that holds the change.
    pub hold: Option<Hold>,
    /// Zone of the first window, for messages that name a time.
    pub timezone: Tz,
}

impl Opening {
    /// Whether a node may start at `at`.
    pub fn may_start(&self) -> bool {
        self.open.is_some() && self.hold.is_none()
    }

    /// The stretch in which a node may next start: the open one, else the
    /// next; `None` while paused (a pause has no end) or when none comes.
    pub fn next_start(&self) -> Option<Window> {
        match self.hold {
            Some(Hold::Paused) => None,
            _ => self.open.or(self.next),
        }
    }
}

impl From<Opening> for WindowState {
    fn from(o: Opening) -> Self {
        WindowState {
            opened_at: o.open.map(|w| w.start),
            closes_at: o.open.map(|w| w.end),
            continues: o.open.is_some_and(|w| w.continues),
            next_opens_at: o.next.map(|w| w.start),
            held: o.hold.as_ref().map(Hold::describe),
            paused: o.hold == Some(Hold::Paused),
            timezone: Some(o.timezone),
        }
    }
}

fn checked_duration(d: Duration) -> Result<chrono::Duration, Error> {
    if d.is_zero() {
        return Err(Error::ZeroDuration);
    }
    let c = chrono::Duration::from_std(d).map_err(|_| Error::DurationTooLarge(d))?;
    // Keep far from chrono's limits so that `start + duration` never overflows.
    if c > chrono::Duration::days(366 * 100) {
        return Err(Error::DurationTooLarge(d));
    }
    Ok(c)
}

/// Check a window specification: cron line and duration.
pub fn validate(spec: &WindowSpec) -> Result<(), Error> {
    Calendar::new(std::slice::from_ref(spec), &[], false).map(|_| ())
}

/// The next `count` merged windows of `spec` that end after `from`; one open at `from` comes first.
pub fn next_windows(
    spec: &WindowSpec,
    from: DateTime<Utc>,
    count: usize,
) -> Result<Vec<Window>, Error> {
    let cal = Calendar::new(std::slice::from_ref(spec), &[], false)?;
    Ok(cal.windows(from).take(count).collect())
}

/// The window of `spec` open at `now`, if any.
pub fn is_open(spec: &WindowSpec, now: DateTime<Utc>) -> Result<Option<Window>, Error> {
    let cal = Calendar::new(std::slice::from_ref(spec), &[], false)?;
    Ok(cal.window_at_or_after(now).filter(|w| w.contains(now)))
}

/// The window of `spec` open at `now`, or else the next one to open.
pub fn next_open(spec: &WindowSpec, now: DateTime<Utc>) -> Result<Window, Error> {
    let cal = Calendar::new(std::slice::from_ref(spec), &[], false)?;
    cal.window_at_or_after(now)
        .ok_or_else(|| Error::NeverFires {
            schedule: spec.schedule.clone(),
            after: now.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(schedule: &str, hours: u64, tz: Tz) -> WindowSpec {
        WindowSpec {
            schedule: schedule.into(),
            duration: Duration::from_secs(hours * 3600),
            timezone: tz,
        }
    }

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn six_field_lines_are_rejected() {
        let err = validate(&spec("0 0 2 8 * *", 1, Tz::UTC)).unwrap_err();
        assert!(matches!(err, Error::Schedule { .. }), "{err}");
    }

    #[test]
    fn zero_duration_is_rejected() {
        let err = validate(&spec("0 2 8 * *", 0, Tz::UTC)).unwrap_err();
        assert_eq!(err, Error::ZeroDuration);
    }

    #[test]
    fn never_firing_schedule_has_no_window_and_does_not_hang() {
        let ws = next_windows(
            &spec("0 0 30 2 *", 1, Tz::UTC),
            t("2026-01-01T00:00:00Z"),
            1,
        )
        .unwrap();
        assert!(ws.is_empty());
    }

    #[test]
    fn window_end_is_exclusive() {
        let s = spec("0 2 8 * *", 6, Tz::UTC);
        assert!(is_open(&s, t("2026-12-08T07:59:59Z")).unwrap().is_some());
        assert!(is_open(&s, t("2026-12-08T08:00:00Z")).unwrap().is_none());
        let w = next_windows(&s, t("2026-12-08T08:00:00Z"), 1).unwrap();
        assert_eq!(w[0].start, t("2027-01-08T02:00:00Z"));
    }

    #[test]
    fn an_always_open_schedule_is_bounded() {
        let s = spec("* * * * *", 2, Tz::UTC);
        let w = next_windows(&s, t("2026-01-01T00:00:00Z"), 2).unwrap();
        assert_eq!(w.len(), 2);
        assert!(w[0].contains(t("2026-01-01T00:00:00Z")));
    }

    #[test]
    fn patch_changes_are_told_apart() {
        let v = |s: &str| semver::Version::parse(s).unwrap();
        let (a, b) = (v("1.13.1"), v("1.13.0"));
        assert_eq!(
            Change::of(&v("1.13.3"), [Some(&a), Some(&b)]),
            Change::Patch
        );
        assert_eq!(Change::of(&v("1.14.0"), [Some(&a)]), Change::Other);
        assert_eq!(Change::of(&v("1.13.3"), [Some(&a), None]), Change::Other);
        assert_eq!(Change::of(&v("1.13.3"), []), Change::Other);
    }
}
