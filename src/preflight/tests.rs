use super::*;
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodStatus, Volume};
use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

fn pod(ns: &str, name: &str, node: &str, owner: Option<(&str, &str)>, app: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            labels: Some([("app".to_string(), app.to_string())].into()),
            owner_references: owner.map(|(kind, name)| {
                vec![OwnerReference {
                    kind: kind.into(),
                    name: name.into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

fn pdb(
    ns: &str,
    app: &str,
    min: Option<i32>,
    max: Option<i32>,
    expected: i32,
    allowed: i32,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(format!("{app}-pdb")),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            }),
            min_available: min.map(IntOrString::Int),
            max_unavailable: max.map(IntOrString::Int),
            ..Default::default()
        }),
        status: Some(PodDisruptionBudgetStatus {
            expected_pods: Some(expected),
            disruptions_allowed: Some(allowed),
            ..Default::default()
        }),
    }
}

fn snap(pods: Vec<Pod>, pdbs: Vec<PodDisruptionBudget>) -> Snapshot {
    Snapshot {
        nodes: ["n1".to_string(), "n2".to_string()].into(),
        pods,
        pdbs,
        ..Default::default()
    }
}

fn kinds(f: &[Finding]) -> Vec<(Kind, String)> {
    f.iter().map(|f| (f.kind, f.object.clone())).collect()
}

#[test]
fn a_healthy_workload_finds_nothing() {
    let mut s = snap(
        vec![
            pod("a", "web-1", "n1", Some(("ReplicaSet", "web-x")), "web"),
            pod("a", "web-2", "n2", Some(("ReplicaSet", "web-x")), "web"),
            pod("a", "agent", "n1", Some(("DaemonSet", "agent")), "agent"),
        ],
        vec![pdb("a", "web", Some(1), None, 2, 1)],
    );
    let web = Owner {
        kind: "Deployment".into(),
        namespace: "a".into(),
        name: "web".into(),
    };
    s.workloads.insert("a/web-1".into(), web.clone());
    s.workloads.insert("a/web-2".into(), web.clone());
    s.replicas.insert(web, 2);
    assert_eq!(findings(&s), vec![]);
}

#[test]
fn each_kind_is_found_where_it_is_and_only_there() {
    let mut bare = pod("a", "bare", "n1", None, "bare");
    let mut cache = pod(
        "a",
        "cache-1",
        "n2",
        Some(("ReplicaSet", "cache-x")),
        "cache",
    );
    cache.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "scratch".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }]);
    // A static pod and a finished one are not drained: no finding.
    bare.metadata.labels = None;
    let mut mirror = pod("a", "etcd-n1", "n1", None, "etcd");
    mirror.metadata.annotations =
        Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
    let mut done = pod("a", "job-1", "n1", None, "job");
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    // A pod on a node the environment does not select: no finding.
    let elsewhere = pod("a", "other", "n9", None, "db");
    let mut s = snap(
        vec![
            bare,
            cache,
            mirror,
            done,
            elsewhere,
            pod("a", "db-0", "n1", Some(("StatefulSet", "db")), "db"),
            pod("a", "q-1", "n2", Some(("ReplicaSet", "q-x")), "q"),
        ],
        vec![
            pdb("a", "db", Some(1), None, 1, 0),
            pdb("a", "q", None, Some(1), 2, 0),
            pdb("a", "nothing-here", Some(1), None, 1, 0),
        ],
    );
    let db = Owner {
        kind: "StatefulSet".into(),
        namespace: "a".into(),
        name: "db".into(),
    };
    s.workloads.insert("a/db-0".into(), db.clone());
    s.replicas.insert(db, 1);
    assert_eq!(
        kinds(&findings(&s)),
        vec![
            (Kind::PdbNeverAllows, "a/db-pdb".into()),
            (Kind::PdbAllowsNoneNow, "a/q-pdb".into()),
            (Kind::SingleReplica, "a/db".into()),
            (Kind::NoController, "a/bare".into()),
            (Kind::LocalStorage, "a/cache-1".into()),
        ]
    );
}

#[test]
fn percentages_and_max_unavailable_zero_never_allow() {
    let mut p = pdb("a", "db", None, None, 4, 0);
    p.spec.as_mut().unwrap().min_available = Some(IntOrString::String("100%".into()));
    assert!(never_allows(&p).is_some());
    p.spec.as_mut().unwrap().min_available = Some(IntOrString::String("75%".into()));
    assert!(never_allows(&p).is_none());
    let zero = pdb("a", "db", None, Some(0), 4, 0);
    assert_eq!(never_allows(&zero).as_deref(), Some("maxUnavailable is 0"));
}
