//! Decoded objects shared by every handler of one informer: each log entry's JSON is decoded
//! once, by whichever handler reaches it first, and the others get the same `Arc<K>`.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::object::ObjectError;
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

/// The decoded states of the most recent log entries, for one type `K`.
pub(crate) struct Decoded<K> {
    /// The bytes are kept (a reference, not a copy) to check a hit: a seq names one log entry
    /// for the life of a database, but a database reset for a new cluster starts seqs again.
    entries: Mutex<Entries<K>>,
}

impl<K: DeserializeOwned> Decoded<K> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(BTreeMap::new()),
        }
    }

    /// The entry's state decoded from `bytes`, or the `Arc` another handler decoded before.
    pub(crate) fn get(&self, seq: Seq, side: Side, bytes: &Bytes) -> Result<Arc<K>, ObjectError> {
        if let Some((b, k)) = self.lock().get(&(seq, side)) {
            if b == bytes {
                return Ok(k.clone());
            }
        }
        // Decode outside the lock: two handlers racing may both decode, never block each other.
        let k = Arc::new(serde_json::from_slice::<K>(bytes).map_err(ObjectError::Json)?);
        let mut entries = self.lock();
        let slot = entries.entry((seq, side)).or_insert_with(|| (bytes.clone(), k.clone()));
        if slot.0 != *bytes {
            *slot = (bytes.clone(), k);
        }
        let k = slot.1.clone();
        while entries.len() > WINDOW {
            // The oldest entry: every handler near the head of the log is past it.
            entries.pop_first();
        }
        Ok(k)
    }

    fn lock(&self) -> MutexGuard<'_, Entries<K>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
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
        let mut types = self.types.lock().unwrap_or_else(PoisonError::into_inner);
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
        let a = d.get(Seq(1), Side::New, &b(r#"{"v":1}"#)).unwrap();
        let again = d.get(Seq(1), Side::New, &b(r#"{"v":1}"#)).unwrap();
        assert!(Arc::ptr_eq(&a, &again), "a hit returns the same Arc");
        let old = d.get(Seq(1), Side::Old, &b(r#"{"v":0}"#)).unwrap();
        assert_eq!(old["v"], 0, "the old state is its own entry");
        assert!(d.get(Seq(2), Side::New, &b("nope")).is_err());
    }

    #[test]
    fn other_bytes_under_a_seq_are_decoded_afresh() {
        // A database reset for another cluster starts seqs again.
        let d: Decoded<serde_json::Value> = Decoded::new();
        d.get(Seq(1), Side::New, &b(r#"{"v":1}"#)).unwrap();
        let after_reset = d.get(Seq(1), Side::New, &b(r#"{"v":2}"#)).unwrap();
        assert_eq!(after_reset["v"], 2);
        assert_eq!(d.get(Seq(1), Side::New, &b(r#"{"v":2}"#)).unwrap()["v"], 2);
    }

    #[test]
    fn the_window_drops_the_oldest_entries() {
        let d: Decoded<serde_json::Value> = Decoded::new();
        for i in 0..(WINDOW as u64 + 10) {
            d.get(Seq(i), Side::New, &b(r#"{"v":1}"#)).unwrap();
        }
        assert_eq!(d.lock().len(), WINDOW);
        assert!(!d.lock().contains_key(&(Seq(0), Side::New)));
        assert!(d.lock().contains_key(&(Seq(WINDOW as u64 + 9), Side::New)));
    }

    #[test]
    fn each_type_has_its_own_window() {
        let by_type = DecodedByType::default();
        let first = by_type.of::<serde_json::Value>();
        let second = by_type.of::<serde_json::Value>();
        assert!(Arc::ptr_eq(&first, &second));
        let typed = by_type.of::<std::collections::BTreeMap<String, i64>>();
        let v = typed.get(Seq(1), Side::New, &b(r#"{"v":1}"#)).unwrap();
        assert_eq!(v.get("v"), Some(&1));
    }
}
