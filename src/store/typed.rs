//! A bounded cache of decoded objects, keyed by (key, resourceVersion): repeated reads of an
//! unchanged object skip the JSON decode. Memory stays bounded by `capacity`, not by the number
//! of objects in the store.

use crate::util::Locked;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;

use super::read::StoredObject;
use super::StoreError;
use crate::object::{ObjectError, ObjectKey, ResourceVersion};

type Entry = (ObjectKey, ResourceVersion);
/// The map and the insertion order used for eviction.
type Slots<K> = (HashMap<Entry, Arc<K>>, VecDeque<Entry>);

/// Decoded `Arc<K>`s of recently read objects, at most `capacity` of them (oldest evicted
/// first). A changed object has a new resourceVersion, so a stale entry is never returned.
///
/// ```
/// use durable_informer::store::TypedCache;
/// let cache: TypedCache<k8s_openapi::api::core::v1::ConfigMap> = TypedCache::new(10_000);
/// assert_eq!(cache.len(), 0);
/// ```
pub struct TypedCache<K> {
    capacity: usize,
    inner: Mutex<Slots<K>>,
}

impl<K: DeserializeOwned> TypedCache<K> {
    /// A cache holding at most `capacity` decoded objects.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// The decoded object, from the cache or freshly decoded (and then cached).
    pub fn decode(&self, obj: &StoredObject) -> Result<Arc<K>, StoreError> {
        self.get_or_decode(&obj.key, &obj.meta.resource_version, || Ok(obj.bytes.clone()))
    }

    /// The cached object for (key, RV), or `bytes()` decoded and cached: on a hit the bytes are
    /// never fetched (nor read from the log and decompressed).
    pub(crate) fn get_or_decode(
        &self,
        key: &ObjectKey,
        rv: &ResourceVersion,
        bytes: impl FnOnce() -> Result<bytes::Bytes, StoreError>,
    ) -> Result<Arc<K>, StoreError> {
        self.get_or_else(key, rv, || {
            let b = bytes()?;
            Ok(Arc::new(
                serde_json::from_slice(&b).map_err(|e| StoreError::from(ObjectError::Json(e)))?,
            ))
        })
    }

    /// The cached object for (key, RV), or the one `make` returns (then cached).
    pub(crate) fn get_or_else(
        &self,
        key: &ObjectKey,
        rv: &ResourceVersion,
        make: impl FnOnce() -> Result<Arc<K>, StoreError>,
    ) -> Result<Arc<K>, StoreError> {
        let id = (key.clone(), rv.clone());
        if let Some(k) = self.lock().0.get(&id) {
            return Ok(k.clone());
        }
        // Outside the lock: decoding is the expensive part.
        let k = make()?;
        let mut g = self.lock();
        let (map, order) = &mut *g;
        if map.insert(id.clone(), k.clone()).is_none() {
            order.push_back(id);
            while order.len() > self.capacity {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
        Ok(k)
    }

    /// Objects currently cached.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().0.len()
    }

    /// True when nothing is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots<K>> {
        self.inner.locked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::ObjectMeta;

    fn obj(name: &str, rv: &str, v: &str) -> StoredObject {
        StoredObject {
            key: ObjectKey::namespaced("ns", name),
            meta: ObjectMeta {
                name: name.into(),
                resource_version: rv.into(),
                ..ObjectMeta::default()
            },
            bytes: format!(r#"{{"v":"{v}"}}"#).into_bytes().into(),
        }
    }

    #[test]
    fn hits_share_the_decoded_object_changes_do_not_and_size_stays_bounded() {
        let cache: TypedCache<serde_json::Value> = TypedCache::new(2);
        let a1 = cache.decode(&obj("a", "1", "x")).unwrap();
        let a1_again = cache.decode(&obj("a", "1", "x")).unwrap();
        assert!(Arc::ptr_eq(&a1, &a1_again), "a hit returns the cached Arc");
        let a2 = cache.decode(&obj("a", "2", "y")).unwrap();
        assert_eq!(a2["v"], "y", "a new RV is decoded afresh");
        cache.decode(&obj("b", "1", "z")).unwrap();
        assert_eq!(cache.len(), 2, "bounded by capacity");
        assert!(cache
            .decode(&StoredObject {
                bytes: b"nope".to_vec().into(),
                ..obj("c", "1", "")
            })
            .is_err());
    }
}
