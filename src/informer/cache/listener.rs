//! What a volatile handler has still to hear of: the keys whose state changed since it was last
//! told, each with the state it was last told of.
//!
//! The invariant: for a key *not* pending, the handler's view equals the cache's state. The
//! cache keeps it: a change to a key that is not pending marks it pending with the replaced
//! state as the one told; a change to a pending key changes nothing here. Delivering a key
//! tells the handler the cache's state at that moment (read under the same lock the cache
//! changes under), so the invariant holds again. Events are derived from the two states: an
//! add, an update (old: the state told), or a delete (the final state the server sent, when it
//! did); a rollback is just one more change, so a handler told of a change that is then taken
//! back hears of the restored state. A handler that falls behind holds one pending entry per
//! key, never more: memory is bounded by the number of objects, and a slow handler sees the
//! newest state of each key (like a workqueue), never a stale one.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::objects::Entry;
use crate::object::ObjectKey;
use crate::store::Seq;
use crate::util::Locked;

/// One key a handler has to hear of.
pub(crate) struct Dirty<K> {
    /// The state the handler was last told of (`None`: nothing, or a delete).
    pub(crate) told: Option<Arc<Entry<K>>>,
    /// A delete's final state as the server sent it, if the key was deleted since.
    pub(crate) deleted: Option<Arc<Entry<K>>>,
    /// The delete was found by a relist.
    pub(crate) final_state_unknown: bool,
    /// A synthetic add of the handler's initial list (registration, or the cache's first load).
    pub(crate) initial: bool,
    /// A periodic resync: tell the current state even if it did not change.
    pub(crate) resync: bool,
    /// The seq of the first change not yet told (for the handler's cursor, and `initial`).
    pub(crate) since: Seq,
    /// Its place in the handler's order (for `has_synced`).
    ticket: u64,
}

#[derive(Default)]
struct State<K> {
    order: VecDeque<ObjectKey>,
    pending: HashMap<ObjectKey, Dirty<K>>,
    next_ticket: u64,
    /// Entries with a ticket below this must be told before the handler is synced.
    barrier: Option<u64>,
    /// How many of them are still pending.
    below: usize,
    stopped: bool,
}

/// One volatile handler's pending keys; see the module documentation.
pub(crate) struct Listener<K> {
    state: Mutex<State<K>>,
    /// Woken when a key becomes pending (or the cache reloaded).
    pub(crate) notify: Notify,
}

impl<K> Default for Listener<K> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                order: VecDeque::new(),
                pending: HashMap::new(),
                next_ticket: 0,
                barrier: None,
                below: 0,
                stopped: false,
            }),
            notify: Notify::new(),
        }
    }
}

/// What changed about a key, for [`Listener::changed`].
pub(crate) struct Change<'a, K> {
    pub(crate) key: &'a ObjectKey,
    /// The state the change replaced (what a handler that is not behind was told).
    pub(crate) before: Option<&'a Arc<Entry<K>>>,
    /// A delete's final state, when the server sent it.
    pub(crate) deleted: Option<&'a Arc<Entry<K>>>,
    pub(crate) final_state_unknown: bool,
    pub(crate) initial: bool,
    pub(crate) resync: bool,
    pub(crate) seq: Seq,
}

impl<K> Listener<K> {
    /// A key changed (called by the cache under its write lock, so the change and this are one
    /// step for [`pop`](Self::pop)).
    pub(crate) fn changed(&self, c: &Change<'_, K>) {
        let mut st = self.state.locked();
        if st.stopped {
            return;
        }
        if let Some(d) = st.pending.get_mut(c.key) {
            // Already pending: what the handler was told stays as it is.
            if c.deleted.is_some() || c.final_state_unknown {
                d.deleted = c.deleted.cloned();
                d.final_state_unknown = c.final_state_unknown;
            }
            d.resync |= c.resync;
            return;
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.pending.insert(
            c.key.clone(),
            Dirty {
                told: c.before.cloned(),
                deleted: c.deleted.cloned(),
                final_state_unknown: c.final_state_unknown,
                initial: c.initial,
                resync: c.resync,
                since: c.seq,
                ticket,
            },
        );
        st.order.push_back(c.key.clone());
        drop(st);
        self.notify.notify_one();
    }

    /// The oldest pending key, taken off (the caller reads the cache's state under the same
    /// cache lock it held when calling this, and tells the handler).
    pub(crate) fn pop(&self) -> Option<(ObjectKey, Dirty<K>)> {
        let mut st = self.state.locked();
        while let Some(key) = st.order.pop_front() {
            if let Some(d) = st.pending.remove(&key) {
                if st.barrier.is_some_and(|b| d.ticket < b) {
                    st.below = st.below.saturating_sub(1);
                }
                return Some((key, d));
            }
        }
        None
    }

    /// A key popped could not be told after all (its state could not be read): it is pending
    /// again with what the handler was really told, first in line.
    pub(crate) fn put_back(&self, key: ObjectKey, dirty: Dirty<K>) {
        let mut st = self.state.locked();
        let below = st.barrier.is_some_and(|b| dirty.ticket < b);
        match st.pending.get_mut(&key) {
            Some(d) => {
                d.told = dirty.told;
                d.ticket = d.ticket.min(dirty.ticket);
                d.since = d.since.min(dirty.since);
            }
            None => {
                st.pending.insert(key.clone(), dirty);
                st.order.push_front(key);
            }
        }
        if below {
            st.below += 1;
        }
        drop(st);
        self.notify.notify_one();
    }

    /// The handler is synced once everything pending now has been told.
    pub(crate) fn set_barrier(&self) {
        let mut st = self.state.locked();
        if st.barrier.is_none() {
            st.barrier = Some(st.next_ticket);
            st.below = st.pending.len();
        }
    }

    /// Whether everything pending at the barrier has been told.
    pub(crate) fn synced(&self) -> bool {
        let st = self.state.locked();
        st.barrier.is_some() && st.below == 0
    }

    /// The seq of the change that made the first key in line pending (about the oldest not
    /// yet told), if any.
    pub(crate) fn first_since(&self) -> Option<Seq> {
        let mut st = self.state.locked();
        while let Some(k) = st.order.front() {
            if let Some(d) = st.pending.get(k) {
                return Some(d.since);
            }
            st.order.pop_front();
        }
        None
    }

    /// Stops taking changes (the handler was removed).
    pub(crate) fn stop(&self) {
        let mut st = self.state.locked();
        st.stopped = true;
        st.pending.clear();
        st.order.clear();
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

    fn change<'a>(key: &'a ObjectKey, before: Option<&'a E>, seq: u64) -> Change<'a, serde_json::Value> {
        Change {
            key,
            before,
            deleted: None,
            final_state_unknown: false,
            initial: false,
            resync: false,
            seq: Seq(seq),
        }
    }

    #[test]
    fn a_key_changed_twice_while_pending_keeps_what_was_told_and_its_place() {
        let l = Listener::default();
        let (a, b) = (ObjectKey::cluster("a"), ObjectKey::cluster("b"));
        let a1 = e("a", 1);
        l.changed(&change(&a, Some(&a1), 2));
        l.changed(&change(&b, None, 3));
        let a2 = e("a", 2);
        l.changed(&change(&a, Some(&a2), 4));
        assert_eq!(l.first_since(), Some(Seq(2)));
        let (k, d) = l.pop().expect("a");
        assert_eq!(k, a);
        assert_eq!(d.told.expect("told").meta.resource_version.as_str(), "1");
        assert_eq!(l.pop().expect("b").0, b);
        assert!(l.pop().is_none());
    }

    #[test]
    fn synced_once_everything_pending_at_the_barrier_is_told() {
        let l: Listener<serde_json::Value> = Listener::default();
        let (a, b, c) = (
            ObjectKey::cluster("a"),
            ObjectKey::cluster("b"),
            ObjectKey::cluster("c"),
        );
        l.changed(&change(&a, None, 1));
        l.changed(&change(&b, None, 2));
        assert!(!l.synced(), "no barrier yet");
        l.set_barrier();
        l.changed(&change(&c, None, 3));
        let first = l.pop().expect("a");
        assert!(!l.synced());
        // Put back: pending again, still before the barrier.
        l.put_back(first.0, first.1);
        assert!(!l.synced());
        l.pop();
        l.pop();
        assert!(l.synced(), "c came after the barrier");
    }
}
