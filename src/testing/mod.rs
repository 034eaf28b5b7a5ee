//! Test a controller against recorded traffic, with a fault at every event boundary,
//! deterministically (feature `testing`).
//!
//! A [`Harness`] takes one or more [`Recording`]s (what the world did: `durable-informer
//! record` writes them) and a controller in kube-runtime's shape: `reconcile(Arc<K>,
//! Arc<Ctx>) -> Result<Action, E>` and `error_policy(Arc<K>, &E, Arc<Ctx>) -> Action`, with a
//! function that builds the context from an [`Env`] (a `kube::Client` and the informers'
//! `kube::runtime::reflector::Store`s). For each schedule it
//!
//! * starts a simulated API server ([`crate::sim`]) in-process, on the test's thread, holding
//!   the recording's initial state;
//! * releases the recorded changes in order (a change is applied as a patch from the recorded
//!   previous version, so what the controller wrote to the same object stays);
//! * lets the controller's `kube::Client` write to that server (conflicts, resourceVersion
//!   preconditions, finalizers as the server has them); a small garbage collector deletes
//!   objects whose controlling owner is gone;
//! * runs on tokio's paused clock (a current-thread runtime without an I/O driver: a
//!   reconcile that opens sockets of its own is not supported), with one seeded scheduler
//!   deciding every interleaving: which recorded change next, which informer delivers its
//!   next event, which queued object is reconciled, when a requeue fires;
//! * injects [`Fault`]s at event boundaries: crash and restart (from the database, from an
//!   empty one, against a server view behind), a crash right after a write, one informer
//!   delayed behind the others, a dropped watch with a 410 relist, events delivered again;
//! * checks the [`Oracle`]s: no panic, invariants after every reconcile and write, the end
//!   state after a quiet period equal to the fault-free run's, reconciles per trigger
//!   bounded, no lost update (a write that changed what had changed since the controller
//!   read it).
//!
//! The same schedule gives the same trace, byte for byte. A failure is shrunk to the fewest
//! faults that still fail, and written out (schedule, trace and recordings) for
//! [`Harness::replay`] to run again.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use durable_informer::testing::{Env, Harness, Recording};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::controller::Action;
//!
//! struct Ctx {
//!     client: kube::Client,
//! }
//!
//! async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
//!     let _ = (cm, &ctx.client);
//!     Ok(Action::requeue(Duration::from_secs(300)))
//! }
//!
//! fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<Ctx>) -> Action {
//!     Action::requeue(Duration::from_secs(5))
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let report = Harness::new(reconcile, error_policy, |env: &Env| Ctx { client: env.client() })
//!     .recording(Recording::open("tests/data/recordings/configmaps.jsonl")?)
//!     .invariant("no configmap named bad", |w| {
//!         match w.list("configmaps").iter().any(|c| c["metadata"]["name"] == "bad") {
//!             true => Err("found".into()),
//!             false => Ok(()),
//!         }
//!     })
//!     .check(200)?;
//! println!("{report}");
//! # Ok(()) }
//! ```

mod client;
mod oracle;
mod recording;
mod run;
mod schedule;

use crate::sim::util::JsonAt as _;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use recording::Recording;
pub use schedule::{Fault, FaultKinds, Restart, Schedule};

use crate::controller::Controller;
use crate::leader::{LeaderElectionConfig, Leadership};
use crate::object::ObjectKey;
use crate::queue::WorkQueue;
use crate::sim::{ResourceDef, Sim};
use crate::store::{DurableStore, StoreConfig};
use futures::stream::BoxStream;
use futures::StreamExt;

/// Errors setting up or running the harness (not a controller's failure: see [`Failure`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A recording could not be read.
    #[error("recording: {0}")]
    Recording(String),
    /// The simulated server refused the setup (an unknown resource, a bad initial object).
    #[error("simulated server: {0}")]
    Sim(#[from] crate::sim::SimError),
    /// A saved failure could not be read or written.
    #[error("{path}: {detail}")]
    Saved {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The controller failed a schedule (shrunk, written out).
    #[error("{0}")]
    Failed(Box<Failure>),
    /// The harness's settings cannot work (a leader election whose timings `run` refuses).
    #[error("harness settings: {0}")]
    Config(String),
    /// A replayed schedule did not give the saved trace.
    #[error("replay of {path} diverged from the saved trace at line {line}:\n  saved: {saved}\n  now:   {now}")]
    Diverged {
        /// The saved trace.
        path: PathBuf,
        /// The first line that differs (1-based).
        line: usize,
        /// That line as saved.
        saved: String,
        /// That line now.
        now: String,
    },
}

/// Which oracle a failure broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Oracle {
    /// The reconcile (or error policy, or delete handler) panicked.
    Panic,
    /// An invariant was broken after a reconcile or a write.
    Invariant,
    /// An invariant checked at the end (after the quiet period) was broken.
    Eventually,
    /// The end state differs from the fault-free run's.
    EndState,
    /// An object was reconciled more often than allowed without a change from the world.
    HotLoop,
    /// A write changed fields that had changed since the controller read the object.
    LostUpdate,
    /// A reconcile did not finish, or the run did not settle.
    Stuck,
    /// The harness could not deliver an object (it does not decode as its type).
    Harness,
    /// A write reached the server from a replica while another one held the Lease: a leader
    /// deposed in the middle of a reconcile wrote on (with [`Harness::leader_election`]).
    DeposedWrite,
}

impl Oracle {
    /// Its name in reports and saved schedules.
    pub fn as_str(self) -> &'static str {
        match self {
            Oracle::Panic => "panic",
            Oracle::Invariant => "invariant",
            Oracle::Eventually => "eventually",
            Oracle::EndState => "end-state",
            Oracle::HotLoop => "hot-loop",
            Oracle::LostUpdate => "lost-update",
            Oracle::Stuck => "stuck",
            Oracle::Harness => "harness",
            Oracle::DeposedWrite => "deposed-write",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Oracle::Panic,
            Oracle::Invariant,
            Oracle::Eventually,
            Oracle::EndState,
            Oracle::HotLoop,
            Oracle::LostUpdate,
            Oracle::Stuck,
            Oracle::Harness,
            Oracle::DeposedWrite,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// A controller's failure on one schedule.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The oracle it broke.
    pub oracle: Oracle,
    /// What happened.
    pub detail: String,
    /// The schedule, shrunk when it came from a check.
    pub schedule: Schedule,
    /// How many faults the schedule had before shrinking.
    pub faults_before_shrinking: usize,
    /// Schedules run before this one failed.
    pub schedules_run: u64,
    /// Where the schedule, trace and recordings were written.
    pub saved: Option<PathBuf>,
    /// The last lines of the trace.
    pub trace_tail: Vec<String>,
}

impl Failure {
    pub(crate) fn new(oracle: Oracle, detail: String) -> Self {
        Self {
            oracle,
            detail,
            schedule: Schedule {
                seed: 0,
                faults: Vec::new(),
            },
            faults_before_shrinking: 0,
            schedules_run: 0,
            saved: None,
            trace_tail: Vec::new(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "controller failed [{}]: {}", self.oracle.as_str(), self.detail)?;
        writeln!(
            f,
            "  schedule: {} (shrunk from {} faults; failed after {} schedules)",
            self.schedule, self.faults_before_shrinking, self.schedules_run
        )?;
        if let Some(p) = &self.saved {
            writeln!(
                f,
                "  saved: {} (rerun with Harness::replay(\"{}\"))",
                p.display(),
                p.display()
            )?;
        }
        writeln!(f, "  trace (last lines):")?;
        for l in &self.trace_tail {
            writeln!(f, "    {l}")?;
        }
        Ok(())
    }
}

/// What a passing check ran.
#[derive(Debug, Clone)]
pub struct Report {
    /// Schedules run (the fault-free one included).
    pub schedules: u64,
    /// Faults injected over all schedules.
    pub faults: u64,
    /// Steps over all schedules.
    pub steps: u64,
    /// Reconciles over all schedules.
    pub reconciles: u64,
    /// The fault-free run's trace.
    pub baseline_trace: String,
    /// Schedules asked for that did not run because the
    /// [`time_budget`](Harness::time_budget) ran out (0 without one).
    pub not_run: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} schedules passed ({} faults, {} steps, {} reconciles)",
            self.schedules, self.faults, self.steps, self.reconciles
        )?;
        if self.not_run > 0 {
            write!(f, "; {} not run: the time budget ran out", self.not_run)?;
        }
        Ok(())
    }
}

/// What a controller's context is built from, at each (re)start.
#[derive(Clone)]
pub struct Env {
    client: kube::Client,
    stores: Arc<HashMap<TypeId, Box<dyn Any + Send + Sync>>>,
    db: Option<Arc<DurableStore>>,
    leadership: Leadership,
}

impl Env {
    /// A `kube::Client` of the simulated server (in-process: no socket).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The database the controller runs on, in controller mode ([`Harness::for_controller`]):
    /// a real redb file, which a crash leaves behind and a restart opens again. `None` for
    /// a reconcile function the harness drives itself.
    pub fn database(&self) -> Option<Arc<DurableStore>> {
        self.db.clone()
    }

    /// This replica's leadership (fenced: see [`Leadership::is_leading`]), from this crate's
    /// [`LeaderElector`](crate::leader::LeaderElector) over a Lease on the simulated server,
    /// with [`Harness::leader_election`]; always leading without it. The harness starts a
    /// reconcile only on the leader; a reconcile checks it before each write, since its
    /// leader may be deposed while it waits for an answer.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// The cache of an informer the harness runs (the primary resource, or one added with
    /// [`Harness::owns`] or [`Harness::watches`]); the harness decides when it sees each
    /// event.
    ///
    /// # Panics
    ///
    /// When no informer of `T` was added, and always in controller mode (the controller's
    /// informers are its own there): a mistake in the test's setup.
    pub fn store<T: Resource + Clone + 'static>(&self) -> Store<T>
    where
        T::DynamicType: Eq + std::hash::Hash + Clone,
    {
        self.stores
            .get(&TypeId::of::<T>())
            .and_then(|s| s.downcast_ref::<Store<T>>())
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "no informer of {} in this harness: add it with Harness::owns or Harness::watches",
                    std::any::type_name::<T>()
                )
            })
    }
}

/// The simulated server's state, for invariants.
pub struct World<'a> {
    pub(crate) sim: &'a Sim,
    pub(crate) parsed: &'a Parsed,
}

/// Object versions already parsed, by resource and revision (a revision names one version):
/// an invariant that lists a resource after every write parses only what changed.
#[derive(Default)]
pub(crate) struct Parsed(std::sync::Mutex<HashMap<String, HashMap<u64, Arc<Value>>>>);

impl World<'_> {
    /// The objects of `resource` (`pods`, `deployments.apps`, `foos.samplecontroller.k8s.io`)
    /// in key order; none for an unknown resource. Each version is parsed once per run.
    pub fn list(&self, resource: &str) -> Vec<Arc<Value>> {
        let Ok(raw) = self.sim.objects_raw(resource) else {
            return Vec::new();
        };
        let mut cache = self.parsed.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = cache.remove(resource).unwrap_or_default();
        let mut now = HashMap::with_capacity(raw.len());
        let out = raw
            .into_iter()
            .map(|(rv, json, kept)| {
                let v = old
                    .get(&rv)
                    .cloned()
                    .or(kept)
                    .unwrap_or_else(|| Arc::new(serde_json::from_slice(&json).unwrap_or(Value::Null)));
                now.insert(rv, v.clone());
                v
            })
            .collect();
        cache.insert(resource.to_string(), now);
        out
    }

    /// The objects of type `T`; one that does not decode as `T` is skipped.
    pub fn objects<T: Resource<DynamicType = ()> + DeserializeOwned>(&self) -> Vec<T> {
        self.list(&sim_resource::<T>())
            .iter()
            .filter_map(|v| T::deserialize(&**v).ok())
            .collect()
    }

    /// One object, if it exists.
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.sim.get(resource, namespace, name).ok()
    }
}

/// A check over the server's state.
pub(crate) type CheckFn = Arc<dyn Fn(&World<'_>) -> Result<(), String> + Send + Sync>;

/// A named check over the server's state.
#[derive(Clone)]
pub(crate) struct Invariant {
    pub name: String,
    pub check: CheckFn,
}

/// Which key an object holds, for [`Harness::unique`].
pub(crate) type KeyFn = Arc<dyn Fn(&Value) -> Option<String> + Send + Sync>;

/// "No two objects of `resource` share a key", kept up to date from the changes.
#[derive(Clone)]
pub(crate) struct Unique {
    pub name: String,
    pub resource: String,
    pub key: KeyFn,
}

/// The simulated server's name of `T`'s resource.
pub(crate) fn sim_resource<T: Resource<DynamicType = ()>>() -> String {
    let plural = T::plural(&());
    let group = T::group(&());
    if group.is_empty() {
        plural.into_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// The simulated server's definition of `T`, for kinds it does not know.
fn resource_def<T: Resource<DynamicType = ()> + 'static>() -> ResourceDef
where
    T::Scope: 'static,
{
    let def = ResourceDef::custom(&T::group(&()), &T::version(&()), &T::kind(&()), &T::plural(&()));
    if TypeId::of::<T::Scope>() == TypeId::of::<k8s_openapi::ClusterResourceScope>() {
        def.cluster_scoped()
    } else {
        def
    }
}

/// A typed informer cache the harness fills.
pub(crate) trait Feed: Send {
    /// Applies an ADDED/MODIFIED (`deleted` false) or DELETED event; gives back the object
    /// as decoded (a `T`), for the watch's mapper or the delete handler.
    fn apply(&mut self, deleted: bool, object: &Value) -> Result<Box<dyn Any + Send>, String>;
    /// A relist: the cache becomes exactly `objects`.
    fn reset(&mut self, objects: &[Arc<Value>]) -> Result<(), String>;
}

struct TypedFeed<T: Resource + Clone + 'static>
where
    T::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer: kube::runtime::reflector::store::Writer<T>,
}

impl<T> Feed for TypedFeed<T>
where
    T: Resource + Clone + DeserializeOwned + Send + Sync + 'static,
    T::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    fn apply(&mut self, deleted: bool, object: &Value) -> Result<Box<dyn Any + Send>, String> {
        use kube::runtime::watcher::Event;
        let t: T = decode(object)?;
        let ev = if deleted { Event::Delete(t) } else { Event::Apply(t) };
        self.writer.apply_watcher_event(&ev);
        match ev {
            Event::Delete(t) | Event::Apply(t) => Ok(Box::new(t)),
            _ => unreachable!("built as Delete or Apply above"),
        }
    }

    fn reset(&mut self, objects: &[Arc<Value>]) -> Result<(), String> {
        use kube::runtime::watcher::Event;
        self.writer.apply_watcher_event(&Event::Init);
        for o in objects {
            self.writer.apply_watcher_event(&Event::InitApply(decode::<T>(o)?));
        }
        self.writer.apply_watcher_event(&Event::InitDone);
        Ok(())
    }
}

fn decode<T: DeserializeOwned>(v: &Value) -> Result<T, String> {
    T::deserialize(v).map_err(|e| {
        format!(
            "{} {:?} does not decode as {}: {e}",
            v.get("kind").and_then(Value::as_str).unwrap_or("object"),
            v.at("/metadata/name").and_then(Value::as_str).unwrap_or(""),
            std::any::type_name::<T>()
        )
    })
}

/// Which primary objects an event of a watched kind reconciles, from its JSON and, when the
/// informer decoded it already, its typed form (so a typed mapper does not decode it again).
pub(crate) type MapFn = Arc<dyn Fn(&Value, Option<Box<dyn Any + Send>>) -> Vec<(Option<String>, String)> + Send + Sync>;

/// One informer the harness runs.
#[derive(Clone)]
pub(crate) struct WatchSpec {
    pub resource: String,
    pub def: ResourceDef,
    /// A fresh typed cache: its feed, and its `Store` for [`Env`].
    #[allow(clippy::type_complexity)]
    pub make: Arc<dyn Fn() -> (Box<dyn Feed>, TypeId, Box<dyn Any + Send + Sync>) + Send + Sync>,
    pub map: MapFn,
}

fn watch_spec<T>(map: MapFn) -> WatchSpec
where
    T: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
    T::Scope: 'static,
{
    WatchSpec {
        resource: sim_resource::<T>(),
        def: resource_def::<T>(),
        make: Arc::new(|| {
            let writer = kube::runtime::reflector::store::Writer::<T>::default();
            let store = writer.as_reader();
            (Box::new(TypedFeed { writer }), TypeId::of::<T>(), Box::new(store))
        }),
        map,
    }
}

/// What the controller's `run` stream reported, in controller mode.
pub(crate) enum Reconciled {
    /// Reconciled (the object).
    Ok(String),
    /// The reconcile returned an error (the object, the error).
    Failed(String, String),
    /// The reconcile panicked (the object, the message).
    Panicked(String, String),
    /// Anything else the stream said.
    Other(String),
}

/// Builds a controller's context at each start.
pub(crate) type ContextFn<Ctx> = Arc<dyn Fn(&Env) -> Ctx + Send + Sync>;

/// How controller mode opens a lifetime's database ([`Harness::store_config`]).
pub(crate) type StoreConfigFn = Arc<dyn Fn(StoreConfig) -> StoreConfig + Send + Sync>;

/// Builds the user's controller and its context from an [`Env`] (its database and client)
/// and runs it: its queue, and what its `run` stream reports. An error is the setup's.
pub(crate) type ControllerFn = Arc<
    dyn Fn(Env) -> BoxFuture<'static, Result<(WorkQueue<ObjectKey>, BoxStream<'static, Reconciled>), String>>
        + Send
        + Sync,
>;

/// Errors retried by the controller's error policy come back at once in controller mode
/// (the harness runs it on real time): at most this long.
const CONTROLLER_RETRY: Duration = Duration::from_millis(20);

/// `f()` boxed: the box is allocated first so the future (often kilobytes: kube's request
/// futures nest) can be built in it rather than on the stack and then copied.
#[inline(always)]
fn boxed_in_place<'a, Fut, F>(f: F) -> BoxFuture<'a, Fut::Output>
where
    F: FnOnce() -> Fut,
    Fut: Future + Send + 'a,
{
    let slot = Box::<Fut>::new_uninit();
    let fut: Box<Fut> = Box::write(slot, f());
    Box::into_pin(fut)
}

type ReconcileFn<K, Ctx, E> = Arc<dyn Fn(Arc<K>, Arc<Ctx>) -> BoxFuture<'static, Result<Action, E>> + Send + Sync>;
type ErrorPolicyFn<K, Ctx, E> = Arc<dyn Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync>;
type DeleteFn<K, Ctx> = Arc<dyn Fn(Arc<K>, Arc<Ctx>) -> BoxFuture<'static, ()> + Send + Sync>;

/// The test harness for one controller; see the [module documentation](self).
pub struct Harness<K, Ctx, E> {
    pub(crate) reconcile: ReconcileFn<K, Ctx, E>,
    pub(crate) error_policy: ErrorPolicyFn<K, Ctx, E>,
    /// `None` in controller mode with a setup function, which builds the context itself.
    pub(crate) context: Option<ContextFn<Ctx>>,
    pub(crate) on_delete: Option<DeleteFn<K, Ctx>>,
    pub(crate) recordings: Vec<Recording>,
    pub(crate) resources: Vec<ResourceDef>,
    pub(crate) watches: Vec<WatchSpec>,
    pub(crate) invariants: Vec<Invariant>,
    pub(crate) uniques: Vec<Unique>,
    pub(crate) eventually: Vec<Invariant>,
    pub(crate) volatile: Vec<String>,
    pub(crate) quiet: Duration,
    pub(crate) max_reconciles_per_trigger: u32,
    pub(crate) kinds: FaultKinds,
    pub(crate) max_faults: usize,
    pub(crate) first_seed: u64,
    pub(crate) lost_updates: bool,
    pub(crate) garbage_collector: bool,
    pub(crate) save_dir: Option<PathBuf>,
    pub(crate) name: String,
    pub(crate) threads: usize,
    /// Wall time after which a check starts no more schedules.
    pub(crate) budget: Option<Duration>,
    /// Controller mode: the user's `Controller`, built and run by the harness.
    pub(crate) controller: Option<ControllerFn>,
    /// A leader and a warm standby, with these election timings.
    pub(crate) election: Option<LeaderElectionConfig>,
    /// Controller mode: how each lifetime's database is opened.
    pub(crate) store_config: Option<StoreConfigFn>,
}

impl<K, Ctx, E> Harness<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: fmt::Display + Send + 'static,
{
    /// A harness for the controller `reconcile` of `K`, with its `error_policy`, and the
    /// function that builds its context at each start (a restart builds a new one: whatever
    /// the old one held in memory is lost, as in a real crash).
    pub fn new<R, RF, P, C>(reconcile: R, error_policy: P, context: C) -> Self
    where
        R: Fn(Arc<K>, Arc<Ctx>) -> RF + Send + Sync + 'static,
        RF: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
        C: Fn(&Env) -> Ctx + Send + Sync + 'static,
    {
        Self::base(reconcile, error_policy, Some(Arc::new(context)))
    }

    fn base<R, RF, P>(reconcile: R, error_policy: P, context: Option<ContextFn<Ctx>>) -> Self
    where
        R: Fn(Arc<K>, Arc<Ctx>) -> RF + Send + Sync + 'static,
        RF: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
    {
        let primary = watch_spec::<K>(Arc::new(|v: &Value, _: Option<Box<dyn Any + Send>>| {
            let ns = v.at("/metadata/namespace").and_then(Value::as_str).map(str::to_owned);
            let name = v.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
            vec![(ns, name.to_string())]
        }));
        Self {
            reconcile: Arc::new(move |k, c| boxed_in_place(|| reconcile(k, c))),
            error_policy: Arc::new(error_policy),
            context,
            on_delete: None,
            recordings: Vec::new(),
            resources: Vec::new(),
            watches: vec![primary],
            invariants: Vec::new(),
            uniques: Vec::new(),
            eventually: Vec::new(),
            volatile: Vec::new(),
            quiet: Duration::from_secs(600),
            max_reconciles_per_trigger: 20,
            kinds: FaultKinds::ALL,
            max_faults: 3,
            first_seed: 1,
            lost_updates: true,
            garbage_collector: true,
            save_dir: None,
            name: std::any::type_name::<K>()
                .rsplit("::")
                .next()
                .unwrap_or("controller")
                .to_lowercase(),
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            budget: None,
            store_config: None,
            controller: None,
            election: None,
        }
    }

    /// Adds a recording: its initial state is on the server when the controller starts, its
    /// changes are released during the run. Several recordings (of one cluster) are merged
    /// by resourceVersion.
    #[must_use]
    pub fn recording(mut self, recording: Recording) -> Self {
        self.recordings.push(recording);
        self
    }

    /// Registers a resource the simulated server does not know (a CRD with an irregular
    /// plural; the kinds the controller watches are registered by themselves).
    #[must_use]
    pub fn resource(mut self, def: ResourceDef) -> Self {
        self.resources.push(def);
        self
    }

    /// Watches `T` and reconciles the `K`s that own each (its `ownerReferences` entries of
    /// `K`'s kind), as kube's `Controller::owns`.
    #[must_use]
    pub fn owns<T>(mut self) -> Self
    where
        T: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
        T::Scope: 'static,
    {
        let (kind, api_version) = (K::kind(&()).into_owned(), K::api_version(&()).into_owned());
        self.watches.push(watch_spec::<T>(Arc::new(
            move |v: &Value, _: Option<Box<dyn Any + Send>>| {
                let ns = v.at("/metadata/namespace").and_then(Value::as_str).map(str::to_owned);
                v.at("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|o| {
                        o.get("kind").and_then(Value::as_str) == Some(kind.as_str())
                            && o.get("apiVersion").and_then(Value::as_str) == Some(api_version.as_str())
                    })
                    .filter_map(|o| o.get("name").and_then(Value::as_str))
                    .map(|n| (ns.clone(), n.to_string()))
                    .collect()
            },
        )));
        self
    }

    /// Watches `T` and reconciles the objects `mapper` names, as kube's
    /// `Controller::watches`.
    #[must_use]
    pub fn watches<T, I, F>(mut self, mapper: F) -> Self
    where
        F: Fn(T) -> I + Send + Sync + 'static,
        T: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
        T::Scope: 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        self.watches.push(watch_spec::<T>(Arc::new(
            move |v: &Value, typed: Option<Box<dyn Any + Send>>| {
                let t = match typed.and_then(|t| t.downcast::<T>().ok()) {
                    Some(t) => *t,
                    None => match T::deserialize(v) {
                        Ok(t) => t,
                        Err(_) => return Vec::new(),
                    },
                };
                mapper(t).into_iter().map(|r| (r.namespace, r.name)).collect()
            },
        )));
        self
    }

    /// Runs `handler` when the primary informer delivers a deletion (what a controller that
    /// cleans up on delete events instead of with a finalizer relies on; a relist never
    /// delivers the deletions it skipped).
    #[must_use]
    pub fn on_delete<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.on_delete = Some(Arc::new(move |k, c| boxed_in_place(|| handler(k, c))));
        self
    }

    /// An invariant over the server's state, checked after every reconcile and every write
    /// of the controller.
    #[must_use]
    pub fn invariant(
        mut self,
        name: &str,
        check: impl Fn(&World<'_>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.invariants.push(Invariant {
            name: name.to_string(),
            check: Arc::new(check),
        });
        self
    }

    /// An invariant that no two objects of `resource` hold the same key (`None`: no key),
    /// checked when [`invariant`](Self::invariant)s are: Sieve's duplicate objects, such as
    /// "at most one Deployment per Foo" with the Foo a label or owner reference names. It is
    /// kept up to date from the objects changed since the last check, so its cost does not
    /// grow with the number of objects, as an `invariant` that lists them all does.
    ///
    /// ```no_run
    /// # use durable_informer::testing::Harness;
    /// # fn f<K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static, C: Send + Sync + 'static>(h: Harness<K, C, kube::Error>) -> Harness<K, C, kube::Error> where K::Scope: 'static {
    /// h.unique("at most one Deployment per Foo", "deployments.apps", |d| {
    ///     let foo = d.pointer("/metadata/labels/foo")?.as_str()?;
    ///     Some(format!("{}/{foo}", d.pointer("/metadata/namespace")?.as_str()?))
    /// })
    /// # }
    /// ```
    #[must_use]
    pub fn unique(
        mut self,
        name: &str,
        resource: &str,
        key: impl Fn(&Value) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.uniques.push(Unique {
            name: name.to_string(),
            resource: resource.to_string(),
            key: Arc::new(key),
        });
        self
    }

    /// An invariant checked once, at the end, after the recording and the quiet period.
    #[must_use]
    pub fn eventually(
        mut self,
        name: &str,
        check: impl Fn(&World<'_>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.eventually.push(Invariant {
            name: name.to_string(),
            check: Arc::new(check),
        });
        self
    }

    /// A field (a JSON pointer; `*` matches every array element) left out of the end-state
    /// comparison, such as a timestamp the controller writes.
    #[must_use]
    pub fn volatile(mut self, pointer: &str) -> Self {
        self.volatile.push(pointer.to_string());
        self
    }

    /// How long (virtual time) the run goes on after the last recorded change (default
    /// 10 minutes): requeues within it run.
    #[must_use]
    pub fn quiet_period(mut self, d: Duration) -> Self {
        self.quiet = d;
        self
    }

    /// How often one object may be reconciled without a change from the world (a recorded
    /// change, a restart) before it counts as a hot loop (default 20).
    #[must_use]
    pub fn max_reconciles_per_trigger(mut self, n: u32) -> Self {
        self.max_reconciles_per_trigger = n;
        self
    }

    /// The fault kinds a check samples (default: all).
    #[must_use]
    pub fn faults(mut self, kinds: FaultKinds) -> Self {
        self.kinds = kinds;
        self
    }

    /// At most this many faults per schedule (default 3).
    #[must_use]
    pub fn max_faults(mut self, n: usize) -> Self {
        self.max_faults = n;
        self
    }

    /// The first schedule's seed (default 1); a check runs seeds `seed..seed+n`.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.first_seed = seed;
        self
    }

    /// Whether to check for lost updates (default on).
    #[must_use]
    pub fn lost_updates(mut self, on: bool) -> Self {
        self.lost_updates = on;
        self
    }

    /// Whether the harness deletes objects whose controlling owner is gone, as the cluster's
    /// garbage collector does (default on).
    #[must_use]
    pub fn garbage_collector(mut self, on: bool) -> Self {
        self.garbage_collector = on;
        self
    }

    /// Where failures are written (default `target/controller-testing`, or
    /// `$DURABLE_INFORMER_TESTING_DIR`); the name picks the subdirectory.
    #[must_use]
    pub fn save_to(mut self, dir: impl Into<PathBuf>, name: &str) -> Self {
        self.save_dir = Some(dir.into());
        self.name = name.to_string();
        self
    }

    /// How many schedules a check runs at once, each on its own thread and runtime (default:
    /// the machine's cores). The result does not depend on it: the first failing schedule in
    /// seed order is the one reported.
    #[must_use]
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// Wall time a check may take: once it has passed (the fault-free run counted), no
    /// further schedule starts, and the check reports what ran, with
    /// [`Report::not_run`] saying how many it skipped (`cargo fuzz`'s `-max_total_time`, Go's
    /// `-fuzztime`). How many schedules fit depends on the machine; which ran does not:
    /// always the first ones in seed order, and a failure among them replays by its seed.
    /// Shrinking a failure found is not cut short.
    ///
    /// ```no_run
    /// # use durable_informer::testing::Harness;
    /// # fn f<K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static, C: Send + Sync + 'static>(h: Harness<K, C, kube::Error>) -> Result<(), Box<dyn std::error::Error>> where K::Scope: 'static {
    /// use std::time::Duration;
    /// let report = h.time_budget(Duration::from_secs(30)).check(1_000)?;
    /// println!("{report}");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn time_budget(mut self, budget: Duration) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Controller mode ([`for_controller`](Self::for_controller)): the store options each
    /// lifetime's database is opened with, as the controller's `main` would set them (a
    /// memory budget, compression, a backend wrapper that makes the disk slow or failing).
    /// The harness gives the path; by default the store's defaults apply.
    ///
    /// ```no_run
    /// # use durable_informer::testing::Harness;
    /// # fn f<K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static, C: Send + Sync + 'static>(h: Harness<K, C, kube::Error>) -> Result<(), Box<dyn std::error::Error>> where K::Scope: 'static {
    /// let report = h.store_config(|c| c.object_cache_bytes(64 << 20)).check(100)?;
    /// println!("{report}");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn store_config(mut self, f: impl Fn(StoreConfig) -> StoreConfig + Send + Sync + 'static) -> Self {
        self.store_config = Some(Arc::new(f));
        self
    }

    /// Runs the controller as two replicas, a leader and a warm standby, elected by this
    /// crate's [`LeaderElector`](crate::leader::LeaderElector) over a Lease on the simulated
    /// server (`default/controller-leader`), with `config`'s timings on the virtual clock: every
    /// `retry_period`, each replica runs one acquire-or-renew round, in replica order. Both
    /// replicas' informers follow the server (the standby's caches are warm); only the leader
    /// reconciles, and on taking over a replica reconciles every object it has cached, as
    /// [`Controller::leader_election`](crate::controller::Controller::leader_election) does.
    /// The context gets each replica's leadership from [`Env::leadership`].
    ///
    /// Checks then sample [`Fault::HandOver`] and [`Fault::HandOverAfterWrite`] (a leader cut
    /// off in the middle of a reconcile), and the [`Oracle::DeposedWrite`] oracle fails a
    /// write that reaches the server from a replica while the other one holds the Lease.
    /// Crashes hit the leader (a write's crash, its writer); informers `0..n` are the first
    /// replica's and `n..2n` the standby's. Not in controller mode.
    ///
    /// ```no_run
    /// # use durable_informer::testing::Harness;
    /// # fn f<K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static, C: Send + Sync + 'static>(h: Harness<K, C, kube::Error>) -> Result<(), Box<dyn std::error::Error>> where K::Scope: 'static {
    /// use durable_informer::leader::LeaderElectionConfig;
    /// h.leader_election(LeaderElectionConfig::default()).check(200)?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn leader_election(mut self, config: LeaderElectionConfig) -> Self {
        self.election = Some(config);
        self
    }

    /// Runs one schedule and returns its trace, and its failure if it failed.
    pub fn run(&self, schedule: &Schedule) -> Result<(String, Option<Failure>), HarnessError> {
        let out = run::run_schedule(self, schedule)?;
        Ok((out.trace, out.failure))
    }

    /// The fault-free run, then `schedules` sampled schedules (seeds `seed..seed+schedules`,
    /// each with 1 to `max_faults` faults). The first failure is shrunk to the fewest faults
    /// that still fail, written out, and returned as [`HarnessError::Failed`].
    pub fn check(&self, schedules: u64) -> Result<Report, HarnessError> {
        run::check(self, schedules)
    }

    /// The fault-free run (seed [`seed`](Self::seed)), then one schedule per event boundary
    /// and fault kind: the same interleaving with one fault, after each of its writes (crash,
    /// restart from the database or empty) and before each of its steps (crash and restart
    /// from the database, from an empty one, 5 revisions behind; each informer delayed 10
    /// steps, relisting, getting 2 events again). Only the kinds of
    /// [`faults`](Self::faults) are injected. The first failure is written out and
    /// returned as [`HarnessError::Failed`].
    pub fn check_every_boundary(&self) -> Result<Report, HarnessError> {
        run::check_every_boundary(self)
    }

    /// Runs a schedule saved by a failed check (the directory, or its `schedule.json`) and
    /// checks that it gives the saved trace byte for byte and fails the same way.
    pub fn replay(&self, saved: impl AsRef<Path>) -> Result<Failure, HarnessError> {
        run::replay(self, saved.as_ref())
    }
}

impl<K, Ctx, E> Harness<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    /// A harness for the [`Controller`] you ship: `build` makes it from a database and a
    /// client (the function your `main` calls too, with `owns`, `watches`, predicates and
    /// settings), and the harness runs it with `reconcile`, `error_policy` and the context
    /// `context` builds. Its informers watch the simulated server and keep their caches in a
    /// real redb database file ([`Env::database`]): a crash drops the controller and its
    /// tasks, and the restart opens the same file again (its watches resume from what it
    /// holds), or a new one for an empty restart.
    ///
    /// The controller's own tasks decide the order of its work here, not the harness: each
    /// step releases one recorded change and waits until the controller is idle (its queue
    /// empty, no request in flight, nothing sent for a few milliseconds of real time, its
    /// store's writer flushed: what its informers were sent is stored). The
    /// faults injected at those boundaries are crashes (from the database, empty), a crash
    /// right after a write, a relist (every watch ends with 410), time travel (a restart from
    /// an empty database against a server whose watch cache is behind: each resource's first
    /// streaming list answers that older state, then its events catch up) and a delayed
    /// informer (its resource's watches send nothing for that many steps, or until the
    /// controller waits for it with work queued; informer 0 is the primary resource, then the
    /// others the controller watches, by name). Duplicate
    /// deliveries and hand-overs are not drawn: a duplicate models a client that resumes a
    /// watch from before what it delivered, which this crate's informer does not do (it
    /// resumes after the revision stored with its data), and one controller runs here. Retries the error policy asks for come back at once (20 ms at most);
    /// requeues of successful reconciles do not fire (the run is on real time). Two runs of a
    /// schedule give the same boundaries; the order of writes within one may differ when
    /// several reconciles run at once.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use durable_informer::controller::{Action, Controller};
    /// use durable_informer::store::DurableStore;
    /// use durable_informer::testing::{Env, Harness, Recording};
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::Api;
    ///
    /// /// The controller as `main` builds it.
    /// fn controller(db: &Arc<DurableStore>, client: kube::Client) -> Controller<ConfigMap> {
    ///     Controller::new(db, Api::all(client), Default::default())
    /// }
    /// async fn reconcile(_: Arc<ConfigMap>, _: Arc<kube::Client>) -> Result<Action, kube::Error> {
    ///     Ok(Action::await_change())
    /// }
    /// fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<kube::Client>) -> Action {
    ///     Action::requeue(Duration::from_secs(5))
    /// }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// Harness::for_controller(controller, reconcile, error_policy, |env: &Env| env.client())
    ///     .recording(Recording::open("tests/data/recordings/configmaps.jsonl")?)
    ///     .check(50)?;
    /// # Ok(()) }
    /// ```
    pub fn for_controller<B, R, RF, P, C>(build: B, reconcile: R, error_policy: P, context: C) -> Self
    where
        B: Fn(&Arc<DurableStore>, kube::Client) -> Controller<K> + Send + Sync + 'static,
        R: Fn(Arc<K>, Arc<Ctx>) -> RF + Send + Sync + 'static,
        RF: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
        C: Fn(&Env) -> Ctx + Send + Sync + 'static,
    {
        let build = Arc::new(build);
        let context = Arc::new(context);
        Self::for_controller_with(
            move |env: Env| {
                let (build, context) = (build.clone(), context.clone());
                async move {
                    let ctx = context(&env);
                    let db = env.database().ok_or("controller mode without a database")?;
                    Ok::<_, &str>((build(&db, env.client()), ctx))
                }
            },
            reconcile,
            error_policy,
        )
    }

    /// [`for_controller`](Self::for_controller) for a controller whose setup is async, as a
    /// `main` that builds informers is: `setup` gets the [`Env`] (its database and client)
    /// at each start and returns the controller with its context, so the context can hold
    /// readers of informers the controller was given (`Informer::reader`, then
    /// `Controller::owns_informer`). An error fails the run (oracle `harness`).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use durable_informer::controller::{Action, Controller, Relation};
    /// use durable_informer::informer::{Informer, Reader};
    /// use durable_informer::testing::{Env, Harness, Recording};
    /// use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    /// use kube::Api;
    ///
    /// struct Ctx {
    ///     secrets: Reader<Secret>,
    /// }
    /// async fn reconcile(_: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    ///     let _cached = ctx.secrets.state();
    ///     Ok(Action::await_change())
    /// }
    /// fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<Ctx>) -> Action {
    ///     Action::requeue(Duration::from_secs(5))
    /// }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// Harness::for_controller_with(
    ///     |env: Env| async move {
    ///         let db = env.database().ok_or("no database")?;
    ///         let secrets = Informer::from_api(&db, Api::<Secret>::all(env.client()))
    ///             .allow_secrets()
    ///             .build()
    ///             .await?;
    ///         let ctx = Ctx { secrets: secrets.reader() };
    ///         let c = Controller::new(&db, Api::<ConfigMap>::all(env.client()), Default::default())
    ///             .owns_informer(secrets, Relation::default());
    ///         Ok::<_, Box<dyn std::error::Error + Send + Sync>>((c, ctx))
    ///     },
    ///     reconcile,
    ///     error_policy,
    /// )
    /// .recording(Recording::open("tests/data/recordings/configmaps.jsonl")?)
    /// .check(50)?;
    /// # Ok(()) }
    /// ```
    pub fn for_controller_with<S, SF, SE, R, RF, P>(setup: S, reconcile: R, error_policy: P) -> Self
    where
        S: Fn(Env) -> SF + Send + Sync + 'static,
        SF: Future<Output = Result<(Controller<K>, Ctx), SE>> + Send + 'static,
        SE: fmt::Display,
        R: Fn(Arc<K>, Arc<Ctx>) -> RF + Send + Sync + 'static,
        RF: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
    {
        let mut h = Self::base(reconcile, error_policy, None);
        let (rec, pol) = (h.reconcile.clone(), h.error_policy.clone());
        let setup = Arc::new(setup);
        h.controller = Some(Arc::new(move |env: Env| {
            let (rec, pol, setup) = (rec.clone(), pol.clone(), setup.clone());
            Box::pin(async move {
                let (c, ctx) = setup(env).await.map_err(|e| e.to_string())?;
                let queue = c.queue();
                let stream = c
                    .run(
                        move |k, c| rec(k, c),
                        move |k, e: &E, c| {
                            let a = pol(k, e, c);
                            match run::requeue_after(&a) {
                                Some(d) if d > CONTROLLER_RETRY => Action::requeue(CONTROLLER_RETRY),
                                _ => a,
                            }
                        },
                        Arc::new(ctx),
                    )
                    .map(|r| {
                        use crate::controller::Error;
                        match r {
                            Ok((o, _)) => Reconciled::Ok(o.to_string()),
                            Err(Error::ReconcilerFailed(e, o)) => Reconciled::Failed(o.to_string(), e.to_string()),
                            Err(Error::ReconcilerPanicked(m, o)) => Reconciled::Panicked(o.to_string(), m),
                            Err(e) => Reconciled::Other(e.to_string()),
                        }
                    })
                    .boxed();
                Ok((queue, stream))
            })
        }));
        h.kinds = FaultKinds {
            crash: true,
            crash_after_write: true,
            time_travel: true,
            delay: true,
            relist: true,
            duplicate: false,
            hand_over: false,
        };
        h
    }
}
