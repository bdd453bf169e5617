//! The pure core of admission (`admit::judge_env`): configs and policies in,
//! a decision out, with evidence given as values — no git, no clock.

use crate::support::time::t;
use chrono::{DateTime, Utc};
use drover::admit::{judge_env, Change, Error, EvidenceSource, Policy, StatusEvidence};
use drover::config::{self, DirEntry, EntryKind, Files, RepoConfig};
use drover::gate::{Decision, LowerHistory, Reason};
use semver::Version;
use std::collections::BTreeMap;

/// Config files held in memory.
struct Mem(BTreeMap<String, String>);

impl Files for Mem {
    fn read(&self, path: &str) -> Result<Option<Vec<u8>>, String> {
        Ok(self.0.get(path).map(|t| t.clone().into_bytes()))
    }
    fn list(&self, dir: &str) -> Vec<DirEntry> {
        self.0
            .keys()
            .filter_map(|k| k.strip_prefix(&format!("{dir}/")))
            .map(|name| DirEntry {
                name: name.to_owned(),
                kind: EntryKind::File,
            })
            .collect()
    }
}

const NOW: &str = "2026-12-20T12:00:00Z";

/// A config: chain test, stage, production; `production` carries `prod_extra`.
fn cfg(
    root_extra: &str,
    chain: &str,
    prod: &str,
    prod_extra: &str,
    stage_clusters: &str,
) -> (RepoConfig, Policy) {
    let mut files = BTreeMap::new();
    files.insert(
        "drover.toml".to_owned(),
        format!(
            "[promotion]\nchain = {chain}\nreport_signers = \"agents.allowed_signers\"\n{root_extra}\n[clusters]\ntest = [\"test-1\"]\nstage = [{stage_clusters}]\nproduction = [\"prod-1\"]\n"
        ),
    );
    for (env, v, extra) in [
        ("test", "1.12.0", ""),
        ("stage", "1.12.0", ""),
        ("production", prod, prod_extra),
    ] {
        files.insert(
            format!("environments/{env}.toml"),
            format!("version = \"{v}\"\n{extra}\n"),
        );
    }
    let c = config::load_at(&Mem(files), t(NOW)).unwrap_or_else(|d| panic!("{d:?}"));
    let p = Policy::of(&c, Some("stage/stage-1 ssh-ed25519 AAAA\n".into()));
    (c, p)
}

const CHAIN: &str = "[\"test\", \"stage\", \"production\"]";

/// Evidence as values: stage's clusters' confirmations of each version.
#[derive(Default)]
struct Given {
    confirmed: BTreeMap<(String, Version), DateTime<Utc>>,
    asked: Vec<String>,
}

impl EvidenceSource for Given {
    fn status(
        &mut self,
        policy: &Policy,
        lower: &str,
        _clusters: &[String],
        version: &Version,
    ) -> Result<StatusEvidence, Error> {
        self.asked
            .push(format!("{}:{lower}:{version}", policy.status_branch));
        let confirmations = self
            .confirmed
            .iter()
            .filter(|((_, v), _)| v == version)
            .map(|((c, _), at)| (c.clone(), *at))
            .collect();
        Ok(StatusEvidence {
            confirmations,
            ..Default::default()
        })
    }
    fn history(&mut self, _: &str, _: &Version) -> Result<LowerHistory, Error> {
        Ok(LowerHistory::AtOtherVersion(None))
    }
}

fn confirmed(cluster: &str, v: &str) -> Given {
    let mut g = Given::default();
    g.confirmed.insert(
        (cluster.into(), v.parse().unwrap()),
        t("2026-12-10T00:00:00Z"),
    );
    g
}

fn judge(before: &(RepoConfig, Policy), after: &(RepoConfig, Policy), ev: &mut Given) -> Decision {
    judge_env(
        Change {
            before: Some((&before.0, &before.1)),
            after: (&after.0, &after.1),
        },
        "production",
        ev,
        t(NOW),
    )
    .unwrap()
}

fn reason(d: &Decision) -> &Reason {
    match d {
        Decision::Refused(r) => &r.reason,
        other => panic!("expected a refusal, got {other}"),
    }
}

#[test]
fn confirmed_move_is_allowed_and_reads_the_base_policys_branch() {
    let base = cfg(
        "status_branch = \"drover/status\"",
        CHAIN,
        "1.12.0",
        "",
        "\"stage-1\"",
    );
    let head = cfg(
        "status_branch = \"drover/status\"",
        CHAIN,
        "1.13.0",
        "",
        "\"stage-1\"",
    );
    let mut ev = confirmed("stage-1", "1.13.0");
    assert!(matches!(judge(&base, &head, &mut ev), Decision::Allowed(_)));
    assert_eq!(ev.asked, ["drover/status:stage:1.13.0"]);
}

#[test]
fn policy_edit_with_a_move_is_refused_and_alone_is_not_judged() {
    let base = cfg("", CHAIN, "1.12.0", "", "\"stage-1\"");
    let moved = cfg(
        "status_branch = \"mine\"",
        CHAIN,
        "1.13.0",
        "",
        "\"stage-1\"",
    );
    let mut ev = confirmed("stage-1", "1.13.0");
    let d = judge(&base, &moved, &mut ev);
    assert_eq!(
        reason(&d),
        &Reason::PolicyAndVersion {
            edits: vec!["status_branch".into()]
        }
    );
    assert!(
        ev.asked.is_empty(),
        "no evidence read from the change's own branch"
    );

    let alone = cfg(
        "status_branch = \"mine\"",
        CHAIN,
        "1.12.0",
        "",
        "\"stage-1\"",
    );
    assert_eq!(judge(&base, &alone, &mut ev), Decision::Unchanged);

    let soak = cfg(
        "",
        CHAIN,
        "1.13.0",
        "[promotion]\nsoak = \"1h\"",
        "\"stage-1\"",
    );
    let d = judge(&base, &soak, &mut ev);
    assert_eq!(
        reason(&d),
        &Reason::PolicyAndVersion {
            edits: vec!["soak of production".into()]
        }
    );
}

#[test]
fn allow_downgrade_counts_only_when_the_change_sets_it() {
    let base = cfg("", CHAIN, "1.12.0", "", "\"stage-1\"");
    let stale = cfg("", CHAIN, "1.12.0", "allow_downgrade = true", "\"stage-1\"");
    let down = cfg("", CHAIN, "1.0.0", "allow_downgrade = true", "\"stage-1\"");
    let mut ev = confirmed("stage-1", "1.0.0");
    assert!(matches!(
        reason(&judge(&stale, &down, &mut ev)),
        Reason::Downgrade { .. }
    ));
    assert!(matches!(judge(&base, &down, &mut ev), Decision::Allowed(a) if a.downgrade));
}

#[test]
fn dropping_the_unconfirmed_cluster_does_not_weaken_the_gate() {
    let base = cfg("", CHAIN, "1.12.0", "", "\"stage-1\", \"stage-2\"");
    let head = cfg("", CHAIN, "1.13.0", "", "\"stage-1\"");
    let mut ev = confirmed("stage-1", "1.13.0");
    let Reason::NotConfirmed { missing, .. } = reason(&judge(&base, &head, &mut ev)).clone() else {
        panic!("expected not confirmed")
    };
    assert_eq!(missing, [("stage-2".to_string(), None)]);
}

#[test]
fn status_evidence_without_report_signers_is_refused() {
    let base = cfg("", CHAIN, "1.12.0", "", "\"stage-1\"");
    let mut head = cfg("", CHAIN, "1.13.0", "", "\"stage-1\"");
    head.0.root.report_signers = None;
    let mut before = base.clone();
    before.0.root.report_signers = None;
    let before = (before.0.clone(), Policy::of(&before.0, None));
    let head = (head.0.clone(), Policy::of(&head.0, None));
    let mut ev = confirmed("stage-1", "1.13.0");
    assert_eq!(
        reason(&judge(&before, &head, &mut ev)),
        &Reason::NoReportSigners
    );
}
