//! Publication: what the writer tells the world, and when. The change streams of subscribed
//! scopes ([`changes`](super::super::changes)), and the three positions: `applied` (shown to
//! readers), `committed` (in redb) and `durable` (on disk), plus the rollback count.
//!
//! A group that commits without an fsync publishes each change as it is decided, before its
//! rows are written ([`Publisher::change`] with the group open "early"); any other group
//! holds its changes until it has committed. A group that fails after publishing anything,
//! and commits lost before they reached the disk, are taken back with one
//! [`Item::Rollback`] in every stream.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::watch;

use super::super::changes::{Change, Item, Reader, Stream};
use super::super::memory::MemoryBudget;
use super::super::schema::{ScopeId, Seq};

/// The writer thread's side of publication (only the writer thread touches it).
pub(super) struct Publisher {
    streams: RefCell<HashMap<u32, Arc<Stream>>>,
    /// The open group's items, for a group that publishes once committed.
    held: RefCell<Vec<(u32, Item)>>,
    /// The open group publishes each change as it is decided.
    early: Cell<bool>,
    /// Scopes the open group published to before its commit.
    touched: RefCell<HashSet<u32>>,
    committed: watch::Sender<Seq>,
    applied: watch::Sender<Seq>,
    durable: watch::Sender<Seq>,
    rollbacks: watch::Sender<(u64, Seq)>,
    /// The store's budget, which the streams are charged to.
    memory: Arc<MemoryBudget>,
}

/// The receiving ends, for the [`Writer`](super::Writer) handle.
pub(super) struct Positions {
    pub(super) committed: watch::Receiver<Seq>,
    pub(super) applied: watch::Receiver<Seq>,
    pub(super) durable: watch::Receiver<Seq>,
    pub(super) rollbacks: watch::Receiver<(u64, Seq)>,
}

impl Publisher {
    /// A publisher whose positions all start at `last` (what the file holds).
    pub(super) fn new(last: Seq, memory: Arc<MemoryBudget>) -> (Self, Positions) {
        let (committed, committed_rx) = watch::channel(last);
        let (applied, applied_rx) = watch::channel(last);
        let (durable, durable_rx) = watch::channel(last);
        let (rollbacks, rollbacks_rx) = watch::channel((0, last));
        (
            Self {
                streams: RefCell::new(HashMap::new()),
                held: RefCell::new(Vec::new()),
                early: Cell::new(false),
                touched: RefCell::new(HashSet::new()),
                committed,
                applied,
                durable,
                rollbacks,
                memory,
            },
            Positions {
                committed: committed_rx,
                applied: applied_rx,
                durable: durable_rx,
                rollbacks: rollbacks_rx,
            },
        )
    }

    /// How many rollbacks this writer made.
    pub(super) fn rollbacks(&self) -> u64 {
        self.rollbacks.borrow().0
    }

    /// Whether changes of `scope` are published (someone subscribed to it).
    pub(super) fn wants(&self, scope: ScopeId) -> bool {
        self.streams.borrow().contains_key(&scope.0)
    }

    /// A group starts; `early`: it commits without an fsync, so it publishes as it decides.
    pub(super) fn begin_group(&self, early: bool) {
        debug_assert!(self.held.borrow().is_empty(), "a group's items were left over");
        self.early.set(early);
        self.touched.borrow_mut().clear();
    }

    /// One change the open group decided (before its rows are written).
    pub(super) fn change(&self, scope: ScopeId, change: Change) {
        self.item(scope, Item::Change(change));
    }

    /// The open group drops every object of `scope` at once (no log entries).
    pub(super) fn reset(&self, scope: ScopeId) {
        let at = *self.applied.borrow();
        self.item(scope, Item::Reset { at });
    }

    fn item(&self, scope: ScopeId, item: Item) {
        if !self.wants(scope) {
            return;
        }
        if !self.early.get() {
            self.held.borrow_mut().push((scope.0, item));
            return;
        }
        let seq = match &item {
            Item::Change(c) => Some(c.seq),
            _ => None,
        };
        if let Some(stream) = self.streams.borrow().get(&scope.0) {
            stream.push(item);
        }
        self.touched.borrow_mut().insert(scope.0);
        if let Some(seq) = seq {
            self.applied.send_replace(seq);
        }
    }

    /// The open group's items are shown: those held are published, and every stream's readers
    /// stand at `last` (an early group, before its commit; any other, after it).
    pub(super) fn show_group(&self, last: Seq) {
        let held = std::mem::take(&mut *self.held.borrow_mut());
        let streams = self.streams.borrow();
        for (scope, item) in held {
            if let Some(stream) = streams.get(&scope) {
                stream.push(item);
            }
        }
        for stream in streams.values() {
            stream.advance(last);
        }
        drop(streams);
        self.applied.send_replace(last);
    }

    /// The open group failed: what it published is taken back to `to` (the last seq that
    /// stands), and what it held is dropped.
    pub(super) fn abort_group(&self, to: Seq) {
        self.held.borrow_mut().clear();
        let touched = std::mem::take(&mut *self.touched.borrow_mut());
        if touched.is_empty() {
            return;
        }
        let streams = self.streams.borrow();
        for scope in touched {
            if let Some(stream) = streams.get(&scope) {
                stream.push(Item::Rollback { to });
            }
        }
        drop(streams);
        self.take_back(to);
    }

    /// Commits after `last` never reached the disk (a failed fsync, an I/O error): what was
    /// shown of them is taken back in every stream, and every position goes back to `last`.
    ///
    /// The file may also hold *more* than was shown: a commit whose fsync failed is reported
    /// failed, yet redb may have written it whole. Nothing in the streams leads there, so every
    /// reader is sent back to redb to reload.
    pub(super) fn lost(&self, last: Seq) {
        self.held.borrow_mut().clear();
        self.touched.borrow_mut().clear();
        let applied = *self.applied.borrow();
        if applied > last {
            for stream in self.streams.borrow().values() {
                stream.push(Item::Rollback { to: last });
            }
            self.take_back(last);
        } else if applied < last {
            for stream in self.streams.borrow().values() {
                stream.invalidate(last);
            }
            self.applied.send_replace(last);
        }
        for stream in self.streams.borrow().values() {
            stream.committed(last);
        }
        for tx in [&self.committed, &self.applied, &self.durable] {
            tx.send_if_modified(|seq| std::mem::replace(seq, last) != last);
        }
    }

    fn take_back(&self, to: Seq) {
        self.applied.send_replace(to);
        self.rollbacks.send_modify(|(n, at)| {
            *n += 1;
            *at = to;
        });
    }

    /// The open group committed up to `last`.
    pub(super) fn committed(&self, last: Seq) {
        // What is committed may be spilled from the streams (redb has it).
        for stream in self.streams.borrow().values() {
            stream.committed(last);
        }
        self.committed.send_replace(last);
    }

    /// Everything up to `last` is on disk. Never moves back: a background fsync may finish
    /// after a later durable commit was reported.
    pub(super) fn durable_at_least(&self, last: Seq) {
        self.durable.send_if_modified(|d| {
            let newer = last > *d;
            if newer {
                *d = last;
            }
            newer
        });
    }

    /// A reader of `scope`'s stream, at its end (between two groups: the caller takes a read
    /// snapshot next, which holds everything before the reader's first item).
    pub(super) fn subscribe(&self, scope: ScopeId) -> Reader {
        let head = *self.applied.borrow();
        let mut streams = self.streams.borrow_mut();
        // A stream nobody reads any more is not worth building changes for.
        streams.retain(|_, s| Arc::strong_count(s) > 1);
        streams
            .entry(scope.0)
            .or_insert_with(|| Stream::new(scope, head, self.memory.clone()))
            .reader()
    }
}
