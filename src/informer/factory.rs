//! The informer factory: one database, many informers, each scope shared.

use crate::util::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::core::{ApiResource, Resource};
use serde::de::DeserializeOwned;

use super::{Informer, InformerError, Inner};
use crate::reflector::{ReflectorConfig, ReflectorError};
use crate::selector::RingMember;
use crate::source::{KubeSource, Source};
use crate::store::{DurableStore, Indexer, StoreError};

type Starter = Box<dyn Fn() + Send + Sync>;
type Waiter = Box<dyn Fn() -> futures::future::BoxFuture<'static, Result<(), InformerError>> + Send + Sync>;
type Stopper = Box<dyn Fn() -> futures::future::BoxFuture<'static, Result<(), ReflectorError>> + Send + Sync>;

struct Entry {
    /// Untyped: a typed and a dynamic informer of one scope share it (and its reflector).
    inner: Arc<Inner>,
    start: Starter,
    wait: Waiter,
    stop: Stopper,
}

/// client-go's `SharedInformerFactory`: one database file, many informers; asking twice for
/// the same scope (resource + namespace + selectors) returns the same informer, whatever the
/// Rust type asked for: `informer::<Pod>` and `informer_for::<DynamicObject>` of pods share one
/// reflector (one LIST, one WATCH) and one store.
///
/// ```no_run
/// # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_informer::informer::InformerFactory;
/// use durable_informer::store::{DurableStore, StoreConfig};
/// use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
/// let factory = InformerFactory::new(DurableStore::open(StoreConfig::new("cache.redb"))?, client, "https://cluster");
/// let pods = factory.informer::<Pod>(None).await?;
/// let deployments = factory.informer::<Deployment>(Some("default")).await?;
/// factory.start();
/// factory.wait_for_cache_sync().await?;
/// factory.shutdown().await?;
/// # let _ = (pods, deployments); Ok(()) }
/// ```
pub struct InformerFactory {
    db: Mutex<Option<Arc<DurableStore>>>,
    client: kube::Client,
    server: String,
    config: ReflectorConfig,
    ring_shard: Option<RingMember>,
    informers: Mutex<HashMap<String, Arc<Entry>>>,
}

impl InformerFactory {
    /// A factory over `db`, talking to the server at `server` through `client`.
    #[must_use]
    pub fn new(db: DurableStore, client: kube::Client, server: &str) -> Self {
        Self {
            db: Mutex::new(Some(Arc::new(db))),
            client,
            server: server.to_owned(),
            config: ReflectorConfig::default(),
            ring_shard: None,
            informers: Mutex::new(HashMap::new()),
        }
    }

    /// Reflector settings for informers created from now on.
    #[must_use]
    pub fn reflector_config(mut self, config: ReflectorConfig) -> Self {
        self.config = config;
        self
    }

    /// Every informer created from now on holds only this shard of its resource (see
    /// [`InformerBuilder::sharding`](super::InformerBuilder::sharding)): the usual way to run
    /// N replicas of a controller, each with shard `i` of `n`.
    ///
    /// ```no_run
    /// # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::informer::InformerFactory;
    /// use durable_informer::selector::ShardSelector;
    /// use durable_informer::store::{DurableStore, StoreConfig};
    /// let factory = InformerFactory::new(DurableStore::open(StoreConfig::new("cache.redb"))?, client, "https://cluster")
    ///     .sharding(ShardSelector::by_uid(0, 3)?);
    /// let pods = factory.informer::<k8s_openapi::api::core::v1::Pod>(None).await?;
    /// # let _ = pods; Ok(()) }
    /// ```
    #[must_use]
    pub fn sharding(mut self, shard: crate::selector::ShardSelector) -> Self {
        self.config.sharding = Some(shard);
        self
    }

    /// Every informer created from now on holds only the objects assigned to this shard of a
    /// label ring (see [`InformerBuilder::ring_shard`](super::InformerBuilder::ring_shard)): its
    /// label selector is added to each informer's own. The sharder labels owned objects with
    /// their controller's shard, so a controller's primary and owned resources agree.
    ///
    /// ```no_run
    /// # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::informer::InformerFactory;
    /// use durable_informer::selector::RingLabels;
    /// use durable_informer::store::{DurableStore, StoreConfig};
    /// use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    /// let factory = InformerFactory::new(DurableStore::open(StoreConfig::new("cache.redb"))?, client, "https://cluster")
    ///     .ring_shard(RingLabels::new("web")?.member("shard-0")?);
    /// let deployments = factory.informer::<Deployment>(None).await?;
    /// let replicasets = factory.informer::<ReplicaSet>(None).await?;
    /// # let _ = (deployments, replicasets); Ok(()) }
    /// ```
    #[must_use]
    pub fn ring_shard(mut self, member: RingMember) -> Self {
        self.ring_shard = Some(member);
        self
    }

    /// The shared informer of a typed resource in one namespace (or all).
    pub async fn informer<K>(&self, namespace: Option<&str>) -> Result<Informer<K>, InformerError>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        self.informer_for(ApiResource::erase::<K>(&()), namespace, None, None, Vec::new())
            .await
    }

    /// The shared informer of a typed resource with kube-runtime's `watcher::Config`: its
    /// selectors are part of the scope; its page size, timeout and list strategy apply when the
    /// informer is created (see
    /// [`InformerBuilder::watcher_config`](super::InformerBuilder::watcher_config)).
    ///
    /// ```no_run
    /// # async fn f(factory: durable_informer::informer::InformerFactory) -> Result<(), Box<dyn std::error::Error>> {
    /// use kube::runtime::watcher;
    /// let web = factory
    ///     .informer_with::<k8s_openapi::api::core::v1::Pod>(None, &watcher::Config::default().labels("app=web"))
    ///     .await?;
    /// # let _ = web; Ok(()) }
    /// ```
    pub async fn informer_with<K>(
        &self,
        namespace: Option<&str>,
        wc: &kube::runtime::watcher::Config,
    ) -> Result<Informer<K>, InformerError>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        self.make(
            ApiResource::erase::<K>(&()),
            namespace,
            wc.label_selector.as_deref(),
            wc.field_selector.as_deref(),
            Vec::new(),
            false,
            Some(wc),
        )
        .await
    }

    /// The shared metadata-only informer of a typed resource (see
    /// [`Informer::metadata_from_api`](super::Informer::metadata_from_api)): a scope apart from
    /// the full objects'.
    ///
    /// ```no_run
    /// # async fn f(factory: durable_informer::informer::InformerFactory) -> Result<(), Box<dyn std::error::Error>> {
    /// use k8s_openapi::api::core::v1::Pod;
    /// let pods = factory.metadata_informer::<Pod>(None).await?;
    /// # let _ = pods; Ok(()) }
    /// ```
    pub async fn metadata_informer<K>(
        &self,
        namespace: Option<&str>,
    ) -> Result<Informer<kube::core::PartialObjectMeta<K>>, InformerError>
    where
        K: Resource<DynamicType = ()> + Send + Sync + 'static,
    {
        self.make(
            ApiResource::erase::<K>(&()),
            namespace,
            None,
            None,
            Vec::new(),
            true,
            None,
        )
        .await
    }

    /// The shared informer of any resource, with selectors and indexers. Indexers apply when the
    /// informer is created; a later call for the same scope returns it as it is.
    pub async fn informer_for<K>(
        &self,
        resource: ApiResource,
        namespace: Option<&str>,
        label_selector: Option<&str>,
        field_selector: Option<&str>,
        indexers: Vec<Indexer>,
    ) -> Result<Informer<K>, InformerError>
    where
        K: DeserializeOwned + Send + Sync + 'static,
    {
        self.make(
            resource,
            namespace,
            label_selector,
            field_selector,
            indexers,
            false,
            None,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn make<K>(
        &self,
        resource: ApiResource,
        namespace: Option<&str>,
        label_selector: Option<&str>,
        field_selector: Option<&str>,
        indexers: Vec<Indexer>,
        metadata_only: bool,
        wc: Option<&kube::runtime::watcher::Config>,
    ) -> Result<Informer<K>, InformerError>
    where
        K: DeserializeOwned + Send + Sync + 'static,
    {
        let mut source = KubeSource::new(self.client.clone(), &self.server, resource);
        if metadata_only {
            source = source.metadata_only();
        }
        if let Some(ns) = namespace {
            source = source.namespace(ns);
        }
        match &self.ring_shard {
            Some(member) => source = source.labels(&member.narrow(label_selector)),
            None => {
                if let Some(l) = label_selector {
                    source = source.labels(l);
                }
            }
        }
        if let Some(f) = field_selector {
            source = source.fields(f);
        }
        let key = source.scope().canonical();
        if let Some(e) = self.informers.locked().get(&key) {
            return Ok(Informer::from_inner(e.inner.clone()));
        }
        let db = self.db.locked().clone();
        let db = db.ok_or(StoreError::WriterGone)?;
        let mut config = self.config.clone();
        if let Some(wc) = wc {
            crate::source::apply_watcher_config(&mut config, wc);
        }
        let mut b = Informer::<K>::builder(&db, source).reflector_config(config);
        for ix in indexers {
            b = b.indexer(ix);
        }
        let informer = b.build().await?;
        let (i1, i2, i3) = (informer.clone(), informer.clone(), informer.clone());
        let entry = Arc::new(Entry {
            inner: informer.inner.clone(),
            start: Box::new(move || i1.start()),
            wait: Box::new(move || {
                let i = i2.clone();
                Box::pin(async move { i.wait_for_sync().await })
            }),
            stop: Box::new(move || {
                let i = i3.clone();
                Box::pin(async move { i.shutdown().await })
            }),
        });
        let mut map = self.informers.locked();
        // Another task may have created the same scope meanwhile: keep the first.
        let e = map.entry(key).or_insert(entry);
        Ok(Informer::from_inner(e.inner.clone()))
    }

    fn entries(&self) -> Vec<Arc<Entry>> {
        self.informers.locked().values().cloned().collect()
    }

    /// Starts every informer created so far (again for new ones: starting twice is harmless).
    pub fn start(&self) {
        for e in self.entries() {
            (e.start)();
        }
    }

    /// Waits until every informer has synced; fails with the first informer that stopped
    /// before syncing ([`InformerError::NotSynced`]).
    pub async fn wait_for_cache_sync(&self) -> Result<(), InformerError> {
        for e in self.entries() {
            (e.wait)().await?;
        }
        Ok(())
    }

    /// Stops every watch, drains the handlers (they receive everything committed), then
    /// flushes the writer and closes the database.
    pub async fn shutdown(&self) -> Result<(), InformerError> {
        let mut first_err = None;
        for e in self.entries() {
            if let Err(err) = (e.stop)().await {
                first_err.get_or_insert(err);
            }
        }
        let db = self.db.locked().take();
        if let Some(db) = db.and_then(|db| Arc::try_unwrap(db).ok()) {
            tokio::task::spawn_blocking(move || db.close())
                .await
                .map_err(InformerError::Join)??;
        }
        match first_err {
            // A cluster mismatch stopped an informer: the caller must hear of it.
            Some(e) => Err(InformerError::Reflector(e)),
            None => Ok(()),
        }
    }
}
