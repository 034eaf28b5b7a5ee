//! Typed listers over the store (client-go's `Lister` / `NamespaceLister`), with label
//! selectors in kubectl's syntax.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::selector::LabelSelector;
use crate::store::{CodecError, ObjectKey, Store, StoreError, StoredObject, TypedCache};

fn decode<K: DeserializeOwned>(o: &StoredObject) -> Result<Arc<K>, StoreError> {
    serde_json::from_slice(&o.bytes)
        .map(Arc::new)
        .map_err(|e| StoreError::Codec(CodecError::Json(e)))
}

/// Lists and gets typed objects from an informer's store.
///
/// ```no_run
/// # fn f(lister: durable_informer::informer::Lister<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
/// let web = lister.namespace("prod").list(&"app=web,tier!=cache".parse()?)?;
/// let one = lister.namespace("prod").get("web-0")?;
/// # let _ = (web, one); Ok(()) }
/// ```
pub struct Lister<K> {
    store: Store,
    cache: Option<Arc<TypedCache<K>>>,
    _k: PhantomData<fn() -> K>,
}

impl<K> Clone for Lister<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            cache: self.cache.clone(),
            _k: PhantomData,
        }
    }
}

impl<K: DeserializeOwned> Lister<K> {
    pub(crate) fn new(store: Store) -> Self {
        Self {
            store,
            cache: None,
            _k: PhantomData,
        }
    }

    /// Keeps up to `capacity` decoded objects in a bounded cache keyed by (key, RV), so
    /// repeated reads of unchanged objects skip the JSON decode. Clones share the cache.
    #[must_use]
    pub fn with_cache(mut self, capacity: usize) -> Self {
        self.cache = Some(Arc::new(TypedCache::new(capacity)));
        self
    }

    fn decode(&self, o: &StoredObject) -> Result<Arc<K>, StoreError> {
        match &self.cache {
            Some(c) => c.decode(o),
            None => decode(o),
        }
    }

    /// Every object matching `selector`, in key order.
    pub fn list(&self, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        self.select(self.store.list()?, selector)
    }

    fn select(&self, objs: Vec<StoredObject>, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        objs.iter()
            .filter(|o| selector.matches(&o.meta.labels))
            .map(|o| self.decode(o))
            .collect()
    }

    /// A cluster-scoped object by name.
    pub fn get(&self, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        self.store
            .get(&ObjectKey::cluster(name))?
            .as_ref()
            .map(|o| self.decode(o))
            .transpose()
    }

    /// The objects of one namespace.
    #[must_use]
    pub fn namespace(&self, namespace: &str) -> NamespaceLister<K> {
        NamespaceLister {
            lister: self.clone(),
            namespace: namespace.to_owned(),
        }
    }
}

/// A lister restricted to one namespace (a key-range scan of the store).
pub struct NamespaceLister<K> {
    lister: Lister<K>,
    namespace: String,
}

impl<K: DeserializeOwned> NamespaceLister<K> {
    /// Objects of the namespace matching `selector`.
    pub fn list(&self, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        self.lister
            .select(self.lister.store.list_namespace(&self.namespace)?, selector)
    }

    /// One object by name.
    pub fn get(&self, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        let obj = self.lister.store.get(&ObjectKey::namespaced(&self.namespace, name))?;
        obj.as_ref().map(|o| self.lister.decode(o)).transpose()
    }
}
