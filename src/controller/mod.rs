//! kube-runtime's `Controller`, on durable informers: the same builder (`owns`, `watches`,
//! `with_config`, `reconcile_on`, `graceful_shutdown_on`, …), the same `reconcile(Arc<K>,
//! Arc<Ctx>)` and `error_policy(Arc<K>, &E, Arc<Ctx>)` with kube's own [`Action`], and `run`
//! returning the same stream of results. What changes is where the objects live: in a redb
//! database that survives restarts, so a restart resumes its watches instead of listing
//! everything again.
//!
//! What this crate adds: [`leader_election`](Controller::leader_election) (a warm standby),
//! client-go's rate-limited workqueue ([`requeue_rate_limited`], [`default_error_policy`]),
//! workqueue and reconcile metrics under the controller's [`name`](Controller::name), and an
//! opt-in [`on_delete`](Controller::on_delete) hook. `docs/coming-from-kube-runtime.md` compares
//! the two side by side.
//!
//! ## Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use durable_informer::controller::{Action, Config, Controller};
//! use durable_informer::store::{DurableStore, StoreConfig};
//! use futures::StreamExt;
//! use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
//! use kube::runtime::watcher;
//! use kube::{Api, Client};
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("{0}")]
//! struct Error(String);
//!
//! async fn reconcile(d: Arc<Deployment>, _ctx: Arc<()>) -> Result<Action, Error> {
//!     println!("reconcile {:?} at generation {:?}", d.metadata.name, d.metadata.generation);
//!     Ok(Action::requeue(Duration::from_secs(300)))
//! }
//! fn error_policy(_d: Arc<Deployment>, _error: &Error, _ctx: Arc<()>) -> Action {
//!     Action::requeue(Duration::from_secs(5))
//! }
//!
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::try_default().await?;
//! let db = tokio::task::spawn_blocking(|| DurableStore::open(StoreConfig::new("cache.redb"))).await??;
//! let db = Arc::new(db);
//! Controller::new(&db, Api::<Deployment>::all(client.clone()), watcher::Config::default())
//!     .owns(Api::<ReplicaSet>::all(client), watcher::Config::default())
//!     .with_config(Config::default().concurrency(4).debounce(Duration::from_millis(500)))
//!     .shutdown_on_signal()
//!     .run(reconcile, error_policy, Arc::new(()))
//!     .for_each(|res| async move {
//!         match res {
//!             Ok((obj, _action)) => println!("reconciled {obj}"),
//!             Err(e) => eprintln!("{e}"),
//!         }
//!     })
//!     .await;
//! # Ok(()) }
//! ```
//!
//! ## Deletions
//!
//! As with kube-runtime, reconcile sees an object only while it exists: a deletion reaches it
//! as an update with `metadata.deletionTimestamp` set while a finalizer holds the object (use
//! [`kube::runtime::finalizer`]; the `Action` it returns is honoured). A controller that wants
//! to hear of deletions without a finalizer opts in with [`on_delete`](Controller::on_delete).
//!
//! ## Keeping kube-runtime's controller instead
//!
//! [`watcher_stream`](crate::informer::watcher_stream) turns an informer into the
//! `kube::runtime::watcher::Event` stream that `kube::runtime::reflector` and
//! `kube::runtime::Controller::for_stream` consume (kube-runtime's
//! `unstable-runtime-stream-control` feature, which the application enables).

mod action;
mod error;
mod run;
mod schedule;
mod trigger;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::Resource;
use serde::de::DeserializeOwned;

pub use action::{default_error_policy, requeue_rate_limited, Action};
pub use error::Error;
pub use kube::runtime::controller::ReconcileReason;
/// kube-runtime's predicates (`generation`, `labels`, `annotations`, `finalizers`,
/// `resource_version`), for [`Controller::with_predicate`] and [`Relation::predicate`].
pub use kube::runtime::predicates;
pub use trigger::{Predicate, Relation};

use crate::informer::Informer;
use crate::leader::Leadership;
use crate::object::ObjectKey;
use crate::queue::{default_controller_rate_limiter, WorkQueue};
use crate::store::DurableStore;
use trigger::{Origin, Trigger};

/// A boxed error, as the delete hook returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

type DeleteHook<K> = Arc<dyn Fn(Arc<K>) -> BoxFuture<'static, Result<(), BoxError>> + Send + Sync>;

/// The controller's settings (kube-runtime's `controller::Config`).
///
/// ```
/// use std::time::Duration;
/// use durable_informer::controller::Config;
/// let c = Config::default().concurrency(4).debounce(Duration::from_secs(1));
/// # let _ = c;
/// ```
#[derive(Debug, Clone, Default)]
pub struct Config {
    debounce: Duration,
    concurrency: u16,
}

impl Config {
    /// Hold each request until the object has had no other request for this long
    /// (trailing-edge debounce; default 0: none). Coalesces bursts of changes into one
    /// reconcile; an object changing more often than this is reconciled only when it pauses.
    #[must_use]
    pub fn debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }

    /// At most this many reconciles at once (default 0: no limit). One object is never
    /// reconciled twice at once.
    #[must_use]
    pub fn concurrency(mut self, concurrency: u16) -> Self {
        self.concurrency = concurrency;
        self
    }
}

/// Runs a reconcile function over the objects of a primary resource and of related ones; see
/// the [module documentation](self).
pub struct Controller<K: Resource> {
    db: Option<Arc<DurableStore>>,
    primary: Origin<K>,
    triggers: Vec<Trigger>,
    predicates: Vec<Predicate<K>>,
    config: Config,
    name: String,
    queue: WorkQueue<ObjectKey>,
    leading: Option<Leadership>,
    reconcile_on: Vec<BoxStream<'static, ObjectRef<K>>>,
    reconcile_all_on: Vec<BoxStream<'static, ()>>,
    graceful: Vec<BoxFuture<'static, ()>>,
    forceful: Vec<BoxFuture<'static, ()>>,
    on_delete: Option<DeleteHook<K>>,
    /// The primary's resource type: `()` for a typed `K`, an `ApiResource` for `DynamicObject`.
    dyntype: K::DynamicType,
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
    K::DynamicType: Clone + Send + Sync,
{
    /// A controller of the objects `api` reads, narrowed by `wc` (selectors, page size,
    /// streaming list, watch timeout), kept in `db`: kube-runtime's `Controller::new` with the
    /// database first. Its informer is built when [`run`](Self::run) starts, and so are those
    /// of [`owns`](Self::owns) and [`watches`](Self::watches), in the same database; each
    /// resumes from what the database holds.
    ///
    /// Build one informer per scope and database: two controllers watching the same resource
    /// in one database share an informer through [`for_informer`](Self::for_informer) and
    /// [`owns_informer`](Self::owns_informer).
    #[must_use]
    pub fn new(db: &Arc<DurableStore>, api: kube::Api<K>, wc: watcher::Config) -> Self
    where
        K::DynamicType: Default,
    {
        Self::new_with(db, api, wc, K::DynamicType::default())
    }

    /// [`new`](Self::new) for a resource known at run time (kube-runtime's `new_with`): a
    /// controller of `DynamicObject`s over the `ApiResource` `dyntype` (which `api` was made
    /// with). Reconcile and error policy take `Arc<DynamicObject>`; the object references it
    /// yields carry `dyntype`.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use durable_informer::controller::{default_error_policy, Action, Controller};
    /// # use futures::StreamExt;
    /// use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    /// # async fn reconcile(_o: Arc<DynamicObject>, _c: Arc<()>) -> Result<Action, std::io::Error> { Ok(Action::await_change()) }
    /// # async fn f(client: kube::Client, db: Arc<durable_informer::store::DurableStore>) {
    /// let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    /// let widgets = kube::Api::<DynamicObject>::all_with(client, &ar);
    /// Controller::new_with(&db, widgets, Default::default(), ar)
    ///     .run(reconcile, default_error_policy, Arc::new(()))
    ///     .for_each(|_| async {})
    ///     .await;
    /// # }
    /// ```
    #[must_use]
    pub fn new_with(db: &Arc<DurableStore>, api: kube::Api<K>, wc: watcher::Config, dyntype: K::DynamicType) -> Self {
        Self::with_origin(Some(db.clone()), Origin::Api(Box::new((api, wc))), dyntype)
    }

    /// A controller of the objects of an informer you built (shared, or with options
    /// `watcher::Config` does not have: indexers, a transform, sharding). `run` starts it if it
    /// was not started.
    #[must_use]
    pub fn for_informer(informer: Informer<K>) -> Self
    where
        K::DynamicType: Default,
    {
        Self::for_informer_with(informer, K::DynamicType::default())
    }

    /// [`for_informer`](Self::for_informer) for a resource known at run time: an
    /// `Informer<DynamicObject>` (see [`Informer::from_api_with`]) and its `ApiResource`.
    #[must_use]
    pub fn for_informer_with(informer: Informer<K>, dyntype: K::DynamicType) -> Self {
        Self::with_origin(None, Origin::Informer(informer), dyntype)
    }

    fn with_origin(db: Option<Arc<DurableStore>>, primary: Origin<K>, dyntype: K::DynamicType) -> Self {
        let name = K::plural(&dyntype).into_owned();
        Self {
            db,
            primary,
            triggers: Vec::new(),
            predicates: Vec::new(),
            config: Config::default(),
            queue: controller_queue(&name),
            name,
            leading: None,
            reconcile_on: Vec::new(),
            reconcile_all_on: Vec::new(),
            graceful: Vec::new(),
            forceful: Vec::new(),
            on_delete: None,
            dyntype,
        }
    }

    /// The controller's name (default: the resource's plural, `deployments`): on its log lines
    /// and reconcile spans, the `name` label of its workqueue metrics and the `controller`
    /// label of its reconcile metrics (see [`metrics`](crate::metrics)). Two controllers of one
    /// resource in one process need different names. Call it before [`queue`](Self::queue): it
    /// gives the controller a new, empty queue.
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self.queue = controller_queue(name);
        self
    }

    /// Settings: concurrency and debounce.
    #[must_use]
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Also reconciles the owners of type `K` named by the owner references of every changed
    /// object `api` reads (narrowed by `wc`): kube-runtime's `owns`. Every matching owner
    /// reference counts, not only the controlling one (for that, see
    /// [`owns_where`](Self::owns_where)); a reference matches by `K`'s API group and kind, any
    /// version. The children are never decoded: their owner references come from the metadata
    /// the store scanned on arrival.
    #[must_use]
    pub fn owns<C>(self, api: kube::Api<C>, wc: watcher::Config) -> Self
    where
        C: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        self.owns_where(api, wc, Relation::default())
    }

    /// [`owns`](Self::owns) with a [`Relation`]: controller references only, predicates.
    #[must_use]
    pub fn owns_where<C>(mut self, api: kube::Api<C>, wc: watcher::Config, relation: Relation<C>) -> Self
    where
        C: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        let owns = trigger::owns::<K, C>(Origin::Api(Box::new((api, wc))), relation, &self.dyntype);
        self.triggers.push(owns);
        self
    }

    /// [`owns`](Self::owns) over an informer you built; `run` starts it if it was not started.
    #[must_use]
    pub fn owns_informer<C>(mut self, informer: Informer<C>, relation: Relation<C>) -> Self
    where
        C: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        let owns = trigger::owns::<K, C>(Origin::Informer(informer), relation, &self.dyntype);
        self.triggers.push(owns);
        self
    }

    /// Also reconciles the objects `mapper` names for every changed object `api` reads
    /// (narrowed by `wc`): kube-runtime's `watches`. For an update the mapper sees the old and
    /// the new state (a relation may have moved); for a delete, the last state.
    #[must_use]
    pub fn watches<C, I>(
        self,
        api: kube::Api<C>,
        wc: watcher::Config,
        mapper: impl Fn(C) -> I + Send + Sync + 'static,
    ) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        self.watches_where(api, wc, mapper, Relation::default())
    }

    /// [`watches`](Self::watches) with a [`Relation`]'s predicates.
    #[must_use]
    pub fn watches_where<C, I>(
        mut self,
        api: kube::Api<C>,
        wc: watcher::Config,
        mapper: impl Fn(C) -> I + Send + Sync + 'static,
        relation: Relation<C>,
    ) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        self.triggers.push(trigger::watches::<K, C, I>(
            Origin::Api(Box::new((api, wc))),
            mapper,
            relation,
        ));
        self
    }

    /// [`watches`](Self::watches) over an informer you built; `run` starts it if it was not
    /// started.
    #[must_use]
    pub fn watches_informer<C, I>(
        mut self,
        informer: Informer<C>,
        mapper: impl Fn(C) -> I + Send + Sync + 'static,
        relation: Relation<C>,
    ) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        self.triggers.push(trigger::watches::<K, C, I>(
            Origin::Informer(informer),
            mapper,
            relation,
        ));
        self
    }

    /// Reconciles an update of a primary object only when `predicate`'s value changed
    /// (kube-runtime's `predicate_filter`, e.g. [`predicates::generation`]: spec changes, not
    /// status writes); adds always pass. Given several times, a change of any one passes.
    /// Related objects take theirs through [`Relation::predicate`].
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use durable_informer::controller::{predicates, Controller};
    /// # fn f(db: &Arc<durable_informer::store::DurableStore>, api: kube::Api<k8s_openapi::api::apps::v1::Deployment>) {
    /// let c = Controller::new(db, api, Default::default())
    ///     .with_predicate(predicates::generation)
    ///     .with_predicate(predicates::labels);
    /// # let _ = c; }
    /// ```
    #[must_use]
    pub fn with_predicate(mut self, predicate: impl Fn(&K) -> Option<u64> + Send + Sync + 'static) -> Self {
        self.predicates.push(Arc::new(predicate));
        self
    }

    /// Reconciles each object `trigger` names (kube-runtime's `reconcile_on`), reason
    /// `unknown`. A stream that ends stops being read; the controller keeps running.
    #[must_use]
    pub fn reconcile_on(mut self, trigger: impl Stream<Item = ObjectRef<K>> + Send + 'static) -> Self {
        self.reconcile_on.push(trigger.boxed());
        self
    }

    /// Reconciles every object each time `trigger` yields (kube-runtime's `reconcile_all_on`),
    /// reason `bulk reconcile requested`.
    #[must_use]
    pub fn reconcile_all_on(mut self, trigger: impl Stream<Item = ()> + Send + 'static) -> Self {
        self.reconcile_all_on.push(trigger.boxed());
        self
    }

    /// Starts a graceful shutdown when `trigger` resolves (kube-runtime's
    /// `graceful_shutdown_on`): no new reconcile starts, those in flight finish, then the
    /// stream ends. Several triggers: the first one counts.
    #[must_use]
    pub fn graceful_shutdown_on(mut self, trigger: impl Future<Output = ()> + Send + 'static) -> Self {
        self.graceful.push(trigger.boxed());
        self
    }

    /// Shuts down gracefully on Ctrl+C or SIGTERM (on Unix), and at once, without waiting for
    /// the reconciles in flight, on a second one (kube-runtime's `shutdown_on_signal`). Needs
    /// the `signal` feature (default), which turns on tokio's.
    #[cfg(feature = "signal")]
    #[cfg_attr(docsrs, doc(cfg(feature = "signal")))]
    #[must_use]
    pub fn shutdown_on_signal(mut self) -> Self {
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
        self.graceful.push(first_rx.map(|_| ()).boxed());
        self.forceful.push(
            async move {
                shutdown_signal().await;
                tracing::info!("graceful shutdown requested; a second signal forces it");
                let _ = first_tx.send(());
                shutdown_signal().await;
                tracing::info!("forced shutdown requested");
            }
            .boxed(),
        );
        self
    }

    /// Calls `hook` with the last state of each primary object deleted (the opt-in delete hook
    /// kube-runtime does not have; reconcile itself never sees a deleted object). The hook runs
    /// in the workqueue like a reconcile (never at the same time as a reconcile of that
    /// object), and at least once: the deletions are read through a durable handler named
    /// `<controller name>-deletes`, whose cursor moves past a deletion only after the hook
    /// succeeded, so a deletion that happened while the controller was down is delivered at the
    /// next start. A failed hook is retried through the rate limiter.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use durable_informer::controller::Controller;
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # fn f(db: &Arc<durable_informer::store::DurableStore>, api: kube::Api<ConfigMap>) {
    /// let c = Controller::new(db, api, Default::default()).on_delete(|cm: Arc<ConfigMap>| async move {
    ///     println!("{:?} is gone", cm.metadata.name);
    ///     Ok::<(), std::io::Error>(())
    /// });
    /// # let _ = c; }
    /// ```
    #[must_use]
    pub fn on_delete<F, Fut, E>(mut self, hook: F) -> Self
    where
        F: Fn(Arc<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.on_delete = Some(Arc::new(move |obj| hook(obj).map(|r| r.map_err(Into::into)).boxed()));
        self
    }

    /// Reconciles only while `leading` is true, as one replica of several (from
    /// [`LeaderElector::fenced_leadership`](crate::leader::LeaderElector::fenced_leadership)).
    ///
    /// A follower keeps its informers running and synced and its queue filled (a warm
    /// standby) but reconciles nothing. On winning it enqueues every primary object (what the
    /// previous leader did is unknown); on losing, it starts no new reconcile and lets those in
    /// flight finish. With fenced leadership each reconcile starts only if the term's deadline
    /// has not passed on the monotonic clock, so a replica resuming from a pause longer than the
    /// Lease reconciles nothing before its elector notices the loss. A reconcile that can run
    /// longer than `lease_duration - renew_deadline` should check
    /// [`Leadership::is_leading`] itself before it writes.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use durable_informer::controller::{default_error_policy, Action, Controller};
    /// # use durable_informer::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector};
    /// # use futures::StreamExt;
    /// # use k8s_openapi::api::core::v1::Pod;
    /// # async fn reconcile(_p: Arc<Pod>, _c: Arc<()>) -> Result<Action, std::io::Error> { Ok(Action::await_change()) }
    /// # async fn f(client: kube::Client, db: Arc<durable_informer::store::DurableStore>) {
    /// let elector = LeaderElector::new(
    ///     KubeLeaseLock::new(client.clone(), "default", "my-controller", "replica-a"),
    ///     LeaderElectionConfig::default(),
    /// );
    /// let (stop_tx, stop) = tokio::sync::watch::channel(false);
    /// let controller = Controller::new(&db, kube::Api::<Pod>::all(client), Default::default())
    ///     .leader_election(elector.fenced_leadership());
    /// let elector_task = tokio::spawn(elector.run(stop)); // stopped after the controller
    /// controller
    ///     .shutdown_on_signal()
    ///     .run(reconcile, default_error_policy, Arc::new(()))
    ///     .for_each(|_| async {})
    ///     .await;
    /// # let _ = (stop_tx, elector_task); }
    /// ```
    #[must_use]
    pub fn leader_election(mut self, leading: impl Into<Leadership>) -> Self {
        self.leading = Some(leading.into());
        self
    }

    /// The workqueue (for its metrics, or to enqueue keys by hand).
    #[must_use]
    pub fn queue(&self) -> WorkQueue<ObjectKey> {
        self.queue.clone()
    }

    /// Builds the informers (those not given), starts them, waits until every cache synced,
    /// then reconciles until a shutdown trigger fires; the stream yields the outcome of each
    /// reconcile (kube-runtime's `Controller::run`), and ends after a graceful shutdown once the
    /// reconciles in flight finished, or at once on a forced one. Nothing happens until the
    /// stream is polled; dropping it stops everything, reconciles in flight included.
    ///
    /// After a failed reconcile `error_policy` decides what comes next; its item is
    /// [`Error::ReconcilerFailed`]. A reconcile that panics is retried through the rate limiter
    /// ([`Error::ReconcilerPanicked`]); as with any caught panic, state the reconcile shared
    /// through `ctx` may be left half-updated.
    pub fn run<Ctx, F, Fut, E, P>(
        self,
        reconcile: F,
        error_policy: P,
        ctx: Arc<Ctx>,
    ) -> impl Stream<Item = Result<(ObjectRef<K>, Action), Error<E>>> + Send + 'static
    where
        Ctx: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
    {
        run::stream(self, reconcile, error_policy, ctx)
    }
}

/// Ctrl+C, or SIGTERM on Unix.
#[cfg(feature = "signal")]
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl+C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
