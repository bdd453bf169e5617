//! Maintenance windows (DESIGN §3): cron firings in a time zone, each open for a duration.
