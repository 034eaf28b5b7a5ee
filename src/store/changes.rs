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
//! everything before the reader's first item. Entries every reader has passed are dropped.
//!
//! The streams of a store are charged to its [memory budget](super::MemoryBudget), within
//! its [stream bound](super::MemoryBudget::stream_bound). Past the bound, the JSON of the oldest
//! committed adds and updates is dropped from the stream (*spilled*): a reader takes such a
//! change with its key, metadata and index values, as a cache takes an evicted object, and
//! whoever needs the JSON reads it back from redb, which has it. Nothing is lost and the
//! order stays. Should the stream still be over its bound (metadata alone, or changes not yet
//! committed), or a reader be more than [`MAX_ENTRIES`] behind, the slowest readers are told
//! they [`lagged`](StreamRead::Lagged) and subscribe again (a reload from a snapshot, which
//! tells handlers the difference). The stream never waits for a reader, so a slow one costs it
//! a reload, never the writer its latency; list pages wait at the budget's gate (up to a second)
//! while the stream is over half its bound, so readers that are only slow catch up first.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;

use super::codec::DeltaKind;
use super::dict::Packed;
use super::memory::{meta_bytes, string, MemoryBudget, ALLOC};
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
    /// `new` as stored, compressed: what the informers' caches keep of it (`None` when stored
    /// as received, and once spilled).
    pub(crate) packed: Option<Packed>,
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
    /// Items, oldest first, with what each is charged; `entries[0]` is at position `first`.
    entries: VecDeque<(Arc<Item>, usize)>,
    first: u64,
    /// What the entries are charged in all.
    bytes: usize,
    /// The last seq committed: changes up to it may be spilled.
    committed: Seq,
    /// Entries before this position are spilled, or cannot be.
    spilled: u64,
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
    fn trim(&mut self, memory: &MemoryBudget) {
        let slowest = self.readers.values().copied().min().unwrap_or_else(|| self.end());
        while self.first < slowest || self.entries.len() > MAX_ENTRIES {
            if !self.pop(memory) {
                break;
            }
        }
    }

    fn pop(&mut self, memory: &MemoryBudget) -> bool {
        let Some((_, cost)) = self.entries.pop_front() else {
            return false;
        };
        self.first += 1;
        self.bytes -= cost;
        memory.uncharge_stream(cost);
        true
    }

    /// While the store's streams are over their bound: drops the JSON of this stream's oldest
    /// committed adds and updates, then (still over) its oldest entries, keeping the newest,
    /// so the readers behind them lag.
    fn bound(&mut self, memory: &MemoryBudget) {
        let over = || memory.stream() > memory.stream_bound();
        while over() {
            self.spilled = self.spilled.max(self.first);
            let i = (self.spilled - self.first) as usize;
            let Some((item, cost)) = self.entries.get_mut(i) else {
                break;
            };
            let Item::Change(c) = &**item else {
                self.spilled += 1;
                continue;
            };
            if c.seq > self.committed {
                break;
            }
            self.spilled += 1;
            if c.kind == DeltaKind::Deleted || c.new.is_none() {
                continue;
            }
            let spilled = Item::Change(Change {
                new: None,
                packed: None,
                ..c.clone()
            });
            let less = *cost - item_cost(&spilled);
            *item = Arc::new(spilled);
            *cost -= less;
            self.bytes -= less;
            memory.uncharge_stream(less);
        }
        while over() && self.entries.len() > 1 {
            self.pop(memory);
        }
    }
}

/// What an item is charged: the item, its key, metadata, index values and JSON.
fn item_cost(item: &Item) -> usize {
    use std::mem::size_of;
    let base = size_of::<Item>() + ALLOC;
    match item {
        Item::Change(c) => {
            let values: usize = c
                .values
                .iter()
                .map(|(n, v)| {
                    size_of::<(IndexName, Vec<String>)>()
                        + string(&n.0)
                        + v.iter().map(|s| size_of::<String>() + string(s)).sum::<usize>()
                        + ALLOC
                })
                .sum();
            base + c.key.namespace.as_deref().map_or(0, string)
                + string(&c.key.name)
                + meta_bytes(&c.meta)
                + values
                + ALLOC
                + c.new.as_ref().map_or(0, |b| b.len() + ALLOC)
                + c.packed.as_ref().map_or(0, |p| p.len() + ALLOC)
        }
        Item::Rollback { .. } | Item::Reset { .. } => base,
    }
}

/// One scope's stream; see the module documentation.
pub struct Stream {
    scope: ScopeId,
    memory: Arc<MemoryBudget>,
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
    /// An empty stream whose readers start at seq `head`, charged to `memory`.
    pub(crate) fn new(scope: ScopeId, head: Seq, memory: Arc<MemoryBudget>) -> Arc<Self> {
        Arc::new(Self {
            scope,
            memory,
            state: Mutex::new(State {
                entries: VecDeque::new(),
                first: 0,
                bytes: 0,
                committed: head,
                spilled: 0,
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
        let cost = item_cost(&item);
        st.entries.push_back((Arc::new(item), cost));
        st.bytes += cost;
        self.memory.charge_stream(cost);
        st.trim(&self.memory);
        st.bound(&self.memory);
        self.memory.stream_settled();
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
        self.memory.uncharge_stream(std::mem::take(&mut st.bytes));
        st.head = st.head.max(head);
        let end = st.end();
        self.published.store(end, std::sync::atomic::Ordering::Release);
        drop(st);
        self.end.send_replace(end);
    }

    /// Everything up to `seq` is committed (or, after a loss, only that much): its changes may
    /// be spilled, and are while the store's streams are over their bound.
    pub(crate) fn committed(&self, seq: Seq) {
        let mut st = self.state.locked();
        if seq < st.committed {
            // Taken back: what was spilled stays spilled (redb's rows and log are read back by
            // version), nothing newer is spilled until committed again.
            st.committed = seq;
            return;
        }
        st.committed = seq;
        st.bound(&self.memory);
    }

    /// What the stream's entries are charged now.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.state.locked().bytes
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
        let items: Vec<Arc<Item>> = st
            .entries
            .iter()
            .skip(from)
            .take(limit)
            .map(|(i, _)| i.clone())
            .collect();
        self.at += items.len() as u64;
        let at_end = self.at == st.end();
        let head = at_end.then_some(st.head);
        st.readers.insert(self.id, self.at);
        st.trim(&self.stream.memory);
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
        st.trim(&self.stream.memory);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.state.locked().bytes);
        self.memory.uncharge_stream(bytes);
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
            packed: None,
        })
    }

    fn unbounded() -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget::new(usize::MAX))
    }

    fn sized(seq: u64, kind: DeltaKind, len: usize) -> Item {
        Item::Change(Change {
            seq: Seq(seq),
            kind,
            key: ObjectKey::namespaced("ns", format!("o{seq}")),
            meta: Arc::new(ObjectMeta::default()),
            new: Some(Bytes::from(vec![b'x'; len])),
            values: Arc::from(Vec::new()),
            final_state_unknown: false,
            packed: None,
        })
    }

    /// The stream's charge agrees with its entries, and stays within the bound unless one
    /// entry alone is over it.
    fn within_bound(s: &Stream, memory: &MemoryBudget) -> Result<(), String> {
        let st = s.state.locked();
        let sum: usize = st.entries.iter().map(|(i, _)| item_cost(i)).sum();
        if sum != st.bytes || memory.stream() != st.bytes {
            return Err(format!(
                "charged {} / {}, entries cost {sum}",
                st.bytes,
                memory.stream()
            ));
        }
        if st.bytes > memory.stream_bound() && st.entries.len() > 1 {
            return Err(format!("{} bytes over the bound {}", st.bytes, memory.stream_bound()));
        }
        Ok(())
    }

    #[test]
    fn a_slow_reader_behind_committed_changes_reads_them_all_spilled_within_the_bound() {
        let memory = Arc::new(MemoryBudget::new(0));
        let bound = memory.stream_bound();
        let s = Stream::new(ScopeId(1), Seq(0), memory.clone());
        let mut slow = s.reader();
        // Twice the bound of JSON, each change committed as it is published.
        let n = 2 * bound / (64 << 10);
        for seq in 1..=n as u64 {
            s.push(sized(seq, DeltaKind::Added, 64 << 10));
            s.committed(Seq(seq));
            within_bound(&s, &memory).unwrap();
        }
        let mut seen = Vec::new();
        loop {
            match slow.read(100) {
                StreamRead::Items(items, head) => {
                    for i in items {
                        if let Item::Change(c) = &*i {
                            seen.push((c.seq.0, c.new.is_some()));
                        }
                    }
                    if head.is_some() {
                        break;
                    }
                }
                StreamRead::Lagged => panic!("a reader behind committed changes lagged"),
            }
        }
        assert_eq!(
            seen.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            (1..=n as u64).collect::<Vec<_>>()
        );
        assert!(!seen[0].1, "the oldest changes were spilled");
        assert!(seen[n - 1].1, "the newest kept their JSON");
        assert_eq!(memory.stream(), 0, "everything read is given back");
        drop(slow);
        drop(s);
        assert_eq!(memory.stream(), 0);
    }

    #[test]
    fn uncommitted_changes_are_not_spilled_and_past_the_bound_the_slowest_reader_lags() {
        let memory = Arc::new(MemoryBudget::new(0));
        let bound = memory.stream_bound();
        let s = Stream::new(ScopeId(1), Seq(0), memory.clone());
        let mut slow = s.reader();
        let n = 2 * bound / (64 << 10);
        for seq in 1..=n as u64 {
            s.push(sized(seq, DeltaKind::Added, 64 << 10));
            within_bound(&s, &memory).unwrap();
        }
        assert!(matches!(slow.read(10), StreamRead::Lagged));
        // What is kept still has its JSON: none of it was committed.
        let st = s.state.locked();
        assert!(st
            .entries
            .iter()
            .all(|(i, _)| matches!(&**i, Item::Change(c) if c.new.is_some())));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push { len: usize, delete: bool },
        Commit,
        Lose { back: u64 },
        Read { n: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..400_000, prop::bool::weighted(0.2)).prop_map(|(len, delete)| Op::Push { len, delete }),
            2 => Just(Op::Commit),
            1 => (0u64..4).prop_map(|back| Op::Lose { back }),
            3 => (1usize..40).prop_map(|n| Op::Read { n }),
        ]
    }

    proptest! {
        /// Against a model of what was pushed: the stream's charge is its entries' cost, within
        /// the bound (or one entry); a reader sees every item from where it subscribed, in
        /// order, with its JSON unless the change was a committed add or update (spilled),
        /// until it is told it lagged, and then resubscribes at the end.
        #[test]
        fn the_stream_stays_within_its_bound_and_readers_miss_nothing_unsaid(ops in prop::collection::vec(op(), 1..150)) {
            let memory = Arc::new(MemoryBudget::new(0));
            let s = Stream::new(ScopeId(1), Seq(0), memory.clone());
            let mut r = s.reader();
            // (seq, is a change, JSON length, delete); the reader's index into it.
            let mut pushed: Vec<(u64, bool, usize, bool)> = Vec::new();
            let mut at = 0usize;
            let (mut seq, mut committed) = (0u64, 0u64);
            for op in ops {
                match op {
                    Op::Push { len, delete } => {
                        seq += 1;
                        let kind = if delete { DeltaKind::Deleted } else { DeltaKind::Updated };
                        s.push(sized(seq, kind, len));
                        pushed.push((seq, true, len, delete));
                    }
                    Op::Commit => {
                        committed = seq;
                        s.committed(Seq(seq));
                    }
                    Op::Lose { back } => {
                        let to = committed.saturating_sub(back);
                        s.committed(Seq(to));
                        if seq > to {
                            s.push(Item::Rollback { to: Seq(to) });
                            pushed.push((to, false, 0, false));
                        }
                        seq = to;
                        committed = to;
                    }
                    Op::Read { n } => match r.read(n) {
                        StreamRead::Items(items, _) => {
                            for i in items {
                                let (want_seq, change, len, delete) = pushed[at];
                                at += 1;
                                match &*i {
                                    Item::Change(c) => {
                                        prop_assert!(change);
                                        prop_assert_eq!(c.seq.0, want_seq);
                                        match &c.new {
                                            Some(b) => prop_assert_eq!(b.len(), len),
                                            None => prop_assert!(!delete, "a delete's final state was spilled"),
                                        }
                                    }
                                    Item::Rollback { to } => {
                                        prop_assert!(!change);
                                        prop_assert_eq!(to.0, want_seq);
                                    }
                                    Item::Reset { .. } => prop_assert!(false, "no reset was pushed"),
                                }
                            }
                        }
                        StreamRead::Lagged => {
                            r = s.reader();
                            at = pushed.len();
                        }
                    },
                }
                if let Err(e) = within_bound(&s, &memory) {
                    prop_assert!(false, "{}", e);
                }
            }
            drop(r);
            drop(s);
            prop_assert_eq!(memory.stream(), 0, "a dropped stream gives everything back");
        }
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
        let s = Stream::new(ScopeId(1), Seq(0), unbounded());
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
        let s = Stream::new(ScopeId(1), Seq(0), unbounded());
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
        let s = Stream::new(ScopeId(1), Seq(0), unbounded());
        let mut slow = s.reader();
        for i in 1..=(MAX_ENTRIES as u64 + 5) {
            s.push(change(i, "o"));
        }
        assert!(matches!(slow.read(10), StreamRead::Lagged));
    }

    #[test]
    fn an_invalidated_stream_sends_every_reader_back_and_new_readers_read_on() {
        let s = Stream::new(ScopeId(1), Seq(0), unbounded());
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
        let s = Stream::new(ScopeId(1), Seq(0), unbounded());
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
            let s = Stream::new(ScopeId(1), Seq(0), unbounded());
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
