//! Secondary indexes: the functions that compute index values, and their registry.
//!
//! Namespace listing needs no index: objects are keyed by (scope, namespace, name), so one
//! namespace is a key-range scan. Index rows are written only for indexes a scope asked for:
//! the built-in [`LABELS`] index (`key=value` per label) or custom functions registered by name.

use crate::util::RwLocked;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock};

use super::schema::{IndexName, ScopeId};
use super::StoreError;
use crate::object::ObjectMeta;

/// Name of the built-in label index; its values are `key=value`.
pub const LABELS: &str = "labels";

/// Name under which [`by_index`](super::Store::by_index) answers from the key order instead of
/// index rows: its value is a namespace.
pub const NAMESPACE: &str = "namespace";

/// Computes the values an object is indexed under, from its metadata and JSON bytes.
pub type IndexFunc = Arc<dyn Fn(&ObjectMeta, &[u8]) -> Vec<String> + Send + Sync>;

/// An index a scope maintains.
#[derive(Clone)]
pub struct Indexer {
    /// Its name.
    pub name: IndexName,
    /// Its function.
    pub func: IndexFunc,
}

impl fmt::Debug for Indexer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Indexer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Indexer {
    /// The built-in label index: one value `key=value` per label.
    #[must_use]
    pub fn labels() -> Self {
        Self::new(LABELS, |meta, _| {
            meta.labels.iter().map(|(k, v)| format!("{k}={v}")).collect()
        })
    }

    /// A custom index. The function must be deterministic: the same object must always give
    /// the same values (`check` compares stored rows with fresh answers).
    ///
    /// ```
    /// use durable_informer::store::Indexer;
    /// let by_owner = Indexer::new("owner", |meta, _json| {
    ///     meta.owner_references.iter().map(|o| o.name.clone()).collect()
    /// });
    /// assert_eq!(by_owner.name.0, "owner");
    /// ```
    pub fn new(name: &str, func: impl Fn(&ObjectMeta, &[u8]) -> Vec<String> + Send + Sync + 'static) -> Self {
        Self {
            name: IndexName(name.to_owned()),
            func: Arc::new(func),
        }
    }

    /// A custom index over the typed object (client-go's `IndexFunc` on a typed object): the
    /// writer decodes each stored object as `K` for it, so prefer [`new`](Self::new) when the
    /// metadata is enough. An object that does not decode as `K` is indexed under no value.
    ///
    /// ```
    /// use durable_informer::object::extract_meta;
    /// use durable_informer::store::Indexer;
    /// use k8s_openapi::api::core::v1::Pod;
    ///
    /// let by_node = Indexer::typed::<Pod>("node", |pod| {
    ///     pod.spec.as_ref().and_then(|s| s.node_name.clone()).into_iter().collect()
    /// });
    /// let json = br#"{"metadata":{"name":"web-0","namespace":"prod","resourceVersion":"1"},"spec":{"containers":[],"nodeName":"n1"}}"#;
    /// let meta = extract_meta(json)?;
    /// assert_eq!(by_node.values(&meta, json), ["n1"]);
    /// assert!(by_node.values(&meta, br#"{"spec":"not a pod spec"}"#).is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn typed<K: serde::de::DeserializeOwned>(
        name: &str,
        func: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        Self::new(name, move |_meta, json| match serde_json::from_slice::<K>(json) {
            Ok(k) => func(&k),
            Err(_) => Vec::new(),
        })
    }

    /// The sorted, deduplicated values for one object.
    #[must_use]
    pub fn values(&self, meta: &ObjectMeta, json: &[u8]) -> Vec<String> {
        let mut v = (self.func)(meta, json);
        v.sort_unstable();
        v.dedup();
        v
    }

    /// [`values`](Self::values), with a panic of the user's function caught and returned as
    /// [`StoreError::Panicked`]: the writer thread runs it, and must outlive it.
    pub(crate) fn values_caught(&self, meta: &ObjectMeta, json: &[u8]) -> Result<Vec<String>, StoreError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.values(meta, json))).map_err(|p| {
            StoreError::Panicked {
                what: format!("index function {:?} on {}", self.name.0, meta.key()),
                message: crate::util::panic_message(&*p),
            }
        })
    }
}

/// Index functions per scope, shared by the writer (which maintains rows) and `check`.
/// Functions cannot be persisted: a process registers them again on every start.
#[derive(Clone, Default)]
pub(crate) struct IndexRegistry {
    inner: Arc<RwLock<HashMap<ScopeId, BTreeMap<IndexName, Indexer>>>>,
}

impl IndexRegistry {
    pub(crate) fn register(&self, scope: ScopeId, indexer: Indexer) {
        let mut map = self.inner.writing();
        map.entry(scope).or_default().insert(indexer.name.clone(), indexer);
    }

    pub(crate) fn for_scope(&self, scope: ScopeId) -> Vec<Indexer> {
        let map = self.inner.reading();
        map.get(&scope)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn get(&self, scope: ScopeId, name: &IndexName) -> Option<Indexer> {
        let map = self.inner.reading();
        map.get(&scope).and_then(|m| m.get(name).cloned())
    }
}
