//! [`BlockingWorkQueue`]: the queue's handle for workers that are plain OS threads.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::metrics::QueueMetrics;
use super::work_queue::{Shared, WorkQueue};

/// A handle to a [`WorkQueue`] whose waiting methods block the calling thread.
///
/// Made by [`WorkQueue::blocking`]; cheap to clone, and shares the queue with every other
/// handle, async or blocking. Only [`get`](Self::get) and
/// [`shutdown_with_drain`](Self::shutdown_with_drain) block. They wait on a condition variable and
/// do not need a Tokio runtime.
///
/// They must not be called from async tasks: they do not panic there, but they block the runtime's
/// worker thread, which stalls the other tasks on it and can deadlock a current-thread runtime.
/// From async code use the [`WorkQueue`] methods, or call these inside
/// [`spawn_blocking`](tokio::task::spawn_blocking).
///
/// Delays are measured with [`tokio::time::Instant`]: outside a runtime that is the system clock,
/// so a thread does not see a runtime's paused (virtual) time.
///
/// ```no_run
/// use durable_informer::queue::WorkQueue;
///
/// let queue: WorkQueue<u64> = WorkQueue::new();
/// let blocking = queue.blocking();
/// let worker = std::thread::spawn(move || {
///     while let Some(item) = blocking.get() {
///         println!("processing {item}");
///         blocking.done(&item);
///     }
/// });
/// queue.add(1);
/// queue.blocking().shutdown_with_drain();
/// worker.join().expect("worker panicked");
/// ```
pub struct BlockingWorkQueue<T> {
    shared: Arc<Shared<T>>,
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> BlockingWorkQueue<T> {
    pub(crate) fn new(shared: Arc<Shared<T>>) -> Self {
        Self { shared }
    }

    fn queue(&self) -> WorkQueue<T> {
        WorkQueue::from_shared(Arc::clone(&self.shared))
    }

    /// An async handle to the same queue.
    #[must_use]
    pub fn async_handle(&self) -> WorkQueue<T> {
        self.queue()
    }

    /// Blocks until an item is available and marks it processing; `None` once the queue is shut
    /// down (or, for a drain, once nothing is left to hand out). See [`WorkQueue::get`].
    #[must_use]
    pub fn get(&self) -> Option<T> {
        self.shared.get_blocking()
    }

    /// Shuts down and blocks until drained; see [`WorkQueue::shutdown_with_drain`].
    pub fn shutdown_with_drain(&self) {
        self.shared.shutdown_with_drain_blocking();
    }

    /// See [`WorkQueue::add`].
    pub fn add(&self, item: T) {
        self.queue().add(item);
    }

    /// See [`WorkQueue::add_after`].
    pub fn add_after(&self, item: T, delay: Duration) {
        self.queue().add_after(item, delay);
    }

    /// See [`WorkQueue::add_rate_limited`].
    pub fn add_rate_limited(&self, item: T) {
        self.queue().add_rate_limited(item);
    }

    /// See [`WorkQueue::done`].
    pub fn done(&self, item: &T) {
        self.queue().done(item);
    }

    /// See [`WorkQueue::forget`].
    pub fn forget(&self, item: &T) {
        self.queue().forget(item);
    }

    /// See [`WorkQueue::num_requeues`].
    #[must_use]
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.queue().num_requeues(item)
    }

    /// See [`WorkQueue::len`].
    #[must_use]
    pub fn len(&self) -> usize {
        self.queue().len()
    }

    /// See [`WorkQueue::is_empty`].
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.queue().is_empty()
    }

    /// See [`WorkQueue::shutdown`].
    pub fn shutdown(&self) {
        self.queue().shutdown();
    }

    /// See [`WorkQueue::is_shutting_down`].
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        self.queue().is_shutting_down()
    }

    /// See [`WorkQueue::metrics`].
    #[must_use]
    pub fn metrics(&self) -> QueueMetrics {
        self.queue().metrics()
    }
}

impl<T> Clone for BlockingWorkQueue<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> fmt::Debug for BlockingWorkQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingWorkQueue").finish_non_exhaustive()
    }
}
