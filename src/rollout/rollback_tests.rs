//! Automatic rollback in the decision core (docs/design.md §5b), without
//! I/O: single steps, and a model cluster driven by the decisions alone
//! under random health failures (property tests).

use super::decide::decide;
use super::decision::*;
use super::engine::watched_nodes;
use super::RolloutState;
use crate::cluster::{NodeProgress, NodeSeen, NodeView, PodSeen, ProgressState, UpgradeStatus};
use crate::config::{HealthSpec, MaxUnavailable, OnDrainTimeout, OnFailure};
use chrono::{DateTime, Utc};
use proptest::prelude::*;
use semver::Version;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

pub(super) fn t0() -> DateTime<Utc> {
    "2026-12-08T02:00:00Z".parse().unwrap()
}

pub(super) fn v(s: &str) -> Version {
    s.parse().unwrap()
}

pub(super) fn policy(on_failure: OnFailure, max_unavailable: u32, max_rollbacks: u32) -> Policy {
    Policy {
        target: v("1.13.3"),
        allow_downgrade: false,
        max_unavailable: MaxUnavailable::Count(max_unavailable),
        drain_timeout: Duration::from_secs(20 * 60),
        node_timeout: Duration::from_secs(45 * 60),
        on_drain_timeout: OnDrainTimeout::Skip,
        health: Some(HealthSpec {
            enabled: true,
            settle: Duration::from_secs(10 * 60),
            pod_ready_timeout: Duration::from_secs(5 * 60),
            ..HealthSpec::default()
        }),
        on_failure,
        max_rollbacks,
        prepare: false,
        prestage: std::time::Duration::ZERO,
        revoked: Vec::new(),
        drain: Vec::new(),
        consent_limit: None,
    }
}

pub(super) fn open() -> Inputs {
    Inputs {
        may_start: true,
        window: WindowState {
            opened_at: Some(t0()),
            ..WindowState::default()
        },
        ..Inputs::default()
    }
}

/// A node of the model cluster: what a backend would show, and what the
/// model's OS does when a driver runs.
#[derive(Debug, Clone)]
pub(super) struct Model {
    pub(super) view: NodeView,
    /// Pods crash-loop on it whenever it runs this version.
    bad_at: Option<Version>,
    /// Its driver fails when asked to roll back.
    pub(super) rollback_fails: bool,
    /// The driver's run: the version and whether it finishes next step.
    run: Option<(Version, bool)>,
}

pub(super) fn model(name: &str, bad: bool, rollback_fails: bool) -> Model {
    Model {
        view: NodeView {
            name: name.into(),
            version: Some(v("1.13.2")),
            ready: true,
            ..NodeView::default()
        },
        bad_at: bad.then(|| v("1.13.3")),
        rollback_fails,
        run: None,
    }
}

/// What the model saw over a run.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Nodes that failed a health check at 1.13.3 (recorded failed or rolling back).
    failed_at_v: BTreeSet<String>,
    /// Violations of the properties, with the step.
    pub(super) violations: Vec<String>,
    pub(super) rollbacks_started: usize,
    pub(super) last: Option<Decision>,
}

/// Drive `nodes` with `policy` for up to `steps` steps of one minute,
/// applying every action as a backend would, and check after each step
/// that no node rolled back from 1.13.3 is started at it again and no node
/// that failed at 1.13.3 is uncordoned while it runs 1.13.3.
pub(super) fn drive(policy: &Policy, nodes: &mut [Model], steps: usize) -> Seen {
    let target = policy.target.clone();
    let mut seen = Seen::default();
    let mut now = t0();
    for step in 0..steps {
        // The OS: runs started last step finish now.
        for m in nodes.iter_mut() {
            if let Some((to, true)) = m.run.clone() {
                let rollback = matches!(&m.view.progress,
                    Ok(Some(p)) if p.state == ProgressState::RollingBack);
                if rollback && m.rollback_fails {
                    m.view.upgrade = UpgradeStatus::Failed("exit 1".into());
                } else {
                    m.view.version = Some(to);
                    m.view.ready = true;
                    m.view.upgrade = UpgradeStatus::Succeeded;
                }
                m.run = None;
            } else if let Some((to, false)) = m.run.clone() {
                m.run = Some((to, true));
            }
        }
        let views: Vec<NodeView> = nodes.iter().map(|m| m.view.clone()).collect();
        let watched = watched_nodes(policy, &views);
        let inputs = Inputs {
            health: nodes
                .iter()
                .filter(|m| watched.contains(&m.view.name))
                .map(|m| health_of(m, now))
                .collect(),
            ..open()
        };
        let d = decide(policy, &inputs, &views, now);
        for a in &d.actions {
            let m = nodes
                .iter_mut()
                .find(|m| m.view.name == a.node())
                .expect("an action on a known node");
            check(step, a, m, &target, &mut seen);
            apply(a, m);
        }
        for m in nodes.iter() {
            if let Ok(Some(p)) = &m.view.progress {
                let failed = p.state == ProgressState::RollingBack
                    || (p.state == ProgressState::Failed && p.message.contains("health check"));
                if failed && p.target == target {
                    seen.failed_at_v.insert(m.view.name.clone());
                }
            }
        }
        let settled = d.actions.is_empty()
            && matches!(d.state, RolloutState::Confirmed | RolloutState::Failed)
            && nodes.iter().all(|m| m.run.is_none());
        seen.last = Some(d);
        if settled {
            break;
        }
        now += chrono::Duration::minutes(1);
    }
    seen
}

fn check(step: usize, a: &Action, m: &Model, target: &Version, seen: &mut Seen) {
    let name = &m.view.name;
    let at_v = m.view.version.as_ref() == Some(target);
    match a {
        Action::Cordon { progress, .. } if m.view.rolled_back.contains(&progress.target) => {
            seen.violations.push(format!(
                "step {step}: {name} started at a version it was rolled back from"
            ));
        }
        Action::RollBack { .. } => seen.rollbacks_started += 1,
        _ => {}
    }
    let uncordons = match a {
        Action::Complete { uncordon, .. }
        | Action::Watch { uncordon, .. }
        | Action::Block { uncordon, .. }
        | Action::Fail { uncordon, .. }
        | Action::RolledBack { uncordon, .. } => *uncordon,
        _ => false,
    };
    if uncordons && at_v && seen.failed_at_v.contains(name) {
        seen.violations.push(format!(
            "step {step}: {name} uncordoned at {target} after failing there"
        ));
    }
}

fn apply(a: &Action, m: &mut Model) {
    let set = |m: &mut Model, p: Option<&NodeProgress>| {
        m.view.progress = Ok(p.cloned());
        m.view.retry = false;
    };
    match a {
        Action::Cordon { progress, .. } => {
            m.view.unschedulable = true;
            set(m, Some(progress));
            m.view.upgrade = UpgradeStatus::NotStarted;
        }
        Action::RollBack { progress, .. } => {
            m.view.unschedulable = true;
            set(m, Some(progress));
            m.view.upgrade = UpgradeStatus::NotStarted;
            // Counted in the record, as the backend's write does.
            match m
                .view
                .rollbacks
                .iter_mut()
                .find(|r| r.version == progress.target)
            {
                Some(r) => r.started += 1,
                None => m.view.rollbacks.push(crate::record::Rollbacks {
                    version: progress.target.clone(),
                    started: 1,
                }),
            }
        }
        Action::Evict { .. } => {}
        // The policy here has no drain rules.
        Action::Taint { .. } => unreachable!("no pre-drain taint"),
        // The policy here has no prepare step.
        Action::Prepare { .. } => unreachable!("prepare is off"),
        Action::StartUpgrade { progress, .. } => {
            // The run the record named exists: upgrading (`cluster::effective`).
            set(m, Some(progress));
            m.view.upgrade = UpgradeStatus::Running;
            m.view.ready = false;
            m.run = Some((progress.run_version().clone(), false));
        }
        Action::Complete { uncordon, .. } | Action::GiveBack { uncordon, .. } => {
            m.view.unschedulable &= !uncordon;
            set(m, None);
        }
        Action::Release { progress, .. } => {
            m.view.unschedulable = false;
            set(m, Some(progress));
        }
        Action::Retarget { progress, .. } => set(m, Some(progress)),
        Action::ClearRolledBack { .. } => m.view.rolled_back.clear(),
        Action::Consent { hold, .. } => m.view.consent_hold = *hold,
        Action::StopRun { .. } => {}
        Action::CordonAgain { .. } => m.view.unschedulable = true,
        Action::Block {
            progress, uncordon, ..
        }
        | Action::Fail {
            progress, uncordon, ..
        }
        | Action::Watch {
            progress, uncordon, ..
        } => {
            m.view.unschedulable &= !uncordon;
            set(m, Some(progress));
        }
        Action::Pass { progress, .. }
        | Action::Unhealthy { progress, .. }
        | Action::RollbackFailed { progress, .. }
        | Action::Note { progress, .. } => set(m, Some(progress)),
        Action::RolledBack {
            progress,
            rolled_back,
            uncordon,
            ..
        } => {
            m.view.unschedulable &= !uncordon;
            set(m, Some(progress));
            m.view.rolled_back = rolled_back.clone();
        }
        Action::Clear { .. } => set(m, None),
    }
}

/// The node's health as a backend reads it: a crash-looping pod while it
/// runs the version that is bad on it.
fn health_of(m: &Model, now: DateTime<Utc>) -> NodeSeen {
    let bad = m.bad_at.is_some() && m.bad_at == m.view.version;
    NodeSeen {
        name: m.view.name.clone(),
        conditions: Vec::new(),
        pods: vec![PodSeen {
            name: format!("apps/{}-web", m.view.name),
            created: now - chrono::Duration::minutes(1),
            ready: !bad,
            restarts: if bad { 3 } else { 0 },
            waiting_reason: bad.then(|| crate::health::verdict::CRASHLOOP_REASON.into()),
        }],
        unread: None,
    }
}

pub(super) fn node<'a>(nodes: &'a [Model], name: &str) -> &'a NodeView {
    &nodes.iter().find(|m| m.view.name == name).unwrap().view
}

#[test]
fn a_node_failing_after_its_upgrade_is_rolled_back_healthy_uncordoned_and_marked() {
    let p = policy(OnFailure::Rollback, 1, 1);
    let mut nodes = vec![model("a", true, false), model("b", false, false)];
    let seen = drive(&p, &mut nodes, 200);
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    let a = node(&nodes, "a");
    assert_eq!(a.version, Some(v("1.13.2")), "back at the version it ran");
    assert!(a.ready && !a.unschedulable, "healthy and uncordoned: {a:?}");
    assert_eq!(a.rolled_back, vec![v("1.13.3")]);
    let rec = a.progress.clone().unwrap().unwrap();
    assert_eq!(rec.state, ProgressState::Failed);
    assert!(
        rec.message
            .starts_with("rolled back to 1.13.2: health check failed: "),
        "{}",
        rec.message
    );
    let b = node(&nodes, "b");
    assert_eq!(b.version, Some(v("1.13.2")), "the rollout stopped before b");
    let d = seen.last.unwrap();
    assert_eq!(d.state, RolloutState::Failed);
    assert!(
        d.message.contains("node a failed: rolled back to 1.13.2"),
        "{}",
        d.message
    );
    assert_eq!(seen.rollbacks_started, 1);
}

#[test]
fn halt_keeps_todays_behaviour_the_node_stays_in_service() {
    let p = policy(OnFailure::Halt, 1, 1);
    let mut nodes = vec![model("a", true, false), model("b", false, false)];
    let seen = drive(&p, &mut nodes, 200);
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    let a = node(&nodes, "a");
    assert_eq!(a.version, Some(v("1.13.3")));
    assert!(!a.unschedulable && a.rolled_back.is_empty());
    let rec = a.progress.clone().unwrap().unwrap();
    assert_eq!(rec.state, ProgressState::Failed);
    assert!(
        rec.message.starts_with("health check failed: "),
        "{}",
        rec.message
    );
    assert_eq!(seen.rollbacks_started, 0);
    assert_eq!(seen.last.unwrap().state, RolloutState::Failed);
}

#[test]
fn a_rollback_whose_driver_fails_leaves_the_node_cordoned_and_named() {
    let p = policy(OnFailure::Rollback, 1, 1);
    let mut nodes = vec![model("a", true, true), model("b", false, false)];
    let seen = drive(&p, &mut nodes, 200);
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    let a = node(&nodes, "a");
    assert_eq!(a.version, Some(v("1.13.3")));
    assert!(a.unschedulable, "left cordoned: {a:?}");
    assert!(a.rolled_back.is_empty());
    let rec = a.progress.clone().unwrap().unwrap();
    assert!(rec.cordoned_by_drover, "drover's cordon record is kept");
    assert!(
        rec.message
            .starts_with("rollback failed: its driver failed: exit 1; left cordoned"),
        "{}",
        rec.message
    );
    let d = seen.last.unwrap();
    assert_eq!(d.state, RolloutState::Failed);
    assert!(
        d.message.contains("node a failed: rollback failed"),
        "{}",
        d.message
    );
    assert!(d.skipped.iter().any(|s| s.node == "a"));
}

/// Node `name` moved by drover from 1.13.2 to 1.13.3 and recorded in `state`.
pub(super) fn moved(name: &str, state: ProgressState, message: &str) -> NodeView {
    let mut n = model(name, false, false).view;
    n.version = Some(v("1.13.3"));
    n.progress = Ok(Some(NodeProgress {
        state,
        target: v("1.13.3"),
        started_at: t0(),
        cordoned_by_drover: state.in_flight(),
        message: message.into(),
        retries: 0,
        previous: Some(v("1.13.2")),
    }));
    n
}

/// Node `a`, failed its health check at 1.13.3, rolling back to 1.13.2,
/// still cordoned.
pub(super) fn rolling_back() -> NodeView {
    let mut a = moved(
        "a",
        ProgressState::RollingBack,
        "health check failed: pods crash-looping",
    );
    a.unschedulable = true;
    a
}

#[test]
fn the_pass_that_sees_a_rollback_fail_says_so() {
    // Not only the passes after it: the cluster's message names the failed
    // rollback from the pass that decides it, not "rolling back".
    let p = policy(OnFailure::Rollback, 1, 1);
    let mut a = rolling_back();
    a.upgrade = UpgradeStatus::Failed("exit 1".into());
    let now = t0() + chrono::Duration::minutes(5);
    let d = decide(&p, &open(), &[a], now);
    assert_eq!(d.state, RolloutState::Failed);
    assert!(
        d.message
            .contains("node a failed: rollback failed: its driver failed: exit 1"),
        "{}",
        d.message
    );
    // Its record says it failed now, as a rolled-back node's says it came
    // back now, not when its rollback began.
    match d.actions.as_slice() {
        [Action::RollbackFailed { progress, .. }] => assert_eq!(progress.started_at, now),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_circuit_breaker_halts_beyond_max_rollbacks_with_the_nodes_as_they_are() {
    // Two nodes move at once and both fail: the first is rolled back, the
    // second stays as it is (in service at 1.13.3), and nothing else starts.
    let p = policy(OnFailure::Rollback, 2, 1);
    let mut nodes = vec![
        model("a", true, false),
        model("b", true, false),
        model("c", false, false),
    ];
    let seen = drive(&p, &mut nodes, 200);
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    assert_eq!(seen.rollbacks_started, 1);
    assert_eq!(node(&nodes, "a").version, Some(v("1.13.2")));
    let b = node(&nodes, "b");
    assert_eq!(b.version, Some(v("1.13.3")));
    let rec = b.progress.clone().unwrap().unwrap();
    assert!(
        rec.message
            .contains("max_rollbacks (1) reached: the cluster halts"),
        "{}",
        rec.message
    );
    assert_eq!(node(&nodes, "c").version, Some(v("1.13.2")));
    assert_eq!(seen.last.unwrap().state, RolloutState::Failed);
}

#[test]
fn max_rollbacks_zero_never_rolls_back() {
    let p = policy(OnFailure::Rollback, 1, 0);
    let mut nodes = vec![model("a", true, false)];
    let seen = drive(&p, &mut nodes, 200);
    assert_eq!(seen.rollbacks_started, 0);
    assert_eq!(node(&nodes, "a").version, Some(v("1.13.3")));
}

#[test]
fn a_rolled_back_node_is_not_started_again_after_a_retry_and_the_cluster_stays_failed() {
    let p = policy(OnFailure::Rollback, 1, 1);
    let mut nodes = vec![model("a", true, false)];
    drive(&p, &mut nodes, 200);
    nodes[0].view.retry = true;
    let seen = drive(&p, &mut nodes, 50);
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    let a = node(&nodes, "a");
    assert_eq!(a.version, Some(v("1.13.2")));
    assert_eq!(a.progress, Ok(None), "the retry cleared the record");
    let d = seen.last.unwrap();
    assert_eq!(d.state, RolloutState::Failed);
    assert!(
        d.message.contains("rolled back from 1.13.3"),
        "{}",
        d.message
    );
    // A new version moves it again.
    let mut next = p.clone();
    next.target = v("1.13.4");
    let d = decide(&next, &open(), std::slice::from_ref(a), t0());
    assert!(
        matches!(d.actions.as_slice(), [Action::Cordon { node, .. }] if node == "a"),
        "{:?}",
        d.actions
    );
}

#[test]
fn the_previous_version_is_recorded_when_the_node_starts() {
    let p = policy(OnFailure::Rollback, 1, 1);
    let n = model("a", false, false).view;
    let d = decide(&p, &open(), &[n], t0());
    match d.actions.as_slice() {
        [Action::Cordon { progress, .. }] => assert_eq!(progress.previous, Some(v("1.13.2"))),
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random clusters where 1.13.3 breaks random nodes (and some of their
    /// rollbacks fail): no node rolled back from 1.13.3 is ever started at
    /// it again, no node that failed at 1.13.3 is ever uncordoned while it
    /// runs it, and the rollbacks never exceed `max_rollbacks`.
    #[test]
    fn rollback_never_restarts_v_nor_uncordons_a_failed_node_at_v(
        bad in proptest::collection::vec((any::<bool>(), any::<bool>()), 1..7),
        max_unavailable in 1u32..4,
        max_rollbacks in 0u32..3,
        rollback in any::<bool>(),
        retry_after in any::<bool>(),
    ) {
        let on_failure = if rollback { OnFailure::Rollback } else { OnFailure::Halt };
        let p = policy(on_failure, max_unavailable, max_rollbacks);
        let mut nodes: Vec<Model> = bad
            .iter()
            .enumerate()
            .map(|(i, (bad, fails))| model(&format!("n{i}"), *bad, *fails))
            .collect();
        let mut seen = drive(&p, &mut nodes, 300);
        if retry_after {
            // A person retries every node: the rolled-back ones still never take 1.13.3.
            let failed = std::mem::take(&mut seen.failed_at_v);
            for m in nodes.iter_mut() {
                m.view.retry = true;
            }
            let mut again = drive(&p, &mut nodes, 300);
            seen.violations.append(&mut again.violations);
            seen.rollbacks_started += again.rollbacks_started;
            seen.failed_at_v = failed;
        }
        prop_assert!(seen.violations.is_empty(), "{:?}", seen.violations);
        let marked: BTreeMap<&str, bool> = nodes
            .iter()
            .map(|m| (m.view.name.as_str(), m.view.rolled_back.contains(&v("1.13.3"))))
            .collect();
        let rolled = marked.values().filter(|m| **m).count();
        prop_assert!(rolled <= max_rollbacks as usize, "{rolled} rolled back: {marked:?}");
        if !rollback {
            prop_assert_eq!(seen.rollbacks_started, 0);
        }
        for m in &nodes {
            if m.view.rolled_back.contains(&v("1.13.3")) {
                prop_assert_eq!(m.view.version.clone(), Some(v("1.13.2")));
            }
        }
    }
}

#[test]
fn passed_nodes_are_watched_again_only_once_every_node_is_done() {
    // The settle reads the passed nodes once the rollout is over, and not
    // before: a Prometheus query per passed node at every pass is waste.
    let p = policy(OnFailure::Rollback, 1, 1);
    let passed = |name: &str| moved(name, ProgressState::Passed, "");
    let mut views = vec![passed("a"), passed("b")];
    assert_eq!(watched_nodes(&p, &views), ["a", "b"]);
    views.push(model("c", false, false).view);
    assert_eq!(watched_nodes(&p, &views), Vec::<String>::new());
    // A node still watched at the target is not done: only it is read.
    views.pop();
    views.push(moved("c", ProgressState::Watching, ""));
    assert_eq!(watched_nodes(&p, &views), ["c"]);
}

#[test]
fn a_passed_node_that_fails_notready_under_halt_counts_as_out_of_service() {
    let p = policy(OnFailure::Halt, 1, 1);
    let mut a = moved("a", ProgressState::Passed, "");
    a.ready = false;
    let d = decide(&p, &open(), &[a], t0() + chrono::Duration::minutes(30));
    assert_eq!(d.state, RolloutState::Failed, "{}", d.message);
    assert_eq!(d.unavailable, 1, "{d:?}");
}

/// The health a backend reads of `n`: one pod, crash-looping when `bad`.
fn health(n: &NodeView, bad: bool, now: DateTime<Utc>) -> NodeSeen {
    let mut m = model(&n.name, bad, false);
    m.view.version = n.version.clone();
    health_of(&m, now)
}

pub(super) fn at(m: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::minutes(m)
}

#[test]
fn a_passed_node_that_fails_is_rolled_back_when_the_budget_has_room() {
    // A passed node takes a new place to roll back (a watched one holds
    // its own): with room, it is rolled back, not left failed in service.
    let p = policy(OnFailure::Rollback, 1, 1);
    let mut a = moved("a", ProgressState::Passed, "");
    a.ready = false;
    let d = decide(&p, &open(), &[a], at(30));
    assert!(
        matches!(d.actions.as_slice(), [Action::RollBack { node, .. }] if node == "a"),
        "{:?}",
        d.actions
    );
    assert_eq!(d.unavailable, 1);
}

#[test]
fn a_rollback_drains_outside_the_window_but_starts_its_run_only_inside_one() {
    let p = policy(OnFailure::Rollback, 1, 1);
    let mut a = rolling_back();
    let closed = Inputs {
        window: WindowState::default(),
        ..open()
    };
    // Drained and the window closed: it waits, cordoned, its run not made.
    let d = decide(&p, &closed, std::slice::from_ref(&a), at(5));
    assert!(
        !d.actions
            .iter()
            .any(|x| matches!(x, Action::StartUpgrade { .. })),
        "{:?}",
        d.actions
    );
    // Pods left on it: evicted, window or not.
    a.pods_to_evict = 2;
    let d = decide(&p, &closed, &[a], at(5));
    assert!(
        matches!(d.actions.as_slice(), [Action::Evict { node, .. }] if node == "a"),
        "{:?}",
        d.actions
    );
}

/// `rolling_back()`'s node back at 1.13.2, its run over.
fn back_at_previous() -> NodeView {
    let mut a = rolling_back();
    a.version = Some(v("1.13.2"));
    a.upgrade = UpgradeStatus::Succeeded;
    a
}

#[test]
fn a_node_rolled_back_is_recorded_failed_since_it_came_back() {
    let p = policy(OnFailure::Rollback, 1, 1);
    let a = back_at_previous();
    let inputs = Inputs {
        health: vec![health(&a, false, at(20))],
        ..open()
    };
    let d = decide(&p, &inputs, &[a], at(20));
    match d.actions.as_slice() {
        [Action::RolledBack { progress, .. }] => {
            assert_eq!(progress.state, ProgressState::Failed);
            assert_eq!(progress.started_at, at(20), "given back now, not at t0");
            // Uncordoned with it: a later cordon is someone else's.
            assert!(!progress.cordoned_by_drover);
        }
        other => panic!("{other:?}"),
    }
    // What it came to replaces the "rolling back" said of it this pass...
    assert_eq!(
        d.message,
        "node a failed: rolled back to 1.13.2: health check failed: pods crash-looping"
    );
    // ...but not what another node's failure said first.
    // `0` comes before `a` in the pass's order of names.
    let mut x = moved("0", ProgressState::Failed, "health check failed: 0 broke");
    x.unschedulable = true;
    let d = decide(&p, &inputs, &[x, back_at_previous()], at(20));
    assert_eq!(d.message, "node 0 failed: health check failed: 0 broke");
}

#[test]
fn the_failed_nodes_blocker_is_its_own_skip_not_another_nodes() {
    // `a` failed its health check and was given back with its run stopped,
    // which is still there: its skip says `driver`, and so does the
    // cluster, whatever its message's prefix says. `b` is skipped for
    // another reason, which is not `a`'s.
    let p = policy(OnFailure::Halt, 2, 1);
    let mut a = moved(
        "a",
        ProgressState::Failed,
        "health check failed: pods crash-looping",
    );
    a.unschedulable = true;
    if let Ok(Some(r)) = a.progress.as_mut() {
        r.cordoned_by_drover = true;
    }
    a.upgrade = UpgradeStatus::Stopping;
    let mut b = model("b", false, false).view;
    b.unschedulable = true;
    let d = decide(&p, &open(), &[a, b], at(30));
    assert_eq!(d.state, RolloutState::Failed, "{}", d.message);
    let of = |n: &str| d.skipped.iter().find(|s| s.node == n).map(|s| s.blocker);
    assert_eq!(of("a"), Some(super::Blocker::Driver), "{:?}", d.skipped);
    assert_ne!(of("b"), Some(super::Blocker::Driver), "{:?}", d.skipped);
    assert_eq!(d.blocker, Some(super::Blocker::Driver));
}

#[test]
fn a_watched_node_left_by_a_new_pin_counts_while_notready() {
    // `a` was watched at 1.13.3 when 1.13.4 was pinned: its watch is
    // cleared, and NotReady it still fills the one place, so `b` waits.
    let mut p = policy(OnFailure::Halt, 1, 1);
    p.target = v("1.13.4");
    let mut a = moved("a", ProgressState::Watching, "");
    a.ready = false;
    let b = model("b", false, false).view;
    let d = decide(&p, &open(), &[a, b], at(10));
    assert!(
        matches!(d.actions.as_slice(), [Action::Clear { node, .. }] if node == "a"),
        "{:?}",
        d.actions
    );
    assert_eq!(d.unavailable, 1);
}

#[test]
fn a_watched_node_that_fails_in_service_leaves_the_budget() {
    // Under `halt` a node failing its watch is recorded failed and stays
    // in service, Ready: it no longer counts against max_unavailable.
    let p = policy(OnFailure::Halt, 1, 1);
    let a = moved("a", ProgressState::Watching, "");
    let inputs = Inputs {
        health: vec![health(&a, true, at(3))],
        ..open()
    };
    let d = decide(&p, &inputs, &[a], at(3));
    assert!(
        matches!(d.actions.as_slice(), [Action::Unhealthy { node, .. }] if node == "a"),
        "{:?}",
        d.actions
    );
    assert_eq!(d.unavailable, 0, "{d:?}");
}

#[test]
fn a_node_back_at_its_previous_version_is_rolled_back_only_once_healthy_there() {
    // Back and Ready at 1.13.2, its pod crash-looping there: not recorded
    // rolled back; past node_timeout, its rollback failed, naming why.
    // (The control, healthy there:
    // `a_node_rolled_back_is_recorded_failed_since_it_came_back`.)
    let p = policy(OnFailure::Rollback, 1, 1);
    let a = back_at_previous();
    // The model's node, bad at the version it is back at.
    let mut bad_there = model("a", true, false);
    bad_there.bad_at = Some(v("1.13.2"));
    let step = |now: DateTime<Utc>| {
        let inputs = Inputs {
            health: vec![health_of(&bad_there, now)],
            ..open()
        };
        decide(&p, &inputs, std::slice::from_ref(&a), now)
    };
    // Before node_timeout: neither rolled back nor failed; it waits,
    // counted.
    let d = step(at(20));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.unavailable, 1);
    let d = step(at(50));
    assert!(
        format!("{:?}", d.actions).contains("back at 1.13.2 but not healthy within node_timeout"),
        "{:?}",
        d.actions
    );
}

#[test]
fn a_node_that_ran_the_failed_version_before_is_not_rolled_back_to_it() {
    // Its record says it ran 1.13.3 before: "back" would be the version
    // that failed. The control ran 1.13.2 and is rolled back.
    let p = policy(OnFailure::Rollback, 1, 1);
    for (before, rolled) in [("1.13.2", true), ("1.13.3", false)] {
        let mut a = moved("a", ProgressState::Passed, "");
        a.ready = false;
        if let Ok(Some(r)) = a.progress.as_mut() {
            r.previous = Some(v(before));
        }
        let d = decide(&p, &open(), &[a], at(30));
        let said = format!("{:?}", d.actions);
        assert_eq!(said.contains("RollBack {"), rolled, "{said}");
        assert_eq!(
            said.contains("it ran this version before"),
            !rolled,
            "{said}"
        );
    }
}
