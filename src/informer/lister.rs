//! Typed listers over the store (client-go's `Lister` / `NamespaceLister`), with label
//! selectors in kubectl's syntax.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::decoded::Decoded;
use crate::object::{ObjectError, ObjectKey, ObjectMeta};
use crate::selector::LabelSelector;
use crate::store::{HotEntry, HotTier, Store, StoreError, TypedCache, NAMESPACE};

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

impl<K: DeserializeOwned + Send + Sync + 'static> Lister<K> {
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
        self.get_named(key.namespace.as_deref(), &key.name)
    }

    /// One object by namespace and name: a hot, decoded object is one hash probe and one
    /// `Arc` clone (no key is built unless redb must be read).
    fn get_named(&self, namespace: Option<&str>, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        if let Some(tier) = self.store.hot() {
            // The view (a read lock) ends with this statement: `materialize` may take the
            // write lock to fill the entry.
            let entry = match tier.view() {
                Some(view) => match view.named(namespace, name) {
                    None => return Ok(None),
                    Some(e) => match e.typed::<K>() {
                        Some(k) => return Ok(Some(k)),
                        None => Some(e.clone()),
                    },
                },
                None => None,
            };
            if let Some(e) = entry {
                if let Some(mut found) = self.materialize(tier, vec![e])? {
                    return Ok(found.pop());
                }
            }
        }
        let key = ObjectKey {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
        };
        self.store.get_with(&key, |meta, bytes| self.decode(&key, meta, bytes))
    }

    /// The typed objects of `entries` (one committed state of the hot tier), or `None` when
    /// one of them had to be read from redb and changed since: the caller then reads redb
    /// alone, so an answer never mixes two states.
    fn materialize(&self, tier: &HotTier, entries: Vec<Arc<HotEntry>>) -> Result<Option<Vec<Arc<K>>>, StoreError> {
        let mut out: Vec<Option<Arc<K>>> = Vec::with_capacity(entries.len());
        let mut cold = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if let Some(k) = e.typed::<K>() {
                out.push(Some(k));
                continue;
            }
            match &e.bytes {
                Some(b) => {
                    let k = match self.decoded.as_ref().and_then(|d| d.latest(&e.meta.key(), b)) {
                        Some(k) => k,
                        None => decode(b)?,
                    };
                    e.set_typed(&k);
                    out.push(Some(k));
                }
                None => {
                    out.push(None);
                    cold.push(i);
                }
            }
        }
        if !cold.is_empty() {
            // A redb snapshot is at the tier's state or newer: an unchanged resourceVersion
            // means the same version.
            let snapshot = self.store.snapshot()?;
            for i in cold {
                let e = &entries[i];
                let want = &e.meta.resource_version;
                let bytes = snapshot.get_with(&e.meta.key(), |meta, bytes| {
                    if meta.resource_version == *want {
                        bytes().map(Some)
                    } else {
                        Ok(None)
                    }
                })?;
                let Some(Some(bytes)) = bytes else { return Ok(None) };
                let k = decode(&bytes)?;
                tier.fill(e, bytes, &k);
                out[i] = Some(k);
            }
        }
        debug_assert!(out.iter().all(Option::is_some));
        Ok(Some(out.into_iter().flatten().collect()))
    }

    /// The objects the hot tier selects, or `None` when it cannot answer.
    fn hot_select(
        &self,
        pick: impl FnOnce(&crate::store::HotView<'_>) -> Option<Vec<Arc<HotEntry>>>,
    ) -> Result<Option<Vec<Arc<K>>>, StoreError> {
        let Some(tier) = self.store.hot() else { return Ok(None) };
        let entries = match tier.view() {
            Some(view) => pick(&view),
            None => None,
        };
        match entries {
            Some(entries) => self.materialize(tier, entries),
            None => Ok(None),
        }
    }

    /// The objects an index holds under `value` (client-go's `ByIndex`), in key order for the
    /// built-in `namespace` index and by key within each value otherwise.
    ///
    /// ```no_run
    /// # fn f(lister: durable_informer::informer::Lister<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
    /// let web = lister.by_index("labels", "app=web")?;
    /// # let _ = web; Ok(()) }
    /// ```
    pub fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<K>>, StoreError> {
        let hot = self.hot_select(|view| {
            if index == NAMESPACE {
                Some(view.select(Some(value), |_| true))
            } else {
                view.by_index(index, value)
            }
        })?;
        if let Some(found) = hot {
            return Ok(found);
        }
        let snapshot = self.store.snapshot()?;
        snapshot
            .by_index(index, value)?
            .into_iter()
            .map(|o| {
                let meta = o.meta.clone();
                let mut bytes = || Ok(o.bytes.clone());
                self.decode(&o.key, &meta, &mut bytes)
            })
            .collect()
    }

    /// Every object matching `selector`, in key order.
    pub fn list(&self, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        self.select(None, selector)
    }

    /// One scan: the selector runs on the stored metadata, and an object's JSON is read and
    /// decoded only when it matches and is not already in the cache.
    fn select(&self, namespace: Option<&str>, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        if let Some(found) = self.hot_select(|view| Some(view.select(namespace, |m| selector.matches(&m.labels))))? {
            return Ok(found);
        }
        self.store.scan(namespace, |key, meta, bytes| {
            if !selector.matches(&meta.labels) {
                return Ok(None);
            }
            self.decode(&key, meta, bytes).map(Some)
        })
    }

    /// A cluster-scoped object by name.
    pub fn get(&self, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        self.get_named(None, name)
    }

    /// One object by its key (`namespace/name`, or `name` for a cluster-scoped one), as a
    /// controller's reconcile receives it.
    ///
    /// ```no_run
    /// # fn f(lister: durable_informer::informer::Lister<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::object::ObjectKey;
    /// let pod = lister.get_by_key(&ObjectKey::namespaced("prod", "web-0"))?;
    /// # let _ = pod; Ok(()) }
    /// ```
    pub fn get_by_key(&self, key: &ObjectKey) -> Result<Option<Arc<K>>, StoreError> {
        self.get_key(key)
    }

    /// One object by kube-runtime's [`ObjectRef`](kube::runtime::reflector::ObjectRef) (as
    /// `kube::runtime::reflector::Store::get` takes it); its namespace and name select the
    /// object, its group and kind are those of this lister's type.
    ///
    /// ```no_run
    /// # fn f(lister: durable_informer::informer::Lister<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
    /// use kube::runtime::reflector::ObjectRef;
    /// use k8s_openapi::api::core::v1::Pod;
    /// let pod = lister.get_ref(&ObjectRef::<Pod>::new("web-0").within("prod"))?;
    /// # let _ = pod; Ok(()) }
    /// ```
    pub fn get_ref(&self, obj: &kube::runtime::reflector::ObjectRef<K>) -> Result<Option<Arc<K>>, StoreError>
    where
        K: kube::Resource,
    {
        self.get_named(obj.namespace.as_deref(), &obj.name)
    }

    /// Every object, in key order (kube-runtime's `Store::state`).
    ///
    /// ```no_run
    /// # fn f(lister: durable_informer::informer::Lister<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
    /// let all = lister.state()?;
    /// # let _ = all; Ok(()) }
    /// ```
    pub fn state(&self) -> Result<Vec<Arc<K>>, StoreError> {
        self.select(None, &LabelSelector::default())
    }

    /// The first object, in key order, for which `pred` is true (kube-runtime's `Store::find`).
    ///
    /// ```no_run
    /// # fn f(lister: durable_informer::informer::Lister<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
    /// let pending = lister.find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))?;
    /// # let _ = pending; Ok(()) }
    /// ```
    pub fn find(&self, mut pred: impl FnMut(&K) -> bool) -> Result<Option<Arc<K>>, StoreError> {
        Ok(self.state()?.into_iter().find(|k| pred(k)))
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

impl<K: DeserializeOwned + Send + Sync + 'static> NamespaceLister<K> {
    /// Objects of the namespace matching `selector`.
    pub fn list(&self, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        self.lister.select(Some(&self.namespace), selector)
    }

    /// One object by name.
    pub fn get(&self, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        self.lister.get_named(Some(&self.namespace), name)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::object::{RawObject, ScopeSpec};
    use crate::store::{Batch, DeltaKind, DurableStore, Indexer, StoreConfig, StoredObject, LABELS};

    type Obj = serde_json::Value;

    fn obj(ns: &str, name: &str, rv: u64, app: &str) -> RawObject {
        let json = serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "resourceVersion": rv.to_string(), "labels": {"app": app, "kind": "pod"}},
            "data": {"rv": rv},
        });
        RawObject::from_json(serde_json::to_vec(&json).unwrap()).unwrap()
    }

    /// A database with one scope, a label index and a hot tier of `budget` bytes, loaded.
    fn open(dir: &std::path::Path, budget: usize) -> (DurableStore, Store) {
        let db = DurableStore::open(StoreConfig::new(dir.join("db.redb")).durable(false)).unwrap();
        let w = db.writer();
        let scope = w.register_scope_blocking(&ScopeSpec::new("", "v1", "pods")).unwrap();
        db.register_index(scope, Indexer::labels());
        futures::executor::block_on(w.ensure_index(scope, LABELS.into())).unwrap();
        futures::executor::block_on(w.enable_hot_tier(scope, budget)).unwrap();
        let store = db.store(scope);
        let t = std::time::Instant::now();
        while !store.hot_tier_stats().is_some_and(|s| s.loaded) {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "the tier loads");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        (db, store)
    }

    /// The queries, as the lister answers them.
    fn answers(l: &Lister<Obj>) -> Vec<Vec<Obj>> {
        let sel: LabelSelector = "app=web".parse().unwrap();
        let all = LabelSelector::everything();
        let by = |r: Result<Vec<Arc<Obj>>, StoreError>| r.unwrap().iter().map(|o| (**o).clone()).collect::<Vec<_>>();
        let get = |ns: &str, n: &str| by(l.namespace(ns).get(n).map(|o| o.into_iter().collect()));
        vec![
            by(l.list(&all)),
            by(l.list(&sel)),
            by(l.namespace("a").list(&all)),
            by(l.namespace("b").list(&sel)),
            by(l.by_index(LABELS, "app=web")),
            by(l.by_index("namespace", "b")),
            get("a", "o1"),
            get("b", "o3"),
            get("a", "missing"),
        ]
    }

    /// The same queries answered by redb alone (the model).
    fn model(store: &Store) -> Vec<Vec<Obj>> {
        let snap = store.snapshot().unwrap();
        let web = |o: &StoredObject| o.meta.labels.get("app").map(String::as_str) == Some("web");
        let dec = |v: Vec<StoredObject>| v.iter().map(|o| o.decode::<Obj>().unwrap()).collect::<Vec<_>>();
        let get = |ns: &str, n: &str| dec(snap.get(&ObjectKey::namespaced(ns, n)).unwrap().into_iter().collect());
        let all = snap.list().unwrap();
        vec![
            dec(all.clone()),
            dec(all.into_iter().filter(web).collect()),
            dec(snap.list_namespace("a").unwrap()),
            dec(snap.list_namespace("b").unwrap().into_iter().filter(web).collect()),
            dec(snap.by_index(LABELS, "app=web").unwrap()),
            dec(snap.by_index("namespace", "b").unwrap()),
            get("a", "o1"),
            get("b", "o3"),
            get("a", "missing"),
        ]
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(bool, u8, bool),
        Delete(bool, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<bool>(), 0..4u8, any::<bool>()).prop_map(|(a, n, web)| Op::Put(a, n, web)),
            (any::<bool>(), 0..4u8).prop_map(|(a, n)| Op::Delete(a, n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Against redb as the model: after every batch, a lister served by the hot tier (big
        /// enough for everything, or so small that most reads go to redb) answers exactly
        /// what redb alone answers.
        #[test]
        fn the_hot_tier_answers_what_redb_answers(batches in proptest::collection::vec(proptest::collection::vec(op(), 1..6), 1..8), tiny in any::<bool>()) {
            let dir = tempfile::tempdir().unwrap();
            let (db, store) = open(dir.path(), if tiny { 300 } else { 1 << 20 });
            let hot = Lister::<Obj>::new(store.clone(), None);
            let mut rv = 1u64;
            let mut live: BTreeMap<(bool, u8), ()> = BTreeMap::new();
            for ops in batches {
                let mut batch = Batch::new(store.scope());
                for o in ops {
                    rv += 1;
                    batch = match o {
                        Op::Put(a, n, web) => {
                            let kind = if live.insert((a, n), ()).is_some() { DeltaKind::Updated } else { DeltaKind::Added };
                            batch.delta(kind, obj(if a { "a" } else { "b" }, &format!("o{n}"), rv, if web { "web" } else { "db" }))
                        }
                        Op::Delete(a, n) => {
                            live.remove(&(a, n));
                            batch.delta(DeltaKind::Deleted, obj(if a { "a" } else { "b" }, &format!("o{n}"), rv, "gone"))
                        }
                    };
                }
                db.writer().apply_blocking(batch.rv(rv.to_string())).unwrap();
                prop_assert_eq!(answers(&hot), model(&store));
            }
            let stats = store.hot_tier_stats().unwrap();
            prop_assert!(stats.charged_bytes <= stats.budget_bytes);
            prop_assert_eq!(stats.objects, live.len());
        }
    }

    #[test]
    fn an_object_deleted_and_added_again_with_other_labels_leaves_no_stale_posting() {
        let dir = tempfile::tempdir().unwrap();
        let (db, store) = open(dir.path(), 1 << 20);
        let w = db.writer();
        let s = store.scope();
        w.apply_blocking(Batch::new(s).delta(DeltaKind::Added, obj("a", "o1", 2, "web")).rv("2"))
            .unwrap();
        w.apply_blocking(
            Batch::new(s)
                .delta(DeltaKind::Deleted, obj("a", "o1", 3, "web"))
                .rv("3"),
        )
        .unwrap();
        w.apply_blocking(Batch::new(s).delta(DeltaKind::Added, obj("a", "o1", 4, "db")).rv("4"))
            .unwrap();
        let hot = Lister::<Obj>::new(store.clone(), None);
        assert!(hot.by_index(LABELS, "app=web").unwrap().is_empty());
        assert_eq!(hot.by_index(LABELS, "app=db").unwrap().len(), 1);
    }

    #[test]
    fn a_cold_entry_that_changed_since_the_view_is_not_served_from_the_tier() {
        let dir = tempfile::tempdir().unwrap();
        // Too small to hold any JSON: every entry is cold.
        let (db, store) = open(dir.path(), 1);
        let w = db.writer();
        w.apply_blocking(
            Batch::new(store.scope())
                .delta(DeltaKind::Added, obj("a", "o1", 2, "web"))
                .rv("2"),
        )
        .unwrap();
        let tier = store.hot().unwrap().clone();
        let entries = tier.view().unwrap().select(None, |_| true);
        assert_eq!(entries.len(), 1);
        assert!(entries[0].bytes.is_none(), "evicted at once");
        // The object changes after the view was taken.
        w.apply_blocking(
            Batch::new(store.scope())
                .delta(DeltaKind::Updated, obj("a", "o1", 3, "web"))
                .rv("3"),
        )
        .unwrap();
        let lister = Lister::<Obj>::new(store.clone(), None);
        assert!(
            lister.materialize(&tier, entries).unwrap().is_none(),
            "a version the tier no longer holds is refused"
        );
        // The lister itself answers the new state.
        let got = lister.namespace("a").get("o1").unwrap().unwrap();
        assert_eq!(got["data"]["rv"], 3);
        // A budget of one byte holds no JSON, even of an object just read.
        assert_eq!(store.hot_tier_stats().unwrap().with_json, 0);
    }

    #[test]
    fn reads_decode_a_version_once_and_fill_the_tier() {
        let dir = tempfile::tempdir().unwrap();
        let (db, store) = open(dir.path(), 1 << 20);
        db.writer()
            .apply_blocking(
                Batch::new(store.scope())
                    .delta(DeltaKind::Added, obj("a", "o1", 2, "web"))
                    .rv("2"),
            )
            .unwrap();
        let lister = Lister::<Obj>::new(store.clone(), None);
        let first = lister.namespace("a").get("o1").unwrap().unwrap();
        let again = lister.list(&LabelSelector::everything()).unwrap();
        assert!(Arc::ptr_eq(&first, &again[0]), "the decoded object is shared");
        let stats = store.hot_tier_stats().unwrap();
        assert_eq!((stats.objects, stats.with_json), (1, 1));
    }

    #[test]
    fn a_tier_loaded_over_existing_objects_serves_them_and_their_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        {
            let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
            let w = db.writer();
            let scope = w.register_scope_blocking(&ScopeSpec::new("", "v1", "pods")).unwrap();
            db.register_index(scope, Indexer::labels());
            futures::executor::block_on(w.ensure_index(scope, LABELS.into())).unwrap();
            let mut b = Batch::new(scope);
            for i in 0..50u64 {
                b = b.delta(
                    DeltaKind::Added,
                    obj("a", &format!("o{i}"), 10 + i, if i % 5 == 0 { "web" } else { "db" }),
                );
            }
            w.apply_blocking(b.rv("100")).unwrap();
        }
        let (_db, store) = open(dir.path(), 1 << 20);
        let stats = store.hot_tier_stats().unwrap();
        assert_eq!((stats.objects, stats.with_json), (50, 0), "keys and metadata only");
        let postings = store.hot().unwrap().view().unwrap().by_index(LABELS, "app=web");
        assert_eq!(postings.map(|p| p.len()), Some(10), "the tier serves the label index");
        let hot = Lister::<Obj>::new(store.clone(), None);
        assert_eq!(hot.by_index(LABELS, "app=web").unwrap().len(), 10);
        assert_eq!(answers(&hot), model(&store));
        assert_eq!(store.hot_tier_stats().unwrap().with_json, 50);
    }
}
