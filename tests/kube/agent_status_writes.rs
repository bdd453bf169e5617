//! The status object's writes against the real API server: each carries
//! the `resourceVersion` it was computed on, so a write made on a stale
//! view is refused (409); the term's writer makes it again when only the
//! metadata moved (a follower's fetch request), never writes over a status
//! another replica wrote (it hands that back for the term to reload), and
//! writes nothing once its term has ended.

use std::time::Duration;

use crate::support::agent::install_crd;
use crate::support::kube::setup;
use drover::agent::crd::{DroverStatusSpec, DroverStatusStatus, StatusObject, StatusWriter};
use kube::ResourceExt;
use tokio::sync::watch;

fn status(state: &str, reporter: &str) -> DroverStatusStatus {
    DroverStatusStatus {
        state: Some(state.into()),
        reporter: Some(reporter.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn status_writes_are_preconditioned_and_never_overwrite_another_replicas_status() {
    let (client, ns) = setup("status-writes").await;
    install_crd(&client).await;
    let object = StatusObject::new(
        client.clone(),
        ns.name(),
        "test-test-1",
        DroverStatusSpec {
            environment: "test".into(),
            cluster: "test-1".into(),
        },
    );
    let stored = |o: &StatusObject| {
        let o = o.clone();
        async move { o.read().await.unwrap().unwrap().status.unwrap_or_default() }
    };

    // The precondition: a write on the version read lands, one on an older
    // version is refused.
    let first = object.load_or_create().await.unwrap();
    let v0 = first.resource_version().unwrap();
    object.write_at(&status("rolling", "a"), &v0).await.unwrap();
    let err = object
        .write_at(&status("failed", "a"), &v0)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(stored(&object).await, status("rolling", "a"));

    // The term's writer, from what it read.
    let (stop_tx, stop) = watch::channel(false);
    let read = object.read().await.unwrap().unwrap();
    let (writer, task) =
        StatusWriter::start(object.clone(), Some(&read), stop, Duration::from_secs(5));
    let within = Duration::from_secs(20);

    // Only the metadata moved (a follower asked for a fetch): written anyway.
    object.request_fetch().await.unwrap();
    assert!(writer.write(&status("settling", "a"), within).await);
    assert_eq!(stored(&object).await, status("settling", "a"));

    // Another replica wrote the status: not written over, handed back.
    let now = object.read().await.unwrap().unwrap();
    object
        .write_at(&status("failed", "b"), &now.resource_version().unwrap())
        .await
        .unwrap();
    assert!(!writer.write(&status("confirmed", "a"), within).await);
    assert_eq!(stored(&object).await, status("failed", "b"));
    let theirs = writer
        .take_superseded()
        .expect("the other replica's status");
    assert_eq!(theirs.status, Some(status("failed", "b")));
    // Once the term took it, its next status is written on the version it saw.
    assert!(writer.write(&status("failed", "a"), within).await);
    assert_eq!(stored(&object).await, status("failed", "a"));

    // The term ends: nothing more is written, not even what was offered.
    stop_tx.send(true).unwrap();
    writer.offer(&status("pending", "a"));
    assert!(!writer.write(&status("paused", "a"), within).await);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the writer stops with its term")
        .unwrap();
    assert_eq!(stored(&object).await, status("failed", "a"));
}
