//! Typed listers over the store (client-go's `Lister` / `NamespaceLister`), with label
//! selectors in kubectl's syntax.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::decoded::Decoded;
use crate::object::{ObjectError, ObjectKey, ObjectMeta};
use crate::selector::LabelSelector;
use crate::store::{Store, StoreError, TypedCache};

fn decode<K: DeserializeOwned>(bytes: &[u8]) -> Result<Arc<K>, StoreError> {
    serde_json::from_slice(bytes)
        .map(Arc::new)
        .map_err(|e| StoreError::from(ObjectError::Json(e)))
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
    /// The objects the informer's handlers decoded: a recently changed object is served from
    /// there (after a byte comparison) instead of being decoded again.
    decoded: Option<Arc<Decoded<K>>>,
    _k: PhantomData<fn() -> K>,
}

impl<K> Clone for Lister<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            cache: self.cache.clone(),
            decoded: self.decoded.clone(),
            _k: PhantomData,
        }
    }
}

impl<K: DeserializeOwned> Lister<K> {
    pub(crate) fn new(store: Store, decoded: Option<Arc<Decoded<K>>>) -> Self {
        Self {
            store,
            cache: None,
            decoded,
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

    /// Decodes one object, from the cache when it holds this (key, RV): then the JSON is never
    /// read from the log nor decompressed.
    fn decode(
        &self,
        key: &ObjectKey,
        meta: &ObjectMeta,
        bytes: &mut dyn FnMut() -> Result<bytes::Bytes, StoreError>,
    ) -> Result<Arc<K>, StoreError> {
        let mut fresh = || {
            let b = bytes()?;
            match self.decoded.as_ref().and_then(|d| d.latest(key, &b)) {
                Some(k) => Ok(k),
                None => decode(&b),
            }
        };
        match &self.cache {
            Some(c) => c.get_or_else(key, &meta.resource_version, fresh),
            None => fresh(),
        }
    }

    fn get_key(&self, key: &ObjectKey) -> Result<Option<Arc<K>>, StoreError> {
        self.store.get_with(key, |meta, bytes| self.decode(key, meta, bytes))
    }

    /// Every object matching `selector`, in key order.
    pub fn list(&self, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        self.select(None, selector)
    }

    /// One scan: the selector runs on the stored metadata, and an object's JSON is read and
    /// decoded only when it matches and is not already in the cache.
    fn select(&self, namespace: Option<&str>, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        self.store.scan(namespace, |key, meta, bytes| {
            if !selector.matches(&meta.labels) {
                return Ok(None);
            }
            self.decode(&key, meta, bytes).map(Some)
        })
    }

    /// A cluster-scoped object by name.
    pub fn get(&self, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        self.get_key(&ObjectKey::cluster(name))
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
        self.lister.select(Some(&self.namespace), selector)
    }

    /// One object by name.
    pub fn get(&self, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        self.lister.get_key(&ObjectKey::namespaced(&self.namespace, name))
    }
}
