//! Typed listers over the store (client-go's `Lister` / `NamespaceLister`), with label
//! selectors in kubectl's syntax.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::cache::{decode_error, Cache, Entry};
use crate::object::{ObjectError, ObjectKey};
use crate::selector::LabelSelector;
use crate::store::{Store, StoreError, NAMESPACE};

fn decode<K: DeserializeOwned>(bytes: &[u8]) -> Result<Arc<K>, StoreError> {
    serde_json::from_slice(bytes)
        .map(Arc::new)
        .map_err(|e| StoreError::from(ObjectError::Json(e)))
}

/// Lists and gets typed objects from an informer's object cache (kube-runtime's `Store<K>`),
/// reading from redb what the cache does not hold.
///
/// ```no_run
/// # fn f(lister: durable_informer::informer::Lister<k8s_openapi::api::core::v1::Pod>) -> Result<(), Box<dyn std::error::Error>> {
/// let web = lister.namespace("prod").list(&"app=web,tier!=cache".parse()?)?;
/// let one = lister.namespace("prod").get("web-0")?;
/// # let _ = (web, one); Ok(()) }
/// ```
pub struct Lister<K> {
    store: Store,
    /// The informer's read model; until it has loaded, reads go to redb.
    cache: Option<Arc<Cache<K>>>,
    /// Whether the informer was started (one atomic load a read), and its resource (for the
    /// error): `None` for a lister over a store alone.
    started: Option<Arc<(Arc<AtomicBool>, Box<str>)>>,
    _k: PhantomData<fn() -> K>,
}

impl<K> Clone for Lister<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            cache: self.cache.clone(),
            started: self.started.clone(),
            _k: PhantomData,
        }
    }
}

impl<K: DeserializeOwned + Send + Sync + 'static> Lister<K> {
    pub(crate) fn new(store: Store, cache: Option<Arc<Cache<K>>>) -> Self {
        Self {
            store,
            cache,
            started: None,
            _k: PhantomData,
        }
    }

    /// Refuses reads until `started` is true.
    pub(crate) fn started(mut self, started: Arc<AtomicBool>, resource: String) -> Self {
        self.started = Some(Arc::new((started, resource.into())));
        self
    }

    /// [`StoreError::NotStarted`] while the informer was never started.
    fn check_started(&self) -> Result<(), StoreError> {
        match self.started.as_deref() {
            Some((started, resource)) if !started.load(Ordering::Acquire) => Err(StoreError::NotStarted {
                resource: resource.to_string(),
            }),
            _ => Ok(()),
        }
    }

    fn get_key(&self, key: &ObjectKey) -> Result<Option<Arc<K>>, StoreError> {
        self.get_named(key.namespace.as_deref(), &key.name)
    }

    /// One object by namespace and name: a cached, decoded object is one hash probe and one
    /// `Arc` clone (no key is built unless redb must be read).
    fn get_named(&self, namespace: Option<&str>, name: &str) -> Result<Option<Arc<K>>, StoreError> {
        self.check_started()?;
        if let Some(cache) = &self.cache {
            // A decoded object is one `Arc` clone under the view (a read lock); otherwise the
            // view ends with this statement and decoding happens outside it.
            let entry = match cache.view() {
                Some(v) => match v.named(namespace, name) {
                    Some(e) => match e.decoded() {
                        Some(k) => return Ok(Some(k.clone())),
                        None => Some(Some(e.clone())),
                    },
                    None => Some(None),
                },
                None => None,
            };
            match entry {
                Some(None) => return Ok(None),
                Some(Some(e)) => {
                    if let Some(k) = e.read() {
                        return k.map(Some).map_err(|_| decode_error::<K>(e.json()));
                    }
                    if let Some(mut found) = self.materialize(cache, vec![e])? {
                        return Ok(found.pop());
                    }
                }
                None => {}
            }
        }
        let key = ObjectKey {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
        };
        self.store.get_with(&key, |_, bytes| decode(&bytes()?))
    }

    /// What the cache answers for `key` without reading redb (a hash probe, and a decode the
    /// first time): `None` when it cannot — not loaded, or the object's JSON left on disk — so
    /// the caller reads with [`get_many`](Self::get_many) off the runtime.
    pub(crate) fn get_cached(&self, key: &ObjectKey) -> Option<Result<Option<Arc<K>>, StoreError>> {
        if let Err(e) = self.check_started() {
            return Some(Err(e));
        }
        let cache = self.cache.as_ref()?;
        // As in `get_named`: a decoded object is cloned under the view, decoding happens after it.
        let entry = {
            let view = cache.view()?;
            let e = view.named(key.namespace.as_deref(), &key.name);
            if let Some(k) = e.and_then(|e| e.decoded()) {
                return Some(Ok(Some(k.clone())));
            }
            e.cloned()
        };
        match entry {
            None => Some(Ok(None)),
            Some(e) => e.read().map(|k| k.map(Some).map_err(|_| decode_error::<K>(e.json()))),
        }
    }

    /// The objects of `keys`, from the cache where it holds them and from one redb snapshot
    /// for the others (a cold entry read back at its version goes back into the cache). Reads
    /// redb: call it off the runtime.
    pub(crate) fn get_many(&self, keys: &[ObjectKey]) -> Vec<Result<Option<Arc<K>>, StoreError>> {
        let mut snapshot: Option<Result<crate::store::Snapshot, StoreError>> = None;
        keys.iter()
            .map(|key| {
                if let Some(hit) = self.get_cached(key) {
                    return hit;
                }
                let snap = match snapshot.get_or_insert_with(|| self.store.snapshot()) {
                    Ok(s) => s,
                    // One failed read transaction: each key says so (the error is not `Clone`).
                    Err(_) => return self.get_key(key),
                };
                let cold = self
                    .cache
                    .as_ref()
                    .and_then(|c| Some((c, c.view()?.named(key.namespace.as_deref(), &key.name).cloned()?)));
                let read = snap.get_with(key, |meta, bytes| Ok((meta.resource_version.clone(), bytes()?)))?;
                match (read, cold) {
                    (None, _) => Ok(None),
                    // The version the cache holds (redb is not behind it): kept for later readers.
                    (Some((rv, bytes)), Some((cache, e))) if rv == e.meta.resource_version => {
                        cache.fill(&e, bytes).map(Some)
                    }
                    (Some((_, bytes)), _) => decode(&bytes).map(Some),
                }
            })
            .collect()
    }

    /// The decoded objects of `entries` (one state of the cache), or `None` when one of them
    /// had to be read from redb and changed since: the caller then reads redb alone, so an
    /// answer never mixes two states.
    fn materialize(&self, cache: &Cache<K>, entries: Vec<Arc<Entry<K>>>) -> Result<Option<Vec<Arc<K>>>, StoreError> {
        let mut out: Vec<Option<Arc<K>>> = Vec::with_capacity(entries.len());
        let mut cold = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            match e.read() {
                Some(Ok(k)) => out.push(Some(k)),
                Some(Err(_)) => return Err(decode_error::<K>(e.json())),
                None => {
                    out.push(None);
                    cold.push(i);
                }
            }
        }
        if !cold.is_empty() {
            // An evicted entry was committed: redb holds it or a newer version, and an
            // unchanged resourceVersion means the same version.
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
                out[i] = Some(cache.fill(e, bytes)?);
            }
        }
        debug_assert!(out.iter().all(Option::is_some));
        Ok(Some(out.into_iter().flatten().collect()))
    }

    /// The objects the cache selects, or `None` when it cannot answer (not loaded, an index it
    /// does not serve, or an evicted object changed in redb since).
    fn cached(
        &self,
        pick: impl FnOnce(&super::cache::View<'_, K>) -> Option<Vec<Arc<Entry<K>>>>,
    ) -> Result<Option<Vec<Arc<K>>>, StoreError> {
        let Some(cache) = &self.cache else { return Ok(None) };
        let entries = cache.view().and_then(|v| pick(&v));
        match entries {
            Some(entries) => self.materialize(cache, entries),
            None => Ok(None),
        }
    }

    /// The cache's answer to [`select`](Self::select), or `None` when it cannot answer. While
    /// every selected object is decoded already (the hot case) each costs one `Arc` clone
    /// under the view; from the first that is not, the rest are materialized after it.
    fn scanned(&self, namespace: Option<&str>, selector: &LabelSelector) -> Result<Option<Vec<Arc<K>>>, StoreError> {
        let Some(cache) = &self.cache else { return Ok(None) };
        let all = selector.is_empty();
        let (mut out, rest) = {
            let Some(view) = cache.view() else { return Ok(None) };
            let mut picked = view.scan(namespace).filter(|e| all || selector.matches(&e.meta.labels));
            let mut out = Vec::new();
            let mut rest = Vec::new();
            for e in picked.by_ref() {
                match e.decoded() {
                    Some(k) => out.push(k.clone()),
                    None => {
                        rest.push(e.clone());
                        break;
                    }
                }
            }
            rest.extend(picked.cloned());
            (out, rest)
        };
        if rest.is_empty() {
            return Ok(Some(out));
        }
        // The same state as `out`: the view was one read of the table.
        match self.materialize(cache, rest)? {
            Some(more) => {
                out.extend(more);
                Ok(Some(out))
            }
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
        self.check_started()?;
        let cached = if index == NAMESPACE {
            self.scanned(Some(value), &LabelSelector::everything())?
        } else {
            self.cached(|view| view.by_index(index, value))?
        };
        if let Some(found) = cached {
            return Ok(found);
        }
        let snapshot = self.store.snapshot()?;
        snapshot
            .by_index(index, value)?
            .into_iter()
            .map(|o| decode(&o.bytes))
            .collect()
    }

    /// Every object matching `selector`, in key order.
    pub fn list(&self, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        self.select(None, selector)
    }

    /// One scan: the selector runs on the metadata, and an object's JSON is read and decoded
    /// only when it matches and the cache does not hold it decoded.
    fn select(&self, namespace: Option<&str>, selector: &LabelSelector) -> Result<Vec<Arc<K>>, StoreError> {
        self.check_started()?;
        if let Some(found) = self.scanned(namespace, selector)? {
            return Ok(found);
        }
        self.store.scan(namespace, |_, meta, bytes| {
            if !selector.matches(&meta.labels) {
                return Ok(None);
            }
            decode(&bytes()?).map(Some)
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
        self.check_started()?;
        // Object by object, stopping at the first match: only the objects before it are decoded.
        if let Some(cache) = &self.cache {
            if let Some(entries) = cache.view().map(|v| v.select(None, |_| true)) {
                let mut fell_back = false;
                for e in entries {
                    let k = match e.read() {
                        Some(k) => k.map_err(|_| decode_error::<K>(e.json()))?,
                        None => match self.materialize(cache, vec![e])? {
                            Some(mut one) => match one.pop() {
                                Some(k) => k,
                                None => continue,
                            },
                            None => {
                                fell_back = true;
                                break;
                            }
                        },
                    };
                    if pred(&k) {
                        return Ok(Some(k));
                    }
                }
                if !fell_back {
                    return Ok(None);
                }
            }
        }
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

    /// A database with one scope and a label index, and a loaded cache of `budget` bytes over
    /// it (its task on `rt`).
    struct Fixture {
        db: DurableStore,
        store: Store,
        cache: Arc<Cache<Obj>>,
        _rt: tokio::runtime::Runtime,
    }

    impl Fixture {
        fn open(dir: &std::path::Path, budget: usize) -> Self {
            let db = DurableStore::open(StoreConfig::new(dir.join("db.redb")).durable(false)).unwrap();
            let w = db.writer();
            let scope = w.register_scope_blocking(&ScopeSpec::new("", "v1", "pods")).unwrap();
            db.register_index(scope, Indexer::labels());
            w.ensure_index_blocking(scope, LABELS.into()).unwrap();
            Self::over(db, scope, budget)
        }

        fn over(db: DurableStore, scope: crate::store::ScopeId, budget: usize) -> Self {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let store = db.store(scope);
            let (_, sync) = tokio::sync::watch::channel(None);
            let cache = Cache::new(store.clone(), db.log(), db.writer(), budget, sync);
            let c = cache.clone();
            rt.block_on(async move {
                tokio::spawn(Cache::run(Arc::downgrade(&c)));
                let mut applied = c.applied();
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    applied.wait_for(|(loaded, _)| *loaded),
                )
                .await
                .expect("the cache loads")
                .expect("running");
            });
            Self {
                db,
                store,
                cache,
                _rt: rt,
            }
        }

        /// Applies `batch`, and the change to the cache.
        fn apply(&self, batch: Batch) {
            self.db.writer().apply_blocking(batch).unwrap();
            let committed = *self.db.writer().committed().borrow();
            self.cache.pump_now();
            assert!(self.cache.stats().seq >= committed, "the cache took the batch");
        }

        fn lister(&self) -> Lister<Obj> {
            Lister::new(self.store.clone(), Some(self.cache.clone()))
        }
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
        let web = |o: &StoredObject| o.meta.labels.get("app") == Some("web");
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

        /// Against redb as the model: after every batch, a lister served by the cache (big
        /// enough for everything, or so small that most reads go to redb) answers exactly what
        /// redb alone answers.
        #[test]
        fn the_cache_answers_what_redb_answers(batches in proptest::collection::vec(proptest::collection::vec(op(), 1..6), 1..8), tiny in any::<bool>()) {
            let dir = tempfile::tempdir().unwrap();
            let f = Fixture::open(dir.path(), if tiny { 300 } else { 1 << 20 });
            let lister = f.lister();
            let mut rv = 1u64;
            let mut live: BTreeMap<(bool, u8), ()> = BTreeMap::new();
            for ops in batches {
                let mut batch = Batch::new(f.store.scope());
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
                f.apply(batch.rv(rv.to_string()));
                prop_assert_eq!(answers(&lister), model(&f.store));
            }
            let stats = f.cache.stats();
            prop_assert!(stats.charged_bytes <= stats.budget_bytes);
            prop_assert_eq!(stats.objects, live.len());
        }
    }

    #[test]
    fn an_object_deleted_and_added_again_with_other_labels_leaves_no_stale_posting() {
        let dir = tempfile::tempdir().unwrap();
        let f = Fixture::open(dir.path(), 1 << 20);
        let s = f.store.scope();
        f.apply(Batch::new(s).delta(DeltaKind::Added, obj("a", "o1", 2, "web")).rv("2"));
        f.apply(
            Batch::new(s)
                .delta(DeltaKind::Deleted, obj("a", "o1", 3, "web"))
                .rv("3"),
        );
        f.apply(Batch::new(s).delta(DeltaKind::Added, obj("a", "o1", 4, "db")).rv("4"));
        let l = f.lister();
        assert!(l.by_index(LABELS, "app=web").unwrap().is_empty());
        assert_eq!(l.by_index(LABELS, "app=db").unwrap().len(), 1);
    }

    #[test]
    fn a_cold_entry_that_changed_since_the_view_is_not_served_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        // Too small to hold any JSON: every entry is cold once committed.
        let f = Fixture::open(dir.path(), 1);
        let s = f.store.scope();
        f.apply(Batch::new(s).delta(DeltaKind::Added, obj("a", "o1", 2, "web")).rv("2"));
        let entries = f.cache.view().unwrap().select(None, |_| true);
        assert_eq!(entries.len(), 1);
        assert!(!entries[0].has_json(), "evicted at once");
        // The object changes after the view was taken (in redb only: the cache is not pumped).
        f.db.writer()
            .apply_blocking(
                Batch::new(s)
                    .delta(DeltaKind::Updated, obj("a", "o1", 3, "web"))
                    .rv("3"),
            )
            .unwrap();
        let lister = f.lister();
        assert!(
            lister.materialize(&f.cache, entries).unwrap().is_none(),
            "a version redb no longer holds is refused"
        );
        // The lister answers from redb alone, then from the cache once it took the change.
        assert_eq!(lister.namespace("a").get("o1").unwrap().unwrap()["data"]["rv"], 3);
        f.cache.pump_now();
        assert_eq!(lister.namespace("a").get("o1").unwrap().unwrap()["data"]["rv"], 3);
        // A budget of one byte holds no JSON, even of an object just read.
        assert_eq!(f.cache.stats().with_json, 0);
    }

    /// Object `i` of the cache tests: `a/o{i:05}` at resourceVersion 10000 + i, all of one
    /// size, so each is charged the same.
    fn add_numbered(f: &Fixture, i: u64) {
        let b = Batch::new(f.store.scope()).delta(DeltaKind::Added, obj("a", &format!("o{i:05}"), 10_000 + i, "web"));
        f.apply(b.rv((10_000 + i).to_string()));
    }

    /// What the cache charges for one numbered object.
    fn charge_of_one() -> usize {
        let dir = tempfile::tempdir().unwrap();
        let f = Fixture::open(dir.path(), 1 << 20);
        add_numbered(&f, 1);
        f.cache.stats().charged_bytes
    }

    /// A cache full of objects only written takes in what a lister reads back a second time,
    /// and keeps it for the next read, as the budget's docs promise ("the least recently
    /// written or read go first"): before, a full cache took in nothing read back, so a
    /// controller's reads went to redb for ever.
    #[test]
    fn a_full_cache_keeps_what_a_lister_reads_back_for_the_next_read() {
        // A cache with room for three.
        let one = charge_of_one();
        let dir = tempfile::tempdir().unwrap();
        let f = Fixture::open(dir.path(), 3 * one + one / 2);
        for i in 1..=6 {
            add_numbered(&f, i);
        }
        let held = |name: &str| {
            f.cache
                .entry(&ObjectKey::namespaced("a", name))
                .flatten()
                .is_some_and(|e| e.has_json())
        };
        assert!(!held("o00001") && held("o00006"), "the oldest written went");
        let lister = f.lister();
        let once = lister.namespace("a").get("o00001").unwrap().unwrap();
        assert!(!held("o00001"), "read back once (a scan, say): not taken in");
        let first = lister.namespace("a").get("o00001").unwrap().unwrap();
        assert!(!Arc::ptr_eq(&once, &first));
        assert!(held("o00001"), "read back again: taken in");
        let again = lister.namespace("a").get("o00001").unwrap().unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "the third read is served decoded from the cache"
        );
        assert!(!held("o00004"), "the least recently written gave way");
        let stats = f.cache.stats();
        assert!(stats.charged_bytes <= stats.budget_bytes, "{stats:?}");
        assert_eq!(stats.with_json, 3);
        // Read again, o1 outlasts o7, written after it and never read.
        for i in 7..=9 {
            add_numbered(&f, i);
        }
        assert!(held("o00001"), "o1 was read: a second chance");
        assert!(!held("o00007") && held("o00008") && held("o00009"));
    }

    /// After a list of everything and reads of every object, more than the cache holds, a
    /// small set read three times is held whole (the doorkeeper takes each in at its second
    /// read back, and the reads before do not push it out).
    #[test]
    fn a_set_read_again_after_reads_of_everything_is_held() {
        let one = charge_of_one();
        let dir = tempfile::tempdir().unwrap();
        let f = Fixture::open(dir.path(), 200 * one);
        for i in 0..2000 {
            add_numbered(&f, i);
        }
        let lister = f.lister();
        lister.list(&LabelSelector::everything()).unwrap();
        for i in 0..4000u64 {
            lister
                .namespace("a")
                .get(&format!("o{:05}", (i * 7919) % 2000))
                .unwrap();
        }
        let hot: Vec<String> = (0..50u64).map(|i| format!("o{:05}", (i * 7919) % 2000)).collect();
        for _ in 0..3 {
            for h in &hot {
                lister.namespace("a").get(h).unwrap();
            }
        }
        let held = hot
            .iter()
            .filter(|h| {
                f.cache
                    .entry(&ObjectKey::namespaced("a", h.as_str()))
                    .flatten()
                    .is_some_and(|e| e.has_json())
            })
            .count();
        assert_eq!(held, hot.len(), "{:?}", f.cache.stats());
    }

    #[test]
    fn reads_decode_a_version_once_and_share_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = Fixture::open(dir.path(), 1 << 20);
        f.apply(
            Batch::new(f.store.scope())
                .delta(DeltaKind::Added, obj("a", "o1", 2, "web"))
                .rv("2"),
        );
        let lister = f.lister();
        let first = lister.namespace("a").get("o1").unwrap().unwrap();
        let again = lister.list(&LabelSelector::everything()).unwrap();
        assert!(Arc::ptr_eq(&first, &again[0]), "the decoded object is shared");
        let stats = f.cache.stats();
        assert_eq!((stats.objects, stats.with_json), (1, 1));
    }

    #[test]
    fn a_cache_loaded_over_existing_objects_serves_them_and_their_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        let scope = {
            let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
            let w = db.writer();
            let scope = w.register_scope_blocking(&ScopeSpec::new("", "v1", "pods")).unwrap();
            db.register_index(scope, Indexer::labels());
            w.ensure_index_blocking(scope, LABELS.into()).unwrap();
            let mut b = Batch::new(scope);
            for i in 0..50u64 {
                b = b.delta(
                    DeltaKind::Added,
                    obj("a", &format!("o{i}"), 10 + i, if i % 5 == 0 { "web" } else { "db" }),
                );
            }
            w.apply_blocking(b.rv("100")).unwrap();
            scope
        };
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        db.register_index(scope, Indexer::labels());
        let f = Fixture::over(db, scope, 1 << 20);
        let stats = f.cache.stats();
        assert_eq!((stats.objects, stats.with_json), (50, 0), "keys and metadata only");
        let postings = f.cache.view().unwrap().by_index(LABELS, "app=web");
        assert_eq!(postings.map(|p| p.len()), Some(10), "the cache serves the label index");
        let l = f.lister();
        assert_eq!(l.by_index(LABELS, "app=web").unwrap().len(), 10);
        assert_eq!(answers(&l), model(&f.store));
        assert_eq!(f.cache.stats().with_json, 50);
    }
}
