//! A fault-injecting redb backend (wrapping redb's `FileBackend`): fails syncs, writes and
//! `set_len` on command, and fills the disk. Shared by the storage-fault suites.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use durable_informer::store::StoreConfig;
use redb::backends::FileBackend;
use redb::StorageBackend;

#[path = "backend.rs"]
mod backend;
use backend::{hooked, Hooks};

/// What to fail, shared between the test and every backend the store opens.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail this many next `sync_data` calls.
    pub fail_syncs: AtomicU64,
    /// Fail this many next `write` calls (after `skip_writes` more have succeeded).
    pub fail_writes: AtomicU64,
    /// While `fail_writes` is armed, let this many writes through first: fails the k-th write
    /// of a commit (a later page, the header) rather than its first.
    pub skip_writes: AtomicU64,
    /// While set, `write` and growing `set_len` fail with ENOSPC.
    pub disk_full: AtomicBool,
    /// How many calls failed.
    pub injected: AtomicU64,
    pub syncs: AtomicU64,
    pub writes: AtomicU64,
}

impl Faults {
    pub fn take(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Prints how many faults were injected (for RELIABILITY.md) and returns the number.
    pub fn report(&self, test: &str) -> u64 {
        let n = self.injected.load(Ordering::SeqCst);
        eprintln!(
            "{test}: {n} faults injected ({} syncs, {} writes seen)",
            self.syncs.load(Ordering::SeqCst),
            self.writes.load(Ordering::SeqCst)
        );
        n
    }

    fn enospc(&self) -> std::io::Error {
        self.injected.fetch_add(1, Ordering::SeqCst);
        std::io::Error::from_raw_os_error(28)
    }
}

impl Hooks for Faults {
    fn set_len(&self, file: &FileBackend, len: u64) -> Result<(), std::io::Error> {
        if self.disk_full.load(Ordering::SeqCst) && len > file.len()? {
            return Err(self.enospc());
        }
        file.set_len(len)
    }
    fn sync_data(&self, file: &FileBackend) -> Result<(), std::io::Error> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        if Faults::take(&self.fail_syncs) {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(std::io::Error::other("injected fsync failure"));
        }
        file.sync_data()
    }
    fn write(&self, file: &FileBackend, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if self.disk_full.load(Ordering::SeqCst) {
            return Err(self.enospc());
        }
        if self.fail_writes.load(Ordering::SeqCst) > 0
            && !Faults::take(&self.skip_writes)
            && Faults::take(&self.fail_writes)
        {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(std::io::Error::from_raw_os_error(5)); // EIO
        }
        file.write(offset, data)
    }
}

pub fn config(path: &std::path::Path, faults: &Arc<Faults>) -> StoreConfig {
    hooked(StoreConfig::new(path).cache_bytes(4 << 20), faults)
}
