//! Rate-limited workqueue with client-go semantics; it owns work scheduling, never the cache.
//!
//! A controller's event handlers [`add`](WorkQueue::add) keys to a [`WorkQueue`]; worker tasks
//! [`get`](WorkQueue::get) a key, reconcile it, and call [`done`](WorkQueue::done). The queue
//! guarantees, like client-go's `util/workqueue`:
//!
//! * **Deduplication.** An item that is queued and not yet handed out appears once, however many
//!   times it is added. [`len`](WorkQueue::len) counts distinct queued items.
//! * **No concurrent processing of one item.** An item handed out by `get` is *processing* until
//!   `done`. Adding it meanwhile marks it dirty; it is not handed to another worker but queued
//!   again when `done` is called.
//! * **FIFO.** Items are handed out in the order they were (first) queued.
//! * **Delayed adds.** [`add_after`](WorkQueue::add_after) queues an item once a delay has passed.
//!   While an item waits, a later `add_after` with an earlier deadline moves it forward; a later
//!   deadline is ignored. A zero delay is an immediate [`add`](WorkQueue::add).
//! * **Rate limiting.** [`add_rate_limited`](WorkQueue::add_rate_limited) asks the queue's
//!   [`RateLimiter`] how long to wait; [`forget`](WorkQueue::forget) clears that item's history
//!   once it has been processed successfully. The default limiter is
//!   [`default_controller_rate_limiter`].
//! * **Shutdown**, as client-go's `ShutDown` / `ShutDownWithDrain`. After
//!   [`shutdown`](WorkQueue::shutdown) adds are ignored and waiting delayed items are dropped, but
//!   `get` keeps handing out the items already queued, and returns `None` once none is left. An
//!   item re-added while processing is still queued again by its `done`, and the worker that
//!   called `done` takes it with its next `get`.
//!   [`shutdown_with_drain`](WorkQueue::shutdown_with_drain) does the same and also waits until
//!   every handed-out item is done; that is the only difference between the two.
//!
//! ## Sync and async
//!
//! Every method of [`WorkQueue`] that is not `async` only takes a short internal lock and can be
//! called anywhere: from async tasks, from plain threads, from event handlers. The two methods
//! that wait, [`get`](WorkQueue::get) and [`shutdown_with_drain`](WorkQueue::shutdown_with_drain),
//! are `async` and cancel-safe. For workers that are plain OS threads, [`WorkQueue::blocking`]
//! returns a [`BlockingWorkQueue`] over the same queue whose `get` and `shutdown_with_drain` block
//! the calling thread; they must not be called from async tasks (use `spawn_blocking`).
//!
//! Time is [`tokio::time::Instant`], so tests can run on paused, virtual time
//! (`#[tokio::test(start_paused = true)]`). Outside a runtime it is the system's monotonic clock.
//!
//! ## Locking policy
//!
//! State lives behind a `std::sync::Mutex` that is never held across an `.await` or while calling
//! a [`RateLimiter`]. A poisoned lock (a panic in an item's `Hash` or `Eq` while the lock was held)
//! is recovered with [`PoisonError::into_inner`](std::sync::PoisonError::into_inner): the queue
//! keeps serving, and at worst the item whose `Hash`/`Eq` panicked is lost.
//!
//! ## Example
//!
//! ```no_run
//! use durable_informer::queue::WorkQueue;
//!
//! # async fn reconcile(_key: &str) -> Result<(), ()> { Ok(()) }
//! # async fn example() {
//! let queue: WorkQueue<String> = WorkQueue::builder().name("pods").build();
//! let worker = {
//!     let queue = queue.clone();
//!     tokio::spawn(async move {
//!         while let Some(key) = queue.get().await {
//!             match reconcile(&key).await {
//!                 Ok(()) => queue.forget(&key),
//!                 Err(()) => queue.add_rate_limited(key.clone()),
//!             }
//!             queue.done(&key);
//!         }
//!     })
//! };
//! queue.add("default/nginx".to_owned());
//! queue.shutdown_with_drain().await;
//! worker.await.ok();
//! # }
//! ```

mod blocking;
mod metrics;
mod rate_limiter;
mod work_queue;

use crate::util::Locked;
pub use blocking::BlockingWorkQueue;
pub use metrics::{DurationHistogram, QueueMetrics};
pub use rate_limiter::{
    default_controller_rate_limiter, BucketRateLimiter, ItemExponentialFailureRateLimiter, ItemFastSlowRateLimiter,
    MaxOfRateLimiter, RateLimiter,
};
pub use work_queue::{WorkQueue, WorkQueueBuilder};

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering from poisoning (see the module's locking policy).
fn lock<S>(mutex: &Mutex<S>) -> MutexGuard<'_, S> {
    mutex.locked()
}
