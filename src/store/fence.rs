//! The writer's periodic durable commit without its fsync on the writer thread.
//!
//! Deferred watch batches commit without an fsync; every `fsync_delay` an empty durable commit
//! writes their pages and fsyncs. redb has one writer, so while that fsync ran the next batches
//! waited (up to tens of ms on a busy disk). The commit's *last* fsync now runs on a thread of
//! its own: redb's `commit()` returns once the pages are written, the writer goes on deciding
//! and publishing the next batches, and it reports the commit durable only when the fsync has
//! finished.
//!
//! Invariant (what keeps crash consistency as it was): nothing reaches the file after an fsync
//! was requested until that fsync has finished. Every write, `set_len`, `close` and the next
//! fsync wait for the one in flight, so the file sees the same writes and syncs in the same
//! order as with synchronous fsyncs; only the commit call returns earlier. A failed background
//! fsync is latched: every later write or sync fails with it, redb then refuses the database,
//! and the writer reopens it and takes back what the file does not hold, as after a failed
//! synchronous fsync.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crossbeam_channel::{Receiver, Sender};

/// One per store, shared by every backend the store opens (the writer reopens after an error).
#[derive(Debug)]
pub(crate) struct Fence {
    state: Mutex<State>,
    idle: Condvar,
    /// Told (at most one message queued) when a background fsync finishes.
    wake_tx: Sender<()>,
    wake_rx: Receiver<()>,
    /// Set when the store closes: an open of its file then waits for the release.
    pub(crate) closing: Arc<super::release::Closing>,
}

#[derive(Debug, Default)]
struct State {
    /// The next fsync may run in the background (set by the writer around one commit).
    armed: bool,
    in_flight: bool,
    /// Background fsyncs started / finished (each gets the next number).
    started: u64,
    finished: u64,
    /// A background fsync failed: what it said (latched until [`Fence::reset`]).
    failed: Option<(std::io::ErrorKind, String)>,
    /// A `set_len` asked for while an fsync ran (redb trims the file at the end of the very
    /// commit whose fsync this is): done by the syncer after the fsync, in the same order.
    pending_len: Option<u64>,
}

/// Where a background fsync stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SyncState {
    Running,
    Done,
    Failed(String),
}

impl Default for Fence {
    fn default() -> Self {
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        Self {
            state: Mutex::new(State::default()),
            idle: Condvar::new(),
            wake_tx,
            wake_rx,
            closing: Arc::default(),
        }
    }
}

impl Fence {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned lock still holds consistent counters.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until no fsync is in flight; then fails if one failed.
    fn wait_idle(&self) -> Result<MutexGuard<'_, State>, std::io::Error> {
        let mut s = self.lock();
        while s.in_flight {
            s = self.idle.wait(s).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        match &s.failed {
            Some((kind, msg)) => Err(std::io::Error::new(
                *kind,
                format!("an earlier background fsync failed: {msg}"),
            )),
            None => Ok(s),
        }
    }

    /// Lets the next fsync run in the background (until [`disarm`](Self::disarm)).
    pub(crate) fn arm(&self) {
        self.lock().armed = true;
    }

    /// Ends an [`arm`](Self::arm): the number of the background fsync started meanwhile, if any.
    pub(crate) fn disarm(&self, before: u64) -> Option<u64> {
        let mut s = self.lock();
        s.armed = false;
        (s.started > before).then_some(s.started)
    }

    /// How many background fsyncs were started so far (for [`disarm`](Self::disarm)).
    pub(crate) fn started(&self) -> u64 {
        self.lock().started
    }

    /// Where background fsync `n` stands.
    pub(crate) fn state(&self, n: u64) -> SyncState {
        let s = self.lock();
        if s.finished >= n {
            match &s.failed {
                Some((_, msg)) => SyncState::Failed(msg.clone()),
                None => SyncState::Done,
            }
        } else {
            SyncState::Running
        }
    }

    /// Blocks until no fsync is in flight (before the file is closed or reopened).
    pub(crate) fn settle(&self) {
        let mut s = self.lock();
        while s.in_flight {
            s = self.idle.wait(s).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Forgets a latched failure, once the database it concerned is closed.
    pub(crate) fn reset(&self) {
        let mut s = self.lock();
        debug_assert!(!s.in_flight, "reset with an fsync in flight");
        s.failed = None;
        s.armed = false;
    }

    /// Ready when a background fsync finished (for the writer's `select!`).
    pub(crate) fn woken(&self) -> &Receiver<()> {
        &self.wake_rx
    }

    /// Ends fsync `n`, unless a `set_len` waits behind it: then returns its length, to be done
    /// first (and called again with its result).
    fn finish(&self, n: u64, result: Result<(), std::io::Error>) -> Option<u64> {
        let mut s = self.lock();
        if result.is_ok() {
            if let Some(len) = s.pending_len.take() {
                return Some(len);
            }
        }
        s.pending_len = None;
        s.in_flight = false;
        s.finished = n;
        if let Err(e) = result {
            s.failed = Some((e.kind(), e.to_string()));
        }
        drop(s);
        self.idle.notify_all();
        let _ = self.wake_tx.try_send(());
        None
    }
}

/// A backend whose fsyncs may run on a thread of their own (see the module docs).
#[derive(Debug)]
pub(crate) struct Fenced {
    inner: Arc<dyn redb::StorageBackend>,
    fence: Arc<Fence>,
    /// Asks the syncer thread for fsync number `n`; `None` once closed.
    syncer: Mutex<Option<(Sender<u64>, std::thread::JoinHandle<()>)>>,
    /// Last, so it is dropped after `inner` closed the file.
    _held: super::release::HeldFile,
}

impl Fenced {
    /// `path`: the file `inner` holds.
    pub(crate) fn new(inner: Box<dyn redb::StorageBackend>, fence: Arc<Fence>, path: &std::path::Path) -> Self {
        let inner: Arc<dyn redb::StorageBackend> = Arc::from(inner);
        let (tx, rx) = crossbeam_channel::unbounded::<u64>();
        let (file, f) = (inner.clone(), fence.clone());
        let syncer = std::thread::Builder::new()
            .name("durable-informer-fsync".into())
            .spawn(move || {
                for n in rx {
                    let mut result = file.sync_data();
                    while let Some(len) = f.finish(n, result) {
                        result = file.set_len(len);
                    }
                }
            })
            .ok()
            .map(|h| (tx, h));
        let held = super::release::HeldFile::new(path, fence.closing.clone());
        Self {
            inner,
            fence,
            syncer: Mutex::new(syncer),
            _held: held,
        }
    }

    /// Stops the syncer thread (after any fsync in flight), so the file is closed with this.
    fn stop_syncer(&self) {
        let taken = self
            .syncer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some((tx, handle)) = taken {
            drop(tx);
            let _ = handle.join();
        }
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        self.stop_syncer();
    }
}

impl redb::StorageBackend for Fenced {
    fn len(&self) -> Result<u64, std::io::Error> {
        let s = self.fence.lock();
        match s.pending_len {
            Some(len) => Ok(len),
            None => self.inner.len(),
        }
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        // The page cache has what was written: reads need no fence.
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut s = self.fence.lock();
        if s.in_flight {
            // Queued behind the fsync (redb trims the file right after the commit's fsync;
            // truncating before it ends could cut pages the previous commit still uses).
            s.pending_len = Some(len);
            return Ok(());
        }
        drop(s);
        let _idle = self.fence.wait_idle()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        // Taken before the fence's lock, never while holding it (`stop_syncer` joins the
        // thread, which takes the fence's lock).
        let syncer = self
            .syncer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|(tx, _)| tx.clone());
        let mut s = self.fence.wait_idle()?;
        if let (true, Some(tx)) = (s.armed, syncer) {
            let n = s.started + 1;
            if tx.send(n).is_ok() {
                s.started = n;
                s.in_flight = true;
                return Ok(());
            }
        }
        drop(s);
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        // Held across the write: no fsync may start while a write is half done.
        let _idle = self.fence.wait_idle()?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.fence.settle();
        self.stop_syncer();
        self.inner.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: std::ops::Bound<u64>, end: std::ops::Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: std::ops::Bound<u64>, end: std::ops::Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
