//! Typed listers over the store (client-go's `Lister` / `NamespaceLister`), with label
//! selectors in kubectl's syntax.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::selector::LabelSelector;
use crate::store::{CodecError, ObjectKey, Store, StoreError, StoredObject};

fn decode<K: DeserializeOwned>(o: &StoredObject) -> Result<Arc<K>, StoreError> {
    serde_json::from_slice(&o.bytes)
        .map(Arc::new)
        .map_err(|e| StoreError::Codec(CodecError::Json(e)))
}

fn select<K: DeserializeOwned>(objs: Vec<StoredObject>, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
    objs.iter()
        .filter(|o| selector.matches(&o.meta.labels))
        .map(decode)
        .collect()
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
    _k: PhantomData<fn() -> K>,
}

impl<K> Clone for Lister<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            _k: PhantomData,
        }
    }
}

impl<K: DeserializeOwned> Lister<K> {
    pub(crate) fn new(store: Store) -> Self {
        Self { store, _k: PhantomData }
    }

    /// Every object matching `selector`, in key order.
    pub fn list(&self, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        select(self.store.list()?, selector)
    }

    /// A cluster-scoped object by name.
    pub fn get(&self, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        self.store
            .get(&ObjectKey::cluster(name))?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// The objects of one namespace.
    #[must_use]
    pub fn namespace(&self, namespace: &str) -> NamespaceLister<K> {
        NamespaceLister {
            store: self.store.clone(),
            namespace: namespace.to_owned(),
            _k: PhantomData,
        }
    }
}

/// A lister restricted to one namespace (a key-range scan of the store).
pub struct NamespaceLister<K> {
    store: Store,
    namespace: String,
    _k: PhantomData<fn() -> K>,
}

impl<K: DeserializeOwned> NamespaceLister<K> {
    /// Objects of the namespace matching `selector`.
    pub fn list(&self, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        select(self.store.list_namespace(&self.namespace)?, selector)
    }

    /// One object by name.
    pub fn get(&self, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        self.store
            .get(&ObjectKey::namespaced(&self.namespace, name))?
            .as_ref()
            .map(decode)
            .transpose()
    }
}
