//! The cache's table: every object of the scope by key (ordered for namespace scans, hashed by
//! borrowed namespace and name for gets), the postings of the indexes it serves, and what it
//! charges: its own cap on the objects' JSON and decoded forms, and the store's
//! [`MemoryBudget`] shared with every other informer's cache, which also counts the keys,
//! metadata and postings (always held).
//!
//! The always-held part is what every object costs whatever the budget, so it is kept small:
//! the key is the one in the entry's metadata (the ordered set and the hash table order and
//! hash the entries by it), an object's postings share one copy of it, and objects with the
//! same index values (the same labels in one namespace) share one copy of them.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as Atomic};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use hashbrown::hash_table::{Entry as Slot, HashTable};
use hashbrown::DefaultHashBuilder;
use serde::de::DeserializeOwned;

use super::interned::{Interned, Values};
use crate::object::{ObjectKey, ObjectMeta};
use crate::store::memory::{meta_bytes, string, ALLOC, NODE, RETAINED};
use crate::store::{CodecError, IndexName, MemoryBudget, Packed, Seq};

/// Decoded bytes per byte of JSON a table assumes until it measured a decode of its own type:
/// about what a `ConfigMap` takes (`benches/memory.rs` measures one).
const FIRST_RATIO: f64 = 3.0;
/// A table measures the decoded size of its first object's JSON, then one in this many.
const SAMPLE_EVERY: u64 = 1024;

/// Estimates a decoded object's heap bytes from its JSON (`None`: it does not decode).
pub(crate) type Measure = fn(&[u8]) -> Option<usize>;

/// [`Measure`] for `K`.
pub(crate) fn measure<K: DeserializeOwned>(json: &[u8]) -> Option<usize> {
    super::decoded::decode_sized::<K>(json).ok().map(|(_, bytes)| bytes)
}

/// An entry's JSON: as received, or as the store compressed it (what the change stream hands
/// the cache: a fraction of the JSON's size, decompressed by each decode).
#[derive(Clone, Debug)]
pub(crate) enum Json {
    Plain(Bytes),
    Packed(Packed),
}

impl Json {
    /// The JSON's length.
    pub(crate) fn len(&self) -> usize {
        match self {
            Json::Plain(b) => b.len(),
            Json::Packed(p) => p.json_len(),
        }
    }

    /// The bytes held.
    fn held(&self) -> usize {
        match self {
            Json::Plain(b) => b.len(),
            Json::Packed(p) => p.len(),
        }
    }

    /// The JSON itself (decompressed when packed).
    pub(crate) fn bytes(&self) -> Result<Bytes, CodecError> {
        match self {
            Json::Plain(b) => Ok(b.clone()),
            Json::Packed(p) => p.json(),
        }
    }

    /// Whether this is `json`.
    pub(crate) fn is(&self, json: &[u8]) -> bool {
        self.len() == json.len() && self.bytes().is_ok_and(|b| b == json)
    }

    /// The decoded object.
    fn decode<K: DeserializeOwned>(&self) -> Result<K, String> {
        let bytes = self.bytes().map_err(|e| e.to_string())?;
        serde_json::from_slice::<K>(&bytes).map_err(|e| e.to_string())
    }
}

fn key_strings(key: &ObjectKey) -> usize {
    key.namespace.as_deref().map_or(0, string) + string(&key.name)
}

/// What an entry's always-held part costs, by estimate (`benches/memory.rs` compares it with
/// the heap it measures): the entry and its metadata, the slots pointing to it (the ordered
/// set, the hash table) and the set's nodes around them, and for an indexed object its
/// postings and their one copy of its key. Its index values are charged once per distinct
/// set ([`values_cost`]). (An eviction token comes and goes with the object's JSON, whose
/// charge covers it.) On top, what the allocator keeps per object
/// ([`RETAINED`]), since the budget bounds the process's memory, not only its live heap.
fn held<K>(key: &ObjectKey, e: &Entry<K>) -> usize {
    use std::mem::size_of;
    let postings: usize = e
        .values
        .iter()
        .map(|(_, vals)| vals.len() * (size_of::<Arc<ObjectKey>>() + NODE))
        .sum();
    let key = if postings > 0 {
        size_of::<ObjectKey>() + 2 * size_of::<usize>() + ALLOC + key_strings(key)
    } else {
        0
    };
    let entry = size_of::<Entry<K>>() + 2 * size_of::<usize>() + ALLOC;
    let slots = size_of::<Keyed<K>>() + NODE + size_of::<Arc<Entry<K>>>() + NODE / 2;
    entry + meta_bytes(&e.meta) + key + slots + postings + RETAINED
}

/// What one distinct set of index values costs, held once.
fn values_cost(values: &Values) -> usize {
    use std::mem::size_of;
    ALLOC
        + size_of::<Values>()
        + NODE
        + values
            .iter()
            .map(|(n, vals)| {
                size_of::<(IndexName, Vec<String>)>()
                    + string(&n.0)
                    + ALLOC
                    + vals.iter().map(|v| size_of::<String>() + string(v)).sum::<usize>()
            })
            .sum::<usize>()
}

/// One version of one object, as the cache holds it. Never changed once shared: eviction puts
/// a copy without the JSON in its place.
pub(crate) struct Entry<K> {
    pub(crate) meta: Arc<ObjectMeta>,
    /// The index values of this version, to move its postings when it changes.
    pub(crate) values: Arc<[(IndexName, Vec<String>)]>,
    /// The log seq of the change that wrote it (for one loaded from a snapshot, of the entry
    /// holding its bytes; `Seq(0)` once that entry was compacted).
    pub(crate) seq: Seq,
    /// Names this version in the eviction queue.
    gen: u64,
    /// Its JSON and decoded object, unless evicted (boxed: most entries of a large scope have
    /// none, and each would carry the room otherwise).
    data: Option<Box<Data<K>>>,
}

struct Data<K> {
    json: Json,
    /// What the table charged for it (set by the table that first held it, the one that will
    /// uncharge it; the same amount whatever its estimate has become since). 0: not charged
    /// yet, so a charge is at least 1.
    charge: AtomicUsize,
    /// Decoded once, by the first reader (a handler, a lister), for all.
    object: OnceLock<Result<Arc<K>, Arc<str>>>,
    /// A lister or reader read it since eviction last passed it: it gets a second chance
    /// (eviction is a clock over the write order, so a read needs no write lock).
    read: AtomicBool,
}

impl<K> Data<K> {
    fn mark_read(&self) {
        // A load first: readers of a hot entry do not keep writing its cache line.
        if !self.read.load(Atomic::Relaxed) {
            self.read.store(true, Atomic::Relaxed);
        }
    }
}

impl<K> Entry<K> {
    pub(crate) fn new(
        meta: Arc<ObjectMeta>,
        values: Arc<[(IndexName, Vec<String>)]>,
        seq: Seq,
        json: Option<Json>,
    ) -> Self {
        Self {
            meta,
            values,
            seq,
            gen: 0,
            data: json.map(|json| {
                Box::new(Data {
                    json,
                    charge: AtomicUsize::new(0),
                    object: OnceLock::new(),
                    read: AtomicBool::new(false),
                })
            }),
        }
    }

    /// The JSON, unless evicted.
    pub(crate) fn json(&self) -> Option<&Json> {
        self.data.as_ref().map(|d| &d.json)
    }

    /// Whether it holds its JSON (else it was evicted, or never held).
    pub(crate) fn has_json(&self) -> bool {
        self.data.is_some()
    }

    /// What the table charged for its JSON and decoded form (`None`: it holds none).
    #[cfg(test)]
    pub(crate) fn charged(&self) -> Option<usize> {
        self.data.as_ref().map(|d| d.charge.load(Atomic::Relaxed))
    }

    /// Whether `other` is the same version of the same object (same UID and resourceVersion).
    pub(crate) fn same_version(&self, other: &Entry<K>) -> bool {
        self.meta.resource_version == other.meta.resource_version && self.meta.uid == other.meta.uid
    }

    /// Whether `other` is the same object (not one deleted and created again under its name).
    pub(crate) fn same_object(&self, other: &Entry<K>) -> bool {
        self.meta.uid == other.meta.uid
    }
}

impl<K> Entry<K> {
    /// The decoded object, when a reader decoded it already (never decodes); for a lister or
    /// reader, so it counts as read (see [`read`](Self::read)).
    pub(crate) fn decoded(&self) -> Option<&Arc<K>> {
        let d = self.data.as_ref()?;
        let k = d.object.get()?.as_ref().ok()?;
        d.mark_read();
        Some(k)
    }

    /// Whether a lister or reader read it since eviction last gave it a second chance
    /// (tests).
    #[cfg(test)]
    pub(crate) fn was_read(&self) -> bool {
        self.data.as_ref().is_some_and(|d| d.read.load(Atomic::Relaxed))
    }
}

impl<K: DeserializeOwned> Entry<K> {
    /// The decoded object (decoded now if no reader did yet); `None` when evicted.
    pub(crate) fn object(&self) -> Option<Result<Arc<K>, Arc<str>>> {
        let d = self.data.as_ref()?;
        Some(
            d.object
                .get_or_init(|| d.json.decode::<K>().map(Arc::new).map_err(Arc::from))
                .clone(),
        )
    }

    /// [`object`](Self::object) for a lister or reader: the entry counts as read, so eviction
    /// passes over it once (handlers' decoding does not count: every change is decoded for
    /// them, which would say nothing of what is read again).
    pub(crate) fn read(&self) -> Option<Result<Arc<K>, Arc<str>>> {
        let k = self.object()?;
        if let Some(d) = &self.data {
            d.mark_read();
        }
        Some(k)
    }
}

pub(crate) type Postings = HashMap<IndexName, BTreeMap<String, BTreeSet<Arc<ObjectKey>>>>;

/// A key as the ordered set compares it, whatever holds it: namespace (none first), then name,
/// as [`ObjectKey`] orders.
trait KeyView {
    fn namespace(&self) -> Option<&str>;
    fn name(&self) -> &str;
}

impl KeyView for ObjectKey {
    fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// An entry in the ordered set: it is ordered by the key in its own metadata.
struct Keyed<K>(Arc<Entry<K>>);

impl<K> KeyView for Keyed<K> {
    fn namespace(&self) -> Option<&str> {
        self.0.meta.namespace.as_deref()
    }

    fn name(&self) -> &str {
        &self.0.meta.name
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for dyn KeyView + '_ {}

impl PartialOrd for dyn KeyView + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn KeyView + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.namespace(), self.name()).cmp(&(other.namespace(), other.name()))
    }
}

impl<K> PartialEq for Keyed<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<K> Eq for Keyed<K> {}

impl<K> PartialOrd for Keyed<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Keyed<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self as &dyn KeyView).cmp(other as &dyn KeyView)
    }
}

/// Looks entries up by any key, in the set's order.
impl<'a, K: 'a> Borrow<dyn KeyView + 'a> for Keyed<K> {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

/// The table; see the module documentation.
pub(crate) struct Objects<K> {
    ordered: BTreeSet<Keyed<K>>,
    by_name: HashTable<Arc<Entry<K>>>,
    hasher: DefaultHashBuilder,
    /// Index name → value → keys, for the indexes the cache serves.
    postings: Postings,
    /// JSON held, as charged against the cap (and the shared budget).
    charged: usize,
    /// Entries holding JSON (counted as charged: `stats()` must not walk the table under
    /// its lock).
    with_json: usize,
    /// The bytes that hold their JSON (the stored blob's where the store compressed it).
    json_bytes: usize,
    /// The always-held part, as charged against the shared budget.
    held: usize,
    /// The store's budget shared by every informer's cache (`None`: a table of its own).
    memory: Option<Arc<MemoryBudget>>,
    /// Entries holding JSON, oldest first (an entry replaced since leaves a stale token).
    queue: VecDeque<(ObjectKey, u64)>,
    /// Entries whose JSON is held only until their change is on disk, in the order applied
    /// (see [`mark_transient`](Self::mark_transient)).
    transient: VecDeque<(ObjectKey, u64)>,
    next_gen: u64,
    /// The distinct sets of index values the entries share, each charged once.
    values: Interned,
    values_held: usize,
    /// Decoded bytes per byte of JSON, as last measured (see [`charge`](Self::charge)).
    ratio: f64,
    /// How the table measures a decode of its type (`None`: [`FIRST_RATIO`] throughout).
    measure: Option<Measure>,
    /// Entries charged since the table was made, to measure one in [`SAMPLE_EVERY`].
    priced: u64,
    /// The keys read back lately, for a full table's admission.
    doorkeeper: Doorkeeper,
}

/// Which keys were read back lately, two bits per key (TinyLFU's doorkeeper, a Bloom filter):
/// a full table takes in only an object read back a second time, so one-off reads (a scan,
/// a list of everything) neither push out what is read again nor churn the allocator for
/// nothing. Cleared once a quarter of its bits are set (about 16,000 keys: "lately"; a key
/// not read back is taken for one about one time in sixteen then). 16 KiB, allocated at the
/// first read back into a full table.
#[derive(Default)]
struct Doorkeeper {
    bits: Vec<u64>,
    set: usize,
}

impl Doorkeeper {
    const BITS: usize = 1 << 17;

    /// Whether `hash` was seen since the last clearing; remembers it.
    fn seen(&mut self, hash: u64) -> bool {
        if self.bits.is_empty() {
            self.bits = vec![0; Self::BITS / 64];
        }
        let mut seen = true;
        for i in [hash as usize, (hash >> 32) as usize].map(|i| i & (Self::BITS - 1)) {
            let (word, bit) = (i / 64, 1u64 << (i % 64));
            if self.bits[word] & bit == 0 {
                self.bits[word] |= bit;
                self.set += 1;
                seen = false;
            }
        }
        if self.set >= Self::BITS / 4 {
            self.bits.fill(0);
            self.set = 0;
        }
        seen
    }
}

fn name_hash(hasher: &DefaultHashBuilder, namespace: Option<&str>, name: &str) -> u64 {
    let mut h = hasher.build_hasher();
    namespace.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

fn is_named<K>(e: &Entry<K>, namespace: Option<&str>, name: &str) -> bool {
    e.meta.name == name && e.meta.namespace.as_deref() == namespace
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Self {
            ordered: BTreeSet::new(),
            by_name: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            postings: Postings::new(),
            charged: 0,
            with_json: 0,
            json_bytes: 0,
            held: 0,
            memory: None,
            queue: VecDeque::new(),
            transient: VecDeque::new(),
            next_gen: 0,
            values: Interned::default(),
            values_held: 0,
            ratio: FIRST_RATIO,
            measure: None,
            priced: 0,
            doorkeeper: Doorkeeper::default(),
        }
    }
}

impl<K> Objects<K> {
    /// An empty table serving `indexes`.
    pub(crate) fn with_indexes(indexes: &[IndexName]) -> Self {
        let mut t = Self::default();
        for name in indexes {
            t.postings.insert(name.clone(), BTreeMap::new());
        }
        t
    }

    /// Estimates decoded sizes with `measure` (its type's), from the next object charged on.
    pub(crate) fn measure_with(&mut self, measure: Measure) {
        self.measure = Some(measure);
        self.priced = 0;
    }

    /// What `json` costs against the cap and the budget: what holds it (the JSON, or the
    /// store's compressed blob of it) and its decoded form, at the table's measured ratio of
    /// decoded bytes to JSON bytes (a decoded k8s-openapi `Pod` is about eight times its JSON,
    /// a `ConfigMap` two and a half: the charge must follow the type). The first object and
    /// one in [`SAMPLE_EVERY`] are decoded to measure it.
    fn charge(&mut self, json: &Json) -> usize {
        if let Some(measure) = self.measure {
            if self.priced.is_multiple_of(SAMPLE_EVERY) && json.len() > 0 {
                if let Some(bytes) = json.bytes().ok().and_then(|b| measure(&b)) {
                    let sample = bytes as f64 / json.len() as f64;
                    self.ratio = if self.priced == 0 {
                        sample
                    } else {
                        self.ratio + (sample - self.ratio) / 8.0
                    };
                }
            }
            self.priced += 1;
        }
        self.estimate(json)
    }

    /// What [`charge`](Self::charge) would give `json` now, without measuring.
    fn estimate(&self, json: &Json) -> usize {
        json.held().saturating_add((json.len() as f64 * self.ratio) as usize)
    }

    /// Charges this table, from now on, against the store's shared `memory` budget.
    pub(crate) fn attach(&mut self, memory: Arc<MemoryBudget>) {
        if let Some(old) = self.memory.take() {
            old.uncharge(self.held, true);
            old.uncharge(self.charged, false);
        }
        memory.charge(self.held, true);
        memory.charge(self.charged, false);
        self.memory = Some(memory);
    }

    /// The entry named `name` in `namespace` (`None`: cluster-scoped): one hash probe with
    /// borrowed strings.
    pub(crate) fn named(&self, namespace: Option<&str>, name: &str) -> Option<&Arc<Entry<K>>> {
        let hash = name_hash(&self.hasher, namespace, name);
        self.by_name.find(hash, |e| is_named(e, namespace, name))
    }

    pub(crate) fn get(&self, key: &ObjectKey) -> Option<&Arc<Entry<K>>> {
        self.named(key.namespace.as_deref(), &key.name)
    }

    pub(crate) fn len(&self) -> usize {
        self.ordered.len()
    }

    pub(crate) fn charged(&self) -> usize {
        self.charged
    }

    /// The always-held part's estimated bytes (keys, metadata, postings).
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    pub(crate) fn with_json(&self) -> usize {
        self.with_json
    }

    pub(crate) fn json_bytes(&self) -> usize {
        self.json_bytes
    }

    /// Every entry, in key order (its key is its metadata's).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Entry<K>>> {
        self.ordered.iter().map(|k| &k.0)
    }

    /// The entries of one namespace (`Some("")`: cluster-scoped objects) or of the whole
    /// scope, in key order, that `keep` accepts.
    pub(crate) fn select(
        &self,
        namespace: Option<&str>,
        mut keep: impl FnMut(&ObjectMeta) -> bool,
    ) -> Vec<Arc<Entry<K>>> {
        self.scan(namespace).filter(|e| keep(&e.meta)).cloned().collect()
    }

    /// The entries of one namespace (`Some("")`: cluster-scoped objects) or of the whole
    /// scope, in key order. A namespace is one range of the ordered set, bounded at both ends,
    /// so no entry's key is compared on the way.
    pub(crate) fn scan<'a>(&'a self, namespace: Option<&str>) -> Box<dyn Iterator<Item = &'a Arc<Entry<K>>> + 'a> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let Some(ns) = namespace else {
            return Box::new(self.iter());
        };
        // Cluster-scoped keys (no namespace) sort first, before the least namespaced key
        // ("", ""); every key of `ns` sorts before `ns` followed by the least character.
        let from = (!ns.is_empty()).then(|| ObjectKey::namespaced(ns, ""));
        let to = if ns.is_empty() {
            ObjectKey::namespaced("", "")
        } else {
            ObjectKey::namespaced(format!("{ns}\0"), "")
        };
        let lower: std::ops::Bound<&dyn KeyView> = match &from {
            Some(k) => Included(k),
            None => Unbounded,
        };
        let upper: std::ops::Bound<&dyn KeyView> = Excluded(&to);
        let range = self.ordered.range::<dyn KeyView + '_, _>((lower, upper));
        Box::new(range.map(|k| &k.0))
    }

    /// The entries indexed under `value`, or `None` when the cache does not serve this index.
    pub(crate) fn by_index(&self, index: &str, value: &str) -> Option<Vec<Arc<Entry<K>>>> {
        let postings = self.postings.get(&IndexName(index.to_owned()))?;
        Some(
            postings
                .get(value)
                .into_iter()
                .flatten()
                .filter_map(|k| self.get(k).cloned())
                .collect(),
        )
    }

    /// Makes `key` hold `entry` (or nothing), moving its postings and charges; returns what it
    /// held before.
    pub(crate) fn put(&mut self, key: &ObjectKey, mut entry: Option<Arc<Entry<K>>>) -> Option<Arc<Entry<K>>> {
        let old = self.get(key).cloned();
        if let Some(e) = entry.as_mut() {
            self.intern(e);
        }
        // Only the values that changed move: an update rarely changes its labels.
        let none: Arc<[(IndexName, Vec<String>)]> = Arc::from(Vec::new());
        let before = old.as_ref().map_or_else(|| none.clone(), |e| e.values.clone());
        let after = entry.as_ref().map_or(none, |e| e.values.clone());
        let holds = |set: &[(IndexName, Vec<String>)], name: &IndexName, v: &String| {
            set.iter().any(|(n, vs)| n == name && vs.contains(v))
        };
        for (name, vals) in before.iter() {
            let Some(p) = self.postings.get_mut(name) else { continue };
            for v in vals.iter().filter(|v| !holds(&after, name, v)) {
                if let Some(keys) = p.get_mut(v) {
                    keys.remove(key);
                    if keys.is_empty() {
                        p.remove(v);
                    }
                }
            }
        }
        // The object's postings share one copy of its key: the one its other postings hold.
        let mut shared: Option<Arc<ObjectKey>> = None;
        for (name, vals) in after.iter() {
            let Some(p) = self.postings.get(name) else { continue };
            if let Some(k) = vals.iter().find_map(|v| p.get(v)?.get(key)) {
                shared = Some(k.clone());
                break;
            }
        }
        for (name, vals) in after.iter() {
            let Some(p) = self.postings.get_mut(name) else { continue };
            for v in vals.iter().filter(|v| !holds(&before, name, v)) {
                let k = shared.get_or_insert_with(|| Arc::new(key.clone())).clone();
                p.entry(v.clone()).or_default().insert(k);
            }
        }
        if let Some(old) = &old {
            self.uncharge(old);
            let h = held(key, old);
            self.held = self.held.saturating_sub(h);
            if let Some(m) = &self.memory {
                m.uncharge(h, true);
            }
        }
        match entry {
            Some(mut entry) => {
                let h = held(key, &entry);
                self.held += h;
                if let Some(m) = &self.memory {
                    m.charge(h, true);
                }
                debug_assert!(
                    is_named(&entry, key.namespace.as_deref(), &key.name),
                    "an entry under another key"
                );
                let priced = entry
                    .data
                    .as_ref()
                    .map(|d| (d.charge.load(Atomic::Relaxed), d.json.clone()));
                if let Some((charged, json)) = priced {
                    // Charged once, by the first table to hold it; put back (a rollback's),
                    // the same amount again.
                    let cost = match charged {
                        0 => {
                            let cost = self.charge(&json).max(1);
                            if let Some(d) = &entry.data {
                                d.charge.store(cost, Atomic::Relaxed);
                            }
                            cost
                        }
                        cost => cost,
                    };
                    self.json_bytes += json.held();
                    // A new entry takes a new generation; one put back (a rollback's) keeps its.
                    let gen = self.next_gen;
                    self.next_gen += 1;
                    if let Some(e) = Arc::get_mut(&mut entry) {
                        e.gen = gen;
                    }
                    self.charged += cost;
                    self.with_json += 1;
                    if let Some(m) = &self.memory {
                        m.charge(cost, false);
                    }
                    self.queue.push_back((key.clone(), entry.gen));
                }
                self.insert(entry);
            }
            None => {
                self.remove(key);
            }
        }
        old
    }

    /// Makes `entry` share the table's copy of its index values (an entry held elsewhere
    /// already keeps the copy it has, which the table then holds too).
    fn intern(&mut self, entry: &mut Arc<Entry<K>>) {
        let hash = self.values.hash(&entry.values);
        if let Some(held) = self.values.get(hash, &entry.values) {
            if !Arc::ptr_eq(held, &entry.values) {
                if let Some(e) = Arc::get_mut(entry) {
                    e.values = held.clone();
                }
            }
            return;
        }
        let cost = values_cost(&entry.values);
        let freed = self.values.insert(hash, entry.values.clone(), values_cost);
        self.values_held = self.values_held + cost - freed;
        self.held = self.held + cost - freed;
        if let Some(m) = &self.memory {
            m.charge(cost, true);
            m.uncharge(freed, true);
        }
    }

    fn uncharge(&mut self, e: &Entry<K>) {
        if let Some(d) = &e.data {
            let cost = d.charge.load(Atomic::Relaxed);
            self.charged = self.charged.saturating_sub(cost);
            self.with_json = self.with_json.saturating_sub(1);
            self.json_bytes = self.json_bytes.saturating_sub(d.json.held());
            if let Some(m) = &self.memory {
                m.uncharge(cost, false);
            }
        }
    }

    /// Whether the shared budget is over, for a table `cap` does not exempt.
    fn pressed(&self, cap: usize) -> bool {
        self.pressed_for(0, cap)
    }

    /// Whether `need` more bytes would put the shared budget over, for a table `cap` does
    /// not exempt.
    fn pressed_for(&self, need: usize, cap: usize) -> bool {
        cap != usize::MAX && self.memory.as_ref().is_some_and(|m| !m.fits(need))
    }

    /// Drops the JSON (and decoded form) of the oldest entries while this table is over its
    /// `cap` or the shared budget is over, except those written after `committed` (redb does
    /// not have them yet, so they could not be read back). A `cap` of `usize::MAX` (a pinned
    /// cache) evicts nothing. When the shared budget is still over after this table gave all
    /// it could, the other caches of the store are asked to evict theirs.
    pub(crate) fn evict(&mut self, cap: usize, committed: Seq) {
        self.evict_while(cap, committed);
        if self.pressed(cap) {
            if let Some(m) = &self.memory {
                m.press();
            }
        }
    }

    /// [`evict`](Self::evict) for another cache's [press](MemoryBudget::press): never presses
    /// in turn (caches with nothing left to evict would wake each other for ever).
    pub(crate) fn relieve(&mut self, cap: usize, committed: Seq) {
        self.evict_while(cap, committed);
    }

    fn evict_while(&mut self, cap: usize, committed: Seq) {
        self.evict_for(0, cap, committed);
    }

    /// Evicts, oldest first, until `need` more bytes fit the `cap` and the shared budget. An
    /// entry read since eviction last passed it goes to the back of the queue once instead
    /// (a clock: what listers read again stays, what was only written goes first). At most
    /// one pass of second chances: readers marking entries meanwhile cannot keep it going.
    fn evict_for(&mut self, need: usize, cap: usize, committed: Seq) {
        let mut kept = Vec::new();
        let mut chances = self.queue.len();
        while self.charged.saturating_add(need) > cap || self.pressed_for(need, cap) {
            let Some((k, gen)) = self.queue.pop_front() else { break };
            let Some(e) = self.get(&k).cloned() else { continue };
            let Some(d) = e.data.as_ref().filter(|_| e.gen == gen) else {
                continue;
            };
            if e.seq > committed {
                kept.push((k, gen));
                continue;
            }
            if chances > 0 && d.read.swap(false, Atomic::Relaxed) {
                chances -= 1;
                self.queue.push_back((k, gen));
                continue;
            }
            self.make_cold(&e);
        }
        // Not yet committed: evictable later, still the oldest.
        for t in kept.into_iter().rev() {
            self.queue.push_front(t);
        }
        // Stale tokens (entries replaced since) are dropped now and then, in one pass bounded
        // by the number of objects.
        if self.queue.len() > 2 * self.ordered.len() + 1024 {
            let mut queue = std::mem::take(&mut self.queue);
            queue.retain(|(k, gen)| self.get(k).is_some_and(|e| e.gen == *gen && e.data.is_some()));
            self.queue = queue;
        }
    }

    /// Puts a copy of `e` without its JSON in its place.
    fn make_cold(&mut self, e: &Arc<Entry<K>>) {
        let cold = Arc::new(Entry {
            meta: e.meta.clone(),
            values: e.values.clone(),
            seq: e.seq,
            gen: e.gen,
            data: None,
        });
        self.uncharge(e);
        self.insert(cold);
    }

    /// Holds the JSON of the entry `key` holds now only until its change is on disk
    /// ([`drop_transient`](Self::drop_transient)), whatever the budget. Until then a lister
    /// could not read it back: redb may not have it yet.
    pub(crate) fn mark_transient(&mut self, key: &ObjectKey) {
        if let Some(e) = self.get(key).filter(|e| e.data.is_some()) {
            let token = (key.clone(), e.gen);
            self.transient.push_back(token);
        }
        // Tokens of entries replaced since are dropped now and then (nothing may reach the
        // disk for a long while: a store that does not fsync).
        if self.transient.len() > 2 * self.ordered.len() + 1024 {
            let mut transient = std::mem::take(&mut self.transient);
            transient.retain(|(k, gen)| self.get(k).is_some_and(|e| e.gen == *gen && e.data.is_some()));
            self.transient = transient;
        }
    }

    /// Drops the JSON of the entries [marked](Self::mark_transient) whose change is on disk
    /// (`durable`), unless a later put replaced them (a read back keeps its JSON).
    pub(crate) fn drop_transient(&mut self, durable: Seq) {
        while let Some((k, gen)) = self.transient.front().cloned() {
            let Some(e) = self.get(&k).cloned().filter(|e| e.gen == gen && e.data.is_some()) else {
                self.transient.pop_front();
                continue;
            };
            if e.seq > durable {
                // Applied in order: the rest are later still.
                break;
            }
            self.transient.pop_front();
            self.make_cold(&e);
        }
    }

    /// Keeps the JSON of every entry [marked](Self::mark_transient) (someone decodes objects
    /// now), within the budget as any other.
    pub(crate) fn keep_transient(&mut self) {
        self.transient.clear();
    }

    /// Puts the JSON read back from redb into `entry`, if the table still holds that version
    /// and both its `cap` and the shared budget allow (a `cap` of `usize::MAX`: whatever the
    /// shared budget); returns the entry now held.
    pub(crate) fn fill(&mut self, entry: &Arc<Entry<K>>, bytes: Bytes, cap: usize) -> Option<Arc<Entry<K>>> {
        let key = entry.meta.key();
        match self.get(&key) {
            Some(e) if Arc::ptr_eq(e, entry) && e.data.is_none() => {}
            _ => return None,
        }
        let bytes = Json::Plain(bytes);
        let cost = self.estimate(&bytes);
        if self.charged.saturating_add(cost) > cap {
            return None;
        }
        if cap != usize::MAX && self.memory.as_ref().is_some_and(|m| !m.fits(cost)) {
            return None;
        }
        let filled = Arc::new(Entry::new(
            entry.meta.clone(),
            entry.values.clone(),
            entry.seq,
            Some(bytes),
        ));
        // Handed over alone, so `put` can give it its own place in the eviction queue.
        self.put(&key, Some(filled));
        self.get(&key).cloned()
    }

    /// [`fill`](Self::fill) for a lister's read: when the JSON does not fit and the object
    /// was read back lately before ([`Doorkeeper`]), the least recently written or read
    /// entries on disk (`committed`) give way to it, as to a write. Without this, a full
    /// cache would never take in what its readers read again.
    pub(crate) fn fill_making_room(
        &mut self,
        entry: &Arc<Entry<K>>,
        bytes: Bytes,
        cap: usize,
        committed: Seq,
    ) -> Option<Arc<Entry<K>>> {
        let (ns, name) = (entry.meta.namespace.as_deref(), entry.meta.name.as_str());
        match self.named(ns, name) {
            Some(e) if Arc::ptr_eq(e, entry) && e.data.is_none() => {}
            _ => return None,
        }
        let cost = self.estimate(&Json::Plain(bytes.clone()));
        // What would not fit even with this table empty (the rest of the shared budget held
        // by other caches) evicts nothing.
        if cost > cap || self.pressed_for(cost.saturating_sub(self.charged), cap) {
            return None;
        }
        if self.charged.saturating_add(cost) > cap || self.pressed_for(cost, cap) {
            if !self.doorkeeper.seen(name_hash(&self.hasher, ns, name)) {
                return None;
            }
            self.evict_for(cost, cap, committed);
        }
        self.fill(entry, bytes, cap)
    }

    fn insert(&mut self, entry: Arc<Entry<K>>) {
        let (ns, name) = (entry.meta.namespace.as_deref(), entry.meta.name.as_str());
        let hasher = &self.hasher;
        let rehash = |e: &Arc<Entry<K>>| name_hash(hasher, e.meta.namespace.as_deref(), &e.meta.name);
        match self
            .by_name
            .entry(name_hash(hasher, ns, name), |e| is_named(e, ns, name), rehash)
        {
            Slot::Occupied(mut o) => *o.get_mut() = entry.clone(),
            Slot::Vacant(v) => {
                v.insert(entry.clone());
            }
        }
        self.ordered.replace(Keyed(entry));
        debug_assert_eq!(self.ordered.len(), self.by_name.len());
    }

    fn remove(&mut self, key: &ObjectKey) {
        let (ns, name) = (key.namespace.as_deref(), key.name.as_str());
        let hash = name_hash(&self.hasher, ns, name);
        if let Ok(o) = self.by_name.find_entry(hash, |e| is_named(e, ns, name)) {
            o.remove();
        }
        self.ordered.remove(key as &dyn KeyView);
        debug_assert_eq!(self.ordered.len(), self.by_name.len());
    }

    /// Whether postings and charges agree with the entries (tests and debug checks).
    #[cfg(test)]
    pub(crate) fn consistent(&self) -> bool {
        let charged: usize = self
            .iter()
            .filter_map(|e| e.data.as_ref())
            .map(|d| d.charge.load(Atomic::Relaxed))
            .sum();
        let mut want: Postings = self.postings.keys().map(|n| (n.clone(), BTreeMap::new())).collect();
        for e in self.iter() {
            for (name, vals) in e.values.iter() {
                if let Some(p) = want.get_mut(name) {
                    for v in vals {
                        p.entry(v.clone()).or_default().insert(Arc::new(e.meta.key()));
                    }
                }
            }
        }
        // Each object's postings share one copy of its key.
        let mut copies: HashMap<ObjectKey, *const ObjectKey> = HashMap::new();
        let shared = self
            .postings
            .values()
            .flat_map(|p| p.values())
            .flatten()
            .all(|k| *copies.entry((**k).clone()).or_insert(Arc::as_ptr(k)) == Arc::as_ptr(k));
        let values: usize = self.values.iter().map(values_cost).sum();
        let held: usize = self.iter().map(|e| held(&e.meta.key(), e)).sum::<usize>() + values;
        let by_name = self.iter().all(|e| {
            self.named(e.meta.namespace.as_deref(), &e.meta.name)
                .is_some_and(|n| Arc::ptr_eq(n, e))
        });
        charged == self.charged
            && self.iter().filter(|e| e.data.is_some()).count() == self.with_json
            && self
                .iter()
                .filter_map(|e| e.data.as_ref())
                .map(|d| d.json.held())
                .sum::<usize>()
                == self.json_bytes
            && held == self.held
            && want == self.postings
            && shared
            && self.values.consistent()
            && by_name
            && self.ordered.len() == self.by_name.len()
    }
}

impl<K> Drop for Objects<K> {
    fn drop(&mut self) {
        if let Some(m) = &self.memory {
            m.uncharge(self.held, true);
            m.uncharge(self.charged, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, seq: u64, app: &str, json: &'static [u8]) -> Arc<Entry<serde_json::Value>> {
        Arc::new(Entry::new(
            Arc::new(ObjectMeta {
                namespace: Some("ns".into()),
                name: name.into(),
                resource_version: seq.to_string().into(),
                ..ObjectMeta::default()
            }),
            Arc::from(vec![(IndexName("labels".into()), vec![format!("app={app}")])]),
            Seq(seq),
            Some(Json::Plain(Bytes::from_static(json))),
        ))
    }

    #[test]
    fn postings_and_charges_follow_puts_and_evictions() {
        let mut t = Objects::with_indexes(&[IndexName("labels".into())]);
        let k = ObjectKey::namespaced("ns", "a");
        t.put(&k, Some(entry("a", 1, "web", b"0123456789")));
        t.put(
            &ObjectKey::namespaced("ns", "b"),
            Some(entry("b", 2, "web", b"0123456789")),
        );
        assert_eq!(t.by_index("labels", "app=web").map(|v| v.len()), Some(2));
        t.put(&k, Some(entry("a", 3, "db", b"0123456789")));
        assert_eq!(t.by_index("labels", "app=web").map(|v| v.len()), Some(1));
        assert_eq!(t.by_index("labels", "app=db").map(|v| v.len()), Some(1));
        assert!(t.consistent());
        // Over the budget: the oldest committed JSON goes; the uncommitted stays.
        t.evict(40, Seq(2));
        assert_eq!(t.with_json(), 1, "b (seq 2) goes, a (seq 3, not committed) stays");
        assert!(t.get(&ObjectKey::namespaced("ns", "b")).is_some_and(|e| !e.has_json()));
        t.evict(40, Seq(3));
        assert_eq!(t.with_json(), 1);
        t.evict(0, Seq(3));
        assert_eq!(t.with_json(), 0);
        assert!(t.consistent());
        t.put(&k, None);
        assert_eq!(t.by_index("labels", "app=db").map(|v| v.len()), Some(0));
        assert_eq!(t.len(), 1);
        assert!(t.consistent());
    }

    /// Under steady churn (every update a new set of index values, the one before unheld)
    /// the sets no entry holds are swept as the interning tables fill: what they hold stays
    /// bounded, and their charge follows (`consistent` compares it with a walk).
    #[test]
    fn steady_churn_of_index_values_sweeps_the_unheld_sets() {
        let mut t = Objects::with_indexes(&[IndexName("labels".into())]);
        let n = 20_000u64;
        let mut seq = 0;
        for r in 0..6 {
            for i in 0..n {
                seq += 1;
                let name = format!("p{i}");
                t.put(
                    &ObjectKey::namespaced("ns", &name),
                    Some(entry(&name, seq, &format!("r{r}-{i}"), b"{}")),
                );
            }
            let held = t.values.len();
            // At most about twice what is used (a table is swept when it doubles); never
            // sweeping would hold (r + 1) × n.
            assert!(
                held >= n as usize && held <= 5 * n as usize / 2,
                "round {r}: {held} sets held"
            );
        }
        assert!(t.consistent());
    }

    fn sized(name: &str, seq: u64, app: &str, json_len: usize) -> Arc<Entry<serde_json::Value>> {
        Arc::new(Entry::new(
            Arc::new(ObjectMeta {
                namespace: Some("ns".into()),
                name: name.into(),
                resource_version: seq.to_string().into(),
                ..ObjectMeta::default()
            }),
            Arc::from(vec![(IndexName("labels".into()), vec![format!("app={app}")])]),
            Seq(seq),
            Some(Json::Plain(Bytes::from(vec![b' '; json_len]))),
        ))
    }

    /// Namespaces that prefix each other, sort next to each other, or hold characters below
    /// and above the bound's; `None` is cluster-scoped.
    fn namespace() -> impl proptest::strategy::Strategy<Value = Option<String>> {
        use proptest::prelude::*;
        prop_oneof![
            Just(None),
            proptest::sample::select(vec!["", "a", "a-b", "ab", "a\u{1}", "a\0", "b", "kube-system", "é"])
                .prop_map(|s| Some(s.to_owned())),
        ]
    }

    proptest::proptest! {
        /// A namespace's scan is exactly the entries of that namespace, in key order: the
        /// range's bounds stand in for comparing each key.
        #[test]
        fn a_namespace_scan_is_that_namespaces_entries_in_order(
            keys in proptest::collection::vec((namespace(), 0..6u8), 0..60),
            asked in namespace(),
        ) {
            let mut t: Objects<serde_json::Value> = Objects::default();
            for (i, (ns, n)) in keys.iter().enumerate() {
                let key = ObjectKey { namespace: ns.clone(), name: format!("o{n}") };
                let meta = ObjectMeta { namespace: ns.clone(), name: key.name.clone(), ..ObjectMeta::default() };
                t.put(&key, Some(Arc::new(Entry::new(Arc::new(meta), Arc::from(vec![]), Seq(i as u64 + 1), None))));
            }
            // `Some("")` asks for the cluster-scoped objects, as `select` always did.
            let want_ns = asked.as_deref().map(|a| (!a.is_empty()).then_some(a));
            let want: Vec<ObjectKey> = t
                .iter()
                .filter(|e| want_ns.is_none_or(|w| e.meta.namespace.as_deref() == w))
                .map(|e| e.meta.key())
                .collect();
            let got: Vec<ObjectKey> = t.scan(asked.as_deref()).map(|e| e.meta.key()).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A change from the stream into table `t`: key `k`, JSON of `len` bytes (0: a delete).
        Put { t: usize, k: u8, len: usize },
        /// A lister reading back the JSON of a cold entry of table `t`.
        Fill { t: usize, k: u8, len: usize },
        /// The writer commits everything written so far.
        Commit,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..3usize, 0..40u8, 0..400usize).prop_map(|(t, k, len)| Op::Put { t, k, len }),
            2 => (0..3usize, 0..40u8, 1..400usize).prop_map(|(t, k, len)| Op::Fill { t, k, len }),
            1 => Just(Op::Commit),
        ]
    }

    proptest::proptest! {
        /// Three caches share one budget and each has a cap of its own. After every operation
        /// (and the evictions it triggers, as the caches' pumps and tasks run them), the
        /// shared total is exactly what the tables charge, each table within its cap, and the
        /// total within the budget unless all that is left is always-held data and JSON not
        /// yet committed (which cannot be evicted: redb could not give it back).
        #[test]
        fn the_shared_budget_holds_after_every_operation(
            limit in 0usize..20_000,
            caps in proptest::collection::vec(0usize..8_000, 3),
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let memory = Arc::new(MemoryBudget::new(limit));
            let mut pressure = memory.pressure();
            let mut tables: Vec<Objects<serde_json::Value>> = (0..3)
                .map(|_| {
                    let mut t = Objects::with_indexes(&[IndexName("labels".into())]);
                    t.attach(memory.clone());
                    t
                })
                .collect();
            let (mut seq, mut committed) = (0u64, Seq(0));
            for op in ops {
                match op {
                    Op::Put { t, k, len } => {
                        seq += 1;
                        let key = ObjectKey::namespaced("ns", format!("o{k}"));
                        let e = (len > 0).then(|| sized(&format!("o{k}"), seq, &format!("a{}", k % 3), len));
                        tables[t].put(&key, e);
                        tables[t].evict(caps[t], committed);
                    }
                    Op::Fill { t, k, len } => {
                        let key = ObjectKey::namespaced("ns", format!("o{k}"));
                        if let Some(e) = tables[t].get(&key).cloned().filter(|e| !e.has_json()) {
                            tables[t].fill(&e, Bytes::from(vec![b' '; len]), caps[t]);
                        }
                    }
                    Op::Commit => {
                        committed = Seq(seq);
                        for (t, cap) in tables.iter_mut().zip(&caps) {
                            t.evict(*cap, committed);
                        }
                    }
                }
                if pressure.has_changed().unwrap_or(false) {
                    pressure.borrow_and_update();
                    for (t, cap) in tables.iter_mut().zip(&caps) {
                        t.relieve(*cap, committed);
                    }
                }
                let total: usize = tables.iter().map(|t| t.held() + t.charged()).sum();
                proptest::prop_assert_eq!(memory.used(), total);
                for (t, cap) in tables.iter().zip(&caps) {
                    proptest::prop_assert!(t.consistent());
                    let pinned: usize = t
                        .iter()
                        .filter(|e| e.seq > committed)
                        .filter_map(|e| e.charged())
                        .sum();
                    proptest::prop_assert!(t.charged() <= (*cap).max(pinned), "a table over its cap");
                }
                let evictable: usize = tables
                    .iter()
                    .flat_map(|t| t.iter())
                    .filter(|e| e.seq <= committed)
                    .filter_map(|e| e.charged())
                    .sum();
                proptest::prop_assert!(
                    memory.used() <= limit || evictable == 0,
                    "{} charged over a budget of {limit} with {evictable} evictable",
                    memory.used()
                );
            }
            drop(tables);
            proptest::prop_assert_eq!(memory.used(), 0, "dropped tables give everything back");
        }
    }

    #[test]
    fn entries_are_ordered_by_their_own_key_and_selected_by_namespace() {
        let mut t: Objects<serde_json::Value> = Objects::default();
        let keys = [
            ObjectKey::namespaced("b", "x"),
            ObjectKey::cluster("z"),
            ObjectKey::namespaced("a", "y"),
            ObjectKey::namespaced("ab", "a"),
            ObjectKey::namespaced("a", "x"),
            ObjectKey::cluster("c"),
        ];
        for (i, k) in keys.iter().enumerate() {
            let meta = ObjectMeta {
                namespace: k.namespace.clone(),
                name: k.name.clone(),
                resource_version: (i as u64 + 1).to_string().into(),
                ..ObjectMeta::default()
            };
            t.put(
                k,
                Some(Arc::new(Entry::new(
                    Arc::new(meta),
                    Arc::from(Vec::new()),
                    Seq(i as u64 + 1),
                    None,
                ))),
            );
        }
        let names =
            |v: Vec<Arc<Entry<serde_json::Value>>>| v.iter().map(|e| e.meta.key().to_string()).collect::<Vec<_>>();
        let mut sorted = keys.to_vec();
        sorted.sort();
        assert_eq!(
            t.iter().map(|e| e.meta.key()).collect::<Vec<_>>(),
            sorted,
            "the order of ObjectKey"
        );
        assert_eq!(names(t.select(Some("a"), |_| true)), ["a/x", "a/y"]);
        assert_eq!(names(t.select(Some("ab"), |_| true)), ["ab/a"]);
        assert_eq!(names(t.select(Some("aa"), |_| true)), Vec::<String>::new());
        assert_eq!(names(t.select(Some(""), |_| true)), ["c", "z"]);
        assert_eq!(names(t.select(None, |m| m.name == "x")), ["a/x", "b/x"]);
        t.put(&ObjectKey::namespaced("a", "x"), None);
        assert_eq!(names(t.select(Some("a"), |_| true)), ["a/y"]);
        assert!(t.get(&ObjectKey::namespaced("a", "x")).is_none());
        assert_eq!(t.len(), 5);
        assert!(t.consistent());
    }

    /// The always-held charge of a ConfigMap-shaped entry (three labels, one annotation, no
    /// index, no JSON) is about what `benches/memory.rs` measured such an entry costs the
    /// process's memory with glibc (`MALLOC_ARENA_MAX=2`, no JSON kept, redb's cache taken
    /// out): 1.2 to 1.4 KB, of which about 0.5 KB is live heap. Without [`RETAINED`] the charge
    /// is about 0.7 KB.
    #[test]
    fn a_config_map_entry_is_charged_what_the_process_keeps_for_it() {
        let mut t: Objects<serde_json::Value> = Objects::default();
        let n = 100;
        for i in 0..n {
            let meta = ObjectMeta {
                namespace: Some("ns-07".into()),
                name: format!("cm-{i:06}"),
                uid: Some(format!("{i:08}-1f2e-4d3c-8b7a-0123456789ab")),
                resource_version: (100_000 + i).to_string().into(),
                labels: [
                    ("app", format!("app-{}", i % 50)),
                    ("team", format!("team-{}", i % 7)),
                    ("tier", "backend".into()),
                ]
                .into(),
                annotations: [("example.com/owner", format!("owner-{}", i % 13))].into(),
                ..ObjectMeta::default()
            };
            let key = meta.key();
            t.put(
                &key,
                Some(Arc::new(Entry::new(
                    Arc::new(meta),
                    Arc::from(vec![]),
                    Seq(i as u64 + 1),
                    None,
                ))),
            );
        }
        // One distinct (empty) set of index values, charged once.
        let per_object = t.held() / n;
        assert!(per_object >= 1300, "{per_object} B charged per object");
        assert!(per_object < 2000, "{per_object} B charged per object: far over");
    }

    #[test]
    fn an_entry_decodes_once_and_a_cold_one_does_not_decode() {
        let e = entry("a", 1, "web", br#"{"v":1}"#);
        let first = e.object().expect("has JSON").expect("decodes");
        let again = e.object().expect("has JSON").expect("decodes");
        assert!(Arc::ptr_eq(&first, &again));
        let mut t = Objects::default();
        t.put(&ObjectKey::namespaced("ns", "a"), Some(e));
        t.evict(0, Seq(1));
        assert!(t
            .get(&ObjectKey::namespaced("ns", "a"))
            .expect("kept")
            .object()
            .is_none());
    }

    #[test]
    fn the_doorkeeper_remembers_a_key_until_a_quarter_of_its_bits_are_set() {
        let mut d = Doorkeeper::default();
        let key = |k: u64| k | ((k + Doorkeeper::BITS as u64 / 2) << 32);
        assert!(!d.seen(key(7)), "first time");
        assert!(d.seen(key(7)), "second time");
        assert!(!d.seen(7), "one of its bits is another key's only");
        // A quarter of the bits set (7's two included) clears them all.
        let mut k = 8;
        while d.set != 0 {
            assert!(!d.seen(key(k)));
            k += 1;
        }
        assert_eq!(k - 8, (Doorkeeper::BITS as u64 / 4 - 3).div_ceil(2));
        assert!(!d.seen(key(7)), "forgotten after clearing");
    }
}
