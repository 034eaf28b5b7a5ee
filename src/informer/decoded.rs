//! Decoded objects shared by every handler of one informer: each log entry's JSON is decoded
//! once, by whichever handler reaches it first, and the others get the same `Arc<K>`. The
//! informer's listers read the newest of them too, so a reconcile that reads the object whose
//! event woke it gets the handler's `Arc<K>` instead of decoding it again.

use crate::util::Locked;
use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::object::{ObjectError, ObjectKey};
use crate::store::Seq;

/// How many log entries' decoded states are kept. Handlers usually read the log close behind
/// each other, so a window of recent entries serves them all; a handler far behind decodes for
/// itself, which costs time, not correctness.
const WINDOW: usize = 2048;

/// Which state of a log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Side {
    /// The new state (or a delete's final state).
    New,
    /// The state before an update or delete.
    Old,
}

/// Decoded states by log entry, each with the bytes it was decoded from.
type Entries<K> = BTreeMap<(Seq, Side), (Bytes, Arc<K>)>;

/// The newest decoded state of each key among the entries: the log entry, bytes and object.
type Latest<K> = HashMap<ObjectKey, (Seq, Bytes, Arc<K>)>;

struct State<K> {
    entries: Entries<K>,
    latest: Latest<K>,
    /// `latest`'s insertions in order (a key updated since appears again, later), so that
    /// eviction drops one old object per new one: dropping thousands of decoded objects at
    /// once stalled the dispatcher for tens of milliseconds (p99 of `benches/compare`).
    order: VecDeque<(Seq, ObjectKey)>,
}

/// The decoded states of the most recent log entries, for one type `K`.
pub(crate) struct Decoded<K> {
    /// The bytes are kept (a reference, not a copy) to check a hit: a seq names one log entry
    /// for the life of a database, but a database reset for a new cluster starts seqs again,
    /// and a restored cluster can reuse a resourceVersion for other content.
    state: Mutex<State<K>>,
}

impl<K: DeserializeOwned> Decoded<K> {
    fn new() -> Self {
        Self {
            state: Mutex::new(State {
                entries: BTreeMap::new(),
                latest: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    /// The entry's state decoded from `bytes`, or the `Arc` another handler decoded before.
    /// `current` names the object when this is its state after the entry (an add or an
    /// update), which listers may then serve.
    pub(crate) fn get(
        &self,
        seq: Seq,
        side: Side,
        bytes: &Bytes,
        current: Option<&ObjectKey>,
    ) -> Result<Arc<K>, ObjectError> {
        let hit = match self.lock().entries.get(&(seq, side)) {
            Some((b, k)) if b == bytes => Some(k.clone()),
            _ => None,
        };
        let k = match hit {
            Some(k) => k,
            None => {
                // Decode outside the lock: two handlers racing may both decode, never block
                // each other.
                let k = Arc::new(serde_json::from_slice::<K>(bytes).map_err(ObjectError::Json)?);
                let mut st = self.lock();
                let slot = st
                    .entries
                    .entry((seq, side))
                    .or_insert_with(|| (bytes.clone(), k.clone()));
                if slot.0 != *bytes {
                    *slot = (bytes.clone(), k);
                }
                let k = slot.1.clone();
                while st.entries.len() > WINDOW {
                    // The oldest entry: every handler near the head of the log is past it.
                    st.entries.pop_first();
                }
                k
            }
        };
        if let Some(key) = current {
            self.remember(key, seq, bytes, &k);
        }
        Ok(k)
    }

    fn remember(&self, key: &ObjectKey, seq: Seq, bytes: &Bytes, k: &Arc<K>) {
        let mut st = self.lock();
        match st.latest.get_mut(key) {
            Some(slot) if slot.0 >= seq => return,
            Some(slot) => *slot = (seq, bytes.clone(), k.clone()),
            None => {
                st.latest.insert(key.clone(), (seq, bytes.clone(), k.clone()));
            }
        }
        st.order.push_back((seq, key.clone()));
        // At most WINDOW keys, evicted oldest first, one or two per call.
        while st.latest.len() > WINDOW || st.order.len() > 2 * WINDOW {
            let Some((s, k)) = st.order.pop_front() else { break };
            if st.latest.get(&k).is_some_and(|(at, _, _)| *at == s) {
                st.latest.remove(&k);
            }
        }
        debug_assert!(st.latest.len() <= WINDOW);
    }

    /// The object a handler decoded from exactly `bytes` as the newest state of `key`, if any.
    pub(crate) fn latest(&self, key: &ObjectKey, bytes: &Bytes) -> Option<Arc<K>> {
        match self.lock().latest.get(key) {
            Some((_, b, k)) if b == bytes => Some(k.clone()),
            _ => None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.locked()
    }
}

/// One [`Decoded`] per type: the factory shares an informer's scope between types (a typed
/// and a `DynamicObject` view, say), and each type decodes for itself.
#[derive(Default)]
pub(crate) struct DecodedByType {
    types: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl DecodedByType {
    pub(crate) fn of<K: DeserializeOwned + Send + Sync + 'static>(&self) -> Arc<Decoded<K>> {
        let mut types = self.types.locked();
        let any = types
            .entry(TypeId::of::<K>())
            .or_insert_with(|| Arc::new(Decoded::<K>::new()))
            .clone();
        // The map holds a `Decoded<K>` under `TypeId::of::<K>()` only.
        any.downcast::<Decoded<K>>()
            .unwrap_or_else(|_| unreachable!("a Decoded<K> is stored under K's TypeId"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn one_entry_is_decoded_once_and_shared() {
        let d: Decoded<serde_json::Value> = Decoded::new();
        let a = d.get(Seq(1), Side::New, &b(r#"{"v":1}"#), None).unwrap();
        let again = d.get(Seq(1), Side::New, &b(r#"{"v":1}"#), None).unwrap();
        assert!(Arc::ptr_eq(&a, &again), "a hit returns the same Arc");
        let old = d.get(Seq(1), Side::Old, &b(r#"{"v":0}"#), None).unwrap();
        assert_eq!(old["v"], 0, "the old state is its own entry");
        assert!(d.get(Seq(2), Side::New, &b("nope"), None).is_err());
    }

    #[test]
    fn other_bytes_under_a_seq_are_decoded_afresh() {
        // A database reset for another cluster starts seqs again.
        let d: Decoded<serde_json::Value> = Decoded::new();
        d.get(Seq(1), Side::New, &b(r#"{"v":1}"#), None).unwrap();
        let after_reset = d.get(Seq(1), Side::New, &b(r#"{"v":2}"#), None).unwrap();
        assert_eq!(after_reset["v"], 2);
        assert_eq!(d.get(Seq(1), Side::New, &b(r#"{"v":2}"#), None).unwrap()["v"], 2);
    }

    #[test]
    fn the_window_drops_the_oldest_entries() {
        let d: Decoded<serde_json::Value> = Decoded::new();
        for i in 0..(WINDOW as u64 + 10) {
            d.get(Seq(i), Side::New, &b(r#"{"v":1}"#), None).unwrap();
        }
        assert_eq!(d.lock().entries.len(), WINDOW);
        assert!(!d.lock().entries.contains_key(&(Seq(0), Side::New)));
        assert!(d.lock().entries.contains_key(&(Seq(WINDOW as u64 + 9), Side::New)));
    }

    #[test]
    fn each_type_has_its_own_window() {
        let by_type = DecodedByType::default();
        let first = by_type.of::<serde_json::Value>();
        let second = by_type.of::<serde_json::Value>();
        assert!(Arc::ptr_eq(&first, &second));
        let typed = by_type.of::<std::collections::BTreeMap<String, i64>>();
        let v = typed.get(Seq(1), Side::New, &b(r#"{"v":1}"#), None).unwrap();
        assert_eq!(v.get("v"), Some(&1));
    }

    #[test]
    fn listers_get_the_newest_state_of_a_key_only_for_the_same_bytes() {
        let d: Decoded<serde_json::Value> = Decoded::new();
        let key = ObjectKey::namespaced("ns", "a");
        let v1 = d.get(Seq(1), Side::New, &b(r#"{"v":1}"#), Some(&key)).unwrap();
        assert!(Arc::ptr_eq(&d.latest(&key, &b(r#"{"v":1}"#)).unwrap(), &v1));
        let v2 = d.get(Seq(2), Side::New, &b(r#"{"v":2}"#), Some(&key)).unwrap();
        assert!(
            d.latest(&key, &b(r#"{"v":1}"#)).is_none(),
            "an older state is not served"
        );
        assert!(Arc::ptr_eq(&d.latest(&key, &b(r#"{"v":2}"#)).unwrap(), &v2));
        // A handler far behind decodes an older entry: the newest state stays.
        d.get(Seq(1), Side::New, &b(r#"{"v":1}"#), Some(&key)).unwrap();
        assert!(d.latest(&key, &b(r#"{"v":2}"#)).is_some());
        // Old states (`Side::Old`) and deletes are never a key's current state.
        d.get(Seq(3), Side::Old, &b(r#"{"v":2}"#), None).unwrap();
        assert!(d.latest(&ObjectKey::namespaced("ns", "b"), &b(r#"{"v":2}"#)).is_none());
    }

    #[test]
    fn the_newest_states_stay_bounded() {
        let d: Decoded<serde_json::Value> = Decoded::new();
        for i in 0..(4 * WINDOW as u64) {
            let key = ObjectKey::namespaced("ns", format!("o{i}"));
            d.get(Seq(i), Side::New, &b(r#"{"v":1}"#), Some(&key)).unwrap();
        }
        assert!(d.lock().latest.len() <= WINDOW);
        assert!(d.lock().order.len() <= 2 * WINDOW);
        let newest = ObjectKey::namespaced("ns", format!("o{}", 4 * WINDOW as u64 - 1));
        assert!(d.latest(&newest, &b(r#"{"v":1}"#)).is_some());
    }
}
