//! Maintenance windows (DESIGN §3): cron firings in a time zone, each open for a duration.
//!
//! Semantics, chosen so the cron line reads the way a person expects:
//!
//! - A window is the half-open interval `[start, end)`; it is open at `start`
//!   and closed at `end`.
//! - `duration` is exact elapsed time: a 6h window that spans a
//!   daylight-saving change lasts 6 real hours, so its local end time moves
//!   by the change (02:00 + 6h on a spring-forward day ends at 09:00 local).
//! - Spring forward: a firing whose local time does not exist that day
//!   (02:30 in Europe/Madrid on the last Sunday of March) fires at the first
//!   valid instant after the gap (03:00 local).
//! - Fall back: a fixed-time firing whose local time occurs twice fires
//!   once, at the first occurrence. Schedules with wildcard or stepped
//!   hours/minutes fire at both occurrences, like any repeated wall time.
//! - Days some months lack: `0 2 31 * *` fires only in months with a 31st
//!   (it is never moved to the 30th or the 1st).
//! - A window longer than the gap to the next firing (overlapping windows)
//!   is an error; back-to-back windows (`end == next start`) are fine.
//! - Schedules have exactly five fields (no seconds, no year).

use crate::config::WindowSpec;
use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Serialize;

/// Why a window specification cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The cron line does not parse.
    #[error("schedule {schedule:?} is not a valid 5-field cron line (minute hour day-of-month month day-of-week): {reason}")]
    Schedule {
        /// The cron line as written.
        schedule: String,
        /// What croner reported.
        reason: String,
    },
    /// The schedule has no firing from the point asked.
    #[error("schedule {schedule:?} never fires after {after}")]
    NeverFires {
        /// The cron line as written.
        schedule: String,
        /// Instant from which no firing was found.
        after: String,
    },
    /// A window of zero length would never let anything start.
    #[error("window duration must be longer than zero")]
    ZeroDuration,
    /// The duration does not fit in a time computation.
    #[error("window duration {0:?} is too large")]
    DurationTooLarge(std::time::Duration),
    /// Two consecutive windows overlap.
    #[error("window duration {duration} is longer than the gap between the firings at {first} and {next} of schedule {schedule:?}; shorten the duration or space the firings out")]
    Overlap {
        /// The cron line as written.
        schedule: String,
        /// The duration, as humantime writes it.
        duration: String,
        /// Start of the first window (RFC 3339 UTC).
        first: String,
        /// Start of the window it runs into (RFC 3339 UTC).
        next: String,
    },
}

/// One maintenance window, in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Window {
    /// First instant the window is open.
    pub start: DateTime<Utc>,
    /// First instant the window is closed again.
    pub end: DateTime<Utc>,
}

impl Window {
    /// Whether `t` lies inside `[start, end)`.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        self.start <= t && t < self.end
    }
}

/// A parsed window specification, for computing many windows from one spec.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    schedule: String,
    duration: chrono::Duration,
    std_duration: std::time::Duration,
    tz: Tz,
}

/// Five fields only: a seconds or year field would make a line that reads
/// one way to people used to crontab and another way to croner.
fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
}

impl Schedule {
    /// Parse `spec`'s cron line and check its duration (not yet overlaps; see [`validate`]).
    pub fn new(spec: &WindowSpec) -> Result<Self, Error> {
        let cron = parser()
            .parse(&spec.schedule)
            .map_err(|e| Error::Schedule {
                schedule: spec.schedule.clone(),
                reason: e.to_string(),
            })?;
        if spec.duration.is_zero() {
            return Err(Error::ZeroDuration);
        }
        let duration = chrono::Duration::from_std(spec.duration)
            .map_err(|_| Error::DurationTooLarge(spec.duration))?;
        // Keep far from chrono's limits so that `start + duration` never overflows.
        if duration > chrono::Duration::days(366 * 100) {
            return Err(Error::DurationTooLarge(spec.duration));
        }
        Ok(Self {
            cron,
            schedule: spec.schedule.clone(),
            duration,
            std_duration: spec.duration,
            tz: spec.timezone,
        })
    }

    /// The time zone the cron line is evaluated in.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// First firing strictly after `t`.
    fn firing_after(&self, t: DateTime<Utc>) -> Result<DateTime<Utc>, Error> {
        let local = t.with_timezone(&self.tz);
        self.cron
            .find_next_occurrence(&local, false)
            .map(|d| d.with_timezone(&Utc))
            .map_err(|_| Error::NeverFires {
                schedule: self.schedule.clone(),
                after: rfc3339(t),
            })
    }

    fn window_at(&self, start: DateTime<Utc>) -> Window {
        Window {
            start,
            end: start + self.duration,
        }
    }

    fn overlap(&self, w: &Window, next: DateTime<Utc>) -> Error {
        Error::Overlap {
            schedule: self.schedule.clone(),
            duration: humantime::format_duration(self.std_duration).to_string(),
            first: rfc3339(w.start),
            next: rfc3339(next),
        }
    }

    /// The next `count` windows that end after `from`, a window open at `from` first.
    pub fn next_windows(&self, from: DateTime<Utc>, count: usize) -> Result<Vec<Window>, Error> {
        let mut out = Vec::with_capacity(count);
        if count == 0 {
            return Ok(out);
        }
        // A window ends after `from` exactly when it starts after `from - duration`.
        let mut start = self.firing_after(from - self.duration)?;
        loop {
            let w = self.window_at(start);
            // The firing after the last listed one is computed too, so an
            // overlap at the end of the list is reported rather than hidden.
            let next = self.firing_after(start)?;
            if w.end > next {
                return Err(self.overlap(&w, next));
            }
            out.push(w);
            if out.len() == count {
                return Ok(out);
            }
            start = next;
        }
    }

    /// The window open at `now`, if any.
    pub fn is_open(&self, now: DateTime<Utc>) -> Result<Option<Window>, Error> {
        let w = self.next_open(now)?;
        Ok(w.contains(now).then_some(w))
    }

    /// The window open at `now`, or else the next one to open.
    pub fn next_open(&self, now: DateTime<Utc>) -> Result<Window, Error> {
        let mut ws = self.next_windows(now, 1)?;
        ws.pop().ok_or_else(|| Error::NeverFires {
            schedule: self.schedule.clone(),
            after: rfc3339(now),
        })
    }

    /// Check that no two windows overlap over a span long enough to meet
    /// every calendar pattern (leap years, both DST changes, 31st-only months).
    pub fn validate(&self) -> Result<(), Error> {
        // Fixed, so validation gives the same answer whenever it runs;
        // eight years include two leap days.
        let from = Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).single();
        let until = Utc.with_ymd_and_hms(2032, 1, 1, 0, 0, 0).single();
        let (Some(from), Some(until)) = (from, until) else {
            return Ok(());
        };
        // Bounded work for frequent schedules: an overlap in a frequent
        // schedule shows within its first few firings anyway.
        const MAX_FIRINGS: usize = 20_000;
        let mut start = self.firing_after(from)?;
        for _ in 0..MAX_FIRINGS {
            let w = self.window_at(start);
            let next = match self.firing_after(start) {
                Ok(n) => n,
                // A schedule that stops firing (e.g. 29 February near
                // croner's year limit) cannot overlap past its last firing.
                Err(_) => return Ok(()),
            };
            if w.end > next {
                return Err(self.overlap(&w, next));
            }
            if next >= until {
                return Ok(());
            }
            start = next;
        }
        Ok(())
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// Check a window specification: cron line, duration, and no overlapping windows.
pub fn validate(spec: &WindowSpec) -> Result<(), Error> {
    Schedule::new(spec)?.validate()
}

/// The next `count` windows of `spec` that end after `from`; one open at `from` comes first.
pub fn next_windows(
    spec: &WindowSpec,
    from: DateTime<Utc>,
    count: usize,
) -> Result<Vec<Window>, Error> {
    Schedule::new(spec)?.next_windows(from, count)
}

/// The window of `spec` open at `now`, if any.
pub fn is_open(spec: &WindowSpec, now: DateTime<Utc>) -> Result<Option<Window>, Error> {
    Schedule::new(spec)?.is_open(now)
}

/// The window of `spec` open at `now`, or else the next one to open.
pub fn next_open(spec: &WindowSpec, now: DateTime<Utc>) -> Result<Window, Error> {
    Schedule::new(spec)?.next_open(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(schedule: &str, hours: u64, tz: Tz) -> WindowSpec {
        WindowSpec {
            schedule: schedule.into(),
            duration: std::time::Duration::from_secs(hours * 3600),
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
    fn never_firing_schedule_is_an_error_not_a_hang() {
        let err = next_windows(
            &spec("0 0 30 2 *", 1, Tz::UTC),
            t("2026-01-01T00:00:00Z"),
            1,
        )
        .unwrap_err();
        assert!(matches!(err, Error::NeverFires { .. }), "{err}");
    }

    #[test]
    fn window_end_is_exclusive() {
        let s = spec("0 2 8 * *", 6, Tz::UTC);
        assert!(is_open(&s, t("2026-12-08T07:59:59Z")).unwrap().is_some());
        assert!(is_open(&s, t("2026-12-08T08:00:00Z")).unwrap().is_none());
        let w = next_open(&s, t("2026-12-08T08:00:00Z")).unwrap();
        assert_eq!(w.start, t("2027-01-08T02:00:00Z"));
    }
}
