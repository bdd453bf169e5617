//! Leader election with a `coordination.k8s.io/v1` Lease, so that of the
//! Deployment's replicas exactly one drives the nodes.
//!
//! The decision ([`decide`]) is pure: given the lease as read and the time,
//! create, acquire, renew or wait. The [`Elector`] does the I/O: every write
//! is a `resourceVersion`-preconditioned replace (or a create), so when two
//! replicas race the API server lets exactly one win and the other gets 409.
//! Leadership is published on a watch channel; the acting task must stop as
//! soon as it reads `false`.

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use std::time::Duration;
use tokio::sync::watch;

/// Errors of leader election that end it (not a lost race, which is a normal outcome).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or could not be reached.
    #[error("lease {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The configured durations cannot work together.
    #[error("invalid leader election timing: {0}")]
    Timing(String),
}

/// Where the lease is and how long it lasts.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease (the agent's).
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// `leaseDurationSeconds`: how long a holder that stops renewing keeps the lease.
    pub duration: Duration,
    /// How often the holder renews (about a third of the duration).
    pub renew_every: Duration,
    /// A holder that could not renew for this long since its last renewal
    /// gives up at once, safely before the lease expires for the others.
    pub renew_deadline: Duration,
    /// How often a non-holder looks again, and the pause between failed renewals.
    pub retry_every: Duration,
}

impl LeaseConfig {
    /// Timings derived from the lease duration: renew every third, give up at two thirds.
    pub fn new(namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration,
            renew_every: duration / 3,
            renew_deadline: duration * 2 / 3,
            retry_every: (duration / 10).max(Duration::from_millis(100)),
        }
    }

    /// The longest an acting replica's engine may wait for one write: four
    /// fifths of the time between giving up the lease (`renew_deadline`
    /// after the last renewal was sent) and the lease expiring for the
    /// others (`duration` after it). A write started while leading is
    /// therefore given up before another replica can take over, even if
    /// the loss of leadership were noticed late (docs/design.md §9a).
    pub fn write_timeout(&self) -> Duration {
        self.duration.saturating_sub(self.renew_deadline) * 4 / 5
    }

    fn validate(&self) -> Result<(), Error> {
        if self.duration.as_secs() < 1 {
            return Err(Error::Timing(
                "the lease duration must be at least 1s".into(),
            ));
        }
        if !(self.renew_every < self.renew_deadline && self.renew_deadline < self.duration) {
            return Err(Error::Timing(format!(
                "need renew_every ({:?}) < renew_deadline ({:?}) < duration ({:?})",
                self.renew_every, self.renew_deadline, self.duration
            )));
        }
        Ok(())
    }
}

/// What to do with the lease as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No Lease object exists: create it holding it.
    Create,
    /// The lease is free (no holder) or expired: take it over.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it until `until`.
    Wait {
        /// The current holder.
        holder: String,
        /// When the lease expires unless renewed.
        until: DateTime<Utc>,
    },
}

/// The pure decision: `lease` as read (`None` when there is no Lease object), at `now`.
///
/// A lease is expired when `renewTime + leaseDurationSeconds < now`; a lease
/// without a renew time or duration counts as expired, since nobody can be
/// relying on it.
pub fn decide(lease: Option<&LeaseSpec>, identity: &str, now: DateTime<Utc>) -> Step {
    let Some(spec) = lease else {
        return Step::Create;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == identity {
        return Step::Renew;
    }
    if holder.is_empty() {
        return Step::Acquire;
    }
    let (Some(renewed), Some(secs)) = (
        spec.renew_time.as_ref().map(from_micro),
        spec.lease_duration_seconds,
    ) else {
        return Step::Acquire;
    };
    let until = renewed + chrono::Duration::seconds(i64::from(secs.max(0)));
    if until < now {
        Step::Acquire
    } else {
        Step::Wait {
            holder: holder.to_string(),
            until,
        }
    }
}

/// The spec to write for `step` (Create, Acquire or Renew) over `current`.
pub fn next_spec(
    current: Option<&LeaseSpec>,
    step: &Step,
    identity: &str,
    duration: Duration,
    now: DateTime<Utc>,
) -> LeaseSpec {
    let now_m = to_micro(now);
    let secs = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX);
    let mut spec = current.cloned().unwrap_or_default();
    match step {
        Step::Renew => {
            spec.renew_time = Some(now_m);
            spec.lease_duration_seconds = Some(secs);
        }
        Step::Create | Step::Acquire | Step::Wait { .. } => {
            // Any change of holder is a transition (client-go counts the same way).
            let transitions = spec.lease_transitions.unwrap_or(0);
            spec.lease_transitions = Some(if current.is_some() {
                transitions.saturating_add(1)
            } else {
                0
            });
            spec.holder_identity = Some(identity.to_string());
            spec.acquire_time = Some(now_m.clone());
            spec.renew_time = Some(now_m);
            spec.lease_duration_seconds = Some(secs);
        }
    }
    spec
}

fn to_micro(t: DateTime<Utc>) -> MicroTime {
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_microsecond(t.timestamp_micros())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

fn from_micro(t: &MicroTime) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.0.as_microsecond()).unwrap_or(DateTime::UNIX_EPOCH)
}

/// The result of one attempt at the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the lease (newly acquired or renewed).
    Leader,
    /// Someone else holds it (or won the race just now).
    Follower {
        /// The holder, if known.
        holder: String,
        /// When their lease expires, if known.
        until: Option<DateTime<Utc>>,
    },
}

/// Runs leader election for one replica.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// The lease as we last wrote or read it: its resourceVersion is the precondition of the next write.
    last: Option<Lease>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector").field("cfg", &self.cfg).finish()
    }
}

impl Elector {
    /// An elector for `cfg`; checks that its timings are consistent.
    pub fn new(client: Client, cfg: LeaseConfig) -> Result<Self, Error> {
        cfg.validate()?;
        Ok(Elector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            last: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.cfg
    }

    fn err(&self, source: kube::Error) -> Error {
        Error::Api {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            source,
        }
    }

    /// One attempt: read the lease (unless we hold a fresh copy), decide, write.
    pub async fn try_once(&mut self) -> Result<Attempt, Error> {
        // Renewing from our own copy saves a GET; a 409 then means someone
        // else wrote in between, and we read again to learn who.
        let current = match &self.last {
            Some(l) if holder(l) == Some(self.cfg.identity.as_str()) => Some(l.clone()),
            _ => self
                .api
                .get_opt(&self.cfg.name)
                .await
                .map_err(|e| self.err(e))?,
        };
        match self.write(current.clone()).await {
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let fresh = self
                    .api
                    .get_opt(&self.cfg.name)
                    .await
                    .map_err(|e| self.err(e))?;
                if current.is_some() && holder_of(fresh.as_ref()) == Some(&self.cfg.identity) {
                    // Our stale copy lost against our own earlier write that we
                    // never saw answered: retry once from the fresh read.
                    return self.write(fresh).await.map_err(|e| self.err(e));
                }
                self.last = fresh.clone();
                Ok(Attempt::Follower {
                    holder: holder_of(fresh.as_ref()).cloned().unwrap_or_default(),
                    until: fresh.as_ref().and_then(|l| expiry(l.spec.as_ref())),
                })
            }
            other => other.map_err(|e| self.err(e)),
        }
    }

    async fn write(&mut self, current: Option<Lease>) -> Result<Attempt, kube::Error> {
        let now = Utc::now();
        let step = decide(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.cfg.identity,
            now,
        );
        let spec = |c: Option<&Lease>| {
            next_spec(
                c.and_then(|l| l.spec.as_ref()),
                &step,
                &self.cfg.identity,
                self.cfg.duration,
                now,
            )
        };
        let written = match (&step, current) {
            (Step::Wait { holder, until }, cur) => {
                self.last = cur;
                return Ok(Attempt::Follower {
                    holder: holder.clone(),
                    until: Some(*until),
                });
            }
            (Step::Create, _) | (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec(None)),
                };
                self.api.create(&PostParams::default(), &lease).await?
            }
            (Step::Acquire | Step::Renew, Some(cur)) => {
                let lease = Lease {
                    // Keeps metadata.resourceVersion: the replace is conditional on it.
                    metadata: cur.metadata.clone(),
                    spec: Some(spec(Some(&cur))),
                };
                self.api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await?
            }
        };
        self.last = Some(written);
        Ok(Attempt::Leader)
    }

    /// Give the lease up (clear `holderIdentity`) if we hold it, so another
    /// replica takes over at once instead of after the lease duration.
    pub async fn release(&mut self) -> Result<(), Error> {
        let current = self
            .api
            .get_opt(&self.cfg.name)
            .await
            .map_err(|e| self.err(e))?;
        let Some(mut lease) = current else {
            return Ok(());
        };
        if holder(&lease) != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = Some(to_micro(Utc::now()));
        }
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            // Someone took it meanwhile: it is not ours to release any more.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(self.err(e)),
            Ok(_) => {
                self.last = None;
                Ok(())
            }
        }
    }

    /// Run election until `shutdown` becomes true, publishing leadership on
    /// `leader`. A leader renews every `renew_every`; when it has not
    /// renewed for `renew_deadline` (API errors, or someone else holds the
    /// lease) it publishes `false` at once. On shutdown the lease is not
    /// released here: the caller first stops acting, then calls [`Elector::release`].
    pub async fn run(&mut self, leader: watch::Sender<bool>, mut shutdown: watch::Receiver<bool>) {
        let mut renewed_at: Option<tokio::time::Instant> = None;
        // Failed attempts back off (jittered) up to the lease duration, and
        // are logged once a minute; a leader's deadline still caps the wait.
        let mut backoff = crate::retry::Backoff::new(self.cfg.retry_every, self.cfg.duration);
        let mut quiet = crate::retry::Quiet::new(Duration::from_secs(60));
        loop {
            if *shutdown.borrow() {
                return;
            }
            let deadline = renewed_at.map(|t| t + self.cfg.renew_deadline);
            // Bound each attempt by the renew deadline, so a hanging request
            // cannot keep a stale leader acting.
            let limit = deadline
                .map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
                .unwrap_or(self.cfg.duration);
            // The renewal counts from before it was sent, as the renewTime it
            // writes does: a slow answer must not stretch the deadline past
            // the lease's real expiry.
            let sent = tokio::time::Instant::now();
            let attempt = tokio::select! {
                biased;
                _ = shutdown.changed() => return,
                r = tokio::time::timeout(limit, self.try_once()) => r,
            };
            let succeeded = matches!(attempt, Ok(Ok(_)));
            let wait = match attempt {
                Ok(Ok(Attempt::Leader)) => {
                    if renewed_at.is_none() {
                        tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "acquired the lease");
                    }
                    renewed_at = Some(sent);
                    leader.send_if_modified(|v| !std::mem::replace(v, true));
                    // The next renewal is due `renew_every` after this one
                    // was sent, so a slow answer does not eat the time the
                    // next one has before the deadline.
                    self.cfg.renew_every.saturating_sub(sent.elapsed())
                }
                Ok(Ok(Attempt::Follower { holder, until })) => {
                    if renewed_at.take().is_some() {
                        tracing::warn!(lease = %self.cfg.name, %holder, "lost the lease");
                    }
                    leader.send_if_modified(|v| std::mem::replace(v, false));
                    // Look again when the holder's lease would expire, but no later than the retry period.
                    let until = until
                        .and_then(|u| (u - Utc::now()).to_std().ok())
                        .unwrap_or_default();
                    until.clamp(self.cfg.retry_every / 2, self.cfg.retry_every)
                }
                Ok(Err(e)) => {
                    if let Some(n) = quiet.allow() {
                        tracing::warn!(error = %e, suppressed = n, "lease attempt failed");
                    }
                    backoff.next_delay()
                }
                Err(_elapsed) => {
                    if let Some(n) = quiet.allow() {
                        tracing::warn!(lease = %self.cfg.name, suppressed = n, "lease attempt timed out");
                    }
                    backoff.next_delay()
                }
            };
            if succeeded {
                backoff.reset();
                quiet.reset();
            }
            if let Some(d) = renewed_at.map(|t| t + self.cfg.renew_deadline) {
                if tokio::time::Instant::now() >= d {
                    tracing::warn!(lease = %self.cfg.name, "could not renew the lease in time: stepping down");
                    renewed_at = None;
                    self.last = None;
                    leader.send_if_modified(|v| std::mem::replace(v, false));
                }
            }
            // A renewal that would land after the deadline is useless; retry before it.
            let wait = match renewed_at.map(|t| t + self.cfg.renew_deadline) {
                Some(d) => wait.min(d.saturating_duration_since(tokio::time::Instant::now())),
                None => wait,
            };
            tokio::select! {
                biased;
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

fn holder(l: &Lease) -> Option<&str> {
    l.spec.as_ref()?.holder_identity.as_deref()
}

fn holder_of(l: Option<&Lease>) -> Option<&String> {
    l?.spec.as_ref()?.holder_identity.as_ref()
}

fn expiry(spec: Option<&LeaseSpec>) -> Option<DateTime<Utc>> {
    let spec = spec?;
    let renewed = from_micro(spec.renew_time.as_ref()?);
    Some(renewed + chrono::Duration::seconds(i64::from(spec.lease_duration_seconds?)))
}

#[cfg(test)]
mod tests;
