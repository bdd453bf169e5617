//! One cron schedule in one time zone, and its firings as instants, read the
//! way classic (Vixie) cron reads the line (docs/design.md §3).
//!
//! The cron line is matched against *wall-clock* (naive local) times by
//! croner, evaluated in a zone without daylight saving; this module then maps
//! each wall-clock match to instants with the zone's rules. croner's own DST
//! handling cannot be used: it counts a schedule as fixed-time only when the
//! minute and hour are single values, so `"30 1,13 * * *"` would fire twice
//! in a fall-back hour.
//!
//! - A *fixed-time* schedule (neither the minute nor the hour field starts
//!   with `*`; lists, ranges and stepped ranges are fixed) fires a match that
//!   falls in a spring-forward gap at the first valid instant after the gap,
//!   and a match in a repeated (fall-back) hour once, at its first occurrence.
//! - Any other schedule follows the wall clock: nothing fires in the gap, and
//!   both occurrences of a repeated time fire.
//! - Several matches that resolve to the same instant fire once.

use super::Error;
use chrono::{DateTime, LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use std::collections::BTreeSet;

/// How far before `t`'s wall-clock time a match can still fire after `t`:
/// the largest fall-back any zone has made since 1900 is 2h (Antarctica/Troll
/// moves by 2h); 3h leaves room.
const LOOKBACK: chrono::Duration = chrono::Duration::hours(3);

/// The longest spring-forward gap searched for its end (Pacific/Apia skipped
/// a whole day in 2011).
const LONGEST_GAP_MINUTES: u32 = 49 * 60;

/// Parse a five-field cron line the way windows are computed.
fn parse_cron(s: &str) -> Result<Cron, String> {
    let syntax = "a cron line of exactly 5 fields (minute hour day-of-month month \
                  day-of-week), such as \"0 2 8 * *\" for 02:00 on the 8th";
    let fields = s.split_whitespace().count();
    if fields == 6 {
        return Err(format!(
            "`schedule` must be {syntax}; found 6 fields in \"{s}\": a seconds (or year) \
             field is not supported"
        ));
    }
    if fields != 5 {
        return Err(format!(
            "`schedule` must be {syntax}; found {fields} field{} in \"{s}\"",
            if fields == 1 { "" } else { "s" }
        ));
    }
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Disallowed)
        .year(croner::parser::Year::Disallowed)
        .build()
        .parse(s)
        .map_err(|e| match out_of_range(s) {
            // croner says only "Number out of bounds": name the field.
            Some(why) => format!("`schedule` must be {syntax}; found \"{s}\": {why}"),
            None => format!("`schedule` must be {syntax}; found \"{s}\": {e}"),
        })
}

/// The first number of a five-field cron line outside its field's range,
/// said as `the hour 25 is out of range 0–23`.
fn out_of_range(s: &str) -> Option<String> {
    const FIELDS: [(&str, u32, u32); 5] = [
        ("minute", 0, 59),
        ("hour", 0, 23),
        ("day of the month", 1, 31),
        ("month", 1, 12),
        ("day of the week", 0, 7),
    ];
    for (field, (name, lo, hi)) in s.split_whitespace().zip(FIELDS) {
        for part in field.split(',') {
            // A step (`*/5`) is not a value of the field.
            let values = part.split('/').next().unwrap_or("");
            for n in values.split('-').filter_map(|v| v.parse::<u32>().ok()) {
                if n < lo || n > hi {
                    return Some(format!("the {name} {n} is out of range {lo}–{hi}"));
                }
            }
        }
    }
    None
}

/// Whether classic cron treats the line as fixed-time: neither the minute
/// nor the hour field starts with `*`.
pub fn is_fixed_time(schedule: &str) -> bool {
    let mut f = schedule.split_whitespace();
    let (Some(min), Some(hour)) = (f.next(), f.next()) else {
        return false;
    };
    !min.starts_with('*') && !hour.starts_with('*')
}

/// A parsed cron line in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    text: String,
    fixed: bool,
    tz: Tz,
}

impl Schedule {
    /// Parse `schedule`, evaluated in `tz`.
    pub fn new(schedule: &str, tz: Tz) -> Result<Self, Error> {
        let cron = parse_cron(schedule).map_err(|reason| Error::Schedule {
            schedule: schedule.to_owned(),
            reason,
        })?;
        Ok(Schedule {
            cron,
            text: schedule.trim().to_owned(),
            fixed: is_fixed_time(schedule),
            tz,
        })
    }

    /// The cron line as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The zone the line is evaluated in.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// Whether the line is fixed-time (see the module doc).
    pub fn is_fixed_time(&self) -> bool {
        self.fixed
    }

    /// The firings strictly after `t`, in time order. The iterator ends when
    /// the schedule stops firing (croner searches up to the year 5000).
    pub fn firings_after(&self, t: DateTime<Utc>) -> Firings<'_> {
        let wall = t.with_timezone(&self.tz).naive_local();
        Firings {
            s: self,
            after: t,
            cursor: wall.checked_sub_signed(LOOKBACK).unwrap_or(wall),
            peeked: None,
            second: BTreeSet::new(),
            last: None,
            done: false,
        }
    }

    /// The next wall-clock match after `cursor`, as its earliest instant and,
    /// for a wildcard schedule in a repeated hour, its second occurrence.
    fn next_match(
        &self,
        cursor: &mut NaiveDateTime,
    ) -> Option<(DateTime<Utc>, Option<DateTime<Utc>>)> {
        // Skipping wildcard matches inside a gap is bounded by the gap's
        // length in minutes.
        for _ in 0..=LONGEST_GAP_MINUTES {
            let next = self
                .cron
                .find_next_occurrence(&Utc.from_utc_datetime(cursor), false)
                .ok()?
                .naive_utc();
            *cursor = next;
            match self.tz.from_local_datetime(&next) {
                LocalResult::Single(d) => return Some((d.with_timezone(&Utc), None)),
                LocalResult::Ambiguous(a, b) => {
                    let later = (!self.fixed).then(|| b.with_timezone(&Utc));
                    return Some((a.with_timezone(&Utc), later));
                }
                LocalResult::None if self.fixed => return Some((gap_end(self.tz, next)?, None)),
                LocalResult::None => continue,
            }
        }
        None
    }
}

/// A wall-clock time as a fixed-time firing reads it: its first occurrence,
/// or, in a spring-forward gap, the first valid instant after the gap.
pub(crate) fn resolve_fixed(tz: Tz, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t.with_timezone(&Utc)),
        LocalResult::None => gap_end(tz, wall),
    }
}

/// The first valid instant after the spring-forward gap that holds `wall`.
fn gap_end(tz: Tz, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
    let minute = chrono::Duration::minutes(1);
    let second = chrono::Duration::seconds(1);
    let mut m = wall;
    for _ in 0..LONGEST_GAP_MINUTES {
        m = m.checked_add_signed(minute)?;
        if let Some(mut best) = tz.from_local_datetime(&m).earliest() {
            // Zone changes of old (LMT) offsets fall between minutes.
            let mut s = m;
            for _ in 0..59 {
                s = s.checked_sub_signed(second)?;
                match tz.from_local_datetime(&s).earliest() {
                    Some(e) if s > wall => best = e,
                    _ => break,
                }
            }
            return Some(best.with_timezone(&Utc));
        }
    }
    None
}

/// Iterator over a schedule's firings, in time order; see [`Schedule::firings_after`].
#[derive(Debug)]
pub struct Firings<'a> {
    s: &'a Schedule,
    after: DateTime<Utc>,
    cursor: NaiveDateTime,
    peeked: Option<(DateTime<Utc>, Option<DateTime<Utc>>)>,
    /// Second occurrences of repeated wall times, which come after the
    /// first occurrences of later wall times.
    second: BTreeSet<DateTime<Utc>>,
    last: Option<DateTime<Utc>>,
    done: bool,
}

impl Iterator for Firings<'_> {
    type Item = DateTime<Utc>;

    fn next(&mut self) -> Option<DateTime<Utc>> {
        loop {
            if self.peeked.is_none() && !self.done {
                self.peeked = self.s.next_match(&mut self.cursor);
                self.done = self.peeked.is_none();
            }
            let pending = self.second.first().copied();
            let t = match (self.peeked, pending) {
                (Some((e, _)), Some(p)) if p < e => self.second.pop_first()?,
                (Some((e, later)), _) => {
                    self.peeked = None;
                    self.second.extend(later);
                    e
                }
                (None, Some(_)) => self.second.pop_first()?,
                (None, None) => return None,
            };
            if t <= self.after || self.last == Some(t) {
                continue;
            }
            self.last = Some(t);
            return Some(t);
        }
    }
}
