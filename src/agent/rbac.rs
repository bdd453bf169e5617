//! The RBAC the agent needs: one table per scope (cluster, the upgrade Jobs'
//! namespace, the agent's own namespace), which `deploy/base/rbac.yaml` must
//! grant exactly (tests/offline/agent_manifests.rs checks).

/// One RBAC rule the agent needs: (API group, resource, verbs).
pub type Permission = (&'static str, &'static str, &'static [&'static str]);

/// Every permission the agent uses, cluster-wide; `deploy/base/rbac.yaml`'s
/// ClusterRole must grant exactly these (tests/offline/agent_manifests.rs checks).
pub const CLUSTER_PERMISSIONS: &[Permission] = &[
    // crate::kubernetes: observe nodes, cordon and uncordon; the one
    // migration removes earlier releases' annotations. The preflight before
    // a window (agent::preflight) lists nodes, pods and PDBs and gets the
    // pods' owners with the grants below.
    ("", "nodes", &["get", "list", "watch", "patch"]),
    // crate::kubernetes: pods on nodes being drained (field-selected lists
    // and watches). Deleting one is not here: DRAIN_DELETE_PERMISSIONS.
    ("", "pods", &["list", "watch"]),
    // crate::kubernetes: drains through the Eviction API.
    ("", "pods/eviction", &["create"]),
    ("policy", "poddisruptionbudgets", &["list", "watch"]),
    // kubernetes::drain: a drain rule's `restart` rung finds a pod's
    // Deployment (through its ReplicaSet) or StatefulSet and restarts it
    // as `kubectl rollout restart` does.
    ("apps", "replicasets", &["get"]),
    ("apps", "deployments", &["get", "patch"]),
    ("apps", "statefulsets", &["get", "patch"]),
    // events::Events: creates Events, and patches a repeated one into a series.
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// What a drain rule's `delete` rung needs beyond [`CLUSTER_PERMISSIONS`],
/// granted only by `deploy/components/drain-delete` (ClusterRole
/// `drover-drain-delete`): the base lets the agent remove a pod through the
/// Eviction API alone, which PodDisruptionBudgets govern, so its token
/// cannot take a workload below its budget unless a person chose this.
pub const DRAIN_DELETE_PERMISSIONS: &[Permission] = &[("", "pods", &["delete"])];

/// Every permission the agent uses in the namespace of its upgrade Jobs
/// (`drover-upgrades` in `deploy/base`, Role `drover-upgrades`): kept apart
/// from the agent's own namespace so that only that namespace admits the
/// pods an OS driver needs.
pub const JOB_NAMESPACE_PERMISSIONS: &[Permission] = &[
    // crate::kubernetes: the OS driver's Jobs; one is deleted only when its
    // run must stop (a timeout, a new pin while it prepares); finished ones
    // are left to their ttlSecondsAfterFinished.
    (
        "batch",
        "jobs",
        &["create", "get", "list", "watch", "delete"],
    ),
];

/// Every permission the agent uses in its own namespace (the Role `drover` in `deploy/base/rbac.yaml`).
pub const NAMESPACE_PERMISSIONS: &[Permission] = &[
    // leader::Elector: get, create once, conditional replace (update).
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    ),
    // crd::StatusObject: get, create once, merge-patch the status subresource;
    // a follower patches an annotation that the leader watches (webhook relay).
    (
        "drover.dev",
        "droverstatuses",
        &["get", "list", "watch", "create", "patch"],
    ),
    ("drover.dev", "droverstatuses/status", &["patch"]),
    // crate::kubernetes::record: each node's record, created once, then
    // written whole (merge patch) at each transition; read through a watch.
    // Only this ServiceAccount may write them (the admission policy of
    // deploy/base/admission-policy.yaml refuses everyone else but a
    // person's retry and clear-rolled-back annotations).
    (
        "drover.dev",
        "drovernodes",
        &["get", "list", "watch", "create", "patch"],
    ),
];
