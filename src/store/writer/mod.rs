//! The writer: one OS thread that owns every write transaction.
//!
//! Commands arrive over a crossbeam channel. The thread takes what is queued (bounded by count
//! and bytes: group commit), applies it in one transaction, commits, and only then acknowledges
//! each sender and publishes the committed log position. A command that is refused (say, an RV
//! regression) is refused before it writes anything, so the others in the group still commit;
//! a storage error aborts the whole group and every sender hears of it.
//!
//! Files: this one holds the [`Writer`] handle and its commands; `batch` what callers send and
//! get back; `thread` the loop and group commit; `apply` a batch's objects, log and index rows;
//! `relist` staging and the relist diff; `scopes` scope records, cursors and the cluster
//! identity; `dicts` compression dictionaries; `backfill`, `retention` and `background` the
//! bounded work between groups.

mod apply;
mod backfill;
mod background;
mod batch;
mod dicts;
mod publish;
mod relist;
mod retention;
mod scopes;
mod shards;
mod thread;

use crate::util::RwLocked;
pub use batch::{Batch, Committed, CompactReport, Delta, Durability, RelistSummary};
pub(crate) use batch::{Packed, PublishedDicts};
pub use retention::LogPin;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::Arc;

use crossbeam_channel::Sender;
use redb::ReadableTable;
use tokio::sync::{oneshot, watch};

use bytes::Bytes;

use super::codec::{DeltaKind, ShardRecord};
use super::dict;
use super::schema::{CursorName, IndexName, ScopeId, Seq, LOG, META, META_LAST_SEQ};
use super::{Shared, StoreConfig, StoreError};
use crate::object::{RawObject, ResourceVersion};
use apply::Tables;
use thread::{Deferred, Failure, Garbage, Step, WriterThread};

type Ack<T> = oneshot::Sender<Result<T, StoreError>>;

/// Running index backfills and the callers waiting for each.
type Backfills = BTreeMap<(ScopeId, IndexName), Vec<Ack<()>>>;

enum Command {
    RegisterScope(String, Ack<ScopeRegistration>),
    Apply(Batch, Ack<Committed>),
    Stage(ScopeId, Vec<RawObject>, Ack<()>),
    FinishRelist(ScopeId, ResourceVersion, String, Ack<RelistSummary>),
    AbortRelist(ScopeId, Ack<()>),
    EnsureIndex(ScopeId, IndexName, Ack<()>),
    /// The last field: refused if the writer's rollback count is no longer this one.
    SetCursor(ScopeId, CursorName, Seq, Option<u64>, Ack<()>),
    DeleteCursor(ScopeId, CursorName, Ack<()>),
    Compact(Option<u64>, Ack<CompactReport>),
    Settle(Ack<()>),
    /// Commits durably (making earlier relaxed commits durable too).
    Flush(Ack<()>),
    Identity(String, bool, Ack<bool>),
    ResetScope(ScopeId, Ack<()>),
    DropScope(ScopeId, Ack<()>),
    ChangeShard(ScopeId, ShardRecord, Ack<RelistSummary>),
    ShardFetched(ScopeId, Ack<()>),
    /// A reader of a scope's change stream and a snapshot of what precedes it (after the
    /// group commits).
    Subscribe(ScopeId, Ack<Subscription>),
    Shutdown,
}

impl Command {
    /// Whether it changes what a scope is, or the cluster identity: committed durably even on a
    /// store that does not fsync.
    fn is_structural(&self) -> bool {
        matches!(
            self,
            Command::RegisterScope(..)
                | Command::Identity(..)
                | Command::EnsureIndex(..)
                | Command::ChangeShard(..)
                | Command::ResetScope(..)
                | Command::DropScope(..)
        )
    }

    fn weight(&self) -> (usize, usize) {
        match self {
            Command::Apply(b, _) => (b.deltas.len().max(1), b.bytes()),
            Command::Stage(_, objs, _) => (objs.len().max(1), objs.iter().map(|o| o.bytes.len()).sum()),
            _ => (1, 0),
        }
    }
}

/// The handle through which every write goes. Cheap to clone; usable from async code (the
/// `async` methods) and from plain threads (the `_blocking` methods, which must not be called
/// from inside an async task: they block the thread until the commit).
#[derive(Clone)]
pub struct Writer {
    tx: Sender<Command>,
    committed: watch::Receiver<Seq>,
    applied: watch::Receiver<Seq>,
    durable: watch::Receiver<Seq>,
    rollbacks: watch::Receiver<(u64, Seq)>,
    dicts: PublishedDicts,
    pins: Arc<retention::Pins>,
    fsyncs: bool,
}

/// What registering a scope found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScopeRegistration {
    /// The scope.
    pub scope: ScopeId,
    /// Whether this registration created it (no process had registered that spec before).
    pub created: bool,
    /// When it was created: the other scopes of the same resource (any version) and namespace
    /// that no informer of this process has registered, with their records. A selector,
    /// version or namespace change leaves the old scope behind like this: its rows stay until
    /// it is dropped ([`Writer::drop_scope`],
    /// [`StoreConfig::drop_unused_scopes_after`](super::StoreConfig::drop_unused_scopes_after)).
    pub left_behind: Vec<(ScopeId, super::ScopeRecord)>,
}

/// A reader of one scope's [change stream](super::changes) from a point between two group
/// commits, and a read snapshot of the database at that point: together, everything.
pub struct Subscription {
    /// The changes after the snapshot, in order.
    pub reader: super::changes::Reader,
    /// The scope as of just before the reader's first item.
    pub snapshot: super::Snapshot,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("reader", &self.reader)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("committed", &*self.committed.borrow())
            .finish()
    }
}

macro_rules! request {
    ($name:ident, $blocking:ident, ($($arg:ident: $ty:ty),*) -> $out:ty, $variant:ident, $doc:literal) => {
        #[doc = $doc]
        pub async fn $name(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
            let (ack, rx) = oneshot::channel();
            self.send(Command::$variant($($arg.into()),*, ack))?;
            rx.await.map_err(|_| StoreError::WriterGone)?
        }

        #[doc = $doc]
        ///
        /// Blocks the calling thread until the commit; never call it from an async task.
        pub fn $blocking(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
            let (ack, rx) = oneshot::channel();
            self.send(Command::$variant($($arg.into()),*, ack))?;
            futures::executor::block_on(rx).map_err(|_| StoreError::WriterGone)?
        }
    };
}

impl Writer {
    fn send(&self, cmd: Command) -> Result<(), StoreError> {
        self.tx.send(cmd).map_err(|_| StoreError::WriterGone)
    }

    /// Registers a scope, or finds the one with the same spec.
    pub async fn register_scope(&self, spec: &super::ScopeSpec) -> Result<ScopeId, StoreError> {
        Ok(self.register_scope_reporting(spec).await?.scope)
    }

    /// Registers a scope, or finds the one with the same spec. Blocking.
    pub fn register_scope_blocking(&self, spec: &super::ScopeSpec) -> Result<ScopeId, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::RegisterScope(spec.canonical(), ack))?;
        Ok(futures::executor::block_on(rx)
            .map_err(|_| StoreError::WriterGone)??
            .scope)
    }

    /// [`register_scope`](Self::register_scope), also saying whether the scope is new and
    /// which scopes it may leave behind (see [`ScopeRegistration`]).
    pub async fn register_scope_reporting(&self, spec: &super::ScopeSpec) -> Result<ScopeRegistration, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::RegisterScope(spec.canonical(), ack))?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Queues a batch now and returns a receiver for its commit, so a caller can keep reading
    /// while earlier batches commit (pipelining). When the receiver yields `Ok` the batch is
    /// committed, and on disk as its [`Durability`] says: at once for
    /// [`Immediate`](Durability::Immediate) (the default), within the store's `fsync_delay`
    /// for [`Deferred`](Durability::Deferred), with the next durable commit for
    /// [`Relaxed`](Durability::Relaxed).
    ///
    /// Once the scope has a committed dictionary, the objects are compressed here, on the
    /// caller's thread, so the writer thread spends its time on redb work.
    pub fn submit(&self, batch: Batch) -> Result<oneshot::Receiver<Result<Committed, StoreError>>, StoreError> {
        let batch = self.precompress(batch);
        let (ack, rx) = oneshot::channel();
        self.send(Command::Apply(batch, ack))?;
        Ok(rx)
    }

    fn precompress(&self, mut batch: Batch) -> Batch {
        if batch.packed.is_some() || batch.deltas.is_empty() {
            return batch;
        }
        let dict = self.dicts.reading().get(&batch.scope.0).cloned();
        let Some(dict) = dict else { return batch };
        let blobs: Result<Vec<Bytes>, _> = batch
            .deltas
            .iter()
            .filter(|d| d.kind != DeltaKind::Sync)
            .map(|d| dict::pack_with(&dict, &d.object.bytes))
            .collect();
        // On an error the writer compresses them itself, and reports it.
        if let Ok(blobs) = blobs {
            batch.packed = Some(Packed { dict, blobs });
        }
        batch
    }

    /// Queues one page of a relist now (see [`Writer::stage_relist`]) and returns a receiver
    /// for its commit, for callers that pipeline pages like [`Writer::submit`].
    pub fn submit_stage(
        &self,
        scope: ScopeId,
        objects: Vec<RawObject>,
    ) -> Result<oneshot::Receiver<Result<(), StoreError>>, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::Stage(scope, objects, ack))?;
        Ok(rx)
    }

    /// Applies a batch in the next group commit and returns once it is committed (and on disk
    /// as its [`Durability`] says; see [`submit`](Self::submit)).
    pub async fn apply(&self, batch: Batch) -> Result<Committed, StoreError> {
        self.submit(batch)?.await.map_err(|_| StoreError::WriterGone)?
    }

    /// [`apply`](Self::apply), blocking the calling thread.
    ///
    /// Blocks the calling thread until the commit; never call it from an async task.
    pub fn apply_blocking(&self, batch: Batch) -> Result<Committed, StoreError> {
        futures::executor::block_on(self.submit(batch)?).map_err(|_| StoreError::WriterGone)?
    }

    request!(stage_relist, stage_relist_blocking, (scope: ScopeId, objects: Vec<RawObject>) -> (), Stage,
        "Stages one page of a relist. Readers keep seeing the old state until `finish_relist`.");
    request!(abort_relist, abort_relist_blocking, (scope: ScopeId) -> (), AbortRelist,
        "Drops what was staged for a relist (for example when the list restarts).");
    request!(ensure_index, ensure_index_blocking, (scope: ScopeId, name: IndexName) -> (), EnsureIndex,
        "Records an index registered with `DurableStore::register_index` on the scope and backfills its rows for the objects already stored; returns once the index answers queries.\n\n\
        The backfill runs in transactions of at most 1,000 objects, between the batches of every scope, so ingest goes on meanwhile. \
        Until it finished, queries of the index return `StoreError::IndexNotReady` (never a partial answer). \
        Its progress is persisted: after a crash, calling this again (with the index registered) resumes where it stopped.\n\n\
        ```no_run\n\
        use durable_informer::object::ScopeSpec;\n\
        use durable_informer::store::{DurableStore, Indexer, StoreConfig, LABELS};\n\
        # fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
        let db = DurableStore::open(StoreConfig::new(\"/tmp/cache.redb\"))?;\n\
        let scope = db.writer().register_scope_blocking(&ScopeSpec::new(\"\", \"v1\", \"pods\"))?;\n\
        db.register_index(scope, Indexer::labels());\n\
        db.writer().ensure_index_blocking(scope, LABELS.into())?;\n\
        let web = db.store(scope).by_index(LABELS, \"app=web\")?;\n\
        # let _ = web; Ok(()) }\n\
        ```");
    /// Persists the cursor of the durable consumer `name` of `scope`: every entry up to `seq`
    /// was handled. Consumers of different scopes may share a name. A seq past the log is
    /// refused ([`StoreError::CursorPastLog`]).
    pub async fn set_cursor(&self, scope: ScopeId, name: CursorName, seq: Seq) -> Result<(), StoreError> {
        self.cursor_command(scope, name, seq, None).await
    }

    /// [`set_cursor`](Self::set_cursor), blocking the calling thread.
    ///
    /// Blocks the calling thread until the commit; never call it from an async task.
    pub fn set_cursor_blocking(&self, scope: ScopeId, name: CursorName, seq: Seq) -> Result<(), StoreError> {
        futures::executor::block_on(self.cursor_command(scope, name, seq, None))
    }

    /// [`set_cursor`](Self::set_cursor) for a consumer that had looked at the writer's
    /// [`rollbacks`](Self::rollbacks) count when it was `seen`: refused with
    /// [`StoreError::CursorRolledBack`] if a rollback came since. A rollback (a reopen after
    /// an I/O error) hands its seqs out again, so a position read before it may name entries
    /// the consumer never saw; on a store that does not fsync
    /// ([`StoreConfig::durable`](crate::store::StoreConfig::durable)) a consumer may also
    /// have been told what it took back.
    ///
    /// ```no_run
    /// use durable_informer::object::ScopeSpec;
    /// use durable_informer::store::{CursorName, DurableStore, Seq, StoreConfig, StoreError};
    /// # async fn run() -> Result<(), StoreError> {
    /// let db = DurableStore::open(StoreConfig::new("/tmp/cache.redb").durable(false))?;
    /// let writer = db.writer();
    /// let scope = writer.register_scope(&ScopeSpec::new("", "v1", "pods")).await?;
    /// let seen = writer.rollbacks().borrow().0;
    /// let (entries, last) = db.log().read_scope_after_contiguous(Seq(0), 100, scope)?;
    /// // ... handle `entries` ...
    /// # let _ = entries;
    /// match writer.set_cursor_unless_rolled_back(scope, CursorName::from("mine"), last, seen).await {
    ///     Err(StoreError::CursorRolledBack { .. }) => { /* read again from the rollback's seq */ }
    ///     other => other?,
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn set_cursor_unless_rolled_back(
        &self,
        scope: ScopeId,
        name: CursorName,
        seq: Seq,
        seen: u64,
    ) -> Result<(), StoreError> {
        self.cursor_command(scope, name, seq, Some(seen)).await
    }

    async fn cursor_command(
        &self,
        scope: ScopeId,
        name: CursorName,
        seq: Seq,
        seen: Option<u64>,
    ) -> Result<(), StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::SetCursor(scope, name, seq, seen, ack))?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    request!(delete_cursor, delete_cursor_blocking, (scope: ScopeId, name: CursorName) -> (), DeleteCursor,
        "Removes the cursor of the durable consumer `name` of `scope`, so it no longer holds back compaction.");
    request!(compact, compact_blocking, (keep_entries: Option<u64>) -> CompactReport, Compact,
        "Removes log entries below every durable cursor that are beyond `keep_entries` (default: the configured `retention_entries`) or older than the configured `retention_age`; returns once done.\n\n\
        It runs in transactions of at most 4,096 entries between incoming batches. The writer applies the configured retention on its own too; this is for applying it now or with another count (the CLI `compact`).\n\n\
        ```no_run\n\
        use durable_informer::store::{DurableStore, StoreConfig};\n\
        # fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
        let db = DurableStore::open(StoreConfig::new(\"/tmp/cache.redb\"))?;\n\
        let report = db.writer().compact_blocking(Some(1000))?;\n\
        println!(\"removed {}, first retained {}\", report.removed, report.first_retained);\n\
        # Ok(()) }\n\
        ```");
    request!(reset_scope, reset_scope_blocking, (scope: ScopeId) -> (), ResetScope,
        "Forgets a scope's objects, indexes and RV (its log entries stay, for cursors).");
    request!(drop_scope, drop_scope_blocking, (scope: ScopeId) -> (), DropScope,
        "Removes a scope from the database: its record, objects, indexes, durable cursors, shard range and use record, in one transaction. Its log entries stay until retention removes them, and its id is never handed out again. Refused with `StoreError::ScopeInUse` for a scope registered through this store since it was opened (an informer of this process uses it), and `StoreError::UnknownScope` for one that does not exist.\n\n\
        `DurableStore::scope_usage` lists the scopes with their size and last use; \
        `StoreConfig::drop_unused_scopes_after` drops the unused ones on its own.\n\n\
        ```\n\
        use durable_informer::object::ScopeSpec;\n\
        use durable_informer::store::{DurableStore, StoreConfig};\n\
        # let dir = tempfile::tempdir().unwrap();\n\
        # let path = dir.path().join(\"db.redb\");\n\
        # let old = DurableStore::open(StoreConfig::new(&path)).unwrap();\n\
        # old.writer().register_scope_blocking(&ScopeSpec::new(\"\", \"v1\", \"pods\").labels(\"app=old\")).unwrap();\n\
        # old.close().unwrap();\n\
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();\n\
        // A scope an earlier run left behind (this process never registered it):\n\
        let (old, _) = db.scopes().unwrap().into_iter().next().unwrap();\n\
        db.writer().drop_scope_blocking(old).unwrap();\n\
        assert!(db.scopes().unwrap().is_empty());\n\
        ```");

    request!(change_shard, change_shard_blocking, (scope: ScopeId, record: ShardRecord) -> RelistSummary, ChangeShard,
        "Gives the scope a shard range, in one transaction: every stored object outside `record.range` is deleted (logged as a delete with its final state unknown, as a relist's, so handlers see it; `deleted` counts them, `unchanged` the objects kept) and `record` is saved. `record.pending` names the ranges still to fetch at the scope's RV; [`Writer::shard_fetched`] or a relist clears it.");
    request!(shard_fetched, shard_fetched_blocking, (scope: ScopeId) -> (), ShardFetched,
        "Records that the ranges added by the last shard change are fetched (clears `ShardRecord::pending`).");

    request!(finish_relist, finish_relist_blocking, (scope: ScopeId, rv: ResourceVersion, reason: &str) -> RelistSummary, FinishRelist,
        "Diffs the staged relist against the stored objects and swaps it in, in one transaction: new → Added, changed RV → Updated, not listed → Deleted (final state unknown), same RV → nothing. Sets the scope RV to `rv` (which may be lower than before: a relist is the only way an RV moves backwards). A shard's pending ranges are cleared: the relist listed the whole range.");

    /// Records the cluster identity, or checks it against the stored one. With `reset`, a
    /// different identity wipes every scope instead of failing. Returns `true` when the
    /// database was wiped.
    pub async fn cluster_identity(&self, identity: &str, reset: bool) -> Result<bool, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::Identity(identity.to_owned(), reset, ack))?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Blocking form of [`cluster_identity`](Self::cluster_identity).
    pub fn cluster_identity_blocking(&self, identity: &str, reset: bool) -> Result<bool, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::Identity(identity.to_owned(), reset, ack))?;
        futures::executor::block_on(rx).map_err(|_| StoreError::WriterGone)?
    }

    /// Plans automatic retention with the store clock's current time and returns once its
    /// compaction steps ran (or a durable cursor stopped them). For tests that check what
    /// automatic retention did; the writer does the same on its own after commits.
    #[doc(hidden)]
    pub fn settle_blocking(&self) -> Result<(), StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::Settle(ack))?;
        futures::executor::block_on(rx).map_err(|_| StoreError::WriterGone)?
    }

    /// Makes everything committed so far durable (one durable commit; relaxed batches before
    /// it were committed without waiting for the disk).
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::Flush(ack))?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// [`flush`](Self::flush), blocking the calling thread; never call it from an async task.
    pub fn flush_blocking(&self) -> Result<(), StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::Flush(ack))?;
        futures::executor::block_on(rx).map_err(|_| StoreError::WriterGone)?
    }

    /// Subscribes to `scope`'s changes: a reader of its [change stream](super::changes) and a
    /// read snapshot holding everything before the reader's first item (taken between two
    /// group commits). Changes of a group that commits without an fsync reach the stream as
    /// the writer decides them, before the disk has them; see [`Item::Rollback`](super::Item).
    ///
    /// ```no_run
    /// # async fn f(db: durable_informer::store::DurableStore, scope: durable_informer::store::ScopeId) -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::store::StreamRead;
    /// let mut sub = db.writer().subscribe(scope).await?;
    /// println!("{} objects before", sub.snapshot.len()?);
    /// while sub.reader.changed().await {
    ///     if let StreamRead::Items(items, _) = sub.reader.read(256) {
    ///         println!("{} changes", items.len());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn subscribe(&self, scope: ScopeId) -> Result<Subscription, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::Subscribe(scope, ack))?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Keeps the log entries after `seq` from compaction while the pin lives, for a reader
    /// that has no durable cursor yet (a durable handler delivering its initial adds).
    #[must_use]
    pub fn pin(&self, seq: Seq) -> LogPin {
        self.pins.pin(seq)
    }

    /// Whether commits reach the disk before they count as [`durable`](Self::durable). Without
    /// it ([`StoreConfig::durable(false)`](super::StoreConfig::durable)) every commit counts
    /// as durable at once, and a reopen after an I/O error can take back commits that
    /// `durable` had reported: readers of the log must then follow the rollback.
    #[must_use]
    pub(crate) fn fsyncs(&self) -> bool {
        self.fsyncs
    }

    /// The last log seq known to be on disk: equal to [`committed`](Self::committed) except
    /// while batches sent with [`Batch::deferred_fsync`] wait for their durable commit (at most
    /// the store's [`fsync_delay`](super::StoreConfig::fsync_delay)). Durable handlers read the
    /// log up to here only.
    #[must_use]
    pub fn durable(&self) -> watch::Receiver<Seq> {
        self.durable.clone()
    }

    /// How many times commits not yet on disk were rolled back (after a failed fsync, or a
    /// failed commit of a group already shown to readers), and the last seq that stands: seqs
    /// after it are handed out again.
    #[must_use]
    pub fn rollbacks(&self) -> watch::Receiver<(u64, Seq)> {
        self.rollbacks.clone()
    }

    /// The last log seq shown to readers: the change streams get a change of a group committed
    /// without an fsync as soon as the writer decided it, before its rows are written, so this
    /// is at or after [`committed`](Self::committed); it moves back if that group then fails.
    ///
    /// ```no_run
    /// # async fn demo(db: durable_informer::store::DurableStore) {
    /// let writer = db.writer();
    /// assert!(*writer.applied().borrow() >= *writer.committed().borrow());
    /// # }
    /// ```
    #[must_use]
    pub fn applied(&self) -> watch::Receiver<Seq> {
        self.applied.clone()
    }

    /// The last committed log seq, updated after every commit.
    #[must_use]
    pub fn committed(&self) -> watch::Receiver<Seq> {
        self.committed.clone()
    }

    pub(crate) fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

/// Starts the writer thread.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    config: &StoreConfig,
) -> Result<(Writer, std::thread::JoinHandle<()>), StoreError> {
    let last = last_seq_read(&shared)?;
    let (tx, rx) = crossbeam_channel::unbounded();
    let (publisher, positions) = publish::Publisher::new(last, shared.memory.clone());
    let pins = Arc::new(retention::Pins::default());
    let published = PublishedDicts::default();
    let (reap_tx, reap_rx) = crossbeam_channel::bounded::<Vec<Garbage>>(16);
    // Ends when the writer thread drops its sender.
    let reaper = std::thread::Builder::new()
        .name("durable-informer-free".into())
        .spawn(move || reap_rx.iter().for_each(drop))
        .ok()
        .map(|_| reap_tx);
    let state = WriterThread {
        next_seq: Cell::new(last.0 + 1),
        shared,
        commit: thread::GroupCommit {
            rx,
            fsync_delay: config.fsync_delay,
            fsync_due: Cell::new(None),
            durable: config.durable,
            shared_file: config.live_inspection,
            max_deltas: config.max_batch_deltas,
            max_bytes: config.max_batch_bytes,
            garbage: RefCell::new(Vec::new()),
            reaper,
            poisoned: Cell::new(false),
            pending_sync: Cell::new(None),
            background_sync: Cell::new(false),
            closing: Cell::new(false),
        },
        publisher,
        upkeep: background::Upkeep::new(config, pins.clone()),
        dict: dicts::Dictionaries::new(config.compression, published.clone()),
    };
    state.observe_size(true);
    let thread = std::thread::Builder::new()
        .name("durable-informer-writer".into())
        .spawn(move || state.run())
        .map_err(|source| StoreError::Io {
            path: "writer thread".into(),
            source,
        })?;
    Ok((
        Writer {
            tx,
            committed: positions.committed,
            applied: positions.applied,
            durable: positions.durable,
            rollbacks: positions.rollbacks,
            dicts: published,
            pins,
            fsyncs: config.durable,
        },
        thread,
    ))
}

fn last_seq_read(shared: &Shared) -> Result<Seq, StoreError> {
    let txn = shared.db()?.begin_read().map_err(|e| shared.storage(e))?;
    let log = txn.open_table(LOG).map_err(|e| shared.storage(e))?;
    let in_log = log.last().map_err(|e| shared.storage(e))?.map_or(0, |(k, _)| k.value());
    let meta = txn.open_table(META).map_err(|e| shared.storage(e))?;
    let saved = match meta.get(META_LAST_SEQ).map_err(|e| shared.storage(e))? {
        Some(v) => <[u8; 8]>::try_from(v.value()).map(u64::from_be_bytes).unwrap_or(0),
        None => 0,
    };
    Ok(Seq(in_log.max(saved)))
}
