//! Which nodes the Bottlerocket driver takes: of a pool that mixes
//! Bottlerocket and another OS under one label, only the nodes whose
//! `osImage` says Bottlerocket (`[nodes] os_image_regex`), unless told
//! otherwise; nodes the Bottlerocket update operator manages; and a driver
//! with no image.

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

/// Nodes the Bottlerocket update operator manages (its label) are left
/// alone by default, named with the reason; `[nodes] brupop = "take"`
/// drives them. Two updaters on one node's update API would undo each
/// other's version lock and reboot it behind each other's drain.
#[tokio::test]
async fn a_node_the_bottlerocket_update_operator_manages_is_skipped_unless_taken() {
    for take in [false, true] {
        let (client, ns) = setup(if take { "brupop-take" } else { "brupop-skip" }).await;
        let sim = start_sim(&client, pool_options(ns.name(), 1)).await;
        let mut labelled = pool_options(ns.name(), 1);
        labelled.name_prefix = format!("{}-brupop-", ns.name());
        labelled.pdb_controller = false;
        labelled
            .labels
            .insert(drover::config::BRUPOP_LABEL.into(), "2.0.0".into());
        let brupop_sim = start_sim(&client, labelled).await;
        let (plain, managed) = (
            sim.node_names()[0].clone(),
            brupop_sim.node_names()[0].clone(),
        );

        let mut opts = kube_options(ns.name());
        opts.nodes.skip_brupop = !take;
        let cluster = KubeCluster::new(admin_config().await, opts).await.unwrap();
        let engine = engine(policy("1.13.0", 2, MINUTE, MINUTE));
        // Until the rollout settles: a node at the target whose run the
        // record still names as running is in flight, with no action.
        let out = drive(&engine, &cluster, &open_window(), 2 * MINUTE, |o| {
            o.decision.nodes_at_version == if take { 2 } else { 1 }
                && o.decision.actions.is_empty()
                && o.decision.state != RolloutState::Rolling
        })
        .await;
        if take {
            assert_eq!(out.decision.state, RolloutState::Confirmed);
            assert_eq!(brupop_sim.upgrades_started(&managed), 1);
        } else {
            assert_eq!(sim.upgrades_started(&plain), 1);
            assert_eq!(brupop_sim.upgrades_started(&managed), 0);
            assert_eq!(out.decision.state, RolloutState::Blocked);
            let skipped = &out.decision.skipped;
            assert_eq!(skipped.len(), 1, "{skipped:?}");
            assert_eq!(skipped[0].node, managed);
            assert!(
                skipped[0].reason.contains(
                    "managed by the Bottlerocket update operator (label bottlerocket.aws/updater-interface-version=2.0.0)"
                ) && skipped[0].reason.contains("[nodes] brupop = \"take\""),
                "{}",
                skipped[0].reason
            );
            let node: Node = Api::all(client.clone()).get(&managed).await.unwrap();
            assert!(no_drover_annotations(&node), "{:?}", node.annotations());
        }
        sim.shutdown().await;
        brupop_sim.shutdown().await;
    }
}

/// The agent's cluster view for a Bottlerocket driver without an image (a
/// build that is not a release, no `[driver] image`) is refused before it
/// watches anything, naming the setting: no node is cordoned for Jobs that
/// could not be created. Control: with an image, the view starts.
#[tokio::test]
async fn the_agents_view_refuses_a_bottlerocket_driver_without_an_image() {
    let (_client, ns) = setup("no-image").await;
    let mut opts = kube_options(ns.name());
    opts.driver = drover::config::DriverSpec::Bottlerocket { image: None };
    let err = KubeCluster::with_write_timeout(admin_config().await, opts.clone(), MINUTE)
        .await
        .expect_err("no image, no view");
    let text = err.to_string();
    assert!(
        text.contains("[driver] image = \"REPOSITORY@sha256:<digest>\""),
        "{text}"
    );
    opts.driver = drover::config::DriverSpec::Bottlerocket {
        image: Some(drover::config::TEST_UPDATER_IMAGE.into()),
    };
    KubeCluster::with_write_timeout(admin_config().await, opts, MINUTE)
        .await
        .expect("with an image, the view starts");
}
