//! One schedule, start to end: the server, the world's changes, the informers, the queue, the
//! controller's lifetimes, the faults and the oracles; and the check loop around it
//! (baseline, sampling, shrinking, saving, replay).

use crate::sim::util::JsonAt as _;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

// Keys are hashed on every step; none of these maps is iterated in an order that matters.
use foldhash::{HashMap, HashSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::client::{
    check_invariants, key_of_value, lock, object_key, rv_of, short, InProcess, LeaseName, RunShared, UniqueIndex,
};
use super::oracle::{differing, normalize};
use super::recording::{merge, Change, WorldEvent};
use super::schedule::{sample, save, Extent, Saved};
use super::{
    Env, Failure, Fault, Feed, Harness, HarnessError, Oracle, Recording, Report, Restart, Schedule, WatchSpec, World,
};
use crate::leader::{KubeLeaseLock, LeaderElector, Leadership};
use crate::sim::{HistoryEvent, Sim, SimConfig};

mod controller;

/// Virtual time per step: requeue timers interleave with the recorded changes.
const STEP: Duration = Duration::from_millis(10);
/// A reconcile still running after this much virtual time is stuck.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(600);
/// The simulated clock's start (unix seconds): 2026-01-01T00:00:00Z.
const CLOCK_BASE: u64 = 1_767_225_600;
/// The Lease a leader and its standby are elected by (in `default`).
const LEASE: &str = "controller-leader";
/// The identities of the leader and its standby.
const REPLICAS: [&str; 2] = ["replica-a", "replica-b"];
/// Lines of the trace a failure shows.
const TAIL: usize = 40;

/// What one schedule did.
pub(crate) struct Outcome {
    pub trace: String,
    /// Whether `trace` (and a failure's `trace_tail`) was kept; see [`retrace`].
    pub traced: bool,
    pub failure: Option<Failure>,
    pub end: BTreeMap<String, Value>,
    pub steps: u64,
    pub writes: u64,
    pub reconciles: u64,
    pub revisions: u64,
    /// Informers faults can name: the controller's watched resources in controller mode.
    pub informers: usize,
}

/// A primary object's key.
type Key = (Option<String>, String);

/// An object the garbage collector may delete: resource, namespace, name.
type Dependent = (String, Option<String>, String);

fn show(k: &Key) -> String {
    match &k.0 {
        Some(ns) => format!("{ns}/{}", k.1),
        None => k.1.clone(),
    }
}

/// One informer: its cache (typed, for the controller), what its database holds, and where
/// its watch is.
struct Informer {
    spec: WatchSpec,
    feed: Box<dyn Feed>,
    /// The revision delivered up to.
    cursor: u64,
    /// The persisted cache: what a restart from the database starts with.
    db: BTreeMap<String, Arc<Value>>,
    /// No deliveries before this step.
    delayed_until: u64,
    /// The revisions of the last events delivered (for duplicates).
    recent: VecDeque<u64>,
    /// The next event, once looked up (the history only grows).
    next: Option<HistoryEvent>,
    /// The server revision at which there was no next event.
    none_at: Option<u64>,
}

/// One lifetime of the controller process.
struct Lifetime<K: Resource<DynamicType = ()> + Clone + 'static, Ctx> {
    /// `None` before the first start.
    ctx: Option<Arc<Ctx>>,
    primary: Store<K>,
    queue: VecDeque<Key>,
    /// What `queue` holds (a key is queued once).
    queued: HashSet<Key>,
    timers: BTreeMap<(Instant, u64), Key>,
    /// Each key's timer in `timers` (one per key).
    timer_of: HashMap<Key, (Instant, u64)>,
    /// Reconciles of each object since a change from the world.
    counts: HashMap<Key, u32>,
}

/// One replica of the controller process: its informers and its current lifetime; with a
/// standby, its leader elector.
struct Replica<K: Resource<DynamicType = ()> + Clone + 'static, Ctx> {
    informers: Vec<Informer>,
    life: Lifetime<K, Ctx>,
    elector: Option<LeaderElector<KubeLeaseLock>>,
    /// Cut off from the server (a hand-over): no elector rounds, no deliveries.
    partitioned: bool,
}

/// A future run under [`Run::guarded`]: it can be set aside (a stall) and polled again.
type Guard<T> = Pin<Box<tokio::time::Timeout<futures::future::CatchUnwind<AssertUnwindSafe<BoxFuture<'static, T>>>>>>;

fn guard<T>(fut: BoxFuture<'static, T>) -> Guard<T> {
    Box::pin(tokio::time::timeout(
        RECONCILE_TIMEOUT,
        AssertUnwindSafe(fut).catch_unwind(),
    ))
}

/// A deposed leader's reconcile, set aside while it waits for its answer.
struct Stalled<K, Ctx, E> {
    replica: usize,
    key: Key,
    obj: Arc<K>,
    ctx: Arc<Ctx>,
    fut: Guard<Result<Action, E>>,
    /// The step its answer arrives at.
    resume_at: u64,
}

enum Guarded<T> {
    Done(T),
    Crashed,
    /// A write stalled (a hand-over): the future is set aside, not finished.
    Stalled,
    Panicked(String),
    TimedOut,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic)".into())
}

/// Parses the requeue delay out of kube's `Action`, which keeps it private (its `Debug` is
/// `Action { requeue_after: Some(5s) }`).
pub(crate) fn requeue_after(a: &Action) -> Option<Duration> {
    if *a == Action::await_change() {
        return None;
    }
    // A controller returns the same few actions over and over (a requeue on success, another
    // on error): the last few answers are kept.
    const KEEP: usize = 4;
    thread_local! {
        static LAST: std::cell::RefCell<Vec<(Action, Option<Duration>)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    if let Some(d) = LAST.with_borrow(|l| l.iter().find(|(b, _)| b == a).map(|(_, d)| *d)) {
        return d;
    }
    let d = parse_requeue_after(a);
    LAST.with_borrow_mut(|l| {
        if l.len() == KEEP {
            l.remove(0);
        }
        l.push((a.clone(), d));
    });
    d
}

fn parse_requeue_after(a: &Action) -> Option<Duration> {
    let dbg = format!("{a:?}");
    let inner = dbg.split("Some(").nth(1)?.split(')').next()?;
    let (num, unit) = inner
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|i| inner.split_at(i))?;
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "µs" | "us" => n / 1e6,
        "ns" => n / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

/// A recorded merge patch split into what goes to the object (`None`: nothing) and its
/// `status` (`None`: unchanged); copied only when it holds both.
fn split_status(p: &Value) -> (Option<Cow<'_, Value>>, Option<&Value>) {
    let Some(m) = p.as_object() else {
        return (None, None);
    };
    match m.get("status") {
        None if m.is_empty() => (None, None),
        None => (Some(Cow::Borrowed(p)), None),
        Some(s) if m.len() == 1 => (None, Some(s)),
        Some(s) => {
            let rest: serde_json::Map<String, Value> = m
                .iter()
                .filter(|(k, _)| *k != "status")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (Some(Cow::Owned(Value::Object(rest))), Some(s))
        }
    }
}

/// An object with the fields only the server sets removed (what the world "sends").
pub(crate) fn world_body(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(k);
        }
    }
    v
}

/// `plural` or `plural.group` of an owner reference's kind.
fn owner_resource(o: &Value) -> Option<String> {
    let kind = o.get("kind")?.as_str()?;
    let api_version = o.get("apiVersion")?.as_str()?;
    let plural = crate::replay::plural_of(kind);
    Some(match api_version.split_once('/') {
        Some((g, _)) => format!("{plural}.{g}"),
        None => plural,
    })
}

struct Run<'h, K: Resource<DynamicType = ()> + Clone + 'static, Ctx, E> {
    h: &'h Harness<K, Ctx, E>,
    /// Whether the trace is kept (see [`Trace`](super::client::Trace)).
    traced: bool,
    sim: Arc<Sim>,
    shared: Arc<Mutex<RunShared>>,
    rng: ChaCha8Rng,
    world: VecDeque<WorldEvent>,
    /// The controller's replicas: one, or a leader and a standby.
    reps: Vec<Replica<K, Ctx>>,
    /// The replica that reconciles: the leader.
    lead: usize,
    /// When the electors run their next round.
    next_round: Instant,
    /// A deposed leader's reconcile, waiting for its answer.
    stalled: Option<Stalled<K, Ctx, E>>,
    step: u64,
    faults: Vec<Fault>,
    start: Instant,
    /// The revision after the initial state was loaded (time travel goes no further back).
    start_rv: u64,
    last_world: Instant,
    reconciles: u64,
    /// Resources compared at the end.
    compared: BTreeSet<String>,
    /// The revision up to which the collector looked.
    gc_seen: u64,
    /// Objects that name owners, by owner key (`resource|namespace|name`).
    gc_index: HashMap<String, BTreeSet<Dependent>>,
    /// The orphans as of `gc_seen` (checked again when the revision moves).
    gc_pending: BTreeSet<Dependent>,
    /// Controller mode: reconciles of each object since the last change from the world.
    counts: HashMap<String, u32>,
    /// Controller mode: held resources (delayed informers) and the step each delay ends at.
    held_until: BTreeMap<String, u64>,
    seq: u64,
}

impl<'h, K, Ctx, E> Run<'h, K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    fn new(
        h: &'h Harness<K, Ctx, E>,
        recordings: &[Recording],
        schedule: &Schedule,
        traced: bool,
    ) -> Result<Self, HarnessError> {
        let sim = Sim::in_process(
            SimConfig::default()
                .history_max_events(usize::MAX)
                .history_max_age(Duration::from_secs(100 * 365 * 86_400)),
        )?;
        sim.set_clock(CLOCK_BASE);
        let known: BTreeSet<String> = h.watches.iter().map(|w| w.resource.clone()).collect();
        for def in &h.resources {
            sim.register_crd(def.clone());
        }
        for w in &h.watches {
            if !sim.knows(&w.resource) {
                sim.register_crd(w.def.clone());
            }
        }
        let sim = Arc::new(sim);
        let mut run_shared = RunShared::new(Arc::new(h.invariants.clone()), h.lost_updates, traced);
        run_shared.uniques = h.uniques.iter().cloned().map(UniqueIndex::new).collect();
        let shared = Arc::new(Mutex::new(run_shared));
        let (initial, events) = merge(recordings);
        let mut compared = known;
        for ev in &initial {
            compared.insert(ev.resource.clone());
            let ns = ev.object.at("/metadata/namespace").and_then(Value::as_str);
            sim.create(&ev.resource, ns, world_body(&ev.object))
                .map_err(|e| HarnessError::Recording(format!("{}: the initial object is refused: {e}", ev.origin)))?;
        }
        for ev in &events {
            compared.insert(ev.resource.clone());
        }
        let start_rv = sim.current_rv();
        let replicas = if h.election.is_some() { 2 } else { 1 };
        let lease = match &h.election {
            None => None,
            Some(c) => {
                if h.controller.is_some() {
                    return Err(HarnessError::Config(
                        "leader_election runs a reconcile function the harness drives, not a Controller (for_controller)"
                            .into(),
                    ));
                }
                if c.retry_period.is_zero()
                    || c.retry_period >= c.renew_deadline
                    || c.renew_deadline >= c.lease_duration
                {
                    return Err(HarnessError::Config(format!(
                        "leader election needs 0 < retry_period < renew_deadline < lease_duration, not {c:?}"
                    )));
                }
                Some(LeaseName {
                    namespace: "default".into(),
                    name: LEASE.into(),
                    identities: REPLICAS.iter().map(|s| (*s).to_string()).collect(),
                })
            }
        };
        let reps = (0..replicas)
            .map(|r| {
                let informers = h
                    .watches
                    .iter()
                    .map(|spec| {
                        let (feed, _, _) = (spec.make)();
                        Informer {
                            spec: spec.clone(),
                            feed,
                            cursor: start_rv,
                            db: BTreeMap::new(),
                            delayed_until: 0,
                            recent: VecDeque::new(),
                            next: None,
                            none_at: None,
                        }
                    })
                    .collect();
                let elector = h.election.zip(lease.as_ref()).map(|(config, l)| {
                    let client = kube::Client::new(
                        InProcess {
                            sim: sim.clone(),
                            shared: shared.clone(),
                            replica: r,
                            elector: true,
                        },
                        "default",
                    );
                    LeaderElector::new(
                        KubeLeaseLock::new(client, &l.namespace, &l.name, &l.identities[r]),
                        config,
                    )
                });
                Replica {
                    informers,
                    life: Lifetime {
                        ctx: None,
                        primary: kube::runtime::reflector::store::Writer::<K>::default().as_reader(),
                        queue: VecDeque::new(),
                        queued: HashSet::default(),
                        timers: BTreeMap::new(),
                        timer_of: HashMap::default(),
                        counts: HashMap::default(),
                    },
                    elector,
                    partitioned: false,
                }
            })
            .collect();
        if lease.is_some() {
            let mut sh = lock(&shared);
            sh.reads = vec![HashMap::default(); replicas];
            sh.lease = lease;
        }
        let now = Instant::now();
        Ok(Run {
            h,
            traced,
            sim,
            shared,
            rng: ChaCha8Rng::seed_from_u64(schedule.seed),
            world: events.into(),
            reps,
            lead: 0,
            next_round: now,
            stalled: None,
            step: 0,
            faults: schedule.faults.clone(),
            start: now,
            start_rv,
            last_world: now,
            reconciles: 0,
            compared,
            gc_seen: 0,
            gc_index: HashMap::default(),
            gc_pending: BTreeSet::new(),
            counts: HashMap::default(),
            held_until: BTreeMap::new(),
            seq: 0,
        })
    }

    /// A fresh client and fresh typed caches for replica `r`; `feeds` receives the caches'
    /// feeds in informer order (empty when only the environment is wanted).
    fn env(&self, r: usize, feeds: &mut Vec<Box<dyn Feed>>) -> (Env, Store<K>) {
        let h = self.h;
        let client = kube::Client::new(
            InProcess {
                sim: self.sim.clone(),
                shared: self.shared.clone(),
                replica: r,
                elector: false,
            },
            "default",
        );
        let leadership = match &self.reps[r].elector {
            Some(e) => e.fenced_leadership(),
            None => Leadership::from(tokio::sync::watch::channel(true).1),
        };
        let mut stores = std::collections::HashMap::new();
        for spec in &h.watches {
            let (feed, id, store) = (spec.make)();
            feeds.push(feed);
            stores.entry(id).or_insert(store);
        }
        let primary = stores
            .get(&std::any::TypeId::of::<K>())
            .and_then(|s| s.downcast_ref::<Store<K>>())
            .cloned()
            .unwrap_or_else(|| kube::runtime::reflector::store::Writer::<K>::default().as_reader());
        (
            Env {
                client,
                stores: Arc::new(stores),
                db: None,
                leadership,
            },
            primary,
        )
    }

    /// Adds a line to the trace, built only if the trace is kept.
    fn trace(&self, line: impl FnOnce() -> String) {
        if !self.traced {
            return;
        }
        let line = line();
        let ms = (Instant::now() - self.start).as_millis();
        lock(&self.shared)
            .trace
            .push(format_args!("[{:>5} {ms:>8}ms] {line}", self.step));
    }

    fn failed(&self) -> bool {
        lock(&self.shared).failure.is_some()
    }

    fn fail(&self, oracle: Oracle, detail: String) {
        lock(&self.shared).fail(oracle, detail);
    }

    /// `"b: "` before a line about replica `r`, with a standby; nothing without one.
    fn who(&self, r: usize) -> String {
        match &lock(&self.shared).lease {
            Some(l) => format!("{}: ", short(&l.identities, r)),
            None => String::new(),
        }
    }

    /// Informer `g` of all replicas' (the first replica's, then the standby's): (replica,
    /// informer of that replica).
    fn split(&self, g: usize) -> (usize, usize) {
        let n = self.h.watches.len().max(1);
        (g / n, g % n)
    }

    fn informer(&mut self, g: usize) -> &mut Informer {
        let (r, i) = self.split(g);
        &mut self.reps[r].informers[i]
    }

    /// All replicas' informers.
    fn informer_count(&self) -> usize {
        self.reps.len() * self.h.watches.len()
    }

    /// Starts a lifetime of replica `r`: informers as `restart` says, a new context; on the
    /// leader, every primary object queued (as kube's controller does on start).
    fn start_lifetime(&mut self, r: usize, restart: Restart) {
        let current = self.sim.current_rv();
        {
            let mut sh = lock(&self.shared);
            if let Some(read) = sh.reads.get_mut(r) {
                read.clear();
            }
            sh.crashed = false;
        }
        let mut feeds = Vec::new();
        let (env, primary) = self.env(r, &mut feeds);
        let view = match restart {
            Restart::FromDatabase => None,
            Restart::Empty => Some(current),
            Restart::TimeTravel { behind } => Some(current.saturating_sub(behind).max(self.start_rv)),
        };
        for (inf, feed) in self.reps[r].informers.iter_mut().zip(feeds) {
            inf.feed = feed;
            inf.delayed_until = 0;
            inf.recent.clear();
            if let Some(rv) = view {
                let objects = match self.sim.objects_at(&inf.spec.resource, rv) {
                    Ok(o) => o,
                    Err(e) => {
                        lock(&self.shared).fail(Oracle::Harness, format!("listing {}: {e}", inf.spec.resource));
                        Vec::new()
                    }
                };
                inf.db = objects
                    .into_iter()
                    .map(|o| (key_of_value(&inf.spec.resource, &o), o))
                    .collect();
                inf.cursor = rv;
                inf.next = None;
                inf.none_at = None;
            }
            let objects: Vec<Arc<Value>> = inf.db.values().cloned().collect();
            if let Err(e) = inf.feed.reset(&objects) {
                lock(&self.shared).fail(Oracle::Harness, e);
            }
            let mut sh = lock(&self.shared);
            for (k, o) in &inf.db {
                sh.saw(r, k.clone(), o.clone());
            }
        }
        self.reps[r].life = Lifetime {
            ctx: self.h.context.as_ref().map(|c| Arc::new(c(&env))),
            primary,
            queue: VecDeque::new(),
            queued: HashSet::default(),
            timers: BTreeMap::new(),
            timer_of: HashMap::default(),
            counts: HashMap::default(),
        };
        if r == self.lead {
            self.enqueue_all();
        }
        let cursors: Vec<String> = self.reps[r].informers.iter().map(|i| i.cursor.to_string()).collect();
        self.trace(|| {
            format!(
                "{}start {restart:?}: informers at rv {}, {} queued",
                self.who(r),
                cursors.join(","),
                self.reps[r].life.queue.len()
            )
        });
    }

    /// Queues every primary object the leader has cached (a start, a takeover).
    fn enqueue_all(&mut self) {
        let inf = &self.reps[self.lead].informers[0];
        let keys: Vec<Key> = inf.db.values().flat_map(|o| (inf.spec.map)(o, None)).collect();
        for k in keys {
            self.enqueue(k, true);
        }
    }

    /// The faults injected before this step (no allocation when none is).
    fn due_faults(&self) -> Vec<Fault> {
        self.faults
            .iter()
            .filter(|f| f.step() == Some(self.step))
            .copied()
            .collect()
    }

    /// Queues `k` on the leader.
    fn enqueue(&mut self, k: Key, from_world: bool) {
        let life = &mut self.reps[self.lead].life;
        if from_world {
            life.counts.insert(k.clone(), 0);
        }
        if life.queued.insert(k.clone()) {
            life.queue.push_back(k);
        }
    }

    /// The next event of informer `g`, if any.
    fn peek(&mut self, g: usize) -> Option<&HistoryEvent> {
        let rv = self.sim.current_rv();
        let (r, i) = self.split(g);
        let inf = &mut self.reps[r].informers[i];
        if inf.next.is_none() && inf.none_at != Some(rv) {
            match self.sim.events_after(&inf.spec.resource, inf.cursor, 1) {
                Ok(mut v) => inf.next = v.pop(),
                Err(e) => {
                    lock(&self.shared).fail(Oracle::Harness, format!("watching {}: {e}", inf.spec.resource));
                }
            }
            if inf.next.is_none() {
                inf.none_at = Some(rv);
            }
        }
        self.reps[r].informers[i].next.as_ref()
    }

    async fn apply_fault(&mut self, f: Fault) {
        self.trace(|| format!("FAULT {f}"));
        let n = self.informer_count();
        match f {
            Fault::Crash { restart, .. } => self.start_lifetime(self.lead, restart),
            Fault::CrashAfterWrite { .. } | Fault::HandOverAfterWrite { .. } => {}
            Fault::Delay { informer, steps, .. } => {
                if informer < n {
                    let until = self.step + steps;
                    self.informer(informer).delayed_until = until;
                }
            }
            Fault::Relist { informer, .. } => {
                if informer < n {
                    self.relist(informer);
                }
            }
            Fault::Duplicate { informer, events, .. } => {
                if informer < n {
                    let inf = self.informer(informer);
                    let n = usize::try_from(events).unwrap_or(usize::MAX);
                    let back = inf.recent.len().saturating_sub(n);
                    if let Some(&rv) = inf.recent.get(back) {
                        inf.cursor = rv - 1;
                        inf.next = None;
                        inf.none_at = None;
                    }
                }
            }
            Fault::HandOver { .. } => {
                if self.hand_over().await {
                    let from = 1 - self.lead;
                    self.reps[from].partitioned = false;
                }
            }
        }
    }

    /// Informer `g`'s watch is gone and its history with it: list the current state.
    fn relist(&mut self, g: usize) {
        let rv = self.sim.current_rv();
        let (r, i) = self.split(g);
        let inf = &mut self.reps[r].informers[i];
        let objects = self.sim.objects_at(&inf.spec.resource, rv).unwrap_or_default();
        inf.db = objects
            .into_iter()
            .map(|o| (key_of_value(&inf.spec.resource, &o), o))
            .collect();
        inf.cursor = rv;
        inf.next = None;
        inf.none_at = None;
        let objects: Vec<Arc<Value>> = inf.db.values().cloned().collect();
        if let Err(e) = inf.feed.reset(&objects) {
            lock(&self.shared).fail(Oracle::Harness, e);
        }
        let keys: Vec<Key> = objects.iter().flat_map(|o| (inf.spec.map)(o, None)).collect();
        {
            let mut sh = lock(&self.shared);
            for (k, o) in &self.reps[r].informers[i].db {
                sh.saw(r, k.clone(), o.clone());
            }
        }
        if r == self.lead {
            for k in keys {
                self.enqueue(k, true);
            }
        }
    }

    /// One round of each replica's elector that is due (in replica order; a replica cut off
    /// from the server runs none), every `retry_period` of virtual time.
    async fn elect(&mut self) {
        let Some(config) = self.h.election else {
            return;
        };
        while Instant::now() >= self.next_round {
            self.next_round += config.retry_period;
            for r in 0..self.reps.len() {
                if self.reps[r].partitioned {
                    continue;
                }
                let Some(mut elector) = self.reps[r].elector.take() else {
                    continue;
                };
                let before = elector.fenced_leadership().flag();
                let was = *before.borrow();
                let rv = self.sim.current_rv();
                let now = elector.round().await;
                self.reps[r].elector = Some(elector);
                let wrote = self.sim.current_rv() != rv;
                let what = match (was, now, wrote) {
                    (false, true, _) => "acquires the lease",
                    (true, true, true) => "renews the lease",
                    (true, true, false) => "leads (the renewal failed)",
                    (true, false, _) => "no longer leads",
                    (false, false, _) => continue,
                };
                let at = if wrote {
                    format!(" -> rv={}", self.sim.current_rv())
                } else {
                    String::new()
                };
                self.trace(|| format!("{}{what}{at}", self.who(r)));
            }
        }
    }

    /// Whether replica `r` leads now (its elector's fenced leadership; always without one).
    fn leads(&self, r: usize) -> bool {
        self.reps[r]
            .elector
            .as_ref()
            .is_none_or(|e| e.fenced_leadership().is_leading())
    }

    /// The leader is cut off from the server: its Lease runs out on the virtual clock and
    /// the standby takes over, reconciling what it has cached. The old leader stays cut off
    /// (the caller reconnects it). False when there is no standby to take over, or a
    /// hand-over is already under way.
    async fn hand_over(&mut self) -> bool {
        let Some(config) = self.h.election else {
            self.trace(|| "  (not injected: no standby)".into());
            return false;
        };
        if self.reps.len() < 2 || self.reps.iter().any(|r| r.partitioned) {
            self.trace(|| "  (not injected: a hand-over is under way)".into());
            return false;
        }
        let (from, to) = (self.lead, 1 - self.lead);
        self.reps[from].partitioned = true;
        let began = Instant::now();
        while !self.leads(to) {
            if Instant::now() - began > 4 * config.lease_duration + 4 * config.retry_period {
                self.fail(Oracle::Harness, "the standby did not take the lease over".into());
                return false;
            }
            let now = Instant::now();
            if self.next_round > now {
                tokio::time::advance(self.next_round - now).await;
            }
            let secs = (Instant::now() - self.start).as_secs();
            self.sim.set_clock(CLOCK_BASE + secs);
            self.elect().await;
        }
        self.lead = to;
        // The deposed leader takes nothing from its queue any more; as a standby it keeps
        // its caches and its context.
        let old = &mut self.reps[from].life;
        old.queue.clear();
        old.queued.clear();
        old.timers.clear();
        old.timer_of.clear();
        self.enqueue_all();
        self.trace(|| {
            format!(
                "{}leads after {} ms cut off: {} queued",
                self.who(to),
                (Instant::now() - began).as_millis(),
                self.reps[to].life.queue.len()
            )
        });
        true
    }

    /// The deposed leader's answer arrives: its reconcile goes on (and finishes) now.
    async fn resume_stalled(&mut self) {
        let Some(mut s) = self.stalled.take() else {
            return;
        };
        self.reps[s.replica].partitioned = false;
        self.trace(|| {
            format!(
                "{}back in touch: the answer arrives, the reconcile of {} goes on",
                self.who(s.replica),
                show(&s.key)
            )
        });
        // Not `reconciling`: a hand-over cuts off the leader, not a deposed one.
        let resume = {
            let mut sh = lock(&self.shared);
            sh.stalled = false;
            sh.resume_notify.get(s.replica).cloned()
        };
        if let Some(resume) = resume {
            resume.notify_one();
        }
        let outcome = self.guarded(&mut s.fut).await;
        self.finish_reconcile(s.replica, &s.key, s.obj, s.ctx, outcome);
    }

    /// Applies the next recorded change to the server.
    fn release(&mut self) {
        let Some(ev) = self.world.pop_front() else {
            return;
        };
        self.last_world = Instant::now();
        let ns = ev.object.at("/metadata/namespace").and_then(Value::as_str);
        let name = ev.object.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let res = &ev.resource;
        let outcome = match ev.change {
            Change::Added => {
                let mut body = world_body(&ev.object);
                self.fix_owner_uids(&mut body, ns);
                self.sim.create_stored(res, ns, body).map(|o| o.rv.to_string())
            }
            Change::Modified => match ev.patch.as_deref() {
                None => Ok("no change".to_string()),
                Some(p) => {
                    // The status goes through its subresource, as the recorded writer's did.
                    let (rest, status) = split_status(p);
                    let mut out = Ok("no change".to_string());
                    if let Some(p) = rest {
                        out = self
                            .sim
                            .patch_stored(res, ns, name, &p, false)
                            .map(|o| o.rv.to_string());
                    }
                    if let (Some(s), true) = (status, out.is_ok()) {
                        out = self
                            .sim
                            .patch_stored(res, ns, name, &json!({ "status": s }), true)
                            .map(|o| o.rv.to_string());
                    }
                    out
                }
            },
            Change::Deleted => self.sim.delete_stored(res, ns, name).map(|o| o.rv.to_string()),
        };
        self.trace(|| {
            let result = match outcome {
                Ok(rv) => format!("rv={rv}"),
                Err(e) => format!("skipped: {e}"),
            };
            format!(
                "release {} {res} {}{name} ({}) -> {result}",
                ev.change.as_str(),
                ns.map(|n| format!("{n}/")).unwrap_or_default(),
                ev.origin.rsplit('/').next().unwrap_or(&ev.origin)
            )
        });
    }

    /// Points a recorded object's owner references at the simulated owners' uids.
    fn fix_owner_uids(&self, body: &mut Value, ns: Option<&str>) {
        let Some(refs) = body.at_mut("/metadata/ownerReferences").and_then(Value::as_array_mut) else {
            return;
        };
        for r in refs {
            let (Some(res), Some(name)) = (owner_resource(r), r.get("name").and_then(Value::as_str)) else {
                continue;
            };
            let owner = self
                .sim
                .get_parsed(&res, ns, name)
                .or_else(|_| self.sim.get_parsed(&res, None, name));
            if let Some(uid) = owner.ok().and_then(|o| o.at("/metadata/uid").cloned()) {
                r["uid"] = uid;
            }
        }
    }

    /// Whether some objects have owners that are all gone (what the garbage collector deletes:
    /// `gc_pending`, in key order). The objects that name owners are indexed by owner as they change; a deletion makes the
    /// deleted object's dependents candidates, and so does a change of an object's owners.
    fn orphans(&mut self) -> bool {
        if !self.h.garbage_collector {
            return false;
        }
        let rv = self.sim.current_rv();
        // Whether an object is an orphan follows from the server's state alone, which only a
        // write changes, and every write moves the revision: nothing to check again before.
        if rv != self.gc_seen {
            let (deleted, owning) = self.sim.gc_changes_since(self.gc_seen);
            self.gc_seen = rv;
            for (res, o) in owning {
                let ns = o.at("/metadata/namespace").and_then(Value::as_str).map(str::to_owned);
                let name = o.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
                let me: Dependent = (res, ns.clone(), name.to_string());
                let refs = o.at("/metadata/ownerReferences").and_then(Value::as_array);
                for r in refs.into_iter().flatten() {
                    let (Some(ores), Some(oname)) = (owner_resource(r), r.get("name").and_then(Value::as_str)) else {
                        continue;
                    };
                    // A cluster-scoped owner is looked up without the namespace.
                    for ons in [ns.as_deref(), None] {
                        self.gc_index
                            .entry(object_key(&ores, ons, oname))
                            .or_default()
                            .insert(me.clone());
                    }
                }
                // The recording's initial objects are indexed, not suspected: an owner the
                // recording does not hold is not known to be gone.
                if rv_of(&o) > self.start_rv {
                    self.gc_pending.insert(me);
                }
            }
            for (res, ns, name) in deleted {
                if let Some(deps) = self.gc_index.get(&object_key(&res, ns.as_deref(), &name)) {
                    self.gc_pending.extend(deps.iter().cloned());
                }
            }
            let mut pending = std::mem::take(&mut self.gc_pending);
            pending.retain(|d| self.is_orphan(d));
            self.gc_pending = pending;
        }
        !self.gc_pending.is_empty()
    }

    /// Whether an object exists, is not terminating, and has owners that are all gone.
    fn is_orphan(&self, (res, ns, name): &Dependent) -> bool {
        let Ok(o) = self.sim.get_parsed(res, ns.as_deref(), name) else {
            return false;
        };
        if o.at("/metadata/deletionTimestamp").is_some() {
            return false;
        }
        let Some(refs) = o.at("/metadata/ownerReferences").and_then(Value::as_array) else {
            return false;
        };
        let alive = refs.iter().any(|r| {
            let (Some(ores), Some(oname)) = (owner_resource(r), r.get("name").and_then(Value::as_str)) else {
                return true;
            };
            let look = |n: Option<&str>| self.sim.uid_of(&ores, n, oname);
            let found = match look(ns.as_deref()) {
                Err(crate::sim::SimError::UnknownResource(_)) => return true,
                Err(_) => return false,
                Ok(Some(f)) => Some(f),
                Ok(None) => look(None).ok().flatten(),
            };
            match found {
                Some((uid, _)) => r.get("uid").and_then(Value::as_str).is_none_or(|u| u == uid),
                None => false,
            }
        });
        !alive
    }

    /// Polls `fut` until it finishes, panics, times out, or the process crashes or stalls
    /// (a hand-over) in it; after a stall, `fut` can be polled again.
    async fn guarded<T>(&self, fut: &mut Guard<T>) -> Guarded<T> {
        let (crash, stall) = {
            let sh = lock(&self.shared);
            (sh.crash_notify.clone(), sh.stall_notify.clone())
        };
        tokio::select! {
            biased;
            () = crash.notified() => Guarded::Crashed,
            () = stall.notified() => Guarded::Stalled,
            r = fut.as_mut() => match r {
                Ok(Ok(v)) => Guarded::Done(v),
                Ok(Err(p)) => Guarded::Panicked(panic_message(&*p)),
                Err(_) => Guarded::TimedOut,
            },
        }
    }

    /// Handles a crash inside replica `r`'s reconcile or handler: restart as the fault says.
    fn crashed(&mut self, r: usize) {
        let n = lock(&self.shared).writes;
        let restart = self
            .faults
            .iter()
            .find_map(|f| match f {
                Fault::CrashAfterWrite { write, restart } if *write == n => Some(*restart),
                _ => None,
            })
            .unwrap_or(Restart::FromDatabase);
        self.start_lifetime(r, restart);
    }

    async fn deliver(&mut self, g: usize) {
        let (r, i) = self.split(g);
        let Some(ev) = self.reps[r].informers[i].next.take() else {
            return;
        };
        let inf = &mut self.reps[r].informers[i];
        inf.cursor = ev.rv;
        inf.recent.push_back(ev.rv);
        if inf.recent.len() > 8 {
            inf.recent.pop_front();
        }
        let deleted = ev.kind == "DELETED";
        let key = key_of_value(&inf.spec.resource, &ev.object);
        let typed = match inf.feed.apply(deleted, &ev.object) {
            Ok(t) => Some(t),
            Err(e) => {
                lock(&self.shared).fail(Oracle::Harness, e);
                None
            }
        };
        if deleted {
            inf.db.remove(&key);
        } else {
            inf.db.insert(key.clone(), ev.object.clone());
        }
        // The primary's typed object goes to the delete handler, a watched kind's to its mapper.
        let (typed, for_map) = if i == 0 { (typed, None) } else { (None, typed) };
        // A standby's events queue nothing: it reconciles what it has cached on taking over.
        let targets = if r == self.lead {
            (inf.spec.map)(&ev.object, for_map)
        } else {
            Vec::new()
        };
        let from_world = {
            let mut sh = lock(&self.shared);
            sh.saw(r, key, ev.object.clone());
            !sh.controller_rvs.contains(&ev.rv)
        };
        self.trace(|| {
            let name = ev.object.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
            let ns = ev.object.at("/metadata/namespace").and_then(Value::as_str);
            let resource = &self.reps[r].informers[i].spec.resource;
            format!(
                "deliver {g}:{resource} {} {}{name} rv={} -> {}",
                ev.kind,
                ns.map(|n| format!("{n}/")).unwrap_or_default(),
                ev.rv,
                targets.iter().map(show).collect::<Vec<_>>().join(",")
            )
        });
        for t in targets {
            self.enqueue(t, from_world);
        }
        if deleted && i == 0 && r == self.lead {
            if let (Some(handler), Some(ctx), Ok(obj)) = (
                self.h.on_delete.clone(),
                self.reps[r].life.ctx.clone(),
                typed
                    .and_then(|t| t.downcast::<K>().ok())
                    .map_or_else(|| K::deserialize(&*ev.object), |k| Ok(*k)),
            ) {
                let mut fut = guard(handler(Arc::new(obj), ctx));
                match self.guarded(&mut fut).await {
                    Guarded::Done(()) => {}
                    Guarded::Crashed => self.crashed(r),
                    Guarded::Panicked(m) => self.fail(Oracle::Panic, format!("delete handler panicked: {m}")),
                    Guarded::TimedOut | Guarded::Stalled => {
                        self.fail(Oracle::Stuck, "the delete handler did not finish".into());
                    }
                }
            }
        }
    }

    async fn reconcile(&mut self, qi: usize) {
        let r = self.lead;
        let Some(key) = self.reps[r].life.queue.remove(qi) else {
            return;
        };
        self.reps[r].life.queued.remove(&key);
        let mut oref = ObjectRef::<K>::new(&key.1);
        if let Some(ns) = &key.0 {
            oref = oref.within(ns);
        }
        let Some(obj) = self.reps[r].life.primary.get(&oref) else {
            self.trace(|| format!("{}reconcile {}: not in the cache, skipped", self.who(r), show(&key)));
            return;
        };
        self.reconciles += 1;
        let count = {
            let c = self.reps[r].life.counts.entry(key.clone()).or_insert(0);
            *c += 1;
            *c
        };
        self.trace(|| {
            format!(
                "{}reconcile {} (rv={})",
                self.who(r),
                show(&key),
                obj.meta().resource_version.as_deref().unwrap_or("")
            )
        });
        if count > self.h.max_reconciles_per_trigger {
            self.fail(
                Oracle::HotLoop,
                format!(
                    "{} reconciled {count} times without a change from the world (limit {})",
                    show(&key),
                    self.h.max_reconciles_per_trigger
                ),
            );
            return;
        }
        let Some(ctx) = self.reps[r].life.ctx.clone() else {
            return;
        };
        let mut fut = guard((self.h.reconcile)(obj.clone(), ctx.clone()));
        lock(&self.shared).reconciling = Some(r);
        let outcome = self.guarded(&mut fut).await;
        lock(&self.shared).reconciling = None;
        if let Guarded::Stalled = outcome {
            let n = lock(&self.shared).writes;
            let steps = self
                .faults
                .iter()
                .find_map(|f| match f {
                    Fault::HandOverAfterWrite { write, steps } if *write == n => Some(*steps),
                    _ => None,
                })
                .unwrap_or(0);
            if self.hand_over().await {
                self.stalled = Some(Stalled {
                    replica: r,
                    key,
                    obj,
                    ctx,
                    fut,
                    resume_at: self.step + steps,
                });
            } else {
                // No standby to take over: the answer arrives at once.
                self.reps[r].partitioned = false;
                let resume = {
                    let mut sh = lock(&self.shared);
                    sh.stalled = false;
                    sh.resume_notify.get(r).cloned()
                };
                if let Some(resume) = resume {
                    resume.notify_one();
                }
                let outcome = self.guarded(&mut fut).await;
                self.finish_reconcile(r, &key, obj, ctx, outcome);
            }
            return;
        }
        self.finish_reconcile(r, &key, obj, ctx, outcome);
    }

    /// What follows a reconcile of `key` on replica `r`: the error policy, the requeue (on
    /// the leader), the invariants.
    fn finish_reconcile(
        &mut self,
        r: usize,
        key: &Key,
        obj: Arc<K>,
        ctx: Arc<Ctx>,
        outcome: Guarded<Result<Action, E>>,
    ) {
        let action = match outcome {
            Guarded::Done(Ok(a)) => {
                self.trace(|| format!("  -> ok, requeue {:?}", requeue_after(&a)));
                a
            }
            Guarded::Done(Err(e)) => {
                let policy = self.h.error_policy.clone();
                match std::panic::catch_unwind(AssertUnwindSafe(|| policy(obj.clone(), &e, ctx))) {
                    Ok(a) => {
                        self.trace(|| format!("  -> error: {e}; requeue {:?}", requeue_after(&a)));
                        a
                    }
                    Err(p) => {
                        self.fail(Oracle::Panic, format!("error_policy panicked: {}", panic_message(&*p)));
                        return;
                    }
                }
            }
            Guarded::Crashed => {
                self.crashed(r);
                return;
            }
            Guarded::Panicked(m) => {
                self.fail(Oracle::Panic, format!("reconcile of {} panicked: {m}", show(key)));
                return;
            }
            Guarded::TimedOut | Guarded::Stalled => {
                self.fail(Oracle::Stuck, format!("reconcile of {} did not finish", show(key)));
                return;
            }
        };
        // A deposed leader's requeue is dropped: it takes nothing from its queue any more.
        if r == self.lead {
            let life = &mut self.reps[r].life;
            if let Some(old) = life.timer_of.remove(key) {
                life.timers.remove(&old);
            }
            if let Some(d) = requeue_after(&action) {
                self.seq += 1;
                let at = (Instant::now() + d, self.seq);
                life.timers.insert(at, key.clone());
                life.timer_of.insert(key.clone(), at);
            }
        }
        let mut sh = lock(&self.shared);
        check_invariants(&self.sim, &mut sh, || format!("reconcile of {}", show(key)));
    }

    async fn collect_garbage(&mut self, victims: Vec<Dependent>) {
        for (res, ns, name) in victims {
            self.gc_pending.remove(&(res.clone(), ns.clone(), name.clone()));
            let r = self.sim.delete(&res, ns.as_deref(), &name);
            let ns_s = ns.map(|n| format!("{n}/")).unwrap_or_default();
            match r {
                Ok(v) => self.trace(|| format!("gc delete {res} {ns_s}{name} -> rv={}", rv_of(&v))),
                Err(e) => self.trace(|| format!("gc delete {res} {ns_s}{name} -> {e}")),
            }
        }
    }

    async fn go(mut self, baseline: Option<&BTreeMap<String, Value>>) -> Outcome {
        // With a standby: the first rounds elect the first replica.
        self.elect().await;
        for r in 0..self.reps.len() {
            self.start_lifetime(r, Restart::Empty);
        }
        let budget = 10_000 + 100 * (self.world.len() as u64 + self.sim.current_rv());
        loop {
            if self.failed() {
                break;
            }
            self.step += 1;
            if self.step > budget {
                self.fail(Oracle::Stuck, format!("the run did not settle within {budget} steps"));
                break;
            }
            tokio::time::advance(STEP).await;
            let secs = (Instant::now() - self.start).as_secs();
            self.sim.set_clock(CLOCK_BASE + secs);
            self.elect().await;
            if self.stalled.as_ref().is_some_and(|s| s.resume_at <= self.step) {
                self.resume_stalled().await;
            }
            for f in self.due_faults() {
                self.apply_fault(f).await;
            }
            {
                let mut sh = lock(&self.shared);
                sh.crash_after_write = self.faults.iter().find_map(|f| match f {
                    Fault::CrashAfterWrite { write, .. } if *write > sh.writes => Some(*write),
                    _ => None,
                });
                sh.stall_after_write = self.faults.iter().find_map(|f| match f {
                    Fault::HandOverAfterWrite { write, .. } if *write > sh.writes => Some(*write),
                    _ => None,
                });
            }
            let now = Instant::now();
            let lead = self.lead;
            while let Some((&(at, seq), _)) = self.reps[lead].life.timers.first_key_value() {
                if at > now {
                    break;
                }
                if let Some(k) = self.reps[lead].life.timers.remove(&(at, seq)) {
                    self.reps[lead].life.timer_of.remove(&k);
                    self.trace(|| format!("{}requeue {} fires", self.who(lead), show(&k)));
                    self.enqueue(k, false);
                }
            }
            // The choices: release a change, deliver an event, reconcile, collect garbage.
            let mut deliverable = Vec::new();
            for g in 0..self.informer_count() {
                let (r, i) = self.split(g);
                if !self.reps[r].partitioned
                    && self.reps[r].informers[i].delayed_until <= self.step
                    && self.peek(g).is_some()
                {
                    deliverable.push(g);
                }
            }
            let orphans = self.orphans();
            let mut kinds = [0u8; 4];
            let mut n_kinds = 0;
            for (kind, possible) in [
                !self.world.is_empty(),
                !deliverable.is_empty(),
                !self.reps[lead].life.queue.is_empty(),
                orphans,
            ]
            .into_iter()
            .enumerate()
            {
                if possible {
                    kinds[n_kinds] = kind as u8;
                    n_kinds += 1;
                }
            }
            if n_kinds == 0 {
                let step = self.step;
                if self
                    .reps
                    .iter()
                    .flat_map(|r| r.informers.iter())
                    .any(|i| i.delayed_until > step)
                {
                    self.trace(|| "idle: delays end".into());
                    self.reps
                        .iter_mut()
                        .flat_map(|r| r.informers.iter_mut())
                        .for_each(|i| i.delayed_until = 0);
                    continue;
                }
                if self.stalled.is_some() {
                    // Nothing else can happen before the deposed leader's answer arrives.
                    self.resume_stalled().await;
                    continue;
                }
                let deadline = self.last_world + self.h.quiet;
                match self.reps[lead].life.timers.first_key_value() {
                    Some((&(at, _), _)) if at <= deadline => {
                        // The electors' rounds are not skipped: a leader renews through a wait.
                        let to = if self.h.election.is_some() {
                            at.min(self.next_round)
                        } else {
                            at
                        };
                        let now = Instant::now();
                        if to > now {
                            tokio::time::advance(to - now).await;
                        }
                        continue;
                    }
                    _ => break,
                }
            }
            match kinds[self.rng.random_range(0..n_kinds)] {
                0 => self.release(),
                1 => {
                    let g = deliverable[self.rng.random_range(0..deliverable.len())];
                    self.deliver(g).await;
                }
                2 => {
                    let qi = self.rng.random_range(0..self.reps[lead].life.queue.len());
                    self.reconcile(qi).await;
                }
                _ => {
                    let victims: Vec<Dependent> = self.gc_pending.iter().cloned().collect();
                    self.collect_garbage(victims).await;
                }
            }
        }
        self.finish(baseline)
    }

    fn end_state(&self) -> BTreeMap<String, Value> {
        let rv = self.sim.current_rv();
        let mut out = BTreeMap::new();
        for res in &self.compared {
            for o in self.sim.objects_at(res, rv).unwrap_or_default() {
                out.insert(
                    object_key(res, None, "") + &key_of_value("", &o),
                    normalize(&o, &self.h.volatile),
                );
            }
        }
        out
    }

    fn finish(self, baseline: Option<&BTreeMap<String, Value>>) -> Outcome {
        let end = self.end_state();
        let informers = match self.h.controller {
            Some(_) => lock(&self.shared).watched.len().max(1),
            None => self.informer_count(),
        };
        if !self.failed() {
            let parsed = lock(&self.shared).parsed.clone();
            let world = World {
                sim: &self.sim,
                parsed: &parsed,
            };
            for inv in &self.h.eventually {
                if let Err(e) = (inv.check)(&world) {
                    self.fail(Oracle::Eventually, format!("{:?} broken at the end: {e}", inv.name));
                    break;
                }
            }
        }
        if let (false, Some(base)) = (self.failed(), baseline) {
            let mut diffs = Vec::new();
            for k in base.keys().chain(end.keys()).collect::<BTreeSet<_>>() {
                match (base.get(k), end.get(k)) {
                    (Some(_), None) => diffs.push(format!("{k}: missing")),
                    (None, Some(_)) => diffs.push(format!("{k}: extra")),
                    (Some(a), Some(b)) if a != b => diffs.push(format!("{k}: {:?} differ", differing(a, b))),
                    _ => {}
                }
            }
            if !diffs.is_empty() {
                let n = diffs.len();
                diffs.truncate(5);
                self.fail(
                    Oracle::EndState,
                    format!(
                        "the end state differs from the fault-free run's in {n} objects: {}",
                        diffs.join("; ")
                    ),
                );
            }
        }
        self.trace(|| {
            format!(
                "end: {} steps, {} reconciles, rv {}",
                self.step,
                self.reconciles,
                self.sim.current_rv()
            )
        });
        let mut sh = lock(&self.shared);
        let tail = sh.failure.is_some().then(|| sh.trace.tail(TAIL));
        let trace = sh.trace.take();
        let failure = sh.failure.take().map(|mut f| {
            f.trace_tail = tail.unwrap_or_default();
            f
        });
        Outcome {
            trace,
            traced: self.traced,
            failure,
            end,
            steps: self.step,
            writes: sh.writes,
            reconciles: self.reconciles,
            revisions: self.sim.current_rv().saturating_sub(self.start_rv),
            informers,
        }
    }
}

/// Runs one schedule on a fresh current-thread runtime with a paused clock.
pub(crate) fn run_with<K, Ctx, E>(
    h: &Harness<K, Ctx, E>,
    recordings: &[Recording],
    schedule: &Schedule,
    baseline: Option<&BTreeMap<String, Value>>,
    traced: bool,
) -> Result<Outcome, HarnessError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    // Controller mode runs on real time: the controller's store has a writer thread, which a
    // paused clock would not wait for. Otherwise nothing does I/O (the server is in-process),
    // and without an I/O driver waking the runtime and parking it make no system calls.
    let mut rt = tokio::runtime::Builder::new_current_thread();
    match h.controller {
        Some(_) => rt.enable_all(),
        None => rt.enable_time().start_paused(true),
    };
    let rt = rt.build().map_err(|e| HarnessError::Sim(crate::sim::SimError::Io(e)))?;
    rt.block_on(async {
        let run = Run::new(h, recordings, schedule, traced)?;
        let mut out = if h.controller.is_some() {
            run.go_controller(baseline).await
        } else {
            run.go(baseline).await
        };
        if let Some(f) = &mut out.failure {
            f.schedule = schedule.clone();
            f.faults_before_shrinking = schedule.faults.len();
        }
        Ok(out)
    })
}

pub(crate) fn run_schedule<K, Ctx, E>(h: &Harness<K, Ctx, E>, schedule: &Schedule) -> Result<Outcome, HarnessError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    let base = if schedule.faults.is_empty() {
        None
    } else {
        Some(
            run_with(
                h,
                &h.recordings,
                &Schedule {
                    seed: 0,
                    faults: Vec::new(),
                },
                None,
                false,
            )?
            .end,
        )
    };
    run_with(h, &h.recordings, schedule, base.as_ref(), true)
}

/// A failing outcome with its trace: run without one (a sampled schedule, a candidate of
/// shrinking), the schedule runs again with it; the same schedule gives the same run.
fn retrace<K, Ctx, E>(
    h: &Harness<K, Ctx, E>,
    recordings: &[Recording],
    schedule: &Schedule,
    base: &BTreeMap<String, Value>,
    out: Outcome,
) -> Result<Outcome, HarnessError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    if out.traced || out.failure.is_none() {
        return Ok(out);
    }
    let again = run_with(h, recordings, schedule, Some(base), true)?;
    // Controller mode runs on real time: the writes within a boundary may come in another
    // order (another write number in the detail), so the same oracle is the same failure.
    let controller_mode = h.controller.is_some();
    let result = |o: &Outcome| {
        o.failure
            .as_ref()
            .map(|f| (f.oracle, (!controller_mode).then(|| f.detail.clone())))
    };
    if result(&again) == result(&out) {
        return Ok(again);
    }
    // Not the same run: say so rather than show a trace of another one.
    let why = if controller_mode {
        "controller mode runs on real time, and the controller's tasks order its writes"
    } else {
        "the controller or its context is not deterministic"
    };
    let mut out = out;
    if let Some(f) = &mut out.failure {
        f.detail.push_str(&format!(
            " (run again to record its trace, the schedule gave another result: {}; {why})",
            again.failure.as_ref().map_or_else(
                || "it passed".to_string(),
                |g| format!("{}: {}", g.oracle.as_str(), g.detail)
            )
        ));
    }
    Ok(out)
}

/// Removes faults one at a time while the schedule still fails the same oracle.
fn shrink<K, Ctx, E>(
    h: &Harness<K, Ctx, E>,
    recordings: &[Recording],
    failing: Schedule,
    out: Outcome,
    base: &BTreeMap<String, Value>,
) -> Result<(Schedule, Outcome), HarnessError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    let oracle = out.failure.as_ref().map(|f| f.oracle);
    let (mut cur, mut cur_out) = (failing, out);
    loop {
        let mut smaller = None;
        for i in 0..cur.faults.len() {
            let mut cand = cur.clone();
            cand.faults.remove(i);
            let o = run_with(h, recordings, &cand, Some(base), false)?;
            if o.failure.as_ref().map(|f| f.oracle) == oracle {
                smaller = Some((cand, o));
                break;
            }
        }
        match smaller {
            Some((s, o)) => (cur, cur_out) = (s, o),
            None => {
                let out = retrace(h, recordings, &cur, base, cur_out)?;
                return Ok((cur, out));
            }
        }
    }
}

fn save_dir<K, Ctx, E>(h: &Harness<K, Ctx, E>, seed: u64) -> std::path::PathBuf {
    let root = h
        .save_dir
        .clone()
        .or_else(|| std::env::var_os("DURABLE_INFORMER_TESTING_DIR").map(Into::into))
        .unwrap_or_else(|| "target/controller-testing".into());
    root.join(format!("{}-seed{seed}", h.name))
}

pub(crate) fn check<K, Ctx, E>(h: &Harness<K, Ctx, E>, schedules: u64) -> Result<Report, HarnessError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    let deadline = h.budget.map(|b| std::time::Instant::now() + b);
    let recordings = &h.recordings;
    let base = run_with(
        h,
        recordings,
        &Schedule {
            seed: 0,
            faults: Vec::new(),
        },
        None,
        true,
    )?;
    let mut report = Report {
        schedules: 1,
        faults: 0,
        steps: base.steps,
        reconciles: base.reconciles,
        baseline_trace: base.trace.clone(),
        not_run: 0,
    };
    if base.failure.is_some() {
        return Err(finish_failure(
            h,
            Schedule {
                seed: 0,
                faults: Vec::new(),
            },
            base,
            0,
            0,
        ));
    }
    let extent = extent_of(h, &base);
    let all: Vec<Schedule> = (0..schedules)
        .map(|i| sample(h.first_seed + i, h.kinds, h.max_faults, extent))
        .collect();
    let (passed, failed) = run_all(h, recordings, &all, &base.end, deadline)?;
    for (schedule, t) in all.iter().zip(&passed) {
        report.add(schedule, t);
    }
    if failed.is_none() {
        report.not_run = (all.len() - passed.len()) as u64;
    }
    if let Some((i, out)) = failed {
        let schedule = all[i].clone();
        report.schedules += 1;
        let before = schedule.faults.len();
        let (small, small_out) = shrink(h, recordings, schedule, out, &base.end)?;
        let mut err = finish_failure(h, small, small_out, report.schedules, 0);
        if let HarnessError::Failed(f) = &mut err {
            f.faults_before_shrinking = before;
        }
        return Err(err);
    }
    Ok(report)
}

/// The ranges a check draws faults from: the fault-free run's.
fn extent_of<K, Ctx, E>(h: &Harness<K, Ctx, E>, base: &Outcome) -> Extent {
    let replicas = if h.election.is_some() { 2 } else { 1 };
    Extent {
        steps: base.steps,
        writes: base.writes,
        informers: base.informers,
        revisions: base.revisions,
        replicas,
    }
}

/// What a passing schedule ran.
pub(crate) struct Totals {
    steps: u64,
    reconciles: u64,
}

impl Report {
    fn add(&mut self, schedule: &Schedule, t: &Totals) {
        self.schedules += 1;
        self.faults += schedule.faults.len() as u64;
        self.steps += t.steps;
        self.reconciles += t.reconciles;
    }
}

/// Runs `schedules` on [`Harness::threads`] threads, each on its own runtime; returns what
/// the passing ones before the first failure ran, in order, and that failure (the lowest
/// index fails, whichever thread got there first): the same answer as one thread's. None
/// starts after `deadline`.
#[allow(clippy::type_complexity)]
fn run_all<K, Ctx, E>(
    h: &Harness<K, Ctx, E>,
    recordings: &[Recording],
    schedules: &[Schedule],
    base: &BTreeMap<String, Value>,
    deadline: Option<std::time::Instant>,
) -> Result<(Vec<Totals>, Option<(usize, Outcome)>), HarnessError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    enum Done {
        Passed(Totals),
        Failed(Box<Outcome>),
        Error(HarnessError),
    }
    let n = schedules.len();
    let next = AtomicUsize::new(0);
    let first_bad = AtomicUsize::new(usize::MAX);
    let done: Mutex<Vec<Option<Done>>> = Mutex::new((0..n).map(|_| None).collect());
    let work = || loop {
        // Past the budget no schedule starts; one taken is run to its end. Indexes are
        // taken in order, so what ran is a prefix of `schedules`.
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n || i > first_bad.load(Ordering::Relaxed) {
            return;
        }
        let d = match run_with(h, recordings, &schedules[i], Some(base), false) {
            Ok(out) if out.failure.is_none() => Done::Passed(Totals {
                steps: out.steps,
                reconciles: out.reconciles,
            }),
            Ok(out) => match retrace(h, recordings, &schedules[i], base, out) {
                Ok(out) => Done::Failed(Box::new(out)),
                Err(e) => Done::Error(e),
            },
            Err(e) => Done::Error(e),
        };
        if !matches!(d, Done::Passed(_)) {
            first_bad.fetch_min(i, Ordering::Relaxed);
        }
        done.lock().unwrap_or_else(PoisonError::into_inner)[i] = Some(d);
    };
    let threads = h.threads.clamp(1, n.max(1));
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    let mut passed = Vec::new();
    for (i, d) in done
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .into_iter()
        .enumerate()
    {
        match d {
            Some(Done::Passed(t)) => passed.push(t),
            Some(Done::Failed(out)) => return Ok((passed, Some((i, *out)))),
            Some(Done::Error(e)) => return Err(e),
            // Past the first failure: not run.
            None => break,
        }
    }
    Ok((passed, None))
}

/// The faults of [`Harness::check_every_boundary`]: each enabled kind, alone, at each step
/// and after each write of the fault-free run.
fn every_boundary(kinds: super::FaultKinds, extent: Extent) -> Vec<Fault> {
    let mut out = Vec::new();
    if kinds.crash_after_write {
        for write in 1..=extent.writes {
            for restart in [Restart::FromDatabase, Restart::Empty] {
                out.push(Fault::CrashAfterWrite { write, restart });
            }
        }
    }
    if kinds.hand_over && extent.replicas > 1 {
        for write in 1..=extent.writes {
            out.push(Fault::HandOverAfterWrite { write, steps: 10 });
        }
    }
    for at in 1..=extent.steps {
        if kinds.hand_over && extent.replicas > 1 {
            out.push(Fault::HandOver { at });
        }
        if kinds.crash {
            out.push(Fault::Crash {
                at,
                restart: Restart::FromDatabase,
            });
            out.push(Fault::Crash {
                at,
                restart: Restart::Empty,
            });
        }
        if kinds.time_travel {
            out.push(Fault::Crash {
                at,
                restart: Restart::TimeTravel { behind: 5 },
            });
        }
        for informer in 0..extent.informers {
            if kinds.delay {
                out.push(Fault::Delay {
                    at,
                    informer,
                    steps: 10,
                });
            }
            if kinds.relist {
                out.push(Fault::Relist { at, informer });
            }
            if kinds.duplicate {
                out.push(Fault::Duplicate {
                    at,
                    informer,
                    events: 2,
                });
            }
        }
    }
    out
}

pub(crate) fn check_every_boundary<K, Ctx, E>(h: &Harness<K, Ctx, E>) -> Result<Report, HarnessError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    let deadline = h.budget.map(|b| std::time::Instant::now() + b);
    let recordings = &h.recordings;
    let seed = h.first_seed;
    let base = run_with(
        h,
        recordings,
        &Schedule {
            seed,
            faults: Vec::new(),
        },
        None,
        true,
    )?;
    let mut report = Report {
        schedules: 1,
        faults: 0,
        steps: base.steps,
        reconciles: base.reconciles,
        baseline_trace: base.trace.clone(),
        not_run: 0,
    };
    if base.failure.is_some() {
        return Err(finish_failure(
            h,
            Schedule {
                seed,
                faults: Vec::new(),
            },
            base,
            0,
            seed,
        ));
    }
    let extent = extent_of(h, &base);
    let all: Vec<Schedule> = every_boundary(h.kinds, extent)
        .into_iter()
        .map(|fault| Schedule {
            seed,
            faults: vec![fault],
        })
        .collect();
    let (passed, failed) = run_all(h, recordings, &all, &base.end, deadline)?;
    for (schedule, t) in all.iter().zip(&passed) {
        report.add(schedule, t);
    }
    if failed.is_none() {
        report.not_run = (all.len() - passed.len()) as u64;
    }
    if let Some((i, out)) = failed {
        report.schedules += 1;
        return Err(finish_failure(h, all[i].clone(), out, report.schedules, seed));
    }
    Ok(report)
}

/// Writes a failure out and wraps it.
fn finish_failure<K, Ctx, E>(
    h: &Harness<K, Ctx, E>,
    schedule: Schedule,
    out: Outcome,
    run: u64,
    baseline_seed: u64,
) -> HarnessError {
    let Some(mut failure) = out.failure else {
        return HarnessError::Recording("internal: a failure without a failure".into());
    };
    failure.schedule = schedule.clone();
    failure.schedules_run = run;
    let dir = save_dir(h, schedule.seed);
    let files: Vec<&Path> = h
        .recordings
        .iter()
        .flat_map(|r| r.files.iter().map(std::path::PathBuf::as_path))
        .collect();
    let saved = Saved {
        schedule,
        baseline_seed,
        oracle: failure.oracle.as_str().to_string(),
        detail: failure.detail.clone(),
        recordings: files
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "recording-{i}/{}",
                    p.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                )
            })
            .collect(),
    };
    match save(&dir, &saved, &out.trace, &files) {
        Ok(()) => failure.saved = Some(dir),
        Err(e) => failure
            .detail
            .push_str(&format!(" (could not save to {}: {e})", dir.display())),
    }
    HarnessError::Failed(Box::new(failure))
}

pub(crate) fn replay<K, Ctx, E>(h: &Harness<K, Ctx, E>, path: &Path) -> Result<Failure, HarnessError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    let dir = if path.is_dir() {
        path.to_owned()
    } else {
        path.parent().unwrap_or(Path::new(".")).to_owned()
    };
    let bad = |p: &Path, d: String| HarnessError::Saved {
        path: p.to_owned(),
        detail: d,
    };
    let sched_path = dir.join("schedule.json");
    let text = std::fs::read_to_string(&sched_path).map_err(|e| bad(&sched_path, e.to_string()))?;
    let saved: Saved = serde_json::from_str(&text).map_err(|e| bad(&sched_path, e.to_string()))?;
    let trace_path = dir.join("trace.txt");
    let want = std::fs::read_to_string(&trace_path).map_err(|e| bad(&trace_path, e.to_string()))?;
    let originals: Vec<&Recording> = h.recordings.iter().collect();
    let mut recordings = Vec::new();
    for (i, name) in saved.recordings.iter().enumerate() {
        let p = dir.join(name);
        let rec = match originals.get(i) {
            Some(o) => Recording::open_as(&p, &o.resource)?,
            None => Recording::open(&p)?,
        };
        recordings.push(rec);
    }
    let base = run_with(
        h,
        &recordings,
        &Schedule {
            seed: 0,
            faults: Vec::new(),
        },
        None,
        true,
    )?;
    let out = run_with(h, &recordings, &saved.schedule, Some(&base.end), true)?;
    if out.trace != want {
        let (line, saved_l, now_l) = want
            .lines()
            .zip(out.trace.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| (i + 1, a.to_string(), b.to_string()))
            .unwrap_or_else(|| {
                let n = want.lines().count().min(out.trace.lines().count());
                (n + 1, "(end)".into(), "(end)".into())
            });
        return Err(HarnessError::Diverged {
            path: trace_path,
            line,
            saved: saved_l,
            now: now_l,
        });
    }
    let want_oracle = Oracle::parse(&saved.oracle);
    match out.failure {
        Some(f) if Some(f.oracle) == want_oracle => Ok(f),
        other => Err(bad(
            &sched_path,
            format!(
                "the saved schedule failed {:?} before; now: {}",
                saved.oracle,
                other.map_or_else(|| "passes".to_string(), |f| f.oracle.as_str().to_string())
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{requeue_after, split_status};
    use kube::runtime::controller::Action;
    use std::borrow::Cow;
    use std::time::Duration;

    #[test]
    fn a_recorded_patch_splits_into_the_object_and_its_status() {
        use serde_json::json;
        let both = json!({"spec": {"replicas": 2}, "status": {"message": "m"}});
        let (rest, status) = split_status(&both);
        assert_eq!(rest.as_deref(), Some(&json!({"spec": {"replicas": 2}})));
        assert_eq!(status, Some(&json!({"message": "m"})));
        let spec = json!({"spec": {"replicas": 2}});
        assert_eq!(split_status(&spec), (Some(Cow::Borrowed(&spec)), None));
        let only_status = json!({"status": {"message": "m"}});
        assert_eq!(split_status(&only_status), (None, Some(&json!({"message": "m"}))));
        assert_eq!(split_status(&json!({})), (None, None));
        assert_eq!(split_status(&json!(null)), (None, None));
    }

    #[test]
    fn requeue_delays_are_read_back_from_actions() {
        let delays = [
            Duration::from_secs(300),
            Duration::from_millis(1500),
            Duration::from_millis(5),
            Duration::from_micros(7),
            Duration::from_secs(2),
        ];
        // Twice round, more than are kept: answers come from the cache and after evictions.
        for d in delays.into_iter().chain(delays) {
            let got = requeue_after(&Action::requeue(d)).expect("a delay");
            assert!(got.abs_diff(d) < Duration::from_micros(1), "{d:?} read as {got:?}");
            // Again: the kept answer is this action's, not the one before.
            assert_eq!(requeue_after(&Action::requeue(d)), Some(got));
        }
        assert_eq!(requeue_after(&Action::await_change()), None);
    }
}
