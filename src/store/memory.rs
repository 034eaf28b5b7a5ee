//! The memory budget of one [`DurableStore`](super::DurableStore)
//! ([`StoreConfig::memory_budget`](super::StoreConfig::memory_budget)): one bound for what the
//! crate holds in a process, however many informers share the store.
//!
//! It is made of five parts, each charged as it is allocated and given back as it is freed:
//!
//! * **redb's page cache**, carved out once at open (its size is fixed);
//! * **always held** by the informers' caches: every key, metadata and index posting;
//! * **object JSON** the caches keep, with its decoded form (evictable);
//! * **the change stream**: changes published and not yet read by every cache, bounded by
//!   [`stream_bound`](MemoryBudget::stream_bound) (past it the writer drops the JSON of
//!   committed changes, which readers then read back from redb);
//! * **syncs in flight**: list pages fetched and not yet committed, admitted through a gate of
//!   [`sync_bound`](MemoryBudget::sync_bound) bytes shared by every reflector.
//!
//! Only the caches' JSON gives way: when the total is over the limit, the cache that took it
//! over evicts its own least recently written or read objects; when it has nothing left to
//! evict it raises [`pressure`](MemoryBudget::pressure), and every other cache of the store
//! evicts its own. When the parts that cannot give way leave no room (the always-held part is
//! larger than the budget less the fixed parts), the store says so once in a warning and in
//! `durable_informer_memory_budget_exceeded`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::object::ObjectMeta;

/// What the allocator takes per allocation beyond the bytes asked for (glibc: an 8-byte header,
/// rounded to 16).
pub(crate) const ALLOC: usize = 24;
/// What the allocator keeps per object the informers' caches hold, beyond [`ALLOC`] on each
/// of its allocations: the free memory a sync's short-lived allocations (list pages, decoded
/// heads, the stream's changes) leave between the entries' long-lived ones, which it cannot
/// give back, and the rounding of small allocations past `ALLOC`. It grows with the objects
/// held, evicted or not (`benches/memory.rs` reports it; docs/deploying.md has the figures).
pub(crate) const RETAINED: usize = 640;
/// A map node's share per element beyond the element itself (B-tree nodes are about
/// two-thirds full).
pub(crate) const NODE: usize = 16;

/// A heap string's cost.
pub(crate) fn string(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        s.len() + ALLOC
    }
}

/// What an [`ObjectMeta`] costs on the heap, by estimate (`benches/memory.rs` compares the
/// always-held part with the heap it measures).
pub(crate) fn meta_bytes(m: &ObjectMeta) -> usize {
    use std::mem::size_of;
    // Two allocations a non-empty map: its text and where each string ends.
    let pairs = |map: &crate::object::StringMap| {
        let (text, ends) = map.heap_bytes();
        [text, ends]
            .iter()
            .map(|&b| if b == 0 { 0 } else { b + ALLOC })
            .sum::<usize>()
    };
    let owners: usize = m
        .owner_references
        .iter()
        .map(|o| {
            size_of::<crate::object::OwnerReference>()
                + string(&o.api_version)
                + string(&o.kind)
                + string(&o.name)
                + string(&o.uid)
        })
        .sum::<usize>()
        + if m.owner_references.is_empty() { 0 } else { ALLOC };
    size_of::<ObjectMeta>()
        + ALLOC
        + m.namespace.as_deref().map_or(0, string)
        + string(&m.name)
        + m.uid.as_deref().map_or(0, string)
        + string(&m.resource_version.0)
        + m.deletion_timestamp.as_deref().map_or(0, string)
        + pairs(&m.labels)
        + pairs(&m.annotations)
        + owners
}

/// The least a bounded part (stream, syncs in flight) gets, whatever the budget.
const MIN_PART: usize = 4 << 20;
/// The most a bounded part gets: beyond it more room buys nothing measurable.
const MAX_PART: usize = 32 << 20;
/// How long a sync waits for the change stream to shrink below its bound before it goes on
/// anyway (a reader that stopped reading must not stop every informer's sync).
const STREAM_WAIT: Duration = Duration::from_secs(1);

/// A bounded part's size for a budget of `limit`: a thirty-second of it, within
/// [`MIN_PART`]..=[`MAX_PART`].
fn part(limit: usize) -> usize {
    (limit / 32).clamp(MIN_PART, MAX_PART)
}

/// What a store's budget holds now, part by part, in bytes; see
/// [`DurableStore::memory_stats`](super::DurableStore::memory_stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MemoryStats {
    /// The budget ([`StoreConfig::memory_budget`](super::StoreConfig::memory_budget)).
    pub budget: usize,
    /// redb's page cache, carved out of the budget at open.
    pub redb_cache: usize,
    /// The informers' caches' keys, metadata and index postings (always held), as estimated.
    pub held: usize,
    /// The object JSON (and decoded objects) the caches keep, as charged.
    pub objects: usize,
    /// Changes published and not yet read by every reader.
    pub stream: usize,
    /// The change stream's bound.
    pub stream_bound: usize,
    /// The most the change stream held since the store opened: within its bound, plus at most
    /// the one change being published.
    pub stream_peak: usize,
    /// List pages fetched and not yet committed.
    pub syncing: usize,
    /// The bound of list pages in flight.
    pub sync_bound: usize,
    /// The most the total reached since the store opened.
    pub peak: usize,
    /// Whether the parts that cannot give way (redb's cache, the always-held part, the
    /// stream's and the syncs' bounds) were ever found larger than the budget.
    pub exceeded: bool,
}

impl MemoryStats {
    /// Everything charged now.
    #[must_use]
    pub fn used(&self) -> usize {
        self.redb_cache + self.held + self.objects + self.stream + self.syncing
    }
}

/// The shared byte budget; see the module documentation.
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    limit: usize,
    redb: usize,
    held: AtomicUsize,
    json: AtomicUsize,
    stream: AtomicUsize,
    syncing: AtomicUsize,
    peak: AtomicUsize,
    stream_peak: AtomicUsize,
    stream_bound: usize,
    sync_bound: usize,
    /// Admits list pages in KiB, up to `sync_bound`.
    gate: Arc<Semaphore>,
    /// Woken when the stream falls back within half its bound.
    stream_room: Notify,
    pressure: watch::Sender<u64>,
    /// Whether the parts that cannot give way were found over the limit (logged once).
    warned: AtomicBool,
    /// Where to report it (the database file), if anywhere.
    database: Option<std::path::PathBuf>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes with nothing carved out (a table or stream of its own, tests).
    pub(crate) fn new(limit: usize) -> Self {
        Self::build(limit, 0, None)
    }

    /// A store's budget: `limit` bytes of which `redb` are redb's page cache.
    pub(crate) fn for_store(limit: usize, redb: usize, database: std::path::PathBuf) -> Self {
        Self::build(limit, redb, Some(database))
    }

    fn build(limit: usize, redb: usize, database: Option<std::path::PathBuf>) -> Self {
        let bound = part(limit);
        let b = Self {
            limit,
            redb,
            held: AtomicUsize::new(0),
            json: AtomicUsize::new(0),
            stream: AtomicUsize::new(0),
            syncing: AtomicUsize::new(0),
            peak: AtomicUsize::new(redb),
            stream_peak: AtomicUsize::new(0),
            stream_bound: bound,
            sync_bound: bound,
            gate: Arc::new(Semaphore::new((bound >> 10).max(1))),
            stream_room: Notify::new(),
            pressure: watch::channel(0).0,
            warned: AtomicBool::new(false),
            database,
        };
        b.check_fixed();
        b
    }

    /// redb's share of a budget of `limit` when the configuration does not set it: a
    /// thirty-second, 16 to 32 MiB, at most a quarter. Small because it bounds redb's dirty
    /// pages as well as its read cache: between durable commits (a whole cold sync) the pages
    /// written stay in memory up to this size, and beyond what the object caches hold it
    /// mostly keeps pages the OS page cache keeps too.
    pub(crate) fn redb_share(limit: usize) -> usize {
        (limit / 32).clamp(16 << 20, 32 << 20).min(limit / 4)
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    pub(crate) fn stream_bound(&self) -> usize {
        self.stream_bound
    }

    #[cfg(test)]
    pub(crate) fn sync_bound(&self) -> usize {
        self.sync_bound
    }

    /// Everything charged now.
    pub(crate) fn used(&self) -> usize {
        self.redb
            + self.held.load(Ordering::Relaxed)
            + self.json.load(Ordering::Relaxed)
            + self.stream.load(Ordering::Relaxed)
            + self.syncing.load(Ordering::Relaxed)
    }

    /// The parts by name.
    pub(crate) fn stats(&self) -> MemoryStats {
        MemoryStats {
            budget: self.limit,
            redb_cache: self.redb,
            held: self.held.load(Ordering::Relaxed),
            objects: self.json.load(Ordering::Relaxed),
            stream: self.stream.load(Ordering::Relaxed),
            stream_bound: self.stream_bound,
            stream_peak: self.stream_peak.load(Ordering::Relaxed),
            syncing: self.syncing.load(Ordering::Relaxed),
            sync_bound: self.sync_bound,
            peak: self.peak.load(Ordering::Relaxed),
            exceeded: self.warned.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn over(&self) -> bool {
        self.used() > self.limit
    }

    fn grew(&self) {
        self.peak.fetch_max(self.used(), Ordering::Relaxed);
    }

    /// Charges `bytes` whatever the limit: always-held data (`held`), or JSON just written (a
    /// cache evicts it afterwards if it must).
    pub(crate) fn charge(&self, bytes: usize, held: bool) {
        if held {
            self.held.fetch_add(bytes, Ordering::Relaxed);
            self.check_fixed();
        } else {
            self.json.fetch_add(bytes, Ordering::Relaxed);
        }
        self.grew();
    }

    pub(crate) fn uncharge(&self, bytes: usize, held: bool) {
        sub(if held { &self.held } else { &self.json }, bytes);
    }

    /// Charges `bytes` of change stream.
    pub(crate) fn charge_stream(&self, bytes: usize) {
        self.stream.fetch_add(bytes, Ordering::Relaxed);
        self.grew();
    }

    /// Records the stream's bytes once a publication is within its bound again (the stream
    /// calls it after [`charge_stream`](Self::charge_stream) and its spilling).
    pub(crate) fn stream_settled(&self) {
        self.stream_peak.fetch_max(self.stream(), Ordering::Relaxed);
    }

    pub(crate) fn uncharge_stream(&self, bytes: usize) {
        let before = sub(&self.stream, bytes);
        let soft = self.stream_bound / 2;
        if before > soft && before.saturating_sub(bytes) <= soft {
            self.stream_room.notify_waiters();
        }
    }

    /// The change streams' bytes now.
    pub(crate) fn stream(&self) -> usize {
        self.stream.load(Ordering::Relaxed)
    }

    /// Whether `bytes` more fit within the limit.
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        self.used().saturating_add(bytes) <= self.limit
    }

    /// Whether the parts that cannot give way exceed the limit: said once, in a warning and
    /// in the `durable_informer_memory_budget_exceeded` gauge.
    fn check_fixed(&self) {
        let fixed = self
            .redb
            .saturating_add(self.held.load(Ordering::Relaxed))
            .saturating_add(self.stream_bound + self.sync_bound);
        if fixed > self.limit && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                budget = self.limit,
                redb_cache = self.redb,
                held = self.held.load(Ordering::Relaxed),
                stream_bound = self.stream_bound,
                sync_bound = self.sync_bound,
                "StoreConfig::memory_budget is smaller than what cannot be evicted: the informers' keys, \
                 metadata and postings, redb's page cache and the bounds of the change stream and of syncs \
                 in flight; no object JSON is kept in memory and the process will exceed the budget \
                 (see docs/deploying.md#sizing)"
            );
            if let Some(db) = &self.database {
                super::metrics::memory_budget_exceeded(db);
            }
        }
    }

    /// Asks every cache of the store to evict its own objects until the total is within the
    /// limit: called by a cache that has nothing left to evict while the total is over.
    pub(crate) fn press(&self) {
        self.pressure.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes whenever a cache [presses](Self::press).
    pub(crate) fn pressure(&self) -> watch::Receiver<u64> {
        self.pressure.subscribe()
    }

    /// Admits a list page of `bytes` (fetched, about to be written): charges it at once, then
    /// waits while the pages admitted from every reflector of the store fill
    /// [`sync_bound`](Self::sync_bound) (a page larger than the bound waits for all the
    /// others), and for up to a second while the change stream is over half its bound (its
    /// readers catch up before the stream spills or they lag). The permit gives it back when dropped, once the
    /// page is committed. So the pages in flight stay within the bound, plus one waiting per
    /// reflector.
    pub(crate) async fn admit(self: &Arc<Self>, bytes: usize) -> SyncPermit {
        self.syncing.fetch_add(bytes, Ordering::Relaxed);
        self.grew();
        // Charged while it waits; given back should the wait be cancelled.
        let guard = SyncPermit {
            budget: self.clone(),
            _permit: None,
            bytes,
        };
        let kib = u32::try_from((bytes >> 10).clamp(1, (self.sync_bound >> 10).max(1))).unwrap_or(u32::MAX);
        let permit = self.gate.clone().acquire_many_owned(kib).await.ok();
        let deadline = tokio::time::Instant::now() + STREAM_WAIT;
        loop {
            let room = self.stream_room.notified();
            if self.stream() <= self.stream_bound / 2 {
                break;
            }
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                break;
            }
        }
        let mut guard = guard;
        guard._permit = permit;
        guard
    }
}

/// Subtracts without going below zero, whatever a bug elsewhere did, in one atomic step;
/// returns the value before.
fn sub(a: &AtomicUsize, bytes: usize) -> usize {
    a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| Some(u.saturating_sub(bytes)))
        .unwrap_or(0)
}

/// A list page admitted by [`MemoryBudget::admit`]; dropped once it is committed.
#[derive(Debug)]
pub(crate) struct SyncPermit {
    budget: Arc<MemoryBudget>,
    _permit: Option<OwnedSemaphorePermit>,
    bytes: usize,
}

impl Drop for SyncPermit {
    fn drop(&mut self) {
        sub(&self.budget.syncing, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redb_takes_a_small_share_of_the_budget() {
        assert_eq!(MemoryBudget::redb_share(1 << 30), 32 << 20, "the default budget");
        assert_eq!(MemoryBudget::redb_share(4 << 30), 32 << 20, "at most 32 MiB");
        assert_eq!(MemoryBudget::redb_share(256 << 20), 16 << 20, "at least 16 MiB");
        assert_eq!(MemoryBudget::redb_share(32 << 20), 8 << 20, "at most a quarter");
        assert_eq!(MemoryBudget::redb_share(0), 0);
    }

    #[test]
    fn charges_add_up_and_uncharge_saturates() {
        let b = MemoryBudget::new(100);
        b.charge(60, true);
        assert!(b.fits(40));
        assert!(!b.fits(41), "60 + 41 > 100");
        b.charge(40, false);
        assert!(!b.over());
        b.charge(1, false);
        assert!(b.over());
        b.uncharge(500, true);
        b.uncharge(500, false);
        assert_eq!(b.used(), 0);
        assert_eq!(b.stats().peak, 101);
    }

    #[test]
    fn redb_and_the_stream_count_against_the_limit() {
        let b = MemoryBudget::for_store(100 << 20, 25 << 20, "db.redb".into());
        assert_eq!(b.used(), 25 << 20, "redb's cache is carved out at open");
        assert!(b.fits(75 << 20) && !b.fits((75 << 20) + 1));
        b.charge_stream(10 << 20);
        assert!(!b.fits(70 << 20));
        b.uncharge_stream(10 << 20);
        assert_eq!(b.stats().used(), 25 << 20);
        assert!(!b.stats().exceeded);
    }

    #[test]
    fn fixed_parts_over_the_limit_are_said() {
        let b = MemoryBudget::for_store(64 << 20, 16 << 20, "db.redb".into());
        assert!(!b.stats().exceeded);
        // 16 MiB redb + 4 + 4 MiB bounds + 41 MiB held > 64 MiB.
        b.charge(41 << 20, true);
        assert!(b.stats().exceeded);
    }

    #[test]
    fn pressing_wakes_the_receivers() {
        let b = MemoryBudget::new(10);
        let rx = b.pressure();
        assert!(!rx.has_changed().unwrap_or(true));
        b.press();
        assert!(rx.has_changed().unwrap_or(false));
    }

    #[tokio::test]
    async fn the_sync_gate_admits_up_to_its_bound_and_charges_pages_waiting_too() {
        let b = Arc::new(MemoryBudget::new(0));
        let bound = b.sync_bound();
        let first = b.admit(bound / 2).await;
        let second = b.admit(bound / 2).await;
        assert_eq!(b.stats().syncing, bound);
        // A third half does not fit until one is dropped, and is charged while it waits.
        let third = b.clone();
        let waiting = tokio::spawn(async move { third.admit(bound / 2).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert_eq!(b.stats().syncing, bound + bound / 2);
        drop(first);
        let third = waiting.await.expect("admitted once the first was dropped");
        assert_eq!(b.stats().syncing, bound);
        drop((second, third));
        assert_eq!(b.stats().syncing, 0);
    }
}
