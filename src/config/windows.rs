//! The grammar of `[window]` / `[[window]]`, `[[freeze]]` and `[rollout]
//! paused` in an environment file. Parsing only: what the values mean (cron
//! firings, merging, freezes) is owned by [`crate::window`].

use super::keys::ENV_KEYS;
use super::spanned::{Ctx, Span};
use super::values::nearest;
use crate::config::{
    Freeze, FreezeScope, WindowSpec, DEFAULT_SCHEDULE, DEFAULT_TIMEZONE, DEFAULT_WINDOW_DURATION,
};
use crate::window;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use chrono_tz::Tz;
use toml::de::{DeTable, DeValue};

/// The most `[[window]]` or `[[freeze]]` tables one file may hold.
const MAX_ENTRIES: usize = 64;

/// What a freeze time may look like, for error messages.
const FREEZE_TIME: &str = "a TOML date-time such as 2026-12-18T00:00:00 (local time in \
                           `timezone`) or 2026-12-18T00:00:00+01:00, or a date such as 2026-12-18";

impl<'a> Ctx<'a> {
    /// `[window]` (one table) or `[[window]]` (several); the default window when absent.
    pub(super) fn windows(&mut self, doc: &DeTable<'a>) -> Vec<WindowSpec> {
        let Some(v) = doc.get("window") else {
            return vec![WindowSpec::default()];
        };
        let Some(tables) = self.tables_of(
            doc,
            "window",
            true,
            "a table, written [window] or [[window]]",
            ("windows", MAX_ENTRIES),
        ) else {
            return vec![WindowSpec::default()];
        };
        if tables.is_empty() {
            let span = self.key_span(doc, "window").unwrap_or(v.span());
            self.err(
                &span,
                "`window` has no entry; write at least one [[window]] with a `schedule`",
            );
        }
        tables
            .into_iter()
            .take(MAX_ENTRIES)
            .map(|(t, _)| self.window(t))
            .collect()
    }

    fn window(&mut self, t: &DeTable<'a>) -> WindowSpec {
        self.check_keys(t, "window", ENV_KEYS);
        self.window_keys(t)
    }

    /// `schedule`, `duration` and `timezone` of `t` (a `[[window]]` or a
    /// `[[wave]]`, whose keys the caller checks), validated alike.
    pub(super) fn window_keys(&mut self, t: &DeTable<'a>) -> WindowSpec {
        let timezone = match t.get("timezone") {
            None => Some(DEFAULT_TIMEZONE),
            Some(v) => self.timezone(v),
        };
        let schedule = match t.get("schedule") {
            None => Some(DEFAULT_SCHEDULE.to_owned()),
            Some(v) => self
                .want_str("schedule", v, "a cron line such as \"0 2 8 * *\"")
                .and_then(|s| match window::Schedule::new(s, Tz::UTC) {
                    // Fixed, so validation gives the same answer whenever it runs.
                    Ok(c) if c.firings_after(DateTime::UNIX_EPOCH).next().is_none() => {
                        self.err(
                            &v.span(),
                            format!(
                                "`schedule` \"{s}\" never fires (no such date); use a date \
                                 that exists, such as \"0 2 8 * *\""
                            ),
                        );
                        None
                    }
                    Ok(_) => Some(s.trim().to_owned()),
                    Err(e) => {
                        self.err(&v.span(), e.to_string());
                        None
                    }
                }),
        };
        let (duration, _) = self.duration(Some(t), "duration", DEFAULT_WINDOW_DURATION, false);
        WindowSpec {
            schedule: schedule.unwrap_or_else(|| DEFAULT_SCHEDULE.to_owned()),
            duration,
            timezone: timezone.unwrap_or(DEFAULT_TIMEZONE),
        }
    }

    fn timezone(&mut self, v: &super::spanned::Value<'a>) -> Option<Tz> {
        let s = self.want_str(
            "timezone",
            v,
            "an IANA time zone name such as \"Europe/Madrid\"",
        )?;
        match s.parse::<Tz>() {
            Ok(tz) => Some(tz),
            Err(_) => {
                let names = chrono_tz::TZ_VARIANTS.iter().map(|t| t.name());
                let hint = nearest(s, names)
                    .map(|n| format!("; did you mean \"{n}\"?"))
                    .unwrap_or_default();
                self.err(
                    &v.span(),
                    format!(
                        "`timezone` must be an IANA time zone name such as \
                         \"Europe/Madrid\" or \"UTC\"; found \"{s}\"{hint}"
                    ),
                );
                None
            }
        }
    }

    /// `[[freeze]]` tables; `default_tz` is the first window's zone.
    pub(super) fn freezes(&mut self, doc: &DeTable<'a>, default_tz: Tz) -> Vec<Freeze> {
        let Some(tables) = self.tables_of(
            doc,
            "freeze",
            true,
            "tables, written [[freeze]]",
            ("freezes", MAX_ENTRIES),
        ) else {
            return Vec::new();
        };
        tables
            .into_iter()
            .take(MAX_ENTRIES)
            .filter_map(|(t, span)| self.freeze(t, span, default_tz))
            .collect()
    }

    fn freeze(&mut self, t: &DeTable<'a>, at: Span, default_tz: Tz) -> Option<Freeze> {
        self.check_keys(t, "freeze", ENV_KEYS);
        let timezone = match t.get("timezone") {
            None => Some(default_tz),
            Some(v) => self.timezone(v),
        };
        let scope = match t.get("scope") {
            None => Some(FreezeScope::All),
            Some(v) => match self.one_of("scope", v, &["all", "minor"]) {
                Some("all") => Some(FreezeScope::All),
                Some(_) => Some(FreezeScope::Minor),
                None => None,
            },
        };
        let reason = match t.get("reason") {
            None => Some(String::new()),
            Some(v) => self
                .want_str("reason", v, "a string such as \"holiday change freeze\"")
                .and_then(|s| {
                    if s.len() > 200 || s.contains(['\n', '\r']) {
                        self.err(
                            &v.span(),
                            "`reason` must be one line of at most 200 bytes; it is shown in \
                             states and Events",
                        );
                        None
                    } else {
                        Some(s.to_owned())
                    }
                }),
        };
        let tz = timezone.unwrap_or(default_tz);
        let mut when = |key: &str| -> Option<(DateTime<Utc>, Span)> {
            let Some(v) = t.get(key) else {
                self.err(&at, format!("[[freeze]] requires `{key}`, {FREEZE_TIME}"));
                return None;
            };
            let DeValue::Datetime(d) = v.get_ref() else {
                self.type_err(key, &v.span(), FREEZE_TIME, v.get_ref());
                return None;
            };
            match freeze_time(&d.to_string(), tz) {
                Ok(t) => Some((t, v.span())),
                Err(e) => {
                    self.err(&v.span(), format!("`{key}` must be {FREEZE_TIME}; {e}"));
                    None
                }
            }
        };
        let start = when("start");
        let end = when("end");
        let ((start, _), (end, end_span)) = (start?, end?);
        if end <= start {
            self.err(
                &end_span,
                format!(
                    "`end` ({}) must be after `start` ({})",
                    window::local_and_utc(end, tz),
                    window::local_and_utc(start, tz)
                ),
            );
            return None;
        }
        Some(Freeze {
            start,
            end,
            timezone: tz,
            scope: scope?,
            reason: reason?,
        })
    }
}

/// A TOML date-time as written: with an offset it is that instant; without,
/// local time in `tz` (a time in a spring-forward gap means the first valid
/// instant after it, a repeated time its first occurrence); a bare date is
/// local midnight.
fn freeze_time(s: &str, tz: Tz) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let naive = if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        d.and_hms_opt(0, 0, 0).ok_or_else(|| format!("found {s}"))?
    } else {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
            .or_else(|_| NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M"))
            .map_err(|_| format!("found {s} (a time of day needs a date)"))?
    };
    window::schedule::resolve_fixed(tz, naive)
        .ok_or_else(|| format!("found {s}, which does not exist in {}", tz.name()))
}
