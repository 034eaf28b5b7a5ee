//! The writer thread: the loop that takes commands, commits them in groups and answers.

use crate::util::RwLocked;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use redb::{ReadableTable, WriteTransaction};
use tokio::sync::{oneshot, watch};

use super::super::codec::Compression;
use super::super::hot::{HotEntry, HotOp, HotTier};
use super::super::read::{LogRecord, Snapshot};
use super::super::schema::{IndexName, ScopeId, Seq, META, META_LAST_SEQ};
use super::super::{Shared, StoreError};
use super::retention::{Compaction, Goal};
use super::{
    last_seq_read, Ack, Backfills, Command, Committed, CompactReport, Delta, PublishedDicts, RelistSummary, ScopeDicts,
};
use crate::object::ObjectKey;

/// First and longest wait between the writer's own attempts to reopen a poisoned database.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(10);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) struct WriterThread {
    /// Next log seq to hand out; reset to its value at the start of a group that rolls back.
    pub(super) next_seq: Cell<u64>,
    pub(super) shared: Arc<Shared>,
    pub(super) rx: Receiver<Command>,
    pub(super) seq_tx: watch::Sender<Seq>,
    /// The last seq applied and published to the feeds, ahead of `seq_tx` during a commit.
    pub(super) applied_tx: watch::Sender<Seq>,
    /// The last seq on disk (see [`Writer::durable`](super::Writer::durable)).
    pub(super) durable_tx: watch::Sender<Seq>,
    /// Rollbacks of commits that never reached the disk, or of a group published to the feeds
    /// whose commit failed: (count, the last seq that stands).
    pub(super) rollback_tx: watch::Sender<(u64, Seq)>,
    /// How long deferred batches may wait for their durable commit; `None`: they do not.
    pub(super) fsync_delay: Option<std::time::Duration>,
    /// When the durable commit of the deferred batches committed so far is due.
    pub(super) fsync_due: Cell<Option<std::time::Instant>>,
    pub(super) durable: bool,
    pub(super) max_deltas: usize,
    pub(super) max_bytes: usize,
    pub(super) compression: Compression,
    pub(super) retention_entries: Option<u64>,
    pub(super) retention_age: Option<std::time::Duration>,
    /// Most log entries one compaction transaction removes.
    pub(super) compact_step: usize,
    /// Most objects one backfill transaction indexes.
    pub(super) backfill_step: usize,
    /// Compaction still to do (automatic retention and explicit `compact` calls).
    pub(super) compaction: RefCell<Compaction>,
    /// Backfills this writer runs, with the callers waiting for each. An index in here has its
    /// function registered, so every write since maintained its rows.
    pub(super) backfills: RefCell<Backfills>,
    /// Whether the next idle step goes to a backfill (compaction and backfills take turns).
    pub(super) backfill_turn: Cell<bool>,
    /// Per-scope dictionary state for [`Compression::ZstdDict`].
    pub(super) dicts: RefCell<HashMap<u32, ScopeDicts>>,
    /// The highest dictionary id handed out per scope in this process (kept across
    /// rollbacks: see `scope_dict`).
    pub(super) dict_ids: RefCell<HashMap<u32, u32>>,
    /// Scopes whose dictionary was trained in the open group: forgotten if it rolls back,
    /// published once it commits.
    pub(super) pending_dicts: RefCell<Vec<u32>>,
    /// The scopes with a hot tier, and the open group's changes to them (applied after the
    /// commit, dropped on a rollback).
    pub(super) hot: RefCell<HashMap<u32, Arc<HotTier>>>,
    pub(super) hot_ops: RefCell<Vec<(u32, HotOp)>>,
    /// The open group's log records of hot scopes, for their feeds.
    pub(super) feed_ops: RefCell<Vec<(u32, LogRecord)>>,
    /// The newest JSON of each key the open group wrote in a hot scope: the old state of the
    /// key's next record in the group.
    pub(super) feed_latest: RefCell<HashMap<(u32, ObjectKey), Bytes>>,
    /// Hot scopes whose changes the open group publishes as it applies them (a group of
    /// batches only, each scope's tier serving readers).
    pub(super) early: RefCell<std::collections::HashSet<u32>>,
    /// Whether the open group published anything before its commit.
    pub(super) published_early: Cell<bool>,
    /// Committed dictionaries, for [`Writer::submit`] to compress with.
    pub(super) published: PublishedDicts,
    /// What the open group's batches held, freed by the `reaper` thread after the group: the
    /// objects were allocated on other threads, and freeing thousands of small allocations
    /// from another thread's arena cost the writer about a fifth of its time (`perf`, replay).
    pub(super) garbage: RefCell<Vec<Garbage>>,
    /// Frees garbage; `None` (or full) frees it here.
    pub(super) reaper: Option<crossbeam_channel::Sender<Vec<Garbage>>>,
    /// An I/O error happened: redb refuses every later operation ("Previous I/O error
    /// occurred") until the database is reopened, which the next group does first.
    pub(super) poisoned: Cell<bool>,
    /// When the file size was last published to the `database_bytes` metric.
    pub(super) size_observed: Cell<Option<std::time::Instant>>,
}

/// What a group let go of, kept until the group is done and then freed by the reaper.
#[allow(dead_code)] // the fields are held only to be dropped on the reaper thread
pub(super) enum Garbage {
    /// A batch's deltas and compressed blobs.
    Batch(Vec<Delta>, Vec<(Bytes, Compression)>),
    /// Versions the hot tiers' feeds let go of (with the objects readers decoded from them).
    Entries(Vec<Arc<HotEntry>>),
}

/// Hands the group's garbage to the reaper when the group ends, however it ends.
pub(super) struct Reap<'w>(&'w WriterThread);

impl Drop for Reap<'_> {
    fn drop(&mut self) {
        for tier in self.0.hot.borrow().values() {
            let dropped = tier.feed.take_dropped();
            if !dropped.is_empty() {
                self.0.garbage.borrow_mut().push(Garbage::Entries(dropped));
            }
        }
        let garbage = std::mem::take(&mut *self.0.garbage.borrow_mut());
        if garbage.is_empty() {
            return;
        }
        if let Some(reaper) = &self.0.reaper {
            // Full or gone: drop it here instead.
            let _ = reaper.try_send(garbage);
        }
    }
}

/// A command's reply, held until the transaction commits.
pub(super) enum Reply {
    Scope(Ack<ScopeId>, Result<ScopeId, StoreError>),
    Committed(Ack<Committed>, Result<u64, StoreError>),
    Unit(Ack<()>, Result<(), StoreError>),
    Relist(Ack<RelistSummary>, Result<RelistSummary, StoreError>),
    Compact(Ack<CompactReport>, Result<CompactReport, StoreError>),
    Bool(Ack<bool>, Result<bool, StoreError>),
    /// A hot tier to start once the group committed.
    Hot(Ack<()>, ScopeId, usize),
    /// Work that goes on in bounded transactions after this commit; acknowledged when it is done.
    Deferred(Deferred),
}

/// A command whose work outlives its group commit.
pub(super) enum Deferred {
    Compact(Ack<CompactReport>, Goal),
    Settle(Ack<()>),
    Backfill(Ack<()>, ScopeId, IndexName),
}

/// Why a command did not apply: `Refused` wrote nothing, so the group goes on; `Fatal` may have
/// written part of the command, so the whole group is rolled back.
pub(super) enum Failure {
    Refused(StoreError),
    Fatal(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Fatal(e)
    }
}

pub(super) type Step<T> = Result<T, Failure>;

impl WriterThread {
    pub(super) fn run(self) {
        let mut stop = false;
        // While poisoned (an I/O error, and the reopen failed or has not run yet), the writer
        // retries the reopen on its own: readers get `Closed` until it succeeds, and they must
        // not wait for someone to write first.
        let mut retry = RETRY_FIRST;
        while !stop {
            // Deferred batches wait at most `fsync_delay` for their durable commit.
            let due_in = self
                .fsync_due
                .get()
                .map(|due| due.saturating_duration_since(std::time::Instant::now()));
            if due_in == Some(std::time::Duration::ZERO) && !self.poisoned.get() {
                self.flush_deferred();
                continue;
            }
            let first = if self.poisoned.get() {
                match self.rx.recv_timeout(retry) {
                    Ok(cmd) => cmd,
                    Err(RecvTimeoutError::Timeout) => {
                        match self.recover() {
                            Ok(()) => retry = RETRY_FIRST,
                            Err(e) => {
                                tracing::debug!(error = %e, "reopening the database after an I/O error failed");
                                retry = (retry * 2).min(RETRY_MAX);
                            }
                        }
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else if self.has_background_work() {
                // Background work (compaction, backfill) runs while nothing is queued.
                retry = RETRY_FIRST;
                match self.rx.try_recv() {
                    Ok(cmd) => cmd,
                    Err(TryRecvError::Empty) => {
                        self.background_step();
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break,
                }
            } else if let Some(poll) = self.idle_poll() {
                // Entries age while nothing is written: look at them now and then.
                retry = RETRY_FIRST;
                match self.rx.recv_timeout(due_in.map_or(poll, |d| d.min(poll))) {
                    Ok(cmd) => cmd,
                    Err(RecvTimeoutError::Timeout) => {
                        self.plan_retention();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else if let Some(due_in) = due_in {
                retry = RETRY_FIRST;
                match self.rx.recv_timeout(due_in) {
                    Ok(cmd) => cmd,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                retry = RETRY_FIRST;
                let Ok(cmd) = self.rx.recv() else { break };
                cmd
            };
            let mut group = vec![first];
            let (mut n, mut bytes) = group[0].weight();
            while n < self.max_deltas && bytes < self.max_bytes {
                match self.rx.try_recv() {
                    Ok(cmd) => {
                        let (dn, db) = cmd.weight();
                        n += dn;
                        bytes += db;
                        group.push(cmd);
                    }
                    Err(_) => break,
                }
            }
            if let Some(pos) = group.iter().position(|c| matches!(c, Command::Shutdown)) {
                // Everything queued before the shutdown is still committed.
                group.truncate(pos);
                stop = true;
            }
            if !group.is_empty() {
                let appended = self.commit_group(group);
                self.after_group(appended);
            }
        }
        if self.fsync_due.get().is_some() && !self.poisoned.get() {
            self.flush_deferred();
        }
        self.abandon_background_work();
    }

    /// The durable commit that deferred batches wait for (an empty durable group).
    fn flush_deferred(&self) {
        let (ack, _) = oneshot::channel();
        self.commit_group(vec![Command::Flush(ack)]);
        if self.poisoned.get() {
            // Failed: `recover` drops the deferred commits with the rest.
            self.fsync_due.set(None);
        }
    }

    /// After an I/O error: reopen the database (through the same backend wrapper) and restart
    /// the log seq from what is durable in the file: a commit whose final sync failed may or
    /// may not have reached the disk, so the file, not the writer's counter, says which it was.
    pub(super) fn recover(&self) -> Result<(), StoreError> {
        self.shared.reopen()?;
        let last = last_seq_read(&self.shared)?;
        self.next_seq.set(last.0 + 1);
        // Dictionaries are looked up again from what the file holds.
        self.dicts.borrow_mut().clear();
        self.pending_dicts.borrow_mut().clear();
        self.published.writing().clear();
        self.poisoned.set(false);
        // Relaxed commits lost with the error may be in the tiers: load them again.
        self.forget_group();
        // Volatile handlers may have been told of the commits lost (read from the log or a
        // feed): they read again from `last`.
        let rolled_back = *self.applied_tx.borrow() > last;
        self.reload_hot(last);
        for tx in [&self.seq_tx, &self.applied_tx] {
            tx.send_if_modified(|seq| {
                let changed = *seq != last;
                *seq = last;
                changed
            });
        }
        if rolled_back {
            self.rollback_tx.send_modify(|(n, at)| {
                *n += 1;
                *at = last;
            });
        }
        // Commits not yet on disk are gone (the reflector's next batch, which requires them,
        // is refused, and it re-watches from what the file holds).
        self.fsync_due.set(None);
        self.durable_tx.send_if_modified(|seq| {
            let changed = *seq != last;
            *seq = last;
            changed
        });
        tracing::info!(last_seq = last.0, "database reopened after an I/O error");
        Ok(())
    }

    /// Remembers that `e` needs a reopen before the next group (redb latches I/O errors).
    pub(super) fn note(&self, e: &StoreError) {
        if let StoreError::Storage { source, .. } = e {
            if matches!(source, redb::Error::Io(_) | redb::Error::PreviousIo) {
                self.poisoned.set(true);
            }
        }
    }

    /// Applies and commits one group; returns how many log entries it appended.
    pub(super) fn commit_group(&self, group: Vec<Command>) -> u64 {
        let _span = tracing::debug_span!("commit", commands = group.len()).entered();
        let _reap = Reap(self);
        if self.poisoned.get() {
            if let Err(e) = self.recover() {
                tracing::warn!(error = %e, "reopening the database after an I/O error failed");
                fail_all(group, &e);
                return 0;
            }
        }
        let db = match self.shared.db() {
            Ok(db) => db,
            Err(e) => {
                fail_all(group, &e);
                return 0;
            }
        };
        let mut txn = match db.begin_write() {
            Ok(t) => t,
            Err(e) => {
                let e = self.shared.storage(e);
                self.note(&e);
                fail_all(group, &e);
                return 0;
            }
        };
        // A group of relaxed batches only commits without an fsync; anything else in the group
        // (a flush, a cursor, a durable batch) makes the whole group, and every relaxed commit
        // before it, durable.
        let deferrable = self.fsync_delay.is_some();
        let relaxed = group
            .iter()
            .all(|c| matches!(c, Command::Apply(b, _) if b.relaxed || (b.defer_fsync && deferrable)));
        // A bulk load's relaxed batches make their end durable themselves: only deferred ones
        // schedule the durable commit.
        let deferred = relaxed
            && group
                .iter()
                .any(|c| matches!(c, Command::Apply(b, _) if b.defer_fsync && !b.relaxed));
        if !self.durable || relaxed {
            let _ = txn.set_durability(redb::Durability::None);
        }
        let start_seq = self.next_seq.get();
        // A group of batches alone that commits without an fsync shows each change of a hot
        // scope to its tier and feed as soon as it is decided, before writing its rows (other
        // commands rewrite a tier or a log range wholesale, and publish with the group).
        self.published_early.set(false);
        let ahead = relaxed || !self.durable;
        if ahead && group.iter().all(|c| matches!(c, Command::Apply(..))) {
            let mut early = self.early.borrow_mut();
            for (scope, tier) in self.hot.borrow().iter() {
                if tier.serves() {
                    debug_assert_eq!(tier.feed.head(), Seq(start_seq - 1), "a feed is behind the log");
                    early.insert(*scope);
                }
            }
        }
        let mut replies = Vec::with_capacity(group.len());
        let mut fatal = None;
        let mut pending = group.into_iter();
        for cmd in pending.by_ref() {
            match self.apply(&txn, cmd) {
                Ok(reply) => replies.push(reply),
                Err((reply, e)) => {
                    replies.push(reply);
                    fatal = Some(e);
                    break;
                }
            }
        }
        let rest: Vec<Command> = pending.collect();
        if let Some(e) = fatal {
            drop(txn);
            self.forget_group();
            if self.published_early.get() {
                self.unpublish_hot(Seq(start_seq - 1));
            }
            self.next_seq.set(start_seq);
            tracing::warn!(error = %e, "group commit rolled back");
            self.note(&e);
            fail_replies(replies, &e);
            fail_all(rest, &e);
            return 0;
        }
        let last = Seq(self.next_seq.get() - 1);
        let saved = save_last_seq(&self.shared, &txn, last.0).and_then(|()| self.date_commit(&txn, start_seq, last.0));
        if let Err(e) = saved {
            self.note(&e);
            self.forget_group();
            if self.published_early.get() {
                self.unpublish_hot(Seq(start_seq - 1));
            }
            self.next_seq.set(start_seq);
            fail_replies(replies, &e);
            return 0;
        }
        // A group that commits without an fsync is shown to readers before its commit: the
        // hot tiers, their feeds (volatile handlers) and then `applied`. One that fsyncs is
        // shown once on disk (`fsync_delay(None)`: nothing is seen before the disk has it).
        if ahead {
            self.publish_hot(start_seq, last);
            self.applied_tx.send_replace(last);
        }
        if let Err(e) = txn.commit() {
            let e = self.shared.storage(e);
            tracing::warn!(error = %e, "commit failed");
            self.note(&e);
            self.forget_group();
            if ahead {
                self.unpublish_hot(Seq(start_seq - 1));
            }
            self.next_seq.set(start_seq);
            fail_replies(replies, &e);
            return 0;
        }
        for scope in self.pending_dicts.borrow_mut().drain(..) {
            if let Some(d) = self.scope_dict_cached(ScopeId(scope)) {
                self.publish(scope, d);
            }
        }
        if !ahead {
            self.publish_hot(start_seq, last);
            self.applied_tx.send_replace(last);
        }
        for tier in self.hot.borrow().values() {
            tier.confirm(last);
        }
        self.seq_tx.send_replace(last);
        if !relaxed || !self.durable {
            // On disk (or the store does not fsync at all): so is everything before it.
            self.fsync_due.set(None);
            self.durable_tx.send_replace(last);
        } else if deferred && self.fsync_due.get().is_none() {
            let delay = self.fsync_delay.unwrap_or_default();
            self.fsync_due.set(Some(std::time::Instant::now() + delay));
        }
        for r in replies {
            match r {
                Reply::Deferred(d) => self.defer(d),
                Reply::Hot(ack, scope, budget) => {
                    self.enable_hot(scope, budget);
                    let _ = ack.send(Ok(()));
                }
                r => send_reply(r, last),
            }
        }
        (last.0 + 1).saturating_sub(start_seq)
    }

    /// Applies one command. `Err` carries the reply and the error that aborts the group.
    #[allow(clippy::result_large_err)] // private, returned once per command, never propagated
    pub(super) fn apply(&self, txn: &WriteTransaction, cmd: Command) -> Result<Reply, (Reply, StoreError)> {
        macro_rules! run {
            ($variant:ident, $ack:expr, $call:expr) => {
                match $call {
                    Ok(v) => Ok(Reply::$variant($ack, Ok(v))),
                    Err(Failure::Refused(e)) => Ok(Reply::$variant($ack, Err(e))),
                    Err(Failure::Fatal(e)) => {
                        let aborted = e.to_aborted();
                        Err((Reply::$variant($ack, Err(e)), aborted))
                    }
                }
            };
        }
        match cmd {
            Command::RegisterScope(spec, ack) => run!(Scope, ack, self.register_scope(txn, &spec)),
            Command::Apply(batch, ack) => run!(Committed, ack, self.apply_batch(txn, batch)),
            Command::Stage(scope, objs, ack) => run!(Unit, ack, self.stage(txn, scope, objs)),
            Command::FinishRelist(scope, rv, reason, ack) => {
                run!(Relist, ack, self.finish_relist(txn, scope, rv, &reason))
            }
            Command::AbortRelist(scope, ack) => run!(Unit, ack, self.clear_staged(txn, scope)),
            Command::EnsureIndex(scope, name, ack) => match self.ensure_index(txn, scope, &name) {
                Ok(true) => Ok(Reply::Unit(ack, Ok(()))),
                Ok(false) => Ok(Reply::Deferred(Deferred::Backfill(ack, scope, name))),
                Err(Failure::Refused(e)) => Ok(Reply::Unit(ack, Err(e))),
                Err(Failure::Fatal(e)) => {
                    let aborted = e.to_aborted();
                    Err((Reply::Unit(ack, Err(e)), aborted))
                }
            },
            Command::SetCursor(scope, name, seq, ack) => {
                run!(Unit, ack, self.set_cursor(txn, scope, name.as_str(), seq))
            }
            Command::DeleteCursor(scope, name, ack) => run!(Unit, ack, self.delete_cursor(txn, scope, name.as_str())),
            Command::Compact(keep, ack) => match self.compact_goal(txn, keep) {
                Ok(goal) => Ok(Reply::Deferred(Deferred::Compact(ack, goal))),
                Err(Failure::Refused(e)) => Ok(Reply::Compact(ack, Err(e))),
                Err(Failure::Fatal(e)) => {
                    let aborted = e.to_aborted();
                    Err((Reply::Compact(ack, Err(e)), aborted))
                }
            },
            Command::Settle(ack) => Ok(Reply::Deferred(Deferred::Settle(ack))),
            Command::Flush(ack) => Ok(Reply::Unit(ack, Ok(()))),
            Command::Identity(id, reset, ack) => run!(Bool, ack, self.identity(txn, &id, reset)),
            Command::ResetScope(scope, ack) => run!(Unit, ack, self.reset_scope(txn, scope)),
            Command::ChangeShard(scope, record, ack) => run!(Relist, ack, self.change_shard(txn, scope, &record)),
            Command::ShardFetched(scope, ack) => run!(Unit, ack, self.shard_fetched(txn, scope)),
            Command::HotTier(scope, budget, ack) => Ok(Reply::Hot(ack, scope, budget)),
            Command::Shutdown => Ok(Reply::Unit(oneshot::channel().0, Ok(()))),
        }
    }

    /// Forgets what the open group prepared, after it rolled back.
    fn forget_group(&self) {
        self.forget_pending_dicts();
        self.early.borrow_mut().clear();
        self.hot_ops.borrow_mut().clear();
        self.feed_ops.borrow_mut().clear();
        self.feed_latest.borrow_mut().clear();
    }

    /// Journals a change to a scope's objects for its hot tier, if it has one.
    pub(super) fn journal_hot(&self, scope: ScopeId, op: impl FnOnce() -> HotOp) {
        if self.hot.borrow().contains_key(&scope.0) {
            self.hot_ops.borrow_mut().push((scope.0, op()));
        }
    }

    /// Whether `scope` has a hot tier (so its changes are journaled).
    pub(super) fn is_hot(&self, scope: ScopeId) -> bool {
        self.hot.borrow().contains_key(&scope.0)
    }

    /// Applies the group of seqs `start..=last` to the hot tiers, then publishes its records
    /// to their feeds (a tier readers do not use yet gets its feed emptied instead: its
    /// handlers read these records from redb once committed). An early scope has both
    /// already; its feed's head moves to `last`. Runs before the commit of a group committed
    /// without an fsync, after the commit of any other.
    fn publish_hot(&self, start: u64, last: Seq) {
        let hot = self.hot.borrow();
        self.feed_latest.borrow_mut().clear();
        if hot.is_empty() {
            return;
        }
        let mut ops: HashMap<u32, Vec<HotOp>> = HashMap::new();
        for (scope, op) in self.hot_ops.borrow_mut().drain(..) {
            ops.entry(scope).or_default().push(op);
        }
        let mut records: HashMap<u32, Vec<LogRecord>> = HashMap::new();
        for (scope, r) in self.feed_ops.borrow_mut().drain(..) {
            records.entry(scope).or_default().push(r);
        }
        let committed = *self.seq_tx.borrow();
        let early = std::mem::take(&mut *self.early.borrow_mut());
        for (scope, tier) in hot.iter() {
            if tier.apply(ops.remove(scope).unwrap_or_default(), last) {
                // An early scope's feed holds its records of the group already.
                let after = if early.contains(scope) {
                    tier.feed.head()
                } else {
                    Seq(start - 1)
                };
                tier.feed
                    .publish(records.remove(scope).unwrap_or_default(), after, last, committed);
            } else {
                tier.feed.reset(last);
            }
        }
    }

    /// The commit of the group after `to` failed: takes back what [`publish_hot`] showed
    /// readers, and reloads the tiers from redb.
    ///
    /// [`publish_hot`]: Self::publish_hot
    fn unpublish_hot(&self, to: Seq) {
        if self.poisoned.get() {
            // `recover` does it all when it reopens the database.
            return;
        }
        self.reload_hot(to);
        self.applied_tx.send_replace(to);
        // Volatile handlers told of the group read what replaces it (the rewind of a lost
        // relaxed commit).
        self.rollback_tx.send_modify(|(n, at)| {
            *n += 1;
            *at = to;
        });
    }

    /// Takes the feeds' records after `to` back and reloads every tier from the database
    /// (between groups).
    fn reload_hot(&self, to: Seq) {
        let tiers: Vec<(u32, Arc<HotTier>)> = self.hot.borrow().iter().map(|(s, t)| (*s, t.clone())).collect();
        for (scope, tier) in tiers {
            tier.feed.undo(to);
            self.load_hot(ScopeId(scope), &tier);
        }
    }

    /// Hands one change of a hot scope to its tier (`op`) and its feed (`change`): at once
    /// when the group publishes as it applies (an `early` scope), so that volatile handlers and
    /// listers see it before the redb rows are even written; else journaled for the end of the
    /// group. Runs before the change's rows are written, so `prev` still reads the old state.
    pub(super) fn hot_change(
        &self,
        t: &super::apply::Tables<'_>,
        scope: ScopeId,
        change: super::apply::Change<'_>,
        op: HotOp,
    ) -> Result<(), StoreError> {
        let Some(tier) = self.hot.borrow().get(&scope.0).cloned() else {
            return Ok(());
        };
        let (record, old) = self.feed_record(t, &tier, scope, change)?;
        if self.early.borrow().contains(&scope.0) {
            let seq = record.seq;
            if tier.apply(vec![op], seq) {
                tier.feed.push(record, old, *self.seq_tx.borrow());
                self.published_early.set(true);
                self.applied_tx.send_replace(seq);
                return Ok(());
            }
            // Not served by the tier after all (cannot happen: only the writer reloads a
            // tier): the op waits in it, and the feed is emptied at the end of the group.
            debug_assert!(false, "an early tier stopped serving readers mid-group");
            self.early.borrow_mut().remove(&scope.0);
            return Ok(());
        }
        self.feed_ops.borrow_mut().push((scope.0, record));
        self.hot_ops.borrow_mut().push((scope.0, op));
        Ok(())
    }

    /// The log record of `change` for a feed, and the tier entry it replaces. Its old state
    /// comes from the group (an earlier record of the key; an early scope's tier has those
    /// already), else the tier's JSON, else redb (`prev`).
    fn feed_record(
        &self,
        t: &super::apply::Tables<'_>,
        tier: &HotTier,
        scope: ScopeId,
        change: super::apply::Change<'_>,
    ) -> Result<(LogRecord, Option<Arc<HotEntry>>), StoreError> {
        use super::super::codec::{self, PrevRef};
        let super::apply::Change {
            seq,
            kind,
            key,
            rv,
            object,
            prev,
            prev_inline,
            final_state_unknown,
        } = change;
        // Only a group published at its end tracks its own newest JSON per key.
        let slot = (!self.early.borrow().contains(&scope.0)).then(|| (scope.0, key.clone()));
        let known = slot.as_ref().and_then(|s| self.feed_latest.borrow().get(s).cloned());
        // The version this record replaces, as the tier holds it (before this record is
        // applied to it; in an early scope it has the group's earlier records too).
        let held_entry = match prev {
            PrevRef::None => None,
            _ => tier
                .view()
                .and_then(|v| v.named(key.namespace.as_deref(), &key.name).cloned()),
        };
        let old = match (known, prev) {
            (_, PrevRef::None) => None,
            (Some(b), _) => Some(b),
            (None, prev) => {
                let held = held_entry.as_ref().and_then(|e| e.bytes.clone());
                match (held, prev) {
                    (Some(b), _) => Some(b),
                    (None, PrevRef::Inline(c)) => Some(self.unpack(t, c, prev_inline)?),
                    (None, PrevRef::Log(p)) => match t.log.get(p).map_err(|e| self.st(e))? {
                        Some(row) => {
                            let (h, data, _) = codec::decode_log(row.value())?;
                            h.has_data.then(|| self.unpack(t, h.compression, data)).transpose()?
                        }
                        None => None,
                    },
                    (None, PrevRef::None) => None,
                }
            }
        };
        if let Some(slot) = slot {
            let mut latest = self.feed_latest.borrow_mut();
            match &object {
                Some(b) if kind != super::super::codec::DeltaKind::Deleted => {
                    latest.insert(slot, b.clone());
                }
                _ => {
                    latest.remove(&slot);
                }
            }
        }
        let record = LogRecord {
            seq: Seq(seq),
            scope,
            kind,
            key: key.clone(),
            rv,
            object,
            old,
            final_state_unknown,
        };
        Ok((record, held_entry))
    }

    /// Decompresses stored bytes in the open group (its dictionaries included).
    fn unpack(
        &self,
        t: &super::apply::Tables<'_>,
        compression: super::super::codec::Compression,
        bytes: &[u8],
    ) -> Result<Bytes, StoreError> {
        let load = |scope: u32, id: u32| -> Result<Option<Vec<u8>>, StoreError> {
            let table = t.txn.open_table(super::super::schema::DICTS).map_err(|e| self.st(e))?;
            super::super::read::dict_row(&self.shared, &table, scope, id)
        };
        self.shared.dicts.unpack(compression, bytes, &load)
    }

    /// Gives `scope` a hot tier (between groups), loaded in the background.
    fn enable_hot(&self, scope: ScopeId, budget: usize) {
        if budget == 0 || self.hot.borrow().contains_key(&scope.0) {
            return;
        }
        let tier = Arc::new(HotTier::new(scope, budget, Seq(self.next_seq.get() - 1)));
        self.hot.borrow_mut().insert(scope.0, tier.clone());
        self.shared.hot.writing().insert(scope, tier.clone());
        self.load_hot(scope, &tier);
    }

    /// Loads `tier` from a snapshot of the database as it is now (between groups), on a
    /// thread of its own; the writer journals the groups after it meanwhile.
    fn load_hot(&self, scope: ScopeId, tier: &Arc<HotTier>) {
        use redb::ReadableDatabase;
        let load = tier.begin_load();
        let txn = self
            .shared
            .db()
            .and_then(|db| db.begin_read().map_err(|e| self.shared.storage(e)));
        let indexes = self
            .shared
            .indexes
            .for_scope(scope)
            .into_iter()
            .map(|ix| ix.name)
            .collect::<Vec<_>>();
        let shared = self.shared.clone();
        let tier2 = tier.clone();
        let spawned = std::thread::Builder::new()
            .name("durable-informer-hot".into())
            .spawn(move || match txn {
                Ok(txn) => tier2.load(load, &Snapshot::from_txn(shared, txn, scope), &indexes),
                Err(e) => tier2.fail(load, &e),
            });
        if let Err(e) = spawned {
            tier.fail(
                load,
                &StoreError::Io {
                    path: "hot tier loader thread".into(),
                    source: e,
                },
            );
        }
    }

    pub(super) fn st<E: Into<redb::Error>>(&self, e: E) -> StoreError {
        self.shared.storage(e)
    }
}

/// Persists the last seq handed out, so seqs stay increasing after the log is emptied.
pub(super) fn save_last_seq(shared: &Shared, txn: &WriteTransaction, last: u64) -> Result<(), StoreError> {
    let mut meta = txn.open_table(META).map_err(|e| shared.storage(e))?;
    meta.insert(META_LAST_SEQ, last.to_be_bytes().as_slice())
        .map_err(|e| shared.storage(e))?;
    Ok(())
}

pub(super) fn send_reply(reply: Reply, last: Seq) {
    match reply {
        Reply::Scope(a, r) => drop(a.send(r)),
        Reply::Committed(a, r) => drop(a.send(r.map(|entries| Committed { seq: last, entries }))),
        Reply::Unit(a, r) => drop(a.send(r)),
        Reply::Relist(a, r) => drop(a.send(r)),
        Reply::Compact(a, r) => drop(a.send(r)),
        Reply::Bool(a, r) => drop(a.send(r)),
        Reply::Hot(a, _, _) => drop(a.send(Err(StoreError::Aborted("hot tier request was dropped".into())))),
        // Handled by the writer before replies are sent.
        Reply::Deferred(d) => d.fail(&StoreError::Aborted("deferred work was dropped".into())),
    }
}

pub(super) fn fail_replies(replies: Vec<Reply>, e: &StoreError) {
    for r in replies {
        match r {
            Reply::Scope(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Committed(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Unit(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Relist(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Compact(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Bool(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Hot(a, _, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Deferred(d) => d.fail(e),
        }
    }
}

pub(super) fn fail_all(cmds: Vec<Command>, e: &StoreError) {
    for c in cmds {
        let err = e.to_aborted();
        match c {
            Command::RegisterScope(_, a) => drop(a.send(Err(err))),
            Command::Apply(_, a) => drop(a.send(Err(err))),
            Command::Stage(_, _, a)
            | Command::AbortRelist(_, a)
            | Command::EnsureIndex(_, _, a)
            | Command::SetCursor(_, _, _, a)
            | Command::DeleteCursor(_, _, a)
            | Command::ResetScope(_, a)
            | Command::ShardFetched(_, a)
            | Command::HotTier(_, _, a) => drop(a.send(Err(err))),
            Command::FinishRelist(_, _, _, a) | Command::ChangeShard(_, _, a) => drop(a.send(Err(err))),
            Command::Compact(_, a) => drop(a.send(Err(err))),
            Command::Settle(a) | Command::Flush(a) => drop(a.send(Err(err))),
            Command::Identity(_, _, a) => drop(a.send(Err(err))),
            Command::Shutdown => {}
        }
    }
}

impl Deferred {
    pub(super) fn fail(self, e: &StoreError) {
        match self {
            Deferred::Compact(a, _) => drop(a.send(Err(e.to_aborted()))),
            Deferred::Settle(a) | Deferred::Backfill(a, _, _) => drop(a.send(Err(e.to_aborted()))),
        }
    }
}
