//! Getting keys into the workqueue: with the reason of the first request (what the reconcile
//! span reports, as kube-runtime keeps the first reason of a request), and, with a debounce,
//! held until the key has been quiet that long (kube-runtime's trailing-edge debounce).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::controller::ReconcileReason;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::object::ObjectKey;
use crate::queue::WorkQueue;
use crate::util::Locked;

/// Enqueues keys for one controller. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Enqueue {
    pub(crate) queue: WorkQueue<ObjectKey>,
    reasons: Arc<Mutex<HashMap<ObjectKey, ReconcileReason>>>,
    debounce: Option<Debouncer>,
}

impl Enqueue {
    pub(crate) fn new(queue: WorkQueue<ObjectKey>, debounce: Duration) -> Self {
        Self {
            queue,
            reasons: Arc::default(),
            debounce: (!debounce.is_zero()).then(|| Debouncer::new(debounce)),
        }
    }

    /// Asks for a reconcile of `key` (after the debounce, if any); `reason` is kept unless the
    /// key already waits with one.
    pub(crate) fn add(&self, key: ObjectKey, reason: impl FnOnce() -> ReconcileReason) {
        self.note(&key, reason);
        match &self.debounce {
            None => self.queue.add(key),
            Some(d) => d.push(key),
        }
    }

    /// Keeps `reason` for `key` unless it has one.
    pub(crate) fn note(&self, key: &ObjectKey, reason: impl FnOnce() -> ReconcileReason) {
        let mut reasons = self.reasons.locked();
        if !reasons.contains_key(key) {
            reasons.insert(key.clone(), reason());
        }
    }

    /// The reason `key` was queued for, taken (a later request records its own).
    pub(crate) fn take_reason(&self, key: &ObjectKey) -> ReconcileReason {
        self.reasons.locked().remove(key).unwrap_or(ReconcileReason::Unknown)
    }

    /// Moves debounced keys into the queue as their quiet period ends, until the queue shuts
    /// down; nothing to do without a debounce.
    pub(crate) async fn run_debounce(self) {
        let Some(d) = self.debounce.clone() else {
            return;
        };
        loop {
            if self.queue.is_shutting_down() {
                return;
            }
            let notified = d.notify.notified();
            let next = d.state.locked().order.first().map(|(at, _, _)| *at);
            match next {
                None => notified.await,
                Some(at) if at > Instant::now() => {
                    let _ = tokio::time::timeout_at(at, notified).await;
                }
                Some(_) => {
                    for key in d.expired(Instant::now()) {
                        self.queue.add(key);
                    }
                }
            }
        }
    }
}

/// Keys waiting for their quiet period to end.
#[derive(Clone)]
struct Debouncer {
    delay: Duration,
    state: Arc<Mutex<Pending>>,
    notify: Arc<Notify>,
}

#[derive(Default)]
struct Pending {
    /// When each key is due, and the order by that time (with a tiebreak counter).
    due: HashMap<ObjectKey, (Instant, u64)>,
    order: BTreeSet<(Instant, u64, ObjectKey)>,
    next: u64,
}

impl Debouncer {
    fn new(delay: Duration) -> Self {
        Self {
            delay,
            state: Arc::default(),
            notify: Arc::default(),
        }
    }

    /// Due `delay` from now, whatever was due before: another request restarts the wait.
    fn push(&self, key: ObjectKey) {
        let at = Instant::now() + self.delay;
        {
            let mut st = self.state.locked();
            let n = st.next;
            st.next += 1;
            if let Some((old_at, old_n)) = st.due.insert(key.clone(), (at, n)) {
                st.order.remove(&(old_at, old_n, key.clone()));
            }
            st.order.insert((at, n, key));
        }
        self.notify.notify_one();
    }

    fn expired(&self, now: Instant) -> Vec<ObjectKey> {
        let mut st = self.state.locked();
        let mut out = Vec::new();
        while st.order.first().is_some_and(|(at, _, _)| *at <= now) {
            if let Some((_, _, key)) = st.order.pop_first() {
                st.due.remove(&key);
                out.push(key);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn key(name: &str) -> ObjectKey {
        ObjectKey::namespaced("ns", name)
    }

    /// Takes whatever the queue hands out now, without waiting.
    async fn ready(queue: &WorkQueue<ObjectKey>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(Some(k)) = tokio::time::timeout(Duration::ZERO, queue.get()).await {
            queue.done(&k);
            out.push(k.name);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_requests_is_one_reconcile_after_the_key_went_quiet() {
        let enqueue = Enqueue::new(WorkQueue::new(), MS * 300);
        let task = tokio::spawn(enqueue.clone().run_debounce());
        // Five requests 100 ms apart: each restarts the 300 ms wait.
        for _ in 0..5 {
            enqueue.add(key("a"), || ReconcileReason::ObjectUpdated);
            tokio::time::sleep(MS * 100).await;
        }
        enqueue.add(key("b"), || ReconcileReason::Unknown);
        // 100 ms after a's last request: neither is due.
        assert!(ready(&enqueue.queue).await.is_empty());
        tokio::time::sleep(MS * 150).await;
        assert!(
            ready(&enqueue.queue).await.is_empty(),
            "a is due 300 ms after its last request"
        );
        tokio::time::sleep(MS * 60).await;
        assert_eq!(ready(&enqueue.queue).await, ["a"], "once, after the burst");
        tokio::time::sleep(MS * 100).await;
        assert_eq!(ready(&enqueue.queue).await, ["b"]);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(ready(&enqueue.queue).await.is_empty(), "nothing more");
        // The first request's reason is the one reported.
        assert!(matches!(enqueue.take_reason(&key("a")), ReconcileReason::ObjectUpdated));
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_debounce_a_request_is_due_at_once() {
        let enqueue = Enqueue::new(WorkQueue::new(), Duration::ZERO);
        enqueue.add(key("a"), || ReconcileReason::ObjectUpdated);
        enqueue.add(key("a"), || ReconcileReason::BulkReconcile);
        assert_eq!(ready(&enqueue.queue).await, ["a"], "deduplicated by the queue");
        assert!(matches!(enqueue.take_reason(&key("a")), ReconcileReason::ObjectUpdated));
        assert!(
            matches!(enqueue.take_reason(&key("a")), ReconcileReason::Unknown),
            "taken: none left"
        );
    }
}
