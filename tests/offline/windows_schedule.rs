//! Maintenance windows (docs/design.md §3) computed from `WindowSpec` values: no config parsing, no I/O.

use crate::support::time::t;
use chrono_tz::Tz;
use drover::config::WindowSpec;
use drover::window::{self, Error, Window};
use std::time::Duration;

fn spec(schedule: &str, duration: Duration, tz: Tz) -> WindowSpec {
    WindowSpec {
        schedule: schedule.into(),
        duration,
        timezone: tz,
    }
}

fn hours(h: u64) -> Duration {
    Duration::from_secs(h * 3600)
}

fn starts(ws: &[Window]) -> Vec<String> {
    ws.iter()
        .map(|w| w.start.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .collect()
}

#[test]
fn stage_example_windows_in_madrid() {
    // docs/design.md §2: "0 2 8 * *", 6h, Europe/Madrid. 02:00 CET is 01:00Z in winter,
    // 02:00 CEST is 00:00Z in summer.
    let s = spec("0 2 8 * *", hours(6), Tz::Europe__Madrid);
    let ws = window::next_windows(&s, t("2026-02-01T00:00:00Z"), 4).unwrap();
    assert_eq!(
        starts(&ws),
        [
            "2026-02-08T01:00:00Z",
            "2026-03-08T01:00:00Z",
            "2026-04-08T00:00:00Z",
            "2026-05-08T00:00:00Z"
        ]
    );
    assert!(ws
        .iter()
        .all(|w| w.end - w.start == chrono::Duration::hours(6)));
}

#[test]
fn utc_timezone_uses_the_cron_line_as_utc() {
    let s = spec("0 2 1 * *", hours(6), Tz::UTC);
    let ws = window::next_windows(&s, t("2026-11-15T00:00:00Z"), 2).unwrap();
    assert_eq!(ws[0].start, t("2026-12-01T02:00:00Z"));
    assert_eq!(ws[0].end, t("2026-12-01T08:00:00Z"));
    assert_eq!(ws[1].start, t("2027-01-01T02:00:00Z"));
}

#[test]
fn an_open_window_is_listed_first() {
    let s = spec("0 2 1 * *", hours(6), Tz::UTC);
    let now = t("2026-12-01T05:00:00Z");
    let ws = window::next_windows(&s, now, 2).unwrap();
    assert_eq!(ws[0].start, t("2026-12-01T02:00:00Z"));
    assert_eq!(ws[1].start, t("2027-01-01T02:00:00Z"));
    assert_eq!(window::is_open(&s, now).unwrap(), Some(ws[0]));
    assert_eq!(window::next_open(&s, now).unwrap(), ws[0]);
    // At its start the window is open; at its end it is not.
    assert_eq!(window::is_open(&s, ws[0].start).unwrap(), Some(ws[0]));
    assert_eq!(window::is_open(&s, ws[0].end).unwrap(), None);
    assert_eq!(window::next_open(&s, ws[0].end).unwrap(), ws[1]);
}

#[test]
fn windows_cross_midnight() {
    let s = spec("0 22 * * *", hours(4), Tz::UTC);
    let now = t("2026-01-02T01:30:00Z");
    let open = window::is_open(&s, now).unwrap().expect("open since 22:00");
    assert_eq!(open.start, t("2026-01-01T22:00:00Z"));
    assert_eq!(open.end, t("2026-01-02T02:00:00Z"));
    let ws = window::next_windows(&s, now, 2).unwrap();
    assert_eq!(ws[0], open);
    assert_eq!(ws[1].start, t("2026-01-02T22:00:00Z"));
    assert_eq!(
        window::is_open(&s, t("2026-01-02T02:00:00Z")).unwrap(),
        None
    );
}

#[test]
fn windows_cross_midnight_in_local_time() {
    // 23:00 New York (EST, -5) is 04:00Z the next day.
    let s = spec("0 23 * * 5", hours(5), Tz::America__New_York);
    let ws = window::next_windows(&s, t("2026-01-01T00:00:00Z"), 1).unwrap();
    assert_eq!(ws[0].start, t("2026-01-03T04:00:00Z"));
    assert_eq!(ws[0].end, t("2026-01-03T09:00:00Z"));
}

#[test]
fn spring_forward_in_madrid_fires_at_the_first_valid_instant() {
    // 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
    let s = spec("30 2 * * *", hours(1), Tz::Europe__Madrid);
    let ws = window::next_windows(&s, t("2026-03-28T00:00:00Z"), 3).unwrap();
    assert_eq!(
        starts(&ws),
        [
            "2026-03-28T01:30:00Z", // 02:30 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST, first instant after the gap
            "2026-03-30T00:30:00Z", // 02:30 CEST
        ]
    );
}

#[test]
fn spring_forward_in_new_york_fires_at_the_first_valid_instant() {
    // 2026-03-08: 02:00 EST jumps to 03:00 EDT.
    let s = spec("30 2 * * *", hours(1), Tz::America__New_York);
    let ws = window::next_windows(&s, t("2026-03-07T00:00:00Z"), 3).unwrap();
    assert_eq!(
        starts(&ws),
        [
            "2026-03-07T07:30:00Z", // 02:30 EST
            "2026-03-08T07:00:00Z", // 03:00 EDT
            "2026-03-09T06:30:00Z", // 02:30 EDT
        ]
    );
}

#[test]
fn fall_back_in_madrid_fires_once_at_the_first_occurrence() {
    // 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    let s = spec("30 2 * * *", hours(1), Tz::Europe__Madrid);
    let ws = window::next_windows(&s, t("2026-10-24T12:00:00Z"), 2).unwrap();
    assert_eq!(
        starts(&ws),
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        "02:30 CEST only, not again at 02:30 CET"
    );
    // Asked from inside the repeated hour, after the firing: no second window that day.
    let ws = window::next_windows(&s, t("2026-10-25T01:45:00Z"), 1).unwrap();
    assert_eq!(ws[0].start, t("2026-10-26T01:30:00Z"));
}

#[test]
fn fall_back_in_new_york_fires_once_at_the_first_occurrence() {
    // 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
    let s = spec("30 1 * * *", hours(2), Tz::America__New_York);
    let ws = window::next_windows(&s, t("2026-11-01T00:00:00Z"), 2).unwrap();
    assert_eq!(
        starts(&ws),
        ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    );
}

#[test]
fn duration_is_elapsed_time_across_a_dst_change() {
    // Opens 00:00 CET (23:00Z), lasts 6 real hours: closes 07:00 CEST local.
    let s = spec("0 0 29 3 *", hours(6), Tz::Europe__Madrid);
    let w = window::next_open(&s, t("2026-03-01T00:00:00Z")).unwrap();
    assert_eq!(w.start, t("2026-03-28T23:00:00Z"));
    assert_eq!(w.end, t("2026-03-29T05:00:00Z"));
    assert_eq!(
        w.end
            .with_timezone(&Tz::Europe__Madrid)
            .format("%H:%M")
            .to_string(),
        "07:00"
    );
}

#[test]
fn the_31st_fires_only_in_months_that_have_one() {
    let s = spec("0 2 31 * *", hours(6), Tz::UTC);
    let ws = window::next_windows(&s, t("2026-01-01T00:00:00Z"), 7).unwrap();
    assert_eq!(
        starts(&ws),
        [
            "2026-01-31T02:00:00Z",
            "2026-03-31T02:00:00Z",
            "2026-05-31T02:00:00Z",
            "2026-07-31T02:00:00Z",
            "2026-08-31T02:00:00Z",
            "2026-10-31T02:00:00Z",
            "2026-12-31T02:00:00Z",
        ]
    );
}

#[test]
fn a_window_longer_than_the_gap_merges_with_the_next() {
    // Daily for 25h: every window runs into the next, so they form one.
    let daily = spec("0 2 * * *", hours(25), Tz::UTC);
    window::validate(&daily).unwrap();
    let ws = window::next_windows(&daily, t("2026-01-01T00:00:00Z"), 2).unwrap();
    assert!(
        ws[0].end - ws[0].start > chrono::Duration::days(300),
        "{ws:?}"
    );
}

#[test]
fn back_to_back_windows_merge() {
    // 00:00-12:00 and 12:00-24:00 every day: one open stretch, never closed.
    let s = spec("0 0,12 * * *", hours(12), Tz::UTC);
    window::validate(&s).unwrap();
    let w = window::next_open(&s, t("2026-01-01T07:00:00Z")).unwrap();
    assert!(w.end - w.start > chrono::Duration::days(300), "{w:?}");
    // Saturdays 02:00 for 22h and Sundays 00:00 for 4h touch at midnight.
    let s = spec("0 2 * * 6", hours(22), Tz::UTC);
    let ws = window::next_windows(&s, t("2026-01-01T00:00:00Z"), 1).unwrap();
    assert_eq!(ws[0].end, t("2026-01-04T00:00:00Z"));
}

#[test]
fn overlap_is_valid_for_any_now() {
    // The 31st for 32 days: windows overlap from July to August only.
    let s = spec("0 2 31 * *", hours(32 * 24), Tz::UTC);
    for now in [
        "2026-01-01T00:00:00Z",
        "2028-06-01T00:00:00Z",
        "2091-03-01T00:00:00Z",
    ] {
        window::validate(&s).unwrap();
        assert!(
            !window::next_windows(&s, t(now), 3).unwrap().is_empty(),
            "{now}"
        );
    }
    let ws = window::next_windows(&s, t("2026-07-03T00:00:00Z"), 1).unwrap();
    assert_eq!(ws[0].start, t("2026-07-31T02:00:00Z"));
    assert_eq!(
        ws[0].end,
        t("2026-10-02T02:00:00Z"),
        "Jul 31 + Aug 31 merged"
    );
}

#[test]
fn invalid_cron_lines_are_errors() {
    for bad in ["", "0 2 8 *", "61 2 8 * *", "0 2 8 * * 2026x", "every day"] {
        let err = window::validate(&spec(bad, hours(1), Tz::UTC)).unwrap_err();
        assert!(matches!(err, Error::Schedule { .. }), "{bad:?}: {err}");
    }
}

/// The examples table of docs/config.md ("Windows, freezes and pause").
#[test]
fn the_documented_dst_examples_hold() {
    let first = |sched: &str, tz: Tz, from: &str, n: usize| -> Vec<String> {
        window::next_windows(&spec(sched, Duration::from_secs(60), tz), t(from), n)
            .unwrap()
            .iter()
            .map(|w| w.start.format("%Y-%m-%dT%H:%MZ").to_string())
            .collect()
    };
    assert_eq!(
        first("30 2 * * *", Tz::Europe__Madrid, "2026-03-28T12:00:00Z", 1),
        ["2026-03-29T01:00Z"]
    );
    assert_eq!(
        first("30 2 * * *", Tz::Europe__Madrid, "2026-10-24T12:00:00Z", 2),
        ["2026-10-25T00:30Z", "2026-10-26T01:30Z"]
    );
    assert_eq!(
        first(
            "8 1,2 * * *",
            Tz::Australia__Sydney,
            "2027-10-02T13:00:00Z",
            2
        ),
        ["2027-10-02T15:08Z", "2027-10-02T16:00Z"]
    );
    assert_eq!(
        first(
            "30 1,13 * * *",
            Tz::America__New_York,
            "2026-11-01T00:00:00Z",
            2
        ),
        ["2026-11-01T05:30Z", "2026-11-01T18:30Z"]
    );
    assert_eq!(
        first(
            "30 * * * *",
            Tz::America__New_York,
            "2026-11-01T05:00:00Z",
            2
        ),
        ["2026-11-01T05:30Z", "2026-11-01T06:30Z"]
    );
    // Lord Howe: +10:30 -> +11 at 02:00 local; 02:15 does not exist.
    assert_eq!(
        first(
            "15 2 * * *",
            Tz::Australia__Lord_Howe,
            "2026-10-03T12:00:00Z",
            1
        ),
        ["2026-10-03T15:30Z"]
    );
}
