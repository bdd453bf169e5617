//! The two things that make two runs of the agent on the same inputs
//! differ, in one place: the random draws (poll and backoff jitter, the
//! ids of node records) and where blocking work runs (git fetches,
//! admission's reads of the cache, evidence reads, report pushes).
//!
//! A running agent draws from the operating system's randomness and sends
//! each piece of blocking work to a thread (tokio's blocking pool; a
//! report push to a thread of its own: `agent/reporter.rs` says why), so
//! that the control loop never waits on it.
//!
//! The whole-agent simulation (tests/sim) needs the opposite: a seed that
//! fails must fail again the same way, and a thread that finishes at a
//! moment the operating system chooses, or a jitter drawn afresh, makes
//! the next run interleave differently. A thread that runs a simulated
//! process holds an [`Exact`] guard: draws then come from a generator
//! seeded by the simulation, and blocking work runs as a task of the
//! runtime that asked for it, on that runtime's one thread, in the order it
//! was asked for, the way FoundationDB's simulator runs its real code on
//! one deterministic thread. Nothing else holds one.
//!
//! Under the guard a simulation may also stall the remote: work that talks
//! to the git server (a fetch, a report push) asked for before the stall
//! ends waits for it in the runtime's time, as a real fetch waits on a
//! server that answers nothing ([`stall_remote`]).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::{Cell, RefCell};
use tokio::task::JoinHandle;

thread_local! {
    static INLINE: Cell<bool> = const { Cell::new(false) };
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
    static STALLED: Cell<Option<tokio::time::Instant>> = const { Cell::new(None) };
}

/// While alive, this thread's draws are seeded and its blocking work runs
/// inline (the module's doc); dropping it restores what was there before.
pub struct Exact {
    inline: bool,
    rng: Option<StdRng>,
    stalled: Option<tokio::time::Instant>,
}

impl Exact {
    /// Exact runs on this thread, its draws seeded with `seed`, from now
    /// until the guard is dropped.
    pub fn seeded(seed: u64) -> Exact {
        Exact {
            inline: INLINE.with(|i| i.replace(true)),
            rng: SEEDED.with(|r| r.replace(Some(StdRng::seed_from_u64(seed)))),
            // A stall is an instant of one runtime's clock: none carries over.
            stalled: STALLED.with(|s| s.replace(None)),
        }
    }
}

impl Drop for Exact {
    fn drop(&mut self) {
        INLINE.with(|i| i.set(self.inline));
        SEEDED.with(|r| *r.borrow_mut() = self.rng.take());
        STALLED.with(|s| s.set(self.stalled));
    }
}

fn draw<T>(f: impl FnOnce(&mut dyn rand::RngCore) -> T) -> T {
    SEEDED.with(|r| match r.borrow_mut().as_mut() {
        Some(seeded) => f(seeded),
        None => f(&mut rand::rng()),
    })
}

/// 64 random bits (ids of node records and of replicas).
pub fn random_u64() -> u64 {
    draw(|r| r.random())
}

/// A number drawn uniformly from `lo..=hi` (jitter factors).
pub fn random_between(lo: f64, hi: f64) -> f64 {
    draw(|r| r.random_range(lo..=hi))
}

fn inline() -> bool {
    INLINE.with(Cell::get)
}

/// Run `f` off the control loop: on the blocking pool, or inline as a task
/// of this runtime under [`Exact`].
pub fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    if inline() {
        tokio::spawn(async move { f() })
    } else {
        tokio::task::spawn_blocking(f)
    }
}

/// Under [`Exact`]: remote work asked for from now on waits until `until`
/// (`None`: the remote answers again). Outside it this does nothing.
pub fn stall_remote(until: Option<tokio::time::Instant>) {
    if inline() {
        STALLED.with(|s| s.set(until));
    }
}

/// Inline, remote work first waits out the stall [`stall_remote`] set, or
/// its own `bound` if that ends first: the bound its real transfer has.
async fn after_stall(bound: std::time::Duration) {
    if let Some(until) = STALLED.with(Cell::get) {
        let bounded = tokio::time::Instant::now().checked_add(bound);
        tokio::time::sleep_until(bounded.map_or(until, |b| until.min(b))).await;
    }
}

/// Run remote work `f` (a fetch, which gives up after `bound`) off the
/// control loop, as [`spawn`] does; inline, after the stall of the remote.
pub fn remote<T: Send + 'static>(
    bound: std::time::Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    if inline() {
        tokio::spawn(async move {
            after_stall(bound).await;
            f()
        })
    } else {
        tokio::task::spawn_blocking(f)
    }
}

/// Run remote work `f` (a report push, which gives up after `bound`) on a
/// thread of its own named `name` (work that may take long and must not
/// hold a thread of the pool), or inline as [`remote`] does. `Err` when no
/// thread could be started.
pub fn thread(
    name: &str,
    bound: std::time::Duration,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    if inline() {
        drop(tokio::spawn(async move {
            after_stall(bound).await;
            f()
        }));
        return Ok(());
    }
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    /// Under the guard, work runs on the asking thread and draws repeat
    /// for a seed; without it, work goes to other threads.
    #[tokio::test(flavor = "current_thread")]
    async fn exact_runs_inline_and_repeats_its_draws_only_while_the_guard_lives() {
        let me = std::thread::current().id();
        let pooled = spawn(|| std::thread::current().id()).await.unwrap();
        assert_ne!(pooled, me);
        let draws = |seed| {
            let _exact = Exact::seeded(seed);
            (random_u64(), random_between(0.9, 1.1))
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        {
            let _exact = Exact::seeded(1);
            let here = spawn(|| std::thread::current().id()).await.unwrap();
            assert_eq!(here, me);
            let (tx, rx) = tokio::sync::oneshot::channel();
            thread("t", Duration::from_secs(1), move || {
                let _ = tx.send(std::thread::current().id());
            })
            .unwrap();
            assert_eq!(rx.await.unwrap(), me);
        }
        assert!(!inline());
        let pooled = spawn(|| std::thread::current().id()).await.unwrap();
        assert_ne!(pooled, me);
        let f = random_between(0.9, 1.1);
        assert!((0.9..=1.1).contains(&f));
    }

    /// A stalled remote holds remote work until the stall ends or the
    /// work's own bound does, whichever is first; local work and work
    /// outside the guard never wait, and no stall outlives its guard.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_stalled_remote_holds_remote_work_for_the_stall_or_its_bound() {
        let t0 = Instant::now();
        {
            let _exact = Exact::seeded(1);
            stall_remote(Some(t0 + Duration::from_secs(600)));
            remote(Duration::from_secs(60), || ()).await.unwrap();
            assert_eq!(t0.elapsed(), Duration::from_secs(60));
            let (tx, rx) = tokio::sync::oneshot::channel();
            thread("t", Duration::from_secs(30), move || {
                let _ = tx.send(());
            })
            .unwrap();
            rx.await.unwrap();
            assert_eq!(t0.elapsed(), Duration::from_secs(90));
            spawn(|| ()).await.unwrap();
            assert_eq!(
                t0.elapsed(),
                Duration::from_secs(90),
                "local work waits on no stall"
            );
            stall_remote(Some(Instant::now() + Duration::from_secs(10)));
            remote(Duration::from_secs(60), || ()).await.unwrap();
            assert_eq!(t0.elapsed(), Duration::from_secs(100));
        }
        assert_eq!(
            STALLED.with(Cell::get),
            None,
            "the guard took its stall with it"
        );
        stall_remote(Some(Instant::now() + Duration::from_secs(600)));
        assert_eq!(
            STALLED.with(Cell::get),
            None,
            "outside the guard there is no stall"
        );
    }
}
