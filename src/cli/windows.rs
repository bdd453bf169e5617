//! `drover windows`: the periods in which a node may really start, asked of
//! [`crate::window::Calendar`] — merged windows, clipped by `all` freezes,
//! with the stretches under a `minor` freeze marked "patch only".

use super::{parse_time, print_ok, Global, Outcome};
use crate::config;
use crate::terminal::escape;
use crate::window::{self, Calendar, Period};
use anyhow::Context as _;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

/// Arguments of `drover windows`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Environment whose windows to list.
    #[arg(long)]
    pub env: String,
    /// List windows that end after this time (RFC 3339); default now.
    #[arg(long, value_parser = parse_time)]
    pub from: Option<DateTime<Utc>>,
    /// How many windows to list (at most 10000).
    #[arg(long, default_value_t = 5)]
    pub count: u64,
    /// Text: no header line and no lines above the table, for scripts.
    #[arg(long)]
    pub no_headers: bool,
}

/// The most windows one `drover windows` lists (27 years of daily windows):
/// the list is built in memory, so the count needs a bound.
pub const MAX_COUNT: u64 = 10_000;

/// The fields `drover windows -o json` adds to the document.
#[derive(Debug, Serialize)]
pub struct Output {
    /// Environment name.
    pub env: String,
    /// Zone of the first window.
    pub timezone: String,
    /// `[rollout] paused`: no period below lets a node start while true.
    pub paused: bool,
    /// The periods, in order.
    pub windows: Vec<WindowOut>,
}

/// One period in JSON.
#[derive(Debug, Serialize)]
pub struct WindowOut {
    /// First open instant (RFC 3339, UTC).
    pub start: String,
    /// First closed instant (RFC 3339, UTC).
    pub end: String,
    /// The `minor` freeze's reason when only a patch update may start here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_only: Option<String>,
    /// Open before `start` too: windows overlap without a gap for longer
    /// than drover looks back (a year).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub opened_earlier: bool,
    /// Still open at `end`: windows overlap without a gap for longer than
    /// drover looks ahead (a year); the next period starts at `end`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub continues: bool,
}

fn utc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The periods `drover windows` lists for `env` (the command's computation,
/// without printing).
pub fn periods(
    env: &config::EnvConfig,
    from: DateTime<Utc>,
    count: usize,
) -> Result<Vec<Period>, window::Error> {
    let cal = Calendar::of(env)?;
    Ok(cal
        .periods(from)
        .take(count.min(MAX_COUNT as usize))
        .collect())
}

/// Run `drover windows`.
pub fn run(g: &Global, args: Args) -> anyhow::Result<Outcome> {
    if args.count > MAX_COUNT {
        return super::reject(
            g,
            vec![format!(
                "--count {} is more than {MAX_COUNT}, the most windows listed at once; \
                 give a count from 0 to {MAX_COUNT} (use --from to list later windows)",
                args.count
            )
            .into()],
        );
    }
    let Some(cfg) = super::load_repo(g) else {
        return Ok(Outcome::Rejected);
    };
    let env = match super::known_env(g, &cfg, &args.env) {
        Ok(env) => env,
        Err(rejected) => return rejected,
    };
    let from = args.from.unwrap_or_else(Utc::now);
    let tz = env.windows[0].timezone;
    let list = match periods(env, from, args.count as usize) {
        Ok(w) => w,
        Err(e) => {
            let file = format!("{}/{}.toml", config::ENV_DIR, args.env);
            return super::reject(
                g,
                vec![crate::diag::Diagnostic::file(file, format!("[window]: {e}")).into()],
            );
        }
    };
    match g.format.is_document() {
        true => print_ok(
            g.format,
            &Output {
                env: args.env.clone(),
                timezone: tz.name().to_owned(),
                paused: env.rollout.paused,
                windows: list
                    .iter()
                    .map(|w| WindowOut {
                        start: utc(w.start),
                        end: utc(w.end),
                        patch_only: w.patch_only.clone(),
                        opened_earlier: w.opened_earlier,
                        continues: w.continues,
                    })
                    .collect(),
            },
        )
        .context("writing JSON")?,
        false => {
            let specs: Vec<String> = env
                .windows
                .iter()
                .map(|w| {
                    format!(
                        "{:?} for {} in {}",
                        w.schedule,
                        humantime::format_duration(w.duration),
                        w.timezone.name()
                    )
                })
                .collect();
            // Freeze reasons are free text: no control character reaches the terminal.
            let line = |text: String| println!("{}", escape(&text));
            let headers = !args.no_headers;
            if headers {
                line(format!("Windows of {}: {}", args.env, specs.join("; ")));
            }
            for f in env.freezes.iter().filter(|_| headers) {
                line(format!(
                    "Freeze from {}: {}",
                    window::local_and_utc(f.start, f.timezone),
                    f.describe()
                ));
            }
            if env.rollout.paused && headers {
                println!("PAUSED ([rollout] paused = true): no node starts in any window below");
            }
            let local = |t: DateTime<Utc>| {
                t.with_timezone(&tz)
                    .format("%a %Y-%m-%d %H:%M %Z")
                    .to_string()
            };
            if headers {
                println!(
                    "{:<26} {:<26} {:<21} {:<21}",
                    "START (local)", "END (local)", "START (UTC)", "END (UTC)"
                );
            }
            for w in &list {
                let open = if w.start <= from && from < w.end {
                    "  (open)"
                } else {
                    ""
                };
                let patch = match &w.patch_only {
                    Some(r) if r.is_empty() => "  patch updates only (minor freeze)".to_owned(),
                    Some(r) => format!("  patch updates only: {r}"),
                    None => String::new(),
                };
                // A window cut by the horizon: open past the times shown.
                let cut = match (w.opened_earlier, w.continues) {
                    (true, true) => "  (open before and after: windows overlap)",
                    (false, true) => "  (continues: windows overlap)",
                    (true, false) => "  (open before: windows overlap)",
                    (false, false) => "",
                };
                line(format!(
                    "{:<26} {:<26} {:<21} {:<21}{open}{cut}{patch}",
                    local(w.start),
                    local(w.end),
                    utc(w.start),
                    utc(w.end)
                ));
            }
        }
    }
    Ok(Outcome::Ok)
}
