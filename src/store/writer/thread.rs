//! The writer thread: the loop that takes commands, commits them in groups and answers.

use crate::util::RwLocked;
use std::cell::{Cell, RefCell};
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use redb::WriteTransaction;
use tokio::sync::oneshot;

use super::super::codec::Compression;
use super::super::fence::SyncState;
use super::super::read::Snapshot;
use super::super::schema::{IndexName, ScopeId, Seq, META, META_LAST_SEQ};
use super::super::{Shared, StoreError};
use super::background::Upkeep;
use super::dicts::Dictionaries;
use super::publish::Publisher;
use super::retention::Goal;
use super::{last_seq_read, Ack, Command, Committed, CompactReport, Delta, Durability, RelistSummary, Subscription};

/// First and longest wait between the writer's own attempts to reopen a poisoned database.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(10);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// The writer thread's state: the log position, and one part per concern, each owning its
/// fields (group commit here, [`Publisher`] in `publish`, [`Upkeep`] in `background`,
/// [`Dictionaries`] in `dicts`).
pub(super) struct WriterThread {
    /// Next log seq to hand out; reset to its value at the start of a group that rolls back.
    pub(super) next_seq: Cell<u64>,
    pub(super) shared: Arc<Shared>,
    pub(super) commit: GroupCommit,
    /// The change streams and the applied, committed and durable positions.
    pub(super) publisher: Publisher,
    /// Compaction, retention and index backfills between groups.
    pub(super) upkeep: Upkeep,
    /// Compression dictionaries.
    pub(super) dict: Dictionaries,
}

/// How groups are taken and committed.
pub(super) struct GroupCommit {
    pub(super) rx: Receiver<Command>,
    /// How long deferred batches may wait for their durable commit; `None`: they do not.
    pub(super) fsync_delay: Option<std::time::Duration>,
    /// When the durable commit of the deferred batches committed so far is due.
    pub(super) fsync_due: Cell<Option<std::time::Instant>>,
    /// Whether the store fsyncs at all (`StoreConfig::durable`).
    pub(super) durable: bool,
    /// Other processes may read the file (`StoreConfig::live_inspection`): redb shares only
    /// durable commits then, so every group is fsynced, relaxed ones too.
    pub(super) shared_file: bool,
    pub(super) max_deltas: usize,
    pub(super) max_bytes: usize,
    /// What the open group's batches held, freed by the `reaper` thread after the group: the
    /// objects were allocated on other threads, and freeing thousands of small allocations
    /// from another thread's arena slowed the writer (`docs/benchmarks.md`).
    pub(super) garbage: RefCell<Vec<Garbage>>,
    /// Frees garbage; `None` (or full) frees it here.
    pub(super) reaper: Option<crossbeam_channel::Sender<Vec<Garbage>>>,
    /// An I/O error happened: redb refuses every later operation ("Previous I/O error
    /// occurred") until the database is reopened, which the next group does first.
    pub(super) poisoned: Cell<bool>,
    /// The periodic durable commit's fsync running in the background (`store::fence`): its
    /// number, and the seq that is on disk once it finishes.
    pub(super) pending_sync: Cell<Option<(u64, Seq)>>,
    /// The group being committed is the periodic durable commit, whose fsync may run in the
    /// background.
    pub(super) background_sync: Cell<bool>,
    /// Set while the store closes: its last commit is durable in every mode.
    pub(super) closing: Cell<bool>,
}

/// What the writer's wait for its next command ended with.
enum Next {
    Command(Command),
    /// The timeout passed, or a background fsync finished.
    Woken,
    Disconnected,
}

/// What a group let go of, kept until the group is done and then freed by the reaper.
#[allow(dead_code)] // the fields are held only to be dropped on the reaper thread
pub(super) enum Garbage {
    /// A batch's deltas and compressed blobs.
    Batch(Vec<Delta>, Vec<(Bytes, Compression)>),
}

/// Hands the group's garbage to the reaper when the group ends, however it ends.
pub(super) struct Reap<'w>(&'w WriterThread);

impl Drop for Reap<'_> {
    fn drop(&mut self) {
        let garbage = std::mem::take(&mut *self.0.commit.garbage.borrow_mut());
        if garbage.is_empty() {
            return;
        }
        if let Some(reaper) = &self.0.commit.reaper {
            // Full or gone: drop it here instead.
            let _ = reaper.try_send(garbage);
        }
    }
}

/// A command's reply, held until the transaction commits.
pub(super) enum Reply {
    Scope(
        Ack<super::ScopeRegistration>,
        Result<super::ScopeRegistration, StoreError>,
    ),
    Committed(Ack<Committed>, Result<u64, StoreError>),
    Unit(Ack<()>, Result<(), StoreError>),
    Relist(Ack<RelistSummary>, Result<RelistSummary, StoreError>),
    Compact(Ack<CompactReport>, Result<CompactReport, StoreError>),
    Bool(Ack<bool>, Result<bool, StoreError>),
    /// A subscription to a scope's changes, made once the group committed.
    Subscribe(Ack<Subscription>, ScopeId),
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
            self.poll_sync();
            // Deferred batches wait `fsync_delay` for their durable commit, and for the
            // previous one's fsync to finish (until then they are on their way to disk with it).
            let due_in = self
                .commit
                .fsync_due
                .get()
                .filter(|_| self.commit.pending_sync.get().is_none())
                .map(|due| due.saturating_duration_since(std::time::Instant::now()));
            if due_in == Some(std::time::Duration::ZERO) && !self.commit.poisoned.get() {
                self.flush_deferred(true);
                continue;
            }
            let first = if self.commit.poisoned.get() {
                match self.commit.rx.recv_timeout(retry) {
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
            } else if self.has_background_work() && self.commit.pending_sync.get().is_none() {
                // (Not while a background fsync runs: its writes would wait for it.)
                // Background work (compaction, backfill) runs while nothing is queued.
                retry = RETRY_FIRST;
                match self.commit.rx.try_recv() {
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
                let poll = due_in.map_or(poll, |d| d.min(poll));
                let started = std::time::Instant::now();
                match self.next_command(Some(poll)) {
                    Next::Command(cmd) => cmd,
                    Next::Woken => {
                        // An idle tick writes: not while a background fsync runs.
                        if started.elapsed() >= poll && self.commit.pending_sync.get().is_none() {
                            self.idle_tick();
                        }
                        continue;
                    }
                    Next::Disconnected => break,
                }
            } else {
                retry = RETRY_FIRST;
                match self.next_command(due_in) {
                    Next::Command(cmd) => cmd,
                    Next::Woken => continue,
                    Next::Disconnected => break,
                }
            };
            let mut group = vec![first];
            let (mut n, mut bytes) = group[0].weight();
            while n < self.commit.max_deltas && bytes < self.commit.max_bytes {
                match self.commit.rx.try_recv() {
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
                let appended = self.commit_group_guarded(group);
                self.after_group(appended);
            }
        }
        if self.commit.pending_sync.get().is_some() {
            self.shared.fence.settle();
            self.poll_sync();
        }
        self.scope_life_close();
        // What a store that does not fsync acknowledged is made durable as it closes.
        let unsynced = self.commit.fsync_due.get().is_some() || !self.commit.durable;
        if unsynced && !self.commit.poisoned.get() {
            self.commit.closing.set(true);
            self.flush_deferred(false);
        }
        self.abandon_background_work();
    }

    /// Waits for the next command, at most `timeout`, waking early when a background fsync
    /// finishes (so its commit is reported durable at once).
    fn next_command(&self, timeout: Option<std::time::Duration>) -> Next {
        let never = crossbeam_channel::never();
        let woken = if self.commit.pending_sync.get().is_some() {
            self.shared.fence.woken()
        } else {
            &never
        };
        let deadline = timeout.map_or_else(crossbeam_channel::never, crossbeam_channel::after);
        crossbeam_channel::select! {
            recv(self.commit.rx) -> cmd => match cmd {
                Ok(cmd) => Next::Command(cmd),
                Err(_) => Next::Disconnected,
            },
            recv(woken) -> _ => Next::Woken,
            recv(deadline) -> _ => Next::Woken,
        }
    }

    /// Reports the periodic durable commit durable once its background fsync finished; a
    /// failed one poisons the database like a failed commit (the next group reopens it and
    /// takes back what the file does not hold).
    fn poll_sync(&self) {
        let Some((n, seq)) = self.commit.pending_sync.get() else {
            return;
        };
        match self.shared.fence.state(n) {
            SyncState::Running => {}
            SyncState::Done => {
                self.commit.pending_sync.set(None);
                self.publisher.durable_at_least(seq);
            }
            SyncState::Failed(e) => {
                self.commit.pending_sync.set(None);
                tracing::warn!(error = %e, "the durable commit's background fsync failed");
                if !self.commit.poisoned.replace(true) {
                    crate::store::metrics::storage_error(&self.shared.path);
                }
            }
        }
    }

    /// The durable commit that deferred batches wait for (an empty durable group);
    /// `background`: its fsync may run on the fence's thread.
    fn flush_deferred(&self, background: bool) {
        let (ack, _) = oneshot::channel();
        self.commit.background_sync.set(background);
        self.commit_group(vec![Command::Flush(ack)]);
        self.commit.background_sync.set(false);
        if self.commit.poisoned.get() {
            // Failed: `recover` drops the deferred commits with the rest.
            self.commit.fsync_due.set(None);
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
        self.dict.scopes.borrow_mut().clear();
        self.dict.pending.borrow_mut().clear();
        self.dict.published.writing().clear();
        self.commit.poisoned.set(false);
        self.forget_group();
        // Commits not yet on disk are gone: readers shown them hear of a rollback to `last`
        // (and the reflector's next batch, which requires them, is refused; it re-watches
        // from what the file holds).
        self.commit.fsync_due.set(None);
        self.commit.pending_sync.set(None);
        self.publisher.lost(last);
        crate::store::metrics::reopened(&self.shared.path);
        tracing::info!(last_seq = last.0, "database reopened after an I/O error");
        Ok(())
    }

    /// Remembers that `e` needs a reopen before the next group (redb latches I/O errors).
    pub(super) fn note(&self, e: &StoreError) {
        if let StoreError::Storage { source, .. } = e {
            if matches!(source, redb::Error::Io(_) | redb::Error::PreviousIo) {
                // Counted once per failure: redb repeats it as `PreviousIo` until the reopen.
                if !self.commit.poisoned.replace(true) {
                    crate::store::metrics::storage_error(&self.shared.path);
                }
            }
        }
    }

    /// [`commit_group`](Self::commit_group), surviving a panic on this thread (redb on a
    /// damaged file, say): the group's senders get `WriterGone`, anything it showed readers is
    /// taken back by the reopen that follows, and the writer goes on.
    fn commit_group_guarded(&self, group: Vec<Command>) -> u64 {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.commit_group(group))) {
            Ok(appended) => appended,
            Err(payload) => {
                tracing::error!(
                    panic = crate::util::panic_message(&*payload),
                    "the writer panicked in a group commit; reopening the database"
                );
                self.forget_group();
                self.commit.poisoned.set(true);
                0
            }
        }
    }

    /// How durable a group must be: as its most durable command (see [`Durability`]), with
    /// deferred batches immediate when the store defers nothing.
    fn group_durability(&self, group: &[Command]) -> Durability {
        group
            .iter()
            .map(|c| match c {
                Command::Apply(b, _) if b.durability == Durability::Deferred && self.commit.fsync_delay.is_none() => {
                    Durability::Immediate
                }
                Command::Apply(b, _) => b.durability,
                _ => Durability::Immediate,
            })
            .max()
            .unwrap_or(Durability::Immediate)
    }

    /// Applies and commits one group; returns how many log entries it appended.
    pub(super) fn commit_group(&self, group: Vec<Command>) -> u64 {
        let _span = tracing::debug_span!("commit", commands = group.len()).entered();
        let _reap = Reap(self);
        if self.commit.poisoned.get() {
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
        let durability = self.group_durability(&group);
        // Without an fsync (a relaxed or deferred group, or a store that never fsyncs) the
        // group is shown to readers as the writer decides it; with one, once on disk
        // (`fsync_delay(None)`: nothing deferred is seen before the disk has it).
        // A store that does not fsync still makes durable what a scope is (its registration,
        // indexes, shard range, a reset or drop) and the cluster's identity: a reopen after an
        // I/O error must not take those back, as informers set them only as they start (they
        // would fail with "no such scope" or "no index named" for ever). And its last commit
        // as it closes: otherwise a reopen after an I/O error goes back past earlier runs,
        // whose durable handlers' cursors it takes too.
        let structural = self.commit.closing.get() || group.iter().any(Command::is_structural);
        let fsync = if self.commit.durable {
            self.commit.shared_file || durability == Durability::Immediate
        } else {
            structural
        };
        if !fsync {
            relax(&mut txn);
        }
        let start_seq = self.next_seq.get();
        self.publisher.begin_group(!fsync);
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
            self.publisher.abort_group(Seq(start_seq - 1));
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
            self.publisher.abort_group(Seq(start_seq - 1));
            self.next_seq.set(start_seq);
            fail_replies(replies, &e);
            return 0;
        }
        if !fsync {
            self.publisher.show_group(last);
        }
        // Only the periodic durable commit (no replies wait on it) fsyncs in the background.
        let background = fsync && self.commit.background_sync.get() && !self.commit.shared_file;
        let fence = &self.shared.fence;
        let before = fence.started();
        if background {
            fence.arm();
        }
        let done = txn.commit();
        let syncing = if background { fence.disarm(before) } else { None };
        if let Err(e) = done {
            let e = self.shared.storage(e);
            tracing::warn!(error = %e, "commit failed");
            self.note(&e);
            self.forget_group();
            self.publisher.abort_group(Seq(start_seq - 1));
            self.next_seq.set(start_seq);
            fail_replies(replies, &e);
            return 0;
        }
        for scope in self.dict.pending.borrow_mut().drain(..) {
            if let Some(d) = self.scope_dict_cached(ScopeId(scope)) {
                self.publish(scope, d);
            }
        }
        if fsync {
            self.publisher.show_group(last);
        }
        self.publisher.committed(last);
        if let Some(n) = syncing {
            // On disk once fsync `n` finishes (`poll_sync`); deferred batches committed from
            // now on wait for the next durable commit.
            self.commit.fsync_due.set(None);
            self.commit.pending_sync.set(Some((n, last)));
        } else if fsync || !self.commit.durable {
            // On disk (or the store does not fsync at all): so is everything before it.
            self.commit.fsync_due.set(None);
            self.publisher.durable_at_least(last);
        } else if durability == Durability::Deferred && self.commit.fsync_due.get().is_none() {
            let delay = self.commit.fsync_delay.unwrap_or_default();
            self.commit.fsync_due.set(Some(std::time::Instant::now() + delay));
        }
        for r in replies {
            match r {
                Reply::Deferred(d) => self.defer(d),
                Reply::Subscribe(ack, scope) => {
                    let _ = ack.send(self.subscribe(scope));
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
            Command::SetCursor(scope, name, seq, seen, ack) => {
                run!(Unit, ack, self.set_cursor(txn, scope, name.as_str(), seq, seen))
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
            Command::DropScope(scope, ack) => run!(Unit, ack, self.drop_scope(txn, scope)),
            Command::ChangeShard(scope, record, ack) => run!(Relist, ack, self.change_shard(txn, scope, &record)),
            Command::ShardFetched(scope, ack) => run!(Unit, ack, self.shard_fetched(txn, scope)),
            Command::Subscribe(scope, ack) => Ok(Reply::Subscribe(ack, scope)),
            Command::Shutdown => Ok(Reply::Unit(oneshot::channel().0, Ok(()))),
        }
    }

    /// Forgets what the open group prepared, after it rolled back.
    fn forget_group(&self) {
        self.forget_pending_dicts();
    }

    /// A reader of `scope`'s changes from here on, with a read snapshot of everything before
    /// (between two groups, so nothing is in flight).
    fn subscribe(&self, scope: ScopeId) -> Result<Subscription, StoreError> {
        let reader = self.publisher.subscribe(scope);
        let txn = self.shared.db()?.begin_read().map_err(|e| self.st(e))?;
        Ok(Subscription {
            reader,
            snapshot: Snapshot::from_txn(self.shared.clone(), txn, scope),
        })
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
        Reply::Subscribe(a, _) => drop(a.send(Err(StoreError::Aborted("subscription was dropped".into())))),
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
            Reply::Subscribe(a, _) => drop(a.send(Err(e.to_aborted()))),
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
            | Command::SetCursor(_, _, _, _, a)
            | Command::DeleteCursor(_, _, a)
            | Command::ResetScope(_, a)
            | Command::DropScope(_, a)
            | Command::ShardFetched(_, a) => drop(a.send(Err(err))),
            Command::Subscribe(_, a) => drop(a.send(Err(err))),
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

/// Makes `txn` commit without an fsync. redb refuses that only in a mode other processes read,
/// where the writer never asks for it (`GroupCommit::shared_file`).
pub(super) fn relax(txn: &mut redb::WriteTransaction) {
    let refused = txn.set_durability(redb::Durability::None);
    debug_assert!(refused.is_ok(), "{refused:?}");
    if let Err(e) = refused {
        tracing::error!(error = %e, "a commit meant to skip its fsync is made durable instead");
    }
}
