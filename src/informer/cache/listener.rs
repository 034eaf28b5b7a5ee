//! What a volatile handler has still to hear of.
//!
//! While a handler keeps up it is told every change, in order, exactly as the cache took it
//! (client-go's behaviour): the changes queue up, each with the entries before and after. A
//! handler further behind than [`EXACT_LIMIT`] changes is told each changed object's newest
//! state instead (like a workqueue): the queue folds into one pending entry per key, with the
//! state the handler was last told, until it has caught up. Memory is thus bounded by the
//! limit or by the number of objects, never by how far behind a handler is.
//!
//! The invariant of the folded mode: for a key *not* pending, the handler's view equals the
//! cache's state. The cache keeps it: a change to a key that is not pending marks it pending
//! with the replaced state as the one told; a change to a pending key changes nothing here.
//! Delivering a key tells the handler the cache's state at that moment (read under the lock
//! the cache changes under), so the invariant holds again. In the exact mode the handler's view
//! is the cache's state with the queued changes taken back, so folding the queue in order gives
//! each key's pending entry the state the handler holds. A rollback is one more change to the
//! handler either way, so a handler told of a change that is then taken back hears of the
//! restored state.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::objects::Entry;
use crate::object::ObjectKey;
use crate::store::Seq;
use crate::util::Locked;

/// The most changes a handler is told one by one while behind; beyond, it is told each
/// object's newest state.
pub(crate) const EXACT_LIMIT: usize = 16_384;

/// One change to tell, as the cache took it (exact mode), or one key with the state the
/// handler was last told (folded mode: `after` is read from the cache at delivery).
pub(crate) struct Dirty<K> {
    pub(crate) key: ObjectKey,
    /// The state the handler holds (`None`: nothing, or a delete).
    pub(crate) told: Option<Arc<Entry<K>>>,
    /// The state to tell (exact mode); `None` in the folded mode, where it is the cache's.
    pub(crate) after: Option<Option<Arc<Entry<K>>>>,
    /// A delete's final state as the server sent it.
    pub(crate) deleted: Option<Arc<Entry<K>>>,
    /// The delete was found by a relist (or is a rollback's).
    pub(crate) final_state_unknown: bool,
    /// A synthetic add of the handler's initial list (registration, or the cache's first load).
    pub(crate) initial: bool,
    /// A periodic resync: tell the state even if it did not change.
    pub(crate) resync: bool,
    /// The seq of the (first) change to tell (for the handler's cursor, and `initial`).
    pub(crate) since: Seq,
    /// Its place in the handler's order (for `has_synced`).
    ticket: u64,
}

enum Mode<K> {
    Exact(VecDeque<Dirty<K>>),
    Folded {
        order: VecDeque<ObjectKey>,
        pending: HashMap<ObjectKey, Dirty<K>>,
    },
}

struct State<K> {
    mode: Mode<K>,
    /// The most changes queued one by one (see [`EXACT_LIMIT`]).
    limit: usize,
    next_ticket: u64,
    /// Entries with a ticket below this must be told before the handler is synced.
    barrier: Option<u64>,
    /// How many of them are still to tell.
    below: usize,
    stopped: bool,
    /// Times the queue was folded (for the issue it reports).
    folds: u64,
}

/// One volatile handler's changes to tell; see the module documentation.
pub(crate) struct Listener<K> {
    state: Mutex<State<K>>,
    /// Woken when there is something to tell (or the cache reloaded).
    pub(crate) notify: Notify,
    /// Registered while the cache was (re)loading: its initial list is every object of the
    /// table the load brings, not only what the load changed.
    initial_pending: std::sync::atomic::AtomicBool,
}

impl<K> Default for Listener<K> {
    fn default() -> Self {
        Self::new(EXACT_LIMIT)
    }
}

impl<K> Listener<K> {
    /// A listener telling at most `limit` changes one by one while behind.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            state: Mutex::new(State {
                mode: Mode::Exact(VecDeque::new()),
                limit: limit.max(1),
                next_ticket: 0,
                barrier: None,
                below: 0,
                stopped: false,
                folds: 0,
            }),
            notify: Notify::new(),
            initial_pending: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// What changed about a key, for [`Listener::changed`].
pub(crate) struct Change<'a, K> {
    pub(crate) key: &'a ObjectKey,
    /// The state the change replaced.
    pub(crate) before: Option<&'a Arc<Entry<K>>>,
    /// The state after it.
    pub(crate) after: Option<&'a Arc<Entry<K>>>,
    /// A delete's final state, when the server sent it.
    pub(crate) deleted: Option<&'a Arc<Entry<K>>>,
    pub(crate) final_state_unknown: bool,
    pub(crate) initial: bool,
    pub(crate) resync: bool,
    pub(crate) seq: Seq,
}

impl<K> State<K> {
    fn len(&self) -> usize {
        match &self.mode {
            Mode::Exact(q) => q.len(),
            Mode::Folded { pending, .. } => pending.len(),
        }
    }

    fn below_barrier(&self, ticket: u64) -> bool {
        self.barrier.is_some_and(|b| ticket < b)
    }

    /// Marks `d`'s key pending in the folded mode (a key already pending keeps what it was
    /// told, its place and its ticket).
    fn fold_in(order: &mut VecDeque<ObjectKey>, pending: &mut HashMap<ObjectKey, Dirty<K>>, d: Dirty<K>) -> bool {
        match pending.get_mut(&d.key) {
            Some(p) => {
                if d.deleted.is_some() || d.final_state_unknown {
                    p.deleted = d.deleted;
                    p.final_state_unknown = d.final_state_unknown;
                }
                p.resync |= d.resync;
                false
            }
            None => {
                order.push_back(d.key.clone());
                pending.insert(d.key.clone(), Dirty { after: None, ..d });
                true
            }
        }
    }

    /// Turns the queue into one pending entry per key.
    fn fold(&mut self) {
        let Mode::Exact(queue) = &mut self.mode else { return };
        let queue = std::mem::take(queue);
        let (mut order, mut pending) = (VecDeque::new(), HashMap::new());
        for d in queue {
            State::fold_in(&mut order, &mut pending, d);
        }
        self.below = pending.values().filter(|d| self.below_barrier(d.ticket)).count();
        self.mode = Mode::Folded { order, pending };
        self.folds += 1;
    }
}

impl<K> Listener<K> {
    /// A key changed (called by the cache under its write lock, so the change and this are one
    /// step for [`pop`](Self::pop)).
    pub(crate) fn changed(&self, c: &Change<'_, K>) {
        let mut st = self.state.locked();
        if st.stopped {
            return;
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let d = Dirty {
            key: c.key.clone(),
            told: c.before.cloned(),
            after: Some(c.after.cloned()),
            deleted: c.deleted.cloned(),
            final_state_unknown: c.final_state_unknown,
            initial: c.initial,
            resync: c.resync,
            since: c.seq,
            ticket,
        };
        let added = match &mut st.mode {
            Mode::Exact(queue) => {
                queue.push_back(d);
                true
            }
            Mode::Folded { order, pending } => State::fold_in(order, pending, d),
        };
        if matches!(st.mode, Mode::Exact(ref q) if q.len() > st.limit) {
            st.fold();
        }
        drop(st);
        if added {
            self.notify.notify_one();
        }
    }

    /// The next change (or key) to tell, taken off (the caller reads the cache's state, for a
    /// folded key, under the same cache lock it held when calling this).
    pub(crate) fn pop(&self) -> Option<Dirty<K>> {
        let mut st = self.state.locked();
        let popped = match &mut st.mode {
            Mode::Exact(queue) => queue.pop_front(),
            Mode::Folded { order, pending } => {
                let mut found = None;
                while let Some(key) = order.pop_front() {
                    if let Some(d) = pending.remove(&key) {
                        found = Some(d);
                        break;
                    }
                }
                found
            }
        };
        if let Some(d) = &popped {
            if st.below_barrier(d.ticket) {
                st.below = st.below.saturating_sub(1);
            }
        }
        // Caught up: back to telling every change.
        if matches!(&st.mode, Mode::Folded { pending, .. } if pending.is_empty()) {
            st.mode = Mode::Exact(VecDeque::new());
        }
        popped
    }

    /// A folded key popped could not be told after all (its state could not be read): it is
    /// pending again with what the handler really holds, first in line.
    pub(crate) fn put_back(&self, dirty: Dirty<K>) {
        let mut st = self.state.locked();
        let below = st.below_barrier(dirty.ticket);
        // Not a handler falling behind: no fold counted.
        let folds = st.folds;
        st.fold();
        st.folds = folds;
        let Mode::Folded { order, pending } = &mut st.mode else {
            return;
        };
        match pending.get_mut(&dirty.key) {
            Some(d) => {
                d.told = dirty.told;
                d.ticket = d.ticket.min(dirty.ticket);
                d.since = d.since.min(dirty.since);
            }
            None => {
                order.push_front(dirty.key.clone());
                pending.insert(dirty.key.clone(), dirty);
            }
        }
        if below {
            st.below += 1;
        }
        drop(st);
        self.notify.notify_one();
    }

    /// A change popped could not be told for a while (its state could not be read): it is
    /// first in line again as it was, its state to tell included.
    pub(crate) fn retry(&self, dirty: Dirty<K>) {
        let mut st = self.state.locked();
        let below = st.below_barrier(dirty.ticket);
        let Mode::Exact(queue) = &mut st.mode else {
            drop(st);
            return self.put_back(Dirty { after: None, ..dirty });
        };
        queue.push_front(dirty);
        if below {
            st.below += 1;
        }
        drop(st);
        self.notify.notify_one();
    }

    /// The handler is synced once everything to tell now has been told.
    /// Marks it registered while the cache loads (see `initial_pending`).
    pub(crate) fn await_initial(&self) {
        self.initial_pending.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether it still waits for its initial list; clears the mark.
    pub(crate) fn take_initial(&self) -> bool {
        self.initial_pending.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    pub(crate) fn set_barrier(&self) {
        let mut st = self.state.locked();
        if st.barrier.is_none() {
            st.barrier = Some(st.next_ticket);
            st.below = st.len();
            drop(st);
            // Its task looks at `synced` again (there may be nothing left to tell).
            self.notify.notify_one();
        }
    }

    /// Whether everything to tell at the barrier has been told.
    pub(crate) fn synced(&self) -> bool {
        let st = self.state.locked();
        st.barrier.is_some() && st.below == 0
    }

    /// The seq of the next change to tell (about the oldest not yet told), if any.
    pub(crate) fn first_since(&self) -> Option<Seq> {
        let mut st = self.state.locked();
        match &mut st.mode {
            Mode::Exact(queue) => queue.front().map(|d| d.since),
            Mode::Folded { order, pending } => {
                while let Some(k) = order.front() {
                    if let Some(d) = pending.get(k) {
                        return Some(d.since);
                    }
                    order.pop_front();
                }
                None
            }
        }
    }

    /// How many times the handler fell so far behind that it was told newest states only, and
    /// the limit it passed.
    pub(crate) fn folds(&self) -> (u64, usize) {
        let st = self.state.locked();
        (st.folds, st.limit)
    }

    /// Stops taking changes (the handler was removed).
    pub(crate) fn stop(&self) {
        let mut st = self.state.locked();
        st.stopped = true;
        st.mode = Mode::Exact(VecDeque::new());
        drop(st);
        self.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::ObjectMeta;

    type E = Arc<Entry<serde_json::Value>>;

    fn e(name: &str, rv: u64) -> E {
        Arc::new(Entry::new(
            Arc::new(ObjectMeta {
                name: name.into(),
                resource_version: rv.to_string().into(),
                ..ObjectMeta::default()
            }),
            Arc::from(Vec::new()),
            Seq(rv),
            None,
        ))
    }

    fn change<'a>(
        key: &'a ObjectKey,
        before: Option<&'a E>,
        after: Option<&'a E>,
        seq: u64,
    ) -> Change<'a, serde_json::Value> {
        Change {
            key,
            before,
            after,
            deleted: None,
            final_state_unknown: false,
            initial: false,
            resync: false,
            seq: Seq(seq),
        }
    }

    fn rv(e: &Option<E>) -> Option<String> {
        e.as_ref().map(|e| e.meta.resource_version.to_string())
    }

    #[test]
    fn a_handler_keeping_up_is_told_every_change_in_order() {
        let l = Listener::default();
        let a = ObjectKey::cluster("a");
        let (a1, a2) = (e("a", 1), e("a", 2));
        l.changed(&change(&a, None, Some(&a1), 1));
        l.changed(&change(&a, Some(&a1), Some(&a2), 2));
        let first = l.pop().expect("the add");
        assert_eq!(
            (rv(&first.told), first.after.as_ref().map(rv)),
            (None, Some(Some("1".into())))
        );
        let second = l.pop().expect("the update");
        assert_eq!(
            (rv(&second.told), second.after.as_ref().map(rv)),
            (Some("1".into()), Some(Some("2".into())))
        );
        assert!(l.pop().is_none());
    }

    #[test]
    fn far_behind_each_key_is_folded_keeping_what_was_told_and_its_place() {
        let l = Listener::default();
        let keys: Vec<ObjectKey> = (0..=EXACT_LIMIT).map(|i| ObjectKey::cluster(format!("k{i}"))).collect();
        let a = ObjectKey::cluster("a");
        let (a1, a2) = (e("a", 1), e("a", 2));
        l.changed(&change(&a, Some(&a1), Some(&a2), 1));
        for (i, k) in keys.iter().enumerate() {
            l.changed(&change(k, None, None, 2 + i as u64));
        }
        assert_eq!(l.folds(), (1, EXACT_LIMIT));
        let a3 = e("a", 3);
        l.changed(&change(&a, Some(&a2), Some(&a3), 100_000));
        let first = l.pop().expect("a");
        assert_eq!(first.key, a);
        assert_eq!(rv(&first.told), Some("1".into()), "still what the handler holds");
        assert!(first.after.is_none(), "the cache's state is told");
        assert_eq!(l.first_since(), Some(Seq(2)));
        for _ in 0..=EXACT_LIMIT {
            l.pop().expect("a key");
        }
        assert!(l.pop().is_none());
        // Caught up: exact again.
        l.changed(&change(&a, Some(&a3), None, 100_001));
        assert!(l.pop().expect("the delete").after.is_some());
    }

    #[test]
    fn synced_once_everything_at_the_barrier_is_told_in_either_mode() {
        let l: Listener<serde_json::Value> = Listener::default();
        let (a, b, c) = (
            ObjectKey::cluster("a"),
            ObjectKey::cluster("b"),
            ObjectKey::cluster("c"),
        );
        l.changed(&change(&a, None, None, 1));
        l.changed(&change(&b, None, None, 2));
        assert!(!l.synced(), "no barrier yet");
        l.set_barrier();
        l.changed(&change(&c, None, None, 3));
        let first = l.pop().expect("a");
        assert!(!l.synced());
        // Put back (folds): pending again, still before the barrier.
        l.put_back(first);
        assert!(!l.synced());
        l.pop();
        l.pop();
        assert!(l.synced(), "c came after the barrier");
    }
}
