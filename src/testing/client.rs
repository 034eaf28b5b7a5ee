//! The controller's `kube::Client`: a tower service that calls the simulated server in-process,
//! on the test's runtime and clock, and watches every request for the oracles (what the
//! controller read, lost updates, invariants after each write, a crash right after a write).

use crate::sim::util::JsonAt as _;
use std::collections::BTreeSet;

// Hashed on every request and delivery; never iterated in an order that matters.
use foldhash::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use super::oracle::lost_update;
use super::{Failure, Invariant, Oracle, Parsed, Reconciled, Unique, World};
use crate::sim::Sim;

/// The key of an object in the harness's maps: `resource|namespace|name`.
pub(crate) fn object_key(resource: &str, ns: Option<&str>, name: &str) -> String {
    // Built by hand: made for every write, delivery and lookup of a run (`format!` costs
    // several times more).
    let ns = ns.unwrap_or("");
    let mut k = String::with_capacity(resource.len() + ns.len() + name.len() + 2);
    k.push_str(resource);
    k.push('|');
    k.push_str(ns);
    k.push('|');
    k.push_str(name);
    k
}

/// The key of an object value of `resource`.
pub(crate) fn key_of_value(resource: &str, v: &Value) -> String {
    let meta = v.get("metadata");
    let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str);
    object_key(resource, field("namespace"), field("name").unwrap_or(""))
}

/// An object's resourceVersion as a number.
pub(crate) fn rv_of(v: &Value) -> u64 {
    v.at("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A run's trace: its lines in one buffer, each ended by a newline.
pub(crate) struct Trace {
    text: String,
    /// Where each line starts (a line may hold newlines of its own).
    starts: Vec<usize>,
    /// Whether lines are kept: a sampled schedule that passes runs without (its trace is
    /// never shown); a failing one is run again with it, as the same schedule gives the same
    /// trace.
    on: bool,
}

impl Trace {
    pub(crate) fn new(on: bool) -> Self {
        Self {
            text: String::new(),
            starts: Vec::new(),
            on,
        }
    }

    /// Whether lines are kept (callers skip building a line otherwise).
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    pub(crate) fn push(&mut self, line: impl std::fmt::Display) {
        use std::fmt::Write as _;
        if !self.on {
            return;
        }
        self.starts.push(self.text.len());
        let _ = writeln!(self.text, "{line}");
    }

    /// The last `n` lines.
    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        let from = self.starts.len().saturating_sub(n);
        let ends = self.starts.iter().skip(from + 1).copied().chain([self.text.len()]);
        self.starts[from..]
            .iter()
            .zip(ends)
            .map(|(&s, e)| self.text.get(s..e - 1).unwrap_or_default().to_string())
            .collect()
    }

    /// The whole trace (a newline alone when it is empty, as the lines joined were).
    pub(crate) fn take(&mut self) -> String {
        match std::mem::take(&mut self.text) {
            t if t.is_empty() => "\n".to_string(),
            t => t,
        }
    }
}

/// State shared by the run loop and the client service of one schedule.
pub(crate) struct RunShared {
    pub trace: Trace,
    /// Per replica and controller lifetime: the version of each object the controller last
    /// read (what its informer cache holds, or a later GET/LIST answer).
    pub reads: Vec<HashMap<String, Arc<Value>>>,
    /// Per object: the state the controller's last successful write to it left.
    pub own: HashMap<String, Arc<Value>>,
    /// Controller writes so far (all lifetimes).
    pub writes: u64,
    /// Crash right after this write reaches the server.
    pub crash_after_write: Option<u64>,
    /// Set when that crash happened: the in-flight reconcile is dropped.
    pub crashed: bool,
    pub crash_notify: Arc<tokio::sync::Notify>,
    /// Revisions written by the controller (the others come from the world or the collector).
    pub controller_rvs: HashSet<u64>,
    pub failure: Option<Failure>,
    pub invariants: Arc<Vec<Invariant>>,
    /// Check for lost updates.
    pub check_lost_updates: bool,
    /// The revision the invariants last held at (the state has not changed since).
    pub checked_rv: Option<u64>,
    /// The [`Harness::unique`](super::Harness::unique) invariants' indexes.
    pub uniques: Vec<UniqueIndex>,
    pub parsed: Arc<Parsed>,
    /// Requests answered and watch chunks sent (controller mode: is the controller idle?).
    pub served: u64,
    /// Requests being answered (a watch counts only while it starts).
    pub inflight: u64,
    /// What the controller's `run` stream reported (controller mode).
    pub reconciled: Vec<Reconciled>,
    /// The controller's watches by resource (controller mode).
    pub watches: HashMap<String, Watching>,
    /// Every resource the controller watched in this run, across restarts (controller mode:
    /// what a fault's informer index names).
    pub watched: BTreeSet<String>,
    /// Controller mode: resources whose watches send nothing for now (a delayed informer),
    /// with the wakers of their streams waiting.
    pub held: HashMap<String, Vec<std::task::Waker>>,
    /// Controller mode, after a time-travel restart: the revision the lagging server's
    /// watch cache is at, and the resources whose first streaming list it has answered.
    pub lagging: Option<(u64, HashSet<String>)>,
    /// With a standby: the Lease and the replicas' identities.
    pub lease: Option<LeaseName>,
    /// Cut the writer off from the server right after this write (a hand-over).
    pub stall_after_write: Option<u64>,
    /// The replica whose reconcile is running (only a reconcile's write stalls).
    pub reconciling: Option<usize>,
    /// Set when a write stalled: its reconcile is set aside until `resume` is notified.
    pub stalled: bool,
    pub stall_notify: Arc<tokio::sync::Notify>,
    /// Per replica: its stalled write's answer may arrive (one each: a waiter of one must not
    /// take the other's wake-up).
    pub resume_notify: Vec<Arc<tokio::sync::Notify>>,
}

/// The Lease the replicas are elected by, and who they are.
pub(crate) struct LeaseName {
    pub namespace: String,
    pub name: String,
    pub identities: Vec<String>,
}

impl RunShared {
    pub(crate) fn new(invariants: Arc<Vec<Invariant>>, check_lost_updates: bool, traced: bool) -> Self {
        Self {
            trace: Trace::new(traced),
            reads: vec![HashMap::default()],
            own: HashMap::default(),
            writes: 0,
            crash_after_write: None,
            crashed: false,
            crash_notify: Arc::new(tokio::sync::Notify::new()),
            controller_rvs: HashSet::default(),
            failure: None,
            invariants,
            check_lost_updates,
            checked_rv: None,
            uniques: Vec::new(),
            parsed: Arc::default(),
            served: 0,
            inflight: 0,
            reconciled: Vec::new(),
            watches: HashMap::default(),
            watched: BTreeSet::new(),
            held: HashMap::default(),
            lagging: None,
            lease: None,
            stall_after_write: None,
            reconciling: None,
            stalled: false,
            stall_notify: Arc::new(tokio::sync::Notify::new()),
            resume_notify: (0..2).map(|_| Arc::new(tokio::sync::Notify::new())).collect(),
        }
    }

    /// Remembers that replica `replica` read `v` (its cache moved, or it asked the server).
    pub(crate) fn saw(&mut self, replica: usize, key: String, v: Arc<Value>) {
        if let Some(r) = self.reads.get_mut(replica) {
            r.insert(key, v);
        }
    }

    /// A write of replica `replica` that reached the server while the Lease named another
    /// holder: a deposed leader wrote.
    fn deposed(&self, sim: &Sim, replica: usize) -> Option<String> {
        let l = self.lease.as_ref()?;
        let me = l.identities.get(replica)?;
        let lease = sim
            .get("leases.coordination.k8s.io", Some(&l.namespace), &l.name)
            .ok()?;
        let holder = lease.at("/spec/holderIdentity").and_then(Value::as_str)?;
        (!holder.is_empty() && holder != me).then(|| holder.to_string())
    }

    /// Records the first failure of the run.
    pub(crate) fn fail(&mut self, oracle: Oracle, detail: String) {
        if self.failure.is_none() {
            self.trace.push(format!("  FAIL {}: {detail}", oracle.as_str()));
            self.failure = Some(Failure::new(oracle, detail));
        }
    }
}

/// Locks, ignoring poisoning (a panicking reconcile is caught and reported; the data stays
/// consistent because every update is a single assignment).
pub(crate) fn lock(m: &Mutex<RunShared>) -> MutexGuard<'_, RunShared> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the invariants against the server's state; the first broken one fails the run. A
/// state they already held at (a reconcile that wrote nothing) is not checked again.
/// `after` names the step for a failure (made only then).
pub(crate) fn check_invariants(sim: &Sim, shared: &mut RunShared, after: impl Fn() -> String) {
    let rv = sim.current_rv();
    if shared.failure.is_some() || shared.checked_rv == Some(rv) {
        return;
    }
    let broken = shared.uniques.iter_mut().find_map(|u| {
        u.update(sim)
            .err()
            .map(|e| format!("{:?} broken after {}: {e}", u.spec.name, after()))
    });
    if let Some(detail) = broken {
        shared.fail(Oracle::Invariant, detail);
        return;
    }
    let parsed = shared.parsed.clone();
    let world = World { sim, parsed: &parsed };
    for inv in shared.invariants.clone().iter() {
        if let Err(e) = (inv.check)(&world) {
            shared.fail(
                Oracle::Invariant,
                format!("{:?} broken after {}: {e}", inv.name, after()),
            );
            return;
        }
    }
    shared.checked_rv = Some(rv);
}

/// The index of one [`Harness::unique`](super::Harness::unique) invariant: which key each
/// object holds, and which objects hold each key.
pub(crate) struct UniqueIndex {
    pub spec: Unique,
    /// The revision the index is at.
    at: u64,
    key_of: HashMap<String, String>,
    holders: HashMap<String, BTreeSet<String>>,
}

impl UniqueIndex {
    pub(crate) fn new(spec: Unique) -> Self {
        Self {
            spec,
            at: 0,
            key_of: HashMap::default(),
            holders: HashMap::default(),
        }
    }

    fn set(&mut self, object: String, key: Option<String>, touched: &mut BTreeSet<String>) {
        if let Some(old) = self.key_of.remove(&object) {
            if let Some(h) = self.holders.get_mut(&old) {
                h.remove(&object);
            }
        }
        if let Some(k) = key {
            self.holders.entry(k.clone()).or_default().insert(object.clone());
            touched.insert(k.clone());
            self.key_of.insert(object, k);
        }
    }

    /// Takes in the changes since the last call (everything again after a compaction) and
    /// fails when a key they touched has more than one holder.
    fn update(&mut self, sim: &Sim) -> Result<(), String> {
        let now = sim.current_rv();
        let name = |v: &Value| key_of_value("", v).trim_start_matches('|').replace('|', "/");
        let mut touched = BTreeSet::new();
        match sim.events_after(&self.spec.resource, self.at, usize::MAX) {
            Ok(events) => {
                for ev in events {
                    let key = if ev.kind == "DELETED" {
                        None
                    } else {
                        (self.spec.key)(&ev.object)
                    };
                    self.set(name(&ev.object), key, &mut touched);
                }
            }
            Err(_) => {
                self.key_of.clear();
                self.holders.clear();
                for o in sim.objects_at(&self.spec.resource, now).unwrap_or_default() {
                    let key = (self.spec.key)(&o);
                    self.set(name(&o), key, &mut touched);
                }
            }
        }
        self.at = now;
        for k in touched {
            if let Some(h) = self.holders.get(&k).filter(|h| h.len() > 1) {
                return Err(format!("{} {:?} hold the same key {k:?}", self.spec.resource, h));
            }
        }
        Ok(())
    }
}

/// The controller's watches of one resource (controller mode).
#[derive(Default)]
pub(crate) struct Watching {
    /// Open now.
    pub open: u64,
    /// The revision the last one opened at or sent an event of.
    pub at: u64,
}

/// Counts a watch as open until its body is dropped.
struct WatchOpen {
    shared: Arc<Mutex<RunShared>>,
    resource: String,
    counted: bool,
}

impl Drop for WatchOpen {
    fn drop(&mut self) {
        if self.counted {
            if let Some(w) = lock(&self.shared).watches.get_mut(&self.resource) {
                w.open = w.open.saturating_sub(1);
            }
        }
    }
}

impl RunShared {
    /// Whether every resource the controller watched has a watch open that has sent
    /// everything up to now (controller mode: nothing is on its way to the controller).
    pub(crate) fn watches_caught_up(&self, sim: &Sim) -> bool {
        // A held watch (a delayed informer) is behind on purpose: the controller is idle as
        // far as what it was shown goes.
        self.watches
            .iter()
            .filter(|(res, _)| !self.held.contains_key(*res))
            .all(|(res, w)| w.open > 0 && sim.events_after(res, w.at, 1).is_ok_and(|e| e.is_empty()))
    }
}

/// A replica's short name in traces: its identity without the `replica-` prefix.
pub(crate) fn short(identities: &[String], replica: usize) -> String {
    identities.get(replica).map_or_else(
        || replica.to_string(),
        |i| i.strip_prefix("replica-").unwrap_or(i).to_string(),
    )
}

/// What the client service reads of a request's body: its metadata's names and precondition.
/// Parsed alone (the rest of the body skipped, not built), as the server parses the body too.
#[derive(serde::Deserialize, Default)]
struct Sent {
    #[serde(default)]
    metadata: SentMeta,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SentMeta {
    name: Option<String>,
    generate_name: Option<String>,
    resource_version: Option<String>,
}

impl Sent {
    /// The body's metadata, or none when it is not an object holding string names (a JSON
    /// patch, an empty body; such a body is the server's to refuse).
    fn of(body: &[u8]) -> SentMeta {
        serde_json::from_slice::<Sent>(body)
            .map(|s| s.metadata)
            .unwrap_or_default()
    }
}

/// A string at `pointer` in `v`.
fn named(v: Option<&Value>, pointer: &str) -> Option<String> {
    v?.at(pointer)?.as_str().map(str::to_owned)
}

/// Which object a request path names: (`plural` or `plural.group`, namespace, name).
fn target(path: &str) -> Option<(String, Option<String>, Option<String>)> {
    // Read in place (every request asks): `/api/v1/…` or `/apis/<group>/<version>/…`, then
    // `namespaces/<ns>/<plural>[/<name>…]` or `<plural>[/<name>…]`.
    let mut segs = path.split('/').filter(|s| !s.is_empty());
    let group = match (segs.next()?, segs.next()?) {
        ("api", "v1") => "",
        ("apis", g) => {
            segs.next()?;
            g
        }
        _ => return None,
    };
    let first = segs.next()?;
    let (second, third) = (segs.next(), segs.next());
    let (ns, plural, name) = match (first, second, third) {
        ("namespaces", Some(ns), Some(plural)) => (Some(ns.to_string()), plural, segs.next()),
        _ => (None, first, second),
    };
    let mut resource = String::with_capacity(plural.len() + 1 + group.len());
    resource.push_str(plural);
    if !group.is_empty() {
        resource.push('.');
        resource.push_str(group);
    }
    Some((resource, ns, name.map(str::to_string)))
}

/// The in-process service behind the controller's `kube::Client`.
#[derive(Clone)]
pub(crate) struct InProcess {
    pub sim: Arc<Sim>,
    pub shared: Arc<Mutex<RunShared>>,
    /// Whose client (0 without a standby).
    pub replica: usize,
    /// A leader elector's client: its Lease requests are not the controller's.
    pub elector: bool,
}

impl tower::Service<Request<kube::client::Body>> for InProcess {
    type Response = Response<UnsyncBoxBody<Bytes, std::io::Error>>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let this = self.clone();
        async move { Ok(this.serve(req).await) }.boxed()
    }
}

impl InProcess {
    async fn serve(self, req: Request<kube::client::Body>) -> Response<UnsyncBoxBody<Bytes, std::io::Error>> {
        let (parts, body) = req.into_parts();
        let watch = parts.method == Method::GET
            && parts
                .uri
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        if watch {
            return self.watch(parts, body).await;
        }
        if self.elector {
            let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let resp = self.sim.handle(Request::from_parts(parts, Full::new(body))).await;
            let (rparts, rbody) = resp.into_parts();
            let rbytes = rbody.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            return Response::from_parts(rparts, Full::new(rbytes).map_err(|never| match never {}).boxed_unsync());
        }
        let me = self.replica;
        lock(&self.shared).inflight += 1;
        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let method = parts.method.clone();
        let path = parts.uri.path().to_string();
        let write = matches!(method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE);
        let target = target(&path);
        let sent = Sent::of(&body);
        let precondition = sent.resource_version.as_deref().is_some_and(|s| !s.is_empty());
        // The state before the write: only the lost-update check needs it.
        let unguarded = matches!(method, Method::PUT | Method::PATCH) && !precondition;
        let before = match (&target, unguarded && lock(&self.shared).check_lost_updates) {
            (Some((res, ns, Some(name))), true) => self.sim.get_parsed(res, ns.as_deref(), name).ok(),
            _ => None,
        };
        let resp = self.sim.handle(Request::from_parts(parts, Full::new(body))).await;
        let (rparts, rbody) = resp.into_parts();
        let rbytes = rbody.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let code = rparts.status.as_u16();
        // A write's answer is the version it stored, which the server parsed already.
        let ok = (200..300).contains(&code);
        let mut answer: Option<Arc<Value>> = self.sim.parsed_of_bytes(&rbytes);
        // Only a success's answer is read below: an error's (a conflict, a 404) is not parsed.
        if answer.is_none() && ok {
            answer = serde_json::from_slice(&rbytes).ok().map(Arc::new);
            if let (true, Some(a)) = (write, &answer) {
                // The stored version itself: its delivery need not parse it again.
                self.sim.remember_parsed(&rbytes, a);
            }
        }
        let (crash, stall) = {
            let mut sh = lock(&self.shared);
            if write {
                sh.writes += 1;
                let n = sh.writes;
                // Named only for the trace and the failures (a passing run has neither).
                let answered = answer.clone().filter(|_| ok);
                let what = || {
                    target
                        .as_ref()
                        .map(|(r, ns, name)| {
                            format!(
                                "{r} {}{}",
                                ns.as_deref().map(|n| format!("{n}/")).unwrap_or_default(),
                                name.clone()
                                    .or_else(|| named(answered.as_deref(), "/metadata/name"))
                                    .or_else(|| sent.name.clone())
                                    .or_else(|| sent.generate_name.as_ref().map(|g| format!("{g}*")))
                                    .unwrap_or_default()
                            )
                        })
                        .unwrap_or_else(|| path.clone())
                };
                let status = if path.ends_with("/status") { " (status)" } else { "" };
                let rv = answer.as_deref().filter(|_| ok).map(rv_of).unwrap_or(0);
                let by = match &sh.lease {
                    Some(l) => format!(" by {}", short(&l.identities, me)),
                    None => String::new(),
                };
                if sh.trace.on() {
                    let what = what();
                    sh.trace
                        .push(format!("  write #{n}{by} {method} {what}{status} -> {code} rv={rv}"));
                }
                if ok {
                    if let Some(holder) = sh.deposed(&self.sim, me) {
                        let what = what();
                        let detail = format!(
                            "write #{n} {method} {what}{status} by replica {} reached the server while {holder} held the lease (a leader deposed in the middle of a reconcile wrote on)",
                            short(sh.lease.as_ref().map_or(&[][..], |l| l.identities.as_slice()), me)
                        );
                        sh.fail(Oracle::DeposedWrite, detail);
                    }
                }
                if ok {
                    if let (Some((res, _, _)), Some(after)) = (&target, answer.take()) {
                        sh.controller_rvs.insert(rv);
                        let key = key_of_value(res, &after);
                        if sh.check_lost_updates && !precondition && matches!(method, Method::PUT | Method::PATCH) {
                            let seen = sh.reads.get(me).and_then(|r| r.get(&key)).cloned();
                            if let (Some(seen), Some(before)) = (seen, &before) {
                                let own = sh.own.get(&key).cloned();
                                let lost = lost_update(&seen, before, &after, own.as_deref());
                                if !lost.is_empty() {
                                    let what = what();
                                    let detail = format!(
                                        "write #{n} {method} {what}{status} changed {lost:?}, which had changed since the controller read it at resourceVersion {} (server was at {})",
                                        rv_of(&seen),
                                        rv_of(before)
                                    );
                                    sh.fail(Oracle::LostUpdate, detail);
                                }
                            }
                        }
                        sh.own.insert(key, after);
                    }
                    check_invariants(&self.sim, &mut sh, || format!("write #{n}"));
                }
                if sh.crash_after_write == Some(n) {
                    sh.crashed = true;
                    sh.trace.push(format!("  CRASH after write #{n} (its answer is lost)"));
                    sh.crash_notify.notify_one();
                    (true, false)
                } else if sh.stall_after_write == Some(n) && sh.reconciling == Some(me) {
                    sh.stall_after_write = None;
                    sh.stalled = true;
                    let who = short(sh.lease.as_ref().map_or(&[][..], |l| l.identities.as_slice()), me);
                    sh.trace.push(format!(
                        "  STALL after write #{n}: {who} is cut off from the server (the answer and its lease renewals are held up)"
                    ));
                    sh.stall_notify.notify_one();
                    (false, true)
                } else {
                    (false, false)
                }
            } else {
                if let (true, Some((res, _, name)), Some(a)) = (ok && method == Method::GET, &target, &answer) {
                    if name.is_some() {
                        sh.saw(me, key_of_value(res, a), a.clone());
                    } else if let Some(items) = a.get("items").and_then(Value::as_array) {
                        for it in items {
                            sh.saw(me, key_of_value(res, it), Arc::new(it.clone()));
                        }
                    }
                }
                (false, false)
            }
        };
        if crash {
            // The process is gone: the answer never arrives.
            futures::future::pending::<()>().await;
        }
        if stall {
            // Set aside by the harness until the hand-over is done and the answer may arrive.
            let resume = lock(&self.shared).resume_notify.get(me).cloned();
            if let Some(resume) = resume {
                resume.notified().await;
            }
        }
        {
            let mut sh = lock(&self.shared);
            sh.inflight = sh.inflight.saturating_sub(1);
            sh.served += 1;
        }
        Response::from_parts(rparts, Full::new(rbytes).map_err(|never| match never {}).boxed_unsync())
    }

    /// A watch (controller mode: the controller's own informers): streamed as the server
    /// sends it; each event is what the controller read, and each chunk counts as activity.
    async fn watch(
        self,
        parts: http::request::Parts,
        body: kube::client::Body,
    ) -> Response<UnsyncBoxBody<Bytes, std::io::Error>> {
        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let resource = target(parts.uri.path()).map(|t| t.0).unwrap_or_default();
        let from: u64 = parts
            .uri
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("resourceVersion=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let streaming_list = parts
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "sendInitialEvents=true"));
        let mut req = Request::from_parts(parts, Full::new(body));
        if streaming_list {
            let mut sh = lock(&self.shared);
            if let Some((at, listed)) = &mut sh.lagging {
                // Only the first list of each resource: the lagging cache catches up after.
                if listed.insert(resource.clone()) {
                    req.extensions_mut().insert(crate::sim::LaggingCache(*at));
                    let at = *at;
                    sh.trace
                        .push(format_args!("  {resource}: listed by a server behind, at rv {at}"));
                }
            }
        }
        let resp = self.sim.handle(req).await;
        let shared = self.shared.clone();
        let mut partial: Vec<u8> = Vec::new();
        {
            let mut sh = lock(&shared);
            sh.served += 1;
            if resp.status().is_success() {
                let w = sh.watches.entry(resource.clone()).or_default();
                w.open += 1;
                w.at = from;
                if !sh.watched.contains(&resource) {
                    sh.watched.insert(resource.clone());
                }
            }
        }
        let open = WatchOpen {
            shared: shared.clone(),
            resource: resource.clone(),
            counted: resp.status().is_success(),
        };
        let held_shared = shared.clone();
        let held_resource = resource.clone();
        resp.map(move |b| {
            let body = b
                .map_frame(move |f| {
                    let _open = &open;
                    if let Some(d) = f.data_ref() {
                        partial.extend_from_slice(d);
                        let mut sh = lock(&shared);
                        sh.served += 1;
                        while let Some(i) = partial.iter().position(|c| *c == b'\n') {
                            let line: Vec<u8> = partial.drain(..=i).collect();
                            let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                                continue;
                            };
                            let kind = ev.get("type").and_then(Value::as_str).unwrap_or("");
                            if let (Some(o), true) =
                                (ev.get("object"), matches!(kind, "ADDED" | "MODIFIED" | "DELETED"))
                            {
                                let rv = rv_of(o);
                                if let Some(w) = sh.watches.get_mut(&resource) {
                                    w.at = w.at.max(rv);
                                }
                                sh.saw(0, key_of_value(&resource, o), Arc::new(o.clone()));
                            }
                        }
                    }
                    f
                })
                .boxed_unsync();
            Held {
                inner: body,
                shared: held_shared,
                resource: held_resource,
            }
            .boxed_unsync()
        })
    }
}

/// A watch's body that sends nothing while its resource is held (a delayed informer, in
/// controller mode): the server's events wait behind it, in order.
struct Held {
    inner: UnsyncBoxBody<Bytes, std::io::Error>,
    shared: Arc<Mutex<RunShared>>,
    resource: String,
}

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        {
            let mut sh = lock(&self.shared);
            if let Some(waiting) = sh.held.get_mut(&self.resource) {
                if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                    waiting.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }
}

impl RunShared {
    /// Holds `resource`'s watches: they send nothing until [`release`](Self::release).
    pub(crate) fn hold(&mut self, resource: &str) {
        self.held.entry(resource.to_string()).or_default();
    }

    /// Lets `resource`'s watches send again (what waited arrives in order).
    pub(crate) fn release(&mut self, resource: &str) {
        for w in self.held.remove(resource).unwrap_or_default() {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::target;
    use proptest::prelude::*;

    /// The plain reading `target` does in place: the segments collected, then matched.
    fn target_model(path: &str) -> Option<(String, Option<String>, Option<String>)> {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, rest) = match segs.as_slice() {
            ["api", "v1", rest @ ..] => ("", rest.to_vec()),
            ["apis", g, _, rest @ ..] => (*g, rest.to_vec()),
            _ => return None,
        };
        let (ns, rest) = match rest.as_slice() {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_string()), rest.to_vec()),
            _ => (None, rest),
        };
        let plural = rest.first()?;
        let resource = if group.is_empty() {
            (*plural).to_string()
        } else {
            format!("{plural}.{group}")
        };
        Some((resource, ns, rest.get(1).map(|s| (*s).to_string())))
    }

    proptest! {
        #[test]
        fn reads_a_path_as_the_model_does(
            segs in proptest::collection::vec(
                prop_oneof![Just("api"), Just("apis"), Just("v1"), Just("apps"), Just("namespaces"),
                    Just("ns"), Just("pods"), Just("status"), Just("")],
                0..9,
            ),
            lead in any::<bool>(),
        ) {
            let path = format!("{}{}", if lead { "/" } else { "" }, segs.join("/"));
            prop_assert_eq!(target(&path), target_model(&path));
        }
    }

    #[test]
    fn paths_name_their_objects() {
        assert_eq!(
            target("/apis/apps/v1/namespaces/ns/deployments/web/status"),
            Some(("deployments.apps".into(), Some("ns".into()), Some("web".into())))
        );
        assert_eq!(
            target("/api/v1/namespaces/a"),
            Some(("namespaces".into(), None, Some("a".into())))
        );
        assert_eq!(target("/api/v1/pods"), Some(("pods".into(), None, None)));
        assert_eq!(
            target("/api/v1/namespaces/ns/pods"),
            Some(("pods".into(), Some("ns".into()), None))
        );
        assert_eq!(
            target("/apis/samplecontroller.k8s.io/v1alpha1/namespaces/default/foos/x"),
            Some((
                "foos.samplecontroller.k8s.io".into(),
                Some("default".into()),
                Some("x".into())
            ))
        );
        assert_eq!(target("/api/v1/namespaces"), Some(("namespaces".into(), None, None)));
        assert_eq!(target("/api/v1"), None);
        assert_eq!(target("/apis/apps"), None);
        assert_eq!(target("/version"), None);
    }
}
