//! The records of earlier releases, taken over once (docs/design.md, "The
//! node record"): an agent that finds no marker of a finished migration in
//! its `DroverStatus` (`status.nodeRecords`) turns the annotation records
//! it finds on the selected nodes into node records
//! (`record::legacy::migrate`: only as far as drover's Jobs corroborate
//! them, or as far as the result cannot choose a version), removes those
//! annotations, then sets the marker, before the engine acts at all.
//! Afterwards any such annotation on a Node is named once (a Warning Event
//! and a log line) and never read.

use super::crd::DroverStatusStatus;
use super::events::Severity;
use super::guard::Guarded;
use super::{Acting, Active, ClusterBackend};
use crate::cluster::{Cluster, NodeView, RecordWrite, Requests};
use crate::record::legacy;
use tokio::sync::watch;

/// `status.nodeRecords` once the records are `DroverNode` objects and the
/// annotations of earlier releases were migrated.
pub const RECORDS_MARKER: &str = "DroverNode";

/// The most (node, annotation) pairs named so far that are remembered:
/// beyond, the set starts again (a name said twice, never a memory that
/// grows with a forger's writes).
const MAX_NAMED: usize = 4096;

impl<B: ClusterBackend> Acting<B> {
    /// Whether node records are in `DroverNode` objects: migrated now if
    /// they are not yet. False while that could not be done (the engine
    /// waits; the next pass tries again).
    pub(super) async fn records_ready(
        &mut self,
        active: &Active,
        cancel: &watch::Receiver<bool>,
    ) -> bool {
        if self.told.status().node_records.as_deref() == Some(RECORDS_MARKER) {
            return true;
        }
        let Some((_, conn)) = self.cluster.connected.as_ref() else {
            return false;
        };
        let guarded = Guarded::new(&conn.cluster, cancel);
        let (found, views) = match futures::try_join!(guarded.legacy(), guarded.observe()) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the records of earlier releases");
                return false;
            }
        };
        let now = self.clock.now();
        let mut left = Vec::new();
        for n in &found {
            let recorded = views.iter().any(|v| v.name == n.node && v.record.is_some());
            if !recorded {
                let id = format!("{:016x}", crate::replay::random_u64());
                let m = legacy::migrate(n, &id, &active.env.version, now);
                if let Some(record) = m.record {
                    let write = RecordWrite {
                        record,
                        base: None,
                        consume: Requests::default(),
                        at: now,
                    };
                    if let Err(e) = guarded.write_record(&write).await {
                        tracing::warn!(node = %n.node, error = %e, "cannot write the migrated record");
                        return false;
                    }
                }
                if let Some(why) = m.left {
                    left.push((n.node.clone(), why));
                }
            }
            if let Err(e) = guarded.clear_legacy(&n.node).await {
                tracing::warn!(node = %n.node, error = %e, "cannot remove the annotations of an earlier release");
                return false;
            }
            tracing::info!(node = %n.node, "record of an earlier release migrated");
        }
        drop(guarded);
        for (node, why) in left {
            tracing::warn!(node = %node, why = %why, "record of an earlier release not migrated");
            self.edges
                .events
                .on_node(
                    &node,
                    Severity::Warning,
                    "RecordNotMigrated",
                    "Migrate",
                    format!("{why}; drover leaves the node as it is"),
                )
                .await;
        }
        let next = DroverStatusStatus {
            node_records: Some(RECORDS_MARKER.into()),
            ..self.told.status().clone()
        };
        if !self.write_durably(next).await {
            return false;
        }
        tracing::info!(nodes = found.len(), "node records are DroverNode objects");
        true
    }

    /// Name, once each, the annotations of earlier releases found on the
    /// observed Nodes (a log line each, one Warning Event per node for
    /// those newly found): they are not records, nothing reads them.
    pub(super) async fn report_ignored(&mut self, observed: &[NodeView]) {
        if self.told.status().node_records.as_deref() != Some(RECORDS_MARKER) {
            return;
        }
        for n in observed {
            let mut new = Vec::new();
            for found in &n.ignored {
                let key = found.split('=').next().unwrap_or(found);
                if self.told.first_naming(&n.name, key) {
                    tracing::warn!(node = %n.name, annotation = %found, "annotation on the node ignored");
                    new.push(found.as_str());
                }
            }
            if new.is_empty() {
                continue;
            }
            let mut note = format!(
                "{} on the Node {} ignored: drover's record of a node is its DroverNode, which \
                 only drover writes; a Node's annotations choose nothing",
                new.join(", "),
                if new.len() == 1 { "is" } else { "are" }
            );
            if new
                .iter()
                .any(|f| f.starts_with(&format!("{}=", legacy::ANN_RETRY)))
            {
                note.push_str(&format!(
                    "; a retry is asked on the node's record: kubectl annotate drovernode -n {} \
                     {} drover.dev/retry=now",
                    self.cfg.namespace, n.name
                ));
            }
            self.edges
                .events
                .on_node(
                    &n.name,
                    Severity::Warning,
                    "AnnotationIgnored",
                    "Observe",
                    note,
                )
                .await;
        }
        self.told.bound_named(MAX_NAMED);
    }
}
