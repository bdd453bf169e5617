//! The part of a Node that drover reads, decoded straight from the API
//! server's JSON: name, uid, resourceVersion, `spec.unschedulable`, the
//! Ready condition, `nodeInfo.osImage`, the Bottlerocket update operator's
//! label ([`BRUPOP_LABEL`]: a node it manages is left alone), the consent
//! label ([`CONSENT_LABEL`]: a node its workload holds is not started), and the
//! annotations earlier releases kept their records in (`record::legacy`:
//! migrated once, then named and ignored).
//!
//! The decoder skips everything else (images, capacity, addresses, other
//! controllers' annotations, managedFields) without allocating it. Decoding
//! full `k8s_openapi` Nodes and trimming them afterwards kept the trimmed
//! parts scattered across pages the rest had occupied, and the agent's memory
//! grew by ~7 KiB per node; decoding only this keeps it near 1 KiB.
//!
//! Nodes are only written with merge patches built from these fields, never
//! replaced, so nothing skipped here can be lost.

use crate::config::{BRUPOP_LABEL, CONSENT_LABEL};
use crate::record::legacy::ALL_ANNOTATIONS;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A Node as drover observes it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Wire")]
pub struct ObservedNode {
    /// Name, uid, resourceVersion and earlier releases' drover annotations only.
    pub metadata: ObjectMeta,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Whether the Ready condition is True.
    pub ready: bool,
    /// `status.nodeInfo.osImage` ("" when unset).
    pub os_image: String,
    /// The value of [`BRUPOP_LABEL`], when the node carries it.
    pub brupop: Option<String>,
    /// The value of [`CONSENT_LABEL`], when the node carries it.
    pub consent: Option<String>,
    /// `spec.taints` as written: the pre-drain taint is added to and
    /// removed from this list whole, with the others kept as they are.
    pub taints: Vec<serde_json::Value>,
}

impl ObservedNode {
    /// Whether the node carries drover's pre-drain taint
    /// ([`crate::config::DRAIN_TAINT`]).
    pub fn drain_tainted(&self) -> bool {
        self.taints.iter().any(is_drain_taint)
    }
}

/// Whether `t` is drover's pre-drain taint.
pub fn is_drain_taint(t: &serde_json::Value) -> bool {
    t.get("key").and_then(|k| k.as_str()) == Some(crate::config::DRAIN_TAINT)
}

impl kube::Resource for ObservedNode {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Node".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "nodes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: MetaWire,
    spec: Option<SpecWire>,
    status: Option<StatusWire>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaWire {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    #[serde(default, deserialize_with = "drover_annotations")]
    annotations: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "kept_labels")]
    labels: KeptLabels,
}

#[derive(Deserialize)]
struct SpecWire {
    unschedulable: Option<bool>,
    #[serde(default)]
    taints: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusWire {
    conditions: Option<Vec<ConditionWire>>,
    node_info: Option<NodeInfoWire>,
}

#[derive(Deserialize)]
struct ConditionWire {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeInfoWire {
    #[serde(default)]
    os_image: String,
}

impl From<Wire> for ObservedNode {
    fn from(w: Wire) -> Self {
        let status = w.status;
        let ready = status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        ObservedNode {
            metadata: ObjectMeta {
                name: w.metadata.name,
                uid: w.metadata.uid,
                resource_version: w.metadata.resource_version,
                annotations: (!w.metadata.annotations.is_empty()).then_some(w.metadata.annotations),
                ..Default::default()
            },
            unschedulable: w
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            taints: w.spec.and_then(|s| s.taints).unwrap_or_default(),
            ready,
            os_image: status
                .and_then(|s| s.node_info)
                .map(|i| i.os_image)
                .unwrap_or_default(),
            brupop: w.metadata.labels.brupop,
            consent: w.metadata.labels.consent,
        }
    }
}

// Keep drover's annotations; skip the values of all others undecoded.
fn drover_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    struct Keep;
    impl<'de> Visitor<'de> for Keep {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of annotations")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kept = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if ALL_ANNOTATIONS.contains(&key.as_str()) {
                    kept.insert(key, map.next_value()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(kept)
        }
    }
    d.deserialize_any(Keep)
}

/// The labels drover reads: the Bottlerocket update operator's and consent's.
#[derive(Default)]
struct KeptLabels {
    brupop: Option<String>,
    consent: Option<String>,
}

// Keep the values of the labels drover reads; skip the others.
fn kept_labels<'de, D: Deserializer<'de>>(d: D) -> Result<KeptLabels, D::Error> {
    struct Keep;
    impl<'de> Visitor<'de> for Keep {
        type Value = KeptLabels;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of labels")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(KeptLabels::default())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kept = KeptLabels::default();
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key == BRUPOP_LABEL {
                    kept.brupop = Some(map.next_value()?);
                } else if key == CONSENT_LABEL {
                    kept.consent = Some(map.next_value()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(kept)
        }
    }
    d.deserialize_any(Keep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use kube::ResourceExt;
    use serde_json::json;

    fn full_node() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "n1", "uid": "u-1", "resourceVersion": "42",
                "labels": { "kubernetes.io/hostname": "n1", "pool": "a" },
                "annotations": {
                    "drover.dev/state": "draining",
                    "drover.dev/target": "1.13.0",
                    "node.alpha.kubernetes.io/ttl": "0",
                    "csi.volume.kubernetes.io/nodeid": "{\"ebs.csi.aws.com\":\"i-0\"}",
                },
                "managedFields": [{ "manager": "kubelet", "operation": "Update",
                                    "fieldsV1": { "f:status": { "f:conditions": {} } } }],
            },
            "spec": { "unschedulable": true, "podCIDR": "10.0.0.0/24",
                      "taints": [{ "key": "k", "effect": "NoSchedule" }] },
            "status": {
                "conditions": [
                    { "type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory" },
                    { "type": "Ready", "status": "True", "reason": "KubeletReady",
                      "message": "kubelet is posting ready status" },
                ],
                "nodeInfo": { "osImage": "Bottlerocket OS 1.12.0 (aws-k8s-1.36)",
                    "kubeletVersion": "v1.36.3", "machineID": "m", "systemUUID": "s", "bootID": "b",
                    "kernelVersion": "6.1", "containerRuntimeVersion": "containerd://2.0",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64" },
                "capacity": { "cpu": "2", "memory": "8035444Ki" },
                "addresses": [{ "type": "InternalIP", "address": "10.0.0.1" }],
                "images": [{ "names": ["registry/image:tag"], "sizeBytes": 1 }],
            },
        })
    }

    #[test]
    fn decodes_exactly_what_drover_reads() {
        let full = full_node();
        let n: ObservedNode = serde_json::from_value(full.clone()).unwrap();
        // The typed Node agrees on every field kept.
        let typed: Node = serde_json::from_value(full).unwrap();
        assert_eq!(n.name_any(), typed.name_any());
        assert_eq!(n.uid(), typed.uid());
        assert_eq!(n.resource_version(), typed.resource_version());
        assert!(n.ready && n.unschedulable);
        assert_eq!(n.os_image, "Bottlerocket OS 1.12.0 (aws-k8s-1.36)");
        let kept: Vec<&String> = n.annotations().keys().collect();
        assert_eq!(kept, ["drover.dev/state", "drover.dev/target"]);
        assert!(n.labels().is_empty() && n.managed_fields().is_empty());
        assert_eq!(n.brupop, None);
        let mut managed = full_node();
        managed["metadata"]["labels"][BRUPOP_LABEL] = json!("2.0.0");
        let n: ObservedNode = serde_json::from_value(managed).unwrap();
        assert_eq!(n.brupop.as_deref(), Some("2.0.0"));
    }

    #[test]
    fn a_not_ready_or_bare_node_decodes_as_not_ready() {
        let mut v = full_node();
        v["status"]["conditions"][1]["status"] = json!("Unknown");
        let n: ObservedNode = serde_json::from_value(v).unwrap();
        assert!(!n.ready);
        let bare: ObservedNode =
            serde_json::from_value(json!({ "metadata": { "name": "b", "annotations": null } }))
                .unwrap();
        assert_eq!(bare.name_any(), "b");
        assert!(!bare.ready && !bare.unschedulable && bare.os_image.is_empty());
        assert!(bare.metadata.annotations.is_none());
    }

    #[test]
    fn is_served_at_the_node_urls() {
        use kube::Resource;
        assert_eq!(ObservedNode::url_path(&(), None), "/api/v1/nodes");
        assert_eq!(ObservedNode::api_version(&()), "v1");
    }
}
