//! The memory budget one [`DurableStore`](super::DurableStore) shares among the object caches
//! of all its informers (see [`StoreConfig::memory_budget`](super::StoreConfig::memory_budget)).
//!
//! Each cache charges what it holds: every key, metadata and posting (always held) and the
//! JSON and decoded form of the objects it keeps (evictable). A cache whose change takes the
//! total over the limit evicts its own least recently written or read objects; when it has
//! nothing left to evict it raises [`pressure`](MemoryBudget::pressure), and every other cache
//! of the store evicts its own.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;

/// The shared byte budget; see the module documentation.
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    limit: usize,
    /// Everything charged.
    used: AtomicUsize,
    /// The always-held part of it.
    held: AtomicUsize,
    pressure: watch::Sender<u64>,
    /// Whether the always-held part alone was found over the limit (logged once).
    warned: AtomicBool,
}

impl MemoryBudget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            pressure: watch::channel(0).0,
            warned: AtomicBool::new(false),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn over(&self) -> bool {
        self.used() > self.limit
    }

    /// Charges `bytes` whatever the limit: always-held data (`held`), or JSON just written (a
    /// cache evicts it afterwards if it must).
    pub(crate) fn charge(&self, bytes: usize, held: bool) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        if held {
            self.held.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub(crate) fn uncharge(&self, bytes: usize, held: bool) {
        // Never below zero, whatever a bug elsewhere did: saturating, in one atomic step.
        let sub = |a: &AtomicUsize| {
            let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| Some(u.saturating_sub(bytes)));
        };
        sub(&self.used);
        if held {
            sub(&self.held);
        }
    }

    /// Whether `bytes` more fit within the limit.
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        self.used().saturating_add(bytes) <= self.limit
    }

    /// Asks every cache of the store to evict its own objects until the total is within the
    /// limit: called by a cache that has nothing left to evict while the total is over.
    pub(crate) fn press(&self) {
        self.pressure.send_modify(|n| *n = n.wrapping_add(1));
        let held = self.held.load(Ordering::Relaxed);
        if held > self.limit && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limit = self.limit,
                held,
                "the keys, metadata and postings of the informers' caches alone exceed StoreConfig::memory_budget; \
                 no object JSON is kept in memory (see docs/deploying.md#sizing)"
            );
        }
    }

    /// Changes whenever a cache [presses](Self::press).
    pub(crate) fn pressure(&self) -> watch::Receiver<u64> {
        self.pressure.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn pressing_wakes_the_receivers() {
        let b = MemoryBudget::new(10);
        let rx = b.pressure();
        assert!(!rx.has_changed().unwrap_or(true));
        b.press();
        assert!(rx.has_changed().unwrap_or(false));
    }
}
