//! Leader election against a real kube-apiserver: exactly one of two
//! electors leads; when the leader stops (dropped, no release) the other
//! takes over within the lease duration; a released lease is taken at once;
//! a leader whose lease is taken from it steps down.

use crate::support::kube::{await_object, ControlPlane, TestNamespace};
use drover::agent::leader::{Elector, LeaseConfig};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const DURATION: Duration = Duration::from_secs(3);

struct Running {
    leader: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Elector>,
}

async fn start(client: &kube::Client, ns: &str, id: &str) -> Running {
    let mut el =
        Elector::new(client.clone(), LeaseConfig::new(ns, "drover", id, DURATION)).unwrap();
    let (tx, rx) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        el.run(tx, stop_rx).await;
        el
    });
    Running {
        leader: rx,
        stop,
        task,
    }
}

fn holder(l: &Lease) -> &str {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("")
}

fn renew_micros(l: &Lease) -> i64 {
    l.spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0.as_microsecond())
        .unwrap_or(0)
}

async fn until_leader(r: &mut Running, within: Duration) {
    tokio::time::timeout(within, r.leader.wait_for(|l| *l))
        .await
        .expect("did not become leader in time")
        .unwrap();
}

#[tokio::test]
async fn exactly_one_leads_and_the_other_takes_over_within_the_duration() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    let ns = TestNamespace::create(&client, "leader").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());

    let a = start(&client, ns.name(), "pod-a").await;
    let b = start(&client, ns.name(), "pod-b").await;
    let lease = await_object(&leases, "drover", "a holder", |l| !holder(l).is_empty()).await;
    let first = holder(&lease).to_string();
    let (mut leader, mut follower) = if first == "pod-a" { (a, b) } else { (b, a) };
    until_leader(&mut leader, Duration::from_secs(5)).await;

    // Across several renewals, the follower never leads.
    let mut last = renew_micros(&lease);
    for _ in 0..3 {
        let l = await_object(&leases, "drover", "a renewal", |l| renew_micros(l) > last).await;
        last = renew_micros(&l);
        assert_eq!(holder(&l), first);
        assert!(*leader.leader.borrow());
        assert!(!*follower.leader.borrow(), "two leaders at once");
    }
    let transitions_before = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0);

    // The leader stops without releasing: the other must wait for expiry, and no longer.
    leader.task.abort();
    let _ = leader.task.await;
    let stopped = tokio::time::Instant::now();
    until_leader(&mut follower, DURATION + Duration::from_secs(3)).await;
    let took = stopped.elapsed();
    // It cannot be earlier than the lease's remaining life, nor much later than the duration.
    assert!(
        took <= DURATION
            + LeaseConfig::new("", "", "", DURATION).retry_every
            + Duration::from_millis(500),
        "takeover took {took:?}"
    );
    let l = leases.get("drover").await.unwrap();
    assert_ne!(holder(&l), first);
    assert_eq!(
        l.spec.as_ref().and_then(|s| s.lease_transitions),
        Some(transitions_before + 1)
    );

    // Graceful stop: the new leader releases, and a fresh elector acquires at once.
    follower.stop.send(true).unwrap();
    let mut el = follower.task.await.unwrap();
    el.release().await.unwrap();
    let l = leases.get("drover").await.unwrap();
    assert_eq!(holder(&l), "");
    let t0 = tokio::time::Instant::now();
    let mut c = start(&client, ns.name(), "pod-c").await;
    until_leader(&mut c, Duration::from_secs(2)).await;
    assert!(
        t0.elapsed() < DURATION,
        "a released lease is taken without waiting for expiry"
    );
    c.stop.send(true).unwrap();
    let _ = c.task.await;
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_steps_down() {
    let cp = ControlPlane::get();
    let client = cp.admin_client().await;
    let ns = TestNamespace::create(&client, "leader-loss").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let mut a = start(&client, ns.name(), "pod-a").await;
    until_leader(&mut a, Duration::from_secs(5)).await;

    // Someone else takes the lease behind its back (as after a partition).
    let mut l = leases.get("drover").await.unwrap();
    let spec = l.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    spec.lease_duration_seconds = Some(3600);
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases
        .replace("drover", &PostParams::default(), &l)
        .await
        .unwrap();

    // At its next renewal (a third of the duration) it learns and steps down.
    tokio::time::timeout(DURATION, a.leader.wait_for(|l| !*l))
        .await
        .expect("the old leader kept leading")
        .unwrap();
    let l = leases.get("drover").await.unwrap();
    assert_eq!(holder(&l), "intruder");
    a.stop.send(true).unwrap();
    let mut el = a.task.await.unwrap();
    // Releasing a lease it does not hold changes nothing.
    el.release().await.unwrap();
    assert_eq!(holder(&leases.get("drover").await.unwrap()), "intruder");
}
