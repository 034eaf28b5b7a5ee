//! A fault-injecting redb backend (wrapping redb's `FileBackend`): fails syncs, writes and
//! `set_len` on command, and fills the disk. Shared by the storage-fault suites.
#![allow(dead_code)]

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use durable_informer::store::StoreConfig;
use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

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

#[derive(Debug)]
struct FaultyBackend {
    inner: FileBackend,
    faults: Arc<Faults>,
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        if self.faults.disk_full.load(Ordering::SeqCst) && len > self.inner.len()? {
            return Err(self.faults.enospc());
        }
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.faults.syncs.fetch_add(1, Ordering::SeqCst);
        if Faults::take(&self.faults.fail_syncs) {
            self.faults.injected.fetch_add(1, Ordering::SeqCst);
            return Err(std::io::Error::other("injected fsync failure"));
        }
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.faults.writes.fetch_add(1, Ordering::SeqCst);
        if self.faults.disk_full.load(Ordering::SeqCst) {
            return Err(self.faults.enospc());
        }
        if self.faults.fail_writes.load(Ordering::SeqCst) > 0
            && !Faults::take(&self.faults.skip_writes)
            && Faults::take(&self.faults.fail_writes)
        {
            self.faults.injected.fetch_add(1, Ordering::SeqCst);
            return Err(std::io::Error::from_raw_os_error(5)); // EIO
        }
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

pub fn config(path: &std::path::Path, faults: &Arc<Faults>) -> StoreConfig {
    let faults = faults.clone();
    StoreConfig::new(path)
        .cache_bytes(4 << 20)
        .backend_wrapper(Arc::new(move |inner| {
            Box::new(FaultyBackend {
                inner,
                faults: faults.clone(),
            })
        }))
}
