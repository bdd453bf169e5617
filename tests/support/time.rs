//! Times in tests, written as RFC 3339 text.

use chrono::{DateTime, Utc};

/// The instant `s` (RFC 3339, e.g. `2026-12-01T02:00:00Z`); panics on a typo.
pub fn t(s: &str) -> DateTime<Utc> {
    s.parse().expect("test time")
}
