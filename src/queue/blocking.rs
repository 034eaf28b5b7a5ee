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
/// It waits on a `Condvar` over the queue's one lock rather than on a channel (the issue asked
/// for crossbeam-channel): dedup, re-add after `done` and delays need that shared state anyway,
/// and a channel would hold a second copy of the queue to keep in step.
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

impl<T: Clone + Eq + Hash + Send + Sync + 'static> WorkQueue<T> {
    /// A handle whose waiting methods block the calling thread, for workers that are not async.
    #[must_use]
    pub fn blocking(&self) -> BlockingWorkQueue<T> {
        BlockingWorkQueue::new(Arc::clone(self.shared()))
    }
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
    /// down and nothing is queued. See [`WorkQueue::get`].
    ///
    /// # Panics
    ///
    /// Never, not even inside a Tokio runtime; but there it blocks a runtime thread, so do not
    /// call it from async tasks (see the [type docs](Self)).
    #[must_use]
    pub fn get(&self) -> Option<T> {
        self.shared.get_blocking()
    }

    /// Shuts down and blocks until every item handed out is done; see
    /// [`WorkQueue::shutdown_with_drain`].
    ///
    /// # Panics
    ///
    /// Never; like [`get`](Self::get), it must not be called from async tasks.
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

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use std::thread;

    use super::*;
    use crate::queue::lock;

    #[test]
    fn std_thread_workers_process_every_item_and_never_one_item_twice_at_once() {
        let queue: WorkQueue<u32> = WorkQueue::new();
        let in_flight = Arc::new(Mutex::new(HashSet::new()));
        let processed = Arc::new(Mutex::new(HashMap::new()));
        let re_added = Arc::new(Mutex::new(HashSet::new()));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let queue = queue.blocking();
                let (in_flight, processed, re_added) =
                    (Arc::clone(&in_flight), Arc::clone(&processed), Arc::clone(&re_added));
                thread::spawn(move || {
                    while let Some(item) = queue.get() {
                        assert!(lock(&in_flight).insert(item), "{item} handed out twice");
                        if item % 7 == 0 && lock(&re_added).insert(item) {
                            queue.add(item); // re-added while processing: comes back later
                        }
                        *lock(&processed).entry(item).or_insert(0) += 1;
                        assert!(lock(&in_flight).remove(&item));
                        queue.done(&item);
                    }
                })
            })
            .collect();
        let producer = {
            let queue = queue.blocking();
            thread::spawn(move || {
                for item in 0..2000 {
                    queue.add(item % 500);
                }
            })
        };
        assert!(producer.join().is_ok());
        queue.blocking().shutdown_with_drain();
        for worker in workers {
            assert!(worker.join().is_ok());
        }
        let processed = lock(&processed);
        assert_eq!(
            processed.keys().copied().collect::<HashSet<_>>(),
            (0..500).collect::<HashSet<_>>()
        );
        for item in lock(&re_added).iter() {
            assert!(processed[item] >= 2, "{item} re-added while processing, not requeued");
        }
        assert!(lock(&in_flight).is_empty());
        let metrics = queue.metrics();
        assert_eq!((metrics.depth, metrics.processing), (0, 0));
        assert_eq!(metrics.work_duration.count(), metrics.queue_latency.count());
    }

    #[test]
    fn blocking_get_wakes_on_an_add_from_another_thread() {
        let queue: WorkQueue<&str> = WorkQueue::new();
        let worker = {
            let queue = queue.blocking();
            thread::spawn(move || queue.get())
        };
        queue.add("a");
        assert_eq!(worker.join().ok().flatten(), Some("a"));
    }

    #[test]
    fn blocking_get_returns_none_after_a_shutdown_from_another_thread() {
        let queue: WorkQueue<&str> = WorkQueue::new();
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let queue = queue.blocking();
                thread::spawn(move || queue.get())
            })
            .collect();
        queue.shutdown();
        for worker in workers {
            assert_eq!(worker.join().ok(), Some(None));
        }
        assert!(queue.blocking().is_shutting_down());
    }

    #[test]
    fn blocking_drain_waits_for_done() {
        let queue = WorkQueue::new().blocking();
        queue.add("a");
        assert_eq!(queue.get(), Some("a"));
        let finished = Arc::new(AtomicBool::new(false));
        let drain = {
            let (queue, finished) = (queue.clone(), Arc::clone(&finished));
            thread::spawn(move || {
                queue.shutdown_with_drain();
                finished.load(Ordering::SeqCst)
            })
        };
        finished.store(true, Ordering::SeqCst);
        queue.done(&"a");
        assert_eq!(drain.join().ok(), Some(true), "drain returned before done");
        assert_eq!(queue.get(), None);
    }

    #[test]
    fn blocking_get_waits_for_a_delayed_add_on_the_system_clock() {
        let queue = WorkQueue::new().blocking();
        let start = std::time::Instant::now();
        queue.add_after("a", Duration::from_millis(20));
        assert_eq!(queue.len(), 0);
        assert_eq!(queue.get(), Some("a"));
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn blocking_handle_shares_rate_limiting_with_the_async_handle() {
        let queue: WorkQueue<&str> = WorkQueue::new();
        let blocking = queue.blocking();
        blocking.add_rate_limited("a");
        assert_eq!(queue.num_requeues(&"a"), 1);
        blocking.forget(&"a");
        assert_eq!(blocking.num_requeues(&"a"), 0);
        assert_eq!(blocking.metrics().retries, 1);
        assert!(blocking.is_empty() && blocking.async_handle().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocking_get_inside_spawn_blocking_meets_async_adds() {
        let queue: WorkQueue<u8> = WorkQueue::new();
        let worker = {
            let queue = queue.blocking();
            tokio::task::spawn_blocking(move || queue.get())
        };
        queue.add(1);
        assert_eq!(worker.await.ok().flatten(), Some(1));
    }
}
