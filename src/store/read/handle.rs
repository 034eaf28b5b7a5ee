//! [`Store`]: the cheap, cloneable read handle over one scope.

use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::super::codec::{ScopeRecord, ShardRecord};
use super::super::schema::ScopeId;
use super::super::{Shared, StoreError};
use crate::object::{ObjectKey, ObjectMeta, ResourceVersion};

use super::{IndexStatus, Snapshot, StoredObject};

/// A cheap, cloneable read handle over one scope.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
    scope: ScopeId,
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
        Self { shared, scope }
    }

    /// The indexes registered on this scope in this process (their functions; see
    /// [`DurableStore::register_index`](crate::store::DurableStore::register_index)).
    pub(crate) fn registered_indexes(&self) -> Vec<super::super::IndexName> {
        self.shared
            .indexes
            .for_scope(self.scope)
            .into_iter()
            .map(|ix| ix.name)
            .collect()
    }

    /// The object caches' shared budget of the store this handle reads.
    pub(crate) fn memory(&self) -> &Arc<super::super::MemoryBudget> {
        &self.shared.memory
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
