//! The async [`WorkQueue`] and the state it shares with the blocking handle.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::lock;
use super::metrics::{DurationHistogram, QueueMetrics};
use super::rate_limiter::{default_controller_rate_limiter, RateLimiter};

/// A deduplicating, delaying, rate-limited work queue with client-go semantics.
///
/// Cheap to clone: clones share one queue. See the [module docs](super) for the semantics.
///
/// ```no_run
/// use std::time::Duration;
/// use durable_informer::queue::{ItemExponentialFailureRateLimiter, WorkQueue};
///
/// # async fn example() {
/// let queue = WorkQueue::builder()
///     .name("configmaps")
///     .rate_limiter(ItemExponentialFailureRateLimiter::new(
///         Duration::from_millis(10),
///         Duration::from_secs(60),
///     ))
///     .build();
/// queue.add("default/a");
/// queue.add("default/a"); // deduplicated
/// assert_eq!(queue.len(), 1);
/// let key = queue.get().await.expect("not shut down");
/// queue.add_rate_limited(key); // back in 10 ms, once `done` is called
/// queue.done(&key);
/// # }
/// ```
pub struct WorkQueue<T> {
    shared: Arc<Shared<T>>,
}

/// What every handle of one queue shares.
pub(crate) struct Shared<T> {
    name: Option<String>,
    state: Mutex<State<T>>,
    /// Wakes async waiters (`get`, `shutdown_with_drain`) after any change they may wait for.
    notify: Notify,
    /// Wakes blocking waiters, on the same occasions as `notify`.
    condvar: Condvar,
    rate_limiter: Box<dyn RateLimiter<T>>,
}

/// The outcome of one attempt to take an item.
pub(crate) enum TryGet<T> {
    /// An item, now processing.
    Item(T),
    /// Shut down (and, when draining, nothing left to hand out).
    Closed,
    /// Nothing yet; wait for a notification or until the deadline, if any.
    Wait(Option<Instant>),
}

/// The queue proper. Invariants (checked by `debug_check`):
/// * `queue` holds no duplicates, every item in it is in `dirty` and none is in `processing`;
/// * `waiting` is empty once `shutting_down`.
struct State<T> {
    /// Items ready to be handed out, in order.
    queue: VecDeque<T>,
    /// Items wanted again (queued, or re-added while processing), with the time they were added.
    dirty: HashMap<T, Instant>,
    /// Items handed out and not yet done, with the time they were handed out.
    processing: HashMap<T, Instant>,
    /// Delayed adds.
    waiting: Waiting<T>,
    shutting_down: bool,
    /// A `shutdown_with_drain` waits for the items processing (until a plain `shutdown`).
    draining: bool,
    adds: u64,
    retries: u64,
    queue_latency: DurationHistogram,
    work_duration: DurationHistogram,
}

/// Items waiting for a delayed add, ordered by deadline, then by arrival.
struct Waiting<T> {
    by_deadline: BTreeMap<(Instant, u64), T>,
    by_item: HashMap<T, (Instant, u64)>,
    next_seq: u64,
}

impl<T: Clone + Eq + Hash> Waiting<T> {
    fn new() -> Self {
        Self {
            by_deadline: BTreeMap::new(),
            by_item: HashMap::new(),
            next_seq: 0,
        }
    }

    /// Schedules `item` at `deadline` unless it already waits for an earlier or equal one.
    /// Returns whether the schedule changed.
    fn insert(&mut self, item: T, deadline: Instant) -> bool {
        if let Some(&key) = self.by_item.get(&item) {
            if key.0 <= deadline {
                return false;
            }
            self.by_deadline.remove(&key);
        }
        let key = (deadline, self.next_seq);
        self.next_seq += 1;
        self.by_item.insert(item.clone(), key);
        self.by_deadline.insert(key, item);
        true
    }

    /// Removes and returns the first item whose deadline is not after `now`, with its deadline.
    fn pop_ready(&mut self, now: Instant) -> Option<(T, Instant)> {
        let (&(deadline, seq), _) = self.by_deadline.first_key_value()?;
        if deadline > now {
            return None;
        }
        let item = self.by_deadline.remove(&(deadline, seq))?;
        self.by_item.remove(&item);
        Some((item, deadline))
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.first_key_value().map(|(key, _)| key.0)
    }

    fn len(&self) -> usize {
        self.by_deadline.len()
    }

    fn clear(&mut self) {
        self.by_deadline.clear();
        self.by_item.clear();
    }
}

impl<T: Clone + Eq + Hash> State<T> {
    fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            dirty: HashMap::new(),
            processing: HashMap::new(),
            waiting: Waiting::new(),
            shutting_down: false,
            draining: false,
            adds: 0,
            retries: 0,
            queue_latency: DurationHistogram::default(),
            work_duration: DurationHistogram::default(),
        }
    }

    /// Adds `item` as of `at`; returns whether it became ready to hand out.
    fn add(&mut self, item: T, at: Instant) -> bool {
        if self.shutting_down || self.dirty.contains_key(&item) {
            return false;
        }
        self.adds += 1;
        let processing = self.processing.contains_key(&item);
        self.dirty.insert(item.clone(), at);
        if processing {
            return false;
        }
        self.queue.push_back(item);
        true
    }

    /// Moves delayed items whose deadline has passed into the queue; returns whether any became
    /// ready to hand out.
    fn promote(&mut self, now: Instant) -> bool {
        let mut ready = false;
        while let Some((item, deadline)) = self.waiting.pop_ready(now) {
            ready |= self.add(item, deadline);
        }
        ready
    }

    /// Like client-go's `Get`: queued items are handed out even after a shutdown; once nothing
    /// is queued, a shut-down queue is closed (even if a processing item will be queued again by
    /// its `done`: the worker that calls `done` takes it next).
    fn try_get(&mut self, now: Instant) -> TryGet<T> {
        if let Some(item) = self.queue.pop_front() {
            let added = self.dirty.remove(&item).unwrap_or(now);
            self.queue_latency.observe(now.saturating_duration_since(added));
            self.processing.insert(item.clone(), now);
            return TryGet::Item(item);
        }
        if self.shutting_down {
            return TryGet::Closed;
        }
        TryGet::Wait(self.waiting.next_deadline())
    }

    /// [`try_get`](Self::try_get) for up to `max` items (at least one), in order.
    fn try_get_many(&mut self, now: Instant, max: usize) -> TryGet<Vec<T>> {
        match self.try_get(now) {
            TryGet::Item(first) => {
                let mut items = vec![first];
                while items.len() < max {
                    match self.try_get(now) {
                        TryGet::Item(item) => items.push(item),
                        _ => break,
                    }
                }
                TryGet::Item(items)
            }
            TryGet::Closed => TryGet::Closed,
            TryGet::Wait(at) => TryGet::Wait(at),
        }
    }

    /// Marks `item` done; returns whether waiters should look again (it was queued again, or the
    /// last processing item finished).
    fn done(&mut self, item: &T, now: Instant) -> bool {
        let Some(started) = self.processing.remove(item) else {
            return false;
        };
        self.work_duration.observe(now.saturating_duration_since(started));
        if self.dirty.contains_key(item) {
            self.queue.push_back(item.clone());
            return true;
        }
        self.processing.is_empty()
    }

    /// As client-go: the last call decides whether a drain waits (a plain shutdown ends it).
    fn shutdown(&mut self, drain: bool) {
        self.shutting_down = true;
        self.draining = drain;
        self.waiting.clear();
    }

    /// Whether `shutdown_with_drain` may return: no item is processing (or a plain shutdown
    /// ended the drain).
    fn drained(&self) -> bool {
        !self.draining || self.processing.is_empty()
    }

    fn debug_check(&self) {
        debug_assert!(self.queue.len() <= self.dirty.len());
        debug_assert!(self
            .queue
            .iter()
            .all(|item| self.dirty.contains_key(item) && !self.processing.contains_key(item)));
        debug_assert!(!self.shutting_down || self.waiting.len() == 0);
    }
}

impl<T: Clone + Eq + Hash> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        lock(&self.state)
    }

    /// Runs `f` on the state after promoting due delayed items, then wakes waiters if either
    /// asked for it.
    fn update<R>(&self, f: impl FnOnce(&mut State<T>, Instant) -> (R, bool)) -> R {
        let (result, wake) = {
            let mut state = self.lock();
            let now = Instant::now();
            let promoted = state.promote(now);
            let (result, wake) = f(&mut state, now);
            state.debug_check();
            (result, wake || promoted)
        };
        if wake {
            self.wake();
        }
        result
    }

    fn wake(&self) {
        self.notify.notify_waiters();
        self.condvar.notify_all();
    }

    /// Takes an item, or says how long to wait; for both handles' `get`.
    pub(crate) fn try_get(&self) -> TryGet<T> {
        self.update(|state, now| (state.try_get(now), false))
    }

    /// [`try_get`](Self::try_get) for up to `max` items.
    pub(crate) fn try_get_many(&self, max: usize) -> TryGet<Vec<T>> {
        self.update(|state, now| (state.try_get_many(now, max), false))
    }

    /// Blocks the thread until an item is available or the queue is closed.
    pub(crate) fn get_blocking(&self) -> Option<T> {
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            let promoted = state.promote(now);
            let next = state.try_get(now);
            if promoted {
                // Other waiters may take what this one leaves.
                self.wake();
            }
            state = match next {
                TryGet::Item(item) => return Some(item),
                TryGet::Closed => return None,
                TryGet::Wait(None) => self.condvar.wait(state).unwrap_or_else(PoisonError::into_inner),
                TryGet::Wait(Some(deadline)) => {
                    let timeout = deadline.saturating_duration_since(now);
                    match self.condvar.wait_timeout(state, timeout) {
                        Ok((state, _)) => state,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
            };
        }
    }

    /// Shuts down with drain and blocks the thread until drained.
    pub(crate) fn shutdown_with_drain_blocking(&self) {
        self.update(|state, _| {
            state.shutdown(true);
            ((), true)
        });
        let mut state = self.lock();
        while !state.drained() {
            state = self.condvar.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Configures a [`WorkQueue`]; made by [`WorkQueue::builder`].
#[must_use]
pub struct WorkQueueBuilder<T> {
    name: Option<String>,
    rate_limiter: Option<Box<dyn RateLimiter<T>>>,
}

impl<T> fmt::Debug for WorkQueueBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueueBuilder")
            .field("name", &self.name)
            .field("custom_rate_limiter", &self.rate_limiter.is_some())
            .finish()
    }
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> WorkQueueBuilder<T> {
    /// Names the queue; the name is reported in [`QueueMetrics::name`], and a named queue's
    /// metrics are exported under client-go's `workqueue_*` names with the label `name`
    /// (see [`metrics::register`](crate::metrics::register)).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Replaces the default [`default_controller_rate_limiter`].
    pub fn rate_limiter(mut self, rate_limiter: impl RateLimiter<T> + 'static) -> Self {
        self.rate_limiter = Some(Box::new(rate_limiter));
        self
    }

    /// Builds the queue.
    pub fn build(self) -> WorkQueue<T> {
        let rate_limiter = self
            .rate_limiter
            .unwrap_or_else(|| Box::new(default_controller_rate_limiter()));
        let named = self.name.is_some();
        let queue = WorkQueue {
            shared: Arc::new(Shared {
                name: self.name,
                state: Mutex::new(State::new()),
                notify: Notify::new(),
                condvar: Condvar::new(),
                rate_limiter,
            }),
        };
        if named {
            // Exported under client-go's `workqueue_*` names while the queue lives.
            let weak = Arc::downgrade(&queue.shared);
            super::metrics::add_queue(Box::new(move || {
                weak.upgrade().map(|shared| WorkQueue::from_shared(shared).metrics())
            }));
        }
        queue
    }
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> WorkQueue<T> {
    /// An unnamed queue with [`default_controller_rate_limiter`].
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Starts configuring a queue.
    pub fn builder() -> WorkQueueBuilder<T> {
        WorkQueueBuilder {
            name: None,
            rate_limiter: None,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared<T>> {
        &self.shared
    }

    pub(crate) fn from_shared(shared: Arc<Shared<T>>) -> Self {
        Self { shared }
    }

    /// Queues `item` unless it is already queued; if it is processing, it is queued again when
    /// [`done`](Self::done). Ignored after shutdown.
    pub fn add(&self, item: T) {
        self.shared.update(|state, now| ((), state.add(item, now)));
    }

    /// Queues `item` once `delay` has passed (see the [module docs](super) for how delays of one
    /// item combine). A zero delay is [`add`](Self::add). Ignored after shutdown, as is a delay
    /// so long that its deadline is not representable.
    pub fn add_after(&self, item: T, delay: Duration) {
        self.shared.update(|state, now| {
            if state.shutting_down {
                return ((), false);
            }
            if delay.is_zero() {
                return ((), state.add(item, now));
            }
            let Some(deadline) = now.checked_add(delay) else {
                tracing::debug!(?delay, "workqueue: delay beyond the clock's range, dropped");
                return ((), false);
            };
            ((), state.waiting.insert(item, deadline))
        });
    }

    /// Queues `item` after the delay the rate limiter decides, counting a retry. Ignored after
    /// shutdown (the rate limiter is not consulted then).
    pub fn add_rate_limited(&self, item: T) {
        if self.is_shutting_down() {
            return;
        }
        let delay = self.shared.rate_limiter.when(&item);
        self.shared.update(|state, _| {
            if !state.shutting_down {
                state.retries += 1;
            }
            ((), false)
        });
        self.add_after(item, delay);
    }

    /// Clears `item`'s rate-limiter history; call it when the item was processed successfully.
    /// It does not remove the item from the queue.
    pub fn forget(&self, item: &T) {
        self.shared.rate_limiter.forget(item);
    }

    /// How many times `item` was retried since it was last forgotten.
    #[must_use]
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.shared.rate_limiter.num_requeues(item)
    }

    /// Waits for an item and marks it processing; `None` once the queue is shut down and nothing
    /// is queued (items queued before the shutdown are still handed out, as in client-go).
    ///
    /// Every item returned must be passed to [`done`](Self::done). Cancel safe: if the future is
    /// dropped before it completes, no item was taken.
    pub async fn get(&self) -> Option<T> {
        self.wait_for(|| self.shared.try_get()).await
    }

    /// Tries `attempt` until it takes something or the queue is closed.
    async fn wait_for<R>(&self, attempt: impl Fn() -> TryGet<R>) -> Option<R> {
        loop {
            // Created before looking at the state, so a wake-up in between is not lost.
            let notified = pin!(self.shared.notify.notified());
            match attempt() {
                TryGet::Item(item) => return Some(item),
                TryGet::Closed => return None,
                TryGet::Wait(None) => notified.await,
                TryGet::Wait(Some(deadline)) => {
                    // Either outcome means: look again.
                    let _ = tokio::time::timeout_at(deadline, notified).await;
                }
            }
        }
    }

    /// [`get`](Self::get) for up to `max` items at once (at least one; `max` 0 counts as 1),
    /// in queue order, under one lock: a worker pool fed by one task takes a burst of keys
    /// without a wake-up per key. Every item returned must be passed to [`done`](Self::done).
    /// Cancel safe, as `get`.
    pub(crate) async fn get_many(&self, max: usize) -> Option<Vec<T>> {
        let max = max.max(1);
        self.wait_for(|| self.shared.try_get_many(max)).await
    }

    /// Marks `item`, handed out by [`get`](Self::get), as processed; if it was added meanwhile
    /// it is queued again. Does nothing for an item that is not processing.
    pub fn done(&self, item: &T) {
        self.shared.update(|state, now| ((), state.done(item, now)));
    }

    /// Number of items queued and ready to be handed out (not processing, not waiting for a
    /// delay).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.update(|state, _| (state.queue.len(), false))
    }

    /// Whether no item is ready to be handed out.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shuts the queue down: adds are ignored and delayed items dropped; [`get`](Self::get)
    /// still hands out the items already queued, then returns `None`, in every handle. Ends a
    /// [`shutdown_with_drain`](Self::shutdown_with_drain) in progress.
    pub fn shutdown(&self) {
        self.shared.update(|state, _| {
            state.shutdown(false);
            ((), true)
        });
    }

    /// Shuts the queue down like [`shutdown`](Self::shutdown), then waits until every item handed
    /// out is [`done`](Self::done) (client-go's `ShutDownWithDrain`). Items still queued are not
    /// waited for: `get` keeps handing them out, so to wait for them too, join the workers
    /// afterwards (each ends when `get` returns `None`).
    ///
    /// Never returns if an item handed out is never passed to `done`, unless a plain `shutdown`
    /// ends the wait.
    pub async fn shutdown_with_drain(&self) {
        self.shared.update(|state, _| {
            state.shutdown(true);
            ((), true)
        });
        loop {
            let notified = pin!(self.shared.notify.notified());
            if self.shared.lock().drained() {
                return;
            }
            notified.await;
        }
    }

    /// Whether [`shutdown`](Self::shutdown) or [`shutdown_with_drain`](Self::shutdown_with_drain)
    /// was called.
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        self.shared.lock().shutting_down
    }

    /// The queue's name, if it was given one.
    #[must_use]
    pub fn name(&self) -> Option<&str> {
        self.shared.name.as_deref()
    }

    /// A snapshot of the queue's metrics.
    #[must_use]
    pub fn metrics(&self) -> QueueMetrics {
        self.shared.update(|state, now| {
            let running = state
                .processing
                .values()
                .map(|started| now.saturating_duration_since(*started));
            let (unfinished_work, longest_running_processor) = running
                .fold((Duration::ZERO, Duration::ZERO), |(sum, max), running| {
                    (sum.saturating_add(running), max.max(running))
                });
            let metrics = QueueMetrics {
                name: self.shared.name.clone(),
                depth: state.queue.len(),
                processing: state.processing.len(),
                waiting: state.waiting.len(),
                adds: state.adds,
                retries: state.retries,
                queue_latency: state.queue_latency.clone(),
                work_duration: state.work_duration.clone(),
                unfinished_work,
                longest_running_processor,
            };
            (metrics, false)
        })
    }
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> Default for WorkQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> fmt::Debug for WorkQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueue")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::ItemExponentialFailureRateLimiter;
    use futures::FutureExt;

    const MS: Duration = Duration::from_millis(1);

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::builder()
            .rate_limiter(ItemExponentialFailureRateLimiter::new(
                MS * 5,
                Duration::from_secs(1000),
            ))
            .build()
    }

    /// Takes an item if one is ready now, without waiting.
    fn try_take<T: Clone + Eq + Hash + Send + Sync + 'static>(q: &WorkQueue<T>) -> Option<T> {
        q.get().now_or_never().flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn adds_are_deduplicated_while_queued() {
        // (adds, expected len, expected order of gets)
        let table: [(&[&str], usize, &[&str]); 4] = [
            (&["a"], 1, &["a"]),
            (&["a", "a", "a"], 1, &["a"]),
            (&["a", "b", "a", "c", "b"], 3, &["a", "b", "c"]),
            (&["c", "b", "a"], 3, &["c", "b", "a"]),
        ];
        for (adds, len, order) in table {
            let q = queue();
            for item in adds {
                q.add(item);
            }
            assert_eq!(q.len(), len, "{adds:?}");
            let mut got = Vec::new();
            while let Some(item) = try_take(&q) {
                got.push(item);
            }
            assert_eq!(got, order, "{adds:?}");
            assert!(q.is_empty());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn item_re_added_while_processing_is_queued_again_after_done() {
        let q = queue();
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        q.add("a");
        q.add("a");
        assert_eq!(q.len(), 0, "a processing item is not queued");
        assert_eq!(try_take(&q), None, "not handed to a second worker");
        q.add("b");
        assert_eq!(try_take(&q), Some("b"), "other items flow meanwhile");
        q.done(&"a");
        assert_eq!(q.len(), 1);
        assert_eq!(try_take(&q), Some("a"));
        q.done(&"a");
        q.done(&"b");
        assert_eq!(q.len(), 0, "queued again once, not once per add");
        assert_eq!(try_take(&q), None);
    }

    #[tokio::test(start_paused = true)]
    async fn get_many_takes_up_to_max_in_order_and_keeps_processing_items_back() {
        let q = queue();
        for item in ["a", "b", "c", "d"] {
            q.add(item);
        }
        assert_eq!(q.get_many(3).await, Some(vec!["a", "b", "c"]));
        // Added again while processing: not handed out until done.
        q.add("a");
        assert_eq!(q.get_many(10).await, Some(vec!["d"]));
        assert_eq!(q.get_many(10).now_or_never(), None, "a is processing: nothing ready");
        q.done(&"a");
        assert_eq!(q.get_many(0).await, Some(vec!["a"]), "0 counts as 1");
        // A delayed item becomes due while the batch waits.
        q.add_after("e", MS * 10);
        q.add_after("f", MS * 10);
        assert_eq!(q.get_many(10).await, Some(vec!["e", "f"]));
        q.add("g");
        q.shutdown();
        assert_eq!(q.get_many(10).await, Some(vec!["g"]), "queued before the shutdown");
        assert_eq!(q.get_many(10).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn done_of_an_item_not_processing_does_nothing() {
        let q = queue();
        q.add("a");
        q.done(&"a");
        q.done(&"b");
        assert_eq!(q.len(), 1);
        assert_eq!(q.metrics().work_duration.count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn get_waits_for_an_add() {
        let q = queue();
        let worker = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        assert!(!worker.is_finished());
        q.add("a");
        assert_eq!(worker.await.ok().flatten(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn after_shutdown_get_hands_out_what_is_queued_then_none_and_adds_are_ignored() {
        let q = queue();
        q.add("a");
        q.add("b");
        q.add_after("late", MS);
        q.shutdown();
        assert!(q.is_shutting_down());
        q.add("c");
        q.add_after("d", MS);
        q.add_rate_limited("e");
        tokio::time::advance(MS * 10).await;
        assert_eq!(q.get().await, Some("a"), "client-go's Get keeps returning queued items");
        assert_eq!(q.get().await, Some("b"));
        assert_eq!(q.get().await, None, "then reports the shutdown");
        assert_eq!(q.num_requeues(&"e"), 0);
        assert_eq!(q.metrics().retries, 0);
        assert_eq!(q.metrics().waiting, 0, "delayed items are dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn after_shutdown_done_still_requeues_an_item_re_added_before() {
        let q = queue();
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        q.add("a");
        q.shutdown();
        assert_eq!(q.get().await, None, "nothing queued yet: shut down");
        q.done(&"a");
        assert_eq!(q.get().await, Some("a"), "the worker that called done takes it");
        q.done(&"a");
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_wakes_waiting_workers() {
        let q = queue();
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.get().await })
            })
            .collect();
        tokio::task::yield_now().await;
        q.shutdown();
        for worker in workers {
            assert_eq!(worker.await.ok(), Some(None));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_with_drain_waits_for_in_flight_items() {
        let q = queue();
        q.add("a");
        q.add("b");
        let a = q.get().await;
        let b = q.get().await;
        assert_eq!((a, b), (Some("a"), Some("b")));
        let drain = tokio::spawn({
            let q = q.clone();
            async move { q.shutdown_with_drain().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(q.is_shutting_down());
        assert!(!drain.is_finished());
        q.done(&"a");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!drain.is_finished(), "b is still processing");
        q.done(&"b");
        assert!(drain.await.is_ok());
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn drain_hands_out_queued_items_and_waits_only_for_those_processing() {
        let q = queue();
        q.add("a");
        q.add("b");
        assert_eq!(q.get().await, Some("a"));
        q.add("a"); // re-added while processing, before the shutdown
        q.add_after("late", MS); // dropped by the shutdown
        let drain = tokio::spawn({
            let q = q.clone();
            async move { q.shutdown_with_drain().await }
        });
        tokio::task::yield_now().await;
        q.add("c"); // ignored
        assert_eq!(q.get().await, Some("b"));
        q.done(&"b");
        assert_eq!(
            q.get().await,
            None,
            "nothing queued: as client-go, no wait for a's requeue"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!drain.is_finished(), "a is processing");
        q.done(&"a");
        assert!(drain.await.is_ok(), "nothing processing");
        assert_eq!(q.len(), 1, "a was queued again by done");
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn drain_after_a_plain_shutdown_still_waits_for_done() {
        let q = queue();
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        q.shutdown();
        let drain = tokio::spawn({
            let q = q.clone();
            async move { q.shutdown_with_drain().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!drain.is_finished());
        q.done(&"a");
        assert!(drain.await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn drain_of_an_idle_queue_returns_at_once_even_with_items_queued() {
        let q = queue();
        q.add("a");
        assert!(q.shutdown_with_drain().now_or_never().is_some());
        assert_eq!(q.get().await, Some("a"), "still handed out");
        q.done(&"a");
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn plain_shutdown_ends_a_drain() {
        let q = queue();
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        let drain = tokio::spawn({
            let q = q.clone();
            async move { q.shutdown_with_drain().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!drain.is_finished());
        q.shutdown();
        assert!(drain.await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_add_becomes_ready_at_its_deadline() {
        let q = queue();
        q.add_after("a", MS * 100);
        assert_eq!(q.len(), 0);
        assert_eq!(q.metrics().waiting, 1);
        tokio::time::advance(MS * 99).await;
        assert_eq!(q.len(), 0);
        tokio::time::advance(MS).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.metrics().waiting, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn get_waits_for_a_delayed_add() {
        let q = queue();
        let start = Instant::now();
        q.add_after("a", Duration::from_secs(3));
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn shorter_delay_for_the_same_item_wins() {
        // (delays in ms, in order of the calls; expected ready time in ms)
        let table: [(&[u32], u32); 4] = [
            (&[50, 10], 10),
            (&[10, 50], 10),
            (&[30, 20, 40, 25], 20),
            (&[20, 20], 20),
        ];
        for (delays, ready) in table {
            let q = queue();
            let start = Instant::now();
            for delay in delays {
                q.add_after("a", MS * *delay);
            }
            assert_eq!(q.get().await, Some("a"), "{delays:?}");
            assert_eq!(start.elapsed(), MS * ready, "{delays:?}");
            q.done(&"a");
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(q.len(), 0, "{delays:?}: delivered once");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_zero_is_immediate() {
        let q = queue();
        q.add_after("a", Duration::ZERO);
        assert_eq!(q.len(), 1);
        assert_eq!(try_take(&q), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_items_come_out_in_deadline_order_and_dedup_with_queued() {
        let q = queue();
        q.add_after("c", MS * 30);
        q.add_after("a", MS * 10);
        q.add_after("b", MS * 20);
        q.add("b");
        assert_eq!(q.get().await, Some("b"));
        q.done(&"b");
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(q.get().await);
        }
        assert_eq!(got, [Some("a"), Some("b"), Some("c")]);
        q.add_after("d", MS * 10);
        q.add("d");
        tokio::time::advance(MS * 10).await;
        assert_eq!(q.len(), 1, "the delayed d merged with the queued d");
    }

    #[tokio::test(start_paused = true)]
    async fn huge_delay_does_not_panic() {
        let q = queue();
        q.add_after("a", Duration::MAX);
        q.add_after("b", Duration::from_secs(86_400 * 365 * 10));
        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert_eq!(q.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_exponentially_and_forget_resets() {
        let q = queue();
        // Each round: add rate limited, measure when the item comes back.
        for (round, expected_ms) in [5, 10, 20, 40, 80].into_iter().enumerate() {
            let start = Instant::now();
            q.add_rate_limited("a");
            assert_eq!(q.get().await, Some("a"));
            assert_eq!(start.elapsed(), MS * expected_ms, "round {round}");
            q.done(&"a");
        }
        assert_eq!(q.num_requeues(&"a"), 5);
        q.forget(&"a");
        assert_eq!(q.num_requeues(&"a"), 0);
        let start = Instant::now();
        q.add_rate_limited("a");
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(start.elapsed(), MS * 5);
    }

    #[tokio::test(start_paused = true)]
    async fn default_queue_uses_the_controller_rate_limiter() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let start = Instant::now();
        q.add_rate_limited(1);
        assert_eq!(q.get().await, Some(1));
        assert_eq!(start.elapsed(), MS * 5);
        assert_eq!(q.num_requeues(&1), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_adds_latency_work_and_retries() {
        let q = WorkQueue::builder().name("test").rate_limiter(queue_limiter()).build();
        q.add("a");
        q.add("a"); // deduplicated: not counted
        q.add("b");
        tokio::time::advance(MS * 10).await;
        let m = q.metrics();
        assert_eq!(m.name.as_deref(), Some("test"));
        assert_eq!((m.depth, m.processing, m.adds), (2, 0, 2));

        assert_eq!(q.get().await, Some("a"));
        tokio::time::advance(MS * 30).await;
        assert_eq!(q.get().await, Some("b"));
        tokio::time::advance(MS * 20).await;
        let m = q.metrics();
        assert_eq!(m.depth, 0);
        assert_eq!(m.processing, 2);
        assert_eq!(m.queue_latency.count(), 2);
        assert_eq!(m.queue_latency.sum(), MS * 50); // 10 + 40
        assert_eq!(m.longest_running_processor, MS * 50);
        assert_eq!(m.unfinished_work, MS * 70); // 50 + 20

        q.done(&"a");
        q.add_rate_limited("b"); // a retry while processing
        q.done(&"b");
        let m = q.metrics();
        assert_eq!(m.work_duration.count(), 2);
        assert_eq!(m.work_duration.sum(), MS * 70);
        assert_eq!(m.retries, 1);
        assert_eq!(m.waiting, 1);
        assert_eq!((m.processing, m.unfinished_work), (0, Duration::ZERO));
        tokio::time::advance(MS * 5).await;
        let m = q.metrics();
        assert_eq!((m.waiting, m.depth, m.adds), (0, 1, 3));
    }

    fn queue_limiter() -> ItemExponentialFailureRateLimiter<&'static str> {
        ItemExponentialFailureRateLimiter::new(MS * 5, Duration::from_secs(1000))
    }

    #[tokio::test(start_paused = true)]
    async fn many_workers_never_process_one_item_concurrently() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let in_flight = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let processed = Arc::new(Mutex::new(0_u32));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (q, in_flight, processed) = (q.clone(), Arc::clone(&in_flight), Arc::clone(&processed));
                tokio::spawn(async move {
                    while let Some(item) = q.get().await {
                        assert!(lock(&in_flight).insert(item), "{item} handed out twice");
                        tokio::time::sleep(MS).await;
                        q.add(item % 3); // re-adds while processing
                        assert!(lock(&in_flight).remove(&item));
                        *lock(&processed) += 1;
                        q.done(&item);
                    }
                })
            })
            .collect();
        for item in 0..200 {
            q.add(item % 10);
            tokio::task::yield_now().await;
        }
        q.shutdown_with_drain().await;
        for worker in workers {
            assert!(worker.await.is_ok());
        }
        assert!(*lock(&processed) >= 10);
        assert!(lock(&in_flight).is_empty());
    }

    /// An item whose `Hash` panics for 13, to poison the queue's lock.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Bomb(u32);

    impl Hash for Bomb {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            assert_ne!(self.0, 13, "boom");
            self.0.hash(state);
        }
    }

    #[test]
    fn queue_keeps_working_after_an_item_panics_under_the_lock() {
        let q: WorkQueue<Bomb> = WorkQueue::new();
        q.add(Bomb(1));
        let add = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| q.add(Bomb(13))));
        assert!(add.is_err());
        assert!(q.shared.state.is_poisoned());
        q.add(Bomb(2));
        assert_eq!(q.len(), 2);
        let blocking = q.blocking();
        assert_eq!(blocking.get(), Some(Bomb(1)));
        blocking.done(&Bomb(1));
    }

    #[test]
    fn handles_and_futures_are_send_and_sync() {
        fn send_sync<S: Send + Sync>(_: &S) {}
        fn send<F: Send>(_: &F) {}
        let q: WorkQueue<String> = WorkQueue::new();
        send_sync(&q);
        send_sync(&q.blocking());
        send(&q.get());
        send(&q.shutdown_with_drain());
    }
}
