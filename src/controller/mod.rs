//! The controller runner: handlers enqueue keys, workers pop them, read the listers, reconcile,
//! and requeue through the rate limiter on error (client-go's controller pattern).
//!
//! It owns the workqueue and the workers; it never touches the store or the network directly —
//! the informers do.
//!
//! ## Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use durable_informer::controller::{predicates, Action, Controller};
//! use durable_informer::informer::{Informer, Lister};
//! use durable_informer::object::ObjectKey;
//! use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
//!
//! # async fn f(deployments: Informer<Deployment>, replicasets: Informer<ReplicaSet>) -> Result<(), Box<dyn std::error::Error>> {
//! struct Ctx {
//!     deployments: Lister<Deployment>,
//! }
//! #[derive(Debug, thiserror::Error)]
//! #[error("cache: {0}")]
//! struct Error(#[from] durable_informer::store::StoreError);
//!
//! async fn reconcile(key: ObjectKey, ctx: Arc<Ctx>) -> Result<Action, Error> {
//!     let Some(d) = ctx.deployments.get_by_key(&key)? else {
//!         return Ok(Action::await_change()); // deleted
//!     };
//!     println!("reconcile {key} at generation {:?}", d.metadata.generation);
//!     Ok(Action::requeue(Duration::from_secs(300)))
//! }
//! fn error_policy(key: &ObjectKey, error: &Error, _ctx: Arc<Ctx>) -> Action {
//!     eprintln!("{key}: {error}");
//!     Action::requeue(Duration::from_secs(5))
//! }
//!
//! let ctx = Arc::new(Ctx { deployments: deployments.lister() });
//! let (stop_tx, stop) = tokio::sync::watch::channel(false);
//! let summary = Controller::new(deployments)
//!     .name("deployments")
//!     .owns(replicasets) // ReplicaSets whose controller is an apps/Deployment
//!     .with_predicate(predicates::generation())
//!     .workers(2)
//!     .run(reconcile, error_policy, ctx, stop)
//!     .await?;
//! println!("{summary:?}");
//! # let _ = stop_tx; Ok(()) }
//! ```
//!
//! `run` starts the informers it was given that are not started yet (starting is idempotent, so
//! informers shared through an [`InformerFactory`](crate::informer::InformerFactory) are fine).
//!
//! ## kube-runtime's controller instead
//!
//! [`watcher_stream`](crate::informer::watcher_stream) turns an informer into the
//! `kube::runtime::watcher::Event` stream that `kube::runtime::reflector` and
//! `kube::runtime::Controller::for_stream` consume (kube-runtime's `unstable-runtime-stream-control`
//! feature, which the application enables), for code already written against kube-runtime:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use durable_informer::informer::{watcher_stream, Informer};
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::controller::Action;
//! use kube::runtime::{reflector, Controller, WatchStreamExt};
//!
//! async fn reconcile(cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, kube::Error> {
//!     println!("reconcile {:?}", cm.metadata.name);
//!     Ok(Action::await_change())
//! }
//! fn error_policy(_cm: Arc<ConfigMap>, _e: &kube::Error, _ctx: Arc<()>) -> Action {
//!     Action::requeue(Duration::from_secs(5))
//! }
//!
//! # async fn f(informer: Informer<ConfigMap>) {
//! informer.start();
//! let (reader, writer) = reflector::store();
//! let stream = reflector(writer, watcher_stream(&informer)).applied_objects();
//! Controller::for_stream(stream, reader)
//!     .run(reconcile, error_policy, Arc::new(()))
//!     .for_each(|_| async {})
//!     .await;
//! # }
//! ```

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::informer::{handler_fn, Entry, Event, HandlerOptions, Informer, InformerError, Registration, Watched};
use crate::leader::Leadership;
use crate::object::ObjectKey;
use crate::queue::{default_controller_rate_limiter, WorkQueue};

/// What to do next with a key: the result of a reconcile, and of the error policy after a
/// failed one (kube-runtime's `Action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Action {
    next: Next,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Next {
    #[default]
    AwaitChange,
    After(Duration),
    RateLimited,
}

impl Action {
    /// Reconcile again after `delay` even if nothing changes.
    #[must_use]
    pub fn requeue(delay: Duration) -> Self {
        Self {
            next: Next::After(delay),
        }
    }

    /// Reconcile again only when something changes.
    #[must_use]
    pub fn await_change() -> Self {
        Self {
            next: Next::AwaitChange,
        }
    }

    /// Reconcile again after the controller's rate limiter's delay for this key (client-go's
    /// `AddRateLimited`: per-key exponential backoff, 5 ms doubling to 1000 s, and an overall
    /// 10 qps): what [`default_error_policy`] answers.
    #[must_use]
    pub fn requeue_rate_limited() -> Self {
        Self {
            next: Next::RateLimited,
        }
    }

    /// The requeue delay, if a fixed one.
    #[must_use]
    pub fn requeue_after(&self) -> Option<Duration> {
        match self.next {
            Next::After(d) => Some(d),
            Next::AwaitChange | Next::RateLimited => None,
        }
    }
}

/// The error policy client-go's controllers follow: every failure is retried through the rate
/// limiter ([`Action::requeue_rate_limited`]).
///
/// ```
/// use durable_informer::controller::{default_error_policy, Action};
/// use durable_informer::object::ObjectKey;
/// let a = default_error_policy(&ObjectKey::cluster("x"), &"boom", std::sync::Arc::new(()));
/// assert_eq!(a, Action::requeue_rate_limited());
/// ```
pub fn default_error_policy<E, Ctx>(_key: &ObjectKey, _error: &E, _ctx: Arc<Ctx>) -> Action {
    Action::requeue_rate_limited()
}

/// What [`Controller::run`] did, once it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RunSummary {
    /// Reconciles that returned `Ok`.
    pub reconciled: u64,
    /// Reconciles that returned `Err` (each then went through the error policy).
    pub failed: u64,
    /// Reconciles that panicked (each requeued through the rate limiter).
    pub panicked: u64,
}

/// Why [`Controller::run`] could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// An informer stopped before its cache synced: no worker was started, as client-go's
    /// controllers refuse to run on a cache that `WaitForCacheSync` did not confirm.
    #[error("caches did not sync: {0}")]
    CacheSync(#[source] crate::informer::InformerError),
}

/// The key of an object, `namespace/name` or `name`.
#[must_use]
pub fn key_of<K: Resource>(obj: &K) -> Option<ObjectKey> {
    let meta = obj.meta();
    let name = meta.name.clone()?;
    Some(ObjectKey {
        namespace: meta.namespace.clone(),
        name,
    })
}

/// Keys of the owners of `obj` whose kind is `owner_kind`, of any API group (same namespace,
/// as owner references are namespace-local); the controlling owner only when
/// `controller_only`. [`owner_keys_of`] also checks the group.
#[must_use]
pub fn owner_keys<K: Resource>(obj: &K, owner_kind: &str, controller_only: bool) -> Vec<ObjectKey> {
    owners(obj.meta(), None, owner_kind, controller_only)
}

/// Keys of the owners of `obj` of type `O` (its API group and kind, any version: an owner
/// reference may name an older version of the owner's API), the controlling owner only when
/// `controller_only`.
///
/// ```
/// use durable_informer::controller::owner_keys_of;
/// use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
///
/// let owned = |api_version: &str| ReplicaSet {
///     metadata: ObjectMeta {
///         namespace: Some("prod".into()),
///         owner_references: Some(vec![OwnerReference {
///             api_version: api_version.into(),
///             kind: "Deployment".into(),
///             name: "web".into(),
///             controller: Some(true),
///             ..Default::default()
///         }]),
///         ..Default::default()
///     },
///     ..Default::default()
/// };
/// assert_eq!(owner_keys_of::<Deployment, _>(&owned("apps/v1"), true)[0].to_string(), "prod/web");
/// // Another group's Deployment is not ours.
/// assert!(owner_keys_of::<Deployment, _>(&owned("example.com/v1"), true).is_empty());
/// ```
#[must_use]
pub fn owner_keys_of<O, K>(obj: &K, controller_only: bool) -> Vec<ObjectKey>
where
    O: Resource,
    O::DynamicType: Default,
    K: Resource,
{
    let dt = O::DynamicType::default();
    owners(obj.meta(), Some(&O::group(&dt)), &O::kind(&dt), controller_only)
}

fn owners(meta: &kube::core::ObjectMeta, group: Option<&str>, kind: &str, controller_only: bool) -> Vec<ObjectKey> {
    let refs = meta.owner_references.iter().flatten();
    let refs = refs.map(|o| {
        (
            o.api_version.as_str(),
            o.kind.as_str(),
            o.name.as_str(),
            o.controller == Some(true),
        )
    });
    owners_in(meta.namespace.as_ref(), refs, group, kind, controller_only)
}

/// Like [`owners`], over the metadata the store extracts (the controller's `owns` reads it
/// with one scan of the JSON, never decoding the object).
fn scanned_owners(
    meta: &crate::object::ObjectMeta,
    group: Option<&str>,
    kind: &str,
    controller_only: bool,
) -> Vec<ObjectKey> {
    let refs = meta.owner_references.iter();
    let refs = refs.map(|o| (o.api_version.as_str(), o.kind.as_str(), o.name.as_str(), o.controller));
    owners_in(meta.namespace.as_ref(), refs, group, kind, controller_only)
}

/// Keys of the owners among `refs` (`apiVersion`, `kind`, `name`, `controller`).
fn owners_in<'a>(
    namespace: Option<&String>,
    refs: impl Iterator<Item = (&'a str, &'a str, &'a str, bool)>,
    group: Option<&str>,
    kind: &str,
    controller_only: bool,
) -> Vec<ObjectKey> {
    refs.filter(|(api_version, ref_kind, _, controller)| {
        // `apiVersion` is `group/version`, or `version` alone for the core group.
        let ref_group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        *ref_kind == kind && group.is_none_or(|g| g == ref_group) && (!controller_only || *controller)
    })
    .map(|(_, _, name, _)| ObjectKey {
        namespace: namespace.cloned(),
        name: name.to_owned(),
    })
    .collect()
}

/// A value computed from an object's metadata; an update whose old and new values are equal
/// is not enqueued (kube-runtime's predicates). `None` lets the event through.
pub type Predicate = Arc<dyn Fn(&kube::core::ObjectMeta) -> Option<u64> + Send + Sync>;

/// Predicates over the stored metadata, for [`Controller::with_predicate`] (kube-runtime's
/// `predicates`), evaluated on the objects the informer's cache decoded (once, shared with the
/// handlers and listers).
pub mod predicates {
    use std::hash::{Hash, Hasher};
    use std::sync::Arc;

    use super::Predicate;

    fn hash(v: &impl Hash) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        v.hash(&mut h);
        h.finish()
    }

    /// `metadata.generation`: changes of the spec only (status writes leave it alone); objects
    /// without a generation always pass.
    #[must_use]
    pub fn generation() -> Predicate {
        Arc::new(|m| m.generation.map(|g| hash(&g)))
    }

    /// `metadata.labels`.
    #[must_use]
    pub fn labels() -> Predicate {
        Arc::new(|m| Some(hash(&m.labels)))
    }

    /// `metadata.annotations`.
    #[must_use]
    pub fn annotations() -> Predicate {
        Arc::new(|m| Some(hash(&m.annotations)))
    }

    /// `metadata.finalizers`.
    #[must_use]
    pub fn finalizers() -> Predicate {
        Arc::new(|m| Some(hash(&m.finalizers)))
    }
}

/// Whether an update with these states passes the predicates (see [`passes`]), on the
/// objects the cache decoded (once, for everyone). A state not held decoded (evicted) or that
/// does not decode passes: a reconcile too many is safe, one too few is not.
fn passes_entries<K: Resource + DeserializeOwned>(predicates: &[Predicate], old: &Entry<K>, new: &Entry<K>) -> bool {
    if predicates.is_empty() {
        return true;
    }
    match (old.object(), new.object()) {
        (Some(Ok(o)), Some(Ok(n))) => passes(predicates, o.meta(), n.meta()),
        _ => true,
    }
}

/// A trigger from `informer` whose changes `register` turns into keys of `queue`.
fn trigger<C>(
    informer: Informer<C>,
    register: impl FnOnce(&Informer<C>, WorkQueue<ObjectKey>) -> Registration + Send + 'static,
) -> Trigger
where
    C: DeserializeOwned + Send + Sync + 'static,
{
    Box::new(move |queue| {
        let reg = register(&informer, queue);
        // Idempotent: an informer already started (say, shared through a factory) keeps its
        // one reflector.
        informer.start();
        let synced = informer.clone();
        let wait = async move { synced.wait_for_sync().await };
        (reg, Box::pin(wait), Box::new(informer))
    })
}

/// A related informer's registration, its sync, and the informer itself: the controller holds
/// it while it runs, or an informer whose only handle was given to `owns` or `watches` would
/// stop (dropping its last handle stops it) right after its sync.
type Armed = (
    Registration,
    BoxFuture<'static, Result<(), InformerError>>,
    Box<dyn Any + Send + Sync>,
);

type Trigger = Box<dyn FnOnce(WorkQueue<ObjectKey>) -> Armed + Send>;

/// Runs a reconcile function over the keys of a primary informer and of related objects.
pub struct Controller<K> {
    primary: Informer<K>,
    triggers: Vec<Trigger>,
    workers: usize,
    name: String,
    queue: WorkQueue<ObjectKey>,
    predicates: Vec<Predicate>,
    leading: Option<Leadership>,
}

fn enqueue_handler<O, F>(queue: WorkQueue<ObjectKey>, map: F) -> impl crate::informer::EventHandler<O>
where
    O: Send + Sync + 'static,
    F: Fn(&O) -> Vec<ObjectKey> + Send + Sync + 'static,
{
    handler_fn(move |ev: Event<O>| -> Result<(), std::convert::Infallible> {
        match &ev {
            // Both: an owner reference may have moved from one owner to another.
            Event::Update { old, new, .. } => map(old).into_iter().chain(map(new)).for_each(|k| queue.add(k)),
            other => map(other.object()).into_iter().for_each(|k| queue.add(k)),
        }
        Ok(())
    })
}

/// Whether an update passes the predicates: none given, or one whose value changed or is `None`.
fn passes(predicates: &[Predicate], old: &kube::core::ObjectMeta, new: &kube::core::ObjectMeta) -> bool {
    predicates.is_empty()
        || predicates.iter().any(|p| match (p(old), p(new)) {
            (Some(a), Some(b)) => a != b,
            _ => true,
        })
}

fn controller_queue(name: &str) -> WorkQueue<ObjectKey> {
    WorkQueue::builder()
        .name(name)
        .rate_limiter(default_controller_rate_limiter())
        .build()
}

impl<K> Controller<K>
where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
{
    /// A controller for the objects of `primary`, with client-go's default rate limiter
    /// (per-item exponential 5 ms–1000 s, overall 10 qps / burst 100), named `controller`
    /// (see [`name`](Self::name)).
    #[must_use]
    pub fn new(primary: Informer<K>) -> Self {
        Self {
            primary,
            triggers: Vec::new(),
            workers: 1,
            name: "controller".to_owned(),
            queue: controller_queue("controller"),
            predicates: Vec::new(),
            leading: None,
        }
    }

    /// The controller's name: the `name` label of its workqueue metrics and the `controller`
    /// label of its reconcile metrics (see [`metrics`](crate::metrics)). Call it before
    /// [`queue`](Self::queue): it gives the controller a new, empty queue.
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self.queue = controller_queue(name);
        self
    }

    /// Also reconciles the controlling owner of every changed object of `informer` whose owner
    /// reference names `K` (its API group and kind, from the type): a Deployment controller
    /// `owns` its ReplicaSets. The objects are never decoded: their owner references come from
    /// the metadata the store scanned when it received them.
    #[must_use]
    pub fn owns<C>(mut self, informer: Informer<C>) -> Self
    where
        K::DynamicType: Default,
        C: DeserializeOwned + Send + Sync + 'static,
    {
        let dt = K::DynamicType::default();
        let (group, kind) = (K::group(&dt).into_owned(), K::kind(&dt).into_owned());
        self.triggers.push(trigger(informer, move |informer, queue| {
            let on_change = move |c: Watched<'_, C>| {
                // Both states: an owner reference may have moved from one owner to another.
                let old = c.old.filter(|o| !c.new.is_some_and(|n| Arc::ptr_eq(o, n)));
                for state in old.into_iter().chain(c.new) {
                    scanned_owners(&state.meta, Some(&group), &kind, true)
                        .into_iter()
                        .for_each(|k| queue.add(k));
                }
            };
            informer.watch_changes(on_change, HandlerOptions::volatile())
        }));
        self
    }

    /// Reconciles a primary object's update only when one of `predicate`'s values changed
    /// (kube-runtime's `predicate_filter`); adds and deletes always. Given several times,
    /// a change of any one lets the update through. Evaluated on the objects as the informer's
    /// cache decoded them.
    ///
    /// ```no_run
    /// # use durable_informer::controller::{predicates, Controller};
    /// # fn f(deployments: durable_informer::informer::Informer<k8s_openapi::api::apps::v1::Deployment>) {
    /// // Spec changes and relabelling, not status writes.
    /// let c = Controller::new(deployments)
    ///     .with_predicate(predicates::generation())
    ///     .with_predicate(predicates::labels());
    /// # let _ = c; }
    /// ```
    #[must_use]
    pub fn with_predicate(mut self, predicate: Predicate) -> Self {
        self.predicates.push(predicate);
        self
    }

    /// Also reconciles the keys `map` gives for every changed object of `informer`.
    #[must_use]
    pub fn watches<C, F>(mut self, informer: Informer<C>, map: F) -> Self
    where
        C: DeserializeOwned + Send + Sync + 'static,
        F: Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
    {
        self.triggers.push(trigger(informer, move |informer, queue| {
            informer.add_event_handler(enqueue_handler(queue, map), HandlerOptions::volatile())
        }));
        self
    }

    /// Number of concurrent workers (default 1). One key is never reconciled by two workers at
    /// once.
    #[must_use]
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// Reconciles only while `leading` is true, as one replica of several (from
    /// [`LeaderElector::leadership`](crate::leader::LeaderElector::leadership)).
    ///
    /// A follower keeps its informers running and synced and its queue filled (a warm
    /// standby) but reconciles nothing. On winning it enqueues every key of the primary
    /// informer (what the previous leader did is unknown) and starts its workers at once; on
    /// losing, its workers take no new key, and `run` waits for the reconciles in flight.
    /// The elector turns leadership off `lease_duration - renew_deadline` (5 s by default)
    /// before another replica may take the Lease: a reconcile that can run longer than that
    /// should check [`Leadership::is_leading`] itself before it writes.
    ///
    /// Pass [`LeaderElector::fenced_leadership`](crate::leader::LeaderElector::fenced_leadership)
    /// (a plain `watch::Receiver<bool>` works too): each worker then checks the term's deadline
    /// on the monotonic clock before it takes a key, so a replica that resumes from a pause
    /// longer than the Lease reconciles nothing before its elector notices the loss.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use durable_informer::controller::{Action, Controller};
    /// # use durable_informer::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector};
    /// # use durable_informer::object::ObjectKey;
    /// # async fn f(client: kube::Client, pods: durable_informer::informer::Informer<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
    /// # use durable_informer::controller::default_error_policy;
    /// # async fn reconcile(_k: ObjectKey, _c: Arc<()>) -> Result<Action, String> { Ok(Action::await_change()) }
    /// let elector = LeaderElector::new(
    ///     KubeLeaseLock::new(client, "default", "my-controller", "replica-a"),
    ///     LeaderElectionConfig::default(),
    /// );
    /// let controller = Controller::new(pods).leader_election(elector.fenced_leadership());
    /// let (stop_tx, stop) = tokio::sync::watch::channel(false);
    /// let elector_task = tokio::spawn(elector.run(stop.clone()));
    /// controller.run(reconcile, default_error_policy, Arc::new(()), stop).await?;
    /// # let _ = (stop_tx, elector_task); Ok(()) }
    /// ```
    #[must_use]
    pub fn leader_election(mut self, leading: impl Into<Leadership>) -> Self {
        self.leading = Some(leading.into());
        self
    }

    /// The workqueue (for metrics, or to enqueue keys by hand).
    #[must_use]
    pub fn queue(&self) -> WorkQueue<ObjectKey> {
        self.queue.clone()
    }

    /// Starts the informers (those not started yet), waits for their caches to sync, runs the
    /// workers until `stop` turns true, then shuts down gracefully: events are no longer
    /// enqueued, keys already queued are still reconciled, and `run` returns once every
    /// reconcile in flight has finished (delayed requeues are dropped).
    ///
    /// After a failed reconcile, `error_policy` decides what comes next (kube-runtime's
    /// `error_policy`; [`default_error_policy`] is client-go's rate-limited retry). A reconcile
    /// that panics is logged with the key and requeued through the rate limiter; the worker
    /// lives on. As with any caught panic, state the reconcile shared through `ctx` may be
    /// left half-updated.
    ///
    /// # Errors
    ///
    /// [`ControllerError::CacheSync`] when an informer stops before its cache synced: then no
    /// reconcile ran.
    pub async fn run<Ctx, F, Fut, E, P>(
        self,
        reconcile: F,
        error_policy: P,
        ctx: Arc<Ctx>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<RunSummary, ControllerError>
    where
        Ctx: Send + Sync + 'static,
        F: Fn(ObjectKey, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        P: Fn(&ObjectKey, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
    {
        let queue = self.queue.clone();
        let mut regs = Vec::new();
        let mut waits: Vec<BoxFuture<'static, Result<(), InformerError>>> = Vec::new();
        let primary = self.primary.clone();
        let predicates = self.predicates;
        let q = queue.clone();
        // Keys as the informer's cache takes each change: with no predicate to evaluate, no
        // object is decoded (the metadata was scanned once, on arrival).
        let enqueue = move |c: Watched<'_, K>| {
            if let (Some(old), Some(new)) = (c.old, c.new) {
                if !passes_entries(&predicates, old, new) {
                    return;
                }
            }
            q.add(c.key.clone());
        };
        regs.push(primary.watch_changes(enqueue, HandlerOptions::volatile()));
        primary.start();
        let mut related = Vec::new();
        for t in self.triggers {
            let (reg, wait, informer) = t(queue.clone());
            regs.push(reg);
            waits.push(wait);
            related.push(informer);
        }
        // Wait for every cache before the first reconcile (WaitForCacheSync).
        let all_synced = async {
            primary.wait_for_sync().await?;
            for w in waits {
                w.await?;
            }
            for r in &regs {
                r.wait_for_sync().await?;
            }
            Ok::<_, InformerError>(())
        };
        let synced = tokio::select! {
            r = all_synced => Some(r),
            r = stop.wait_for(|s| *s) => { drop(r); None },
        };
        match synced {
            Some(Ok(())) => {}
            stopped_or_failed => {
                for r in regs {
                    r.remove().await;
                }
                return match stopped_or_failed {
                    Some(Err(e)) => Err(ControllerError::CacheSync(e)),
                    _ => Ok(RunSummary::default()),
                };
            }
        }
        let workers = Workers {
            queue: queue.clone(),
            reconcile: Arc::new(reconcile),
            error_policy: Arc::new(error_policy),
            ctx,
            counts: Arc::new(Counts::new(&self.name)),
        };
        let handles = match self.leading {
            None => {
                tracing::info!(workers = self.workers, "caches synced; starting workers");
                let handles = workers.spawn(self.workers, None);
                let _ = stop.wait_for(|s| *s).await;
                handles
            }
            Some(leading) => lead_while(&primary, &workers, self.workers, leading, &mut stop).await,
        };
        for r in regs {
            r.remove().await;
        }
        drain(&queue, handles).await;
        // Held until here: the related informers run as long as the controller.
        drop(related);
        Ok(workers.counts.summary())
    }
}

/// Waits until `leading` is true; false once its elector is gone (a dropped sender keeps its
/// last value, which must not count as leadership).
async fn until_leading(leading: &mut watch::Receiver<bool>) -> bool {
    loop {
        if leading.has_changed().is_err() {
            return false;
        }
        if *leading.borrow_and_update() {
            return true;
        }
        if leading.changed().await.is_err() {
            return false;
        }
    }
}

/// Runs the workers only while `leading` is true, until `stop`; returns the workers still
/// running then (none when stopped as a follower).
async fn lead_while<K, W: Spawn>(
    primary: &Informer<K>,
    workers: &W,
    n: usize,
    leadership: Leadership,
    stop: &mut watch::Receiver<bool>,
) -> Vec<JoinHandle<()>>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let mut leading = leadership.flag();
    loop {
        tracing::info!("caches synced; waiting for leadership");
        let won = tokio::select! {
            won = until_leading(&mut leading) => won,
            _ = stop.wait_for(|s| *s) => return Vec::new(),
        };
        if !won {
            // The elector is gone: this replica can never lead again.
            let _ = stop.wait_for(|s| *s).await;
            return Vec::new();
        }
        // What the previous leader reconciled is unknown: every key once more.
        let store = primary.store();
        match tokio::task::spawn_blocking(move || store.list_keys()).await {
            Ok(Ok(keys)) => keys.into_iter().for_each(|k| workers.queue().add(k)),
            Ok(Err(e)) => tracing::warn!(error = %e, "listing the keys to reconcile after winning failed"),
            Err(e) => tracing::warn!(error = %e, "listing the keys to reconcile after winning failed"),
        }
        tracing::info!(workers = n, "leading; starting workers");
        let handles = workers.spawn(n, Some(leadership.clone()));
        // Decided first: a `watch::Ref` must not live across the awaits below.
        let lost = tokio::select! {
            // Lost, or the elector is gone (then leadership cannot be vouched for either).
            r = leading.wait_for(|l| !*l) => { drop(r); true }
            _ = stop.wait_for(|s| *s) => false,
        };
        if !lost {
            return handles;
        }
        tracing::warn!("leadership lost; stopping workers");
        for h in handles {
            if let Err(e) = h.await {
                tracing::error!(error = %e, "controller worker failed");
            }
        }
    }
}

/// Outcome counters of one run, and the process-wide reconcile metrics of this controller.
struct Counts {
    reconciled: AtomicU64,
    failed: AtomicU64,
    panicked: AtomicU64,
    name: String,
}

impl Counts {
    fn new(name: &str) -> Self {
        Self {
            reconciled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
            name: name.to_owned(),
        }
    }

    fn record(&self, result: crate::metrics::ReconcileResult, took: Duration) {
        use crate::metrics::ReconcileResult as R;
        let counter = match result {
            R::Success | R::Requeue | R::RequeueAfter => &self.reconciled,
            R::Error => &self.failed,
            R::Panic => &self.panicked,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        crate::metrics::global().observe_reconcile(&self.name, result, took);
    }

    fn summary(&self) -> RunSummary {
        RunSummary {
            reconciled: self.reconciled.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            panicked: self.panicked.load(Ordering::Relaxed),
        }
    }
}

/// What every worker of one controller shares.
struct Workers<Ctx, F, P> {
    queue: WorkQueue<ObjectKey>,
    reconcile: Arc<F>,
    error_policy: Arc<P>,
    ctx: Arc<Ctx>,
    counts: Arc<Counts>,
}

impl<Ctx, F, P> Clone for Workers<Ctx, F, P> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            reconcile: self.reconcile.clone(),
            error_policy: self.error_policy.clone(),
            ctx: self.ctx.clone(),
            counts: self.counts.clone(),
        }
    }
}

/// Starting workers, whatever the reconcile's types (so [`lead_while`] needs none of them).
trait Spawn {
    fn queue(&self) -> &WorkQueue<ObjectKey>;
    fn spawn(&self, n: usize, leading: Option<Leadership>) -> Vec<JoinHandle<()>>;
}

impl<Ctx, F, Fut, E, P> Spawn for Workers<Ctx, F, P>
where
    Ctx: Send + Sync + 'static,
    F: Fn(ObjectKey, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
    P: Fn(&ObjectKey, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
{
    fn queue(&self) -> &WorkQueue<ObjectKey> {
        &self.queue
    }

    /// Spawns `n` worker tasks; each ends when the queue is shut down and empty, or, with
    /// `leading`, once it turns false (after the reconcile in flight).
    fn spawn(&self, n: usize, leading: Option<Leadership>) -> Vec<JoinHandle<()>> {
        (0..n)
            .map(|_| {
                let w = self.clone();
                let mut leading = leading.clone();
                tokio::spawn(async move {
                    loop {
                        let next = match &mut leading {
                            // `get` is cancel safe: losing leadership takes no key.
                            Some(l) => {
                                let mut flag = l.flag();
                                tokio::select! {
                                    biased;
                                    _ = flag.wait_for(|l| !*l) => None,
                                    key = w.queue.get() => key,
                                }
                            }
                            None => w.queue.get().await,
                        };
                        let Some(key) = next else { break };
                        if let Some(l) = &mut leading {
                            if !l.is_leading() {
                                // The term ran out (a pause?) before the elector noticed: hand
                                // the key back and wait for a renewal or the loss.
                                w.queue.add(key.clone());
                                w.queue.done(&key);
                                l.changed().await;
                                continue;
                            }
                        }
                        // `done` always, even if the error policy panics: otherwise the key is
                        // never handed out again and a drain waits for it forever.
                        let _done = DoneOnDrop(&w.queue, &key);
                        w.process(&key).await;
                    }
                })
            })
            .collect()
    }
}

impl<Ctx, F, Fut, E, P> Workers<Ctx, F, P>
where
    Ctx: Send + Sync + 'static,
    F: Fn(ObjectKey, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
    P: Fn(&ObjectKey, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
{
    /// Reconciles `key` once and schedules what comes next.
    async fn process(&self, key: &ObjectKey) {
        use crate::metrics::ReconcileResult as R;
        let (reconcile, ctx) = (self.reconcile.clone(), self.ctx.clone());
        let k = key.clone();
        let started = std::time::Instant::now();
        // Inside the async block, so that a panic in the call itself is caught too.
        let result = AssertUnwindSafe(async move { reconcile(k, ctx).await })
            .catch_unwind()
            .await;
        let took = started.elapsed();
        match result {
            Ok(Ok(action)) => {
                let outcome = match action.next {
                    Next::AwaitChange => R::Success,
                    Next::After(_) => R::RequeueAfter,
                    Next::RateLimited => R::Requeue,
                };
                self.counts.record(outcome, took);
                self.schedule(key, action, true);
            }
            Ok(Err(e)) => {
                self.counts.record(R::Error, took);
                tracing::warn!(%key, error = %e, requeues = self.queue.num_requeues(key), "reconcile failed");
                let action = (self.error_policy)(key, &e, self.ctx.clone());
                self.schedule(key, action, false);
            }
            Err(panic) => {
                self.counts.record(R::Panic, took);
                let msg = crate::util::panic_message(panic.as_ref());
                tracing::error!(%key, panic = msg, "reconcile panicked");
                self.queue.add_rate_limited(key.clone());
            }
        }
    }

    /// Schedules `key` as `action` says; a success also resets its rate-limit history.
    fn schedule(&self, key: &ObjectKey, action: Action, success: bool) {
        if success && action.next != Next::RateLimited {
            self.queue.forget(key);
        }
        match action.next {
            Next::AwaitChange => {}
            Next::After(d) => self.queue.add_after(key.clone(), d),
            Next::RateLimited => self.queue.add_rate_limited(key.clone()),
        }
    }
}

/// Marks its key done when dropped.
struct DoneOnDrop<'a>(&'a WorkQueue<ObjectKey>, &'a ObjectKey);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.done(self.1);
    }
}

/// Shuts `queue` down with drain and waits for the workers: queued keys are still handed out,
/// and every reconcile in flight finishes.
async fn drain(queue: &WorkQueue<ObjectKey>, workers: Vec<JoinHandle<()>>) {
    queue.shutdown_with_drain().await;
    for w in workers {
        if let Err(e) = w.await {
            // Reconcile panics are caught; this is a panic in the queue or the error callback.
            tracing::error!(error = %e, "controller worker failed");
        }
    }
}

#[cfg(test)]
mod tests {
    //! The worker loop on paused time, without informers: keys are added to the queue by hand.

    use std::collections::{HashMap, HashSet};
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        crate::util::Locked::locked(m)
    }

    /// What the test reconcilers record: every call with its (virtual) time.
    #[derive(Default)]
    struct Log {
        calls: Mutex<Vec<(String, Instant)>>,
        errors: Mutex<Vec<(String, String)>>,
    }

    impl Log {
        fn times(&self, name: &str) -> Vec<Instant> {
            lock(&self.calls)
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, t)| *t)
                .collect()
        }

        fn gaps(&self, name: &str) -> Vec<Duration> {
            self.times(name).windows(2).map(|w| w[1] - w[0]).collect()
        }
    }

    /// Workers over a fresh controller queue (client-go's default limiter), reporting errors to
    /// the log.
    #[allow(clippy::type_complexity)]
    fn workers<F, Fut>(
        log: &Arc<Log>,
        reconcile: F,
    ) -> Workers<Log, F, impl Fn(&ObjectKey, &String, Arc<Log>) -> Action + Send + Sync + 'static>
    where
        F: Fn(ObjectKey, Arc<Log>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, String>> + Send + 'static,
    {
        Workers {
            queue: WorkQueue::builder()
                .rate_limiter(default_controller_rate_limiter())
                .build(),
            reconcile: Arc::new(reconcile),
            error_policy: Arc::new(|k: &ObjectKey, e: &String, log: Arc<Log>| {
                lock(&log.errors).push((k.name.clone(), e.clone()));
                default_error_policy(k, e, log)
            }),
            ctx: log.clone(),
            counts: Arc::new(Counts::new("test")),
        }
    }

    /// Records the call and returns how many calls `key` had before this one.
    fn record(log: &Log, key: &ObjectKey) -> usize {
        let mut calls = lock(&log.calls);
        let before = calls.iter().filter(|(n, _)| *n == key.name).count();
        calls.push((key.name.clone(), Instant::now()));
        before
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_reconciles_again_after_the_delay() {
        let log = Arc::new(Log::default());
        let w = workers(&log, |k, log: Arc<Log>| async move {
            let n = record(&log, &k);
            Ok(if n == 0 {
                Action::requeue(Duration::from_secs(10))
            } else {
                Action::await_change()
            })
        });
        let handles = w.spawn(1, None);
        w.queue.add(key("a"));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(log.times("a").len(), 1, "not before the delay");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(log.gaps("a"), [Duration::from_secs(10)]);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(log.times("a").len(), 2, "await_change: no third call");
        drain(&w.queue, handles).await;
    }

    #[tokio::test(start_paused = true)]
    async fn errors_back_off_per_key_and_success_resets_the_backoff() {
        let log = Arc::new(Log::default());
        // "a" fails 3 times, then succeeds; later, when re-added, fails once more.
        // "b" fails once, then succeeds.
        let w = workers(&log, |k, log: Arc<Log>| async move {
            let n = record(&log, &k);
            let fails = match k.name.as_str() {
                "a" => n < 3 || n == 4,
                _ => n < 1,
            };
            if fails {
                Err(format!("failure {n}"))
            } else {
                Ok(Action::await_change())
            }
        });
        let handles = w.spawn(2, None);
        w.queue.add(key("a"));
        tokio::time::sleep(MS * 2).await;
        w.queue.add(key("b"));
        tokio::time::sleep(MS).await;
        assert_eq!(w.queue.num_requeues(&key("a")), 1);
        assert_eq!(w.queue.num_requeues(&key("b")), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // 5 ms, 10 ms, 20 ms: client-go's per-item exponential limiter; b's own history.
        assert_eq!(log.gaps("a"), [MS * 5, MS * 10, MS * 20]);
        assert_eq!(log.gaps("b"), [MS * 5]);
        assert_eq!(w.queue.num_requeues(&key("a")), 0, "forgotten after the success");
        assert_eq!(w.queue.metrics().retries, 4);
        let errors = lock(&log.errors).clone();
        assert_eq!(errors.len(), 4);
        assert!(errors.contains(&("a".into(), "failure 2".into())));

        // A later failure starts from the base delay again.
        w.queue.add(key("a"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(log.gaps("a")[4..], [MS * 5]);
        drain(&w.queue, handles).await;
    }

    #[tokio::test(start_paused = true)]
    async fn workers_run_concurrently_but_never_one_key_twice_at_once() {
        #[derive(Default)]
        struct Track {
            in_flight: HashSet<String>,
            peak: usize,
            overlap: Vec<String>,
            done: HashMap<String, usize>,
        }
        let track = Arc::new(Mutex::new(Track::default()));
        let log = Arc::new(Log::default());
        let t = track.clone();
        let w = workers(&log, move |k, _log| {
            let t = t.clone();
            async move {
                {
                    let mut t = lock(&t);
                    if !t.in_flight.insert(k.name.clone()) {
                        t.overlap.push(k.name.clone());
                    }
                    t.peak = t.peak.max(t.in_flight.len());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                let mut t = lock(&t);
                t.in_flight.remove(&k.name);
                *t.done.entry(k.name.clone()).or_default() += 1;
                Ok(Action::await_change())
            }
        });
        let handles = w.spawn(4, None);
        for round in 0..3 {
            // Every key again while the previous round may still be in flight.
            for i in 0..20 {
                w.queue.add(key(&format!("k{i}")));
            }
            tokio::time::sleep(MS * 300 * round).await;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        drain(&w.queue, handles).await;
        let t = lock(&track);
        assert_eq!(t.peak, 4, "4 workers, 20 keys: 4 at once");
        assert!(t.overlap.is_empty(), "reconciled twice at once: {:?}", t.overlap);
        assert_eq!(t.done.len(), 20);
        assert!(t.done.values().all(|n| *n >= 1));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_reconciles_in_flight_and_hands_out_queued_keys() {
        let log = Arc::new(Log::default());
        let finished = Arc::new(Mutex::new(Vec::<String>::new()));
        let f = finished.clone();
        let w = workers(&log, move |k, log: Arc<Log>| {
            let f = f.clone();
            async move {
                record(&log, &k);
                tokio::time::sleep(Duration::from_secs(5)).await;
                lock(&f).push(k.name.clone());
                Ok(Action::requeue(Duration::from_secs(1)))
            }
        });
        let handles = w.spawn(1, None);
        w.queue.add(key("a"));
        w.queue.add(key("b"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stopping = tokio::spawn({
            let queue = w.queue.clone();
            async move { drain(&queue, handles).await }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!stopping.is_finished(), "a is still reconciling");
        assert!(lock(&finished).is_empty());
        assert!(stopping.await.is_ok());
        assert_eq!(
            *lock(&finished),
            ["a", "b"],
            "a finished; b, queued, was still handed out"
        );
        assert_eq!(log.times("a").len(), 1, "the requeue after 1 s is dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_retried_and_does_not_stall_the_worker_or_shutdown() {
        let log = Arc::new(Log::default());
        let w = workers(&log, |k, log: Arc<Log>| async move {
            let n = record(&log, &k);
            assert!(!(k.name == "a" && n == 0), "first reconcile of a");
            Ok(Action::await_change())
        });
        // One worker: if the panic killed it, nothing after it would be reconciled.
        let handles = w.spawn(1, None);
        w.queue.add(key("a"));
        w.queue.add(key("b"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(log.times("a").len(), 2, "retried");
        assert_eq!(log.gaps("a"), [MS * 5], "through the rate limiter");
        assert_eq!(log.times("b").len(), 1);
        assert_eq!(w.queue.num_requeues(&key("a")), 0, "the retry succeeded");
        assert!(
            lock(&log.errors).is_empty(),
            "a panic is not an error of the reconcile's type"
        );
        assert_eq!(
            w.counts.summary(),
            RunSummary {
                reconciled: 2,
                failed: 0,
                panicked: 1
            }
        );
        let stopped = tokio::time::timeout(Duration::from_secs(60), drain(&w.queue, handles)).await;
        assert!(stopped.is_ok(), "shutdown completes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_in_the_call_itself_is_caught_too() {
        let log = Arc::new(Log::default());
        let calls = Arc::new(Mutex::new(0_u32));
        let c = calls.clone();
        let w = workers(&log, move |_k, _log| {
            let n = {
                let mut n = lock(&c);
                *n += 1;
                *n
            };
            assert_ne!(n, 1, "before the future");
            async { Ok(Action::await_change()) }
        });
        let handles = w.spawn(1, None);
        w.queue.add(key("a"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*lock(&calls), 2);
        assert_eq!(w.counts.summary().panicked, 1);
        drain(&w.queue, handles).await;
    }

    fn meta(generation: Option<i64>, label: &str, rv: &str) -> kube::core::ObjectMeta {
        kube::core::ObjectMeta {
            generation,
            labels: Some([("app".to_owned(), label.to_owned())].into()),
            resource_version: Some(rv.to_owned()),
            ..Default::default()
        }
    }

    #[test]
    fn predicates_let_through_only_the_updates_they_watch() {
        let generation = [predicates::generation()];
        // A status write: new RV, same generation.
        assert!(!passes(&generation, &meta(Some(1), "a", "1"), &meta(Some(1), "a", "2")));
        assert!(passes(&generation, &meta(Some(1), "a", "1"), &meta(Some(2), "a", "2")));
        // No generation (a ConfigMap): always through, as kube-runtime.
        assert!(passes(&generation, &meta(None, "a", "1"), &meta(None, "a", "2")));
        // Relabelling passes only with the labels predicate too.
        assert!(!passes(&generation, &meta(Some(1), "a", "1"), &meta(Some(1), "b", "2")));
        let both = [predicates::generation(), predicates::labels()];
        assert!(passes(&both, &meta(Some(1), "a", "1"), &meta(Some(1), "b", "2")));
        assert!(!passes(&both, &meta(Some(1), "a", "1"), &meta(Some(1), "a", "2")));
        // No predicate: every update.
        assert!(passes(&[], &meta(Some(1), "a", "1"), &meta(Some(1), "a", "2")));
    }

    #[test]
    fn owner_references_match_group_and_kind() {
        let with_owner = |api_version: &str, kind: &str, controller: bool| kube::core::ObjectMeta {
            namespace: Some("ns".into()),
            owner_references: Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "owner".into(),
                controller: Some(controller),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let found = |m: &kube::core::ObjectMeta, group: &str| owners(m, Some(group), "Deployment", true).len();
        assert_eq!(found(&with_owner("apps/v1", "Deployment", true), "apps"), 1);
        assert_eq!(found(&with_owner("apps/v1beta1", "Deployment", true), "apps"), 1);
        assert_eq!(found(&with_owner("other.io/v1", "Deployment", true), "apps"), 0);
        assert_eq!(found(&with_owner("apps/v1", "StatefulSet", true), "apps"), 0);
        assert_eq!(found(&with_owner("apps/v1", "Deployment", false), "apps"), 0);
        // The core group is the empty string: `v1` alone.
        assert_eq!(
            owners(&with_owner("v1", "Service", true), Some(""), "Service", true).len(),
            1
        );
    }
}
