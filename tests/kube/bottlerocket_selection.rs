//! Which nodes the Bottlerocket driver takes: of a pool that mixes
//! Bottlerocket and another OS under one label, only the nodes whose
//! `osImage` says Bottlerocket (`[nodes] os_image_regex`), unless told
//! otherwise.

use std::time::Duration;

use drover::cluster::Cluster;
use drover::kubernetes::KubeCluster;
use drover::rollout::RolloutState;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::ResourceExt;

use crate::support::backend::*;
use crate::support::kube::*;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_bottlerocket_driver_leaves_a_node_of_another_os_alone_unless_told_otherwise() {
    let (client, ns) = setup("os-image").await;
    let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
    let mut other = pool_options(ns.name(), 1);
    other.name_prefix = format!("{}-ubuntu-", ns.name());
    other.os_image = "Ubuntu 22.04.5 LTS".into();
    other.pdb_controller = false;
    let ubuntu_sim = start_sim(&client, other).await;
    let (bottlerocket, ubuntu) = (
        sim.node_names()[0].clone(),
        ubuntu_sim.node_names()[0].clone(),
    );

    // Control first: told to take every node, the driver sees both.
    let mut every = kube_options(ns.name());
    every.nodes.os_image_regex = None;
    let all = KubeCluster::new(admin_config().await, every).await.unwrap();
    let mut seen: Vec<String> = all
        .observe()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect();
    seen.sort();
    assert_eq!(seen, [bottlerocket.clone(), ubuntu.clone()]);
    drop(all);

    // The default: only the Bottlerocket node is counted and upgraded.
    let cluster = cluster(ns.name()).await;
    let names: Vec<String> = cluster
        .observe()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, std::slice::from_ref(&bottlerocket));
    let engine = engine(policy("1.13.0", 1, MINUTE, MINUTE));
    let out = drive(&engine, &cluster, &open_window(), 2 * MINUTE, |o| {
        o.decision.state == RolloutState::Confirmed
    })
    .await;
    assert_eq!(out.decision.nodes_at_version, 1);
    assert_eq!(sim.upgrades_started(&bottlerocket), 1);
    assert_eq!(ubuntu_sim.upgrades_started(&ubuntu), 0);
    let node: Node = Api::all(client.clone()).get(&ubuntu).await.unwrap();
    assert!(
        !node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        "never cordoned"
    );
    assert!(no_drover_annotations(&node), "{:?}", node.annotations());
    sim.shutdown().await;
    ubuntu_sim.shutdown().await;
}
