//! `drover windows`.

use super::{parse_time, print_json, Format, Global, Outcome};
use crate::config;
use crate::window;
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
}

/// The most windows one `drover windows` lists (27 years of daily windows):
/// the list is built in memory, so the count needs a bound.
pub const MAX_COUNT: u64 = 10_000;

#[derive(Serialize)]
struct Output<'a> {
    env: &'a str,
    timezone: &'a str,
    windows: Vec<WindowOut>,
}

#[derive(Serialize)]
struct WindowOut {
    start: String,
    end: String,
}

fn utc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
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
    let tz = env.window.timezone;
    let windows = match window::next_windows(&env.window, from, args.count as usize) {
        Ok(w) => w,
        Err(e) => {
            let file = format!("{}/{}.toml", config::ENV_DIR, args.env);
            return super::reject(
                g,
                vec![crate::diag::Diagnostic::file(file, format!("[window]: {e}")).into()],
            );
        }
    };
    match g.format {
        Format::Json => print_json(&Output {
            env: &args.env,
            timezone: tz.name(),
            windows: windows
                .iter()
                .map(|w| WindowOut {
                    start: utc(w.start),
                    end: utc(w.end),
                })
                .collect(),
        })
        .context("writing JSON")?,
        Format::Text => {
            println!(
                "Windows of {} ({:?}, {}, timezone {})",
                args.env,
                env.window.schedule,
                humantime::format_duration(env.window.duration),
                tz.name()
            );
            let local = |t: DateTime<Utc>| {
                t.with_timezone(&tz)
                    .format("%a %Y-%m-%d %H:%M %Z")
                    .to_string()
            };
            println!(
                "{:<26} {:<26} {:<21} {:<21}",
                "START (local)", "END (local)", "START (UTC)", "END (UTC)"
            );
            for w in &windows {
                let open = if w.contains(from) { "  (open)" } else { "" };
                println!(
                    "{:<26} {:<26} {:<21} {:<21}{open}",
                    local(w.start),
                    local(w.end),
                    utc(w.start),
                    utc(w.end)
                );
            }
        }
    }
    Ok(Outcome::Ok)
}
