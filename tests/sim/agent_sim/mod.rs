//! A deterministic simulation of the whole agent (issue 38): the real
//! `drover::agent::Agent` (fetch, admit, decide, act, report) run against
//! the in-memory cluster, an in-process API server and a local git origin,
//! in virtual time, under a seeded plan of config changes and faults
//! (`plan.rs`), with the rules of `checks.rs` judged after every step.
//!
//! - `seeds` runs `DROVER_SIM_SEEDS` seeds (default [`CI_SEEDS`]) from
//!   `DROVER_SIM_FIRST` (default 0), on every core;
//! - `DROVER_SIM_SEED=<n>` runs seed `n` alone and prints its plan;
//! - `regressions` runs [`REGRESSIONS`], seeds that found a defect, every
//!   time.
//!
//! A failing seed prints itself, the rule it broke, its plan and the
//! shortest plan found that still fails (each step, then each node, left
//! out in turn while it keeps failing).

mod api;
mod checks;
mod forge;
mod plan;
mod world;

use plan::{Plan, Round};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Seeds `.ci/run` runs.
const CI_SEEDS: u64 = 40;

/// Seeds that found a defect, each with the round of draws it was found
/// in (it runs the plan that round drew: `DROVER_SIM_ROUND=first|stalls|
/// notready|driver` replays one so; the newest round is the default) and
/// what it found; each fails again if its fix is taken out (the commit
/// that fixed it says how).
const REGRESSIONS: &[(u64, Round, &str)] = &[
    (
        11,
        Round::First,
        "a stale follower's takeover abandoned every drain",
    ),
    (
        17,
        Round::First,
        "a refused pin-and-policy span the checks misjudged",
    ),
    (
        133,
        Round::First,
        "a halt learnt mid-drain: the node went on to its run",
    ),
    (
        185,
        Round::First,
        "a halt learnt mid-drain: the node went on to its run",
    ),
    (
        221,
        Round::First,
        "a failed report rewritten away before it had to be fetched",
    ),
    (
        287,
        Round::First,
        "a pin and a revocation fetched together, then more merges",
    ),
    (
        398,
        Round::First,
        "a pin and a revocation merged within one poll",
    ),
    (
        441,
        Round::First,
        "a revocation in a span the gate refused, not honoured",
    ),
    (
        514,
        Round::First,
        "a revocation in a span the gate refused; a restart acting before its fetch",
    ),
    (
        803,
        Round::First,
        "the checks: a clock jump before a revocation was known",
    ),
    (
        999,
        Round::First,
        "the checks: a clock jump before a bump was known",
    ),
    (
        1219,
        Round::First,
        "the checks: a failed and a confirmed report pushed in one step",
    ),
    (
        3170,
        Round::First,
        "a takeover that could not read the status object acted on its own older term's pin",
    ),
    (
        5754,
        Round::First,
        "a head accepted but not recorded: the older pin started a node the head revoked",
    ),
    (
        6440,
        Round::First,
        "the checks: merges of one minute fetched with a refused pair",
    ),
    (
        6524,
        Round::First,
        "a head accepted but not recorded: the older pin moved a node meanwhile",
    ),
    (
        165,
        Round::Stalls,
        "a restart under a stalled origin: its first fetch must give up at its bound",
    ),
    (
        4331,
        Round::Stalls,
        "the checks: a takeover in the instant a clock jump let the origin go down",
    ),
    (
        5123,
        Round::Stalls,
        "the checks: a merge a stall held back, then to be recorded while writes hung",
    ),
    (
        553,
        Round::NotReady,
        "a passed node's rollback took a place nodes later in name order held",
    ),
    (
        1837,
        Round::NotReady,
        "a passed node's rollback took a place nodes later in name order held",
    ),
    (
        821,
        Round::Driver,
        "a retried rollback whose run waited past node_timeout for a window: refused and named, \
         not ignored (the rule's)",
    ),
    (
        5377,
        Round::Driver,
        "a clock jump past the origin's outage left it down a step longer, into a takeover's \
         first fetch (the harness's)",
    ),
    (
        10900,
        Round::Driver,
        "the checks: a passed node's rollback under a halt taken for a start",
    ),
    (
        11347,
        Round::Driver,
        "a driver's failure on a node whose pods could not be listed held no start",
    ),
    (
        11423,
        Round::Driver,
        "the checks: a passed node's rollback under a halt taken for a start",
    ),
    (
        12787,
        Round::Driver,
        "a pin and a revocation fetched together, a freeze between them",
    ),
    (
        13572,
        Round::Driver,
        "the checks: a clock jump in the grace after an outage, not counted",
    ),
    (
        16086,
        Round::Driver,
        "the checks: a retry judged unanswered at a clock jump, its time not over",
    ),
    (
        46,
        Round::Evidence,
        "the checks: a drain given back when a forged branch held the evidence",
    ),
    (
        20784,
        Round::Evidence,
        "the checks: a refused span whose head was merged after the newest known merge",
    ),
    (
        22918,
        Round::Evidence,
        "the checks: a takeover in overlapping outages of the origin, holding for the applied commit",
    ),
    (
        24036,
        Round::Evidence,
        "the checks: a report's wait to name a cordoned node cut short by a clock jump",
    ),
];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Run one seed; on failure, the message a person replays it from.
fn seed(n: u64) -> Result<world::Ran, String> {
    run(n, plan(n))
}

/// Seed `n`'s plan, as the round `DROVER_SIM_ROUND` names (`first`,
/// `stalls`, `notready`, `driver`) drew it, or as every round draws it.
fn plan(n: u64) -> Plan {
    match std::env::var("DROVER_SIM_ROUND").as_deref() {
        Ok("first") => Plan::draw_as(n, Round::First),
        Ok("stalls") => Plan::draw_as(n, Round::Stalls),
        Ok("notready") => Plan::draw_as(n, Round::NotReady),
        Ok("driver") => Plan::draw_as(n, Round::Driver),
        _ => Plan::draw(n),
    }
}

fn run(n: u64, plan: Plan) -> Result<world::Ran, String> {
    let (ran, out) = world::run(plan.clone());
    if let Some(k) = env_u64("DROVER_SIM_REPLAYS") {
        for i in 1..k {
            let (again, out2) = world::run(plan.clone());
            if again.digest != ran.digest || out2.is_ok() != out.is_ok() {
                return Err(format!(
                    "DROVER_SIM_SEED={n} does not replay: run {i} differs from run 0 ({:?} vs {:?})",
                    out2.err(),
                    out.as_ref().err()
                ));
            }
        }
    }
    let Err(first) = out else { return Ok(ran) };
    let (shrunk, why) = shrink(plan.clone(), first.clone());
    if std::env::var("DROVER_SIM_TRACE").is_ok() {
        // The trace a person reads is the shortest plan's, not the last
        // shrink tried.
        tracing::info!("replaying the shortest failing plan");
        let _ = world::run(shrunk.clone());
    }
    Err(format!(
        "DROVER_SIM_SEED={n} failed: {first}\n  plan: {plan:?}\n  shortest failing plan: {shrunk:?}\n  \
         which fails with: {why}\n  \
         replay: DROVER_SIM_SEED={n} cargo test --test sim agent_sim::seeds -- --nocapture"
    ))
}

/// The shortest plan found that still fails.
fn shrink(mut plan: Plan, mut why: String) -> (Plan, String) {
    'outer: for _ in 0..40 {
        for smaller in plan.shrinks() {
            if let Err(e) = world::run(smaller.clone()).1 {
                plan = smaller;
                why = e;
                continue 'outer;
            }
        }
        break;
    }
    (plan, why)
}

#[test]
fn seeds() {
    if let Some(n) = env_u64("DROVER_SIM_SEED") {
        if std::env::var("DROVER_SIM_TRACE").is_ok() {
            // Virtual time is in the "sim step" lines; wall time would only
            // make two replays' traces differ.
            let _ = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info,sim=debug".into()),
                )
                .without_time()
                .with_ansi(false)
                .try_init();
        }
        eprintln!("{:?}", plan(n));
        match seed(n) {
            Ok(ran) => eprintln!("seed {n} passed: {ran:?}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let count = env_u64("DROVER_SIM_SEEDS").unwrap_or(CI_SEEDS);
    let first = env_u64("DROVER_SIM_FIRST").unwrap_or(0);
    if std::env::var("DROVER_SIM_LIST").is_ok() {
        for n in first..first + count {
            eprintln!("{n}: {:?}", plan(n));
        }
        return;
    }
    let next = AtomicU64::new(first);
    let failures = Mutex::new(Vec::new());
    let (steps, faults, procs, runs, retries) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= first + count {
                    return;
                }
                match seed(n) {
                    Ok(r) => {
                        steps.fetch_add(r.steps, Ordering::Relaxed);
                        faults.fetch_add(r.faults, Ordering::Relaxed);
                        procs.fetch_add(r.processes, Ordering::Relaxed);
                        runs.fetch_add(r.driver_runs, Ordering::Relaxed);
                        retries.fetch_add(r.retries, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("{e}");
                        failures.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let c = count as f64;
    eprintln!(
        "agent_sim: {count} seeds in {secs:.1}s ({:.1} seeds/s), per seed {:.0} steps, {:.1} faults, {:.2} processes, {:.1} driver runs, {:.2} retries asked",
        c / secs,
        steps.into_inner() as f64 / c,
        faults.into_inner() as f64 / c,
        procs.into_inner() as f64 / c,
        runs.into_inner() as f64 / c,
        retries.into_inner() as f64 / c,
    );
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Seeds that crash, hand over, fail drivers and lose git, each run twice:
/// both runs make the same cluster events at the same virtual times and
/// push the same reports (`crate::replay` pins what would differ).
#[test]
fn replays_exactly() {
    for n in [6, 16, 17, 28] {
        let plan = Plan::draw(n);
        let (a, _) = world::run(plan.clone());
        let (b, _) = world::run(plan);
        assert_eq!(a.digest, b.digest, "seed {n} ran differently twice");
    }
}

#[test]
fn regressions() {
    for (n, round, found) in REGRESSIONS {
        if let Err(e) = run(*n, Plan::draw_as(*n, *round)) {
            panic!("regression seed {n} ({found}) fails again:\n{e}");
        }
    }
}
