//! The distinct sets of index values the cache's entries share, each held once.
//!
//! A label that changes on every update (a timestamp, a generation) adds a set per event, so
//! the table grows and is swept under steady churn while the cache's lock is held and every
//! event waits. One hash table over all of them hashed every set again each time it grew, a
//! stall of tens of milliseconds at 100,000 Pods (docs/benchmarks.md). Here the sets are spread
//! over [`SHARDS`] tables, each grown and swept on its own, so one growth or sweep touches 1/64
//! of them. (Keeping each set's hash would spare even that, at 8 bytes a set.)

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::store::IndexName;

/// The index values of an object: one shared copy per distinct set.
pub(crate) type Values = Arc<[(IndexName, Vec<String>)]>;

/// Tables the sets are spread over: growing or sweeping one touches 1/64 of them.
const SHARDS: usize = 64;

/// Smallest number of sets a table holds before it is swept at all.
const MIN_SWEPT: usize = 8;

/// See the module documentation.
pub(crate) struct Interned {
    hasher: DefaultHashBuilder,
    shards: Box<[Shard]>,
}

#[derive(Default)]
struct Shard {
    table: HashTable<Values>,
    /// Sets held just after this table's last sweep.
    swept: usize,
}

/// Which table a hash goes to: bits hashbrown uses for neither the bucket (the low bits) nor
/// the control byte (the top seven), so each table still gets well-spread hashes.
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

impl Default for Interned {
    fn default() -> Self {
        Self {
            hasher: DefaultHashBuilder::default(),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl Interned {
    /// The hash `values` is held under (computed once per put).
    pub(crate) fn hash(&self, values: &[(IndexName, Vec<String>)]) -> u64 {
        self.hasher.hash_one(values)
    }

    /// The held copy equal to `values`, whose [`hash`](Self::hash) is `hash`.
    pub(crate) fn get(&self, hash: u64, values: &[(IndexName, Vec<String>)]) -> Option<&Values> {
        self.shards[shard_of(hash)].table.find(hash, |v| **v == *values)
    }

    /// Holds `values` (not held yet, its hash `hash`). First sweeps its table when that has
    /// doubled since its last sweep; returns what the sets swept cost (`cost` of each), for
    /// the caller to uncharge.
    pub(crate) fn insert(&mut self, hash: u64, values: Values, cost: impl Fn(&Values) -> usize) -> usize {
        debug_assert!(self.get(hash, &values).is_none(), "a set interned twice");
        let hasher = &self.hasher;
        let shard = &mut self.shards[shard_of(hash)];
        let doubled = shard.table.len() > 2 * shard.swept.max(MIN_SWEPT);
        let freed = if doubled { shard.sweep(&cost) } else { 0 };
        shard.table.insert_unique(hash, values, |v| hasher.hash_one(&**v));
        freed
    }

    /// Sets held (some perhaps no longer used by any entry, until swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.table.len()).sum()
    }

    /// The most sets one table holds.
    #[cfg(test)]
    pub(crate) fn largest_table(&self) -> usize {
        self.shards.iter().map(|s| s.table.len()).max().unwrap_or(0)
    }

    /// Every set held.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Values> {
        self.shards.iter().flat_map(|s| s.table.iter())
    }

    /// Each set is held in its hash's table, once.
    #[cfg(test)]
    pub(crate) fn consistent(&self) -> bool {
        self.shards.iter().enumerate().all(|(i, s)| {
            s.table.iter().all(|v| {
                let h = self.hasher.hash_one(&**v);
                let found = s.table.find(h, |w| **w == **v);
                shard_of(h) == i && found.is_some_and(|w| Arc::ptr_eq(w, v))
            })
        })
    }
}

impl Shard {
    /// Drops the sets no entry holds any more; returns what they cost.
    fn sweep(&mut self, cost: &impl Fn(&Values) -> usize) -> usize {
        let mut freed = 0;
        self.table.retain(|v| {
            let used = Arc::strong_count(v) > 1;
            if !used {
                freed += cost(v);
            }
            used
        });
        self.swept = self.table.len();
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(i: u64) -> Values {
        Arc::from(vec![(IndexName("labels".into()), vec![format!("app=a{i}")])])
    }

    /// The sets spread evenly over the tables (a growth or a sweep does 1/64 of the work), and
    /// a swept table keeps exactly the sets still used.
    #[test]
    fn sets_spread_over_the_tables_and_sweeps_keep_what_is_used() {
        let mut t = Interned::default();
        let n = 50_000u64;
        let mut all = Vec::new();
        for i in 0..n {
            let v = set(i);
            let h = t.hash(&v);
            assert!(t.get(h, &v).is_none());
            assert_eq!(t.insert(h, v.clone(), |_| 1), 0, "every set is still used");
            all.push(v);
        }
        assert_eq!(t.len(), n as usize);
        let avg = n as usize / SHARDS;
        assert!(
            t.largest_table() < 2 * avg,
            "{} in one table, {avg} on average",
            t.largest_table()
        );
        assert!(t.consistent());
        let mut kept: Vec<Values> = all.into_iter().step_by(2).collect();
        // The odd sets are now unused: inserting more sweeps them, table by table.
        let mut freed = 0;
        for i in n..2 * n {
            let v = set(i);
            let h = t.hash(&v);
            freed += t.insert(h, v.clone(), |_| 1);
            kept.push(v);
        }
        assert!(freed > 0 && freed <= n as usize / 2, "freed {freed}");
        assert_eq!(t.len(), kept.len() + (n as usize / 2 - freed));
        for v in &kept {
            assert!(t.get(t.hash(v), v).is_some_and(|held| Arc::ptr_eq(held, v)));
        }
        assert!(t.consistent());
    }
}
