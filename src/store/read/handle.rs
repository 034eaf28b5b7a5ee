//! [`Store`]: the cheap, cloneable read handle over one scope.

use crate::util::RwLocked;
use std::sync::Arc;

use bytes::Bytes;
use redb::ReadableDatabase;
use serde::de::DeserializeOwned;

use super::super::codec::{ScopeRecord, ShardRecord};
use super::super::hot::HotTier;
use super::super::schema::ScopeId;
use super::super::{Shared, StoreError};
use crate::object::{ObjectKey, ObjectMeta, ResourceVersion};

use super::{IndexStatus, Snapshot, StoredObject};

/// A cheap, cloneable read handle over one scope.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
    scope: ScopeId,
    /// The scope's hot tier once seen (a tier, once given, stays for the store's life).
    hot: Arc<std::sync::OnceLock<Arc<HotTier>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Store {
    pub(crate) fn new(shared: Arc<Shared>, scope: ScopeId) -> Self {
        Self {
            shared,
            scope,
            hot: Arc::default(),
        }
    }

    /// The scope's hot tier, if it has one (loaded or not).
    pub(crate) fn hot(&self) -> Option<&Arc<HotTier>> {
        // Borrowed, not cloned: a get by key is a few hundred nanoseconds in all.
        if let Some(t) = self.hot.get() {
            return Some(t);
        }
        let tier = self.shared.hot.reading().get(&self.scope).cloned()?;
        Some(self.hot.get_or_init(|| tier))
    }

    /// What the scope's hot tier holds, if it has one (see
    /// [`StoreConfig::hot_tier_bytes`](crate::store::StoreConfig::hot_tier_bytes)).
    ///
    /// ```no_run
    /// # fn f(store: durable_informer::store::Store) {
    /// if let Some(stats) = store.hot_tier_stats() {
    ///     println!("{} objects, {} with their JSON in memory", stats.objects, stats.with_json);
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn hot_tier_stats(&self) -> Option<super::super::HotTierStats> {
        self.hot().map(|t| t.stats())
    }

    /// The scope this handle reads.
    #[must_use]
    pub fn scope(&self) -> ScopeId {
        self.scope
    }

    /// A view at the latest commit, for several consistent reads.
    pub fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let txn = self.shared.db()?.begin_read().map_err(|e| self.shared.storage(e))?;
        Ok(Snapshot {
            shared: self.shared.clone(),
            txn,
            scope: self.scope,
        })
    }

    /// See [`Snapshot::get`].
    pub fn get(&self, key: &ObjectKey) -> Result<Option<StoredObject>, StoreError> {
        self.snapshot()?.get(key)
    }

    /// The object with this key, decoded into `K`.
    pub fn get_as<K: DeserializeOwned>(&self, key: &ObjectKey) -> Result<Option<K>, StoreError> {
        self.get(key)?.map(|o| o.decode()).transpose()
    }

    /// See [`Snapshot::list`].
    pub fn list(&self) -> Result<Vec<StoredObject>, StoreError> {
        self.snapshot()?.list()
    }

    /// The metadata of `key` as listers and volatile handlers see it: from the hot tier when
    /// it serves readers (it may be ahead of redb by the group being written), else from redb.
    pub(crate) fn current_meta(&self, key: &ObjectKey) -> Result<Option<Arc<ObjectMeta>>, StoreError> {
        if let Some(view) = self.hot().and_then(|t| t.view()) {
            return Ok(view.named(key.namespace.as_deref(), &key.name).map(|e| e.meta.clone()));
        }
        self.get_with(key, |meta, _| Ok(Arc::new(meta.clone())))
    }

    /// See [`Snapshot::get_with`].
    pub(crate) fn get_with<T>(
        &self,
        key: &ObjectKey,
        visit: impl FnOnce(&ObjectMeta, &mut dyn FnMut() -> Result<Bytes, StoreError>) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        self.snapshot()?.get_with(key, visit)
    }

    /// See [`Snapshot::scan`].
    pub(crate) fn scan<T>(
        &self,
        namespace: Option<&str>,
        visit: impl FnMut(
            ObjectKey,
            &ObjectMeta,
            &mut dyn FnMut() -> Result<Bytes, StoreError>,
        ) -> Result<Option<T>, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        self.snapshot()?.scan(namespace, visit)
    }

    /// See [`Snapshot::list_namespace`].
    pub fn list_namespace(&self, namespace: &str) -> Result<Vec<StoredObject>, StoreError> {
        self.snapshot()?.list_namespace(namespace)
    }

    /// See [`Snapshot::list_keys`].
    pub fn list_keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        self.snapshot()?.list_keys()
    }

    /// See [`Snapshot::by_index`].
    pub fn by_index(&self, index: &str, value: &str) -> Result<Vec<StoredObject>, StoreError> {
        self.snapshot()?.by_index(index, value)
    }

    /// See [`Snapshot::index_keys`].
    pub fn index_keys(&self, index: &str, value: &str) -> Result<Vec<ObjectKey>, StoreError> {
        self.snapshot()?.index_keys(index, value)
    }

    /// See [`Snapshot::list_index_values`].
    pub fn list_index_values(&self, index: &str) -> Result<Vec<String>, StoreError> {
        self.snapshot()?.list_index_values(index)
    }

    /// See [`Snapshot::index_status`].
    pub fn index_status(&self, index: &str) -> Result<IndexStatus, StoreError> {
        self.snapshot()?.index_status(index)
    }

    /// See [`Snapshot::record`].
    pub fn record(&self) -> Result<ScopeRecord, StoreError> {
        self.snapshot()?.record()
    }

    /// See [`Snapshot::shard`].
    pub fn shard(&self) -> Result<ShardRecord, StoreError> {
        self.snapshot()?.shard()
    }

    /// The persisted resourceVersion of the scope.
    pub fn resource_version(&self) -> Result<Option<ResourceVersion>, StoreError> {
        Ok(self.record()?.rv)
    }
}
