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

/// `name`, a `kind` of `replicas` in namespace `a`, owns the pods `pods`.
fn workload(s: &mut Snapshot, kind: &str, name: &str, replicas: i32, pods: &[&str]) {
    let owner = Owner {
        kind: kind.into(),
        namespace: "a".into(),
        name: name.into(),
    };
    for p in pods {
        s.workloads.insert(format!("a/{p}"), owner.clone());
    }
    s.replicas.insert(owner, replicas);
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
    workload(&mut s, "Deployment", "web", 2, &["web-1", "web-2"]);
    assert_eq!(findings(&s, &Policy::default()), vec![]);
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
    workload(&mut s, "StatefulSet", "db", 1, &["db-0"]);
    assert_eq!(
        kinds(&findings(&s, &Policy::default())),
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

/// The policy of an environment file with `drain` (TOML), drain_timeout 1h.
fn policy(drain: &str) -> Policy {
    let text = format!(
        "version = \"1.2.3\"\n[rollout]\ndrain_timeout = \"1h\"\nnode_timeout = \"2h\"\n\
         node_selector = \"pool=a\"\n{drain}"
    );
    let env = crate::config::parse_env("environments/prod.toml", "prod", &text).expect("valid");
    Policy::of(&env)
}

#[test]
fn nodes_held_by_consent_are_listed_one_finding_each() {
    let mut s = snap(vec![], vec![]);
    s.nodes.insert("n3".into());
    s.consent = [
        ("n1", CONSENT_PAUSED),
        ("n2", "go"),
        ("n3", CONSENT_PAUSED),
        // Not selected: not drover's to start, not listed.
        ("n9", CONSENT_PAUSED),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    let found = findings(&s, &Policy::default());
    assert_eq!(
        kinds(&found),
        vec![
            (Kind::ConsentHeld, "n1".into()),
            (Kind::ConsentHeld, "n3".into())
        ]
    );
    assert_eq!(found[0].nodes, vec!["n1".to_string()]);
    assert!(
        found[0].why.contains("drover.dev/upgrade=paused"),
        "{}",
        found[0].why
    );
    assert!(
        found[0]
            .fix
            .contains("kubectl label node n1 drover.dev/upgrade-"),
        "{}",
        found[0].fix
    );
    // Listed, counted, but no drain waits on it.
    assert!(!Kind::ConsentHeld.blocks());
    assert!(Kind::ALL.contains(&Kind::ConsentHeld));
}

#[test]
fn a_singleton_its_drain_rule_restarts_is_not_flagged_and_others_still_are() {
    let fixture = || {
        let mut s = snap(
            vec![
                // Moved by the restart rung: neither it nor its PDB blocks.
                pod("a", "solo-0", "n1", Some(("ReplicaSet", "solo-x")), "solo"),
                // Its first rule only evicts (a later one would restart).
                pod(
                    "a",
                    "pinned-0",
                    "n2",
                    Some(("StatefulSet", "pinned")),
                    "pinned",
                ),
                // Its rule restarts only after drain_timeout: never climbed.
                pod("a", "late-0", "n1", Some(("ReplicaSet", "late-x")), "late"),
                // Three replicas: the restart rung evicts it, its PDB holds.
                pod("a", "wide-0", "n2", Some(("ReplicaSet", "wide-x")), "wide"),
            ],
            vec![
                pdb("a", "solo", Some(1), None, 1, 0),
                pdb("a", "pinned", Some(1), None, 1, 0),
                pdb("a", "wide", None, Some(0), 3, 0),
            ],
        );
        workload(&mut s, "Deployment", "solo", 1, &["solo-0"]);
        workload(&mut s, "StatefulSet", "pinned", 1, &["pinned-0"]);
        workload(&mut s, "Deployment", "late", 1, &["late-0"]);
        workload(&mut s, "Deployment", "wide", 3, &["wide-0"]);
        s
    };
    let rules = policy(
        "[[drain]]\nname = \"pinned\"\nselector = \"app=pinned\"\nladder = [\"evict 30m\", \"skip\"]\n\
         [[drain]]\nname = \"late\"\nselector = \"app=late\"\nladder = [\"evict 1h\", \"restart\"]\n\
         [[drain]]\nname = \"singletons\"\nnamespaces = [\"a\"]\nladder = [\"restart 15m\", \"evict\"]\n",
    );
    assert_eq!(rules.drain.len(), 3);
    assert_eq!(
        kinds(&findings(&fixture(), &rules)),
        vec![
            (Kind::PdbNeverAllows, "a/pinned-pdb".into()),
            (Kind::PdbNeverAllows, "a/wide-pdb".into()),
            (Kind::SingleReplica, "a/late".into()),
            (Kind::SingleReplica, "a/pinned".into()),
        ]
    );
    // Without the rules, solo is flagged as every other singleton.
    assert_eq!(
        kinds(&findings(&fixture(), &Policy::default())),
        vec![
            (Kind::PdbNeverAllows, "a/pinned-pdb".into()),
            (Kind::PdbNeverAllows, "a/solo-pdb".into()),
            (Kind::PdbNeverAllows, "a/wide-pdb".into()),
            (Kind::SingleReplica, "a/late".into()),
            (Kind::SingleReplica, "a/pinned".into()),
            (Kind::SingleReplica, "a/solo".into()),
        ]
    );
}
