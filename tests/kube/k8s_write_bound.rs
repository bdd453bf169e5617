//! The agent backend's write bound (`kubernetes::client`) against the real
//! API server: a write on a path to the API server that stalls (accepts
//! and answers nothing) is given up within its bound, so it cannot land
//! long after the decision that made it, and with it the caller is free
//! again; control: the same backend's writes land while the path forwards.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chrono::Utc;
use drover::cluster::{Cluster, NodeProgress, ProgressState, RecordWrite};
use drover::kubernetes::KubeCluster;
use drover::rollout::Action;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use semver::Version;

use crate::support::backend::{
    act, admin_config, install_record_crd, kube_options, pool_options, start_sim,
};
use crate::support::kube::{retry_until, setup, unschedulable};
use crate::support::proxy::{Mode, TcpProxy};

const BOUND: Duration = Duration::from_millis(700);

fn draining() -> NodeProgress {
    NodeProgress {
        state: ProgressState::Draining,
        target: Version::new(1, 13, 0),
        started_at: Utc::now(),
        cordoned_by_drover: true,
        message: String::new(),
        retries: 0,
        previous: None,
    }
}

#[tokio::test]
async fn a_write_on_a_stalled_path_is_given_up_within_its_bound() {
    let (client, ns) = setup("write-bound").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let node = sim.node_names()[0].clone();
    let mut config = admin_config().await;
    let upstream: SocketAddr = format!(
        "{}:{}",
        config.cluster_url.host().unwrap(),
        config.cluster_url.port_u16().unwrap()
    )
    .parse()
    .unwrap();
    install_record_crd(&client).await;
    let path = TcpProxy::start(upstream).await;
    config.cluster_url = format!("https://{}", path.addr).parse().unwrap();
    let cluster = KubeCluster::with_write_timeout(config, kube_options(ns.name()), BOUND)
        .await
        .unwrap();

    // Control: while the path forwards, the write lands. The first write
    // also opens the connection (TCP and TLS through the path), which on a
    // loaded machine can itself outlast the bound: a given-up attempt is
    // tried again, the write must land.
    let cordon = Action::Cordon {
        node: node.clone(),
        progress: draining(),
    };
    retry_until(
        "the record and the cordon through the forwarding path",
        || act(&cluster, &cordon),
    )
    .await;

    // The path stalls: the next writes, of the node and of its record, are
    // given up at their bound.
    path.set(Mode::Stall);
    let t0 = Instant::now();
    let err = cluster.uncordon(&node).await.unwrap_err();
    let took = t0.elapsed();
    assert!(err.to_string().contains("no answer within"), "{err}");
    assert!(
        took >= BOUND && took < BOUND + Duration::from_secs(2),
        "given up after {took:?}"
    );
    let stored = cluster.observe().await.unwrap().remove(0).record.unwrap();
    let write = RecordWrite {
        record: stored.record.with_progress(None),
        base: Some(stored),
        consume: Default::default(),
        at: Utc::now(),
    };
    let t0 = Instant::now();
    let err = cluster.write_record(&write).await.unwrap_err();
    let took = t0.elapsed();
    assert!(err.to_string().contains("no answer within"), "{err}");
    assert!(
        took < BOUND + Duration::from_secs(2),
        "given up after {took:?}"
    );
    // What the stall held is lost with the path (a partition's packets):
    // the node keeps drover's record, as the next leader will find it.
    path.set(Mode::Refuse);
    path.set(Mode::Up);
    let n = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert!(unschedulable(&n), "the given-up write landed anyway");
    sim.shutdown().await;
}
