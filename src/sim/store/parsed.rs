//! Parsed object versions kept for the controller test harness (`crate::testing`), which reads
//! each one several times.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::Obj;

/// The newest object versions parsed, by revision: the harness reads a version when an
/// informer delivers it, when the collector and the invariants look at it, and when a write
/// answers with it; each is parsed once. An entry holds the serialized bytes it was parsed
/// from, so a revision naming another version (after a restore) is parsed again.
#[derive(Debug, Default)]
pub(crate) struct ParsedVersions {
    by_rv: BTreeMap<u64, (Bytes, Arc<Value>)>,
}

impl ParsedVersions {
    /// Versions kept: the harness reads versions close to the newest revision.
    const KEEP: usize = 4096;

    /// `obj` parsed.
    pub(crate) fn of(&mut self, obj: &Obj) -> Arc<Value> {
        if let Some((full, v)) = self.by_rv.get(&obj.rv) {
            if same_bytes(full, &obj.full) {
                return v.clone();
            }
        }
        let v = Arc::new(obj.value());
        self.remember(obj.rv, obj.full.clone(), v.clone());
        v
    }

    /// The parsed version whose bytes `full` are, among the `newest` kept.
    pub(crate) fn newest_of_bytes(&self, full: &Bytes, newest: usize) -> Option<Arc<Value>> {
        self.by_rv
            .values()
            .rev()
            .take(newest)
            .find(|(b, _)| same_bytes(b, full))
            .map(|(_, v)| v.clone())
    }

    pub(crate) fn remember(&mut self, rv: u64, full: Bytes, v: Arc<Value>) {
        self.by_rv.insert(rv, (full, v));
        if self.by_rv.len() > Self::KEEP {
            self.by_rv.pop_first();
        }
    }
}

/// Whether two `Bytes` are one buffer (a version's bytes are shared, never copied).
fn same_bytes(a: &Bytes, b: &Bytes) -> bool {
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}
