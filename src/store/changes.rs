//! The change stream: the store's one in-memory output, each subscribed scope's changes in the
//! order the writer decided them, so readers above the store (the informer's cache) never
//! read back what was just written.
//!
//! A change is published where the writer decides it: a group that commits without an fsync
//! publishes each change before writing its rows (so handlers hear of it at once); any other
//! group publishes its changes once it has committed. Should a group that published early
//! fail, or commits not yet on disk be lost (a failed fsync, an I/O error), the writer
//! publishes [`Item::Rollback`]: everything after `to` is taken back, and the seqs after it are
//! handed out again for what replaces it. Readers read items by *position*, which never goes
//! back, so a reissued seq is never confused with the one taken back.
//!
//! Readers are registered with the writer between two groups, together with a read snapshot
//! taken at that point ([`Writer::subscribe`](super::Writer::subscribe)): the snapshot holds
//! everything before the reader's first item. Entries every reader has passed are dropped; a
//! reader further behind than [`MAX_ENTRIES`] is told it [`lagged`](StreamRead::Lagged) and
//! subscribes again. The stream never waits for a reader, so a slow one costs it a reload, never
//! the writer its latency.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;

use super::codec::DeltaKind;
use super::schema::{IndexName, ScopeId, Seq};
use crate::object::{ObjectKey, ObjectMeta};
use crate::util::Locked;

/// The most entries a stream keeps for a reader that is behind; beyond it the reader lags and
/// reloads from a snapshot.
pub const MAX_ENTRIES: usize = 1 << 18;

/// One change to a scope's objects, as the writer decided it.
#[derive(Debug, Clone)]
pub struct Change {
    /// Its log seq.
    pub seq: Seq,
    /// `Added`, `Updated` or `Deleted`.
    pub kind: DeltaKind,
    /// The object's key.
    pub key: ObjectKey,
    /// The metadata of the state after the change; for a delete, of the final state (or,
    /// when that is unknown, of the last stored state).
    pub meta: Arc<ObjectMeta>,
    /// The JSON after an add or update; a delete's final state when the server sent it.
    /// `None` for a delete found by a relist (`final_state_unknown`): readers keep the state a
    /// change replaces themselves, so the writer never reads an old version back.
    pub new: Option<Bytes>,
    /// The index values of the state after the change, for the indexes the scope has.
    pub values: Arc<[(IndexName, Vec<String>)]>,
    /// A delete found by a relist (client-go's `DeletedFinalStateUnknown`).
    pub final_state_unknown: bool,
}

/// One item of a scope's stream.
#[derive(Debug, Clone)]
pub enum Item {
    /// A change.
    Change(Change),
    /// Everything published after seq `to` is taken back (its commit failed, or it was lost
    /// before reaching the disk); the seqs after `to` are handed out again.
    Rollback {
        /// The last seq that stands.
        to: Seq,
    },
    /// The scope's objects were all dropped in one step (the database was reset for another
    /// cluster): no change is logged for them.
    Reset {
        /// The last seq at the time.
        at: Seq,
    },
}

/// What [`Reader::read`] found.
#[derive(Debug)]
pub enum StreamRead {
    /// The items after the reader's position (possibly none), and the last seq (of any scope)
    /// the stream had published when the reader reached its end (`None` when more items wait).
    Items(Vec<Arc<Item>>, Option<Seq>),
    /// The reader fell further behind than the stream keeps: subscribe again.
    Lagged,
}

struct State {
    /// Items, oldest first; `entries[0]` is at position `first`.
    entries: VecDeque<Arc<Item>>,
    first: u64,
    /// The last seq published (any scope): where a reader at the end of the stream stands.
    head: Seq,
    /// Each reader's position (the next item it reads).
    readers: BTreeMap<u64, u64>,
    next_reader: u64,
}

impl State {
    fn end(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    /// Drops what every reader has passed, and beyond [`MAX_ENTRIES`] what the slowest have not.
    fn trim(&mut self) {
        let slowest = self.readers.values().copied().min().unwrap_or_else(|| self.end());
        while self.first < slowest || self.entries.len() > MAX_ENTRIES {
            if self.entries.pop_front().is_none() {
                break;
            }
            self.first += 1;
        }
    }
}

/// One scope's stream; see the module documentation.
pub struct Stream {
    scope: ScopeId,
    state: Mutex<State>,
    /// The position after the newest item, to wake readers.
    end: watch::Sender<u64>,
    /// The same, for a reader to tell cheaply whether it is behind.
    published: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Stream {
    /// An empty stream whose readers start at seq `head`.
    pub(crate) fn new(scope: ScopeId, head: Seq) -> Arc<Self> {
        Arc::new(Self {
            scope,
            state: Mutex::new(State {
                entries: VecDeque::new(),
                first: 0,
                head,
                readers: BTreeMap::new(),
                next_reader: 0,
            }),
            end: watch::channel(0).0,
            published: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Publishes one item (writer thread).
    pub(crate) fn push(&self, item: Item) {
        let mut st = self.state.locked();
        match &item {
            Item::Change(c) => {
                debug_assert!(c.seq > st.head, "a change older than the stream's head");
                st.head = c.seq;
            }
            Item::Rollback { to } => st.head = *to,
            Item::Reset { .. } => {}
        }
        st.entries.push_back(Arc::new(item));
        st.trim();
        let end = st.end();
        self.published.store(end, std::sync::atomic::Ordering::Release);
        drop(st);
        self.end.send_replace(end);
    }

    /// Sends every reader back to redb: the stream no longer leads to the file's state (a
    /// commit reported failed was found on disk when the writer reopened the file, and was
    /// never published). Each reader's next read is [`StreamRead::Lagged`], so it subscribes
    /// again and reloads; `head` is where the file stands.
    pub(crate) fn invalidate(&self, head: Seq) {
        let mut st = self.state.locked();
        // One past the end: every reader, even one at the end, is behind the first item.
        st.first = st.end() + 1;
        st.entries.clear();
        st.head = st.head.max(head);
        let end = st.end();
        self.published.store(end, std::sync::atomic::Ordering::Release);
        drop(st);
        self.end.send_replace(end);
    }

    /// The position after the newest item (one atomic load).
    #[must_use]
    pub fn published(&self) -> u64 {
        self.published.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The writer's position moved to `head` with no change of this scope (other scopes'
    /// entries, or a group with none): readers at the end stand there now.
    pub(crate) fn advance(&self, head: Seq) {
        let mut st = self.state.locked();
        if head > st.head {
            st.head = head;
            drop(st);
            // Readers waiting at the end learn the new head on their next read.
            self.end.send_modify(|_| {});
        }
    }

    /// A reader at the end of the stream (writer thread, between two groups).
    pub(crate) fn reader(self: &Arc<Self>) -> Reader {
        let mut st = self.state.locked();
        let id = st.next_reader;
        st.next_reader += 1;
        let at = st.end();
        st.readers.insert(id, at);
        drop(st);
        Reader {
            stream: self.clone(),
            id,
            at,
            wake: self.end.subscribe(),
        }
    }
}

/// One reader's position in a [`Stream`]. Dropping it lets the stream drop what it kept for it.
pub struct Reader {
    stream: Arc<Stream>,
    id: u64,
    at: u64,
    wake: watch::Receiver<u64>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("at", &self.at).finish_non_exhaustive()
    }
}

impl Reader {
    /// Up to `limit` items after the reader's position, which moves past them.
    pub fn read(&mut self, limit: usize) -> StreamRead {
        let mut st = self.stream.state.locked();
        if self.at < st.first {
            return StreamRead::Lagged;
        }
        let from = (self.at - st.first) as usize;
        let items: Vec<Arc<Item>> = st.entries.iter().skip(from).take(limit).cloned().collect();
        self.at += items.len() as u64;
        let at_end = self.at == st.end();
        let head = at_end.then_some(st.head);
        st.readers.insert(self.id, self.at);
        st.trim();
        // What this read saw is marked seen, so `changed` waits for what comes next.
        self.wake.borrow_and_update();
        StreamRead::Items(items, head)
    }

    /// Waits until something was published after the last read; `false` once the writer is
    /// gone (nothing more will come).
    pub async fn changed(&mut self) -> bool {
        self.wake.changed().await.is_ok()
    }

    /// A receiver woken by every publication (its value is meaningless): for tasks that wait
    /// on the stream while another holds the reader.
    #[must_use]
    pub fn waker(&self) -> watch::Receiver<u64> {
        self.wake.clone()
    }

    /// The stream it reads.
    #[must_use]
    pub fn stream(&self) -> Arc<Stream> {
        self.stream.clone()
    }

    /// The position of the next item it reads: behind when below [`Stream::published`].
    #[must_use]
    pub fn position(&self) -> u64 {
        self.at
    }

    /// Whether something was published after the last read.
    #[must_use]
    pub fn has_changed(&self) -> bool {
        self.wake.has_changed().unwrap_or(false)
    }

    /// The scope.
    #[must_use]
    pub fn scope(&self) -> ScopeId {
        self.stream.scope
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut st = self.stream.state.locked();
        st.readers.remove(&self.id);
        st.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn change(seq: u64, name: &str) -> Item {
        Item::Change(Change {
            seq: Seq(seq),
            kind: DeltaKind::Added,
            key: ObjectKey::namespaced("ns", name),
            meta: Arc::new(ObjectMeta::default()),
            new: Some(Bytes::from_static(b"{}")),
            values: Arc::from(Vec::new()),
            final_state_unknown: false,
        })
    }

    fn seqs(read: StreamRead) -> (Vec<String>, Option<Seq>) {
        match read {
            StreamRead::Items(items, head) => (
                items
                    .iter()
                    .map(|i| match &**i {
                        Item::Change(c) => format!("{}:{}", c.seq.0, c.key.name),
                        Item::Rollback { to } => format!("rollback {}", to.0),
                        Item::Reset { .. } => "reset".into(),
                    })
                    .collect(),
                head,
            ),
            StreamRead::Lagged => panic!("lagged"),
        }
    }

    #[test]
    fn a_rollback_is_an_item_in_order_and_reissued_seqs_are_new_items() {
        let s = Stream::new(ScopeId(1), Seq(0));
        let mut r = s.reader();
        s.push(change(1, "a"));
        s.push(change(2, "b"));
        s.push(Item::Rollback { to: Seq(1) });
        s.push(change(2, "c"));
        s.advance(Seq(5));
        assert_eq!(
            seqs(r.read(100)),
            (
                vec!["1:a".into(), "2:b".into(), "rollback 1".into(), "2:c".into()],
                Some(Seq(5))
            )
        );
        assert_eq!(seqs(r.read(100)), (vec![], Some(Seq(5))));
    }

    #[test]
    fn a_reader_starts_at_the_end_and_entries_all_readers_passed_are_dropped() {
        let s = Stream::new(ScopeId(1), Seq(0));
        s.push(change(1, "before"));
        let mut r = s.reader();
        s.push(change(2, "after"));
        assert_eq!(seqs(r.read(1)), (vec!["2:after".into()], Some(Seq(2))));
        assert!(s.state.locked().entries.is_empty(), "every reader passed them");
        let mut late = s.reader();
        s.push(change(3, "x"));
        drop(r);
        assert_eq!(seqs(late.read(10)).0, vec!["3:x".to_string()]);
    }

    #[test]
    fn a_reader_too_far_behind_lags() {
        let s = Stream::new(ScopeId(1), Seq(0));
        let mut slow = s.reader();
        for i in 1..=(MAX_ENTRIES as u64 + 5) {
            s.push(change(i, "o"));
        }
        assert!(matches!(slow.read(10), StreamRead::Lagged));
    }

    #[test]
    fn an_invalidated_stream_sends_every_reader_back_and_new_readers_read_on() {
        let s = Stream::new(ScopeId(1), Seq(0));
        let mut behind = s.reader();
        s.push(change(1, "a"));
        let mut at_end = s.reader();
        s.invalidate(Seq(3));
        assert!(matches!(behind.read(10), StreamRead::Lagged));
        assert!(matches!(at_end.read(10), StreamRead::Lagged));
        let mut fresh = s.reader();
        s.push(change(4, "b"));
        match fresh.read(10) {
            StreamRead::Items(items, head) => {
                assert_eq!(items.len(), 1);
                assert_eq!(head, Some(Seq(4)));
            }
            StreamRead::Lagged => panic!("a reader subscribed after the invalidation lagged"),
        }
    }

    #[tokio::test]
    async fn readers_wake_on_a_push_and_on_an_advance() {
        let s = Stream::new(ScopeId(1), Seq(0));
        let mut r = s.reader();
        assert!(!r.has_changed());
        s.push(change(1, "a"));
        assert!(r.changed().await);
        r.read(10);
        assert!(!r.has_changed());
        s.advance(Seq(9));
        assert!(r.changed().await);
        assert_eq!(seqs(r.read(10)).1, Some(Seq(9)));
    }

    proptest! {
        /// Against a model (every item pushed): a reader reading in chunks of any size sees
        /// every item once, in order, and its head is the last seq published.
        #[test]
        fn a_reader_sees_every_item_once_in_order(ops in prop::collection::vec((0u8..4, 1usize..20), 1..200)) {
            let s = Stream::new(ScopeId(1), Seq(0));
            let mut r = s.reader();
            let (mut pushed, mut seen) = (Vec::new(), Vec::new());
            let mut seq = 0u64;
            for (op, n) in ops {
                match op {
                    0 | 1 => {
                        seq += 1;
                        s.push(change(seq, "o"));
                        pushed.push(format!("{seq}:o"));
                    }
                    2 if seq > 0 => {
                        let to = seq.saturating_sub(n as u64 % 3);
                        s.push(Item::Rollback { to: Seq(to) });
                        pushed.push(format!("rollback {to}"));
                        seq = to;
                    }
                    _ => {
                        let (items, head) = seqs(r.read(n));
                        seen.extend(items);
                        if let Some(h) = head {
                            prop_assert_eq!(h, Seq(seq));
                        }
                    }
                }
            }
            loop {
                let (items, head) = seqs(r.read(7));
                seen.extend(items);
                if head.is_some() {
                    break;
                }
            }
            prop_assert_eq!(seen, pushed);
        }
    }
}
