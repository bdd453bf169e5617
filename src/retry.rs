//! Pacing for retry loops (the agent's and the Kubernetes watchers'):
//! exponential backoff with full jitter and a ceiling, and a log limiter, so
//! that an outage of the API server or the git remote costs a few requests
//! and a few log lines a minute.

use std::time::Duration;
use std::time::Instant;

/// Exponential backoff with full jitter: the n-th delay is drawn uniformly
/// from `[base·2ⁿ/2, base·2ⁿ]`, capped at `max`. Half the span is kept as a
/// floor so that a run of small draws cannot turn into a busy loop.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// Delays start around `base` and never exceed `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max: max.max(base),
            attempt: 0,
        }
    }

    /// The delay before the next attempt; each call doubles the span.
    pub fn next_delay(&mut self) -> Duration {
        let factor = 1u32 << self.attempt.min(20);
        self.attempt = self.attempt.saturating_add(1);
        let span = self.base.saturating_mul(factor).min(self.max);
        span.mul_f64(crate::replay::random_between(0.5, 1.0))
    }

    /// After a success: start again from `base`.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.attempt
    }
}

/// Lets one log line through per period and counts the ones held back, so a
/// failure repeated thousands of times a second logs once a period with the
/// count.
#[derive(Debug, Clone)]
pub struct Quiet {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Quiet {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        Quiet {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(held back since the last line)` when a line may be logged now.
    pub fn allow(&mut self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    /// [`Quiet::allow`] at `now`.
    pub fn allow_at(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }

    /// After a success: the next failure is logged at once.
    pub fn reset(&mut self) {
        self.last = None;
        self.suppressed = 0;
    }
}

/// One [`Quiet`] per kind of log line, for a loop that logs several kinds.
#[derive(Debug, Default)]
pub struct Paced(std::sync::Mutex<std::collections::HashMap<&'static str, Quiet>>);

/// How often each kind of repeated failure is logged.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

impl Paced {
    /// `Some(held back)` when a line of kind `key` may be logged now (one per [`LOG_EVERY`]).
    pub fn allow(&self, key: &'static str) -> Option<u64> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(key)
            .or_insert_with(|| Quiet::new(LOG_EVERY))
            .allow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_up_to_the_ceiling_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let d: Vec<Duration> = (0..12).map(|_| b.next_delay()).collect();
        assert!(d[0] >= Duration::from_millis(50) && d[0] <= Duration::from_millis(100));
        assert!(d[3] >= Duration::from_millis(400) && d[3] <= Duration::from_millis(800));
        for x in &d {
            assert!(*x <= Duration::from_secs(30), "{x:?} over the ceiling");
        }
        assert!(
            d[11] >= Duration::from_secs(15),
            "capped delays stay near the ceiling"
        );
        assert_eq!(b.failures(), 12);
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn backoff_draws_differ_so_replicas_do_not_retry_in_step() {
        let draws: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay())
            .collect();
        assert!(draws.len() > 1);
    }

    #[test]
    fn quiet_lets_one_line_a_period_through_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut q = Quiet::new(Duration::from_secs(60));
        assert_eq!(q.allow_at(t0), Some(0));
        let held = (0..1000)
            .filter(|i| q.allow_at(t0 + Duration::from_millis(*i)).is_none())
            .count();
        assert_eq!(held, 1000);
        let later = t0 + Duration::from_secs(61);
        assert_eq!(q.allow_at(later), Some(1000));
        assert_eq!(q.allow_at(later), None);
        q.reset();
        assert_eq!(q.allow_at(later), Some(0));
    }
}
