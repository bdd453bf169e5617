//! Observation through watches: reflector stores for the selected nodes,
//! drover's records of them (`DroverNode`s in the agent's namespace),
//! drover's Jobs and the PodDisruptionBudgets, plus field-selected pod
//! watches for the nodes whose health is watched and the blocked nodes whose
//! first retry may come early, at most [`MAX_POD_WATCHES`] of them (health
//! first); beyond that their pods are listed instead, a blocked node's at
//! most every [`BLOCKED_POLL`]. The pods of a node being drained are listed
//! fresh once per pass ([`Observer::list_pods`]), by the observation, which
//! counts them and keeps the ones to evict, trimmed to what an eviction
//! needs, for the drain of the same pass ([`Observer::take_drain_list`]): a
//! watch per draining node held one API connection each (50 in flight, 50
//! connections with their TLS and read buffers), and a drain re-steps every
//! few seconds while pods remain anyway.
//!
//! Nothing here waits for a pod watch to sync: a watch not ready yet counts
//! as no answer (a blocked node waits out its backoff, a watched node's pods
//! are listed once), and its first list wakes the engine when it arrives.
//! A node whose own reads fail is returned with [`NodeView::fault`] set, so
//! one node's trouble never fails the observation of the others.
//!
//! A node's run is the Job its record names ([`super::objects::linked`]),
//! nothing else; a run drover stopped is looked for in its pods too (one
//! labelled list while it stops), so the node is not uncordoned while
//! one of them runs.
//!
//! The pods' share of the observer is in `pods.rs`, the records' (their
//! overlay, the run a record links, the earlier releases' records) in
//! `record.rs`.

use super::node::ObservedNode;
use super::objects::ObservedJob;
use super::objects::{must_evict, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use super::{Error, KubeOptions};
use crate::cluster::{LinkedRun, NodeProgress, NodeView, ProgressState, UpgradeStatus};
use crate::record::wire::DroverNode;
use crate::record::{CLUSTER_LABEL, ENVIRONMENT_LABEL, PERSON_ANNOTATIONS};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, store::Writer, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// The watches and what drover wrote that they have not shown yet.
pub struct Observer {
    pub(crate) client: Client,
    pub(crate) opts: KubeOptions,
    pub(crate) nodes: Store<ObservedNode>,
    pub(crate) records: Store<DroverNode>,
    pub(crate) jobs: Store<ObservedJob>,
    pub(crate) pdbs: Store<PodDisruptionBudget>,
    pub(crate) changes: Arc<watch::Sender<u64>>,
    // Our own writes, newer than the stores until the watches deliver them:
    // the engine must read its own writes, or a stale view would let it
    // cordon a node twice or start more nodes than the budget allows.
    node_overlay: Mutex<HashMap<String, Arc<ObservedNode>>>,
    pub(super) record_overlay: Mutex<HashMap<String, Arc<DroverNode>>>,
    job_overlay: Mutex<HashMap<String, Arc<ObservedJob>>>,
    // The UIDs of Jobs we deleted, and when, until the watch shows them
    // gone: a deleted run the store still holds is not running any more
    // for the record that stopped it. By UID: a Job created again under
    // the same name is another object.
    deleted_jobs: Mutex<HashMap<String, Instant>>,
    /// Per draining node, UIDs of pods this process evicted, so a pass never
    /// evicts a pod twice while the watch has not shown its deletionTimestamp yet.
    pub(crate) evicted: Mutex<HashMap<String, HashSet<String>>>,
    pub(super) pod_watches: Mutex<HashMap<String, PodWatch>>,
    /// The nodes that may hold a pod watch now (set by each observation).
    pub(super) watch_plan: Mutex<HashSet<String>>,
    /// Blocked nodes beyond the watch cap: when their pods were last listed,
    /// and whether their budgets allowed a drain then.
    pub(super) polled: Mutex<HashMap<String, (Instant, bool)>>,
    /// Per draining node, the pods the last observation found to evict
    /// (trimmed) and when: the drain of the same pass evicts from it
    /// instead of listing again.
    pub(super) drain_lists: Mutex<HashMap<String, (Instant, Vec<Pod>)>>,
    tasks: Vec<AbortHandle>,
}

pub(super) struct PodWatch {
    pub(super) store: Store<Pod>,
    pub(super) task: AbortHandle,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for w in lock(&self.pod_watches).values() {
            w.task.abort();
        }
    }
}

/// Lock a mutex, recovering from a poisoned one (the data are caches, always valid).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn bump(changes: &watch::Sender<u64>) {
    changes.send_modify(|v| *v = v.wrapping_add(1));
}

/// Objects listed per page by the watches' initial lists and relists.
///
/// Each page's JSON body is held whole while it is decoded: 100 nodes are a
/// few hundred KiB, where kube's default of 500 held megabytes at once.
pub(super) const LIST_PAGE_SIZE: u32 = 100;

/// Most pods a drain pass reads of one node: the kubelet's default `maxPods`
/// is 110 and few raise it past 250, so this only bounds a hostile case.
/// A node with more is an error, never a drain that counts some of its pods.
pub(crate) const MAX_DRAIN_PODS: usize = 1000;

/// Most pod watches held at once by default ([`KubeOptions::pod_watches`]),
/// one API connection each: the nodes in their health watch first (a crash
/// loop is seen as the kubelet reports it), then blocked nodes whose first
/// retry may come early.
pub const MAX_POD_WATCHES: usize = 32;

/// How often a blocked node beyond [`MAX_POD_WATCHES`] has its pods listed
/// to see whether its budgets relent (a relenting budget may then be seen
/// this much later; the retry backoff is minutes).
pub const BLOCKED_POLL: Duration = Duration::from_secs(30);

/// How old an observation's list of a draining node's pods may be for the
/// drain to evict from it rather than list again: a pass observes, decides
/// and evicts within milliseconds; a list older than this belongs to an
/// earlier pass.
pub(super) const DRAIN_LIST_FRESH: Duration = Duration::from_secs(2);

/// What an eviction reads of a pod (its name, namespace, UID, labels for
/// the budgets and drain rules that cover it, its controller for a
/// `restart` rung, whether it is terminating), so the list kept from the
/// observation to the drain holds a few hundred bytes per pod.
fn trim_for_drain(pod: Pod) -> Pod {
    let m = pod.metadata;
    Pod {
        metadata: kube::api::ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            labels: m.labels,
            deletion_timestamp: m.deletion_timestamp,
            owner_references: m.owner_references.map(|o| {
                o.into_iter()
                    .filter(|o| o.controller == Some(true))
                    .collect()
            }),
            ..Default::default()
        },
        spec: None,
        status: None,
    }
}

// Run a reflector for `api`, calling `on_event` on every event it applies.
pub(super) fn spawn_reflector<K>(
    api: Api<K>,
    cfg: watcher::Config,
    writer: Writer<K>,
    what: String,
    trim: fn(&mut K),
    mut on_event: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> AbortHandle
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let cfg = cfg.page_size(LIST_PAGE_SIZE);
    tokio::spawn(async move {
        let stream = watcher(api, cfg)
            .default_backoff()
            // managedFields are never read and are often most of an object's
            // size (nodes have none: super::node decodes only what is read).
            .modify(move |o: &mut K| {
                o.managed_fields_mut().clear();
                trim(o)
            })
            .reflect(writer);
        futures::pin_mut!(stream);
        // An outage fails every retry: one line a minute per watch, with a count.
        let mut quiet = crate::retry::Quiet::new(Duration::from_secs(60));
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => on_event(&ev),
                Err(e) => {
                    if let Some(n) = quiet.allow() {
                        tracing::warn!(watch = %what, error = %e, suppressed = n, "watch failed; retrying with backoff")
                    }
                }
            }
        }
    })
    .abort_handle()
}

/// Keep what drover reads of a record: no managedFields, and of the
/// annotations only the person's requests.
pub(crate) fn trim_record(r: &mut DroverNode) {
    r.managed_fields_mut().clear();
    if let Some(a) = r.metadata.annotations.as_mut() {
        a.retain(|k, _| PERSON_ANNOTATIONS.contains(&k.as_str()));
    }
}

/// Forget the Jobs we created that the store now shows (the same uid): the
/// overlay only bridges the time until the watch catches up, so it stays as
/// small as the Jobs the watch has not delivered yet.
fn forget_caught_up(
    overlay: &mut HashMap<String, Arc<ObservedJob>>,
    stored_uids: &HashSet<String>,
) {
    overlay.retain(|_, j| j.uid().is_none_or(|uid| !stored_uids.contains(&uid)));
}

async fn ready<K>(store: &Store<K>, what: &str, timeout: Duration) -> Result<(), Error>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    match tokio::time::timeout(timeout, store.wait_until_ready()).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(Error::NotReady {
            what: what.to_string(),
            timeout,
        }),
    }
}

// What the engine decides on, so that heartbeats alone do not wake it.
fn node_fingerprint(n: &ObservedNode) -> u64 {
    let mut h = DefaultHasher::new();
    n.annotations().hash(&mut h);
    n.unschedulable.hash(&mut h);
    n.ready.hash(&mut h);
    n.os_image.hash(&mut h);
    h.finish()
}

// resourceVersions are etcd revisions (integers) on every etcd-backed API
// server; comparing them tells which of two copies of an object is newer.
fn rv(o: &impl Resource) -> Option<u64> {
    o.meta().resource_version.as_deref()?.parse().ok()
}

pub(super) fn newer(a: &impl Resource, b: &impl Resource) -> bool {
    match (rv(a), rv(b)) {
        (Some(a), Some(b)) => a > b,
        // Unknown format: trust our write until the watch shows any other version.
        _ => a.meta().resource_version != b.meta().resource_version,
    }
}

impl Observer {
    /// Validate the selector and permissions with one small list each, start
    /// the watches, and wait for their initial lists.
    pub async fn start(client: Client, opts: KubeOptions) -> Result<Arc<Observer>, Error> {
        let job_selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
        let node_api: Api<ObservedNode> = Api::all(client.clone());
        let job_api: Api<ObservedJob> = Api::namespaced(client.clone(), &opts.namespace);
        let pdb_api: Api<PodDisruptionBudget> = Api::all(client.clone());
        // One page of one object each: a bad selector or a missing RBAC grant
        // is a clear error here instead of a watch retrying forever.
        let probe = |labels: &str| ListParams::default().labels(labels).limit(1);
        node_api
            .list_metadata(&probe(&opts.node_selector))
            .await
            .map_err(|source| Error::Api {
                call: format!("list nodes with selector {:?}", opts.node_selector),
                source,
            })?;
        job_api
            .list_metadata(&probe(&job_selector))
            .await
            .map_err(|source| Error::Api {
                call: format!("list jobs in namespace {}", opts.namespace),
                source,
            })?;
        pdb_api
            .list_metadata(&probe(""))
            .await
            .map_err(|source| Error::Api {
                call: "list poddisruptionbudgets".into(),
                source,
            })?;
        let record_api: Api<DroverNode> = Api::namespaced(client.clone(), &opts.records_namespace);
        let record_selector = format!(
            "{ENVIRONMENT_LABEL}={},{CLUSTER_LABEL}={}",
            opts.environment, opts.cluster_name
        );
        record_api
            .list_metadata(&probe(&record_selector))
            .await
            .map_err(|source| Error::Api {
                call: format!("list drovernodes in namespace {}", opts.records_namespace),
                source,
            })?;

        let changes = Arc::new(watch::channel(0u64).0);
        let (nodes, node_writer) = reflector::store::<ObservedNode>();
        let (jobs, job_writer) = reflector::store::<ObservedJob>();
        let (records, record_writer) = reflector::store::<DroverNode>();
        let (pdbs, pdb_writer) = reflector::store::<PodDisruptionBudget>();
        let mut tasks = Vec::new();

        let mut node_cfg = watcher::Config::default();
        if !opts.node_selector.is_empty() {
            node_cfg = node_cfg.labels(&opts.node_selector);
        }
        let tx = changes.clone();
        let mut seen: HashMap<String, u64> = HashMap::new();
        tasks.push(spawn_reflector(
            node_api,
            node_cfg,
            node_writer,
            "nodes".into(),
            |_| {},
            move |ev| match ev {
                watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                    let fp = node_fingerprint(n);
                    if seen.insert(n.name_any(), fp) != Some(fp) {
                        bump(&tx);
                    }
                }
                watcher::Event::Delete(n) => {
                    seen.remove(&n.name_any());
                    bump(&tx);
                }
                watcher::Event::InitDone => bump(&tx),
                watcher::Event::Init => {}
            },
        ));
        let tx = changes.clone();
        tasks.push(spawn_reflector(
            job_api,
            watcher::Config::default().labels(&job_selector),
            job_writer,
            "jobs".into(),
            // Decoded as drover keeps it (ObservedJob): nothing more to drop.
            |_| {},
            move |_| bump(&tx),
        ));
        let tx = changes.clone();
        tasks.push(spawn_reflector(
            record_api,
            watcher::Config::default().labels(&record_selector),
            record_writer,
            "drovernodes".into(),
            trim_record,
            move |_| bump(&tx),
        ));
        let tx = changes.clone();
        tasks.push(spawn_reflector(
            pdb_api,
            watcher::Config::default(),
            pdb_writer,
            "poddisruptionbudgets".into(),
            |_| {},
            move |_| bump(&tx),
        ));

        let obs = Arc::new(Observer {
            client,
            opts,
            nodes,
            records,
            jobs,
            pdbs,
            changes,
            node_overlay: Mutex::new(HashMap::new()),
            record_overlay: Mutex::new(HashMap::new()),
            job_overlay: Mutex::new(HashMap::new()),
            deleted_jobs: Mutex::new(HashMap::new()),
            evicted: Mutex::new(HashMap::new()),
            pod_watches: Mutex::new(HashMap::new()),
            watch_plan: Mutex::new(HashSet::new()),
            polled: Mutex::new(HashMap::new()),
            drain_lists: Mutex::new(HashMap::new()),
            tasks,
        });
        let t = obs.opts.ready_timeout;
        ready(&obs.nodes, "nodes", t).await?;
        ready(&obs.jobs, "jobs", t).await?;
        ready(&obs.records, "drovernodes", t).await?;
        ready(&obs.pdbs, "poddisruptionbudgets", t).await?;
        Ok(obs)
    }

    /// Record a node as written by us (the response of our patch).
    pub(crate) fn wrote_node(&self, node: ObservedNode) {
        lock(&self.node_overlay).insert(node.name_any(), Arc::new(node));
    }

    /// Record a Job as created by us.
    pub(crate) fn wrote_job(&self, job: impl Into<ObservedJob>) {
        let job = job.into();
        lock(&self.job_overlay).insert(job.name_any(), Arc::new(job));
    }

    /// Forget a Job we deleted.
    pub(crate) fn deleted_job(&self, job: &ObservedJob) {
        let name = job.name_any();
        let uid = job.uid();
        let mut overlay = lock(&self.job_overlay);
        if overlay.get(&name).is_some_and(|o| o.uid() == uid) {
            overlay.remove(&name);
        }
        drop(overlay);
        if let Some(uid) = uid {
            lock(&self.deleted_jobs).insert(uid, Instant::now());
        }
    }

    fn deleted_by_us(&self, job: &ObservedJob) -> bool {
        job.uid()
            .is_some_and(|uid| lock(&self.deleted_jobs).contains_key(&uid))
    }

    pub(super) fn is_deleted(&self, job: &ObservedJob) -> bool {
        job.metadata.deletion_timestamp.is_some() || self.deleted_by_us(job)
    }

    /// The newest copy of node `name` we know of: the store's or our own write's.
    pub(crate) fn node(&self, name: &str) -> Option<Arc<ObservedNode>> {
        let stored = self.nodes.get(&ObjectRef::new(name));
        let mut overlay = lock(&self.node_overlay);
        match (stored, overlay.get(name)) {
            (Some(s), Some(o)) if newer(o.as_ref(), s.as_ref()) => Some(o.clone()),
            (Some(s), Some(_)) => {
                overlay.remove(name);
                Some(s)
            }
            (s, _) => s,
        }
    }

    /// All selected nodes, each as its newest known copy.
    pub(super) fn current_nodes(&self) -> Vec<Arc<ObservedNode>> {
        // `[nodes] os_image_regex` narrows the label selection (no selector
        // can match osImage); a node drover is already upgrading stays until
        // it is done or given back.
        let stored: Vec<_> = self
            .nodes
            .state()
            .into_iter()
            .filter(|n| {
                self.opts.nodes.selects(&n.os_image)
                    || self
                        .record(&n.name_any())
                        .is_some_and(|r| r.progress.is_some())
            })
            .collect();
        let mut overlay = lock(&self.node_overlay);
        let names: HashSet<String> = stored.iter().map(|n| n.name_any()).collect();
        // A node that left the selection (or the cluster) is no longer ours to overlay.
        overlay.retain(|k, _| names.contains(k));
        stored
            .into_iter()
            .map(|s| {
                let name = s.name_any();
                match overlay.get(&name) {
                    Some(o) if newer(o.as_ref(), s.as_ref()) => o.clone(),
                    Some(_) => {
                        overlay.remove(&name);
                        s
                    }
                    None => s,
                }
            })
            .collect()
    }

    /// The Job named `name` in the agent's namespace, including one we just created.
    pub(crate) fn job(&self, name: &str) -> Option<Arc<ObservedJob>> {
        let stored = self
            .jobs
            .get(&ObjectRef::new(name).within(&self.opts.namespace));
        let mut overlay = lock(&self.job_overlay);
        match stored {
            Some(s) if !self.deleted_by_us(&s) => {
                overlay.remove(name);
                Some(s)
            }
            // A copy we deleted (the watch has not shown it gone): only a
            // Job created since under the same name is one.
            _ => overlay.get(name).cloned(),
        }
    }

    /// drover's Jobs for `node` (store and our own creations), less the
    /// ones we deleted.
    pub(crate) fn jobs_of(&self, node: &str) -> Vec<Arc<ObservedJob>> {
        let of_node = |j: &ObservedJob| j.node.as_deref() == Some(node) && !self.deleted_by_us(j);
        let mut jobs: Vec<Arc<ObservedJob>> = self
            .jobs
            .state()
            .into_iter()
            .filter(|j| of_node(j))
            .collect();
        let names: HashSet<String> = jobs.iter().map(|j| j.name_any()).collect();
        jobs.extend(
            lock(&self.job_overlay)
                .values()
                .filter(|j| of_node(j) && !names.contains(&j.name_any()))
                .cloned(),
        );
        jobs
    }

    /// Forget the Jobs we created that the store shows now, and the
    /// deletions it no longer shows (after a minute, so a watch that had
    /// not even shown the creation yet cannot bring one back): the
    /// overlays only bridge the time until the watch catches up.
    fn forget_shown_jobs(&self) {
        let uids: HashSet<String> = self.jobs.state().iter().filter_map(|j| j.uid()).collect();
        lock(&self.deleted_jobs)
            .retain(|uid, at| uids.contains(uid) || at.elapsed() < Duration::from_secs(60));
        forget_caught_up(&mut lock(&self.job_overlay), &uids);
    }

    /// The selected nodes as they are now (see [`crate::cluster::Cluster::observe`]).
    ///
    /// `pods_to_evict` is counted for nodes drover is draining (the only
    /// ones it is read for); it is 0 for the others, where no drain runs. A
    /// node whose pods cannot be listed, or whose version cannot be confirmed,
    /// carries the reason in [`NodeView::fault`].
    pub async fn observe(&self) -> Result<Vec<NodeView>, Error> {
        self.forget_shown_jobs();
        let mut nodes = self.current_nodes();
        nodes.sort_by_key(|n| n.name_any());
        // What drover acts on: the record, and the run it links (a
        // `draining` record whose run exists is upgrading).
        let mut seen = Vec::with_capacity(nodes.len());
        for n in &nodes {
            let stored = self.stored_record(&n.name_any());
            let linked = match &stored {
                Some(Ok(s)) => self.linked(&s.record).await,
                _ => Ok(LinkedRun::None),
            };
            seen.push((stored, linked));
        }
        let progress: Vec<Option<NodeProgress>> = seen
            .iter()
            .map(|(stored, linked)| match (stored, linked) {
                (Some(Ok(s)), Ok(l)) => crate::cluster::effective(&s.record, l).progress,
                (Some(Ok(s)), Err(_)) => s.record.progress.clone(),
                _ => None,
            })
            .collect();
        let named = |keep: &dyn Fn(&NodeProgress) -> bool| -> Vec<String> {
            nodes
                .iter()
                .zip(&progress)
                .filter(|(_, p)| p.as_ref().is_some_and(keep))
                .map(|(n, _)| n.name_any())
                .collect()
        };
        // A node rolling back is drained before its driver runs, as one
        // moving to the target is.
        let draining: HashSet<String> = named(&|p| {
            matches!(
                p.state,
                ProgressState::Draining | ProgressState::RollingBack
            )
        })
        .into_iter()
        .collect();
        // The pods of nodes in their health watch are watched, and so are
        // a blocked node's while its budgets may cut its first backoff short
        // (a settling cluster's are listed instead, see kubernetes/health.rs).
        let watching = named(&|p| p.state == ProgressState::Watching);
        let blocked = named(&|p| p.state == ProgressState::Blocked && p.retries == 0);
        self.plan_pod_watches(&draining, &watching, &blocked);
        // The draining nodes' pod lists, several at once: one after another
        // they made a pass with 50 nodes draining last ~0.7 s before it
        // decided anything.
        let lists: Vec<_> = draining.iter().map(|n| self.list_named(n)).collect();
        let mut listed: HashMap<String, Result<Vec<Pod>, Error>> = futures::stream::iter(lists)
            .buffer_unordered(crate::rollout::CALLS_AT_ONCE)
            .collect()
            .await;

        let mut views = Vec::with_capacity(nodes.len());
        for ((mut node, progress), (stored, linked)) in nodes.into_iter().zip(progress).zip(seen) {
            let name = node.name_any();
            let mut pods_to_evict = 0;
            let mut budgets_allow_drain = false;
            let mut fault = None;
            let linked = linked.unwrap_or_else(|e| {
                fault = Some(format!("its stopped run cannot be looked at: {e}"));
                LinkedRun::Stopping
            });
            if let Some(p) = &progress {
                if p.state == ProgressState::Blocked && p.retries == 0 {
                    budgets_allow_drain = self.blocked_budgets_allow(&name).await;
                }
                if let Some(pods) = listed.remove(&name) {
                    match pods {
                        Ok(pods) => {
                            let evict: Vec<Pod> = pods
                                .into_iter()
                                .filter(must_evict)
                                .map(trim_for_drain)
                                .collect();
                            pods_to_evict = evict.len();
                            lock(&self.drain_lists).insert(name.clone(), (Instant::now(), evict));
                        }
                        Err(e) => {
                            lock(&self.drain_lists).remove(&name);
                            fault = Some(format!("its pods cannot be listed: {e}"));
                        }
                    }
                }
                let succeeded = matches!(
                    &linked,
                    LinkedRun::Found {
                        status: UpgradeStatus::Succeeded,
                        ..
                    }
                );
                let at_target =
                    self.opts.nodes.version_of(&node.os_image) == Some(p.target.clone());
                if p.state == ProgressState::Upgrading && succeeded && !at_target {
                    // The verdict would be "failed, wrong version": the
                    // node and Job watches are independent, so confirm
                    // with a fresh read before the engine acts on it.
                    match self.get_node(&name, "confirm version").await {
                        Ok(n) => node = n,
                        Err(e) => fault = Some(format!("its version cannot be confirmed: {e}")),
                    }
                }
            }
            let version = self.opts.nodes.version_of(&node.os_image);
            if version.is_none() {
                tracing::debug!(node = %name, os_image = %node.os_image, "OS version cannot be read");
            }
            let mut view = NodeView::of_record(
                name,
                version,
                node.ready,
                node.unschedulable,
                stored,
                &linked,
            );
            view.pods_to_evict = pods_to_evict;
            view.budgets_allow_drain = budgets_allow_drain;
            if let Some(f) = fault {
                tracing::debug!(node = %view.name, fault = %f, "node observed in part");
                view.fault = Some(f);
            }
            view.ignored = node
                .annotations()
                .iter()
                .take(crate::cluster::MAX_IGNORED)
                .map(|(k, v)| format!("{k}={}", v.chars().take(64).collect::<String>()))
                .collect();
            view.managed_by = self.opts.nodes.managed_by(node.brupop.as_deref());
            view.consent_paused = node.consent.as_deref() == Some(crate::config::CONSENT_PAUSED);
            view.drain_tainted = node.drain_tainted();
            views.push(view);
        }
        // The runs that just ended: what their drivers said (a failure's
        // reason, the retries), read for all of them at once.
        super::termination::hear_drivers(&self.client, &self.opts.namespace, &mut views).await;
        Ok(views)
    }

    /// A fresh read of the node from the API server (recorded as our newest copy).
    pub(crate) async fn get_node(
        &self,
        name: &str,
        call: &'static str,
    ) -> Result<Arc<ObservedNode>, Error> {
        let api: Api<ObservedNode> = Api::all(self.client.clone());
        match api.get_opt(name).await {
            Ok(Some(n)) => {
                let n = Arc::new(n);
                lock(&self.node_overlay).insert(name.to_string(), n.clone());
                Ok(n)
            }
            Ok(None) => Err(Error::NodeGone {
                node: name.to_string(),
                call,
            }),
            Err(source) => Err(Error::Node {
                node: name.to_string(),
                call: format!("get ({call})"),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn job(name: &str, uid: &str) -> ObservedJob {
        ObservedJob {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            node: Some("n1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_overlay_forgets_a_creation_once_the_store_shows_it() {
        let mut overlay: HashMap<String, Arc<ObservedJob>> = [
            ("a".to_string(), Arc::new(job("a", "u1"))),
            ("b".to_string(), Arc::new(job("b", "u2"))),
        ]
        .into();
        // The store shows `a` as created, and an older `b` (another uid: a
        // copy deleted and created again under the same name).
        forget_caught_up(&mut overlay, &["u1".to_string(), "u0".to_string()].into());
        assert_eq!(overlay.keys().collect::<Vec<_>>(), vec!["b"]);
    }
}
