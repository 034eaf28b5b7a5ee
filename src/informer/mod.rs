//! Shared informers, event handlers with durable cursors, listers and the informer factory:
//! what controller authors program against.
//!
//! The vocabulary is client-go's (informer, handler, lister, indexer, `WaitForCacheSync`); the
//! feel is kube-rs's (builders, `Arc<K>`, async). The cache is the durable store: an informer
//! restarted on the same database resumes without a LIST, and its durable handlers receive what
//! was committed while they were away.
//!
//! ## Example
//!
//! ```no_run
//! use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
//! use durable_informer::source::KubeSource;
//! use durable_informer::store::{DurableStore, StoreConfig};
//! use k8s_openapi::api::core::v1::Pod;
//!
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let config = kube::Config::infer().await?;
//! let server = config.cluster_url.to_string();
//! let client = kube::Client::try_from(config)?;
//! let db = DurableStore::open(StoreConfig::new("pods.redb"))?;
//! let informer = Informer::<Pod>::builder(&db, KubeSource::typed::<Pod>(client, &server)).build().await?;
//! informer.add_event_handler(
//!     handler_fn(|ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
//!         println!("{:?}", ev.object().metadata.name);
//!         Ok(())
//!     }),
//!     HandlerOptions::durable("printer"),
//! );
//! informer.start();
//! informer.wait_for_sync().await?;
//! let pods = informer.lister().namespace("default").list(&Default::default())?;
//! # let _ = pods; Ok(()) }
//! ```

mod adaptor;
mod cache;
mod dispatch;
mod error;
mod factory;
mod handler;
mod lister;
mod metrics;
mod reader;

use crate::util::Locked;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

pub use adaptor::watcher_stream;
pub use cache::CacheStats;
pub(crate) use cache::{Entry, Watched};
pub use error::{HandlerProblem, InformerError, InformerIssue};
pub use factory::InformerFactory;
pub use handler::{
    async_handler_fn, handler_fn, Event, EventHandler, Filtering, HandlerError, HandlerFuncs, HandlerOptions,
    Registration,
};
pub use lister::{Lister, NamespaceLister};
pub use reader::Reader;

use crate::object::ResourceVersion;
use crate::reflector::{Reflector, ReflectorConfig, ReflectorError, ReflectorStatus, Transform};
use crate::selector::{RingMember, ShardSelector};
use crate::source::Source;
use crate::store::{CursorName, DurableStore, Indexer, LogReader, ScopeId, Seq, Store, StoreError, Writer};

/// Keeps `issue` among the last 100.
fn keep_issue(issues: &Mutex<Vec<InformerIssue>>, issue: InformerIssue) {
    let mut v = issues.locked();
    v.push(issue);
    let excess = v.len().saturating_sub(100);
    v.drain(..excess);
}

/// How long [`Informer::shutdown`] waits for each handler to catch up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

type RunFn = Box<dyn FnOnce(watch::Receiver<bool>) -> BoxFuture<'static, Result<(), ReflectorError>> + Send>;

struct Inner {
    scope: ScopeId,
    store: Store,
    log: LogReader,
    writer: Writer,
    status: watch::Receiver<ReflectorStatus>,
    run: Mutex<Option<RunFn>>,
    /// Set by [`Informer::start`]: listers and readers of an informer never started refuse
    /// to pass the database's last state off as current.
    started: watch::Sender<bool>,
    /// The same, for listers (an atomic load a read).
    started_flag: Arc<std::sync::atomic::AtomicBool>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<Result<(), ReflectorError>>>>,
    sync_seq: watch::Sender<Option<Seq>>,
    initial_list: watch::Sender<dispatch::InitialList>,
    restored: bool,
    resync: Option<Duration>,
    errors: Arc<Mutex<Vec<InformerIssue>>>,
    handlers: Mutex<Vec<Slot>>,
    /// Durable handlers registered before [`Informer::start`], until each has its place in
    /// the log: the reflector writes nothing before (see `start`).
    unplaced: Mutex<Vec<watch::Receiver<bool>>>,
    /// The read model, one per type the informer is used as (the factory shares a scope
    /// between a typed and a dynamic view, say); the type it was built with has one from the
    /// start.
    caches: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// Each cache's byte budget.
    cache_bytes: usize,
    /// A metadata-only scope: its caches hold the metadata once (`Cache::hold_metadata_once`).
    metadata_only: bool,
    /// The runtime the informer was built on, for the tasks of caches made later.
    runtime: tokio::runtime::Handle,
    resource: String,
    /// The shard range the reflector holds (see [`Informer::set_sharding`]).
    sharding: watch::Sender<Option<ShardSelector>>,
    /// Keeps the store's writer running while the informer lives, even if the application
    /// dropped its `DurableStore` first.
    _store: Arc<crate::store::Lifetime>,
}

/// The current metadata of an informer's objects; see [`Informer::metadata`].
#[derive(Clone)]
pub struct Metadata(Arc<dyn cache::MetaLookup>);

impl std::fmt::Debug for Metadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metadata").finish_non_exhaustive()
    }
}

impl Metadata {
    /// The metadata of `key`, or `None` when the informer holds no such object.
    pub fn get(&self, key: &crate::object::ObjectKey) -> Result<Option<Arc<crate::object::ObjectMeta>>, StoreError> {
        self.0.meta(key)
    }
}

/// What the informer keeps of each handler, to drain and stop it at shutdown.
struct Slot {
    stop: watch::Sender<bool>,
    done: watch::Receiver<bool>,
    cursor: watch::Receiver<Seq>,
}

/// An informer of one scope (resource + namespace + selectors), typed by `K` (a
/// `k8s_openapi` type, your own `CustomResource`, or `kube::core::DynamicObject`).
///
/// Cheap to clone; clones share everything.
pub struct Informer<K> {
    inner: Arc<Inner>,
    _k: PhantomData<fn() -> K>,
}

impl<K> Informer<K> {
    /// A view typed by `K` of an informer's shared state (the factory shares one scope across
    /// types; each log entry is decoded once per type, for all handlers).
    fn from_inner(inner: Arc<Inner>) -> Self {
        Self { inner, _k: PhantomData }
    }
}

impl<K> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            _k: PhantomData,
        }
    }
}

/// Builds an [`Informer`]. The options live where they act:
///
/// | Option | Where |
/// |---|---|
/// | resource (typed or [`ApiResource`](kube::core::ApiResource)), namespace, label and field selectors | the [`KubeSource`](crate::source::KubeSource) given to [`Informer::builder`] |
/// | durability (fsync per commit), cache size, retention | [`StoreConfig`](crate::store::StoreConfig) of the [`DurableStore`] |
/// | indexers, transform, default resync, reflector settings, shard range, ring shard, Secrets | this builder |
/// | durable or volatile, per-handler resync | [`HandlerOptions`] at [`Informer::add_event_handler`] |
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
/// use durable_informer::reflector::Transform;
/// use durable_informer::source::KubeSource;
/// use durable_informer::store::{DurableStore, Indexer, StoreConfig};
/// use k8s_openapi::api::core::v1::Pod;
///
/// # async fn f(client: kube::Client, server: &str) -> Result<(), Box<dyn std::error::Error>> {
/// // Where the cache lives, and how: fsync before each commit is acknowledged.
/// let db = DurableStore::open(StoreConfig::new("pods.redb").durable(true))?;
/// // What to watch: Pods of one namespace, narrowed by label and field selectors.
/// let source = KubeSource::typed::<Pod>(client, server)
///     .namespace("shop")
///     .labels("app=web,tier!=debug")
///     .fields("status.phase=Running");
/// let informer = Informer::<Pod>::builder(&db, source)
///     // Secondary indexes, kept in the same transaction as the objects.
///     .indexer(Indexer::labels())
///     .indexer(Indexer::new("node", |_meta, json| {
///         let pod: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
///         pod["spec"]["nodeName"].as_str().map(str::to_owned).into_iter().collect()
///     }))
///     // Drop managedFields (the default) and annotations before storing.
///     .transform(Transform {
///         func: Some(Arc::new(|json: &[u8]| {
///             let mut v: serde_json::Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
///             if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
///                 meta.remove("annotations");
///             }
///             serde_json::to_vec(&v).map(Some).map_err(|e| e.to_string())
///         })),
///         ..Transform::default()
///     })
///     // Handlers registered without their own period resync every 10 minutes.
///     .resync(Duration::from_secs(600))
///     .build()
///     .await?;
/// informer.add_event_handler(
///     handler_fn(|ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
///         println!("{:?}", ev.object().metadata.name);
///         Ok(())
///     }),
///     HandlerOptions::durable("printer"),
/// );
/// informer.start();
/// informer.wait_for_sync().await?;
/// let on_node = informer.indexer().by_index("node", "node-1")?;
/// # let _ = on_node; Ok(()) }
/// ```
///
/// An informer of core/v1 `secrets` also needs [`allow_secrets`](Self::allow_secrets).
pub struct InformerBuilder<'a, K, S> {
    db: &'a DurableStore,
    source: S,
    indexers: Vec<Indexer>,
    config: ReflectorConfig,
    resync: Option<Duration>,
    allow_secrets: bool,
    cache_bytes: Option<usize>,
    _k: PhantomData<fn() -> K>,
}

impl<K, S: Source> InformerBuilder<'_, K, S> {
    /// The byte budget of this informer's object cache (default: the database's
    /// [`StoreConfig::object_cache_bytes`](crate::store::StoreConfig::object_cache_bytes),
    /// 512 MiB). Every key, metadata and index posting is held whatever the budget; 0 keeps no
    /// object's JSON in memory, and listers read it from redb.
    #[must_use]
    pub fn object_cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = Some(bytes);
        self
    }

    /// Allows caching Secrets. They are then stored on disk, in the database file (created
    /// 0600): protect it like the Secrets themselves. Without this, an informer of core/v1
    /// `secrets` is refused.
    #[must_use]
    pub fn allow_secrets(mut self) -> Self {
        self.allow_secrets = true;
        self
    }

    /// Maintains an index (see [`Indexer`]); `Indexer::labels()` gives `key=value` lookups.
    #[must_use]
    pub fn indexer(mut self, indexer: Indexer) -> Self {
        self.indexers.push(indexer);
        self
    }

    /// Transforms objects before they are stored (default: drop `metadata.managedFields`).
    #[must_use]
    pub fn transform(mut self, transform: Transform) -> Self {
        self.config.transform = transform;
        self
    }

    /// Reflector settings (page size, timeouts, backoff, cluster-change policy). A transform
    /// or shard set on this builder stays unless `config` has its own.
    #[must_use]
    pub fn reflector_config(mut self, config: ReflectorConfig) -> Self {
        let transform = std::mem::take(&mut self.config.transform);
        let sharding = self.config.sharding.take();
        self.config = config;
        if self.config.transform.func.is_none() {
            self.config.transform = transform;
        }
        if self.config.sharding.is_none() {
            self.config.sharding = sharding;
        }
        self
    }

    /// Holds only one shard of the resource: the objects whose 64-bit FNV-1a hash of
    /// `metadata.uid` (or `metadata.namespace`) falls in the selector's ranges (KEP-5866).
    ///
    /// The server filters when it supports `shardSelector` (Kubernetes v1.36+, alpha gate
    /// `ShardedListAndWatch`); otherwise the informer filters every list page and watch event
    /// itself, so the store and the handlers see the shard only, either way. The range is
    /// persisted with the scope: started again with another range, the informer keeps the
    /// objects it still owns, reports those it no longer owns as deletes, and fetches only
    /// the added ranges (at the persisted resourceVersion; a full relist diff if that is
    /// compacted). `ReflectorStatus::shard_mode` tells who filtered.
    ///
    /// ```no_run
    /// use durable_informer::informer::Informer;
    /// use durable_informer::selector::ShardSelector;
    /// use durable_informer::store::{DurableStore, StoreConfig};
    /// use k8s_openapi::api::core::v1::Pod;
    ///
    /// # async fn f(client: kube::Client, replica: u32) -> Result<(), Box<dyn std::error::Error>> {
    /// let db = DurableStore::open(StoreConfig::new("pods.redb"))?;
    /// // Replica `replica` of 3 holds a third of the Pods, by UID.
    /// let pods = Informer::from_api(&db, kube::Api::<Pod>::all(client))
    ///     .sharding(ShardSelector::by_uid(replica, 3)?)
    ///     .build()
    ///     .await?;
    /// pods.start();
    /// pods.wait_for_sync().await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn sharding(mut self, shard: ShardSelector) -> Self {
        self.config.sharding = Some(shard);
        self
    }

    /// Default resync period of handlers registered without one.
    #[must_use]
    pub fn resync(mut self, period: Duration) -> Self {
        self.resync = Some(period);
        self
    }
}

impl<K> InformerBuilder<'_, K, crate::source::KubeSource> {
    /// Watches only objects matching a label selector (kubectl's syntax).
    #[must_use]
    pub fn labels(mut self, selector: &str) -> Self {
        self.source = self.source.labels(selector);
        self
    }

    /// Watches only objects matching a field selector.
    #[must_use]
    pub fn fields(mut self, selector: &str) -> Self {
        self.source = self.source.fields(selector);
        self
    }

    /// Holds only the objects assigned to one shard of a label ring (label-ring sharding,
    /// see [`crate::sharding`]): the label selector `shard.alpha.sharding.timebertt.dev/<ring>=<shard>`
    /// is added to the source's own. An object the sharder moves to another shard leaves the
    /// selection, so the watch reports it deleted (handlers get a delete) and the store drops
    /// it; one moved here arrives as an add. The selector is part of the persisted scope: the
    /// same shard id started again on the same database resumes without a LIST.
    ///
    /// ```no_run
    /// use durable_informer::informer::Informer;
    /// use durable_informer::selector::RingLabels;
    /// use durable_informer::store::{DurableStore, StoreConfig};
    /// use k8s_openapi::api::core::v1::ConfigMap;
    ///
    /// # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let db = DurableStore::open(StoreConfig::new("configmaps.redb"))?;
    /// let me = RingLabels::new("web")?.member("shard-0")?;
    /// let mine = Informer::from_api(&db, kube::Api::<ConfigMap>::all(client))
    ///     .labels("app=web")
    ///     .ring_shard(&me) // app=web,shard.alpha.sharding.timebertt.dev/web=shard-0
    ///     .build()
    ///     .await?;
    /// # let _ = mine; Ok(()) }
    /// ```
    #[must_use]
    pub fn ring_shard(mut self, member: &RingMember) -> Self {
        let selector = member.narrow(self.source.label_selector());
        self.source = self.source.labels(&selector);
        self
    }

    /// How the cluster is named in the database (see [`ClusterIdentity`](crate::source::ClusterIdentity);
    /// the default reads the `kube-system` namespace UID and, without access to it, the
    /// cluster's root CA in the informer's namespace).
    #[must_use]
    pub fn cluster_identity(mut self, identity: crate::source::ClusterIdentity) -> Self {
        self.source = self.source.identity(identity);
        self
    }

    /// Takes kube-runtime's `watcher::Config`: its label and field selectors go to the source
    /// (added to any set before), its page size, watch timeout and initial list strategy to the
    /// reflector (see [`ReflectorConfig`'s `From`](crate::reflector::ReflectorConfig) for each
    /// field, and the two it ignores: `list_semantic` and `bookmarks`). A transform or shard
    /// set on this builder stays.
    ///
    /// ```no_run
    /// # async fn f(client: kube::Client, db: &durable_informer::store::DurableStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::informer::Informer;
    /// use k8s_openapi::api::apps::v1::Deployment;
    /// use kube::runtime::watcher;
    ///
    /// let wc = watcher::Config::default().labels("app=web").streaming_lists().page_size(200);
    /// let deployments = Informer::from_api(db, kube::Api::<Deployment>::all(client)).watcher_config(&wc).build().await?;
    /// # let _ = deployments; Ok(()) }
    /// ```
    #[must_use]
    pub fn watcher_config(mut self, wc: &kube::runtime::watcher::Config) -> Self {
        if let Some(l) = wc.label_selector.as_deref().filter(|l| !l.is_empty()) {
            let merged = match self.source.label_selector() {
                Some(mine) if !mine.is_empty() => format!("{mine},{l}"),
                _ => l.to_owned(),
            };
            self.source = self.source.labels(&merged);
        }
        if let Some(f) = wc.field_selector.as_deref().filter(|f| !f.is_empty()) {
            let merged = match self.source.field_selector() {
                Some(mine) if !mine.is_empty() => format!("{mine},{f}"),
                _ => f.to_owned(),
            };
            self.source = self.source.fields(&merged);
        }
        crate::source::apply_watcher_config(&mut self.config, wc);
        self
    }

    /// Puts your controller's agent first in the `User-Agent` of every request (see
    /// [`KubeSource::user_agent`](crate::source::KubeSource::user_agent)).
    #[must_use]
    pub fn user_agent(mut self, agent: &str) -> Self {
        self.source = self.source.user_agent(agent);
        self
    }
}

impl<K, S> InformerBuilder<'_, K, S>
where
    K: DeserializeOwned + Send + Sync + 'static,
    S: Source,
{
    /// Registers the scope and its indexes in the database (backfilling new indexes) and
    /// returns the informer, not yet started. The store is readable at once.
    pub async fn build(self) -> Result<Informer<K>, InformerError> {
        let spec = self.source.scope();
        // Metadata alone carries no Secret data.
        if spec.group.is_empty() && spec.resource == "secrets" && !spec.metadata_only {
            if !self.allow_secrets {
                return Err(InformerError::SecretsNotAllowed);
            }
            tracing::warn!(path = %self.db.path().display(), "caching Secrets: they are stored on disk in the database file");
        }
        let writer = self.db.writer();
        let registration = writer.register_scope_reporting(&spec).await?;
        let scope = registration.scope;
        for ix in self.indexers {
            let name = ix.name.clone();
            self.db.register_index(scope, ix);
            writer.ensure_index(scope, name).await?;
        }
        let cache_bytes = self.cache_bytes.unwrap_or_else(|| self.db.object_cache_bytes());
        let store = self.db.store(scope);
        let resource = self.source.resource();
        let record = store.record()?;
        let restored = record.synced && record.rv.is_some();
        let errors: Arc<Mutex<Vec<InformerIssue>>> = Arc::default();
        for (old, record) in registration.left_behind {
            // The writer logged it; the informer's issues keep it for whoever looks there.
            keep_issue(
                &errors,
                InformerIssue::ScopeLeftBehind {
                    old,
                    spec: record.spec,
                    objects: record.object_count,
                },
            );
        }
        let e2 = errors.clone();
        let (sharding, shard_rx) = watch::channel(self.config.sharding.clone());
        let reflector = Reflector::new(self.source, writer.clone(), store.clone(), self.config)
            .on_error(Arc::new(move |e: &ReflectorError| {
                keep_issue(&e2, InformerIssue::Reflector(e.clone()));
            }))
            .shard_updates(shard_rx);
        let status = reflector.status();
        let run: RunFn = Box::new(move |stop| reflector.run(stop).boxed());
        let (stop, _) = watch::channel(false);
        let (sync_seq, _) = watch::channel(None);
        let (initial_list, _) = watch::channel(dispatch::InitialList::default());
        let informer = Informer {
            inner: Arc::new(Inner {
                scope,
                store,
                log: self.db.log(),
                writer,
                status,
                run: Mutex::new(Some(run)),
                started: watch::channel(false).0,
                started_flag: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                stop,
                task: Mutex::new(None),
                sync_seq,
                initial_list,
                restored,
                resync: self.resync,
                errors,
                handlers: Mutex::new(Vec::new()),
                unplaced: Mutex::new(Vec::new()),
                caches: Mutex::new(HashMap::new()),
                cache_bytes,
                metadata_only: spec.metadata_only,
                runtime: tokio::runtime::Handle::current(),
                resource,
                sharding,
                _store: self.db.keepalive(),
            }),
            _k: PhantomData,
        };
        // The read model loads now, in the background: listers read redb until it has.
        informer.inner.cache::<K>();
        Ok(informer)
    }
}

/// How long a wait for sync gives an informer not yet started to start.
const START_GRACE: Duration = Duration::from_secs(2);

impl<K> Informer<kube::core::PartialObjectMeta<K>>
where
    K: kube::Resource<DynamicType = ()> + Send + Sync + 'static,
{
    /// A metadata-only informer of what `api` reads (kube-runtime's `metadata_watcher`): it
    /// lists and watches `PartialObjectMetadata` (names, labels, annotations, owner references,
    /// finalizers, resourceVersion; no spec or status), stored and resumed like any informer
    /// (a restart resumes its watch without a LIST), in a scope of its own. Its objects are
    /// `PartialObjectMeta<K>`, which implements `kube::Resource` with `K`'s group, version and
    /// kind, so it serves wherever an informer of `K` would only need metadata (readers,
    /// handlers, a controller's owned or watched triggers).
    ///
    /// ```no_run
    /// # async fn f(client: kube::Client, db: &durable_informer::store::DurableStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::informer::Informer;
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kube::core::PartialObjectMeta;
    /// use kube::runtime::reflector::ObjectRef;
    ///
    /// let pods = Informer::metadata_from_api(db, kube::Api::<Pod>::all(client)).build().await?;
    /// let reader = pods.reader();
    /// pods.start();
    /// reader.wait_until_ready().await?;
    /// let web: Option<std::sync::Arc<PartialObjectMeta<Pod>>> = reader.get(&ObjectRef::new("web-0").within("prod"));
    /// println!("{:?}", web.map(|p| p.metadata.labels.clone()));
    /// # Ok(()) }
    /// ```
    pub fn metadata_from_api(
        db: &DurableStore,
        api: kube::Api<K>,
    ) -> InformerBuilder<'_, kube::core::PartialObjectMeta<K>, crate::source::KubeSource> {
        Self::builder(db, crate::source::KubeSource::from_api(api).metadata_only())
    }
}

impl Inner {
    /// Waits (at most [`START_GRACE`]) for the informer to be started.
    async fn wait_started(&self) -> Result<(), InformerError> {
        let mut started = self.started.subscribe();
        let ok = matches!(
            tokio::time::timeout(START_GRACE, started.wait_for(|s| *s)).await,
            Ok(Ok(_))
        );
        if ok {
            return Ok(());
        }
        Err(InformerError::NotStarted {
            resource: self.resource.clone(),
            grace: START_GRACE,
        })
    }

    /// What handler tasks and caches report issues through.
    fn reporter(&self) -> dispatch::Report {
        let errors = self.errors.clone();
        Arc::new(move |issue: InformerIssue| {
            tracing::warn!(%issue, "handler");
            keep_issue(&errors, issue);
        })
    }

    /// The read model of type `K`, made (and its task started) on first use.
    fn cache<K: DeserializeOwned + Send + Sync + 'static>(&self) -> Arc<cache::Cache<K>> {
        let mut caches = self.caches.locked();
        if let Some(c) = caches.get(&TypeId::of::<K>()) {
            if let Ok(c) = c.clone().downcast::<cache::Cache<K>>() {
                return c;
            }
        }
        let c = cache::Cache::<K>::new(
            self.store.clone(),
            self.log.clone(),
            self.writer.clone(),
            self.cache_bytes,
            self.sync_seq.subscribe(),
        );
        if self.metadata_only {
            c.hold_metadata_once();
        }
        caches.insert(TypeId::of::<K>(), c.clone());
        self.runtime.spawn(cache::Cache::run(Arc::downgrade(&c)));
        c
    }

    fn ctx(&self) -> dispatch::Ctx {
        dispatch::Ctx {
            store: self.store.clone(),
            log: self.log.clone(),
            writer: self.writer.clone(),
            scope: self.scope,
            sync_seq: self.sync_seq.subscribe(),
            initial_list: self.initial_list.subscribe(),
            report: self.reporter(),
        }
    }
}

impl<K> Informer<K>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    /// An informer of what `api` reads (its type, and its namespace for `Api::namespaced`),
    /// stored in `db`: the kube-rs way, with the resource taken from `K` itself so the type
    /// and the resource cannot disagree. The cluster is identified by its `kube-system` UID
    /// (see [`KubeSource::from_api`](crate::source::KubeSource::from_api)).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::informer::Informer;
    /// use durable_informer::store::{DurableStore, StoreConfig};
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kube::{Api, Client};
    ///
    /// let client = Client::try_default().await?;
    /// let db = DurableStore::open(StoreConfig::new("pods.redb"))?;
    /// let pods = Informer::from_api(&db, Api::<Pod>::namespaced(client, "prod"))
    ///     .labels("app=web")
    ///     .build()
    ///     .await?;
    /// # let _ = pods; Ok(()) }
    /// ```
    ///
    /// An `Api` of another type does not compile:
    ///
    /// ```compile_fail
    /// # fn f(db: &durable_informer::store::DurableStore, client: kube::Client) {
    /// use durable_informer::informer::Informer;
    /// use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
    /// let wrong = Informer::<Deployment>::from_api(db, kube::Api::<Pod>::all(client));
    /// # }
    /// ```
    pub fn from_api(db: &DurableStore, api: kube::Api<K>) -> InformerBuilder<'_, K, crate::source::KubeSource>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        Self::builder(db, crate::source::KubeSource::from_api(api))
    }

    /// [`from_api`](Self::from_api) for a resource known at run time: an `Informer<DynamicObject>`
    /// of what `api` (kube's `Api::all_with(client, &ar)`) reads, the resource named by `dyntype`.
    ///
    /// ```no_run
    /// # async fn f(client: kube::Client, db: &durable_informer::store::DurableStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::informer::Informer;
    /// use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    /// let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    /// let widgets = Informer::from_api_with(db, kube::Api::<DynamicObject>::all_with(client, &ar), &ar).build().await?;
    /// # let _ = widgets; Ok(()) }
    /// ```
    pub fn from_api_with<'a>(
        db: &'a DurableStore,
        api: kube::Api<K>,
        dyntype: &K::DynamicType,
    ) -> InformerBuilder<'a, K, crate::source::KubeSource>
    where
        K: kube::Resource,
    {
        Self::builder(db, crate::source::KubeSource::from_api_with(api, dyntype))
    }

    /// An informer builder over `source`, stored in `db`. For a typed `K`, prefer
    /// [`from_api`](Self::from_api), which takes the resource from the type; a
    /// [`KubeSource`](crate::source::KubeSource) built by hand must name `K`'s resource.
    pub fn builder<S: Source>(db: &DurableStore, source: S) -> InformerBuilder<'_, K, S> {
        InformerBuilder {
            db,
            source,
            indexers: Vec::new(),
            config: ReflectorConfig::default(),
            resync: None,
            allow_secrets: false,
            cache_bytes: None,
            _k: PhantomData,
        }
    }

    /// Starts the reflector on the current tokio runtime (once; later calls do nothing).
    pub fn start(&self) {
        let Some(run) = self.inner.run.locked().take() else {
            return;
        };
        self.inner
            .started_flag
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner.started.send_replace(true);
        let fut = run(self.inner.stop.subscribe());
        // A durable handler registered before the start is told this run's changes one by
        // one, the initial list included (client-go's handlers added before `Run` are): the
        // reflector writes once each has its place in the log, or the informer is stopped.
        let unplaced = std::mem::take(&mut *self.inner.unplaced.locked());
        let fut: futures::future::BoxFuture<'static, _> = if unplaced.is_empty() {
            fut
        } else {
            let mut stop = self.inner.stop.subscribe();
            Box::pin(async move {
                let placed = futures::future::join_all(unplaced.into_iter().map(|mut p| async move {
                    // Err: the handler's task ended (removed) before it had a place.
                    let _ = p.wait_for(|placed| *placed).await;
                }));
                let stopped = async move {
                    let _ = stop.wait_for(|stopped| *stopped).await;
                };
                let go = tokio::select! {
                    _ = placed => true,
                    () = stopped => false,
                };
                if go {
                    fut.await
                } else {
                    Ok(())
                }
            })
        };
        // A store restored from disk has no initial list in this run: its catch-up and relist
        // deltas are changes to what handlers already saw.
        if !self.inner.restored {
            let after = *self.inner.writer.committed().borrow();
            self.inner.initial_list.send_modify(|l| l.after = Some(after));
        }
        // Record the log position at which the informer became synced, for handlers' sync and
        // the end of the initial list.
        // Not the whole `Inner`: a task outliving the informer would keep the store's writer,
        // and its file, open.
        let (writer, initial_list, sync_seq) = (
            self.inner.writer.clone(),
            self.inner.initial_list.clone(),
            self.inner.sync_seq.clone(),
        );
        let mut status = self.inner.status.clone();
        tokio::spawn(async move {
            let (rv, seq) = match status.wait_for(|s| s.synced).await {
                Ok(s) => (s.committed_rv.clone(), s.synced_seq),
                Err(_) => return,
            };
            // The reflector sets both together; the writer's position is a safe bound otherwise.
            debug_assert!(seq.is_some(), "synced without a sync point");
            let seq = seq.unwrap_or_else(|| *writer.committed().borrow());
            initial_list.send_modify(|l| l.until = Some((seq, rv)));
            sync_seq.send_replace(Some(seq));
        });
        let handle = tokio::spawn(fut);
        *self.inner.task.locked() = Some(handle);
    }

    /// Starts and runs until [`stop`](Self::stop) or a fatal error (another cluster's database).
    pub async fn run(&self) -> Result<(), ReflectorError> {
        self.start();
        self.join().await
    }

    /// Waits for the reflector task, if it runs.
    async fn join(&self) -> Result<(), ReflectorError> {
        let task = self.inner.task.locked().take();
        match task {
            Some(t) => match t.await {
                Ok(result) => result,
                // The reflector catches its own panics; one escaping anyway (or a cancelled
                // runtime) is still not a clean stop.
                Err(e) => Err(ReflectorError::Panicked {
                    resource: self.inner.resource.clone(),
                    what: "reflector task",
                    message: if e.is_panic() {
                        crate::util::panic_message(&*e.into_panic())
                    } else {
                        "cancelled".to_owned()
                    },
                }),
            },
            None => Ok(()),
        }
    }

    /// Stops the reflector and waits for it. Handlers keep their registrations until removed
    /// (see [`shutdown`](Self::shutdown)).
    pub async fn stop(&self) -> Result<(), ReflectorError> {
        let _ = self.inner.stop.send(true);
        self.join().await
    }

    /// Registers a handler. Volatile handlers start with a synthetic add of everything in the
    /// store; durable ones continue from their persisted cursor (see [`HandlerOptions`]).
    pub fn add_event_handler(&self, handler: impl EventHandler<K>, options: HandlerOptions) -> Registration {
        self.add_shared_handler(Arc::new(handler), options)
    }

    /// Like [`add_event_handler`](Self::add_event_handler) for a handler shared by several informers.
    pub fn add_shared_handler(&self, handler: Arc<dyn EventHandler<K>>, mut options: HandlerOptions) -> Registration {
        if options.resync.is_none() {
            options.resync = self.inner.resync;
        }
        let (stop, stop_rx) = watch::channel(false);
        let (synced_tx, synced) = watch::channel(false);
        let (cursor_tx, cursor) = watch::channel(Seq(0));
        let (done_tx, done) = watch::channel(false);
        let lag_labels =
            metrics::HandlerLabels::new(&self.inner.resource, options.name.as_ref().map(CursorName::as_str));
        tokio::spawn(dispatch::track_lag(
            self.inner.writer.committed(),
            cursor.clone(),
            done.clone(),
            lag_labels,
        ));
        let (placed, unplaced) = watch::channel(false);
        if options.name.is_some() && !*self.inner.started.borrow() {
            self.inner.unplaced.locked().push(unplaced);
        }
        let progress = dispatch::Progress {
            synced: synced_tx,
            position: cursor_tx,
            placed,
        };
        let ctx = self.inner.ctx();
        let cache = self.inner.cache::<K>();
        tokio::spawn(async move {
            match options.name.clone() {
                Some(name) => dispatch::run_durable(ctx, Some(cache), handler, name, options, stop_rx, progress).await,
                None => dispatch::run_volatile(ctx, cache, handler, options, stop_rx, progress).await,
            }
            let _ = done_tx.send(true);
        });
        self.keep_slot(&stop, &done, &cursor);
        Registration {
            stop,
            synced,
            done,
            cursor,
        }
    }

    fn keep_slot(&self, stop: &watch::Sender<bool>, done: &watch::Receiver<bool>, cursor: &watch::Receiver<Seq>) {
        let mut slots = self.inner.handlers.locked();
        slots.retain(|s| !*s.done.borrow());
        slots.push(Slot {
            stop: stop.clone(),
            done: done.clone(),
            cursor: cursor.clone(),
        });
    }

    /// Registers `on_change`, called with the entries before and after every change of the
    /// read model (first with every object held, as adds; again for each at `options`'
    /// resync period), synchronously as the cache takes it: the controller's enqueueing,
    /// which reads metadata only and never waits.
    pub(crate) fn watch_changes(
        &self,
        on_change: impl Fn(Watched<'_, K>) + Send + Sync + 'static,
        mut options: HandlerOptions,
    ) -> Registration {
        if options.resync.is_none() {
            options.resync = self.inner.resync;
        }
        let cache = self.inner.cache::<K>();
        let id = cache.watch(on_change);
        let (stop, mut stop_rx) = watch::channel(false);
        let (synced_tx, synced) = watch::channel(false);
        let (cursor_tx, cursor) = watch::channel(Seq(0));
        let (done_tx, done) = watch::channel(false);
        let period = options.resync.unwrap_or(Duration::MAX);
        let mut sync_seq = self.inner.sync_seq.subscribe();
        tokio::spawn(async move {
            let mut applied = cache.applied();
            let mut resync_at = tokio::time::Instant::now().checked_add(period);
            loop {
                if cache.reached_sync() {
                    synced_tx.send_if_modified(|s| !std::mem::replace(s, true));
                }
                cursor_tx.send_replace(applied.borrow_and_update().1);
                let resync_sleep = async {
                    match resync_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => futures::future::pending().await,
                    }
                };
                tokio::select! {
                    r = applied.changed() => if r.is_err() { break },
                    r = sync_seq.changed() => if r.is_err() { break },
                    () = resync_sleep => {
                        cache.rewatch(id);
                        resync_at = tokio::time::Instant::now().checked_add(period);
                    }
                    _ = stop_rx.wait_for(|s| *s) => break,
                }
            }
            cache.unwatch(id);
            let _ = done_tx.send(true);
        });
        self.keep_slot(&stop, &done, &cursor);
        Registration {
            stop,
            synced,
            done,
            cursor,
        }
    }

    /// The current metadata of this informer's objects, by key, as its cache holds it (ahead of
    /// redb by what the writer is committing): cheap to clone, typeless (the sharding guard
    /// reads it).
    ///
    /// ```no_run
    /// # fn f(pods: durable_informer::informer::Informer<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::object::ObjectKey;
    /// let meta = pods.metadata().get(&ObjectKey::namespaced("prod", "web-0"))?;
    /// println!("{:?}", meta.map(|m| m.labels.clone()));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn metadata(&self) -> Metadata {
        Metadata(self.inner.cache::<K>())
    }

    /// What the informer's object cache holds now (see
    /// [`InformerBuilder::object_cache_bytes`]). The counts are kept as the cache changes,
    /// so a call does not walk the cache: cheap enough for every metrics scrape.
    ///
    /// ```no_run
    /// # fn f(pods: durable_informer::informer::Informer<k8s_openapi::api::core::v1::Pod>) {
    /// let stats = pods.cache_stats();
    /// println!("{} objects, {} with their JSON in memory", stats.objects, stats.with_json);
    /// # }
    /// ```
    #[must_use]
    pub fn cache_stats(&self) -> CacheStats {
        self.inner.cache::<K>().stats()
    }

    /// Stops the reflector, lets every handler catch up with what was committed (waiting at
    /// most 30 seconds for each handler), then stops the handlers. A handler still behind after
    /// that is stopped where it is: a durable one resumes from its persisted cursor next time.
    pub async fn shutdown(&self) -> Result<(), ReflectorError> {
        let result = self.stop().await;
        let target = *self.inner.writer.committed().borrow();
        let slots: Vec<(watch::Sender<bool>, watch::Receiver<bool>, watch::Receiver<Seq>)> = self
            .inner
            .handlers
            .locked()
            .drain(..)
            .map(|s| (s.stop, s.done, s.cursor))
            .collect();
        for (stop, mut done, mut cursor) in slots {
            let drained = cursor.wait_for(|c| *c >= target);
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, drained).await;
            let _ = stop.send(true);
            let _ = done.wait_for(|d| *d).await;
        }
        result
    }

    /// The read handle over this informer's objects (get, list, indexes, snapshots).
    #[must_use]
    pub fn store(&self) -> Store {
        self.inner.store.clone()
    }

    /// The same handle, by client-go's name: index queries go through it.
    #[must_use]
    pub fn indexer(&self) -> Store {
        self.store()
    }

    /// A typed lister: fallible reads that fall back to redb for what the cache does not hold
    /// (for kube-runtime's infallible `Store<K>`, see [`reader`](Self::reader)). Its reads fail
    /// with [`StoreError::NotStarted`] until the informer is [started](Self::start).
    #[must_use]
    pub fn lister(&self) -> Lister<K> {
        Lister::new(self.inner.store.clone(), Some(self.inner.cache::<K>()))
            .started(self.inner.started_flag.clone(), self.inner.resource.clone())
    }

    /// A reader shaped like kube-runtime's `reflector::Store<K>`: infallible reads from memory
    /// (see [`Reader`]). The first reader pins the informer's cache: every object's JSON is
    /// held, whatever [`InformerBuilder::object_cache_bytes`] says.
    #[must_use]
    pub fn reader(&self) -> Reader<K> {
        Reader::new(self.inner.clone(), self.inner.cache::<K>())
    }

    /// True once the store holds a complete, current view.
    #[must_use]
    pub fn has_synced(&self) -> bool {
        self.inner.status.borrow().synced
    }

    /// Waits until [`has_synced`](Self::has_synced) (client-go's `WaitForCacheSync`), or fails
    /// with [`InformerError::NotSynced`] when the reflector stops first, so nothing runs on
    /// a cache that will never be complete. An informer not [started](Self::start) within
    /// 2 seconds of the call fails with [`InformerError::NotStarted`] rather than waiting for
    /// ever (the grace covers a `run()` spawned just before).
    pub async fn wait_for_sync(&self) -> Result<(), InformerError> {
        self.inner.wait_started().await?;
        let mut rx = self.inner.status.clone();
        let synced = rx
            .wait_for(|s| s.synced || s.phase == crate::reflector::Phase::Stopped)
            .await
            .map(|s| s.synced)
            // The reflector is gone (its task ended): its last status says whether it synced.
            .unwrap_or_else(|_| self.inner.status.borrow().synced);
        if synced {
            return Ok(());
        }
        Err(InformerError::NotSynced {
            resource: self.inner.resource.clone(),
            last_error: self.inner.status.borrow().last_error.clone(),
        })
    }

    /// The resourceVersion of the last batch the writer acknowledged (committed; a watch
    /// batch reaches the disk within `StoreConfig::fsync_delay`), or the persisted one before
    /// the reflector ran. Should commits be lost before reaching the disk, it goes back to
    /// what the file holds when the reflector re-watches from there.
    #[must_use]
    pub fn last_synced_resource_version(&self) -> Option<ResourceVersion> {
        self.inner
            .status
            .borrow()
            .committed_rv
            .clone()
            .or_else(|| self.inner.store.resource_version().ok().flatten())
    }

    /// True when the store was restored from disk (the informer resumes without a LIST).
    #[must_use]
    pub fn is_restored(&self) -> bool {
        self.inner.restored
    }

    /// The reflector's status (phase, counts, last error).
    #[must_use]
    pub fn status(&self) -> watch::Receiver<ReflectorStatus> {
        self.inner.status.clone()
    }

    /// The last issues met by the reflector and the handlers (at most 100), oldest first.
    #[must_use]
    pub fn issues(&self) -> Vec<InformerIssue> {
        self.inner.errors.locked().clone()
    }

    /// [`issues`](Self::issues) as text, for logs.
    #[must_use]
    pub fn errors(&self) -> Vec<String> {
        self.issues().iter().map(ToString::to_string).collect()
    }

    /// Moves the informer to another shard range while it runs (`None`: every object), as a
    /// restart with [`InformerBuilder::sharding`] would: the watch ends after committing what
    /// it received, the objects no longer owned are deleted (handlers get their deletes), the
    /// added ranges are listed at the persisted resourceVersion (handlers get adds; a full
    /// relist diff if that version is compacted), and the watch resumes with the new range.
    /// The informer stays synced meanwhile: listers miss the added range's objects until
    /// they are fetched (`ReflectorStatus::shard_fetched` is set when they are). Sent before
    /// [`start`](Self::start), it is the range the informer starts with.
    ///
    /// ```no_run
    /// # async fn f(pods: durable_informer::informer::Informer<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::selector::ShardSelector;
    /// // A fourth replica joined: this one (index 1) now holds a quarter instead of a third.
    /// pods.set_sharding(Some(ShardSelector::by_uid(1, 4)?));
    /// # Ok(()) }
    /// ```
    pub fn set_sharding(&self, shard: Option<ShardSelector>) {
        self.inner.sharding.send_if_modified(|current| {
            let changed = *current != shard;
            *current = shard;
            changed
        });
    }

    /// The shard range the informer holds or is moving to (`None`: every object).
    #[must_use]
    pub fn sharding(&self) -> Option<ShardSelector> {
        self.inner.sharding.borrow().clone()
    }

    /// The scope in the database.
    #[must_use]
    pub fn scope(&self) -> ScopeId {
        self.inner.scope
    }
}
