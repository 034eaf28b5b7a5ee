//! A redb backend that forwards every call to redb's `FileBackend`, and lets a test hook the
//! calls it cares about (fail, hold, slow down or record them) through [`Hooks`], whose
//! methods forward by default.
#![allow(dead_code)]

use std::ops::Bound;
use std::sync::Arc;

use durable_informer::store::StoreConfig;
use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// What a test does around the file's reads, writes, `set_len`s and fsyncs; each method gets
/// the file and does the call itself (or not).
pub trait Hooks: std::fmt::Debug + Send + Sync + 'static {
    fn read(&self, file: &FileBackend, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        file.read(offset, out)
    }
    fn write(&self, file: &FileBackend, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        file.write(offset, data)
    }
    fn set_len(&self, file: &FileBackend, len: u64) -> Result<(), std::io::Error> {
        file.set_len(len)
    }
    fn sync_data(&self, file: &FileBackend) -> Result<(), std::io::Error> {
        file.sync_data()
    }
}

#[derive(Debug)]
pub struct Hooked<H: Hooks> {
    file: FileBackend,
    hooks: Arc<H>,
}

impl<H: Hooks> StorageBackend for Hooked<H> {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.file.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.hooks.read(&self.file, offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.hooks.set_len(&self.file, len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.hooks.sync_data(&self.file)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.hooks.write(&self.file, offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.file.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

/// `config` with its file behind `hooks`, shared by every backend the store opens (the writer
/// reopens the file after an I/O error).
pub fn hooked<H: Hooks>(config: StoreConfig, hooks: &Arc<H>) -> StoreConfig {
    let hooks = hooks.clone();
    config.backend_wrapper(Arc::new(move |file| {
        Box::new(Hooked {
            file,
            hooks: hooks.clone(),
        })
    }))
}
