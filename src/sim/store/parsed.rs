//! Parsed object versions kept for the controller test harness (`crate::testing`), which reads
//! each one several times.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::Obj;

/// The newest object versions parsed, by revision: the harness reads a version when an
/// informer delivers it, when the collector and the invariants look at it, and when a write
/// answers with it; each is parsed once. An entry holds the serialized bytes it was parsed
/// from, so a revision naming another version (after a restore) is parsed again.
///
/// A ring in revision order: versions arrive almost always newest last, so an insert is a
/// push at the back and the oldest falls off the front (a B-tree allocated per node).
#[derive(Debug)]
pub(crate) struct ParsedVersions {
    by_rv: VecDeque<(u64, Bytes, Arc<Value>)>,
    keep: usize,
}

impl Default for ParsedVersions {
    fn default() -> Self {
        Self::keeping(Self::KEEP)
    }
}

impl ParsedVersions {
    /// Versions kept: the harness reads versions close to the newest revision.
    const KEEP: usize = 4096;

    fn keeping(keep: usize) -> Self {
        Self {
            by_rv: VecDeque::new(),
            keep,
        }
    }

    /// Where revision `rv` is, or would go.
    fn find(&self, rv: u64) -> Result<usize, usize> {
        // The newest first: most lookups are of a version written a moment ago.
        match self.by_rv.back() {
            Some((last, ..)) if *last < rv => Err(self.by_rv.len()),
            Some((last, ..)) if *last == rv => Ok(self.by_rv.len() - 1),
            _ => self.by_rv.binary_search_by_key(&rv, |(r, ..)| *r),
        }
    }

    /// `obj` parsed.
    pub(crate) fn of(&mut self, obj: &Obj) -> Arc<Value> {
        if let Some(v) = self.kept(obj) {
            return v;
        }
        let v = Arc::new(obj.value());
        self.remember(obj.rv, obj.full.clone(), v.clone());
        v
    }

    /// `obj` parsed, when it is kept (nothing is parsed or evicted).
    pub(crate) fn kept(&self, obj: &Obj) -> Option<Arc<Value>> {
        self.get(obj.rv, &obj.full)
    }

    fn get(&self, rv: u64, bytes: &Bytes) -> Option<Arc<Value>> {
        let i = self.find(rv).ok()?;
        let (_, full, v) = &self.by_rv[i];
        same_bytes(full, bytes).then(|| v.clone())
    }

    /// The parsed version whose bytes `full` are, among the `newest` kept.
    pub(crate) fn newest_of_bytes(&self, full: &Bytes, newest: usize) -> Option<Arc<Value>> {
        self.by_rv
            .iter()
            .rev()
            .take(newest)
            .find(|(_, b, _)| same_bytes(b, full))
            .map(|(.., v)| v.clone())
    }

    pub(crate) fn remember(&mut self, rv: u64, full: Bytes, v: Arc<Value>) {
        match self.find(rv) {
            Ok(i) => self.by_rv[i] = (rv, full, v),
            Err(i) => self.by_rv.insert(i, (rv, full, v)),
        }
        if self.by_rv.len() > self.keep {
            self.by_rv.pop_front();
        }
        debug_assert!(self.by_rv.len() < 2 || self.by_rv[self.by_rv.len() - 2].0 < self.by_rv[self.by_rv.len() - 1].0);
    }
}

/// Whether two `Bytes` are one buffer (a version's bytes are shared, never copied).
fn same_bytes(a: &Bytes, b: &Bytes) -> bool {
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// The ring keeps what a map by revision keeping the newest `keep` would keep.
        #[test]
        fn keeps_what_a_map_by_revision_keeps(
            keep in 1usize..8,
            ops in proptest::collection::vec((0u64..40, any::<bool>()), 0..120),
        ) {
            let mut ring = ParsedVersions::keeping(keep);
            let mut model: BTreeMap<u64, (Bytes, Arc<Value>)> = BTreeMap::new();
            for (step, (rv, newest)) in ops.into_iter().enumerate() {
                // Mostly newer revisions, as a server writes them; sometimes an older one.
                let rv = if newest { model.keys().next_back().map_or(rv, |m| m + 1 + rv % 3) } else { rv };
                let full = Bytes::from(format!("v{step}"));
                let v = Arc::new(Value::from(step));
                ring.remember(rv, full.clone(), v.clone());
                model.insert(rv, (full, v));
                if model.len() > keep {
                    model.pop_first();
                }
                let got: Vec<u64> = ring.by_rv.iter().map(|(r, ..)| *r).collect();
                let want: Vec<u64> = model.keys().copied().collect();
                prop_assert_eq!(got, want);
                for (r, (b, v)) in &model {
                    prop_assert_eq!(ring.get(*r, b), Some(v.clone()));
                    // Another buffer with the same revision is another version.
                    prop_assert_eq!(ring.get(*r, &Bytes::from(b.to_vec())), None);
                }
                let newest_bytes = model.values().next_back().map(|(b, _)| b.clone());
                if let Some(b) = newest_bytes {
                    prop_assert!(ring.newest_of_bytes(&b, 1).is_some());
                }
            }
        }
    }
}
