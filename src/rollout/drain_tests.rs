//! The decision's part of the drain rules: the pre-drain taint's lead
//! before the cordon, and a ladder's `skip` giving the node back blocked,
//! never stopping the rollout.

use super::decide::*;
use super::decide_tests::{open, policy, t, v};
use super::decision::*;
use crate::cluster::{Cluster, NodeProgress, NodeView, ProgressState, Stored};
use crate::config::{parse_env, OnDrainTimeout, RungKind};
use crate::record::{NodeRecord, RungUse};

fn rules(tables: &str) -> Vec<crate::config::DrainRule> {
    let text = format!("version = \"1.13.2\"\n{tables}");
    parse_env("environments/t.toml", "t", &text)
        .expect("valid rules")
        .drain
}

/// Node `a` draining toward 1.13.2 since 03:00, schedulable (`cordoned`
/// false) or not, its record holding `rungs` of attempt 1.
pub(super) fn draining(cordoned: bool, rungs: &[RungKind]) -> NodeView {
    let p = NodeProgress {
        state: ProgressState::Draining,
        target: v("1.13.2"),
        started_at: t("03:00"),
        cordoned_by_drover: true,
        message: String::new(),
        retries: 0,
        previous: None,
    };
    let mut record = NodeRecord::new("a", "id").start(p.clone());
    record.drain_rungs = rungs
        .iter()
        .map(|r| RungUse {
            rung: *r,
            rule: "db".into(),
            version: v("1.13.2"),
            attempt: record.attempt,
            detail: "what it did".into(),
        })
        .collect();
    NodeView {
        name: "a".into(),
        version: Some(v("1.12.0")),
        ready: true,
        unschedulable: cordoned,
        progress: Ok(Some(p)),
        pods_to_evict: 1,
        record: Some(Stored {
            record,
            resource_version: "1".into(),
            generation: 1,
            conditions: Vec::new(),
            requests: Default::default(),
        }),
        ..NodeView::default()
    }
}

fn kinds(d: &Decision) -> Vec<&'static str> {
    d.actions.iter().map(Action::kind).collect()
}

#[test]
fn a_node_is_cordoned_only_once_the_taints_lead_is_over() {
    let mut p = policy(1, OnDrainTimeout::Skip);
    p.drain = rules("[[drain]]\ntaint = \"10m\"\nladder = [\"evict\"]\n");
    // Within the lead: tainted (the taint was lost), not cordoned, woken at its end.
    let d = decide(&p, &open(), &[draining(false, &[])], t("03:05"));
    assert_eq!(kinds(&d), ["taint"]);
    assert_eq!(d.wake_at, Some(t("03:10")));
    let mut tainted = draining(false, &[]);
    tainted.drain_tainted = true;
    let d = decide(&p, &open(), &[tainted.clone()], t("03:05"));
    assert!(kinds(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(d.unavailable, 1, "the node holds its place while tainted");
    // Once it is over: cordoned.
    let d = decide(&p, &open(), &[tainted], t("03:10"));
    assert_eq!(kinds(&d), ["cordon_again"]);
    // Cordoned: the rungs count from the cordon.
    let d = decide(&p, &open(), &[draining(true, &[])], t("03:12"));
    let [Action::Evict { cordoned_at, .. }] = &d.actions[..] else {
        panic!("{:?}", d.actions)
    };
    assert_eq!(*cordoned_at, t("03:10"));
    // Without a taint rule, a schedulable draining node is cordoned at once.
    let d = decide(
        &policy(1, OnDrainTimeout::Skip),
        &open(),
        &[draining(false, &[])],
        t("03:05"),
    );
    assert_eq!(kinds(&d), ["cordon_again"]);
}

#[test]
fn a_ladders_skip_gives_the_node_back_blocked_and_never_stops_the_rollout() {
    // on_drain_timeout = "stop" stops at a timeout, not at a skip.
    let p = policy(1, OnDrainTimeout::Stop);
    let d = decide(
        &p,
        &open(),
        &[draining(true, &[RungKind::Skip])],
        t("03:05"),
    );
    let [Action::Block {
        progress, uncordon, ..
    }] = &d.actions[..]
    else {
        panic!("{:?}", d.actions)
    };
    assert!(uncordon);
    assert_eq!(progress.state, ProgressState::Blocked);
    assert!(
        progress
            .message
            .starts_with("skipped by drain rule db: what it did"),
        "{}",
        progress.message
    );
    assert!(
        d.wake_at.is_some(),
        "a skipped node is tried again after its backoff"
    );
    // A skip of an earlier attempt does not end this one's drain.
    let mut later = draining(true, &[RungKind::Skip]);
    if let Some(s) = later.record.as_mut() {
        s.record.attempt += 1;
    }
    let d = decide(&p, &open(), &[later], t("03:05"));
    assert_eq!(kinds(&d), ["evict"]);
    // Other rungs recorded change nothing of the decision.
    let d = decide(
        &p,
        &open(),
        &[draining(true, &[RungKind::Wait, RungKind::Restart])],
        t("03:05"),
    );
    assert_eq!(kinds(&d), ["evict"]);
}

#[test]
fn the_taint_is_a_drains_first_rung_only_on_a_node_that_can_still_be_scheduled() {
    // A node already cordoned when its drain starts is cordoned at once: a
    // taint ahead of a cordon that stands keeps nothing off it, and a rung
    // recorded as used would say what did not happen.
    let taint = rules("[[drain]]\nname = \"db\"\ntaint = \"10m\"\nladder = [\"evict\"]\n");
    let plain = rules("[[drain]]\nname = \"db\"\nladder = [\"evict\"]\n");
    let schedulable = draining(false, &[]);
    let cordoned = draining(true, &[]);
    let started = &schedulable.record.as_ref().expect("a record").record;
    let rungs = |rules: &[crate::config::DrainRule], view: Option<&NodeView>| {
        super::apply::taint_rung(rules, started, view)
            .map(|r| r.drain_rungs.iter().map(|u| u.rung).collect::<Vec<_>>())
    };
    assert_eq!(
        rungs(&taint, Some(&schedulable)),
        Some(vec![RungKind::Taint])
    );
    assert_eq!(rungs(&taint, None), Some(vec![RungKind::Taint]));
    assert_eq!(rungs(&taint, Some(&cordoned)), None);
    assert_eq!(rungs(&plain, Some(&schedulable)), None);
}

#[test]
fn the_step_that_taints_a_node_before_its_cordon_reports_the_taint_once() {
    // The taint is the drain's first rung: the step that sets it says so
    // (Events, the report), once, and a step within the lead says nothing.
    use super::{reconcile, VirtualClock};
    use crate::sim::{Sim, SimNode};
    use futures::executor::block_on;
    let sim = Sim::new("drain", VirtualClock::new(t("03:00")));
    sim.add_node(SimNode::new(
        "a",
        Some(v("1.12.0")),
        std::time::Duration::from_secs(300),
    ));
    let mut p = policy(1, OnDrainTimeout::Skip);
    p.drain = rules("[[drain]]\nname = \"db\"\ntaint = \"10m\"\nladder = [\"evict\"]\n");
    let out = block_on(reconcile(&sim, &p, &open(), t("03:00"))).unwrap();
    assert_eq!(kinds(&out.decision), ["cordon"]);
    let said: Vec<(&str, RungKind, &str)> = out
        .drain_rungs
        .iter()
        .map(|(n, r)| (n.as_str(), r.rung, r.rule.as_str()))
        .collect();
    assert_eq!(said, [("a", RungKind::Taint, "db")]);
    assert!(
        out.drain_rungs[0].1.detail.starts_with("tainted "),
        "{:?}",
        out.drain_rungs
    );
    let a = &block_on(sim.observe()).unwrap()[0];
    assert!(a.drain_tainted && !a.unschedulable, "{a:?}");
    let out = block_on(reconcile(&sim, &p, &open(), t("03:05"))).unwrap();
    assert!(out.drain_rungs.is_empty(), "{:?}", out.drain_rungs);
}

/// The in-memory cluster with one node, `a`, whose one pod a budget
/// holds until `until`.
fn one_pod_held_until(clock: &super::VirtualClock, until: &str) -> crate::sim::Sim {
    use crate::sim::{Pdb, Pod, Sim, SimNode};
    let sim = Sim::new("drain", clock.clone());
    sim.add_node(
        SimNode::new("a", Some(v("1.12.0")), std::time::Duration::from_secs(300)).with_pods(vec![
            Pod {
                name: "a-0".into(),
                pdb: Some("hold".into()),
            },
        ]),
    );
    sim.add_pdb(
        "hold",
        Pdb {
            min_available: 0,
            blocked_until: Some(t(until)),
        },
    );
    sim
}

#[test]
fn a_pass_that_leaves_pods_asks_for_another_soon_and_one_that_empties_the_node_does_not() {
    use super::{reconcile, Clock, VirtualClock};
    use futures::executor::block_on;
    let clock = VirtualClock::new(t("03:00"));
    let sim = one_pod_held_until(&clock, "03:10");
    let p = policy(1, OnDrainTimeout::Skip);
    let step = || block_on(reconcile(&sim, &p, &open(), clock.now())).unwrap();
    let out = step();
    assert_eq!(kinds(&out.decision), ["cordon"]);
    assert!(!out.retry_evictions);
    // The budget refuses the pod: the agent is asked to try again soon.
    let out = step();
    assert_eq!(kinds(&out.decision), ["evict"]);
    assert!(out.retry_evictions, "{out:?}");
    // Once it relents the pass empties the node: nothing left to retry.
    clock.set(t("03:10"));
    let out = step();
    assert_eq!(kinds(&out.decision), ["evict"]);
    assert!(!out.retry_evictions, "{out:?}");
}

/// The sim, its eviction passes using rung `.1` of a drain rule `db` (the
/// sim has no ladders: the Kubernetes backend's rungs are its own tests').
struct UsingRung<'a>(&'a crate::sim::Sim, RungKind);

impl Cluster for UsingRung<'_> {
    type Error = crate::sim::SimError;
    fn name(&self) -> &str {
        self.0.name()
    }
    async fn observe(&self) -> Result<Vec<NodeView>, Self::Error> {
        self.0.observe().await
    }
    async fn write_record(
        &self,
        w: &crate::cluster::RecordWrite,
    ) -> Result<crate::cluster::Stored, Self::Error> {
        self.0.write_record(w).await
    }
    async fn cordon(&self, node: &str) -> Result<crate::cluster::Cordoned, Self::Error> {
        self.0.cordon(node).await
    }
    async fn taint(&self, node: &str) -> Result<(), Self::Error> {
        self.0.taint(node).await
    }
    async fn uncordon(&self, node: &str) -> Result<(), Self::Error> {
        self.0.uncordon(node).await
    }
    async fn evict(
        &self,
        node: &str,
        order: &crate::cluster::DrainOrder<'_>,
    ) -> Result<crate::cluster::EvictionPass, Self::Error> {
        let mut pass = self.0.evict(node, order).await?;
        pass.rungs.push(crate::cluster::RungTaken {
            rung: self.1,
            rule: "db".into(),
            detail: format!("{:?} for pod apps/db-0", self.1),
        });
        Ok(pass)
    }
    async fn start_run(
        &self,
        node: &str,
        start: &crate::cluster::RunStart,
    ) -> Result<(), Self::Error> {
        self.0.start_run(node, start).await
    }
    async fn stop_run(&self, node: &str, run: &crate::cluster::RunLink) -> Result<(), Self::Error> {
        self.0.stop_run(node, run).await
    }
}

#[test]
fn a_rung_an_eviction_pass_used_is_recorded_and_reported_once() {
    use super::{reconcile, VirtualClock};
    use futures::executor::block_on;
    let sim = one_pod_held_until(&VirtualClock::new(t("03:00")), "04:00");
    let cluster = UsingRung(&sim, RungKind::Restart);
    let p = policy(1, OnDrainTimeout::Skip);
    let step = || block_on(reconcile(&cluster, &p, &open(), t("03:00"))).unwrap();
    assert_eq!(kinds(&step().decision), ["cordon"]);
    let out = step();
    assert_eq!(kinds(&out.decision), ["evict"]);
    // A restart leaves the pod to its budget: no reason to look again now.
    assert!(!out.again);
    let said: Vec<(&str, RungKind)> = out
        .drain_rungs
        .iter()
        .map(|(n, r)| (n.as_str(), r.rung))
        .collect();
    assert_eq!(said, [("a", RungKind::Restart)]);
    let record = sim.record("a").expect("a's record");
    assert!(
        record
            .drain_rungs
            .iter()
            .any(|u| u.rung == RungKind::Restart && u.rule == "db"),
        "{:?}",
        record.drain_rungs
    );
    // The next pass uses it again: recorded already, not said again.
    let out = step();
    assert_eq!(kinds(&out.decision), ["evict"]);
    assert!(out.drain_rungs.is_empty(), "{:?}", out.drain_rungs);
}

#[test]
fn a_node_given_back_at_its_drain_timeout_counts_while_notready() {
    // Given back blocked, it is no longer drover's to move, but a NotReady
    // node is out of service all the same: with max_unavailable = 1 no
    // other node starts beside it; once it is Ready one does.
    let p = policy(1, OnDrainTimeout::Skip);
    let mut a = draining(true, &[]);
    a.ready = false;
    let b = super::decide_tests::idle("b", "1.12.0");
    let timeout = chrono::Duration::from_std(p.drain_timeout).unwrap();
    let at = t("03:00") + timeout + chrono::Duration::minutes(1);
    let d = decide(&p, &open(), &[a.clone(), b.clone()], at);
    assert_eq!(kinds(&d), ["block"]);
    assert_eq!(d.unavailable, 1);
    a.ready = true;
    let d = decide(&p, &open(), &[a, b], at);
    assert_eq!(kinds(&d), ["block", "cordon"]);
    assert_eq!(d.unavailable, 1);
}

#[test]
fn a_pass_that_skips_pods_asks_for_the_next_step_at_once() {
    // A `skip` rung leaves pods on the node on purpose: the drain may be
    // over, and the next step (the run's start) need not wait for a wake.
    use super::{reconcile, VirtualClock};
    use futures::executor::block_on;
    let sim = one_pod_held_until(&VirtualClock::new(t("03:00")), "04:00");
    let cluster = UsingRung(&sim, RungKind::Skip);
    let p = policy(1, OnDrainTimeout::Skip);
    let step = || block_on(reconcile(&cluster, &p, &open(), t("03:00"))).unwrap();
    assert_eq!(kinds(&step().decision), ["cordon"]);
    let out = step();
    assert_eq!(kinds(&out.decision), ["evict"]);
    assert!(out.again, "{out:?}");
}
