//! The window merge (docs/design.md §3: windows that overlap merge into
//! one) against the independent reading of `windows_differential`: minute
//! by minute around the instant asked, for schedules whose windows overlap
//! (hourly windows of two hours never close; `*/15` windows of 40 minutes;
//! daily windows longer than a day; two schedules in two zones overlapping
//! each other), with freezes. drover follows a merged window for a year
//! (`window::HORIZON`) and says where it cut it; the random cases ask with
//! a horizon of a few days (`Calendar::with_horizon`), so that a walk of a
//! week meets cuts, forward and back, in most cases.
//!
//! What must hold, for every case:
//! - the periods `drover windows` lists, clipped to the range and joined
//!   where they touch with the same state, are exactly the oracle's maximal
//!   runs (nothing open is listed closed, nothing closed open, no made-up
//!   gap where a merged window was cut);
//! - a period that ends inside the range ends where the oracle's run ends,
//!   unless it says it `continues`, and then the oracle is open there too;
//!   a first period that starts before the instant asked starts where the
//!   oracle's run starts, unless it says it `opened_earlier`;
//! - `drover status` and `drover windows` name the same window (start, end
//!   and whether it continues), through the binary.
//!
//! Before the fix, hourly 2-hour windows were cut after 10,000 firings, the
//! next one listed from the first firing after the cut (an hour the oracle
//! says is open showed closed), and `status` joined eight cuts into a
//! window ending in 2037 while `windows` said 2028.

use crate::windows_differential::{oracle_periods, FreezeCase, P, ZONES};
use chrono::{DateTime, Duration, TimeZone, Utc};
use chrono_tz::Tz;
use proptest::prelude::*;
use proptest::strategy::ValueTree;

/// How far past the horizon, on both sides of the instant asked, the oracle walks.
const MARGIN: i64 = 2;

#[derive(Debug, Clone)]
struct Case {
    windows: Vec<(String, Tz, i64)>,
    freezes: Vec<(i64, i64, bool)>,
    from: DateTime<Utc>,
    /// How far drover follows a merged window, in days.
    horizon: i64,
}

impl Case {
    fn text(&self) -> String {
        let mut text = "version = \"1.13.2\"\n".to_string();
        for (line, tz, mins) in &self.windows {
            text += &format!(
                "[[window]]\nschedule = \"{line}\"\nduration = \"{mins}m\"\ntimezone = \"{}\"\n",
                tz.name()
            );
        }
        for (k, f) in self.freezes().iter().enumerate() {
            text += &format!(
                "[[freeze]]\nstart = {}\nend = {}\nscope = \"{}\"\nreason = \"freeze {k}\"\n",
                f.start.format("%Y-%m-%dT%H:%M:%SZ"),
                f.end.format("%Y-%m-%dT%H:%M:%SZ"),
                if f.minor { "minor" } else { "all" }
            );
        }
        text
    }

    fn freezes(&self) -> Vec<FreezeCase> {
        self.freezes
            .iter()
            .enumerate()
            .map(|(k, (at, len, minor))| {
                let start = self.from + Duration::minutes(*at);
                FreezeCase {
                    start,
                    end: start + Duration::minutes(*len),
                    minor: *minor,
                    reason: format!("freeze {k}"),
                }
            })
            .collect()
    }
}

/// One schedule whose windows overlap, touch or nearly touch: (line, minutes).
fn overlapping() -> impl Strategy<Value = (String, i64)> {
    prop_oneof![
        // Hourly, 30 minutes to 5 hours (from 60 on, never closed).
        (0u32..60, 30i64..=300).prop_map(|(m, d)| (format!("{m} * * * *"), d)),
        // Every k minutes, for about k to 3k minutes.
        (prop::sample::select(vec![5i64, 10, 15, 20, 30]), 0i64..=200)
            .prop_map(|(k, p)| { (format!("*/{k} * * * *"), (k * (50 + p) / 100).max(1)) }),
        // Every k hours, for k hours give or take one.
        (prop::sample::select(vec![2i64, 3, 4, 6]), -60i64..=60)
            .prop_map(|(k, d)| { (format!("0 */{k} * * *"), k * 60 + d) }),
        // Daily at 01:00-03:00 (near DST changes), 20 to 30 hours.
        (1u32..=3, 20i64 * 60..=30 * 60).prop_map(|(h, d)| (format!("30 {h} * * *"), d)),
        // Weekdays, a long day: the weekend closes it.
        (22i64 * 60..=26 * 60).prop_map(|d| ("0 2 * * 1-5".to_string(), d)),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let zone = prop::sample::select(ZONES.to_vec());
    (
        prop::collection::vec((overlapping(), zone), 1..=2),
        prop::collection::vec((-3000i64..=4000, 1i64..=3000, any::<bool>()), 0..=2),
        // Instants in 2026-2028, spread over the year (DST changes included).
        0i64..(3 * 365 * 24 * 60),
        1i64..=3,
    )
        .prop_map(|(parts, freezes, at, horizon)| Case {
            windows: parts
                .into_iter()
                .map(|((line, mins), tz)| (line, tz, mins))
                .collect(),
            freezes,
            from: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + Duration::minutes(at),
            horizon,
        })
}

/// The periods `drover windows` lists from the case's instant (its
/// computation), up to `until`.
fn listed(c: &Case, until: DateTime<Utc>) -> Vec<drover::window::Period> {
    let env = drover::config::parse_env("environments/x.toml", "x", &c.text())
        .unwrap_or_else(|e| panic!("case config is valid: {e:?}\n{}", c.text()));
    let cal = drover::window::Calendar::of(&env)
        .expect("calendar")
        .with_horizon(Duration::days(c.horizon));
    cal.periods(c.from)
        .take_while(|p| p.start < until)
        .collect()
}

/// The state at `t` of a list of maximal runs: `None` closed, else the
/// patch-only reason (`Some(None)`: open to every change).
fn state(ps: &[P], t: DateTime<Utc>) -> Option<Option<String>> {
    ps.iter()
        .find(|p| p.start <= t && t < p.end)
        .map(|p| p.patch_only.clone())
}

/// Every disagreement between drover's periods and the oracle, in words.
fn disagreements(c: &Case) -> Vec<String> {
    let (a, b) = (
        c.from - Duration::days(c.horizon + MARGIN),
        c.from + Duration::days(c.horizon + MARGIN),
    );
    let mut n = 0;
    let oracle = oracle_periods(&c.windows, &c.freezes(), a, b, &mut n);
    let ps = listed(c, b);
    let mut out = Vec::new();
    // Ordered and disjoint; touching only where cut or where the state changes.
    for w in ps.windows(2) {
        if w[1].start < w[0].end {
            out.push(format!("{w:?} overlap"));
        }
        if w[1].start == w[0].end && !w[0].continues && w[1].patch_only == w[0].patch_only {
            out.push(format!("{w:?} touch with the same state but are not one"));
        }
    }
    // Clipped to [from, b) and joined where they touch alike: the oracle's runs.
    let mut joined: Vec<P> = Vec::new();
    for p in ps.iter().filter(|p| p.end > c.from && p.start < b) {
        let (s, e) = (p.start.max(c.from), p.end.min(b));
        match joined.last_mut() {
            Some(l) if l.end == s && l.patch_only == p.patch_only => l.end = e,
            _ => joined.push(P {
                start: s,
                end: e,
                patch_only: p.patch_only.clone(),
            }),
        }
    }
    let want: Vec<P> = oracle
        .iter()
        .filter(|p| p.end > c.from)
        .map(|p| P {
            start: p.start.max(c.from),
            ..p.clone()
        })
        .collect();
    if joined != want {
        let first = joined
            .iter()
            .zip(&want)
            .position(|(x, y)| x != y)
            .unwrap_or(joined.len().min(want.len()));
        let show = |ps: &[P]| {
            ps.iter()
                .skip(first.saturating_sub(1))
                .take(4)
                .map(|p| format!("  {} .. {} {:?}", p.start, p.end, p.patch_only))
                .collect::<Vec<_>>()
                .join("\n")
        };
        out.push(format!(
            "the open minutes differ\ncontract:\n{}\ndrover:\n{}",
            show(&want),
            show(&joined)
        ));
    }
    // Each end inside the range: a real end, or said to continue.
    for p in ps.iter().filter(|p| p.end < b) {
        let open_on = state(&oracle, p.end) == Some(p.patch_only.clone());
        if p.continues != open_on {
            out.push(format!(
                "{} .. {} (continues: {}) but the contract's state at its end is {:?}",
                p.start,
                p.end,
                p.continues,
                state(&oracle, p.end)
            ));
        }
    }
    // The first period's start, looked for back from `from`.
    if let Some(p) = ps.first().filter(|p| p.start < c.from && p.start > a) {
        let run = oracle.iter().find(|o| o.start <= c.from && c.from < o.end);
        let exact = run.is_some_and(|o| o.start == p.start);
        let inside = run.is_some_and(|o| o.start <= p.start);
        if !inside || (!p.opened_earlier && !exact) {
            out.push(format!(
                "first period starts {} (opened earlier: {}); the contract's run: {:?}",
                p.start, p.opened_earlier, run
            ));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn merged_windows_are_the_contracts_minute_by_minute(c in case()) {
        let d = disagreements(&c);
        prop_assert!(d.is_empty(), "from {}:\n{}\n{}", c.from, c.text(), d.join("\n"));
    }
}

/// The case of the trial, with drover's own horizon: hourly windows of two
/// hours are one window that never closes; drover lists it as stretches of
/// a year, each saying it continues, touching, and open at every minute the
/// contract says (checked around the instant asked and around each cut).
#[test]
fn hourly_two_hour_windows_never_close_and_say_so() {
    let c = Case {
        windows: vec![("0 * * * *".into(), Tz::UTC, 120)],
        freezes: vec![],
        from: Utc.with_ymd_and_hms(2026, 12, 8, 10, 30, 0).unwrap(),
        horizon: drover::window::HORIZON.num_days(),
    };
    let ps = listed(&c, c.from + Duration::days(800));
    assert_eq!(ps.len(), 3, "{ps:?}");
    assert!(ps.iter().all(|p| p.continues && p.patch_only.is_none()));
    assert!(ps[0].opened_earlier && ps[0].start < c.from);
    assert_eq!(ps[0].end, c.from + drover::window::HORIZON);
    let mut n = 0;
    for (k, w) in ps.windows(2).enumerate() {
        assert_eq!(w[1].start, w[0].end, "touching");
        assert!(!w[1].opened_earlier);
        // The contract around the cut: open throughout, one run.
        let (a, b) = (w[0].end - Duration::days(1), w[0].end + Duration::days(1));
        let oracle = oracle_periods(&c.windows, &[], a, b, &mut n);
        assert_eq!(
            oracle,
            [P {
                start: a,
                end: b,
                patch_only: None
            }],
            "cut {k}"
        );
    }
    // Control: the test can fail. The capped merge listed the next window
    // from the first firing after the cut, an hour later; the contract is
    // open in that hour.
    let cut = ps[0].end;
    let oracle = oracle_periods(&c.windows, &[], cut, cut + Duration::hours(2), &mut n);
    assert_eq!(state(&oracle, cut + Duration::minutes(30)), Some(None));
    // The random cases' check, on this case with a short horizon.
    let short = Case { horizon: 2, ..c };
    assert!(
        disagreements(&short).is_empty(),
        "{:?}",
        disagreements(&short)
    );
}

/// `drover status` and `drover windows` give the same window, through the
/// binary, for the trial's case and for random ones.
#[test]
fn status_and_windows_name_the_same_window() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut cases = vec![Case {
        windows: vec![("0 * * * *".into(), Tz::UTC, 120)],
        freezes: vec![],
        from: Utc.with_ymd_and_hms(2026, 12, 8, 10, 30, 0).unwrap(),
        horizon: 0,
    }];
    for _ in 0..5 {
        cases.push(case().new_tree(&mut runner).unwrap().current());
    }
    for c in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("environments")).unwrap();
        std::fs::write(
            dir.path().join("drover.toml"),
            "[promotion]\nchain = [\"x\"]\n\n[clusters]\nx = [\"x-1\"]\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("environments/x.toml"), c.text()).unwrap();
        let git = |args: &[&str]| crate::support::git::git(dir.path(), args);
        git(&["init", "-q"]);
        git(&["add", "-A"]);
        crate::support::git::commit_configured(dir.path(), &["-qm", "config"]);
        let from = c.from.to_rfc3339();
        let run = |args: &[&str]| -> serde_json::Value {
            let (code, out, err) = crate::support::cli::drover_at(dir.path(), args);
            assert_eq!(code, 0, "{args:?}: {err}\n{}", c.text());
            serde_json::from_str(&out).unwrap()
        };
        let status = run(&["-o", "json", "status", "--now", &from]);
        // The page's timeline keeps the instant asked on it, whatever the
        // windows: the trial's page spanned 2036-2037.
        let page = dir.path().join("page.html");
        run(&[
            "-o",
            "json",
            "status",
            "--now",
            &from,
            "--html",
            page.to_str().unwrap(),
        ]);
        let drawn = crate::support::timeline::read(&std::fs::read_to_string(&page).unwrap());
        assert!(
            drawn.from <= c.from && c.from <= drawn.to && drawn.to - c.from < Duration::days(40),
            "the page spans {} .. {} for {}\n{}",
            drawn.from,
            drawn.to,
            c.from,
            c.text()
        );
        let windows = run(&[
            "-o", "json", "windows", "--env", "x", "--from", &from, "--count", "20",
        ]);
        let shown = &status["environments"][0]["next_window"];
        // status names the stretch a minor change may start in: the first
        // period `windows` lists that is not patch-only.
        let first = windows["windows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["patch_only"].is_null());
        match first {
            None => assert!(shown.is_null(), "{shown}\n{}", c.text()),
            Some(w) => {
                let utc = |v: &serde_json::Value| {
                    v.as_str()
                        .unwrap()
                        .parse::<DateTime<Utc>>()
                        .unwrap_or_else(|e| panic!("{e}: {v}"))
                };
                assert_eq!(
                    (utc(&shown["start"]), utc(&shown["end"])),
                    (utc(&w["start"]), utc(&w["end"])),
                    "from {from}\n{}",
                    c.text()
                );
                let flag = |v: &serde_json::Value, k: &str| v[k].as_bool().unwrap_or(false);
                assert_eq!(
                    flag(shown, "continues"),
                    flag(w, "continues"),
                    "{}",
                    c.text()
                );
                assert_eq!(
                    flag(shown, "opened_earlier"),
                    flag(w, "opened_earlier"),
                    "{}",
                    c.text()
                );
            }
        }
    }
}
