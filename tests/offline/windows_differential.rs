//! Differential test of `drover windows` against an independent reading of
//! the window contract (docs/design.md §3), written here from the contract's
//! words and sharing no code with `drover::window`:
//!
//! - its own cron parser and matcher (Vixie day-of-month / day-of-week rule);
//! - firings found by walking real time minute by minute and looking at the
//!   local wall clock: a fixed-time line fires at a wall time's first
//!   occurrence, and once at the end of a spring-forward gap for matches
//!   skipped in it; a wildcard line fires whenever the wall clock matches;
//! - "open" is then decided per minute (some firing `f` with `f <= t <
//!   f + duration`), cut by `all` freezes and marked by `minor` ones, and the
//!   periods are the maximal runs of equal minutes.
//!
//! Hundreds of random schedules, durations (some overlapping) and freezes,
//! in zones with unusual transitions (Lord Howe's 30-minute shift, Chatham's
//! +12:45/+13:45, Troll's 2 hours, Havana's midnight change), each case
//! starting near a DST change. Zero disagreements are allowed.

use chrono::{DateTime, Datelike, Duration, NaiveDateTime, Offset, TimeZone, Timelike, Utc};
use chrono_tz::Tz;

// ---------- a tiny deterministic PRNG (no shared code, reproducible) ----------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + self.below(u64::from(hi - lo + 1)) as u32
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// ---------- the independent cron reading ----------

/// One field as a set of allowed values, and whether it was written starting with `*`.
struct Field {
    allowed: Vec<bool>,
    star: bool,
}

fn field(text: &str, lo: u32, hi: u32) -> Field {
    let mut allowed = vec![false; hi as usize + 1];
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().expect("step")),
            None => (part, 1),
        };
        let (a, b) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (a.parse().expect("a"), b.parse().expect("b"))
        } else {
            let a: u32 = range.parse().expect("n");
            // `a/step` means a through the end, stepping.
            (a, if step > 1 { hi } else { a })
        };
        let mut v = a;
        while v <= b {
            allowed[v as usize] = true;
            v += step;
        }
    }
    Field {
        allowed,
        star: text.starts_with('*'),
    }
}

struct Cron {
    minute: Field,
    hour: Field,
    dom: Field,
    month: Field,
    dow: Field,
    fixed: bool,
}

impl Cron {
    fn parse(line: &str) -> Cron {
        let f: Vec<&str> = line.split_whitespace().collect();
        let mut dow = field(f[4], 0, 7);
        if dow.allowed[7] {
            dow.allowed[0] = true;
        }
        Cron {
            minute: field(f[0], 0, 59),
            hour: field(f[1], 0, 23),
            dom: field(f[2], 1, 31),
            month: field(f[3], 1, 12),
            dow,
            fixed: !f[0].starts_with('*') && !f[1].starts_with('*'),
        }
    }

    fn matches(&self, t: NaiveDateTime) -> bool {
        let dom = self.dom.allowed[t.day() as usize];
        let dow = self.dow.allowed[t.weekday().num_days_from_sunday() as usize];
        // Vixie cron: either day field written with `*` means both must match.
        let day = if self.dom.star || self.dow.star {
            dom && dow
        } else {
            dom || dow
        };
        self.minute.allowed[t.minute() as usize]
            && self.hour.allowed[t.hour() as usize]
            && self.month.allowed[t.month() as usize]
            && day
    }
}

fn wall(tz: Tz, t: DateTime<Utc>) -> NaiveDateTime {
    t.with_timezone(&tz).naive_local()
}

/// Firings of `line` in `tz` in `[from, to)`, walking real time by the minute.
/// `counted` tallies firings whose wall time was skipped or repeated.
pub(crate) fn oracle_firings(
    line: &str,
    tz: Tz,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    counted: &mut usize,
) -> Vec<DateTime<Utc>> {
    let cron = Cron::parse(line);
    let minute = Duration::minutes(1);
    // Start early enough that "seen before" covers any repeated hour.
    let mut u = from - Duration::hours(6);
    let mut prev = wall(tz, u - minute);
    let mut latest_seen = prev;
    let mut out = Vec::new();
    while u < to {
        let l = wall(tz, u);
        let mut fires = false;
        let mut unusual = false;
        if l > prev + minute {
            // Spring forward: wall times (prev, l) never happened.
            if cron.fixed {
                let mut m = prev + minute;
                while m < l {
                    if cron.matches(m) {
                        fires = true;
                        unusual = true;
                    }
                    m += minute;
                }
            }
        }
        if cron.matches(l) {
            if cron.fixed {
                if l > latest_seen {
                    fires = true;
                } else {
                    unusual = true;
                }
            } else {
                fires = true;
                unusual |= l <= latest_seen;
            }
        }
        if fires && u >= from {
            out.push(u);
            *counted += usize::from(unusual);
        }
        latest_seen = latest_seen.max(l);
        prev = l;
        u += minute;
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct P {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub patch_only: Option<String>,
}

pub(crate) struct FreezeCase {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub minor: bool,
    pub reason: String,
}

/// Periods over `[a, b)` by the minute: `None` closed, `Some(None)` open,
/// `Some(Some(reason))` patch only.
pub(crate) fn oracle_periods(
    windows: &[(String, Tz, i64)],
    freezes: &[FreezeCase],
    a: DateTime<Utc>,
    b: DateTime<Utc>,
    counted: &mut usize,
) -> Vec<P> {
    let minute = Duration::minutes(1);
    let mut open_until = vec![];
    for (line, tz, mins) in windows {
        let fs = oracle_firings(line, *tz, a - Duration::minutes(*mins), b, counted);
        open_until.push((fs, *mins));
    }
    let mut out: Vec<P> = Vec::new();
    let mut u = a;
    let mut idx = vec![0usize; open_until.len()];
    let mut reach = vec![a - Duration::days(400); open_until.len()];
    while u < b {
        let mut open = false;
        for (k, (fs, mins)) in open_until.iter().enumerate() {
            while idx[k] < fs.len() && fs[idx[k]] <= u {
                reach[k] = reach[k].max(fs[idx[k]] + Duration::minutes(*mins));
                idx[k] += 1;
            }
            open |= u < reach[k];
        }
        let state = if !open
            || freezes
                .iter()
                .any(|f| !f.minor && f.start <= u && u < f.end)
        {
            None
        } else {
            Some(
                // Overlapping minor freezes: the one that began first names it.
                freezes
                    .iter()
                    .filter(|f| f.minor && f.start <= u && u < f.end)
                    .min_by_key(|f| (f.start, f.end))
                    .map(|f| f.reason.clone()),
            )
        };
        if let Some(s) = state {
            match out.last_mut() {
                Some(p) if p.end == u && p.patch_only == s => p.end = u + minute,
                _ => out.push(P {
                    start: u,
                    end: u + minute,
                    patch_only: s,
                }),
            }
        }
        u += minute;
    }
    out
}

// ---------- random cases ----------

pub(crate) const ZONES: &[Tz] = &[
    Tz::Australia__Lord_Howe,
    Tz::Pacific__Chatham,
    Tz::Europe__Madrid,
    Tz::America__New_York,
    Tz::Australia__Sydney,
    Tz::America__Havana,
    Tz::Antarctica__Troll,
    Tz::America__Santiago,
    Tz::Pacific__Auckland,
    Tz::America__St_Johns,
    Tz::Europe__London,
    Tz::Africa__Cairo,
    Tz::UTC,
];

/// Instants in 2026–2029 where `tz`'s offset changes, to the minute.
fn transitions(tz: Tz) -> Vec<DateTime<Utc>> {
    let off = |t: DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix();
    let mut out = Vec::new();
    let mut t = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let end = Utc.with_ymd_and_hms(2029, 1, 1, 0, 0, 0).unwrap();
    while t < end {
        let next = t + Duration::hours(1);
        if off(t) != off(next) {
            let mut m = t;
            while off(m) == off(t) {
                m += Duration::minutes(1);
            }
            out.push(m);
        }
        t = next;
    }
    out
}

fn time_field(rng: &mut Rng, hi: u32, near: &[u32]) -> String {
    let pick = |rng: &mut Rng| {
        if !near.is_empty() && rng.chance(70) {
            near[rng.below(near.len() as u64) as usize]
        } else {
            rng.range(0, hi)
        }
    };
    match rng.below(10) {
        0..=3 => pick(rng).to_string(),
        4 | 5 => {
            let a = pick(rng);
            let b = pick(rng);
            if a == b {
                a.to_string()
            } else {
                format!("{},{}", a.min(b), a.max(b))
            }
        }
        6 => {
            let a = pick(rng).min(hi - 1);
            format!("{a}-{}", rng.range(a + 1, hi.min(a + 3)))
        }
        7 => {
            let a = pick(rng).min(hi - 1);
            format!("{a}-{hi}/{}", rng.range(2, 5))
        }
        8 => format!("*/{}", rng.range(2, if hi > 30 { 30 } else { 6 })),
        _ => "*".to_string(),
    }
}

fn schedule(rng: &mut Rng) -> String {
    // Wall times near where zones change: 00:00–03:59, minutes on quarters.
    let minute = time_field(rng, 59, &[0, 15, 30, 45, 59]);
    let hour = time_field(rng, 23, &[0, 1, 2, 3]);
    let dom = match rng.below(8) {
        0 => format!("{}-{}", rng.range(1, 10), rng.range(15, 31)),
        1 => format!("{},{}", rng.range(1, 14), rng.range(15, 31)),
        _ => "*".into(),
    };
    let dow = match rng.below(8) {
        0 => "0".into(),
        1 => format!("{}-{}", rng.range(0, 2), rng.range(3, 6)),
        2 => "1,3,5,7".into(),
        _ => "*".into(),
    };
    format!("{minute} {hour} {dom} * {dow}")
}

struct Case {
    text: String,
    windows: Vec<(String, Tz, i64)>,
    freezes: Vec<FreezeCase>,
    from: DateTime<Utc>,
}

fn case(rng: &mut Rng, zone_transitions: &[(Tz, Vec<DateTime<Utc>>)]) -> Case {
    let (tz, ts) = &zone_transitions[rng.below(zone_transitions.len() as u64) as usize];
    let centre = if ts.is_empty() {
        Utc.with_ymd_and_hms(2027, 3, 28, 1, 0, 0).unwrap()
    } else {
        ts[rng.below(ts.len() as u64) as usize]
    };
    let from = centre - Duration::minutes(rng.range(0, 48 * 60) as i64);
    let n = if rng.chance(25) { 2 } else { 1 };
    let mut windows = Vec::new();
    let mut text = "version = \"1.13.2\"\n".to_string();
    for i in 0..n {
        let tz_i = if i == 0 || rng.chance(50) {
            *tz
        } else {
            ZONES[rng.below(ZONES.len() as u64) as usize]
        };
        let mins: i64 = match rng.below(4) {
            0 => rng.range(1, 59) as i64,
            1 => rng.range(1, 6) as i64 * 60,
            2 => rng.range(60, 30 * 60) as i64,
            _ => rng.range(20, 90) as i64,
        };
        let line = schedule(rng);
        text += &format!(
            "[[window]]\nschedule = \"{line}\"\nduration = \"{mins}m\"\ntimezone = \"{}\"\n",
            tz_i.name()
        );
        windows.push((line, tz_i, mins));
    }
    let mut freezes = Vec::new();
    for k in 0..rng.below(3) {
        let start = from + Duration::minutes(rng.range(0, 3 * 24 * 60) as i64 - 600);
        let end = start + Duration::minutes(rng.range(1, 36 * 60) as i64);
        let minor = rng.chance(50);
        let reason = format!("freeze {k}");
        text += &format!(
            "[[freeze]]\nstart = {}\nend = {}\nscope = \"{}\"\nreason = \"{reason}\"\n",
            start.format("%Y-%m-%dT%H:%M:%SZ"),
            end.format("%Y-%m-%dT%H:%M:%SZ"),
            if minor { "minor" } else { "all" }
        );
        freezes.push(FreezeCase {
            start,
            end,
            minor,
            reason,
        });
    }
    Case {
        text,
        windows,
        freezes,
        from,
    }
}

fn production(c: &Case, count: usize) -> Vec<P> {
    let env = drover::config::parse_env("environments/x.toml", "x", &c.text)
        .unwrap_or_else(|e| panic!("case config is valid: {e:?}\n{}", c.text));
    drover::cli::windows::periods(&env, c.from, count)
        .expect("periods")
        .into_iter()
        .map(|p| P {
            start: p.start,
            end: p.end,
            patch_only: p.patch_only,
        })
        .collect()
}

/// Compare over `[a, b)`: only periods that start after `a` and end before `b`
/// are fully determined by the oracle's walk.
fn compare(c: &Case, counted: &mut usize) -> Result<usize, String> {
    let longest = c.windows.iter().map(|w| w.2).max().unwrap_or(0);
    let a = c.from - Duration::minutes(longest) - Duration::days(1);
    let b = c.from + Duration::days(4) + Duration::minutes(longest);
    let keep = |p: &P| p.start > a && p.end < b;
    let after: Vec<P> = oracle_periods(&c.windows, &c.freezes, a, b, counted)
        .into_iter()
        .filter(|p| p.end > c.from)
        .collect();
    // As many as the contract lists after `from`, plus one: a period too
    // many in drover's list shows as a disagreement too.
    let prod: Vec<P> = production(c, after.len() + 1)
        .into_iter()
        .filter(|p| keep(p))
        .collect();
    let oracle: Vec<P> = after.into_iter().filter(|p| keep(p)).collect();
    if oracle == prod {
        Ok(oracle.len())
    } else {
        let show = |ps: &[P]| {
            ps.iter()
                .map(|p| format!("  {} .. {} {:?}", p.start, p.end, p.patch_only))
                .collect::<Vec<_>>()
                .join("\n")
        };
        Err(format!(
            "from {}:\n{}\ncontract:\n{}\ndrover windows:\n{}",
            c.from,
            c.text,
            show(&oracle),
            show(&prod)
        ))
    }
}

#[test]
fn drover_windows_agrees_with_an_independent_reading_of_the_contract() {
    let zone_transitions: Vec<(Tz, Vec<DateTime<Utc>>)> =
        ZONES.iter().map(|tz| (*tz, transitions(*tz))).collect();
    // Lord Howe moves by 30 minutes; its transitions must be found.
    let lh = &zone_transitions[0].1;
    assert!(!lh.is_empty());
    let mut rng = Rng(0x5EED_D20C_0FFE_E001);
    let mut disagreements = Vec::new();
    let mut periods = 0;
    let mut dst_firings = 0;
    let cases = 500;
    let mut seen_zones = std::collections::BTreeSet::new();
    for _ in 0..cases {
        let c = case(&mut rng, &zone_transitions);
        seen_zones.insert(c.windows[0].1.name());
        match compare(&c, &mut dst_firings) {
            Ok(n) => periods += n,
            Err(e) => disagreements.push(e),
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {cases} cases disagree; first:\n{}",
        disagreements.len(),
        disagreements[0]
    );
    // The control: the comparison compared something, and the cases hit
    // firings in gaps and repeated hours.
    assert!(periods > cases, "only {periods} periods compared");
    assert!(
        dst_firings > 50,
        "only {dst_firings} firings near a DST change"
    );
    assert!(seen_zones.contains("Australia/Lord_Howe") && seen_zones.contains("Pacific/Chatham"));
    eprintln!("{cases} cases, {periods} periods compared, {dst_firings} firings in gaps or repeated hours");
}

#[test]
fn the_oracle_catches_a_wrong_dst_reading() {
    // A control for the test itself: reading "30 1,13 * * *" in New York as
    // croner alone would (firing twice in the repeated hour) differs from
    // the contract, and the oracle says so.
    let mut n = 0;
    let from = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
    let to = from + Duration::days(1);
    let fixed = oracle_firings("30 1,13 * * *", Tz::America__New_York, from, to, &mut n);
    let wild = oracle_firings("30 */12 * * *", Tz::America__New_York, from, to, &mut n);
    // 01:30 EDT once, then 13:30 EST.
    assert_eq!(
        fixed,
        [
            Utc.with_ymd_and_hms(2026, 11, 1, 5, 30, 0).unwrap(),
            Utc.with_ymd_and_hms(2026, 11, 1, 18, 30, 0).unwrap()
        ]
    );
    // "*/12" fires at 00:30 EDT, and at 12:30 EST: no repeated match.
    assert_eq!(wild.len(), 2);
    let twice = oracle_firings("30 1 * * *", Tz::America__New_York, from, to, &mut n);
    let every = oracle_firings("30 * * * *", Tz::America__New_York, from, to, &mut n);
    assert_eq!(twice.len(), 1);
    // A wildcard hour fires in both 01:30s (EDT 05:30Z and EST 06:30Z).
    assert!(every.contains(&Utc.with_ymd_and_hms(2026, 11, 1, 5, 30, 0).unwrap()));
    assert!(every.contains(&Utc.with_ymd_and_hms(2026, 11, 1, 6, 30, 0).unwrap()));
    assert_eq!(every.len(), 24, "one per real hour");
    // Sydney's spring forward on 2027-10-03 skips 02:00-03:00: "8 1,2" fires at 03:00.
    let syd = oracle_firings(
        "8 1,2 * * *",
        Tz::Australia__Sydney,
        Utc.with_ymd_and_hms(2027, 10, 2, 12, 0, 0).unwrap(),
        Utc.with_ymd_and_hms(2027, 10, 3, 12, 0, 0).unwrap(),
        &mut n,
    );
    assert_eq!(
        syd.iter()
            .map(|t| t
                .with_timezone(&Tz::Australia__Sydney)
                .format("%H:%M")
                .to_string())
            .collect::<Vec<_>>(),
        ["01:08", "03:00"]
    );
}

#[test]
fn the_binary_prints_the_same_periods() {
    let mut rng = Rng(0xB1A5_0000_0000_0042);
    let zone_transitions: Vec<(Tz, Vec<DateTime<Utc>>)> =
        [Tz::Australia__Lord_Howe, Tz::Pacific__Chatham]
            .iter()
            .map(|tz| (*tz, transitions(*tz)))
            .collect();
    for _ in 0..6 {
        let c = case(&mut rng, &zone_transitions);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("environments")).expect("mkdir");
        std::fs::write(
            dir.path().join("drover.toml"),
            "[promotion]\nchain = [\"x\"]\n\n[clusters]\nx = [\"x-1\"]\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("environments/x.toml"), &c.text).expect("write");
        let out = crate::support::cli::drover_command()
            .arg("--repo")
            .arg(dir.path())
            .args([
                "--format", "json", "windows", "--env", "x", "--count", "8", "--from",
            ])
            .arg(c.from.to_rfc3339())
            .output()
            .expect("run drover");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let printed: Vec<P> = v["windows"]
            .as_array()
            .expect("windows")
            .iter()
            .map(|w| P {
                start: w["start"].as_str().unwrap().parse().unwrap(),
                end: w["end"].as_str().unwrap().parse().unwrap(),
                patch_only: w["patch_only"].as_str().map(str::to_owned),
            })
            .collect();
        assert_eq!(printed, production(&c, 8), "{}", c.text);
    }
}
