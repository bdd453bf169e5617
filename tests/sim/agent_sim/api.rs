//! The simulation's API server for what the agent keeps outside the nodes:
//! its `DroverStatus` object (read, created, merge-patched with a
//! `resourceVersion` precondition, its `status` subresource) and Events,
//! answered in-process as a tower service behind a real `kube::Client`,
//! so the agent's own client code (requests, errors, retries, watches)
//! runs unchanged. Faults are answered as an API server answers them: a
//! window of time in which reads or writes of one resource get a status
//! code (403, 409, 429, 500, 503), or no answer: a hung server does what it
//! was asked and answers when the window ends, long after the agent's
//! bound on the call gave up (so a write it counts as failed may have
//! landed, as over a real network).
//!
//! Objects live in a store that outlives each simulated process (a crash
//! drops the runtime the client ran on, not the API server's objects).

use chrono::{DateTime, Utc};
use drover::rollout::{Clock, VirtualClock};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// What a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hits {
    /// Reads (GET, list) of the status object.
    StatusReads,
    /// Writes (create, patch) of the status object.
    StatusWrites,
    /// Every Event call.
    Events,
}

/// A fault: from `from` until `until`, calls `hits` names get `code`, or
/// with code 0 their answer only at `until`.
#[derive(Debug, Clone)]
pub struct ApiFault {
    pub hits: Hits,
    pub code: u16,
    pub from: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

#[derive(Default)]
struct Store {
    objects: BTreeMap<String, Value>,
    revision: u64,
    faults: Vec<ApiFault>,
    /// Calls answered with an injected fault.
    faulted: usize,
    calls: usize,
}

/// The in-process API server; clones share one store.
#[derive(Clone)]
pub struct ApiServer {
    store: Arc<Mutex<Store>>,
    clock: VirtualClock,
}

type Answer = http::Response<BoxBody<Bytes, Infallible>>;

impl ApiServer {
    pub fn new(clock: VirtualClock) -> Self {
        ApiServer {
            store: Arc::default(),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn inject(&self, fault: ApiFault) {
        self.lock().faults.push(fault);
    }

    /// A client for a process of the agent (built inside its runtime).
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "drover-system")
    }

    /// The status object's `status`, as stored.
    pub fn status(&self) -> Option<Value> {
        let s = self.lock();
        s.objects
            .iter()
            .find(|(k, _)| k.contains("/droverstatuses/"))
            .and_then(|(_, v)| v.get("status").cloned())
    }

    /// The status object's applied commit and version, as stored: what
    /// the checks read after every step, without a copy of the whole status.
    pub fn applied(&self) -> Option<(String, String)> {
        let s = self.lock();
        let (_, v) = s
            .objects
            .iter()
            .find(|(k, _)| k.contains("/droverstatuses/"))?;
        let field = |f: &str| Some(v.get("status")?.get(f)?.as_str()?.to_owned());
        Some((field("lastAppliedCommit")?, field("appliedVersion")?))
    }

    /// How long a call to `uri` waits for its answer under a stall.
    fn stalled(&self, method: &http::Method, uri: &http::Uri) -> Option<std::time::Duration> {
        let plural = uri
            .path()
            .split('/')
            .find(|seg| ["events", "droverstatuses"].contains(seg))?;
        let now = self.clock.now();
        let mut s = self.lock();
        let until = s
            .fault(hits(method, plural), now)
            .filter(|f| f.code == 0)?
            .until;
        s.faulted += 1;
        (until - now).to_std().ok()
    }

    /// Calls answered with an injected fault.
    pub fn faulted(&self) -> usize {
        self.lock().faulted
    }

    pub fn calls(&self) -> usize {
        self.lock().calls
    }

    fn answer(&self, method: &http::Method, uri: &http::Uri, body: &[u8]) -> Answer {
        let path = uri.path().trim_end_matches('/').to_string();
        let query = uri.query().unwrap_or("");
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        // /api/v1/namespaces/ns/plural[/name[/sub]] or /apis/g/v/namespaces/...
        let base = if segs.first() == Some(&"api") { 2 } else { 3 };
        if segs.len() < base + 3 || segs.get(base) != Some(&"namespaces") {
            return status(404, "NotFound", &format!("no route {path}"));
        }
        let plural = segs[base + 2];
        let collection = segs[..base + 3].join("/");
        let name = segs.get(base + 3).copied();
        let sub = segs.get(base + 4).copied();
        let now = self.clock.now();
        let mut s = self.lock();
        s.calls += 1;
        let fault = s
            .fault(hits(method, plural), now)
            .map(|f| f.code)
            .filter(|c| *c != 0);
        if let Some(code) = fault {
            s.faulted += 1;
            let reason = match code {
                403 => "Forbidden",
                409 => "Conflict",
                429 => "TooManyRequests",
                _ => "InternalError",
            };
            return status(code, reason, "injected by the simulation");
        }
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        match (method.as_str(), name) {
            ("GET", None) if query.contains("watch=true") || query.contains("watch=1") => {
                // A watch that never sends: the agent's watches wait, as
                // on a quiet API server.
                let never = futures::stream::pending::<Result<Frame<Bytes>, Infallible>>();
                http::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(StreamBody::new(never).boxed())
                    .unwrap_or_default()
            }
            ("GET", None) => {
                let items: Vec<Value> = s
                    .objects
                    .iter()
                    .filter(|(k, _)| k.rsplit_once('/').map(|(c, _)| c) == Some(&collection))
                    .map(|(_, v)| v.clone())
                    .collect();
                let rv = s.revision.to_string();
                ok(
                    200,
                    &json!({"kind": "List", "apiVersion": "v1",
                    "metadata": {"resourceVersion": rv}, "items": items}),
                )
            }
            ("GET", Some(n)) => match s.objects.get(&format!("{collection}/{n}")) {
                Some(o) => ok(200, o),
                None => status(404, "NotFound", &format!("{plural} {n} not found")),
            },
            ("POST", None) => {
                let Some(n) = value["metadata"]["name"].as_str().map(str::to_string) else {
                    return status(422, "Invalid", "no name");
                };
                if plural == "events" {
                    return ok(201, &value);
                }
                let key = format!("{collection}/{n}");
                if s.objects.contains_key(&key) {
                    return status(409, "AlreadyExists", &format!("{n} exists"));
                }
                s.revision += 1;
                let mut o = value;
                o["metadata"]["resourceVersion"] = json!(s.revision.to_string());
                o["metadata"]["uid"] = json!(format!("uid-{}", s.revision));
                o["metadata"]["generation"] = json!(1);
                s.objects.insert(key, o.clone());
                ok(201, &o)
            }
            ("PATCH", Some(n)) => {
                if plural == "events" {
                    return ok(200, &json!({"metadata": {"name": n}}));
                }
                let key = format!("{collection}/{n}");
                let revision = s.revision + 1;
                let Some(o) = s.objects.get_mut(&key) else {
                    return status(404, "NotFound", &format!("{n} not found"));
                };
                let mut patch = value;
                if let Some(want) = patch["metadata"]["resourceVersion"].as_str() {
                    if o["metadata"]["resourceVersion"].as_str() != Some(want) {
                        return status(409, "Conflict", "the object has been modified");
                    }
                }
                if let Some(m) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                let part = if sub == Some("status") {
                    json!({"status": patch.get("status").cloned().unwrap_or(Value::Null)})
                } else {
                    if let Some(p) = patch.as_object_mut() {
                        p.remove("status");
                    }
                    patch
                };
                merge(o, &part);
                o["metadata"]["resourceVersion"] = json!(revision.to_string());
                let out = o.clone();
                s.revision = revision;
                ok(200, &out)
            }
            _ => status(405, "MethodNotAllowed", &format!("{method} {path}")),
        }
    }
}

impl Store {
    fn fault(&self, hits: Option<Hits>, now: DateTime<Utc>) -> Option<&ApiFault> {
        self.faults
            .iter()
            .find(|f| Some(f.hits) == hits && f.from <= now && now < f.until)
    }
}

/// What a call to `plural` is, for faults.
fn hits(method: &http::Method, plural: &str) -> Option<Hits> {
    match (plural, *method == http::Method::GET) {
        ("events", _) => Some(Hits::Events),
        ("droverstatuses", true) => Some(Hits::StatusReads),
        ("droverstatuses", false) => Some(Hits::StatusWrites),
        _ => None,
    }
}

/// JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

fn ok(code: u16, v: &Value) -> Answer {
    let body = serde_json::to_vec(v).unwrap_or_default();
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_default()
}

fn status(code: u16, reason: &str, message: &str) -> Answer {
    ok(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}),
    )
}

impl tower::Service<http::Request<kube::client::Body>> for ApiServer {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let answer = me.answer(&parts.method, &parts.uri, &bytes);
            // A hung server: the call was done, the answer waits.
            if let Some(wait) = me.stalled(&parts.method, &parts.uri) {
                tokio::time::sleep(wait).await;
            }
            Ok(answer)
        })
    }
}
