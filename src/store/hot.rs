//! The hot tier: an in-memory mirror of one scope, so that reads touch no redb page.
//!
//! It holds every key of the scope with its metadata and index values, and the JSON of as many
//! objects as its byte budget allows (the rest are read from redb on demand). Each entry also
//! carries a slot for the object decoded into the reader's type, filled on first read, so a
//! reader decodes each version once.
//!
//! The writer thread keeps it: every change to the `objects` table is journaled in the group
//! and applied here once the group is applied, before its commit (with the group's log records
//! in the [`Feed`], for volatile handlers), all under one write lock. A reader therefore always
//! sees the state after one whole group: never a torn mix of two. Should the commit fail, the
//! writer reloads the tier from redb. The JSON of entries changed by a group not yet committed
//! is never evicted (`pinned`), so an entry whose JSON was evicted is a committed version, and a
//! redb snapshot holds it or a newer one; the reader checks that the stored resourceVersion is
//! the one the tier holds, and when it is not (the object changed since) answers from redb
//! alone instead.
//!
//! It is filled in the background from a read snapshot taken between two groups; the writer
//! journals the groups committed meanwhile, and the loader applies them after the snapshot.
//! Until then (and after a failed load) readers use redb.

use crate::util::RwLocked;
use std::any::{Any, TypeId};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use hashbrown::hash_table::{Entry, HashTable};
use hashbrown::DefaultHashBuilder;

use super::feed::Feed;
use super::read::Snapshot;
use super::schema::{IndexName, ScopeId, Seq};
use super::StoreError;
use crate::object::{ObjectKey, ObjectMeta};

/// What an object's JSON costs against the budget: the JSON itself and its decoded form,
/// estimated at twice the JSON (`benches/compare` measures the real RSS).
fn charge(bytes: &Bytes) -> usize {
    bytes.len().saturating_mul(3)
}

/// What a hot tier holds; see [`Store::hot_tier_stats`](super::Store::hot_tier_stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotTierStats {
    /// Whether it is loaded (before, and after a failed load, listers read the database).
    pub loaded: bool,
    /// Objects mirrored (every object of the scope once loaded).
    pub objects: usize,
    /// Objects whose JSON is held (the others are read from the database when needed).
    pub with_json: usize,
    /// Bytes charged against the budget (three times each held object's JSON).
    pub charged_bytes: usize,
    /// The budget.
    pub budget_bytes: usize,
    /// The last committed log seq it reflects.
    pub seq: Seq,
}

/// One object in the tier: the version the tier holds.
pub(crate) struct HotEntry {
    pub(crate) meta: Arc<ObjectMeta>,
    /// Its JSON, unless evicted.
    pub(crate) bytes: Option<Bytes>,
    /// The values of each index the tier serves, to drop its postings when it changes.
    values: Arc<[(IndexName, Vec<String>)]>,
    /// Names this version in the eviction queue.
    gen: u64,
    /// The object decoded by the first reader, in that reader's type.
    typed: OnceLock<(TypeId, Arc<dyn Any + Send + Sync>)>,
}

impl HotEntry {
    /// The decoded object, if a reader of type `K` decoded this version.
    pub(crate) fn typed<K: Send + Sync + 'static>(&self) -> Option<Arc<K>> {
        let (id, any) = self.typed.get()?;
        if *id != TypeId::of::<K>() {
            return None;
        }
        any.clone().downcast::<K>().ok()
    }

    /// Keeps `k` as this version decoded (the first type to get here wins the slot; other
    /// types decode for themselves).
    pub(crate) fn set_typed<K: Send + Sync + 'static>(&self, k: &Arc<K>) {
        let _ = self.typed.set((TypeId::of::<K>(), k.clone()));
    }
}

/// A change to one scope's objects, journaled by the writer in its group.
pub(crate) enum HotOp {
    Put {
        meta: Box<ObjectMeta>,
        bytes: Bytes,
        values: Vec<(IndexName, Vec<String>)>,
    },
    Remove(ObjectKey),
    Clear,
}

enum Phase {
    /// The loader runs; the groups committed since its snapshot wait here.
    Loading {
        load: u64,
        pending: Vec<HotOp>,
    },
    Ready,
    /// The load failed: readers use redb.
    Failed,
}

struct State {
    phase: Phase,
    objects: Objects,
    /// Index name → value → keys, for the indexes that were complete when the tier loaded.
    postings: Postings,
    /// JSON held, as charged against the budget.
    charged: usize,
    /// Entries holding JSON, oldest first (an entry replaced since leaves a stale token).
    queue: VecDeque<(ObjectKey, u64)>,
    next_gen: u64,
    /// While a group applied here is not yet committed, its first generation: entries from
    /// there on keep their JSON until [`HotTier::confirm`], so that redb holds every version
    /// the tier lets go of.
    pinned: Option<u64>,
    /// The last applied seq the tier reflects.
    seq: Seq,
    /// Loads started, to ignore a loader that was superseded.
    loads: u64,
}

/// The in-memory mirror of one scope; see the module documentation.
pub(crate) struct HotTier {
    scope: ScopeId,
    budget: usize,
    state: RwLock<State>,
    /// The scope's newest log records, published with the tier's changes.
    pub(crate) feed: Feed,
}

/// A read view of a loaded tier at one committed state.
pub(crate) struct HotView<'a>(RwLockReadGuard<'a, State>);

impl HotView<'_> {
    /// The entry named `name` in `namespace` (`None`: cluster-scoped), or `None` when the
    /// scope holds no such object; borrowed, so a get builds no key and clones no entry.
    pub(crate) fn named(&self, namespace: Option<&str>, name: &str) -> Option<&Arc<HotEntry>> {
        self.0.objects.named(namespace, name)
    }

    /// The entries of one namespace (`Some("")`: cluster-scoped objects) or of the whole
    /// scope, in key order, that `keep` accepts.
    pub(crate) fn select(
        &self,
        namespace: Option<&str>,
        mut keep: impl FnMut(&ObjectMeta) -> bool,
    ) -> Vec<Arc<HotEntry>> {
        let pick = |(_, e): (&ObjectKey, &Arc<HotEntry>)| keep(&e.meta).then(|| e.clone());
        match namespace {
            None => self.0.objects.iter().filter_map(pick).collect(),
            Some("") => self
                .0
                .objects
                .iter()
                .take_while(|(k, _)| k.namespace.is_none())
                .filter_map(pick)
                .collect(),
            Some(ns) => self
                .0
                .objects
                .range(ObjectKey::namespaced(ns, ""))
                .take_while(|(k, _)| k.namespace.as_deref() == Some(ns))
                .filter_map(pick)
                .collect(),
        }
    }

    /// The entries indexed under `value`, or `None` when the tier does not serve this index.
    pub(crate) fn by_index(&self, index: &str, value: &str) -> Option<Vec<Arc<HotEntry>>> {
        let postings = self.0.postings.get(&IndexName(index.to_owned()))?;
        let keys = postings.get(value);
        Some(
            keys.into_iter()
                .flatten()
                .filter_map(|k| self.0.objects.get(k).cloned())
                .collect(),
        )
    }
}

impl HotTier {
    /// A tier, not loaded yet, created between groups when `head` is the last seq.
    pub(crate) fn new(scope: ScopeId, budget: usize, head: Seq) -> Self {
        Self {
            feed: Feed::new(head),
            scope,
            budget,
            state: RwLock::new(State {
                phase: Phase::Failed,
                objects: Objects::default(),
                postings: HashMap::new(),
                charged: 0,
                queue: VecDeque::new(),
                next_gen: 0,
                pinned: None,
                seq: Seq(0),
                loads: 0,
            }),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.reading()
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.writing()
    }

    /// A view, when the tier is loaded.
    pub(crate) fn view(&self) -> Option<HotView<'_>> {
        let st = self.read();
        matches!(st.phase, Phase::Ready).then(|| HotView(st))
    }

    /// What the tier holds now.
    pub(crate) fn stats(&self) -> HotTierStats {
        let st = self.read();
        HotTierStats {
            loaded: matches!(st.phase, Phase::Ready),
            objects: st.objects.len(),
            with_json: st.objects.values().filter(|e| e.bytes.is_some()).count(),
            charged_bytes: st.charged,
            budget_bytes: self.budget,
            seq: st.seq,
        }
    }

    /// Starts a load (writer thread, between groups): later groups are journaled until the
    /// loader installs its snapshot. Returns the load's number.
    pub(crate) fn begin_load(&self) -> u64 {
        let mut st = self.write();
        st.loads += 1;
        let load = st.loads;
        st.phase = Phase::Loading {
            load,
            pending: Vec::new(),
        };
        load
    }

    /// Applies one group's changes (writer thread, once the group is applied and before its
    /// commit). Returns whether readers use the tier now, so may be told of the group before
    /// its commit.
    pub(crate) fn apply(&self, ops: Vec<HotOp>, seq: Seq) -> bool {
        let mut st = self.write();
        match &mut st.phase {
            Phase::Loading { pending, .. } => {
                pending.extend(ops);
                false
            }
            Phase::Ready => {
                st.pinned = st.pinned.or(Some(st.next_gen));
                for op in ops {
                    st.apply_op(op, self.budget);
                }
                debug_assert!(st.seq <= seq, "the hot tier moved back");
                st.seq = seq;
                true
            }
            Phase::Failed => false,
        }
    }

    /// Whether readers use the tier now (it is loaded), so that changes applied to it are
    /// seen at once.
    pub(crate) fn serves(&self) -> bool {
        matches!(self.read().phase, Phase::Ready)
    }

    /// The groups applied so far are committed: their JSON may be evicted now.
    pub(crate) fn confirm(&self, committed: Seq) {
        let mut st = self.write();
        st.pinned = None;
        st.evict(self.budget);
        drop(st);
        self.feed.committed(committed);
    }

    /// Builds the tier from `snapshot` (on the loader thread) and installs it with the groups
    /// journaled since, unless another load started meanwhile.
    pub(crate) fn load(&self, load: u64, snapshot: &Snapshot, indexes: &[IndexName]) {
        match build(snapshot, indexes) {
            Ok((objects, postings, seq)) => {
                let mut st = self.write();
                let Phase::Loading { load: current, pending } = &mut st.phase else {
                    return;
                };
                if *current != load {
                    return;
                }
                let pending = std::mem::take(pending);
                st.objects = objects;
                st.postings = postings;
                st.charged = 0;
                st.queue.clear();
                st.seq = seq;
                // The journaled groups may include one not yet committed.
                st.pinned = st.pinned.or(Some(st.next_gen));
                for op in pending {
                    st.apply_op(op, self.budget);
                }
                st.phase = Phase::Ready;
                tracing::debug!(scope = self.scope.0, objects = st.objects.len(), "hot tier loaded");
            }
            Err(e) => self.fail(load, &e),
        }
    }

    /// Gives up load number `load`: readers use redb.
    pub(crate) fn fail(&self, load: u64, e: &StoreError) {
        tracing::warn!(scope = self.scope.0, error = %e, "the hot tier could not load; reads use the database");
        let mut st = self.write();
        if matches!(st.phase, Phase::Loading { load: l, .. } if l == load) {
            st.phase = Phase::Failed;
            st.objects.clear();
            st.postings.clear();
            st.charged = 0;
            st.queue.clear();
        }
    }

    /// Keeps `bytes` (read from redb) as the JSON of `entry`, if the tier still holds that
    /// version.
    pub(crate) fn fill<K: Send + Sync + 'static>(&self, entry: &Arc<HotEntry>, bytes: Bytes, typed: &Arc<K>) {
        let mut st = self.write();
        let key = entry.meta.key();
        match st.objects.get(&key) {
            Some(e) if Arc::ptr_eq(e, entry) && e.bytes.is_none() => {}
            _ => return,
        }
        let gen = st.next_gen;
        st.next_gen += 1;
        let filled = Arc::new(HotEntry {
            meta: entry.meta.clone(),
            bytes: Some(bytes),
            values: entry.values.clone(),
            gen,
            typed: OnceLock::new(),
        });
        filled.set_typed(typed);
        st.hold(&key, filled, self.budget);
    }
}

impl State {
    fn apply_op(&mut self, op: HotOp, budget: usize) {
        match op {
            HotOp::Put { meta, bytes, values } => {
                let key = meta.key();
                // Only the values that changed move: an update rarely changes its labels, and
                // each posting moved costs allocations and tree walks on the delivery path.
                let old = self.objects.get(&key).map(|e| e.values.clone());
                let old: &[(IndexName, Vec<String>)] = old.as_deref().unwrap_or(&[]);
                let kept = |name: &IndexName, v: &String, other: &[(IndexName, Vec<String>)]| {
                    other.iter().any(|(n, vs)| n == name && vs.contains(v))
                };
                for (name, vals) in old {
                    let Some(p) = self.postings.get_mut(name) else { continue };
                    for v in vals.iter().filter(|v| !kept(name, v, &values)) {
                        if let Some(keys) = p.get_mut(v) {
                            keys.remove(&key);
                            if keys.is_empty() {
                                p.remove(v);
                            }
                        }
                    }
                }
                for (name, vals) in &values {
                    let Some(p) = self.postings.get_mut(name) else { continue };
                    for v in vals.iter().filter(|v| !kept(name, v, old)) {
                        p.entry(v.clone()).or_default().insert(key.clone());
                    }
                }
                let gen = self.next_gen;
                self.next_gen += 1;
                let entry = Arc::new(HotEntry {
                    meta: Arc::from(meta),
                    bytes: Some(bytes),
                    values: values.into(),
                    gen,
                    typed: OnceLock::new(),
                });
                self.hold(&key, entry, budget);
            }
            HotOp::Remove(key) => {
                self.unindex(&key);
                if let Some(old) = self.objects.remove(&key) {
                    self.uncharge(&old);
                }
            }
            HotOp::Clear => {
                self.objects.clear();
                for p in self.postings.values_mut() {
                    p.clear();
                }
                self.charged = 0;
                self.queue.clear();
            }
        }
    }

    /// Drops the postings of the version of `key` the tier holds.
    fn unindex(&mut self, key: &ObjectKey) {
        let Some(old) = self.objects.get(key) else { return };
        let values = old.values.clone();
        for (name, vals) in values.iter() {
            let Some(p) = self.postings.get_mut(name) else { continue };
            for v in vals {
                if let Some(keys) = p.get_mut(v) {
                    keys.remove(key);
                    if keys.is_empty() {
                        p.remove(v);
                    }
                }
            }
        }
    }

    fn uncharge(&mut self, e: &HotEntry) {
        if let Some(b) = &e.bytes {
            self.charged = self.charged.saturating_sub(charge(b));
        }
    }

    /// Inserts `entry` (with JSON) for `key`, then evicts the oldest JSON over the budget.
    fn hold(&mut self, key: &ObjectKey, entry: Arc<HotEntry>, budget: usize) {
        if let Some(b) = &entry.bytes {
            self.charged += charge(b);
            self.queue.push_back((key.clone(), entry.gen));
        }
        if let Some(old) = self.objects.insert(key.clone(), entry) {
            self.uncharge(&old);
        }
        self.evict(budget);
    }

    /// Evicts the oldest JSON over the budget, down to the first pinned entry.
    fn evict(&mut self, budget: usize) {
        while self.charged > budget {
            // The queue is in generation order: what follows a pinned entry is pinned too.
            let pinned = self.pinned.unwrap_or(u64::MAX);
            if self.queue.front().is_none_or(|(_, gen)| *gen >= pinned) {
                break;
            }
            let Some((k, gen)) = self.queue.pop_front() else { break };
            let Some(e) = self.objects.get(&k) else { continue };
            if e.gen != gen || e.bytes.is_none() {
                continue;
            }
            let cold = Arc::new(HotEntry {
                meta: e.meta.clone(),
                bytes: None,
                values: e.values.clone(),
                gen,
                typed: OnceLock::new(),
            });
            if let Some(old) = self.objects.insert(k, cold) {
                self.uncharge(&old);
            }
        }
        // Stale tokens (entries replaced since) are dropped now and then, in one pass bounded
        // by the number of objects.
        if self.queue.len() > 2 * self.objects.len() + 1024 {
            let objects = &self.objects;
            self.queue
                .retain(|(k, gen)| objects.get(k).is_some_and(|e| e.gen == *gen && e.bytes.is_some()));
        }
    }
}

type Postings = HashMap<IndexName, BTreeMap<String, BTreeSet<ObjectKey>>>;

/// Every entry of the scope, in key order (namespace lists and selects walk a range) and in a
/// hash table by (namespace, name) (a get probes it with borrowed strings). Both always hold
/// the same entries: every change goes through `insert`, `remove` and `clear`.
#[derive(Default)]
struct Objects {
    ordered: BTreeMap<ObjectKey, Arc<HotEntry>>,
    by_name: HashTable<Arc<HotEntry>>,
    hasher: DefaultHashBuilder,
}

fn name_hash(hasher: &DefaultHashBuilder, namespace: Option<&str>, name: &str) -> u64 {
    let mut h = hasher.build_hasher();
    namespace.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

fn is_named(e: &HotEntry, namespace: Option<&str>, name: &str) -> bool {
    e.meta.name == name && e.meta.namespace.as_deref() == namespace
}

impl Objects {
    fn named(&self, namespace: Option<&str>, name: &str) -> Option<&Arc<HotEntry>> {
        let hash = name_hash(&self.hasher, namespace, name);
        self.by_name.find(hash, |e| is_named(e, namespace, name))
    }

    fn get(&self, key: &ObjectKey) -> Option<&Arc<HotEntry>> {
        self.named(key.namespace.as_deref(), &key.name)
    }

    /// Puts `entry` under `key` (the entry's own namespace and name), returning the one it
    /// replaces.
    fn insert(&mut self, key: ObjectKey, entry: Arc<HotEntry>) -> Option<Arc<HotEntry>> {
        debug_assert!(
            is_named(&entry, key.namespace.as_deref(), &key.name),
            "an entry under another key"
        );
        let (ns, name) = (key.namespace.as_deref(), key.name.as_str());
        let hasher = &self.hasher;
        let rehash = |e: &Arc<HotEntry>| name_hash(hasher, e.meta.namespace.as_deref(), &e.meta.name);
        match self
            .by_name
            .entry(name_hash(hasher, ns, name), |e| is_named(e, ns, name), rehash)
        {
            Entry::Occupied(mut o) => *o.get_mut() = entry.clone(),
            Entry::Vacant(v) => {
                v.insert(entry.clone());
            }
        }
        let old = self.ordered.insert(key, entry);
        debug_assert_eq!(self.ordered.len(), self.by_name.len());
        old
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<HotEntry>> {
        let (ns, name) = (key.namespace.as_deref(), key.name.as_str());
        let hash = name_hash(&self.hasher, ns, name);
        if let Ok(o) = self.by_name.find_entry(hash, |e| is_named(e, ns, name)) {
            o.remove();
        }
        let old = self.ordered.remove(key);
        debug_assert_eq!(self.ordered.len(), self.by_name.len());
        old
    }

    fn clear(&mut self) {
        self.ordered.clear();
        self.by_name.clear();
    }

    fn len(&self) -> usize {
        self.ordered.len()
    }

    fn values(&self) -> impl Iterator<Item = &Arc<HotEntry>> {
        self.ordered.values()
    }

    fn iter(&self) -> std::collections::btree_map::Iter<'_, ObjectKey, Arc<HotEntry>> {
        self.ordered.iter()
    }

    fn range(&self, from: ObjectKey) -> std::collections::btree_map::Range<'_, ObjectKey, Arc<HotEntry>> {
        self.ordered.range(from..)
    }
}

/// Every key, metadata and complete index of the scope in `snapshot` (JSON is left in redb:
/// reads and writes bring it in).
fn build(snapshot: &Snapshot, indexes: &[IndexName]) -> Result<(Objects, Postings, Seq), StoreError> {
    let seq = snapshot.position()?;
    let mut values: HashMap<ObjectKey, Vec<(IndexName, Vec<String>)>> = HashMap::new();
    let mut postings = Postings::new();
    for name in indexes {
        // An index still being backfilled is answered by redb (which refuses until it is done).
        if !matches!(snapshot.index_status(&name.0)?, super::IndexStatus::Ready) {
            continue;
        }
        let mut p: BTreeMap<String, BTreeSet<ObjectKey>> = BTreeMap::new();
        for (value, key) in snapshot.index_rows(name)? {
            let v = values.entry(key.clone()).or_default();
            match v.last_mut() {
                Some((n, vals)) if n == name => vals.push(value.0.clone()),
                _ => v.push((name.clone(), vec![value.0.clone()])),
            }
            p.entry(value.0).or_default().insert(key);
        }
        postings.insert(name.clone(), p);
    }
    let mut objects = Objects::default();
    snapshot.scan(None, |key, meta, _| {
        let entry = HotEntry {
            meta: Arc::new(meta.clone()),
            bytes: None,
            values: values.remove(&key).unwrap_or_default().into(),
            gen: 0,
            typed: OnceLock::new(),
        };
        objects.insert(key, Arc::new(entry));
        Ok(None::<()>)
    })?;
    Ok((objects, postings, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(name: &str, json: &'static [u8]) -> HotOp {
        HotOp::Put {
            meta: Box::new(ObjectMeta {
                namespace: Some("ns".into()),
                name: name.into(),
                ..ObjectMeta::default()
            }),
            bytes: Bytes::from_static(json),
            values: Vec::new(),
        }
    }

    fn with_json(tier: &HotTier) -> Vec<String> {
        let st = tier.read();
        let mut names: Vec<String> = st
            .objects
            .values()
            .filter(|e| e.bytes.is_some())
            .map(|e| e.meta.name.clone())
            .collect();
        names.sort();
        names
    }

    /// JSON of a group not yet committed stays over the budget (redb does not have it yet);
    /// the commit lets the oldest go.
    #[test]
    fn uncommitted_json_is_pinned_until_the_commit() {
        // Each 10-byte object is charged 30: a budget of 40 holds one.
        let tier = HotTier::new(ScopeId(1), 40, Seq(0));
        tier.write().phase = Phase::Ready;
        assert!(tier.apply(vec![put("a", b"0123456789")], Seq(1)));
        tier.confirm(Seq(1));
        assert_eq!(with_json(&tier), ["a"]);
        assert!(tier.apply(vec![put("b", b"0123456789"), put("c", b"0123456789")], Seq(3)));
        // `a` was committed: it goes; `b` and `c` stay though over the budget.
        assert_eq!(with_json(&tier), ["b", "c"]);
        tier.confirm(Seq(3));
        assert_eq!(with_json(&tier), ["c"]);
        assert_eq!(tier.stats().objects, 3, "keys and metadata stay");
    }
}
