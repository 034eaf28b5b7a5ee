//! The writer: one OS thread that owns every write transaction.
//!
//! Commands arrive over a crossbeam channel. The thread takes what is queued (bounded by count
//! and bytes: group commit), applies it in one transaction, commits, and only then acknowledges
//! each sender and publishes the committed log position. A command that is refused (say, an RV
//! regression) is refused before it writes anything, so the others in the group still commit;
//! a storage error aborts the whole group and every sender hears of it.

mod backfill;
pub(crate) use backfill::RESUME_SCAN;
mod background;
mod retention;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use redb::{ReadableTable, WriteTransaction};
use tokio::sync::{oneshot, watch};

use bytes::Bytes;

use super::codec::{self, Compression, DataRef, DeltaKind, LogHeader, ObjectHeader, PrevRef, ScopeRecord};
use super::dict::{self, EncDict};
use super::index::Indexer;
use super::schema::{
    keys, IndexName, ScopeId, Seq, CURSORS, DICTS, INDEX, INDEX_REV, LOG, META, META_CLUSTER_IDENTITY, META_LAST_SEQ,
    OBJECTS, RELIST, SCOPES, SCOPE_NAMES,
};
use super::{Shared, StoreConfig, StoreError};
use crate::object::{ObjectKey, RawObject, ResourceVersion};
use retention::{Compaction, Goal};

/// One change to apply.
#[derive(Debug, Clone)]
pub struct Delta {
    /// What happened. `Added`/`Updated`/`Replaced` are stored as an add or an update depending on
    /// whether the key exists; a `Deleted` of an unknown key and an upsert with the stored RV are
    /// dropped, so redelivered events are harmless.
    pub kind: DeltaKind,
    /// The object (for deletes, its final state).
    pub object: RawObject,
}

/// Deltas for one scope, committed atomically together with the scope's new RV.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The scope.
    pub scope: ScopeId,
    /// The changes, in order.
    pub deltas: Vec<Delta>,
    /// The scope's RV after this batch (from the last event or a bookmark). `None` keeps it.
    pub rv: Option<ResourceVersion>,
    /// Marks the scope synced (the end of an initial list).
    pub mark_synced: bool,
    /// Refuse unless the persisted RV is at least this: set to the RV the previous pipelined
    /// batch reaches, so a batch never commits after its predecessor failed (which would skip
    /// the predecessor's events).
    pub requires_rv: Option<ResourceVersion>,
    /// The carried objects already compressed by [`Writer::submit`] on the caller's thread.
    pub(crate) packed: Option<Packed>,
    /// Commit without waiting for the disk (see [`Writer::flush`]): for a bulk load whose
    /// caller makes the end durable itself and redoes the whole load after a crash.
    pub(crate) relaxed: bool,
}

/// Objects of a batch compressed before it reached the writer thread, with the committed
/// dictionary they used. The writer takes them only if that is the dictionary it would use
/// itself (the same `Arc`), so a blob never names a dictionary that is not in the file.
#[derive(Clone)]
pub(crate) struct Packed {
    dict: Arc<EncDict>,
    /// One per delta that carries bytes (every kind but `Sync`), in order.
    blobs: Vec<Bytes>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("scope", &self.dict.scope)
            .field("dict", &self.dict.id)
            .field("blobs", &self.blobs.len())
            .finish()
    }
}

/// Each scope's newest committed dictionary, published by the writer thread for
/// [`Writer::submit`]: dictionary rows are never rewritten, so one published stays valid.
pub(crate) type PublishedDicts = Arc<std::sync::RwLock<HashMap<u32, Arc<EncDict>>>>;

impl Batch {
    /// An empty batch for `scope`.
    #[must_use]
    pub fn new(scope: ScopeId) -> Self {
        Self {
            scope,
            deltas: Vec::new(),
            rv: None,
            mark_synced: false,
            requires_rv: None,
            packed: None,
            relaxed: false,
        }
    }

    /// Applies only if the scope's persisted RV is at least `rv` (see [`Batch::requires_rv`]).
    #[must_use]
    pub fn requires(mut self, rv: impl Into<ResourceVersion>) -> Self {
        self.requires_rv = Some(rv.into());
        self
    }

    /// Appends a delta.
    #[must_use]
    pub fn delta(mut self, kind: DeltaKind, object: RawObject) -> Self {
        self.deltas.push(Delta { kind, object });
        self
    }

    /// Sets the RV the scope reaches with this batch.
    #[must_use]
    pub fn rv(mut self, rv: impl Into<ResourceVersion>) -> Self {
        self.rv = Some(rv.into());
        self
    }

    /// Marks the scope synced.
    #[must_use]
    pub fn synced(mut self) -> Self {
        self.mark_synced = true;
        self
    }

    fn bytes(&self) -> usize {
        self.deltas.iter().map(|d| d.object.bytes.len()).sum()
    }
}

/// What a commit made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The last log seq in the database after the commit.
    pub seq: Seq,
    /// How many log entries this command appended.
    pub entries: u64,
}

/// The outcome of a relist diff.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelistSummary {
    /// Listed objects the store did not have.
    pub added: u64,
    /// Listed objects whose RV differed.
    pub updated: u64,
    /// Stored objects the list did not contain (delivered as deletes, final state unknown).
    pub deleted: u64,
    /// Listed objects equal to what was stored (no event).
    pub unchanged: u64,
    /// The last log seq after the commit.
    pub seq: Seq,
}

/// The outcome of a log compaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Entries removed.
    pub removed: u64,
    /// Object rows whose bytes moved from the log into the row.
    pub inlined: u64,
    /// The first seq still in the log (0 when empty).
    pub first_retained: Seq,
}

type Ack<T> = oneshot::Sender<Result<T, StoreError>>;

/// Running index backfills and the callers waiting for each.
type Backfills = BTreeMap<(ScopeId, IndexName), Vec<Ack<()>>>;

enum Command {
    RegisterScope(String, Ack<ScopeId>),
    Apply(Batch, Ack<Committed>),
    Stage(ScopeId, Vec<RawObject>, Ack<()>),
    FinishRelist(ScopeId, ResourceVersion, String, Ack<RelistSummary>),
    AbortRelist(ScopeId, Ack<()>),
    EnsureIndex(ScopeId, IndexName, Ack<()>),
    SetCursor(ScopeId, String, Seq, Ack<()>),
    DeleteCursor(ScopeId, String, Ack<()>),
    Compact(Option<u64>, Ack<CompactReport>),
    Settle(Ack<()>),
    /// Commits durably (making earlier relaxed commits durable too).
    Flush(Ack<()>),
    Identity(String, bool, Ack<bool>),
    ResetScope(ScopeId, Ack<()>),
    Shutdown,
}

impl Command {
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
    dicts: PublishedDicts,
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
        let (ack, rx) = oneshot::channel();
        self.send(Command::RegisterScope(spec.canonical(), ack))?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Registers a scope, or finds the one with the same spec. Blocking.
    pub fn register_scope_blocking(&self, spec: &super::ScopeSpec) -> Result<ScopeId, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::RegisterScope(spec.canonical(), ack))?;
        futures::executor::block_on(rx).map_err(|_| StoreError::WriterGone)?
    }

    /// Queues a batch now and returns a receiver for its commit, so a caller can keep reading
    /// while earlier batches commit (pipelining). The batch is durable once the receiver yields
    /// `Ok`.
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
        let dict = self
            .dicts
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&batch.scope.0)
            .cloned();
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

    /// Applies a batch in the next group commit and returns once it is durable.
    pub async fn apply(&self, batch: Batch) -> Result<Committed, StoreError> {
        self.submit(batch)?.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Applies a batch in the next group commit and returns once it is durable.
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
    request!(set_cursor, set_cursor_blocking, (scope: ScopeId, name: String, seq: Seq) -> (), SetCursor,
        "Persists the cursor of the durable consumer `name` of `scope`: every entry up to `seq` was handled. Consumers of different scopes may share a name.");
    request!(delete_cursor, delete_cursor_blocking, (scope: ScopeId, name: String) -> (), DeleteCursor,
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

    /// Diffs the staged relist against the stored objects and swaps it in, in one transaction:
    /// new → Added, changed RV → Updated, not listed → Deleted (final state unknown), same RV →
    /// nothing. Sets the scope RV to `rv` (which may be lower than before: a relist is the only
    /// way an RV moves backwards).
    pub async fn finish_relist(
        &self,
        scope: ScopeId,
        rv: ResourceVersion,
        reason: &str,
    ) -> Result<RelistSummary, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::FinishRelist(scope, rv, reason.to_owned(), ack))?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Blocking form of [`finish_relist`](Self::finish_relist).
    pub fn finish_relist_blocking(
        &self,
        scope: ScopeId,
        rv: ResourceVersion,
        reason: &str,
    ) -> Result<RelistSummary, StoreError> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::FinishRelist(scope, rv, reason.to_owned(), ack))?;
        futures::executor::block_on(rx).map_err(|_| StoreError::WriterGone)?
    }

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
    let (seq_tx, seq_rx) = watch::channel(last);
    let published = PublishedDicts::default();
    let (reap_tx, reap_rx) = crossbeam_channel::bounded::<Vec<Garbage>>(16);
    // Ends when the writer thread drops its sender.
    let reaper = std::thread::Builder::new()
        .name("durable-informer-free".into())
        .spawn(move || reap_rx.iter().for_each(drop))
        .ok()
        .map(|_| reap_tx);
    let state = WriterThread {
        published: published.clone(),
        garbage: RefCell::new(Vec::new()),
        reaper,
        next_seq: Cell::new(last.0 + 1),
        shared,
        rx,
        seq_tx,
        durable: config.durable,
        max_deltas: config.max_batch_deltas,
        max_bytes: config.max_batch_bytes,
        compression: config.compression,
        retention_entries: config.retention_entries,
        retention_age: config.retention_age,
        compact_step: config.compact_step,
        backfill_step: config.backfill_step,
        compaction: RefCell::new(Compaction::default()),
        backfills: RefCell::new(BTreeMap::new()),
        backfill_turn: Cell::new(false),
        dicts: RefCell::new(HashMap::new()),
        pending_dicts: RefCell::new(Vec::new()),
        poisoned: Cell::new(false),
        size_observed: Cell::new(None),
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
            committed: seq_rx,
            dicts: published,
        },
        thread,
    ))
}

fn last_seq_read(shared: &Shared) -> Result<Seq, StoreError> {
    use redb::ReadableDatabase;
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

/// First and longest wait between the writer's own attempts to reopen a poisoned database.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(10);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

struct WriterThread {
    /// Next log seq to hand out; reset to its value at the start of a group that rolls back.
    next_seq: Cell<u64>,
    shared: Arc<Shared>,
    rx: Receiver<Command>,
    seq_tx: watch::Sender<Seq>,
    durable: bool,
    max_deltas: usize,
    max_bytes: usize,
    compression: Compression,
    retention_entries: Option<u64>,
    retention_age: Option<std::time::Duration>,
    /// Most log entries one compaction transaction removes.
    compact_step: usize,
    /// Most objects one backfill transaction indexes.
    backfill_step: usize,
    /// Compaction still to do (automatic retention and explicit `compact` calls).
    compaction: RefCell<Compaction>,
    /// Backfills this writer runs, with the callers waiting for each. An index in here has its
    /// function registered, so every write since maintained its rows.
    backfills: RefCell<Backfills>,
    /// Whether the next idle step goes to a backfill (compaction and backfills take turns).
    backfill_turn: Cell<bool>,
    /// Per-scope dictionary state for [`Compression::ZstdDict`].
    dicts: RefCell<HashMap<u32, ScopeDicts>>,
    /// Scopes whose dictionary was trained in the open group: forgotten if it rolls back,
    /// published once it commits.
    pending_dicts: RefCell<Vec<u32>>,
    /// Committed dictionaries, for [`Writer::submit`] to compress with.
    published: PublishedDicts,
    /// What the open group's batches held, freed by the `reaper` thread after the group: the
    /// objects were allocated on other threads, and freeing thousands of small allocations
    /// from another thread's arena cost the writer about a fifth of its time (`perf`, replay).
    garbage: RefCell<Vec<Garbage>>,
    /// Frees garbage; `None` (or full) frees it here.
    reaper: Option<crossbeam_channel::Sender<Vec<Garbage>>>,
    /// An I/O error happened: redb refuses every later operation ("Previous I/O error
    /// occurred") until the database is reopened, which the next group does first.
    poisoned: Cell<bool>,
    /// When the file size was last published to the `database_bytes` metric.
    size_observed: Cell<Option<std::time::Instant>>,
}

/// A batch's deltas and compressed blobs, kept until its group is done.
type Garbage = (Vec<Delta>, Vec<(Bytes, Compression)>);

/// Hands the group's garbage to the reaper when the group ends, however it ends.
struct Reap<'w>(&'w WriterThread);

impl Drop for Reap<'_> {
    fn drop(&mut self) {
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

/// A scope's compression dictionary on the writer.
#[derive(Default)]
struct ScopeDicts {
    /// Whether the newest committed dictionary was looked up.
    loaded: bool,
    /// The dictionary new blobs are compressed with.
    current: Option<Arc<EncDict>>,
    /// Objects kept to train the first dictionary on (`Bytes` clones: no copy).
    samples: Vec<Bytes>,
}

/// A command's reply, held until the transaction commits.
enum Reply {
    Scope(Ack<ScopeId>, Result<ScopeId, StoreError>),
    Committed(Ack<Committed>, Result<u64, StoreError>),
    Unit(Ack<()>, Result<(), StoreError>),
    Relist(Ack<RelistSummary>, Result<RelistSummary, StoreError>),
    Compact(Ack<CompactReport>, Result<CompactReport, StoreError>),
    Bool(Ack<bool>, Result<bool, StoreError>),
    /// Work that goes on in bounded transactions after this commit; acknowledged when it is done.
    Deferred(Deferred),
}

/// A command whose work outlives its group commit.
enum Deferred {
    Compact(Ack<CompactReport>, Goal),
    Settle(Ack<()>),
    Backfill(Ack<()>, ScopeId, IndexName),
}

/// Why a command did not apply: `Refused` wrote nothing, so the group goes on; `Fatal` may have
/// written part of the command, so the whole group is rolled back.
enum Failure {
    Refused(StoreError),
    Fatal(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Fatal(e)
    }
}

type Step<T> = Result<T, Failure>;

impl WriterThread {
    fn run(self) {
        let mut stop = false;
        // While poisoned (an I/O error, and the reopen failed or has not run yet), the writer
        // retries the reopen on its own: readers get `Closed` until it succeeds, and they must
        // not wait for someone to write first.
        let mut retry = RETRY_FIRST;
        while !stop {
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
                match self.rx.recv_timeout(poll) {
                    Ok(cmd) => cmd,
                    Err(RecvTimeoutError::Timeout) => {
                        self.plan_retention();
                        continue;
                    }
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
        self.abandon_background_work();
    }

    /// After an I/O error: reopen the database (through the same backend wrapper) and restart
    /// the log seq from what is durable in the file: a commit whose final sync failed may or
    /// may not have reached the disk, so the file, not the writer's counter, says which it was.
    fn recover(&self) -> Result<(), StoreError> {
        self.shared.reopen()?;
        let last = last_seq_read(&self.shared)?;
        self.next_seq.set(last.0 + 1);
        // Dictionaries are looked up again from what the file holds.
        self.dicts.borrow_mut().clear();
        self.pending_dicts.borrow_mut().clear();
        self.published
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        self.poisoned.set(false);
        self.seq_tx.send_if_modified(|seq| {
            let changed = *seq != last;
            *seq = last;
            changed
        });
        tracing::info!(last_seq = last.0, "database reopened after an I/O error");
        Ok(())
    }

    /// Remembers that `e` needs a reopen before the next group (redb latches I/O errors).
    fn note(&self, e: &StoreError) {
        if let StoreError::Storage { source, .. } = e {
            if matches!(source, redb::Error::Io(_) | redb::Error::PreviousIo) {
                self.poisoned.set(true);
            }
        }
    }

    /// Applies and commits one group; returns how many log entries it appended.
    fn commit_group(&self, group: Vec<Command>) -> u64 {
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
        let relaxed = group.iter().all(|c| matches!(c, Command::Apply(b, _) if b.relaxed));
        if !self.durable || relaxed {
            let _ = txn.set_durability(redb::Durability::None);
        }
        let start_seq = self.next_seq.get();
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
            self.forget_pending_dicts();
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
            self.forget_pending_dicts();
            self.next_seq.set(start_seq);
            fail_replies(replies, &e);
            return 0;
        }
        if let Err(e) = txn.commit() {
            let e = self.shared.storage(e);
            tracing::warn!(error = %e, "commit failed");
            self.note(&e);
            self.forget_pending_dicts();
            self.next_seq.set(start_seq);
            fail_replies(replies, &e);
            return 0;
        }
        for scope in self.pending_dicts.borrow_mut().drain(..) {
            if let Some(d) = self.scope_dict_cached(ScopeId(scope)) {
                self.publish(scope, d);
            }
        }
        self.seq_tx.send_replace(last);
        for r in replies {
            match r {
                Reply::Deferred(d) => self.defer(d),
                r => send_reply(r, last),
            }
        }
        (last.0 + 1).saturating_sub(start_seq)
    }

    /// Applies one command. `Err` carries the reply and the error that aborts the group.
    #[allow(clippy::result_large_err)] // private, returned once per command, never propagated
    fn apply(&self, txn: &WriteTransaction, cmd: Command) -> Result<Reply, (Reply, StoreError)> {
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
            Command::SetCursor(scope, name, seq, ack) => run!(Unit, ack, self.set_cursor(txn, scope, &name, seq)),
            Command::DeleteCursor(scope, name, ack) => run!(Unit, ack, self.delete_cursor(txn, scope, &name)),
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
            Command::Shutdown => Ok(Reply::Unit(oneshot::channel().0, Ok(()))),
        }
    }

    /// Dictionaries trained in a group that did not commit were never stored: drop them, so
    /// their ids are handed out again and never cached for two different dictionaries.
    fn forget_pending_dicts(&self) {
        let mut dicts = self.dicts.borrow_mut();
        for scope in self.pending_dicts.borrow_mut().drain(..) {
            dicts.remove(&scope);
        }
    }

    /// The dictionary new blobs of `scope` are compressed with: the newest committed one, or
    /// one trained now (and stored in this transaction) once `objects` bring enough samples.
    /// Also returns how many leading `objects` come before it: when this batch completes the
    /// samples, the object that completes them and every later one use the new dictionary,
    /// the earlier ones do not. Where a dictionary starts thus depends only on the order of
    /// objects, never on where batches happen to begin, so replays give identical bytes.
    fn scope_dict(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        objects: &[&Bytes],
    ) -> Step<(Option<Arc<EncDict>>, usize)> {
        let Compression::ZstdDict(level) = self.compression else {
            return Ok((None, 0));
        };
        let mut all = self.dicts.borrow_mut();
        let state = all.entry(scope.0).or_default();
        if !state.loaded {
            let table = txn.open_table(DICTS).map_err(|e| self.st(e))?;
            let newest = table
                .range((scope.0, 0)..=(scope.0, u32::MAX))
                .map_err(|e| self.st(e))?
                .next_back()
                .transpose()
                .map_err(|e| self.st(e))?;
            if let Some((k, v)) = newest {
                let d = Arc::new(EncDict::new(scope.0, k.value().1, v.value(), level));
                // Read from the file: committed, so callers may compress with it.
                self.publish(scope.0, d.clone());
                state.current = Some(d);
            }
            state.loaded = true;
        }
        let mut before = 0;
        if state.current.is_none() {
            before = objects.len();
            for (i, b) in objects.iter().enumerate() {
                if state.samples.len() >= dict::TRAIN_SAMPLES {
                    break;
                }
                if !b.is_empty() {
                    state.samples.push((*b).clone());
                    before = i;
                }
            }
            if state.samples.len() >= dict::TRAIN_SAMPLES {
                let samples = std::mem::take(&mut state.samples);
                if let Some(raw) = dict::train(&samples) {
                    let mut table = txn.open_table(DICTS).map_err(|e| self.st(e))?;
                    let id = table
                        .range((scope.0, 0)..=(scope.0, u32::MAX))
                        .map_err(|e| self.st(e))?
                        .next_back()
                        .transpose()
                        .map_err(|e| self.st(e))?
                        .map_or(1, |(k, _)| k.value().1 + 1);
                    table.insert((scope.0, id), raw.as_slice()).map_err(|e| self.st(e))?;
                    state.current = Some(Arc::new(EncDict::new(scope.0, id, &raw, level)));
                    self.pending_dicts.borrow_mut().push(scope.0);
                    tracing::debug!(%scope, id, bytes = raw.len(), "trained a zstd dictionary");
                }
            }
            if state.current.is_none() {
                before = objects.len();
            }
        }
        Ok((state.current.clone(), before))
    }

    fn publish(&self, scope: u32, dict: Arc<EncDict>) {
        self.published
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(scope, dict);
    }

    /// The dictionary `scope_dict` last settled on (call that first in the command).
    fn scope_dict_cached(&self, scope: ScopeId) -> Option<Arc<EncDict>> {
        self.dicts.borrow().get(&scope.0).and_then(|s| s.current.clone())
    }

    fn st<E: Into<redb::Error>>(&self, e: E) -> StoreError {
        self.shared.storage(e)
    }

    fn register_scope(&self, txn: &WriteTransaction, spec: &str) -> Step<ScopeId> {
        let mut names = txn.open_table(SCOPE_NAMES).map_err(|e| self.st(e))?;
        if let Some(id) = names.get(spec).map_err(|e| self.st(e))? {
            return Ok(ScopeId(id.value()));
        }
        let mut scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
        let next = scopes.last().map_err(|e| self.st(e))?.map_or(1, |(k, _)| k.value() + 1);
        let record = ScopeRecord {
            spec: spec.to_owned(),
            ..ScopeRecord::default()
        };
        let encoded = codec::encode_scope(&record).map_err(StoreError::from)?;
        scopes.insert(next, encoded.as_slice()).map_err(|e| self.st(e))?;
        names.insert(spec, next).map_err(|e| self.st(e))?;
        Ok(ScopeId(next))
    }

    fn load_scope(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<ScopeRecord> {
        let scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
        let Some(v) = scopes.get(scope.0).map_err(|e| self.st(e))? else {
            return Err(Failure::Refused(StoreError::UnknownScope(scope)));
        };
        Ok(codec::decode_scope(v.value()).map_err(StoreError::from)?)
    }

    fn save_scope(&self, txn: &WriteTransaction, scope: ScopeId, record: &ScopeRecord) -> Step<()> {
        let mut scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
        let encoded = codec::encode_scope(record).map_err(StoreError::from)?;
        scopes.insert(scope.0, encoded.as_slice()).map_err(|e| self.st(e))?;
        Ok(())
    }

    fn apply_batch(&self, txn: &WriteTransaction, mut batch: Batch) -> Step<u64> {
        let mut record = self.load_scope(txn, batch.scope)?;
        // Refuse before writing anything, so the rest of the group still commits.
        for d in &batch.deltas {
            d.object.key().validate().map_err(|e| Failure::Refused(e.into()))?;
        }
        if let Some(required) = &batch.requires_rv {
            if record.rv.as_ref().is_none_or(|p| p.is_older_than(required)) {
                return Err(Failure::Refused(StoreError::PredecessorMissing {
                    scope: batch.scope,
                    persisted: record.rv.clone(),
                    required: required.clone(),
                }));
            }
        }
        if let (Some(persisted), Some(offered)) = (&record.rv, &batch.rv) {
            // Invariant 2: the persisted RV never moves backwards outside a relist.
            if offered.is_older_than(persisted) {
                return Err(Failure::Refused(StoreError::RvRegression {
                    scope: batch.scope,
                    persisted: persisted.clone(),
                    offered: offered.clone(),
                }));
            }
        }
        let indexers = self.shared.indexes.for_scope(batch.scope);
        // Compress everything first (on two threads for large batches), so the redb work below
        // runs uninterrupted.
        let carried: Vec<&Bytes> = batch
            .deltas
            .iter()
            .filter(|d| d.kind != DeltaKind::Sync)
            .map(|d| &d.object.bytes)
            .collect();
        let (dict, before) = self.scope_dict(txn, batch.scope, &carried)?;
        let precompressed = match (batch.packed.take(), &dict) {
            (Some(p), Some(d)) if before == 0 && Arc::ptr_eq(&p.dict, d) && p.blobs.len() == carried.len() => {
                let tag = Compression::Dict {
                    scope: d.scope,
                    dict: d.id,
                };
                Some(p.blobs.into_iter().map(|b| (b, tag)).collect::<Vec<_>>())
            }
            _ => None,
        };
        let packed = match precompressed {
            Some(p) => p,
            None => {
                let (plain, with_dict) = carried.split_at(before);
                let mut packed = dict::pack_all(self.compression, None, plain).map_err(StoreError::from)?;
                packed.extend(dict::pack_all(self.compression, dict.as_deref(), with_dict).map_err(StoreError::from)?);
                packed
            }
        };
        let mut next_blob = packed.iter().cloned();
        drop(carried);
        let mut tables = Tables::open(self, txn)?;
        let mut appended = 0;
        for d in &batch.deltas {
            let blob = if d.kind == DeltaKind::Sync {
                None
            } else {
                next_blob.next()
            };
            if self.apply_delta(
                &mut tables,
                batch.scope,
                &indexers,
                &mut record,
                d.kind,
                &d.object,
                false,
                blob,
            )? {
                appended += 1;
            }
        }
        drop(next_blob);
        // Freed off this thread: the objects were allocated on the submitting threads.
        self.garbage
            .borrow_mut()
            .push((std::mem::take(&mut batch.deltas), packed));
        if let Some(rv) = batch.rv {
            record.rv = Some(rv);
        }
        record.synced |= batch.mark_synced;
        drop(tables);
        self.save_scope(txn, batch.scope, &record)?;
        Ok(appended)
    }

    /// Applies one delta to the object, index and log tables. Returns whether a log entry was
    /// appended.
    #[allow(clippy::too_many_arguments)] // one call site; a struct would only rename these
    fn apply_delta(
        &self,
        t: &mut Tables<'_>,
        scope: ScopeId,
        indexers: &[Indexer],
        record: &mut ScopeRecord,
        kind: DeltaKind,
        obj: &RawObject,
        final_state_unknown: bool,
        packed: Option<(Bytes, Compression)>,
    ) -> Step<bool> {
        let pack = |packed: Option<(Bytes, Compression)>| -> Step<(Bytes, Compression)> {
            match packed {
                Some(p) => Ok(p),
                None => {
                    let dict = self.scope_dict_cached(scope);
                    Ok(dict::pack(self.compression, dict.as_deref(), &obj.bytes).map_err(StoreError::from)?)
                }
            }
        };
        let key = obj.key();
        let okey = keys::object(scope, &key);
        // The existing row is read once; its inline bytes (only present after compaction) are
        // copied once, because the row is overwritten below.
        let existing = match t.objects.get(okey.as_slice()).map_err(|e| self.st(e))? {
            Some(v) => {
                let (h, inline) = codec::decode_object(v.value()).map_err(StoreError::from)?;
                let inline = if h.data == DataRef::Inline {
                    inline.to_vec()
                } else {
                    Vec::new()
                };
                Some((h, inline))
            }
            None => None,
        };
        let (prev, prev_inline): (PrevRef, &[u8]) = match &existing {
            None => (PrevRef::None, &[]),
            Some((h, inline)) => match h.data {
                DataRef::Log(s) => (PrevRef::Log(s), &[]),
                DataRef::Inline => (PrevRef::Inline(h.compression), inline.as_slice()),
            },
        };
        let seq = t.next_seq;
        match kind {
            DeltaKind::Deleted => {
                let Some((old, _)) = &existing else { return Ok(false) };
                let (data, compression) = if final_state_unknown {
                    (Bytes::new(), Compression::None)
                } else {
                    pack(packed)?
                };
                let rv = if final_state_unknown {
                    old.meta.resource_version.clone()
                } else {
                    obj.meta.resource_version.clone()
                };
                self.append_log(
                    t,
                    scope,
                    DeltaKind::Deleted,
                    &key,
                    rv,
                    &data,
                    !final_state_unknown,
                    compression,
                    prev,
                    prev_inline,
                    final_state_unknown,
                )?;
                t.objects.remove(okey.as_slice()).map_err(|e| self.st(e))?;
                for ix in indexers {
                    self.set_index_values(t, scope, &ix.name, &key, &[])?;
                }
                record.object_count = record.object_count.saturating_sub(1);
                Ok(true)
            }
            DeltaKind::Sync => {
                let Some((h, _)) = &existing else { return Ok(false) };
                self.append_log(
                    t,
                    scope,
                    DeltaKind::Sync,
                    &key,
                    h.meta.resource_version.clone(),
                    &[],
                    false,
                    Compression::None,
                    prev,
                    prev_inline,
                    false,
                )?;
                Ok(true)
            }
            DeltaKind::Added | DeltaKind::Updated | DeltaKind::Replaced => {
                if let Some((h, _)) = &existing {
                    if h.meta.resource_version == obj.meta.resource_version && !obj.meta.resource_version.is_empty() {
                        return Ok(false);
                    }
                }
                let stored_kind = if existing.is_some() {
                    DeltaKind::Updated
                } else {
                    DeltaKind::Added
                };
                let (data, compression) = pack(packed)?;
                self.append_log(
                    t,
                    scope,
                    stored_kind,
                    &key,
                    obj.meta.resource_version.clone(),
                    &data,
                    true,
                    compression,
                    prev,
                    prev_inline,
                    false,
                )?;
                let row =
                    codec::encode_object_parts(&obj.meta, DataRef::Log(seq), compression).map_err(StoreError::from)?;
                t.objects
                    .insert(okey.as_slice(), row.as_slice())
                    .map_err(|e| self.st(e))?;
                for ix in indexers {
                    let values = ix.values(&obj.meta, &obj.bytes);
                    self.set_index_values(t, scope, &ix.name, &key, &values)?;
                }
                if existing.is_none() {
                    record.object_count += 1;
                }
                Ok(true)
            }
        }
    }

    #[allow(clippy::too_many_arguments)] // mirrors the log header's fields
    fn append_log(
        &self,
        t: &mut Tables<'_>,
        scope: ScopeId,
        kind: DeltaKind,
        key: &ObjectKey,
        rv: ResourceVersion,
        data: &[u8],
        has_data: bool,
        compression: Compression,
        prev: PrevRef,
        prev_inline: &[u8],
        final_state_unknown: bool,
    ) -> Step<()> {
        let header = LogHeader {
            scope: scope.0,
            kind,
            key: key.clone(),
            rv,
            data_len: u32::try_from(data.len()).map_err(|_| StoreError::Aborted("object larger than 4 GiB".into()))?,
            has_data,
            compression,
            prev,
            final_state_unknown,
        };
        let row = codec::encode_log(&header, data, prev_inline).map_err(StoreError::from)?;
        // Invariant 4: seqs are dense; `next_seq` is always last + 1.
        t.log.insert(t.next_seq, row.as_slice()).map_err(|e| self.st(e))?;
        t.next_seq += 1;
        Ok(())
    }

    /// Makes the index rows of `key` equal `values`, dropping stale ones through the reverse map.
    fn set_index_values(
        &self,
        t: &mut Tables<'_>,
        scope: ScopeId,
        index: &IndexName,
        key: &ObjectKey,
        values: &[String],
    ) -> Step<()> {
        let rkey = keys::index_rev(scope, index, key);
        let old: Vec<String> = match t.index_rev.get(rkey.as_slice()).map_err(|e| self.st(e))? {
            Some(v) => codec::decode_values(v.value()).map_err(StoreError::from)?,
            None => Vec::new(),
        };
        if old == values {
            return Ok(());
        }
        for v in old.iter().filter(|v| !values.contains(v)) {
            let k = keys::index(scope, index, &v.as_str().into(), key);
            t.index.remove(k.as_slice()).map_err(|e| self.st(e))?;
        }
        for v in values.iter().filter(|v| !old.contains(v)) {
            let k = keys::index(scope, index, &v.as_str().into(), key);
            t.index.insert(k.as_slice(), ()).map_err(|e| self.st(e))?;
        }
        if values.is_empty() {
            t.index_rev.remove(rkey.as_slice()).map_err(|e| self.st(e))?;
        } else {
            let enc = codec::encode_values(values).map_err(StoreError::from)?;
            t.index_rev
                .insert(rkey.as_slice(), enc.as_slice())
                .map_err(|e| self.st(e))?;
        }
        Ok(())
    }

    fn stage(&self, txn: &WriteTransaction, scope: ScopeId, objs: Vec<RawObject>) -> Step<()> {
        self.load_scope(txn, scope)?;
        for o in &objs {
            o.key().validate().map_err(|e| Failure::Refused(e.into()))?;
        }
        let mut relist = txn.open_table(RELIST).map_err(|e| self.st(e))?;
        for o in objs {
            let header = ObjectHeader {
                meta: o.meta.clone(),
                data: DataRef::Inline,
                compression: Compression::None,
            };
            let row = codec::encode_object(&header, Some(&o.bytes)).map_err(StoreError::from)?;
            relist
                .insert(keys::object(scope, &o.key()).as_slice(), row.as_slice())
                .map_err(|e| self.st(e))?;
        }
        Ok(())
    }

    fn clear_staged(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<()> {
        let mut relist = txn.open_table(RELIST).map_err(|e| self.st(e))?;
        let (start, end) = keys::scope_range(scope);
        relist
            .retain_in::<&[u8], _>(start.as_slice()..end.as_slice(), |_, _| false)
            .map_err(|e| self.st(e))?;
        Ok(())
    }

    fn finish_relist(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        rv: ResourceVersion,
        reason: &str,
    ) -> Step<RelistSummary> {
        let mut record = self.load_scope(txn, scope)?;
        let indexers = self.shared.indexes.for_scope(scope);
        let (start, end) = keys::scope_range(scope);
        let range = start.as_slice()..end.as_slice();
        // Stored objects' RVs, to diff against; keys only, so memory stays proportional to the
        // number of keys, not their bytes.
        let mut stored: HashMap<Vec<u8>, ResourceVersion> = HashMap::new();
        {
            let objects = txn.open_table(OBJECTS).map_err(|e| self.st(e))?;
            for row in objects.range::<&[u8]>(range.clone()).map_err(|e| self.st(e))? {
                let (k, v) = row.map_err(|e| self.st(e))?;
                let (h, _) = codec::decode_object(v.value()).map_err(StoreError::from)?;
                stored.insert(k.value().to_vec(), h.meta.resource_version);
            }
        }
        let mut summary = RelistSummary::default();
        // Loads the scope's dictionary for `apply_delta` (relisted objects do not train one).
        self.scope_dict(txn, scope, &[])?;
        let relist = txn.open_table(RELIST).map_err(|e| self.st(e))?;
        let mut t = Tables::open(self, txn)?;
        for row in relist.range::<&[u8]>(range.clone()).map_err(|e| self.st(e))? {
            let (k, v) = row.map_err(|e| self.st(e))?;
            let (h, inline) = codec::decode_object(v.value()).map_err(StoreError::from)?;
            match stored.remove(k.value()) {
                Some(old_rv) if old_rv == h.meta.resource_version => summary.unchanged += 1,
                seen => {
                    let obj = RawObject::from_parts(h.meta, bytes::Bytes::copy_from_slice(inline));
                    self.apply_delta(
                        &mut t,
                        scope,
                        &indexers,
                        &mut record,
                        DeltaKind::Replaced,
                        &obj,
                        false,
                        None,
                    )?;
                    if seen.is_some() {
                        summary.updated += 1;
                    } else {
                        summary.added += 1;
                    }
                }
            }
        }
        drop(relist);
        // What was stored but not listed was deleted while we were not watching.
        let mut gone: Vec<Vec<u8>> = stored.into_keys().collect();
        gone.sort();
        for k in gone {
            let (_, key) = keys::decode_object(&k).map_err(StoreError::from)?;
            let obj = RawObject::from_parts(
                crate::object::ObjectMeta {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    ..Default::default()
                },
                bytes::Bytes::new(),
            );
            self.apply_delta(
                &mut t,
                scope,
                &indexers,
                &mut record,
                DeltaKind::Deleted,
                &obj,
                true,
                None,
            )?;
            summary.deleted += 1;
        }
        summary.seq = Seq(t.next_seq.saturating_sub(1));
        drop(t);
        self.clear_staged(txn, scope)?;
        if record.synced {
            record.relist_count += 1;
        }
        record.rv = Some(rv);
        record.synced = true;
        record.last_relist_reason = Some(reason.to_owned());
        record.last_relist_at_ms = Some(now_ms());
        self.save_scope(txn, scope, &record)?;
        Ok(summary)
    }

    fn set_cursor(&self, txn: &WriteTransaction, scope: ScopeId, name: &str, seq: Seq) -> Step<()> {
        let mut cursors = txn.open_table(CURSORS).map_err(|e| self.st(e))?;
        cursors.insert((scope.0, name), seq.0).map_err(|e| self.st(e))?;
        Ok(())
    }

    fn delete_cursor(&self, txn: &WriteTransaction, scope: ScopeId, name: &str) -> Step<()> {
        let mut cursors = txn.open_table(CURSORS).map_err(|e| self.st(e))?;
        cursors.remove((scope.0, name)).map_err(|e| self.st(e))?;
        Ok(())
    }

    fn identity(&self, txn: &WriteTransaction, identity: &str, reset: bool) -> Step<bool> {
        let stored = {
            let meta = txn.open_table(META).map_err(|e| self.st(e))?;
            let v = meta.get(META_CLUSTER_IDENTITY).map_err(|e| self.st(e))?;
            v.map(|v| String::from_utf8_lossy(v.value()).into_owned())
        };
        match stored {
            Some(s) if s == identity => return Ok(false),
            Some(s) if !reset => {
                return Err(Failure::Refused(StoreError::ClusterMismatch {
                    stored: s,
                    found: identity.to_owned(),
                }))
            }
            _ => {}
        }
        let wiped = if stored.is_some() {
            // Another cluster's data must not leak into this one: wipe every scope's state.
            let ids: Vec<u32> = {
                let scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
                scopes
                    .iter()
                    .map_err(|e| self.st(e))?
                    .map(|r| r.map(|(k, _)| k.value()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| self.st(e))?
            };
            for id in ids {
                self.reset_scope(txn, ScopeId(id))?;
            }
            true
        } else {
            false
        };
        let mut meta = txn.open_table(META).map_err(|e| self.st(e))?;
        meta.insert(META_CLUSTER_IDENTITY, identity.as_bytes())
            .map_err(|e| self.st(e))?;
        Ok(wiped)
    }

    fn reset_scope(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<()> {
        let mut record = self.load_scope(txn, scope)?;
        let (start, end) = keys::scope_range(scope);
        let range = start.as_slice()..end.as_slice();
        for table in [OBJECTS, INDEX_REV, RELIST] {
            let mut t = txn.open_table(table).map_err(|e| self.st(e))?;
            t.retain_in::<&[u8], _>(range.clone(), |_, _| false)
                .map_err(|e| self.st(e))?;
        }
        let mut index = txn.open_table(INDEX).map_err(|e| self.st(e))?;
        index
            .retain_in::<&[u8], _>(range, |_, _| false)
            .map_err(|e| self.st(e))?;
        record.rv = None;
        record.synced = false;
        record.object_count = 0;
        self.save_scope(txn, scope, &record)
    }
}

/// The tables a delta touches, opened once per command.
struct Tables<'t> {
    objects: redb::Table<'t, &'static [u8], &'static [u8]>,
    log: redb::Table<'t, u64, &'static [u8]>,
    index: redb::Table<'t, &'static [u8], ()>,
    index_rev: redb::Table<'t, &'static [u8], &'static [u8]>,
    next_seq: u64,
    seq_cell: &'t Cell<u64>,
}

impl<'t> Tables<'t> {
    fn open(w: &'t WriterThread, txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            objects: txn.open_table(OBJECTS).map_err(|e| w.st(e))?,
            log: txn.open_table(LOG).map_err(|e| w.st(e))?,
            index: txn.open_table(INDEX).map_err(|e| w.st(e))?,
            index_rev: txn.open_table(INDEX_REV).map_err(|e| w.st(e))?,
            next_seq: w.next_seq.get(),
            seq_cell: &w.next_seq,
        })
    }
}

impl Drop for Tables<'_> {
    fn drop(&mut self) {
        // Seqs are never reused, even when compaction empties the log (invariant 4).
        self.seq_cell.set(self.next_seq);
    }
}

/// Persists the last seq handed out, so seqs stay increasing after the log is emptied.
fn save_last_seq(shared: &Shared, txn: &WriteTransaction, last: u64) -> Result<(), StoreError> {
    let mut meta = txn.open_table(META).map_err(|e| shared.storage(e))?;
    meta.insert(META_LAST_SEQ, last.to_be_bytes().as_slice())
        .map_err(|e| shared.storage(e))?;
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn send_reply(reply: Reply, last: Seq) {
    match reply {
        Reply::Scope(a, r) => drop(a.send(r)),
        Reply::Committed(a, r) => drop(a.send(r.map(|entries| Committed { seq: last, entries }))),
        Reply::Unit(a, r) => drop(a.send(r)),
        Reply::Relist(a, r) => drop(a.send(r)),
        Reply::Compact(a, r) => drop(a.send(r)),
        Reply::Bool(a, r) => drop(a.send(r)),
        // Handled by the writer before replies are sent.
        Reply::Deferred(d) => d.fail(&StoreError::Aborted("deferred work was dropped".into())),
    }
}

fn fail_replies(replies: Vec<Reply>, e: &StoreError) {
    for r in replies {
        match r {
            Reply::Scope(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Committed(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Unit(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Relist(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Compact(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Bool(a, _) => drop(a.send(Err(e.to_aborted()))),
            Reply::Deferred(d) => d.fail(e),
        }
    }
}

fn fail_all(cmds: Vec<Command>, e: &StoreError) {
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
            | Command::ResetScope(_, a) => drop(a.send(Err(err))),
            Command::FinishRelist(_, _, _, a) => drop(a.send(Err(err))),
            Command::Compact(_, a) => drop(a.send(Err(err))),
            Command::Settle(a) | Command::Flush(a) => drop(a.send(Err(err))),
            Command::Identity(_, _, a) => drop(a.send(Err(err))),
            Command::Shutdown => {}
        }
    }
}

impl Deferred {
    fn fail(self, e: &StoreError) {
        match self {
            Deferred::Compact(a, _) => drop(a.send(Err(e.to_aborted()))),
            Deferred::Settle(a) | Deferred::Backfill(a, _, _) => drop(a.send(Err(e.to_aborted()))),
        }
    }
}
