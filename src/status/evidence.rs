//! What the status store proves (docs/design.md §4a, §5, §6): standing
//! confirmations, standing failures, and what is *held*. The gate, the
//! waves and the halt all read this one result, so one store gives one
//! direction: missing evidence holds, it never opens.
//!
//! An environment's evidence is held, with the reason, when a branch
//! holding one of its listed clusters' reports does not count as a whole
//! (an unsigned commit on a cluster's branch may hide a `failed`), and
//! every environment's is when the single branch of the older layout does
//! not count (it holds every cluster's older history), or the store cannot
//! be read or is refused. A held environment's confirmations are not
//! counted and, for the halt and the waves, no cluster of it starts a node;
//! the gate refuses a move that needs its evidence.
//!
//! A failure *stands* while it is its cluster's newest trusted report for
//! the version: that cluster's own later trusted report for the version
//! (a retried node rolling again, a confirmation) ends it, nothing else the
//! store says does.

use super::branch::{Layout, ReportSigners, Untrusted};
use super::read::{
    for_display, merge_newest_first, tally, Confirmations, Event, Ignored, Newest, ReportVersion,
    Trust,
};
use super::store::{walk_store, BranchRead, Store, Visitor};
use super::Judge;
use chrono::{DateTime, Utc};
use git2::Repository;
use semver::Version;
use std::collections::{HashMap, HashSet};

/// The store read for the gate: confirmations, failures, what is held and
/// why, what is ignored and why, and each cluster's newest report.
struct Tallier {
    signed: bool,
    out: Confirmations,
    /// The branch being read: each cluster's events (newest first), which
    /// versions it has an event of, reports that cannot be read, the
    /// newest readable report per cluster.
    events: HashMap<(String, String), Vec<Event>>,
    versions: HashSet<(String, String, Version)>,
    unreadable: Vec<Ignored>,
    newest: HashMap<(String, String), (ReportVersion, super::StatusReport)>,
    /// Events of the single branch, once it is known to hold.
    single: HashMap<(String, String), Vec<Event>>,
    /// Clusters with no standing evidence: a branch holding their reports does not count.
    void: HashSet<(String, String)>,
    /// The single branch does not count: no cluster's evidence does.
    void_all: bool,
    /// Files deleted at the single branch's tip, named once.
    deleted_noted: HashSet<(String, String)>,
}

impl Visitor for Tallier {
    fn version(&mut self, v: ReportVersion) {
        let key = (v.env.clone(), v.cluster.clone());
        if v.deleted_at_tip && self.deleted_noted.insert(key.clone()) {
            self.unreadable.push(Ignored {
                env: v.env.clone(),
                cluster: v.cluster.clone(),
                commit: v.commit.to_string(),
                why: "the file is deleted at the branch tip, so its confirmations no longer count"
                    .into(),
            });
        }
        match &v.report {
            Ok(r) => {
                let e = Event::of(&v, r);
                // Every decisive report, and each version's newest report of
                // any state (what ends a failure); the rest says nothing.
                let first =
                    self.versions
                        .insert((v.env.clone(), v.cluster.clone(), r.version.clone()));
                // A deleted file's confirmations no longer count; its failures still withdraw.
                let keep = if v.deleted_at_tip {
                    e.failed
                } else {
                    e.decisive || first
                };
                if keep {
                    self.events.entry(key.clone()).or_default().push(e);
                }
                if !v.deleted_at_tip && !self.newest.contains_key(&key) {
                    let r = for_display(r.clone());
                    self.newest.insert(key, (v, r));
                }
            }
            Err(why) => self.unreadable.push(Ignored {
                env: v.env.clone(),
                cluster: v.cluster.clone(),
                commit: v.commit.to_string(),
                why: why.clone(),
            }),
        }
    }

    fn branch(&mut self, b: &BranchRead<'_>) {
        let events = std::mem::take(&mut self.events);
        let unreadable = std::mem::take(&mut self.unreadable);
        self.versions.clear();
        let trust = |principal: &str| match (self.signed, b.verdict, b.broken.get(principal)) {
            (false, _, _) => Trust::Unverified,
            (true, Err(u), _) | (true, Ok(()), Some(u)) => Trust::Untrusted(u.to_string()),
            (true, Ok(()), None) => Trust::Trusted,
        };
        for ((env, cluster), (v, report)) in std::mem::take(&mut self.newest) {
            let trust = trust(&format!("{env}/{cluster}"));
            self.out.newest.insert(
                (env, cluster),
                Newest {
                    report,
                    commit: v.commit,
                    committed: v.committed,
                    trust,
                },
            );
        }
        match (b.layout, b.verdict) {
            (Layout::Legacy, Err(u)) => {
                self.void_all = true;
                self.out.single_void = Some(u.clone());
                self.out.ignored.push(Ignored::branch(u, "", ""));
                self.out.untrusted.push(u.clone());
                if self.signed {
                    self.out.held_all = Some(format!(
                        "{u}; it holds every cluster's older reports, so no environment's \
                         evidence can be read until it is repaired or deleted"
                    ));
                }
            }
            (Layout::Legacy, Ok(())) => {
                for (principal, u) in b.broken {
                    let (env, cluster) = principal.split_once('/').unwrap_or(("", principal));
                    self.void_cluster(env, cluster, u);
                }
                self.out.ignored.extend(unreadable);
                self.single = events;
            }
            (Layout::Cluster { env, cluster }, Err(u)) => self.void_cluster(env, cluster, u),
            (Layout::Cluster { env, cluster }, Ok(())) => {
                self.out.ignored.extend(unreadable);
                let key = (env.clone(), cluster.clone());
                let own = events.into_values().next().unwrap_or_default();
                let single = self.single.remove(&key).unwrap_or_default();
                self.settle(key, merge_newest_first(own, single));
            }
        }
    }
}

impl Tallier {
    /// A branch holding `env`/`cluster`'s reports does not count: none of
    /// its evidence counts, and its environment's evidence is held.
    fn void_cluster(&mut self, env: &str, cluster: &str, u: &Untrusted) {
        self.void.insert((env.to_owned(), cluster.to_owned()));
        self.out.ignored.push(Ignored::branch(u, env, cluster));
        self.out.untrusted.push(u.clone());
        if self.signed {
            self.out
                .held
                .entry(env.to_owned())
                .or_default()
                .entry(cluster.to_owned())
                .or_insert_with(|| u.to_string());
        }
    }

    /// Tally one cluster's merged events, unless it is void.
    fn settle(&mut self, key: (String, String), events: Vec<Event>) {
        if !self.signed || self.void_all || self.void.contains(&key) {
            return;
        }
        self.out.add_latest(&key.0, &key.1, &events);
        self.out.add(&key.0, &key.1, tally(&events));
    }
}

/// What the whole store proves at `now`, trusting reports signed by
/// `signers`, judged with the first-seen record of the repository when it
/// has one (an agent's cache).
pub fn confirmations_in(
    repo: &Repository,
    store: &Store,
    signers: ReportSigners<'_>,
    now: DateTime<Utc>,
) -> Result<Confirmations, git2::Error> {
    let seen = crate::source::seen::StatusSeen::load(repo.path());
    let judge = Judge {
        signers,
        now,
        seen: (!seen.is_empty()).then_some(&seen),
    };
    let mut t = Tallier {
        signed: signers.is_some(),
        out: Confirmations {
            branch: store.legacy.clone(),
            ignored: store.ignored.clone(),
            ..Confirmations::default()
        },
        events: HashMap::new(),
        versions: HashSet::new(),
        unreadable: Vec::new(),
        newest: HashMap::new(),
        single: HashMap::new(),
        void: HashSet::new(),
        void_all: false,
        deleted_noted: HashSet::new(),
    };
    walk_store(repo, store, &judge, &mut t)?;
    // Clusters with reports only on the single branch.
    for (key, events) in std::mem::take(&mut t.single) {
        t.settle(key, events);
    }
    if !t.signed && !store.is_empty() {
        t.out.ignored.push(Ignored {
            env: String::new(),
            cluster: "every status report".into(),
            commit: String::new(),
            why: "no `report_signers` in [promotion] of drover.toml, so no report can be trusted"
                .into(),
        });
    }
    Ok(t.out)
}
